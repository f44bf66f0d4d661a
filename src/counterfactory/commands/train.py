"""``counterfactory train``: mixtures, one fine-tuning run per (mixture, seed), and the runs table
(COCO-Counterfactuals §5, appendix B.3)."""

from __future__ import annotations

from ..config import load_config
from ..errors import InputError
from . import CONFIG, LABEL, NO_PROGRESS, OUT, OUT_CSV, OUT_DIR, OUT_HTML, OUT_MD, OUT_TEX, Param, Step, flag, registrar


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


# ------------------------------------------------------------------------------------------- declarations

PAIRS = Param("--pairs", required=True, help="selected_pairs.parquet from the image stage")
CAPTIONS = Param("--captions", required=True, help="caption table parquet (the real MS-COCO captions)")

TRAIN = Step(
    "train", help="training data mixtures, fine-tuning runs over seeds, and the runs table",
    description="Fine-tuning runs and the runs table every study's statistics read: COCO-Counterfactuals' real + "
                "counterfactual mixtures (§5, appendix B.3) and in-domain split (A.1), one run per (mixture, seed) of "
                "a CLIP, open_clip, BridgeTower or FLAVA role, `train collect` (the runs table of every study) and "
                "loss curves.",
    steps=(
        Step("mixtures", help="write the B.3.1 mixture manifests (exact paper pool sizes, reproducible 80/20 split)",
             description="Reads the selected pairs and the real MS-COCO captions; writes one training manifest per "
                         "mixture (<mixture>.parquet) to --out-dir and a CSV summary of the mixtures.",
             params=(CONFIG, PAIRS, CAPTIONS,
                     OUT_DIR.but(metavar=None, help="folder for <mixture>.parquet (and summary.csv)"),
                     Param("--out-summary", former=("--summary",), metavar="FILE.csv",
                           help="where to write the mixture summary CSV (default: <out-dir>/summary.csv)")),
             run=_mixtures),
        Step("in-domain-split", help="COCO-CF A.1: withhold 30 %% of the pairs for testing, 56/14 %% train/dev "
                                     "manifests (coco_cfs, mscoco)",
             description="Reads the selected pairs and the real MS-COCO captions; withholds 30%% of the pairs for "
                         "testing and writes split.parquet, test_pairs.parquet, the train/dev manifests and "
                         "summary.csv to --out-dir.",
             params=(CONFIG, PAIRS, CAPTIONS,
                     OUT_DIR.but(metavar=None, help="split.parquet, test_pairs.parquet, manifests/, summary.csv")),
             run=_in_domain),
        Step("in-domain-table", help="COCO-CF Table 5 layout from the in-domain runs' statistics",
             description="Reads the stats summary of the in-domain runs; writes Table 5 as Markdown, LaTeX and CSV.",
             params=(Param("--summary", required=True,
                           help="stats summary CSV of the in-domain runs (one experiment per model)"),
                     Param("--models", required=True, help="comma-separated model roles, in table order"),
                     Param("--mixtures", default="mscoco,coco_cfs",
                           help="comma-separated mixtures after the pre-trained row"),
                     OUT_MD.but(required=True), OUT_TEX.but(required=True), OUT_CSV.but(required=True), OUT_HTML,
                     LABEL.but(help="display name of a model role (repeatable; default: the paper's CLIP / "
                                    "BridgeTower / Flava)")),
             run=_in_domain_table),
        Step("run", help="train one (mixture, seed) run, keep the best checkpoint, evaluate it",
             description="Reads a mixture manifest and the model role; fine-tunes it for one (mixture, seed), keeps "
                         "the best checkpoint, evaluates it and writes checkpoint/, history.csv, metrics.csv (a runs "
                         "table) and run.json to --out-dir.",
             params=(CONFIG,
                     Param("--manifest", help="mixture manifest (parquet or CSV); required unless --no-train"),
                     Param("--mixture", required=True, help="mixture name written into the runs table"),
                     Param("--seed", type=int, required=True, help="model-side seed (B.3.2: 107..131)"),
                     Param("--data-seed", type=int, required=True, help="batch-order seed (B.3.2: 108..132)"),
                     OUT_DIR.but(metavar=None, help="checkpoint/, history.csv, metrics.csv, run.json"),
                     Param("--role", default="clip_train",
                           help="model role to fine-tune (CLIP / open_clip, or BridgeTower / FLAVA with their ITC "
                                "heads)"),
                     Param("--experiment", help="experiment name in the runs table (default: training.experiment)"),
                     flag("--no-train", "evaluate the model as loaded (a table's pre-trained row); --manifest is not "
                                        "read"),
                     Param("--eval-pairs",
                           help="also evaluate retrieval on these counterfactual pairs (A.1 in-domain test)"),
                     Param("--eval-pairs-name", default="coco_cfs_test", help="metric prefix of --eval-pairs"),
                     flag("--no-default-eval", "skip the evaluations of training.eval"),
                     flag("--in-domain-recipe", "apply in_domain.recipes.<role> over training: (A.1's per-model "
                                                "batch size and epochs)"),
                     NO_PROGRESS),
             run=_run),
        Step("collect", help="concatenate per-run metrics into the tidy runs table",
             description="Reads the metrics.csv of each run (of any study); writes the tidy runs table (experiment, "
                         "mixture, seed, data_seed, metric, value) as CSV.",
             params=(Param("metrics", nargs="+", help="metrics.csv of each run"),
                     OUT.but(metavar=None,
                             help="runs table CSV (experiment, mixture, seed, data_seed, metric, value)")),
             run=_collect),
        Step("plot-curves", help="plot training / validation loss of runs (PNG)",
             description="Reads the history.csv of each run; writes a PNG plot of their training and validation "
                         "losses.",
             params=(Param("histories", nargs="+",
                           help="history.csv of each run (.../<mixture>/seed<N>/history.csv)"),
                     OUT.but(metavar=None, help="output PNG")),
             run=_curves),
    ))

register = registrar(TRAIN)
