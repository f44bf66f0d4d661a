"""Readers for the official MS-COCO 2017 annotation files.

* ``captions_<split>.json``: ``{info, licenses, images, annotations}``; each annotation is
  ``{image_id, id, caption}``. Every caption of an image is kept (COCO has 5–7 per image).
* ``instances_<split>.json``: the same plus ``categories``; annotations carry ``bbox [x, y, w, h]``,
  ``category_id``, ``area``, ``iscrowd``, ``segmentation``.

Caption ids follow the COCO-Counterfactuals release: ``{image_id}_{caption_index}``, where
``caption_index`` is the 0-based position of the caption among that image's captions **in file order**
(the order pycocotools' ``imgToAnns`` keeps). Bad files raise :class:`InputError` naming the file, the
record and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..errors import input_error

CAPTION_COLUMNS = ["caption_id", "image_id", "caption_index", "annotation_id", "caption", "file_name", "width",
                   "height"]
IMAGE_KEYS = ("id", "file_name", "width", "height")
CAPTION_KEYS = ("id", "image_id", "caption")
INSTANCE_KEYS = ("id", "image_id", "category_id", "bbox")


def read_json(path: str | Path, what: str = "COCO annotation file") -> dict:
    """Parse a JSON file; a truncated or invalid file names the line and column where it broke."""
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, f"{what} not found", "check data.coco_root / the path, see README 'Getting MS-COCO'")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise input_error(path, f"line {exc.lineno} column {exc.colno}", f"invalid or truncated JSON ({exc.msg})",
                          "re-download or re-extract the file") from exc


def _require(doc: dict, path: Path, keys: tuple[str, ...]) -> None:
    if not isinstance(doc, dict):
        raise input_error(path, None, "top level is not a JSON object", "use the official COCO 2017 file")
    for key in keys:
        if key not in doc:
            raise input_error(path, None, f"missing top-level key {key!r}", "use the official COCO 2017 file")


def _records(doc: dict, section: str, keys: tuple[str, ...], path: Path) -> pd.DataFrame:
    items = doc[section]
    if not isinstance(items, list):
        raise input_error(path, section, "is not a list", "use the official COCO 2017 file")
    for i, rec in enumerate(items):
        if not isinstance(rec, dict):
            raise input_error(path, f"{section}[{i}]", "is not an object", "fix or remove that record")
        for key in keys:
            if key not in rec:
                raise input_error(path, f"{section}[{i}] (id {rec.get('id')})", f"missing key {key!r}",
                                  "fix or remove that record")
    frame = pd.DataFrame.from_records(items, columns=list(dict.fromkeys([*keys, *(items[0].keys() if items else [])])))
    dup = frame["id"].duplicated()
    if dup.any():
        i = int(dup.to_numpy().nonzero()[0][0])
        raise input_error(path, f"{section}[{i}] (id {frame.at[i, 'id']})", "duplicate id", "remove the duplicate record")
    return frame


def load_images(doc: dict, path: Path) -> pd.DataFrame:
    images = _records(doc, "images", IMAGE_KEYS, path)
    bad = pd.to_numeric(images["id"], errors="coerce").isna()
    if bad.any():
        i = int(bad.to_numpy().nonzero()[0][0])
        raise input_error(path, f"images[{i}]", f"id {images.at[i, 'id']!r} is not an integer", "fix that record")
    return images.astype({"id": "int64"})


def load_coco_captions(path: str | Path) -> pd.DataFrame:
    """All captions of a ``captions_*.json`` as a table with columns :data:`CAPTION_COLUMNS`,
    sorted by ``(image_id, caption_index)``."""
    path = Path(path)
    doc = read_json(path)
    _require(doc, path, ("images", "annotations"))
    images = load_images(doc, path).set_index("id")
    anns = _records(doc, "annotations", CAPTION_KEYS, path)
    if anns.empty:
        raise input_error(path, "annotations", "no captions", "use a captions_*.json file, not instances_*.json")
    unknown = ~anns["image_id"].isin(images.index)
    if unknown.any():
        i = int(unknown.to_numpy().nonzero()[0][0])
        raise input_error(path, f"annotations[{i}] (id {anns.at[i, 'id']})",
                          f"caption for unknown image id {anns.at[i, 'image_id']}",
                          "the image is missing from 'images'; use matching official files")
    not_text = ~anns["caption"].map(lambda c: isinstance(c, str))
    text = anns["caption"].where(~not_text, "").str.strip()
    empty = text == ""
    if empty.any():
        i = int(empty.to_numpy().nonzero()[0][0])
        raise input_error(path, f"annotations[{i}] (id {anns.at[i, 'id']})", "empty or non-text caption",
                          "fix or remove that annotation")
    out = pd.DataFrame({
        "image_id": anns["image_id"].astype("int64"),
        "annotation_id": anns["id"].astype("int64"),
        "caption": text.str.replace(r"\s+", " ", regex=True),
    })
    out["caption_index"] = out.groupby("image_id").cumcount()
    out["caption_id"] = out["image_id"].astype(str) + "_" + out["caption_index"].astype(str)
    meta = images.loc[out["image_id"], ["file_name", "width", "height"]].reset_index(drop=True)
    out = pd.concat([out.reset_index(drop=True), meta], axis=1)
    return out.sort_values(["image_id", "caption_index"], kind="stable").reset_index(drop=True)[CAPTION_COLUMNS]


def load_coco_instances(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``(images, annotations, categories)`` of an ``instances_*.json``. Annotations get the category
    ``name`` joined and ``bbox`` split into float columns ``x, y, w, h``."""
    path = Path(path)
    doc = read_json(path)
    _require(doc, path, ("images", "annotations", "categories"))
    images = load_images(doc, path)
    cats = _records(doc, "categories", ("id", "name"), path)
    anns = _records(doc, "annotations", INSTANCE_KEYS, path) if doc["annotations"] else pd.DataFrame(
        columns=[*INSTANCE_KEYS, "area", "iscrowd"])
    for i, (bbox, img, cat) in enumerate(zip(anns["bbox"], anns["image_id"], anns["category_id"])):
        if not (isinstance(bbox, list) and len(bbox) == 4):
            raise input_error(path, f"annotations[{i}] (id {anns.at[i, 'id']})", "bbox is not [x, y, w, h]", "fix that record")
    unknown_img = ~anns["image_id"].isin(images["id"])
    unknown_cat = ~anns["category_id"].isin(cats["id"])
    for mask, what in ((unknown_img, "image id"), (unknown_cat, "category id")):
        if mask.any():
            i = int(mask.to_numpy().nonzero()[0][0])
            col = "image_id" if what == "image id" else "category_id"
            raise input_error(path, f"annotations[{i}] (id {anns.at[i, 'id']})", f"unknown {what} {anns.at[i, col]}",
                              "use matching official files")
    boxes = pd.DataFrame(anns["bbox"].tolist() or [], columns=["x", "y", "w", "h"], dtype="float64")
    anns = pd.concat([anns.reset_index(drop=True), boxes], axis=1)
    anns = anns.merge(cats[["id", "name"]].rename(columns={"id": "category_id"}), on="category_id", how="left")
    for col, default in (("iscrowd", 0), ("area", float("nan"))):
        if col not in anns:
            anns[col] = default
    return images, anns, cats
