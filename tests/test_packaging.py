"""What a user installing the package meets: the Python floor, declared dependencies, licence and citation."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import counterfactory

PACKAGE = Path(counterfactory.__file__).resolve().parent
#: imported only where the hardware or an optional install is there (each import is guarded in the code)
OPTIONAL = {"habana_frameworks", "optimum", "lama_cleaner"}


@pytest.fixture(scope="module")
def pyproject(repo):
    with open(repo / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _third_party_imports() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("counterfactory", "__future__")}


def test_every_imported_distribution_is_a_declared_dependency(pyproject):
    declared = {_norm(re.split(r"[<>=!~ ;\[]", d)[0]) for d in pyproject["project"]["dependencies"]}
    dists = importlib.metadata.packages_distributions()
    missing = {}
    for name in sorted(_third_party_imports() - OPTIONAL):
        owners = {_norm(d) for d in dists.get(name, [])}
        assert owners, f"{name} is imported but no installed distribution provides it"
        if not owners & declared:
            missing[name] = sorted(owners)
    assert missing == {}, "add these to [project] dependencies in pyproject.toml"


def test_python_floor_is_the_locks_floor(repo, pyproject):
    """Every pin of requirements.lock installs on the declared minimum (numpy, pandas, snakemake ... need 3.11)."""
    assert pyproject["project"]["requires-python"] == ">=3.11"
    assert sys.version_info >= (3, 11)


def test_make_stops_early_on_an_old_python(repo, tmp_path):
    for name in ("Makefile", "requirements.lock", "pyproject.toml"):
        (tmp_path / name).write_bytes((repo / name).read_bytes())
    fake = tmp_path / "python3.10"
    fake.write_text('#!/bin/sh\n[ "$1" = "-V" ] && { echo "Python 3.10.12"; exit 0; }\nexit 1\n')
    fake.chmod(0o755)
    proc = subprocess.run(["make", "venv", f"PYTHON={fake}"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "needs Python 3.11 or newer" in proc.stdout and "Python 3.10.12" in proc.stdout
    assert not (tmp_path / ".venv").exists()  # stopped before creating anything


def test_licence_and_citation(repo, pyproject):
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert (repo / "LICENSE").read_text(encoding="utf-8").lstrip().startswith("Apache License")
    cff = yaml.safe_load((repo / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "Apache-2.0"
    from counterfactory.studies import STUDIES

    titles = {r["title"] for r in cff["references"]}
    for _, paper in STUDIES.values():  # every study's paper is cited
        assert any(t.split(":")[0] in paper for t in titles), paper


def test_local_profile_runs_one_accelerator_job_at_a_time(repo):
    profile = yaml.safe_load((repo / "profiles" / "local" / "config.yaml").read_text(encoding="utf-8"))
    assert profile["resources"] == {"gpu": 1, "hpu": 1}
