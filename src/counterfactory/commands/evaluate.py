"""``counterfactory evaluate``: COCO-Counterfactuals as a test set (§4.2, A.6) and zero-shot classification
(§5.2, Table 4). Per-model steps (``itr``, ``itm``, ``classify``) and merge steps that write the tables
and plots (``itr-table``, ``itm-summary``, ``classify-table``). Settings live under ``evaluation:``."""

from __future__ import annotations

import logging

from ..errors import ConfigError
from ..io import save_figure, write_csv, write_json, write_parquet, write_text
from . import add_config_option, add_label_option, add_progress_option, role_labels

log = logging.getLogger(__name__)


def _add_config(p) -> None:
    add_config_option(p)
    add_progress_option(p)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="zero-shot retrieval / ITM differences on COCO-Counterfactuals, zero-shot classification",
        description="COCO-Counterfactuals as a test set (§4.2, A.6) and zero-shot classification (§5.2, "
                    "Table 4): per-model steps (itr, itm, classify) and merge steps that write the tables and "
                    "plots (itr-table, itm-summary, classify-table). Settings live under evaluation: in the config.",
    )
    sub = parser.add_subparsers(dest="evaluate_command", metavar="<evaluate command>")
    sub.required = True

    p = sub.add_parser(
        "itr", help="Recall@1/5/10 of one model on the matched MS-COCO subset, COCO-CFs and subsets",
        description="Zero-shot image-text retrieval (§4.2.1, Tables 2/13) of one model role: TR@K (image->text) "
                    "and IR@K (text->image) in percent on MS-COCO (the original images of the selected pairs), "
                    "COCO-CFs (both images of every pair) and evaluation.itr.subsets. Writes a long CSV.")
    _add_config(p)
    p.add_argument("--role", required=True, help="model role (models.<role>)")
    p.add_argument("--pairs", required=True, metavar="selected_pairs.parquet", help="the image stage's pair table")
    p.add_argument("--captions", required=True, metavar="captions.parquet", help="the data stage's caption table")
    p.add_argument("--out", required=True, metavar="OUT.csv", help="long results CSV (one row per model, dataset, "
                   "subset and metric)")
    p.add_argument("--subset", action="append", default=[], metavar="LABEL=FILE",
                   help="one more COCO-CFs subset (a table with an id column), e.g. the A.1 in-domain test pairs; "
                        "added to evaluation.itr.subsets")
    p.set_defaults(func=_itr)

    t = sub.add_parser("itr-table", help="Table 2 layout with relative change vs MS-COCO",
                       description="Merge per-model ITR CSVs into the layout of Tables 2/13: rows model x dataset, "
                                   "columns TR@K and IR@K, each with its change relative to MS-COCO.")
    t.add_argument("--inputs", nargs="+", required=True, metavar="ITR.csv", help="per-model results of `evaluate itr`")
    t.add_argument("--out-csv", required=True, metavar="FILE.csv", help="the table as CSV")
    t.add_argument("--out-md", required=True, metavar="FILE.md", help="the table as Markdown")
    t.add_argument("--out-html", metavar="FILE.html", help="the table as an HTML page (what the report shows)")
    t.add_argument("--title", default="Zero-shot image-text retrieval on COCO-Counterfactuals",
                   help="title line of the Markdown table")
    add_label_option(t)
    t.set_defaults(func=_itr_table)

    m = sub.add_parser("itm", help="per-pair ITM score differences IR_r, IR_c, TR_r, TR_c of one model",
                       description="ITM score differences (§4.2.2) of one model role on every selected pair, with a "
                                   "seeded random MS-COCO alternative. Writes a parquet table (one row per pair).")
    _add_config(m)
    m.add_argument("--role", required=True, help="model role (models.<role>)")
    m.add_argument("--pairs", required=True, metavar="selected_pairs.parquet", help="the image stage's pair table")
    m.add_argument("--captions", required=True, metavar="captions.parquet", help="the data stage's caption table")
    m.add_argument("--out", required=True, metavar="OUT.parquet", help="one row per pair: IR_r, IR_c, TR_r, TR_c")
    m.set_defaults(func=_itm)

    s = sub.add_parser("itm-summary", help="summary table and Figure 3 style plot of ITM differences",
                       description="Merge per-model ITM difference tables: summary CSV/Markdown (mean, std, median, "
                                   "share below zero) and a PNG with one distribution panel per model.")
    s.add_argument("--inputs", nargs="+", required=True, metavar="ITM.parquet", help="per-model tables of `evaluate itm`")
    s.add_argument("--out-csv", required=True, metavar="FILE.csv", help="the summary as CSV")
    s.add_argument("--out-md", required=True, metavar="FILE.md", help="the summary as Markdown")
    s.add_argument("--out-html", metavar="FILE.html", help="the summary as an HTML page (what the report shows)")
    s.add_argument("--out-png", required=True, metavar="FILE.png", help="the Figure 3 style histogram plot")
    s.add_argument("--bins", type=int, default=40, help="histogram bins per panel (default 40)")
    s.add_argument("--title", default="ITM score differences on COCO-Counterfactuals",
                   help="title of the Markdown table and the plot")
    add_label_option(s)
    s.set_defaults(func=_itm_summary)

    c = sub.add_parser("classify", help="zero-shot top-k accuracy of one model on one dataset",
                       description="Zero-shot classification (§5.2): prompts from evaluation.classification.templates "
                                   "('a photo of a {c}.'), argmax over class text embeddings. Writes a JSON result.")
    _add_config(c)
    c.add_argument("--role", required=True, help="model role (models.<role>)")
    c.add_argument("--dataset", required=True, help="name under evaluation.classification.datasets")
    c.add_argument("--out", required=True, metavar="OUT.json", help="top-k accuracies of the model on the dataset")
    c.set_defaults(func=_classify)

    ct = sub.add_parser("classify-table", help="Table 4 layout: models x datasets (+ Mean)",
                        description="Merge classification JSON results into CSV/Markdown tables (top-1 and any other "
                                    "top-k) and a bar chart of top-1 accuracy.")
    ct.add_argument("--inputs", nargs="+", required=True, metavar="RESULT.json",
                    help="per-model results of `evaluate classify`")
    ct.add_argument("--out-csv", required=True, metavar="FILE.csv", help="the table as CSV")
    ct.add_argument("--out-md", required=True, metavar="FILE.md", help="the table as Markdown")
    ct.add_argument("--out-html", metavar="FILE.html", help="the table as an HTML page (what the report shows)")
    ct.add_argument("--out-png", metavar="FILE.png", help="also plot the table here")
    ct.add_argument("--dataset-order", help="comma-separated dataset order (default: as given)")
    ct.add_argument("--title", default="Zero-shot classification accuracy", help="title of the table and the plot")
    add_label_option(ct)
    ct.set_defaults(func=_classify_table)


def _relabel(frame, labels: dict):
    """The ``model`` column named by ``--label ROLE=NAME`` (the config's display names: a table-only setting, so
    the per-model results carry the model's own name and a rename reruns only the tables)."""
    if labels and "role" in frame.columns:
        frame = frame.copy()
        frame["model"] = [labels.get(r, m) for r, m in zip(frame["role"], frame["model"])]
    return frame


def _itr(args) -> int:
    from .. import evaluation
    from ..config import load_config
    from ..evaluation.settings import stage_config

    cfg = stage_config(load_config(args.config))   # evaluation.precision (paper config: fp32)
    extra = {}
    for item in args.subset:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            raise ConfigError(f"--subset {item!r}: expected LABEL=FILE. Fix: e.g. --subset in_domain_test=test.parquet")
        extra[label] = path
    if extra:
        itr = dict(cfg["evaluation"].get("itr") or {})
        itr["subsets"] = {**(itr.get("subsets") or {}), **extra}
        cfg["evaluation"] = {**cfg["evaluation"], "itr": itr}
    long = evaluation.run_itr(cfg, args.role, args.pairs, args.captions, progress=not args.no_progress)
    write_csv(args.out, long)
    log.info("wrote %s (%d rows)", args.out, len(long))
    return 0


def _itr_table(args) -> int:
    from .. import evaluation

    long = _relabel(evaluation.read_itr_results(args.inputs), role_labels(args.label))
    table = evaluation.itr_table(long)
    write_csv(args.out_csv, table)
    write_text(args.out_md, evaluation.render_itr_markdown(table, args.title))
    if args.out_html:
        write_text(args.out_html, evaluation.render_itr_html(table, args.title))
    log.info("wrote %s and %s (%d rows)", args.out_csv, args.out_md, len(table))
    return 0


def _itm(args) -> int:
    from .. import evaluation
    from ..config import load_config
    from ..evaluation.settings import stage_config

    cfg = stage_config(load_config(args.config))   # evaluation.precision (paper config: fp32)
    table = evaluation.run_itm(cfg, args.role, args.pairs, args.captions, progress=not args.no_progress)
    write_parquet(args.out, table)
    log.info("wrote %s (%d pairs)", args.out, len(table))
    return 0


def _itm_summary(args) -> int:
    from .. import evaluation

    per_pair = _relabel(evaluation.read_itm_results(args.inputs), role_labels(args.label))
    summary = evaluation.itm_summary(per_pair)
    write_csv(args.out_csv, summary)
    write_text(args.out_md, evaluation.render_itm_markdown(summary, args.title))
    if args.out_html:
        write_text(args.out_html, evaluation.render_itm_html(summary, args.title))
    fig = evaluation.plot_itm(per_pair, bins=args.bins)
    save_figure(args.out_png, fig)
    log.info("wrote %s, %s, %s", args.out_csv, args.out_md, args.out_png)
    return 0


def _classify(args) -> int:
    from .. import evaluation
    from ..config import load_config
    from ..evaluation.settings import stage_config

    cfg = stage_config(load_config(args.config))   # evaluation.precision (paper config: fp32)
    result = evaluation.run_classification(cfg, args.role, args.dataset, progress=not args.no_progress)
    write_json(args.out, result)
    return 0


def _classify_table(args) -> int:
    import pandas as pd

    from .. import evaluation

    labels = role_labels(args.label)
    results = [{**r, "model": labels.get(r.get("role"), r.get("model"))} for r in
               evaluation.read_classification_results(args.inputs)]
    order = [d.strip() for d in args.dataset_order.split(",") if d.strip()] if args.dataset_order else None
    metrics = sorted({k for r in results for k in r if k.startswith("top") and k[3:].isdigit()},
                     key=lambda k: int(k[3:]))
    tables = {m: evaluation.classification_table(results, m, order) for m in metrics}
    long = pd.concat([t.assign(metric=m) for m, t in tables.items()], ignore_index=True)
    write_csv(args.out_csv, long[["metric"] + [c for c in long.columns if c != "metric"]])
    write_text(args.out_md, evaluation.render_classification_markdown(tables, args.title))
    if args.out_html:
        write_text(args.out_html, evaluation.render_classification_html(tables, args.title))
    if args.out_png:
        save_figure(args.out_png, evaluation.plot_classification(tables[metrics[0]], metrics[0]))
    log.info("classification table: %d models x %d datasets", len(tables[metrics[0]]),
             len(tables[metrics[0]].columns) - 3)
    return 0
