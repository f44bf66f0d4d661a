"""SocialCounterfactuals' filters as filter cards (:mod:`counterfactory.filters.cards`, docs/verify.md "Filter
cards"): each stage's per-set table as a score table ``item_id, score[, kept]``.

**Item id: ``<set_id>:<candidate_index>``**, one candidate counterfactual set (§3.3: one over-generation of a caption
set; the unit every stage keeps or drops, §3.4). One audit sample can serve every filter below: a person judges a
candidate set once (do its images show the same scene, each member's attributes as its caption says?).

Filters (the stages' set tables, ``filter/{clip,nsfw,detect}_sets.parquet``; the VQA check's ``verify/vqa.parquet``):

* ``clip_image_caption``: ``min_image_caption >= filter.clip.image_caption_min`` (inclusive, §3.4);
* ``clip_image_image``: ``min_image_image`` against ``filter.clip.image_image_min`` (the filter's test is strict,
  ``>``; the card's is ``>=``, which differs only on a tie); sets of one image (no pair) are left out;
* ``clip``: stage (a), a rule (``passed``);
* ``nsfw``: stage (b): with ``filter.nsfw.threshold`` set, ``max_nsfw_probability`` kept when ``<=`` it (the filter
  flags ``>=``: they differ only on a tie); without (the paper's argmax), a rule (``passed``);
* ``detectability``: stage (c), a rule (``passed``: every attribute type discernible in enough images, Table 10);
* ``vqa``: the VQA check of the set's pairs (docs/verify.md): ``score`` the lowest of its pairs' margins to the
  check's thresholds (:func:`counterfactory.filters.vqa.margin`), so ``>= 0`` exactly when every pair is kept (the
  verified variant's rule, ``kept``); ``n_pairs`` beside it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...filters.cards import StudyFilter, score_frame
from ...filters import vqa
from ...filters.vqa import read_table

KEYS = ("set_id", "candidate_index")


def item_id(set_id, candidate_index) -> str:
    """A candidate set's id: ``<set_id>:<candidate_index>``."""
    return f"{set_id}:{int(candidate_index)}"


def _sets(inputs: dict, name: str, columns) -> pd.DataFrame:
    frame = read_table(inputs[name], (*KEYS, *columns), f"{name} stage set table")
    return frame.assign(item_id=[item_id(s, c) for s, c in zip(frame["set_id"], frame["candidate_index"])])


def _section(cfg: dict, *keys):
    node = cfg.get("filter") or {}
    for k in keys:
        node = (node or {}).get(k)
    return node


def _score(name: str, column: str):
    def table(inputs: dict, cfg: dict) -> pd.DataFrame:
        frame = _sets(inputs, name, (column, "passed"))
        frame = frame[np.isfinite(frame[column].astype(float).to_numpy())]
        return score_frame(frame["item_id"], frame[column].astype(float), passed=frame["passed"].astype(bool).to_numpy())
    return table


def _rule(name: str):
    def table(inputs: dict, cfg: dict) -> pd.DataFrame:
        frame = _sets(inputs, name, ("passed",))
        return score_frame(frame["item_id"], frame["passed"].astype(bool))
    return table


def nsfw_table(inputs: dict, cfg: dict) -> pd.DataFrame:
    """``max_nsfw_probability`` with a threshold configured, else the stage's ``passed``."""
    if _section(cfg, "nsfw", "threshold") is None:
        return _rule("nsfw")(inputs, cfg)
    return _score("nsfw", "max_nsfw_probability")(inputs, cfg)


def vqa_table(inputs: dict, cfg: dict) -> pd.DataFrame:
    """The VQA check's pair scores (``<set_id>:<candidate_index>:<i>-<j>``) per candidate set: the lowest margin (a
    set is kept when every pair is)."""
    scores = vqa.card_scores(inputs["vqa"], cfg)
    sets = scores["item_id"].str.rsplit(":", n=1).str[0]
    grouped = scores.assign(item=sets).groupby("item", sort=False)
    agg = grouped.agg(score=("score", "min"), kept=("kept", "all"), n_pairs=("score", "size")).reset_index()
    return score_frame(agg["item"], agg["score"].astype(float), kept=agg["kept"].astype(bool).to_numpy(),
                       n_pairs=agg["n_pairs"].to_numpy())


UNIT = "a candidate counterfactual set, id `<set_id>:<candidate_index>` (filter/*_sets.parquet)."
FILTERS: dict[str, StudyFilter] = {
    "clip_image_caption": StudyFilter(
        "SocialCF CLIP image-caption similarity, min over the set", ("clip",), UNIT,
        _score("clip", "min_image_caption"), lambda cfg: float(_section(cfg, "clip", "image_caption_min"))),
    "clip_image_image": StudyFilter(
        "SocialCF CLIP image-image similarity, min over the set's pairs", ("clip",), UNIT,
        _score("clip", "min_image_image"), lambda cfg: float(_section(cfg, "clip", "image_image_min")),
        note="The filter's test is strict (>); the card's >= differs only on a tie."),
    "clip": StudyFilter("SocialCF CLIP filter (stage a)", ("clip",), UNIT, _rule("clip")),
    "nsfw": StudyFilter(
        "SocialCF NSFW filter (stage b), max P(nsfw) over the set", ("nsfw",), UNIT, nsfw_table,
        lambda cfg: _section(cfg, "nsfw", "threshold"), keep="below",
        note="With filter.nsfw.threshold unset (argmax) the card is the stage's keep/drop rule."),
    "detectability": StudyFilter("SocialCF attribute detectability (stage c)", ("detect",), UNIT, _rule("detect")),
    "vqa": StudyFilter(
        f"SocialCF VQA check, the lowest pair {vqa.CARD_SCORE} of the set", ("vqa",), UNIT, vqa_table,
        lambda cfg: 0.0, note="Only the sets kept by the three stages are scored (the VQA check runs on "
                              "filter/kept.parquet). " + vqa.CARD_NOTE),
}
