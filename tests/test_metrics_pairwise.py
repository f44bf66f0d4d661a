"""Tests for counterfactory.metrics.pairwise (Winoground, SugarCrepe, CounterCurate)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from counterfactory.metrics import (
    SUGARCREPE_CATEGORIES,
    countercurate_counting_accuracy,
    countercurate_position_accuracy,
    pairwise_accuracy,
    stack_pair_scores,
    sugarcrepe_scores,
    winoground_item_scores,
    winoground_scores,
)

FAST = settings(max_examples=60, deadline=None)


def S(c0i0, c0i1, c1i0, c1i1):
    """One example in the scores[caption, image] layout."""
    return [[c0i0, c0i1], [c1i0, c1i1]]


# ---------------------------------------------------------------- Winoground
def test_winoground_hand_computed():
    scores = np.array([
        S(0.9, 0.1, 0.2, 0.8),   # text ok, image ok -> group ok
        S(0.5, 0.6, 0.2, 0.8),   # text ok (.5>.2, .8>.6); image: s(c0,i0)=.5 < s(c0,i1)=.6 -> wrong
        S(0.5, 0.1, 0.6, 0.8),   # text: s(c0,i0)=.5 < s(c1,i0)=.6 -> wrong; image ok
        S(0.5, 0.1, 0.5, 0.8),   # tie s(c0,i0) == s(c1,i0) -> text wrong (strict); image ok
    ])
    items = winoground_item_scores(scores)
    assert items["text"].tolist() == [True, True, False, False]
    assert items["image"].tolist() == [True, False, True, True]
    assert items["group"].tolist() == [True, False, False, False]
    assert winoground_scores(scores) == {"text": 0.5, "image": 0.75, "group": 0.25}


def test_winoground_all_equal_scores_are_wrong():
    assert winoground_scores(np.ones((3, 2, 2))) == {"text": 0.0, "image": 0.0, "group": 0.0}


def test_stack_pair_scores_layout():
    stacked = stack_pair_scores([1, 5], [2, 6], [3, 7], [4, 8])
    assert stacked.shape == (2, 2, 2)
    assert stacked[1].tolist() == [[5, 6], [7, 8]]
    assert stacked[0, 1, 0] == 3   # caption 1, image 0


@FAST
@given(st.lists(st.lists(st.integers(0, 2), min_size=4, max_size=4), min_size=1, max_size=20))
def test_winoground_matches_loop(rows):
    scores = np.array([S(*r) for r in rows], dtype=float)
    text = image = group = 0
    for a, b, c, d in rows:  # a=s(c0,i0) b=s(c0,i1) c=s(c1,i0) d=s(c1,i1)
        t = a > c and d > b
        i = a > b and d > c
        text += t
        image += i
        group += t and i
    n = len(rows)
    assert winoground_scores(scores) == pytest.approx({"text": text / n, "image": image / n, "group": group / n})


@pytest.mark.parametrize("scores, message", [
    (np.zeros((3, 2)), "shape"),
    (np.zeros((3, 2, 3)), "shape"),
    (np.zeros((0, 2, 2)), "empty"),
    (np.array([S(np.nan, 0, 0, 0)]), "NaN"),
])
def test_winoground_rejects_bad_input(scores, message):
    with pytest.raises(ValueError, match=message):
        winoground_scores(scores)


# ---------------------------------------------------------------- SugarCrepe
def test_sugarcrepe_hand_computed_with_tie_and_averages():
    pos = [0.9, 0.5, 0.3, 0.8, 0.7, 0.6, 0.2, 0.4]
    neg = [0.1, 0.5, 0.4, 0.1, 0.1, 0.1, 0.9, 0.3]
    cats = ["add_att", "add_att", "add_obj", "replace_att", "replace_obj", "replace_rel",
            "swap_att", "swap_obj"]
    r = sugarcrepe_scores(pos, neg, cats)
    assert r["add_att"] == 0.5           # 0.9 > 0.1 right; 0.5 == 0.5 tie -> wrong
    assert r["add_obj"] == 0.0
    assert r["replace_att"] == r["replace_obj"] == r["replace_rel"] == 1.0
    assert r["swap_att"] == 0.0 and r["swap_obj"] == 1.0
    assert r["avg_add"] == pytest.approx(0.25)           # unweighted over categories
    assert r["avg_replace"] == pytest.approx(1.0)
    assert r["avg_swap"] == pytest.approx(0.5)
    assert r["average"] == pytest.approx((0.5 + 0 + 1 + 1 + 1 + 0 + 1) / 7)
    assert set(SUGARCREPE_CATEGORIES) <= set(r)


def test_sugarcrepe_average_is_unweighted_and_partial_groups_skipped():
    # add_att has 3 items (2 right), add_obj 1 item (right): weighted mean would be 0.75
    r = sugarcrepe_scores([1, 1, 0, 1], [0, 0, 1, 0], ["add_att", "add_att", "add_att", "add_obj"])
    assert r["avg_add"] == pytest.approx((2 / 3 + 1) / 2)
    assert "avg_swap" not in r and "avg_replace" not in r
    r2 = sugarcrepe_scores([1], [0], ["swap_att"])
    assert "avg_swap" not in r2 and r2["average"] == 1.0


def test_sugarcrepe_custom_averages_and_errors():
    r = sugarcrepe_scores([1, 0], [0, 1], ["x", "y"], averages={"both": ("x", "y")})
    assert r == {"x": 1.0, "y": 0.0, "both": 0.5, "average": 0.5}
    with pytest.raises(ValueError, match="same length"):
        sugarcrepe_scores([1, 0], [0], ["x", "y"])
    with pytest.raises(ValueError, match="collide"):
        sugarcrepe_scores([1], [0], ["average"])
    with pytest.raises(ValueError, match="empty"):
        sugarcrepe_scores([], [], [])


# ---------------------------------------------------------------- CounterCurate
def test_countercurate_position_hand_computed():
    scores = np.array([
        S(0.9, 0.2, 0.1, 0.8),   # s(C,I)>s(C',I) yes; s(C',I')>s(C,I') yes -> 2
        S(0.4, 0.6, 0.5, 0.7),   # .4 > .5 no; .7 > .6 yes -> 1
        S(0.5, 0.3, 0.5, 0.3),   # tie .5 == .5 -> no; .3 == .3 -> no -> 0
    ])
    assert countercurate_position_accuracy(scores) == pytest.approx(3 / 6)


def test_countercurate_counting_and_pairwise_accuracy():
    assert countercurate_counting_accuracy([0.3, 0.5, 0.2], [0.1, 0.5, 0.4]) == pytest.approx(1 / 3)
    assert pairwise_accuracy(np.array([2, 2]), np.array([1, 2])) == 0.5
    with pytest.raises(ValueError, match="same length"):
        pairwise_accuracy([1, 2], [1])
    with pytest.raises(ValueError, match="NaN"):
        countercurate_counting_accuracy([np.nan], [0.0])


@FAST
@given(st.lists(st.lists(st.integers(0, 2), min_size=4, max_size=4), min_size=1, max_size=20))
def test_countercurate_position_matches_loop(rows):
    correct = 0
    for a, b, c, d in rows:   # a=s(C,I) b=s(C,I') c=s(C',I) d=s(C',I')
        correct += (a > c) + (d > b)
    scores = np.array([S(*r) for r in rows], dtype=float)
    assert countercurate_position_accuracy(scores) == pytest.approx(correct / (2 * len(rows)))
