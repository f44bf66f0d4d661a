"""CVLD's candidates for the VQA check (:mod:`counterfactory.filters.vqa`, docs/verify.md).

Each kept edit of the COCO training images (``coco/edits/<train method>/edits.parquet``: the k edits most similar to
the original, §3.3, §5.1) is one item: the original image with its request's source prompt (a caption naming the
person's gender) and its partner, the edited image with the target prompt (the caption with the gender flipped;
``coco/edits/requests.parquet``). Item id: ``<item_id>:<candidate>``. The verified variant is the edit manifest's
kept rows that the VQA check keeps too (``path`` relative to the verify folder).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ...errors import input_error
from ...filters import vqa

REQUEST_COLUMNS = ("item_id", "image_path", "source_prompt", "target_prompt")
EDIT_COLUMNS = ("item_id", "candidate", "kept", "path")


def _edits(inputs: dict[str, str]) -> pd.DataFrame:
    frame = vqa.read_table(inputs["candidates"], EDIT_COLUMNS, "edit manifest")
    return frame[frame["kept"].astype(bool)]


def _key(item_id, candidate) -> str:
    return f"{item_id}:{candidate}"


def pair_rows(inputs: dict[str, str]) -> list[dict]:
    """Pair-table rows of the kept edits (``inputs["candidates"]``) with their requests (``inputs["requests"]``)."""
    edits_path = Path(inputs["candidates"])
    requests = vqa.read_table(inputs["requests"], REQUEST_COLUMNS, "edit requests").set_index("item_id")
    rows = []
    for r in _edits(inputs).to_dict("records"):
        if r["item_id"] not in requests.index:
            raise input_error(edits_path, f"item_id {r['item_id']}", "no request of that item",
                              f"pass the requests the edits were made from ({inputs['requests']})")
        req = requests.loc[r["item_id"]]
        rows.append({"item_id": _key(r["item_id"], r["candidate"]), "image_path": req["image_path"],
                     "caption": req["source_prompt"], "partner_image_path": vqa.resolve(edits_path.parent, r["path"]),
                     "partner_caption": req["target_prompt"]})
    return rows


def verified(inputs: dict[str, str], scores: pd.DataFrame, out_dir: str | os.PathLike) -> pd.DataFrame:
    """The kept edits the VQA check keeps, ``path`` relative to ``out_dir``."""
    kept = vqa.kept_ids(scores)
    edits = _edits(inputs)
    out = edits[[_key(i, c) in kept for i, c in zip(edits["item_id"], edits["candidate"])]].reset_index(drop=True)
    out["path"] = vqa.rebase(out["path"].tolist(), Path(inputs["candidates"]).parent, out_dir)
    return out
