"""CLIP filter and selection (COCO-Counterfactuals B.1.2; InstructPix2Pix's CLIP filter)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from hypothesis import HealthCheck, given, settings, strategies as st

from counterfactory.filters import (DIRECTION_REL_TOL, DIRECTION_UNDEFINED, SCORE_COLUMNS, ClipScorer,
                                    FilterThresholds, apply_thresholds, pair_scores, select_top, set_scores)
from counterfactory.metrics.similarity import clip_directional_similarity

PAPER = FilterThresholds()


def _scores(**kw):
    base = {"sim_0": [0.5], "sim_1": [0.5], "sim_image": [0.9], "sim_direction": [0.5]}
    base.update({k: [v] for k, v in kw.items()})
    return base


def test_paper_thresholds():
    assert (PAPER.image_caption_min, PAPER.image_image_min, PAPER.direction_min) == (0.2, 0.7, 0.2)
    t = FilterThresholds.from_config({"image_caption_min": -0.1, "direction_min": 0.0})
    assert (t.image_caption_min, t.image_image_min, t.direction_min) == (-0.1, 0.7, 0.0)
    assert PAPER.direction_rel_tol == 0.0 and DIRECTION_REL_TOL == 1e-3        # issue 42 item 9: off, the option 1e-3
    assert FilterThresholds.from_config({"direction_rel_tol": 0.01}).direction_rel_tol == 0.01


def test_paper_config_has_no_direction_tolerance():
    """Issue 42 item 9: B.1.2 / InstructPix2Pix's filter (the reference) rejects no pair for an "undefined"
    direction; the paper config leaves direction_rel_tol off, only an exactly zero difference has none."""
    from counterfactory.config import load_config

    repo = Path(__file__).resolve().parents[1]
    view = load_config([repo / "config" / "config.yaml"], study="coco_counterfactuals")
    th = FilterThresholds.from_config(view["images"]["filter"])
    assert th.direction_rel_tol == 0.0
    rng = np.random.default_rng(0)
    t0, t1, i0 = rng.normal(size=(1, 16)), rng.normal(size=(1, 16)), rng.normal(size=(1, 16))
    near = pair_scores(t0, t1, i0, i0 * (1 + 1e-5), rel_tol=th.direction_rel_tol)   # a tiny difference: scored
    assert not near[DIRECTION_UNDEFINED].any() and np.isfinite(near["sim_direction"]).all()
    same = pair_scores(t0, t1, i0, i0, rel_tol=th.direction_rel_tol)                  # none at all: undefined
    assert same[DIRECTION_UNDEFINED].all() and apply_thresholds(same, th)[1][0].endswith(DIRECTION_UNDEFINED)
    demo = load_config([repo / "config" / "config.yaml", repo / "config" / "demo.yaml"], study="coco_counterfactuals")
    assert demo["images"]["filter"]["direction_rel_tol"] == DIRECTION_REL_TOL     # the option, on in the demo


@pytest.mark.parametrize("key,edge", [("sim_0", 0.2), ("sim_1", 0.2), ("sim_image", 0.7), ("sim_direction", 0.2)])
def test_thresholds_are_inclusive_at_the_edge(key, edge):
    passed, reasons = apply_thresholds(_scores(**{key: edge}), PAPER)
    assert passed.tolist() == [True] and reasons == [""]
    below = np.nextafter(edge, -np.inf)
    passed, reasons = apply_thresholds(_scores(**{key: below}), PAPER)
    assert passed.tolist() == [False] and reasons[0] == f"{key}<{edge:g}"


def test_all_failed_tests_are_listed():
    passed, reasons = apply_thresholds(
        {"sim_0": [0.1], "sim_1": [0.3], "sim_image": [0.5], "sim_direction": [0.1]}, PAPER)
    assert not passed[0] and reasons[0] == "sim_0<0.2;sim_image<0.7;sim_direction<0.2"


def test_non_finite_scores_are_rejected_and_logged(caplog):
    scores = {"sim_0": [0.5, np.nan, 0.5], "sim_1": [0.5, 0.5, np.inf], "sim_image": [0.9] * 3,
              "sim_direction": [0.5] * 3}
    with caplog.at_level(logging.WARNING, logger="counterfactory.filters"):
        passed, reasons = apply_thresholds(scores, PAPER, labels=["c#0", "c#1", "c#2"])
    assert passed.tolist() == [True, False, False]
    assert reasons[1:] == ["non_finite_score"] * 2
    assert "c#1" in caplog.text and "c#2" in caplog.text and "non-finite" in caplog.text


def test_pair_scores_match_definitions():
    rng = np.random.default_rng(0)
    t0, t1 = rng.normal(size=(1, 8)), rng.normal(size=(1, 8))
    i0, i1 = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
    s = pair_scores(t0, t1, i0, i1)
    n = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    np.testing.assert_allclose(s["sim_0"], (n(i0) * n(t0)).sum(-1))
    np.testing.assert_allclose(s["sim_1"], (n(i1) * n(t1)).sum(-1))
    np.testing.assert_allclose(s["sim_image"], (n(i0) * n(i1)).sum(-1))
    # the same directional similarity as the metrics module (differences of normalised embeddings)
    expected = clip_directional_similarity(np.repeat(t0, 5, 0), np.repeat(t1, 5, 0), i0, i1)
    np.testing.assert_allclose(s["sim_direction"], expected)
    # scale invariance (features are normalised first)
    s2 = pair_scores(3 * t0, t1, 10 * i0, i1)
    for k in SCORE_COLUMNS:
        np.testing.assert_allclose(s2[k], s[k])


def test_identical_images_have_no_direction(caplog):
    v = np.ones((1, 4))
    s = pair_scores(v, v + [[0, 1, 0, 0]], v, v)
    assert np.isnan(s["sim_direction"][0]) and s[DIRECTION_UNDEFINED].tolist() == [True]
    with caplog.at_level(logging.WARNING):
        passed, reasons = apply_thresholds(s, PAPER)
    assert not passed[0] and reasons[0] == DIRECTION_UNDEFINED
    assert "non-finite" not in caplog.text          # expected, not a warning


def test_direction_below_relative_tolerance_is_undefined():
    rng = np.random.default_rng(3)
    t0, t1 = rng.normal(size=(1, 16)), rng.normal(size=(1, 16))
    i0 = rng.normal(size=(4, 16)) * 50.0                      # the tolerance is relative to the norms
    noise = rng.normal(size=(4, 16))
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    norm = np.linalg.norm(i0, axis=1, keepdims=True)
    i1 = i0 + noise * norm * np.array([[0.5e-3], [0.99e-3], [1.01e-3], [0.1]])
    s = pair_scores(t0, t1, i0, i1)
    assert s[DIRECTION_UNDEFINED].tolist() == [True, True, False, False]
    assert np.isnan(s["sim_direction"][:2]).all() and np.isfinite(s["sim_direction"][2:]).all()
    # a negligible text difference also leaves the direction undefined
    s = pair_scores(t0, t0 * (1 + 1e-6), i0, i1)
    assert s[DIRECTION_UNDEFINED].all()
    # a looser tolerance, as for fp16 scorers
    assert pair_scores(t0, t1, i0, i1, rel_tol=0.2)[DIRECTION_UNDEFINED].all()


def test_undefined_direction_lists_other_failures_and_nan_direction_alone_is_non_finite():
    s = {"sim_0": [0.1], "sim_1": [0.5], "sim_image": [1.0], "sim_direction": [np.nan], DIRECTION_UNDEFINED: [True]}
    assert apply_thresholds(s, PAPER)[1] == ["sim_0<0.2;direction_undefined"]
    s[DIRECTION_UNDEFINED] = [False]      # NaN without the mark: a broken scorer, not an identical pair
    assert apply_thresholds(s, PAPER)[1] == ["non_finite_score"]


def test_select_top_sorts_by_direction_then_index():
    idx = [0, 1, 2, 3, 4]
    sd = [0.3, 0.9, 0.9, 0.95, 0.1]
    passed = [True, True, True, False, True]
    assert select_top(idx, sd, passed, 1) == [1]
    assert select_top(idx, sd, passed, 3) == [1, 2, 0]
    assert select_top(idx, sd, [False] * 5, 2) == []


def test_set_scores_take_the_worst_member():
    texts = np.eye(4)[:3]                      # base + 2 edits
    images = np.stack([np.eye(4)[:3] + 0.1, np.eye(4)[:3][[0, 1, 1]] + 0.1])   # (2 sets, 3 members, 4)
    s = set_scores(texts, images)
    p1 = pair_scores(texts[:1], texts[1:2], images[:, 0], images[:, 1])
    p2 = pair_scores(texts[:1], texts[2:3], images[:, 0], images[:, 2])
    for k in SCORE_COLUMNS:
        np.testing.assert_allclose(s[k], np.minimum(p1[k], p2[k]))
    assert not s[DIRECTION_UNDEFINED].any()
    same = set_scores(texts, np.stack([images[0], images[0][[0, 1, 0]]]))   # set 2: member 2 == base image
    assert same[DIRECTION_UNDEFINED].tolist() == [False, True] and np.isnan(same["sim_direction"][1])


@pytest.fixture(scope="module")
def scorer(tmp_path_factory):
    from counterfactory.models import tiny

    path = tiny.build("clip_filter", tmp_path_factory.mktemp("tiny_clip"))
    cfg = {"device": "cpu", "precision": "fp32", "models": {"clip_filter": {"source": str(path)}},
           "images": {"filter": {"direction_rel_tol": DIRECTION_REL_TOL}}}   # the option (paper config: 0, off)
    return ClipScorer.from_config(cfg)


def test_clip_scorer_resizes_without_crop(scorer):
    assert scorer.size == (32, 32)
    rng = np.random.default_rng(0)
    wide = rng.integers(0, 256, size=(2, 32, 64, 3), dtype=np.uint8)
    px = scorer._pixels(wide)
    assert tuple(px.shape) == (2, 3, 32, 32)
    expected = torch.nn.functional.interpolate(
        torch.from_numpy(wide).permute(0, 3, 1, 2).float() / 255, size=(32, 32), mode="bicubic", align_corners=False)
    torch.testing.assert_close(px, (expected - scorer.mean) / scorer.std)


def test_clip_scorer_scores_pairs(scorer):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    b = rng.integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    s = scorer.score_pairs("a cat on a bed", "a dog on a bed", a, b)
    assert set(s) == {*SCORE_COLUMNS, DIRECTION_UNDEFINED} and all(len(v) == 3 for v in s.values())
    assert all(np.all(np.isfinite(s[k])) and np.all(np.abs(s[k]) <= 1 + 1e-9) for k in SCORE_COLUMNS)
    assert not s[DIRECTION_UNDEFINED].any()
    # the scorer is a plain function of its inputs
    s2 = scorer.score_pairs("a cat on a bed", "a dog on a bed", a[::-1], b[::-1])
    np.testing.assert_allclose(s2["sim_direction"], s["sim_direction"][::-1], rtol=1e-6, atol=1e-6)
    same = scorer.score_pairs("a cat on a bed", "a dog on a bed", a, a)
    np.testing.assert_allclose(same["sim_image"], 1.0, atol=1e-6)
    assert np.all(np.isnan(same["sim_direction"])) and same[DIRECTION_UNDEFINED].all()
    assert all(r.endswith(DIRECTION_UNDEFINED) for r in apply_thresholds(same, PAPER)[1])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), n=st.integers(1, 6), data=st.data())
def test_property_identical_images_at_any_batch_position_are_rejected(scorer, seed, n, data):
    """The same image at two different batch positions (and batch chunks) never passes: its feature
    difference is rounding noise (which differs between OMP_NUM_THREADS=1 and 2) below the tolerance."""
    rng = np.random.default_rng(seed)
    imgs = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    perm = np.asarray(data.draw(st.permutations(range(n))))
    other = imgs.copy()
    k = data.draw(st.integers(0, n - 1))
    other[perm[k]] = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)   # one genuinely different pair
    a, b = imgs[perm], other[perm]
    old = scorer.batch_size
    scorer.batch_size = data.draw(st.integers(1, 2 * n))
    try:
        s = scorer.score_pairs("a cat on a bed", "a dog on a bed", a, b)
    finally:
        scorer.batch_size = old
    passed, reasons = apply_thresholds(s, FilterThresholds(-1.0, -1.0, -1.0))   # only the direction can fail
    for j in range(n):
        if j == k:
            assert reasons[j] != DIRECTION_UNDEFINED
        else:
            assert not passed[j] and reasons[j] == DIRECTION_UNDEFINED
