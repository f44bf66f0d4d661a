"""Retrieval metrics: Recall@K, Skew@K / MaxSkew@K / MinSkew@K / NDKL, Bias@K, AP@k and ODmAP@k.

Conventions shared by this module (see each function for details):

* **Ties** are resolved deterministically. Recall@K uses the *optimistic* rank (the number of
  candidates scoring strictly higher than the best positive), with a ``ties="pessimistic"`` option.
  Functions that need a full ordering (:func:`ranking_from_scores`, :func:`odmap_at_k`) sort by
  descending score and break ties by ascending candidate index (a stable sort).
* **k larger than the ranking** is a ``ValueError`` for the list metrics (Skew, Bias@K, AP@k,
  ODmAP@k), because a share "out of k" is not defined when fewer than k items exist; pass
  ``min(k, len(ranking))`` explicitly if that is what you want. Recall@K accepts any K (a ranking
  shorter than K contains every candidate, so every query is a hit).
* **Empty inputs** are a ``ValueError``.
* Recall@K and ODmAP@k are returned in **percent** (as reported in the papers); every other value
  is on its natural scale.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

from ._validation import (
    as_array,
    as_binary_array,
    as_float_array,
    as_label_list,
    check_k,
    check_k_within,
    unique_in_order,
)

__all__ = [
    "recall_at_k",
    "ranking_from_scores",
    "skew_at_k",
    "max_skew_at_k",
    "min_skew_at_k",
    "ndkl",
    "bias_at_k",
    "mean_bias_at_k",
    "AP_NORMALISERS",
    "average_precision_at_k",
    "odmap_relevance",
    "odmap_at_k",
]

# Rows of the similarity matrix processed per step by recall_at_k: about 1M entries (4 MB in
# float32), small enough to stay in cache for the two comparisons made on each block.
_CHUNK_ELEMENTS = 1 << 20


# --------------------------------------------------------------------------------------------
# Recall@K
# --------------------------------------------------------------------------------------------
def _check_ks(ks: Any) -> list[int]:
    if isinstance(ks, (int, np.integer)) and not isinstance(ks, bool):
        ks = (ks,)
    try:
        ks_list = list(ks)
    except TypeError as exc:
        raise ValueError(f"ks: expected an iterable of positive integers, got {ks!r}") from exc
    if not ks_list:
        raise ValueError("ks: is empty; give at least one K, e.g. ks=(1, 5, 10)")
    return unique_in_order(check_k(k, "ks") for k in ks_list)


def recall_at_k(similarity: Any, text_image: Any, ks: Iterable[int] = (1, 5, 10), *,
                ties: str = "optimistic") -> dict[str, float]:
    """Image↔text retrieval Recall@K in percent (BLIP / Karpathy COCO-Flickr protocol).

    Parameters
    ----------
    similarity:
        Array of shape ``(n_images, n_texts)``; ``similarity[i, j]`` scores image ``i`` against
        text ``j`` (higher = more similar). float32 is kept as is (no copy); memmaps work.
    text_image:
        Integer array of length ``n_texts``; ``text_image[j]`` is the index of the image that
        text ``j`` describes. Any number of texts per image is allowed (COCO 5k has ~25,010).
    ks:
        The cut-offs K (positive integers).
    ties:
        ``"optimistic"`` (default) or ``"pessimistic"``, see below.

    Returns
    -------
    dict
        ``{"image_to_text@K": ..., "text_to_image@K": ...}`` for every K, in percent.

    Definition
    ----------
    * text→image (image retrieval, IR@K): for text ``j`` the rank of its image is
      ``r_j = #{i : s[i, j] > s[text_image[j], j]}``; IR@K = 100 · #{j : r_j < K} / n_texts.
    * image→text (text retrieval, TR@K): image ``i`` is a hit if *any* of its texts is in the
      top K (BLIP ``itm_eval`` takes the minimum rank over the ground-truth captions; CLIP_benchmark
      counts a hit if any positive is in the top-k). The rank is computed against the best-scoring
      positive ``b_i = max_{j: text_image[j] = i} s[i, j]`` as ``r_i = #{j : s[i, j] > b_i}``;
      TR@K = 100 · #{i : r_i < K} / #(images with at least one text). Images that no text describes
      are still candidates (distractors) for text→image but are left out of the image→text mean.

    Ties: the published implementations (BLIP, CLIP_benchmark) break ties arbitrarily through
    ``argsort``/``topk``. Here the result is deterministic. ``"optimistic"`` counts only candidates
    scoring *strictly* higher than the positive (a tie is resolved in favour of the positive);
    ``"pessimistic"`` counts every *negative* scoring greater than *or equal to* the positive.
    Without ties both equal the argsort-based value.

    K larger than the number of candidates is allowed: every query is then a hit.

    Cost: one pass over the matrix in row blocks (two comparisons per entry, no sort); a
    25,000 × 5,000 float32 matrix takes well under a second (see ``benchmarks/bench_recall.py``).

    Sources: Li et al. 2022, "BLIP", ``train_retrieval.py::itm_eval``; Karpathy & Fei-Fei 2015
    (COCO/Flickr30k retrieval splits); LAION CLIP_benchmark ``zeroshot_retrieval.py``.
    """
    if ties not in ("optimistic", "pessimistic"):
        raise ValueError(f"ties: expected 'optimistic' or 'pessimistic', got {ties!r}")
    ks_list = _check_ks(ks)
    sim = as_array(similarity, "similarity", ndim=2)
    if sim.dtype.kind not in "fiub":
        raise ValueError(f"similarity: expected numeric scores, got dtype {sim.dtype}")
    if sim.dtype.kind == "b":
        sim = sim.astype(np.int8)
    n_img, n_txt = sim.shape
    owner = as_array(text_image, "text_image", ndim=1)
    if owner.dtype.kind not in "iu":
        raise ValueError(f"text_image: expected integer image indices, got dtype {owner.dtype}")
    if owner.shape[0] != n_txt:
        raise ValueError(
            f"text_image has {owner.shape[0]} entries but similarity has {n_txt} text columns; "
            "similarity must be (n_images, n_texts) with one text_image entry per column"
        )
    if owner.min() < 0 or owner.max() >= n_img:
        bad = owner[(owner < 0) | (owner >= n_img)][0]
        raise ValueError(f"text_image: index {bad} is outside [0, {n_img}) (n_images = similarity rows)")
    owner = owner.astype(np.intp, copy=False)

    cols = np.arange(n_txt)
    pos_text = sim[owner, cols]  # score of each text with its own image
    if sim.dtype.kind == "f" and np.isnan(pos_text).any():
        raise ValueError("similarity: contains NaN for a (image, own text) pair")
    # Best positive score per image (images without texts keep -inf / are excluded below).
    if sim.dtype.kind == "f":
        best = np.full(n_img, -np.inf, dtype=sim.dtype)
    else:
        best = np.full(n_img, np.iinfo(sim.dtype).min, dtype=sim.dtype)
    np.maximum.at(best, owner, pos_text)
    has_text = np.bincount(owner, minlength=n_img) > 0

    pessimistic = ties == "pessimistic"
    compare = np.greater_equal if pessimistic else np.greater
    t2i_rank = np.zeros(n_txt, dtype=np.int64)
    i2t_rank = np.zeros(n_img, dtype=np.int64)
    rows = max(1, _CHUNK_ELEMENTS // max(n_txt, 1))
    buf = np.empty((min(rows, n_img), n_txt), dtype=bool)
    check_nan = sim.dtype.kind == "f"
    for r0 in range(0, n_img, rows):
        block = sim[r0:r0 + rows]
        m = block.shape[0]
        out = buf[:m]
        if check_nan:
            np.isnan(block, out=out)
            if out.any():
                i, j = np.argwhere(out)[0]
                raise ValueError(f"similarity: contains NaN (first at image {r0 + i}, text {j})")
        compare(block, pos_text, out=out)
        t2i_rank += np.count_nonzero(out, axis=0)
        compare(block, best[r0:r0 + m, None], out=out)
        i2t_rank[r0:r0 + m] = np.count_nonzero(out, axis=1)
    if pessimistic:
        # ">=" counted the positive itself (t2i) / every positive tied with the best one (i2t).
        t2i_rank -= 1
        n_best_ties = np.zeros(n_img, dtype=np.int64)
        np.add.at(n_best_ties, owner, pos_text == best[owner])
        i2t_rank -= n_best_ties

    i2t_rank = i2t_rank[has_text]
    result: dict[str, float] = {}
    for k in ks_list:
        result[f"image_to_text@{k}"] = 100.0 * float(np.count_nonzero(i2t_rank < k)) / i2t_rank.size
    for k in ks_list:
        result[f"text_to_image@{k}"] = 100.0 * float(np.count_nonzero(t2i_rank < k)) / n_txt
    return result


def ranking_from_scores(scores: Any) -> np.ndarray:
    """Indices that sort ``scores`` (1-D) by descending score; ties keep ascending index order.

    Use it to turn retrieval scores into the ranked label lists expected by :func:`skew_at_k`,
    :func:`ndkl` and :func:`bias_at_k`: ``[labels[i] for i in ranking_from_scores(s)]``.
    This is the deterministic tie rule recommended by the reference notes (``argsort(-s, stable)``).
    """
    s = as_float_array(scores, "scores", ndim=1)
    return np.argsort(-s, kind="stable")


# --------------------------------------------------------------------------------------------
# Skew@K, MaxSkew@K, MinSkew@K, NDKL
# --------------------------------------------------------------------------------------------
def _resolve_distribution(ranked: list, labels: Sequence[Hashable] | None,
                          desired: Mapping[Hashable, float] | None) -> tuple[list, np.ndarray]:
    """The attribute values to score and their desired proportions (validated)."""
    if labels is None:
        label_list = list(desired.keys()) if desired is not None else unique_in_order(ranked)
    else:
        label_list = as_label_list(labels, "labels")
        if len(set(label_list)) != len(label_list):
            raise ValueError(f"labels: contains duplicates: {label_list!r}")
    if not label_list:
        raise ValueError("desired: is empty; give one proportion per attribute value")
    if desired is None:
        return label_list, np.full(len(label_list), 1.0 / len(label_list))
    if not isinstance(desired, Mapping):
        raise ValueError(f"desired: expected a dict label -> proportion, got {type(desired).__name__}")
    missing = [a for a in label_list if a not in desired]
    if missing:
        raise ValueError(f"desired: has no proportion for label(s) {missing!r}")
    extra = [a for a in desired if a not in set(label_list)]
    if extra:
        raise ValueError(f"desired: has proportions for label(s) {extra!r} that are not in labels")
    q = np.array([float(desired[a]) for a in label_list])
    if not np.all(np.isfinite(q)) or np.any(q <= 0):
        raise ValueError(f"desired: every proportion must be finite and > 0, got {dict(desired)!r}")
    if abs(q.sum() - 1.0) > 1e-6:
        raise ValueError(f"desired: proportions must sum to 1 over the labels, they sum to {q.sum():.6g}")
    return label_list, q


def skew_at_k(ranked_labels: Sequence[Hashable], k: int, labels: Sequence[Hashable] | None = None,
              desired: Mapping[Hashable, float] | None = None) -> dict[Hashable, float]:
    """Skew@k for every attribute value: ``Skew_a@k = ln(p_a / q_a)`` (Geyik et al. 2019).

    Parameters
    ----------
    ranked_labels:
        The attribute value (e.g. ``"male"``, ``("black", "female")``, ``0``) of each retrieved item,
        in rank order (best first). Build it with :func:`ranking_from_scores` for deterministic ties.
    k:
        Cut-off; must satisfy ``1 <= k <= len(ranked_labels)`` (otherwise ``ValueError``).
    labels:
        Attribute values to score. Default: the keys of ``desired`` if given, else every value present
        in ``ranked_labels`` (the whole ranking, not just the top k), in first-seen order.
    desired:
        Target proportions ``q_a`` (dict label -> proportion, each > 0, summing to 1 over ``labels``).
        Default: uniform ``1/|labels|`` ("equality of opportunity" in Berg et al.'s code).

    Definition
    ----------
    ``p_a = #{items with value a among the top k} / k``; a **zero count is replaced by 1/k**
    (as in Berg et al. 2022 and VisoGender, so the log is finite). Natural log. Items whose value is
    not in ``labels`` still occupy positions of the top k (the denominator stays k).

    Sources: Geyik, Ambler & Kenthapadi 2019, "Fairness-Aware Ranking in Search & Recommendation
    Systems with Application to LinkedIn Talent Search" (KDD); Berg et al. 2022, "A Prompt Array Keeps
    the Bias Away" (AACL), code ``oxai/debias-vision-lang`` ``measuring_bias.py``.
    """
    ranked = as_label_list(ranked_labels, "ranked_labels")
    k = check_k(k)
    check_k_within(k, len(ranked), "ranked items")
    label_list, q = _resolve_distribution(ranked, labels, desired)
    counts = Counter(ranked[:k])
    p = np.array([counts.get(a, 0) for a in label_list], dtype=float)
    p[p == 0] = 1.0
    p /= k
    return {a: float(v) for a, v in zip(label_list, np.log(p / q))}


def max_skew_at_k(ranked_labels: Sequence[Hashable], k: int, labels: Sequence[Hashable] | None = None,
                  desired: Mapping[Hashable, float] | None = None) -> float:
    """MaxSkew@k = max over attribute values of :func:`skew_at_k` (Geyik et al. 2019).

    Unlike Berg et al.'s code (which starts the running maximum at 0), the value is not clamped at 0.
    With every item labelled and uniform ``desired`` it is >= 0 anyway.
    """
    return max(skew_at_k(ranked_labels, k, labels, desired).values())


def min_skew_at_k(ranked_labels: Sequence[Hashable], k: int, labels: Sequence[Hashable] | None = None,
                  desired: Mapping[Hashable, float] | None = None) -> float:
    """MinSkew@k = min over attribute values of :func:`skew_at_k` (Geyik et al. 2019); not clamped at 0."""
    return min(skew_at_k(ranked_labels, k, labels, desired).values())


def ndkl(ranked_labels: Sequence[Hashable], labels: Sequence[Hashable] | None = None,
         desired: Mapping[Hashable, float] | None = None) -> float:
    """Normalised discounted KL divergence of a whole ranking (Geyik et al. 2019).

    ``NDKL = (1/Z) Σ_{i=1}^{n} KL(P_i ‖ Q) / log2(i + 1)`` with ``Z = Σ_{i=1}^{n} 1/log2(i + 1)``,
    where ``n = len(ranked_labels)`` (the **full** ranking, as in Geyik and in Berg et al.'s
    ``src/ranking.py``), ``P_i`` the label distribution of the top i, ``Q`` the desired distribution
    and ``KL(P‖Q) = Σ_{a: P_a > 0} P_a ln(P_a / Q_a)`` (natural log, ``0 · ln 0 = 0``, so no
    zero-count replacement is needed). 0 means every prefix matches ``Q`` exactly.

    ``labels``/``desired`` behave as in :func:`skew_at_k`, except that every item of the ranking must
    carry one of ``labels`` (a prefix distribution must sum to 1), otherwise ``ValueError``.
    To score only the top k items, pass ``ranked_labels[:k]``.

    Sources: Geyik, Ambler & Kenthapadi 2019 (KDD); Berg et al. 2022 (AACL), ``oxai/debias-vision-lang``.
    """
    ranked = as_label_list(ranked_labels, "ranked_labels")
    label_list, q = _resolve_distribution(ranked, labels, desired)
    index = {a: i for i, a in enumerate(label_list)}
    unknown = [a for a in unique_in_order(ranked) if a not in index]
    if unknown:
        raise ValueError(f"ranked_labels: value(s) {unknown!r} are not in labels {label_list!r}; "
                         "NDKL needs every ranked item to carry one of the labels")
    codes = np.fromiter((index[a] for a in ranked), dtype=np.intp, count=len(ranked))
    n, n_labels = codes.size, len(label_list)
    onehot = np.zeros((n, n_labels))
    onehot[np.arange(n), codes] = 1.0
    positions = np.arange(1, n + 1, dtype=float)
    p = np.cumsum(onehot, axis=0) / positions[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p / q[None, :]), 0.0)
    kl = terms.sum(axis=1)
    discount = 1.0 / np.log2(positions + 1.0)
    return float(np.dot(kl, discount) / discount.sum())


# --------------------------------------------------------------------------------------------
# Bias@K
# --------------------------------------------------------------------------------------------
def bias_at_k(ranked_genders: Sequence[Any], k: int) -> float:
    """Bias@K of one query: ``(N_male − N_female) / (N_male + N_female)`` over the top k.

    ``ranked_genders`` holds one gender label per retrieved image in rank order. ``"male"`` and
    ``"female"`` (case-insensitive, surrounding spaces ignored) are gendered; any other value
    (``"neutral"``, ``None``, ...) is neutral. The value is **signed** (positive = skewed towards men)
    and is exactly 0 when no gendered image is in the top k. ``k > len(ranked_genders)`` is a
    ``ValueError``.

    Source: Wang, Liu & Wang 2021, "Are Gender-Neutral Queries Really Gender-Neutral? Mitigating
    Gender Bias in Image Search" (EMNLP); code ``eric-ai-lab/Mitigate-Gender-Bias-in-Image-Search``.
    """
    ranked = as_label_list(ranked_genders, "ranked_genders")
    k = check_k(k)
    check_k_within(k, len(ranked), "ranked images")
    norm = [g.strip().lower() if isinstance(g, str) else None for g in ranked[:k]]
    n_male = norm.count("male")
    n_female = norm.count("female")
    if n_male + n_female == 0:
        return 0.0
    return (n_male - n_female) / (n_male + n_female)


def mean_bias_at_k(rankings: Iterable[Sequence[Any]], k: int) -> float:
    """Bias@K averaged over queries, ``(1/|Q|) Σ_q bias_at_k(ranking_q, k)`` (Wang et al. 2021)."""
    values = [bias_at_k(r, k) for r in rankings]
    if not values:
        raise ValueError("rankings: is empty; give at least one query's ranking")
    return float(np.mean(values))


# --------------------------------------------------------------------------------------------
# AP@k and ODmAP@k
# --------------------------------------------------------------------------------------------
#: AP@k normalisers (the divisor of ``Σ_{j<=k} P@j · rel_j``); see :func:`average_precision_at_k`
AP_NORMALISERS = ("hits_in_top_k", "min_k_relevant", "relevant")


def _check_normaliser(normaliser: str) -> str:
    if normaliser not in AP_NORMALISERS:
        raise ValueError(f"normaliser: expected one of {', '.join(AP_NORMALISERS)}, got {normaliser!r}")
    return normaliser


def _ap_divisor(normaliser: str, k: int, hits_in_top: Any, total: Any) -> Any:
    """Divisor of the summed precisions: ``min(k, R)``, ``max(1, hits in the top k)`` or ``R``."""
    if normaliser == "hits_in_top_k":
        return np.maximum(hits_in_top, 1)
    if normaliser == "relevant":
        return total
    return np.minimum(k, total)


def average_precision_at_k(relevance: Any, k: int, n_relevant: int | None = None, *,
                           normaliser: str = "hits_in_top_k") -> float:
    """AP@k of one ranked list: ``(1/N) Σ_{j=1}^{k} P@j · rel_j`` in [0, 1].

    ``normaliser`` picks N: ``hits_in_top_k`` (default, the paper's) the number of relevant items inside
    the top k, at least 1 (a list with no hit in its top k scores 0) — pytorch-metric-learning's
    ``mean_average_precision`` up to release 1.6.0, the library of Musgrave et al. 2020 that Kim et al.
    2023 cite for mAP@k; ``min_k_relevant`` ``min(k, R)``, the information-retrieval AP@k (also that
    library's rule in release 1.6.1 alone); ``relevant`` ``R`` itself (the library from release 1.6.2 on).
    At k = 1 ``hits_in_top_k`` and ``min_k_relevant`` agree; ``relevant`` does not (ranking
    ``[1, 0, 1]``: 1.0 against 0.5).

    ``relevance`` is the 0/1 relevance of the retrieved items in rank order, ``P@j`` the precision of
    the top j, and ``R`` the total number of relevant items in the gallery: ``n_relevant`` if given
    (it must be >= the relevant items listed), else ``sum(relevance)`` (so pass the full ranking).
    Returns ``nan`` when ``R == 0`` (no relevant item: AP is undefined; :func:`odmap_at_k` skips
    such queries). ``k > len(relevance)`` is a ``ValueError``.

    Source: the standard truncated AP used for mAP@k; Musgrave et al. 2020, "A Metric Learning
    Reality Check" (pytorch-metric-learning) for ``hits_in_top_k`` and ``relevant``.

    Not ``sklearn.metrics.average_precision_score``: sklearn computes the untruncated AP over scores,
    ``Σ_n (R_n − R_{n−1}) P_n`` over score thresholds, i.e. ``(1/R) Σ_j P@j · rel_j`` over the *whole*
    ranking with tied scores merged into one threshold. AP@k stops at rank k and divides by
    ``N`` (above), and takes an already ranked list (ties broken by the
    caller). The two agree only for ``k = len(relevance)``, every relevant item listed and no tied
    scores (any normaliser); the tests check that case against sklearn.
    """
    rel = as_binary_array(relevance, "relevance")
    k = check_k(k)
    check_k_within(k, rel.size, "ranked items in relevance")
    _check_normaliser(normaliser)
    listed = int(np.count_nonzero(rel))
    if n_relevant is None:
        total = listed
    else:
        if isinstance(n_relevant, bool) or not isinstance(n_relevant, (int, np.integer)):
            raise ValueError(f"n_relevant: expected a non-negative integer, got {n_relevant!r}")
        total = int(n_relevant)
        if total < listed:
            raise ValueError(f"n_relevant={total} is smaller than the {listed} relevant items in relevance")
    if total == 0:
        return float("nan")
    top = rel[:k].astype(float)
    precision = np.cumsum(top) / np.arange(1, k + 1)
    return float(np.dot(precision, top) / _ap_divisor(normaliser, k, int(top.sum()), total))


def _class_matrix(sets: Any, name: str, vocab: dict | None) -> tuple[np.ndarray, dict | None]:
    """Multi-hot matrix from a 2-D 0/1 array, or from a sequence of class-name collections."""
    if isinstance(sets, np.ndarray) and sets.ndim == 2:
        return as_binary_array(sets, name, ndim=2), None
    if isinstance(sets, (str, bytes)):
        raise ValueError(f"{name}: expected a sequence of class collections, got a string")
    rows = list(sets)
    if not rows:
        raise ValueError(f"{name}: is empty")
    out = np.zeros((len(rows), len(vocab)), dtype=bool)
    for r, classes in enumerate(rows):
        if isinstance(classes, (str, bytes)):
            raise ValueError(f"{name}[{r}]: expected a collection of class names, got the string {classes!r}; "
                             "wrap a single class as [name]")
        for c in classes:
            out[r, vocab[c]] = True
    return out, vocab


def odmap_relevance(removed_classes: Any, remaining_classes: Any, caption_classes: Any) -> np.ndarray:
    """Relevance matrix for ODmAP@k: ``rel[q, g]`` for query image q and gallery caption g.

    A caption is relevant to a query (a synthetic image from which the classes ``removed_classes[q]``
    were removed) **iff it names none of the removed classes and at least one class still in the
    image** (``remaining_classes[q]``), the two conditions of Kim et al. 2023, §3.2.

    Inputs are either sequences of class-name collections (one per query / per caption; e.g. the
    COCO categories matched in the caption's noun phrases) or 2-D 0/1 multi-hot arrays over a shared
    class axis (all three must then be arrays). A class listed as both removed and remaining for the
    same query is a ``ValueError``. Returns a boolean array of shape ``(n_queries, n_captions)``.
    """
    as_arrays = [isinstance(x, np.ndarray) and x.ndim == 2
                 for x in (removed_classes, remaining_classes, caption_classes)]
    if any(as_arrays) and not all(as_arrays):
        raise ValueError("removed_classes, remaining_classes and caption_classes must all be 2-D "
                         "multi-hot arrays or all be sequences of class collections")
    vocab = None
    if not any(as_arrays):
        try:
            removed_classes, remaining_classes, caption_classes = (
                [list(c) if not isinstance(c, (str, bytes)) else c for c in x]
                for x in (removed_classes, remaining_classes, caption_classes))
        except TypeError as exc:
            raise ValueError(f"class inputs must be sequences of collections ({exc})") from exc
        names = unique_in_order(c for x in (removed_classes, remaining_classes, caption_classes)
                                for row in x if not isinstance(row, (str, bytes)) for c in row)
        vocab = {c: i for i, c in enumerate(names)}
    removed, _ = _class_matrix(removed_classes, "removed_classes", vocab)
    remaining, _ = _class_matrix(remaining_classes, "remaining_classes", vocab)
    captions, _ = _class_matrix(caption_classes, "caption_classes", vocab)
    if removed.shape[0] != remaining.shape[0]:
        raise ValueError(f"removed_classes has {removed.shape[0]} queries but remaining_classes has "
                         f"{remaining.shape[0]}")
    if not (removed.shape[1] == remaining.shape[1] == captions.shape[1]):
        raise ValueError("removed_classes, remaining_classes and caption_classes must share the class axis, "
                         f"got widths {removed.shape[1]}, {remaining.shape[1]}, {captions.shape[1]}")
    clash = removed & remaining
    if clash.any():
        q = int(np.argwhere(clash)[0][0])
        raise ValueError(f"query {q}: a class is listed both as removed and as remaining")
    cap = captions.astype(np.float32)
    names_removed = removed.astype(np.float32) @ cap.T > 0      # (n_q, n_g)
    names_remaining = remaining.astype(np.float32) @ cap.T > 0
    return ~names_removed & names_remaining


def _top_k_indices(sim: np.ndarray, k: int) -> np.ndarray:
    """Per row, the k column indices ordered by (descending score, ascending index)."""
    n_rows, n_cols = sim.shape
    if k == n_cols:
        return np.argsort(-sim, axis=1, kind="stable")
    kth = -np.partition(-sim, k - 1, axis=1)[:, k - 1]       # k-th largest value per row
    greater = sim > kth[:, None]
    need = k - np.count_nonzero(greater, axis=1)             # how many tied-at-kth items to take
    equal = sim == kth[:, None]
    take_equal = equal & (np.cumsum(equal, axis=1) <= need[:, None])  # lowest indices first
    selected = greater | take_equal
    idx = np.nonzero(selected)[1].reshape(n_rows, k)          # ascending index within each row
    scores = np.take_along_axis(sim, idx, axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1)


def odmap_at_k(similarity: Any, relevance: Any, k: int, *, percent: bool = True,
               return_per_query: bool = False,
               normaliser: str = "hits_in_top_k") -> float | tuple[float, np.ndarray]:
    """ODmAP@k: mean AP@k of caption retrieval for synthetic (object-removed) query images.

    Parameters
    ----------
    similarity:
        ``(n_queries, n_captions)``; ``similarity[q, g]`` scores query image q against gallery
        caption g (higher = more similar). No NaN.
    relevance:
        ``(n_queries, n_captions)`` 0/1 matrix, typically from :func:`odmap_relevance`.
    k:
        Cut-off, ``1 <= k <= n_captions`` (otherwise ``ValueError``).
    percent:
        Return ×100 (default, as reported by Kim et al.); ``False`` gives [0, 1].
    return_per_query:
        Also return the per-query AP@k array (``nan`` for skipped queries), e.g. to combine
        query chunks of a very large gallery yourself (``np.nanmean`` of the concatenation).
    normaliser:
        The AP@k divisor (:func:`average_precision_at_k`): ``hits_in_top_k`` (default: relevant captions
        inside the top k, at least 1 — the cited metric-learning library's mAP@k up to release 1.6.0,
        the paper's), ``min_k_relevant`` (``min(k, R_q)``, the information-retrieval AP@k) or
        ``relevant`` (``R_q``).

    Definition (ours; Kim et al. 2023 published no code)
    ----------------------------------------------------
    Captions are ranked by descending similarity, ties broken by ascending gallery index. For each
    query, ``AP@k = (1/N_q) Σ_{j=1}^{k} P@j · rel_j`` with ``N_q`` set by ``normaliser`` (``R_q`` is
    the number of relevant captions in the whole gallery; see :func:`average_precision_at_k`);
    ODmAP@k is the mean over queries. **Queries with R_q = 0 are skipped** (AP undefined; the
    metric-learning library drops such "lone" queries too); if every query is skipped, ``ValueError``.
    A query with relevant captions but none in its top k scores 0 under every normaliser.

    Source: Kim, Koepke, Schmid & Akata 2023, "Exposing and Mitigating Spurious Correlations for
    Cross-Modal Retrieval" (CVPR Workshops), §3.2 — the relevance rule and "mAP@k" of their
    reference [52] (Musgrave et al. 2020, pytorch-metric-learning): ``normaliser="hits_in_top_k"``,
    the default. Per query this is :func:`average_precision_at_k`, not sklearn's
    ``average_precision_score`` (untruncated, ties merged; see there why they differ).
    """
    sim = as_float_array(similarity, "similarity", ndim=2)
    rel = as_binary_array(relevance, "relevance", ndim=2)
    if rel.shape != sim.shape:
        raise ValueError(f"relevance has shape {rel.shape} but similarity has shape {sim.shape}")
    k = check_k(k)
    check_k_within(k, sim.shape[1], "gallery captions")
    _check_normaliser(normaliser)
    n_q, n_g = sim.shape
    per_query = np.full(n_q, np.nan)
    n_rel_total = np.count_nonzero(rel, axis=1)
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(n_g, 1))
    positions = np.arange(1, k + 1, dtype=float)
    for r0 in range(0, n_q, rows_per_chunk):
        r1 = min(n_q, r0 + rows_per_chunk)
        top = _top_k_indices(sim[r0:r1], k)
        hits = np.take_along_axis(rel[r0:r1], top, axis=1).astype(float)
        precision = np.cumsum(hits, axis=1) / positions
        total = n_rel_total[r0:r1]
        with np.errstate(divide="ignore", invalid="ignore"):
            ap = (precision * hits).sum(axis=1) / _ap_divisor(normaliser, k, hits.sum(axis=1), total)
        per_query[r0:r1] = np.where(total > 0, ap, np.nan)
    valid = ~np.isnan(per_query)
    if not valid.any():
        raise ValueError("odmap_at_k: no query has a relevant caption in the gallery (all queries skipped)")
    mean = float(per_query[valid].mean()) * (100.0 if percent else 1.0)
    if return_per_query:
        return mean, per_query
    return mean
