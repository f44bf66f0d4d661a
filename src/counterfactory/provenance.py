"""Provenance: what produced a result. Written next to results as JSON: the git commit (and whether
the tree was dirty), the resolved configuration, versions of the packages that matter, and each
model role's id or path (with the revision or a folder fingerprint)."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
import time
from pathlib import Path

from . import __version__
from .io import write_json

PACKAGES = (
    "counterfactory", "torch", "torchvision", "transformers", "diffusers", "open_clip_torch", "sentence-transformers",
    "tokenizers", "nltk", "numpy", "scipy", "pandas", "pyarrow", "snakemake", "lama-cleaner",
)


def git_state(cwd: str | Path = ".") -> dict:
    def run(*args):
        try:
            return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = run("rev-parse", "HEAD")
    return {"commit": commit or None, "dirty": bool(run("status", "--porcelain", "--untracked-files=no")) if commit else None}


def package_versions(names=PACKAGES) -> dict:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def collect(cfg: dict, models: dict | None = None, extra: dict | None = None) -> dict:
    from .models.registry import configured_models, loaded_models

    record = {
        "counterfactory": __version__,
        "created_unix": int(time.time()),
        "git": git_state(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
        "config": cfg,
        "models": models if models is not None else (loaded_models() or configured_models(cfg)),
    }
    if extra:
        record.update(extra)
    return record


def write(path: str | Path, cfg: dict, models: dict | None = None, extra: dict | None = None) -> Path:
    return write_json(path, collect(cfg, models, extra))
