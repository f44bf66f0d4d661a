"""``counterfactory provenance``: record git commit, resolved config, package versions, model roles
(with content fingerprints), the NLTK data in use and the outputs' sizes and sha256; or, with
``--verify``, check a provenance file against the files on disk. The command line only, declared as data
(``commands.Step``); the work is :mod:`counterfactory.provenance`."""

from __future__ import annotations

from ..config import load_full_config
from ..errors import CounterFactoryError
from . import Param, Step, flag, registrar


def _run(args) -> int:
    from .. import provenance

    if args.verify:
        problems = provenance.verify(args.verify, base=args.base, use_cache=args.trust_cache)
        for p in problems:
            print(f"MISMATCH {p['path']}: {p['problem']}")
        if problems:
            raise CounterFactoryError(
                f"{args.verify}: {len(problems)} output(s) differ from the provenance record. Fix: rerun the steps "
                "that make them, or write a new provenance record if the change is intended")
        print(f"{args.verify}: every recorded output matches")
        return 0
    if not args.config or not args.out:
        raise CounterFactoryError("provenance: --config and --out are required (or --verify PROVENANCE.json)")
    cfg = load_full_config(args.config)  # the whole run: every study's section
    provenance.write(args.out, cfg, outputs=args.outputs or (), folders=args.folders or (), skip=args.skip or ())
    return 0


PROVENANCE = Step(
    "provenance", help="write (or --verify) a provenance JSON for a run",
    description="Reads the configuration, the git checkout, the installed packages, the model roles and the given "
                "outputs; writes a provenance JSON (git commit, resolved config, package versions, model "
                "fingerprints, NLTK data, each output's size and sha256). With --verify it writes nothing and checks "
                "a provenance file against the files on disk.",
    params=(Param("--config", action="append", help="config YAML (repeat to merge)"),
            Param("--out", help="output JSON"),
            Param("--outputs", nargs="+", metavar="PATH", default=[],
                  help="result files or folders to record (path, size, sha256 / folder fingerprint)"),
            Param("--folders", nargs="+", metavar="DIR", default=[],
                  help="folders recorded whole, every file in them (the workflow passes each study's results)"),
            Param("--skip", nargs="+", metavar="REL", default=[],
                  help="paths under each --folders folder left out (a file, or a folder ending /): what is made "
                       "from this record and what changes run to run (logs/, benchmarks/)"),
            Param("--verify", metavar="PROVENANCE.json",
                  help="check the outputs recorded in this file against the disk; exit 2 on any mismatch"),
            Param("--base", help="with --verify: folder relative output paths start from (default: current)"),
            flag("--trust-cache", "with --verify: reuse cached file hashes when size/mtime/inode are unchanged")),
    run=_run)

register = registrar(PROVENANCE)
