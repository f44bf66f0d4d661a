"""``counterfactory images adaptive-curve``: cost vs selected score of adaptive over-generation stopping rules,
replayed exactly from a fixed-mode run (:mod:`counterfactory.generation.adaptive`). The command line only,
declared as data (``commands.Step``).

The subcommand lives under ``images``: :mod:`.images` includes :data:`ADAPTIVE_CURVE` in its steps. This module's
own :func:`register` adds nothing at the top level.
"""

from __future__ import annotations

from . import CONFIG, Param, Step, lazy_module, registrar

# imported when the subcommand runs (building the parser must not import pandas)
ad = lazy_module("counterfactory.generation.adaptive")


def register(subparsers) -> None:
    """Nothing at the top level (the CLI calls every command module's ``register``)."""


def _curve(args) -> int:
    import pandas as pd

    from ..config import load_config

    kind = ad.scores_kind(args.scores)
    study = args.study or ("social_counterfactuals" if kind == ad.SETS else "coco_counterfactuals")
    cfg = load_config(args.config, study=study)
    table = ad.write_curve(cfg, args.scores, args.out_csv, args.summary, kind=kind, study=study, out_png=args.out_png,
                           score_column=args.score_column, targets=args.targets, best_quantiles=args.best_quantiles,
                           batch_size=args.batch_size)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 0


ADAPTIVE_CURVE = Step(
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
    params=(
        CONFIG,
        Param("--scores", required=True, metavar="PARQUET",
              help="fixed-mode candidate scores: candidate_scores.parquet (pairs) or filter/clip_sets.parquet (sets)"),
        Param("--summary", metavar="JSON",
              help="the run's summary.json (default for pairs: next to --scores; required for sets: "
                   "generation/summary.json)"),
        Param("--out-csv", required=True, metavar="CSV", help="curve table, one row per rule"),
        Param("--out-png", metavar="PNG", help="plot: UNet evaluations per accepted vs median selected score"),
        Param("--study", help="study whose config view to read from a full config (default: coco_counterfactuals "
                              "for pairs, social_counterfactuals for sets; a job config names its own)"),
        Param("--score-column", metavar="COL",
              help="score to summarise (pairs: sim_direction; sets: min_image_caption)"),
        Param("--targets", type=int, nargs="+", metavar="T", help="override adaptive_curve.targets"),
        Param("--best-quantiles", type=float, nargs="+", metavar="Q", help="override adaptive_curve.best_quantiles"),
        Param("--batch-size", type=int, metavar="B",
              help="replay with this batch layout instead of the run's (candidates do not depend on it)"),
    ),
    run=_curve)

#: ``adaptive-curve`` alone in a subparsers (for tests that parse it)
add_curve_parser = registrar(ADAPTIVE_CURVE)
