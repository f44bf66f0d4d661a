"""The spurious-retrieval study's filters as filter cards (:mod:`counterfactory.filters.cards`, docs/verify.md
"Filter cards").

**Item id: ``<dataset>:<item_id>``**, one object removal (``<dataset>/selection/requests.parquet``; the VQA check's
ids). The one filter with a card is the VQA check (``vqa``: ``score >= verify.min_score``, ``--input
vqa=verify/vqa.parquet``): was the removed class there in the photograph and is it gone from the inpainting? The
study keeps every inpainting it makes (§3.1: no filter after the inpainting), so the card measures what a filter
would add.
"""

from __future__ import annotations

import pandas as pd

from ...filters.cards import StudyFilter, score_frame
from ...filters.vqa import VerifySettings, read_table


def vqa_table(inputs: dict, cfg: dict) -> pd.DataFrame:
    vqa = read_table(inputs["vqa"], ("item_id", "score", "kept"), "VQA scores")
    return score_frame(vqa["item_id"].astype(str), vqa["score"].astype(float), kept=vqa["kept"].astype(bool).to_numpy())


FILTERS: dict[str, StudyFilter] = {
    "vqa": StudyFilter("Spurious-retrieval VQA check, score = present in the photograph - present in the inpainting",
                       ("vqa",), "an object removal, id `<dataset>:<item_id>` (<dataset>/selection/requests.parquet).",
                       vqa_table, lambda cfg: VerifySettings.from_config(cfg).min_score),
}
