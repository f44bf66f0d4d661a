"""Filters of over-generated candidates, shared by every study that over-generates and selects.

* :mod:`.pairs` -- COCO-Counterfactuals' CLIP filter and top-k selection of image *pairs* (InstructPix2Pix's
  filter, §3.2, B.1.2), with the CLIP scorer;
* :mod:`.sets` -- SocialCounterfactuals' CLIP and NSFW filters of counterfactual *sets* (§3.4, §8.3);
* :mod:`.detectability` -- its attribute-detectability filter of sets and the calibration of its thresholds
  (§3.4, §8.3, Table 10).
"""

from .pairs import (CLIP_MEAN, CLIP_STD, DIRECTION_REL_TOL, DIRECTION_UNDEFINED, NON_FINITE, SCORE_COLUMNS, ClipScorer,
                    FilterThresholds, apply_thresholds, pair_scores, select_top, set_scores)
from .sets import ClipThresholds, clip_stage, clip_thresholds, nsfw_flags, nsfw_stage

__all__ = ["CLIP_MEAN", "CLIP_STD", "DIRECTION_REL_TOL", "DIRECTION_UNDEFINED", "NON_FINITE", "SCORE_COLUMNS", "ClipScorer",
           "ClipThresholds", "FilterThresholds", "apply_thresholds", "clip_stage", "clip_thresholds", "nsfw_flags", "nsfw_stage",
           "pair_scores", "select_top", "set_scores"]
