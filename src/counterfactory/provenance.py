"""Provenance: what produced a result. Written next to results as JSON: the git commit (and whether
the tree was dirty), the resolved configuration, versions of the packages that matter, each model
role's id or path with its content fingerprint (and hub commit), the NLTK data in use, the CPU thread settings
(torch's thread count and ``OMP_NUM_THREADS``: they can change pixels by batched-kernel rounding), and -- tying
the record to the results -- each output's path, size and sha256 (a folder: a content fingerprint
over its files and, for up to :data:`MAX_LISTED_FILES` files, each file's sha256).

:func:`verify` checks a provenance file against the files on disk and lists every mismatch.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

from . import __version__
from .data.nltk_data import describe_nltk_data, nltk_source
from .errors import CounterFactoryError
from .io import write_json
from .models import registry
from .models.identity import HashCache, _combine, content_files

PACKAGES = (
    "counterfactory", "torch", "torchvision", "transformers", "diffusers", "open_clip_torch", "sentence-transformers",
    "tokenizers", "nltk", "numpy", "scipy", "pandas", "pyarrow", "snakemake", "lama-cleaner",
)
#: folders with more files than this record only their fingerprint, not each file's sha256
MAX_LISTED_FILES = 5000
FORMAT = 2


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


def _skipped_rel(rel: str, skip: tuple[str, ...]) -> bool:
    """``rel`` (a POSIX path under a recorded folder) is one of ``skip``: a file, or inside a folder ending ``/``."""
    return any(rel == s or (s.endswith("/") and rel.startswith(s)) for s in skip)


def _folder_hashes(folder: Path, exclude: set[str], use_cache: bool, skip: tuple[str, ...] = ()) -> dict[str, str]:
    cache = HashCache(read=use_cache)
    try:
        return {rel: cache.sha256(p) for rel, p in content_files(folder)
                if os.path.realpath(p) not in exclude and not _skipped_rel(rel, skip)}
    finally:
        cache.save()


def describe_output(path: str | os.PathLike, *, exclude: Iterable[str | os.PathLike] = (),
                    use_cache: bool = True, skip: Iterable[str] = ()) -> dict:
    """``{"path", "type", "size", "sha256"}`` of a file, or ``{"path", "type": "folder", "size" (all
    files), "files" (count), "fingerprint", "file_sha256" (each file, when not too many)}`` of a
    folder (logs, locks, ``.snakemake`` and files in ``exclude`` left out; so are the paths under it in ``skip``,
    a file or a folder ending ``/``, which the record lists as ``skipped`` so that :func:`verify` skips them too)."""
    p = Path(path)
    skip = tuple(sorted(str(s).replace("\\", "/") for s in skip))
    if not p.exists():
        raise CounterFactoryError(f"output {p} does not exist. Fix: run the step that makes it first, or drop it "
                                  "from --outputs")
    try:
        if p.is_dir():
            hashes = _folder_hashes(p, {os.path.realpath(e) for e in exclude}, use_cache, skip)
            record = {"path": str(path), "type": "folder",
                      "size": sum((p / rel).stat().st_size for rel in hashes), "files": len(hashes),
                      "fingerprint": _combine(sorted(hashes.items()))}
            if skip:
                record["skipped"] = list(skip)
            if len(hashes) <= MAX_LISTED_FILES:
                record["file_sha256"] = hashes
            return record
        cache = HashCache(read=use_cache)
        try:
            return {"path": str(path), "type": "file", "size": p.stat().st_size, "sha256": cache.sha256(p)}
        finally:
            cache.save()
    except OSError as exc:
        raise CounterFactoryError(f"output {p}: cannot read {exc.filename or p} ({exc.strerror or exc}). "
                                  "Fix: make it readable") from exc


def describe_nltk(cfg: dict) -> dict | None:
    """The NLTK data the config points at (``nltk.data_dir``), or None when the config names none."""
    section = cfg.get("nltk") or {}
    if not section.get("data_dir"):
        return None

    try:
        source = nltk_source(cfg)
    except CounterFactoryError:
        source = None
    return describe_nltk_data(section["data_dir"], source=source)


#: environment variables that set the CPU thread count of torch / BLAS kernels
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def describe_threads() -> dict:
    """The CPU thread settings of this process: torch's thread count (when torch is loaded), the variables
    that set it, and the CPU count. Batched CPU kernels may round differently for another thread count, so the
    record keeps it next to the configured batch sizes (each image shard's summary records its own)."""
    torch = sys.modules.get("torch")
    return {"torch": int(torch.get_num_threads()) if torch is not None else None,
            "environment": {name: os.environ.get(name) for name in THREAD_VARIABLES},
            "cpu_count": os.cpu_count()}


def collect(cfg: dict, models: dict | None = None, extra: dict | None = None,
            outputs: Iterable[str | os.PathLike] = (), exclude: Iterable[str | os.PathLike] = (),
            folders: Iterable[str | os.PathLike] = (), skip: Iterable[str] = ()) -> dict:
    """The provenance record (see the module docstring). ``models`` defaults to the roles loaded in
    this process, else every configured role (identified by content without loading; a local model
    that is missing or unreadable raises :class:`~counterfactory.models.registry.ModelIdentityError`).
    ``folders`` (each study's results folder) are recorded whole, every file in them, less ``skip`` (paths under
    each folder that are made from this record, or change run to run: logs, timings)."""
    record = {
        "format": FORMAT,
        "counterfactory": __version__,
        "created_unix": int(time.time()),
        "cwd": os.getcwd(),
        "git": git_state(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
        "config": cfg,
        "models": models if models is not None else (registry.loaded_models() or registry.configured_models(cfg)),
        "nltk_data": describe_nltk(cfg),
        "threads": describe_threads(),
        "outputs": [describe_output(o, exclude=exclude) for o in outputs]
                   + [describe_output(f, exclude=exclude, skip=skip) for f in folders],
    }
    if extra:
        record.update(extra)
    return record


def write(path: str | Path, cfg: dict, models: dict | None = None, extra: dict | None = None,
          outputs: Iterable[str | os.PathLike] = (), folders: Iterable[str | os.PathLike] = (),
          skip: Iterable[str] = ()) -> Path:
    """Write the provenance record to ``path`` (the file itself is never part of an output folder's hash)."""
    return write_json(path, collect(cfg, models, extra, outputs=outputs, exclude=[path], folders=folders,
                                    skip=skip))


def verify(provenance_path: str | os.PathLike, *, base: str | os.PathLike | None = None,
           use_cache: bool = False) -> list[dict]:
    """Compare the outputs recorded in a provenance file with the files on disk.

    Relative output paths are taken from ``base`` (default: the current folder). Files are re-read
    unless ``use_cache``. Returns the mismatches, each ``{"path", "problem"}`` (empty: all match).
    """
    provenance_path = Path(provenance_path)
    try:
        record = json.loads(provenance_path.read_text(encoding="utf-8"))
        outputs = record.get("outputs") or []
    except (OSError, ValueError, AttributeError) as exc:
        raise CounterFactoryError(f"{provenance_path}: not a readable provenance JSON ({exc}). "
                                  "Fix: pass the provenance.json written by `counterfactory provenance`") from exc
    base = Path(base) if base is not None else Path.cwd()
    problems: list[dict] = []
    for entry in outputs:
        rel = entry.get("path", "")
        path = Path(rel) if Path(rel).is_absolute() else base / rel
        if not path.exists():
            problems.append({"path": rel, "problem": "missing"})
            continue
        kind = "folder" if path.is_dir() else "file"
        if kind != entry.get("type"):
            problems.append({"path": rel, "problem": f"is a {kind}, recorded as a {entry.get('type')}"})
            continue
        now = describe_output(path, exclude=[provenance_path], use_cache=use_cache,
                              skip=entry.get("skipped") or ())
        if kind == "file":
            if now["sha256"] != entry.get("sha256"):
                problems.append({"path": rel, "problem": f"sha256 {now['sha256']} (size {now['size']}), recorded "
                                                         f"{entry.get('sha256')} (size {entry.get('size')})"})
            continue
        if now["fingerprint"] == entry.get("fingerprint"):
            continue
        old_files, new_files = entry.get("file_sha256"), now.get("file_sha256")
        if old_files is None or new_files is None:
            problems.append({"path": rel, "problem": f"folder fingerprint {now['fingerprint']}, recorded "
                                                     f"{entry.get('fingerprint')}"})
            continue
        for name in sorted(set(old_files) | set(new_files)):
            if name not in new_files:
                problems.append({"path": f"{rel}/{name}", "problem": "missing"})
            elif name not in old_files:
                problems.append({"path": f"{rel}/{name}", "problem": "not in the provenance record (new file)"})
            elif old_files[name] != new_files[name]:
                problems.append({"path": f"{rel}/{name}",
                                 "problem": f"sha256 {new_files[name]}, recorded {old_files[name]}"})
    return problems
