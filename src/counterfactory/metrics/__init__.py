"""Evaluation metrics for CounterFactory (pure NumPy, vectorised).

Every function documents its definition, its source and the conventions chosen where the sources
are silent or disagree (ties, zero counts, k larger than the ranking, empty inputs). Submodules:

* :mod:`~counterfactory.metrics.retrieval` — Recall@K, Skew@K / MaxSkew@K / MinSkew@K, NDKL,
  Bias@K, AP@k, ODmAP@k.
* :mod:`~counterfactory.metrics.fairness` — DEO (with calibrated threshold and bootstrap), ΔAcc,
  mAcc, AP, bias amplification (Zhao et al. 2017; directional, Wang & Russakovsky 2021), LIC.
* :mod:`~counterfactory.metrics.pairwise` — Winoground, SugarCrepe, CounterCurate scores.
* :mod:`~counterfactory.metrics.similarity` — CLIP directional similarity, COCO-Counterfactuals ITM
  differences.

Invalid inputs raise ``ValueError`` with a message naming the argument and the problem.
"""

from .fairness import (
    average_precision,
    bias_amplification,
    bootstrap_deo,
    calibrated_threshold,
    delta_accuracy,
    deo,
    deo_from_scores,
    directional_bias_amplification,
    false_negative_rate,
    group_accuracies,
    group_codes,
    intersect_groups,
    lic_score,
    mean_group_accuracy,
)
from .pairwise import (
    SUGARCREPE_AVERAGES,
    SUGARCREPE_CATEGORIES,
    countercurate_counting_accuracy,
    countercurate_position_accuracy,
    pairwise_accuracy,
    stack_pair_scores,
    sugarcrepe_scores,
    winoground_item_scores,
    winoground_scores,
)
from .retrieval import (
    average_precision_at_k,
    bias_at_k,
    max_skew_at_k,
    mean_bias_at_k,
    min_skew_at_k,
    ndkl,
    odmap_at_k,
    odmap_relevance,
    ranking_from_scores,
    recall_at_k,
    skew_at_k,
)
from .similarity import clip_directional_similarity, itm_differences, l2_normalize, rowwise_cosine

__all__ = [
    # retrieval
    "recall_at_k",
    "ranking_from_scores",
    "skew_at_k",
    "max_skew_at_k",
    "min_skew_at_k",
    "ndkl",
    "bias_at_k",
    "mean_bias_at_k",
    "average_precision_at_k",
    "odmap_relevance",
    "odmap_at_k",
    # similarity
    "l2_normalize",
    "rowwise_cosine",
    "clip_directional_similarity",
    "itm_differences",
    # pairwise
    "stack_pair_scores",
    "pairwise_accuracy",
    "winoground_item_scores",
    "winoground_scores",
    "SUGARCREPE_CATEGORIES",
    "SUGARCREPE_AVERAGES",
    "sugarcrepe_scores",
    "countercurate_position_accuracy",
    "countercurate_counting_accuracy",
    # fairness
    "group_codes",
    "intersect_groups",
    "false_negative_rate",
    "calibrated_threshold",
    "deo",
    "bootstrap_deo",
    "deo_from_scores",
    "group_accuracies",
    "mean_group_accuracy",
    "delta_accuracy",
    "average_precision",
    "bias_amplification",
    "directional_bias_amplification",
    "lic_score",
]
