"""``counterfactory score``: any model on the counterfactual benchmarks, one leaderboard with bootstrap intervals and
shortcut baselines (:mod:`counterfactory.leaderboard`; docs/score.md); ``score compare``: a paired test of two models."""

from __future__ import annotations


def _run(args) -> int:
    from .. import leaderboard
    from ..config import load_full_config
    from . import key_values

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

    from .. import leaderboard
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
    from pathlib import Path

    import pandas as pd

    from .. import leaderboard
    from ..config import load_config
    from ..errors import input_error
    from ..render import model_display_names
    from . import key_values

    cfg = load_config(args.config, study="countercurate")   # its benchmarks section: the data paths
    sc = cfg["score"]
    labels = dict(key_values(args.label, "--label", "ROLE=NAME"))
    sources = dict(key_values(args.data, "--data", "BENCHMARK=PATH"))
    scored, names, notes, models = [], [], list(args.note), []
    for path in map(Path, args.items):
        name, role = path.parent.name, path.stem
        if name not in leaderboard.BENCHMARKS:
            raise input_error(path, None, f"{name!r} is not a benchmark",
                              "pass files laid out as <dir>/items/<benchmark>/<role>.parquet")
        label = labels.get(role) or model_display_names(cfg.get("models") or {}, [role]).get(role, role)
        outcomes = pd.read_parquet(path)
        models.append(label)
        names.append(name)
        note = leaderboard.outcome_note(outcomes)
        if note:
            notes.append(f"{label} on {name}: {note}")
            continue
        scored.append((label, name, outcomes))
    names = list(dict.fromkeys(names))
    shortcut = [n for n in names if leaderboard.BENCHMARKS[n].kind != leaderboard.SET]
    items = {n: leaderboard.read_items(cfg, n, sources.get(n)) for n in shortcut} if sc["baselines"] else {}
    table = leaderboard.cells(cfg, scored, items, resamples=sc["resamples"], seed=sc["seed"], level=sc["level"],
                              baselines=sc["baselines"])
    table = leaderboard.with_na_rows(table, list(dict.fromkeys(models)), names)
    leaderboard.write_leaderboard(table, Path(args.out_dir), resamples=sc["resamples"], seed=sc["seed"],
                                  level=sc["level"], notes=notes + leaderboard.tie_notes(scored))
    print(f"{args.out_dir.rstrip('/')}/leaderboard.md: {len(table)} cells, {len(scored)} model x benchmark file(s)")
    return 0


def _compare(args) -> int:
    import json

    from .. import leaderboard

    result = leaderboard.compare_cached(args.out_dir, args.benchmark, args.a, args.b, resamples=args.resamples,
                                        seed=args.seed)
    print(json.dumps(result, indent=2))
    return 0


def register(sub) -> None:
    from . import add_config_option, add_progress_option

    p = sub.add_parser("score", help="score models on every counterfactual benchmark (leaderboard with intervals)",
                       description="Scores models (configured roles, local folders or hub ids) on the counterfactual "
                                   "benchmarks and writes leaderboard.{md,csv,json,html} with bootstrap intervals "
                                   "and shortcut baselines; per-item outcomes are cached by model and data content.")
    s = p.add_subparsers(dest="step", metavar="<step>")
    s.required = True
    r = s.add_parser("run", help="score the models and write the leaderboard",
                     description="Reads the benchmarks' data (the config's paths, or --data) and each model; writes "
                                 "<out-dir>/leaderboard.* and <out-dir>/items/<benchmark>/<key>.parquet.")
    add_config_option(r)
    r.add_argument("--model", action="append", required=True, metavar="ROLE_OR_SOURCE",
                   help="a configured model role, a local model folder or a hub id (repeatable)")
    r.add_argument("--benchmarks", nargs="+", default=["all"], metavar="NAME",
                   help="benchmarks (docs/score.md: coco_cf, coco_cf_retrieval, sugarcrepe, winoground, looktwice, "
                        "cc_positions, cc_counting, cc_attributes, socialcf, pata, visogender, cvld_fairface, "
                        "cvld_celeba, odmap_coco, odmap_flickr30k), or all (default); one whose data is not "
                        "configured is skipped with a note")
    r.add_argument("--data", action="append", default=[], metavar="BENCHMARK=PATH",
                   help="a benchmark's data instead of the config's (coco_cf, coco_cf_retrieval: "
                        "selected_pairs.parquet or the release; socialcf: the release folder; cc_*: the countercurate "
                        "datasets table; odmap_*: the spurious_retrieval dataset folder)")
    r.add_argument("--out-dir", required=True, metavar="DIR", help="leaderboard and cached per-item outcomes")
    r.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples per cell (default 1000)")
    r.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    r.add_argument("--head", default="itm", choices=("itm", "itc"),
                   help="score head of models that have both (default itm)")
    r.add_argument("--no-baselines", action="store_true", help="leave out the shortcut rows")
    add_progress_option(r)
    r.set_defaults(func=_run)
    i = s.add_parser("item", help="one model on one benchmark: per-item outcomes (the workflow's score_item job)",
                     description="Reads the benchmark's data (the config's countercurate.benchmarks paths, or --data) "
                                 "and the model; writes its per-item outcomes (per-unit for a set-level benchmark; an "
                                 "n/a file for a model kind it cannot score) for `score leaderboard`. Settings: the "
                                 "config's score section.")
    add_config_option(i)
    i.add_argument("--model", required=True, metavar="ROLE_OR_SOURCE",
                   help="a configured model role, a local model folder or a hub id")
    i.add_argument("--benchmark", required=True, metavar="NAME",
                   help="the benchmark to score (one of `score run --benchmarks`)")
    i.add_argument("--data", default=None, metavar="PATH",
                   help="the benchmark's data instead of the config's (as `score run --data`)")
    i.add_argument("--out", required=True, metavar="FILE", help="per-item outcomes (.parquet)")
    add_progress_option(i)
    i.set_defaults(func=_item)
    lb = s.add_parser("leaderboard", help="the leaderboard of per-item outcome files (the workflow's last step)",
                      description="Reads <dir>/items/<benchmark>/<role>.parquet files of `score item` and the "
                                  "benchmarks' data (for the shortcut rows); writes leaderboard.{md,csv,json,html} with "
                                  "the config's score.resamples / seed / level.")
    add_config_option(lb)
    lb.add_argument("--items", nargs="+", required=True, metavar="FILE",
                    help="per-item outcomes, laid out as <dir>/items/<benchmark>/<role>.parquet")
    lb.add_argument("--data", action="append", default=[], metavar="BENCHMARK=PATH",
                    help="a benchmark's data instead of the config's (for the shortcut rows)")
    lb.add_argument("--label", action="append", default=[], metavar="ROLE=NAME",
                    help="the leaderboard name of a role (default: its display_name)")
    lb.add_argument("--note", action="append", default=[], metavar="TEXT",
                    help="a note under the table, e.g. a benchmark the run skipped and why (repeatable)")
    lb.add_argument("--out-dir", required=True, metavar="DIR", help="where leaderboard.* are written")
    lb.set_defaults(func=_leaderboard)
    c = s.add_parser("compare", help="paired bootstrap test of two cached models on one benchmark",
                     description="Reads two cached outcome files of one benchmark (<out-dir>/items/<benchmark>/"
                                 "<key>.parquet) and prints the mean difference, its interval and p-value per metric.")
    c.add_argument("--out-dir", required=True, metavar="DIR", help="the --out-dir of `score run`")
    c.add_argument("--benchmark", required=True, help="the benchmark both models were scored on")
    c.add_argument("a", metavar="KEY_A", help="cache key of model A (<out-dir>/cache_keys.csv)")
    c.add_argument("b", metavar="KEY_B", help="cache key of model B")
    c.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    c.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    c.set_defaults(func=_compare)
