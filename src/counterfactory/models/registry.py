"""Model registry: role -> (library loader, id or path), and the identity of what each role loads.

Every role in ``config['models']`` names a hub id (``roberta-base``) or a local folder
(``resources/models/tiny/mlm``). Loading always goes through the library's real loader
(``from_pretrained(path_or_id)``, ``open_clip.create_model_and_transforms``, ``SentenceTransformer``),
never ``trust_remote_code``; transformers and diffusers prefer ``.safetensors`` weights.
A missing or unloadable model raises one :class:`ModelLoadError` naming the role, what was tried
and how to fix it. Each load is recorded for provenance (:func:`loaded_models`).

Identity is by content: :func:`fingerprint` of a folder is a sha256 over (relative path, sha256 of
content) of every file in it (``.git``, ``__pycache__``, ``*.lock``, logs and our manifest skipped).
Per-file hashes are cached in ``file_hashes.json`` (``$COUNTERFACTORY_CACHE_DIR``, else
``$XDG_CACHE_HOME/counterfactory``, else ``~/.cache/counterfactory``) keyed by the resolved path
and its size, mtime_ns, ctime_ns and inode, so unchanged multi-GB weights are not re-read.
Hub ids are identified by their hub commit (``config._commit_hash`` or the HF-cache snapshot
folder) and, when they resolve in the local cache, by the fingerprint of the snapshot folder.
Anything that cannot be identified raises :class:`ModelIdentityError` -- never an empty key.

Integrity: folders built by ``counterfactory models build-tiny`` carry ``counterfactory-manifest.json``
(sha256 of every file); :func:`verify_folder` checks them, and checks HF-cache snapshots against
their blob names (LFS blobs are named by their sha256, other blobs by their git blob sha1).
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import ConfigError, ModelLoadError

log = logging.getLogger(__name__)


class ModelIdentityError(ModelLoadError):
    """A model role (or a file) could not be identified by content: names role, path and fix."""


class ModelIntegrityError(ModelLoadError):
    """A model folder's files do not match its manifest or its HF-cache blob names."""


#: default loader library of each role (a config entry may override with ``library:``)
DEFAULT_LIBRARY = {
    "mlm": "transformers",
    "lm": "transformers",
    "sentence": "sentence_transformers",
    "sd": "diffusers",
    "vae": "diffusers",
    "sd_inpaint": "diffusers",
    "gligen": "diffusers",
    "gligen_inpaint": "diffusers",
    "t2i": "diffusers",
    "vlm": "transformers",
    "clip_filter": "transformers",
    "clip_eval": "transformers",
    "clip_train": "transformers",
    "itm": "transformers",
    "nsfw": "transformers",
    "inpaint": "lama_cleaner",
    "editor": "diffusers",
    "llm": "transformers",
    "captioner": "transformers",
    "itm_bridgetower": "transformers",
    "itm_flava": "transformers",
    "itm_vilt": "transformers",
    "itm_blip": "transformers",
    "clip_open_clip": "open_clip",
}


@dataclass(frozen=True)
class ModelSpec:
    role: str
    source: str
    library: str
    revision: str | None = None
    pretrained: str | None = None

    @property
    def is_local(self) -> bool:
        """A source is a local folder if it exists on disk or is written like a path."""
        s = self.source
        if s.startswith("local-dir:"):
            return True
        return Path(s).exists() or s.startswith(("/", "./", "../", "~")) or s.startswith("resources/")

    @property
    def local_path(self) -> Path:
        return Path(os.path.expanduser(self.source.removeprefix("local-dir:")))


@dataclass
class LoadedModel:
    role: str
    source: str
    library: str
    revision: str | None
    local: bool = False
    resolved: str | None = None
    fingerprint: str | None = None
    commit: str | None = None
    classes: list[str] = field(default_factory=list)


_LOADED: dict[str, LoadedModel] = {}
_LOADERS: dict[str, Callable[[ModelSpec, dict], Any]] = {}


def model_spec(cfg: dict, role: str) -> ModelSpec:
    """The :class:`ModelSpec` of ``role`` from a validated config."""
    models = cfg.get("models", {})
    if role not in models:
        raise ConfigError(
            f"models.{role} is not configured. Fix: add `{role}: {{source: <hub id or local folder>}}` "
            f"under `models:` in your config"
        )
    entry = models[role]
    if isinstance(entry, str):
        entry = {"source": entry}
    return ModelSpec(
        role=role,
        source=entry["source"],
        library=entry.get("library") or DEFAULT_LIBRARY.get(role, "transformers"),
        revision=entry.get("revision"),
        pretrained=entry.get("pretrained"),
    )


def register_loader(kind: str):
    """Decorator: register the loader for ``kind`` (``"<role>"`` or ``"<role>:<library>"``)."""

    def deco(fn):
        _LOADERS[kind] = fn
        return fn

    return deco


def load(cfg: dict, role: str, **kwargs) -> Any:
    """Load the model of ``role`` with its library's loader; raise :class:`ModelLoadError` on failure."""
    spec = model_spec(cfg, role)
    loader = _LOADERS.get(f"{role}:{spec.library}") or _LOADERS.get(role)
    if loader is None:
        raise ConfigError(
            f"models.{role}: no loader for library {spec.library!r}. "
            f"Fix: use one of the libraries this role supports"
        )
    if spec.is_local and not spec.local_path.exists():
        raise ModelLoadError(
            f"role '{role}': local model folder {spec.local_path} does not exist. Fix: for the offline demo "
            f"build the tiny models (`snakemake --configfile config/demo.yaml models_build_tiny` or "
            f"`counterfactory models build-tiny --config config/demo.yaml`); otherwise point "
            f"models.{role}.source at a downloaded model folder or a hub id"
        )
    try:
        obj = loader(spec, kwargs)
    except ModelLoadError:
        raise
    except Exception as exc:  # library errors vary (OSError, ValueError, HF hub errors ...)
        raise ModelLoadError(_load_failure_message(spec, exc)) from exc
    _record(spec, obj)
    return obj


def _load_failure_message(spec: ModelSpec, exc: Exception) -> str:
    tried = f"local folder {spec.local_path}" if spec.is_local else f"hub id {spec.source!r}"
    if spec.revision:
        tried += f" at revision {spec.revision}"
    offline = os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True")
    if spec.is_local:
        fix = (
            f"check that {spec.local_path} was saved with the {spec.library} library's save_pretrained / "
            f"export for this role, or rebuild it"
        )
    elif offline:
        fix = (
            f"HF_HUB_OFFLINE is set and {spec.source!r} is not in the local cache: on a connected machine run "
            f"`hf download {spec.source}` (fills the cache), or download the model folder and set "
            f"models.{spec.role}.source to its path"
        )
    else:
        fix = (
            f"check the id, or download the model and set models.{spec.role}.source to its local folder; "
            f"on machines without network set HF_HUB_OFFLINE=1 and pre-fill the cache"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"role '{spec.role}' ({spec.library}): could not load {tried}: {first}. Fix: {fix}"


# --------------------------------------------------------------------------- content identity

CHUNK = 8 * 1024 * 1024  # bytes read at a time when hashing
MANIFEST_NAME = "counterfactory-manifest.json"
CACHE_ENV = "COUNTERFACTORY_CACHE_DIR"
CACHE_FILE = "file_hashes.json"
CACHE_FORMAT = 1
#: a file modified less than this long before it was hashed is not cached (its mtime may not yet
#: tell a later rewrite apart: file system timestamps are coarser than a fast rewrite)
RACY_NS = 2_000_000_000
#: folders and files that are not part of a model's content
SKIP_DIRS = frozenset({".git", "__pycache__", ".ipynb_checkpoints", ".snakemake", ".cache"})
SKIP_NAMES = frozenset({".DS_Store", MANIFEST_NAME})
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
    """sha256 of a file's content, streamed in 8 MiB chunks."""
    digest = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


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
    files (HF-cache snapshots). ``skip`` leaves out ``.git``, ``__pycache__``, locks, logs and our
    manifest. Unreadable folders raise :class:`PermissionError`/:class:`OSError`."""
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
    from ..io import write_json

    folder = Path(folder)
    files = {rel: {"sha256": _hash_file(p), "size": p.stat().st_size} for rel, p in content_files(folder)}
    manifest = {"format": 1, **info, "fingerprint": _combine((rel, f["sha256"]) for rel, f in sorted(files.items())),
                "files": files}
    return write_json(folder / MANIFEST_NAME, manifest)


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


# --------------------------------------------------------------------------- role identity


def _identity_error(spec: ModelSpec, path: Path | str, exc: BaseException) -> ModelIdentityError:
    where = getattr(exc, "filename", None) or path
    if isinstance(exc, FileNotFoundError) and Path(str(path)) == spec.local_path and not spec.local_path.exists():
        fix = (f"build it (`counterfactory models build-tiny --config <config> --role {spec.role}`) or point "
               f"models.{spec.role}.source at an existing model folder or a hub id")
    elif isinstance(exc, PermissionError):
        fix = f"make {where} readable by this user (chmod/chown), or copy the model to a readable folder"
    else:
        fix = f"check that {path} is a complete, readable model folder; rebuild or re-download it"
    what = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
    return ModelIdentityError(
        f"role '{spec.role}': cannot identify the model at {path} by content ({what}: {where}). Fix: {fix}")


def _hub_candidates(spec: ModelSpec) -> list[str]:
    source = spec.source
    if spec.library == "open_clip" and not source.startswith("hf-hub:"):
        return []  # open_clip architecture names (ViT-B-32) are not hub ids
    repo_id = source.removeprefix("hf-hub:")
    out = [repo_id]
    if spec.library == "sentence_transformers" and "/" not in repo_id:
        out.insert(0, f"sentence-transformers/{repo_id}")
    return out


def resolve_hub(spec: ModelSpec) -> tuple[Path | None, str | None]:
    """``(snapshot folder, commit)`` of a hub id in the local HF cache, or ``(None, None)`` when it is
    not cached (never contacts the hub)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None, None
    for repo_id in _hub_candidates(spec):
        try:
            folder = Path(snapshot_download(repo_id, revision=spec.revision, local_files_only=True))
        except Exception:  # not cached, invalid id, ...: the hub library raises various types
            continue
        if folder.is_dir():
            snap = hf_snapshot(folder)
            return folder, snap[1] if snap else None
    return None, None


def identify(spec: ModelSpec, commit: str | None = None) -> dict:
    """Identity of a role's model without loading it: ``local``, ``resolved`` folder, ``fingerprint``
    (64-hex content sha256) and, for hub ids, ``commit`` (``commit`` argument -- e.g. the loaded
    config's ``_commit_hash`` -- else the cached snapshot's folder name). A hub id that is not in the
    local cache has no fingerprint (the hub commit, when known, identifies it). Raises
    :class:`ModelIdentityError` when a local folder is missing or a file cannot be read."""
    if spec.is_local:
        path = spec.local_path
        try:
            if not path.exists():
                raise FileNotFoundError(2, "No such file or directory", str(path))
            fp = fingerprint(path)
            if path.is_dir() and not content_files(path):
                raise ModelIdentityError(
                    f"role '{spec.role}': model folder {path} holds no files. Fix: rebuild or re-download it")
        except OSError as exc:
            raise _identity_error(spec, path, exc) from exc
        out = {"local": True, "resolved": str(path.resolve()), "fingerprint": fp}
        snap = hf_snapshot(path)
        if snap:
            out["commit"] = commit or snap[1]
        return out
    folder, snapshot_commit = resolve_hub(spec)
    out = {"local": False, "resolved": str(folder) if folder else None, "fingerprint": None,
           "commit": commit or snapshot_commit}
    if folder is not None:
        try:
            out["fingerprint"] = fingerprint(folder)
        except OSError as exc:
            raise _identity_error(spec, folder, exc) from exc
    return out


def _record(spec: ModelSpec, obj: Any) -> None:
    objs = obj if isinstance(obj, tuple) else (obj,)
    commit = None
    for o in objs:
        commit = getattr(getattr(o, "config", None), "_commit_hash", None)
        if commit:
            break
    ident = identify(spec, commit=commit if not spec.is_local or hf_snapshot(spec.local_path) else None)
    _LOADED[spec.role] = LoadedModel(
        role=spec.role,
        source=spec.source,
        library=spec.library,
        revision=spec.revision,
        local=ident["local"],
        resolved=ident["resolved"],
        fingerprint=ident["fingerprint"],
        commit=ident.get("commit"),
        classes=[type(o).__name__ for o in objs],
    )


def loaded_models() -> dict[str, dict]:
    """Every role loaded in this process: source, library, configured revision, local or hub,
    resolved path, content fingerprint (64-hex sha256), hub commit when known, loaded classes."""
    return {role: asdict(m) for role, m in sorted(_LOADED.items())}


def configured_models(cfg: dict, roles: Iterable[str] | None = None) -> dict[str, dict]:
    """Each configured role (or only ``roles``) identified without loading it: ``source``,
    ``library``, ``revision``, ``local``, ``resolved`` path, ``fingerprint`` (64-hex content sha256;
    None only for a hub id that is not in the local cache) and, for hub ids, ``commit`` when known.

    Raises :class:`ModelIdentityError` (a :class:`~counterfactory.errors.CounterFactoryError`)
    naming the role, the path and the fix when a local model is missing or unreadable."""
    wanted = sorted(cfg.get("models", {}) if roles is None else roles)
    out = {}
    for role in wanted:
        spec = model_spec(cfg, role)
        out[role] = {"source": spec.source, "library": spec.library, "revision": spec.revision, **identify(spec)}
    return out


def verify_role(cfg: dict, role: str, *, use_cache: bool = False) -> dict:
    """Integrity check of one role's files (see :func:`verify_folder`) without loading it.

    Returns ``{"role", "folder", "method", "problems", "fix"}``; ``folder`` is None for a hub id that
    is not cached. Raises :class:`ModelIdentityError` when the folder cannot be read."""
    spec = model_spec(cfg, role)
    folder = spec.local_path if spec.is_local else resolve_hub(spec)[0]
    report = {"role": role, "folder": str(folder) if folder else None, "method": None, "problems": [], "fix": None}
    if folder is None or not folder.is_dir():
        return report
    try:
        method, problems = verify_folder(folder, use_cache=use_cache)
    except OSError as exc:
        raise _identity_error(spec, folder, exc) from exc
    report.update(method=method, problems=problems)
    if method == "manifest":
        report["fix"] = (f"rebuild with `counterfactory models build-tiny --config <config> --role {role} --force`"
                         if _manifest_builder(folder) == TINY_BUILDER else
                         f"restore {folder} from its source (its manifest no longer matches)")
    elif method == "hf-cache":
        repo = hf_snapshot(folder)
        repo_id = repo[0].removeprefix("models--").replace("--", "/") if repo else spec.source
        report["fix"] = (f"re-download: `hf download {repo_id} --revision {repo[1] if repo else 'main'} "
                         f"--force-download` (or delete {folder.parent.parent} and download again)")
    return report


TINY_BUILDER = "counterfactory.models.tiny"


def _manifest_builder(folder: Path) -> str | None:
    try:
        return json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8")).get("builder")
    except (OSError, ValueError, AttributeError):
        return None


def _hf_kwargs(spec: ModelSpec) -> dict:
    kw: dict[str, Any] = {}
    if spec.revision and not spec.is_local:
        kw["revision"] = spec.revision
    return kw


def _src(spec: ModelSpec) -> str:
    return str(spec.local_path) if spec.is_local else spec.source


# --------------------------------------------------------------------------- loaders

@register_loader("mlm")
def _load_mlm(spec: ModelSpec, kw: dict):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_src(spec), **_hf_kwargs(spec))
    model = AutoModelForMaskedLM.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), tok


@register_loader("lm")
def _load_lm(spec: ModelSpec, kw: dict):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_src(spec), **_hf_kwargs(spec))
    model = AutoModelForCausalLM.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), tok


@register_loader("sentence")
def _load_sentence(spec: ModelSpec, kw: dict):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(_src(spec), device=kw.get("device", "cpu"), revision=spec.revision)


def _load_hf_clip(spec: ModelSpec, kw: dict):
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(_src(spec), **_hf_kwargs(spec))
    processor = CLIPProcessor.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), processor


def _load_open_clip(spec: ModelSpec, kw: dict):
    import open_clip

    name = spec.source
    if spec.is_local and not name.startswith("local-dir:"):
        name = f"local-dir:{spec.local_path}"
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=spec.pretrained)
    tokenizer = open_clip.get_tokenizer(name)
    return model.eval(), preprocess, tokenizer


for _role in ("clip_filter", "clip_eval", "clip_train"):
    register_loader(f"{_role}:transformers")(_load_hf_clip)
    register_loader(f"{_role}:open_clip")(_load_open_clip)


@register_loader("sd")
def _load_sd(spec: ModelSpec, kw: dict):
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_pretrained(
        _src(spec), safety_checker=None, requires_safety_checker=False, **_hf_kwargs(spec)
    )


@register_loader("vae")
def _load_vae(spec: ModelSpec, kw: dict):
    """``AutoencoderKL`` that decodes the ``sd`` role's latents instead of the pipeline's own VAE
    (the paper config: ``stabilityai/sd-vae-ft-mse``, as InstructPix2Pix's generator)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_pretrained(_src(spec), **_hf_kwargs(spec)).eval()


@register_loader("gligen")
@register_loader("gligen_inpaint")
def _load_gligen(spec: ModelSpec, kw: dict):
    """``StableDiffusionGLIGENPipeline``: text-box generation (``gligen``: gligen/gligen-generation-text-box,
    CounterCurate §3.2) or text-box inpainting (``gligen_inpaint``: gligen/gligen-inpainting-text-box, §3.3)."""
    from diffusers import StableDiffusionGLIGENPipeline

    return StableDiffusionGLIGENPipeline.from_pretrained(
        _src(spec), safety_checker=None, requires_safety_checker=False, **_hf_kwargs(spec)
    )


@register_loader("t2i")
def _load_t2i(spec: ModelSpec, kw: dict):
    """The open text-to-image model in DALLE-3's role (CounterCurate §3.4), through diffusers'
    ``AutoPipelineForText2Image``, which picks the class the folder's ``model_index.json`` names (the paper
    config's SDXL base: ``StableDiffusionXLPipeline``; SD 1.x/2.x: ``StableDiffusionPipeline``, loaded without
    its safety checker like every other SD role)."""
    from diffusers import AutoPipelineForText2Image, DiffusionPipeline

    index = DiffusionPipeline.load_config(_src(spec), **_hf_kwargs(spec))
    extra = {"safety_checker": None, "requires_safety_checker": False} if "safety_checker" in index else {}
    return AutoPipelineForText2Image.from_pretrained(_src(spec), **extra, **_hf_kwargs(spec))


# loaders of the evaluation roles (ITM families, open_clip) register themselves on import
from . import loaders_eval  # noqa: E402,F401
from . import loaders_nsfw  # noqa: E402,F401  (the nsfw role: SocialCounterfactuals §3.4)
from . import loaders_vlm  # noqa: E402,F401  (the vlm role: CounterCurate §3.5, LLaVA-1.5)
from . import loaders_llm  # noqa: E402,F401  (the llm role: CounterCurate §3.4 / app. A-B, GPT-4(V) stand-in)
from . import loaders_editing  # noqa: E402,F401  (CVLD: editor = InstructPix2Pix, image_encoder = Swin)
from . import loaders_inpaint  # noqa: E402,F401  (inpaint = LaMa through lama-cleaner, object removal)
