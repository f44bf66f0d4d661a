"""CounterCurate benchmarks (§4.2-4.4, app. E-G): readers on the official-format fixtures, hand-computed scores with a
fake scorer (ties count as failures), table layouts and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from counterfactory.data.looktwice import drop_repeated_names, read_looktwice, read_questions
from counterfactory.data.sugarcrepe import read_sugarcrepe
from counterfactory.data.winoground import read_winoground
from counterfactory.errors import ConfigError, InputError
from counterfactory.studies.countercurate import benchmarks as bm
from counterfactory.studies.countercurate import benchmark_tables as bt

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "resources" / "demo"
SC_DATA, SC_IMAGES = DEMO / "sugarcrepe" / "data", DEMO / "coco2017" / "val2017"
LT = DEMO / "looktwice"
WG = DEMO / "winoground"


class FakeScorer:
    """``s(text, image)`` from a dict keyed by (image file stem, text), else by text, else ``default``."""

    name = "fake"

    def __init__(self, scores: dict, default: float = 0.0):
        self.scores, self.default, self.calls = scores, default, 0

    def _one(self, image, text):
        stem = Path(str(image)).stem
        return self.scores.get((stem, text), self.scores.get(text, self.default))

    def score_pairs(self, images, texts):
        self.calls += 1
        return np.array([self._one(i, t) for i, t in zip(images, texts)], dtype=np.float32)


class IndexScorer(FakeScorer):
    """Also has ``score_index_pairs`` (as counterfactory.scorers.Scorer); records how many distinct inputs it saw."""

    def score_index_pairs(self, images, texts, image_idx, text_idx):
        self.seen = (len(images), len(texts))
        return np.array([self._one(images[i], texts[j]) for i, j in zip(image_idx, text_idx)], dtype=np.float32)


def value(results: pd.DataFrame, subset: str, metric: str) -> float:
    hit = results[(results["subset"] == subset) & (results["metric"] == metric)]
    assert len(hit) == 1, (subset, metric, results)
    return float(hit["value"].iloc[0])


# ------------------------------------------------------------------------------------------------------------------
# Flickr30k-Positions (§4.2)
# ------------------------------------------------------------------------------------------------------------------
#: (subset, s(C,I), s(C',I), s(C,I'), s(C',I'))
POSITION_ROWS = {
    "a": ("LR", 0.9, 0.1, 0.2, 0.8),   # both directions right: 1.0
    "b": ("LR", 0.5, 0.5, 0.7, 0.3),   # tie, then wrong: 0
    "c": ("LR", 0.6, 0.4, 0.5, 0.5),   # right, then tie: 0.5
    "d": ("AB", 0.3, 0.2, 0.4, 0.5),   # image-to-text right twice (text-to-image would be wrong for C): 1.0
    "e": ("AB", 0.2, 0.3, 0.1, 0.6),   # wrong, then right: 0.5
}


def positions_fixture(tmp_path: Path) -> tuple[Path, FakeScorer]:
    rows, scores = [], {}
    for key, (subset, c_i, nc_i, c_ni, nc_ni) in POSITION_ROWS.items():
        rows.append({"image_id": key, "image_path": f"img/{key}.jpg", "negative_image_path": f"img/{key}_neg.jpg",
                     "caption": f"{key}: a dog left of a cat", "negative_caption": f"{key}: a dog right of a cat",
                     "relation": "left", "subset": subset, "split": "test"})
        scores.update({(key, f"{key}: a dog left of a cat"): c_i, (key, f"{key}: a dog right of a cat"): nc_i,
                       (f"{key}_neg", f"{key}: a dog left of a cat"): c_ni,
                       (f"{key}_neg", f"{key}: a dog right of a cat"): nc_ni})
    rows.append({**rows[0], "image_id": "t", "split": "train"})
    path = tmp_path / "positions.parquet"
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path, FakeScorer(scores)


def test_positions_scores_hand_computed(tmp_path):
    path, scorer = positions_fixture(tmp_path)
    cfg = {"benchmarks": {"positions": {"table": str(path)}}}
    results, items = bm.evaluate(cfg, "clip", "positions", scorer=scorer)
    assert list(results.columns) == bm.RESULT_COLUMNS
    assert len(items) == 5 and (items["split"] == "test").all()
    assert value(results, "LR", "accuracy") == pytest.approx(1.5 / 3)
    assert value(results, "AB", "accuracy") == pytest.approx(1.5 / 2)
    assert value(results, "both", "accuracy") == pytest.approx(3 / 5)
    assert results.set_index(["subset", "metric"]).loc[("LR", "accuracy"), "n"] == 3
    # Winoground-style scores of the quadruples (our definition): LR text a; image a, c; group a
    assert value(results, "LR", "text_score") == pytest.approx(1 / 3)
    assert value(results, "LR", "image_score") == pytest.approx(2 / 3)
    assert value(results, "LR", "group_score") == pytest.approx(1 / 3)
    # d: C prefers I' (text-to-image wrong) although both image-to-text choices are right; e: text-to-image right
    assert value(results, "AB", "image_score") == pytest.approx(0.5)
    assert value(results, "AB", "text_score") == pytest.approx(0.5)
    assert Path(items["image_path"].iloc[0]).is_absolute()
    assert items["image_path"].iloc[0] == str((tmp_path / "img" / "a.jpg").resolve())


def test_positions_reader_official_tsv_and_errors(tmp_path):
    tsv = tmp_path / "test_left_right_.csv"
    pd.DataFrame({"captions": ["x left of y"], "images": ["/abs/i.jpg"], "neg_captions": ["x right of y"],
                  "neg_images": ["n.jpg"]}).to_csv(tsv, sep="\t", index=False)
    tsv2 = tsv.with_suffix(".tsv")
    tsv.rename(tsv2)
    frame = bm.read_positions(tsv2, images_root=tmp_path / "imgs", subset="lr")
    assert frame["subset"].tolist() == ["LR"]
    assert frame["image_path"].iloc[0] == "/abs/i.jpg"
    assert frame["negative_image_path"].iloc[0] == str((tmp_path / "imgs" / "n.jpg").resolve())
    with pytest.raises(InputError, match="subset"):
        bm.read_positions(tsv2)
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"image_path": ["a.jpg"], "negative_image_path": ["b.jpg"], "caption": ["c"],
                  "negative_caption": ["d"], "subset": ["LEFT"], "split": ["test"]}).to_csv(bad, index=False)
    with pytest.raises(InputError, match=r"bad\.csv, record row 0: subset 'LEFT' is not LR or AB"):
        bm.read_positions(bad)
    pos = tmp_path / "positions.parquet"   # positions.py's layout: negative_image, AB negatives not generated yet
    pd.DataFrame({"image_path": ["a.jpg", "a.jpg"], "negative_image": ["a_flip.png", None], "caption": ["c", "e"],
                  "negative_caption": ["d", "f"], "subset": ["LR", "AB"], "split": ["test", "test"]}).to_parquet(pos)
    with pytest.raises(InputError, match=r"record row 1: 1 of 2 rows have no negative image \(per subset: \{'AB': 1\}"):
        bm.read_positions(pos)
    with pytest.raises(InputError, match="no rows of split 'val'"):
        bm.read_positions(bad, split="val")
    with pytest.raises(ConfigError, match=r"benchmarks\.positions\.table is not set"):
        bm.load_benchmark({}, "positions")


# ------------------------------------------------------------------------------------------------------------------
# PointQA-LookTwice (§4.3)
# ------------------------------------------------------------------------------------------------------------------
def test_looktwice_reader_drops_images_with_repeated_names():
    frame = read_looktwice(LT / "looktwiceqa_dataset.json", LT / "images")
    # image 2000003 asks about "coins" twice: the whole image goes
    assert frame["image_id"].tolist() == ["2000001", "2000001", "2000002"]
    assert frame["obj_type"].tolist() == ["horses", "trees", "coins"]
    assert frame["count"].tolist() == [1, 3, 2]
    assert frame["caption"].iloc[0] == "there are 1 horses in the image."
    assert frame["negative_caption"].iloc[0] == "there are 2 horses in the image."
    assert all(Path(p).is_absolute() and Path(p).is_file() for p in frame["image_path"])
    assert len(read_questions(LT / "looktwiceqa_dataset.json")) == 5
    # the split list keeps 2000001 and 2000003 (dropped): two questions remain
    test = read_looktwice(LT / "looktwiceqa_dataset.json", LT / "images", imgs_list=LT / "looktwiceqa_test_imgs.json")
    assert test["image_id"].unique().tolist() == ["2000001"]
    # same name on different images, different names on one image: kept
    q = pd.DataFrame({"image_id": ["1", "1", "2", "3", "3"], "obj_type": ["dogs", "cats", "dogs", "cups", "cups"],
                      "count": [1, 2, 3, 4, 5], "question": [""] * 5})
    assert drop_repeated_names(q)["image_id"].tolist() == ["1", "1", "2"]


def test_looktwice_reader_errors(tmp_path):
    bad = tmp_path / "looktwiceqa_dataset.json"
    bad.write_text(json.dumps({"7": [{"id": "7", "obj_type": "dogs", "ans": "two"}]}))
    with pytest.raises(InputError, match=r"image '7', QA 0: 'ans' is 'two', not a whole number"):
        read_looktwice(bad)
    bad.write_text(json.dumps({"7": [{"id": "7", "ans": "2"}]}))
    with pytest.raises(InputError, match="missing key 'obj_type'"):
        read_looktwice(bad)
    bad.write_text(json.dumps({"7": [{"id": "7", "obj_type": "dogs", "ans": "2"}]}))
    with pytest.raises(InputError, match=r"image '7'.*7\.jpg' not found"):
        read_looktwice(bad, tmp_path)


def test_looktwice_scores_hand_computed():
    scorer = FakeScorer({"there are 1 horses in the image.": 0.7, "there are 2 horses in the image.": 0.2,
                         "there are 3 trees in the image.": 0.4, "there are 4 trees in the image.": 0.4,  # tie
                         "there are 2 coins in the image.": 0.1, "there are 3 coins in the image.": 0.3})
    cfg = {"benchmarks": {"looktwice": {"dataset": str(LT / "looktwiceqa_dataset.json")}}}
    results, items = bm.evaluate(cfg, "clip", "looktwice", images=LT / "images", scorer=scorer)
    assert value(results, "all", "accuracy") == pytest.approx(1 / 3)
    assert results["n"].tolist() == [3]
    assert items["s_pos"].tolist() == pytest.approx([0.7, 0.4, 0.1])


# ------------------------------------------------------------------------------------------------------------------
# SugarCrepe (§4.4, app. G)
# ------------------------------------------------------------------------------------------------------------------
def test_sugarcrepe_reader_fixture():
    frame = read_sugarcrepe(SC_DATA, SC_IMAGES)
    assert list(frame.columns) == ["category", "item_id", "filename", "image_path", "caption", "negative_caption"]
    assert frame["category"].value_counts().to_dict() == {"add_obj": 3, "add_att": 2, "replace_att": 2,
                                                         "replace_obj": 2, "replace_rel": 2, "swap_att": 2,
                                                         "swap_obj": 2}
    assert all(Path(p).is_absolute() and Path(p).is_file() for p in frame["image_path"])
    assert frame["item_id"].iloc[0] == "0"
    # the repository root (holding data/) works too; a subset of categories
    sub = read_sugarcrepe(SC_DATA.parent, SC_IMAGES, ["swap_obj"])
    assert sub["category"].unique().tolist() == ["swap_obj"]


def test_sugarcrepe_missing_key_names_file_and_record(tmp_path):
    path = tmp_path / "swap_obj.json"
    path.write_text(json.dumps({"0": {"filename": "000000000101.jpg", "caption": "a", "negative_caption": "b"},
                                "1": {"filename": "000000000102.jpg", "caption": "a"}}))
    with pytest.raises(InputError) as err:
        read_sugarcrepe(tmp_path, SC_IMAGES, ["swap_obj"])
    msg = str(err.value)
    assert str(path) in msg and "item '1'" in msg and "missing key 'negative_caption'" in msg and "Fix:" in msg
    with pytest.raises(InputError, match="file of category 'add_att' not found"):
        read_sugarcrepe(tmp_path, SC_IMAGES, ["add_att"])
    path.write_text(json.dumps({"0": {"filename": "nope.jpg", "caption": "a", "negative_caption": "b"}}))
    with pytest.raises(InputError, match=r"item '0'.*nope\.jpg not found"):
        read_sugarcrepe(tmp_path, SC_IMAGES, ["swap_obj"])


def test_sugarcrepe_scores_hand_computed():
    frame = read_sugarcrepe(SC_DATA, SC_IMAGES)
    scores = {t: 0.0 for t in frame["negative_caption"]}
    scores.update({t: 1.0 for t in frame["caption"]})   # add_obj item 2 has caption == negative: a tie, wrong
    wrong = frame[((frame["category"] == "replace_rel") & (frame["item_id"] == "0"))
                  | ((frame["category"] == "swap_obj") & (frame["item_id"] == "1"))]
    scores.update({t: 2.0 for t in wrong["negative_caption"]})
    cfg = {"benchmarks": {"sugarcrepe": {"root": str(SC_DATA), "images": str(SC_IMAGES)}}}
    results, _ = bm.evaluate(cfg, "clip", "sugarcrepe", scorer=IndexScorer(scores))
    per = {"add_att": 1.0, "add_obj": 2 / 3, "replace_att": 1.0, "replace_obj": 1.0, "replace_rel": 0.5,
           "swap_att": 1.0, "swap_obj": 0.5}
    for cat, acc in per.items():
        assert value(results, cat, "accuracy") == pytest.approx(acc)
    assert value(results, "add", "accuracy") == pytest.approx(4 / 5)          # pooled: 2 + 2 of 2 + 3 items
    assert value(results, "add", "macro_accuracy") == pytest.approx((1 + 2 / 3) / 2)
    assert value(results, "replace", "accuracy") == pytest.approx(5 / 6)
    assert value(results, "swap", "accuracy") == pytest.approx(3 / 4)
    assert value(results, "average", "accuracy") == pytest.approx(12 / 15)
    assert value(results, "average", "macro_accuracy") == pytest.approx(np.mean(list(per.values())))
    assert results.set_index(["subset", "metric"]).loc[("average", "accuracy"), "n"] == 15


def test_sugarcrepe_pooled_groups_reproduce_table3_from_table6():
    """Table 3's Add / Replace / Swap / Average are item-pooled over Table 6's categories (official counts)."""
    counts = {"add_obj": 2062, "add_att": 692, "replace_obj": 1652, "replace_att": 788, "replace_rel": 1406,
              "swap_obj": 245, "swap_att": 666}
    clip_table6 = {"add_obj": 77.89, "add_att": 87.15, "replace_obj": 93.77, "replace_att": 82.61,
                   "replace_rel": 68.92, "swap_obj": 60.00, "swap_att": 67.42}
    rows = []
    for cat, n in counts.items():
        k = round(clip_table6[cat] / 100 * n)
        rows += [{"category": cat, "s_pos": 1.0, "s_neg": 0.0}] * k
        rows += [{"category": cat, "s_pos": 0.0, "s_neg": 0.0}] * (n - k)   # ties: wrong
    results = bm.summarize("sugarcrepe", pd.DataFrame(rows), "CLIP")
    table3 = {"add": 80.22, "replace": 82.40, "swap": 65.42, "average": 79.54}
    for group, expected in table3.items():
        assert 100 * value(results, group, "accuracy") == pytest.approx(expected, abs=0.01)
    assert 100 * value(results, "average", "macro_accuracy") == pytest.approx(76.82, abs=0.01)


# ------------------------------------------------------------------------------------------------------------------
# Winoground (app. E)
# ------------------------------------------------------------------------------------------------------------------
def test_winoground_reader_fixture(tmp_path):
    frame = read_winoground(WG / "examples.jsonl", WG / "images")
    assert frame["id"].tolist() == [0, 1, 2]
    assert frame["image_0_path"].iloc[1] == str((WG / "images" / "ex_1_img_0.png").resolve())
    assert frame["collapsed_tag"].tolist() == ["Object", "Relation", "Object"]
    with pytest.raises(InputError, match=r"id 0.*ex_0_img_0\.png not found"):
        read_winoground(WG / "examples.jsonl", tmp_path)
    bad = tmp_path / "examples.jsonl"
    bad.write_text('{"id": 0, "image_0": "a", "image_1": "b", "caption_0": "x"}\n')
    with pytest.raises(InputError, match=r"line 1: missing key 'caption_1'"):
        read_winoground(bad)


def test_winoground_scores_hand_computed():
    ex = read_winoground(WG / "examples.jsonl", WG / "images")
    c = {i: (ex["caption_0"].iloc[i], ex["caption_1"].iloc[i]) for i in range(3)}
    scores = {
        # ex 0: everything right
        ("ex_0_img_0", c[0][0]): 0.9, ("ex_0_img_0", c[0][1]): 0.1, ("ex_0_img_1", c[0][0]): 0.2,
        ("ex_0_img_1", c[0][1]): 0.8,
        # ex 1: text wrong (image 0 prefers caption 1), image right
        ("ex_1_img_0", c[1][0]): 0.6, ("ex_1_img_0", c[1][1]): 0.7, ("ex_1_img_1", c[1][0]): 0.1,
        ("ex_1_img_1", c[1][1]): 0.8,
        # ex 2: identical captions -> text ties (wrong); image: caption 1 prefers image 0 -> wrong
        ("ex_2_img_0", c[2][0]): 0.7, ("ex_2_img_1", c[2][0]): 0.2,
    }
    cfg = {"benchmarks": {"winoground": {"examples": str(WG / "examples.jsonl"), "images": str(WG / "images")}}}
    results, items = bm.evaluate(cfg, "clip", "winoground", scorer=FakeScorer(scores))
    assert value(results, "all", "text_score") == pytest.approx(1 / 3)
    assert value(results, "all", "image_score") == pytest.approx(2 / 3)
    assert value(results, "all", "group_score") == pytest.approx(1 / 3)
    assert value(results, "tag:Object", "text_score") == pytest.approx(0.5)
    assert value(results, "tag:Relation", "image_score") == 1.0
    assert value(results, "tag:Relation", "group_score") == 0.0
    assert items["s_c1_i1"].tolist() == pytest.approx([0.8, 0.8, 0.2])


# ------------------------------------------------------------------------------------------------------------------
# scoring plumbing, settings
# ------------------------------------------------------------------------------------------------------------------
def test_pair_scores_dedupes_and_rejects_nan():
    scorer = IndexScorer({("a", "x"): 1.0, ("b", "y"): 2.0})
    out = bm.pair_scores(scorer, ["/p/a.jpg", "/p/b.jpg", "/p/a.jpg", "/p/a.jpg"], ["x", "y", "y", "x"])
    assert out.tolist() == [1.0, 2.0, 0.0, 1.0]
    assert scorer.seen == (2, 2)
    with pytest.raises(InputError, match="NaN score"):
        bm.pair_scores(FakeScorer({"x": math.nan}), ["a.jpg"], ["x"])


def test_settings_and_scorer_factory(tmp_path):
    with pytest.raises(ConfigError, match=r"benchmarks\.sugarcrepe: unknown key\(s\) rot"):
        bm.benchmark_settings({"benchmarks": {"sugarcrepe": {"rot": "x"}}}, "sugarcrepe")   # unknown key
    opts = bm.benchmark_settings({"benchmarks": {"looktwice": {"dataset": "a.json"}}}, "looktwice", images="imgs")
    assert opts["dataset"] == "a.json" and opts["images"] == "imgs" and opts["image_name"] == "{id}.jpg"
    path, scorer = positions_fixture(tmp_path)
    seen = {}

    def factory(cfg, role, head, progress):
        seen.update(role=role, head=head)
        return scorer

    cfg = {"benchmarks": {"head": "itc", "positions": {"table": str(path)}}}
    results, _ = bm.evaluate(cfg, "blip", "positions", scorer_factory=factory, model="BLIP (ft)")
    assert seen == {"role": "blip", "head": "itc"} and set(results["model"]) == {"BLIP (ft)"}


# ------------------------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------------------------
def all_results(tmp_path) -> pd.DataFrame:
    path, scorer = positions_fixture(tmp_path)
    cfg = {"benchmarks": {"positions": {"table": str(path)},
                          "sugarcrepe": {"root": str(SC_DATA), "images": str(SC_IMAGES)},
                          "looktwice": {"dataset": str(LT / "looktwiceqa_dataset.json"), "images": str(LT / "images")},
                          "winoground": {"examples": str(WG / "examples.jsonl"), "images": str(WG / "images")}}}
    parts = []
    for model, s in (("clip", scorer), ("clip_cc", FakeScorer({}, default=0.0))):
        for b in bm.BENCHMARKS:
            parts.append(bm.evaluate(cfg, model, b, scorer=s)[0])
    return pd.concat(parts, ignore_index=True)


def test_table_layouts(tmp_path):
    results = all_results(tmp_path)
    labels = {"clip": "CLIP", "clip_cc": "+ CounterCurate"}
    t1 = bt.build_table(results, "positions", labels=labels)
    assert list(t1.values.columns) == ["LR", "AB", "Both"] and list(t1.values.index) == ["CLIP", "+ CounterCurate"]
    assert t1.values.loc["CLIP", "Both"] == pytest.approx(60.0)
    assert t1.values.loc["+ CounterCurate", "LR"] == 0.0   # a constant scorer ties everywhere: all wrong
    t8 = bt.build_table(results, "looktwice", labels=labels)
    assert list(t8.values.columns) == ["Accuracy"] and t8.values.shape == (2, 1)
    t3 = bt.build_table(results, "sugarcrepe", labels=labels, deltas={"clip": "clip_cc"})
    assert list(t3.values.index) == ["Add", "Replace", "Swap", "Average"]
    assert list(t3.values.columns) == ["CLIP", "+ CounterCurate"]
    t6 = bt.build_table(results, "sugarcrepe", detail=True, models=["clip_cc"])
    assert list(t6.values.index) == ["Add Object", "Add Attribute", "Replace Object", "Replace Attribute",
                                     "Replace Relations", "Swap Object", "Swap Attribute", "Average"]
    assert list(t6.values.columns) == ["clip_cc"]
    t7 = bt.build_table(results, "winoground")
    assert list(t7.values.columns) == ["Text Score", "Image Score", "Group Score"]
    md = bt.render_markdown(t3)
    assert "| Categories" in md and "| Add " in md and "(+" in md
    tex = bt.render_latex(t1)
    assert "\\toprule" in tex and "Both" in tex and "+ CounterCurate" in tex
    frame = bt.table_frame(t3)
    assert list(frame.columns) == ["table", "row", "column", "value", "delta"] and len(frame) == 8
    with pytest.raises(ConfigError, match="no results"):
        bt.build_table(results, "positions", models=["nope"])


def test_cli_tables_and_evaluate(tmp_path, monkeypatch):
    from counterfactory.cli import main

    results = all_results(tmp_path)
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    results[results["model"] == "clip"].to_csv(a, index=False)
    results[results["model"] == "clip_cc"].to_csv(b, index=False)
    rc = main(["countercurate", "tables", "--results", str(a), str(b), "--label", "clip=CLIP", "--out-md",
               str(tmp_path / "t.md"), "--out-tex", str(tmp_path / "t.tex"), "--out-csv", str(tmp_path / "t.csv")])
    assert rc == 0
    md = (tmp_path / "t.md").read_text()
    for title in ("Tables 1 and 4", "Tables 2 and 8", "Table 3", "Table 6", "Table 7"):
        assert title in md
    assert set(pd.read_csv(tmp_path / "t.csv")["table"]) == {"positions", "looktwice", "sugarcrepe",
                                                             "sugarcrepe_detail", "winoground"}
    assert main(["countercurate", "tables", "--results", str(a), str(a)]) == 2   # repeated results

    import counterfactory.config as config_mod
    path, scorer = positions_fixture(tmp_path)
    monkeypatch.setattr(config_mod, "load_config", lambda paths, study=None: {"benchmarks": {}})
    monkeypatch.setattr(bm, "_default_scorer_factory", lambda cfg, role, head, progress: scorer)
    out = tmp_path / "res.csv"
    rc = main(["countercurate", "evaluate", "--config", "x.yaml", "--role", "clip", "--benchmark", "positions",
               "--data", str(path), "--out", str(out), "--out-items", str(tmp_path / "items.parquet")])
    assert rc == 0
    res = pd.read_csv(out)
    assert list(res.columns) == bm.RESULT_COLUMNS
    assert value(res, "both", "accuracy") == pytest.approx(0.6)
    assert len(pd.read_parquet(tmp_path / "items.parquet")) == 5
