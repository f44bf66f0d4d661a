"""CLIP filter and selection (COCO-Counterfactuals B.1.2; metrics-and-formats §A7)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from counterfactory.filters import (SCORE_COLUMNS, ClipScorer, FilterThresholds, apply_thresholds, pair_scores,
                                    select_top, set_scores)
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


def test_identical_images_have_no_direction():
    v = np.ones((1, 4))
    s = pair_scores(v, v + [[0, 1, 0, 0]], v, v)
    assert np.isnan(s["sim_direction"][0])
    passed, reasons = apply_thresholds(s, PAPER)
    assert not passed[0] and reasons[0] == "non_finite_score"


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


@pytest.fixture(scope="module")
def scorer(tmp_path_factory):
    from counterfactory.models import tiny

    path = tiny.build("clip_filter", tmp_path_factory.mktemp("tiny_clip"))
    cfg = {"device": "cpu", "precision": "fp32", "models": {"clip_filter": {"source": str(path)}}}
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
    assert set(s) == set(SCORE_COLUMNS) and all(len(v) == 3 for v in s.values())
    assert all(np.all(np.isfinite(v)) and np.all(np.abs(v) <= 1 + 1e-9) for v in s.values())
    # the scorer is a plain function of its inputs
    s2 = scorer.score_pairs("a cat on a bed", "a dog on a bed", a[::-1], b[::-1])
    np.testing.assert_allclose(s2["sim_direction"], s["sim_direction"][::-1], rtol=1e-6, atol=1e-6)
    same = scorer.score_pairs("a cat on a bed", "a dog on a bed", a, a)
    np.testing.assert_allclose(same["sim_image"], 1.0, atol=1e-6)
    assert np.all(np.isnan(same["sim_direction"]))
