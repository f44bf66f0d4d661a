"""Tests for counterfactory.metrics.fairness: DEO, ΔAcc, mAcc, AP, bias amplification, LIC."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from counterfactory.metrics import (
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
    intersect_groups,
    lic_score,
    mean_group_accuracy,
)

FAST = settings(max_examples=60, deadline=None)


# ---------------------------------------------------------------- plain-Python references
def loop_deo(y_true, y_pred, protected):
    """DEO from recall per group, written with loops only (no sklearn / scipy)."""
    fnr = {}
    for g in sorted(set(protected)):
        positives = [i for i in range(len(y_true)) if protected[i] == g and y_true[i] == 1]
        found = sum(1 for i in positives if y_pred[i] == 1)
        fnr[g] = 1 - found / len(positives)
    a, b = fnr.values()
    return abs(a - b)


def loop_average_precision(y_true, scores):
    thresholds = sorted(set(scores), reverse=True)
    n_pos = sum(y_true)
    ap, prev_recall = 0.0, 0.0
    for t in thresholds:
        chosen = [i for i in range(len(scores)) if scores[i] >= t]
        tp = sum(y_true[i] for i in chosen)
        precision, recall = tp / len(chosen), tp / n_pos
        ap += (recall - prev_recall) * precision
        prev_recall = recall
    return ap


# ---------------------------------------------------------------- DEO
def test_deo_hand_computed():
    y_true = [1, 1, 1, 1, 0, 1, 1, 0, 0]
    y_pred = [1, 1, 1, 0, 1, 0, 0, 1, 0]
    group = [0, 0, 0, 0, 0, 1, 1, 1, 1]
    # group 0: 4 positives, 3 found -> FNR 0.25; group 1: 2 positives, 0 found -> FNR 1
    assert deo(y_true, y_pred, group) == pytest.approx(0.75)
    assert deo(y_true, y_pred, ["m" if g else "f" for g in group]) == pytest.approx(0.75)
    assert false_negative_rate(y_true[:5], y_pred[:5]) == pytest.approx(0.25)
    assert deo(y_true, y_true, group) == 0.0


def test_deo_errors():
    with pytest.raises(ValueError, match="no positive"):
        deo([1, 0, 0], [1, 0, 0], [0, 1, 1])
    with pytest.raises(ValueError, match="exactly two groups"):
        deo([1, 1, 1], [1, 0, 1], [0, 1, 2])
    with pytest.raises(ValueError, match="exactly two groups"):
        deo([1, 1], [1, 0], [0, 0])
    with pytest.raises(ValueError, match="0/1"):
        deo([1, 2], [1, 0], [0, 1])
    with pytest.raises(ValueError, match="same length"):
        deo([1, 1], [1], [0, 1])
    with pytest.raises(ValueError, match="empty"):
        deo([], [], [])
    with pytest.raises(ValueError, match="no positive"):
        false_negative_rate([0, 0], [1, 0])


@FAST
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1), st.sampled_from(["a", "b"])),
                min_size=2, max_size=40))
def test_deo_matches_loop_reference(rows):
    y_true, y_pred, protected = (list(c) for c in zip(*rows))
    groups_with_pos = {g for t, g in zip(y_true, protected) if t == 1}
    if groups_with_pos != {"a", "b"}:
        with pytest.raises(ValueError):
            deo(y_true, y_pred, protected)
        return
    assert deo(y_true, y_pred, protected) == pytest.approx(loop_deo(y_true, y_pred, protected))


def test_calibrated_threshold_is_cp_th_largest():
    assert calibrated_threshold([0, 1, 1, 0], [0.1, 0.9, 0.4, 0.7]) == 0.7   # cp = 2
    assert calibrated_threshold([1, 0, 0], [0.2, 0.5, 0.3]) == 0.5           # cp = 1 -> largest
    with pytest.raises(ValueError, match="no positive"):
        calibrated_threshold([0, 0], [0.1, 0.2])


def test_bootstrap_deo_matches_loop_with_same_draws():
    rng = np.random.default_rng(5)
    n = 60
    y_true = rng.integers(0, 2, n)
    y_pred = rng.integers(0, 2, n)
    protected = rng.integers(0, 2, n)
    got = bootstrap_deo(y_true, y_pred, protected, n_resamples=200, seed=11)
    # the implementation draws all resamples in one call for this size; replay them with loops
    draws = np.random.default_rng(11).integers(0, n, size=(200, n))
    values = []
    for idx in draws:
        t, p, g = y_true[idx].tolist(), y_pred[idx].tolist(), protected[idx].tolist()
        if {gg for tt, gg in zip(t, g) if tt == 1} != {0, 1}:
            continue
        values.append(loop_deo(t, p, g))
    assert got["n_valid"] == len(values)
    assert got["deo"] == pytest.approx(float(np.median(values)))
    assert got["std"] == pytest.approx(float(np.std(values)))
    assert bootstrap_deo(y_true, y_pred, protected, n_resamples=200, seed=11) == got    # deterministic


def test_bootstrap_deo_degenerate_cases():
    y_true = [1] * 10 + [0] * 4
    group = [0] * 5 + [1] * 5 + [0, 1, 0, 1]
    y_pred = [0] * 5 + [1] * 5 + [0] * 4        # group 0 misses every positive, group 1 finds all
    out = bootstrap_deo(y_true, y_pred, group, n_resamples=50, seed=0)
    assert out["deo"] == 1.0 and out["std"] == 0.0 and out["n_valid"] == 50
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_deo(y_true, y_pred, group, n_resamples=0)


def test_deo_from_scores_threshold_and_calibration():
    y_true = [1, 1, 0, 1, 1, 0]
    scores = [0.9, 0.4, 0.3, 0.8, 0.2, 0.7]
    group = [0, 0, 0, 1, 1, 1]
    out = deo_from_scores(y_true, scores, group, threshold=0.5, n_resamples=0)
    # predictions 1,0,0,1,0,1: group 0 FNR 1/2, group 1 FNR 1/2 -> 0
    assert out["threshold"] == 0.5 and out["deo_point"] == 0.0 and out["deo"] == 0.0
    cal = deo_from_scores(y_true, scores, group, val_true=[1, 0, 0], val_scores=[0.3, 0.1, 0.2],
                          n_resamples=20, seed=1)
    assert cal["threshold"] == 0.3            # predictions scores > 0.3: 1,1,0,1,0,1
    assert cal["deo_point"] == pytest.approx(0.5)   # group 0 FNR 0, group 1 FNR 1/2
    with pytest.raises(ValueError, match="either threshold"):
        deo_from_scores(y_true, scores, group)
    with pytest.raises(ValueError, match="either threshold"):
        deo_from_scores(y_true, scores, group, threshold=0.5, val_true=[1], val_scores=[0.1])
    with pytest.raises(ValueError, match="both"):
        deo_from_scores(y_true, scores, group, val_true=[1])


# ---------------------------------------------------------------- accuracies
def test_group_accuracies_and_gaps():
    y_true = [1, 0, 1, 1, 0, 0]
    y_pred = [1, 0, 0, 1, 1, 1]
    group = ["f", "f", "f", "m", "m", "m"]
    accs = group_accuracies(y_true, y_pred, group)
    assert accs == pytest.approx({"f": 2 / 3, "m": 1 / 3})
    assert mean_group_accuracy(y_true, y_pred, group) == pytest.approx(0.5)
    assert delta_accuracy(y_true, y_pred, group) == pytest.approx(1 / 3)
    # CVLD wording: overall accuracy (3/6) minus the worst group (1/3)
    assert delta_accuracy(y_true, y_pred, group, reference="mean") == pytest.approx(0.5 - 1 / 3)
    with pytest.raises(ValueError, match="reference"):
        delta_accuracy(y_true, y_pred, group, reference="median")


def test_intersectional_groups_for_worst_group():
    y_true = [1, 1, 0, 0, 1]
    y_pred = [1, 0, 0, 1, 1]
    gender = ["m", "f", "m", "f", "m"]
    groups = intersect_groups(y_true, gender)
    assert groups == [(1, "m"), (1, "f"), (0, "m"), (0, "f"), (1, "m")]
    accs = group_accuracies(y_true, y_pred, groups)
    assert accs == {(0, "f"): 0.0, (0, "m"): 1.0, (1, "f"): 0.0, (1, "m"): 1.0}
    assert delta_accuracy(y_true, y_pred, groups, reference="mean") == pytest.approx(0.6)
    with pytest.raises(ValueError, match="same length"):
        intersect_groups([1, 2], [1])


@FAST
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=40))
def test_group_accuracy_gap_matches_loop(rows):
    y_true, y_pred, groups = (list(c) for c in zip(*rows))
    accs = {}
    for g in set(groups):
        members = [i for i in range(len(groups)) if groups[i] == g]
        accs[g] = sum(y_true[i] == y_pred[i] for i in members) / len(members)
    assert group_accuracies(y_true, y_pred, groups) == pytest.approx(accs)
    assert delta_accuracy(y_true, y_pred, groups) == pytest.approx(max(accs.values()) - min(accs.values()))
    assert mean_group_accuracy(y_true, y_pred, groups) == pytest.approx(sum(accs.values()) / len(accs))


# ---------------------------------------------------------------- AP
def test_average_precision_hand_computed_with_ties():
    assert average_precision([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.6]) == pytest.approx(0.5 + 0.5 * 2 / 3)
    # tied top block {0.9, 0.9} enters together: P=1/2 at R=1/2, then P=2/3 at R=1
    assert average_precision([1, 0, 1], [0.9, 0.9, 0.1]) == pytest.approx(0.25 + 0.5 * 2 / 3)
    assert average_precision([1, 1], [0.3, 0.3]) == 1.0
    with pytest.raises(ValueError, match="no positive"):
        average_precision([0, 0], [0.1, 0.2])


@FAST
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5)), min_size=1, max_size=30))
def test_average_precision_matches_loop(rows):
    y, s = (list(c) for c in zip(*rows))
    if sum(y) == 0:
        return
    assert average_precision(y, s) == pytest.approx(loop_average_precision(y, s))


# ---------------------------------------------------------------- bias amplification
def test_bias_amplification_hand_computed():
    # object 0: train m 3, f 1 -> b*(0,m) = .75 (> 1/2); object 1: m 1, f 1 -> not biased
    train_attr = [[1, 0], [1, 0], [1, 1], [1, 0], [0, 1]]
    train_grp = ["m", "m", "m", "f", "f"]
    # predictions: object 0 with m 4 times -> b~(0,m) = 1; object 1 with m twice -> ignored term
    pred_attr = [[1, 1], [1, 1], [1, 0], [1, 0], [1, 1]]
    pred_grp = ["m", "m", "m", "m", "neutral"]
    assert bias_amplification(train_attr, train_grp, pred_attr, pred_grp) == pytest.approx((1 - 0.75) / 2)


def test_bias_amplification_drops_objects_without_predictions():
    train_attr = [[1, 1], [1, 1], [0, 1], [1, 0]]
    train_grp = [0, 0, 1, 1]
    pred_attr = [[1, 0], [1, 0]]
    pred_grp = [1, 1]
    # object 0: b*(0,0) = 2/3, predicted only with group 1 -> b~(0,0) = 0: -2/3; object 1 dropped
    assert bias_amplification(train_attr, train_grp, pred_attr, pred_grp) == pytest.approx(-2 / 3)
    with pytest.raises(ValueError, match="no object"):
        bias_amplification(train_attr, train_grp, [[0, 0]], [1])
    with pytest.raises(ValueError, match="two groups"):
        bias_amplification(train_attr, [0, 0, 0, 0], pred_attr, pred_grp)
    with pytest.raises(ValueError, match="columns"):
        bias_amplification(train_attr, train_grp, [[1, 0, 1]], [1])


def test_bias_amplification_three_groups_threshold_is_strict():
    # one object, train counts a 2, b 1, c 3 -> b* = (1/3, 1/6, 1/2): only c is above 1/|G| = 1/3
    train_grp = ["a", "a", "b", "c", "c", "c"]
    pred_grp = ["a", "c", "c", "c"]            # b~ = (1/4, 0, 3/4)
    got = bias_amplification([[1]] * 6, train_grp, [[1]] * 4, pred_grp)
    assert got == pytest.approx(0.75 - 0.5)    # a (exactly 1/3) is not counted


def loop_bias_amp(train_attr, train_grp, pred_attr, pred_grp, groups):
    n_obj = len(train_attr[0])
    total, kept = 0.0, 0
    for o in range(n_obj):
        c_tr = {g: sum(1 for r, gg in zip(train_attr, train_grp) if r[o] and gg == g) for g in groups}
        c_pr = {g: sum(1 for r, gg in zip(pred_attr, pred_grp) if r[o] and gg == g) for g in groups}
        if sum(c_tr.values()) == 0 or sum(c_pr.values()) == 0:
            continue
        kept += 1
        for g in groups:
            b_star = c_tr[g] / sum(c_tr.values())
            if c_tr[g] * len(groups) > sum(c_tr.values()):      # b* > 1/|G| without rounding
                total += c_pr[g] / sum(c_pr.values()) - b_star
    return None if kept == 0 else total / kept


@FAST
@given(st.data())
def test_bias_amplification_matches_loop(data):
    n_obj = data.draw(st.integers(1, 4))
    row = st.lists(st.integers(0, 1), min_size=n_obj, max_size=n_obj)
    train_attr = data.draw(st.lists(row, min_size=1, max_size=12))
    pred_attr = data.draw(st.lists(row, min_size=1, max_size=12))
    train_grp = data.draw(st.lists(st.sampled_from(["m", "f", "x"]), min_size=len(train_attr), max_size=len(train_attr)))
    pred_grp = data.draw(st.lists(st.sampled_from(["m", "f", "x"]), min_size=len(pred_attr), max_size=len(pred_attr)))
    groups = data.draw(st.sampled_from([["f", "m"], ["f", "m", "x"]]))
    want = loop_bias_amp(train_attr, train_grp, pred_attr, pred_grp, groups)
    if want is None:
        with pytest.raises(ValueError):
            bias_amplification(train_attr, train_grp, pred_attr, pred_grp, groups=groups)
    else:
        got = bias_amplification(train_attr, train_grp, pred_attr, pred_grp, groups=groups)
        assert got == pytest.approx(want)


def test_directional_bias_amplification_hand_computed():
    # train: A = (male, female) one-hot, T = one task; y(m,t) = +1, y(f,t) = -1
    a_tr = [[1, 0], [1, 0], [0, 1], [0, 1]]
    t_tr = [[1], [1], [0], [1]]
    a_te = [[1, 0], [1, 0], [0, 1], [0, 1]]
    t_te = [[1], [0], [1], [0]]
    t_hat = [[1], [1], [0], [0]]
    # Δ(m,t) = P(T̂|m) - P(T|m) = 1 - .5 ; Δ(f,t) = 0 - .5 -> y·Δ = .5, .5
    assert directional_bias_amplification(a_tr, t_tr, a_te, t_te, t_hat) == pytest.approx(0.5)
    a_hat = [[1, 0], [1, 0], [1, 0], [0, 1]]
    # T->A, conditioning on T=1 (examples 0, 2): P(Â_m|t) = 1 vs P(A_m|t) = .5; P(Â_f|t) = 0 vs .5
    assert directional_bias_amplification(a_tr, t_tr, a_te, t_te, a_hat, direction="T->A") == pytest.approx(0.5)


def test_directional_bias_amplification_errors_and_empty_conditioning():
    a_tr = [[1, 0], [0, 1]]
    t_tr = [[1], [0]]
    # no female test example: the (f, t) pair is NaN and ignored; (m, t): y=+1, Δ = 0 - 1
    assert directional_bias_amplification(a_tr, t_tr, [[1, 0]], [[1]], [[0]]) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="empty"):
        directional_bias_amplification(a_tr, t_tr, [[0, 0]], [[1]], [[0]])
    with pytest.raises(ValueError, match="direction"):
        directional_bias_amplification(a_tr, t_tr, [[1, 0]], [[1]], [[0]], direction="both")
    with pytest.raises(ValueError, match="columns"):
        directional_bias_amplification(a_tr, t_tr, [[1, 0]], [[1]], [[0, 1, 1]])


@FAST
@given(st.data())
def test_directional_bias_amplification_matches_loop(data):
    n_a, n_t = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    n_tr, n_te = data.draw(st.integers(1, 10)), data.draw(st.integers(1, 10))
    mat = lambda n, m: data.draw(st.lists(st.lists(st.integers(0, 1), min_size=m, max_size=m),  # noqa: E731
                                          min_size=n, max_size=n))
    a_tr, t_tr, a_te, t_te = mat(n_tr, n_a), mat(n_tr, n_t), mat(n_te, n_a), mat(n_te, n_t)
    direction = data.draw(st.sampled_from(["A->T", "T->A"]))
    pred = mat(n_te, n_t if direction == "A->T" else n_a)
    vals = []
    for a in range(n_a):
        for t in range(n_t):
            p_at = sum(r[a] and s[t] for r, s in zip(a_tr, t_tr)) / n_tr
            p_a = sum(r[a] for r in a_tr) / n_tr
            p_t = sum(s[t] for s in t_tr) / n_tr
            y = (p_at > p_a * p_t) - (p_at < p_a * p_t)
            if direction == "A->T":
                cond = [i for i in range(n_te) if a_te[i][a]]
                if not cond:
                    continue
                delta = sum(pred[i][t] for i in cond) / len(cond) - sum(t_te[i][t] for i in cond) / len(cond)
            else:
                cond = [i for i in range(n_te) if t_te[i][t]]
                if not cond:
                    continue
                delta = sum(pred[i][a] for i in cond) / len(cond) - sum(a_te[i][a] for i in cond) / len(cond)
            vals.append(y * delta)
    if not vals:
        with pytest.raises(ValueError):
            directional_bias_amplification(a_tr, t_tr, a_te, t_te, pred, direction=direction)
    else:
        got = directional_bias_amplification(a_tr, t_tr, a_te, t_te, pred, direction=direction)
        assert got == pytest.approx(sum(vals) / len(vals), abs=1e-12)


# ---------------------------------------------------------------- LIC
def test_lic_hand_computed():
    p = [0.9, 0.2, 0.6, 0.5]
    labels = [1, 0, 0, 1]
    # preds 1, 0, 1, 0 (0.5 -> class 0); correct: yes, yes, no, no; confidences .9, .8
    assert lic_score(p, labels) == pytest.approx((0.9 + 0.8) / 4)
    assert lic_score(p, labels, percent=True) == pytest.approx(42.5)
    probs2 = [[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.4, 0.4, 0.2]]
    # argmax 0, 2, 0 (first on ties); labels 0, 1, 0 -> .7 + 0 + .4
    assert lic_score(probs2, [0, 1, 0]) == pytest.approx(1.1 / 3)


def test_lic_errors():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        lic_score([1.2], [1])
    with pytest.raises(ValueError, match="0/1 labels"):
        lic_score([0.2], [2])
    with pytest.raises(ValueError, match="same length"):
        lic_score([0.2, 0.3], [1])
    with pytest.raises(ValueError, match="integer"):
        lic_score([0.2], [0.5])
    with pytest.raises(ValueError, match="values in"):
        lic_score([[0.5, 0.5]], [2])


@FAST
@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 1)), min_size=1, max_size=30))
def test_lic_matches_loop(rows):
    p, y = (list(c) for c in zip(*rows))
    total = 0.0
    for pi, yi in zip(p, y):
        pred = 1 if pi > 0.5 else 0
        if pred == yi:
            total += max(pi, 1 - pi)
    assert lic_score(p, y) == pytest.approx(total / len(p))
    assert not math.isnan(lic_score(p, y))


# ---------------------------------------------------------------- Hirota et al.'s gender-balanced split
def test_gender_balanced_split_cuts_both_classes_to_the_smaller_one():
    from counterfactory.metrics.fairness import gender_balanced_split

    labels = np.array([0] * 60 + [1] * 20)                     # male:female 3:1
    train, test = gender_balanced_split(labels, 0.1, seed=3)
    assert np.bincount(labels[test]).tolist() == [2, 2]         # round(20 * 0.1) of each gender
    assert np.bincount(labels[train]).tolist() == [18, 18]
    assert not set(train) & set(test)
    again = gender_balanced_split(labels, 0.1, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip((train, test), again))
    other = gender_balanced_split(labels, 0.1, seed=4)
    assert not np.array_equal(train, other[0])
    with pytest.raises(ValueError, match="no train or no test"):
        gender_balanced_split(np.array([0, 0, 1]), 0.1)
    with pytest.raises(ValueError, match="0/1"):
        gender_balanced_split(np.array([0, 2]), 0.5)
