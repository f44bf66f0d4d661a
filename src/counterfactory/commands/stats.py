"""``counterfactory stats {summarize,correlate,table}``: significance over seeds, correlations and
paper-style tables (COCO-Counterfactuals Tables 3, 4, 12 and appendix A.2). This module is the command line only,
declared as data (``commands.Step``); the work is done by :mod:`counterfactory.stats` and
:mod:`counterfactory.tables`."""

from __future__ import annotations

import argparse
import logging

from .. import stats, tables
from ..errors import InputError
from ..io import write_csv, write_json
from . import OUT, OUT_CSV, OUT_HTML, OUT_MD, OUT_TEX, Param, Step, non_negative_int, open_fraction, registrar

log = logging.getLogger(__name__)


def _csv_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of names")
    return items


# ------------------------------------------------------------------------------------------- handlers


def _summarize(args) -> int:
    runs = stats.read_runs(args.runs)
    if args.mean_metric:
        runs = stats.add_mean_metric(runs, args.mean_metric, source=args.runs)
    summary = stats.summarize(runs, args.baseline, test=args.test, alpha=args.alpha,
                              alternative=args.alternative, source=args.runs)
    write_csv(args.out, summary)
    tested = summary["p_value"].notna().sum()
    log.info("wrote %s: %d rows, %d tested, %d significant at alpha=%g (%s, %s)", args.out, len(summary),
             tested, int(summary["significant"].sum()), args.alpha, args.test, args.alternative)
    return 0


def _correlate(args) -> int:
    table = stats.read_table(args.table)
    result = stats.correlate(table, args.x, args.y, source=args.table)
    write_json(args.out, result)
    log.info("wrote %s: n=%d pearson r=%.3f (p=%.3g) spearman rho=%.3f (p=%.3g)", args.out, result["n"],
             result["pearson_r"], result["pearson_p"], result["spearman_rho"], result["spearman_p"])
    return 0


def _mixture_labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, name = item.partition("=")
        if not sep or not key.strip() or not name.strip():
            raise InputError(f"--mixture-label {item!r}: expected MIXTURE=NAME. Fix: pass e.g. "
                             "--mixture-label 'base=MS-COCO + COCO-CFs (base)'")
        labels[key.strip()] = name.strip()
    return labels


def _table(args) -> int:
    if not (args.out_md or args.out_tex or args.out_csv or args.out_html):
        raise InputError("stats table: no output requested. Fix: pass --out-md, --out-tex, --out-csv and/or --out-html")
    table = tables.write_table_files(args.summary, out_md=args.out_md, out_tex=args.out_tex, out_csv=args.out_csv,
                                     out_html=args.out_html, title=args.title, label=args.label,
                                     mixture_info=args.mixture_info, metrics=args.metrics,
                                     mixture_order=args.mixture_order, experiment=args.experiment,
                                     decimals=args.decimals, std_decimals=args.std_decimals,
                                     row_header=args.row_header, pretrained=args.pretrained_row,
                                     pretrained_label=args.pretrained_label,
                                     mixture_labels=_mixture_labels(args.mixture_label))
    log.info("table: %d mixtures x %d metrics", len(table.row_keys), len(table.col_keys))
    return 0


# ------------------------------------------------------------------------------------------- declarations

SUMMARIZE = Step(
    "summarize", help="mean, std and one-tailed t-test of each mixture against a baseline mixture",
    description="Read a tidy runs table (columns experiment, mixture, seed, data_seed, metric, value; one row per run "
                "per metric) and write, per (experiment, metric, mixture), n, mean, sample std (ddof=1), delta = "
                "mean - baseline mean, and the one-tailed p-value against the baseline. p is left empty, with the "
                "reason in the 'note' column, when a group has one run or both groups have zero variance; unpaired "
                "tests with unequal seed sets get a warning note; the paired test requires identical seeds.",
    params=(Param("--runs", required=True, metavar="RUNS.csv", help="runs table (tidy CSV)"),
            Param("--baseline", required=True, metavar="MIXTURE",
                  help="mixture every other mixture is tested against"),
            OUT.but(metavar="OUT.csv", help="summary CSV to write"),
            Param("--test", choices=stats.TESTS, default="welch",
                  help="welch: ttest_ind(equal_var=False) (default); student: equal_var=True; "
                       "paired: ttest_rel on runs matched by seed"),
            Param("--alpha", type=open_fraction, default=0.05,
                  help="significance level, significant = p <= alpha (default 0.05)"),
            Param("--alternative", choices=stats.ALTERNATIVES, default="greater",
                  help="greater: test mixture > baseline (default); less: mixture < baseline (lower is better)"),
            Param("--mean-metric", metavar="NAME",
                  help="also add metric NAME = per-run mean over each experiment's metrics (the paper's 'Mean' "
                       "column)")),
    run=_summarize)

CORRELATE = Step(
    "correlate", help="Pearson and Spearman correlation between two columns of a CSV",
    description="Pearson r with its two-sided p, and Spearman rho with its two-sided p, between two numeric columns "
                "(e.g. label frequency vs accuracy change, COCO-Counterfactuals appendix A.2). Rows with an empty x "
                "or y are dropped and listed; needs at least 3 rows and non-constant columns.",
    params=(Param("--table", required=True, metavar="T.csv", help="input CSV with a header row"),
            Param("--x", required=True, metavar="COL", help="first column"),
            Param("--y", required=True, metavar="COL", help="second column"),
            OUT.but(metavar="OUT.json", help="JSON result to write")),
    run=_correlate)

TABLE = Step(
    "table", help="paper-style Markdown/LaTeX/CSV table from a summary CSV",
    description="Render a summary (from 'stats summarize') as a table: rows = mixtures, columns = metrics, cells = "
                "mean with the std as subscript; the best mean per column is bold (minimum for metrics summarized "
                "with --alternative less) and significant improvements over the baseline are underlined.",
    params=(Param("--summary", required=True, metavar="OUT.csv", help="summary CSV from 'stats summarize'"),
            OUT_MD.but(metavar="T.md", help="Markdown table to write"),
            OUT_TEX.but(metavar="T.tex", help="LaTeX table (booktabs) to write"),
            OUT_CSV.but(metavar="T.csv", help="wide CSV table to write"),
            OUT_HTML.but(metavar="T.html", help="HTML page of the table to write (what the report shows)"),
            Param("--metrics", type=_csv_list, metavar="m1,m2",
                  help="columns to show, in order (metric or experiment:metric); default: all"),
            Param("--mixture-order", type=_csv_list, metavar="a,b,c",
                  help="rows to show, in order; unlisted mixtures are left out; default: all, baseline first"),
            Param("--experiment", metavar="NAME", help="only this experiment's rows"),
            Param("--mixture-info", metavar="INFO.csv",
                  help="CSV with 'mixture' and any of label, n_train (|D_train|), n_cf (|D_train^CF|), "
                       "pct_cf (%% CFs, 0-100)"),
            Param("--pretrained-row", metavar="MIXTURE",
                  help="mixture of the pre-trained model's run: shown first, |D_train| = |D_train^CF| = %% CFs = 0 "
                       "(COCO-CF Tables 3, 4 and 12)"),
            Param("--pretrained-label", metavar="TEXT", help="label of the --pretrained-row row (default: its name)"),
            Param("--mixture-label", action="append", default=[], metavar="MIXTURE=NAME",
                  help="row name of a mixture, as the paper names it (e.g. base='MS-COCO + COCO-CFs (base)'); "
                       "repeatable; default: the mixture info's label, else the mixture's key"),
            Param("--title", help="caption / title line"),
            Param("--label", help="LaTeX \\label"),
            Param("--row-header", default="Training dataset", help="header of the mixture column"),
            Param("--decimals", type=non_negative_int, default=2, help="decimals of the mean (default 2)"),
            Param("--std-decimals", type=non_negative_int, default=1,
                  help="decimals of the std subscript (default 1, as in the paper)")),
    run=_table)

STATS = Step(
    "stats", help="significance tests over seeds, correlations, and paper-style result tables",
    description="Statistics over repeated training runs, as in COCO-Counterfactuals §5: per-mixture mean/std over "
                "seeds with one-tailed t-tests against a baseline mixture, Pearson/Spearman correlations, and "
                "Markdown/LaTeX tables with the best mean bold and significant improvements underlined.",
    steps=(SUMMARIZE, CORRELATE, TABLE),
    metavar="<stats command>")

register = registrar(STATS)
