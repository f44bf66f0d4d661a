"""Embedding-similarity metrics: CLIP directional similarity and COCO-Counterfactuals ITM differences.

All functions take NumPy arrays (or anything ``np.asarray`` accepts, e.g. CPU tensors) of embeddings
or scores, row-wise: row ``n`` of every argument belongs to the same example.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._validation import as_float_array, check_same_length

__all__ = [
    "l2_normalize",
    "rowwise_cosine",
    "clip_directional_similarity",
    "itm_differences",
]

_EPS = 1e-8


def _embeddings(x: Any, name: str) -> np.ndarray:
    arr = as_float_array(x, name)
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name}: expected an embedding (d,) or a batch (n, d), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: contains inf")
    return arr


def l2_normalize(x: Any, name: str = "x") -> np.ndarray:
    """Rows of ``x`` divided by their L2 norm (float64 output). A zero row is a ``ValueError``."""
    arr = _embeddings(x, name).astype(np.float64)
    norms = np.linalg.norm(arr, axis=-1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError(f"{name}: contains an all-zero embedding, which cannot be L2-normalised")
    return arr / norms


def rowwise_cosine(a: Any, b: Any, *, eps: float = _EPS) -> np.ndarray | float:
    """Cosine similarity of matching rows: ``a_n · b_n / max(‖a_n‖ ‖b_n‖, eps)``.

    The ``eps`` clamp follows ``torch.nn.functional.cosine_similarity``: a zero vector gives 0, not NaN.
    1-D inputs give a float; 2-D inputs of shape (n, d) give an array of n values.
    """
    x = _embeddings(a, "a").astype(np.float64)
    y = _embeddings(b, "b").astype(np.float64)
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same shape, got {x.shape} and {y.shape}")
    num = np.sum(x * y, axis=-1)
    den = np.maximum(np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1), eps)
    out = num / den
    return float(out) if np.ndim(out) == 0 else out


def clip_directional_similarity(text_a: Any, text_b: Any, image_a: Any, image_b: Any) -> np.ndarray | float:
    """CLIP directional similarity ``cos(Ê(image_b) − Ê(image_a), Ê(text_b) − Ê(text_a))``.

    ``text_a``/``image_a`` are the embeddings of the original caption and image, ``text_b``/``image_b``
    those of the edited (counterfactual) ones, each of shape (d,) or (n, d). Every embedding is
    **L2-normalised first** (``Ê``), then the cosine of the two difference vectors is taken; this is
    ``sim_direction`` of InstructPix2Pix's ``metrics/clip_similarity.py`` (Brooks, Holynski & Efros
    2023, "InstructPix2Pix: Learning to Follow Image Editing Instructions"), whose data filter keeps
    samples with directional similarity >= 0.2. If either difference vector is zero (identical texts
    or images) the result is 0 (cosine with an ``eps`` clamp, as in PyTorch), not NaN.

    Returns a float for 1-D inputs, else an array of length n.
    """
    ta, tb = l2_normalize(text_a, "text_a"), l2_normalize(text_b, "text_b")
    ia, ib = l2_normalize(image_a, "image_a"), l2_normalize(image_b, "image_b")
    shapes = {"text_a": ta.shape, "text_b": tb.shape, "image_a": ia.shape, "image_b": ib.shape}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"all four embedding arrays must have the same shape, got {shapes}")
    return rowwise_cosine(ib - ia, tb - ta)


def itm_differences(*, random_pair: Any, random_caption_original_image: Any,
                    original_caption_random_image: Any, counterfactual_pair: Any,
                    counterfactual_caption_original_image: Any,
                    original_caption_counterfactual_image: Any) -> dict[str, np.ndarray]:
    """ITM score differences IR_r, IR_c, TR_r, TR_c of COCO-Counterfactuals (Le et al. 2023, §4.2.2).

    Notation of the paper: ``(C_o, I_o)`` an original MS-COCO pair, ``I_o^s`` the synthetic image
    generated for ``C_o``, ``(C_c, I_c^s)`` the counterfactual caption and synthetic image, and
    ``(C_r, I_r)`` a random other MS-COCO pair (``I_r != I_o``). ``G(C, I)`` is the model's ITM score
    (e.g. BridgeTower / ViLT ITM logit, CLIP ``logits_per_text``). Each keyword argument is an array
    (one value per example) of ``G`` on one pair:

    ==========================================  ==================
    keyword                                     score
    ==========================================  ==================
    ``random_pair``                             ``G(C_r, I_r)``
    ``random_caption_original_image``           ``G(C_r, I_o)``
    ``original_caption_random_image``           ``G(C_o, I_r)``
    ``counterfactual_pair``                     ``G(C_c, I_c^s)``
    ``counterfactual_caption_original_image``   ``G(C_c, I_o^s)``
    ``original_caption_counterfactual_image``   ``G(C_o, I_c^s)``
    ==========================================  ==================

    The three "random" arrays must have one common length, and so must the three "counterfactual"
    arrays. Returns ``{"IR_r", "IR_c", "TR_r", "TR_c"}`` (float arrays; > 0 means the matching pair
    scored higher than the alternative):

    * ``IR_r = G(C_r, I_r) − G(C_r, I_o)`` — image retrieval, random alternative image;
    * ``TR_r = G(C_r, I_r) − G(C_o, I_r)`` — text retrieval, random alternative caption;
    * ``IR_c = G(C_c, I_c^s) − G(C_c, I_o^s)`` — image retrieval, counterfactual alternative image;
    * ``TR_c = G(C_c, I_c^s) − G(C_o, I_c^s)`` — text retrieval, counterfactual alternative caption.

    Note on IR_c: the paper's printed formula reads ``G(C_c, I_c^s) − G(C_c, I_c^s)`` (identically 0,
    a typesetting error). We use the alternative image ``I_o^s``, by symmetry with IR_r (same caption,
    alternative image) and TR_c (the counterfactual pair against the original side), and because
    ``I_o^s`` is defined in the paper but otherwise unused.
    """
    names = {
        "random_pair": random_pair,
        "random_caption_original_image": random_caption_original_image,
        "original_caption_random_image": original_caption_random_image,
        "counterfactual_pair": counterfactual_pair,
        "counterfactual_caption_original_image": counterfactual_caption_original_image,
        "original_caption_counterfactual_image": original_caption_counterfactual_image,
    }
    arrays = {n: np.atleast_1d(as_float_array(v, n)) for n, v in names.items()}
    for n, a in arrays.items():
        if a.ndim != 1:
            raise ValueError(f"{n}: expected one score per example (1-D), got shape {a.shape}")
    # The random and the counterfactual triples are checked separately: their lengths may differ.
    check_same_length(**{n: arrays[n] for n in list(names)[:3]})
    check_same_length(**{n: arrays[n] for n in list(names)[3:]})
    return {
        "IR_r": arrays["random_pair"] - arrays["random_caption_original_image"],
        "IR_c": arrays["counterfactual_pair"] - arrays["counterfactual_caption_original_image"],
        "TR_r": arrays["random_pair"] - arrays["original_caption_random_image"],
        "TR_c": arrays["counterfactual_pair"] - arrays["original_caption_counterfactual_image"],
    }
