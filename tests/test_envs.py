"""The conda environment of `--software-deployment-method conda` (envs/): generated from requirements.lock,
self-contained once Snakemake copies it to .snakemake/conda/<hash>.yaml, with a post-deploy script that
installs what the environment file cannot (lama-cleaner without dependencies, the package itself).

Creating the environment needs conda and the network, so it is not run here: these tests check the files
Snakemake hands to conda and run the post-deploy script with a stand-in `python` that records its calls."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ENV_FILE = REPO / "envs" / "counterfactory.yaml"
POST_DEPLOY = REPO / "envs" / "counterfactory.post-deploy.sh"


def _script():
    spec = importlib.util.spec_from_file_location("conda_env", REPO / "scripts" / "conda_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env_pip_entries() -> list[str]:
    deps = yaml.safe_load(ENV_FILE.read_text())["dependencies"]
    pip = [d["pip"] for d in deps if isinstance(d, dict)]
    assert len(pip) == 1, deps
    return pip[0]


def test_env_file_and_lock_have_the_same_pins():
    script = _script()
    assert script.main(["--check"]) == 0  # both generated files are what the lock file and Makefile give
    lock = [line.strip() for line in (REPO / "requirements.lock").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert _env_pip_entries() == lock
    assert f"python={script.PYTHON}" in yaml.safe_load(ENV_FILE.read_text())["dependencies"]
    # lama-cleaner: the Makefile's --no-deps pin, installed the same way after the environment is created
    makefile_pin = re.search(r"--no-deps (lama-cleaner==\S+)", (REPO / "Makefile").read_text()).group(1)
    assert f"python -m pip install --no-deps {makefile_pin}\n" in POST_DEPLOY.read_text()


def test_env_file_has_no_path_that_breaks_when_copied():
    """Snakemake copies the file to .snakemake/conda/<hash>.yaml: no `-r ../x`, `-e ..` or file paths."""
    deps = yaml.safe_load(ENV_FILE.read_text())["dependencies"]
    for dep in deps:
        if isinstance(dep, str):
            assert re.fullmatch(r"[A-Za-z0-9_.-]+(=[0-9.]+)?", dep), dep
    for entry in _env_pip_entries():
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+", entry), entry
    for text in (ENV_FILE.read_text(), POST_DEPLOY.read_text()):
        body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        assert "../" not in body and "file:" not in body and not re.search(r"\s\.\.?(\s|$)", body)
    # the rules point at this file, and Snakemake finds the post-deploy script by its name beside it
    common = (REPO / "rules" / "common.smk").read_text()
    assert re.search(r'CONDA_ENV = "\.\./envs/counterfactory\.yaml"', common)
    assert POST_DEPLOY.name == ENV_FILE.name.replace(".yaml", ".post-deploy.sh")


def _run_post_deploy(tmp_path, cwd, **env):
    """The script as Snakemake runs it: copied next to the environment, run from the working directory."""
    copied = tmp_path / ".snakemake" / "conda" / "0123abcd.post-deploy.sh"
    copied.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(POST_DEPLOY, copied)
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    (fake / "python").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (fake / "python").chmod(0o755)
    calls.write_text("")
    proc = subprocess.run(["bash", str(copied)], capture_output=True, text=True, cwd=cwd, timeout=60,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", **env})
    return proc, calls.read_text().splitlines()


def test_post_deploy_installs_lama_cleaner_and_the_package_from_the_checkout(tmp_path):
    proc, calls = _run_post_deploy(tmp_path, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert calls[0].startswith("-m pip install --no-deps lama-cleaner==")
    assert calls[-1] == f"-m pip install --no-deps -e {REPO}"

    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    proc, calls = _run_post_deploy(tmp_path, cwd=elsewhere)
    assert proc.returncode == 1 and "-e" not in " ".join(calls)
    assert "is not a CounterFactory checkout" in proc.stderr and "COUNTERFACTORY_SRC" in proc.stderr
    proc, calls = _run_post_deploy(tmp_path, cwd=elsewhere, COUNTERFACTORY_SRC=str(REPO))
    assert proc.returncode == 0 and calls[-1] == f"-m pip install --no-deps -e {REPO}"
