"""Fairness and classification metrics: DEO, ΔAcc, mAcc, AP, bias amplification and LIC.

Inputs are 1-D arrays with one entry per example (``y_true``: 0/1 targets, ``y_pred``: 0/1
predictions, ``scores``: real-valued classifier scores, ``protected`` / ``groups``: group labels of
any hashable type), or 2-D 0/1 matrices for the multi-label bias-amplification metrics. Values are
fractions in [0, 1] unless a ``percent`` option says otherwise. Empty inputs, mismatched lengths and
undefined quantities (e.g. a group without positives for DEO) raise ``ValueError``.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import numpy as np

from ._validation import (
    as_array,
    as_binary_array,
    as_float_array,
    check_same_length,
    unique_in_order,
)

__all__ = [
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
    "gender_balanced_split",
]


# --------------------------------------------------------------------------------------------
# Group helpers
# --------------------------------------------------------------------------------------------
def group_codes(groups: Any, name: str = "groups") -> tuple[list, np.ndarray]:
    """Distinct group values (sorted when sortable, else first-seen order) and each example's code."""
    arr = as_array(groups, name, ndim=1)
    values = arr.tolist()
    distinct = unique_in_order(values)
    try:
        distinct = sorted(distinct)
    except TypeError:
        pass
    index = {v: i for i, v in enumerate(distinct)}
    codes = np.fromiter((index[v] for v in values), dtype=np.intp, count=len(values))
    return distinct, codes


def intersect_groups(*groupings: Any) -> list[tuple]:
    """Row-wise tuples of several group arrays, e.g. ``intersect_groups(y_true, gender)`` for the
    target × protected-attribute groups used by CVLD's worst-group ΔAcc."""
    if not groupings:
        raise ValueError("intersect_groups: give at least one group array")
    arrays = [as_array(g, f"groupings[{i}]", ndim=1).tolist() for i, g in enumerate(groupings)]
    check_same_length(**{f"groupings[{i}]": a for i, a in enumerate(arrays)})
    return list(zip(*arrays))


def _binary_pair(y_true: Any, y_pred: Any) -> tuple[np.ndarray, np.ndarray]:
    t = as_binary_array(y_true, "y_true")
    p = as_binary_array(y_pred, "y_pred")
    check_same_length(y_true=t, y_pred=p)
    return t, p


# --------------------------------------------------------------------------------------------
# DEO (Ramaswamy et al. 2021)
# --------------------------------------------------------------------------------------------
def false_negative_rate(y_true: Any, y_pred: Any) -> float:
    """FNR = 1 − recall = #(y_true=1, y_pred=0) / #(y_true=1). No positive example: ``ValueError``."""
    t, p = _binary_pair(y_true, y_pred)
    n_pos = int(t.sum())
    if n_pos == 0:
        raise ValueError("false_negative_rate: y_true has no positive example; FNR is undefined")
    return float(np.count_nonzero(t & ~p) / n_pos)


def calibrated_threshold(y_true: Any, scores: Any) -> float:
    """Score threshold from validation data: the cp-th largest score, cp = number of positives.

    Predictions are then ``scores > threshold`` (strict), applied unchanged to the test set. This is
    ``calibrated_threshold`` of ``princetonvisualai/gan-debiasing`` (Ramaswamy et al. 2021); note that
    with the strict ``>`` (as there) and no ties, exactly cp − 1 validation examples are predicted
    positive.
    """
    t = as_binary_array(y_true, "y_true")
    s = as_float_array(scores, "scores", ndim=1)
    check_same_length(y_true=t, scores=s)
    cp = int(t.sum())
    if cp == 0:
        raise ValueError("calibrated_threshold: the validation labels contain no positive example")
    return float(np.sort(s)[-cp])


def _fnr_pair(t: np.ndarray, p: np.ndarray, codes: np.ndarray) -> tuple[float, float]:
    fnr = []
    for g in (0, 1):
        pos = t & (codes == g)
        n_pos = int(pos.sum())
        if n_pos == 0:
            raise ValueError(f"deo: protected group {g} has no positive example; its FNR is undefined")
        fnr.append(np.count_nonzero(pos & ~p) / n_pos)
    return fnr[0], fnr[1]


def _two_groups(protected: Any, n: int) -> tuple[list, np.ndarray]:
    names, codes = group_codes(protected, "protected")
    if len(codes) != n:
        raise ValueError(f"protected has {len(codes)} entries but the labels have {n}")
    if len(names) != 2:
        raise ValueError(f"protected: DEO needs exactly two groups, found {len(names)}: {names!r}")
    return names, codes


def deo(y_true: Any, y_pred: Any, protected: Any) -> float:
    """Difference in equal opportunity: ``DEO = |FNR_{g0} − FNR_{g1}|`` (= |TPR_{g0} − TPR_{g1}|).

    ``protected`` must contain exactly two distinct values (e.g. CelebA ``Male`` 0/1). A group with
    no positive example is a ``ValueError`` (sklearn's ``recall_score``, used by the reference code,
    would silently return recall 0 there). Returns a fraction; multiply by 100 for the tables.

    Source: Ramaswamy, Kim & Russakovsky 2021, "Fair Attribute Classification through Latent Space
    De-biasing" (CVPR), ``princetonvisualai/gan-debiasing`` ``utils.py``; Hardt et al. 2016.
    """
    t, p = _binary_pair(y_true, y_pred)
    _, codes = _two_groups(protected, len(t))
    f0, f1 = _fnr_pair(t, p, codes)
    return float(abs(f0 - f1))


def bootstrap_deo(y_true: Any, y_pred: Any, protected: Any, *, n_resamples: int = 500,
                  seed: int = 0) -> dict[str, float]:
    """DEO over bootstrap resamples, as reported by Ramaswamy et al. (median of 500 resamples).

    Draws ``n_resamples`` resamples of the examples with replacement (``numpy.random.default_rng(seed)``),
    computes :func:`deo` on each, and returns ``{"deo": median, "std": standard deviation (ddof=0),
    "n_valid": resamples used}``. A resample in which a group has no positive example is skipped
    (the reference code would count that group's recall as 0); if all are skipped, ``ValueError``.
    The reference script prints ``100·median ± 200·std``.
    """
    t, p = _binary_pair(y_true, y_pred)
    _, codes = _two_groups(protected, len(t))
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples: expected a positive integer, got {n_resamples!r}")
    n = t.size
    # Per-example category: 0/1 = negative in group 0/1, 2/3 = missed positive, 4/5 = found positive.
    category = codes + 2 * np.where(t, np.where(p, 2, 1), 0)
    rng = np.random.default_rng(seed)
    values = np.empty(n_resamples)
    batch = max(1, (1 << 22) // max(n, 1))
    for b0 in range(0, n_resamples, batch):
        b1 = min(n_resamples, b0 + batch)
        idx = rng.integers(0, n, size=(b1 - b0, n))
        flat = category[idx] + 6 * np.arange(b1 - b0)[:, None]
        counts = np.bincount(flat.ravel(), minlength=6 * (b1 - b0)).reshape(b1 - b0, 6)
        missed, found = counts[:, 2:4], counts[:, 4:6]
        with np.errstate(divide="ignore", invalid="ignore"):
            fnr = missed / (missed + found)
        values[b0:b1] = np.abs(fnr[:, 0] - fnr[:, 1])
    valid = values[~np.isnan(values)]
    if valid.size == 0:
        raise ValueError("bootstrap_deo: every resample had a group without positive examples")
    return {"deo": float(np.median(valid)), "std": float(np.std(valid)), "n_valid": int(valid.size)}


def deo_from_scores(y_true: Any, scores: Any, protected: Any, *, threshold: float | None = None,
                    val_true: Any = None, val_scores: Any = None, n_resamples: int = 500,
                    seed: int = 0) -> dict[str, float]:
    """DEO from classifier scores with the reference protocol of Ramaswamy et al. 2021.

    Predictions are ``scores > threshold``; ``threshold`` is given, or calibrated on validation data
    with :func:`calibrated_threshold` (``val_true``/``val_scores``). Exactly one of the two must be
    given. Returns ``{"threshold", "deo_point": deo on the full test set, "deo": bootstrap median,
    "std", "n_valid"}`` (``n_resamples=0`` skips the bootstrap and sets ``deo`` to the point value).
    """
    s = as_float_array(scores, "scores", ndim=1)
    have_val = val_true is not None or val_scores is not None
    if (threshold is None) == (not have_val):
        raise ValueError("deo_from_scores: give either threshold or both val_true and val_scores (not both)")
    if threshold is None:
        if val_true is None or val_scores is None:
            raise ValueError("deo_from_scores: calibration needs both val_true and val_scores")
        threshold = calibrated_threshold(val_true, val_scores)
    pred = s > float(threshold)
    out = {"threshold": float(threshold), "deo_point": deo(y_true, pred, protected)}
    if n_resamples:
        boot = bootstrap_deo(y_true, pred, protected, n_resamples=n_resamples, seed=seed)
        out.update(boot)
    else:
        out.update({"deo": out["deo_point"], "std": float("nan"), "n_valid": 0})
    return out


# --------------------------------------------------------------------------------------------
# Group accuracies
# --------------------------------------------------------------------------------------------
def group_accuracies(y_true: Any, y_pred: Any, groups: Any) -> dict[Hashable, float]:
    """Accuracy within each group: ``{g: mean(y_pred == y_true over examples of g)}``.

    Labels may be any comparable values (binary or multi-class). ``groups`` may hold any hashable
    values, e.g. the tuples of :func:`intersect_groups`.
    """
    t = as_array(y_true, "y_true", ndim=1)
    p = as_array(y_pred, "y_pred", ndim=1)
    g = groups if isinstance(groups, list) else as_array(groups, "groups", ndim=1)
    check_same_length(y_true=t, y_pred=p, groups=g)
    if isinstance(groups, list):
        distinct = unique_in_order(groups)
        try:
            distinct = sorted(distinct)
        except TypeError:
            pass
        index = {v: i for i, v in enumerate(distinct)}
        codes = np.fromiter((index[v] for v in groups), dtype=np.intp, count=len(groups))
    else:
        distinct, codes = group_codes(g)
    correct = (t == p).astype(float)
    hits = np.bincount(codes, weights=correct, minlength=len(distinct))
    counts = np.bincount(codes, minlength=len(distinct))
    return {v: float(h / c) for v, h, c in zip(distinct, hits, counts)}


def mean_group_accuracy(y_true: Any, y_pred: Any, groups: Any) -> float:
    """mAcc: the unweighted mean of :func:`group_accuracies` (each group counts once).

    Used by CVLD ("mean accuracy over demographic groups"), with ``groups`` = the protected attribute.
    """
    return float(np.mean(list(group_accuracies(y_true, y_pred, groups).values())))


def delta_accuracy(y_true: Any, y_pred: Any, groups: Any, *, reference: str = "max") -> float:
    """Accuracy gap ΔAcc between groups (a fraction).

    * ``reference="max"`` (default, **our definition**): ``max_g Acc_g − min_g Acc_g``.
    * ``reference="mean"``: ``Acc_all − min_g Acc_g``, the accuracy of the whole dataset minus the
      worst group, which is the wording of the CVLD paper (groups = target × protected attribute,
      build them with :func:`intersect_groups`).

    Ramaswamy et al. 2021 (whose protocol CVLD follows) define no ΔAcc in code, so whichever is used
    must be reported.
    """
    accs = group_accuracies(y_true, y_pred, groups)
    worst = min(accs.values())
    if reference == "max":
        return float(max(accs.values()) - worst)
    if reference == "mean":
        t = as_array(y_true, "y_true", ndim=1)
        p = as_array(y_pred, "y_pred", ndim=1)
        return float(np.mean(t == p) - worst)
    raise ValueError(f"reference: expected 'max' or 'mean', got {reference!r}")


def average_precision(y_true: Any, scores: Any) -> float:
    """Average precision of a scored binary classification, ``AP = Σ_n (R_n − R_{n−1}) P_n``.

    ``P_n``/``R_n`` are precision and recall at the n-th distinct score threshold in decreasing
    order (examples with equal scores enter together), i.e. the step-wise definition of
    ``sklearn.metrics.average_precision_score`` without interpolation. No positive: ``ValueError``.
    """
    t = as_binary_array(y_true, "y_true")
    s = as_float_array(scores, "scores", ndim=1)
    check_same_length(y_true=t, scores=s)
    n_pos = int(t.sum())
    if n_pos == 0:
        raise ValueError("average_precision: y_true has no positive example")
    order = np.argsort(-s, kind="stable")
    s_sorted, t_sorted = s[order], t[order]
    last = np.r_[np.nonzero(np.diff(s_sorted))[0], s_sorted.size - 1]  # end of each score block
    tp = np.cumsum(t_sorted)[last]
    precision = tp / (last + 1)
    recall = tp / n_pos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


# --------------------------------------------------------------------------------------------
# Bias amplification (Zhao et al. 2017) and directional BA (Wang & Russakovsky 2021)
# --------------------------------------------------------------------------------------------
def bias_amplification(train_attributes: Any, train_groups: Any, pred_attributes: Any, pred_groups: Any,
                       *, groups: Sequence[Hashable] | None = None, min_train_count: int = 1) -> float:
    """Bias amplification of Zhao et al. 2017 ("Men Also Like Shopping", EMNLP).

    ``train_attributes`` (n_train, O) and ``pred_attributes`` (n_test, O) are 0/1 matrices: whether
    object/verb o is present in a training example / predicted for a test example. ``train_groups``
    and ``pred_groups`` give each example's group (e.g. the annotated and the predicted gender).
    ``groups`` lists the group values counted (default: those in ``train_groups``); examples with any
    other value (e.g. ``"neutral"``) are ignored.

    With ``c(o, g)`` = number of examples of group g containing o, the bias is
    ``b(o, g) = c(o, g) / Σ_g' c(o, g')`` — ``b*`` on training labels, ``b̃`` on test predictions — and

        ``BA = (1/|O|) Σ_g Σ_{o ∈ O : b*(o, g) > 1/|G|} (b̃(o, g) − b*(o, g))``.

    ``O`` keeps the objects with at least ``min_train_count`` group-labelled training examples and at
    least one group-labelled prediction (``b̃`` undefined otherwise); this filtering is our reading
    of the official ``uclanlp/reducingbias`` code, which also drops rare objects. No object left:
    ``ValueError``.
    """
    a_tr = as_binary_array(train_attributes, "train_attributes", ndim=2)
    a_pr = as_binary_array(pred_attributes, "pred_attributes", ndim=2)
    if a_tr.shape[1] != a_pr.shape[1]:
        raise ValueError(f"train_attributes has {a_tr.shape[1]} columns but pred_attributes has {a_pr.shape[1]}")
    g_tr = as_array(train_groups, "train_groups", ndim=1).tolist()
    g_pr = as_array(pred_groups, "pred_groups", ndim=1).tolist()
    check_same_length(train_attributes=a_tr, train_groups=g_tr)
    check_same_length(pred_attributes=a_pr, pred_groups=g_pr)
    if groups is None:
        group_list = unique_in_order(g_tr)
        try:
            group_list = sorted(group_list)
        except TypeError:
            pass
    else:
        group_list = unique_in_order(groups)
    if len(group_list) < 2:
        raise ValueError(f"bias_amplification needs at least two groups, got {group_list!r}")
    if isinstance(min_train_count, bool) or not isinstance(min_train_count, (int, np.integer)) \
            or min_train_count < 1:
        raise ValueError(f"min_train_count: expected a positive integer, got {min_train_count!r}")
    index = {g: i for i, g in enumerate(group_list)}

    def counts(attrs: np.ndarray, labels: list) -> np.ndarray:
        onehot = np.zeros((len(labels), len(group_list)))
        for r, g in enumerate(labels):
            if g in index:
                onehot[r, index[g]] = 1.0
        return attrs.astype(float).T @ onehot          # (O, G)

    c_tr, c_pr = counts(a_tr, g_tr), counts(a_pr, g_pr)
    tot_tr, tot_pr = c_tr.sum(axis=1), c_pr.sum(axis=1)
    keep = (tot_tr >= min_train_count) & (tot_pr > 0)
    if not keep.any():
        raise ValueError("bias_amplification: no object has both group-labelled training examples and predictions")
    b_star = c_tr[keep] / tot_tr[keep, None]
    b_tilde = c_pr[keep] / tot_pr[keep, None]
    biased = c_tr[keep] * len(group_list) > tot_tr[keep, None]   # b*(o, g) > 1/|G|, exactly
    return float(np.sum((b_tilde - b_star) * biased) / keep.sum())


def directional_bias_amplification(train_attributes: Any, train_tasks: Any, test_attributes: Any,
                                   test_tasks: Any, predictions: Any, *, direction: str = "A->T") -> float:
    """Directional bias amplification BiasAmp→ (Wang & Russakovsky 2021, ICML).

    All inputs are 0/1 matrices: ``*_attributes`` (n, |A|) protected attributes (e.g. gender one-hot),
    ``*_tasks`` (n, |T|) task labels (e.g. objects), on the training and the test set.
    ``predictions`` are predicted tasks (m, |T|) for ``direction="A->T"`` or predicted attributes
    (m, |A|) for ``"T->A"``.

    * ``y_at = sign(P(A_a=1, T_t=1) − P(A_a=1) P(T_t=1))`` on the **training** labels;
    * A→T: ``Δ_at = P(T̂_t=1 | A_a=1) − P(T_t=1 | A_a=1)`` on the test set;
      T→A: ``Δ_at = P(Â_a=1 | T_t=1) − P(A_a=1 | T_t=1)``;
    * ``BiasAmp→ = mean over (a, t) of y_at · Δ_at``, ignoring pairs whose conditioning set is empty
      (NaN, as ``nanmean`` in ``princetonvisualai/directional-bias-amp``). Pairs with exactly
      independent training statistics (``y_at = 0``) contribute 0.
    """
    if direction not in ("A->T", "T->A"):
        raise ValueError(f"direction: expected 'A->T' or 'T->A', got {direction!r}")
    a_tr = as_binary_array(train_attributes, "train_attributes", ndim=2).astype(float)
    t_tr = as_binary_array(train_tasks, "train_tasks", ndim=2).astype(float)
    a_te = as_binary_array(test_attributes, "test_attributes", ndim=2).astype(float)
    t_te = as_binary_array(test_tasks, "test_tasks", ndim=2).astype(float)
    pred = as_binary_array(predictions, "predictions", ndim=2).astype(float)
    check_same_length(train_attributes=a_tr, train_tasks=t_tr)
    check_same_length(test_attributes=a_te, test_tasks=t_te, predictions=pred)
    if a_tr.shape[1] != a_te.shape[1] or t_tr.shape[1] != t_te.shape[1]:
        raise ValueError("train and test matrices must have the same attribute and task columns")
    expected = t_te.shape[1] if direction == "A->T" else a_te.shape[1]
    if pred.shape[1] != expected:
        raise ValueError(f"predictions: expected {expected} columns for direction {direction}, got {pred.shape[1]}")
    n = a_tr.shape[0]
    p_at = a_tr.T @ t_tr / n                                   # (|A|, |T|)
    y = np.sign(p_at - np.outer(a_tr.mean(axis=0), t_tr.mean(axis=0)))
    with np.errstate(divide="ignore", invalid="ignore"):
        if direction == "A->T":
            denom = a_te.sum(axis=0)[:, None]                  # condition on A_a = 1
            delta = (a_te.T @ pred - a_te.T @ t_te) / denom
        else:
            denom = t_te.sum(axis=0)[None, :]                  # condition on T_t = 1
            delta = (pred.T @ t_te - a_te.T @ t_te) / denom
    values = y * delta
    if np.all(np.isnan(values)):
        raise ValueError("directional_bias_amplification: every conditioning set is empty on the test set")
    return float(np.nanmean(values))


# --------------------------------------------------------------------------------------------
# LIC (Hirota et al. 2022)
# --------------------------------------------------------------------------------------------
def lic_score(probabilities: Any, labels: Any, *, percent: bool = False) -> float:
    """Leakage score LIC of a protected-attribute classifier (Hirota, Nakashima & Garcia 2022, CVPR).

    ``probabilities``: 1-D ``P(class 1)`` of a binary (sigmoid) classifier, or 2-D (n, C) class
    probabilities; ``labels``: the true class (0/1, or 0..C−1). Per example
    ``score_i = 1[pred_i == label_i] · confidence_i`` where, binary, ``pred = 1[p > 0.5]`` (0.5
    goes to class 0, like ``torch.round``) and ``confidence = max(p, 1 − p)``; multi-class, ``pred``
    is the arg-max (first on ties) and ``confidence`` its probability. ``LIC = mean_i score_i``, ×100
    with ``percent=True`` (as printed by ``rebnej/lick-caption-bias``). Train the classifier on
    captions with gender words masked; LIC_M − LIC_D is the amplification.
    """
    p = as_float_array(probabilities, "probabilities")
    y = as_array(labels, "labels", ndim=1)
    if y.dtype.kind not in "biu":
        if y.dtype.kind == "f" and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise ValueError(f"labels: expected integer class labels, got dtype {y.dtype}")
    if p.ndim not in (1, 2):
        raise ValueError(f"probabilities: expected shape (n,) or (n, C), got {p.shape}")
    check_same_length(probabilities=p, labels=y)
    if np.any(p < 0) or np.any(p > 1):
        raise ValueError("probabilities: values must lie in [0, 1]")
    if p.ndim == 1:
        if np.any((y != 0) & (y != 1)):
            raise ValueError("labels: binary probabilities need 0/1 labels")
        pred = (p > 0.5).astype(np.int64)
        conf = np.maximum(p, 1.0 - p)
    else:
        if np.any(y < 0) or np.any(y >= p.shape[1]):
            raise ValueError(f"labels: expected values in [0, {p.shape[1]})")
        pred = np.argmax(p, axis=1)
        conf = p[np.arange(p.shape[0]), pred]
    score = float(np.mean((pred == y) * conf))
    return 100.0 * score if percent else score


def gender_balanced_split(labels: Any, test_ratio: float = 0.1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Train / test indices of the leakage classifier's gender-balanced split (Hirota et al. 2022's default).

    ``labels``: binary 0/1 class of each example. Both classes are cut to the smaller one's size by a seeded random
    draw (the examples left out are in neither part), then ``round(n_per_class * test_ratio)`` examples of each
    class go to the test part and the rest to the training part. Balanced parts keep class imbalance alone from
    raising LIC: a classifier that learns nothing scores about chance on a balanced test set. The draw depends only
    on ``labels`` and ``seed``, so human and model captions of the same images share a split. Indices are sorted.
    """
    y = as_array(labels, "labels", ndim=1)
    if y.size == 0:
        raise ValueError("labels: is empty")
    if np.any((y != 0) & (y != 1)):
        raise ValueError("labels: expected 0/1 class labels")
    if not 0.0 < float(test_ratio) < 1.0:
        raise ValueError(f"test_ratio: expected a number in (0, 1), got {test_ratio!r}")
    rng = np.random.default_rng(int(seed))
    members = [np.flatnonzero(y == c) for c in (0, 1)]
    n = min(len(m) for m in members)
    n_test = int(round(n * float(test_ratio)))
    if n == 0 or n_test == 0 or n_test == n:
        raise ValueError(f"gender_balanced_split: {n} examples of the smaller class leave no train or no test part "
                         f"at test_ratio {test_ratio}")
    train, test = [], []
    for m in members:
        chosen = rng.permutation(m)[:n]
        test.append(chosen[:n_test])
        train.append(chosen[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
