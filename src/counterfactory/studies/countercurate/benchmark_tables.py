"""CounterCurate benchmark result tables (Zhang et al., Findings of ACL 2024, §4.2–§4.5 and appendices E–G): the long results of
:func:`.benchmarks.evaluate` laid out as the paper's Tables 1/4, 2/8, 3/6 and 7.

Results
-------
:func:`evaluate` returns ``(results, items)``: the long results table with the columns :data:`RESULT_COLUMNS`
(``model, benchmark, subset, metric, value, n``; ``value`` a fraction in [0, 1], ``n`` the number of items) and the
per-item scores. :func:`build_table` lays results out as in Tables 1/4 (positions: rows = models, columns LR / AB /
Both), 8 (looktwice: rows = models or training variants, column Accuracy; Table 2 shows the same numbers with model
families as columns), 3/6 (sugarcrepe: rows = categories, columns = models) and 7 (winoground: rows = models, columns
Text / Image / Group Score), in percent with two decimals; :func:`render_markdown`, :func:`render_latex`,
:func:`table_frame` render them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ... import render
from ...errors import ConfigError, InputError, input_error
from ...io import write_csv, write_text
from ...render import Cell, Column
from .benchmarks import BENCHMARKS, RESULT_COLUMNS, SUGARCREPE_GROUP_LABELS, SUGARCREPE_LABELS


#: the columns of the fine-tuning tables per training dataset, as the paper shows them: Flickr30k-Positions
#: LR / AB / Both (§4.2 Table 1, §4.5 Table 4), PointQA-LookTwice accuracy (§4.3 Table 2), SugarCrepe's Add / Replace
#: / Swap / Average (§4.4 Table 3); the runs' other metrics (Winoground-style scores, macro accuracies) stay in
#: the summary CSV
FINETUNE_COLUMNS = {
    "positions": ["positions/LR/accuracy", "positions/AB/accuracy", "positions/both/accuracy"],
    "counting": ["looktwice/all/accuracy"],
    "attributes": [f"sugarcrepe/{g}/accuracy" for g in ("add", "replace", "swap", "average")],
}


def finetune_metrics(dataset: str) -> str:
    """``--metrics`` of ``stats table`` for ``dataset``'s fine-tuning table (:data:`FINETUNE_COLUMNS`), each
    optional (``?``: a subset a small run has no test items of is left out rather than failing)."""
    if dataset not in FINETUNE_COLUMNS:
        raise ConfigError(f"unknown CounterCurate dataset {dataset!r}. Fix: use one of {', '.join(FINETUNE_COLUMNS)}")
    return ",".join(f"{m}?" for m in FINETUNE_COLUMNS[dataset])


# ----------------------------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------------------------
def read_results(paths: str | Path | Sequence[str | Path]) -> pd.DataFrame:
    """Concatenate results CSVs of ``countercurate evaluate``; a missing column or a repeated
    (model, benchmark, subset, metric) is an error naming the file."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    parts, seen = [], {}
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise input_error(p.resolve(), None, "results table not found", "run 'countercurate evaluate' first")
        frame = pd.read_csv(p, keep_default_na=False, na_values=[""], dtype={"model": str, "subset": str})
        missing = [c for c in RESULT_COLUMNS if c not in frame.columns]
        if missing:
            raise input_error(p, None, f"missing column(s) {', '.join(missing)}",
                              "pass results tables written by 'countercurate evaluate'")
        for i, key in enumerate(zip(frame["model"], frame["benchmark"], frame["subset"], frame["metric"])):
            if key in seen:
                raise input_error(p, f"row {i}", f"{key} is also in {seen[key]}",
                                  "give each model its own name (evaluate --model) or pass each result once")
            seen[key] = p
        parts.append(frame[RESULT_COLUMNS])
    if not parts:
        raise InputError("no results table given. Fix: pass --results FILE.csv")
    return pd.concat(parts, ignore_index=True)


@dataclass
class BenchmarkTable:
    """One paper table: ``values`` in percent (rows x columns, NaN = missing); ``deltas`` (same shape or None) are
    the differences to a baseline shown in parentheses as in Table 3."""

    name: str
    title: str
    row_header: str
    values: pd.DataFrame
    deltas: pd.DataFrame | None = None
    decimals: int = 2
    notes: list[str] = field(default_factory=list)


TITLES = {
    "positions": "Flickr30k-Positions test accuracy (%), CounterCurate Tables 1 and 4",
    "looktwice": "PointQA-LookTwice counting accuracy (%), CounterCurate Tables 2 and 8",
    "sugarcrepe": "SugarCrepe accuracy (%), CounterCurate Table 3",
    "sugarcrepe_detail": "SugarCrepe accuracy per category (%), CounterCurate Table 6",
    "winoground": "Winoground scores (%), CounterCurate Table 7",
}


def _order_models(results: pd.DataFrame, models: Sequence[str] | None) -> list[str]:
    have = list(dict.fromkeys(results["model"]))
    if not models:
        return have
    unknown = [m for m in models if m not in have]
    if unknown:
        raise ConfigError(f"models {unknown} have no results for this benchmark. Fix: use some of {', '.join(have)}")
    return list(models)


def build_table(results: pd.DataFrame, benchmark: str, *, models: Sequence[str] | None = None,
                labels: Mapping[str, str] | None = None, deltas: Mapping[str, str] | None = None,
                detail: bool = False, decimals: int = 2) -> BenchmarkTable:
    """The paper layout of ``benchmark`` from long results (values x 100).

    * positions (Tables 1, 4): rows = models, columns ``LR, AB, Both`` (metric ``accuracy``);
    * looktwice (Table 8; Table 2 has the same cells): rows = models, column ``Accuracy``;
    * sugarcrepe (Table 3): rows ``Add, Replace, Swap, Average`` (item-pooled ``accuracy``), columns = models;
      ``detail`` (Table 6): the seven categories in the paper's order and ``Average``;
    * winoground (Table 7): rows = models, columns ``Text Score, Image Score, Group Score``.

    ``labels`` maps model names to display names, ``models`` picks and orders them, ``deltas`` maps a model to
    its baseline model: its cells then show ``value (+difference)``."""
    part = results[results["benchmark"] == benchmark]
    if part.empty:
        raise InputError(f"no {benchmark} results in the given tables. Fix: run 'countercurate evaluate "
                         f"--benchmark {benchmark}' and pass its CSV")
    order = _order_models(part, models)
    labels = dict(labels or {})
    lab = [labels.get(m, m) for m in order]

    def cell(model: str, subset: str, metric: str) -> float:
        hit = part[(part["model"] == model) & (part["subset"] == subset) & (part["metric"] == metric)]
        return float(hit["value"].iloc[0]) * 100.0 if len(hit) else math.nan

    if benchmark == "positions":
        cols, row_header, by_rows = [("LR", "accuracy"), ("AB", "accuracy"), ("both", "accuracy")], "Models", True
        col_labels = ["LR", "AB", "Both"]
    elif benchmark == "looktwice":
        cols, row_header, by_rows, col_labels = [("all", "accuracy")], "Model Setting", True, ["Accuracy"]
    elif benchmark == "winoground":
        cols = [("all", f"{k}_score") for k in ("text", "image", "group")]
        row_header, by_rows, col_labels = "Model", True, ["Text Score", "Image Score", "Group Score"]
    elif benchmark == "sugarcrepe":
        keys = SUGARCREPE_LABELS if detail else SUGARCREPE_GROUP_LABELS
        rows_spec = [(k, "accuracy") for k in keys]
        row_header, by_rows, col_labels = "Categories", False, list(keys.values())
    else:
        raise ConfigError(f"unknown benchmark {benchmark!r}. Fix: use one of {', '.join(BENCHMARKS)}")

    if by_rows:
        values = pd.DataFrame([[cell(m, s, k) for s, k in cols] for m in order], index=lab, columns=col_labels)
    else:
        values = pd.DataFrame([[cell(m, s, k) for m in order] for s, k in rows_spec], index=col_labels, columns=lab)
    delta_frame = None
    if deltas:
        for m, base in deltas.items():
            for name in (m, base):
                if name not in set(part["model"]):
                    raise ConfigError(f"--delta {m}={base}: no {benchmark} results for {name!r}")
        delta_frame = pd.DataFrame(np.nan, index=values.index, columns=values.columns)
        for m, base in deltas.items():
            if m not in order:
                continue
            if by_rows:
                delta_frame.loc[labels.get(m, m)] = [cell(m, s, k) - cell(base, s, k) for s, k in cols]
            else:
                delta_frame[labels.get(m, m)] = [cell(m, s, k) - cell(base, s, k) for s, k in rows_spec]
    name = "sugarcrepe_detail" if benchmark == "sugarcrepe" and detail else benchmark
    notes = ["Strict comparisons: a tie counts as wrong."]
    if benchmark == "sugarcrepe":
        notes.append("Group rows and Average pool the items of their categories (as in the paper's Table 3).")
    if benchmark == "positions":
        notes.append("0.5 per image whose own caption scores higher (image-to-text); Both = LR and AB test rows.")
    table = BenchmarkTable(name=name, title=TITLES[name], row_header=row_header, values=values, deltas=delta_frame,
                           decimals=decimals, notes=notes)
    values.index.name = row_header
    return table


def describe(table: BenchmarkTable, title: bool = True, label: str | None = None) -> render.Table:
    """``table`` as the shared table description (:class:`counterfactory.render.Table`): cells ``value`` or
    ``value (+delta)``, not in LaTeX math mode."""
    columns = [Column(table.row_header, "left")] + [Column(str(c), "right") for c in table.values.columns]
    rows = []
    for r, idx in enumerate(table.values.index):
        row: list[render.Value] = [str(idx)]
        for c in range(table.values.shape[1]):
            v = table.values.iat[r, c]
            d = table.deltas.iat[r, c] if table.deltas is not None else math.nan
            row.append(Cell(v, delta=d) if math.isfinite(v) else None)
        rows.append(row)
    return render.Table(columns, rows, title=table.title if title else None,
                        label=label or f"tab:countercurate-{table.name}",
                        note=" ".join(table.notes) if table.notes else None, decimals=table.decimals, tex_math=False)


def render_markdown(table: BenchmarkTable, title: bool = True) -> str:
    """A pipe table with the title in bold and the notes below."""
    return render.render_markdown(describe(table, title))


def render_html(tables: Sequence[BenchmarkTable], title: str = "CounterCurate: benchmark results") -> str:
    """Every table as one standalone HTML page (what the Snakemake report shows), from :func:`describe`."""
    return render.html_page(title, [render.render_html(describe(t)) for t in tables])


def render_latex(table: BenchmarkTable, label: str | None = None) -> str:
    """A booktabs table (``Styler.to_latex``); text is escaped."""
    return render.render_latex(describe(table, label=label))


def table_frame(table: BenchmarkTable) -> pd.DataFrame:
    """CSV form: ``table, row, column, value`` (percent), plus ``delta`` when the table has deltas."""
    out = table.values.reset_index().melt(id_vars=table.row_header, var_name="column", value_name="value")
    out = out.rename(columns={table.row_header: "row"})
    out.insert(0, "table", table.name)
    if table.deltas is not None:
        d = table.deltas.copy()
        d.index.name = table.row_header
        out["delta"] = d.reset_index().melt(id_vars=table.row_header, value_name="delta")["delta"].to_numpy()
    return out


def build_tables(results: pd.DataFrame, benchmarks: Sequence[str] | None = None, **kw) -> list[BenchmarkTable]:
    """Every table of ``benchmarks`` (default: those present in ``results``, in :data:`BENCHMARKS` order); for
    SugarCrepe both Table 3 and Table 6."""
    present = [b for b in BENCHMARKS if b in set(results["benchmark"])]
    chosen = list(benchmarks) if benchmarks else present
    tables = []
    for b in chosen:
        if b == "sugarcrepe":
            tables += [build_table(results, b, detail=False, **kw), build_table(results, b, detail=True, **kw)]
        else:
            tables.append(build_table(results, b, **kw))
    return tables


# ----------------------------------------------------------------------------------------------------------------
# Tables 1, 2, 3 and 5 as printed (pre-trained and fine-tuned models side by side)
# ----------------------------------------------------------------------------------------------------------------
PAPER_TITLES = {
    "table1": "Table 1: Flickr30k-Positions test accuracy (%)",
    "table2": "Table 2: PointQA-LookTwice counting accuracy (%)",
    "table3": "Table 3: SugarCrepe accuracy (%), improvements against CLIP and LLaVA-1.5 in parentheses",
    "table5": "Table 5: MS-COCO 5K retrieval (%) of CLIP before and after fine-tuning on Flickr30k-Attributes",
    "table6": "Table 6: SugarCrepe accuracy per sub-category (%), improvements in parentheses",
}


def _summary_mean(summary: pd.DataFrame | None, dataset: str, mixture: str, metric: str) -> float:
    if summary is None or summary.empty:
        return math.nan
    hit = summary[(summary["experiment"] == dataset) & (summary["mixture"] == mixture) & (summary["metric"] == metric)]
    return float(hit["mean"].iloc[0]) if len(hit) else math.nan


def paper_tables(clip_summary: pd.DataFrame | None, vlm_summary: pd.DataFrame | None,
                 results: pd.DataFrame | None = None, *, finetuned: str = "grouping",
                 vlm_finetuned: str = "conversation", pretrained: str = "pretrained", clip_label: str = "CLIP",
                 vlm_label: str = "LLaVA-1.5", negclip_model: str | None = "negclip",
                 negclip_label: str = "NegCLIP", gpt4v_model: str | None = None,
                 gpt4v_label: str | None = None) -> list[BenchmarkTable]:
    """CounterCurate Tables 1, 2, 3, 5 and 6 in the paper's layout, from the fine-tuning summaries (``stats
    summarize`` of the CLIP runs and of the vlm family: metric means in %, mixtures ``pretrained`` / ``finetuned`` /
    ``vlm_finetuned``) and, for Table 3's NegCLIP and GPT-4V columns, the long results of ``countercurate
    evaluate`` (``negclip_model``; ``gpt4v_model`` = the open VLM role standing in for GPT-4V, its column named by
    ``gpt4v_label``, the model's name). Table 1: rows Random (50), CLIP, + CounterCurate, LLaVA-1.5,
    + CounterCurate, columns LR / AB / Both; Table 2: rows Vanilla / + CounterCurate, columns CLIP / LLaVA-1.5;
    Table 3: rows Add / Replace / Swap / Average, columns CLIP, NegCLIP, + CounterCurate (+Δ vs CLIP), LLaVA-1.5,
    GPT-4V's stand-in, + CounterCurate (+Δ vs LLaVA-1.5), Table 6 the same for the seven sub-categories; Table 5: rows Image / Text / Average @1, @5 (image
    retrieval = text→image), columns CLIP / + CounterCurate. A table with no value is left out; missing cells are
    empty. Means over seeds (the paper reports one run)."""
    ours = "+ CounterCurate"
    out = []

    def mean(summary, dataset, mixture, metric):
        return _summary_mean(summary, dataset, mixture, metric)

    def result(model, benchmark, subset):
        if results is None or model is None:
            return math.nan
        hit = results[(results["model"] == model) & (results["benchmark"] == benchmark)
                      & (results["subset"] == subset) & (results["metric"] == "accuracy")]
        return float(hit["value"].iloc[0]) * 100.0 if len(hit) else math.nan

    def keep(name, header, values, deltas=None, notes=()):
        if np.isfinite(values.to_numpy(dtype=float)).sum() > (3 if name == "table1" else 0):
            values.index.name = header
            out.append(BenchmarkTable(name=name, title=PAPER_TITLES[name], row_header=header, values=values,
                                      deltas=deltas, notes=list(notes)))

    pos = [f"positions/{s}/accuracy" for s in ("LR", "AB", "both")]
    rows = [[50.0, 50.0, 50.0]]
    rows += [[mean(sm, "positions", mx, m) for m in pos]
             for sm, mx in ((clip_summary, pretrained), (clip_summary, finetuned), (vlm_summary, pretrained),
                            (vlm_summary, vlm_finetuned))]
    keep("table1", "Models", pd.DataFrame(rows, index=["Random", clip_label, ours, vlm_label, ours],
                                          columns=["LR", "AB", "Both"]),
         notes=["Random: chance of the two-option comparison."])
    look = "looktwice/all/accuracy"
    keep("table2", "", pd.DataFrame([[mean(clip_summary, "counting", pretrained, look),
                                      mean(vlm_summary, "counting", pretrained, look)],
                                     [mean(clip_summary, "counting", finetuned, look),
                                      mean(vlm_summary, "counting", vlm_finetuned, look)]],
                                    index=["Vanilla", ours], columns=[clip_label, vlm_label]))
    stand_in = (f"GPT-4V's column: {gpt4v_label or gpt4v_model} in its place (an open model)." if gpt4v_model else
                "GPT-4V's column is empty: no open model stands in for it (countercurate evaluate --model).")
    for name, groups in (("table3", list(SUGARCREPE_GROUP_LABELS.items())),
                         ("table6", list(SUGARCREPE_LABELS.items()))):
        rows_ = []
        for key, _ in groups:
            metric = f"sugarcrepe/{key}/accuracy"
            rows_.append([mean(clip_summary, "attributes", pretrained, metric),
                          result(negclip_model, "sugarcrepe", key),
                          mean(clip_summary, "attributes", finetuned, metric),
                          mean(vlm_summary, "attributes", pretrained, metric), result(gpt4v_model, "sugarcrepe", key),
                          mean(vlm_summary, "attributes", vlm_finetuned, metric)])
        columns = [clip_label, negclip_label, ours, vlm_label, gpt4v_label or gpt4v_model or "GPT-4V", ours]
        values = pd.DataFrame(rows_, index=[label for _, label in groups], columns=columns)
        deltas = pd.DataFrame(np.nan, index=values.index, columns=range(len(columns)))
        deltas[2] = values.iloc[:, 2].to_numpy() - values.iloc[:, 0].to_numpy()
        deltas[5] = values.iloc[:, 5].to_numpy() - values.iloc[:, 3].to_numpy()
        deltas.columns = columns
        keep(name, "Categories", values, deltas, notes=[stand_in])
    t5 = {}
    for k in (1, 5):
        for label, metric in (("Image", f"coco/text_to_image@{k}"), ("Text", f"coco/image_to_text@{k}")):
            t5[f"{label} @{k}"] = [mean(clip_summary, "attributes", mx, metric) for mx in (pretrained, finetuned)]
    for k in (1, 5):
        t5[f"Average @{k}"] = list(np.mean([t5[f"Image @{k}"], t5[f"Text @{k}"]], axis=0))
    order = ["Image @1", "Image @5", "Text @1", "Text @5", "Average @1", "Average @5"]
    keep("table5", "Scores", pd.DataFrame([t5[r] for r in order], index=order, columns=[clip_label, ours]),
         notes=["Image = text-to-image retrieval, Text = image-to-text; Average = their mean."])
    return sorted(out, key=lambda t: list(PAPER_TITLES).index(t.name))   # the paper's order: 1, 2, 3, 5, then 6


# ----------------------------------------------------------------------------------------------------------------
# the table steps: results files in, the tables written
# ----------------------------------------------------------------------------------------------------------------
def write_tables(results_paths: Sequence[str | Path], benchmarks: Sequence[str] | None = None, *,
                 models: Sequence[str] | None = None, labels: Mapping[str, str] | None = None,
                 deltas: Mapping[str, str] | None = None, decimals: int = 2, out_md=None, out_tex=None,
                 out_csv=None, out_html=None) -> str:
    """``counterfactory countercurate tables``: the tables of ``benchmarks`` (:func:`build_tables`) from the
    results CSVs, written as Markdown, LaTeX, CSV and HTML where a path is given. Returns the Markdown."""
    results = read_results(results_paths)
    tables = build_tables(results, benchmarks, models=models, labels=labels, deltas=deltas, decimals=decimals)
    md = "\n".join(render_markdown(t) for t in tables)
    if out_md:
        write_text(out_md, md)
    if out_tex:
        write_text(out_tex, "\n".join(render_latex(t) for t in tables))
    if out_csv:
        write_csv(out_csv, pd.concat([table_frame(t) for t in tables], ignore_index=True))
    if out_html:
        write_text(out_html, render_html(tables))
    return md


def write_paper_tables(clip_summary=None, vlm_summary=None, results_paths: Sequence[str | Path] = (), *,
                       labels: Mapping[str, str] | None = None, clip_role: str = "clip_open_clip",
                       vlm_role: str = "vlm", negclip: str = "negclip", gpt4v: str | None = None, out_md,
                       out_csv=None, out_html=None) -> list[BenchmarkTable]:
    """``counterfactory countercurate paper-tables``: :func:`paper_tables` from the summary CSVs of the CLIP and
    the vlm fine-tuning runs (``stats summarize``) and the results CSVs of ``countercurate evaluate``, columns named
    by ``labels`` (role or model -> display name), written as Markdown (and CSV and HTML where a path is given)."""
    labels = dict(labels or {})
    read = lambda path: pd.read_csv(path) if path else None  # noqa: E731
    results = read_results(results_paths) if results_paths else None
    tables = paper_tables(
        read(clip_summary), read(vlm_summary), results, clip_label=labels.get(clip_role, "CLIP"),
        vlm_label=labels.get(vlm_role, "LLaVA-1.5"), negclip_model=negclip,
        negclip_label=labels.get(negclip, "NegCLIP"), gpt4v_model=gpt4v,
        gpt4v_label=f"{labels.get(gpt4v, gpt4v)} (in GPT-4V's place)" if gpt4v else None)
    write_text(out_md, "\n".join(render_markdown(t) for t in tables))
    if out_csv:
        frames = [table_frame(t) for t in tables]
        write_csv(out_csv, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
    if out_html:
        write_text(out_html, render_html(tables, "CounterCurate: Tables 1, 2, 3 and 5"))
    return tables
