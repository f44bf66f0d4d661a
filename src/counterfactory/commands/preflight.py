"""``counterfactory preflight``: before a real run, check that every model role, dataset, the NLTK data, the disk and
the accelerator's memory are in place, without loading any weights; see :mod:`counterfactory.preflight`. This
module is the command line only, declared as data (``commands.Step``)."""

from __future__ import annotations

from . import CONFIG, Param, Step, flag, registrar

#: the preflight's checks (``--only``), all run by default
PARTS = ("model", "dataset", "nltk", "disk", "gpu-memory")


def _preflight(args) -> int:
    from .. import preflight
    from ..config import load_full_config
    from ..io import write_text

    cfg = load_full_config(args.config)
    if args.study:
        preflight.only_studies(cfg, args.study)
    throughput = args.throughput
    if throughput is not None:       # a file the user named is read here: a bad one is an error, not a skipped check
        from ..planning import load_throughput

        throughput = load_throughput(throughput)
    checks = preflight.preflight(cfg, online=False if args.offline else None, results_root=args.results_root,
                                 throughput=throughput, parts=args.only or list(PARTS))
    if args.table:
        print(preflight.to_table(checks, only_problems=args.problems_only))
        print(preflight.summary(checks))
    else:
        print(preflight.render(checks, cfg, only_problems=args.problems_only))
    if args.script:
        write_text(args.script, preflight.download_script(checks, cfg))
        print(f"wrote {args.script}: the folders and sources of what is missing (read it, then run it)")
    if args.out:
        write_text(args.out, preflight.report_json(checks, args.config))
    return 0 if preflight.passed(checks) else 1


PREFLIGHT = Step(
    "preflight", help="check models, datasets, NLTK data, disk and GPU memory before a run (nothing loaded)",
    description="Reads the configuration and, for every enabled study: each model role's folder, Hugging Face cache "
                "entry or hub repository (configuration files only, never weights) and whether its class fits its "
                "stage; each dataset in its official layout; the NLTK data; free disk against the `counterfactory "
                "plan` estimate; with a CUDA device, its memory against the largest role. Prints one table (check, "
                "config key, status, detail and fix); exit status 0 only when every check passes (statuses ok, "
                "fetch, build, skip).",
    params=(
        CONFIG.but(help="configuration file (repeatable; later files win), e.g. config/config.yaml"),
        Param("--study", action="append", metavar="NAME",
              help="check only this enabled study (repeatable; default: every study of `studies:`)"),
        flag("--offline", "do not ask the hub about roles missing from the cache (as with HF_HUB_OFFLINE=1, but a "
                          "missing role is reported as fetched on first use instead of failed)"),
        Param("--only", action="append", choices=PARTS, help="run only these checks (repeatable; default: all)"),
        flag("--problems-only", "print only the checks that failed"),
        Param("--throughput", metavar="JSON", default=None,
              help="rates for the plan's estimate (default: the packaged file; only its disk column is used)"),
        Param("--results-root", default=".", metavar="DIR",
              help="folder holding results/ (its file system is the one checked for space)"),
        Param("--out", metavar="JSON", help="also write the checks as JSON"),
        Param("--script", metavar="FILE",
              help="also write a shell script with the folders, sources, sizes and licences of every missing "
                   "dataset and the download command of every missing hub model (pinned revisions)"),
        flag("--table", "print one aligned row per check (config key, status, detail / fix) instead of the grouped "
                        "report"),
    ),
    run=_preflight)

register = registrar(PREFLIGHT)
