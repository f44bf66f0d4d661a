"""`counterfactory score` (issue 46 item 1, the fairness part): the set-level benchmarks (SocialCF, PATA, VisoGender,
CVLD FairFace / CelebA, ODmAP) and CounterCurate's quadruples in the leaderboard. Each cell must equal the study's
own metric function on the same input, carry a unit bootstrap interval around it, and unconfigured data / model kinds
that cannot be scored read n/a (a note), not an error. Scores come from hand-made fake scorers (no model is loaded)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from counterfactory import leaderboard as lb
from counterfactory.config import load_full_config, study_view

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_cfg():
    import os

    old = os.getcwd()
    os.chdir(REPO)   # the demo config's data paths are relative to the repository
    try:
        yield load_full_config([REPO / "config" / "demo.yaml"])
    finally:
        os.chdir(old)


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


class FakeDual:
    """A dual encoder whose embeddings are given: ``image(path) -> vector``, ``text(str) -> vector``."""

    dual = True

    def __init__(self, image, text):
        self.image, self.text = image, text

    def encode_images(self, paths):
        return np.array([self.image(str(p)) for p in paths], dtype=np.float64)

    def encode_texts(self, texts):
        return np.array([self.text(str(t)) for t in texts], dtype=np.float64)

    def score_matrix(self, images, texts):
        return self.encode_images(images) @ self.encode_texts(texts).T


def _unit_vec(seed_text: str, dim: int = 4) -> np.ndarray:
    v = np.random.default_rng(abs(hash(seed_text)) % (2 ** 32)).normal(size=dim)
    return v / np.linalg.norm(v)


def _patch_scorers(monkeypatch, scorer):
    from counterfactory.studies.social_counterfactuals import external, probing

    factory = lambda *a, **k: scorer   # noqa: E731
    monkeypatch.setattr(lb, "_dual_scorer", factory)
    monkeypatch.setattr(probing, "_default_scorer_factory", factory)
    monkeypatch.setattr(external, "_default_scorer_factory", factory)


def _set_cells(cfg, name, data, resamples=200):
    units = lb.score_model(cfg, "clip_eval", lb.BENCHMARKS[name], data)
    rows = lb._cells("fake", "model", lb.BENCHMARKS[name], units, resamples, 0, 0.95)
    return units, {r["metric"]: r for r in rows}


def _brackets(cell):
    assert cell["ci_low"] - 1e-12 <= cell["value"] <= cell["ci_high"] + 1e-12


# ------------------------------------------------------------------ SocialCounterfactuals
def _social_table(tmp_path: Path) -> Path:
    """Two occupations, two counterfactual sets each of race x gender (4 images per set): male images score 1
    against every query, female 0, so the top K = 4 holds the four male images."""
    rows = []
    for subject in ("doctor", "nurse"):
        for s in range(2):
            for m, (race, gender) in enumerate([("White", "male"), ("White", "female"), ("Indian", "male"),
                                                ("Indian", "female")]):
                name = f"{subject}_{s}_{m}.png"
                (tmp_path / name).write_bytes(f"{subject}{s}{m}".encode())
                rows.append({"set_id": f"{subject}{s}", "candidate_index": 0, "member_index": m,
                             "segment": "race_gender", "prefix": "A photo of a", "subject": subject,
                             "caption": f"A photo of a {race} {gender} {subject}", "a1_type": "race", "a1": race,
                             "a2_type": "gender", "a2": gender, "image_path": name})
    path = tmp_path / "kept.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_socialcf_maxskew_and_ndkl_equal_the_metric_functions_and_a_hand_computed_value(demo_cfg, tmp_path,
                                                                                          monkeypatch):
    from counterfactory.metrics.retrieval import max_skew_at_k, ndkl
    from counterfactory.studies.social_counterfactuals import probing

    path = _social_table(tmp_path)
    _patch_scorers(monkeypatch, FakeDual(lambda p: [1.0, 0.0] if "_0.png" in p or "_2.png" in p else [0.0, 1.0],
                                         lambda t: [1.0, 0.0]))
    data = lb.read_items(demo_cfg, "socialcf", str(path))
    units, cells = _set_cells(demo_cfg, "socialcf", data)
    assert sorted(units["unit_id"]) == ["race_gender/doctor", "race_gender/nurse"]
    # hand: top 4 = 2 White male + 2 Indian male; the two female labels count 0 -> 1/k; desired share 1/4
    assert cells["maxskew"]["value"] == pytest.approx(math.log(0.5 / 0.25))
    frame = probing.read_images_table(path)
    doctor = frame[frame["subject"] == "doctor"]
    score = np.array([1.0 if g == "male" else 0.0 for g in doctor["a2"]])
    labels = [f"{r}|{g}" for r, g in zip(doctor["a1"], doctor["a2"])]
    ranked = [labels[i] for i in np.argsort(-score, kind="stable")]
    joint = ["White|male", "White|female", "Indian|male", "Indian|female"]
    assert cells["maxskew"]["value"] == pytest.approx(max_skew_at_k(ranked, 4, labels=joint))
    assert cells["ndkl"]["value"] == pytest.approx(ndkl(ranked[:8], labels=joint))
    assert cells["maxskew:race_gender"]["value"] == cells["maxskew"]["value"]   # per segment
    for cell in cells.values():
        _brackets(cell)
        assert cell["direction"] == "lower" and cell["unit"].startswith("pool")
    assert cells["maxskew"]["ci_low"] == cells["maxskew"]["ci_high"]   # both pools alike: a point interval


# ------------------------------------------------------------------ PATA / VisoGender (demo fixtures)
@pytest.mark.parametrize("name", ["pata", "visogender"])
def test_pata_and_visogender_equal_the_study_evaluation(demo_cfg, monkeypatch, name):
    from counterfactory.studies.social_counterfactuals import external

    scorer = FakeDual(_unit_vec, _unit_vec)
    _patch_scorers(monkeypatch, scorer)
    data = lb.read_items(demo_cfg, name)
    units, cells = _set_cells(demo_cfg, name, data)
    view = study_view(demo_cfg, "social_counterfactuals")
    run = external.evaluate_pata if name == "pata" else external.evaluate_visogender
    study = run(view, ["clip_eval"], scorer_factory=lambda *a, **k: scorer)
    assert cells["maxskew"]["value"] == pytest.approx(external.external_summary(study).loc["clip_eval", name])
    assert cells["ndkl"]["value"] == pytest.approx(
        external.external_summary(study, "ndkl").loc["clip_eval", name])
    for cell in cells.values():
        _brackets(cell)


# ------------------------------------------------------------------ CVLD: FairFace and CelebA (demo fixtures)
def test_fairface_bias_and_maxskew_equal_cvld_table(demo_cfg, monkeypatch):
    from counterfactory.evaluation.cvld import FAIRFACE_QUERIES, fairface_bias_table

    scorer = FakeDual(_unit_vec, _unit_vec)
    _patch_scorers(monkeypatch, scorer)
    data = lb.read_items(demo_cfg, "cvld_fairface")
    _, cells = _set_cells(demo_cfg, "cvld_fairface", data)
    frame = data.payload
    sim = scorer.score_matrix(list(frame["image_path"]), list(FAIRFACE_QUERIES)).T
    table = fairface_bias_table(sim, list(frame["gender"]), list(FAIRFACE_QUERIES), ks=data.settings["ks"])
    for k in data.settings["ks"]:
        mean = table[(table["query"] == "mean") & (table["k"] == k)].iloc[0]
        assert cells[f"bias@{k}"]["value"] == pytest.approx(mean["abs_bias"])
        assert cells[f"maxskew@{k}"]["value"] == pytest.approx(mean["max_skew"])
        _brackets(cells[f"bias@{k}"])
        assert cells[f"bias@{k}"]["direction"] == "lower"


def test_celeba_ap_deo_delta_acc_equal_cvld_classification_metrics(demo_cfg, monkeypatch):
    from counterfactory.evaluation.cvld import DEFAULT_PROMPTS, classification_metrics

    scorer = FakeDual(_unit_vec, _unit_vec)
    _patch_scorers(monkeypatch, scorer)
    data = lb.read_items(demo_cfg, "cvld_celeba")
    _, cells = _set_cells(demo_cfg, "cvld_celeba", data, resamples=50)
    test, val, attributes = data.payload
    texts = [t for a in attributes for t in DEFAULT_PROMPTS[a]]

    def margins(frame):
        s = scorer.score_matrix(list(frame["image_path"]), texts)
        return pd.DataFrame(s[:, 0::2] - s[:, 1::2], columns=attributes)

    ref = classification_metrics(margins(test), test[attributes], test["Male"].to_numpy(),
                                 val_scores=margins(val), val_labels=val[attributes], attributes=attributes)
    mean = ref[ref["attribute"] == "mean"].iloc[0]
    for metric in ("AP", "DEO", "ΔAcc"):
        if np.isnan(mean[metric]):
            assert metric not in cells
            continue
        assert cells[metric]["value"] == pytest.approx(mean[metric] / 100)
        _brackets(cells[metric])
    assert cells["AP"]["direction"] == "higher" and cells["AP"]["unit"] == "image"


def test_celeba_compare_is_a_paired_bootstrap_that_recomputes_the_metrics(demo_cfg, monkeypatch, tmp_path):
    """`score compare` on cvld_celeba: AP, DEO and ΔAcc are recomputed on each draw of the shared images (the same
    draw for both models); the difference is that of the two models' metrics, a model against itself differs by 0
    with p = 1."""
    _patch_scorers(monkeypatch, FakeDual(_unit_vec, _unit_vec))
    data = lb.read_items(demo_cfg, "cvld_celeba")
    units = lb.score_model(demo_cfg, "clip_eval", lb.BENCHMARKS["cvld_celeba"], data)
    other = units.copy()
    for c in [c for c in units.columns if c.startswith("score:")]:   # a worse model: its scores ignore the label
        other[c] = np.random.default_rng(1).normal(size=len(units))
    folder = tmp_path / "items" / "cvld_celeba"
    folder.mkdir(parents=True)
    units.to_parquet(folder / "a.parquet")
    other.iloc[::-1].to_parquet(folder / "b.parquet")                # row order does not matter: units pair by id
    same = lb.compare_cached(tmp_path, "cvld_celeba", "a", "a", resamples=30)
    assert same and all(r["difference"] == 0 and r["p_value"] == 1 for r in same.values())
    diff = lb.compare_cached(tmp_path, "cvld_celeba", "a", "b", resamples=30)
    agg_a, agg_b = lb.BENCHMARKS["cvld_celeba"].aggregate(units), lb.BENCHMARKS["cvld_celeba"].aggregate(other)
    for metric, r in diff.items():
        assert r["difference"] == pytest.approx(agg_a[metric] - agg_b[metric])
        assert r["n"] == len(units) and r["test"].startswith("paired bootstrap over units")
        assert r["ci_low"] <= r["ci_high"]


# ------------------------------------------------------------------ ODmAP
def test_odmap_equals_odmap_at_k_and_the_hand_computed_value(demo_cfg, tmp_path, monkeypatch):
    from counterfactory.metrics import odmap_at_k

    (tmp_path / "captions").mkdir()
    (tmp_path / "manifests").mkdir()
    for name in ("q0.png", "q1.png"):
        (tmp_path / name).write_bytes(name.encode())
    gallery = pd.DataFrame({"caption": ["a dog on grass", "a cat", "a dog on a sofa"],
                            "mentions": [["dog"], ["cat"], ["dog"]], "split": ["train", "val", "test"],
                            "image_path": ["g0", "g1", "g2"]})
    gallery.to_parquet(tmp_path / "captions" / "gallery.parquet")
    queries = pd.DataFrame({"item_id": ["a", "b"], "image_id": [1, 2],
                            "image_path": [str(tmp_path / "q0.png"), str(tmp_path / "q1.png")],
                            "removed_categories": [["cat"], ["cat"]], "present_categories": [["dog"], ["dog"]]})
    queries.to_parquet(tmp_path / "manifests" / "queries.parquet")
    caption_emb = {"a dog on grass": [1.0, 0.0], "a cat": [0.5, 0.0], "a dog on a sofa": [0.1, 0.0]}
    _patch_scorers(monkeypatch, FakeDual(lambda p: [1.0, 0.0], lambda t: caption_emb[t]))
    data = lb.read_items(demo_cfg, "odmap_coco", str(tmp_path))
    _, cells = _set_cells(demo_cfg, "odmap_coco", data)
    # scores [1, .5, .1], relevance [1, 0, 1]: AP@3 = (1 + 2/3) / 2 by hits in the top k; AP@1 = 1
    sim, rel = np.array([[1.0, 0.5, 0.1]] * 2), np.array([[1, 0, 1]] * 2)
    assert cells["odmap@5"]["value"] == pytest.approx((1 + 2 / 3) / 2)
    assert cells["odmap@5"]["value"] == pytest.approx(odmap_at_k(sim, rel, 3, percent=False))
    assert cells["odmap@1"]["value"] == pytest.approx(odmap_at_k(sim, rel, 1, percent=False)) == 1.0
    for cell in cells.values():
        _brackets(cell)
        assert cell["direction"] == "higher"


# ------------------------------------------------------------------ CounterCurate quadruples
def test_counterCurate_positions_accuracy_is_the_authors_2n_accuracy(demo_cfg, tmp_path):
    from counterfactory.metrics.pairwise import countercurate_position_accuracy, stack_pair_scores

    for name in ("i0", "n0", "i1", "n1"):
        (tmp_path / f"{name}.png").write_bytes(name.encode())
    pd.DataFrame({"image_path": ["i0.png", "i1.png"], "negative_image_path": ["n0.png", "n1.png"],
                  "caption": ["a left of b", "c above d"], "negative_caption": ["a right of b", "c below d"],
                  "subset": ["LR", "AB"], "split": ["test", "test"]}).to_parquet(tmp_path / "positions.parquet")
    items = lb.read_items(demo_cfg, "cc_positions", str(tmp_path / "positions.parquet"))
    table = {("i0", "a left of b"): 0.9, ("i0", "a right of b"): 0.1, ("n0", "a left of b"): 0.2,
             ("n0", "a right of b"): 0.8,   # item 0: both choices right
             ("i1", "c above d"): 0.9, ("i1", "c below d"): 0.1, ("n1", "c above d"): 0.9,
             ("n1", "c below d"): 0.1}      # item 1: the negative image picks the positive caption (half right)

    class Pairs:
        def score_pairs(self, images, texts):
            return np.array([table[(Path(i).stem, t)] for i, t in zip(images, texts)])

    outcomes = lb.score_model(demo_cfg, "clip_eval", lb.BENCHMARKS["cc_positions"], items, scorer=Pairs())
    assert outcomes["accuracy"].tolist() == [1.0, 0.5]
    s = stack_pair_scores([0.9, 0.9], [0.2, 0.9], [0.1, 0.1], [0.8, 0.1])
    assert outcomes["accuracy"].mean() == pytest.approx(countercurate_position_accuracy(s))
    assert outcomes["group"].tolist() == [True, False]


def test_counterCurate_attributes_table_reads_its_negative_column_and_accepted_rows(demo_cfg, tmp_path):
    """The attributes step writes its hard negative as ``negative`` (positions / counting: ``negative_caption``)
    and keeps the rows the LLM gave no edit for as ``status`` rejected, without a negative image: those are no
    item."""
    for name in ("i0", "n0"):
        (tmp_path / f"{name}.png").write_bytes(name.encode())
    pd.DataFrame({"item_id": ["1_0_noun", "1_0_swap"], "image_path": ["i0.png", "i0.png"],
                  "caption": ["a red car", "a red car"], "negative": ["a blue car", None],
                  "negative_image": ["n0.png", None], "status": ["accepted", "rejected"]}).to_parquet(
        tmp_path / "attributes.parquet")
    items = lb.read_items(demo_cfg, "cc_attributes", str(tmp_path / "attributes.parquet"))
    assert items["item_id"].tolist() == ["1_0_noun"] and items["caption_1"].tolist() == ["a blue car"]
    assert items["image_1_path"].tolist() == [str(tmp_path / "n0.png")]


# ------------------------------------------------------------------ skips and n/a
def test_unconfigured_data_is_skipped_with_a_note_not_an_error(demo_cfg, tmp_path):
    import copy

    cfg = copy.deepcopy(dict(demo_cfg))
    cfg["cvld"]["data"]["fairface"]["root"] = str(tmp_path / "nowhere")
    with pytest.raises(lb.NotConfigured, match="not found"):
        lb.read_items(cfg, "cvld_fairface")
    with pytest.raises(lb.NotConfigured, match="release"):
        lb.read_items(cfg, "socialcf")          # the demo study's release.root is null
    with pytest.raises(lb.NotConfigured):
        lb.data_inputs(cfg, "cvld_fairface")
    table = lb.run(cfg, [lb.ModelRef("tiny LLaVA", cfg, "vlm")], ["cvld_fairface", "odmap_coco", "cc_counting"],
                   tmp_path / "out", resamples=10)
    assert table.empty
    text = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "cvld_fairface: skipped" in text and "odmap_coco: skipped" in text and "cc_counting: skipped" in text


def test_a_generative_model_reads_n_a_on_the_set_benchmarks(demo_cfg, tmp_path):
    assert lb.model_kinds(demo_cfg, "vlm") == {lb.GENERATIVE}
    assert lb.model_kinds(demo_cfg, "itm_vilt") == {lb.ITM}
    assert lb.DUAL in lb.model_kinds(demo_cfg, "itm_blip") and lb.DUAL in lb.model_kinds(demo_cfg, "clip_open_clip")
    for name in ("socialcf", "pata", "visogender", "cvld_fairface", "cvld_celeba", "odmap_coco"):
        assert "n/a" in lb.not_scorable(demo_cfg, "vlm", name)
        assert lb.not_scorable(demo_cfg, "clip_eval", name) is None
    assert lb.not_scorable(demo_cfg, "vlm", "winoground") is None   # the two-caption choice protocol
    table = lb.run(demo_cfg, [lb.ModelRef("tiny LLaVA", demo_cfg, "vlm")], ["pata"], tmp_path / "out",
                   resamples=10)
    wide = lb.wide(table)
    assert (wide.loc["tiny LLaVA"] == "n/a").all()
    assert "pata/maxskew ↓" in wide.columns
    assert "tiny LLaVA on pata: n/a" in (tmp_path / "out" / "leaderboard.md").read_text()
    # the workflow's n/a file reads the same in the leaderboard
    assert lb.outcome_note(lb.empty_outcomes("n/a: why")) == "n/a: why"
    assert lb._cells("m", "model", lb.BENCHMARKS["pata"], lb.empty_outcomes("n/a"), 10, 0, 0.95) == []


def test_set_cache_key_follows_the_data_bytes_and_settings(demo_cfg, tmp_path):
    path = _social_table(tmp_path)
    a = lb.read_items(demo_cfg, "socialcf", str(path))
    fp = lb.data_fingerprint(lb.SET, a)
    assert fp == lb.data_fingerprint(lb.SET, lb.read_items(demo_cfg, "socialcf", str(path)))
    (tmp_path / "doctor_0_0.png").write_bytes(b"changed")
    assert lb.data_fingerprint(lb.SET, lb.read_items(demo_cfg, "socialcf", str(path))) != fp
