"""Readers of the published releases, so that our evaluations and probes run on them unchanged.

* :func:`read_coco_counterfactuals` — Intel/COCO-Counterfactuals (the Hugging Face dataset's layout):
  ``data/examples.jsonl`` (``id`` a string, ``caption_0``, ``caption_1``, ``image_0``, ``image_1`` = file
  stems) and the images as ``data/images.zip`` (the loading script's first version joined
  ``images/<stem>.jpg``, its later commit 22a3b9c ``<stem>.jpg``; both are found) or an extracted folder
  ``data/images/``. Rows come in the schema of the image stage's ``selected_pairs.parquet``
  (:data:`counterfactory.generation.shards.SELECTED_SCHEMA`), which ``evaluate itr`` / ``itm``, ``train
  mixtures``, ``in-domain-split`` and ``report pair-grid`` read.
* :func:`read_coco_counterfactual_captions` — the caption-only release
  ``coco_counterfactuals_captions.jsonl`` (``coco-counterfactual-index``, ``original_caption``,
  ``counterfactual_caption``), in the caption stage's accepted-pairs schema
  (:data:`counterfactory.text.caption_stage.ACCEPTED_COLUMNS`), so the image stage can run on it.
* :func:`read_social_counterfactuals` — Intel/SocialCounterfactuals (B12): parquet shards
  ``data/train-NNNNN-of-MMMMM[-<hash>].parquet`` with ``image`` (``datasets`` Image feature: a struct of
  ``bytes`` and ``path``), ``caption``, ``counterfactual_set``, ``a1_type``, ``a1``, ``a2_type``, ``a2``,
  ``a1a2``, read with pyarrow one batch at a time (the release is large); the images are written to a
  local folder and the rows come in the schema of the social study's kept-images table (``filter/kept.parquet``),
  which ``social probe``, ``debias-split``/``debias-run`` and ``social release`` read. The extra fields of
  our own export (:mod:`counterfactory.export.social_release`: ``a3_type``, ``a3``,
  ``segment``, ``subject``, ``member_index``) are used when present.

What the releases do not carry is filled as follows (documented choices, not data):

* COCO-CF: ``caption_id`` = ``id``; ``source_index`` = line number (0-based); ``image_id`` = the
  ``<cocoImageId>`` of an id ``<cocoImageId>_<captionIndex>`` (else null: the evaluation then looks the id up in
  the caption table); ``original_word`` / ``new_word`` = the one word that differs between the captions
  (null when more or fewer than one word differ); ``rank`` = 0 (the release holds one pair per caption, the
  selected one, §3.2); ``candidate_index``, ``seed`` = null; ``p``, ``guidance`` and the four CLIP scores = NaN.
  No consumer reads the scores except ``report pair-grid``, which prints NaN.
* SocialCounterfactuals: ``set_id`` = ``counterfactual_set``; ``candidate_index`` = 0; ``member_index`` =
  the row's position in its set (release order) unless given; ``segment`` = the attribute types joined by
  "_" (``race_gender``, as Table 1 and ``debias.lr`` name them); ``subject`` = ``caption.split(a2 + " ")[1]``
  (B12) unless given; ``prefix`` = the caption's text before the attribute values, with a final "an" read as
  "a" (the caption step's article agreement, §3.2, so one prefix per set); ``seed`` null, ``p``, ``guidance`` NaN.

Every problem raises :class:`~counterfactory.errors.InputError` naming the file, the record and the fix.
"""

from __future__ import annotations

import difflib
import io
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from ..errors import input_error, missing_input
from ..io import atomic_dir, utf8_lines, write_parquet
from .layouts import ACCEPTED_COLUMNS, SELECTED_SCHEMA
from .paths import join_under

#: keys of ``data/examples.jsonl`` (B11)
COCO_FIELDS = ("id", "caption_0", "caption_1", "image_0", "image_1")
#: keys of the caption-only release (B11)
CAPTION_FIELDS = ("coco-counterfactual-index", "original_caption", "counterfactual_caption")
#: fields a SocialCounterfactuals shard must have (``a1a2`` is recomputed when absent)
SOCIAL_REQUIRED = ("image", "caption", "counterfactual_set", "a1_type", "a1", "a2_type", "a2")
#: the kept-images table's columns, in the order the filter stage writes them
KEPT_COLUMNS = ("set_id", "candidate_index", "member_index", "seed", "p", "guidance", "caption", "segment", "prefix",
                "subject", "a1_type", "a1", "a2_type", "a2", "a3_type", "a3", "image_path")
IMAGE_EXTENSION = ".jpg"   # the COCO-CF loading script's IMAGE_EXTENSION
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
_STEM = re.compile(r"^[A-Za-z0-9_.-]+$")
_COCO_ID = re.compile(r"^(\d+)_(\d+)$")
_SHARD = re.compile(r"^train-(\d{5})-of-(\d{5})(?:-[A-Za-z0-9_]+)?\.parquet$")
_FORMATS = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp", "BMP": ".bmp", "GIF": ".gif", "TIFF": ".tif"}
_WORD = re.compile(r"[A-Za-z0-9'-]+")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def changed_word(original: str, counterfactual: str) -> tuple[str | None, str | None, int]:
    """The one word replaced between two captions (``original_word``, ``new_word``, its word position),
    compared case-insensitively without punctuation; ``(None, None, -1)`` unless exactly one word differs."""
    a, b = _WORD.findall(str(original)), _WORD.findall(str(counterfactual))
    ops = [op for op in difflib.SequenceMatcher(a=[w.lower() for w in a], b=[w.lower() for w in b],
                                                autojunk=False).get_opcodes() if op[0] != "equal"]
    if len(ops) == 1 and ops[0][0] == "replace" and ops[0][2] - ops[0][1] == 1 and ops[0][4] - ops[0][3] == 1:
        return a[ops[0][1]], b[ops[0][3]], ops[0][1]
    return None, None, -1


def _read_jsonl(path: Path, fields: tuple[str, ...], what: str, fix: str) -> list[dict]:
    """Records of a JSON-lines file with every key of ``fields`` (blank lines skipped); line numbers from 1."""
    if not path.is_file():
        raise missing_input(path, what, fix)
    out = []
    for n, line in utf8_lines(path, "re-download the release (the file is damaged or not UTF-8 text)"):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise input_error(path, f"line {n}", f"not valid JSON ({exc.msg} at column {exc.colno})",
                              "repair or re-download the file (one JSON object per line)") from exc
        if not isinstance(rec, dict):
            raise input_error(path, f"line {n}", f"a {type(rec).__name__}, not a JSON object",
                              "one JSON object per line")
        missing = [k for k in fields if k not in rec]
        if missing:
            raise input_error(path, f"line {n}", f"missing field(s) {', '.join(missing)}",
                              f"every line needs {', '.join(fields)} ({what} layout of Intel/COCO-Counterfactuals)")
        rec["_line"] = n
        out.append(rec)
    if not out:
        raise input_error(path, None, "no records", "re-download the release; the file is empty")
    return out


def _text_field(path: Path, rec: dict, key: str, allow_int: bool = False) -> str:
    value = rec[key]
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise input_error(path, f"line {rec['_line']}", f"{key} {value!r} is not a non-empty string",
                          f"give every record a {key}")
    return value


def _place(paths, relative_to=None, staged: Path | None = None, final: Path | None = None) -> list[str]:
    """Image paths as the table stores them: relative to ``relative_to`` when given, else absolute; a path under
    ``staged`` (a folder being built) is given as it will read once ``staged`` has become ``final``."""
    out = []
    for p in paths:
        p = Path(p).resolve()
        if staged is not None and p.is_relative_to(staged.resolve()):
            p = Path(final).resolve() / p.relative_to(staged.resolve())
        out.append((p if relative_to is None else Path(os.path.relpath(p, Path(relative_to).resolve()))).as_posix())
    return out


def _check_image(data: bytes, where: Path, record, fix: str) -> str:
    """The image format's file suffix; an InputError when the bytes are not a readable image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = im.format
            im.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise input_error(where, record, f"the image is not readable ({exc})", fix) from exc
    return _FORMATS.get(fmt or "", IMAGE_EXTENSION)


# --------------------------------------------------------------------------------------------
# COCO-Counterfactuals
# --------------------------------------------------------------------------------------------
class _CocoImages:
    """The release's images: ``data/images.zip`` (either path convention, or any folder inside it) or an
    extracted folder ``data/images/`` (``<stem>.jpg`` or ``images/<stem>.jpg`` under it)."""

    def __init__(self, root: Path):
        data = root / "data"
        self.zip_path = data / "images.zip"
        self.folder = data / "images"
        self.zip: zipfile.ZipFile | None = None
        if self.zip_path.is_file():
            try:
                self.zip = zipfile.ZipFile(self.zip_path)
            except zipfile.BadZipFile as exc:
                raise input_error(self.zip_path, None, f"not a readable zip file ({exc})",
                                  "re-download data/images.zip (6.36 GB) or unzip it into data/images/") from exc
            self.index: dict[str, tuple[int, str]] = {}
            for name in self.zip.namelist():
                stem, suffix = os.path.splitext(name.rsplit("/", 1)[-1])
                if name.endswith("/") or suffix.lower() not in _IMAGE_SUFFIXES:
                    continue
                # the script's conventions first: `<stem>.jpg` at the top, then `images/<stem>.jpg`, then any
                rank = {f"{stem}{IMAGE_EXTENSION}": 0, f"images/{stem}{IMAGE_EXTENSION}": 1}.get(name, 2)
                if stem not in self.index or rank < self.index[stem][0]:
                    self.index[stem] = (rank, name)
        elif not self.folder.is_dir():
            raise missing_input(self.zip_path, "COCO-Counterfactuals images (data/images.zip or data/images/)",
                                "download data/images.zip of Intel/COCO-Counterfactuals into the release's data/ "
                                "folder (or unzip it into data/images/)")

    @property
    def where(self) -> Path:
        return self.zip_path if self.zip is not None else self.folder

    def find(self, stem: str) -> str | Path | None:
        """The zip member or file of ``stem`` (``.jpg`` preferred), None if absent."""
        if self.zip is not None:
            hit = self.index.get(stem)
            return hit[1] if hit else None
        for base in (self.folder, self.folder / "images"):
            for suffix in (IMAGE_EXTENSION, *_IMAGE_SUFFIXES):
                if (base / f"{stem}{suffix}").is_file():
                    return base / f"{stem}{suffix}"
        return None

    def read(self, ref: str | Path) -> bytes:
        return self.zip.read(ref) if self.zip is not None else Path(ref).read_bytes()

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()


def read_coco_counterfactuals(root: str | os.PathLike, images: str | os.PathLike | None = None, *,
                              relative_to: str | os.PathLike | None = None, verify: bool = True) -> pd.DataFrame:
    """Intel/COCO-Counterfactuals under ``root`` as the image stage's selected pairs
    (:data:`~counterfactory.generation.shards.SELECTED_SCHEMA`; module docstring: what the release lacks).

    ``images``: folder the pairs' images are copied to (from ``data/images.zip``, or from ``data/images/``);
    None reads an extracted ``data/images/`` in place (an error when only the zip is there). Image paths are
    relative to ``relative_to`` when given, else absolute. ``verify`` opens every image (a truncated or
    non-image file is an error naming its record)."""
    root = Path(root)
    examples = root / "data" / "examples.jsonl"
    fix_dl = "download Intel/COCO-Counterfactuals (data/examples.jsonl and data/images.zip) into the release folder"
    records = _read_jsonl(examples, COCO_FIELDS, "COCO-Counterfactuals examples", fix_dl)
    source = _CocoImages(root)
    if source.zip is not None and images is None:
        source.close()
        raise input_error(source.zip_path, None, "the images are in the zip and no folder to extract them to was given",
                          "give a folder to extract them to (images=; the CLI does unless --in-place), or unzip "
                          "data/images.zip into data/images/ to read them in place")
    out_dir = None if images is None else Path(images)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    rows, seen = [], {}
    try:
        for i, rec in enumerate(records):
            line = f"line {rec['_line']}"
            pid = _text_field(examples, rec, "id", allow_int=True)
            if pid in seen:
                raise input_error(examples, line, f"id {pid!r} repeats line {seen[pid]}", "ids must be unique")
            seen[pid] = rec["_line"]
            row = {"id": pid, "caption_0": _text_field(examples, rec, "caption_0"),
                   "caption_1": _text_field(examples, rec, "caption_1")}
            for col in ("image_0", "image_1"):
                stem = _text_field(examples, rec, col)
                stem = stem[: -len(IMAGE_EXTENSION)] if stem.lower().endswith(IMAGE_EXTENSION) else stem
                if not _STEM.match(stem):
                    raise input_error(examples, line, f"{col} {stem!r} is not a file stem ([A-Za-z0-9_.-])",
                                      "image fields name files without folder, e.g. 236308_0_img_0")
                ref = source.find(stem)
                if ref is None:
                    raise input_error(source.where, f"{col} of id {pid} ({examples.name} {line})",
                                      f"no image {stem}{IMAGE_EXTENSION} (looked for {stem}{IMAGE_EXTENSION} and "
                                      f"images/{stem}{IMAGE_EXTENSION})",
                                      "re-download data/images.zip, or drop that record from data/examples.jsonl")
                row[col] = ref
                if out_dir is None and not verify:
                    continue
                data = source.read(ref)
                suffix = (_check_image(data, source.where, f"{col} of id {pid} ({ref})", "re-download the images")
                          if verify else os.path.splitext(str(ref))[1])
                if out_dir is not None:
                    row[col] = out_dir / f"{stem}{suffix}"
                    row[col].write_bytes(data)
            orig_word, new_word, _ = changed_word(row["caption_0"], row["caption_1"])
            m = _COCO_ID.match(pid)
            rows.append({**row, "caption_id": pid, "source_index": i, "image_id": m.group(1) if m else None,
                         "original_word": orig_word, "new_word": new_word, "rank": 0})
    finally:
        source.close()
    frame = pd.DataFrame(rows)
    for col in ("image_0", "image_1"):
        frame[col] = _place(frame[col], relative_to)
    for col in ("candidate_index", "seed"):
        frame[col] = pd.array([pd.NA] * len(frame), dtype="Int64" if col == "candidate_index" else "UInt64")
    for col in ("p", "guidance", "sim_0", "sim_1", "sim_image", "sim_direction"):
        frame[col] = np.nan
    return frame[list(SELECTED_SCHEMA)].astype({"source_index": "int64", "rank": "int64"})


def write_coco_release_pairs(root: str | os.PathLike, out: str | os.PathLike,
                             images: str | os.PathLike | None = None, *, in_place: bool = False) -> dict:
    """Write the release as ``out`` (a ``selected_pairs.parquet``) with its images in ``images`` (default
    ``<out folder>/release``, replaced as a whole), paths relative to ``out``'s folder as the image stage
    writes them; ``in_place`` keeps an extracted ``data/images/`` where it is (absolute paths). Returns counts."""
    out = Path(out)
    final = Path(images) if images is not None else out.parent / "release"
    if in_place:
        frame = read_coco_counterfactuals(root, None)
        final.mkdir(parents=True, exist_ok=True)   # the rule's declared folder exists, empty
    else:
        with atomic_dir(final) as tmp:
            frame = read_coco_counterfactuals(root, tmp)
            for col in ("image_0", "image_1"):
                frame[col] = _place(frame[col], out.parent, tmp, final)
    write_parquet(out, frame)
    return {"pairs": int(len(frame)), "images": 2 * int(len(frame)),
            "with_changed_word": int(frame["original_word"].notna().sum()), "images_dir": str(final)}


def read_coco_counterfactual_captions(path: str | os.PathLike) -> pd.DataFrame:
    """The caption-only release (``coco_counterfactuals_captions.jsonl``) as the caption stage's accepted pairs
    (:data:`~counterfactory.data.layouts.ACCEPTED_COLUMNS`): ``caption_id`` = the index, ``source_index`` =
    line number (0-based), ``image_id`` from the ``<cocoImageId>_<captionIndex>`` index, the changed word and its
    word position from the captions (:func:`changed_word`), ``similarity`` / ``perplexity`` NaN."""
    path = Path(path)
    records = _read_jsonl(path, CAPTION_FIELDS, "COCO-Counterfactuals caption release",
                          "download coco_counterfactuals_captions.jsonl (IntelLabs/multimodal_cognitive_ai, "
                          "COCO-Counterfactuals/coco-counterfactuals/) and pass its path")
    rows, seen = [], {}
    for i, rec in enumerate(records):
        cid = _text_field(path, rec, CAPTION_FIELDS[0], allow_int=True)
        if not _STEM.match(cid):
            raise input_error(path, f"line {rec['_line']}", f"index {cid!r} is not a [A-Za-z0-9_.-] id",
                              "ids name image files; fix the index")
        if cid in seen:
            raise input_error(path, f"line {rec['_line']}", f"index {cid!r} repeats line {seen[cid]}",
                              "indexes must be unique")
        seen[cid] = rec["_line"]
        original, counterfactual = (_text_field(path, rec, k) for k in CAPTION_FIELDS[1:])
        old, new, pos = changed_word(original, counterfactual)
        m = _COCO_ID.match(cid)
        rows.append({"caption_id": cid, "source_index": i, "image_id": m.group(1) if m else None,
                     "original": original, "counterfactual": counterfactual, "original_word": old or "",
                     "new_word": new or "", "position": pos, "similarity": np.nan, "perplexity": np.nan})
    return pd.DataFrame(rows, columns=ACCEPTED_COLUMNS).astype({"source_index": "int64", "position": "int64"})


# --------------------------------------------------------------------------------------------
# SocialCounterfactuals
# --------------------------------------------------------------------------------------------
def social_shards(root: str | os.PathLike, partial: bool = False) -> list[Path]:
    """The parquet shards ``<root>/data/train-NNNNN-of-MMMMM[-<hash>].parquet``, checked to be complete
    (every number below MMMMM, one MMMMM) unless ``partial``."""
    data = Path(root) / "data"
    fix = ("download Intel/SocialCounterfactuals (`hf download Intel/SocialCounterfactuals --repo-type dataset "
           "--local-dir DIR`) and pass DIR")
    if not data.is_dir():
        raise missing_input(data, "SocialCounterfactuals data folder", fix)
    files = sorted(p for p in data.iterdir() if _SHARD.match(p.name))
    if not files:
        raise input_error(data, None, "no train-NNNNN-of-MMMMM*.parquet shard", fix)
    numbers = sorted(int(_SHARD.match(p.name).group(1)) for p in files)
    totals = {int(_SHARD.match(p.name).group(2)) for p in files}
    if len(totals) > 1:
        raise input_error(data, None, f"shards of different releases ('of' counts {sorted(totals)})",
                          "keep the shards of one download only")
    missing = sorted(set(range(totals.pop())) - set(numbers))
    if len(numbers) != len(set(numbers)):
        raise input_error(data, None, "a shard number appears twice", "keep one file per shard number")
    if missing and not partial:
        raise input_error(data, None, f"{len(missing)} shard(s) missing (numbers {missing[:5]}"
                                      f"{'...' if len(missing) > 5 else ''})",
                          "download every shard, or read the ones present with partial=True (CLI: --partial)")
    return files


def _batches(path: Path) -> Iterator[tuple[int, list[dict]]]:
    """(first row, rows) of one shard, a few hundred rows at a time."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types
        raise input_error(path, None, f"not a readable parquet file ({exc})", "re-download this shard") from exc
    missing = [c for c in SOCIAL_REQUIRED if c not in pf.schema_arrow.names]
    if missing:
        raise input_error(path, None, f"missing field(s) {', '.join(missing)} (has {', '.join(pf.schema_arrow.names)})",
                          f"pass the Intel/SocialCounterfactuals parquet release (fields {', '.join(SOCIAL_REQUIRED)})")
    start = 0
    for batch in pf.iter_batches(batch_size=256):
        rows = batch.to_pylist()
        yield start, rows
        start += len(rows)


def _value(v) -> str:
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v).strip()


def read_social_counterfactuals(root: str | os.PathLike, images: str | os.PathLike, *,
                                relative_to: str | os.PathLike | None = None, partial: bool = False) -> pd.DataFrame:
    """Intel/SocialCounterfactuals under ``root`` as the kept-images table (:data:`KEPT_COLUMNS`; module
    docstring: what the release lacks); the images are written to ``images/<shard>/<row><ext>``. Image paths are
    relative to ``relative_to`` when given, else absolute. ``partial`` reads an incomplete download."""
    out_dir = Path(images)
    rows = []
    for shard in social_shards(root, partial):
        number = int(_SHARD.match(shard.name).group(1))
        folder = out_dir / f"{number:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        for start, batch in _batches(shard):
            for j, rec in enumerate(batch):
                where = f"row {start + j}"
                img = rec["image"]
                data = img.get("bytes") if isinstance(img, dict) else None
                if not data and isinstance(img, dict) and img.get("path"):
                    ref = join_under(root, img["path"], source=shard, record=where, key="the release folder")
                    data = ref.read_bytes() if ref.is_file() else None
                if not data:
                    raise input_error(shard, where, "the image has no bytes (and no readable path)",
                                      "re-download this shard")
                suffix = _check_image(data, shard, where, "re-download this shard")
                target = folder / f"{start + j:06d}{suffix}"
                target.write_bytes(data)
                row = {k: _value(rec.get(k)) for k in ("caption", "counterfactual_set", "a1_type", "a1", "a2_type",
                                                       "a2", "a3_type", "a3", "segment", "subject")}
                row.update(member_index=rec.get("member_index"), image_path=target, _where=(shard, where))
                rows.append(row)
    return _kept_table(rows, relative_to)


def _kept_table(rows: list[dict], relative_to) -> pd.DataFrame:
    """Check the release rows and fill in the kept-images columns the release lacks."""
    fix_pair = "every row needs non-empty caption, counterfactual_set, a1_type, a1, a2_type and a2"
    sets: dict[str, list[dict]] = {}
    for row in rows:
        shard, where = row["_where"]
        for key in ("caption", "counterfactual_set", "a1_type", "a1", "a2_type", "a2"):
            if not row[key]:
                raise input_error(shard, where, f"empty {key}", fix_pair)
        if bool(row["a3_type"]) != bool(row["a3"]):
            raise input_error(shard, where, "a3_type and a3 must both be set or both be empty", "fill in both")
        values = [v for v in (row["a1"], row["a2"], row["a3"]) if v]
        phrase = " ".join(values)
        caption = " ".join(row["caption"].split())
        m = re.search(rf"(^|\s){re.escape(phrase)}(\s|$)", caption)
        if not m:
            raise input_error(shard, where, f"caption {caption!r} does not contain its attribute values {phrase!r}",
                              "check that a1/a2 belong to the caption (template <prefix> <a1> <a2> <subject>, B12)")
        prefix = caption[: m.start() + len(m.group(1))].strip()
        row["prefix"] = re.sub(r"(^|\s)([Aa])n$", r"\1\2", prefix)
        row["subject"] = row["subject"] or caption[m.end():].strip()
        if not row["subject"]:
            raise input_error(shard, where, f"caption {caption!r} names no subject after {phrase!r}",
                              "captions follow <prefix> <a1> <a2> <subject> (B12)")
        types = [t for t in (row["a1_type"], row["a2_type"], row["a3_type"]) if t]
        row["segment"] = row["segment"] or "_".join(types)
        row["set_id"] = row["counterfactual_set"]
        sets.setdefault(row["set_id"], []).append(row)
    for set_id, members in sets.items():
        first = members[0]
        for pos, row in enumerate(members):
            shard, where = row["_where"]
            if row["member_index"] is None:
                row["member_index"] = pos
            if (row["segment"], row["subject"]) != (first["segment"], first["subject"]):
                raise input_error(shard, where, f"set {set_id!r} mixes segments or subjects "
                                                f"({first['segment']}/{first['subject']} vs {row['segment']}/"
                                                f"{row['subject']})", "one set holds one subject's attribute variants")
        dup = pd.Series([r["member_index"] for r in members]).duplicated()
        dup_values = pd.Series([(r["a1"], r["a2"], r["a3"]) for r in members]).duplicated()
        for flags, what in ((dup, "member_index"), (dup_values, "attribute values")):
            if flags.any():
                shard, where = members[int(flags.idxmax())]["_where"]
                raise input_error(shard, where, f"set {set_id!r} has the same {what} twice",
                                  "keep one image per attribute combination")
    frame = pd.DataFrame(rows)
    frame["image_path"] = _place(frame["image_path"], relative_to)
    frame["candidate_index"] = 0
    frame["member_index"] = frame["member_index"].astype("int64")
    frame["seed"] = pd.array([pd.NA] * len(frame), dtype="UInt64")
    frame["p"] = np.nan
    frame["guidance"] = np.nan
    return frame[list(KEPT_COLUMNS)].astype({"candidate_index": "int64"})


def write_social_release_images(root: str | os.PathLike, out: str | os.PathLike,
                                images: str | os.PathLike | None = None, *, partial: bool = False) -> dict:
    """Write the release as the kept-images table ``out`` with its images in ``images`` (default
    ``<out folder>/release_images``, replaced as a whole), paths relative to ``out``'s folder. Returns counts."""
    out = Path(out)
    final = Path(images) if images is not None else out.parent / "release_images"
    with atomic_dir(final) as tmp:
        frame = read_social_counterfactuals(root, tmp, partial=partial)
        frame["image_path"] = _place(frame["image_path"], out.parent, tmp, final)
    write_parquet(out, frame)
    return {"images": int(len(frame)), "sets": int(frame["set_id"].nunique()),
            "segments": {str(k): int(v) for k, v in frame.groupby("segment")["set_id"].nunique().items()},
            "subjects": int(frame["subject"].nunique()), "images_dir": str(final)}


# --------------------------------------------------------------------------------------------
# workflow
# --------------------------------------------------------------------------------------------
def release_inputs(kind: str, root: str | os.PathLike) -> list[Path]:
    """The files a release-reading job depends on (its rule inputs): ``coco`` -- ``data/examples.jsonl`` and
    ``data/images.zip`` (else the extracted ``data/images/``); ``social`` -- every shard (an InputError when
    shards are missing). A path that does not exist is returned as it is, for the rule to name its config key."""
    data = Path(root) / "data"
    if kind == "coco":
        return [data / "examples.jsonl", data / "images.zip" if (data / "images.zip").exists() else data / "images"]
    if kind == "social":
        return social_shards(root) if data.is_dir() else [data]
    raise ValueError(f"release_inputs: unknown kind {kind!r} (coco or social)")
