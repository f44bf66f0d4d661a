"""CounterCurate's filters as filter cards (:mod:`counterfactory.filters.cards`, docs/verify.md "Filter cards").

**Item id: ``<dataset>:<item_id>``**, one row of ``datasets/{positions,counting,attributes}.parquet`` (the VQA
check's ids). The one filter with a card is the VQA check (``vqa``: ``score >= verify.min_score``,
``--input vqa=verify/vqa.parquet``); the workflow keeps no CLIP-score selection of CounterCurate's negatives to
card (the negatives are kept as generated, docs/studies/countercurate.md).
"""

from __future__ import annotations

import pandas as pd

from ...filters.cards import StudyFilter, score_frame
from ...filters.vqa import VerifySettings, read_table


def vqa_table(inputs: dict, cfg: dict) -> pd.DataFrame:
    vqa = read_table(inputs["vqa"], ("item_id", "score", "kept"), "VQA scores")
    return score_frame(vqa["item_id"].astype(str), vqa["score"].astype(float), kept=vqa["kept"].astype(bool).to_numpy())


FILTERS: dict[str, StudyFilter] = {
    "vqa": StudyFilter("CounterCurate VQA check, score = present - absent", ("vqa",),
                       "a dataset row, id `<dataset>:<item_id>` (datasets/<dataset>.parquet).", vqa_table,
                       lambda cfg: VerifySettings.from_config(cfg).min_score),
}
