"""``counterfactory images adaptive-curve``: cost vs selected score of adaptive over-generation stopping rules,
replayed exactly from a fixed-mode run (:mod:`counterfactory.generation.adaptive`).

The subcommand lives under ``images``: :mod:`.images` calls :func:`add_curve_parser` on its subparsers.
This module's own :func:`register` adds nothing at the top level.
"""

from __future__ import annotations

from . import add_config_option


def register(subparsers) -> None:
    """Nothing at the top level (the CLI calls every command module's ``register``)."""


def add_curve_parser(images_sub) -> None:
    """Add ``adaptive-curve`` to the ``images`` subcommands."""
    p = images_sub.add_parser(
        "adaptive-curve",
        help="UNet evaluations per accepted item vs median selected score, per adaptive stopping rule",
        description="Adaptive over-generation (ours; images.adaptive) generates a prefix of the fixed mode's batches "
                    "with the same seeds, so its cost and selection follow exactly from a fixed-mode run's "
                    "per-candidate scores. For the fixed paper mode, 'stop once >= t candidates passed' (t in "
                    "adaptive_curve.targets, default 1 2 4) and optional 'stop once the best passed score "
                    ">= the q-quantile' rules, writes one CSV row per rule (items, items with a selection, UNet "
                    "evaluations per accepted candidate, median and quartiles of the selected scores, fraction of "
                    "items whose selection changed vs the fixed mode) and a plot. Pairs: COCO-CF "
                    "candidate_scores.parquet (score: sim_direction = CLIP_dir); sets: SocialCounterfactuals "
                    "filter/clip_sets.parquet with --summary generation/summary.json (score: min_image_caption).",
    )
    add_config_option(p)
    p.add_argument("--scores", required=True, metavar="PARQUET",
                   help="fixed-mode candidate scores: candidate_scores.parquet (pairs) or filter/clip_sets.parquet (sets)")
    p.add_argument("--summary", metavar="JSON",
                   help="the run's summary.json (default for pairs: next to --scores; required for sets: "
                        "generation/summary.json)")
    p.add_argument("--out-csv", required=True, metavar="CSV", help="curve table, one row per rule")
    p.add_argument("--out-png", metavar="PNG", help="plot: UNet evaluations per accepted vs median selected score")
    p.add_argument("--study", help="study whose config view to read from a full config (default: coco_counterfactuals "
                                   "for pairs, social_counterfactuals for sets; a job config names its own)")
    p.add_argument("--score-column", metavar="COL", help="score to summarise (pairs: sim_direction; sets: "
                                                         "min_image_caption)")
    p.add_argument("--targets", type=int, nargs="+", metavar="T", help="override adaptive_curve.targets")
    p.add_argument("--best-quantiles", type=float, nargs="+", metavar="Q",
                   help="override adaptive_curve.best_quantiles")
    p.add_argument("--batch-size", type=int, metavar="B",
                   help="replay with this batch layout instead of the run's (candidates do not depend on it)")
    p.set_defaults(func=_curve)


def _curve(args) -> int:
    import pandas as pd
    import pyarrow.parquet as pq

    from ..config import load_config
    from ..errors import input_error, missing_input
    from ..generation import adaptive as ad
    from ..io import write_csv

    try:
        names = pq.read_schema(args.scores).names
    except FileNotFoundError:
        raise missing_input(args.scores, "candidate scores", "run the image stage (fixed mode) first") from None
    except Exception as exc:  # pyarrow raises several types
        raise input_error(args.scores, None, f"not a readable parquet file ({exc})",
                          "pass candidate_scores.parquet (pairs) or filter/clip_sets.parquet (sets)") from exc
    kind = ad.SETS if "set_id" in names and "caption_id" not in names else ad.PAIRS
    study = args.study or ("social_counterfactuals" if kind == ad.SETS else "coco_counterfactuals")
    cfg = load_config(args.config, study=study)
    base = ad.CurveSettings.from_config(cfg)
    settings = ad.CurveSettings(
        targets=tuple(args.targets) if args.targets else base.targets,
        best_quantiles=tuple(args.best_quantiles) if args.best_quantiles else base.best_quantiles,
        batch_size=args.batch_size if args.batch_size is not None else base.batch_size)
    score = args.score_column or ad.DEFAULT_SCORE[kind]
    table = ad.curve_from_files(args.scores, cfg, args.summary, kind=kind, score_column=score, settings=settings)
    write_csv(args.out_csv, table)
    if args.out_png:
        label = "median selected CLIP_dir" if score == "sim_direction" else f"median selected {score}"
        ad.plot_curve(table, args.out_png, score_label=label,
                      title=f"{cfg.get('study', study)}: adaptive over-generation ({kind})")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 0
