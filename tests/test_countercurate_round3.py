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


def test_counting_overlap_is_against_any_other_object():
    """§3.3: "if both objects do not spatially overlap with other objects" — a Q box covering a third object's box
    (or another Q) makes the item a removal, not a plant into that box; ``counted`` (option) is the old rule."""
    import random

    from counterfactory.studies.countercurate import counting as C

    p = [(0, 0, 10, 10), (20, 0, 30, 10)]
    q = [(0, 20, 10, 30), (20, 20, 30, 30), (40, 20, 50, 30)]
    person = [(42, 22, 60, 40)]                         # overlaps the third Q box only
    old = C.count_change(p, q, random.Random(0), person, overlap_with="counted")
    assert old["edit"] == "add"
    new = C.count_change(p, q, random.Random(0), person)
    assert (new["overlap"], new["edit"], new["new_n_p"], new["new_n_q"]) == (True, "remove", 2, 2)
    assert new["mask_boxes"] == [[40, 20, 50, 30], [42, 22, 60, 40]] and new["mask_of"] == ["Q", "other"]
    # two Q boxes overlapping each other are "other objects" to each other too
    q_pair = [(0, 20, 10, 30), (5, 25, 15, 35), (40, 20, 50, 30)]
    assert C.count_change(p, q_pair, random.Random(0), overlap_with="counted")["edit"] == "add"
    both = C.count_change(p, q_pair, random.Random(0))
    assert both["edit"] == "remove" and both["new_n_q"] == 1 and both["mask_of"] == ["Q", "Q"]
    assert C.settings({})["overlap_with"] == "any" and _paper_view()["counting"]["overlap_with"] == "any"


def test_counting_items_see_the_images_other_chains():
    from counterfactory.data import flickr30k_entities as f30k
    from counterfactory.studies.countercurate import counting as C

    Entity = f30k.Entity
    image = f30k.ImageEntities(
        image_id="1", width=100, height=100, sentences=("two dogs and three cats near a man",),
        phrases=(f30k.Phrase(0, "two dogs", "d", ("animals",), 0), f30k.Phrase(0, "three cats", "c", ("animals",), 3),
                 f30k.Phrase(0, "a man", "m", ("people",), 7)),
        entities={"d": Entity("d", ("animals",), ((0, 0, 10, 10), (20, 0, 30, 10))),
                  "c": Entity("c", ("animals",), ((0, 20, 10, 30), (20, 20, 30, 30), (40, 20, 50, 30))),
                  "m": Entity("m", ("people",), ((45, 25, 70, 70),))})
    by_rule = {rule: C.counting_items(image, {"counting": {"overlap_with": rule}}) for rule in ("any", "counted")}
    dog_cat = {r: [x for x in items if {x["category_p"], x["category_q"]} == {"dog", "cat"}][0]
               for r, items in by_rule.items()}
    assert dog_cat["counted"]["edit"] == "add"
    assert dog_cat["any"]["edit"] == "remove" and dog_cat["any"]["mask_boxes"][-1] == [45, 25, 70, 70]
