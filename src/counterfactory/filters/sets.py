"""Filters of over-generated counterfactual *sets* (SocialCounterfactuals §3.4, §8.3): the kernels.

* **CLIP image-text similarity** (:func:`clip_stage`): a candidate set passes when the cosine of every
  member's image and caption embeddings is at least ``image_caption_min`` (inclusive, 0.2 in the paper)
  and the cosine of every pair of its images is greater than ``image_image_min`` (strict, 0.2).
* **NSFW** (:func:`nsfw_flags`, :func:`nsfw_stage`): a set with any flagged image is dropped.

Pure array code (numpy, pandas): the set generator's adaptive mode (:mod:`counterfactory.generation.sets`)
and the study's filter step (:mod:`counterfactory.studies.social_counterfactuals.filtering`, which reads the
config, the files and the models) run the same kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..metrics.similarity import l2_normalize
from ..settings import schema_defaults


@dataclass(frozen=True)
@schema_defaults("social_counterfactuals.filter.clip")
class ClipThresholds:
    """§3.4: ``image_caption_min`` is inclusive (>=), ``image_image_min`` strict (>); defaults: the schema's."""

    image_caption_min: float
    image_image_min: float


def clip_thresholds(section: Any, where: str) -> tuple[str, ClipThresholds]:
    """``(model role, ClipThresholds)`` of a validated ``clip`` config section (``role``,
    ``image_caption_min``, ``image_image_min``; the schema fills the defaults and checks the ranges)."""
    keys = ("role", "image_caption_min", "image_image_min")
    missing = [k for k in keys if not isinstance(section, dict) or k not in section]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}. Fix: load the config through the schema "
                          "(counterfactory.config.load_config), which fills them in")
    return section["role"], ClipThresholds(float(section["image_caption_min"]), float(section["image_image_min"]))


# ------------------------------------------------------------------------------------------- helpers


def _factorize(set_index: Any) -> tuple[np.ndarray, np.ndarray]:
    """(codes, labels) of a 1-D array of set labels, labels in order of first appearance."""
    arr = np.asarray(set_index)
    if arr.ndim != 1:
        raise ValueError(f"set_index: expected one label per image (1-D), got shape {arr.shape}")
    codes, uniques = pd.factorize(arr, sort=False)
    if (codes < 0).any():
        raise ValueError("set_index: contains missing labels (NaN/None)")
    return codes, np.asarray(uniques)


def _blocks(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, starts, counts): rows sorted by set code, where each set starts, and its size."""
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.intp)
    return order, starts, counts


def _min_pairwise(emb: np.ndarray, order: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                  budget: int = 20_000_000) -> np.ndarray:
    """Smallest off-diagonal cosine of each set's (normalised) image embeddings; NaN for sets of one image.

    Sets of equal size are stacked (s, m, d) and their Gram matrices taken together, in chunks of about
    ``budget`` numbers so paper-scale inputs (5.4M images) stay within memory."""
    out = np.full(len(counts), np.nan)
    d = emb.shape[1]
    for m in np.unique(counts):
        if m < 2:
            continue
        sets = np.flatnonzero(counts == m)
        step = max(1, budget // (int(m) * max(d, int(m))))
        off = ~np.eye(int(m), dtype=bool)
        for lo in range(0, len(sets), step):
            chunk = sets[lo:lo + step]
            rows = order[starts[chunk][:, None] + np.arange(m)]
            stack = emb[rows]                                   # (s, m, d)
            gram = np.einsum("smd,snd->smn", stack, stack)
            out[chunk] = gram[:, off].min(axis=1)
    return out


def _as_bool(values: Any) -> np.ndarray:
    """Booleans from a parquet bool column or a CSV's True/False/1/0 text."""
    s = pd.Series(values)
    if s.dtype == bool:
        return s.to_numpy()
    return s.astype(str).str.strip().str.lower().isin(("true", "1", "1.0")).to_numpy()


def _group_sum(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(codes, weights=np.asarray(values, dtype=np.float64), minlength=n)


# ------------------------------------------------------------------------------------- stage (a) CLIP


def clip_stage(image_emb: Any, text_emb: Any, set_index: Any,
               thresholds: ClipThresholds = ClipThresholds()) -> pd.DataFrame:
    """Stage (a), §3.4: image-caption and image-image cosine tests of each candidate set.

    ``image_emb`` (n, d) and ``text_emb`` (n, d): row ``i`` is image ``i`` and the embedding of its own
    caption (normalised here); ``set_index`` (n,): the candidate set of each image (any hashable labels).
    Returns one row per set (order of first appearance): ``set_index, n_images, min_image_caption,
    mean_image_caption, min_image_image, passed, reason``. A set passes when ``min_image_caption >=
    image_caption_min`` (inclusive, "a minimum cosine similarity of 0.2") and ``min_image_image >
    image_image_min`` (strict, "greater than 0.2"); a set of one image has no pairs (``min_image_image``
    NaN) and passes that test. ``reason`` names every failed test ("" when passed). Embeddings with NaN,
    inf or an all-zero row are a ``ValueError``.
    """
    img = l2_normalize(image_emb, "image_emb")
    txt = l2_normalize(text_emb, "text_emb")
    if img.ndim != 2 or img.shape != txt.shape:
        raise ValueError(f"image_emb and text_emb must both be (n, d), got {img.shape} and {txt.shape}")
    codes, labels = _factorize(set_index)
    if len(codes) != len(img):
        raise ValueError(f"set_index has {len(codes)} labels for {len(img)} images")
    order, starts, counts = _blocks(codes)
    ic = np.einsum("nd,nd->n", img, txt)
    min_ic = np.minimum.reduceat(ic[order], starts)
    mean_ic = _group_sum(codes, ic, len(counts)) / counts
    min_ii = _min_pairwise(img, order, starts, counts)
    ok_ic = min_ic >= thresholds.image_caption_min
    ok_ii = np.isnan(min_ii) | (min_ii > thresholds.image_image_min)
    reasons = np.where(ok_ic, "", f"image_caption<{thresholds.image_caption_min:g}").astype(object)
    bad_ii = np.where(ok_ii, "", f"image_image<={thresholds.image_image_min:g}")
    reasons = np.array([";".join(p for p in pair if p) for pair in zip(reasons, bad_ii)], dtype=object)
    return pd.DataFrame({"set_index": labels, "n_images": counts, "min_image_caption": min_ic,
                         "mean_image_caption": mean_ic, "min_image_image": min_ii,
                         "passed": ok_ic & ok_ii, "reason": reasons})


# ------------------------------------------------------------------------------------- stage (b) NSFW


def nsfw_flags(probs: Any, labels: Sequence[str], *, label: str = "nsfw", threshold: float | None = None) -> np.ndarray:
    """Which images the NSFW classifier flags (§3.4, §8.3).

    ``probs`` (n, k): class probabilities in the order of ``labels`` (the model's ``id2label``). With
    ``threshold`` None an image is flagged when ``label`` has the highest probability, strictly (the model
    card's pipeline takes the argmax; a tie is not flagged); else when ``P(label) >= threshold``.
    """
    p = np.asarray(probs, dtype=np.float64)
    names = [str(x).lower() for x in labels]
    if p.ndim != 2 or p.shape[1] != len(names):
        raise ValueError(f"probs must be (n, {len(names)}) for labels {list(labels)}, got shape {p.shape}")
    if names.count(label.lower()) != 1:
        raise ValueError(f"labels {list(labels)} must contain {label!r} exactly once")
    j = names.index(label.lower())
    own = p[:, j]
    if threshold is not None:
        return own >= threshold
    if p.shape[1] == 1:
        return np.ones(len(p), dtype=bool)
    others = np.delete(p, j, axis=1).max(axis=1)
    return own > others


def nsfw_stage(probs: Any, labels: Sequence[str], set_index: Any, *, label: str = "nsfw",
               threshold: float | None = None) -> pd.DataFrame:
    """Stage (b): one row per set, ``set_index, n_images, n_flagged, max_nsfw_probability, passed, reason``;
    a set passes when none of its images is flagged (:func:`nsfw_flags`)."""
    flags = nsfw_flags(probs, labels, label=label, threshold=threshold)
    codes, uniq = _factorize(set_index)
    if len(codes) != len(flags):
        raise ValueError(f"set_index has {len(codes)} labels for {len(flags)} images")
    j = [str(x).lower() for x in labels].index(label.lower())
    n = len(uniq)
    counts = np.bincount(codes, minlength=n)
    flagged = _group_sum(codes, flags, n).astype(int)
    pmax = np.full(n, -np.inf)
    np.maximum.at(pmax, codes, np.asarray(probs, dtype=np.float64)[:, j])
    return pd.DataFrame({"set_index": uniq, "n_images": counts, "n_flagged": flagged,
                         "max_nsfw_probability": pmax, "passed": flagged == 0,
                         "reason": np.where(flagged == 0, "", [f"nsfw_images={k}" for k in flagged])})
