"""The shard runner shared by the sharded image stages: COCO-Counterfactuals pairs (:mod:`.shards`),
SocialCounterfactuals sets (:mod:`.sets`), CounterCurate grounded generation (:mod:`.grounded`), object
removal (:mod:`.inpaint`) and CVLD edits (:mod:`.editing`).

A stage plugs in by subclassing :class:`ShardStage` and supplying only what is specific to it:

* :meth:`ShardStage.key` -- the fingerprint of an item's output (settings, models, the item's content);
* :meth:`ShardStage.plan` -- its batches over the items to generate;
* :meth:`ShardStage.generate` -- its batch generator, yielding ``(item, result)`` for every item a batch
  completes;
* :meth:`ShardStage.store` -- writing one item's result into the cache (its done-marker last).

:func:`run_stage` owns the rest: the resume cache (an item whose done-marker carries its key is skipped),
clearing stale entries, the loop over batches, the progress bar, the kill hook and the counts. Two caches:

* :class:`WorkCache` -- ``OUT/work/<item_id>/`` with ``done.json`` (holding the fingerprint) written last; the
  shard's outputs are then assembled from it atomically (:func:`assemble`) and shards merged with
  :func:`load_shard_summaries`, which refuses shards whose recorded ``config_digest`` differ.
* :class:`PngKeyCache` -- outputs written straight to ``OUT/<name>.png``, each carrying its key in a PNG text
  chunk (the done-marker is the verified PNG itself).

Per-item randomness depends only on ``(global seed, item id, index)`` (:func:`item_seed`), never on the batch
or the shard, and a batch is generated whole, so a killed and rerun shard writes byte-identical files (shard
summaries hold no counts of one run's work; they record ``batch_size`` and torch's ``threads``).

A stage's shard function holds :func:`shard_lock` on its folder (decorator :func:`locks_shard`): a second run on
the same folder stops with "another run is writing this shard". Merges check the shards against their plan
(:func:`check_shard_plan`): a shard missing or given twice is refused.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import socket
import json
import logging
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..errors import CounterFactoryError, input_error
from ..io import atomic_dir, atomic_path, check_digests, write_json, write_parquet
from .selection import candidate_seed

log = logging.getLogger(__name__)

#: item ids name files and folders: letters, digits, '_', '.', '-'
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")


# --------------------------------------------------------------------------- small helpers


def fingerprint(obj: Any) -> str:
    """sha256 of the JSON of ``obj`` (sorted keys; non-JSON values as ``str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def item_seed(global_seed: int, item_id: str, index: int = 0) -> int:
    """64-bit seed of candidate ``index`` of ``item_id`` (:func:`.selection.candidate_seed`)."""
    return candidate_seed(global_seed, item_id, index)


def png_bytes(image: np.ndarray) -> bytes:
    """PNG encoding of a ``uint8`` image (no metadata, so equal pixels give equal bytes)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def write_bytes(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def frame(rows: list[dict], schema: dict):
    """``rows`` as a DataFrame with exactly ``schema``'s columns and dtypes (also when empty)."""
    import pandas as pd

    df = pd.DataFrame(rows, columns=list(schema))
    return df.astype(schema) if len(df) else pd.DataFrame({k: pd.Series(dtype=v) for k, v in schema.items()})


def shard_bounds(shard: int, size: int) -> tuple[int, int]:
    """``[lo, hi)`` ranks of shard ``shard`` of size ``size``."""
    return shard * size, (shard + 1) * size


def progress_bar(total: int, desc: str, unit: str, enabled: bool):
    """tqdm bar; in a log file (Snakemake's per-shard log) updated at most every 10 s."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled,
                mininterval=1.0 if sys.stderr.isatty() else 10.0)


def torch_threads() -> int | None:
    """CPU threads torch computes with (``torch.get_num_threads``; None when torch is not imported). Batched
    CPU kernels may round differently for another thread count, so shard summaries record it next to the
    batch size."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else None


# --------------------------------------------------------------------------- one writer per shard folder

#: the lock file a running shard job holds in its output folder
LOCK_NAME = ".counterfactory-shard.lock"


class ShardLockedError(CounterFactoryError):
    """Another process is writing the same shard folder."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # exists, owned by another user
        return True
    return True


@contextlib.contextmanager
def shard_lock(out_dir: str | os.PathLike):
    """Hold ``out_dir/.counterfactory-shard.lock`` (pid and host) while a shard job writes ``out_dir``; a
    second job on the same folder stops with :class:`ShardLockedError` instead of racing the first over the
    work cache. A lock left by a killed job (its pid no longer runs on this host) is taken over. Released on
    exit, also on errors and Ctrl-C."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = out_dir / LOCK_NAME
    host = socket.gethostname()
    mine = json.dumps({"pid": os.getpid(), "host": host})
    for attempt in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            try:
                held = json.loads(lock.read_text())
                pid, other = int(held["pid"]), str(held["host"])
            except (OSError, ValueError, KeyError, TypeError):
                pid, other = None, None
            if attempt == 0 and other == host and pid is not None and not _pid_alive(pid):
                log.warning("%s: taking over the lock of process %d, which no longer runs (killed earlier)",
                            lock, pid)
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
                continue
            who = f"process {pid} on {other}" if pid is not None else "an unknown process"
            raise ShardLockedError(
                f"{out_dir}: another run is writing this shard ({who} holds {lock}). Fix: wait for that run to "
                "finish, or give this run another --out-dir; if no such run is alive (e.g. its node failed), "
                f"remove {lock} and rerun") from None
        with os.fdopen(fd, "w") as fh:
            fh.write(mine)
        break
    try:
        yield lock
    finally:
        with contextlib.suppress(OSError):
            if lock.read_text() == mine:
                lock.unlink()


def locks_shard(func: Callable) -> Callable:
    """Decorator: run a stage's shard function (with an ``out_dir`` argument) under :func:`shard_lock`."""
    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        out_dir = signature.bind(*args, **kwargs).arguments["out_dir"]
        with shard_lock(out_dir):
            return func(*args, **kwargs)

    return wrapper


# --------------------------------------------------------------------------- caches


class WorkCache:
    """Per-item cache folders ``root/<item_id>/``; an item is done when its ``done.json`` (written last)
    holds the expected fingerprint and every file of ``require`` exists."""

    def __init__(self, root: str | os.PathLike, require: Sequence[str] = ()):
        self.root = Path(root)
        self.require = tuple(require)
        self.root.mkdir(parents=True, exist_ok=True)

    def dir(self, item_id: str) -> Path:
        return self.root / item_id

    def meta(self, item_id: str) -> dict:
        """The ``done.json`` of a finished item."""
        return json.loads((self.dir(item_id) / "done.json").read_text())

    def is_done(self, item_id: str, key: str) -> bool:
        d = self.dir(item_id)
        try:
            if json.loads((d / "done.json").read_text())["fingerprint"] != key:
                return False
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return all((d / name).is_file() for name in self.require)

    def clear(self, item_id: str) -> None:
        """Remove a partial or stale entry."""
        d = self.dir(item_id)
        if d.exists():
            shutil.rmtree(d)

    def write(self, item_id: str, name: str, data: bytes) -> None:
        write_bytes(self.dir(item_id) / name, data)

    def write_table(self, item_id: str, name: str, table) -> None:
        write_parquet(self.dir(item_id) / name, table)

    def mark_done(self, item_id: str, key: str, meta: dict | None = None) -> None:
        """Write ``done.json`` (``{"fingerprint": key, **meta}``): the item's files must be written before."""
        write_json(self.dir(item_id) / "done.json", {"fingerprint": key, **(meta or {})})

    def remove(self, keep: bool = False) -> None:
        """Delete the whole cache once the shard's outputs are assembled (unless ``keep``)."""
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


class PngKeyCache:
    """Outputs that are their own done-markers: a PNG whose text chunk ``field`` holds the output's key."""

    def __init__(self, field: str):
        self.field = field

    def read(self, path: Path, key: str, size: tuple[int, int], mode: str | None = None) -> dict | None:
        """The PNG's text chunks when ``path`` is a complete PNG (chunks and CRCs verify) of ``size`` (W, H)
        (and ``mode``) whose chunk ``field`` is ``key``; else None."""
        from PIL import Image

        try:
            with Image.open(path) as im:
                if im.format != "PNG" or im.info.get(self.field) != key or im.size != size or (
                        mode is not None and im.mode != mode):
                    return None
                info = dict(im.info)
                im.verify()
            return info
        except (OSError, SyntaxError, ValueError):
            return None

    def write(self, path: Path, image: np.ndarray, key: str, extra: dict[str, str] | None = None) -> None:
        """Write ``image`` (RGB ``uint8``) to ``path`` atomically with chunk ``field`` = ``key`` (then ``extra``)."""
        from PIL import Image, PngImagePlugin

        info = PngImagePlugin.PngInfo()
        info.add_text(self.field, key)
        for name, text in (extra or {}).items():
            info.add_text(name, text)
        with atomic_path(path) as tmp:
            Image.fromarray(image, mode="RGB").save(tmp, format="PNG", pnginfo=info)


# --------------------------------------------------------------------------- the runner


class ShardStage:
    """What a sharded stage supplies to :func:`run_stage` (see the module docstring)."""

    #: regenerate a planned batch whole when any of its items is not cached (plans over all items, so
    #: the batches -- and hence batched-kernel rounding -- are those of an uninterrupted run); else plan
    #: over the items not cached
    whole_batches: bool = False

    def item_id(self, item) -> str:
        return item["item_id"] if isinstance(item, dict) else item.item_id

    def key(self, item) -> str:
        """Fingerprint of everything the item's output depends on."""
        raise NotImplementedError

    def is_done(self, item, key: str) -> bool:
        """Whether the item's cached output carries ``key``."""
        raise NotImplementedError

    def clear(self, item) -> None:
        """Drop a stale or partial cache entry before the item is generated again."""

    def plan(self, items: list) -> list[list]:
        """Batches over ``items`` (default: one item per batch)."""
        return [[it] for it in items]

    def generate(self, batch: list) -> Iterable[tuple[Any, Any]]:
        """Generate one batch; yield ``(item, result)`` for every item the batch completes."""
        raise NotImplementedError

    def store(self, item, key: str, result) -> None:
        """Write one item's result into the cache, its done-marker last."""
        raise NotImplementedError


@dataclass
class RunStats:
    generated: int = 0   # items generated (and stored) this run
    skipped: int = 0     # items found in the cache
    batches: int = 0     # batches generated this run


def run_stage(stage: ShardStage, items: Sequence, *, hook: Callable[[int, str], None] | None = None,
              bar=None, stats: RunStats | None = None) -> RunStats:
    """Generate the items of ``stage`` not in its cache, batch by batch; return the counts.

    ``hook(k, item_id)`` runs after the k-th item generated this run is stored (tests use it to simulate a
    kill). ``stats``: counts to continue (a stage that runs its items window by window)."""
    stats = stats or RunStats()
    items = list(items)
    keys = {stage.item_id(it): stage.key(it) for it in items}
    done = {stage.item_id(it): stage.is_done(it, keys[stage.item_id(it)]) for it in items}
    for i, ok in done.items():
        if ok:
            log.info("%s: cached, skipped", i)
    if stage.whole_batches:
        batches = []
        for batch in stage.plan(items):
            if all(done[stage.item_id(it)] for it in batch):
                stats.skipped += len(batch)
                if bar is not None:
                    bar.update(len(batch))
            else:
                batches.append(batch)
    else:
        todo = [it for it in items if not done[stage.item_id(it)]]
        stats.skipped += len(items) - len(todo)
        if bar is not None:
            bar.update(len(items) - len(todo))
        for it in todo:
            stage.clear(it)
        batches = stage.plan(todo)
    for batch in batches:
        stats.batches += 1
        for item, result in stage.generate(batch):
            item_id = stage.item_id(item)
            if stage.whole_batches:
                stage.clear(item)
            stage.store(item, keys[item_id], result)
            if bar is not None:
                bar.update(1)
            if hook is not None:
                hook(stats.generated, item_id)
            stats.generated += 1
    return stats


# --------------------------------------------------------------------------- assembly and merge


def assemble(out_dir: Path, cache: WorkCache, build: Callable[[Path], tuple[dict[str, Any], dict]], *,
             keep_work: bool = False) -> dict:
    """Build a shard's outputs from its cache: ``build(images)`` fills the temporary ``images/`` folder and
    returns ``({table file: DataFrame}, summary)``; the folder replaces ``out_dir/images`` atomically, the
    tables and ``summary.json`` (last) are written atomically, and the cache is removed unless ``keep_work``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out_dir / "images") as tmp_images:
        tables, summary = build(tmp_images)
    for name, table in tables.items():
        write_parquet(out_dir / name, table)
    write_json(out_dir / "summary.json", summary)
    cache.remove(keep=keep_work)
    return summary


def require_shard_files(shard_dirs: Sequence[str | os.PathLike], files: Sequence[str], missing: str, fix: str) -> None:
    """An input error naming the first of ``files`` missing from a shard folder."""
    for d in map(Path, shard_dirs):
        for name in files:
            if not (d / name).exists():
                raise input_error(d / name, None, missing, fix)


def load_shard_summaries(shard_dirs: Sequence[str | os.PathLike], files: Sequence[str], what: str, rerun: str, *,
                         missing: str = "shard output missing", fix: str | None = None) -> tuple[dict, str | None]:
    """Check that every shard folder holds ``files`` and ``summary.json``; return ``({summary path:
    summary}, config_digest)``. Refuses shards whose recorded ``config_digest`` differ
    (:func:`counterfactory.io.check_digests`)."""
    resolved = [Path(d).resolve() for d in shard_dirs]
    for i, d in enumerate(resolved):
        if d in resolved[:i]:
            raise input_error(shard_dirs[i], None, "shard folder listed twice", "pass each shard folder once")
    require_shard_files(shard_dirs, (*files, "summary.json"), missing, fix or f"rerun that shard's {rerun} job")
    summaries = {str(Path(d) / "summary.json"): json.loads((Path(d) / "summary.json").read_text())
                 for d in shard_dirs}
    return summaries, check_digests(summaries, what, rerun)


def check_shard_plan(summaries: dict[str, dict], out_dir: str | os.PathLike, *, expected: Iterable[int],
                     plan: str, rerun: str, exact: bool = True) -> None:
    """Refuse a merge that lacks shards its plan says exist: ``summaries`` ({shard summary path: summary},
    each with its ``shard`` number) must hold every shard of ``expected`` once (``exact``: and no other;
    ``plan`` describes where the expected numbers come from, e.g. "12 requests in shards of 5")."""
    seen: dict[int, str] = {}
    for label, s in summaries.items():
        number = int(s["shard"])
        if number in seen:
            raise input_error(label, None, f"shard {number} is also in {seen[number]}", "pass each shard folder once")
        seen[number] = label
    expected = set(expected)
    missing = sorted(expected - set(seen))
    extra = sorted(set(seen) - expected) if exact else []
    if missing or extra:
        what = "; ".join(filter(None, [f"shard(s) {missing} missing" if missing else "",
                                       f"shard(s) {extra} not in the plan" if extra else ""]))
        raise input_error(out_dir, None, f"{what} (given {sorted(seen)}; {plan})",
                          f"run {rerun} for the missing shards and pass every shard folder of the run exactly once")


def common_value(summaries: Iterable[dict], key: str):
    """The value of ``key`` shared by every summary, or None when they differ (or none has it)."""
    values = {json.dumps(s.get(key), sort_keys=True) for s in summaries}
    return json.loads(values.pop()) if len(values) == 1 else None


def relative_paths(paths: Iterable[str], shard_dir: Path, out_dir: Path) -> list[str]:
    """Shard-relative paths made relative to ``out_dir`` (merged tables point into the shard folders)."""
    rel = os.path.relpath(shard_dir, out_dir).replace(os.sep, "/")
    return [f"{rel}/{p}" for p in paths]
