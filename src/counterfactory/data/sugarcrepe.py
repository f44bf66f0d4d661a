"""Reader for SugarCrepe (Hsieh et al., NeurIPS 2023 D&B; repository ``RAIVNLab/sugar-crepe``), the benchmark of
CounterCurate §4.4 (Tables 3 and 6).

Files (reference notes B4)
--------------------------
``data/{add_att,add_obj,replace_att,replace_obj,replace_rel,swap_att,swap_obj}.json``: each a JSON object from
``"0"``, ``"1"``, ... to ``{"filename": "000000085329.jpg", "caption": ..., "negative_caption": ...}``. The file
names refer to MS-COCO val2017 images. Official counts: 692 / 2062 / 788 / 1652 / 1406 / 666 / 245 (CounterCurate
appendix G says 246 for swap_obj; the file has 245).

Output
------
:func:`read_sugarcrepe` returns one row per item with the columns :data:`COLUMNS`: ``category`` (the file stem),
``item_id`` (the key in the file, a string), ``filename``, ``image_path`` (absolute; under the images root, i.e. the
COCO ``val2017`` folder), ``caption`` (positive) and ``negative_caption``. Rows keep the file order (categories in
the order asked for, items in file order).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import pandas as pd

from ..errors import describe_path, input_error
from .coco import read_json
from .paths import join_under

log = logging.getLogger(__name__)

CATEGORIES: tuple[str, ...] = (
    "add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj",
)
"""The seven SugarCrepe categories (file stems of ``RAIVNLab/sugar-crepe`` ``data/*.json``)."""
#: keys every item of a category file must have (B4)
KEYS = ("filename", "caption", "negative_caption")
COLUMNS = ["category", "item_id", "filename", "image_path", "caption", "negative_caption"]
#: official item counts per category file (B4); logged when a file differs (a subset or another version)
OFFICIAL_COUNTS = {"add_att": 692, "add_obj": 2062, "replace_att": 788, "replace_obj": 1652, "replace_rel": 1406,
                   "swap_att": 666, "swap_obj": 245}
FIX = ("use the official file from github.com/RAIVNLab/sugar-crepe (data/<category>.json: an object from \"0\", "
       "\"1\", ... to {\"filename\", \"caption\", \"negative_caption\"})")


def category_file(data_dir: str | Path, category: str) -> Path:
    """``<data_dir>/<category>.json``; ``data_dir`` may also be the repository root holding ``data/``."""
    data_dir = Path(data_dir)
    path = data_dir / f"{category}.json"
    if not path.exists() and (data_dir / "data" / f"{category}.json").exists():
        path = data_dir / "data" / f"{category}.json"
    return path


def read_category(path: str | Path, category: str, images_root: str | Path | None = None) -> pd.DataFrame:
    """The items of one category file (columns :data:`COLUMNS`). A missing key, a non-string value or a wrong
    top level is an :class:`~counterfactory.errors.InputError` naming the file and the record."""
    path = Path(path)
    if not path.is_file():
        raise input_error(describe_path(path), None, f"SugarCrepe file of category {category!r} not found",
                          "point benchmarks.sugarcrepe.root at the folder holding the seven <category>.json files "
                          "(the data/ folder of RAIVNLab/sugar-crepe)")
    doc = read_json(path, "SugarCrepe category file")
    if not isinstance(doc, dict):
        raise input_error(path, None, f"top level is a JSON {type(doc).__name__}, not an object", FIX)
    if not doc:
        raise input_error(path, None, "has no items", FIX)
    root = Path(images_root).resolve() if images_root is not None else None
    rows = []
    for key, rec in doc.items():
        where = f"item {key!r}"
        if not isinstance(rec, dict):
            raise input_error(path, where, f"is a JSON {type(rec).__name__}, not an object", FIX)
        missing = [k for k in KEYS if k not in rec]
        if missing:
            found = ", ".join(map(repr, rec)) or "none"
            raise input_error(path, where, f"missing key {', '.join(map(repr, missing))} (found: {found})", FIX)
        for k in KEYS:
            if not isinstance(rec[k], str) or not rec[k].strip():
                raise input_error(path, where, f"{k!r} is {rec[k]!r}, not a non-empty string", FIX)
        image_path = (str(join_under(root, rec["filename"], source=path, record=where, key="the images root"))
                      if root is not None else None)
        rows.append({"category": category, "item_id": str(key), "filename": rec["filename"], "image_path": image_path,
                     "caption": rec["caption"], "negative_caption": rec["negative_caption"]})
    if category in OFFICIAL_COUNTS and len(rows) != OFFICIAL_COUNTS[category]:
        log.info("SugarCrepe %s: %d items (the official file has %d)", category, len(rows), OFFICIAL_COUNTS[category])
    return pd.DataFrame(rows, columns=COLUMNS)


def read_sugarcrepe(data_dir: str | Path, images_root: str | Path | None = None,
                    categories: Sequence[str] | None = None, *, check_images: bool = True) -> pd.DataFrame:
    """All items of ``categories`` (default the seven of :data:`CATEGORIES`) read from ``data_dir``.

    ``images_root``: the MS-COCO ``val2017`` folder; ``image_path`` is then absolute. With ``check_images`` a
    missing image file is an error naming the category file, the item and the path (the paper's accuracies are
    over every item, §4.4). Without ``images_root`` the ``image_path`` column is None.
    """
    categories = list(CATEGORIES if categories is None else categories)
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise input_error(data_dir, None, f"unknown SugarCrepe categories {unknown}",
                          f"use some of {', '.join(CATEGORIES)}")
    if not categories:
        raise input_error(data_dir, None, "no SugarCrepe category asked for", f"use some of {', '.join(CATEGORIES)}")
    frames = []
    for category in categories:
        path = category_file(data_dir, category)
        frame = read_category(path, category, images_root)
        if images_root is not None and check_images:
            exists = frame["image_path"].map(lambda p: Path(p).is_file())
            if not exists.all():
                bad = frame[~exists]
                raise input_error(path, f"item {bad['item_id'].iloc[0]!r}",
                                  f"image {bad['image_path'].iloc[0]} not found ({len(bad)} of {len(frame)} images "
                                  f"of {category} are missing)",
                                  "point benchmarks.sugarcrepe.images at the MS-COCO val2017 folder")
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)
