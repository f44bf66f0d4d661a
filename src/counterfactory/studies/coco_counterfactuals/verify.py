"""COCO-Counterfactuals' candidates for the VQA check (:mod:`counterfactory.filters.vqa`, docs/verify.md).

Each selected pair (``images/selected_pairs.parquet``: the CLIP filter's survivors, §3.2) is one item: image 0
with caption 0 and its partner, image 1 with caption 1 (the one-noun edit, §3.1). The verified variant is the
selected pairs the VQA check keeps, in the same layout (image paths relative to the verify folder).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ...filters import vqa

COLUMNS = ("id", "caption_0", "caption_1", "image_0", "image_1")
WHAT = "selected-pairs table"


def pair_rows(inputs: dict[str, str]) -> list[dict]:
    """Pair-table rows of ``inputs["candidates"]`` (the selected pairs)."""
    path = Path(inputs["candidates"])
    frame = vqa.read_table(path, COLUMNS, WHAT)
    base = path.parent
    return [{"item_id": str(r["id"]), "image_path": vqa.resolve(base, r["image_0"]), "caption": r["caption_0"],
             "partner_image_path": vqa.resolve(base, r["image_1"]), "partner_caption": r["caption_1"]}
            for r in frame.to_dict("records")]


def verified(inputs: dict[str, str], scores: pd.DataFrame, out_dir: str | os.PathLike) -> pd.DataFrame:
    """The selected pairs whose item the VQA check keeps, image paths relative to ``out_dir``."""
    path = Path(inputs["candidates"])
    frame = vqa.read_table(path, COLUMNS, WHAT)
    out = frame[frame["id"].astype(str).isin(vqa.kept_ids(scores))].reset_index(drop=True)
    for col in ("image_0", "image_1"):
        out[col] = vqa.rebase(out[col].tolist(), path.parent, out_dir)
    return out
