"""The filtered dataset in the released Intel/SocialCounterfactuals layout (SocialCounterfactuals §3.4, Table 1).

The public release (``huggingface.co/datasets/Intel/SocialCounterfactuals``; see
the Hugging Face dataset's layout) is one ``train`` split of parquet shards ``data/train-000NN-of-000MM-<hash>.parquet``
with the fields ``image`` (Hugging Face ``datasets`` Image feature), ``caption``, ``counterfactual_set``,
``a1_type``, ``a1``, ``a2_type``, ``a2`` and ``a1a2``. :func:`export_release` writes that layout from the
table of kept images; :func:`check_release` reads it back (with ``datasets.load_dataset("parquet", ...)``
when ``datasets`` is installed, else with pyarrow) and counts sets and images per attribute-type pair,
the figures of Table 1.

Field meanings (those the release leaves undocumented are this package's choices):

* ``image``: ``{"bytes": <the image file's bytes, unchanged>, "path": <its file name>}`` — the encoding of
  ``datasets.Image``; the features are recorded in the parquet schema metadata (key ``huggingface``), so
  ``load_dataset`` decodes the column to PIL images.
* ``counterfactual_set``: the set id of :mod:`.captions` (string), with ``-c<candidate>`` appended when the
  table has a ``candidate_index`` column (several candidate sets of one caption set survive the filters);
  ``a1a2``: the attribute values joined by one space, as they appear in the caption ("Asian female"; with three attributes "young Asian female").
* extra fields: ``a3_type``/``a3`` ("" for two-attribute sets, §10.2), ``segment`` (attribute types joined
  by "_"), ``subject`` (the occupation; recovered as ``caption.split(<last value> + " ")[1]`` when the input
  has no ``subject`` column, as B12 describes) and ``member_index`` (0 = base member).

Rows are ordered by (``counterfactual_set``, ``member_index``); shard ``<hash>`` is the first 16 hex digits of
a sha256 over the shard's rows (captions, ids and image bytes), so identical inputs give identical files.

CLI: ``counterfactory social release --images FILE.parquet --out-dir DIR [--shard-size N]`` and
``counterfactory social release-check --dir DIR``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import InputError, input_error, missing_input
from ..io import atomic_dir, write_json, write_text
from ..render import escape_md
from .citations import size_category

#: fields of the public release, in its order
RELEASE_FIELDS = ("image", "caption", "counterfactual_set", "a1_type", "a1", "a2_type", "a2", "a1a2")
#: fields this package adds after them
EXTRA_FIELDS = ("a3_type", "a3", "segment", "subject", "member_index")
#: columns the kept-images table must have
REQUIRED_COLUMNS = ("set_id", "member_index", "caption", "a1_type", "a1", "a2_type", "a2", "image_path")
#: rows per shard: the release has 61 shards for 170,832 images (about 2,800 each)
DEFAULT_SHARD_SIZE = 2800
#: rows per parquet row group (small groups let readers stream images)
ROW_GROUP_SIZE = 100
SHARD_NAME = re.compile(r"^train-(\d{5})-of-(\d{5})-([0-9a-f]{16})\.parquet$")


def _features() -> dict:
    value = {name: {"dtype": "string", "_type": "Value"} for name in RELEASE_FIELDS[1:] + EXTRA_FIELDS[:-1]}
    return {"image": {"_type": "Image"}, **value, "member_index": {"dtype": "int32", "_type": "Value"}}


def _arrow_schema():
    import pyarrow as pa

    fields = [pa.field("image", pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())]))]
    fields += [pa.field(name, pa.string()) for name in RELEASE_FIELDS[1:] + EXTRA_FIELDS[:-1]]
    fields.append(pa.field("member_index", pa.int32()))
    meta = {"huggingface": json.dumps({"info": {"features": _features()}}, sort_keys=True)}
    return pa.schema(fields, metadata=meta)


# ---------------------------------------------------------------------------------------------- input


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def read_kept_images(path: str | Path) -> pd.DataFrame:
    """The kept-images table, checked and completed (``a3_type``, ``a3``, ``segment``, ``subject``,
    ``a1a2``, absolute ``image_file``), ordered by (set_id, member_index).

    Raises :class:`~counterfactory.errors.InputError` naming the file, the row and the fix."""
    path = Path(path)
    if not path.exists():
        raise missing_input(path, "kept-images table", "pass the parquet written by the filtering step (--images)")
    frame = pd.read_parquet(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        has = ", ".join(map(str, frame.columns))
        raise input_error(path, None, f"missing column(s) {', '.join(missing)} (has {has})",
                          f"give a table with the columns {', '.join(REQUIRED_COLUMNS)}")
    if frame.empty:
        raise input_error(path, None, "no rows", "pass the table of the images kept by the filters")
    frame = frame.reset_index(drop=True)
    for col in ("a3_type", "a3", "segment", "subject"):
        if col not in frame.columns:
            frame[col] = ""
    for col in ("set_id", "caption", "a1_type", "a1", "a2_type", "a2", "image_path", "a3_type", "a3", "segment",
                "subject"):
        frame[col] = [_text(v) for v in frame[col]]
    if "candidate_index" in frame.columns:
        # every candidate set that survives the filters is one counterfactual set of the release (Table 11 counts
        # 13,824 of them from 3,120 caption sets), so the candidate is part of the set's identity
        frame["set_id"] = [f"{s}-c{int(c):03d}" for s, c in zip(frame["set_id"], frame["candidate_index"])]
    for col in ("set_id", "caption", "a1_type", "a1", "a2_type", "a2", "image_path"):
        empty = frame.index[frame[col].str.strip() == ""]
        if len(empty):
            raise input_error(path, int(empty[0]), f"empty {col}", f"fill in {col} for every row")
    try:
        frame["member_index"] = pd.to_numeric(frame["member_index"], errors="raise").astype("int64")
    except (ValueError, TypeError) as exc:
        raise input_error(path, None, f"member_index is not an integer column ({exc})",
                          "write member_index as integers (0 = base member)") from exc
    has_a3 = (frame["a3_type"] != "") | (frame["a3"] != "")
    bad_a3 = frame.index[has_a3 & ((frame["a3_type"] == "") | (frame["a3"] == ""))]
    if len(bad_a3):
        raise input_error(path, int(bad_a3[0]), "a3_type and a3 must both be set or both be empty", "fill in both")
    frame["a1a2"] = [" ".join(v for v in (a, b, c) if v) for a, b, c in zip(frame["a1"], frame["a2"], frame["a3"])]
    for i, (caption, phrase) in enumerate(zip(frame["caption"], frame["a1a2"])):
        if f" {phrase} " not in f" {caption} ":
            raise input_error(path, i, f"caption {caption!r} does not contain its attribute values {phrase!r}",
                              "check that the a1/a2 columns belong to the caption (template <prefix> <a1> <a2> "
                              "<subject>, §3.2)")
    seg = ["_".join(v for v in (t1, t2, t3) if v) for t1, t2, t3 in zip(frame["a1_type"], frame["a2_type"],
                                                                         frame["a3_type"])]
    frame["segment"] = [s or d for s, d in zip(frame["segment"], seg)]
    subjects = []
    for caption, a2, a3, given in zip(frame["caption"], frame["a2"], frame["a3"], frame["subject"]):
        if given:
            subjects.append(given)
            continue
        parts = caption.split((a3 or a2) + " ", 1)
        subjects.append(parts[1].strip() if len(parts) == 2 else "")
    frame["subject"] = subjects
    dup = frame.duplicated(["set_id", "member_index"], keep="first")
    if dup.any():
        i = int(frame.index[dup][0])
        raise input_error(path, i, f"set {frame.at[i, 'set_id']!r} has member_index {frame.at[i, 'member_index']} "
                                   "twice", "keep one image per set member")
    dup = frame.duplicated(["set_id", "a1a2"], keep="first")
    if dup.any():
        i = int(frame.index[dup][0])
        raise input_error(path, i, f"set {frame.at[i, 'set_id']!r} has the attribute values "
                                   f"{frame.at[i, 'a1a2']!r} twice", "keep one image per attribute combination")
    types = frame.groupby("set_id")["segment"].nunique()
    mixed = types[types > 1]
    if len(mixed):
        raise input_error(path, None, f"set {mixed.index[0]!r} mixes attribute types",
                          "give every member of a set the same a1_type/a2_type")
    base = path.parent
    files = []
    for i, rel in enumerate(frame["image_path"]):
        f = Path(rel)
        f = f if f.is_absolute() else base / f
        if not f.is_file():
            raise input_error(path, i, f"image file {f} not found (image_path {rel!r}, relative paths are read "
                                       f"from {base.resolve()})", "check the image_path column and the image folder")
        files.append(f)
    frame["image_file"] = files
    frame = frame.sort_values(["set_id", "member_index"], kind="stable").reset_index(drop=True)
    return frame


# --------------------------------------------------------------------------------------------- export


def _shard_table(rows: pd.DataFrame):
    import pyarrow as pa

    images, digest = [], hashlib.sha256()
    for r in rows.itertuples(index=False):
        data = Path(r.image_file).read_bytes()
        images.append({"bytes": data, "path": Path(r.image_file).name})
        for part in (r.set_id, str(r.member_index), r.caption, hashlib.sha256(data).hexdigest()):
            digest.update(part.encode("utf-8") + b"\0")
    columns = {"image": images, "caption": list(rows["caption"]), "counterfactual_set": list(rows["set_id"])}
    for name in ("a1_type", "a1", "a2_type", "a2", "a1a2", "a3_type", "a3", "segment", "subject"):
        columns[name] = list(rows[name])
    columns["member_index"] = [int(v) for v in rows["member_index"]]
    return pa.Table.from_pydict(columns, schema=_arrow_schema()), digest.hexdigest()[:16]


def export_release(images: str | Path, out_dir: str | Path, shard_size: int = DEFAULT_SHARD_SIZE,
                   citation: str = "") -> dict:
    """Write the kept images ``images`` (parquet) as the release layout under ``out_dir`` (replaced as a
    whole, atomically): ``data/train-*.parquet``, ``README.md`` and ``release_summary.json``.

    Returns the summary: rows, sets, shards (names), per-segment counts."""
    import pyarrow.parquet as pq

    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise InputError(f"--shard-size {shard_size!r}: must be a positive number of rows. Fix: pass e.g. "
                         f"--shard-size {DEFAULT_SHARD_SIZE}")
    frame = read_kept_images(images)
    n_shards = math.ceil(len(frame) / shard_size)
    names = []
    with atomic_dir(out_dir) as tmp:
        data = tmp / "data"
        data.mkdir()
        for k in range(n_shards):
            table, digest = _shard_table(frame.iloc[k * shard_size:(k + 1) * shard_size])
            name = f"train-{k:05d}-of-{n_shards:05d}-{digest}.parquet"
            pq.write_table(table, data / name, row_group_size=ROW_GROUP_SIZE, compression="zstd")
            names.append(f"data/{name}")
        summary = {"rows": int(len(frame)), "sets": int(frame["set_id"].nunique()), "shards": names,
                   "shard_size": shard_size,
                   "segments": _counts(frame.rename(columns={"set_id": "counterfactual_set"})),
                   "source": str(Path(images).resolve())}
        write_json(tmp / "release_summary.json", summary)
        write_text(tmp / "README.md", _readme(summary, citation))
    return summary


def _counts(frame: pd.DataFrame) -> list[dict]:
    out = []
    for seg, g in frame.groupby("segment", sort=True):
        per_set = g.groupby("counterfactual_set").size()
        out.append({"segment": seg, "sets": int(per_set.size), "images": int(len(g)),
                    "images_per_set_min": int(per_set.min()), "images_per_set_max": int(per_set.max())})
    return out


def _readme(summary: dict, citation: str = "") -> str:
    """The release's dataset card: the Hub's YAML metadata (``DatasetCardData``: the one ``train`` split's shards
    as ``data_files``), the layout, fields, counts per segment and the paper's citation."""
    from huggingface_hub import DatasetCardData

    meta = DatasetCardData(pretty_name="SocialCounterfactuals (reproduction)", license="other",
                           license_name="generated images: CreativeML OpenRAIL-M use restrictions",
                           language=["en"], task_categories=["image-to-text", "text-to-image"],
                           size_categories=[size_category(int(summary["rows"]))],
                           tags=["counterfactual", "synthetic", "social-bias", "counterfactory"],
                           configs=[{"config_name": "default",
                                     "data_files": [{"split": "train", "path": "data/train-*.parquet"}]}])
    lines = ["---", meta.to_yaml().rstrip(), "---", "",
             "# SocialCounterfactuals-format release (written by counterfactory)", "",
             "Layout of Intel/SocialCounterfactuals: one `train` split, parquet shards under `data/`.",
             "Load with `datasets.load_dataset(\"parquet\", data_files={\"train\": \"data/*.parquet\"})`.", "",
             "Fields: `image` (datasets Image), `caption`, `counterfactual_set` (set id), `a1_type`, `a1`, "
             "`a2_type`, `a2`, `a1a2` (values joined by a space), and the extra fields `a3_type`, `a3` (\"\" for "
             "two-attribute sets), `segment`, `subject`, `member_index` (0 = base member).", "",
             f"{summary['rows']} images in {summary['sets']} counterfactual sets, {len(summary['shards'])} shard(s).",
             "", "| segment | sets | images |", "|---|---|---|"]
    lines += [f"| {escape_md(s['segment'])} | {s['sets']} | {s['images']} |" for s in summary["segments"]]
    lines += ["", "## Bias, Risks, and Limitations", "",
              "Race, gender and physical characteristics are prompt conditions of generated images, not labels of "
              "real people; the images can show the generator's stereotypes. Use the sets to measure and reduce "
              "social bias, not to infer these attributes.", "", "## Citation", "", "```bibtex",
              citation or "% no citation recorded for this study", "```"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- check


def release_shards(directory: str | Path) -> list[Path]:
    """The shard files of a release folder, checked for the ``train-NNNNN-of-MMMMM-<hash>`` naming."""
    directory = Path(directory)
    data = directory / "data"
    if not data.is_dir():
        raise missing_input(data, "release data folder", "pass the --out-dir of `counterfactory social release`")
    files = sorted(p for p in data.iterdir() if p.suffix == ".parquet")
    if not files:
        raise input_error(data, None, "no parquet shards", "rerun `counterfactory social release`")
    indexes, totals = [], set()
    for f in files:
        m = SHARD_NAME.match(f.name)
        if not m:
            raise input_error(f, None, "shard name is not train-NNNNN-of-MMMMM-<16 hex>.parquet",
                              "remove foreign files from data/ or rerun the release")
        indexes.append(int(m.group(1)))
        totals.add(int(m.group(2)))
    if totals != {len(files)} or indexes != list(range(len(files))):
        raise input_error(data, None, f"shards are incomplete or mixed ({len(files)} files, numbered "
                                      f"{indexes[:5]}..., 'of' counts {sorted(totals)})",
                          "rerun `counterfactory social release` into an empty folder")
    return files


def load_release(directory: str | Path, cache_dir: str | Path | None = None):
    """The release as a ``datasets.Dataset`` (split ``train``), read with ``load_dataset("parquet", ...)``.

    Raises ``ModuleNotFoundError`` when ``datasets`` is not installed."""
    import datasets

    files = [str(p) for p in release_shards(directory)]
    return datasets.load_dataset("parquet", data_files={"train": files}, split="train",
                                 cache_dir=None if cache_dir is None else str(cache_dir))


def check_release(directory: str | Path, use_datasets: bool | None = None) -> dict:
    """Read a release back and count it: rows, sets, per-segment sets/images, reader used.

    ``use_datasets``: None = ``datasets`` when installed, else pyarrow; True = require it."""
    import io

    import pyarrow.parquet as pq
    from PIL import Image

    files = release_shards(directory)
    if use_datasets is None:
        try:
            import datasets  # noqa: F401
            use_datasets = True
        except ModuleNotFoundError:
            use_datasets = False
    meta_cols = list(RELEASE_FIELDS[1:] + EXTRA_FIELDS)
    if use_datasets:
        with tempfile.TemporaryDirectory(prefix="cf-release-check-") as cache:
            ds = load_release(directory, cache_dir=cache)
            feature = type(ds.features["image"]).__name__ if "image" in ds.features else "none"
            missing = [c for c in RELEASE_FIELDS if c not in ds.column_names]
            first_size = ds[0]["image"].size if not missing else None      # decoded to a PIL image
            frame = ds.remove_columns(["image"]).to_pandas() if "image" in ds.column_names else ds.to_pandas()
            reader = f"datasets {datasets_version()}"
    else:
        schema = pq.read_schema(files[0])
        missing = [c for c in RELEASE_FIELDS if c not in schema.names]
        meta = json.loads((schema.metadata or {}).get(b"huggingface", b"{}"))
        feature = meta.get("info", {}).get("features", {}).get("image", {}).get("_type", "none")
        frame = pd.concat([pq.read_table(f, columns=[c for c in meta_cols if c in schema.names]).to_pandas()
                           for f in files], ignore_index=True)
        first_size = None
        if not missing:
            raw = pq.read_table(files[0], columns=["image"]).column("image")[0].as_py()
            first_size = Image.open(io.BytesIO(raw["bytes"])).size
        reader = "pyarrow (datasets is not installed)"
    empty = 0
    if not missing:
        for f in files:      # one shard's images at a time
            empty += sum(1 for img in pq.read_table(f, columns=["image"]).column("image").to_pylist()
                         if not img or not img.get("bytes"))
    if missing:
        raise input_error(directory, None, f"release lacks the field(s) {', '.join(missing)}",
                          "rerun `counterfactory social release`")
    if feature != "Image":
        raise input_error(directory, None, f"the image column is not a datasets Image feature ({feature})",
                          "rerun `counterfactory social release`")
    if empty:
        raise input_error(directory, None, f"{empty} image(s) without bytes", "rerun `counterfactory social release`")
    return {"reader": reader, "shards": len(files), "rows": int(len(frame)),
            "sets": int(frame["counterfactual_set"].nunique()), "segments": _counts(frame),
            "first_image_size": list(first_size) if first_size else None}


def datasets_version() -> str:
    import datasets

    return datasets.__version__
