"""Table 11 of SocialCounterfactuals (§3.4): candidate sets remaining after each filter stage, per segment.

:func:`stage_counts` builds it from the candidate-image table and the per-set tables of the three stages
(:mod:`.filtering`), :func:`stage_counts_markdown` renders it, :func:`filter_table_files` does both from and
to files (``counterfactory social filter-table``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from ...errors import InputError
from ...filters.sets import _as_bool
from .filter_io import SET_KEYS, _write_table, read_table


def _segment_map(frames: Sequence[pd.DataFrame | None]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in frames:
        if f is not None and "segment" in f.columns:
            out.update(dict(zip(f["set_id"].astype(str), f["segment"].astype(str))))
    return out


def stage_counts(candidates: pd.DataFrame, clip_sets: pd.DataFrame, nsfw_sets: pd.DataFrame,
                 detect_sets: pd.DataFrame, captions: pd.DataFrame | None = None) -> pd.DataFrame:
    """Table 11: candidate sets remaining after each stage, per segment, plus a total row.

    ``candidates``: every generated image (one row each); ``*_sets``: the per-set tables of the three stages
    (a ``passed`` column); the segment of a set comes from any table with ``segment`` (``captions`` or the
    candidates). ``% Filtered Out`` is relative to the sets entering that stage, in percent (1 decimal). Rows are
    named as Table 11 names them (``race_gender`` -> ``(Race, Gender)``).
    """
    from .debias_tables import segment_label

    seg = _segment_map([captions, candidates, detect_sets])
    cand = candidates.assign(set_id=candidates["set_id"].astype(str))
    cand["segment"] = cand["set_id"].map(seg)
    if cand["segment"].isna().any():
        missing = cand.loc[cand["segment"].isna(), "set_id"].iloc[0]
        raise InputError(f"set {missing!r} has no segment. Fix: pass the caption-set table (--captions)")
    order = list(dict.fromkeys(cand["segment"]))

    def passed_by_segment(frame: pd.DataFrame, weight: str | None = None) -> pd.Series:
        f = frame[_as_bool(frame["passed"])]
        s = f["set_id"].astype(str).map(seg)
        return (f[weight].groupby(s).sum() if weight else s.value_counts()).reindex(order, fill_value=0)

    sets = cand.groupby("segment")[list(SET_KEYS)].apply(lambda g: len(g.drop_duplicates())).reindex(order)
    images = cand.groupby("segment").size().reindex(order)
    per_set = cand.groupby(["segment", *SET_KEYS]).size().groupby(level="segment").agg(
        lambda s: "/".join(str(v) for v in sorted(s.unique()))).reindex(order)
    a, b, c = passed_by_segment(clip_sets), passed_by_segment(nsfw_sets), passed_by_segment(detect_sets)
    final_images = passed_by_segment(detect_sets, "n_images")

    def pct(after, before):
        return np.round(100.0 * (1 - np.asarray(after, float) / np.asarray(before, float)), 1)

    with np.errstate(invalid="ignore", divide="ignore"):
        table = pd.DataFrame({
            "Attribute Types": [segment_label(name) for name in order], "No. Sets": sets.to_numpy(), "Images Per Set": per_set.to_numpy(),
            "No. Images": images.to_numpy(), "Sets After CLIP Sim. Filter": a.to_numpy(),
            "% Filtered Out (CLIP Sim.)": pct(a, sets), "Sets After NSFW Filter": b.to_numpy(),
            "% Filtered Out (NSFW)": pct(b, a), "Sets After CLIP Attrib. Filter": c.to_numpy(),
            "% Filtered Out (CLIP Attrib.)": pct(c, b), "Final No. Images": final_images.to_numpy().astype(int),
        })
        total = {"Attribute Types": "Total", "Images Per Set": ""}
        for col in ("No. Sets", "No. Images", "Sets After CLIP Sim. Filter", "Sets After NSFW Filter",
                    "Sets After CLIP Attrib. Filter", "Final No. Images"):
            total[col] = int(table[col].sum())
        total["% Filtered Out (CLIP Sim.)"] = pct(total["Sets After CLIP Sim. Filter"], total["No. Sets"])
        total["% Filtered Out (NSFW)"] = pct(total["Sets After NSFW Filter"], total["Sets After CLIP Sim. Filter"])
        total["% Filtered Out (CLIP Attrib.)"] = pct(total["Sets After CLIP Attrib. Filter"],
                                                     total["Sets After NSFW Filter"])
    return pd.concat([table, pd.DataFrame([total])], ignore_index=True)


def stage_counts_markdown(table: pd.DataFrame) -> str:
    """Markdown rendering of :func:`stage_counts` (:func:`counterfactory.render.describe_frame`), percentages
    with a % sign."""
    from ...render import markdown_body

    return markdown_body(_describe_counts(table)) + "\n"


def _describe_counts(table: pd.DataFrame):
    from ...render import describe_frame

    shown = table.copy()
    for col in (c for c in shown.columns if c.startswith("% Filtered")):
        shown[col] = [("" if pd.isna(v) else f"{float(v):.1f}%") for v in shown[col]]
    return describe_frame(shown)


TABLE11_TITLE = "Table 11: counterfactual sets remaining after each filter stage, per segment"


def stage_counts_html(table: pd.DataFrame) -> str:
    """Table 11 as a standalone HTML page (what the Snakemake report shows), from the Markdown's description."""
    from ...render import html_page, render_html

    desc = _describe_counts(table)
    desc.title = TABLE11_TITLE
    return html_page("SocialCounterfactuals: filtering", [render_html(desc)])



def filter_table_files(candidates_path, clip_sets, nsfw_sets, detect_sets, out_csv, out_markdown=None,
                       captions_path=None, out_html=None) -> pd.DataFrame:
    """Table 11 from the stage outputs (CSV and, optionally, Markdown and HTML)."""
    from ...io import write_text

    captions = read_table(captions_path, "caption-set table", ("set_id", "segment")) if captions_path else None
    table = stage_counts(read_table(candidates_path, "candidate-image table", SET_KEYS),
                         read_table(clip_sets, "CLIP set table", (*SET_KEYS, "passed")),
                         read_table(nsfw_sets, "NSFW set table", (*SET_KEYS, "passed")),
                         read_table(detect_sets, "detectability set table", (*SET_KEYS, "passed", "n_images")),
                         captions)
    _write_table(out_csv, table)
    if out_markdown:
        write_text(out_markdown, stage_counts_markdown(table))
    if out_html:
        write_text(out_html, stage_counts_html(table))
    return table
