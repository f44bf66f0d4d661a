"""``counterfactory plan``: the paper-scale plan of every enabled study (items, UNet evaluations, images, disk,
GPU-hours, jobs) to size an allocation before submitting; see :mod:`counterfactory.planning`."""

from __future__ import annotations


def _plan(args) -> int:
    from .. import planning
    from ..config import load_full_config
    from ..io import write_csv, write_text
    from . import key_values

    items = {}
    for key, value in key_values(args.items, "--items", "STUDY.STAGE=N"):
        try:
            items[key] = int(value.replace(",", "").replace("_", ""))
        except ValueError:
            from ..errors import ConfigError

            raise ConfigError(f"--items {key}={value}: not an integer. Fix: write e.g. {key}=1000") from None
    cfg = load_full_config(args.config)
    throughput = planning.load_throughput(args.throughput)
    frame = planning.plan(cfg, throughput, items=items, results_root=args.results_root)
    study_jobs = None
    if args.dry_run:
        study_jobs = planning.jobs_by_study(planning.dry_run_jobs(args.config, args.snakefile))
    text = f"Plan for {', '.join(args.config)} (run_name {cfg.get('run_name')})\n\n" + \
        planning.to_markdown(frame, throughput, study_jobs)
    print(text, end="")
    if args.out_csv:
        write_csv(args.out_csv, frame)
    if args.out_md:
        write_text(args.out_md, text)
    return 0


def register(sub) -> None:
    from . import add_config_option

    p = sub.add_parser(
        "plan", help="paper-scale plan: jobs, UNet evaluations, images, disk and GPU-hours per study",
        description="For every enabled study of the configuration: per image stage, the items, UNet evaluations "
                    "(one latent row at one step; CFG doubles, InstructPix2Pix triples), images written, disk (PNG "
                    "estimate), GPU-hours at the throughput file's rates and the stage's jobs; a Markdown table per "
                    "study, then totals. Items come from --items, from earlier outputs under results/<run_name>/, "
                    "from the config, or from the papers' counts (each row says which).")
    add_config_option(p, help="configuration file (repeatable; later files win), e.g. config/config.yaml")
    p.add_argument("--throughput", metavar="JSON", default=None,
                   help="rates from benchmarks/bench_true_size.py --json (default: the packaged H100 file)")
    p.add_argument("--items", action="append", metavar="STUDY.STAGE=N",
                   help="item count of a stage, e.g. countercurate.t2i=90000 (repeatable)")
    p.add_argument("--dry-run", action="store_true",
                   help="also count every Snakemake job per study with `snakemake -n all` (needs the data in place)")
    p.add_argument("--snakefile", default="Snakefile", help="Snakefile for --dry-run (default: ./Snakefile)")
    p.add_argument("--results-root", default=".", metavar="DIR",
                   help="folder holding results/ (input tables of earlier runs give exact item counts)")
    p.add_argument("--out-csv", metavar="FILE", help="also write the rows as CSV")
    p.add_argument("--out-md", metavar="FILE", help="also write the printed Markdown")
    p.set_defaults(func=_plan)
