"""Evaluation tables: build (pandas), describe (:class:`counterfactory.render.Table`) and render (Markdown).

* Table 2 / 13 layout (:func:`itr_table`, :func:`render_itr_markdown`): one row per model and dataset,
  ``TR@K``/``IR@K`` with the change relative to the same model on MS-COCO, ``100 · (R − R_MS-COCO) /
  R_MS-COCO`` (whole percent; the largest drop of each row in bold).
* ITM differences summary (:func:`itm_summary`, :func:`render_itm_markdown`).
* Table 4 layout (:func:`classification_table`, :func:`render_classification_markdown`): models x datasets
  plus the unweighted ``Mean``.
"""

from __future__ import annotations

import html
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from ..errors import InputError
from ..render import Cell, Column, Table, Text, html_page, markdown_body, render_html, render_markdown
from .settings import BASELINE, ITM_METRICS


# --------------------------------------------------------------------------------------------
# retrieval (Tables 2 / 13)
# --------------------------------------------------------------------------------------------
def relative_change(value: float, baseline: float) -> float:
    """``100 · (value − baseline) / baseline`` in percent; NaN when the baseline is 0."""
    if baseline == 0 or not np.isfinite(baseline):
        return float("nan")
    return 100.0 * (value - baseline) / baseline


def _metric_order(metrics: Iterable[str]) -> list[str]:
    def key(m: str):
        head, k = m.split("@")
        return (0 if head == "TR" else 1, int(k))

    return sorted(set(metrics), key=key)


def itr_table(long: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Wide Table-2 layout: one row per (model, dataset), columns ``TR@K``/``IR@K`` and
    ``<metric> rel%`` (relative change vs. the model's ``baseline`` row; NaN on the baseline row)."""
    need = {"role", "model", "dataset", "metric", "value"}
    if not need <= set(long.columns):
        raise InputError(f"ITR results lack columns {sorted(need - set(long.columns))}. "
                         f"Fix: pass the CSVs written by `counterfactory evaluate itr`")
    metrics = _metric_order(long["metric"])
    out = []
    for role, group in long.groupby("role", sort=False):
        wide = group.pivot_table(index="dataset", columns="metric", values="value", aggfunc="first")
        extra = group.drop_duplicates("dataset").set_index("dataset")
        if baseline not in wide.index:
            raise InputError(f"ITR results of role {role} have no {baseline!r} rows. Fix: rerun `evaluate itr`")
        datasets = [baseline] + [d for d in dict.fromkeys(group["dataset"]) if d != baseline]
        for ds in datasets:
            row = {"model": extra.loc[ds, "model"], "role": role, "dataset": ds}
            for col in ("n_pairs", "n_images", "n_texts"):
                if col in extra.columns:
                    row[col] = int(extra.loc[ds, col])
            for m in metrics:
                row[m] = float(wide.loc[ds, m])
            for m in metrics:
                row[f"{m} rel%"] = (float("nan") if ds == baseline
                                    else relative_change(wide.loc[ds, m], wide.loc[baseline, m]))
            out.append(row)
    return pd.DataFrame(out)


def _fmt_change(pct: float) -> str:
    if not np.isfinite(pct):
        return "n/a"
    r = int(round(pct))
    return f"{'+' if r > 0 else ''}{r}%"


def _blank_repeats(values: Iterable) -> list[str]:
    """A column's values with each run of repeats after its first shown as ''."""
    out, prev = [], object()
    for v in values:
        out.append("" if v == prev else str(v))
        prev = v
    return out


ITR_NOTE = ("TR = text retrieval (image→text), IR = image retrieval (text→image), Recall@K in percent. "
            f"In parentheses: change relative to the same model on {BASELINE} (the matched real subset); "
            "the largest drop of each row is bold.")
ITM_NOTE = ("IR_r = G(C_r, I_r) − G(C_r, I_o), TR_r = G(C_r, I_r) − G(C_o, I_r), IR_c = G(C_c, I_c^s) − "
            "G(C_c, I_o^s), TR_c = G(C_c, I_c^s) − G(C_o, I_c^s) (§4.2.2); > 0 means the matching pair scored "
            "higher. % < 0: share of pairs scored incorrectly.")
CLASSIFICATION_NOTE = ("Zero-shot: each class is scored by the cosine between the image and its prompt embedding "
                       "(templates averaged); Mean = unweighted mean over the datasets shown.")


def describe_itr(table: pd.DataFrame, title: str | None = None, decimals: int = 2) -> Table:
    """Table 2 layout as a :class:`counterfactory.render.Table` (names from config and data are escaped per format)."""
    metrics = [c for c in table.columns if "@" in c and not c.endswith("rel%")]
    ordered = [m for m in metrics if m.startswith("TR")] + [m for m in metrics if m.startswith("IR")]
    cells = []
    for _, row in table.iterrows():
        changes = {m: row[f"{m} rel%"] for m in ordered}
        finite = [v for v in changes.values() if np.isfinite(v)]
        worst = min(finite) if finite else None
        texts = []
        for m in ordered:
            text = f"{row[m]:.{decimals}f}"
            if np.isfinite(changes[m]):
                change = _fmt_change(changes[m])
                if worst is not None and worst < 0 and round(changes[m]) == round(worst):
                    change = f"**{change}**"
                text += f" ({change})"
            texts.append(text)
        cells.append(texts)
    columns = [Column("Model", "left"), Column("Evaluated dataset", "left")]
    columns += [Column(Text(f"{m[:2]} R@{m.split('@')[1]}"), "right") for m in ordered]
    rows = [[model, dataset, *map(Text, texts)]           # names from config / data: escaped per format
            for model, dataset, texts in zip(_blank_repeats(table["model"]), table["dataset"].astype(str), cells)]
    return Table(columns, rows, title=title or None, note=ITR_NOTE)


def render_itr_markdown(table: pd.DataFrame, title: str | None = None, decimals: int = 2) -> str:
    """Markdown in the layout of Table 2: ``R (±x%)`` with the largest drop of each row in bold."""
    return render_markdown(describe_itr(table, title, decimals))


def render_itr_html(table: pd.DataFrame, title: str | None = None, decimals: int = 2) -> str:
    """:func:`render_itr_markdown`'s table as a standalone HTML page (what the report shows)."""
    return html_page(title or "Image-text retrieval", [render_html(describe_itr(table, title, decimals))])


# --------------------------------------------------------------------------------------------
# ITM differences (Figure 3)
# --------------------------------------------------------------------------------------------
def itm_summary(per_pair: pd.DataFrame) -> pd.DataFrame:
    """Per model and metric: n, mean, std (ddof=1), median, quartiles, share of pairs below zero (%)."""
    long = per_pair.melt(id_vars=["role", "model"], value_vars=list(ITM_METRICS), var_name="metric")
    long["below_zero"] = 100.0 * (long["value"] < 0)
    groups = long.groupby(["role", "model", "metric"], sort=False)
    stats = groups["value"].agg(n="size", mean="mean", std="std", median="median",
                                q25=lambda v: v.quantile(0.25), q75=lambda v: v.quantile(0.75))
    stats["pct_below_zero"] = groups["below_zero"].mean()
    stats["n"] = stats["n"].astype(int)
    return stats.reset_index()


def describe_itm(summary: pd.DataFrame, title: str | None = None) -> Table:
    """The ITM summary as a :class:`counterfactory.render.Table` (names escaped per format)."""
    texts = zip(_blank_repeats(summary["model"]), summary["metric"].astype(str), summary["n"].astype(int).astype(str),
                [f"{v:.4g}" for v in summary["mean"]],
                ["n/a" if not np.isfinite(v) else f"{v:.4g}" for v in summary["std"]],
                [f"{v:.4g}" for v in summary["median"]], [f"{v:.1f}" for v in summary["pct_below_zero"]])
    columns = [Column("Model", "left"), Column("Metric", "left")] + [Column(h, "right") for h in
                                                                      ("n", "Mean", "Std", "Median", "% < 0")]
    return Table(columns, [list(row) for row in texts], title=title or None, note=ITM_NOTE)


def render_itm_markdown(summary: pd.DataFrame, title: str | None = None) -> str:
    return render_markdown(describe_itm(summary, title))


def render_itm_html(summary: pd.DataFrame, title: str | None = None) -> str:
    return html_page(title or "ITM score differences", [render_html(describe_itm(summary, title))])


# --------------------------------------------------------------------------------------------
# zero-shot classification (Table 4)
# --------------------------------------------------------------------------------------------
def classification_table(results: Sequence[dict], metric: str = "top1",
                         dataset_order: Sequence[str] | None = None) -> pd.DataFrame:
    """Table 4 layout: one row per model, one column per dataset, plus ``Mean`` over the datasets."""
    if not results:
        raise InputError("no classification results. Fix: pass the JSON files of `counterfactory evaluate classify`")
    frame = pd.DataFrame(list(results))
    if metric not in frame.columns:
        raise InputError(f"classification results have no {metric!r}. Fix: include its k in evaluation.classification.topk")
    order = list(dataset_order) if dataset_order else list(dict.fromkeys(frame["dataset"]))
    order = [d for d in order if d in set(frame["dataset"])]
    wide = frame.pivot_table(index=["model", "role"], columns="dataset", values=metric, aggfunc="first", sort=False)
    wide = wide.reindex(columns=order)
    wide["Mean"] = wide.mean(axis=1, skipna=True)
    wide.columns.name = None
    return wide.reset_index()


def render_classification_markdown(tables: dict[str, pd.DataFrame], title: str | None = None,
                                   decimals: int = 2) -> str:
    lines = [f"**{title}**", ""] if title else []
    for metric, table in tables.items():
        lines += [f"{metric.replace('top', 'Top-')} accuracy (%)", "",
                  markdown_body(describe_classification(table, decimals)), ""]
    lines.append(CLASSIFICATION_NOTE)
    return "\n".join(lines) + "\n"


def render_classification_html(tables: dict[str, pd.DataFrame], title: str | None = None,
                               decimals: int = 2) -> str:
    """:func:`render_classification_markdown` as a standalone HTML page: one table per metric."""
    bodies = []
    for metric, table in tables.items():
        desc = describe_classification(table, decimals)
        bodies.append(render_html(Table(desc.columns, desc.rows, title=f"{metric.replace('top', 'Top-')} "
                                         "accuracy (%)", decimals=desc.decimals)))
    bodies.append(f'<p class="note">{html.escape(CLASSIFICATION_NOTE)}</p>')
    return html_page(title or "Zero-shot classification", bodies)


def describe_classification(table: pd.DataFrame, decimals: int = 2) -> Table:
    """One metric's :func:`classification_table` as a :class:`counterfactory.render.Table` (names escaped per format)."""
    cols = [c for c in table.columns if c not in ("model", "role")]
    columns = [Column("Model", "left")] + [Column(str(c), "right") for c in cols]
    rows = [[str(model)] + [None if pd.isna(v) else Cell(v) for v in values]
            for model, values in zip(table["model"], table[cols].itertuples(index=False))]
    return Table(columns, rows, decimals=decimals)
