"""The probing report of SocialCounterfactuals (Howard et al., CVPR 2024, §4 and §10): the tables (Tables 2,
12–17) and figures (Figures 3–13) drawn from the long probe table that :mod:`.probing` writes (columns
:data:`.probing.PROBE_COLUMNS`; read it with :func:`.probing.read_probe`).

Every name here is also importable from :mod:`.probing`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from ... import render
from ...errors import ConfigError
from ...io import write_csv, write_text
from ...render import describe_frame, html_page, markdown_body, render_html
from . import probing
from .experiments import segment_label
from .probing import ALL, INTERSECTIONAL, SEP, read_probe


# --------------------------------------------------------------------------------------------
# tables (Tables 2, 12–17)
# --------------------------------------------------------------------------------------------
def per_subject(probe_df: pd.DataFrame, metric: str, attribute: str = INTERSECTIONAL, given: str = ALL) -> pd.DataFrame:
    """Rows of one metric (one value per model, segment and subject)."""
    sel = probe_df[(probe_df["metric"] == metric) & (probe_df["attribute"] == attribute)
                   & (probe_df["given"] == given) & (probe_df["label"].fillna("") == "")]
    return sel[["model", "segment", "subject", "k", "value"]].reset_index(drop=True)


def distribution_table(probe_df: pd.DataFrame, metric: str = "ndkl", attribute: str = INTERSECTIONAL) -> pd.DataFrame:
    """Tables 12–14: per segment and model, Mean, Std (ddof 1), Min, 25%, 50%, 75%, Max of ``metric`` across
    subjects (occupations). Index (segment, model)."""
    sel = per_subject(probe_df, metric, attribute)
    if sel.empty:
        return pd.DataFrame(columns=["Mean", "Std", "Min", "25%", "50%", "75%", "Max"])
    desc = sel.groupby(["segment", "model"], sort=True)["value"].describe()
    out = desc[["mean", "std", "min", "25%", "50%", "75%", "max"]]
    out.columns = ["Mean", "Std", "Min", "25%", "50%", "75%", "Max"]
    return out


def mean_table(probe_df: pd.DataFrame, metric: str = "maxskew", attribute: str = INTERSECTIONAL,
               stat: str = "mean") -> pd.DataFrame:
    """Mean (or median) of ``metric`` across subjects: rows = segments, columns = models (Tables 2, 15, 16, 17).
    Bias@K is on the gender attribute: ``mean_table(df, "bias", attribute="gender")`` is Table 15."""
    sel = per_subject(probe_df, metric, attribute)
    if sel.empty:
        return pd.DataFrame()
    return sel.pivot_table(index="segment", columns="model", values="value", aggfunc=stat).sort_index()


def three_attribute_table(probe_df: pd.DataFrame, metric: str = "maxskew", stat: str = "mean") -> pd.DataFrame:
    """§10.2: on the images of each segment with three attribute types, the three-attribute MaxSkew@K (K = 60 for
    physical x race x gender) next to each two-attribute intersection's MaxSkew at the same K on the same images
    (the paper: CLIP 0.693 against 0.567-0.59). Rows (segment, model); columns ``intersection (K)``, then one per
    pair (``physical+race (K)``, ...); values: ``stat`` across subjects. Empty without a three-attribute segment."""
    sel = probe_df[(probe_df["metric"] == metric) & (probe_df["given"] == ALL)
                   & (probe_df["label"].fillna("") == "")]
    pairs = sel[sel["attribute"].astype(str).str.count(r"\+") == 1]
    segments = sorted(set(pairs["segment"]))
    if not segments:
        return pd.DataFrame()
    sel = sel[sel["segment"].isin(segments)
              & ((sel["attribute"] == INTERSECTIONAL) | sel["attribute"].isin(set(pairs["attribute"])))]
    k = sel.groupby(["segment", "attribute"])["k"].max()
    names = {a: f"{'intersection' if a == INTERSECTIONAL else a} (K={int(k.xs(a, level=1).max())})"
             for a in sel["attribute"].unique()}
    table = sel.assign(column=sel["attribute"].map(names)).pivot_table(
        index=["segment", "model"], columns="column", values="value", aggfunc=stat)
    first = names[INTERSECTIONAL] if INTERSECTIONAL in names else None
    order = ([first] if first in table.columns else []) + sorted(c for c in table.columns if c != first)
    return table[order].sort_index()


def _paper_names(table: pd.DataFrame, labels: Mapping[str, str]) -> pd.DataFrame:
    """``table`` with the papers' names: models by ``labels`` (role -> display name, e.g. ``clip_eval`` -> ``CLIP``),
    segments as Table 2 names them (``race_gender`` -> ``(Race, Gender)``), index headers Segment / Model."""
    names = {"model": lambda v: labels.get(v, v), "segment": segment_label}
    table = table.copy()
    for axis in ("index", "columns"):
        index = getattr(table, axis)
        levels = list(index.names)
        if not any(n in names for n in levels):
            continue
        headers = [str(n).capitalize() if n in names else n for n in levels]
        if isinstance(index, pd.MultiIndex):
            index = pd.MultiIndex.from_tuples([tuple(names[n](v) if n in names else v for n, v in zip(levels, key))
                                               for key in index], names=headers)
        else:
            index = pd.Index([names[levels[0]](v) for v in index], name=headers[0])
        setattr(table, axis, index)
    return table


def paper_tables(probe_df: pd.DataFrame, gender_type: str = "gender",
                 labels: Mapping[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """Every probing table: NDKL and MaxSkew@K distributions per segment (Tables 12–14 and the numbers behind
    Figure 3), mean / median MaxSkew@K and NDKL per segment × model (Tables 2, 16 layout), Bias@K (Tables 15, 17),
    and for a three-attribute segment the §10.2 comparison (:func:`three_attribute_table`). Models are named by
    ``labels`` (role -> display name) and segments as the paper names them (:func:`_paper_names`)."""
    tables = _paper_tables(probe_df, gender_type)
    return {title: _paper_names(t, dict(labels or {})) for title, t in tables.items()}


def _paper_tables(probe_df: pd.DataFrame, gender_type: str) -> dict[str, pd.DataFrame]:
    tables: dict[str, pd.DataFrame] = {}
    for metric, name in (("ndkl", "NDKL"), ("maxskew", "MaxSkew@K")):
        dist = distribution_table(probe_df, metric)
        for seg in dist.index.get_level_values(0).unique():
            tables[f"{name} distribution across occupations, segment {segment_label(seg)}"] = dist.loc[seg]
    for metric, name in (("maxskew", "MaxSkew@K"), ("ndkl", "NDKL")):
        for stat in ("mean", "median"):
            t = mean_table(probe_df, metric, stat=stat)
            if not t.empty:
                tables[f"{stat.capitalize()} {name} across occupations"] = t
    bias = mean_table(probe_df, "bias", attribute=gender_type)
    if not bias.empty:
        tables["Bias@K across occupations (segments with gender; positive = male)"] = bias
    three = three_attribute_table(probe_df)
    if not three.empty:
        tables["Mean MaxSkew@K of three attributes against each pair on the same images (§10.2)"] = three
    return tables


def describe(table: pd.DataFrame, decimals: int = 2):
    """A probing table as the shared table description (:class:`counterfactory.render.Table`): the index as
    first column, values rounded to and written with ``decimals``, nothing escaped."""
    return describe_frame(table.round(decimals), f".{decimals}f", index=True)


def tables_markdown(tables: Mapping[str, pd.DataFrame], decimals: int = 2) -> str:
    return "\n".join(f"### {title}\n\n{markdown_body(describe(t, decimals))}\n" for title, t in tables.items())


def tables_html(tables: Mapping[str, pd.DataFrame], decimals: int = 2) -> str:
    """Every probing table as one standalone HTML page (what the Snakemake report shows)."""
    bodies = []
    for title, t in tables.items():
        desc = describe(t, decimals)
        desc.title = title
        bodies.append(render_html(desc))
    return html_page("SocialCounterfactuals: bias probing", bodies)


def tables_latex(tables: Mapping[str, pd.DataFrame], decimals: int = 2) -> str:
    parts = []
    for title, t in tables.items():
        styler = t.style.format(precision=decimals, na_rep="--")
        parts.append(f"% {title}\n" + styler.to_latex(hrules=True, caption=title.replace("_", r"\_")
                                                      .replace("%", r"\%").replace("&", r"\&")))
    return "\n".join(parts)


def tables_long(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    rows = []
    for title, t in tables.items():
        for idx, row in t.iterrows():
            for col, val in row.items():
                rows.append({"table": title, "row": idx, "column": col, "value": val})
    return pd.DataFrame(rows, columns=["table", "row", "column", "value"])


# --------------------------------------------------------------------------------------------
# figures (Figures 3–13)
# --------------------------------------------------------------------------------------------
def _pyplot():
    return render.pyplot()


#: Figure 3's panels: (a) Race-Gender, (b) Physical Characteristics-Gender, (c) Physical Characteristics-Race; any
#: other segment (§10.2's three-attribute one) follows, by name
FIGURE3_SEGMENTS = ("race_gender", "physical_gender", "physical_race")


def figure_segments(segments) -> list[str]:
    """Segments in Figure 3's panel order (:data:`FIGURE3_SEGMENTS`, then the others by name)."""
    segs = list(dict.fromkeys(str(s) for s in segments))
    rank = {s: i for i, s in enumerate(FIGURE3_SEGMENTS)}
    return sorted(segs, key=lambda s: (rank.get(s, len(rank)), s))


def figure_maxskew_boxplots(probe_df: pd.DataFrame, out: str | Path, metric: str = "maxskew") -> Path:
    """Figure 3 / 6: per segment, a box plot of MaxSkew@K across occupations per model; the maximum (red) and
    minimum (green) occupations are circled and named (ties: the first name alphabetically, "+n more"). Panels in
    the paper's order ((a) Race-Gender, (b) Physical Char.-Gender, (c) Physical Char.-Race, :func:`figure_segments`),
    models in the probe table's order (``probing.roles``: ALIP, CLIP, FLAVA, LaCLIP, OpenCLIP, SLIP in Figure 3)."""
    from ...io import save_figure  # local: tests patch io.save_figure
    sel = per_subject(probe_df, metric)
    if sel.empty:
        raise ConfigError(f"no '{metric}' rows in the probe table; nothing to plot")
    segs = figure_segments(sel["segment"].unique())
    model_order = list(dict.fromkeys(probe_df["model"].astype(str)))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(segs), figsize=(5.5 * len(segs), 4.5), squeeze=False)
    for i, (ax, seg) in enumerate(zip(axes[0], segs)):
        s = sel[sel["segment"] == seg]
        models = [m for m in model_order if m in set(s["model"].astype(str))]
        data = [s[s["model"] == m]["value"].to_numpy() for m in models]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(models) + 1), models, rotation=30, ha="right")
        for x, m in enumerate(models, start=1):
            sm = s[s["model"] == m].sort_values("subject")
            for fn, colour, dy in ((np.max, "red", 3), (np.min, "green", -10)):
                v = fn(sm["value"].to_numpy())
                names = sm[np.isclose(sm["value"], v)]["subject"].tolist()
                text = names[0] + (f" (+{len(names) - 1})" if len(names) > 1 else "")
                ax.scatter([x], [v], s=40, facecolors="none", edgecolors=colour, zorder=3)
                ax.annotate(text, (x, v), textcoords="offset points", xytext=(5, dy), fontsize=7, color=colour)
        ax.set_title(f"({chr(ord('a') + i)}) {segment_label(seg)}")   # "(b) (Physical Char., Gender)", as Figure 3
        ax.set_ylabel("MaxSkew@K" if metric == "maxskew" else metric)
    fig.tight_layout()
    path = save_figure(out, fig)
    plt.close(fig)
    return path


#: what an all-zero marginal panel means (MaxSkew@K = 0 for every model and group)
ZERO_NOTE = ("Every value is 0: the top K of each group had the same attribute shares as all of\n"
             "that group's images (as when K covers all of a group's images: the demo's small sets)")


def figure_marginal_bars(probe_df: pd.DataFrame, out: str | Path, attribute: str = "gender",
                         given_type: str = "race", metric: str = "maxskew") -> Path:
    """Figure 4 / 7: mean across occupations of the marginal ``attribute`` MaxSkew@K computed on the images of each
    value of ``given_type``; grouped bars, one group per model, one bar per value."""
    from ...io import save_figure  # local: tests patch io.save_figure
    sel = probe_df[(probe_df["metric"] == metric) & (probe_df["attribute"] == attribute)
                   & probe_df["given"].astype(str).str.startswith(f"{given_type}=")
                   & (probe_df["label"].fillna("") == "")]
    if sel.empty:
        raise ConfigError(f"no marginal '{attribute}' rows given '{given_type}' in the probe table; nothing to plot")
    means = sel.groupby(["segment", "model", "given"], sort=True)["value"].mean().reset_index()
    segs = sorted(means["segment"].unique())
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(segs), figsize=(7 * len(segs), 4), squeeze=False)
    for ax, seg in zip(axes[0], segs):
        t = means[means["segment"] == seg].pivot(index="model", columns="given", values="value")
        t.columns = [c.split("=", 1)[1] for c in t.columns]
        t.plot.bar(ax=ax, rot=0, width=0.8)
        ax.set_ylabel(f"mean {attribute} MaxSkew@K")
        ax.set_title(f"{segment_label(seg)}: marginal {attribute} by {given_type}")
        ax.legend(fontsize=7, ncol=2)
        if not (t.abs().to_numpy() > 1e-12).any():    # issue 44: say why the panel has no bars
            ax.set_ylim(-0.05, 1.0)
            ax.text(0.5, 0.6, ZERO_NOTE, transform=ax.transAxes, ha="center", va="center", fontsize=8, wrap=True,
                    bbox={"boxstyle": "round", "facecolor": "#fef3c7", "edgecolor": "#d97706"})
    fig.tight_layout()
    path = save_figure(out, fig)
    plt.close(fig)
    return path


def figure_retrieval_proportions(probe_df: pd.DataFrame, out: str | Path, subject: str,
                                 segment: str | None = None) -> Path:
    """Figures 5, 8–13: for one occupation, the share of each attribute value among the top-K images retrieved by
    the neutral query; one panel per attribute type (marginal) and one for the intersectional labels, bars grouped
    by model."""
    from ...io import save_figure  # local: tests patch io.save_figure

    sel = probe_df[(probe_df["metric"] == "share") & (probe_df["subject"] == subject) & (probe_df["given"] == ALL)]
    if segment is not None:
        sel = sel[sel["segment"] == segment]
    if sel.empty:
        raise ConfigError(f"no share rows for subject {subject!r}" + (f" in segment {segment!r}" if segment else "")
                          + " in the probe table. Fix: pick a subject that was probed")
    seg = segment or sorted(sel["segment"].unique())[0]
    sel = sel[sel["segment"] == seg]
    attrs = [a for a in dict.fromkeys(sel["attribute"]) if a != INTERSECTIONAL] + [INTERSECTIONAL]
    attrs = [a for a in attrs if a in set(sel["attribute"])]
    widths = [max(2, sel[sel["attribute"] == a]["label"].nunique()) for a in attrs]
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(attrs), figsize=(0.45 * sum(widths) + 3, 4.5), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    k = int(sel["k"].max())
    for ax, a in zip(axes[0], attrs):
        t = sel[sel["attribute"] == a]
        order = list(dict.fromkeys(t["label"]))
        p = t.pivot_table(index="label", columns="model", values="value", aggfunc="mean").reindex(order)
        p.index = [i.replace(SEP, " ") for i in p.index]
        p.plot.bar(ax=ax, width=0.8, legend=ax is axes[0][-1])
        ax.set_title(a)
        ax.set_ylabel(f"proportion @k={k}")
        ax.set_ylim(0, 1)
    fig.suptitle(f"{subject} ({seg})")
    fig.tight_layout()
    path = save_figure(out, fig)
    plt.close(fig)
    return path


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", str(text)).strip("_").lower() or "x"


# ------------------------------------------------------------------------------------------- the steps' files


def write_tables(probe_paths, *, out_md=None, out_tex=None, out_csv=None, out_html=None, decimals: int = 2,
                 labels: Mapping[str, str] | None = None) -> dict:
    """``social probe-tables``: Tables 2 and 12-17 of the probe CSVs ``probe_paths``, written in the formats asked
    for (at least one, else a ConfigError)."""
    if not (out_md or out_tex or out_csv or out_html):
        raise ConfigError("probe-tables: nothing to write. Fix: pass --out-md, --out-tex, --out-csv and/or --out-html")
    tables = paper_tables(read_probe(probe_paths), labels=dict(labels or {}))
    if out_md:
        write_text(out_md, tables_markdown(tables, decimals))
    if out_html:
        write_text(out_html, tables_html(tables, decimals))
    if out_tex:
        write_text(out_tex, tables_latex(tables, decimals))
    if out_csv:
        write_csv(out_csv, tables_long(tables))
    return tables


def write_figures(probe_paths, out_dir, *, subjects=None, marginal: str = "gender:race", fmt: str = "png",
                  labels: Mapping[str, str] | None = None) -> None:
    """``social probe-plots``: Figures 3-5 (and 6-13) of the probe CSVs ``probe_paths`` in ``out_dir``; models
    named as the tables name them (``labels``), Figure 4's ``marginal`` as ``ATTR:GIVEN``."""
    from pathlib import Path

    df = probing.read_probe(probe_paths)
    labels = dict(labels or {})
    df["model"] = df["model"].map(lambda role: labels.get(role, role))    # figures name models as the tables do
    out = Path(out_dir)
    figure_maxskew_boxplots(df, out / f"maxskew_boxplots.{fmt}")
    attr, _, given = marginal.partition(":")
    if given:
        try:
            figure_marginal_bars(df, out / f"marginal_{slug(attr)}_by_{slug(given)}.{fmt}", attr, given)
        except ConfigError as exc:
            probing.log.warning("%s", exc)
    for subj in subjects or probing.settings(None)["figure_subjects"]:
        for seg in sorted(df[df["subject"] == subj]["segment"].unique()):
            figure_retrieval_proportions(df, out / f"proportions_{slug(subj)}_{slug(seg)}.{fmt}", subj, seg)
