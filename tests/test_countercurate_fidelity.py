"""CounterCurate faithful to the paper (round 2): the LLaVA two-option protocol (§4.2-4.4, app. E), training on the
curated sets with the final checkpoint (§4.1, §4.2), Flickr30k-Attributes grouping (§3.5)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from counterfactory.studies.countercurate import benchmarks as bm
from counterfactory.studies.countercurate import vlm

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "resources" / "demo"
SC = {"root": str(DEMO / "sugarcrepe" / "data"), "images": str(DEMO / "coco2017" / "val2017")}
WG = {"examples": str(DEMO / "winoground" / "examples.jsonl"), "images": str(DEMO / "winoground" / "images")}


class ChoiceScorer:
    """A generative scorer: its *choice* picks the caption in ``right`` (a caption or an (image, caption) pair; a
    tie when neither or both are), its
    caption *likelihood* prefers the shorter caption (the length bias of summed log-likelihoods)."""

    name = "fake-vlm"

    def __init__(self, protocol: str, right: set):
        self.settings = SimpleNamespace(protocol=protocol)
        self.right, self.asked = right, []

    def choice_table(self, images, a, b, order=None, seed=None, keys=None):
        self.asked.append((list(images), list(a), list(b)))
        ok = lambda image, text: text in self.right or (image, text) in self.right  # noqa: E731
        margin = np.array([ok(i, x) - ok(i, y) for i, x, y in zip(images, a, b)], dtype=float)
        return pd.DataFrame({"margin": margin})

    def choose(self, images, a, b, order=None, seed=None, keys=None):
        return self.choice_table(images, a, b, order, seed, keys)["margin"].to_numpy()

    def score_pairs(self, images, texts):
        return np.array([-float(len(t)) for t in texts])


POSITIONS = (("a", "a long dog is to the left of a cat", "a dog is right of a cat", "LR"),
             ("b", "a cup is above a plate", "a plate is above a cup", "AB"),
             ("c", "a man is above a very tall horse", "a horse is above a man", "AB"))


def _positions(tmp_path: Path) -> Path:
    rows = [{"image_id": k, "image_path": f"{k}.jpg", "negative_image_path": f"{k}_neg.jpg", "caption": c,
             "negative_caption": n, "subset": s, "split": "test"} for k, c, n, s in POSITIONS]
    pd.DataFrame(rows).to_parquet(tmp_path / "positions.parquet")
    return tmp_path / "positions.parquet"


def _value(results, subset, metric):
    hit = results[(results["subset"] == subset) & (results["metric"] == metric)]
    assert len(hit) == 1, (subset, metric, results)
    return float(hit["value"].iloc[0])


def test_vlm_choice_protocol_on_every_benchmark(tmp_path):
    """§4.2: LLaVA chooses between the positive and the negative caption given the ground-truth image (not a
    caption likelihood); SugarCrepe, LookTwice (§4.3, §4.4) and Winoground's text score (app. E) the same way."""
    cfg = {"benchmarks": {"positions": {"table": str(_positions(tmp_path))}, "sugarcrepe": SC, "winoground": WG}}
    right = {POSITIONS[0][1], POSITIONS[2][1], POSITIONS[1][2]}  # item b: the model picks the negative
    choice = ChoiceScorer("choice", right)
    res, items = bm.evaluate(cfg, "vlm", "positions", scorer=choice)
    assert res.set_index(["subset", "metric"])["value"].to_dict() == {
        ("LR", "accuracy"): 1.0, ("AB", "accuracy"): 0.5, ("both", "accuracy"): pytest.approx(2 / 3)}
    assert choice.asked == [([str(tmp_path / f"{k}.jpg") for k in "abc"],  # one question, on the true image
                             [r[1] for r in POSITIONS], [r[2] for r in POSITIONS])]
    assert items["m_i"].tolist() == [1.0, -1.0, 1.0]
    like, _ = bm.evaluate(cfg, "vlm", "positions", scorer=ChoiceScorer("likelihood", right))
    assert _value(like, "both", "accuracy") == pytest.approx(1 / 3)  # length bias: the shorter caption wins
    # SugarCrepe: the choice follows the model's pick, the likelihood the caption lengths
    sugar = bm.load_benchmark(cfg, "sugarcrepe")
    pos = set(zip(sugar["image_path"], sugar["caption"]))
    sc, _ = bm.evaluate(cfg, "vlm", "sugarcrepe", scorer=ChoiceScorer("choice", pos))
    assert _value(sc, "average", "accuracy") == pytest.approx(14 / 15)  # the fixture's identical pair ties
    sc_like, _ = bm.evaluate(cfg, "vlm", "sugarcrepe", scorer=ChoiceScorer("likelihood", pos))
    shorter = (sugar["caption"].str.len() < sugar["negative_caption"].str.len()).mean()
    assert _value(sc_like, "average", "accuracy") == pytest.approx(shorter) and shorter < 14 / 15
    # Winoground: each image chooses between the two captions; Table 7's text score only
    wg_items = bm.load_benchmark(cfg, "winoground")
    scorer = ChoiceScorer("choice", set(wg_items["caption_0"].iloc[:1]) | set(wg_items["caption_1"].iloc[1:2]))
    wg, _ = bm.evaluate(cfg, "vlm", "winoground", scorer=scorer)
    assert set(wg["metric"]) == {"text_score"}
    images, a, b = scorer.asked[0]
    c0, c1 = wg_items["caption_0"].tolist(), wg_items["caption_1"].tolist()
    assert images == wg_items["image_0_path"].tolist() + wg_items["image_1_path"].tolist()
    assert (a, b) == (c0 + c1, c1 + c0)
    # ex 0: I0 picks C0, I1 picks C0 -> wrong; ex 1: I0 picks C1 -> wrong; ex 2: identical captions tie -> wrong
    assert _value(wg, "all", "text_score") == 0.0


def test_option_order_depends_on_the_item_not_its_row(tmp_path):
    """The authors' per-item coin (which option the positive is), drawn from the seed and the item itself, so
    pre-trained and fine-tuned models (and any subset or order of a benchmark) get the same questions."""
    keys = vlm.item_keys([f"/img/{i}.jpg" for i in range(40)], [f"c{i}" for i in range(40)], ["n"] * 40)
    first = vlm.option_a_first(keys, 0)
    assert 10 < first.sum() < 30  # a fair coin, not always A
    np.testing.assert_array_equal(vlm.option_a_first(keys[::-1], 0), first[::-1])
    np.testing.assert_array_equal(vlm.option_a_first(keys[5:9], 0), first[5:9])
    assert not np.array_equal(vlm.option_a_first(keys, 1), first)
    moved = vlm.item_keys([f"/elsewhere/{i}.jpg" for i in range(40)], [f"c{i}" for i in range(40)], ["n"] * 40)
    np.testing.assert_array_equal(vlm.option_a_first(moved, 0), first)  # the data's folder does not matter
    assert vlm.VlmSettings.defaults().protocol == "choice" and vlm.VlmSettings.defaults().choice_order == "random"


@pytest.mark.parametrize("answer, expected", [
    ("B", "B"), ("(a)", "A"), ("b.", "B"), ("Option B", "B"), ("The answer is A", "A"), ("A. a dog on a bench", "A"),
    ("Answer: b", "B"), ("a dog on a bench", "A"), ("A bench on a dog.", "B"), ("a cat", None), ("", None),
    ("a dog on a bench or a bench on a dog", None)])
def test_parse_choice(answer, expected):
    assert vlm.parse_choice(answer, "a dog on a bench", "a bench on a dog") == expected


# ------------------------------------------------------------------------------------------------------------------
# training data, checkpoint (§4.1, §4.2) and Attributes grouping (§3.5)
# ------------------------------------------------------------------------------------------------------------------
def _png(path: Path, seed: int) -> str:
    from PIL import Image

    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def curated(tmp_path_factory) -> Path:
    """Positions (4 train + 1 test items), Counting (5 items), Attributes (caption of image 300 with its noun,
    adjective and swap negatives; image 301 with one) under datasets/."""
    root = tmp_path_factory.mktemp("curated")
    img, out = root / "images", root / "datasets"
    img.mkdir()
    out.mkdir()
    pos = [{"item_id": f"p{i}", "image_id": str(100 + i), "image_path": _png(img / f"{100 + i}.jpg", i),
            "caption": f"a dog {i} is left of a cat", "negative_caption": f"a dog {i} is right of a cat",
            "negative_image": _png(img / f"p{i}_neg.png", 50 + i), "subset": "LR",
            "split": "test" if i == 4 else "train"} for i in range(5)]
    pd.DataFrame(pos).to_parquet(out / "positions.parquet")
    cnt = [{"item_id": f"c{i}", "image_id": str(200 + i), "image_path": _png(img / f"{200 + i}.jpg", 100 + i),
            "caption": f"there are {i + 1} cups", "negative_caption": f"there are {i + 2} cups",
            "negative_image": _png(img / f"c{i}_neg.png", 150 + i)} for i in range(5)]
    pd.DataFrame(cnt).to_parquet(out / "counting.parquet")
    att = []
    for i, (image, kind) in enumerate([(300, "noun"), (300, "adjective"), (301, "noun"), (300, "swap")]):
        _png(img / f"{image}.jpg", image)
        att.append({"item_id": f"a{i}", "image_id": str(image), "caption": f"a red car near a tree {image}",
                    "negative": f"a {kind} change {image}", "kind": kind, "status": "accepted",
                    "negative_image": _png(img / f"a{i}_neg.png", 200 + i)})
    pd.DataFrame(att).to_parquet(out / "attributes.parquet")
    return root


def test_paper_config_trains_on_the_curated_sets(curated, tmp_path):
    """§4.1 / §4.2: Positions' 4:1 train split, all of Counting and Attributes, no validation split; our held-out
    20 % + 10 % is an option."""
    from counterfactory.studies.countercurate import manifests as mf
    from counterfactory.studies.countercurate import training as tr

    s = tr.settings({})
    assert (s["train_fraction"], s["val_fraction"], s["checkpoint"]) == (1.0, 0.0, "final")
    cfg = {"data": {"images": str(curated / "images")}}
    summary = mf.write_manifests(curated / "datasets", tmp_path / "paper", cfg).set_index(["dataset", "variant",
                                                                                          "split"])
    assert summary.loc[("counting", "grouping", "train"), "pairs"] == 5  # every Counting item
    assert summary.loc[("attributes", "grouping", "train"), "images"] == 2
    assert summary.loc[("positions", "grouping", "train"), "pairs"] == 4  # the test item stays out
    assert (summary.xs("val", level="split")["rows"] == 0).all()
    assert set(pd.read_csv(tmp_path / "paper" / "counting_images.csv")["split"]) == {"train"}
    ours = {**cfg, "training": {"train_fraction": 0.8, "val_fraction": 0.25}}
    summary = mf.write_manifests(curated / "datasets", tmp_path / "ours", ours).set_index(["dataset", "variant",
                                                                                         "split"])
    assert summary.loc[("counting", "grouping", "train"), "pairs"] == 3  # 4 of 5 images, then 1 to validation
    assert summary.loc[("counting", "grouping", "val"), "pairs"] == 1


def test_attributes_positive_is_grouped_with_its_negatives(curated):
    """§3.5: a positive and all its negatives form one batch group; the positive is in a batch once."""
    from counterfactory.studies.countercurate import manifests as mf
    from counterfactory.studies.countercurate import training as tr
    from counterfactory.training.data import step_plan

    pairs = mf.read_dataset(curated / "datasets" / "attributes.parquet", "attributes",
                            {"data": {"images": str(curated / "images")}}).assign(split="train")
    frame = mf.manifest_frame(pairs, "grouping", "attributes")
    assert frame["pair_id"].tolist() == ["a0"] * 4 + ["a2"] * 2  # image 300: caption + noun, adjective, swap
    assert frame["is_counterfactual"].tolist() == [False, True, True, True, False, True]
    assert frame["caption"].tolist()[1:4] == ["a noun change 300", "a adjective change 300", "a swap change 300"]
    group_rows = int(frame.groupby("pair_id").size().max())
    section = tr.training_section({}, "attributes", "grouping", len(frame), group_rows)
    assert section["batch_size"] == 256 * 4  # 256 positives, each with its (up to) three negatives
    for data_seed in range(4):
        for batch in step_plan(frame, 4, 3, data_seed, "grouping"):
            rows = frame.iloc[list(batch.rows)]
            positives = rows[~rows["is_counterfactual"]]
            assert positives["caption"].is_unique  # a positive appears once per batch
            assert set(rows["pair_id"]) == set(positives["pair_id"])  # its negatives ride with it
            assert rows.groupby("pair_id").size().to_dict() == {
                k: int((frame["pair_id"] == k).sum()) for k in set(rows["pair_id"])}
    plain = mf.manifest_frame(pairs, "no_grouping", "attributes")
    assert (~plain["is_counterfactual"]).sum() == 2  # without grouping too: each positive once in the data


def test_paper_config_keeps_the_final_checkpoint(curated, tmp_path):
    """§4.1: a fixed number of epochs, the final weights kept (validation only after the last step, so the only
    checkpoint is the final one); ``checkpoint: best_val`` (ours) keeps validating every ``eval_every`` steps."""
    import json

    from counterfactory.models import tiny
    from counterfactory.studies.countercurate import manifests as mf
    from counterfactory.studies.countercurate import training as tr

    tiny.build("clip_open_clip", tmp_path / "models")
    training = {"datasets": ["positions"], "variants": ["grouping"], "vlm": {"datasets": []},
                "common": {"max_steps": 3, "eval_every": 1, "dataloader_workers": 0},
                "positions": {"batch_size": 1, "lr": 1e-3}}
    cfg = {"data": {"images": str(curated / "images")}, "training": training, "device": "cpu",
           "models": {"clip_open_clip": {"source": str(tmp_path / "models" / "clip_open_clip"),
                                         "library": "open_clip"}},
           "benchmarks": {"positions": {"table": str(curated / "datasets" / "positions.parquet")}}}
    mf.write_manifests(curated / "datasets", tmp_path / "m", cfg)
    manifest = tmp_path / "m" / "positions_grouping.parquet"
    tr.train_run(cfg, "positions", "grouping", manifest, 0, 1, tmp_path / "final")
    history = pd.read_csv(tmp_path / "final" / "history.csv")
    run = json.loads((tmp_path / "final" / "run.json").read_text())
    assert len(history) == 3 and history["val_loss"].notna().tolist() == [False, False, True]
    assert run["best_step"] == run["steps"] == 3
    frame = pd.read_parquet(manifest)
    section = tr.training_section(cfg, "positions", "grouping", len(frame))
    assert section["eval_every"] == 1 and tr.final_eval_every(frame, section, 1) == 3  # best_val keeps eval_every


def test_vlm_family_keeps_the_final_weights(curated, tmp_path, monkeypatch):
    """§4.1 (LLaVA-1.5: 1 epoch): no validation-based selection in the paper config, even with a val split."""
    from counterfactory.studies.countercurate import manifests as mf
    from counterfactory.studies.countercurate import training as tr
    from counterfactory.studies.countercurate import vlm_finetune

    seen = []
    monkeypatch.setattr(vlm_finetune, "train_run", lambda cfg, data, out, seed, role, val_data, progress:
                        seen.append(val_data))
    monkeypatch.setattr(tr, "score_run", lambda *a, **k: pd.DataFrame())
    base = {"data": {"images": str(curated / "images")}, "models": {"vlm": {"source": "x"}}}
    for checkpoint in ("final", "best_val"):
        cfg = {**base, "training": {"datasets": ["counting"], "variants": ["grouping"], "val_fraction": 0.4,
                                    "checkpoint": checkpoint}}
        mf.write_manifests(curated / "datasets", tmp_path / checkpoint, cfg)
        tr.vlm_train_run(cfg, "counting", tmp_path / checkpoint, 0, tmp_path / f"run_{checkpoint}")
    assert seen[0] is None and Path(seen[1]).name == "counting_conversation_val.parquet"


def test_table5_retrieval_and_table7_winoground_of_the_finetuned_models(tmp_path, monkeypatch):
    """§4.5 Table 5: MS-COCO retrieval of the Attributes-tuned CLIP (and its pre-trained row); app. E Table 7: the
    Attributes-tuned models are also scored on Winoground."""
    from counterfactory.evaluation import runs as ev_runs
    from counterfactory.studies.countercurate import training as tr

    assert tr.settings({})["benchmarks"]["attributes"] == ["sugarcrepe", "winoground"]
    scored, retrieved = [], []
    monkeypatch.setattr(bm, "evaluate", lambda cfg, role, name, **kw: (scored.append(name) or pd.DataFrame(
        [{"model": kw["model"], "benchmark": name, "subset": "all", "metric": "accuracy", "value": 0.5, "n": 2}]),
        None))
    monkeypatch.setattr(ev_runs, "evaluate_retrieval", lambda cfg, role, spec, progress=False: retrieved.append(
        (role, cfg["models"][role]["source"])) or {"coco/text_to_image@1": 40.0, "coco/image_to_text@1": 55.0})
    spec = {"name": "coco", "karpathy_json": "dataset_coco.json", "image_root": "coco", "split": "test", "ks": [1, 5]}
    cfg = {"models": {"clip_open_clip": {"source": "base"}, "vlm": {"source": "llava"}},
           "training": {"retrieval": spec}}
    rows = tr.score_run(cfg, "clip_open_clip", tmp_path / "ckpt", "attributes", "grouping", 0, 1, tmp_path / "a")
    assert scored == ["sugarcrepe", "winoground"] and retrieved == [("clip_open_clip", str(tmp_path / "ckpt"))]
    assert rows.set_index("metric")["value"]["coco/text_to_image@1"] == 40.0
    tr.score_run(cfg, "vlm", None, "attributes", "pretrained", 0, 0, tmp_path / "v")  # Table 5 is CLIP's
    tr.score_run(cfg, "clip_open_clip", None, "positions", "pretrained", 0, 0, tmp_path / "p")  # Attributes only
    assert len(retrieved) == 1


def test_paper_config_states_the_papers_protocol():
    """config/config.yaml: the LLaVA choice protocol, training on the curated sets with the final weights, Table 3's
    NegCLIP (an OpenCLIP checkpoint) among the evaluated roles, Table 5's MS-COCO retrieval."""
    from counterfactory.config import load_config
    from counterfactory.models import registry
    from counterfactory.studies.countercurate import training as tr

    full = load_config([str(REPO / "config" / "config.yaml")])
    cfg = load_config([str(REPO / "config" / "config.yaml")], study="countercurate")
    assert (cfg["vlm"]["protocol"], cfg["vlm"]["choice_order"]) == ("choice", "random")
    s = tr.settings(cfg)
    assert (s["train_fraction"], s["val_fraction"], s["checkpoint"]) == (1.0, 0.0, "final")
    assert s["retrieval"]["ks"] == [1, 5] and s["retrieval_datasets"] == ["attributes"]
    assert "negclip" in cfg["evaluation"]["roles"]
    spec = registry.model_spec(full, "negclip")
    assert (spec.library, spec.source) == ("open_clip", "ViT-B-32") and spec.pretrained.endswith(".pth")
