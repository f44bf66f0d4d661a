"""Atomic file output. Every stage writes through these helpers, so a killed job never leaves a
half-written file behind: data goes to a temporary file in the same folder, is flushed and fsynced,
then renamed over the target (``os.replace`` is atomic on POSIX file systems)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it onto ``target``.

    On any exception the temporary file is removed and ``target`` is left untouched.
    ``suffix`` defaults to the target's suffix so libraries that infer formats still work.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=suffix if suffix is not None else target.suffix, dir=target.parent
    )
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
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
    left as it was. Readers never see a half-built folder.
    """
    import shutil

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not target.is_dir():
        from .errors import CounterFactoryError

        raise CounterFactoryError(f"{target} exists and is not a folder. Fix: remove it or choose another path")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        yield tmp
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
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
