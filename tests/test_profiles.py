"""Cluster profiles (profiles/slurm, profiles/gaudi), their set-up and checks, and the per-rule resources
(rules/resources.smk). No Slurm needed: the cluster is a fake `sinfo`; tests/test_slurm.py runs a real one."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from counterfactory import cluster
from counterfactory.cluster import ClusterConfigError, Placement

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CF_SLURM", "SLURM_", "SNAKEMAKE_PROFILE"))}
    env.update(PATH=f"{BIN}:{os.environ['PATH']}", XDG_CONFIG_HOME=str(tmp_path / "xdg"), HF_HUB_OFFLINE="1",
               CF_SLURM_SKIP_CHECK="1", CF_CLUSTER_SITE_FILE=str(tmp_path / "site.yaml"))
    env.update(extra)
    return env


def _demo_config(tmp_path, **top) -> Path:
    from counterfactory.testing import demo_config

    return demo_config(REPO, tmp_path, name="demo-profile-test.yaml", **top)


def _jobs(output: str) -> dict[str, dict]:
    """rule -> {"local": bool, "resources": {...}} of the first job of each rule in a dry run."""
    jobs, current = {}, None
    for line in output.splitlines():
        m = re.match(r"^\s*(local)?rule (\w+):", line)
        if m:
            current = m.group(2)
            jobs.setdefault(current, {"local": bool(m.group(1)), "resources": None, "threads": 1})
            continue
        if current and line.strip().startswith("threads:"):
            jobs[current]["threads"] = int(line.split(":", 1)[1])
        if current and line.strip().startswith("resources:") and jobs[current]["resources"] is None:
            pairs = [p.split("=", 1) for p in line.split(":", 1)[1].split(", ")]
            jobs[current]["resources"] = {k.strip(): v.strip() for k, v in pairs}
            current = None
    return jobs


# --------------------------------------------------------------------------- the profiles themselves

@pytest.mark.parametrize("name", ["slurm", "gaudi"])
def test_repo_profiles_pass_the_checker(name, monkeypatch, tmp_path):
    monkeypatch.setenv(cluster.SITE_FILE_ENV, str(tmp_path / "none.yaml"))
    for key in cluster.SITE_KEYS.values():
        monkeypatch.delenv(key.env, raising=False)
    report = cluster.check_profile(str(REPO / "profiles" / name), live=False)
    assert report.ok, report.format()
    assert not report.warnings, report.format()


def test_accelerator_rules_match_the_rule_files():
    rules = cluster.workflow_rules(REPO / "Snakefile")
    assert "captions_edit" in rules and "all" in rules
    declared = sorted(r for r, info in rules.items() if info["accelerator"])
    assert declared == sorted(cluster.ACCELERATOR_RULES)
    assert not rules["models_build_tiny"]["accelerator"]  # every tiny stand-in in one CPU job


def test_profiles_carry_no_site_values():
    """Partitions, accounts, GRES and constraints come from the environment or the site file."""
    for name in ("slurm", "gaudi"):
        text = (REPO / "profiles" / name / "config.yaml").read_text()
        body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        assert not re.search(r"slurm_partition|slurm_account|constraint:|gres:|qos:", body), name


def test_rules_declare_no_site_values():
    for path in (REPO / "rules").glob("*.smk"):
        text = path.read_text()
        assert not re.search(r"slurm_partition|slurm_account|slurm_extra|constraint\s*=|gres\s*=|qos\s*=", text), path


# --------------------------------------------------------------------------- no set-up: Snakemake's workflow profile

def test_workflow_profile_works_from_a_fresh_clone(tmp_path):
    """`--workflow-profile slurm` is looked up under profiles/ next to the Snakefile: no link into
    ~/.config/snakemake (the former `make profiles` step) is needed, from any working directory."""
    env = _env(tmp_path)
    assert not (tmp_path / "xdg" / "snakemake").exists()
    dry = [str(BIN / "snakemake"), "--workflow-profile", "slurm", "-n", "provenance", "--snakefile",
           str(REPO / "Snakefile"), "--configfile", str(_demo_config(tmp_path))]
    proc = subprocess.run(dry, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert f"workflow specific profile {REPO / 'profiles' / 'slurm'}" in out
    # the checker finds a profile by the same name
    assert cluster.resolve_profile("gaudi") == (REPO / "profiles" / "gaudi", REPO / "profiles" / "gaudi" / "config.yaml")


@pytest.mark.parametrize("name", ["slurm", "gaudi"])
def test_profile_by_name_from_the_repository_root(name, tmp_path):
    """`snakemake --profile slurm all` as typed in the repository root, for a user whose ~/.config/snakemake is
    empty: Snakemake finds the profile name in the working directory (the links `slurm`, `gaudi` into
    profiles/; docs/cluster.md). The site values come from CF_SLURM_* (the cluster check is skipped here)."""
    link = REPO / name
    assert link.is_symlink() and link.resolve() == (REPO / "profiles" / name).resolve(), link
    home = tmp_path / "home"
    home.mkdir()
    env = _env(tmp_path, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), CF_SLURM_PARTITION="cpu",
               CF_SLURM_GPU_PARTITION="gpu")
    env.pop("XDG_CONFIG_DIRS", None)
    proc = subprocess.run([str(BIN / "snakemake"), "--profile", name, "all", "-n", "--configfile", "config/demo.yaml"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert f"Using profile {name} for setting default command line arguments." in out
    assert not (home / ".config" / "snakemake").exists()
    # the profile's site values reached the jobs: it was loaded, YTE and counterfactory.cluster included
    jobs = _jobs(out)
    assert jobs["captions_edit"]["resources"]["slurm_partition"] == "gpu", jobs["captions_edit"]
    assert jobs["models_build_tiny"]["resources"]["slurm_partition"] == "cpu", jobs["models_build_tiny"]
    if name == "gaudi":
        assert jobs["captions_edit"]["resources"]["gres"] == "gpu:1" and jobs["captions_edit"]["resources"]["hpu"] == "1"
    # and it selects the Slurm executor (a dry run prints no executor, so ask Snakemake's own parser)
    parsed = subprocess.run([sys.executable, "-c", "from snakemake.cli import parse_args; "
                             f"print(parse_args(['--profile', {name!r}, 'all', '-n'])[1].executor)"],
                            capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert parsed.stdout.splitlines()[-1:] == ["slurm"], parsed.stdout + parsed.stderr


def _failing_sinfo(tmp_path) -> Path:
    """A login node whose Slurm controller cannot be reached: sinfo exists and fails (squeue: the plugin needs it)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "sinfo").write_text("#!/bin/sh\necho 'slurm_load_partitions: Unable to contact slurm controller "
                                "(connect failure)' >&2\nexit 1\n")
    (fake / "squeue").write_text("#!/bin/sh\nexit 0\n")
    for tool in fake.iterdir():
        tool.chmod(0o755)
    return fake


@pytest.mark.parametrize("how", [["--profile", "slurm"], ["--workflow-profile", "profiles/gaudi"]])
def test_failed_cluster_check_prints_one_line_with_the_fix(how, tmp_path):
    """The profile's live check fails: one line naming the problem and the fix, exit 1, no usage text."""
    env = _env(tmp_path, PATH=f"{_failing_sinfo(tmp_path)}:{BIN}:{os.environ['PATH']}", HOME=str(tmp_path))
    env.pop(cluster.SKIP_CHECK_ENV)
    proc = subprocess.run([str(BIN / "snakemake"), *how, "all", "-n", "--configfile", "config/demo.yaml"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "usage:" not in out and "Traceback" not in out, out[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, proc.stderr
    assert "does not fit this cluster: sinfo failed (exit 1): slurm_load_partitions" in errors[0]
    assert "login node" in errors[0] and f"{cluster.SKIP_CHECK_ENV}=1 skips this check" in errors[0]
    assert len(out.strip().splitlines()) <= 2, out  # Snakemake's "Using profile ..." line and the error


# --------------------------------------------------------------------------- per-rule resources

#: accelerator rules whose jobs a dry run cannot list yet: their number comes from a checkpoint's output
#: (CounterCurate's generation shards, known once the requests exist)
AFTER_CHECKPOINT = {"countercurate_generate"}


def test_resources_through_the_slurm_profile(tmp_path):
    env = _env(tmp_path, CF_SLURM_PARTITION="cpu", CF_SLURM_GPU_PARTITION="gpu", CF_SLURM_GPU_CONSTRAINT="a100")
    cfg = _demo_config(tmp_path, device="auto")
    proc = subprocess.run([str(BIN / "snakemake"), "--profile", str(REPO / "profiles" / "slurm"), "-n", "all",
                           "--snakefile", str(REPO / "Snakefile"), "--configfile", str(cfg)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = _jobs(proc.stdout + proc.stderr)
    assert set(cluster.ACCELERATOR_RULES) - set(jobs) == AFTER_CHECKPOINT
    for rule in sorted(set(cluster.ACCELERATOR_RULES) - AFTER_CHECKPOINT):
        res = jobs[rule]["resources"]
        assert not jobs[rule]["local"], rule
        assert res["gpu"] == "1" and res["hpu"] == "0" and res["slurm_partition"] == "gpu", (rule, res)
        assert res["constraint"] == "a100", (rule, res)
        assert int(res["runtime"]) > 0 and int(res["mem_mb"]) >= 2500, (rule, res)
    assert jobs["models_build_tiny"]["resources"]["slurm_partition"] == "cpu"  # one job builds every tiny model


def _localrules() -> set[str]:
    """Every rule named in a ``localrules:`` block (rules/resources.smk; rules/setup.smk's config_write_job)."""
    out: set[str] = set()
    for path in (REPO / "rules").glob("*.smk"):
        for block in re.findall(r"^localrules:\n((?:[ \t]+\w+,\n)+)", path.read_text(), re.MULTILINE):
            out |= set(re.findall(r"^\s+(\w+),", block, re.MULTILINE))
    return out


def test_every_rule_is_local_or_sized():
    """Bookkeeping runs locally; every job that goes to the scheduler declares memory and runtime."""
    local = _localrules()
    rules = cluster.workflow_rules(REPO / "Snakefile")
    assert local <= set(rules)
    assert {"captions_merge", "images_merge", "evaluate_itr_table", "train_collect", "stats_summarize", "provenance",
            "data_check", "data_captions", "report_pair_grid", "analysis_label_frequency"} <= local
    assert not local & set(cluster.ACCELERATOR_RULES)
    texts = "\n".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))
    base_of = {name: base for base, name in re.findall(r"^use rule (\w+) as (\w+)", texts, re.MULTILINE)}
    for rule in sorted(set(rules) - local - {"all"}):
        head = "checkpoint" if f"checkpoint {rule}:" in texts else "rule"
        body = re.split(r"^(?:rule|checkpoint) \w+:", texts.split(f"{head} {base_of.get(rule, rule)}:", 1)[1],
                        flags=re.MULTILINE)[0]
        assert re.search(r"^\s+mem_mb=", body, re.MULTILINE) and re.search(r"^\s+runtime=", body, re.MULTILINE), rule


def test_resources_through_the_gaudi_profile(tmp_path):
    env = _env(tmp_path, CF_SLURM_GPU_PARTITION="gaudi2")
    proc = subprocess.run([str(BIN / "snakemake"), "--profile", str(REPO / "profiles" / "gaudi"), "-n", "all",
                           "--snakefile", str(REPO / "Snakefile"), "--configfile", str(_demo_config(tmp_path))],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = _jobs(proc.stdout + proc.stderr)
    for rule in sorted(set(cluster.ACCELERATOR_RULES) - AFTER_CHECKPOINT):
        res = jobs[rule]["resources"]
        assert res["hpu"] == "1" and res["gpu"] == "0", (rule, res)  # the profile sets device: hpu
        assert res["gres"] == "gpu:1" and res["slurm_partition"] == "gaudi2", (rule, res)


def _resource_helpers(device="auto", n_captions=25014, **overrides):
    """rules/resources.smk's Python part, evaluated against the paper config (study section overrides)."""
    from counterfactory import workflow as wf
    from counterfactory.config import validate_config

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["device"] = device
    for key, value in overrides.items():
        cfg[STUDY][key] = {**cfg[STUDY][key], **value}
    validate_config(cfg)
    text = (REPO / "rules" / "resources.smk").read_text().split("\nlocalrules:")[0]
    namespace = {"config": cfg, "wf": wf, "view": lambda study: wf.view(cfg, study),
                 "n_captions": lambda study: n_captions}
    exec(compile(text, "rules/resources.smk", "exec"), namespace)
    return namespace


STUDY = "coco_counterfactuals"


def test_resources_scale_with_attempt_and_shard_size():
    h = _resource_helpers()
    assert (h["GPU"], h["HPU"]) == (1, 0)
    assert h["scaled"](2000)(None, 1) == 2000 and h["scaled"](2000)(None, 3) == 6000
    assert h["minutes"](10**9)(None, 1) == h["MAX_RUNTIME"]
    # paper images shard: 50 captions x 100 candidates x 100 steps at 512 x 512 -> hours, not minutes
    images = 15 + h["images_minutes"](STUDY)
    assert 4 * 60 < images < 12 * 60
    halved = _resource_helpers(images={"shard_size": 25})
    assert halved["images_minutes"](STUDY) == pytest.approx(h["images_minutes"](STUDY) / 2)
    wildcards = type("W", (), {"study": STUDY})()
    assert h["per_study"](lambda s: 10**9)(wildcards, 1) == h["MAX_RUNTIME"]
    assert h["per_study"](h["train_minutes"])(wildcards, 2) == math.ceil(2 * h["train_minutes"](STUDY))
    assert h["model_mem"](16000, "sd", "clip_filter")(None, 2) == 32000  # hub models: full size
    assert _resource_helpers(device="hpu")["HPU"] == 1 and _resource_helpers(device="hpu")["GPU"] == 0
    cpu = _resource_helpers(device="cpu")
    assert (cpu["GPU"], cpu["HPU"]) == (0, 0)
    assert cpu["images_minutes"](STUDY) == pytest.approx(20 * h["images_minutes"](STUDY))


# --------------------------------------------------------------------------- checker: bad input

def _write_profile(tmp_path, text: str) -> Path:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "config.yaml").write_text(text)
    return folder


def test_checker_reports_typos_and_refused_options(tmp_path):
    folder = _write_profile(tmp_path, """\
executor: slurm
latency-wiat: 60
slurm-status-command: squeue
default-resources:
  mem_gb: 4
  slurm_extra: "'--gres=gpu:1 --exclusive'"
set-resources:
  captions_edti:
    runtime: 10
  images_generate:
    gres: "'gpu:HL-225:1'"
group-components:
  setpu: 4
""")
    report = cluster.check_profile(str(folder), live=False)
    text = "\n".join(report.errors)
    assert not report.ok
    assert "unknown key 'latency-wiat' (did you mean 'latency-wait'?)" in text
    assert "unknown resource 'mem_gb' (did you mean 'mem_mb'?)" in text
    assert "slurm_extra sets the generic resources (GRES) itself" in text
    assert "unknown rule 'captions_edti' (did you mean 'captions_edit'?)" in text
    assert "GRES \"'gpu:HL-225:1'\" is not name" in text or "GRES 'gpu:HL-225:1'" in text
    assert "unknown group 'setpu'" in text


def test_checker_names_a_missing_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    report = cluster.check_profile("slurn")
    assert not report.ok and "gaudi, local, slurm" in report.errors[0] and "--workflow-profile" in report.errors[0]


def test_cli_exit_status(tmp_path):
    folder = _write_profile(tmp_path, "executor: slurm\nslurm-status-command: squeue\njobz: 4\n")
    proc = subprocess.run([str(BIN / "counterfactory"), "cluster", "check-profile", "--profile", str(folder),
                           "--no-live"], capture_output=True, text=True, env=_env(tmp_path), timeout=120)
    assert proc.returncode == 1 and "unknown key 'jobz' (did you mean 'jobs'?)" in proc.stdout
    ok = subprocess.run([str(BIN / "counterfactory"), "cluster", "show-site", "--profile", "gaudi"],
                        capture_output=True, text=True, env=_env(tmp_path, CF_SLURM_GRES="hpu"), timeout=120)
    assert ok.returncode == 0 and "gres_name      = hpu" in ok.stdout and "[CF_SLURM_GRES]" in ok.stdout


# --------------------------------------------------------------------------- site settings

def test_site_settings_precedence(tmp_path):
    site_file = tmp_path / "cluster.yaml"
    site_file.write_text("partition: batch\njobs: 50\ngaudi:\n  gres_name: hpu\n")
    env = {cluster.SITE_FILE_ENV: str(site_file), "CF_SLURM_JOBS": "7"}
    slurm = cluster.site_settings("slurm", env=env, check=False)
    assert slurm.partition == "batch" and slurm.sources["partition"] == str(site_file)
    assert slurm.jobs == 7 and slurm.sources["jobs"] == "CF_SLURM_JOBS"
    assert slurm.gres_name == "gpu" and slurm.status_command == "squeue"
    assert slurm.default_resources() == {"slurm_partition": "'batch'"}
    acc = slurm.accelerator_resources(["images_generate"])
    assert acc == {"images_generate": {"slurm_partition": "'batch'"}}
    gaudi = cluster.site_settings("gaudi", env={**env, "CF_SLURM_GPU_PARTITION": "hl"}, check=False)
    assert gaudi.accelerator_resources(["train_run"]) == {
        "train_run": {"slurm_partition": "'hl'", "gres": "'hpu:1'"}}
    # a partition called like a Python builtin stays a string
    assert cluster.site_settings("slurm", env={"CF_SLURM_PARTITION": "all", cluster.SITE_FILE_ENV: "/nonexistent"},
                                 check=False).default_resources() == {"slurm_partition": "'all'"}


@pytest.mark.parametrize("text, message", [
    ("partiton: batch\n", "unknown key 'partiton' (did you mean 'partition'?)"),
    ("jobs: many\n", "jobs must be a whole number"),
    ("slurm:\n  acount: x\n", "section slurm: unknown key 'acount'"),
    ("status_command: scontrol\n", "status_command must be squeue or sacct"),
    ("- a list\n", "expected a mapping"),
])
def test_site_file_errors(tmp_path, text, message):
    site_file = tmp_path / "cluster.yaml"
    site_file.write_text(text)
    with pytest.raises(ClusterConfigError, match=re.escape(message)):
        cluster.site_settings("slurm", env={cluster.SITE_FILE_ENV: str(site_file)}, check=False)


# --------------------------------------------------------------------------- cluster checks (fake sinfo)

SINFO = "cpu*|(null)|intel,avx2|64\ngpu|gpu:a100:4(S:0-1)|a100,ib|32\ngpu|gpu:v100:2|v100|16+\n"


def fake_cluster(sinfo=SINFO, min_job_age=300, sacct_ok=False):
    def run(cmd, timeout=20):
        if cmd[0] == "sinfo":
            return 0, sinfo
        if cmd[:2] == ["scontrol", "show"]:
            return 0, f"Configuration data\nMinJobAge               = {min_job_age} sec\n"
        if cmd[0] == "sacct":
            return (0, "") if sacct_ok else (1, "sacct: error: Slurm accounting storage is disabled")
        raise AssertionError(cmd)
    return run


def test_cluster_info_parses_sinfo():
    info = cluster.cluster_info(fake_cluster())
    assert info.default_partition == "cpu"
    assert info.partitions["gpu"]["gres"] == {("gpu", "a100"), ("gpu", "v100")}
    assert info.partitions["gpu"]["features"] == {"a100", "ib", "v100"}
    assert info.partitions["gpu"]["cpus"] == 32 and info.partitions["cpu"]["cpus"] == 64


def test_cluster_checks_accept_a_fitting_setup():
    placements = [Placement("*", None), Placement("gpu jobs", "gpu", "a100&ib", accelerator=True, gpu_model="a100")]
    assert cluster.cluster_problems(placements, "squeue", 40, run=fake_cluster()) == []


def test_cluster_checks_name_every_problem():
    placements = [
        Placement("*", "batch", origin={"partition": "CF_SLURM_PARTITION"}),
        Placement("images_generate", "cpu", accelerator=True),
        Placement("train_run", "gpu", "h100", accelerator=True, gpu_model="h100"),
        Placement("evaluate_itr", "gpu", accelerator=True, gres="hpu:1"),
        Placement("evaluate_itm", "gpu", accelerator=True, threads=48, origin={"threads": "CF_SLURM_MAX_THREADS"}),
    ]
    problems = cluster.cluster_problems(placements, "squeue", 200, run=fake_cluster(min_job_age=300))
    text = "\n".join(problems)
    assert "partition 'batch' (from CF_SLURM_PARTITION) does not exist here; partitions: cpu, gpu" in text
    assert "images_generate: partition 'cpu' offers no GRES 'gpu' (no GRES)" in text
    assert "no gpu of type 'h100' (types: a100, v100)" in text
    assert "features h100" in text
    assert "offers no GRES 'hpu'" in text
    assert "MinJobAge=300 s" in text and "lower the delay to 100" in text
    assert "evaluate_itm: jobs may ask for 48 CPUs (from CF_SLURM_MAX_THREADS)" in text and "at most 32" in text
    sacct = cluster.cluster_problems([Placement("*", None)], "sacct", 40, run=fake_cluster())
    assert sacct and "CF_SLURM_STATUS_COMMAND=squeue" in sacct[0]


def test_site_settings_check_raises_one_clear_error(tmp_path):
    env = {cluster.SITE_FILE_ENV: str(tmp_path / "none.yaml"), "CF_SLURM_GPU_PARTITION": "cpu"}
    with pytest.raises(ClusterConfigError) as err:
        cluster.site_settings("slurm", env=env, check=True, run=fake_cluster())
    message = str(err.value)
    assert "partition 'cpu' offers no GRES 'gpu'" in message and "CF_SLURM_GPU_PARTITION" in message
    assert "CF_SLURM_SKIP_CHECK=1" in message


def test_checks_are_skipped_inside_jobs_and_on_request():
    assert not cluster.should_check({"SLURM_JOB_ID": "12", "PATH": os.environ["PATH"]})
    assert not cluster.should_check({"CF_SLURM_SKIP_CHECK": "1", "PATH": os.environ["PATH"]})
    assert not cluster.should_check({"PATH": "/nonexistent"})  # no sinfo: nothing to check against


# --------------------------------------------------------------------------- scale benchmark (small)

def test_dag_scale_benchmark_counts_jobs(tmp_path):
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_dag_scale.py"), "--captions", "2500",
                           "--images", "500", "--json", str(out), "--no-goals", "--set", "studies=[coco_counterfactuals]"],
                          capture_output=True, text=True, timeout=300, env=_env(tmp_path))
    # one study keeps the test short; the five-study paper-scale dry run is test_workflow's
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    numbers = json.loads(out.read_text())
    assert numbers["per_rule"]["captions_edit"] == 3          # 2,500 captions / 1,000 per shard
    assert numbers["per_rule"]["images_generate"] == 50        # 2,500 / 50
    assert numbers["per_rule"]["train_run"] == 100            # 4 mixtures x 25 seeds
    assert numbers["jobs"] == sum(numbers["per_rule"].values())
