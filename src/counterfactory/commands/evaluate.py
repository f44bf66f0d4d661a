"""``counterfactory evaluate``: COCO-Counterfactuals as a test set (§4.2, A.6) and zero-shot classification
(§5.2, Table 4). Per-model steps (``itr``, ``itm``, ``classify``) and merge steps that write the tables
and plots (``itr-table``, ``itm-summary``, ``classify-table``). Settings live under ``evaluation:``. This module
is the command line only, declared as data (``commands.Step``); the work is :mod:`counterfactory.evaluation`
(the merge steps: :mod:`counterfactory.evaluation.merge`)."""

from __future__ import annotations

import logging

from ..errors import ConfigError
from ..io import write_csv, write_json, write_parquet
from . import CONFIG, LABEL, NO_PROGRESS, OUT, OUT_CSV, OUT_HTML, OUT_MD, Param, Step, registrar, role_labels

log = logging.getLogger(__name__)


def _stage_config(paths):
    from ..config import load_config
    from ..evaluation.settings import stage_config

    return stage_config(load_config(paths))   # evaluation.precision (paper config: fp32)


# ------------------------------------------------------------------------------------------- handlers


def _itr(args) -> int:
    from .. import evaluation
    from ..evaluation.settings import with_itr_subsets

    cfg = _stage_config(args.config)
    extra = {}
    for item in args.subset:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            raise ConfigError(f"--subset {item!r}: expected LABEL=FILE. Fix: e.g. --subset in_domain_test=test.parquet")
        extra[label] = path
    long = evaluation.run_itr(with_itr_subsets(cfg, extra), args.role, args.pairs, args.captions,
                              progress=not args.no_progress)
    write_csv(args.out, long)
    log.info("wrote %s (%d rows)", args.out, len(long))
    return 0


def _itr_table(args) -> int:
    from .. import evaluation

    table = evaluation.write_itr_table(args.inputs, args.out_csv, args.out_md, out_html=args.out_html,
                                       title=args.title, labels=role_labels(args.label))
    log.info("wrote %s and %s (%d rows)", args.out_csv, args.out_md, len(table))
    return 0


def _itm(args) -> int:
    from .. import evaluation

    table = evaluation.run_itm(_stage_config(args.config), args.role, args.pairs, args.captions,
                               progress=not args.no_progress)
    write_parquet(args.out, table)
    log.info("wrote %s (%d pairs)", args.out, len(table))
    return 0


def _itm_summary(args) -> int:
    from .. import evaluation

    evaluation.write_itm_summary(args.inputs, args.out_csv, args.out_md, args.out_png, out_html=args.out_html,
                                 bins=args.bins, title=args.title, labels=role_labels(args.label))
    log.info("wrote %s, %s, %s", args.out_csv, args.out_md, args.out_png)
    return 0


def _classify(args) -> int:
    from .. import evaluation

    result = evaluation.run_classification(_stage_config(args.config), args.role, args.dataset,
                                           progress=not args.no_progress)
    write_json(args.out, result)
    return 0


def _classify_table(args) -> int:
    from .. import evaluation

    labels = role_labels(args.label)
    order = [d.strip() for d in args.dataset_order.split(",") if d.strip()] if args.dataset_order else None
    tables = evaluation.write_classification_table(args.inputs, args.out_csv, args.out_md, out_html=args.out_html,
                                                   out_png=args.out_png, order=order, title=args.title,
                                                   labels=labels)
    top = next(iter(tables.values()))
    log.info("classification table: %d models x %d datasets", len(top), len(top.columns) - 3)
    return 0


# ------------------------------------------------------------------------------------------- declarations

ROLE = Param("--role", required=True, help="model role (models.<role>)")
PAIRS = Param("--pairs", required=True, metavar="selected_pairs.parquet", help="the image stage's pair table")
CAPTIONS = Param("--captions", required=True, metavar="captions.parquet", help="the data stage's caption table")

ITR = Step(
    "itr", help="Recall@1/5/10 of one model on the matched MS-COCO subset, COCO-CFs and subsets",
    description="Zero-shot image-text retrieval (§4.2.1, Tables 2/13) of one model role: TR@K (image->text) and "
                "IR@K (text->image) in percent on MS-COCO (the original images of the selected pairs), COCO-CFs "
                "(both images of every pair) and evaluation.itr.subsets. Writes a long CSV.",
    params=(CONFIG, NO_PROGRESS, ROLE, PAIRS, CAPTIONS,
            OUT.but(metavar="OUT.csv", help="long results CSV (one row per model, dataset, subset and metric)"),
            Param("--subset", action="append", default=[], metavar="LABEL=FILE",
                  help="one more COCO-CFs subset (a table with an id column), e.g. the A.1 in-domain test pairs; "
                       "added to evaluation.itr.subsets")),
    run=_itr)

ITR_TABLE = Step(
    "itr-table", help="Table 2 layout with relative change vs MS-COCO",
    description="Merge per-model ITR CSVs into the layout of Tables 2/13: rows model x dataset, columns TR@K and "
                "IR@K, each with its change relative to MS-COCO.",
    params=(Param("--inputs", nargs="+", required=True, metavar="ITR.csv", help="per-model results of `evaluate itr`"),
            OUT_CSV.but(required=True), OUT_MD.but(required=True), OUT_HTML,
            Param("--title", default="Zero-shot image-text retrieval on COCO-Counterfactuals",
                  help="title line of the Markdown table"),
            LABEL),
    run=_itr_table)

ITM = Step(
    "itm", help="per-pair ITM score differences IR_r, IR_c, TR_r, TR_c of one model",
    description="ITM score differences (§4.2.2) of one model role on every selected pair, with a seeded random "
                "MS-COCO alternative. Writes a parquet table (one row per pair).",
    params=(CONFIG, NO_PROGRESS, ROLE, PAIRS, CAPTIONS,
            OUT.but(metavar="OUT.parquet", help="one row per pair: IR_r, IR_c, TR_r, TR_c")),
    run=_itm)

ITM_SUMMARY = Step(
    "itm-summary", help="summary table and Figure 3 style plot of ITM differences",
    description="Merge per-model ITM difference tables: summary CSV/Markdown (mean, std, median, share below zero) "
                "and a PNG with one distribution panel per model.",
    params=(Param("--inputs", nargs="+", required=True, metavar="ITM.parquet",
                  help="per-model tables of `evaluate itm`"),
            OUT_CSV.but(required=True, help="the summary as CSV"),
            OUT_MD.but(required=True, help="the summary as Markdown"),
            OUT_HTML.but(help="the summary as an HTML page (what the report shows)"),
            Param("--out-png", required=True, metavar="FILE.png", help="the Figure 3 style histogram plot"),
            Param("--bins", type=int, default=40, help="histogram bins per panel (default 40)"),
            Param("--title", default="ITM score differences on COCO-Counterfactuals",
                  help="title of the Markdown table and the plot"),
            LABEL),
    run=_itm_summary)

CLASSIFY = Step(
    "classify", help="zero-shot top-k accuracy of one model on one dataset",
    description="Zero-shot classification (§5.2): prompts from evaluation.classification.templates ('a photo of a "
                "{c}.'), argmax over class text embeddings. Writes a JSON result.",
    params=(CONFIG, NO_PROGRESS, ROLE,
            Param("--dataset", required=True, help="name under evaluation.classification.datasets"),
            OUT.but(metavar="OUT.json", help="top-k accuracies of the model on the dataset")),
    run=_classify)

CLASSIFY_TABLE = Step(
    "classify-table", help="Table 4 layout: models x datasets (+ Mean)",
    description="Merge classification JSON results into CSV/Markdown tables (top-1 and any other top-k) and a bar "
                "chart of top-1 accuracy.",
    params=(Param("--inputs", nargs="+", required=True, metavar="RESULT.json",
                  help="per-model results of `evaluate classify`"),
            OUT_CSV.but(required=True), OUT_MD.but(required=True), OUT_HTML,
            Param("--out-png", metavar="FILE.png", help="also plot the table here"),
            Param("--dataset-order", help="comma-separated dataset order (default: as given)"),
            Param("--title", default="Zero-shot classification accuracy", help="title of the table and the plot"),
            LABEL),
    run=_classify_table)

EVALUATE = Step(
    "evaluate", metavar="<evaluate command>",
    help="zero-shot retrieval / ITM differences on COCO-Counterfactuals, zero-shot classification",
    description="COCO-Counterfactuals as a test set (§4.2, A.6) and zero-shot classification (§5.2, Table 4): "
                "per-model steps (itr, itm, classify) and merge steps that write the tables and plots (itr-table, "
                "itm-summary, classify-table). Settings live under evaluation: in the config.",
    steps=(ITR, ITR_TABLE, ITM, ITM_SUMMARY, CLASSIFY, CLASSIFY_TABLE))

register = registrar(EVALUATE)
