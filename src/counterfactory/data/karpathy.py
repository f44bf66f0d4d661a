"""Reader for Karpathy split files (``dataset_coco.json``, ``dataset_flickr30k.json``).

Structure: ``{"images": [{filepath?, filename, imgid, split, sentids, sentences: [{raw, tokens, imgid,
sentid}], cocoid?}], "dataset": "coco"|"flickr30k"}``; splits are train / val / test / restval.
Flickr30k has no ``filepath`` / ``cocoid``.

:func:`load_karpathy` returns one row per sentence (every sentence kept, in file order) with columns
:data:`COLUMNS`: ``image_id`` (``cocoid`` when present, else ``imgid``), ``filename``, ``filepath`` (""
when absent), ``split``, ``sentid``, ``caption`` (the ``raw`` sentence, stripped). Image-level columns are
built once per image and repeated with numpy; only the error path walks records one by one.

An image id used by two records is an error naming both (a later record would silently replace or drop the
earlier one in every per-image table). With ``image_root``, every image of the chosen split(s) must exist as
``image_root/filepath/filename``: a missing one is an error naming the Karpathy file and record, at the step that
reads the file rather than at the first step that opens the image (one folder listing per ``filepath``).

:func:`image_paths` is the one way every reader turns rows into image paths (``image_root/filepath/filename``, the
official layout: COCO's ``filepath`` is ``train2014`` / ``val2014``, Flickr30k has none); a ``filepath`` or
``filename`` that would leave ``image_root`` (``..``, an absolute path) is an error naming the record.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import input_error, missing_input
from ..io import read_table, utf8_lines
from .paths import escapes, join_under
from .coco import read_json

COLUMNS = ["image_id", "filename", "filepath", "split", "sentid", "caption"]
SPLITS = ("train", "val", "test", "restval")
FIX = "fix that record or use the original dataset_coco.json / dataset_flickr30k.json"


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _diagnose(path: Path, images: list, index: list[int] | None = None) -> None:
    """Walk the records and raise for the first bad one (only called when the fast path failed).
    ``index`` gives each record's position in the file when ``images`` is a filtered subset."""
    for k, img in enumerate(images):
        i = index[k] if index is not None else k
        where = f"images[{i}]"
        if not isinstance(img, dict):
            raise input_error(path, where, f"is a JSON {type(img).__name__}, not an object", FIX)
        where += f" ({img['filename']})" if isinstance(img.get("filename"), str) else ""
        for key in ("filename", "split", "sentences"):
            if key not in img:
                raise input_error(path, where, f"missing key {key!r}", FIX)
        image_id = img.get("cocoid", img.get("imgid"))
        if image_id is None:
            raise input_error(path, where, "has neither 'cocoid' nor 'imgid'", FIX)
        if not _is_int(image_id):
            raise input_error(path, where, f"image id {image_id!r} is not an integer", FIX)
        for key in ("filename", "split"):
            if not isinstance(img[key], str):
                raise input_error(path, where, f"{key!r} must be a string, got {img[key]!r}", FIX)
        if not isinstance(img["sentences"], list):
            raise input_error(path, where, "'sentences' is not a list", FIX)
        for j, sent in enumerate(img["sentences"]):
            swhere = f"{where}.sentences[{j}]"
            if not isinstance(sent, dict):
                raise input_error(path, swhere, "is not an object", FIX)
            for key in ("raw", "sentid"):
                if key not in sent:
                    raise input_error(path, swhere, f"missing key {key!r}", FIX)
            if not isinstance(sent["raw"], str):
                raise input_error(path, swhere, f"'raw' must be a string, got {sent['raw']!r}", FIX)
            if not sent["raw"].strip():
                raise input_error(path, swhere, "empty sentence", FIX)
            if not _is_int(sent["sentid"]):
                raise input_error(path, swhere, f"'sentid' {sent['sentid']!r} is not an integer", FIX)


def _check_unique_ids(path: Path, images: list) -> None:
    """Name the first image id (``cocoid``, else ``imgid``) that two records of the file share."""
    seen: dict = {}
    for i, img in enumerate(images):
        if not isinstance(img, dict):
            continue
        image_id = img.get("cocoid", img.get("imgid"))
        if image_id is None or not _is_int(image_id):
            continue
        if image_id in seen:
            j = seen[image_id]
            name = f" ({img['filename']})" if isinstance(img.get("filename"), str) else ""
            key = "cocoid" if "cocoid" in img else "imgid"
            raise input_error(path, f"images[{i}]{name}",
                              f"duplicate {key} {image_id} (also images[{j}]"
                              + (f" ({images[j]['filename']})" if isinstance(images[j].get("filename"), str) else "")
                              + "); one of the two images would be silently dropped",
                              "give every image its own id (remove the duplicate record), or use the original "
                              "dataset_coco.json / dataset_flickr30k.json")
        seen[image_id] = i


def _check_files(path: Path, images: list, index: list[int] | None, image_root: Path) -> None:
    """Every image of ``images`` (already validated) must exist under ``image_root``; one listing per folder."""
    import os

    listed: dict[str, set[str] | None] = {}
    missing = []
    for k, img in enumerate(images):
        fp, fn = img.get("filepath") or "", img["filename"]
        if _escapes(fp) or _escapes(fn):    # refused before anything outside image_root is listed
            i = index[k] if index is not None else k
            join_under(image_root, fp, fn, source=path, record=f"images[{i}] ({fn!r}, filepath {fp!r})",
                       key="image_root")
        if fp not in listed:
            try:
                with os.scandir(image_root / fp) as entries:
                    listed[fp] = {e.name for e in entries}
            except (FileNotFoundError, NotADirectoryError):
                listed[fp] = None
        if listed[fp] is None or fn not in listed[fp]:
            missing.append(k)
    if missing:
        k = missing[0]
        i = index[k] if index is not None else k
        fp, fn = images[k].get("filepath") or "", images[k]["filename"]
        note = "" if listed[fp] is not None else f"; the folder {image_root / fp} does not exist"
        raise input_error(path, f"images[{i}] ({fn})",
                          f"image file {image_root / fp / fn} not found ({len(missing)} of {len(images)} images "
                          f"missing{note})",
                          f"point image_root ({image_root}) at the folder holding <filepath>/<filename> of every "
                          "image of the Karpathy file (e.g. train2014/ and val2014/ for dataset_coco.json), download "
                          "the missing images, or remove their records from the Karpathy file")


def load_karpathy(path: str | Path, split: str | Iterable[str] | None = None,
                  image_root: str | Path | None = None) -> pd.DataFrame:
    """One row per sentence (every sentence kept), optionally only the images of ``split`` (a name or
    several). Columns :data:`COLUMNS`. With ``image_root``, a missing image file is an error (module
    docstring)."""
    path = Path(path)
    doc = read_json(path, "Karpathy split file")
    if not isinstance(doc, dict) or "images" not in doc:
        raise input_error(path, None, "missing top-level key 'images'",
                          "use dataset_coco.json / dataset_flickr30k.json")
    images = doc["images"]
    if not isinstance(images, list):
        raise input_error(path, "images", "is not a list", "use dataset_coco.json / dataset_flickr30k.json")
    try:
        all_splits = [img["split"] for img in images]
    except (KeyError, TypeError):
        _diagnose(path, images)
        raise  # pragma: no cover - _diagnose always raises here
    present = sorted(set(map(str, all_splits)))
    unknown = sorted(set(present) - set(SPLITS))
    if unknown:
        i = next(i for i, s in enumerate(all_splits) if str(s) in unknown)
        raise input_error(path, f"images[{i}]", f"unknown split {all_splits[i]!r}", f"splits are {', '.join(SPLITS)}")
    if split is not None:
        wanted = {split} if isinstance(split, str) else set(split)
        bad = sorted(wanted - set(SPLITS))
        if bad:
            raise input_error(path, None, f"no such split {bad[0]!r}", f"use one of {', '.join(SPLITS)}")
        index = [i for i, s in enumerate(all_splits) if s in wanted]
        images = [images[i] for i in index]
        if not images:
            raise input_error(path, None, f"no images in split {split!r} (the file has {', '.join(present) or 'none'})",
                              "use one of train, val, test, restval that the file contains")
    else:
        index = None
    try:
        counts = np.fromiter((len(img["sentences"]) for img in images), dtype=np.int64, count=len(images))
        raw = [s["raw"] for img in images for s in img["sentences"]]
        sentid = np.asarray([s["sentid"] for img in images for s in img["sentences"]])
        image_id = np.asarray([img["cocoid"] if "cocoid" in img else img["imgid"] for img in images])
        filename = [img["filename"] for img in images]
        split_col = [img["split"] for img in images]
        if (sentid.dtype.kind not in "iu" and len(sentid)) or (image_id.dtype.kind not in "iu" and len(image_id)) \
                or not all(isinstance(v, str) for v in filename) or not all(isinstance(v, str) for v in split_col):
            _diagnose(path, images, index)
        frame = pd.DataFrame({
            "image_id": np.repeat(image_id.astype(np.int64), counts),
            "filename": np.repeat(np.asarray(filename, dtype=object), counts),
            "filepath": np.repeat(np.asarray([img.get("filepath", "") for img in images], dtype=object), counts),
            "split": np.repeat(np.asarray(split_col, dtype=object), counts),
            "sentid": sentid.astype(np.int64),
            "caption": pd.Series(raw).str.strip(),
        }, columns=COLUMNS)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        _diagnose(path, images, index)
        raise
    if (frame["caption"].isna() | (frame["caption"] == "")).any():
        _diagnose(path, images, index)
    _check_unique_ids(path, doc["images"])
    if image_root is not None:
        _check_files(path, images, index, Path(image_root))
    return frame


def _escapes(part: str) -> bool:
    return escapes(part)


def image_paths(table: pd.DataFrame, image_root: str | Path, source: str | Path = "Karpathy split file") -> list[str]:
    """``image_root/filepath/filename`` of every row of a :func:`load_karpathy` table (the official layout). A
    ``filepath`` or ``filename`` with ``..`` or an absolute path is refused (it would read outside ``image_root``)."""
    root = Path(image_root)
    out = []
    cache: dict[tuple[str, str], str] = {}
    for fp, fn in zip(table["filepath"], table["filename"]):
        key = (fp or "", fn)
        if key not in cache:
            if _escapes(key[0]) or _escapes(fn):
                join_under(root, key[0], fn, source=source, record=f"image {fn!r} (filepath {fp!r})",
                           key="image_root")
            cache[key] = str(root / key[0] / fn) if key[0] else str(root / fn)
        out.append(cache[key])
    return out



#: images per split a layout check looks up (preflight and the DAG's input functions)
SAMPLE_PER_SPLIT = 20


@functools.lru_cache(maxsize=8)
def _summary(path: str, mtime_ns: int, size: int) -> dict | None:
    try:
        images = json.loads(Path(path).read_text(encoding="utf-8"))["images"]
        counts: dict[str, int] = {}
        samples: dict[str, list[tuple[str, str]]] = {}
        for img in images:
            split = str(img.get("split"))
            counts[split] = counts.get(split, 0) + 1
            if len(samples.setdefault(split, [])) < SAMPLE_PER_SPLIT:
                samples[split].append((str(img.get("filepath") or ""), str(img["filename"])))
        return {"counts": counts, "samples": samples}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def summary(path: str | Path) -> dict | None:
    """``{"counts": {split: images}, "samples": {split: [(filepath, filename), ...]}}`` of a Karpathy file (the
    first :data:`SAMPLE_PER_SPLIT` images of each split), read once per file version (the real dataset_coco.json is
    about 150 MB and several studies read it); None when the file is missing or not readable as one."""
    p = Path(path)
    if not p.is_file():
        return None
    p = p.resolve()
    st = p.stat()
    return _summary(str(p), st.st_mtime_ns, st.st_size)


def layout_problem(path: str | Path, image_root: str | Path, splits: Iterable[str] | None = None) -> str | None:
    """Why the images of a Karpathy file are not where the workflow will open them (``image_root/filepath/filename``,
    checked on a sample of each split read); None when the sample is in place or the file cannot be read (its own
    check says so)."""
    info = summary(path)
    if info is None:
        return None
    root = Path(image_root)
    wanted = list(splits) if splits else list(info["samples"])
    missing, looked, example = 0, 0, None
    for split in wanted:
        for fp, fn in info["samples"].get(split, []):
            if _escapes(fp) or _escapes(fn):
                return (f"{path}: image {fn!r} (filepath {fp!r}) leaves image_root {root}; give paths relative to "
                        "it, without '..'")
            looked += 1
            target = root / fp / fn if fp else root / fn
            if not target.is_file():
                missing += 1
                example = example or target
    if not missing:
        return None
    folders = sorted({fp for split in wanted for fp, _ in info["samples"].get(split, []) if fp})
    expect = (f"{root}/{{{','.join(folders)}}}/<filename>" if folders else f"{root}/<filename>")
    return (f"{missing} of {looked} sampled images of split(s) {', '.join(wanted)} not found, e.g. {example}; the "
            f"split file's layout is {expect} (image_root holds the split file's filepath folders)")


def training_captions(path: str | Path) -> list[str]:
    """The training captions a VSE++ vocabulary is built from: a Karpathy split file (``.json``; its train and
    restval captions, §4.1), a CSV / parquet table with a ``caption`` column (a ``split`` column keeps its train
    rows) or a text file with one caption per line (blank lines skipped). A missing or unreadable file is an
    :class:`~counterfactory.errors.InputError` naming it."""
    fix = ("give a Karpathy split file (dataset_coco.json), a CSV / parquet table with a caption column, or a text "
           "file with one caption per line")
    path = str(path)
    if path.lower().endswith(".json"):   # the Karpathy file: the training captions are train + restval (§4.1)
        frame = load_karpathy(path)
        return frame.loc[frame["split"].isin(["train", "restval"]), "caption"].astype(str).tolist()
    if path.lower().endswith((".csv", ".parquet")):
        frame = read_table(path, "VSE++ training captions", fix, columns=("caption",))
        if "split" in frame.columns:   # a training manifest: its train rows
            frame = frame[frame["split"] == "train"]
        return frame["caption"].astype(str).tolist()
    if not Path(path).is_file():
        raise missing_input(path, "VSE++ training captions", fix)
    return [line.strip() for _, line in utf8_lines(path) if line.strip()]
