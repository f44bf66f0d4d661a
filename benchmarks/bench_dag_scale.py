"""Dry-run the paper-scale DAG of all five studies and report its size, build time and peak memory.

Stand-in data of the right shape is written to a temporary folder (:func:`counterfactory.testing.official_tree`):
every dataset of the data catalogue under ``data/`` in its official layout, COCO 2017 with the shape of val2017
(25,014 captions over 5,000 images; empty image files), the other datasets with a handful of items (the demo's
fixtures where a reader needs rows). ``config/config.yaml`` runs against it unchanged, with every study it enables
(COCO-Counterfactuals: 100 candidates per caption, 4 mixtures x 25 seeds; SocialCounterfactuals: 1,872 caption
sets; CounterCurate; spurious-correlation retrieval; CVLD). The run is ``snakemake -n all`` (no job runs), the
way a user checks a paper-scale run before submitting it.

    python benchmarks/bench_dag_scale.py                     # paper scale
    python benchmarks/bench_dag_scale.py --captions 2500 --images 500
    python benchmarks/bench_dag_scale.py --profile slurm     # the same through a cluster profile
    python benchmarks/bench_dag_scale.py --set images.shard_size=5   # smaller shards, more jobs (COCO-CF)
    python benchmarks/bench_dag_scale.py --set cvld.editing.shards=64   # a study's own key: study name first

Prints the jobs per rule grouped by study, the jobs per study, the total job count, the wall and CPU time of the
dry run (parse + DAG) and the peak resident memory of the Snakemake process. Goal on the 2-core development
machine: <= 30 s and <= 1 GB (Snakemake costs about 1 ms and 14 KB per job, so the shard sizes keep the job
count near 10^4 or below). Exit status 1 when a goal is missed or an enabled study has no jobs. CounterCurate's
generation jobs follow a checkpoint (``countercurate_request_shards``), so a dry run before its requests exist
cannot list them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from counterfactory.config import studies as all_studies
from counterfactory.config import validate_config
from counterfactory.planning import job_counts, jobs_by_study
from counterfactory.testing import official_tree

REPO = Path(__file__).resolve().parents[1]
GOAL_SECONDS = 30.0
GOAL_MB = 1024.0
STUDY = "coco_counterfactuals"


def dry_run(workdir: Path, override: Path, profile: str | None) -> tuple[float, float, float, str]:
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    cmd = [snakemake, "-n", "all", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--quiet", "rules"]
    cmd += ["--profile", profile] if profile else ["--cores", "2"]
    cmd += ["--configfile", str(REPO / "config" / "config.yaml"), str(override)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_mb = after.ru_maxrss / 1024  # kB on Linux
    # CPU seconds of the dry run: on shared, loaded cores the wall time exceeds it by the waiting
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode != 0:
        sys.exit(f"snakemake -n failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds, cpu_s, peak_mb, proc.stdout + proc.stderr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--captions", type=int, default=25014, help="captions in the fake COCO root (val2017: 25,014)")
    ap.add_argument("--images", type=int, default=5000, help="images in the fake COCO root (val2017: 5,000)")
    ap.add_argument("--profile", default=None, help="dry-run through this Snakemake profile (e.g. slurm)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, dotted key: COCO-CF's own (images.shard_size=5), another study's with "
                         "its name first (cvld.editing.shards=64), or a shared one (repeatable)")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    ap.add_argument("--no-goals", action="store_true",
                    help="exit 0 even when the time / memory goals are missed (the counts are still checked)")
    args = ap.parse_args(argv)
    overrides: dict = {}
    for item in args.set:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = overrides
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)

    with tempfile.TemporaryDirectory(prefix="cf-dag-scale-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        official_tree(tmp / "work" / "data", coco_captions=args.captions, coco_images=args.images)
        setup_s = time.perf_counter() - t0
        override = tmp / "scale.yaml"
        shared = {"run_name", "device", "precision", "seed", "models", "tiny_models", "nltk", "studies", "data",
                  "data_root"}
        own = set(all_studies()) - {STUDY}   # a key under another study's name goes to that study's section
        doc = {k: v for k, v in overrides.items() if k in shared or k in own}
        doc[STUDY] = {k: v for k, v in overrides.items() if k not in shared and k not in own}
        override.write_text(yaml.safe_dump(doc))
        seconds, cpu_s, peak_mb, out = dry_run(tmp / "work", override, args.profile)

    counts = job_counts(out)
    total = counts.pop("total", sum(counts.values()))
    per_study = jobs_by_study(counts)
    cfg = validate_config(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))[STUDY]   # defaults filled
    for section, values in overrides.items():   # the COCO-CF sections (other studies are keyed by name)
        if isinstance(values, dict) and isinstance(cfg.get(section), dict):
            cfg[section].update(values)
    print(f"official data tree: COCO 2017 with {args.captions:,} captions over {args.images:,} images (written in {setup_s:.1f} s)")
    print(f"config: captions.shard_size={cfg['captions']['shard_size']}, images.shard_size={cfg['images']['shard_size']},"
          f" candidates_per_pair={cfg['images']['candidates_per_pair']},"
          f" {len(cfg['training']['mixtures'])} mixtures x {cfg['training']['seeds']['count']} seeds")
    for study, jobs in sorted(per_study.items(), key=lambda kv: -kv[1]):
        print(f"{study}: {jobs:,} jobs")
        for rule, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if jobs_by_study({rule: n}).get(study):
                print(f"  {rule:<28}{n:>7,}")
    print(f"jobs: {total:,}")
    enabled = overrides.get("studies") or yaml.safe_load((REPO / "config" / "config.yaml").read_text()).get("studies") or []
    missing = [s for s in enabled if not per_study.get(s)]
    if missing:
        print(f"no jobs for enabled stud{'y' if len(missing) == 1 else 'ies'}: {', '.join(missing)}")
    load = os.getloadavg()[0]
    print(f"dry run (parse + DAG): {seconds:.1f} s wall, {cpu_s:.1f} s CPU   (goal <= {GOAL_SECONDS:.0f} s wall;"
          f" load average {load:.1f} on {os.cpu_count()} cores)")
    print(f"peak memory: {peak_mb:.0f} MB   (goal <= {GOAL_MB:.0f} MB)")
    if args.json:
        Path(args.json).write_text(json.dumps({"jobs": total, "per_study": per_study, "per_rule": counts,
                                               "seconds": seconds, "cpu_seconds": cpu_s, "peak_mb": peak_mb}, indent=2))
    if missing:
        return 1
    return 0 if args.no_goals or (seconds <= GOAL_SECONDS and peak_mb <= GOAL_MB) else 1


if __name__ == "__main__":
    sys.exit(main())
