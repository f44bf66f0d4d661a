"""CounterCurate faithful to the paper (round 3, issue 43): training / scoring precision (§4.1), the counting
overlap rule (§3.3), the tables in the paper's layout (Tables 1, 2, 3, 5)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from counterfactory.studies.countercurate import benchmarks as bm
from counterfactory.studies.countercurate import training as tr

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "resources" / "demo"
WG = {"examples": str(DEMO / "winoground" / "examples.jsonl"), "images": str(DEMO / "winoground" / "images")}


def _paper_view():
    from counterfactory.config import load_config

    return load_config([str(REPO / "config" / "config.yaml")], study="countercurate")


def test_paper_config_trains_positions_and_counting_in_fp32_and_scores_in_fp32():
    """§4.1 states mixed precision for Flickr30k-Attributes training only; the benchmarks score in fp32."""
    cfg = _paper_view()
    s = tr.settings(cfg)
    assert [tr.training_precision(s, d) for d in ("positions", "counting", "attributes")] == ["fp32", "fp32", "auto"]
    assert tr.training_precision(s, "positions", family="vlm") is None        # the vlm family: config-wide
    assert bm.scoring_cfg(cfg)["precision"] == "fp32"
    # the project's alternatives: one value for every dataset and family; null = the config-wide precision
    one = tr.settings({"training": {"precision": "bf16"}})
    assert tr.training_precision(one, "counting") == tr.training_precision(one, "counting", family="vlm") == "bf16"
    assert bm.scoring_cfg({"precision": "auto", "benchmarks": {"precision": None}})["precision"] == "auto"


def test_train_run_and_benchmarks_use_the_stage_precisions(tmp_path, monkeypatch):
    from counterfactory.evaluation import runs as ev_runs

    trained, scored = [], []
    monkeypatch.setattr(ev_runs, "run_one", lambda run_cfg, *a, **k: trained.append(run_cfg["precision"]))
    monkeypatch.setattr(tr, "score_run", lambda *a, **k: pd.DataFrame())
    cfg = {"precision": "auto", "models": {"clip_open_clip": {"source": "x"}}}
    for dataset in ("positions", "counting", "attributes"):
        tr.train_run(cfg, dataset, None, None, 0, 1, tmp_path / dataset, train=False)
    assert trained == ["fp32", "fp32", "auto"]

    def factory(cfg, role, head=None, progress=False):
        scored.append(cfg["precision"])
        raise RuntimeError("stop")

    try:
        bm.evaluate({"precision": "auto", "benchmarks": {"winoground": WG}}, "clip_open_clip", "winoground",
                    scorer_factory=factory)
    except RuntimeError:
        pass
    assert scored == ["fp32"]
