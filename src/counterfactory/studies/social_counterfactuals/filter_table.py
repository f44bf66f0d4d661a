"""Table 11 of SocialCounterfactuals (§3.4): candidate sets remaining after each filter stage, per segment.

Table 11 covers the paper's three two-attribute segments (Table 1) and their total; a segment of more attribute
types (§10.2's physical × race × gender) gets its own row after the total, outside it, and its own table in the
Markdown / HTML (its detectability thresholds are ours: §10.2 prints none).

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
from ...io import write_text
from ...render import describe_frame, html_page, markdown_body, render_html
from .filter_io import SET_KEYS, _write_table, read_table
from .experiments import segment_label


def _segment_map(frames: Sequence[pd.DataFrame | None]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in frames:
        if f is not None and "segment" in f.columns:
            out.update(dict(zip(f["set_id"].astype(str), f["segment"].astype(str))))
    return out


def _n_types(segment: str, frames: Sequence[pd.DataFrame | None]) -> int:
    """Attribute types of a segment: its non-blank ``a<i>_type`` columns (caption or candidate table), else the
    parts of its name (``physical_race_gender`` -> 3)."""
    for f in frames:
        if f is None or "segment" not in f.columns:
            continue
        cols = [c for c in f.columns if c.startswith("a") and c.endswith("_type") and c[1:-5].isdigit()]
        rows = f[f["segment"].astype(str) == segment]
        if cols and len(rows):
            first = rows.iloc[0]
            return sum(1 for c in cols if isinstance(first[c], str) and first[c].strip())
    return len(str(segment).split("_"))


def stage_counts(candidates: pd.DataFrame, clip_sets: pd.DataFrame, nsfw_sets: pd.DataFrame,
                 detect_sets: pd.DataFrame, captions: pd.DataFrame | None = None) -> pd.DataFrame:
    """Table 11: candidate sets remaining after each stage, per two-attribute segment, their total row, then any
    segment of more attribute types (§10.2) after the total (not counted in it; :func:`split_table`).

    ``candidates``: every generated image (one row each); ``*_sets``: the per-set tables of the three stages
    (a ``passed`` column); the segment of a set comes from any table with ``segment`` (``captions`` or the
    candidates). ``% Filtered Out`` is relative to the sets entering that stage, in percent (1 decimal). Rows are
    named as Table 11 names them (``race_gender`` -> ``(Race, Gender)``).
    """
    seg = _segment_map([captions, candidates, detect_sets])
    cand = candidates.assign(set_id=candidates["set_id"].astype(str))
    cand["segment"] = cand["set_id"].map(seg)
    if cand["segment"].isna().any():
        missing = cand.loc[cand["segment"].isna(), "set_id"].iloc[0]
        raise InputError(f"set {missing!r} has no segment. Fix: pass the caption-set table (--captions)")
    order = list(dict.fromkeys(cand["segment"]))
    n_types = {s: _n_types(s, [captions, candidates]) for s in order}
    order = [s for s in order if n_types[s] <= 2] + [s for s in order if n_types[s] > 2]   # Table 11's first
    paper_rows = [i for i, s in enumerate(order) if n_types[s] <= 2]

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
            total[col] = int(table[col].iloc[paper_rows].sum())   # Table 11's segments only
        total["% Filtered Out (CLIP Sim.)"] = pct(total["Sets After CLIP Sim. Filter"], total["No. Sets"])
        total["% Filtered Out (NSFW)"] = pct(total["Sets After NSFW Filter"], total["Sets After CLIP Sim. Filter"])
        total["% Filtered Out (CLIP Attrib.)"] = pct(total["Sets After CLIP Attrib. Filter"],
                                                     total["Sets After NSFW Filter"])
    n_paper = len(paper_rows)
    return pd.concat([table.iloc[:n_paper], pd.DataFrame([total]), table.iloc[n_paper:]], ignore_index=True)


def split_table(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`stage_counts`' frame as (Table 11: the two-attribute segments and their total, the rows after the
    total: segments of more attribute types, §10.2)."""
    total = int(table.index[table["Attribute Types"] == "Total"][0])
    return table.iloc[:total + 1].reset_index(drop=True), table.iloc[total + 1:].reset_index(drop=True)


SECTION_10_2_TITLE = ("§10.2: the three-attribute segment, filtered like Table 11's (not part of Table 11; its "
                      "detectability thresholds are ours, §10.2 prints none)")


def stage_counts_markdown(table: pd.DataFrame) -> str:
    """Markdown rendering of :func:`stage_counts` (:func:`counterfactory.render.describe_frame`), percentages
    with a % sign."""
    paper, extra = split_table(table)
    out = markdown_body(_describe_counts(paper)) + "\n"
    if len(extra):
        out += f"\n**{SECTION_10_2_TITLE}**\n\n" + markdown_body(_describe_counts(extra)) + "\n"
    return out


def _describe_counts(table: pd.DataFrame):
    shown = table.copy()
    for col in (c for c in shown.columns if c.startswith("% Filtered")):
        shown[col] = [("" if pd.isna(v) else f"{float(v):.1f}%") for v in shown[col]]
    return describe_frame(shown)


TABLE11_TITLE = "Table 11: counterfactual sets remaining after each filter stage, per segment"


def stage_counts_html(table: pd.DataFrame) -> str:
    """Table 11 as a standalone HTML page (what the Snakemake report shows), from the Markdown's description."""
    paper, extra = split_table(table)
    desc = _describe_counts(paper)
    desc.title = TABLE11_TITLE
    parts = [render_html(desc)]
    if len(extra):
        more = _describe_counts(extra)
        more.title = SECTION_10_2_TITLE
        parts.append(render_html(more))
    return html_page("SocialCounterfactuals: filtering", parts)



def surviving_subjects(detect_sets: pd.DataFrame, captions: pd.DataFrame) -> pd.DataFrame:
    """Table 18 ("Full list of occupations which remain in our dataset after filtering"): every subject with at least
    one candidate set that passed all three stages, in the caption list's order, with its kept sets (all segments)
    and the segments it remains in. Columns ``subject, sets_kept, segments``."""
    for col in ("set_id", "subject", "segment"):
        if col not in captions.columns:
            raise InputError(f"caption-set table: missing column {col!r}. Fix: pass the social captions table")
    by_set = captions.drop_duplicates("set_id").set_index(captions.drop_duplicates("set_id")["set_id"].astype(str))
    kept = detect_sets[_as_bool(detect_sets["passed"])]
    ids = kept["set_id"].astype(str)
    frame = pd.DataFrame({"subject": ids.map(by_set["subject"]), "segment": ids.map(by_set["segment"])}).dropna()
    order = list(dict.fromkeys(captions["subject"].astype(str)))
    rows = []
    for subject in order:
        mine = frame[frame["subject"] == subject]
        if len(mine):
            rows.append({"subject": subject, "sets_kept": int(len(mine)),
                         "segments": " ".join(dict.fromkeys(mine["segment"].astype(str)))})
    return pd.DataFrame(rows, columns=["subject", "sets_kept", "segments"])


def table18_markdown(table: pd.DataFrame, columns: int = 4) -> str:
    """Table 18 as the paper prints it: the remaining occupations in a grid of ``columns`` columns, then the count."""
    names = table["subject"].astype(str).tolist()
    rows = [names[i:i + columns] for i in range(0, len(names), columns)]
    head = "| " + " | ".join(["Occupation"] * columns) + " |\n|" + "---|" * columns + "\n"
    body = "".join("| " + " | ".join(r + [""] * (columns - len(r))) + " |\n" for r in rows)
    return (f"**Table 18: occupations which remain in the dataset after filtering ({len(names)})**\n\n"
            + (head + body if names else "(none)\n"))


def filter_table_files(candidates_path, clip_sets, nsfw_sets, detect_sets, out_csv, out_markdown=None,
                       captions_path=None, out_html=None, out_table18_csv=None, out_table18_md=None) -> pd.DataFrame:
    """Table 11 from the stage outputs (CSV and, optionally, Markdown and HTML)."""
    captions = read_table(captions_path, "caption-set table", ("set_id", "segment", "subject")) if captions_path else None
    table = stage_counts(read_table(candidates_path, "candidate-image table", SET_KEYS),
                         read_table(clip_sets, "CLIP set table", (*SET_KEYS, "passed")),
                         read_table(nsfw_sets, "NSFW set table", (*SET_KEYS, "passed")),
                         read_table(detect_sets, "detectability set table", (*SET_KEYS, "passed", "n_images")),
                         captions)
    _write_table(out_csv, table)
    if out_table18_csv or out_table18_md:
        if captions is None:
            raise InputError("Table 18 needs the caption-set table. Fix: pass --captions")
        t18 = surviving_subjects(read_table(detect_sets, "detectability set table", (*SET_KEYS, "passed")),
                                 captions)
        if out_table18_csv:
            _write_table(out_table18_csv, t18)
        if out_table18_md:
            write_text(out_table18_md, table18_markdown(t18))
    if out_markdown:
        write_text(out_markdown, stage_counts_markdown(table))
    if out_html:
        write_text(out_html, stage_counts_html(table))
    return table
