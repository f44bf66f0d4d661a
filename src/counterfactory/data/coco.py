"""Readers for the official MS-COCO 2017 annotation files.

* ``captions_<split>.json``: ``{info, licenses, images, annotations}``; each annotation is
  ``{image_id, id, caption}``. Every caption of an image is kept (COCO has 5–7 per image).
* ``instances_<split>.json``: the same plus ``categories``; annotations carry ``bbox [x, y, w, h]``,
  ``category_id``, ``area``, ``iscrowd``, ``segmentation``.

Caption ids follow the COCO-Counterfactuals release: ``{image_id}_{caption_index}``, where
``caption_index`` is the 0-based position of the caption among that image's captions **in file order**
(the order pycocotools' ``imgToAnns`` keeps), not in annotation-id order. Captions are stripped and runs
of whitespace (COCO has stray newlines and double spaces) are collapsed to one space; nothing else is
changed. Images without any caption get no rows.

Bad files raise :class:`InputError` naming the file, the record (``annotations[i] (id …)``) and the fix:
invalid or truncated JSON (with line and column), missing top-level or record keys, wrong value types,
duplicate ids, captions or boxes for unknown image / category ids, empty captions, malformed boxes, an image
width or height that is not a positive integer.

Boxes must be finite (NaN / Infinity, which Python's JSON parser accepts, are errors) and lie inside
their image. A box that sticks out by less than :data:`BOX_TOLERANCE_PX` (1 pixel: rounding of
polygon-derived boxes) is clipped to the image in ``x, y, w, h`` (``bbox`` keeps the file's values);
one that sticks out further is an error naming the file, the annotation id and the fix.

The checks are vectorised (pandas / numpy over the parsed lists); only the error path walks records
one by one, so the 25k-caption val2017 file reads in well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import describe_path, input_error

CAPTION_COLUMNS = ["caption_id", "image_id", "caption_index", "annotation_id", "caption", "file_name", "width",
                   "height"]
IMAGE_KEYS = ("id", "file_name", "width", "height")
CAPTION_KEYS = ("id", "image_id", "caption")
INSTANCE_KEYS = ("id", "image_id", "category_id", "bbox")
CATEGORY_KEYS = ("id", "name")
OFFICIAL = "use the official COCO 2017 file (see docs/studies/coco_counterfactuals.md)"
FIX_RECORD = "fix or remove that record, or re-download the official file"
#: boxes may stick out of their image by less than this (pixels) and are then clipped
BOX_TOLERANCE_PX = 1.0


def read_json(path: str | Path, what: str = "COCO annotation file"):
    """Parse a JSON file; a truncated or invalid file names the line and column where it broke."""
    path = Path(path)
    if not path.is_file():
        problem = f"{what} is a folder, not a file" if path.is_dir() else f"{what} not found"
        raise input_error(describe_path(path), None, problem,
                          "check data.coco_root / the path, see docs/studies/coco_counterfactuals.md")
    try:
        with open(path, "rb") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise input_error(path, f"line {exc.lineno} column {exc.colno}",
                          f"invalid or truncated JSON ({exc.msg}; character {exc.pos} of {path.stat().st_size} bytes)",
                          "re-download or re-extract the file (an interrupted download or unzip truncates it)") from exc
    except UnicodeDecodeError as exc:
        raise input_error(path, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                          "re-download or re-extract the file") from exc


def _require(doc, path: Path, keys: tuple[str, ...]) -> None:
    if not isinstance(doc, dict):
        raise input_error(path, None, f"top level is a JSON {type(doc).__name__}, not an object", OFFICIAL)
    for key in keys:
        if key not in doc:
            found = ", ".join(map(repr, doc)) or "none"
            raise input_error(path, None, f"missing top-level key {key!r} (found: {found})", OFFICIAL)


def _where(section: str, i: int, rec) -> str:
    rid = rec.get("id") if isinstance(rec, dict) else None
    return f"{section}[{i}]" + (f" (id {rid})" if rid is not None else "")


def _records(doc: dict, section: str, keys: tuple[str, ...], path: Path) -> pd.DataFrame:
    """``doc[section]`` as a frame with at least ``keys``; bad records are named by index and id."""
    items = doc[section]
    if not isinstance(items, list):
        raise input_error(path, section, f"is a JSON {type(items).__name__}, not a list", OFFICIAL)
    wanted = set(keys)
    bad = [i for i, rec in enumerate(items) if not isinstance(rec, dict) or not wanted <= rec.keys()]
    if bad:
        i = bad[0]
        rec = items[i]
        if not isinstance(rec, dict):
            raise input_error(path, f"{section}[{i}]", f"is a JSON {type(rec).__name__}, not an object", FIX_RECORD)
        missing = [k for k in keys if k not in rec]
        raise input_error(path, _where(section, i, rec), f"missing key {missing[0]!r}"
                          + (f" ({len(bad)} records in {section!r} lack required keys)" if len(bad) > 1 else ""),
                          FIX_RECORD)
    columns = list(keys)
    if items:
        columns += [k for k in items[0] if k not in wanted]
    frame = pd.DataFrame.from_records(items, columns=columns) if items else pd.DataFrame(columns=columns)
    _int_column(frame, "id", section, items, path)
    dup = frame["id"].duplicated()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        first = int(np.flatnonzero((frame["id"] == frame.at[i, "id"]).to_numpy())[0])
        raise input_error(path, _where(section, i, items[i]), f"duplicate id (also used by {section}[{first}])",
                          "remove the duplicate record or re-download the official file")
    return frame


def _first_bad(mask) -> int:
    return int(np.flatnonzero(np.asarray(mask))[0])


def _int_column(frame: pd.DataFrame, col: str, section: str, items: list, path: Path) -> None:
    """Make ``frame[col]`` int64 in place, or name the first record whose value is not an integer."""
    series = frame[col]
    if not pd.api.types.is_integer_dtype(series.dtype) or pd.api.types.is_bool_dtype(series.dtype):
        # slow path: pandas turned the column into float/object, so look at the parsed JSON values
        for i, rec in enumerate(items):
            value = rec[col]
            if not isinstance(value, int) or isinstance(value, bool):
                raise input_error(path, _where(section, i, rec),
                                  f"{col!r} must be an integer, got {value!r} ({type(value).__name__})", FIX_RECORD)
    frame[col] = series.astype("int64")


def _str_column(frame: pd.DataFrame, col: str, section: str, items: list, path: Path) -> None:
    ok = frame[col].map(lambda v: isinstance(v, str)).to_numpy(bool)
    if not ok.all():
        i = _first_bad(~ok)
        value = frame[col].iat[i]
        raise input_error(path, _where(section, i, items[i]),
                          f"{col!r} must be a string, got {value!r} ({type(value).__name__})", FIX_RECORD)


def load_images(doc: dict, path: Path) -> pd.DataFrame:
    """``doc['images']`` as a frame (``id``, ``file_name``, ``width``, ``height`` and any other keys)."""
    images = _records(doc, "images", IMAGE_KEYS, path)
    for col in ("width", "height"):
        _int_column(images, col, "images", doc["images"], path)
    _str_column(images, "file_name", "images", doc["images"], path)
    bad = ((images["width"] <= 0) | (images["height"] <= 0)).to_numpy(bool)
    if bad.any():
        i = _first_bad(bad)
        raise input_error(path, _where("images", i, doc["images"][i]),
                          f"image {images.at[i, 'file_name']!r} has size {images.at[i, 'width']} x "
                          f"{images.at[i, 'height']} (width x height); both must be positive pixel counts"
                          + (f" ({int(bad.sum()) - 1} more images like this)" if bad.sum() > 1 else ""),
                          "give the image's real width and height (they are copied into every table and box check), "
                          "or re-download the official file")
    return images


def _unknown(path: Path, section: str, items: list, frame: pd.DataFrame, col: str, known, what: str, fix: str):
    unknown = ~frame[col].isin(known).to_numpy(bool)
    if unknown.any():
        i = _first_bad(unknown)
        more = int(unknown.sum()) - 1
        raise input_error(path, _where(section, i, items[i]),
                          f"{what} for unknown {col.replace('_', ' ')} {frame[col].iat[i]}"
                          + (f" ({more} more records like this)" if more else ""), fix)


def load_coco_captions(path: str | Path) -> pd.DataFrame:
    """All captions of a ``captions_*.json`` as a table with columns :data:`CAPTION_COLUMNS`, sorted by
    ``(image_id, caption_index)``: ``caption_id`` (str ``"{image_id}_{caption_index}"``), ``image_id``
    (int64), ``caption_index`` (0-based, file order within the image), ``annotation_id`` (the COCO
    annotation ``id``), ``caption`` (stripped, whitespace collapsed), ``file_name``, ``width``, ``height``."""
    path = Path(path)
    doc = read_json(path)
    _require(doc, path, ("images", "annotations"))
    images = load_images(doc, path).set_index("id")
    items = doc["annotations"]
    if isinstance(items, list) and items and isinstance(items[0], dict) and "bbox" in items[0] \
            and "caption" not in items[0]:
        raise input_error(path, "annotations[0]", "holds boxes, not captions (this is an instances file)",
                          "pass annotations/captions_<split>.json")
    anns = _records(doc, "annotations", CAPTION_KEYS, path)
    if anns.empty:
        raise input_error(path, "annotations", "no captions", "use the official captions_<split>.json file")
    _int_column(anns, "image_id", "annotations", items, path)
    _str_column(anns, "caption", "annotations", items, path)
    _unknown(path, "annotations", items, anns, "image_id", images.index, "caption",
             "the image is missing from 'images'; use captions and images from the same official file")
    text = anns["caption"].str.strip()
    empty = (text == "").to_numpy(bool)
    if empty.any():
        i = _first_bad(empty)
        raise input_error(path, _where("annotations", i, items[i]),
                          f"empty caption {anns.at[i, 'caption']!r} for image {anns.at[i, 'image_id']}",
                          FIX_RECORD)
    out = pd.DataFrame({
        "image_id": anns["image_id"],
        "annotation_id": anns["id"],
        "caption": text.str.replace(r"\s+", " ", regex=True),
    })
    out["caption_index"] = out.groupby("image_id", sort=False).cumcount().astype("int64")
    out["caption_id"] = out["image_id"].astype(str) + "_" + out["caption_index"].astype(str)
    meta = images.loc[out["image_id"].to_numpy(), ["file_name", "width", "height"]].reset_index(drop=True)
    out = pd.concat([out.reset_index(drop=True), meta], axis=1)
    return out.sort_values(["image_id", "caption_index"], kind="stable").reset_index(drop=True)[CAPTION_COLUMNS]


def _fit_boxes(boxes: pd.DataFrame, anns: pd.DataFrame, images: pd.DataFrame, items: list, path: Path) -> pd.DataFrame:
    """Clip boxes that stick out of their image by < BOX_TOLERANCE_PX; name the first that sticks out further."""
    size = images.set_index("id")[["width", "height"]]
    width = size["width"].reindex(anns["image_id"]).to_numpy(dtype="float64")
    height = size["height"].reindex(anns["image_id"]).to_numpy(dtype="float64")
    x, y, w, h = (boxes[c].to_numpy() for c in ("x", "y", "w", "h"))
    overshoot = np.max(np.stack([-x, -y, x + w - width, y + h - height]), axis=0)
    bad = overshoot >= BOX_TOLERANCE_PX
    if bad.any():
        i = _first_bad(bad)
        raise input_error(path, _where("annotations", i, items[i]),
                          f"bbox {anns.at[i, 'bbox']!r} lies outside its {int(width[i])}x{int(height[i])} image "
                          f"{anns.at[i, 'image_id']} by {overshoot[i]:.2f} px"
                          + (f" ({int(bad.sum()) - 1} more boxes like this)" if bad.sum() > 1 else ""),
                          "fix the box (x, y >= 0, x + width <= image width, y + height <= image height) or the "
                          "image size in 'images', or re-download the official file")
    clip = overshoot > 0            # only these change; the others keep their exact values
    x0, y0 = np.clip(x, 0, width), np.clip(y, 0, height)
    x1, y1 = np.clip(x + w, 0, width), np.clip(y + h, 0, height)
    return pd.DataFrame({"x": np.where(clip, x0, x), "y": np.where(clip, y0, y),
                         "w": np.where(clip, x1 - x0, w), "h": np.where(clip, y1 - y0, h)}, index=boxes.index)


def load_coco_instances(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``(images, annotations, categories)`` of an ``instances_*.json``.

    ``annotations`` keeps the file's keys (``id``, ``image_id``, ``category_id``, ``bbox``, ``area``,
    ``iscrowd``, ``segmentation``…) and adds ``x, y, w, h`` (float64, from ``bbox``; clipped to the
    image when it sticks out by less than :data:`BOX_TOLERANCE_PX`, an error beyond), the category
    ``name`` and ``supercategory``; ``iscrowd`` defaults to 0 and ``area`` to NaN when absent.
    ``categories`` has ``id``, ``name``, ``supercategory``."""
    path = Path(path)
    doc = read_json(path)
    _require(doc, path, ("images", "annotations", "categories"))
    images = load_images(doc, path)
    cats = _records(doc, "categories", CATEGORY_KEYS, path)
    _str_column(cats, "name", "categories", doc["categories"], path)
    if "supercategory" not in cats:
        cats["supercategory"] = ""
    items = doc["annotations"]
    anns = _records(doc, "annotations", INSTANCE_KEYS, path)
    for col in ("image_id", "category_id"):
        _int_column(anns, col, "annotations", items, path)
    bbox_ok = anns["bbox"].map(
        lambda b: isinstance(b, list) and len(b) == 4
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in b)).to_numpy(bool)
    if not bbox_ok.all():
        i = _first_bad(~bbox_ok)
        raise input_error(path, _where("annotations", i, items[i]),
                          f"bbox {anns.at[i, 'bbox']!r} is not [x, y, width, height] (four numbers)", FIX_RECORD)
    boxes = pd.DataFrame(np.asarray(anns["bbox"].tolist(), dtype="float64").reshape(-1, 4),
                         columns=["x", "y", "w", "h"])
    finite = np.isfinite(boxes.to_numpy()).all(axis=1)
    if not finite.all():
        i = _first_bad(~finite)
        raise input_error(path, _where("annotations", i, items[i]),
                          f"bbox {anns.at[i, 'bbox']!r} has a NaN or infinite coordinate"
                          + (f" ({int((~finite).sum()) - 1} more boxes like this)" if (~finite).sum() > 1 else ""),
                          FIX_RECORD)
    negative = ((boxes["w"] < 0) | (boxes["h"] < 0)).to_numpy(bool)
    if negative.any():
        i = _first_bad(negative)
        raise input_error(path, _where("annotations", i, items[i]),
                          f"bbox {anns.at[i, 'bbox']!r} has a negative width or height", FIX_RECORD)
    fix = "use images, categories and annotations from the same official file"
    _unknown(path, "annotations", items, anns, "image_id", images["id"], "box", fix)
    _unknown(path, "annotations", items, anns, "category_id", cats["id"], "box", fix)
    boxes = _fit_boxes(boxes, anns, images, items, path)
    anns = pd.concat([anns.reset_index(drop=True), boxes], axis=1)
    anns = anns.merge(cats[["id", "name", "supercategory"]].rename(columns={"id": "category_id"}),
                      on="category_id", how="left", sort=False)
    if "iscrowd" not in anns:
        anns["iscrowd"] = 0
    anns["iscrowd"] = anns["iscrowd"].fillna(0).astype("int64")
    anns["area"] = anns["area"].astype("float64") if "area" in anns else np.nan
    return images, anns, cats


#: the columns of :func:`instance_boxes` (``counterfactory data instances``)
BOX_TABLE_COLUMNS = ["annotation_id", "image_id", "category_id", "category_name", "supercategory", "x", "y", "w", "h",
                     "area", "iscrowd"]


def instance_boxes(path: str | Path) -> pd.DataFrame:
    """The boxes of an ``instances_*.json`` as a table (:data:`BOX_TABLE_COLUMNS`), one row per box, sorted by
    ``image_id, annotation_id``: :func:`load_coco_instances`' annotations with ``id`` as ``annotation_id`` and the
    category ``name`` as ``category_name``."""
    _, boxes, _ = load_coco_instances(path)
    cols = ["id", "image_id", "category_id", "name", "supercategory", "x", "y", "w", "h", "area", "iscrowd"]
    table = boxes[cols].rename(columns={"id": "annotation_id", "name": "category_name"})
    return table.sort_values(["image_id", "annotation_id"], kind="stable").reset_index(drop=True)


def segmentation_mask(segmentation, height: int, width: int) -> np.ndarray:
    """Boolean ``(height, width)`` mask of one COCO ``segmentation``, rasterised by pycocotools (the official
    COCO API, so the pixels match its ``annToMask``): a list of polygons (flat ``[x1, y1, x2, y2, ...]`` lists
    of at least three points; their union), an uncompressed RLE (``{"size": [h, w], "counts": [ints]}``,
    column-major runs starting with background, as crowd annotations use) or a compressed RLE (``counts`` a
    string). A malformed value or an RLE whose ``size`` is not ``[height, width]`` raises :class:`ValueError`
    with the reason; callers name the file and record."""
    from pycocotools import mask as mask_utils

    height, width = int(height), int(width)
    if isinstance(segmentation, dict):
        size, counts = segmentation.get("size"), segmentation.get("counts")
        if not (isinstance(size, (list, tuple)) and len(size) == 2) or counts is None:
            raise ValueError(f"an RLE needs 'size' [height, width] and 'counts', got keys {sorted(segmentation)}")
        if [int(size[0]), int(size[1])] != [height, width]:
            raise ValueError(f"the RLE is {int(size[0])}x{int(size[1])} (HxW) but its image is {height}x{width}")
        if isinstance(counts, str):
            rle = {"size": [height, width], "counts": counts.encode("ascii")}
        elif isinstance(counts, bytes):
            rle = {"size": [height, width], "counts": counts}
        else:
            counts = [int(c) for c in counts]
            if any(c < 0 for c in counts) or sum(counts) != height * width:
                raise ValueError(f"the RLE counts sum to {sum(counts)} (or are negative); a {height}x{width} mask "
                                 f"needs non-negative runs summing to {height * width}")
            rle = mask_utils.frPyObjects({"size": [height, width], "counts": counts}, height, width)
        return mask_utils.decode(rle).astype(bool)
    if not isinstance(segmentation, (list, tuple)) or not segmentation:
        raise ValueError(f"segmentation must be a list of polygons or an RLE dict, got {segmentation!r:.80}")
    polygons = []
    for k, poly in enumerate(segmentation):
        values = np.asarray(poly, dtype="float64").ravel() if isinstance(poly, (list, tuple, np.ndarray)) else None
        if values is None or values.size < 6 or values.size % 2 or not np.isfinite(values).all():
            raise ValueError(f"polygon {k} is not a flat list of at least three finite (x, y) points")
        xs, ys = values[0::2], values[1::2]
        if xs.min() < -BOX_TOLERANCE_PX or ys.min() < -BOX_TOLERANCE_PX or xs.max() > width + BOX_TOLERANCE_PX \
                or ys.max() > height + BOX_TOLERANCE_PX:
            raise ValueError(f"polygon {k} reaches ({xs.min():g}..{xs.max():g}, {ys.min():g}..{ys.max():g}), "
                             f"outside its {width}x{height} (WxH) image")
        polygons.append(values.tolist())
    rles = mask_utils.frPyObjects(polygons, height, width)
    return mask_utils.decode(mask_utils.merge(rles)).astype(bool)
