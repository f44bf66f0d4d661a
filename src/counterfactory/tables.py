"""Paper-style result tables (layout of COCO-Counterfactuals Tables 3, 4 and 12).

Rows are training mixtures, optionally preceded by ``|D_train|``, ``|D_train^CF|`` and ``% CFs``
columns (from a mixture-info CSV); columns are metrics. Each cell is the mean with the sample
standard deviation as a subscript (the std is left out when it is undefined, n = 1, as for the
paper's pre-trained CLIP row).

* **Bold**: the best mean in each column, compared at the displayed precision, so ties that print
  the same are all bold. "Best" is the maximum, or the minimum for metrics whose summary rows
  have ``alternative == 'less'`` (lower is better).
* Underline: ``significant`` is True in the summary for a non-baseline row (one-tailed test of
  improvement over the baseline mixture, ``p <= alpha``).

Renderings (:func:`counterfactory.render.render_markdown` / :func:`~counterfactory.render.render_latex` /
:func:`~counterfactory.render.render_html` of :func:`describe`, the one table description every table writer
shares): Markdown (a pipe table; ``**x**``, ``<u>x</u>``, std as ``<sub>std</sub>``), LaTeX (booktabs;
``$\\underline{\\textbf{x}}_{std}$``), HTML (the page the Snakemake report shows) and a wide CSV (cell text
``mean_{std}`` plus per-metric ``best`` and ``significant`` flag columns; columns keep the metric keys).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from . import render
from .errors import InputError, input_error
from .io import write_csv, write_text
from .render import Cell, Column, Text
from .stats import parse_numeric, read_csv_as_text, require_columns, row_line

log = logging.getLogger(__name__)

SUMMARY_REQUIRED = ("experiment", "metric", "mixture", "n", "mean", "std", "significant", "baseline")
#: yes/no columns of a mixture-info CSV, shown as a check mark or a cross (CounterCurate Table 4's
#: "Negative Images / Negative Captions / Grouping")
FLAG_COLUMNS = ("negative_images", "negative_captions", "grouping")
INFO_COLUMNS = ("n_train", "n_cf", "pct_cf", *FLAG_COLUMNS)
_FLAG_HEADERS = {"negative_images": "Negative images", "negative_captions": "Negative captions",
                 "grouping": "Grouping"}
INFO_HEADERS_MD = {
    "n_train": "\\|D<sub>train</sub>\\|",
    "n_cf": "\\|D<sup>CF</sup><sub>train</sub>\\|",
    "pct_cf": "% CFs",
    **_FLAG_HEADERS,
}
INFO_HEADERS_TEX = {
    "n_train": "$|D_{\\text{train}}|$",
    "n_cf": "$|D^{\\text{CF}}_{\\text{train}}|$",
    "pct_cf": "\\% CFs",
    **_FLAG_HEADERS,
}
FLAG_MD = {"yes": "✓", "no": "×"}
FLAG_TEX = {"yes": "$\\checkmark$", "no": "$\\times$"}
_FLAG_WORDS = {"yes": "yes", "true": "yes", "1": "yes", "no": "no", "false": "no", "0": "no"}


@dataclass
class PaperTable:
    row_keys: list[str]                      # mixture ids, in display order
    row_labels: list[str]                    # display names
    info_columns: list[str]                  # subset of INFO_COLUMNS, in that order
    info: dict[str, dict[str, str]]          # mixture -> info column -> display text
    col_keys: list[tuple[str, str]]          # (experiment, metric)
    col_labels: list[str]                    # metric keys (the CSV's column names)
    cells: dict[tuple[str, tuple[str, str]], Cell] = field(default_factory=dict)
    decimals: int = 2
    std_decimals: int = 1
    row_header: str = "Training dataset"
    #: the paper's column headers, ``(group, label)`` per column (Markdown writes ``group label``, LaTeX and
    #: HTML an upper header row); empty: the metric keys
    col_headers: list[tuple[str, str]] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# headers
# --------------------------------------------------------------------------------------------
#: display names of evaluation sets in metric keys (``flickr30k/image_to_text@1``)
DATASET_NAMES = {"flickr30k": "Flickr30k", "coco": "MS-COCO", "mscoco": "MS-COCO", "looktwice": "PointQA-LookTwice",
                 "sugarcrepe": "SugarCrepe", "winoground": "Winoground", "positions": "Flickr30k-Positions"}
_DIRECTIONS = {"image_to_text": "I→T", "text_to_image": "T→I"}
#: CounterCurate's subsets and SugarCrepe's categories as the papers' headers (Tables 1-4)
_SUBSETS = {"LR": "LR", "AB": "AB", "both": "Both", "all": "", "add": "Add", "replace": "Replace", "swap": "Swap",
            "average": "Average"}
_SCORES = {"accuracy": "", "text_score": "Text score", "image_score": "Image score", "group_score": "Group score",
           "macro_accuracy": "macro accuracy"}


def dataset_name(name: str) -> str:
    """``flickr30k`` -> ``Flickr30k``: the paper's name of an evaluation set (unknown names as given)."""
    return DATASET_NAMES.get(name, name)


def metric_header(metric: str) -> tuple[str, str]:
    """``(group, label)`` of a metric key as the papers head its column: retrieval ``<set>/image_to_text@K`` ->
    ``("Flickr30k I→T", "R@K")`` and ``<set>/mean`` -> ``("Flickr30k", "Mean")`` (COCO-CF Tables 3 / 12);
    ``<dataset>/top1`` -> the dataset and ``classification/mean`` -> ``Mean`` (Table 4); CounterCurate's
    ``<benchmark>/<subset>/<score>`` -> the subset (``LR``, ``AB``, ``Both``, ``Add``; Tables 1-4). Other keys as
    given."""
    parts = str(metric).split("/")
    if len(parts) == 2:
        head, tail = parts
        if "@" in tail and tail.split("@")[0] in _DIRECTIONS:
            direction, k = tail.split("@", 1)
            return f"{dataset_name(head)} {_DIRECTIONS[direction]}", f"R@{k}"
        if tail == "mean":
            return ("", "Mean") if head == "classification" else (dataset_name(head), "Mean")
        if tail == "top1":
            return "", head
    if len(parts) == 3 and parts[1] in _SUBSETS and parts[2] in _SCORES:
        subset, score = _SUBSETS[parts[1]], _SCORES[parts[2]]
        label = " ".join(x for x in (subset, score) if x) or "Accuracy"
        return "", label
    return "", str(metric)


# --------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------

_SUMMARY_FIX = "pass the CSV written by 'counterfactory stats summarize'"


def _parse_bool(frame: pd.DataFrame, column: str, path) -> pd.Series:
    text = frame[column].astype(str).str.strip().str.lower()
    mapping = {"true": True, "false": False, "1": True, "0": False, "": False}
    bad = ~text.isin(list(mapping))
    if bad.any():
        first = bad.idxmax()
        raise input_error(path, row_line(first), f"{column} {frame[column][first]!r} is not True/False",
                          f"write True or False in the {column} column")
    return text.map(mapping).astype(bool)


def read_summary(path: str | Path) -> pd.DataFrame:
    """Read a summary CSV (from ``stats summarize``) with typed n/mean/std/significant."""
    path = Path(path)
    frame = read_csv_as_text(path, "summary table", _SUMMARY_FIX)
    require_columns(frame, SUMMARY_REQUIRED, path, _SUMMARY_FIX)
    if frame.empty:
        raise input_error(path, None, "summary table has no rows", "summarize a runs table with at least one run")
    ctx = ("experiment", "metric", "mixture")
    frame["mean"] = parse_numeric(frame, "mean", path, context=ctx)
    frame["std"] = parse_numeric(frame, "std", path, allow_empty=True, context=ctx)
    frame["n"] = parse_numeric(frame, "n", path, integer=True, context=ctx).astype(int)
    frame["significant"] = _parse_bool(frame, "significant", path)
    if "alternative" not in frame.columns:
        frame["alternative"] = "greater"
    frame["alternative"] = frame["alternative"].astype(str).str.strip().replace("", "greater")
    dup = frame.duplicated(list(ctx), keep=False)
    if dup.any():
        first = dup.idxmax()
        where = ", ".join(f"{k}={frame.loc[first, k]}" for k in ctx)
        raise input_error(path, row_line(first), f"({where}) appears twice",
                          "keep one summary row per experiment, metric and mixture")
    return frame


def read_mixture_info(path: str | Path) -> pd.DataFrame:
    """Read a mixture-info CSV: ``mixture`` plus any of ``label, n_train, n_cf, pct_cf`` (pct in 0-100) and the
    yes/no columns :data:`FLAG_COLUMNS`."""
    path = Path(path)
    fix = ("write a CSV with a 'mixture' column and any of label, n_train, n_cf, pct_cf (percent, 0-100), "
           f"{', '.join(FLAG_COLUMNS)} (yes / no)")
    frame = read_csv_as_text(path, "mixture info", fix)
    require_columns(frame, ["mixture"], path, fix)
    frame["mixture"] = frame["mixture"].astype(str).str.strip()
    for col in INFO_COLUMNS:
        if col in FLAG_COLUMNS and col in frame.columns:
            words = frame[col].astype(str).str.strip().str.lower()
            bad = ~words.isin([*_FLAG_WORDS, ""])
            if bad.any():
                first = bad.idxmax()
                raise input_error(path, row_line(first), f"{col} = {frame.loc[first, col]!r} is not yes / no",
                                  f"write {col} as yes or no (or leave it empty)")
            frame[col] = words.map(lambda w: _FLAG_WORDS.get(w, ""))
        elif col in frame.columns:
            parse_numeric(frame, col, path, allow_empty=True, context=("mixture",), fix=f"write {col} as a number")
    dup = frame["mixture"].duplicated(keep=False)
    if dup.any():
        first = dup.idxmax()
        raise input_error(path, row_line(first), f"mixture {frame.loc[first, 'mixture']!r} is listed twice",
                          "keep one row per mixture")
    return frame


# --------------------------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------------------------

def _format_info(column: str, text: str) -> str:
    text = str(text).strip()
    if text == "" or column in FLAG_COLUMNS:
        return text
    value = float(text)
    if column == "pct_cf":
        return f"{value:.0f}%" if value == round(value) else f"{value:.1f}%"
    return f"{int(round(value)):,}" if value == round(value) else f"{value:,}"


def _select(requested: Sequence[str] | None, available: list, label_of, what: str, option: str) -> list:
    if not requested:
        return list(available)
    chosen = []
    for name in requested:
        optional = name.endswith("?")            # "name?": the column if the results have it (a paper column
        name = name[:-1] if optional else name   # a small run may lack, e.g. a subset with no test items)
        matches = [a for a in available if name in label_of(a)]
        if not matches and optional:
            log.info("%s: no %s %r in the results; its column is left out", option, what, name)
            continue
        if not matches:
            names = ", ".join(dict.fromkeys(label_of(a)[0] for a in available))
            raise InputError(f"{option}: unknown {what} {name!r} (available: {names}). Fix: use one of the available names")
        chosen.extend(m for m in matches if m not in chosen)
    left_out = [label_of(a)[0] for a in available if a not in chosen]
    if left_out:
        log.info("%s leaves out %s: %s", option, what, ", ".join(left_out))
    return chosen


def build_table(summary: pd.DataFrame, *, metrics: Sequence[str] | None = None,
                mixture_order: Sequence[str] | None = None, experiment: str | None = None,
                mixture_info: pd.DataFrame | None = None, decimals: int = 2, std_decimals: int = 1,
                row_header: str = "Training dataset", pretrained: str | None = None,
                pretrained_label: str | None = None, headers: Sequence[tuple[str, str]] | None = None,
                mixture_labels: Mapping[str, str] | None = None) -> PaperTable:
    """Arrange summary rows into a :class:`PaperTable` and mark best and significant cells.

    ``metrics`` selects and orders columns: each entry is a metric name (every experiment's
    column of that metric) or ``experiment:metric``; a trailing ``?`` makes an entry optional (left out when the
    summary lacks it). ``mixture_order`` selects and orders rows;
    mixtures it leaves out are dropped. With more than one experiment, column labels are
    ``experiment:metric``.

    ``pretrained`` names the mixture of the pre-trained model's runs (COCO-CF Tables 3, 4 and 12: "None
    (pre-trained CLIP)", one run, no std): it becomes the first row, labelled ``pretrained_label``, with
    ``|D_train|``, ``|D_train^CF|`` and ``% CFs`` of 0 wherever the mixture info has those columns.

    Columns are headed as the papers head them (:func:`metric_header`: ``R@1`` under ``Flickr30k I→T``, the
    dataset names of Table 4, ``LR / AB / Both``) unless ``headers`` gives ``(group, label)`` per selected column.

    Rows are named by ``mixture_labels`` (mixture key -> the paper's row name, e.g. ``base`` -> ``MS-COCO +
    COCO-CFs (base)``), else by the mixture info's ``label`` column, else by the key.
    """
    if decimals < 0 or std_decimals < 0:
        raise InputError("decimals must be >= 0. Fix: pass e.g. --decimals 2")
    frame = summary
    if experiment is not None:
        frame = frame[frame["experiment"] == experiment]
        if frame.empty:
            names = ", ".join(dict.fromkeys(summary["experiment"]))
            raise InputError(f"--experiment: unknown experiment {experiment!r} (available: {names}). "
                             "Fix: use one of the available names")
    col_all = list(dict.fromkeys(zip(frame["experiment"], frame["metric"])))
    multi = len({e for e, _ in col_all}) > 1

    def col_label(key):
        return f"{key[0]}:{key[1]}" if multi else key[1]

    col_keys = _select(metrics, col_all, lambda k: (col_label(k), k[1], f"{k[0]}:{k[1]}"), "metric", "--metrics")
    row_all = list(dict.fromkeys(frame["mixture"]))
    if pretrained is not None and pretrained not in row_all:
        raise InputError(f"--pretrained-row: the summary has no mixture {pretrained!r} (mixtures: "
                         f"{', '.join(row_all)}). Fix: collect the pre-trained run into the runs table")
    row_keys = _select(mixture_order, row_all, lambda m: (m,), "mixture", "--mixture-order")
    if pretrained is not None:
        row_keys = [pretrained] + [m for m in row_keys if m != pretrained]

    labels = {m: m for m in row_keys}
    info: dict[str, dict[str, str]] = {m: {} for m in row_keys}
    info_columns: list[str] = []
    if mixture_info is not None:
        by_mix = mixture_info.set_index("mixture")
        info_columns = [c for c in INFO_COLUMNS if c in by_mix.columns]
        for m in row_keys:
            if m not in by_mix.index:
                continue
            rec = by_mix.loc[m]
            if "label" in by_mix.columns and str(rec["label"]).strip():
                labels[m] = str(rec["label"]).strip()
            for c in info_columns:
                info[m][c] = _format_info(c, rec[c])
        if pretrained is not None and pretrained not in by_mix.index:
            info[pretrained] = {c: _format_info(c, "0") for c in info_columns if c in ("n_train", "n_cf", "pct_cf")}
        unknown = [m for m in row_keys if m not in by_mix.index and m != pretrained]
        if unknown:
            log.warning("mixture info has no row for: %s", ", ".join(unknown))

    for m, name in (mixture_labels or {}).items():
        if m in labels and str(name).strip():
            labels[m] = str(name).strip()
    if pretrained is not None and pretrained_label:
        labels[pretrained] = pretrained_label
    if headers is not None and len(headers) != len(col_keys):
        raise InputError(f"headers: {len(headers)} given for {len(col_keys)} columns. Fix: give one per column")

    def col_header(key) -> tuple[str, str]:
        group, label = metric_header(key[1])
        if (group, label) == ("", key[1]):       # no paper header known: the key as before
            return "", col_label(key)
        return (f"{key[0]} {group}".strip() if multi else group), label

    col_headers = [tuple(h) for h in headers] if headers is not None else [col_header(k) for k in col_keys]
    table = PaperTable(row_keys=row_keys, row_labels=[labels[m] for m in row_keys], info_columns=info_columns,
                       info=info, col_keys=col_keys, col_labels=[col_label(k) for k in col_keys],
                       decimals=decimals, std_decimals=std_decimals, row_header=row_header,
                       col_headers=col_headers)
    indexed = frame.set_index(["mixture", "experiment", "metric"]).sort_index()
    for key in col_keys:
        lower_better = False
        for m in row_keys:
            if (m, *key) not in indexed.index:
                continue
            rec = indexed.loc[(m, *key)]
            lower_better = str(rec["alternative"]) == "less"
            is_base = str(rec["baseline"]).strip() == m
            table.cells[(m, key)] = Cell(mean=float(rec["mean"]), std=float(rec["std"]), n=int(rec["n"]),
                                         significant=bool(rec["significant"]) and not is_base)
        shown = {m: round(c.mean, decimals) for (m, k), c in table.cells.items() if k == key}
        if shown:
            target = min(shown.values()) if lower_better else max(shown.values())
            for m, v in shown.items():
                table.cells[(m, key)].best = v == target
    return table


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------

def cell_markdown(cell: Cell | None, decimals: int = 2, std_decimals: int = 1) -> str:
    return render.format_cell(cell, "md", decimals, std_decimals)


def cell_latex(cell: Cell | None, decimals: int = 2, std_decimals: int = 1) -> str:
    return render.format_cell(cell, "tex", decimals, std_decimals)


def cell_plain(cell: Cell | None, decimals: int = 2, std_decimals: int = 1) -> str:
    return render.format_cell(cell, "plain", decimals, std_decimals)


NOTE = ("Mean over runs with the sample standard deviation as subscript; best mean per column in bold; "
        "underlined: one-tailed t-test shows a significant improvement over the baseline.")
#: the note of a table where no cell has a standard deviation (one run per row): no subscript is shown
NOTE_ONE_RUN = ("One run per row (no standard deviation); best value per column in bold; underlined: one-tailed "
                "t-test shows a significant improvement over the baseline.")


def _info_value(text: str) -> render.Value:
    if text in FLAG_MD:
        return Text(FLAG_MD[text], FLAG_TEX[text])
    return text or None


def describe(table: PaperTable, title: str | None = None, label: str | None = None) -> render.Table:
    """``table`` as the shared table description (:class:`counterfactory.render.Table`)."""
    columns = [Column(table.row_header, "left")]
    columns += [Column(Text(INFO_HEADERS_MD[c], INFO_HEADERS_TEX[c]), "right") for c in table.info_columns]
    headers = table.col_headers or [("", c) for c in table.col_labels]
    columns += [Column(label, "center", group) for group, label in headers]
    rows = [[render.script_label(lab)] + [_info_value(table.info[m].get(c, "")) for c in table.info_columns]
            + [table.cells.get((m, k)) for k in table.col_keys]
            for m, lab in zip(table.row_keys, table.row_labels)]
    shown_std = any(math.isfinite(c.std) for c in table.cells.values())
    return render.Table(columns, rows, title=title.strip() if title else None, label=label,
                        note=NOTE if shown_std else NOTE_ONE_RUN,
                        decimals=table.decimals, std_decimals=table.std_decimals)


def render_markdown(table: PaperTable, title: str | None = None) -> str:
    return render.render_markdown(describe(table, title))


def render_latex(table: PaperTable, title: str | None = None, label: str | None = None) -> str:
    """A booktabs LaTeX table (``Styler.to_latex``); cell and header text is escaped."""
    return render.render_latex(describe(table, title, label))


def render_html(table: PaperTable, title: str | None = None) -> str:
    """``table`` as a standalone HTML page (what Snakemake's report viewer shows), from the same description as
    the Markdown and LaTeX."""
    desc = describe(table, title)
    return render.html_page(desc.title or "Table", [render.render_html(desc)])


def to_frame(table: PaperTable) -> pd.DataFrame:
    """Wide CSV form: one row per mixture; per metric the cell text and best/significant flags."""
    records = []
    for m, label in zip(table.row_keys, table.row_labels):
        rec: dict[str, object] = {"mixture": m, "label": label}
        for c in table.info_columns:
            rec[c] = table.info[m].get(c, "")
        for key, col in zip(table.col_keys, table.col_labels):
            cell = table.cells.get((m, key))
            rec[col] = cell_plain(cell, table.decimals, table.std_decimals)
            rec[f"{col} best"] = bool(cell and cell.best)
            rec[f"{col} significant"] = bool(cell and cell.significant)
        records.append(rec)
    return pd.DataFrame(records)


def write_table_files(summary_path: str | Path, *, out_md: str | None = None, out_tex: str | None = None,
                      out_csv: str | None = None, out_html: str | None = None, title: str | None = None,
                      label: str | None = None, mixture_info: str | Path | None = None, **build) -> PaperTable:
    """``counterfactory stats table``: the summary CSV of ``stats summarize`` (:func:`read_summary`) and the
    optional mixture-info CSV (:func:`read_mixture_info`) as a :class:`PaperTable` (:func:`build_table`, with the
    keywords ``build``), written to each output given: Markdown, LaTeX (``label``: its ``\\label``), the wide CSV
    (:func:`to_frame`) and an HTML page; ``title`` is their caption. Returns the table."""
    summary = read_summary(summary_path)
    info = read_mixture_info(mixture_info) if mixture_info else None
    table = build_table(summary, mixture_info=info, **build)
    if out_md:
        write_text(out_md, render_markdown(table, title))
    if out_tex:
        write_text(out_tex, render_latex(table, title, label))
    if out_csv:
        write_csv(out_csv, to_frame(table))
    if out_html:
        write_text(out_html, render_html(table, title))
    return table
