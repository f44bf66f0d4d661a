"""``counterfactory plan``: the paper-scale plan of every enabled study (items, UNet evaluations, images, disk,
GPU-hours, jobs) to size an allocation before submitting; see :mod:`counterfactory.planning`. The command line only,
declared as data (``commands.Step``)."""

from __future__ import annotations

from . import CONFIG, Param, Step, flag, key_values, registrar


def _plan(args) -> int:
    from .. import planning
    from ..io import write_csv, write_text

    items = {}
    for key, value in key_values(args.items, "--items", "STUDY.STAGE=N"):
        try:
            items[key] = int(value.replace(",", "").replace("_", ""))
        except ValueError:
            from ..errors import ConfigError

            raise ConfigError(f"--items {key}={value}: not an integer. Fix: write e.g. {key}=1000") from None
    frame, text = planning.plan_report(args.config, args.throughput, items=items, results_root=args.results_root,
                                       dry_run=args.dry_run, snakefile=args.snakefile)
    print(text, end="")
    if args.out_csv:
        write_csv(args.out_csv, frame)
    if args.out_md:
        write_text(args.out_md, text)
    return 0


PLAN = Step(
    "plan", help="paper-scale plan: jobs, UNet evaluations, images, disk and GPU-hours per study",
    description="For every enabled study of the configuration: per image stage, the items, UNet evaluations "
                "(one latent row at one step; CFG doubles, InstructPix2Pix triples), images written, disk (PNG "
                "estimate), GPU-hours at the throughput file's rates and the stage's jobs; a Markdown table per "
                "study, then totals. Items come from --items, from earlier outputs under results/<run_name>/, "
                "from the config, or from the papers' counts (each row says which).",
    params=(CONFIG.but(help="configuration file (repeatable; later files win), e.g. config/config.yaml"),
            Param("--throughput", metavar="JSON", default=None,
                  help="rates from benchmarks/bench_true_size.py --json (default: the packaged H100 file)"),
            Param("--items", action="append", metavar="STUDY.STAGE=N",
                  help="item count of a stage, e.g. countercurate.t2i=90000 (repeatable)"),
            flag("--dry-run", "also count every Snakemake job per study with `snakemake -n all` (needs the data in "
                              "place)"),
            Param("--snakefile", default="Snakefile", help="Snakefile for --dry-run (default: ./Snakefile)"),
            Param("--results-root", default=".", metavar="DIR",
                  help="folder holding results/ (input tables of earlier runs give exact item counts)"),
            Param("--out-csv", metavar="FILE", help="also write the rows as CSV"),
            Param("--out-md", metavar="FILE", help="also write the printed Markdown")),
    run=_plan)

register = registrar(PLAN)
