"""Atomic file output. Every stage writes through these helpers, so a killed job never leaves a
half-written file behind: data goes to a temporary file in the same folder, is flushed and fsynced,
then renamed over the target (``os.replace`` is atomic on POSIX file systems).

**Permissions.** ``mkstemp``/``mkdtemp`` create 0600 files and 0700 folders; the helpers chmod them to
what a plain ``open(..., "w")`` / ``mkdir`` would give under the current umask (``0666 & ~umask`` and
``0777 & ~umask``), so outputs are shared exactly like files written without them. Libraries that write
through their own temporary file (safetensors 0.8's ``save_file``, hence every ``save_pretrained``) leave
0600 weights behind whatever the umask; :func:`follow_umask` resets those, and the helpers apply it to
whatever was written into their temporary file or folder before the rename.

**Stale temporaries.** A job killed with SIGKILL (or a node failure) cannot run its cleanup, so a
temporary file ``.<name>.tmp-XXXXXXXX<suffix>`` or folder ``.<name>.build-XXXXXXXX`` /
``.<name>.old-XXXXXXXX`` may be left next to the output. Before writing ``<name>`` the helpers remove
such leftovers of *that* output (exact name pattern, in the output's parent folder only; nothing else
is touched). Two processes must not write the same output at the same time (Snakemake never does).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .errors import CounterFactoryError, input_error, missing_input

log = logging.getLogger(__name__)

_RANDOM = r"[A-Za-z0-9_]{8}"      # tempfile's random part (8 characters of [a-z0-9_])
# a temporary file is ".<name>.tmp-<random><suffix>" with an empty or one-part suffix such as ".parquet"


def current_umask() -> int:
    """The process umask (read from /proc where possible; otherwise set-and-restore)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _file_mode() -> int:
    return 0o666 & ~current_umask()


def _dir_mode() -> int:
    return 0o777 & ~current_umask()


def follow_umask(path: str | os.PathLike) -> Path:
    """Give ``path`` (a file, or a folder and everything in it) the permissions a plain ``open`` /
    ``mkdir`` would give under the current umask: ``0777 & ~umask`` for folders and files with an
    execute bit, ``0666 & ~umask`` for other files. Symbolic links are left alone."""
    path = Path(path)
    file_mode, dir_mode = _file_mode(), _dir_mode()

    def fix(p: str, is_dir: bool) -> None:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            return
        wanted = dir_mode if is_dir or st.st_mode & 0o111 else file_mode
        if stat.S_IMODE(st.st_mode) != wanted:
            os.chmod(p, wanted)

    if path.is_symlink() or not path.exists():
        return path
    if not path.is_dir():
        fix(str(path), False)
        return path
    fix(str(path), True)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames:
            fix(os.path.join(dirpath, name), True)
        for name in filenames:
            fix(os.path.join(dirpath, name), False)
    return path


def _file_prefix(target: Path) -> str:
    return f".{target.name}.tmp-"


def remove_stale_temporaries(target: str | os.PathLike) -> list[Path]:
    """Remove leftovers of killed atomic writes of ``target`` (see the module docstring); returns them."""
    target = Path(target)
    name = re.escape(target.name)
    patterns = [re.compile(rf"^\.{name}\.tmp-{_RANDOM}(?:\.[A-Za-z0-9]+)?$"),
                re.compile(rf"^\.{name}\.(?:build|old)-{_RANDOM}$")]
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not any(p.match(entry.name) for p in patterns):
            continue
        path = Path(entry.path)
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            continue
        log.warning("removed %s, left behind by an interrupted write of %s", path, target)
        removed.append(path)
    return removed


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it onto ``target``.

    On any exception the temporary file is removed and ``target`` is left untouched.
    ``suffix`` defaults to the target's suffix so libraries that infer formats still work.
    The file gets ``0666 & ~umask`` permissions; stale temporaries of ``target`` are removed first.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_dir():      # fail before writing anything, naming the output (not the temporary file)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    remove_stale_temporaries(target)
    fd, tmp = tempfile.mkstemp(
        prefix=_file_prefix(target), suffix=suffix if suffix is not None else target.suffix, dir=target.parent
    )
    try:
        os.fchmod(fd, _file_mode())
    finally:
        os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        follow_umask(tmp_path)  # a library may have replaced the file with its own (0600) temporary
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def write_text(target: str | os.PathLike, text: str) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(target)


def write_json(target: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    return write_text(target, json.dumps(obj, indent=indent, sort_keys=True, default=_json_default) + "\n")


def write_parquet(target: str | os.PathLike, frame) -> Path:
    """Write a pandas DataFrame as parquet (pyarrow), atomically, without the index."""
    with atomic_path(target) as tmp:
        frame.to_parquet(tmp, index=False, engine="pyarrow")
    return Path(target)


def write_csv(target: str | os.PathLike, frame) -> Path:
    with atomic_path(target) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(target)


def read_table(path: str | os.PathLike, what: str, fix: str, columns=(), *, csv_dtype: Any = None,
               formats: tuple[str, ...] = ("parquet", "csv")):
    """Read a parquet or CSV table (by suffix) that must have ``columns``: the one reader every stage uses for its
    input tables. A missing file, an unreadable one and missing columns are an :class:`~.errors.InputError`
    naming the file, what it is and ``fix``. ``csv_dtype``: pandas ``dtype`` for CSV files (e.g. ``str`` keeps
    ids and numbers as written); ``formats``: the formats accepted (a ``.csv`` name is CSV, anything else parquet)."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise missing_input(path, what, fix)
    kind = "csv" if path.suffix.lower() == ".csv" else "parquet"
    if kind not in formats:
        raise input_error(path, None, f"a {kind} file where the {what} must be {' or '.join(formats)}", fix)
    try:
        if kind == "csv":
            frame = pd.read_csv(path, dtype=csv_dtype, keep_default_na=csv_dtype is not str)
        else:
            frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow / pandas raise several types
        raise input_error(path, None, f"not a readable {kind} file ({exc})", fix) from exc
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {missing}", f"the {what} needs columns {list(columns)}")
    return frame


UTF8_FIX = "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 old > new`) or re-download it"


def utf8_error(path: str | os.PathLike, exc: UnicodeDecodeError, data: bytes | None = None, offset: int = 0,
               fix: str = UTF8_FIX):
    """The :class:`~.errors.InputError` for bytes of ``path`` that are not UTF-8: the line (when ``data``, the
    bytes that were decoded, is given) and the byte offset in the file (``offset``: where ``data`` starts in it),
    as every reader words it ("not UTF-8 text (<reason> at byte N)")."""
    line = None if data is None else "line {}".format(data.count(b"\n", 0, exc.start) + 1)
    return input_error(path, line, f"not UTF-8 text ({exc.reason} at byte {offset + exc.start})", fix)


def read_utf8(path: str | os.PathLike, fix: str = UTF8_FIX) -> str:
    """The text of ``path`` decoded as UTF-8 (a leading byte-order mark dropped); bytes that are not UTF-8 are
    an :class:`~.errors.InputError` naming the file, the line and the byte offset (:func:`utf8_error`)."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise utf8_error(path, exc, data, fix=fix) from None


def utf8_lines(path: str | os.PathLike, fix: str = UTF8_FIX) -> Iterator[tuple[int, str]]:
    """``(line number from 1, text)`` of each line of ``path`` (a leading byte-order mark dropped), read one line
    at a time (big files are never held whole); a line that is not UTF-8 is an :class:`~.errors.InputError`
    naming the file, the line and the byte offset in the file."""
    offset = 0
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise input_error(path, f"line {n}", f"not UTF-8 text ({exc.reason} at byte {offset + exc.start})",
                                  fix) from None
            offset += len(raw)
            yield n, text.removeprefix("\ufeff") if n == 1 else text


def write_png(target: str | os.PathLike, image) -> Path:
    """Write a PIL image as PNG atomically (no timestamps, so reruns are byte-identical)."""
    with atomic_path(target) as tmp:
        image.save(tmp, format="PNG")
    return Path(target)


def save_figure(target: str | os.PathLike, fig, dpi: int = 150) -> Path:
    """Save a matplotlib figure atomically; format from the target's suffix."""
    target = Path(target)
    with atomic_path(target) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=target.suffix.lstrip(".") or "png",
                    metadata={"Software": None} if target.suffix == ".png" else None)
    return target


#: bytes read at a time when hashing a file
HASH_CHUNK = 8 * 1024 * 1024


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of a file's content (``hashlib`` ``algorithm``), streamed in :data:`HASH_CHUNK` chunks: the one
    file hash of the package (models' manifests, data checksums, converted checkpoints, NLTK data, llm images)."""
    digest = hashlib.new(algorithm)
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's content (:func:`file_digest`)."""
    return file_digest(path, "sha256")


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys, no whitespace and UTF-8 text: equal data gives equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default)


def config_digest(cfg: dict, sections: tuple[str, ...] = (), model_roles: tuple[str, ...] = ()) -> str:
    """sha256 (hex) of the canonical JSON of ``{"sections": {name: cfg[name]}, "models": {role:
    cfg["models"][role]}}`` — the parts of a config one stage's output depends on. Shards of one stage
    record it in their summaries; merges refuse shards whose digests differ."""
    models = cfg.get("models") or {}
    doc = {"sections": {name: cfg.get(name) for name in sections},
           "models": {role: models.get(role) for role in model_roles}}
    return hashlib.sha256(canonical_json(doc).encode("utf-8")).hexdigest()


def check_digests(summaries: dict[str, dict], what: str, rerun: str) -> str | None:
    """The one ``config_digest`` shared by ``summaries`` ({shard label: summary}); raises
    :class:`~counterfactory.errors.InputError` naming the shards when they disagree or lack one.
    Returns None for no summaries."""
    by_digest: dict[Any, list[str]] = {}
    for label, summary in summaries.items():
        by_digest.setdefault(summary.get("config_digest") if isinstance(summary, dict) else None, []).append(label)
    if None in by_digest:
        raise input_error(by_digest[None][0], None,
                          f"{what} summary has no config_digest (written by an older version)"
                          + (f"; also: {', '.join(by_digest[None][1:])}" if len(by_digest[None]) > 1 else ""),
                          f"rerun {rerun} for that shard")
    if len(by_digest) > 1:
        groups = "; ".join(f"{d[:12]}: {', '.join(labels)}" for d, labels in sorted(by_digest.items()))
        raise input_error(what, None, f"shards were made with different configurations (config_digest {groups})",
                          f"rerun {rerun} for the shards made with an old configuration (snakemake "
                          "--forcerun on the shard rule reruns them all), then merge again")
    return next(iter(by_digest), None)


def _json_default(obj: Any):
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder next to ``target``; on success it replaces ``target``.

    An existing ``target`` is moved aside first and removed only after the new folder is in place (it is
    put back if the swap fails); on any exception the temporary folder is removed and ``target`` is
    left as it was. Readers never see a half-built folder. The folder gets ``0777 & ~umask``
    permissions, and so does everything written into it (:func:`follow_umask`: files ``0666 & ~umask``,
    ``0777 & ~umask`` with an execute bit); stale ``.build-``/``.old-`` folders of ``target`` left by a
    killed run are removed first.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not target.is_dir():
        raise CounterFactoryError(f"{target} exists and is not a folder. Fix: remove it or choose another path")
    remove_stale_temporaries(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    os.chmod(tmp, _dir_mode())
    try:
        yield tmp
        follow_umask(tmp)  # e.g. safetensors writes 0600 weights whatever the umask
        if not target.exists():
            os.replace(tmp, target)
            return
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rmdir(old)
        os.replace(target, old)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(old, target)
            raise
        if old.is_symlink():     # target was a link to a folder: the link goes, the folder it named is kept
            old.unlink()
        else:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
