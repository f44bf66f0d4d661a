"""Your own image–caption collection as a source, in place of MS-COCO (issue 15, "own data in").

Two kinds of source (``coco_counterfactuals.data.source`` in the config, or the ``counterfactory data own-*``
options):

* ``kind: table``: a CSV (``.csv``; ``.tsv`` tab-separated), JSON Lines (``.jsonl`` / ``.ndjson``) or parquet
  (``.parquet`` / ``.pq``) file with one row per caption: ``image_column`` (a local image path; a relative one is
  resolved against ``image_root``, by default the table's folder), ``caption_column`` and optionally
  ``id_column`` (your own caption id, unique). Several rows naming one image are several captions of it.
* ``kind: folder``: a folder (searched recursively) of images, each with a sidecar ``<stem>.txt`` next to it
  holding its captions, one per line (blank lines are skipped).

Optional ``boxes_json``: a COCO ``instances``-style JSON whose ``images[].file_name`` name your images (by
their path relative to ``image_root`` / the folder, or by their file name when that is unique), so the
box-based studies can run on the collection through :func:`write_coco_view`.

The caption table has the columns of :func:`counterfactory.data.coco.load_coco_captions` plus ``own_id``
(your id: the id column, else ``row <n>`` of the table or ``<sidecar>:<line>``) and ``source_image`` (the
image as named in the source). ``image_id`` is an integer assigned 1..N to the distinct images sorted by
their path relative to the image root, so adding rows or reordering the table keeps ids stable;
``caption_index`` is the caption's position among its image's captions in file order and ``caption_id`` is
``{image_id}_{caption_index}`` as for COCO (COCO-Counterfactuals release ids). ``file_name`` is the image's
absolute path, so every step that joins ``<image folder> / file_name`` finds it; ``width`` / ``height``
are read from the image. Captions are stripped and whitespace runs collapsed, as for COCO.

Validation collects every problem (unreadable or non-UTF-8 file, missing column, missing or unreadable image,
an image outside the image root (``../``, or an absolute path elsewhere: the workflow declares only the image root
as the source's input, so such an image would go untracked), empty caption, a caption that is not text (a JSON
number), duplicate id, a sidecar without image, boxes for an unknown image or of another image size)
and raises one :class:`InputError` listing each with file, record (``row <n>``: the n-th data row of a CSV /
parquet table, header not counted; ``line <n>`` of a JSON Lines file or sidecar) and fix, after a count per
kind of problem.
Nothing is written when a source has problems.
"""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..config import fill_section
from ..errors import ConfigError, InputError, describe_path, input_error
from ..io import atomic_dir, write_json
from .check import image_problem
from .coco import CAPTION_COLUMNS, load_coco_instances, read_json
from .splits import round_half_up

OWN_COLUMNS = [*CAPTION_COLUMNS, "own_id", "source_image"]
KINDS = ("table", "folder")
SOURCE_KEYS = ("kind", "path", "image_column", "caption_column", "id_column", "image_root", "boxes_json")
TABLE_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                  ".pq": "parquet"}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
CONFIG_KEY = "coco_counterfactuals.data.source"
#: marks a folder written by :func:`write_coco_view` (only such a folder is replaced by a new view)
VIEW_MARKER = "own_source.json"


@dataclass(frozen=True)
class OwnSource:
    """A validated source specification with absolute paths."""

    kind: str
    path: Path
    image_column: str = "image"
    caption_column: str = "caption"
    id_column: str | None = None
    image_root: Path | None = None
    boxes_json: Path | None = None

    @classmethod
    def from_spec(cls, spec: dict, base_dir: str | Path = ".") -> OwnSource:
        """``spec`` = the ``data.source`` mapping; relative paths are resolved against ``base_dir``."""
        if not isinstance(spec, dict):
            raise ConfigError(f"{CONFIG_KEY} must be a mapping, got {type(spec).__name__}. Fix: give "
                              "{kind: table, path: captions.csv, ...} or {kind: folder, path: photos/}")
        unknown = sorted(set(spec) - set(SOURCE_KEYS))
        if unknown:
            raise ConfigError(f"{CONFIG_KEY} has unknown keys {unknown}. Fix: use only {list(SOURCE_KEYS)}")
        spec = {k: v for k, v in spec.items() if v is not None}
        if spec.get("kind") not in KINDS:
            raise ConfigError(f"{CONFIG_KEY}.kind is {spec.get('kind')!r}. Fix: set it to 'table' or 'folder'")
        if not spec.get("path"):
            raise ConfigError(f"{CONFIG_KEY}.path is missing. Fix: set it to the caption table or the image folder")
        spec = fill_section(CONFIG_KEY, spec)          # the schema's defaults (image / caption columns, ...)
        if spec["kind"] == "folder" and (spec["image_root"] or spec["id_column"]):
            raise ConfigError(f"{CONFIG_KEY}: image_root and id_column apply to kind 'table' only. Fix: remove "
                              "them (a folder source names images by their path inside the folder)")
        base = Path(base_dir)

        def absolute(value):
            return None if value is None else Path(os.path.abspath(base / Path(value).expanduser()))

        path = absolute(spec["path"])
        root = absolute(spec["image_root"]) or (path if spec["kind"] == "folder" else path.parent)
        return cls(spec["kind"], path, str(spec["image_column"]), str(spec["caption_column"]),
                   None if spec["id_column"] is None else str(spec["id_column"]), root, absolute(spec["boxes_json"]))

    def input_files(self) -> dict[str, Path]:
        """Config key -> file or folder a workflow declares as input: the table or folder, a separate image
        root, the boxes JSON."""
        out = {"path": self.path}
        if self.kind == "table" and self.image_root != self.path.parent:
            out["image_root"] = self.image_root
        return out | ({"boxes_json": self.boxes_json} if self.boxes_json else {})


class Problems:
    """Every problem found in a source; :meth:`raise_if_any` turns them into one error."""

    def __init__(self, source: OwnSource):
        self.source = source
        self.items: list[tuple[str, str]] = []   # (kind of problem, message)

    def add(self, kind: str, path, record, problem: str, fix: str) -> None:
        self.items.append((kind, str(input_error(path, record, problem, fix))))

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if not self.items:
            return
        counts = Counter(kind for kind, _ in self.items)
        summary = ", ".join(f"{n} {kind}" for kind, n in counts.most_common())
        lines = [f"own data source {self.source.path} ({self.source.kind}): {len(self.items)} problem"
                 f"{'s' if len(self.items) > 1 else ''} ({summary}); nothing was written"]
        lines += [f"  {i}. {message}" for i, (_, message) in enumerate(self.items, 1)]
        raise InputError("\n".join(lines))


def _utf8(raw: bytes, path: Path, problems: Problems) -> str | None:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        problems.add("non-UTF-8 file", path, f"line {line}", f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                     "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 old > new`)")
        return None


def _read_table(src: OwnSource, problems: Problems) -> tuple[pd.DataFrame, list[str]] | None:
    """The table as a frame of raw values, and a record label per row; ``None`` when it cannot be read."""
    path = src.path
    fmt = TABLE_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        problems.add("unreadable file", path, None, f"unknown table type {path.suffix!r}",
                     f"use one of {', '.join(TABLE_SUFFIXES)}, or kind: folder for a folder of images")
        return None
    if not path.is_file():
        problems.add("unreadable file", describe_path(path), None,
                     "caption table is a folder, not a file" if path.is_dir() else "caption table not found",
                     f"check {CONFIG_KEY}.path (relative paths are resolved against the working directory)")
        return None
    if fmt == "parquet":
        try:
            frame = pd.read_parquet(path)
        except Exception as exc:   # pyarrow raises several types for a damaged or foreign file
            problems.add("unreadable file", path, None, f"not a readable parquet file ({exc})",
                         "rewrite the table (e.g. DataFrame.to_parquet) or use CSV / JSON Lines")
            return None
        return frame, [f"row {i + 1}" for i in range(len(frame))]
    text = _utf8(path.read_bytes(), path, problems)
    if text is None:
        return None
    if fmt == "jsonl":
        rows, labels = [], []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.add("bad record", path, f"line {n}", f"invalid JSON ({exc.msg} at column {exc.colno})",
                             "write one JSON object per line")
                continue
            if not isinstance(rec, dict):
                problems.add("bad record", path, f"line {n}", f"is a JSON {type(rec).__name__}, not an object",
                             "write one JSON object per line")
                continue
            rows.append(rec)
            labels.append(f"line {n}")
        return pd.DataFrame.from_records(rows), labels
    try:
        frame = pd.read_csv(io.StringIO(text), sep="\t" if fmt == "tsv" else ",", dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        problems.add("unreadable file", path, None, f"not a readable {fmt.upper()} table ({str(exc).strip()})",
                     "quote fields that contain the separator or line breaks; the first line names the columns")
        return None
    return frame, [f"row {i + 1}" for i in range(len(frame))]


def _text(value) -> str | None:
    """A cell as text (``None`` for a missing value); ints (JSON / parquet ids) become their digits."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)) and float(value).is_integer():
        return str(int(value))
    return value if isinstance(value, str) else str(value)


def _kind(value) -> str:
    """What a non-string cell is, in words (JSON's names)."""
    import numbers

    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, numbers.Number):
        return "a number"
    return {"list": "a list", "dict": "an object"}.get(type(value).__name__, f"a {type(value).__name__}")


def _clean(caption) -> str:
    return " ".join(caption.split()) if isinstance(caption, str) else ""


def _table_rows(src: OwnSource, problems: Problems) -> list[dict]:
    """One dict per caption row: ``image`` (as written), ``caption``, ``own_id``, ``record``, ``file``."""
    read = _read_table(src, problems)
    if read is None:
        return []
    frame, labels = read
    wanted = [("image_column", src.image_column), ("caption_column", src.caption_column)]
    if src.id_column:
        wanted.append(("id_column", src.id_column))
    missing = [(key, col) for key, col in wanted if col not in frame.columns]
    for key, col in missing:
        found = ", ".join(map(repr, frame.columns)) or "none"
        problems.add("missing column", src.path, None, f"missing column {col!r} (found: {found})",
                     f"set {CONFIG_KEY}.{key} to the column that holds it, or rename the column")
    if missing:
        return []
    rows, seen = [], {}
    for i, label in enumerate(labels):
        image, caption = _text(frame[src.image_column].iat[i]), frame[src.caption_column].iat[i]
        own_id = _text(frame[src.id_column].iat[i]) if src.id_column else label
        record = label + (f" (id {own_id})" if src.id_column else "")
        if src.id_column:
            if not own_id or not own_id.strip():
                problems.add("empty id", src.path, record, f"empty {src.id_column!r}", "give every row a unique id")
            elif own_id in seen:
                problems.add("duplicate id", src.path, record, f"duplicate id {own_id!r} (also {seen[own_id]})",
                             "make the ids unique or remove the duplicate row")
            else:
                seen[own_id] = label
        if not image or not image.strip():
            problems.add("missing image", src.path, record, f"empty {src.image_column!r}",
                         "give the image's path (relative to image_root or absolute)")
            image = None
        if caption is not None and not isinstance(caption, str) and _text(caption) is not None:
            problems.add("caption not text", src.path, record,
                         f"caption {caption!r} in {src.caption_column!r} is {_kind(caption)}, not a string",
                         "write the caption as text (in JSON Lines quoted: \"caption\": \"5\"), or check that "
                         f"{CONFIG_KEY}.caption_column names the caption column")
            caption = None
        elif not isinstance(caption, str) or not caption.strip():
            problems.add("empty caption", src.path, record, f"empty caption {_text(caption)!r}",
                         "write a caption or remove the row")
            caption = None
        rows.append({"image": image, "caption": caption, "own_id": own_id, "record": record, "file": src.path})
    return rows


def _folder_rows(src: OwnSource, problems: Problems) -> list[dict]:
    if not src.path.is_dir():
        problems.add("unreadable file", describe_path(src.path), None,
                     "image folder is a file, not a folder" if src.path.exists() else "image folder not found",
                     f"check {CONFIG_KEY}.path, or use kind: table for a caption table")
        return []
    files = sorted(p for p in src.path.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(src.path).parts))
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    by_sidecar: dict[Path, list[Path]] = {}
    for p in images:
        by_sidecar.setdefault(p.with_suffix(".txt"), []).append(p)
    for p in files:
        if p.suffix.lower() == ".txt" and p not in by_sidecar:
            problems.add("caption file without image", p, None, "no image with this stem next to it",
                         f"add {p.stem}.jpg (or .png, ...) beside it, or move the file out of the folder")
    if not images:
        problems.add("missing image", src.path, None, f"no images ({', '.join(IMAGE_SUFFIXES)}) in the folder",
                     "put the images and their <stem>.txt captions there")
    rows = []
    for sidecar, owners in sorted(by_sidecar.items()):
        if len(owners) > 1:
            problems.add("duplicate id", sidecar, None,
                         f"shared by {len(owners)} images ({', '.join(p.name for p in owners)})",
                         "give every image its own stem")
            continue
        image = owners[0]
        rel = image.relative_to(src.path).as_posix()
        if not sidecar.is_file():
            problems.add("empty caption", image, None, f"no caption file {sidecar.name}",
                         f"write {sidecar.name} beside it (one caption per line) or remove the image")
            continue
        text = _utf8(sidecar.read_bytes(), sidecar, problems)
        if text is None:
            continue
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if not lines:
            problems.add("empty caption", sidecar, None, "no caption in the file", "write one caption per line")
        name = sidecar.relative_to(src.path).as_posix()
        rows += [{"image": rel, "caption": line, "own_id": f"{name}:{n}", "record": f"line {n}", "file": sidecar}
                 for n, line in lines]
    return rows


def _image_key(src: OwnSource, image: str) -> tuple[str, Path]:
    """``(sort key, absolute path)``: the path relative to the image root (posix), or the absolute path."""
    path = Path(os.path.abspath(src.image_root / Path(image).expanduser()))
    try:
        return path.relative_to(src.image_root).as_posix(), path
    except ValueError:
        return path.as_posix(), path


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path`` (absolute, normalised) lies in the folder ``root``."""
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _check_images(src: OwnSource, rows: list[dict], problems: Problems, check: bool) -> dict[str, dict]:
    """key -> {path, width, height, records}: each distinct image once; missing / unreadable ones reported."""
    from PIL import Image

    images: dict[str, dict] = {}
    for row in rows:
        if row["image"] is None:
            continue
        key, path = _image_key(src, row["image"])
        if not _inside(path, src.image_root):
            problems.add("image outside the image root", row["file"], row["record"],
                         f"image {row['image']!r} is {path}, outside the image root {src.image_root} (the folder the "
                         "workflow declares as this source's input, so the image would not be tracked)",
                         f"move or link the image into {src.image_root} and name it relative to it, or set "
                         f"{CONFIG_KEY}.image_root to a folder that holds every image")
            continue
        entry = images.setdefault(key, {"path": path, "rows": [], "file": row["file"]})
        entry["rows"].append(row["record"])
        row["key"] = key
    if not check:
        return images
    fix = f"check the path (relative paths are resolved against {CONFIG_KEY}.image_root, here {src.image_root})"
    for key, entry in images.items():
        where = ", ".join(entry["rows"][:3]) + (f" and {len(entry['rows']) - 3} more" if len(entry["rows"]) > 3 else "")
        path = entry["path"]
        if not path.is_file():
            problems.add("missing image", entry["file"], where, f"image {key!r} not found ({path})", fix)
            continue
        why = image_problem(path)
        if why:
            problems.add("unreadable image", entry["file"], where, f"image {key!r} cannot be used: {why}",
                         "replace the file with an intact image or remove its rows")
            continue
        with Image.open(path) as im:
            entry["width"], entry["height"] = im.size
    return images


@dataclass
class OwnData:
    """A loaded, validated source: the caption table and (with ``boxes_json``) the remapped instances doc."""

    source: OwnSource
    captions: pd.DataFrame
    instances: dict | None = None


def _rows(src: OwnSource, problems: Problems) -> list[dict]:
    return _table_rows(src, problems) if src.kind == "table" else _folder_rows(src, problems)


def _caption_frame(rows: list[dict], images: dict[str, dict]) -> pd.DataFrame:
    ids = {key: i for i, key in enumerate(sorted(images), 1)}
    out = pd.DataFrame({
        "image_id": [ids[r["key"]] for r in rows],
        "annotation_id": range(1, len(rows) + 1),
        "caption": [_clean(r["caption"]) for r in rows],
        "file_name": [str(images[r["key"]]["path"]) for r in rows],
        "width": [images[r["key"]].get("width", 0) for r in rows],
        "height": [images[r["key"]].get("height", 0) for r in rows],
        "own_id": [r["own_id"] for r in rows],
        "source_image": [r["key"] for r in rows],
    })
    out["caption_index"] = out.groupby("image_id", sort=False).cumcount()
    out["caption_id"] = out["image_id"].astype(str) + "_" + out["caption_index"].astype(str)
    out = out.astype({c: "int64" for c in ("image_id", "annotation_id", "caption_index", "width", "height")})
    return out.sort_values(["image_id", "caption_index"], kind="stable").reset_index(drop=True)[OWN_COLUMNS]


def _boxes(src: OwnSource, captions: pd.DataFrame, problems: Problems) -> dict | None:
    """The boxes JSON's ``annotations`` (image ids renumbered to the own ones) and ``categories``; an image of
    the JSON is matched by its path relative to the image root, else by its file name when that is unique."""
    path = src.boxes_json
    try:
        _, anns, _ = load_coco_instances(path)
        doc = read_json(path)
    except InputError as exc:
        problems.add("bad boxes file", path, None, str(exc).rstrip("."), "fix the boxes JSON as the message says")
        return None
    own = captions.drop_duplicates("image_id")
    by_rel = dict(zip(own["source_image"], own.index))
    names = Counter(Path(k).name for k in own["source_image"])
    by_name = {Path(k).name: i for k, i in by_rel.items() if names[Path(k).name] == 1}
    with_boxes = set(anns["image_id"])
    remap = {}
    for i, rec in enumerate(doc["images"]):
        row = by_rel.get(rec["file_name"], by_name.get(Path(rec["file_name"]).name))
        where = f"images[{i}] (id {rec['id']})"
        if row is None:
            if rec["id"] in with_boxes:
                problems.add("box for unknown image", path, where,
                             f"boxes for image {rec['file_name']!r}, which is not in the own data",
                             "set file_name to the image's path relative to the image root (or its file name), "
                             "add the image to the source, or remove its boxes")
            continue
        image = own.loc[row]
        if image["width"] and (rec["width"], rec["height"]) != (image["width"], image["height"]):
            problems.add("box image size mismatch", path, where,
                         f"size {rec['width']}x{rec['height']} differs from the image's "
                         f"{image['width']}x{image['height']} ({image['source_image']})",
                         "give the image's real width and height (boxes are in its pixels)")
        remap[rec["id"]] = int(image["image_id"])
    annotations = [{**a, "image_id": remap[a["image_id"]]} for a in doc["annotations"] if a["image_id"] in remap]
    return {"annotations": annotations, "categories": doc["categories"]}


def load_own_data(spec: dict | OwnSource, base_dir: str | Path = ".", check_images: bool = True) -> OwnData:
    """Read and validate a source (every problem at once, see the module docstring); ``check_images=False``
    skips opening the images (sizes are then 0; used for counting only)."""
    src = spec if isinstance(spec, OwnSource) else OwnSource.from_spec(spec, base_dir)
    problems = Problems(src)
    if src.boxes_json and not src.boxes_json.is_file():
        problems.add("unreadable file", describe_path(src.boxes_json), None, "boxes JSON not found",
                     f"check {CONFIG_KEY}.boxes_json or remove it")
        src_boxes = False
    else:
        src_boxes = bool(src.boxes_json)
    rows = _rows(src, problems)
    images = _check_images(src, rows, problems, check_images)
    if not rows and not problems:
        problems.add("empty caption", src.path, None, "no captions", "add at least one image with a caption")
    good = [r for r in rows if r["caption"] is not None and r.get("key") in images]
    captions = _caption_frame(good, images) if good else pd.DataFrame(columns=OWN_COLUMNS)
    instances = _boxes(src, captions, problems) if src_boxes and check_images and len(captions) else None
    problems.raise_if_any()
    return OwnData(src, captions, instances)


#: the keys of a source that the ``counterfactory data own-*`` options give (each overrides ``data.source``'s)
SOURCE_OPTIONS = ("kind", "path", "image_column", "caption_column", "id_column", "image_root", "boxes_json")


def load_own_source(source: dict | None, given: dict) -> OwnData:
    """The source ``source`` (the configuration's ``data.source``, or None) with every key of ``given`` that is not
    None over it, validated and loaded (:func:`load_own_data`). Without a ``path`` it is a :class:`ConfigError`
    naming the fix; ``kind`` defaults to ``folder`` when the path is a folder, else ``table``."""
    spec = dict(source or {})
    spec.update({key: value for key, value in given.items() if value is not None})
    if not spec.get("path"):
        raise ConfigError(f"no own-data source. Fix: pass --path (a caption table or an image folder) or "
                          f"--config with {CONFIG_KEY} set")
    spec.setdefault("kind", "folder" if Path(spec["path"]).is_dir() else "table")
    return load_own_data(spec)


def load_own_captions(spec: dict | OwnSource, base_dir: str | Path = ".") -> pd.DataFrame:
    """The caption table of a source (columns :data:`OWN_COLUMNS`), after full validation."""
    return load_own_data(spec, base_dir).captions


def limit_images(table: pd.DataFrame, n: int | None) -> pd.DataFrame:
    """The captions of the first ``n`` image ids (as ``data.limit_images`` for COCO)."""
    if not n:
        return table
    keep = sorted(table["image_id"].unique())[:n]
    return table[table["image_id"].isin(keep)].reset_index(drop=True)


def count_own_captions(spec: dict | OwnSource, base_dir: str | Path = ".", limit: int | None = None) -> int:
    """Number of captions the caption table will have (after ``limit`` images), without opening the images
    (cheap enough for workflow parse time). Raises :class:`InputError` like :func:`load_own_data`."""
    return int(len(limit_images(load_own_data(spec, base_dir, check_images=False).captions, limit)))


def check_report(data: OwnData) -> dict:
    """The ``own-check`` report: source settings and counts."""
    src, caps = data.source, data.captions
    return {"kind": src.kind, "path": str(src.path), "image_root": str(src.image_root),
            "boxes_json": str(src.boxes_json) if src.boxes_json else None,
            "images": int(caps["image_id"].nunique()), "captions": int(len(caps)),
            "boxes": len(data.instances["annotations"]) if data.instances else 0,
            "categories": len(data.instances["categories"]) if data.instances else 0}


def coco_file_names(captions: pd.DataFrame) -> dict[int, str]:
    """image_id -> file name inside the COCO view's ``<split>/``: the image's own file name, or
    ``<image_id>_<name>`` for every image when two images share a file name."""
    first = captions.drop_duplicates("image_id")
    names = [Path(p).name for p in first["file_name"]]
    unique = len(set(names)) == len(names)
    return {int(i): n if unique else f"{int(i)}_{n}" for i, n in zip(first["image_id"], names)}


#: the Karpathy-layout split file of a view (``annotations/``), for the studies that read one
KARPATHY_NAME = "dataset_own.json"


def karpathy_splits(image_ids, test_fraction: float, val_fraction: float) -> dict[int, str]:
    """image_id -> ``train`` / ``val`` / ``test``: the images ordered by a hash of their id, the first
    ``round_half_up(test_fraction × n)`` to test, the next ``round_half_up(val_fraction × n)`` to val, the rest
    to train. Deterministic, independent of row order, and an image keeps its split when others are added unless
    the counts move past it."""
    import zlib

    for name, value in (("test_fraction", test_fraction), ("val_fraction", val_fraction)):
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{name} {value} is outside [0, 1). Fix: pass a fraction such as 0.1")
    if test_fraction + val_fraction >= 1.0:
        raise ConfigError(f"test_fraction + val_fraction = {test_fraction + val_fraction} leaves no training "
                          "images. Fix: lower one of them")
    ids = sorted({int(i) for i in image_ids}, key=lambda i: (zlib.crc32(f"own-image-{i}".encode()), i))
    n_test, n_val = round_half_up(test_fraction * len(ids)), round_half_up(val_fraction * len(ids))
    return {i: "test" if k < n_test else "val" if k < n_test + n_val else "train" for k, i in enumerate(ids)}


def karpathy_doc(captions: pd.DataFrame, names: dict[int, str], folder: str, splits: dict[int, str]) -> dict:
    """A Karpathy split file (``dataset_coco.json`` layout: ``filepath`` / ``filename`` under the image root,
    ``cocoid`` = the own ``image_id``, ``sentences`` with ``raw`` and lower-case ``tokens``) of the captions."""
    import re

    images = []
    sentid = 0
    for imgid, (image_id, group) in enumerate(captions.groupby("image_id", sort=True)):
        sentences = []
        for caption in group["caption"]:
            sentences.append({"raw": caption, "tokens": re.findall(r"[a-z0-9]+", caption.lower()), "imgid": imgid,
                              "sentid": sentid})
            sentid += 1
        images.append({"filepath": folder, "filename": names[int(image_id)], "imgid": imgid,
                       "split": splits[int(image_id)], "sentids": [s["sentid"] for s in sentences],
                       "sentences": sentences, "cocoid": int(image_id)})
    return {"images": images, "dataset": "own"}


def write_coco_view(data: OwnData, out_root: str | Path, split: str = "val2017", test_fraction: float = 0.2,
                    val_fraction: float = 0.1) -> dict:
    """Write a COCO-layout folder for the source: ``annotations/captions_<split>.json``,
    ``annotations/instances_<split>.json`` (the boxes, or none: COCO readers need the file),
    ``annotations/dataset_own.json`` (Karpathy layout, images split by :func:`karpathy_splits`, for the studies that
    read a Karpathy split file with an image root: spurious-correlation retrieval, CVLD) and ``<split>/`` with a
    symbolic link per image. Built in a temporary sibling folder that replaces ``out_root`` only when complete
    (:func:`counterfactory.io.atomic_dir`); an existing ``out_root`` is replaced only if it is an earlier view (it
    holds :data:`VIEW_MARKER`)."""
    out_root = Path(out_root)
    if out_root.exists() and not (out_root / VIEW_MARKER).is_file():
        raise input_error(describe_path(out_root), None, "exists and is not a view written by own-to-coco",
                          "choose a new --out-root or remove that folder")
    caps = data.captions
    names = coco_file_names(caps)
    first = caps.drop_duplicates("image_id")
    images = [{"id": int(r.image_id), "file_name": names[int(r.image_id)], "width": int(r.width),
               "height": int(r.height), "own_image": r.source_image} for r in first.itertuples()]
    captions_doc = {"info": {"description": f"own data: {data.source.path}"}, "licenses": [], "images": images,
                    "annotations": [{"id": int(r.annotation_id), "image_id": int(r.image_id), "caption": r.caption}
                                    for r in caps.itertuples()]}
    instances = data.instances or {"annotations": [], "categories": []}
    instances_doc = {**captions_doc, "annotations": instances["annotations"], "categories": instances["categories"]}
    splits = karpathy_splits(first["image_id"], test_fraction, val_fraction)
    karpathy = karpathy_doc(caps, names, split, splits)
    report = {**check_report(data), "split": split, "out_root": str(out_root),
              "karpathy_json": f"annotations/{KARPATHY_NAME}",
              "karpathy_splits": dict(sorted(Counter(splits.values()).items()))}
    with atomic_dir(out_root) as tmp:
        (tmp / "annotations").mkdir()
        (tmp / split).mkdir()
        for name, doc in ((f"captions_{split}.json", captions_doc), (f"instances_{split}.json", instances_doc),
                          (KARPATHY_NAME, karpathy)):
            write_json(tmp / "annotations" / name, doc, indent=None)
        for r in first.itertuples():
            os.symlink(r.file_name, tmp / split / names[int(r.image_id)])
        write_json(tmp / VIEW_MARKER, report)
    return report
