"""The spurious-retrieval study's filters as filter cards (:mod:`counterfactory.filters.cards`, docs/verify.md
"Filter cards").

**Item id: ``<dataset>:<item_id>``**, one object removal (``<dataset>/selection/requests.parquet``; the VQA check's
ids). The one filter with a card is the VQA check (``vqa``: the check's ``kept``, as the margin to its thresholds, ``--input
vqa=verify/vqa.parquet``): was the removed class there in the photograph and is it gone from the inpainting? The
study keeps every inpainting it makes (§3.1: no filter after the inpainting), so the card measures what a filter
would add.
"""

from __future__ import annotations

import pandas as pd

from ...filters import vqa
from ...filters.cards import StudyFilter


def vqa_table(inputs: dict, cfg: dict) -> pd.DataFrame:
    return vqa.card_scores(inputs["vqa"], cfg)


FILTERS: dict[str, StudyFilter] = {
    "vqa": StudyFilter(f"Spurious-retrieval VQA check (the removed class in the photograph, not in the inpainting), "
                       f"{vqa.CARD_SCORE}", ("vqa",),
                       "an object removal, id `<dataset>:<item_id>` (<dataset>/selection/requests.parquet).",
                       vqa_table, lambda cfg: 0.0, note=vqa.CARD_NOTE),
}
