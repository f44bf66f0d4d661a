"""``counterfactory score``: any model on the counterfactual benchmarks, one leaderboard with bootstrap intervals and
shortcut baselines (:mod:`counterfactory.leaderboard`; docs/score.md); ``score compare``: a paired test of two models.
This module is the command line only, declared as data (``commands.Step``); the work is done by
:mod:`counterfactory.leaderboard`."""

from __future__ import annotations

from . import CONFIG, NO_PROGRESS, OUT, OUT_DIR, Param, Step, flag, key_values, lazy_module, registrar

leaderboard = lazy_module("counterfactory.leaderboard")

# ------------------------------------------------------------------------------------------- handlers


def _run(args) -> int:
    from ..config import load_full_config

    cfg = load_full_config(args.config)
    models = [leaderboard.model_ref(cfg, value) for value in args.model]
    names = list(leaderboard.BENCHMARKS) if args.benchmarks == ["all"] else args.benchmarks
    sources = dict(key_values(args.data, "--data", "BENCHMARK=PATH"))
    for name in names:
        if name not in sources and leaderboard.default_source(cfg, name):
            sources[name] = leaderboard.default_source(cfg, name)
    table = leaderboard.run(cfg, models, names, args.out_dir, sources=sources, resamples=args.resamples,
                            seed=args.seed, head=args.head, baselines=not args.no_baselines,
                            progress=not args.no_progress)
    print(f"{args.out_dir.rstrip('/')}/leaderboard.md: {len(table)} cells, {len(models)} model(s), "
          f"{len(names)} benchmark(s)")
    return 0


def _item(args) -> int:
    """One model role on one benchmark: its per-item (or per-unit) outcomes (the workflow's score_item job); a
    model whose kind the benchmark cannot score gets an n/a file."""
    from pathlib import Path

    from ..config import load_config
    from ..errors import ConfigError
    from ..io import write_parquet

    if args.benchmark not in leaderboard.BENCHMARKS:
        raise ConfigError(f"score item: unknown benchmark {args.benchmark!r}. Fix: use "
                          f"{', '.join(leaderboard.BENCHMARKS)}")
    bench = leaderboard.BENCHMARKS[args.benchmark]
    cfg = load_config(args.config, study=bench.study)   # the benchmark's study view: its data paths
    ref = leaderboard.model_ref(cfg, args.model)
    why = leaderboard.not_scorable(ref.cfg, ref.role, args.benchmark)
    if why:
        write_parquet(Path(args.out), leaderboard.empty_outcomes(why))
        print(f"{args.out}: {ref.label} on {args.benchmark}: {why}")
        return 0
    items = leaderboard.read_items(cfg, args.benchmark, args.data)
    outcomes = leaderboard.score_model(cfg, ref.role, bench, items, head=cfg["score"]["head"],
                                       progress=not args.no_progress)
    write_parquet(Path(args.out), outcomes)
    print(f"{args.out}: {ref.label} on {args.benchmark}, {len(outcomes)} {bench.unit}s")
    return 0


def _leaderboard(args) -> int:
    """The leaderboard of the workflow's per-item outcome files (``<dir>/items/<benchmark>/<role>.parquet``)."""
    from ..config import load_config

    cfg = load_config(args.config, study="countercurate")   # its benchmarks section: the data paths
    labels = dict(key_values(args.label, "--label", "ROLE=NAME"))
    sources = dict(key_values(args.data, "--data", "BENCHMARK=PATH"))
    table, scored = leaderboard.run_items(cfg, args.items, args.out_dir, sources=sources, labels=labels,
                                          notes=args.note)
    print(f"{args.out_dir.rstrip('/')}/leaderboard.md: {len(table)} cells, {len(scored)} model x benchmark file(s)")
    return 0


def _compare(args) -> int:
    import json

    result = leaderboard.compare_cached(args.out_dir, args.benchmark, args.a, args.b, resamples=args.resamples,
                                        seed=args.seed)
    print(json.dumps(result, indent=2))
    return 0


# ------------------------------------------------------------------------------------------- declarations

RUN = Step(
    "run", help="score the models and write the leaderboard",
    description="Reads the benchmarks' data (the config's paths, or --data) and each model; writes "
                "<out-dir>/leaderboard.* and <out-dir>/items/<benchmark>/<key>.parquet.",
    params=(CONFIG,
            Param("--model", action="append", required=True, metavar="ROLE_OR_SOURCE",
                  help="a configured model role, a local model folder or a hub id (repeatable)"),
            Param("--benchmarks", nargs="+", default=["all"], metavar="NAME",
                  help="benchmarks (docs/score.md: coco_cf, coco_cf_retrieval, sugarcrepe, winoground, looktwice, "
                       "cc_positions, cc_counting, cc_attributes, socialcf, pata, visogender, cvld_fairface, "
                       "cvld_celeba, odmap_coco, odmap_flickr30k), or all (default); one whose data is not "
                       "configured is skipped with a note"),
            Param("--data", action="append", default=[], metavar="BENCHMARK=PATH",
                  help="a benchmark's data instead of the config's (coco_cf, coco_cf_retrieval: "
                       "selected_pairs.parquet or the release; socialcf: the release folder; cc_*: the countercurate "
                       "datasets table; odmap_*: the spurious_retrieval dataset folder)"),
            OUT_DIR.but(help="leaderboard and cached per-item outcomes"),
            Param("--resamples", type=int, default=1000, help="bootstrap resamples per cell (default 1000)"),
            Param("--seed", type=int, default=0, help="bootstrap seed (default 0)"),
            Param("--head", default="itm", choices=("itm", "itc"),
                  help="score head of models that have both (default itm)"),
            flag("--no-baselines", "leave out the shortcut rows"),
            NO_PROGRESS),
    run=_run)

ITEM = Step(
    "item", help="one model on one benchmark: per-item outcomes (the workflow's score_item job)",
    description="Reads the benchmark's data (the config's countercurate.benchmarks paths, or --data) and the model; "
                "writes its per-item outcomes (per-unit for a set-level benchmark; an n/a file for a model kind it "
                "cannot score) for `score leaderboard`. Settings: the config's score section.",
    params=(CONFIG,
            Param("--model", required=True, metavar="ROLE_OR_SOURCE",
                  help="a configured model role, a local model folder or a hub id"),
            Param("--benchmark", required=True, metavar="NAME",
                  help="the benchmark to score (one of `score run --benchmarks`)"),
            Param("--data", default=None, metavar="PATH",
                  help="the benchmark's data instead of the config's (as `score run --data`)"),
            OUT.but(help="per-item outcomes (.parquet)"),
            NO_PROGRESS),
    run=_item)

LEADERBOARD = Step(
    "leaderboard", help="the leaderboard of per-item outcome files (the workflow's last step)",
    description="Reads <dir>/items/<benchmark>/<role>.parquet files of `score item` and the benchmarks' data (for "
                "the shortcut rows); writes leaderboard.{md,csv,json,html} with the config's score.resamples / seed "
                "/ level.",
    params=(CONFIG,
            Param("--items", nargs="+", required=True, metavar="FILE",
                  help="per-item outcomes, laid out as <dir>/items/<benchmark>/<role>.parquet"),
            Param("--data", action="append", default=[], metavar="BENCHMARK=PATH",
                  help="a benchmark's data instead of the config's (for the shortcut rows)"),
            Param("--label", action="append", default=[], metavar="ROLE=NAME",
                  help="the leaderboard name of a role (default: its display_name)"),
            Param("--note", action="append", default=[], metavar="TEXT",
                  help="a note under the table, e.g. a benchmark the run skipped and why (repeatable)"),
            OUT_DIR.but(help="where leaderboard.* are written")),
    run=_leaderboard)

COMPARE = Step(
    "compare", help="paired bootstrap test of two cached models on one benchmark",
    description="Reads two cached outcome files of one benchmark (<out-dir>/items/<benchmark>/<key>.parquet) and "
                "prints the mean difference, its interval and p-value per metric.",
    params=(OUT_DIR.but(help="the --out-dir of `score run`"),
            Param("--benchmark", required=True, help="the benchmark both models were scored on"),
            Param("a", metavar="KEY_A", help="cache key of model A (<out-dir>/cache_keys.csv)"),
            Param("b", metavar="KEY_B", help="cache key of model B"),
            Param("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)"),
            Param("--seed", type=int, default=0, help="bootstrap seed (default 0)")),
    run=_compare)

SCORE = Step(
    "score", help="score models on every counterfactual benchmark (leaderboard with intervals)",
    description="Scores models (configured roles, local folders or hub ids) on the counterfactual benchmarks and "
                "writes leaderboard.{md,csv,json,html} with bootstrap intervals and shortcut baselines; per-item "
                "outcomes are cached by model and data content.",
    steps=(RUN, ITEM, LEADERBOARD, COMPARE),
    dest="step")

register = registrar(SCORE)
