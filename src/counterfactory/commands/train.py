"""``counterfactory train``: mixtures, one fine-tuning run per (mixture, seed), and the runs table
(COCO-Counterfactuals §5, appendix B.3)."""

from __future__ import annotations

from ..config import load_config
from ..errors import InputError
from . import add_config_option, add_label_option, add_progress_option, add_renamed


def _mixtures(args) -> int:
    from ..training import runs

    cfg = load_config(args.config)
    summary = runs.write_mixtures(cfg, args.pairs, args.captions, args.out_dir, summary_path=args.out_summary)
    print(summary.to_string(index=False))
    return 0


def _run(args) -> int:
    from ..evaluation import runs

    if not args.manifest and not args.no_train:
        raise InputError("train run: no --manifest. Fix: pass the mixture manifest (or --no-train to evaluate the "
                         "model as loaded)")
    cfg = load_config(args.config)
    rows = runs.run_one(cfg, args.manifest, args.mixture, args.seed, args.data_seed, args.out_dir,
                        progress=not args.no_progress, eval_pairs=args.eval_pairs,
                        eval_pairs_name=args.eval_pairs_name, default_eval=not args.no_default_eval, role=args.role,
                        experiment=args.experiment, train=not args.no_train,
                        recipe=((cfg.get("in_domain") or {}).get("recipes") or {}).get(args.role)
                        if args.in_domain_recipe else None)
    print(rows.to_string(index=False))
    return 0


def _in_domain(args) -> int:
    from ..studies.coco_counterfactuals.in_domain import write_in_domain

    cfg = load_config(args.config)
    summary = write_in_domain(cfg, args.pairs, args.captions, args.out_dir)
    print(summary.to_string(index=False))
    return 0


def _in_domain_table(args) -> int:
    from ..io import write_csv, write_text
    from ..studies.coco_counterfactuals import in_domain
    from ..tables import read_summary

    from . import role_labels

    rows = in_domain.table5(read_summary(args.summary), args.models.split(","), args.mixtures.split(","),
                            labels=role_labels(args.label))
    write_text(args.out_md, in_domain.table5_markdown(rows))
    if args.out_html:
        write_text(args.out_html, in_domain.table5_html(rows))
    write_text(args.out_tex, in_domain.table5_latex(rows))
    write_csv(args.out_csv, in_domain.table5_csv(rows))
    print(in_domain.table5_markdown(rows))
    return 0


def _collect(args) -> int:
    from ..training import runs

    table = runs.collect(args.metrics, args.out)
    print(f"{len(table)} rows from {len(args.metrics)} runs -> {args.out}")
    return 0


def _curves(args) -> int:
    from ..training import runs

    runs.plot_curves(args.histories, args.out)
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="training data mixtures, fine-tuning runs over seeds, and the runs table",
                       description="Fine-tuning runs and the runs table every study's statistics read: "
                                   "COCO-Counterfactuals' real + counterfactual mixtures (§5, appendix B.3) and "
                                   "in-domain split (A.1), one run per (mixture, seed) of a CLIP, open_clip, "
                                   "BridgeTower or FLAVA role, `train collect` (the runs table of every study) and "
                                   "loss curves.")
    s = p.add_subparsers(dest="train_command", metavar="<step>")
    s.required = True
    m = s.add_parser("mixtures", help="write the B.3.1 mixture manifests (exact paper pool sizes, reproducible "
                     "80/20 split)",
                     description="Reads the selected pairs and the real MS-COCO captions; writes one training "
                                 "manifest per mixture (<mixture>.parquet) to --out-dir and a CSV summary of the "
                                 "mixtures.")
    add_config_option(m)
    m.add_argument("--pairs", required=True, help="selected_pairs.parquet from the image stage")
    m.add_argument("--captions", required=True, help="caption table parquet (the real MS-COCO captions)")
    m.add_argument("--out-dir", required=True, help="folder for <mixture>.parquet (and summary.csv)")
    add_renamed(m, "--out-summary", "--summary", metavar="FILE.csv",
                help="where to write the mixture summary CSV (default: <out-dir>/summary.csv)")
    m.set_defaults(func=_mixtures)
    d = s.add_parser("in-domain-split", help="COCO-CF A.1: withhold 30 %% of the pairs for testing, 56/14 %% train/dev "
                     "manifests (coco_cfs, mscoco)",
                     description="Reads the selected pairs and the real MS-COCO captions; withholds 30%% of the pairs "
                                 "for testing and writes split.parquet, test_pairs.parquet, the train/dev manifests "
                                 "and summary.csv to --out-dir.")
    add_config_option(d)
    d.add_argument("--pairs", required=True, help="selected_pairs.parquet from the image stage")
    d.add_argument("--captions", required=True, help="caption table parquet (the real MS-COCO captions)")
    d.add_argument("--out-dir", required=True, help="split.parquet, test_pairs.parquet, manifests/, summary.csv")
    d.set_defaults(func=_in_domain)
    t = s.add_parser("in-domain-table", help="COCO-CF Table 5 layout from the in-domain runs' statistics",
                     description="Reads the stats summary of the in-domain runs; writes Table 5 as Markdown, LaTeX "
                                 "and CSV.")
    t.add_argument("--summary", required=True, help="stats summary CSV of the in-domain runs (one experiment per model)")
    t.add_argument("--models", required=True, help="comma-separated model roles, in table order")
    t.add_argument("--mixtures", default="mscoco,coco_cfs", help="comma-separated mixtures after the pre-trained row")
    t.add_argument("--out-md", required=True, metavar="FILE.md", help="the table as Markdown")
    t.add_argument("--out-tex", required=True, metavar="FILE.tex", help="the table as LaTeX")
    t.add_argument("--out-csv", required=True, metavar="FILE.csv", help="the table as CSV")
    t.add_argument("--out-html", metavar="FILE.html", help="the table as an HTML page (what the report shows)")
    add_label_option(t, "display name of a model role (repeatable; default: the paper's CLIP / BridgeTower / "
                        "Flava)")
    t.set_defaults(func=_in_domain_table)
    r = s.add_parser("run", help="train one (mixture, seed) run, keep the best checkpoint, evaluate it",
                     description="Reads a mixture manifest and the model role; fine-tunes it for one (mixture, "
                                 "seed), keeps the best checkpoint, evaluates it and writes checkpoint/, "
                                 "history.csv, metrics.csv (a runs table) and run.json to --out-dir.")
    add_config_option(r)
    r.add_argument("--manifest", help="mixture manifest (parquet or CSV); required unless --no-train")
    r.add_argument("--mixture", required=True, help="mixture name written into the runs table")
    r.add_argument("--seed", type=int, required=True, help="model-side seed (B.3.2: 107..131)")
    r.add_argument("--data-seed", type=int, required=True, help="batch-order seed (B.3.2: 108..132)")
    r.add_argument("--out-dir", required=True, help="checkpoint/, history.csv, metrics.csv, run.json")
    r.add_argument("--role", default="clip_train",
                   help="model role to fine-tune (CLIP / open_clip, or BridgeTower / FLAVA with their ITC heads)")
    r.add_argument("--experiment", help="experiment name in the runs table (default: training.experiment)")
    r.add_argument("--no-train", action="store_true",
                   help="evaluate the model as loaded (a table's pre-trained row); --manifest is not read")
    r.add_argument("--eval-pairs", help="also evaluate retrieval on these counterfactual pairs (A.1 in-domain test)")
    r.add_argument("--eval-pairs-name", default="coco_cfs_test", help="metric prefix of --eval-pairs")
    r.add_argument("--no-default-eval", action="store_true", help="skip the evaluations of training.eval")
    r.add_argument("--in-domain-recipe", action="store_true",
                   help="apply in_domain.recipes.<role> over training: (A.1's per-model batch size and epochs)")
    add_progress_option(r)
    r.set_defaults(func=_run)
    c = s.add_parser("collect", help="concatenate per-run metrics into the tidy runs table",
                     description="Reads the metrics.csv of each run (of any study); writes the tidy runs table "
                                 "(experiment, mixture, seed, data_seed, metric, value) as CSV.")
    c.add_argument("metrics", nargs="+", help="metrics.csv of each run")
    c.add_argument("--out", required=True, help="runs table CSV (experiment, mixture, seed, data_seed, metric, value)")
    c.set_defaults(func=_collect)
    k = s.add_parser("plot-curves", help="plot training / validation loss of runs (PNG)",
                     description="Reads the history.csv of each run; writes a PNG plot of their training and "
                                 "validation losses.")
    k.add_argument("histories", nargs="+", help="history.csv of each run (.../<mixture>/seed<N>/history.csv)")
    k.add_argument("--out", required=True, help="output PNG")
    k.set_defaults(func=_curves)
