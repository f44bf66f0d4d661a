"""`counterfactory score` (issue 46, first part): the leaderboard's per-item outcomes, bootstrap intervals, paired
comparison, shortcut baselines, caching by content, model references, and agreement with the study's own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from counterfactory import leaderboard as lb
from counterfactory.config import load_full_config
from counterfactory.errors import InputError

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ statistics
def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    x = np.r_[np.ones(30), np.zeros(20)]
    a = lb.bootstrap_ci(x, resamples=500, seed=3)
    assert a == lb.bootstrap_ci(x, resamples=500, seed=3)           # seeded: the same interval again
    assert a[0] < 0.6 < a[1] and 0.4 < a[0] and a[1] < 0.8
    assert lb.bootstrap_ci(np.ones(10), resamples=100, seed=0) == (1.0, 1.0)


def test_paired_comparison_is_zero_for_a_model_against_itself_and_decisive_otherwise():
    x = np.r_[np.ones(25), np.zeros(25)]
    same = lb.compare(x, x, resamples=300, seed=0)
    assert same["difference"] == 0 and same["p_value"] == 1.0 and same["test"] == "paired bootstrap"
    better = lb.compare(np.ones(40), np.r_[np.ones(10), np.zeros(30)], resamples=300, seed=0)
    assert better["difference"] == 0.75 and better["p_value"] == 0.0 and better["ci_low"] > 0.5
    with pytest.raises(Exception, match="same items"):
        lb.compare(np.ones(3), np.ones(4), resamples=10, seed=0)


# ------------------------------------------------------------------ outcomes and baselines
def test_item_outcomes_follow_the_benchmark_definitions():
    pair = pd.DataFrame({"item_id": ["a", "b", "c"], "s_pos": [0.9, 0.1, 0.5], "s_neg": [0.1, 0.9, 0.5]})
    assert lb.item_outcomes(lb.PAIR, pair)["accuracy"].tolist() == [True, False, False]   # a tie is wrong
    # Winoground: item 0 right both ways; item 1 text right, image wrong
    group = pd.DataFrame({"item_id": ["w0", "w1"], "s_c0_i0": [0.9, 0.9], "s_c0_i1": [0.1, 0.95],
                          "s_c1_i0": [0.2, 0.1], "s_c1_i1": [0.8, 0.99]})
    out = lb.item_outcomes(lb.GROUP, group)
    assert out["text"].tolist() == [True, True] and out["image"].tolist() == [True, False]
    assert out["group"].tolist() == [True, False]


def test_shortcut_baselines():
    items = pd.DataFrame({"item_id": ["1", "2", "3"], "image_path": ["x", "y", "z"],
                          "caption": ["a dog on a mat", "a red car", "two cats"],
                          "negative_caption": ["a mat on a dog", "a blue car", "three cats"]})
    bow = lb.bow_outcomes(lb.PAIR, items)
    assert bow["accuracy"].tolist() == [False, True, True]        # a swap is the same bag of words
    ppl = {"a dog on a mat": 5.0, "a mat on a dog": 9.0, "a red car": 7.0, "a blue car": 3.0, "two cats": 2.0,
           "three cats": 2.0}
    text = lb.text_only_outcomes(items, lambda texts: np.array([ppl[t] for t in texts]))
    assert text["accuracy"].tolist() == [True, False, False]      # lower perplexity wins; a tie is wrong


# ------------------------------------------------------------------ models and caching
def test_model_reference_takes_the_role_of_its_architecture(tiny_clip, tmp_path):
    cfg = load_full_config([REPO / "config" / "demo.yaml"])
    ref = lb.model_ref(cfg, str(tiny_clip))
    assert ref.role == "clip_eval" and ref.label == str(tiny_clip)
    assert ref.cfg["models"]["clip_eval"]["source"] == str(tiny_clip)
    assert cfg["models"]["clip_eval"]["source"] != str(tiny_clip)   # the caller's config is left alone
    assert lb.model_ref(cfg, "clip_eval").label == "tiny CLIP"     # a configured role: its display name
    (tmp_path / "junk").mkdir()
    with pytest.raises(InputError, match="not a model folder"):
        lb.model_ref(cfg, str(tmp_path / "junk"))
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(InputError, match=r"config\.json.*model_type 't5'"):
        lb.model_ref(cfg, str(tmp_path / "odd"))


def test_leaderboard_agrees_with_the_study_scores_only_new_models_and_writes_every_format(tiny_clip, tmp_path,
                                                                                          monkeypatch):
    from counterfactory.studies.countercurate import benchmarks as cc

    monkeypatch.chdir(REPO)
    cfg = load_full_config([REPO / "config" / "demo.yaml"])
    cfg["models"].pop("lm")                                        # no text-only row: no LM to build here
    ref = lb.model_ref(cfg, str(tiny_clip))
    calls = []
    real = lb.score_model

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(lb, "score_model", counting)
    table = lb.run(cfg, [ref], ["sugarcrepe", "winoground"], tmp_path, resamples=100)
    assert len(calls) == 2
    # the cell is the study's own number for the same model and items (the same scoring code)
    from counterfactory.config import study_view

    results, _ = cc.evaluate(study_view(cfg, "countercurate"), "clip_eval", "sugarcrepe", scorer=_scorer(ref))
    mine = table[(table["model"] == str(tiny_clip)) & (table["benchmark"] == "sugarcrepe")
                 & (table["metric"] == "accuracy")]["value"].item()
    pooled = results[(results["subset"] == "average") & (results["metric"] == "accuracy")]["value"].item()
    assert mine == pooled
    # SugarCrepe's categories: a cell each, the study's per-category accuracy (its seven files)
    from counterfactory.studies.countercurate.benchmarks import SUGARCREPE_CATEGORIES

    per = table[(table["model"] == str(tiny_clip)) & (table["benchmark"] == "sugarcrepe")
                & table["metric"].str.startswith("accuracy:")].set_index("metric")
    cats = results[results["subset"].isin(SUGARCREPE_CATEGORIES) & (results["metric"] == "accuracy")]
    assert len(cats) > 1 and set(per.index) == {f"accuracy:{c}" for c in cats["subset"]}
    for _, row in cats.iterrows():
        assert per.loc[f"accuracy:{row['subset']}", "value"] == pytest.approx(row["value"]), row["subset"]
        assert per.loc[f"accuracy:{row['subset']}", "n"] == row["n"]
    assert per["n"].sum() == table[(table["model"] == str(tiny_clip)) & (table["metric"] == "accuracy")
                                   & (table["benchmark"] == "sugarcrepe")]["n"].item()
    bow = table[(table["model"] == lb.BOW) & (table["benchmark"] == "sugarcrepe")]
    assert set(per.index) <= set(bow["metric"])                    # the shortcut rows per category too
    for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.json", "leaderboard.html", "cache_keys.csv"):
        assert (tmp_path / name).is_file(), name
    md = (tmp_path / "leaderboard.md").read_text()
    assert lb.BOW in md and "[" in md and "sugarcrepe/accuracy" in md
    # a second run with the same model: everything from the cache; a changed item set is scored anew
    lb.run(cfg, [ref], ["sugarcrepe", "winoground"], tmp_path, resamples=100)
    assert len(calls) == 2
    keys = pd.read_csv(tmp_path / "cache_keys.csv")
    assert len(keys) == 2 and keys["key"].str.match(r"^[0-9a-f]{16}-[0-9a-f]{16}-[0-9a-f]{12}$").all()


def _scorer(ref):
    from counterfactory.scorers import scorer_from_config

    return scorer_from_config(dict(ref.cfg), ref.role, head="itm", progress=False)


def test_the_data_fingerprint_follows_image_content_not_names(tmp_path):
    (tmp_path / "a.png").write_bytes(b"one")
    (tmp_path / "b.png").write_bytes(b"one")
    items = lambda name: pd.DataFrame({"item_id": ["1"], "image_path": [str(tmp_path / name)],   # noqa: E731
                                       "caption": ["x"], "negative_caption": ["y"]})
    assert lb.data_fingerprint(lb.PAIR, items("a.png")) == lb.data_fingerprint(lb.PAIR, items("b.png"))
    (tmp_path / "b.png").write_bytes(b"two")
    assert lb.data_fingerprint(lb.PAIR, items("a.png")) != lb.data_fingerprint(lb.PAIR, items("b.png"))
    with pytest.raises(InputError, match="benchmark image unreadable"):
        lb.data_fingerprint(lb.PAIR, items("missing.png"))


def test_cli_scores_a_folder_and_compares_two_cached_models(tiny_clip, tmp_path, monkeypatch, capsys):
    from counterfactory.cli import main

    monkeypatch.chdir(REPO)
    out = tmp_path / "board"
    over = tmp_path / "roles.yaml"   # the configured role: the same tiny CLIP under its display name
    over.write_text(f"models:\n  clip_eval: {{source: '{tiny_clip}', display_name: tiny CLIP}}\n")
    assert main(["score", "run", "--config", "config/demo.yaml", "--config", str(over), "--model", str(tiny_clip),
                 "--model", "clip_eval",
                 "--benchmarks", "sugarcrepe", "--out-dir", str(out), "--resamples", "50", "--no-baselines",
                 "--no-progress"]) == 0
    board = pd.read_csv(out / "leaderboard.csv")
    assert set(board["model"]) == {str(tiny_clip), "tiny CLIP"} and set(board["kind"]) == {"model"}
    keys = pd.read_csv(out / "cache_keys.csv")["key"].tolist()
    capsys.readouterr()
    assert main(["score", "compare", "--out-dir", str(out), "--benchmark", "sugarcrepe", keys[0], keys[0]]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accuracy"]["difference"] == 0 and result["accuracy"]["p_value"] == 1.0


def test_workflow_steps_score_item_then_leaderboard_equal_score_run(tiny_clip, tmp_path, monkeypatch):
    """The workflow's score_item (one model x one benchmark) and score_leaderboard jobs give the cells `score run`
    gives for the same model, items and settings (issue 46: a rule per model x benchmark)."""
    from counterfactory.cli import main

    monkeypatch.chdir(REPO)
    over = tmp_path / "roles.yaml"
    over.write_text(f"models:\n  clip_eval: {{source: '{tiny_clip}', display_name: tiny CLIP}}\n"
                    "score: {resamples: 60, seed: 3, baselines: false}\n")
    conf = ["--config", "config/demo.yaml", "--config", str(over)]
    files = []
    for bench in ("sugarcrepe", "winoground"):
        files.append(tmp_path / "scores" / "items" / bench / "clip_eval.parquet")
        assert main(["score", "item", *conf, "--model", "clip_eval", "--benchmark", bench, "--out", str(files[-1]),
                     "--no-progress"]) == 0
    assert main(["score", "leaderboard", *conf, "--items", *map(str, files), "--out-dir",
                 str(tmp_path / "scores")]) == 0
    steps = pd.read_csv(tmp_path / "scores" / "leaderboard.csv")
    assert main(["score", "run", *conf, "--model", "clip_eval", "--benchmarks", "sugarcrepe", "winoground",
                 "--out-dir", str(tmp_path / "one"), "--resamples", "60", "--seed", "3", "--no-baselines",
                 "--no-progress"]) == 0
    one = pd.read_csv(tmp_path / "one" / "leaderboard.csv")
    pd.testing.assert_frame_equal(steps, one)
    assert set(steps["model"]) == {"tiny CLIP"} and set(steps["benchmark"]) == {"sugarcrepe", "winoground"}
    bad = tmp_path / "scores" / "items" / "nope" / "clip_eval.parquet"
    bad.parent.mkdir(parents=True)
    pd.read_parquet(files[0]).to_parquet(bad)
    assert main(["score", "leaderboard", *conf, "--items", str(bad), "--out-dir", str(tmp_path / "x")]) != 0


# ------------------------------------------------------------------ COCO-CF Recall@K
class _FixedScorer:
    """A dual scorer whose score matrix is given (rows: the retrieval space's images, columns: its captions)."""

    dual, name, logit_scale = True, "fixed", 1.0

    def __init__(self, matrix):
        self.matrix, self.calls = np.asarray(matrix, dtype=np.float32), 0

    def score_matrix(self, images, texts):
        self.calls += 1
        assert self.matrix.shape == (len(images), len(texts))
        return self.matrix


def test_coco_cf_recall_cells_are_evaluate_itr_recall_with_query_bootstrap_and_cache(tmp_path, monkeypatch):
    from test_clip_benchmark_crosscheck import WORDS, coco_cf_study

    from counterfactory.evaluation import cf_retrieval_set, retrieval_recall
    from counterfactory.evaluation.readers import read_pairs

    study = coco_cf_study(tmp_path / "results")
    pairs_path = study / "images" / "selected_pairs.parquet"
    n = 2 * len(WORDS)
    matrix = np.random.default_rng(0).normal(size=(n, n)) + 1.5 * np.eye(n)
    scorer = _FixedScorer(matrix)
    monkeypatch.setattr(lb, "_dual_scorer", lambda *a, **k: scorer)
    monkeypatch.setattr(lb, "model_fingerprint", lambda cfg, role: "f" * 16)
    cfg = {"models": {"clip_eval": {"source": "x"}},
           "coco_counterfactuals": {"evaluation": {"itr": {"ks": [1, 3]}}}}
    ref = lb.ModelRef("m", cfg, "clip_eval")
    table = lb.run(cfg, [ref], ["coco_cf_retrieval"], tmp_path / "out", sources={"coco_cf_retrieval": str(pairs_path)},
                   resamples=200, baselines=False)
    expected = retrieval_recall(scorer, cf_retrieval_set(read_pairs(pairs_path)), [1, 3])
    cells = table.set_index("metric")
    assert set(cells.index) == set(expected)
    for metric, value in expected.items():
        assert 100 * cells.loc[metric, "value"] == pytest.approx(value), metric
        assert cells.loc[metric, "ci_low"] <= cells.loc[metric, "value"] <= cells.loc[metric, "ci_high"]
    assert (cells["n"] == 2 * n).all() and set(cells["unit"]) == {"query (image or caption)"}
    units = pd.read_parquet(next((tmp_path / "out" / "items" / "coco_cf_retrieval").glob("*.parquet")))
    assert units["direction"].value_counts().to_dict() == {"image_to_text": n, "text_to_image": n}
    assert units.loc[units["direction"] == "image_to_text", "text_to_image@1"].isna().all()
    # cached: the same model, data and K score nothing again; another K is scored anew
    calls = scorer.calls
    lb.run(cfg, [ref], ["coco_cf_retrieval"], tmp_path / "out", sources={"coco_cf_retrieval": str(pairs_path)},
           resamples=50, baselines=False)
    assert scorer.calls == calls
    cfg["coco_counterfactuals"]["evaluation"]["itr"]["ks"] = [1, 5]
    lb.run(cfg, [ref], ["coco_cf_retrieval"], tmp_path / "out", sources={"coco_cf_retrieval": str(pairs_path)},
           resamples=50, baselines=False)
    assert scorer.calls > calls
    keys = pd.read_csv(tmp_path / "out" / "cache_keys.csv")["key"].tolist()
    result = lb.compare_cached(tmp_path / "out", "coco_cf_retrieval", keys[0], keys[0], resamples=50)
    assert set(result) == {"image_to_text@1", "image_to_text@5", "text_to_image@1", "text_to_image@5"}
    assert result["text_to_image@1"]["n"] == n and result["text_to_image@1"]["difference"] == 0
    # a cross-encoder-only model reads n/a (the set benchmarks rank by one embedding per query)
    assert "n/a" in lb.not_scorable({"models": {"itm_vilt": {"source": "x"}}}, "itm_vilt", "coco_cf_retrieval")


def test_retrieval_queries_decided_by_exact_ties_are_named_in_a_note(tmp_path, monkeypatch):
    """A model that scores every image alike for a caption (a collapsed encoder) hits every text-to-image query by
    the tie rule; the leaderboard says so instead of leaving a perfect score unexplained. Decisive scores: no note."""
    from test_clip_benchmark_crosscheck import WORDS, coco_cf_study

    pairs_path = coco_cf_study(tmp_path / "results") / "images" / "selected_pairs.parquet"
    n = 2 * len(WORDS)
    monkeypatch.setattr(lb, "model_fingerprint", lambda cfg, role: "f" * 16)
    cfg = {"models": {"clip_eval": {"source": "x"}}, "coco_counterfactuals": {"evaluation": {"itr": {"ks": [1]}}}}
    ref = lb.ModelRef("m", cfg, "clip_eval")
    collapsed = np.tile(np.arange(n, dtype=np.float32), (n, 1))     # column j: every image scores j
    monkeypatch.setattr(lb, "_dual_scorer", lambda *a, **k: _FixedScorer(collapsed))
    table = lb.run(cfg, [ref], ["coco_cf_retrieval"], tmp_path / "tied", resamples=20, baselines=False,
                   sources={"coco_cf_retrieval": str(pairs_path)}).set_index("metric")
    assert table.loc["text_to_image@1", "value"] == 1.0                 # the tie rule's hit, for every caption
    notes = json.loads((tmp_path / "tied" / "leaderboard.json").read_text())["notes"]
    assert notes == [f"m on coco_cf_retrieval: {n} of {2 * n} queries have their positive tied exactly with another "
                     "candidate; a tie counts for the positive (recall_at_k's rule), so those hits say nothing of "
                     "the model"]
    decisive = np.arange(n * n, dtype=np.float32).reshape(n, n) + 1000 * np.eye(n, dtype=np.float32)
    monkeypatch.setattr(lb, "_dual_scorer", lambda *a, **k: _FixedScorer(decisive))
    lb.run(cfg, [ref], ["coco_cf_retrieval"], tmp_path / "decisive", resamples=20, baselines=False,
           sources={"coco_cf_retrieval": str(pairs_path)})
    assert json.loads((tmp_path / "decisive" / "leaderboard.json").read_text())["notes"] == []
