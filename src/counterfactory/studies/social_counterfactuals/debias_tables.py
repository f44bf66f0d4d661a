"""The debiasing tables of SocialCounterfactuals (Howard et al., CVPR 2024, §5; Tables 2, 3, 16, 17): built from a
stats summary of the debiasing runs of :mod:`.debias` (:func:`.debias.summarize`) and rendered as Markdown, LaTeX
and a long CSV.

Every name here is also importable from :mod:`.debias`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Mapping, Sequence

import pandas as pd

from ... import render
from ...errors import ConfigError
from ...render import Cell, Column, Table, format_cell
from .experiments import ATTRIBUTE_LABELS, DEBIASED, PRETRAINED, parse_experiment, segment_label  # noqa: F401

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# tables (Tables 2, 16, 17)
# --------------------------------------------------------------------------------------------
#: table -> (displayed metric, metric whose test marks significance, "best" rule, caption)
TABLES: dict[str, tuple[str, str, str, str]] = {
    "table2": ("maxskew_mean", "maxskew_mean", "min",
               "Table 2. Mean of MaxSkew@K for pre-trained and debiased variants, estimated by withholding "
               "counterfactual sets for {withheld} of the occupations."),
    "table16": ("ndkl_mean", "ndkl_mean", "min",
                "Table 16. Mean of NDKL for pre-trained and debiased variants, estimated by withholding "
                "counterfactual sets for {withheld} of the occupations."),
    "table17": ("bias_mean", "absbias_mean", "abs",
                "Table 17. Bias@K for pre-trained and debiased variants, estimated by withholding counterfactual "
                "sets for {withheld} of the occupations (segments with gender; positive = male)."),
}
for _dataset, _name in (("visogender", "VisoGender"), ("pata", "PATA")):
    TABLES[f"table3_{_dataset}"] = (
        f"{_dataset}_maxskew", f"{_dataset}_maxskew", "min",
        f"Table 3 ({_name}). Mean MaxSkew@K on {_name} of the pre-trained and debiased models (§5.3; debiased on "
        "each segment's counterfactual sets).")
MIXTURE_LABELS = {PRETRAINED: "Pre-trained", DEBIASED: "Debiased"}
NOTE = ("Mean over seeds with the sample standard deviation as subscript; the better of pre-trained / debiased in "
        "bold (lower; for Bias@K closer to 0); underlined: debiased significantly below pre-trained (one-tailed "
        "t-test over seeds; for Bias@K on the mean |Bias@K|).")


@dataclasses.dataclass
class DebiasTable:
    name: str
    caption: str
    segments: list[str]
    roles: list[str]
    role_labels: dict[str, str]
    cells: dict[tuple[str, str, str], Any]   # (segment, role, mixture) -> render.Cell
    decimals: int = 2
    std_decimals: int = 2


def build_tables(summary: pd.DataFrame, *, roles: Sequence[str] | None = None, segments: Sequence[str] | None = None,
                 role_labels: Mapping[str, str] | None = None, decimals: int = 2,
                 std_decimals: int = 2, withheld_fraction: float = 0.2) -> dict[str, DebiasTable]:
    """Tables 2, 16 and 17 from a stats summary of debiasing runs (rows: segments; columns: model × pre-trained /
    debiased). A table with no row in the summary is left out (Table 17 without a gender segment). The captions
    state ``withheld_fraction``, the share of occupations the runs withheld (``debias.withheld_fraction``; the
    paper's 20 %)."""
    if not 0 < withheld_fraction < 1:
        raise ConfigError(f"withheld_fraction {withheld_fraction!r}. Fix: pass debias.withheld_fraction, in (0, 1)")
    withheld = f"{100 * withheld_fraction:g}%"

    need = {"experiment", "metric", "mixture", "mean", "std", "n", "significant"}
    missing = sorted(need - set(summary.columns))
    if missing:
        raise ConfigError(f"summary: missing column(s) {', '.join(missing)}. Fix: pass the CSV of 'stats summarize' "
                          "(or 'debias-table --runs')")
    df = summary.copy()
    parsed = []
    for e in df["experiment"].astype(str):
        try:
            parsed.append(parse_experiment(e))
        except ValueError as exc:
            raise ConfigError(f"summary: {exc}. Fix: summarize the runs of 'counterfactory social debias-run'") \
                from exc
    df["role"], df["segment"] = [p[0] for p in parsed], [p[1] for p in parsed]
    if "alternative" not in df.columns:
        df["alternative"] = "less"
    role_order = list(roles or dict.fromkeys(df["role"]))
    seg_order = list(segments or dict.fromkeys(df["segment"]))
    labels = {r: (role_labels or {}).get(r, r) for r in role_order}
    out: dict[str, DebiasTable] = {}
    for name, (metric, test_metric, best_rule, caption) in TABLES.items():
        caption = caption.format(withheld=withheld)
        sel = df[df["metric"] == metric]
        if sel.empty:
            continue
        tested = df[(df["metric"] == test_metric) & (df["mixture"] == DEBIASED)]
        cells: dict[tuple[str, str, str], Any] = {}
        for row in sel.itertuples(index=False):
            if row.mixture not in MIXTURE_LABELS or row.role not in labels or row.segment not in seg_order:
                continue
            sig = False
            if row.mixture == DEBIASED:
                t = tested[(tested["experiment"] == row.experiment)]
                if len(t):
                    if str(t["alternative"].iloc[0]) != "less":
                        log.warning("%s %s: the test is 'greater'; debiasing is tested with alternative 'less' "
                                    "(not marked)", row.experiment, test_metric)
                    else:
                        sig = bool(t["significant"].iloc[0])
            cells[(row.segment, row.role, row.mixture)] = Cell(float(row.mean), float(row.std), int(row.n), sig)
        for seg in seg_order:
            for role in role_order:
                pair = [cells.get((seg, role, m)) for m in MIXTURE_LABELS]
                if any(c is None for c in pair):
                    continue
                score = [round(abs(c.mean) if best_rule == "abs" else c.mean, decimals) for c in pair]
                for c, s in zip(pair, score):
                    c.best = s == min(score)
        segs = [s for s in seg_order if any(k[0] == s for k in cells)]
        if segs:
            out[name] = DebiasTable(name, caption, segs, role_order, labels, cells, decimals, std_decimals)
    if not out:
        raise ConfigError(f"summary: none of the metrics {', '.join(t[0] for t in TABLES.values())}. Fix: summarize "
                          "the metrics.csv rows of 'counterfactory social debias-run'")
    return out


#: Table 3's columns as the paper prints them: (column, metric)
TABLE3_COLUMNS = (("VisoGender", "visogender_maxskew"), ("PATA", "pata_maxskew"))


def table3_paper(summary: pd.DataFrame, paper_segment: str, *, roles: Sequence[str] | None = None,
                 role_labels: Mapping[str, str] | None = None, decimals: int = 3):
    """Table 3 as the paper lays it out (§5.3): rows "Pre-trained <model>" and "Debiased <model>" (the model
    debiased on ``paper_segment``, Race-Gender: §5.3's "Debiased CLIP"), then "Debiased <model> (<segment>)" for the
    other segments as extra rows; columns VisoGender and PATA (mean MaxSkew@K, mean ± std over seeds). None when
    the summary has no PATA / VisoGender rows. A :class:`counterfactory.render.Table`."""
    cols = [(c, m) for c, m in TABLE3_COLUMNS if (summary["metric"] == m).any()]
    if not cols:
        return None
    df = summary[summary["metric"].isin([m for _, m in cols])].copy()
    parsed = [parse_experiment(str(e)) for e in df["experiment"]]
    df["role"], df["segment"] = [p[0] for p in parsed], [p[1] for p in parsed]
    rows = []
    for role in list(roles or dict.fromkeys(df["role"])):
        name = (role_labels or {}).get(role, role)
        mine = df[df["role"] == role]
        segs = list(dict.fromkeys(mine["segment"]))
        segs = ([paper_segment] if paper_segment in segs else []) + [s for s in segs if s != paper_segment]
        if not segs:
            continue

        def cell(seg, mixture, metric):
            hit = mine[(mine["segment"] == seg) & (mine["mixture"] == mixture) & (mine["metric"] == metric)]
            if hit.empty:
                return None
            r = hit.iloc[0]
            return render.Cell(float(r["mean"]), float(r["std"]), int(r["n"]))

        rows.append([f"Pre-trained {name}", *(cell(segs[0], PRETRAINED, m) for _, m in cols)])
        for seg in segs:
            label = f"Debiased {name}" if seg == paper_segment else f"Debiased {name} {segment_label(seg)}"
            rows.append([label, *(cell(seg, DEBIASED, m) for _, m in cols)])
    columns = [render.Column("Model", "left")] + [render.Column(c, "center") for c, _ in cols]
    return render.Table(columns, rows, title="Table 3. MaxSkew@K of the debiased model as well as the pre-trained "
                        "model on VisoGender and PATA (§5.3; \"Debiased\" = debiased on "
                        f"{segment_label(paper_segment)}).", decimals=decimals, std_decimals=decimals,
                        note="Mean over seeds, sample standard deviation as subscript.")


def _columns(table: DebiasTable) -> list[tuple[str, str]]:
    return [(role, m) for role in table.roles for m in MIXTURE_LABELS]


def describe(table: DebiasTable):
    """``table`` as the shared table description (:class:`counterfactory.render.Table`): rows are segments,
    columns model (group) x Pre-trained / Debiased. The Markdown row names are not escaped (kept as before)."""
    columns = [Column("Intersectional Bias", "left")] + [Column(MIXTURE_LABELS[m], "center", group=table.role_labels[r])
                                                          for r, m in _columns(table)]
    rows = [[segment_label(seg)]                     # text: escaped per format
            + [table.cells.get((seg, r, m)) for r, m in _columns(table)] for seg in table.segments]
    return Table(columns, rows, title=table.caption, label=f"tab:debias-{table.name}", note=NOTE,
                 decimals=table.decimals, std_decimals=table.std_decimals)


def render_markdown(table: DebiasTable) -> str:
    return render.render_markdown(describe(table))


def render_html(tables, extra=()) -> str:
    """Every table (a mapping or list of :class:`DebiasTable`) as one standalone HTML page (what the Snakemake
    report shows); ``extra``: further :class:`counterfactory.render.Table` s after them (Table 3 in the paper's
    layout, :func:`table3_paper`)."""
    items = list(tables.values()) if isinstance(tables, dict) else list(tables)
    return render.html_page("SocialCounterfactuals: debiasing", [render.render_html(describe(t)) for t in items]
                            + [render.render_html(t) for t in extra])


def render_latex(table: DebiasTable) -> str:
    """Booktabs LaTeX with a two-level header (model, then Pre-trained / Debiased) as in the paper."""
    return render.render_latex(describe(table))


def tables_frame(tables: Mapping[str, DebiasTable]) -> pd.DataFrame:
    """Long CSV form: one row per (table, segment, model, mixture) with mean, std, n, best and significant."""
    rows = []
    for t in tables.values():
        for seg in t.segments:
            for role, m in _columns(t):
                c = t.cells.get((seg, role, m))
                rows.append({"table": t.name, "segment": seg, "row": segment_label(seg), "model": role,
                             "label": t.role_labels[role], "mixture": m,
                             "mean": c.mean if c else math.nan, "std": c.std if c else math.nan,
                             "n": c.n if c else 0, "best": bool(c and c.best), "significant": bool(c and c.significant),
                             "cell": format_cell(c, "plain", t.decimals, t.std_decimals)})
    return pd.DataFrame(rows, columns=["table", "segment", "row", "model", "label", "mixture", "mean", "std", "n",
                                       "best", "significant", "cell"])
