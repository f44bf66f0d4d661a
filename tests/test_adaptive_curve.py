"""Adaptive over-generation curve: replayed from a fixed-mode run, checked against the real adaptive mode."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from counterfactory.config import load_config
from counterfactory.errors import ConfigError, InputError
from counterfactory.generation import adaptive as ad
from counterfactory.generation.selection import SelectionSettings, candidate_seed, overgenerate_caption

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "resources" / "models" / "tiny"
pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- hand-made tables, known answers

def _pair_table(seed=0, n=4):
    """Three captions, 4 candidates each (batches of 2 in the config below); scores -> hand-computed curve.
    A: passed [F, T, T, T] with CLIP_dir [.1, .3, .5, .2]; B: only candidate 3 passes (.4); C: nothing passes."""
    spec = {"A": ([0.1, 0.3, 0.5, 0.2], [False, True, True, True]),
            "B": ([0.9, 0.8, 0.7, 0.4], [False, False, False, True]),
            "C": ([0.6, 0.6, 0.6, 0.6], [False] * 4)}
    rows = []
    for cid, (sd, ok) in spec.items():
        for i in range(n):
            rows.append({"caption_id": cid, "source_index": ord(cid), "candidate_index": i,
                         "seed": np.uint64(candidate_seed(seed, cid, i)), "sim_direction": sd[i], "passed": ok[i]})
    return pd.DataFrame(rows)


def _pair_cfg(**curve):
    return {"seed": 0, "adaptive_curve": curve,
            "images": {"candidates_per_pair": 4, "batch_size": 2, "filter": {"top_k": 1}, "adaptive": {"enabled": False}}}


def _write(tmp_path, table, summary, name="candidate_scores.parquet"):
    table.to_parquet(tmp_path / name)
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    return tmp_path / name


PAIR_SUMMARY = {"unet_evals": 12 * 20, "candidates_generated": 12, "stopped_early": 0}


def test_pairs_curve_hand_computed(tmp_path):
    path = _write(tmp_path, _pair_table(), PAIR_SUMMARY)
    t = ad.curve_from_files(path, _pair_cfg(targets=[1, 2, 4], best_quantiles=[0.25])).set_index("rule")
    # passed scores .3 .5 .2 .4 -> 0.25-quantile (linear) = .2 + .75 * .1 = .275
    assert list(t.index) == ["fixed", "passed>=1", "passed>=2", "passed>=4", "best>=q0.25 (0.275)"]
    assert list(t["in_stage"]) == [True, True, True, True, False]
    assert (t["items"] == 3).all() and (t["items_with_selection"] == 2).all() and (t["accepted"] == 2).all()
    # fixed: 12 candidates x 20 evaluations; A selects .5, B .4
    f = t.loc["fixed"]
    assert (f["candidates"], f["unet_evals"], f["unet_evals_per_accepted"]) == (12, 240, 120)
    assert f["selected_median"] == pytest.approx(0.45) and f["selection_changed"] == 0
    assert f["selected_q25"] == pytest.approx(0.425) and f["selected_q75"] == pytest.approx(0.475)
    # passed>=1: A stops after batch 1 (candidate 1 passed) and selects .3; B and C run to the end
    for rule in ("passed>=1", "best>=q0.25 (0.275)"):     # best .3 >= .275 after A's first batch too
        r = t.loc[rule]
        assert (r["candidates"], r["unet_evals"], r["stopped_early"]) == (10, 200, 1)
        assert r["unet_evals_per_accepted"] == 100 and r["selected_median"] == pytest.approx(0.35)
        assert r["selection_changed"] == pytest.approx(1 / 3)
    # passed>=2 and >=4: nobody stops early (A reaches 2 passes only in its last batch)
    for rule in ("passed>=2", "passed>=4"):
        assert t.loc[rule, "unet_evals"] == 240 and t.loc[rule, "selection_changed"] == 0


def test_replay_batch_size_and_top_k(tmp_path):
    path = _write(tmp_path, _pair_table(), PAIR_SUMMARY)
    cfg = _pair_cfg()
    cfg["images"]["filter"]["top_k"] = 2
    t = ad.curve_from_files(path, cfg, settings=ad.CurveSettings(targets=(2,), batch_size=1)).set_index("rule")
    # batch size 1: A stops after candidate 2 (2 passes): 3 x 20; selects {2, 1} (fixed: {2, 1} too)
    assert t.loc["passed>=2", "unet_evals"] == (3 + 4 + 4) * 20
    assert t.loc["passed>=2", "accepted"] == 3 and t.loc["passed>=2", "selection_changed"] == 0
    assert t.loc["fixed", "selected_median"] == pytest.approx(0.4)       # .5 .3 (A) and .4 (B)
    # a batch size recorded in the summary (the run's resolved one) wins over the config's
    path = _write(tmp_path, _pair_table(), {**PAIR_SUMMARY, "batch_size": 1})
    t1 = ad.curve_from_files(path, cfg, settings=ad.CurveSettings(targets=(2,))).set_index("rule")
    assert t1.loc["passed>=2", "unet_evals"] == 220


def test_sets_curve_hand_computed(tmp_path):
    # set X: 4 members, batch min(4, 8 // 4) = 2; set Y: 2 members, batch min(4, 8 // 2) = 4 (one batch)
    rows = []
    for sid, g, scores, ok in (("X", 4, [.1, .2, .3, .4], [True, False, True, True]),
                               ("Y", 2, [.5, .6, .7, .8], [False, True, False, False])):
        rows += [{"set_id": sid, "candidate_index": i, "n_images": g, "min_image_caption": s, "passed": p}
                 for i, (s, p) in enumerate(zip(scores, ok))]
    cost = 6                                   # UNet evaluations per image (2 x 3 steps)
    images = 4 * 4 + 4 * 2
    path = _write(tmp_path, pd.DataFrame(rows), {"unet_evals": cost * images, "images": images,
                                                 "sets_stopped_early": 0}, "clip_sets.parquet")
    cfg = {"seed": 0, "images": {"candidates_per_set": 4, "batch_size": 4, "max_images_per_call": 8}}
    t = ad.curve_from_files(path, cfg, tmp_path / "summary.json",
                            settings=ad.CurveSettings(targets=(1, 3))).set_index("rule")
    f = t.loc["fixed"]                         # keeps every passing set: X .1 .3 .4, Y .6
    assert (f["unet_evals"], f["accepted"], f["items_with_selection"]) == (144, 4, 2)
    assert f["selected_median"] == pytest.approx(0.35) and f["unet_evals_per_accepted"] == 36
    r = t.loc["passed>=1"]                     # X stops after its first batch (.1 passed); Y has one batch
    assert (r["unet_evals"], r["accepted"], r["stopped_early"]) == (2 * 24 + 4 * 12, 2, 1)
    assert r["selected_median"] == pytest.approx(0.35) and r["selection_changed"] == 0.5
    assert t.loc["passed>=3", "unet_evals"] == 144 and t.loc["passed>=3", "selection_changed"] == 0


def test_bad_inputs_are_refused(tmp_path):
    cfg = _pair_cfg()
    path = _write(tmp_path, _pair_table(seed=7), PAIR_SUMMARY)
    with pytest.raises(InputError, match="recorded seed .* Fix: pass the config"):
        ad.curve_from_files(path, cfg)
    path = _write(tmp_path, _pair_table(), {**PAIR_SUMMARY, "stopped_early": 2})
    with pytest.raises(InputError, match="adaptive-mode outputs"):
        ad.curve_from_files(path, cfg)
    path = _write(tmp_path, _pair_table(), {**PAIR_SUMMARY, "unet_evals": 241})
    with pytest.raises(InputError, match="not a whole multiple"):
        ad.curve_from_files(path, cfg)
    path = _write(tmp_path, _pair_table().query("candidate_index < 3"), PAIR_SUMMARY)
    with pytest.raises(InputError, match=r"caption_id 'A'.*not 0..3"):
        ad.curve_from_files(path, cfg)
    auto = _pair_cfg()
    auto["images"]["batch_size"] = "auto"
    with pytest.raises(InputError, match="batch_size is auto.*Fix: pass --batch-size"):
        ad.curve_from_files(path, auto)
    with pytest.raises(ConfigError, match="targets must be integers"):
        ad.CurveSettings(targets=(0,))


def test_a_run_without_candidates_gives_an_empty_curve(tmp_path):
    """A fixed run that generated nothing (no caption passed the caption stage) replays to a curve of zeros,
    not an error (found by `make paper-smoke`)."""
    path = _write(tmp_path, _pair_table().iloc[:0], {"unet_evals": 0, "candidates_generated": 0, "stopped_early": 0})
    out = ad.curve_from_files(path, _pair_cfg())
    assert len(out) >= 1 and set(out["items"]) == {0} and set(out["unet_evals"]) == {0}


def test_cli_writes_csv_and_plot(tmp_path):
    from counterfactory.commands import adaptive as cmd

    path = _write(tmp_path, _pair_table(), PAIR_SUMMARY)
    override = {"coco_counterfactuals": {"images": {"candidates_per_pair": 4, "batch_size": 2}}}
    (tmp_path / "cfg.yaml").write_text(json.dumps(override))   # JSON is YAML
    parser = argparse.ArgumentParser()
    cmd.add_curve_parser(parser.add_subparsers())
    args = parser.parse_args(["adaptive-curve", "--config", str(REPO / "config" / "demo.yaml"),
                              "--config", str(tmp_path / "cfg.yaml"), "--scores", str(path),
                              "--out-csv", str(tmp_path / "c.csv"), "--out-png", str(tmp_path / "c.png"),
                              "--targets", "1"])
    assert args.func(args) == 0
    out = pd.read_csv(tmp_path / "c.csv")
    assert list(out["rule"]) == ["fixed", "passed>=1"] and list(out["unet_evals"]) == [240, 200]
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- the real adaptive mode

PAIRS = [("101_0", 0, "A man riding a horse on the beach.", "A man riding a cow on the beach."),
         ("101_1", 1, "Two dogs sitting on a couch.", "Two cats sitting on a couch."),
         ("102_0", 2, "A plate of pizza on a table.", "A plate of cake on a table.")]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    roles = ("sd", "clip_filter", "vae")
    if all((TINY / r).exists() for r in roles):
        return {r: str(TINY / r) for r in roles}
    from counterfactory.models import tiny

    out = tmp_path_factory.mktemp("tiny_vision")
    return {r: str(tiny.build(r, out)) for r in roles}


def test_replay_equals_the_real_adaptive_mode(tmp_path, tiny_models):
    from counterfactory.filters import ClipScorer, FilterThresholds
    from counterfactory.generation.sampler import build_engine
    from counterfactory.generation.shards import run_shard

    cfg = load_config([REPO / "config" / "demo.yaml"], {
        "models": {r: {"source": p} for r, p in tiny_models.items()},
        "images": {"shard_size": 10, "candidates_per_pair": 6, "batch_size": 2, "steps": 2, "height": 32,
                   "width": 32, "filter": {"image_caption_min": -1.0, "image_image_min": 0.7, "direction_min": 0.0,
                                           "top_k": 1}}})
    engine, scorer = build_engine(cfg), ClipScorer.from_config(cfg)
    pd.DataFrame(PAIRS, columns=["caption_id", "source_index", "original", "counterfactual"]).to_parquet(
        tmp_path / "pairs.parquet")
    run_shard(cfg, tmp_path / "pairs.parquet", 0, tmp_path / "fixed", engine=engine, scorer=scorer, progress=False)
    scores = pd.read_parquet(tmp_path / "fixed" / "candidate_scores.parquet")
    summary = json.loads((tmp_path / "fixed" / "summary.json").read_text())
    settings = ad.CurveSettings(targets=(1, 2, 4))
    items = {it.item_id: it for it in ad.pair_items(
        scores, cfg, summary["unet_evals"] // summary["candidates_generated"], 2)}
    table = ad.curve_from_files(tmp_path / "fixed" / "candidate_scores.parquet", cfg, settings=settings)
    thresholds = FilterThresholds.from_config(cfg["images"]["filter"])
    stopped_any = changed_any = False
    for t in settings.targets:
        rule = ad.Rule(f"passed>={t}", target=t)
        evals = accepted = 0
        for cid, _, original, counterfactual in PAIRS:
            real = overgenerate_caption(engine, scorer, thresholds, cid, original, counterfactual, 6, 0,
                                        SelectionSettings(score_images="decoded", top_k=1, adaptive=True,
                                                          target_accepted=t))
            rep = ad.replay_item(items[cid], rule, ad.top_k_selector(1))
            assert rep.candidates == len(real.scores) and rep.unet_evals == real.unet_evals, (t, cid)
            assert rep.selected == tuple(i for _, i, _, _ in real.selected), (t, cid)
            assert rep.stopped_early == real.stopped_early
            # same seeds, same batches: the adaptive run's scores are the fixed run's prefix
            prefix = scores[(scores["caption_id"] == cid) & (scores["candidate_index"] < len(real.scores))]
            np.testing.assert_array_equal(prefix["passed"], [s["passed"] for s in real.scores])
            evals += real.unet_evals
            accepted += len(real.selected)
            stopped_any |= real.stopped_early
            changed_any |= rep.selected != ad.replay_item(items[cid], ad.Rule("fixed"), ad.top_k_selector(1)).selected
        row = table.set_index("rule").loc[rule.name]
        assert (row["unet_evals"], row["accepted"]) == (evals, accepted)
        assert math.isclose(row["unet_evals_per_accepted"], evals / accepted)
    assert stopped_any and changed_any          # the scenario exercises early stops and changed selections
    assert table.set_index("rule").loc["fixed", "unet_evals"] == summary["unet_evals"]
