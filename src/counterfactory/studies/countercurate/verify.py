"""CounterCurate's candidates for the VQA check (:mod:`counterfactory.filters.vqa`, docs/verify.md).

Each row of the three datasets (``datasets/{positions,counting,attributes}.parquet``: the items with their negative
image, §3.2-3.4) is one item: the photograph with its caption and its partner, the negative image (GLIGEN's
generation or inpainting, the text-to-image negative, or the flipped left/right photograph) with the negative
caption (``negative`` in attributes). Item id: ``<dataset>:<item_id>``. Image paths are as the datasets hold them
(absolute, or relative to the working directory like the study's data paths).

The verified variant is the rows the VQA check keeps, the three datasets in one table with a ``dataset`` column.
"""

from __future__ import annotations

import os

import pandas as pd

from ...filters import vqa

DATASETS = ("positions", "counting", "attributes")
NEGATIVE_CAPTION = {"positions": "negative_caption", "counting": "negative_caption", "attributes": "negative"}


def _tables(inputs: dict[str, str]):
    for name in DATASETS:
        if name in inputs:
            cols = ("item_id", "image_path", "caption", NEGATIVE_CAPTION[name], "negative_image")
            yield name, vqa.read_table(inputs[name], cols, f"{name} dataset")


def pair_rows(inputs: dict[str, str]) -> list[dict]:
    """Pair-table rows of ``inputs["positions"]``, ``["counting"]``, ``["attributes"]`` (each optional)."""
    rows = []
    for name, frame in _tables(inputs):
        neg = NEGATIVE_CAPTION[name]
        for r in frame.to_dict("records"):
            rows.append({"item_id": f"{name}:{r['item_id']}", "image_path": r["image_path"], "caption": r["caption"],
                         "partner_image_path": r["negative_image"], "partner_caption": r[neg]})
    return rows


def verified(inputs: dict[str, str], scores: pd.DataFrame, out_dir: str | os.PathLike) -> pd.DataFrame:
    """The dataset rows the VQA check keeps, with their ``dataset``."""
    kept = vqa.kept_ids(scores)
    parts = [frame[(name + ":" + frame["item_id"].astype(str)).isin(kept)].assign(dataset=name)
             for name, frame in _tables(inputs)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
