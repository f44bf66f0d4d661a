"""CVLD's filters as filter cards (:mod:`counterfactory.filters.cards`, docs/verify.md "Filter cards").

* ``vote`` (item id: the COCO ``image_id`` of ``coco/text/votes.parquet``): the majority vote of an image's captions
  on the person's gender (§3.3), a rule (``accepted``: the image gets an edit prompt), ``--input votes=...``;
* ``edit_selection`` (item id ``<item_id>:<candidate>`` of ``coco/edits/<method>/edits.parquet``, the VQA check's
  ids): the top-k selection of the edits most similar to the original (§3.3, ``editing.k``), a rule (``kept``),
  ``--input edits=...``;
* ``vqa`` (the same edit ids): the VQA check's ``kept``, as the margin to its thresholds, ``--input vqa=verify/vqa.parquet``.
"""

from __future__ import annotations

import pandas as pd

from ...filters.cards import StudyFilter, score_frame
from ...filters import vqa
from ...filters.vqa import read_table


def vote_table(inputs: dict, cfg: dict) -> pd.DataFrame:
    votes = read_table(inputs["votes"], ("image_id", "accepted"), "caption votes")
    return score_frame(votes["image_id"].astype(str), votes["accepted"].astype(bool))


def edit_table(inputs: dict, cfg: dict) -> pd.DataFrame:
    edits = read_table(inputs["edits"], ("item_id", "candidate", "kept", "similarity"), "edit manifest")
    return score_frame([f"{i}:{c}" for i, c in zip(edits["item_id"], edits["candidate"])], edits["kept"].astype(bool),
                       similarity=edits["similarity"].to_numpy())


def vqa_table(inputs: dict, cfg: dict) -> pd.DataFrame:
    return vqa.card_scores(inputs["vqa"], cfg)


EDIT = "a kept or dropped edit, id `<item_id>:<candidate>` (coco/edits/<method>/edits.parquet)."
FILTERS: dict[str, StudyFilter] = {
    "vote": StudyFilter("CVLD majority vote of the captions (an edit prompt or none)", ("votes",),
                        "a COCO image, id its `image_id` (coco/text/votes.parquet).", vote_table),
    "edit_selection": StudyFilter("CVLD top-k edit selection by similarity", ("edits",), EDIT, edit_table),
    "vqa": StudyFilter(f"CVLD VQA check, {vqa.CARD_SCORE}", ("vqa",), EDIT, vqa_table, lambda cfg: 0.0,
                       note="Only the kept edits are scored (the VQA check runs after the selection). " + vqa.CARD_NOTE),
}
