"""Filter cards of the studies' own filters (issue 47 item 2): each study's score-table mapping on hand-built input,
the card command on one study, and the demo audit fixtures' ids against the adapters' ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from counterfactory.config import load_config
from counterfactory.studies.coco_counterfactuals import filter_cards as coco
from counterfactory.studies.social_counterfactuals import filter_cards as scf

REPO = Path(__file__).resolve().parents[1]
AUDIT = REPO / "resources" / "demo" / "audit"


def _coco_candidates(tmp_path: Path) -> dict:
    rows = pd.DataFrame({
        "caption_id": ["101_0", "101_0", "101_0", "102_1"],
        "candidate_index": [0, 1, 2, 0],
        "sim_0": [0.30, 0.10, 0.25, 0.40],
        "sim_1": [0.22, 0.30, 0.35, 0.19],
        "sim_image": [0.90, 0.80, 0.60, 0.95],
        "sim_direction": [0.25, float("nan"), 0.30, 0.10],
        "passed": [True, False, False, False],
        "selected": [True, False, False, False],
    })
    rows.to_parquet(tmp_path / "candidate_scores.parquet")
    pairs = pd.DataFrame({"id": ["101_0"], "caption_id": ["101_0"], "candidate_index": [0]})
    pairs.to_parquet(tmp_path / "selected_pairs.parquet")
    pd.DataFrame({"item_id": ["101_0"], "present": [0.9], "absent": [0.3], "score": [0.6],
                  "kept": [True]}).to_parquet(tmp_path / "vqa.parquet")
    return {"scores": str(tmp_path / "candidate_scores.parquet"), "selected": str(tmp_path / "selected_pairs.parquet"),
            "vqa": str(tmp_path / "vqa.parquet")}


def test_coco_score_tables(tmp_path):
    inputs = _coco_candidates(tmp_path)
    t = coco.FILTERS["clip_image_caption"].table(inputs, {})
    assert t["item_id"].tolist() == ["101_0:0", "101_0:1", "101_0:2", "102_1:0"]
    assert t["score"].tolist() == pytest.approx([0.22, 0.10, 0.25, 0.19])
    d = coco.FILTERS["clip_direction"].table(inputs, {})
    assert d["item_id"].tolist() == ["101_0:0", "101_0:2", "102_1:0"]   # the undefined direction is left out
    rule = coco.FILTERS["clip"].table(inputs, {})
    assert rule["score"].dtype == bool and rule["score"].tolist() == [True, False, False, False]
    sel = coco.FILTERS["selection"].table(inputs, {})
    assert sel.set_index("item_id")["score"].to_dict() == {"101_0:0": True, "101_0:1": False, "101_0:2": False,
                                                            "102_1:0": False}
    v = coco.FILTERS["vqa"].table(inputs, {})
    assert v["item_id"].tolist() == ["101_0:0"] and v["pair_id"].tolist() == ["101_0"]
    assert v["score"].tolist() == pytest.approx([0.2]) and v["vqa_score"].tolist() == [0.6]   # margin: 0.5 - 0.3
    cfg = {"images": {"filter": {"image_caption_min": 0.2, "image_image_min": 0.7, "direction_min": 0.2}}}
    assert coco.FILTERS["clip_image_image"].threshold(cfg) == 0.7
    assert coco.FILTERS["vqa"].threshold({}) == 0.0   # the margin's: >= 0 exactly when kept


def _scf_sets(tmp_path: Path) -> dict:
    keys = {"set_id": ["a", "a", "b"], "candidate_index": [0, 1, 0]}
    pd.DataFrame({**keys, "min_image_caption": [0.3, 0.1, 0.25], "min_image_image": [0.5, float("nan"), 0.1],
                  "passed": [True, False, False]}).to_parquet(tmp_path / "clip_sets.parquet")
    pd.DataFrame({"set_id": ["a"], "candidate_index": [0], "max_nsfw_probability": [0.4],
                  "passed": [True]}).to_parquet(tmp_path / "nsfw_sets.parquet")
    pd.DataFrame({"set_id": ["a"], "candidate_index": [0], "passed": [False]}).to_parquet(tmp_path / "detect_sets.parquet")
    pd.DataFrame({"item_id": ["a:0:0-1", "a:0:1-2", "a:0:2-0", "b:3:0-1"], "present": [0.8, 0.6, 0.55, 0.9],
                  "absent": [0.4, 0.8, 0.2, 0.4], "score": [0.4, -0.2, 0.35, 0.5],
                  "kept": [True, False, True, True]}).to_parquet(tmp_path / "vqa.parquet")
    return {"clip": str(tmp_path / "clip_sets.parquet"), "nsfw": str(tmp_path / "nsfw_sets.parquet"),
            "detect": str(tmp_path / "detect_sets.parquet"), "vqa": str(tmp_path / "vqa.parquet")}


def test_social_score_tables(tmp_path):
    inputs = _scf_sets(tmp_path)
    t = scf.FILTERS["clip_image_caption"].table(inputs, {})
    assert t.set_index("item_id")["score"].to_dict() == {"a:0": 0.3, "a:1": 0.1, "b:0": 0.25}
    ii = scf.FILTERS["clip_image_image"].table(inputs, {})
    assert ii["item_id"].tolist() == ["a:0", "b:0"]   # a one-image set has no pair
    cfg_argmax = {"filter": {"nsfw": {"threshold": None}}}
    assert scf.FILTERS["nsfw"].table(inputs, cfg_argmax)["score"].dtype == bool
    cfg = {"filter": {"nsfw": {"threshold": 0.15}, "clip": {"image_caption_min": 0.2, "image_image_min": 0.2}}}
    assert scf.FILTERS["nsfw"].table(inputs, cfg)["score"].tolist() == [0.4]
    assert scf.FILTERS["nsfw"].threshold(cfg) == 0.15 and scf.FILTERS["nsfw"].keep == "below"
    assert scf.FILTERS["detectability"].table(inputs, {})["score"].tolist() == [False]
    v = scf.FILTERS["vqa"].table(inputs, {}).set_index("item_id")
    # the lowest pair margin of the set: a:0:1-2 has absent 0.8 (max_absent 0.5: -0.3); b:3 min(0.4, 0.1, 0.5)
    assert v["score"].to_dict() == pytest.approx({"a:0": -0.3, "b:3": 0.1})
    assert v["kept"].to_dict() == {"a:0": False, "b:3": True} and v["n_pairs"].to_dict() == {"a:0": 3, "b:3": 1}


def test_study_card_command(tmp_path):
    inputs = _coco_candidates(tmp_path)
    audit = tmp_path / "audit.csv"
    audit.write_text("item_id,verdict\n101_0:0,good\n101_0:1,bad\n101_0:2,good\n999_0:0,bad\n", encoding="utf-8")
    out = tmp_path / "card"
    cmd = [sys.executable, "-m", "counterfactory.cli", "filters", "study-card", "--config",
           str(REPO / "config" / "demo.yaml"), "--study", "coco_counterfactuals", "--filter", "clip_image_caption",
           "--input", f"scores={inputs['scores']}", "--audit", str(audit), "--out-dir", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    card = json.loads((out / "card.json").read_text(encoding="utf-8"))
    assert card["threshold"] == -0.2            # the demo's images.filter.image_caption_min
    assert card["n_scored"] == 4 and card["n_audited"] == 3 and card["audit_unscored"] == ["999_0:0"]
    assert card["unit"].startswith("a candidate image pair")
    for name in ("card.md", "card.html", "curve.png", "curve.csv", "scores.parquet"):
        assert (out / name).is_file()
    assert "<table>" in (out / "card.html").read_text(encoding="utf-8")


def test_paper_config_has_no_audit():
    cfg = load_config([REPO / "config" / "config.yaml"])
    assert cfg["filters"]["audit"] == {}


@pytest.mark.parametrize("study", ["coco_counterfactuals", "social_counterfactuals"])
def test_demo_audit_fixture_ids_exist(study, tmp_path):
    """The demo fixtures' ids are ids the mappings make from tables in the demo's layout (a small built case: the
    ids themselves, as the demo writes them)."""
    audit = pd.read_csv(AUDIT / f"{study}.csv", dtype=str)
    assert set(audit["verdict"]) <= {"good", "bad"} and audit["item_id"].is_unique
    if study == "coco_counterfactuals":
        cap, cand = zip(*(i.rsplit(":", 1) for i in audit["item_id"]))
        rows = pd.DataFrame({"caption_id": cap, "candidate_index": [int(c) for c in cand], "sim_0": 0.3, "sim_1": 0.3,
                             "sim_image": 0.9, "sim_direction": 0.3, "passed": True, "selected": False})
        rows.to_parquet(tmp_path / "s.parquet")
        ids = coco.FILTERS["clip"].table({"scores": str(tmp_path / "s.parquet")}, {})["item_id"]
    else:
        sid, cand = zip(*(i.rsplit(":", 1) for i in audit["item_id"]))
        pd.DataFrame({"set_id": sid, "candidate_index": [int(c) for c in cand], "passed": True}).to_parquet(
            tmp_path / "s.parquet")
        ids = scf.FILTERS["clip"].table({"clip": str(tmp_path / "s.parquet")}, {})["item_id"]
    assert set(audit["item_id"]) == set(ids)
    demo = REPO / "results" / "demo" / study
    table = demo / ("images/candidate_scores.parquet" if study == "coco_counterfactuals" else "filter/clip_sets.parquet")
    if table.is_file():   # the demo ran here: its ids
        inputs = {"scores": str(table)} if study == "coco_counterfactuals" else {"clip": str(table)}
        made = (coco if study == "coco_counterfactuals" else scf).FILTERS["clip"].table(inputs, {})["item_id"]
        assert set(audit["item_id"]) <= set(made)


def test_cvld_countercurate_and_spurious_score_tables(tmp_path):
    from counterfactory.studies.countercurate import filter_cards as cc
    from counterfactory.studies.cvld import filter_cards as cvld
    from counterfactory.studies.spurious_retrieval import filter_cards as sr

    pd.DataFrame({"image_id": [101, 103], "accepted": [True, False]}).to_parquet(tmp_path / "votes.parquet")
    pd.DataFrame({"item_id": ["coco_101", "coco_101"], "candidate": [0, 2], "kept": [True, False],
                  "similarity": [0.1, -0.2]}).to_parquet(tmp_path / "edits.parquet")
    pd.DataFrame({"item_id": ["coco_101:0"], "present": [0.7], "absent": [0.8], "score": [-0.1],
                  "kept": [False]}).to_parquet(tmp_path / "vqa.parquet")
    inputs = {k: str(tmp_path / f"{k}.parquet") for k in ("votes", "edits", "vqa")}
    assert cvld.FILTERS["vote"].table(inputs, {}).set_index("item_id")["score"].to_dict() == {"101": True,
                                                                                             "103": False}
    assert cvld.FILTERS["edit_selection"].table(inputs, {})["item_id"].tolist() == ["coco_101:0", "coco_101:2"]
    assert cvld.FILTERS["vqa"].table(inputs, {})["score"].tolist() == pytest.approx([-0.3])   # 0.5 - 0.8
    pd.DataFrame({"item_id": ["positions:7"], "present": [0.6], "absent": [0.4], "score": [0.2],
                  "kept": [True]}).to_parquet(tmp_path / "vqa.parquet")
    assert cc.FILTERS["vqa"].table({"vqa": str(tmp_path / "vqa.parquet")}, {})["item_id"].tolist() == ["positions:7"]
    # coco:5's score passes min_score (0) but its photograph's present term (0.3) fails min_present: not kept, and
    # the card's margin says so too (a card thresholding the raw score at min_score would have kept it)
    pd.DataFrame({"item_id": ["coco:3", "coco:5"], "present": [0.9, 0.3], "absent": [0.2, 0.1], "score": [0.7, 0.2],
                  "kept": [True, False]}).to_parquet(tmp_path / "vqa.parquet")
    table = sr.FILTERS["vqa"].table({"vqa": str(tmp_path / "vqa.parquet")}, {}).set_index("item_id")
    assert table["score"].to_dict() == pytest.approx({"coco:3": 0.3, "coco:5": -0.2})
    assert table["kept"].tolist() == [True, False] and sr.FILTERS["vqa"].threshold({}) == 0.0


def test_cvld_demo_audit_fixture_is_the_kept_edits():
    """The CVLD fixture audits edits (`<item_id>:<candidate>`, the unit of edit_selection and vqa); the demo names it
    for those two filters; where the demo ran here, every id is a kept edit of its manifest."""
    audit = pd.read_csv(AUDIT / "cvld.csv", dtype=str)
    assert set(audit["verdict"]) <= {"good", "bad"} and audit["item_id"].is_unique
    assert all(i.rsplit(":", 1)[1].isdigit() for i in audit["item_id"])
    cfg = load_config([REPO / "config" / "demo.yaml"])
    assert cfg["filters"]["audit"]["cvld"] == {"edit_selection": "resources/demo/audit/cvld.csv",
                                               "vqa": "resources/demo/audit/cvld.csv"}
    edits = REPO / "results" / "demo" / "cvld" / "coco" / "edits" / "ip2p" / "edits.parquet"
    if edits.is_file():
        e = pd.read_parquet(edits)
        assert set(audit["item_id"]) == {f"{i}:{c}" for i, c, k in zip(e["item_id"], e["candidate"], e["kept"]) if k}


@pytest.mark.parametrize("study, n", [("countercurate", 20), ("spurious_retrieval", 8)])
def test_vqa_only_demo_audit_fixtures_are_the_checked_items(study, n):
    """CounterCurate and the spurious study card their VQA check only: the demo names their fixtures for `vqa`, the
    ids are `<dataset>:<item_id>`, both verdicts occur, and where the demo ran here the fixture audits exactly the
    items the check scored."""
    audit = pd.read_csv(AUDIT / f"{study}.csv", dtype=str)
    assert len(audit) == n and audit["item_id"].is_unique and set(audit["verdict"]) == {"good", "bad"}
    assert all(":" in i for i in audit["item_id"])
    cfg = load_config([REPO / "config" / "demo.yaml"])
    assert cfg["filters"]["audit"][study] == {"vqa": f"resources/demo/audit/{study}.csv"}
    scored = REPO / "results" / "demo" / study / "verify" / "vqa.parquet"
    if scored.is_file():
        assert set(audit["item_id"]) == set(pd.read_parquet(scored)["item_id"].astype(str))
