"""Tests for counterfactory.metrics.similarity (CLIP directional similarity, ITM differences)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from counterfactory.metrics import clip_directional_similarity, itm_differences, l2_normalize, rowwise_cosine

FAST = settings(max_examples=50, deadline=None)


def test_directional_similarity_hand_computed():
    # image and text move the same way -> 1; opposite -> -1; orthogonal -> 0
    assert clip_directional_similarity([1, 0], [0, 1], [2, 0], [0, 3]) == pytest.approx(1.0)
    assert clip_directional_similarity([1, 0], [0, 1], [0, 3], [2, 0]) == pytest.approx(-1.0)
    # text diff (-1, 1, 0); image diff (1, 1, 1)/sqrt(3) - (0, 0, 1): dot = -1/sqrt(3) + 1/sqrt(3) = 0
    assert clip_directional_similarity([1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]) == pytest.approx(0.0, abs=1e-12)
    # text diff (-1, 1) points at 135°; image diff (1, 1)/sqrt(2) - (1, 0) points at 112.5°: cos 22.5°
    u = np.array([1 / math.sqrt(2) - 1, 1 / math.sqrt(2)])
    want = np.dot(u, [-1, 1]) / (np.linalg.norm(u) * math.sqrt(2))
    assert clip_directional_similarity([1, 0], [0, 1], [1, 0], [1, 1]) == pytest.approx(want)
    assert want == pytest.approx(math.cos(math.radians(22.5)))


def test_directional_similarity_normalises_before_differencing():
    # normalised: image diff = (0,1)-(1,0) = (-1, 1), text diff = (-1, 1) -> cosine 1.
    # Without normalisation the image diff would be (-1, 10) and the cosine about 0.77.
    got = clip_directional_similarity([1, 0], [0, 1], [1, 0], [0, 10])
    assert got == pytest.approx(1.0)
    unnormalised = np.dot([-1, 10], [-1, 1]) / (np.linalg.norm([-1, 10]) * np.linalg.norm([-1, 1]))
    assert abs(got - unnormalised) > 0.1


def test_directional_similarity_zero_difference_is_zero_not_nan():
    assert clip_directional_similarity([1, 0], [2, 0], [0, 1], [1, 0]) == 0.0   # same text after norm


def test_directional_similarity_batch_matches_rows():
    rng = np.random.default_rng(0)
    ta, tb, ia, ib = (rng.standard_normal((6, 8)) for _ in range(4))
    batch = clip_directional_similarity(ta, tb, ia, ib)
    assert batch.shape == (6,)
    for n in range(6):
        assert batch[n] == pytest.approx(clip_directional_similarity(ta[n], tb[n], ia[n], ib[n]))


@FAST
@given(arrays(np.float64, (4, 3, 5), elements=st.floats(-10, 10)))
def test_directional_similarity_matches_loop(x):
    norms = np.linalg.norm(x, axis=-1)
    if np.any(norms < 1e-3):
        return
    ta, tb, ia, ib = x
    got = clip_directional_similarity(ta, tb, ia, ib)
    for n in range(3):
        u = [ib[n][d] / np.linalg.norm(ib[n]) - ia[n][d] / np.linalg.norm(ia[n]) for d in range(5)]
        v = [tb[n][d] / np.linalg.norm(tb[n]) - ta[n][d] / np.linalg.norm(ta[n]) for d in range(5)]
        nu, nv = math.sqrt(sum(a * a for a in u)), math.sqrt(sum(b * b for b in v))
        want = sum(a * b for a, b in zip(u, v)) / max(nu * nv, 1e-8)
        assert got[n] == pytest.approx(want, abs=1e-9)
        assert -1 - 1e-9 <= got[n] <= 1 + 1e-9


def test_similarity_errors():
    with pytest.raises(ValueError, match="all-zero"):
        clip_directional_similarity([0, 0], [0, 1], [1, 0], [0, 1])
    with pytest.raises(ValueError, match="same shape"):
        clip_directional_similarity([1, 0], [0, 1], [1, 0, 0], [0, 1, 0])
    with pytest.raises(ValueError, match="NaN"):
        clip_directional_similarity([np.nan, 1], [0, 1], [1, 0], [0, 1])
    with pytest.raises(ValueError, match="empty"):
        l2_normalize([])
    with pytest.raises(ValueError, match="same shape"):
        rowwise_cosine([1, 0], [1, 0, 0])
    assert rowwise_cosine([1, 0], [0, 0]) == 0.0
    assert rowwise_cosine([3, 4], [6, 8]) == pytest.approx(1.0)


def test_itm_differences_hand_computed():
    d = itm_differences(
        random_pair=[5.0, 1.0],                          # G(C_r, I_r)
        random_caption_original_image=[2.0, 3.0],        # G(C_r, I_o)
        original_caption_random_image=[1.0, 0.5],        # G(C_o, I_r)
        counterfactual_pair=[4.0, 2.0],                  # G(C_c, I_c^s)
        counterfactual_caption_original_image=[3.5, 2.5],  # G(C_c, I_o^s)
        original_caption_counterfactual_image=[1.0, 2.0],  # G(C_o, I_c^s)
    )
    assert d["IR_r"].tolist() == [3.0, -2.0]
    assert d["TR_r"].tolist() == [4.0, 0.5]
    assert d["IR_c"].tolist() == [0.5, -0.5]           # not identically zero (the paper's typo)
    assert d["TR_c"].tolist() == [3.0, 0.0]
    assert set(d) == {"IR_r", "IR_c", "TR_r", "TR_c"}


def test_itm_differences_errors_and_group_lengths():
    kw = dict(random_pair=[1.0], random_caption_original_image=[0.0], original_caption_random_image=[0.0],
              counterfactual_pair=[1.0, 2.0], counterfactual_caption_original_image=[0.0, 0.0],
              original_caption_counterfactual_image=[0.0, 1.0])
    d = itm_differences(**kw)                           # random and counterfactual groups may differ
    assert d["TR_c"].tolist() == [1.0, 1.0] and d["IR_r"].tolist() == [1.0]
    with pytest.raises(ValueError, match="same length"):
        itm_differences(**{**kw, "random_pair": [1.0, 2.0]})
    with pytest.raises(ValueError, match="NaN"):
        itm_differences(**{**kw, "counterfactual_pair": [np.nan, 1.0]})
    with pytest.raises(TypeError):
        itm_differences([1.0], [0.0], [0.0], [1.0], [0.0], [0.0])   # keyword-only: order is easy to confuse
