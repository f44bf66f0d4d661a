"""Readers of the evaluation's input and result tables: one reader per table schema.

=====================================  ==========================================================================
reader                                 table (schema)
=====================================  ==========================================================================
:func:`read_pairs`                     the image stage's ``selected_pairs.parquet`` (``id, caption_0, caption_1,
                                       image_0, image_1`` [, ``caption_id``, ``image_id``, ...])
:func:`read_captions`                  the data stage's caption table (``caption_id, image_id, caption``
                                       [, ``file_name``])
:func:`read_subset_ids`                an ``itr.subsets`` id list (CSV/parquet with an ``id`` column)
:func:`read_itr_results`               per-model ITR results of ``evaluate itr`` (long: ``role, model, dataset,
                                       metric, value`` [, ``n_pairs, n_images, n_texts``])
:func:`read_itm_results`               per-model ITM differences of ``evaluate itm`` (``role, model, IR_r, IR_c,
                                       TR_r, TR_c`` and the six scores)
:func:`read_classification_results`    JSON results of ``evaluate classify``
=====================================  ==========================================================================

Every reader raises :class:`~counterfactory.errors.InputError` naming the file, the record and the fix.
The helpers below them map pairs to their MS-COCO images (:func:`pair_image_ids`, :func:`image_files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from ..errors import InputError, input_error
from ..io import read_table
from .settings import ITM_METRICS, ITM_SCORES

PAIR_COLUMNS = ("id", "caption_0", "caption_1", "image_0", "image_1")
CAPTION_COLUMNS = ("caption_id", "image_id", "caption")
ITR_RESULT_COLUMNS = ("role", "model", "dataset", "metric", "value")
ITM_RESULT_COLUMNS = ("role", "model", *ITM_METRICS)


def _read_table(path: str | os.PathLike, what: str, fix: str, columns: Sequence[str] = ()) -> pd.DataFrame:
    """A CSV (all columns as text) or parquet file with the required ``columns``."""
    return read_table(path, what, fix, columns, csv_dtype=str)


def _concat(paths: Sequence[str | os.PathLike], read) -> pd.DataFrame:
    if not paths:
        raise InputError("no result files given. Fix: pass at least one file")
    return pd.concat([read(p) for p in paths], ignore_index=True)


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------
def read_pairs(path: str | os.PathLike) -> pd.DataFrame:
    """The image stage's ``selected_pairs.parquet`` with ``image_0``/``image_1`` resolved to paths
    (relative paths are relative to the parquet's folder, as the image stage writes them)."""
    path = Path(path)
    fix = "run the image stage (`snakemake ... images_merge`) or pass its selected_pairs.parquet"
    df = _read_table(path, "selected pairs table", fix, PAIR_COLUMNS)
    if df.empty:
        raise input_error(path, None, "no selected pairs", "the image stage kept no pair; check its filter settings")
    df = df.reset_index(drop=True).copy()
    df["id"] = df["id"].astype(str)
    dup = df["id"].duplicated()
    if dup.any():
        raise input_error(path, int(dup.idxmax()), f"duplicate id {df['id'][dup].iloc[0]!r}", "ids must be unique")
    for col in ("image_0", "image_1"):
        df[col] = [str(p if Path(p).is_absolute() else path.parent / p) for p in df[col].astype(str)]
    for col in ("caption_0", "caption_1"):
        empty = df[col].isna() | (df[col].astype(str).str.strip() == "")
        if empty.any():
            raise input_error(path, f"id {df['id'][empty].iloc[0]}", f"empty {col}", "fix the image stage output")
    return df


def read_captions(path: str | os.PathLike) -> pd.DataFrame:
    """The caption table (``caption_id, image_id, caption`` [, ``file_name``]); ids as strings."""
    df = _read_table(path, "caption table", "run the data stage (`snakemake ... data_captions`)", CAPTION_COLUMNS)
    df = df.copy()
    df["caption_id"] = df["caption_id"].astype(str)
    df["image_id"] = df["image_id"].astype(str)
    return df


def read_subset_ids(path: str | os.PathLike) -> set[str]:
    """The pair ids of an ``evaluation.itr.subsets`` entry."""
    df = _read_table(path, "subset id list", "write a CSV or parquet file with an 'id' column", ("id",))
    return set(df["id"].astype(str))


# --------------------------------------------------------------------------------------------
# per-model results
# --------------------------------------------------------------------------------------------
def _numeric(frame: pd.DataFrame, columns: Iterable[str], path) -> pd.DataFrame:
    for col in columns:
        if col not in frame.columns:
            continue
        values = pd.to_numeric(frame[col], errors="coerce")
        bad = values.isna() & frame[col].notna() & (frame[col].astype(str).str.strip() != "")
        if bad.any():
            row = int(bad.idxmax())
            raise input_error(path, row, f"{col} {frame[col][row]!r} is not a number",
                              "pass files written by `counterfactory evaluate`")
        frame[col] = values
    return frame


def read_itr_results(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """The long ITR results of ``evaluate itr`` (one file per model), concatenated."""
    def one(p):
        frame = _read_table(p, "ITR result", "run `counterfactory evaluate itr` first", ITR_RESULT_COLUMNS)
        return _numeric(frame, ("value", "n_pairs", "n_images", "n_texts"), p)

    return _concat(paths, one)


def read_itm_results(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """The per-pair ITM differences of ``evaluate itm`` (one file per model), concatenated."""
    def one(p):
        frame = _read_table(p, "ITM difference table", "pass files written by `counterfactory evaluate itm`",
                            ITM_RESULT_COLUMNS)
        return _numeric(frame, (*ITM_METRICS, *ITM_SCORES), p)

    return _concat(paths, one)


def read_classification_results(paths: Sequence[str | os.PathLike]) -> list[dict]:
    """The JSON results of ``evaluate classify`` (one per model and dataset)."""
    fix = "run `counterfactory evaluate classify`"
    out = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise input_error(p, None, "classification result not found", fix)
        try:
            result = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise input_error(p, None, f"not valid JSON ({exc})", "rerun the classification step") from exc
        missing = [k for k in ("role", "model", "dataset") if not isinstance(result, dict) or k not in result]
        if missing:
            raise input_error(p, None, f"missing key(s) {missing}", fix)
        out.append(result)
    if not out:
        raise InputError("no classification results given. Fix: pass the JSON files of `counterfactory evaluate classify`")
    return out


# --------------------------------------------------------------------------------------------
# pairs -> MS-COCO images
# --------------------------------------------------------------------------------------------
def coco_image_dir(cfg: dict) -> Path:
    return Path(cfg["data"]["coco_root"]) / cfg["data"]["split"]


def image_files(captions: pd.DataFrame, coco_dir: Path) -> dict[str, str]:
    """image_id -> path: the table's ``file_name`` if present, else COCO 2017's ``{id:012d}.jpg``."""
    if "file_name" in captions.columns:
        first = captions.drop_duplicates("image_id").set_index("image_id")["file_name"]
        return {i: str(coco_dir / f) for i, f in first.items()}
    out = {}
    for i in captions["image_id"].unique():
        try:
            out[i] = str(coco_dir / f"{int(i):012d}.jpg")
        except ValueError:
            out[i] = str(coco_dir / f"{i}.jpg")
    return out


def pair_image_ids(pairs: pd.DataFrame, captions: pd.DataFrame, pairs_path: str | os.PathLike = "<pairs>") -> list[str]:
    """The MS-COCO image id of each pair: its ``image_id`` column, else the caption table's row for its
    ``caption_id`` (or its ``id``), else the ``{image_id}_{caption_index}`` prefix of the id."""
    by_caption = dict(zip(captions["caption_id"], captions["image_id"]))
    known = set(captions["image_id"])
    out = []
    for _, row in pairs.iterrows():
        cand = None
        if "image_id" in pairs.columns and isinstance(row.get("image_id"), str) and row["image_id"] not in ("", "None"):
            cand = row["image_id"]
        if cand is None:
            cand = by_caption.get(str(row.get("caption_id", row["id"]))) or by_caption.get(row["id"])
        if cand is None:
            cand = row["id"].split("_")[0]
        if cand not in known:
            raise input_error(pairs_path, f"id {row['id']}", f"its MS-COCO image {cand!r} is not in the caption table",
                              "evaluate with the caption table the pairs were made from (same data.split / limit_images)")
        out.append(cand)
    return out


def check_files(paths: Iterable[str], what: str) -> None:
    """An InputError for the first of ``paths`` that does not exist."""
    for p in paths:
        if not Path(p).exists():
            raise input_error(p, None, f"{what} not found",
                              "check data.coco_root / data.split, or rerun the stage that writes it")
