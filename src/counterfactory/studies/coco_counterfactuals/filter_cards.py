"""COCO-Counterfactuals' filters as filter cards (:mod:`counterfactory.filters.cards`, docs/verify.md "Filter
cards"): each filter's outputs as a score table ``item_id, score[, kept]``.

**Item id: ``<caption_id>:<candidate_index>``**, one generated candidate image pair (§3.2: ``candidates_per_pair``
Prompt-to-Prompt pairs per counterfactual caption; ``images/candidate_scores.parquet`` has one row per candidate,
``caption_id`` the counterfactual caption's id, ``candidate_index`` its place among that caption's candidates). One
audit sample can serve every filter below: a person judges a candidate pair once (are both images faithful to their
captions, and do they differ in the edited noun only?).

Filters (``--input scores=images/candidate_scores.parquet``, the VQA check also ``selected=images/selected_pairs.parquet``
and ``vqa=verify/vqa.parquet``):

* ``clip_image_caption``: min(sim_0, sim_1) >= ``images.filter.image_caption_min`` (B.1.2);
* ``clip_image_image``: sim_image >= ``images.filter.image_image_min``;
* ``clip_direction``: sim_direction >= ``images.filter.direction_min``; candidates whose direction is undefined
  (NaN, rejected as ``direction_undefined``) or whose score is not finite are left out of this table;
* ``clip``: the whole CLIP filter, a rule (``passed``: all three tests);
* ``selection``: the top-k selection among the passed candidates, a rule (``selected``: the pair that is exported);
* ``vqa``: the VQA check (docs/verify.md) of each selected pair, as the margin to its three thresholds
  (:func:`counterfactory.filters.vqa.margin`: >= 0 exactly when ``kept``; ``vqa_score`` beside it); the selected
  pair's id (``id``) is mapped to its candidate's id.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...errors import input_error
from ...filters.cards import StudyFilter, score_frame
from ...filters import vqa
from ...filters.vqa import read_table

SCORE_COLUMNS = ("caption_id", "candidate_index", "sim_0", "sim_1", "sim_image", "sim_direction", "passed",
                 "selected")
WHAT = "candidate score table"


def item_id(caption_id, candidate_index) -> str:
    """A candidate's id: ``<caption_id>:<candidate_index>``."""
    return f"{caption_id}:{int(candidate_index)}"


def _candidates(inputs: dict) -> pd.DataFrame:
    frame = read_table(inputs["scores"], SCORE_COLUMNS, WHAT)
    return frame.assign(item_id=[item_id(c, i) for c, i in zip(frame["caption_id"], frame["candidate_index"])])


def _filter(cfg: dict) -> dict:
    """``images.filter`` of the study's view of the configuration (what ``load_config`` returns)."""
    return (cfg.get("images") or {}).get("filter") or {}


def _score(column_fn, extra=("passed",)):
    def table(inputs: dict, cfg: dict) -> pd.DataFrame:
        frame = _candidates(inputs)
        score = column_fn(frame).astype(float)
        frame = frame[np.isfinite(score.to_numpy())]
        return score_frame(frame["item_id"], score[frame.index], **{c: frame[c].to_numpy() for c in extra})
    return table


def _rule(column: str):
    def table(inputs: dict, cfg: dict) -> pd.DataFrame:
        frame = _candidates(inputs)
        return score_frame(frame["item_id"], frame[column].astype(bool))
    return table


def vqa_table(inputs: dict, cfg: dict) -> pd.DataFrame:
    """The VQA check's scores of the selected pairs, by candidate id."""
    pairs = read_table(inputs["selected"], ("id", "caption_id", "candidate_index"), "selected-pairs table")
    to_item = {str(p): item_id(c, i) for p, c, i in zip(pairs["id"], pairs["caption_id"], pairs["candidate_index"])}
    scores = vqa.card_scores(inputs["vqa"], cfg)
    ids = scores["item_id"]
    unknown = sorted(set(ids) - set(to_item))
    if unknown:
        raise input_error(inputs["vqa"], f"item_id {unknown[0]}", "not a selected pair of the selected-pairs table",
                          f"pass the selected pairs the VQA check scored ({inputs['selected']})")
    return score_frame(ids.map(to_item), scores["score"], kept=scores["kept"].to_numpy(),
                       vqa_score=scores["vqa_score"].to_numpy(), pair_id=ids.to_numpy())


UNIT = "a candidate image pair, id `<caption_id>:<candidate_index>` (images/candidate_scores.parquet)."
FILTERS: dict[str, StudyFilter] = {
    "clip_image_caption": StudyFilter(
        "COCO-CF CLIP image-caption similarity, min(sim_0, sim_1)", ("scores",), UNIT,
        _score(lambda f: np.minimum(f["sim_0"].astype(float), f["sim_1"].astype(float))),
        lambda cfg: float(_filter(cfg)["image_caption_min"])),
    "clip_image_image": StudyFilter(
        "COCO-CF CLIP image-image similarity, sim_image", ("scores",), UNIT, _score(lambda f: f["sim_image"]),
        lambda cfg: float(_filter(cfg)["image_image_min"])),
    "clip_direction": StudyFilter(
        "COCO-CF CLIP directional similarity, sim_direction", ("scores",), UNIT, _score(lambda f: f["sim_direction"]),
        lambda cfg: float(_filter(cfg)["direction_min"]),
        note="Candidates with an undefined direction (rejected as direction_undefined) are not scored here."),
    "clip": StudyFilter("COCO-CF CLIP filter (all three tests)", ("scores",), UNIT, _rule("passed")),
    "selection": StudyFilter("COCO-CF top-k selection (the exported pair)", ("scores",), UNIT, _rule("selected")),
    "vqa": StudyFilter(
        f"COCO-CF VQA check, {vqa.CARD_SCORE}", ("selected", "vqa"), UNIT, vqa_table, lambda cfg: 0.0,
        note="Only the selected pairs are scored (the VQA check runs after the selection). " + vqa.CARD_NOTE),
}
