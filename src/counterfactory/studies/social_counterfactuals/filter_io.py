"""Table files of the SocialCounterfactuals filter (§3.4, §8.3): reading and writing the candidate-image
tables and the per-set tables of the three stages (parquet or CSV); a missing, unreadable or incomplete
file raises a clear :class:`InputError`.

Image rows carry ``image_path`` relative to their table's folder on disk and absolute in memory
(:func:`read_images` resolves, :func:`write_images` relativises). :func:`read_labels` reads the calibration's
hand labels (the file format is in :mod:`.filtering`'s docstring). The stages and the calibration live in
:mod:`.filtering`, Table 11 in :mod:`.filter_table`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from ... import io
from ...errors import input_error
from ...io import write_csv, write_parquet

#: a candidate set (§3.3: one over-generation of a caption set)
SET_KEYS = ("set_id", "candidate_index")
CANDIDATE_COLUMNS = ("set_id", "candidate_index", "member_index", "caption", "image_path")
LABEL_COLUMNS = ("set_id", "candidate_index", "attribute_type", "label")


def read_table(path: str | os.PathLike, what: str, columns: Sequence[str] = ()) -> pd.DataFrame:
    """A parquet or CSV table with the required ``columns`` (clear :class:`InputError` otherwise); set ids stay text."""
    return io.read_table(path, what, f"check the path and that the step producing the {what} has run", columns,
                         csv_dtype={"set_id": str})


def read_images(path: str | os.PathLike) -> pd.DataFrame:
    """A candidate-image table with ``image_path`` resolved (relative paths are relative to its folder),
    ``set_id`` as text, indexes as integers, rows sorted by set and member."""
    path = Path(path)
    frame = read_table(path, "candidate-image table", CANDIDATE_COLUMNS)
    frame = frame.assign(set_id=frame["set_id"].astype(str))
    for col in ("candidate_index", "member_index"):
        try:
            frame[col] = frame[col].astype(np.int64)
        except (TypeError, ValueError):
            raise input_error(path, None, f"column {col} holds non-integers", "regenerate the table") from None
    dup = frame.duplicated([*SET_KEYS, "member_index"])
    if dup.any():
        r = frame[dup].iloc[0]
        raise input_error(path, f"set {r.set_id} candidate {r.candidate_index} member {r.member_index}",
                          "duplicate image row", "keep one row per (set_id, candidate_index, member_index)")
    base = path.resolve().parent
    frame["image_path"] = [p if os.path.isabs(p) else str(base / p) for p in frame["image_path"].astype(str)]
    return frame.sort_values([*SET_KEYS, "member_index"], kind="stable").reset_index(drop=True)


def _write_table(path: str | os.PathLike, frame: pd.DataFrame) -> Path:
    return write_csv(path, frame) if str(path).lower().endswith(".csv") else write_parquet(path, frame)


def write_images(path: str | os.PathLike, frame: pd.DataFrame) -> Path:
    """Write surviving image rows with ``image_path`` relative to the output's folder."""
    base = Path(path).resolve().parent
    rel = [os.path.relpath(p, base) for p in frame["image_path"]]
    return _write_table(path, frame.assign(image_path=rel))


def read_labels(path: str | os.PathLike, detect_sets: pd.DataFrame) -> pd.DataFrame:
    """The hand labels of phase 1 (§8.3) joined with stage (c)'s counts.

    ``path``: CSV with ``set_id, candidate_index, attribute_type, label`` (label 1 = keep, 0 = filter out;
    one row per labelled set and type). ``detect_sets``: stage (c)'s per-set table (``set_id,
    candidate_index, segment, count_<type>``). Returns ``set_id, candidate_index, segment,
    attribute_type, label, count``. Raises :class:`InputError` naming the file, the row (its line number;
    the header is row 1) and the fix for: missing columns, a label other than 0/1, a non-integer candidate
    index, a set not in the stage (c) table, a type that is not one of that set's segment, a duplicate
    (set, type).
    """
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "label file not found",
                          "write it with `counterfactory social calibrate --write-template FILE` and fill in labels")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as exc:  # pandas raises several types for malformed CSV
        raise input_error(path, None, f"not a readable CSV file ({exc})", "save the labels as CSV") from exc
    missing = [c for c in LABEL_COLUMNS if c not in raw.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {missing}",
                          f"the label file needs the header {','.join(LABEL_COLUMNS)}")
    sets = detect_sets.assign(set_id=detect_sets["set_id"].astype(str),
                              candidate_index=detect_sets["candidate_index"].astype(int))
    sets = sets.set_index(["set_id", "candidate_index"])
    types_of = {}
    for col in (c for c in sets.columns if c.startswith("count_")):
        for key in sets.index[sets[col].notna()]:
            types_of.setdefault(key, set()).add(col[len("count_"):])
    out, seen = [], {}
    for i, r in enumerate(raw.itertuples(index=False), start=2):
        rec = f"row {i}"
        label = str(r.label).strip()
        if label not in ("0", "1"):
            raise input_error(path, rec, f"label {r.label!r} is not 0 or 1",
                              "write 1 when the set keeps (the attribute is discernible enough) or 0 to filter it out")
        try:
            cand = int(str(r.candidate_index).strip())
        except ValueError:
            raise input_error(path, rec, f"candidate_index {r.candidate_index!r} is not an integer",
                              "copy the candidate_index of the set from the stage (c) table") from None
        key = (str(r.set_id).strip(), cand)
        if key not in sets.index:
            raise input_error(path, rec, f"unknown set {key[0]!r} candidate {cand}: not in the stage (c) table",
                              "label only candidate sets that entered the detectability stage (fix the set_id/"
                              "candidate_index, or pass the matching --sets table)")
        typ = str(r.attribute_type).strip()
        if typ not in types_of.get(key, set()):
            raise input_error(path, rec, f"attribute_type {typ!r} is not a type of this set's segment "
                              f"{sets.loc[key, 'segment']!r}",
                              f"use one of {sorted(types_of.get(key, set()))}")
        if (key, typ) in seen:
            raise input_error(path, rec, f"duplicate label for set {key[0]!r} candidate {cand} type {typ!r} "
                              f"(first at row {seen[(key, typ)]})", "keep one row per set and attribute type")
        seen[(key, typ)] = i
        out.append({"set_id": key[0], "candidate_index": cand, "segment": sets.loc[key, "segment"],
                    "attribute_type": typ, "label": int(label), "count": int(sets.loc[key, f"count_{typ}"])})
    if not out:
        raise input_error(path, None, "no labelled rows", "label at least one set per segment and type")
    return pd.DataFrame(out)
