"""Dataset writers: the published release layouts and a generic Hugging Face layout for every study.

Every writer replaces its output folder as a whole (:func:`counterfactory.io.atomic_dir`) and returns a
manifest (files, rows per config and split), also written to ``manifest_path`` -- outside the folder, so the
folder holds only what a user uploads to the Hub (the workflow keeps them in ``<study>/manifests/``); without it,
as ``manifest.json`` in the folder. The dataset card (:mod:`.cards`) and the examples grid read those manifests.
Field names follow the published releases:

* :func:`write_imagefolder` -- ``datasets`` ``imagefolder`` layout: ``<config>/<split>/metadata.jsonl`` (or
  ``metadata.parquet`` where JSON cannot keep the splits' types equal) with
  ``file_name`` (one image column) or ``<column>_file_name`` (several) and the other fields, the images
  beside it under ``<column>/``;
* :func:`write_parquet` -- the same rows as parquet with the images embedded (``{"bytes", "path"}`` structs,
  declared as ``datasets.Image`` in the schema metadata, so ``load_dataset("parquet", ...)`` decodes them), each
  split streamed into shards of bounded size (``<split>-0000K-of-0000N.parquet``);
* :func:`write_coco_counterfactuals` -- Intel/COCO-Counterfactuals (B11): ``data/examples.jsonl`` with ``id``
  (string), ``image_0``, ``image_1`` (file stems), ``caption_0``, ``caption_1``; the images as
  ``data/images/<stem><ext>``; and the caption-only release ``coco_counterfactuals_captions.jsonl``
  (``coco-counterfactual-index``, ``original_caption``, ``counterfactual_caption``);
* :func:`write_countercurate` -- CounterCurate's evaluation TSVs (A8: ``captions, images, neg_captions,
  neg_images``), one per dataset (positions also per subset LR / AB and split), the images under ``images/``;
* SocialCounterfactuals (B12) is written by :func:`counterfactory.export.social_release.
  export_release` (reused as it is; see :func:`write_social_counterfactuals`).

Values that JSON cannot hold unchanged: numpy arrays become lists, NaN becomes null, and unsigned 64-bit
integers (generation seeds above 2**63) become decimal strings in the JSON/TSV layouts (the parquet layout
keeps ``uint64``).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..errors import InputError, input_error
from ..io import atomic_dir, write_json
from .social_release import RELEASE_FIELDS, export_release

MANIFEST = "manifest.json"
#: file-name-safe version of an item id
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class ExportTable:
    """Rows of one dataset config. ``images``: columns holding image file paths (absolute, or relative to
    ``base``; empty/None = no image); ``id_column``: unique item id (names the image files); ``split_column``:
    rows go to one split per value (else all to ``default_split``)."""

    config: str
    rows: pd.DataFrame
    images: tuple[str, ...]
    id_column: str
    split_column: str | None = None
    default_split: str = "train"
    base: Path | None = None
    description: dict[str, str] = field(default_factory=dict)   # column -> meaning (for the card)

    def splits(self) -> list[tuple[str, pd.DataFrame]]:
        if self.split_column is None or self.split_column not in self.rows.columns:
            return [(self.default_split, self.rows)]
        return [(str(s), g) for s, g in self.rows.groupby(self.split_column, sort=True)]

    def image_file(self, value: Any) -> Path | None:
        if value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == "":
            return None
        p = Path(str(value))
        return p if p.is_absolute() or self.base is None else self.base / p


# ----------------------------------------------------------------------------------------------- values
def plain(value: Any) -> Any:
    """A JSON-ready copy: numpy arrays/scalars -> lists/Python numbers, NaN -> None, uint64 -> str."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, np.unsignedinteger) and np.dtype(type(value)).itemsize == 8:
        return str(int(value))
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def _json_records(frame: pd.DataFrame) -> list[dict]:
    cols = list(frame.columns)
    out = []
    for row in frame.itertuples(index=False, name=None):
        out.append({c: plain(v) for c, v in zip(cols, row)})
    for c in cols:      # a uint64 column is a string column as a whole (not only its large values)
        if str(frame[c].dtype) == "uint64":
            for r in out:
                r[c] = None if r[c] is None else str(r[c])
    return out


def _check(table: ExportTable, where: str | Path) -> None:
    missing = [c for c in (table.id_column, *table.images) if c not in table.rows.columns]
    if missing:
        raise input_error(where, None, f"config {table.config!r}: missing column(s) {', '.join(missing)}",
                          "export the index written by the study's last step")
    ids = table.rows[table.id_column].astype(str)
    dup = ids.duplicated()
    if dup.any():
        raise input_error(where, f"{table.id_column} {ids[dup].iloc[0]!r}", f"config {table.config!r}: item id "
                          "occurs twice", "give every exported item a unique id")


def _resolve_images(table: ExportTable, frame: pd.DataFrame, where: str | Path) -> dict[str, list[Path | None]]:
    out = {}
    for col in table.images:
        files = []
        for item, value in zip(frame[table.id_column].astype(str), frame[col]):
            f = table.image_file(value)
            if f is not None and not f.is_file():
                raise input_error(where, f"{table.id_column} {item!r}", f"{col} file {f} not found",
                                  "rerun the step that writes the images, or export the index that goes with them")
            files.append(f)
        out[col] = files
    return out


def field_types(table: ExportTable) -> dict[str, str]:
    """A short type name per non-image field (what the dataset card's fields table shows): ``string``, ``int64``,
    ``float64``, ``bool``, ``list`` (arrays, e.g. boxes)."""
    out = {}
    for col in (c for c in table.rows.columns if c not in table.images):
        values = table.rows[col]
        kind = values.dtype.kind
        if kind in "iuf":
            out[col] = str(values.dtype)
        elif kind == "b":
            out[col] = "bool"
        else:
            first = next((v for v in values if v is not None and not (isinstance(v, float) and v != v)), None)
            out[col] = "list" if hasattr(first, "__len__") and not isinstance(first, str) else "string"
    return out


def safe_name(text: str) -> str:
    return _UNSAFE.sub("_", str(text)).strip("._") or "item"


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _finish(tmp: Path, manifest: dict, where: str | Path | None = None) -> dict:
    """Write the manifest to ``where`` (outside the dataset folder) or, without it, into the folder."""
    write_json(Path(where) if where is not None else tmp / MANIFEST, manifest)
    return manifest


# ------------------------------------------------------------------------------------------ imagefolder
def write_imagefolder(tables: Iterable[ExportTable], out_dir: str | Path, *, source: str = "",
                      manifest_path: str | Path | None = None) -> dict:
    """``<out_dir>/<config>/<split>/metadata.jsonl`` + images; returns the manifest (rows per config/split).

    Load: ``load_dataset("imagefolder", data_dir=<out_dir>/<config>)``. With one image column the metadata key
    is ``file_name`` (loaded as ``image``); with several, ``<column>_file_name`` (loaded as ``<column>``)."""
    manifest = {"format": "imagefolder", "source": source, "configs": {}}
    with atomic_dir(out_dir) as tmp:
        for table in tables:
            _check(table, source or out_dir)
            splits, per_split = {}, {}
            for split, frame in table.splits():
                folder = tmp / table.config / split
                folder.mkdir(parents=True)
                files = _resolve_images(table, frame, source or out_dir)
                records = _json_records(frame.drop(columns=list(table.images)))
                single = len(table.images) == 1
                for i, item in enumerate(frame[table.id_column].astype(str)):
                    names = {}
                    for col in table.images:
                        src = files[col][i]
                        if src is None:
                            raise input_error(source or out_dir, f"{table.id_column} {item!r}", f"no {col}",
                                              "drop items without images before exporting")
                        rel = f"{col}/{safe_name(item)}{src.suffix.lower()}"
                        _copy(src, folder / rel)
                        names["file_name" if single else f"{col}_file_name"] = rel
                    records[i] = {**names, **{k: v for k, v in records[i].items() if k not in names}}
                per_split[split] = records
                splits[split] = {"rows": len(frame), "path": f"{table.config}/{split}"}
            _write_metadata(tmp / table.config, per_split)
            manifest["configs"][table.config] = {"splits": splits, "images": list(table.images),
                                                 "fields": [c for c in table.rows.columns if c not in table.images],
                                                 "dtypes": field_types(table),
                                                 "description": table.description}
        _finish(tmp, manifest, manifest_path)
    return manifest


def _write_metadata(config_dir: Path, per_split: dict[str, list[dict]]) -> None:
    """``metadata.jsonl`` per split; ``metadata.parquet`` (one schema for all splits) instead when a field is
    null throughout one split but not in another: ``datasets`` infers each JSONL file's types on its own and
    refuses splits whose types differ."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    everything = [r for recs in per_split.values() for r in recs]
    keys = list(everything[0]) if everything else []
    has_value = {k for r in everything for k, v in r.items() if v is not None}
    uneven = any(k in has_value and all(r[k] is None for r in recs) for recs in per_split.values() for k in keys)
    for split, recs in per_split.items():
        if not uneven:
            with open(config_dir / split / "metadata.jsonl", "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
        else:
            schema = pa.Table.from_pylist(everything).schema
            pq.write_table(pa.Table.from_pylist(recs, schema=schema), config_dir / split / "metadata.parquet")


# ---------------------------------------------------------------------------------------------- parquet
#: default bound on the image bytes of one parquet shard (the size ``datasets``' ``push_to_hub`` shards to)
MAX_SHARD_BYTES = 500 * 2**20
#: rows per parquet row group: the writer holds one group's image bytes in memory at a time
ROW_GROUP_ROWS = 100


def _fields_table(table: ExportTable, frame: pd.DataFrame):
    """The non-image fields of ``frame`` as one arrow table (JSON-ready objects, uint64 kept)."""
    import pyarrow as pa

    rest = frame.drop(columns=list(table.images)).reset_index(drop=True).copy()
    for c in rest.columns:
        if rest[c].dtype == object or str(rest[c].dtype) in ("str", "string"):
            rest[c] = pd.Series([plain(v) for v in rest[c]], dtype=object)
    return pa.Table.from_pandas(rest, preserve_index=False).replace_schema_metadata(None)


def _image_struct():
    import pyarrow as pa

    return pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])


def _parquet_schema(table: ExportTable, fields):
    """``fields``' schema with the image columns first, declared as ``datasets.Image`` in the metadata."""
    import datasets
    import pyarrow as pa

    schema = fields.schema
    for k, col in enumerate(table.images):
        schema = schema.insert(k, pa.field(col, _image_struct()))
    features = datasets.Features.from_arrow_schema(schema)
    for col in table.images:
        features[col] = datasets.Image()
    return features.arrow_schema


def _image_chunk(table: ExportTable, fields, files: dict[str, list[Path | None]], start: int, stop: int, schema):
    """Rows ``start:stop`` with their images' bytes read (only these rows' images are in memory)."""
    import pyarrow as pa

    chunk = fields.slice(start, stop - start)
    for k, col in enumerate(table.images):
        values = [None if f is None else {"bytes": f.read_bytes(), "path": f.name} for f in files[col][start:stop]]
        chunk = chunk.add_column(k, pa.field(col, _image_struct()), pa.array(values, type=_image_struct()))
    return chunk.cast(schema)


def shard_bounds(sizes: list[int], max_bytes: int) -> list[tuple[int, int]]:
    """Consecutive ``(start, stop)`` row ranges whose ``sizes`` add up to at most ``max_bytes`` each (a row larger
    than the bound gets a shard of its own); one empty range for no rows."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    bounds, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > max_bytes:
            bounds.append((start, i))
            start, total = i, 0
        total += size
    bounds.append((start, len(sizes)))
    return bounds


def write_parquet(tables: Iterable[ExportTable], out_dir: str | Path, *, source: str = "",
                  manifest_path: str | Path | None = None, max_shard_bytes: int = MAX_SHARD_BYTES) -> dict:
    """``<out_dir>/<config>/<split>-0000K-of-0000N.parquet`` with embedded images; returns the manifest.

    Each split is cut into shards whose image bytes stay within ``max_shard_bytes`` (file sizes, read before
    writing) and named as the Hub names shards; rows are streamed into each shard ``ROW_GROUP_ROWS`` at a time
    (:class:`pyarrow.parquet.ParquetWriter`), so only one row group's images are in memory. The manifest's split
    ``path`` is the glob of its shards (``<config>/<split>-*.parquet``), ``files`` lists them.
    Load: ``load_dataset("parquet", data_files={split: <out_dir>/<path>})`` (image columns decode to PIL images)."""
    import pyarrow.parquet as pq

    where = source or out_dir
    manifest = {"format": "parquet", "source": source, "configs": {}}
    with atomic_dir(out_dir) as tmp:
        for table in tables:
            _check(table, where)
            splits = {}
            for split, frame in table.splits():
                files = _resolve_images(table, frame, where)
                fields = _fields_table(table, frame)
                schema = _parquet_schema(table, fields)
                sizes = [sum(f[i].stat().st_size for f in files.values() if f[i] is not None)
                         for i in range(len(frame))]
                bounds = shard_bounds(sizes, max_shard_bytes)
                (tmp / table.config).mkdir(parents=True, exist_ok=True)
                names = []
                for k, (start, stop) in enumerate(bounds):
                    rel = f"{table.config}/{split}-{k:05d}-of-{len(bounds):05d}.parquet"
                    with pq.ParquetWriter(tmp / rel, schema, compression="zstd") as writer:
                        for lo in range(start, stop, ROW_GROUP_ROWS):
                            writer.write_table(_image_chunk(table, fields, files, lo, min(stop, lo + ROW_GROUP_ROWS),
                                                            schema))
                        if start == stop:
                            writer.write_table(schema.empty_table())
                    names.append(rel)
                splits[split] = {"rows": len(frame), "path": f"{table.config}/{split}-*.parquet", "files": names}
            manifest["configs"][table.config] = {"splits": splits, "images": list(table.images),
                                                 "fields": [c for c in table.rows.columns if c not in table.images],
                                                 "dtypes": field_types(table),
                                                 "description": table.description}
        _finish(tmp, manifest, manifest_path)
    return manifest


# ------------------------------------------------------------------------------------ COCO-Counterfactuals
#: the keys of the caption-only release (B11)
CAPTION_RELEASE_KEYS = ("coco-counterfactual-index", "original_caption", "counterfactual_caption")
EXAMPLE_KEYS = ("id", "image_0", "image_1", "caption_0", "caption_1")


def write_coco_counterfactuals(pairs: str | Path, captions_jsonl: str | Path, out_dir: str | Path, *,
                               manifest_path: str | Path | None = None) -> dict:
    """The Intel/COCO-Counterfactuals layout (B11) from ``images/selected_pairs.parquet`` (``id, caption_0,
    caption_1, image_0, image_1``; image paths relative to its folder) and the caption release JSONL.

    Images keep their bytes and extension (the published zip holds ``.jpg``; ours are the generator's PNGs).
    Load: ``load_dataset("json", data_files=<out_dir>/data/examples.jsonl)``."""
    pairs = Path(pairs)
    frame = pd.read_parquet(pairs)
    table = ExportTable("default", frame, ("image_0", "image_1"), "id", base=pairs.parent)
    _check(table, pairs)
    files = _resolve_images(table, frame, pairs)
    captions = _read_caption_release(captions_jsonl)
    with atomic_dir(out_dir) as tmp:
        (tmp / "data" / "images").mkdir(parents=True)
        stems = set()
        with open(tmp / "data" / "examples.jsonl", "w", encoding="utf-8") as fh:
            for i, row in enumerate(frame.itertuples(index=False)):
                rec = {"id": str(row.id), "caption_0": str(row.caption_0), "caption_1": str(row.caption_1)}
                for col in ("image_0", "image_1"):
                    src = files[col][i]
                    if src is None:
                        raise input_error(pairs, f"id {row.id!r}", f"no {col}", "export only complete pairs")
                    stem = src.stem
                    if stem in stems:
                        raise input_error(pairs, f"id {row.id!r}", f"image stem {stem!r} used twice",
                                          "give every generated image a unique file name")
                    stems.add(stem)
                    _copy(src, tmp / "data" / "images" / f"{stem}{src.suffix.lower()}")
                    rec[col] = stem
                fh.write(json.dumps({k: rec[k] for k in EXAMPLE_KEYS}, ensure_ascii=False) + "\n")
        with open(tmp / "coco_counterfactuals_captions.jsonl", "w", encoding="utf-8") as fh:
            for rec in captions:
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        manifest = {"format": "coco_counterfactuals", "source": str(pairs),
                    "configs": {"default": {"splits": {"test": {"rows": len(frame), "path": "data/examples.jsonl"}},
                                            "images": ["image_0", "image_1"], "fields": list(EXAMPLE_KEYS)},
                                "captions": {"splits": {"train": {"rows": len(captions),
                                                                  "path": "coco_counterfactuals_captions.jsonl"}},
                                             "images": [], "fields": list(CAPTION_RELEASE_KEYS)}}}
        _finish(tmp, manifest, manifest_path)
    return manifest


def _read_caption_release(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise input_error(path, None, "caption release JSONL not found", "run `counterfactory captions merge --jsonl`")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise input_error(path, f"line {n}", f"not JSON ({exc.msg})", "rewrite the file with `captions merge`")
        if not isinstance(rec, dict) or set(rec) != set(CAPTION_RELEASE_KEYS):
            raise input_error(path, f"line {n}", f"keys {sorted(rec) if isinstance(rec, dict) else rec!r} are not "
                              f"{', '.join(CAPTION_RELEASE_KEYS)}", "rewrite the file with `captions merge --jsonl`")
        out.append({k: rec[k] for k in CAPTION_RELEASE_KEYS})
    return out


# ---------------------------------------------------------------------------------------- CounterCurate
#: the columns of CounterCurate's evaluation TSVs (A8, ``benchmark/CLIP_test_position.py``)
CC_TSV_COLUMNS = ("captions", "images", "neg_captions", "neg_images")
CC_DATASETS = ("positions", "counting", "attributes")


def write_countercurate(datasets_dir: str | Path, out_dir: str | Path, *,
                        manifest_path: str | Path | None = None) -> dict:
    """CounterCurate's TSVs from ``datasets/{positions,counting,attributes}.parquet`` (columns ``item_id,
    image_path, caption, negative_caption, negative_image``; positions also ``subset``, ``split``).

    Files: ``positions_<LR|AB>_<split>.tsv``, ``counting.tsv``, ``attributes.tsv`` (a dataset without rows gets
    no file; the manifest records 0), images under ``images/source/`` (originals, once each) and
    ``images/negative/<item_id><ext>``; TSV image paths are relative to ``out_dir``.
    Load: ``load_dataset("csv", data_files=<file>, delimiter="\\t")``."""
    datasets_dir = Path(datasets_dir)
    configs = {}
    with atomic_dir(out_dir) as tmp:
        copied: dict[Path, str] = {}
        for name in CC_DATASETS:
            path = datasets_dir / f"{name}.parquet"
            if not path.is_file():
                raise input_error(path, None, f"CounterCurate {name} table not found",
                                  "run the CounterCurate dataset steps first (datasets/<name>.parquet)")
            frame = pd.read_parquet(path)
            if "negative_caption" not in frame.columns and "negative" in frame.columns:   # attributes' name
                frame = frame.rename(columns={"negative": "negative_caption"})
            table = ExportTable(name, frame, ("image_path", "negative_image"), "item_id", base=path.parent)
            if len(frame):       # an empty table (no attributes in the demo) may lack columns
                _check(table, path)
            groups = ([((s, sp), g) for (s, sp), g in frame.groupby(["subset", "split"], sort=True)]
                      if name == "positions" and len(frame) else [(None, frame)])
            splits = {}
            for key, g in groups:
                if not len(g):
                    splits["test" if name == "positions" else "train"] = {"rows": 0, "path": None}
                    continue
                files = _resolve_images(table, g, path)
                rows = []
                for i, r in enumerate(g.itertuples(index=False)):
                    src, neg = files["image_path"][i], files["negative_image"][i]
                    if src is None or neg is None:
                        raise input_error(path, f"item_id {r.item_id!r}", "missing image or negative image",
                                          "export the table written after the negatives were attached")
                    if src not in copied:
                        rel = f"images/source/{safe_name(src.parent.name)}_{safe_name(src.name)}"
                        _copy(src, tmp / rel)
                        copied[src] = rel
                    neg_rel = f"images/negative/{safe_name(r.item_id)}{neg.suffix.lower()}"
                    _copy(neg, tmp / neg_rel)
                    rows.append({"captions": r.caption, "images": copied[src], "neg_captions": r.negative_caption,
                                 "neg_images": neg_rel})
                fname = f"{name}_{key[0]}_{key[1]}.tsv" if key else f"{name}.tsv"
                pd.DataFrame(rows, columns=list(CC_TSV_COLUMNS)).to_csv(tmp / fname, sep="\t", index=False)
                splits[fname[:-4]] = {"rows": len(g), "path": fname}
            configs[name] = {"splits": splits, "images": ["images", "neg_images"], "fields": list(CC_TSV_COLUMNS)}
        manifest = {"format": "countercurate", "source": str(datasets_dir), "configs": configs}
        _finish(tmp, manifest, manifest_path)
    return manifest


# ------------------------------------------------------------------------------------ SocialCounterfactuals
def write_social_counterfactuals(kept: str | Path, out_dir: str | Path, *,
                                 manifest_path: str | Path | None = None, citation: str = "") -> dict:
    """Intel/SocialCounterfactuals parquet (B12): :func:`.social_release.export_release` (one
    ``train`` split of ``data/train-NNNNN-of-MMMMM-<hash>.parquet`` with ``image`` bytes and the release
    fields), plus this module's ``manifest.json``."""
    summary = export_release(kept, out_dir, citation=citation)
    manifest = {"format": "social_counterfactuals", "source": str(kept),
                "configs": {"default": {"splits": {"train": {"rows": summary["rows"], "path": "data/train-*.parquet"}},
                                        "images": ["image"], "fields": list(RELEASE_FIELDS[1:])}},
                "sets": summary["sets"], "segments": summary["segments"]}
    write_json(Path(manifest_path) if manifest_path is not None else Path(out_dir) / MANIFEST, manifest)
    return manifest


def read_manifest(folder: str | Path, manifest_path: str | Path | None = None) -> dict:
    """The manifest of an exported ``folder``: ``manifest_path`` when given (kept outside the folder), else the
    folder's own ``manifest.json``."""
    path = Path(manifest_path) if manifest_path is not None else Path(folder) / MANIFEST
    if not path.is_file():
        raise InputError(f"{path}: export manifest not found. Fix: run `counterfactory export` for this folder first")
    return json.loads(path.read_text(encoding="utf-8"))
