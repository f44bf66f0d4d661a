"""A real Slurm run: `snakemake --workflow-profile profiles/slurm` submits a slice of the demo DAG through sbatch;
`snakemake --profile slurm` from the repository root stops with one line when the site does not fit.

scripts/slurm/start_local_slurm.sh installs Debian's Slurm + munge (apt-get, waiting for an apt/dpkg lock
another process holds) and starts a single-node
cluster with two fake GPUs (GRES) and two partitions, cpu (default) and gpu; the profiles are used the
way a user does (straight from the checkout: `--profile slurm` in the repository root, Snakemake's
`--workflow-profile` elsewhere; checked with `counterfactory cluster check-profile`) and pointed at the local
partitions through CF_SLURM_* variables.

The slice: tiny stand-in models (one job), the NLTK data, COCO check and caption table (local
rules), one caption shard declared on a GPU (`device: auto`), and `flaky_probe` -- a test-only rule in
a test-only Snakefile that includes the real workflow: declared gpu=1, its first attempt exits 1 and
the profile's `retries` resubmits it through sbatch. Needs root and apt (CI has both); skipped, with
the reason, anywhere else. About 2-3 minutes, most of it the demo jobs themselves.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
START = REPO / "scripts" / "slurm" / "start_local_slurm.sh"
APT_LOCK_WAIT = 300  # seconds start_local_slurm.sh waits for another process's apt/dpkg lock
STOP = REPO / "scripts" / "slurm" / "stop_local_slurm.sh"

FLAKY_SNAKEFILE = """\
# test-only: the real workflow plus one rule whose first attempt fails (tests/test_slurm.py)
include: {snakefile!r}


rule flaky_probe:
    input:
        "resources/models/tiny/mlm",
    output:
        "slurm_probe/flaky.txt",
    resources:
        gpu=1,
        mem_mb=500,
        runtime=5,
        attempt_no=lambda wildcards, attempt: attempt,
    shell:
        # attempts.txt is not a declared output or log, so Snakemake keeps it across attempts
        "echo attempt={{resources.attempt_no}} job=$SLURM_JOB_ID partition=$SLURM_JOB_PARTITION"
        " gpus=$CUDA_VISIBLE_DEVICES >> slurm_probe/attempts.txt;"
        " if [ {{resources.attempt_no}} -lt 2 ]; then echo 'injected failure (first attempt)' >&2; exit 1; fi;"
        " cp slurm_probe/attempts.txt {{output}}"
"""


def _skip_reason() -> str | None:
    if sys.platform != "linux":
        return "needs Linux"
    if os.geteuid() != 0:
        return "needs root (starts slurmd; CI runs as root)"
    have_slurm = all(shutil.which(b) or Path("/usr/sbin", b).exists() for b in ("slurmctld", "slurmd", "munged", "sbatch"))
    if not have_slurm and not shutil.which("apt-get"):
        return "Slurm is not installed and apt-get is not available to install it"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("slurm")
    ports = {"CF_LOCAL_SLURM_CTLD_PORT": str(_free_port()), "CF_LOCAL_SLURM_SLURMD_PORT": str(_free_port())}
    start = time.monotonic()
    # apt-get waits for an apt/dpkg lock another process holds (an unattended upgrade, a parallel install)
    # up to APT_LOCK_WAIT seconds instead of failing at once
    proc = subprocess.run(["bash", str(START), str(state)], capture_output=True, text=True,
                          timeout=APT_LOCK_WAIT + 600,
                          env={**os.environ, **ports, "CF_LOCAL_SLURM_APT_LOCK_WAIT": str(APT_LOCK_WAIT)})
    if proc.returncode != 0 and "held the apt/dpkg lock" in proc.stderr:
        pytest.fail(f"could not install Slurm: another process held the apt/dpkg lock for all of the "
                    f"{APT_LOCK_WAIT} s start_local_slurm.sh waited for it; rerun when that install is done\n"
                    f"{proc.stderr[-2000:]}")
    assert proc.returncode == 0, f"start_local_slurm.sh failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(f"local Slurm up in {time.monotonic() - start:.0f} s", file=sys.stderr)
    env = dict(os.environ)
    env.pop("SNAKEMAKE_PROFILE", None)
    env.pop("SLURM_JOB_ID", None)
    env.update(SLURM_CONF=str(state / "slurm.conf"),
               PATH=f"{state / 'bin'}:{BIN}:/usr/sbin:{os.environ['PATH']}",
               XDG_CONFIG_HOME=str(state / "xdg"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               CF_SLURM_PARTITION="cpu", CF_SLURM_GPU_PARTITION="gpu", CF_SLURM_STATUS_DELAY="5",
               CF_SLURM_MAX_THREADS="2",
               CF_CLUSTER_SITE_FILE=str(state / "no-site-file.yaml"))
    try:
        yield state, env
    finally:
        subprocess.run(["bash", str(STOP), str(state)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CF_LOCAL_SLURM_KEEP": "1"})


def _run(cmd, env, cwd, timeout=120):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


@pytest.fixture(scope="module")
def slurm_profile(local_slurm):
    """No set-up step: the checkout's profiles, checked against the cluster (docs/cluster.md)."""
    state, env = local_slurm
    for name in ("slurm", "gaudi"):  # both fit the local cluster
        proc = _run([str(BIN / "counterfactory"), "cluster", "check-profile", "--profile", name], env, REPO)
        assert proc.returncode == 0 and proc.stdout.endswith("  OK\n"), proc.stdout + proc.stderr
    assert not (state / "xdg" / "snakemake").exists()  # nothing linked into the user's profile folder
    return local_slurm


def test_setup_checks_the_cluster(slurm_profile):
    """Bad site input fails before anything is submitted, naming the setting and the fix."""
    state, env = slurm_profile
    bad = {**env, "CF_SLURM_GPU_PARTITION": "nope"}
    proc = _run([str(BIN / "counterfactory"), "cluster", "check-profile", "--profile", "slurm"], bad, REPO)
    assert proc.returncode == 1
    assert "partition 'nope'" in proc.stdout and "partitions: cpu, gpu" in proc.stdout
    # the same check runs when Snakemake loads the profile, as typed in the repository root: one line, no usage
    proc = _run([str(BIN / "snakemake"), "--profile", "slurm", "-n", "all", "--configfile", "config/demo.yaml"],
                bad, REPO)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "usage:" not in proc.stdout + proc.stderr, proc.stderr
    assert "partition 'nope' (from CF_SLURM_GPU_PARTITION) does not exist here; partitions: cpu, gpu" in errors[0]
    # gaudi profile: the GRES name must exist on the accelerator partition
    proc = _run([str(BIN / "counterfactory"), "cluster", "check-profile", "--profile", "gaudi"],
                {**env, "CF_SLURM_GRES": "hpu"}, REPO)
    assert proc.returncode == 1 and "offers no GRES 'hpu'" in proc.stdout


def test_demo_slice_runs_through_sbatch_with_a_retry(slurm_profile, tmp_path):
    state, env = slurm_profile
    work = tmp_path / "work"
    work.mkdir()
    (work / "Snakefile").write_text(FLAKY_SNAKEFILE.format(snakefile=str(REPO / "Snakefile")))
    from counterfactory.testing import demo_config

    # model rules declare gpu=1 (no CUDA here: the job itself runs on the CPU)
    demo_config(REPO, work, name="demo.yaml", device="auto")
    targets = ["results/demo/coco_counterfactuals/captions/shards/00000.parquet", "slurm_probe/flaky.txt"]
    start = time.monotonic()
    proc = _run([str(BIN / "snakemake"), "--workflow-profile", str(REPO / "profiles" / "slurm"), *targets,
                 "--configfile", "demo.yaml", "--slurm-keep-successful-logs"], env, work, timeout=480)
    seconds = time.monotonic() - start
    out = proc.stdout + proc.stderr
    print(f"snakemake --workflow-profile profiles/slurm: {seconds:.0f} s", file=sys.stderr)
    assert proc.returncode == 0, out[-6000:]
    assert f"workflow specific profile {REPO / 'profiles' / 'slurm'}" in out

    submitted = {}
    for jobid, kind in re.findall(r"has been submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/(\w+)", out):
        submitted.setdefault(kind, []).append(jobid)
    # tiny models: one job; the caption shard and the probe (twice): own jobs; bookkeeping: local
    assert len(submitted.get("rule_models_build_tiny", [])) == 1, submitted
    assert len(submitted.get("rule_captions_edit", [])) == 1, submitted
    assert len(submitted.get("rule_flaky_probe", [])) == 2, submitted
    for rule in ("data_check", "data_captions", "nltk_prepare"):
        assert f"localrule {rule}:" in out

    # the GPU-declared caption shard went to the gpu partition with one GPU
    shard_job = submitted["rule_captions_edit"][0]
    info = _run(["scontrol", "show", "job", shard_job], env, work).stdout
    assert "Partition=gpu" in info and re.search(r"gres[:/]gpu[:=]1", info), info
    assert "JobState=COMPLETED" in info, info
    assert (work / "results/demo/coco_counterfactuals/captions/summary/00000.json").exists()

    # the injected failure: attempt 1 failed in one Slurm job, attempt 2 succeeded in another
    attempts = (work / "slurm_probe" / "attempts.txt").read_text().splitlines()
    assert [a.split()[0] for a in attempts] == ["attempt=1", "attempt=2"], attempts
    jobs = [re.search(r"job=(\d+)", a).group(1) for a in attempts]
    assert jobs == submitted["rule_flaky_probe"], (jobs, submitted)
    assert all("gpus=0" in a or "gpus=1" in a for a in attempts), attempts  # Slurm handed out a (fake) GPU
    assert "Trying to restart job" in out
    first = _run(["scontrol", "show", "job", jobs[0]], env, work).stdout
    assert "JobState=FAILED" in first and "ExitCode=1:0" in first, first
