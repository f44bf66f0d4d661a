"""Pin hub model roles to commits: what the local Hugging Face cache holds for each role (``models pin``).

A role whose ``source`` is a hub id loads whatever the hub's ``main`` branch is on the day it is first downloaded,
unless ``models.<role>.revision`` names a commit. :func:`pins` reads, for every hub role of a configuration, the
commit the local cache resolves for it, through ``huggingface_hub``'s cache scan (:func:`cached_repos`: each
cached repository's refs, ``refs/main`` -> commit, and its snapshot folders, named by commit); nothing is
downloaded and the hub is never asked. :func:`overlay` turns the rows into a configuration overlay
``models: {<role>: {revision: <commit>}}`` to pass after the config (``--config <cfg> --config <overlay>``,
``snakemake --configfile <cfg> <overlay>``).

A role that already pins a revision keeps it: its row says whether that commit is in the cache. A role that is
not in the cache (or is there at another commit than its pin) gets the ``hf download`` command that fills it.
Local folders, open_clip architectures (open_clip's loader takes no revision), LaMa and VSE++ have no hub
commit and are left out.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import sources
from .registry import model_spec

_HEX40 = re.compile(r"[0-9a-f]{40}")
#: loader libraries that take a hub ``revision``
PINNABLE_LIBRARIES = ("transformers", "diffusers", "sentence_transformers")


@dataclass(frozen=True)
class CachedRepo:
    """One model repository in the local Hugging Face cache: its refs (branch or tag -> commit) and the
    commits of its snapshot folders."""

    repo_id: str
    refs: dict
    commits: tuple[str, ...]


@dataclass(frozen=True)
class PinRow:
    """One role of ``models pin``: its hub repository, the commit to pin (None when none can be) and why."""

    role: str
    repo: str
    revision: str | None
    status: str      # cached | pinned | missing | pinned-missing | ambiguous
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.revision is not None


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache: ``$HF_HUB_CACHE`` when set, else ``huggingface_hub``'s own setting
    (``$HF_HOME/hub``, ``~/.cache/huggingface/hub``)."""
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)


def cached_repos(cache_dir: str | os.PathLike | None = None) -> dict[str, CachedRepo]:
    """Every model repository of the local cache (``huggingface_hub.scan_cache_dir``), by repo id; empty when
    there is no cache. Repositories the scan finds corrupted are left out (they count as not cached)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    folder = Path(cache_dir) if cache_dir else hub_cache_dir()
    try:
        info = scan_cache_dir(folder)
    except CacheNotFound:
        return {}
    out = {}
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        refs = {ref: rev.commit_hash for rev in repo.revisions for ref in rev.refs}
        commits = tuple(sorted(rev.commit_hash for rev in repo.revisions))
        out[repo.repo_id] = CachedRepo(repo.repo_id, refs, commits)
    return out


def is_pinnable(spec) -> bool:
    """A hub id loaded by a library that takes a ``revision`` (not a local folder, not open_clip / LaMa /
    VSE++)."""
    return spec.library in PINNABLE_LIBRARIES and not spec.is_local


def candidates(spec) -> list[str]:
    """The repo ids a role may be cached under: its hub id (``sentence-transformers/<id>`` for a bare
    sentence-transformers name) and the source as written."""
    ids = [sources.hub_id(spec), spec.source.removeprefix("hf-hub:")]
    return list(dict.fromkeys(ids))


def resolve_pinned(repo: CachedRepo | None, revision: str) -> str | None:
    """The cached commit a configured ``revision`` (a commit, a branch or a tag) names, or None."""
    if repo is None:
        return None
    if revision in repo.commits:
        return revision
    return repo.refs.get(revision)


def pin_row(spec, cached: dict[str, CachedRepo]) -> PinRow:
    """The :class:`PinRow` of one pinnable role, given the cache's repositories."""
    ids = candidates(spec)
    found = next((cached[i] for i in ids if i in cached), None)
    repo_id = found.repo_id if found else ids[0]
    if spec.revision:
        commit = resolve_pinned(found, spec.revision)
        if commit:
            return PinRow(spec.role, repo_id, commit, "pinned")
        where = (f"cached at {', '.join(c[:12] for c in found.commits)}, not at the pinned revision"
                 if found and found.commits else "not in the cache")
        return PinRow(spec.role, repo_id, None, "pinned-missing",
                      f"{where}: `hf download {repo_id} --revision {spec.revision}`")
    if found is None or not found.commits:
        return PinRow(spec.role, repo_id, None, "missing", f"not in the cache: `hf download {repo_id}`")
    if "main" in found.refs:
        return PinRow(spec.role, repo_id, found.refs["main"], "cached")
    if len(found.commits) == 1:
        return PinRow(spec.role, repo_id, found.commits[0], "cached")
    return PinRow(spec.role, repo_id, None, "ambiguous",
                  f"cached at {len(found.commits)} commits and no refs/main: `hf download {repo_id}` (sets "
                  f"refs/main), or set models.{spec.role}.revision to one of {', '.join(found.commits)}")


def pins(cfg: dict, roles=None, cache_dir: str | os.PathLike | None = None) -> tuple[list[PinRow], list[str]]:
    """``(rows, skipped)``: a :class:`PinRow` for every pinnable role of ``cfg['models']`` (or of ``roles``),
    and the roles left out with why (local folders, open_clip ...)."""
    cached = cached_repos(cache_dir)
    rows, skipped = [], []
    for role in roles or sorted(cfg.get("models") or {}):
        spec = model_spec(cfg, role)
        if is_pinnable(spec):
            rows.append(pin_row(spec, cached))
        elif spec.library == "open_clip" and str(spec.pretrained or "").endswith((".pt", ".pth", ".bin")):
            skipped.append(f"{role}: open_clip {spec.source} with the weights file {spec.pretrained} (not a hub id)")
        elif spec.library == "open_clip" and not spec.is_local:
            skipped.append(f"{role}: open_clip {spec.source} pretrained={spec.pretrained} (open_clip's loader takes "
                           "no revision)")
        else:
            skipped.append(f"{role}: {spec.source} ({spec.library}, not a hub id)")
    return rows, skipped


def overlay(rows: list[PinRow]) -> dict:
    """The configuration overlay of ``rows``: ``{"models": {role: {"revision": commit}}}`` for each row that has
    a commit."""
    return {"models": {r.role: {"revision": r.revision} for r in rows if r.ok}}


def overlay_text(rows: list[PinRow], config: str) -> str:
    """The overlay as YAML, with a header saying what it is and how to use it."""
    head = (f"# Model revisions pinned by `counterfactory models pin` from the local Hugging Face cache, for\n"
            f"# {config}. Use it after that config: --config <config> --config <this file>\n"
            f"# (snakemake: --configfile <config> <this file>).\n")
    return head + yaml.safe_dump(overlay(rows), sort_keys=True)


def table(rows: list[PinRow]) -> str:
    """One line per row: role, repository, revision (or "-") and, for a role without one, the fix."""
    head = ("role", "repository", "revision", "")
    lines = [head] + [(r.role, r.repo, r.revision or "-", r.fix) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line[:3], widths)) + ("  " + line[3] if line[3] else "")
                     for line in lines).rstrip()
