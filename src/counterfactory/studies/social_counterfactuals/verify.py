"""SocialCounterfactuals' candidates for the VQA check (:mod:`counterfactory.filters.vqa`, docs/verify.md).

A counterfactual set (``filter/kept.parquet``: the images surviving the CLIP, NSFW and detectability filters,
§3.4) is one ``(set_id, candidate_index)``: its members differ only in the intersectional attributes (§3.2). Its
pairs are consecutive members in ``member_index`` order, closed into a cycle when the set has more than two
members (member i with member i + 1, the last with the first), so every member is checked against two others
with one pair per member (all pairs would cost n(n-1)/2). Item id: ``<set_id>:<candidate_index>:<i>-<j>``.

The verified variant keeps a set when the VQA check keeps every one of its pairs (the set is the dataset's unit:
``counterfactual_set`` of the release), in the kept-images layout; a set with one member has no pair and is not
verified.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ...filters import vqa

COLUMNS = ("set_id", "candidate_index", "member_index", "caption", "image_path")
WHAT = "kept-images table"


def _sets(frame: pd.DataFrame):
    for (set_id, cand), grp in frame.groupby(["set_id", "candidate_index"], sort=True):
        yield f"{set_id}:{cand}", grp.sort_values("member_index")


def set_pairs(members: pd.DataFrame) -> list[tuple[int, int]]:
    """Positions of the pairs of one set's members: consecutive, cyclic beyond two members."""
    n = len(members)
    if n < 2:
        return []
    return [(0, 1)] if n == 2 else [(i, (i + 1) % n) for i in range(n)]


def pair_rows(inputs: dict[str, str]) -> list[dict]:
    """Pair-table rows of ``inputs["candidates"]`` (the kept images)."""
    path = Path(inputs["candidates"])
    frame = vqa.read_table(path, COLUMNS, WHAT)
    base = path.parent
    rows = []
    for key, grp in _sets(frame):
        recs = grp.to_dict("records")
        for i, j in set_pairs(grp):
            a, b = recs[i], recs[j]
            rows.append({"item_id": f"{key}:{a['member_index']}-{b['member_index']}",
                         "image_path": vqa.resolve(base, a["image_path"]), "caption": a["caption"],
                         "partner_image_path": vqa.resolve(base, b["image_path"]), "partner_caption": b["caption"]})
    return rows


def verified(inputs: dict[str, str], scores: pd.DataFrame, out_dir: str | os.PathLike) -> pd.DataFrame:
    """The kept images of every set whose pairs the VQA check all keeps, image paths relative to ``out_dir``."""
    path = Path(inputs["candidates"])
    frame = vqa.read_table(path, COLUMNS, WHAT)
    kept = vqa.kept_ids(scores)
    keep = []
    for key, grp in _sets(frame):
        recs = grp.to_dict("records")
        ids = [f"{key}:{recs[i]['member_index']}-{recs[j]['member_index']}" for i, j in set_pairs(grp)]
        if ids and all(i in kept for i in ids):
            keep.extend(grp.index)
    out = frame.loc[sorted(keep)].reset_index(drop=True)
    out["image_path"] = vqa.rebase(out["image_path"].tolist(), path.parent, out_dir)
    return out
