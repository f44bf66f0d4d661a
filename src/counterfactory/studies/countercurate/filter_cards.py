"""CounterCurate's filters as filter cards (:mod:`counterfactory.filters.cards`, docs/verify.md "Filter cards").

**Item id: ``<dataset>:<item_id>``**, one row of ``datasets/{positions,counting,attributes}.parquet`` (the VQA
check's ids). The one filter with a card is the VQA check (``vqa``: the check's ``kept``, as the margin to its thresholds,
``--input vqa=verify/vqa.parquet``); the workflow keeps no CLIP-score selection of CounterCurate's negatives to
card (the negatives are kept as generated, docs/studies/countercurate.md).
"""

from __future__ import annotations

import pandas as pd

from ...filters import vqa
from ...filters.cards import StudyFilter


def vqa_table(inputs: dict, cfg: dict) -> pd.DataFrame:
    return vqa.card_scores(inputs["vqa"], cfg)


FILTERS: dict[str, StudyFilter] = {
    "vqa": StudyFilter(f"CounterCurate VQA check, {vqa.CARD_SCORE}", ("vqa",),
                       "a dataset row, id `<dataset>:<item_id>` (datasets/<dataset>.parquet).", vqa_table,
                       lambda cfg: 0.0, note=vqa.CARD_NOTE),
}
