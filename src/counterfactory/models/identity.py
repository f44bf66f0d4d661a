"""Identity of model folders by content, and their integrity.

:func:`fingerprint` of a folder is a sha256 over (relative path, sha256 of content) of every file in it (``.git``,
``__pycache__``, ``*.lock``, logs, Snakemake's ``.snakemake_timestamp`` and our manifest skipped). Per-file hashes are cached in ``file_hashes.json``
(``$COUNTERFACTORY_CACHE_DIR``, else ``$XDG_CACHE_HOME/counterfactory``, else ``~/.cache/counterfactory``) keyed by
the resolved path and its size, mtime_ns, ctime_ns and inode, so unchanged multi-GB weights are not re-read.
Folders built by ``counterfactory models build-tiny`` carry ``counterfactory-manifest.json`` (sha256 of every
file); :func:`verify_folder` checks them, and checks HF-cache snapshots against their blob names (LFS blobs are
named by their sha256, other blobs by their git blob sha1). The registry (:mod:`.registry`) identifies roles
with these.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from ..io import HASH_CHUNK as CHUNK  # bytes read at a time when hashing
from ..io import atomic_dir, file_sha256, write_json

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- content identity

MANIFEST_NAME = "counterfactory-manifest.json"
CACHE_ENV = "COUNTERFACTORY_CACHE_DIR"
CACHE_FILE = "file_hashes.json"
CACHE_FORMAT = 1
#: a file modified less than this long before it was hashed is not cached (its mtime may not yet
#: tell a later rewrite apart: file system timestamps are coarser than a fast rewrite)
RACY_NS = 2_000_000_000
#: folders and files that are not part of a model's content
SKIP_DIRS = frozenset({".git", "__pycache__", ".ipynb_checkpoints", ".snakemake", ".cache"})
#: Snakemake's marker in every folder output (``directory(...)``): its mtime, not the model, changes per run
SNAKEMAKE_TIMESTAMP = ".snakemake_timestamp"
SKIP_NAMES = frozenset({".DS_Store", MANIFEST_NAME, SNAKEMAKE_TIMESTAMP})
SKIP_SUFFIXES = (".lock", ".log", ".pyc", ".incomplete")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")


def cache_dir() -> Path:
    """``$COUNTERFACTORY_CACHE_DIR``, else ``$XDG_CACHE_HOME/counterfactory``, else ``~/.cache/counterfactory``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "counterfactory"


def _hash_file(path: Path) -> str:
    """sha256 of a file's content (:func:`counterfactory.io.file_sha256`)."""
    return file_sha256(path)


def _git_blob_sha1(path: Path) -> str:
    """The git blob id of a file (how the hub names non-LFS blobs in its cache)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class HashCache:
    """Per-file sha256 cache in ``cache_dir()/file_hashes.json``.

    An entry is keyed by the resolved path and valid only while the file's size, mtime_ns, ctime_ns
    and inode are unchanged. ``read=False`` ignores stored entries (fresh hashes are still saved).
    A corrupt or unreadable cache file is ignored and rewritten; writes are atomic (temporary
    file + rename) and merge with what other processes wrote meanwhile; a cache that cannot be
    written is skipped (hashing still works, just slower next time).
    """

    def __init__(self, path: Path | None = None, read: bool = True):
        self.path = path or cache_dir() / CACHE_FILE
        self.entries: dict[str, dict] = self._load() if read else {}
        self.new: dict[str, dict] = {}

    def _load(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable hash cache %s (%s); it will be rewritten", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("files"), dict):
            log.warning("ignoring hash cache %s in an unknown format; it will be rewritten", self.path)
            return {}
        return {k: v for k, v in data["files"].items() if isinstance(v, dict)}

    @staticmethod
    def _stamp(st: os.stat_result) -> dict:
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}

    def sha256(self, path: str | os.PathLike) -> str:
        """Content sha256 of ``path`` (from the cache when the file is unchanged)."""
        real = os.path.realpath(path)
        st = os.stat(real)
        stamp = self._stamp(st)
        entry = self.entries.get(real)
        if entry and all(entry.get(k) == v for k, v in stamp.items()) and _HEX64.fullmatch(str(entry.get("sha256"))):
            return entry["sha256"]
        digest = _hash_file(Path(real))
        if os.stat(real).st_mtime_ns == st.st_mtime_ns and time.time_ns() - st.st_mtime_ns > RACY_NS:
            self.new[real] = self.entries[real] = stamp | {"sha256": digest}
        return digest

    def save(self) -> None:
        if not self.new:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            merged = {**self._load(), **self.new} if self.path.exists() else dict(self.new)
            if len(merged) > 20000:  # keep it small: forget files that are gone
                merged = {k: v for k, v in merged.items() if os.path.exists(k)}
            fd, tmp = tempfile.mkstemp(prefix=f".{CACHE_FILE}.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump({"format": CACHE_FORMAT, "files": merged}, fh, sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self.new = {}
        except OSError as exc:
            log.warning("could not write the hash cache %s (%s); set %s to a writable folder", self.path, exc,
                        CACHE_ENV)


def _skipped(name: str) -> bool:
    return name in SKIP_NAMES or name.endswith(SKIP_SUFFIXES)


def content_files(root: str | os.PathLike, skip: bool = True) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of every file under ``root``, sorted; symlinks to files count as
    files (HF-cache snapshots). ``skip`` leaves out ``.git``, ``__pycache__``, locks, logs, Snakemake's
    ``.snakemake_timestamp`` (written into every folder output after the job) and our manifest. Unreadable folders raise :class:`PermissionError`/:class:`OSError`."""
    root = Path(root)

    def fail(exc: OSError):
        raise exc

    out = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        if skip:
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            if skip and _skipped(name):
                continue
            path = Path(dirpath) / name
            if path.is_file():
                out.append((path.relative_to(root).as_posix(), path))
    return sorted(out)


def _combine(pairs: Iterable[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for rel, sha in pairs:
        digest.update(f"{rel}\0{sha}\n".encode())
    return digest.hexdigest()


def file_hashes(path: str | os.PathLike, *, use_cache: bool = True, skip: bool = True) -> dict[str, str]:
    """``{relative path: sha256}`` of a folder's files (a single file: ``{name: sha256}``)."""
    path = Path(path)
    cache = HashCache(read=use_cache)
    try:
        if path.is_dir():
            return {rel: cache.sha256(p) for rel, p in content_files(path, skip=skip)}
        return {path.name: cache.sha256(path)}
    finally:
        cache.save()


def fingerprint(path: str | os.PathLike, *, use_cache: bool = True, skip: bool = True) -> str:
    """Content identity of a folder (or file): a 64-hex sha256 over (relative path, sha256 of the
    content) of each file; the same files in two places give the same fingerprint. A single file's
    fingerprint is the sha256 of its content. Raises :class:`OSError` when something is unreadable
    (roles wrap it in :class:`ModelIdentityError`)."""
    path = Path(path)
    if path.is_dir():
        return _combine(sorted(file_hashes(path, use_cache=use_cache, skip=skip).items()))
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    return next(iter(file_hashes(path, use_cache=use_cache).values()))


# --------------------------------------------------------------------------- manifests and integrity


def write_manifest(folder: str | os.PathLike, **info: Any) -> Path:
    """Write ``counterfactory-manifest.json`` into ``folder``: size and sha256 of every file (hashed
    afresh, not from the cache), their fingerprint, and ``info`` (builder, role, seed ...)."""
    folder = Path(folder)
    files = {rel: {"sha256": _hash_file(p), "size": p.stat().st_size} for rel, p in content_files(folder)}
    manifest = {"format": 1, **info, "fingerprint": _combine((rel, f["sha256"]) for rel, f in sorted(files.items())),
                "files": files}
    return write_json(folder / MANIFEST_NAME, manifest)


def save_with_manifest(out: str | os.PathLike, *parts: Any, **info: Any) -> Path:
    """Write ``parts`` (objects with ``save_pretrained``: a model, its processor) into the folder ``out``, replacing
    it atomically (:func:`counterfactory.io.atomic_dir`), with the sha256 manifest of :func:`write_manifest`
    (``info``: builder, role, source ...); returns ``out``."""
    out = Path(out)
    with atomic_dir(out) as tmp:
        for part in parts:
            part.save_pretrained(tmp)
        write_manifest(tmp, **info)
    return out


def hf_snapshot(folder: str | os.PathLike) -> tuple[str, str] | None:
    """``(repo folder name, commit)`` when ``folder`` is a snapshot in the HF cache
    (``.../models--org--name/snapshots/<40-hex commit>``), else None."""
    folder = Path(folder).absolute()
    repo = folder.parent.parent
    if _HEX40.fullmatch(folder.name) and folder.parent.name == "snapshots" and (repo / "blobs").is_dir():
        return repo.name, folder.name
    return None


def verify_folder(folder: str | os.PathLike, *, use_cache: bool = False) -> tuple[str | None, list[dict]]:
    """Check a model folder's files against what it claims to be.

    Returns ``(method, problems)``: method ``"manifest"`` (``counterfactory-manifest.json``: every
    listed file present with its sha256, no unlisted files), ``"hf-cache"`` (a hub snapshot: each
    symlinked blob named by a sha256 -- LFS -- or a git blob sha1 must hash to its name) or None
    (nothing to check against). Each problem is ``{"path", "problem"}``. By default files are
    re-read (``use_cache=False``): a check must see bit rot that leaves timestamps alone.
    """
    folder = Path(folder)
    manifest_path = folder / MANIFEST_NAME
    problems: list[dict] = []
    cache = HashCache(read=use_cache)
    try:
        if manifest_path.is_file():
            try:
                manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
                listed = {rel: f["sha256"] for rel, f in manifest["files"].items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                return "manifest", [{"path": str(manifest_path), "problem": f"unreadable manifest ({exc})"}]
            present = dict(content_files(folder))
            for rel, expected in sorted(listed.items()):
                if rel not in present:
                    problems.append({"path": str(folder / rel), "problem": "missing (listed in the manifest)"})
                    continue
                actual = cache.sha256(present[rel])
                if actual != expected:
                    problems.append({"path": str(present[rel]),
                                     "problem": f"sha256 {actual} but the manifest says {expected}"})
            for rel in sorted(set(present) - set(listed)):
                problems.append({"path": str(present[rel]), "problem": "not listed in the manifest"})
            return "manifest", problems
        if hf_snapshot(folder):
            for rel, path in content_files(folder, skip=False):
                if not path.is_symlink():
                    continue
                blob = Path(os.path.realpath(path))
                if _HEX64.fullmatch(blob.name):
                    actual = cache.sha256(blob)
                elif _HEX40.fullmatch(blob.name):
                    actual = _git_blob_sha1(blob)
                else:
                    continue
                if actual != blob.name:
                    problems.append({"path": str(path), "problem": f"blob {blob} hashes to {actual}, not its name"})
            return "hf-cache", problems
        return None, problems
    finally:
        cache.save()
