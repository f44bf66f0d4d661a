"""The evaluation stage's merge steps on files (``counterfactory evaluate itr-table``, ``itm-summary``,
``classify-table``): the per-model results read (:mod:`.readers`), their ``model`` column named by the display
names, and written as the paper's tables (:mod:`.tables`: CSV, Markdown, an optional HTML page) and plots
(:mod:`.plots`)."""

from __future__ import annotations

import pandas as pd

from ..io import save_figure, write_csv, write_text
from .plots import plot_classification, plot_itm
from .readers import read_classification_results, read_itm_results, read_itr_results
from .tables import (classification_table, itm_summary, itr_table, render_classification_html,
                     render_classification_markdown, render_itm_html, render_itm_markdown, render_itr_html,
                     render_itr_markdown)


def relabel(frame: pd.DataFrame, labels: dict) -> pd.DataFrame:
    """The ``model`` column named by ``labels`` (role -> display name, the config's display names: a table-only
    setting, so the per-model results carry the model's own name and a rename reruns only the tables)."""
    if labels and "role" in frame.columns:
        frame = frame.copy()
        frame["model"] = [labels.get(r, m) for r, m in zip(frame["role"], frame["model"])]
    return frame


def write_itr_table(inputs, out_csv, out_md, out_html=None, title: str | None = None,
                    labels: dict | None = None) -> pd.DataFrame:
    """Tables 2/13 from the per-model ITR results ``inputs``: CSV, Markdown and (with ``out_html``) HTML."""
    table = itr_table(relabel(read_itr_results(inputs), labels or {}))
    write_csv(out_csv, table)
    write_text(out_md, render_itr_markdown(table, title))
    if out_html:
        write_text(out_html, render_itr_html(table, title))
    return table


def write_itm_summary(inputs, out_csv, out_md, out_png, out_html=None, bins: int = 40, title: str | None = None,
                      labels: dict | None = None) -> pd.DataFrame:
    """The ITM differences' summary (CSV, Markdown, optional HTML) and the Figure 3 style histograms (``out_png``)
    from the per-model tables ``inputs``."""
    per_pair = relabel(read_itm_results(inputs), labels or {})
    summary = itm_summary(per_pair)
    write_csv(out_csv, summary)
    write_text(out_md, render_itm_markdown(summary, title))
    if out_html:
        write_text(out_html, render_itm_html(summary, title))
    save_figure(out_png, plot_itm(per_pair, bins=bins))
    return summary


def write_classification_table(inputs, out_csv, out_md, out_html=None, out_png=None, order=None,
                               title: str | None = None, labels: dict | None = None) -> dict[str, pd.DataFrame]:
    """Table 4 from the per-model classification results ``inputs``: one table per top-k metric (top-1 first) in
    the dataset ``order`` (default: as given), as a long CSV, Markdown, optional HTML and an optional bar chart of
    the first metric (``out_png``). Returns the tables (metric -> table)."""
    labels = labels or {}
    results = [{**r, "model": labels.get(r.get("role"), r.get("model"))} for r in read_classification_results(inputs)]
    metrics = sorted({k for r in results for k in r if k.startswith("top") and k[3:].isdigit()},
                     key=lambda k: int(k[3:]))
    tables = {m: classification_table(results, m, order) for m in metrics}
    long = pd.concat([t.assign(metric=m) for m, t in tables.items()], ignore_index=True)
    write_csv(out_csv, long[["metric"] + [c for c in long.columns if c != "metric"]])
    write_text(out_md, render_classification_markdown(tables, title))
    if out_html:
        write_text(out_html, render_classification_html(tables, title))
    if out_png:
        save_figure(out_png, plot_classification(tables[metrics[0]], metrics[0]))
    return tables
