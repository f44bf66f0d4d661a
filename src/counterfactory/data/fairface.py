"""Reader for FairFace (Kärkkäinen & Joo 2021), the balanced face set of CVLD's retrieval-fairness evaluation
(§5.3, Table 2, Figure 5; queries of Berg et al. 2022).

Layout under ``root`` (reference notes B8)
------------------------------------------
* ``fairface_label_train.csv`` / ``fairface_label_val.csv`` with header ``file,age,gender,race,service_test``;
  ``file`` is the image path relative to ``root`` (``val/1.jpg``);
* ``age`` ∈ :data:`AGES`, ``gender`` ∈ {Male, Female}, ``race`` ∈ :data:`RACES`, ``service_test`` ∈ {True, False}.

Berg et al. used the padding-1.25 images; unpack whichever zip you use so that ``root/<file>`` exists.
:func:`load_fairface` returns ``image_id`` (= ``file``), ``image_path``, ``age``, ``gender``, ``race``,
``service_test`` (bool). A value outside its set is an :class:`~counterfactory.errors.InputError` naming the file,
the line and the allowed values.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from ..errors import input_error
from ..io import read_utf8
from .paths import join_under

AGES = ("0-2", "3-9", "10-19", "20-29", "30-39", "40-49", "50-59", "60-69", "more than 70")
GENDERS = ("Male", "Female")
RACES = ("White", "Black", "Latino_Hispanic", "East Asian", "Southeast Asian", "Indian", "Middle Eastern")
SERVICE_TEST = {"True": True, "False": False}
COLUMNS = ("file", "age", "gender", "race", "service_test")
SPLITS = {"train": "train", "val": "val", "valid": "val", "validation": "val"}
FIX = "use the official fairface_label_{train,val}.csv (header file,age,gender,race,service_test)"


def label_file(root: str | Path, split: str) -> Path:
    if split not in SPLITS:
        raise input_error(root, None, f"unknown FairFace split {split!r}", "use train or val")
    return Path(root) / f"fairface_label_{SPLITS[split]}.csv"


def load_fairface(root: str | Path, split: str = "val", *, check_images: bool = True) -> pd.DataFrame:
    """One row per image of ``fairface_label_<split>.csv``: ``image_id, image_path, age, gender, race,
    service_test``, in file order. With ``check_images`` a missing image is an error naming it."""
    root = Path(root)
    path = label_file(root, split)
    if not path.is_file():
        raise input_error(path, None, "FairFace label file not found", f"download FairFace; {FIX}")
    with io.StringIO(read_utf8(path, f"save the file as UTF-8 or re-download it; {FIX}"), newline="") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise input_error(path, "line 1", f"missing column(s) {missing} (header {header})", FIX)
        index = {c: header.index(c) for c in COLUMNS}
        rows, seen = [], set()
        allowed = {"age": AGES, "gender": GENDERS, "race": RACES, "service_test": tuple(SERVICE_TEST)}
        for lineno, fields in enumerate(reader, start=2):
            if not fields or not any(f.strip() for f in fields):
                continue
            if len(fields) != len(header):
                raise input_error(path, f"line {lineno}", f"{len(fields)} fields for {len(header)} columns", FIX)
            rec = {c: fields[i].strip() for c, i in index.items()}
            if not rec["file"]:
                raise input_error(path, f"line {lineno}", "empty file name", FIX)
            if rec["file"] in seen:
                raise input_error(path, f"line {lineno}", f"image {rec['file']} is listed twice", FIX)
            seen.add(rec["file"])
            for col, values in allowed.items():
                if rec[col] not in values:
                    raise input_error(path, f"line {lineno}", f"{col} {rec[col]!r} is not one of {list(values)}",
                                      FIX)
            image = join_under(root, rec["file"], source=path, record=f"line {lineno}", key="the FairFace root")
            rows.append({"image_id": rec["file"], "image_path": str(image.resolve()),
                         "age": rec["age"], "gender": rec["gender"], "race": rec["race"],
                         "service_test": SERVICE_TEST[rec["service_test"]]})
    if not rows:
        raise input_error(path, None, "has no images", FIX)
    frame = pd.DataFrame(rows)
    if check_images:
        absent = [p for p in frame["image_path"] if not Path(p).is_file()]
        if absent:
            raise input_error(absent[0], None, f"FairFace image not found ({len(absent)} of {len(frame)} missing)",
                              f"unpack the FairFace image zip into {root} so that root/<file> exists")
    return frame
