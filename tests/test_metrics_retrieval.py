"""Tests for counterfactory.metrics.retrieval: hand-computed cases and brute-force references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from counterfactory.metrics import (
    average_precision_at_k,
    bias_at_k,
    max_skew_at_k,
    mean_bias_at_k,
    min_skew_at_k,
    ndkl,
    odmap_at_k,
    odmap_relevance,
    ranking_from_scores,
    recall_at_k,
    skew_at_k,
)
from counterfactory.metrics import retrieval as retrieval_module

FAST = settings(max_examples=60, deadline=None)


# ---------------------------------------------------------------- brute-force references
def loop_recall(sim, text_image, ks, ties="optimistic"):
    """Sort candidates with an explicit tie rule and read off the first positive's position."""
    n_img, n_txt = len(sim), len(sim[0])
    # positives sort before equal-scored negatives when optimistic, after them when pessimistic
    pos_key = 0 if ties == "optimistic" else 1
    neg_key = 1 - pos_key
    i2t_ranks = []
    for i in range(n_img):
        own = [j for j in range(n_txt) if text_image[j] == i]
        if not own:
            continue
        order = sorted(range(n_txt), key=lambda j: (-sim[i][j], pos_key if j in own else neg_key))
        i2t_ranks.append(min(order.index(j) for j in own))
    t2i_ranks = []
    for j in range(n_txt):
        order = sorted(range(n_img), key=lambda i: (-sim[i][j], pos_key if i == text_image[j] else neg_key))
        t2i_ranks.append(order.index(text_image[j]))
    out = {}
    for k in ks:
        out[f"image_to_text@{k}"] = 100.0 * sum(r < k for r in i2t_ranks) / len(i2t_ranks)
    for k in ks:
        out[f"text_to_image@{k}"] = 100.0 * sum(r < k for r in t2i_ranks) / len(t2i_ranks)
    return out


def loop_skew(ranked, k, labels, desired):
    out = {}
    for a in labels:
        count = sum(1 for x in ranked[:k] if x == a)
        p = (count if count > 0 else 1) / k
        out[a] = math.log(p / desired[a])
    return out


def loop_ndkl(ranked, labels, desired):
    total, z = 0.0, 0.0
    for i in range(1, len(ranked) + 1):
        kl = 0.0
        for a in labels:
            p = sum(1 for x in ranked[:i] if x == a) / i
            if p > 0:
                kl += p * math.log(p / desired[a])
        total += kl / math.log2(i + 1)
        z += 1 / math.log2(i + 1)
    return total / z


def loop_ap(rel, k, n_rel):
    hits, acc = 0, 0.0
    for j in range(k):
        if rel[j]:
            hits += 1
            acc += hits / (j + 1)
    return acc / min(k, n_rel)


# ---------------------------------------------------------------- Recall@K
def test_recall_hand_computed():
    # 3 images, 5 texts: texts 0,1 -> image 0; texts 2,3 -> image 1; text 4 -> image 2
    sim = np.array([
        [0.9, 0.1, 0.8, 0.2, 0.3],   # image 0: best own text (0.9) is rank 0
        [0.5, 0.4, 0.3, 0.1, 0.6],   # image 1: own texts 0.3, 0.1; three texts higher -> rank 3
        [0.2, 0.7, 0.6, 0.5, 0.4],   # image 2: own text 0.4; three higher -> rank 3
    ], dtype=np.float32)
    text_image = np.array([0, 0, 1, 1, 2])
    r = recall_at_k(sim, text_image, ks=(1, 3, 4))
    assert r["image_to_text@1"] == pytest.approx(100 / 3)
    assert r["image_to_text@3"] == pytest.approx(100 / 3)
    assert r["image_to_text@4"] == pytest.approx(100.0)
    # text->image ranks: t0: 0.9 top ->0; t1: 0.1 vs .4,.7 -> 2; t2: .3 vs .8,.6 -> 2;
    # t3: .1 vs .2,.5 -> 2; t4: .4 vs .3,.6 -> 1
    assert r["text_to_image@1"] == pytest.approx(20.0)
    assert r["text_to_image@3"] == pytest.approx(100.0)
    assert list(r) == ["image_to_text@1", "image_to_text@3", "image_to_text@4",
                       "text_to_image@1", "text_to_image@3", "text_to_image@4"]


def test_recall_ties_optimistic_vs_pessimistic():
    sim = np.array([[0.5, 0.5],
                    [0.5, 0.2]])
    text_image = np.array([0, 1])
    opt = recall_at_k(sim, text_image, ks=(1,))
    pes = recall_at_k(sim, text_image, ks=(1,), ties="pessimistic")
    # image 0: own text 0 (0.5) tied with text 1 -> optimistic hit, pessimistic miss
    # image 1: own text 1 (0.2) below text 0 (0.5) -> miss in both
    assert opt["image_to_text@1"] == 50.0 and pes["image_to_text@1"] == 0.0
    # text 0: own image 0 (0.5) tied with image 1 -> optimistic hit, pessimistic miss
    # text 1: own image 1 (0.2) below image 0 (0.5) -> miss
    assert opt["text_to_image@1"] == 50.0 and pes["text_to_image@1"] == 0.0
    assert recall_at_k(sim, text_image, ks=(2,), ties="pessimistic")["text_to_image@2"] == 100.0


def test_recall_tied_positives_do_not_count_against_each_other_when_pessimistic():
    # two own texts tied at the top, one negative below: a hit under both rules
    r = recall_at_k(np.array([[0.7, 0.7, 0.1]]), np.array([0, 0, 0]), ks=(1,), ties="pessimistic")
    assert r["image_to_text@1"] == 100.0
    sim = np.array([[0.7, 0.7, 0.7],
                    [0.0, 0.0, 0.0]])
    owner = np.array([0, 0, 1])
    # image 0: own texts at 0.7 tied with negative text 2 -> pessimistic rank 1 (miss at K=1);
    # image 1: own text 2 at 0.0 tied with negatives 0 and 1 -> pessimistic rank 2 (miss).
    # text->image: texts 0, 1 find image 0 (0.7 > 0.0); text 2 loses to image 0 -> 2/3
    assert recall_at_k(sim, owner, ks=(1, 2), ties="pessimistic") == pytest.approx({
        "image_to_text@1": 0.0, "image_to_text@2": 50.0,
        "text_to_image@1": 200 / 3, "text_to_image@2": 100.0})
    assert recall_at_k(sim, owner, ks=(1,))["image_to_text@1"] == 100.0


def test_recall_any_positive_in_top_k_counts_for_image_to_text():
    sim = np.array([[0.1, 0.9, 0.5],
                    [0.0, 0.0, 0.0]])
    # image 0 owns texts 0 and 2: text 0 is last but text 2 is second -> hit at K=2, miss at K=1
    r = recall_at_k(sim, np.array([0, 1, 0]), ks=(1, 2))
    assert r["image_to_text@1"] == 50.0   # image 1 (own text 1 at 0.0, nothing higher) is a hit
    assert r["image_to_text@2"] == 100.0


def test_recall_image_without_text_is_distractor_only():
    sim = np.array([[0.9, 0.8],
                    [0.1, 0.1],
                    [0.95, 0.0]])          # image 2 has no text but outranks image 0 for text 0
    r = recall_at_k(sim, np.array([0, 1]), ks=(1,))
    # image->text over images 0 and 1 only: image 0 own 0.9 top -> hit; image 1 own 0.1 tie -> hit
    assert r["image_to_text@1"] == 100.0
    # text 0: image 2 (0.95) beats image 0 -> miss; text 1: image 0 (0.8) beats image 1 -> miss
    assert r["text_to_image@1"] == 0.0


def test_recall_k_larger_than_candidates_is_all_hits():
    sim = np.array([[0.1, 0.9], [0.9, 0.1]])
    r = recall_at_k(sim, np.array([0, 1]), ks=(10,))
    assert r == {"image_to_text@10": 100.0, "text_to_image@10": 100.0}
    assert recall_at_k(sim, np.array([0, 1]), ks=(1,))["text_to_image@1"] == 0.0


def test_recall_accepts_int_scores_and_single_k():
    sim = np.array([[3, 1], [2, 5]])
    assert recall_at_k(sim, [0, 1], ks=1) == {"image_to_text@1": 100.0, "text_to_image@1": 100.0}


@pytest.mark.parametrize("sim, owner, ks, message", [
    (np.zeros((2, 3)), [0, 1], (1,), "text_image has 2 entries"),
    (np.zeros((2, 3)), [0, 1, 2], (1,), "outside"),
    (np.zeros((2, 3)), [0, 1, -1], (1,), "outside"),
    (np.zeros((2, 3)), [0.0, 1.0, 1.0], (1,), "integer"),
    (np.zeros(3), [0, 0, 0], (1,), "2-D"),
    (np.zeros((0, 0)), [], (1,), "empty"),
    (np.zeros((2, 2)), [0, 1], (), "ks"),
    (np.zeros((2, 2)), [0, 1], (0,), "positive integer"),
    (np.array([[0.1, np.nan], [0.2, 0.3]]), [0, 1], (1,), "NaN"),
    (np.array([[np.nan, 0.1], [0.2, 0.3]]), [0, 1], (1,), "NaN"),
])
def test_recall_rejects_bad_input(sim, owner, ks, message):
    with pytest.raises(ValueError, match=message):
        recall_at_k(sim, np.asarray(owner), ks=ks)


def test_recall_rejects_bad_ties():
    with pytest.raises(ValueError, match="ties"):
        recall_at_k(np.zeros((1, 1)), [0], ties="average")


@st.composite
def retrieval_problem(draw):
    n_img = draw(st.integers(1, 6))
    n_txt = draw(st.integers(1, 12))
    owner = draw(st.lists(st.integers(0, n_img - 1), min_size=n_txt, max_size=n_txt))
    # small integer scores make ties frequent
    sim = draw(st.lists(st.lists(st.integers(0, 3), min_size=n_txt, max_size=n_txt),
                        min_size=n_img, max_size=n_img))
    return np.array(sim, dtype=np.float32), np.array(owner)


@FAST
@given(retrieval_problem(), st.sampled_from(["optimistic", "pessimistic"]))
def test_recall_matches_sorting_reference(problem, ties):
    sim, owner = problem
    ks = (1, 2, 5)
    got = recall_at_k(sim, owner, ks=ks, ties=ties)
    want = loop_recall(sim.tolist(), owner.tolist(), ks, ties)
    assert got == pytest.approx(want)


def test_recall_chunked_path_matches(monkeypatch):
    rng = np.random.default_rng(1)
    sim = rng.integers(0, 5, size=(23, 17)).astype(np.float32)
    owner = rng.integers(0, 23, size=17)
    want = loop_recall(sim.tolist(), owner.tolist(), (1, 3), "optimistic")
    monkeypatch.setattr(retrieval_module, "_CHUNK_ELEMENTS", 40)   # 2 rows per block
    assert recall_at_k(sim, owner, ks=(1, 3)) == pytest.approx(want)
    want_p = loop_recall(sim.tolist(), owner.tolist(), (1, 3), "pessimistic")
    assert recall_at_k(sim, owner, ks=(1, 3), ties="pessimistic") == pytest.approx(want_p)


def test_ranking_from_scores_breaks_ties_by_index():
    assert ranking_from_scores([0.2, 0.5, 0.5, 0.1]).tolist() == [1, 2, 0, 3]


# ---------------------------------------------------------------- Skew / NDKL
def test_skew_hand_computed_uniform():
    ranked = ["a", "a", "b", "c"]
    s = skew_at_k(ranked, 4)
    assert list(s) == ["a", "b", "c"]
    assert s["a"] == pytest.approx(math.log(0.5 * 3))
    assert s["b"] == pytest.approx(math.log(0.25 * 3))
    assert s["c"] == pytest.approx(math.log(0.25 * 3))
    assert max_skew_at_k(ranked, 4) == pytest.approx(math.log(1.5))
    assert min_skew_at_k(ranked, 4) == pytest.approx(math.log(0.75))


def test_skew_zero_count_replaced_by_one_over_k():
    # top-2 = a, a: "b" has zero count -> p = 1/2; uniform over {a, b}
    s = skew_at_k(["a", "a", "b"], 2)
    assert s["a"] == pytest.approx(math.log(1.0 / 0.5))
    assert s["b"] == pytest.approx(0.0)
    # a label absent from the whole ranking, given explicitly: p = 1/k, q = 1/3
    s3 = skew_at_k(["a", "a", "b"], 2, labels=["a", "b", "c"])
    assert s3["c"] == pytest.approx(math.log(0.5 / (1 / 3)))
    assert min_skew_at_k(["a", "a", "b"], 2, labels=["a", "b", "c"]) == pytest.approx(math.log(1.5))


def test_skew_desired_distribution_and_default_labels_from_desired():
    s = skew_at_k(["m", "f", "f", "f"], 4, desired={"m": 0.25, "f": 0.75})
    assert s == pytest.approx({"m": 0.0, "f": 0.0})
    s2 = skew_at_k(["m", "m", "f", "f"], 4, desired={"m": 0.25, "f": 0.75})
    assert s2["m"] == pytest.approx(math.log(2.0))
    assert s2["f"] == pytest.approx(math.log(0.5 / 0.75))


def test_skew_items_outside_labels_occupy_positions():
    s = skew_at_k(["x", "a", "b", "x"], 4, labels=["a", "b"])
    assert s["a"] == pytest.approx(math.log(0.25 / 0.5))


def test_skew_tuple_labels_for_intersectional_groups():
    ranked = [("black", "female"), ("white", "male"), ("black", "female")]
    s = skew_at_k(ranked, 3)
    assert s[("black", "female")] == pytest.approx(math.log((2 / 3) / 0.5))


@pytest.mark.parametrize("kwargs, message", [
    (dict(ranked_labels=[], k=1), "empty"),
    (dict(ranked_labels=["a", "b"], k=3), "larger than"),
    (dict(ranked_labels=["a", "b"], k=0), "positive integer"),
    (dict(ranked_labels=["a", "b"], k=1.0), "positive integer"),
    (dict(ranked_labels=["a", "b"], k=True), "positive integer"),
    (dict(ranked_labels="ab", k=1), "single string"),
    (dict(ranked_labels=["a", "b"], k=1, desired={"a": 0.5, "b": 0.4}), "sum to 1"),
    (dict(ranked_labels=["a", "b"], k=1, labels=["a", "b"], desired={"a": 1.0}), "no proportion"),
    (dict(ranked_labels=["a", "b"], k=1, labels=["a"], desired={"a": 0.5, "b": 0.5}), "not in labels"),
    (dict(ranked_labels=["a", "b"], k=1, desired={"a": 1.0, "b": 0.0}), "> 0"),
    (dict(ranked_labels=["a", "b"], k=1, labels=["a", "a"]), "duplicates"),
])
def test_skew_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        skew_at_k(**kwargs)


@FAST
@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=25), st.data())
def test_skew_matches_loop(ranked, data):
    k = data.draw(st.integers(1, len(ranked)))
    labels = sorted(set(ranked) | set(data.draw(st.sets(st.sampled_from("abcd")))))
    weights = data.draw(st.lists(st.integers(1, 5), min_size=len(labels), max_size=len(labels)))
    desired = {a: w / sum(weights) for a, w in zip(labels, weights)}
    got = skew_at_k(ranked, k, labels=labels, desired=desired)
    want = loop_skew(ranked, k, labels, desired)
    assert got == pytest.approx(want)
    assert max_skew_at_k(ranked, k, labels, desired) == pytest.approx(max(want.values()))
    assert min_skew_at_k(ranked, k, labels, desired) == pytest.approx(min(want.values()))


def test_ndkl_hand_computed():
    # prefix 1: (1, 0) -> KL = ln 2, discount 1; prefix 2: (1/2, 1/2) -> KL = 0
    assert ndkl(["a", "b"]) == pytest.approx(math.log(2) / (1 + 1 / math.log2(3)))
    # constant ranking over two labels: every prefix has KL = ln 2
    assert ndkl(["a", "a", "a"], labels=["a", "b"]) == pytest.approx(math.log(2))
    # matches the desired distribution at every prefix -> 0
    assert ndkl(["a", "a"], desired={"a": 1.0}) == pytest.approx(0.0)


def test_ndkl_rejects_unknown_label_and_empty():
    with pytest.raises(ValueError, match="not in labels"):
        ndkl(["a", "c"], labels=["a", "b"])
    with pytest.raises(ValueError, match="empty"):
        ndkl([])


@FAST
@given(st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=30), st.data())
def test_ndkl_matches_loop(ranked, data):
    labels = sorted(set(ranked) | set(data.draw(st.sets(st.sampled_from([0, 1, 2, 3])))))
    weights = data.draw(st.lists(st.integers(1, 5), min_size=len(labels), max_size=len(labels)))
    desired = {a: w / sum(weights) for a, w in zip(labels, weights)}
    assert ndkl(ranked, labels, desired) == pytest.approx(loop_ndkl(ranked, labels, desired))
    uniform = {a: 1 / len(labels) for a in labels}
    assert ndkl(ranked, labels) == pytest.approx(loop_ndkl(ranked, labels, uniform))
    assert ndkl(np.array(ranked), labels) == pytest.approx(loop_ndkl(ranked, labels, uniform))


# ---------------------------------------------------------------- Bias@K
def test_bias_at_k_hand_computed():
    ranked = ["male", "Female", "neutral", " MALE ", "female", None]
    assert bias_at_k(ranked, 1) == 1.0
    assert bias_at_k(ranked, 2) == 0.0
    assert bias_at_k(ranked, 4) == pytest.approx((2 - 1) / 3)
    assert bias_at_k(ranked, 6) == pytest.approx(0.0)
    assert bias_at_k(["female", "female", "male"], 3) == pytest.approx(-1 / 3)
    assert bias_at_k(["neutral", None, "woman"], 3) == 0.0          # no gendered image -> 0
    assert mean_bias_at_k([["male"], ["female"], ["male"]], 1) == pytest.approx(1 / 3)


def test_bias_at_k_errors():
    with pytest.raises(ValueError, match="larger than"):
        bias_at_k(["male"], 2)
    with pytest.raises(ValueError, match="empty"):
        bias_at_k([], 1)
    with pytest.raises(ValueError, match="empty"):
        mean_bias_at_k([], 1)


@FAST
@given(st.lists(st.sampled_from(["male", "female", "neutral"]), min_size=1, max_size=20), st.data())
def test_bias_at_k_matches_loop(ranked, data):
    k = data.draw(st.integers(1, len(ranked)))
    m = sum(g == "male" for g in ranked[:k])
    f = sum(g == "female" for g in ranked[:k])
    want = 0.0 if m + f == 0 else (m - f) / (m + f)
    assert bias_at_k(ranked, k) == pytest.approx(want)


# ---------------------------------------------------------------- AP@k / ODmAP@k
def test_average_precision_at_k_hand_computed():
    assert average_precision_at_k([1, 0, 1, 0], 3) == pytest.approx((1 + 2 / 3) / 2)
    assert average_precision_at_k([1, 0, 1, 0], 3, n_relevant=5,
                                  normaliser="min_k_relevant") == pytest.approx((1 + 2 / 3) / 3)
    assert average_precision_at_k([1, 0, 1, 0], 3, n_relevant=5) == pytest.approx((1 + 2 / 3) / 2)
    assert average_precision_at_k([0, 0, 1, 1], 2) == 0.0
    assert average_precision_at_k([True, True], 2) == 1.0
    assert math.isnan(average_precision_at_k([0, 0, 0], 2))       # no relevant item


@pytest.mark.parametrize("args, message", [
    (([1, 0], 3), "larger than"),
    (([], 1), "empty"),
    (([1, 2], 1), "0/1"),
    (([1, 1, 0], 2, 1), "smaller than"),
    (([1, 0], 0), "positive integer"),
])
def test_average_precision_at_k_errors(args, message):
    with pytest.raises(ValueError, match=message):
        average_precision_at_k(*args)


@FAST
@given(st.lists(st.booleans(), min_size=1, max_size=30), st.data())
def test_average_precision_at_k_matches_loop(rel, data):
    k = data.draw(st.integers(1, len(rel)))
    extra = data.draw(st.integers(0, 3))
    n_rel = sum(rel) + extra
    got = average_precision_at_k(rel, k, n_relevant=n_rel, normaliser="min_k_relevant")
    if n_rel == 0:
        assert math.isnan(got)
    else:
        assert got == pytest.approx(loop_ap(rel, k, n_rel))


def test_odmap_relevance_rule():
    rel = odmap_relevance(
        removed_classes=[{"person"}, {"dog"}],
        remaining_classes=[{"horse", "hurdle"}, {"frisbee"}],
        caption_classes=[{"person", "horse"}, {"horse"}, {"dog"}, set(), {"frisbee", "hurdle"}],
    )
    assert rel.tolist() == [
        [False, True, False, False, True],   # names person -> wrong; names nothing -> wrong
        [False, False, False, False, True],
    ]


def test_odmap_relevance_arrays_equal_sets():
    removed = np.array([[1, 0, 0], [0, 1, 0]])
    remaining = np.array([[0, 1, 1], [1, 0, 0]])
    captions = np.array([[1, 1, 0], [0, 0, 1], [1, 0, 0], [0, 1, 1]])
    names = ["a", "b", "c"]
    as_sets = lambda m: [{names[j] for j in np.nonzero(row)[0]} for row in m]  # noqa: E731
    from_sets = odmap_relevance(as_sets(removed), as_sets(remaining), as_sets(captions))
    assert odmap_relevance(removed, remaining, captions).tolist() == from_sets.tolist()
    assert from_sets.tolist() == [[False, True, False, True], [False, False, True, False]]


def test_odmap_relevance_errors():
    with pytest.raises(ValueError, match="both as removed and as remaining"):
        odmap_relevance([{"a"}], [{"a", "b"}], [{"b"}])
    with pytest.raises(ValueError, match="string"):
        odmap_relevance(["a"], [{"b"}], [{"b"}])
    with pytest.raises(ValueError, match="all be 2-D"):
        odmap_relevance(np.zeros((1, 2)), [{"b"}], [{"b"}])


def test_average_precision_and_odmap_full_ranking_equal_sklearn():
    """Without truncation (k = gallery size) and without tied scores, AP@k is sklearn's AP."""
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(7)
    sim = rng.permutation(40 * 25).reshape(40, 25).astype(float)       # distinct scores
    rel = rng.random((40, 25)) < 0.3
    rel[:, 0] = True                                                   # every query has a relevant caption
    expected = [average_precision_score(r, s) for r, s in zip(rel, sim)]
    for r, s, e in zip(rel, sim, expected):
        assert average_precision_at_k(r[np.argsort(-s)], len(r)) == pytest.approx(e)
    assert odmap_at_k(sim, rel, 25, percent=False) == pytest.approx(np.mean(expected))
    # truncated: AP@k differs from sklearn's AP on the same ranking (it stops at k, divides by min(k, R))
    r = np.array([1, 0, 0, 1, 1, 0])
    assert average_precision_at_k(r, 3, normaliser="min_k_relevant") == pytest.approx(1 / 3)
    assert average_precision_score(r, -np.arange(6)) == pytest.approx((1 + 2 / 4 + 3 / 5) / 3)


def test_odmap_at_k_hand_computed():
    sim = np.array([[0.9, 0.8, 0.7, 0.1],
                    [0.1, 0.2, 0.3, 0.4],
                    [0.5, 0.5, 0.5, 0.5]])
    rel = np.array([[0, 1, 1, 0],      # AP@2 = (1/2) / min(2, 2) = 0.25
                    [1, 0, 0, 0],      # ranking 3,2,1,0: nothing relevant in top 2 -> 0
                    [0, 0, 0, 0]])     # no relevant caption: skipped
    mean, per_query = odmap_at_k(sim, rel, 2, return_per_query=True, normaliser="min_k_relevant")
    assert per_query[0] == pytest.approx(0.25)
    assert per_query[1] == 0.0
    assert math.isnan(per_query[2])
    assert mean == pytest.approx(100 * 0.125)
    assert odmap_at_k(sim, rel, 2, percent=False, normaliser="min_k_relevant") == pytest.approx(0.125)


def test_ap_default_is_the_papers_normaliser_and_at_1_only_r_differs():
    """Issue 43 item 9: the library default is the paper's (hits in the top k); at k = 1 ``relevant`` differs."""
    assert average_precision_at_k([1, 0, 1, 0], 3, n_relevant=5) == pytest.approx((1 + 2 / 3) / 2)
    sim = np.array([[1.0, 0.5, 0.1]])
    rel = np.array([[1, 0, 1]])
    assert odmap_at_k(sim, rel, 1, percent=False) == 1.0
    assert odmap_at_k(sim, rel, 1, percent=False, normaliser="min_k_relevant") == 1.0
    assert odmap_at_k(sim, rel, 1, percent=False, normaliser="relevant") == 0.5


# Hand-made rankings (1 = correct caption, in rank order, the whole gallery listed) scored at k = 5 by
# pytorch-metric-learning's AccuracyCalculator ("mean_average_precision", k=5): release 1.6.0 divides by the
# correct items inside the top k ("hits_in_top_k"), release 2.9.0 by all correct items ("relevant"; from 1.6.2);
# release 1.6.1 alone divided by min(k, R) ("min_k_relevant").
LIBRARY_CASES = [
    # ranking                  hits_in_top_k (1.6.0)  relevant (2.9.0)  min_k_relevant (1.6.1)
    ([1, 0, 0, 0, 0, 1, 0, 0], 1.0, 0.5, 0.5),
    ([0, 1, 0, 1, 1, 1, 1, 1], 0.533333, 0.266667, 0.32),
    ([0, 0, 0, 0, 0, 1, 0, 0], 0.0, 0.0, 0.0),        # correct captions exist, none in the top k: 0
    ([1, 1, 1, 1, 1, 1, 1, 1], 1.0, 0.625, 1.0),
]


@pytest.mark.parametrize("ranking, hits, relevant, min_k", LIBRARY_CASES)
def test_ap_at_k_normalisers_match_the_metric_learning_library(ranking, hits, relevant, min_k):
    expected = {"hits_in_top_k": hits, "relevant": relevant, "min_k_relevant": min_k}
    n = len(ranking)
    sim = -np.arange(n, dtype=float)[None, :]                  # gallery already in rank order
    for normaliser, value in expected.items():
        assert average_precision_at_k(ranking, 5, normaliser=normaliser) == pytest.approx(value, abs=1e-6)
        assert odmap_at_k(sim, np.array([ranking]), 5, percent=False, normaliser=normaliser) == \
            pytest.approx(value, abs=1e-6)
    assert average_precision_at_k(ranking, 5) == pytest.approx(hits, abs=1e-6)    # default: the paper's


def test_odmap_hits_normaliser_scores_a_query_without_hits_zero_and_skips_one_without_relevant():
    sim = -np.tile(np.arange(6, dtype=float), (3, 1))
    rel = np.array([[1, 0, 0, 0, 0, 1],          # hit at 1 of 2 -> 1.0 (min(k, R) would give 0.5)
                    [0, 0, 0, 1, 0, 0],          # nothing in the top 3 -> 0
                    [0, 0, 0, 0, 0, 0]])         # no correct caption anywhere -> skipped
    mean, per = odmap_at_k(sim, rel, 3, return_per_query=True, normaliser="hits_in_top_k")
    assert per[:2].tolist() == [1.0, 0.0] and math.isnan(per[2])
    assert mean == pytest.approx(50.0)
    with pytest.raises(ValueError, match="normaliser"):
        odmap_at_k(sim, rel, 3, normaliser="r")


def test_odmap_at_k_ties_broken_by_gallery_index():
    sim = np.array([[0.5, 0.5, 0.5, 0.1]])
    assert odmap_at_k(sim, np.array([[0, 1, 0, 0]]), 1) == 0.0         # index 0 wins the tie
    assert odmap_at_k(sim, np.array([[1, 0, 0, 0]]), 1) == 100.0
    assert odmap_at_k(sim, np.array([[0, 0, 1, 0]]), 2) == 0.0         # top 2 = indices 0, 1
    assert odmap_at_k(sim, np.array([[0, 0, 1, 0]]), 3) == pytest.approx(100 / 3)


def test_odmap_at_k_errors():
    with pytest.raises(ValueError, match="no query has a relevant"):
        odmap_at_k(np.zeros((2, 3)), np.zeros((2, 3)), 1)
    with pytest.raises(ValueError, match="larger than"):
        odmap_at_k(np.zeros((1, 3)), np.ones((1, 3)), 4)
    with pytest.raises(ValueError, match="shape"):
        odmap_at_k(np.zeros((1, 3)), np.ones((1, 2)), 1)
    with pytest.raises(ValueError, match="NaN"):
        odmap_at_k(np.array([[np.nan, 0.0]]), np.ones((1, 2)), 1)


def loop_odmap(sim, rel, k):
    aps = []
    for q in range(len(sim)):
        order = sorted(range(len(sim[q])), key=lambda g: (-sim[q][g], g))
        n_rel = sum(rel[q])
        if n_rel == 0:
            continue
        aps.append(loop_ap([rel[q][g] for g in order], k, n_rel))
    return 100 * sum(aps) / len(aps) if aps else None


@FAST
@given(st.data())
def test_odmap_at_k_matches_loop(data):
    n_q = data.draw(st.integers(1, 5))
    n_g = data.draw(st.integers(1, 10))
    sim = data.draw(st.lists(st.lists(st.integers(0, 3), min_size=n_g, max_size=n_g), min_size=n_q, max_size=n_q))
    rel = data.draw(st.lists(st.lists(st.integers(0, 1), min_size=n_g, max_size=n_g), min_size=n_q, max_size=n_q))
    k = data.draw(st.integers(1, n_g))
    want = loop_odmap(sim, rel, k)
    if want is None:
        with pytest.raises(ValueError):
            odmap_at_k(np.array(sim, float), np.array(rel), k)
    else:
        assert odmap_at_k(np.array(sim, float), np.array(rel), k, normaliser="min_k_relevant") == pytest.approx(want)


def test_odmap_at_k_chunked_path_matches(monkeypatch):
    rng = np.random.default_rng(3)
    sim = rng.integers(0, 4, size=(9, 12)).astype(float)
    rel = rng.integers(0, 2, size=(9, 12))
    rel[0] = 1
    want = loop_odmap(sim.tolist(), rel.tolist(), 5)
    monkeypatch.setattr(retrieval_module, "_CHUNK_ELEMENTS", 25)       # 2 queries per block
    assert odmap_at_k(sim, rel, 5, normaliser="min_k_relevant") == pytest.approx(want)
