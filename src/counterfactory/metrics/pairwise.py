"""Pairwise benchmark scores: Winoground, SugarCrepe, CounterCurate.

Every comparison is **strict** (``>``), as in the official evaluation code: a tie counts as wrong.
Scores are similarities ``s(caption, image)`` (higher = better match), e.g. CLIP cosine or an ITM
logit. NaN scores are rejected with a ``ValueError`` (a failed example must be handled upstream, not
silently counted). Accuracies are fractions in [0, 1].

Layout used for 2×2 benchmarks: an array ``scores`` of shape ``(N, 2, 2)`` with
``scores[n, c, i] = s(caption c, image i)`` of example n; build it from four vectors with
:func:`stack_pair_scores`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..data.sugarcrepe import CATEGORIES
from ._validation import as_array, as_float_array, check_same_length, unique_in_order

__all__ = [
    "stack_pair_scores",
    "pairwise_accuracy",
    "winoground_item_scores",
    "winoground_scores",
    "SUGARCREPE_CATEGORIES",
    "SUGARCREPE_AVERAGES",
    "sugarcrepe_scores",
    "countercurate_position_accuracy",
    "countercurate_counting_accuracy",
]

SUGARCREPE_CATEGORIES: tuple[str, ...] = CATEGORIES
"""The seven SugarCrepe categories (the reader's :data:`counterfactory.data.sugarcrepe.CATEGORIES`)."""

SUGARCREPE_AVERAGES: dict[str, tuple[str, ...]] = {
    "avg_add": ("add_att", "add_obj"),
    "avg_replace": ("replace_att", "replace_obj", "replace_rel"),
    "avg_swap": ("swap_att", "swap_obj"),
}
"""Unweighted category means commonly reported with SugarCrepe."""


def _pair_scores(scores: Any) -> np.ndarray:
    arr = as_float_array(scores, "scores")
    if arr.ndim != 3 or arr.shape[1:] != (2, 2):
        raise ValueError(f"scores: expected shape (N, 2, 2) with scores[n, caption, image], got {arr.shape}")
    return arr


def stack_pair_scores(c0_i0: Any, c0_i1: Any, c1_i0: Any, c1_i1: Any) -> np.ndarray:
    """Stack four score vectors into the ``(N, 2, 2)`` layout ``scores[n, caption, image]``.

    ``cX_iY`` is ``s(caption X, image Y)``; caption 0 belongs to image 0 and caption 1 to image 1.
    """
    vecs = {n: as_float_array(v, n, ndim=1) for n, v in
            {"c0_i0": c0_i0, "c0_i1": c0_i1, "c1_i0": c1_i0, "c1_i1": c1_i1}.items()}
    check_same_length(**vecs)
    out = np.empty((len(vecs["c0_i0"]), 2, 2), dtype=np.result_type(*vecs.values()))
    out[:, 0, 0], out[:, 0, 1] = vecs["c0_i0"], vecs["c0_i1"]
    out[:, 1, 0], out[:, 1, 1] = vecs["c1_i0"], vecs["c1_i1"]
    return out


def pairwise_accuracy(positive_scores: Any, negative_scores: Any) -> float:
    """Fraction of items with ``positive > negative`` (strict; a tie is wrong)."""
    pos = as_float_array(positive_scores, "positive_scores", ndim=1)
    neg = as_float_array(negative_scores, "negative_scores", ndim=1)
    check_same_length(positive_scores=pos, negative_scores=neg)
    return float(np.mean(pos > neg))


def winoground_item_scores(scores: Any) -> dict[str, np.ndarray]:
    """Per-example Winoground booleans (Thrush et al. 2022).

    * text:  ``s(c0,i0) > s(c1,i0)`` and ``s(c1,i1) > s(c0,i1)`` (pick the right caption for each image)
    * image: ``s(c0,i0) > s(c0,i1)`` and ``s(c1,i1) > s(c1,i0)`` (pick the right image for each caption)
    * group: text and image.
    """
    s = _pair_scores(scores)
    text = (s[:, 0, 0] > s[:, 1, 0]) & (s[:, 1, 1] > s[:, 0, 1])
    image = (s[:, 0, 0] > s[:, 0, 1]) & (s[:, 1, 1] > s[:, 1, 0])
    return {"text": text, "image": image, "group": text & image}


def winoground_scores(scores: Any) -> dict[str, float]:
    """Winoground text / image / group scores: fractions of examples that are correct.

    ``scores`` has shape ``(N, 2, 2)``, ``scores[n, c, i] = s(caption c, image i)``; definitions in
    :func:`winoground_item_scores`. Strict comparisons (ties are wrong).

    Source: Thrush et al. 2022, "Winoground: Probing Vision and Language Models for
    Visio-Linguistic Compositionality" (CVPR), official HF dataset README evaluation code.
    Applied to CounterCurate's (C, I, C′, I′) quadruples these give a group score that the
    CounterCurate code does not define: label it as our definition if you report it.
    """
    items = winoground_item_scores(scores)
    return {name: float(v.mean()) for name, v in items.items()}


def sugarcrepe_scores(positive_scores: Any, negative_scores: Any, categories: Sequence[str], *,
                      averages: Mapping[str, Sequence[str]] | None = None) -> dict[str, float]:
    """SugarCrepe accuracy per category and unweighted category averages.

    An item (image I, positive caption, hard-negative caption) is correct iff
    ``s(I, positive) > s(I, negative)`` (strict; a tie is wrong). ``categories[n]`` names item n's
    category (e.g. ``"replace_obj"``). Returns ``{category: accuracy}`` for each category present,
    plus, for every entry of ``averages`` (default :data:`SUGARCREPE_AVERAGES`: ``avg_add``,
    ``avg_replace``, ``avg_swap``) whose member categories are **all** present, the unweighted mean
    of those category accuracies, and ``"average"``, the unweighted mean over all categories present.
    Accuracies are fractions in [0, 1].

    Source: Hsieh et al. 2023, "SugarCrepe: Fixing Hackable Benchmarks for Vision-Language
    Compositionality" (NeurIPS D&B), ``RAIVNLab/sugar-crepe`` ``main_eval.py``.
    """
    pos = as_float_array(positive_scores, "positive_scores", ndim=1)
    neg = as_float_array(negative_scores, "negative_scores", ndim=1)
    cats = as_array(categories, "categories", ndim=1)
    check_same_length(positive_scores=pos, negative_scores=neg, categories=cats)
    averages = SUGARCREPE_AVERAGES if averages is None else averages
    correct = pos > neg
    cat_list = [str(c) for c in cats.tolist()]
    names = unique_in_order(cat_list)
    clash = set(names) & (set(averages) | {"average"})
    if clash:
        raise ValueError(f"categories: names {sorted(clash)} collide with the names of the averages")
    index = {name: i for i, name in enumerate(names)}
    codes = np.fromiter((index[c] for c in cat_list), dtype=np.intp, count=len(cat_list))
    hits = np.bincount(codes, weights=correct, minlength=len(names))
    counts = np.bincount(codes, minlength=len(names))
    result = {name: float(h / c) for name, h, c in zip(names, hits, counts)}
    for avg_name, members in averages.items():
        if members and all(m in result for m in members):
            result[avg_name] = float(np.mean([result[m] for m in members]))
    result["average"] = float(np.mean([result[n] for n in names]))
    return result


def countercurate_position_accuracy(scores: Any) -> float:
    """CounterCurate positional accuracy ``correct / (2N)``.

    ``scores[n, c, i]`` (shape ``(N, 2, 2)``) with caption 0 = C, caption 1 = C′ (the negative
    caption), image 0 = I, image 1 = I′ (the negative image). Each example contributes
    ``[s(C, I) > s(C′, I)] + [s(C′, I′) > s(C, I′)]`` — an image-to-text choice for both images (the
    softmax over {C, C′} in the released code is monotone, so comparing scores is equivalent).

    Source: Zhang et al. 2024, "CounterCurate" (ICML), ``HanSolo9682/CounterCurate``
    ``benchmark/CLIP_test_position.py``.
    """
    s = _pair_scores(scores)
    correct = (s[:, 0, 0] > s[:, 1, 0]).sum() + (s[:, 1, 1] > s[:, 0, 1]).sum()
    return float(correct / (2 * s.shape[0]))


def countercurate_counting_accuracy(true_count_scores: Any, plus_one_scores: Any) -> float:
    """CounterCurate counting accuracy: fraction with ``s(I, "there are {n} ...") > s(I, "... {n+1} ...")``.

    ``true_count_scores[n]`` scores the image against the caption with the true count, and
    ``plus_one_scores[n]`` against the caption with count + 1 (LookTwiceQA, ``CLIP_test_counting.py``).
    Strict comparison: a tie is wrong.
    """
    return pairwise_accuracy(true_count_scores, plus_one_scores)
