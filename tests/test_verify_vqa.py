"""The VQA check (issue 47 item 1; counterfactory.filters.vqa, docs/verify.md "VQA check"): P("Yes") extraction,
the score formula, thresholds from config, batch-size invariance, resume, bad inputs and the study adapters."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from counterfactory.cli import main
from counterfactory.config import load_config
from counterfactory.errors import InputError
from counterfactory.filters import vqa
from counterfactory.studies.coco_counterfactuals import verify as coco_verify
from counterfactory.studies.social_counterfactuals import verify as social_verify

V = 64        # the stub's vocabulary
YES = 3       # the stub's id of "Yes"


# --------------------------------------------------------------------------------------------
# a stub LLaVA whose next-token logits are known: logit("Yes") = the image's mean pixel, every other logit 0
# --------------------------------------------------------------------------------------------
class StubTokenizer:
    pad_token_id, eos_token_id, bos = 0, 2, 1

    def _ids(self, text):
        return [YES if w == "Yes" else 4 + int(hashlib.sha256(w.encode()).hexdigest(), 16) % (V - 4)
                for w in text.split()]

    def __call__(self, text, add_special_tokens=True):
        ids = self._ids(text)
        return SimpleNamespace(input_ids=([self.bos] if add_special_tokens else []) + ids)


class StubProcessor:
    chat_template = None
    image_token = "<image>"

    def __init__(self):
        self.tokenizer = StubTokenizer()

    def __call__(self, text, images, return_tensors="pt"):
        pixels = torch.tensor(np.asarray(images[0], dtype=np.float32) / 255.0).permute(2, 0, 1)
        return {"input_ids": torch.tensor([self.tokenizer(text[0]).input_ids]), "pixel_values": pixels[None]}


class StubModel:
    def __init__(self):
        self.calls = 0

    def __call__(self, input_ids, attention_mask, pixel_values):
        self.calls += 1
        b, t = input_ids.shape
        logits = torch.zeros(b, t, V)
        logits[:, :, YES] = pixel_values.float().mean(dim=(1, 2, 3))[:, None] * 4.0
        return SimpleNamespace(logits=logits)


def _settings(**kw) -> vqa.VerifySettings:
    return vqa.VerifySettings.from_config({"verify": kw})


def _image(path: Path, value: int) -> str:
    Image.fromarray(np.full((4, 4, 3), value, dtype=np.uint8)).save(path)
    return str(path)


@pytest.fixture()
def pair_table(tmp_path):
    """Five pairs over images of known grey values (0, 255, 128, ...), relative paths."""
    values = [255, 0, 128, 64, 200, 10]
    for i, v in enumerate(values):
        _image(tmp_path / f"im{i}.png", v)
    rows = [{"item_id": f"p{i}", "image_path": f"im{i}.png", "caption": f"a dog number {i}",
             "partner_image_path": f"im{i + 1}.png", "partner_caption": f"a cat number {i}" if i != 2 else None}
            for i in range(5)]
    pd.DataFrame(rows).to_parquet(tmp_path / "pairs.parquet")
    return tmp_path / "pairs.parquet"


def _p_yes(value: int) -> float:
    s = value / 255.0 * 4.0
    return math.exp(s) / (math.exp(s) + V - 1)


def test_p_yes_is_the_softmax_of_the_yes_token_after_the_prompt(tmp_path):
    scorer = vqa.YesScorer(StubModel(), StubProcessor(), _settings(batch_size=2))
    images = [_image(tmp_path / "w.png", 255), _image(tmp_path / "b.png", 0), _image(tmp_path / "g.png", 128)]
    probs = scorer.probabilities(images, ["a dog", "a longer caption of a cat", "x"])
    assert probs == pytest.approx([_p_yes(255), _p_yes(0), _p_yes(128)], rel=1e-5)
    assert probs[0] > 0.45 and probs[1] == pytest.approx(1 / V)    # decisive: e^4 / (e^4 + 63) vs uniform
    prompt = scorer.prompt("a dog")
    assert prompt.endswith('USER: <image>\nDoes this image show "a dog"? Please answer yes or no. ASSISTANT:')


def test_score_formula_by_hand():
    terms = pd.DataFrame({"item_id": ["a", "b", "c"], "yes_image": [0.9, 0.9, 0.8], "yes_partner": [0.7, 0.4, np.nan],
                          "yes_image_partner_caption": [0.2, 0.1, np.nan], "yes_partner_caption": [0.3, 0.2, 0.6]})
    out = vqa.combine(terms, _settings())
    assert out["present"].tolist() == pytest.approx([0.7, 0.4, 0.8])
    assert out["absent"].tolist() == pytest.approx([0.3, 0.2, 0.6])
    assert out["score"].tolist() == pytest.approx([0.4, 0.2, 0.2])
    assert out["kept"].tolist() == [True, False, False]            # b: present 0.4 < 0.5; c: absent 0.6 > 0.5
    strict = vqa.combine(terms, _settings(min_present=0.3, max_absent=0.6, min_score=0.3))
    assert strict["kept"].tolist() == [True, False, False]         # b, c: score 0.2 < 0.3


def test_the_card_margin_is_nonnegative_exactly_when_kept():
    """A filter card of the check thresholds its margin at 0, so it measures ``kept`` itself (all three tests):
    on random terms, on terms at each threshold exactly, and with a partner-less (NaN) term."""
    rng = np.random.default_rng(0)
    grid = np.array([0.0, 0.25, 0.5, 0.75, 1.0])       # exact thresholds on the grid: the >= / <= boundaries
    for values in (rng.random((400, 4)), rng.choice(grid, (400, 4))):
        terms = pd.DataFrame(values, columns=["yes_image", "yes_partner", "yes_image_partner_caption",
                                              "yes_partner_caption"])
        terms.loc[::7, ["yes_partner", "yes_image_partner_caption"]] = np.nan
        terms.insert(0, "item_id", [str(i) for i in range(len(terms))])
        for settings in (_settings(), _settings(min_present=0.25, max_absent=0.75, min_score=0.5)):
            out = vqa.combine(terms, settings)
            assert ((vqa.margin(out, settings) >= 0) == out["kept"].to_numpy()).all()
    out = vqa.combine(pd.DataFrame({"item_id": ["x"], "yes_image": [0.3], "yes_partner": [np.nan],
                                    "yes_image_partner_caption": [np.nan], "yes_partner_caption": [0.1]}), _settings())
    assert out["score"].iloc[0] == pytest.approx(0.2) and not out["kept"].iloc[0]   # score passes, present does not
    assert vqa.margin(out, _settings()).tolist() == pytest.approx([-0.2])


def test_thresholds_and_switch_come_from_config():
    s = vqa.VerifySettings.from_config({})
    assert (s.enabled, s.role, s.answer, s.min_present, s.max_absent, s.min_score) == (False, "vlm", "Yes", 0.5, 0.5,
                                                                                      0.0)
    assert load_config(["config/config.yaml"])["verify"]["enabled"] is False
    assert load_config(["config/demo.yaml"])["verify"]["enabled"] is True
    assert vqa.VerifySettings.from_config({"verify": {"max_absent": 0.25}}).max_absent == 0.25


def test_resume_after_a_partial_shard_scores_only_the_rest(pair_table, tmp_path):
    settings = _settings(batch_size=2, checkpoint_every=2)
    out = tmp_path / "s" / "00000.parquet"
    models = []

    def factory():
        models.append(StubModel())
        return vqa.YesScorer(models[-1], StubProcessor(), settings)

    def stop(n_done):
        if n_done >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        vqa.score_shard(pair_table, out, settings, factory, {"source": "stub"}, hook=stop)
    assert not out.exists() and len(list((tmp_path / "s" / "00000.parquet.work").glob("chunk-*"))) == 1
    first_calls = models[0].calls
    table = vqa.score_shard(pair_table, out, settings, factory, {"source": "stub"})
    assert models[1].calls < first_calls * 3    # 3 items left, not 5
    full = vqa.score_shard(pair_table, tmp_path / "full.parquet", settings, factory, {"source": "stub"})
    pd.testing.assert_frame_equal(table, full)
    assert table["item_id"].tolist() == [f"p{i}" for i in range(5)]
    assert table.loc[0, "yes_image"] == pytest.approx(_p_yes(255)) and np.isnan(table.loc[2, "yes_partner"])
    assert not (tmp_path / "s" / "00000.parquet.work").exists()


def test_shards_cover_the_table_once_and_merge_in_order(pair_table, tmp_path):
    settings = _settings(shards=2)
    factory = lambda: vqa.YesScorer(StubModel(), StubProcessor(), settings)  # noqa: E731
    parts = [vqa.score_shard(pair_table, tmp_path / f"{k}.parquet", settings, factory, {}, shard=k, shards=2)
             for k in range(2)]
    assert [len(p) for p in parts] == [2, 3]
    merged = vqa.merge([tmp_path / "0.parquet", tmp_path / "1.parquet"], _settings(min_present=0.0, max_absent=1.0,
                                                                                   min_score=-1.0))
    assert merged["item_id"].tolist() == [f"p{i}" for i in range(5)] and merged["kept"].all()


def test_bad_input_names_the_file_and_the_record(pair_table, tmp_path):
    frame = pd.read_parquet(pair_table)
    frame.loc[3, "partner_image_path"] = "missing.png"
    bad = tmp_path / "bad.parquet"
    frame.to_parquet(bad)
    with pytest.raises(InputError, match=r"bad\.parquet, record row 3 \(item_id p3\): partner_image_path .*missing"):
        vqa.read_pairs(bad)
    frame = pd.read_parquet(pair_table).drop(columns=["caption"])
    frame.to_parquet(bad)
    with pytest.raises(InputError, match=r"bad\.parquet: missing column\(s\) \['caption'\]"):
        vqa.read_pairs(bad)


def test_probabilities_do_not_depend_on_the_batch_size(tmp_path):
    from counterfactory.models import tiny

    folder = tiny.build("vlm", tmp_path / "vlm")
    rng = np.random.default_rng(0)
    images = []
    for i in range(5):
        images.append(str(tmp_path / f"r{i}.png"))
        Image.fromarray(rng.integers(0, 255, (30 + 3 * i, 40, 3), dtype=np.uint8)).save(images[-1])
    captions = ["a dog", "two cats on a very long red sofa near the window", "a car", "a man above a horse", "cup"]
    cfg = {"models": {"vlm": {"source": str(folder)}}, "device": "cpu", "precision": "fp32"}
    probs = {}
    for bs in (1, 3):
        scorer = vqa.scorer_from_config(cfg, _settings(batch_size=bs))
        probs[bs] = scorer.probabilities(images, captions)
    assert np.all((probs[1] > 0) & (probs[1] < 1))
    np.testing.assert_allclose(probs[1], probs[3], rtol=1e-4, atol=0)


def test_cli_pairs_vqa_merge_on_coco_pairs_with_the_tiny_vlm(tmp_path):
    from counterfactory.models import tiny

    folder = tiny.build("vlm", tmp_path / "vlm")
    images = tmp_path / "images"
    (images / "shards").mkdir(parents=True)
    for i in range(4):
        _image(images / "shards" / f"{i}.png", 40 * i)
    pd.DataFrame({"id": ["1_0", "2_0"], "caption_0": ["a dog on a bench", "a red car"],
                  "caption_1": ["a cat on a bench", "a blue car"], "image_0": ["shards/0.png", "shards/2.png"],
                  "image_1": ["shards/1.png", "shards/3.png"], "sim_direction": [0.3, 0.4]}
                 ).to_parquet(images / "selected_pairs.parquet")
    over = tmp_path / "over.yaml"
    over.write_text(yaml.safe_dump({"models": {"vlm": {"source": str(folder)}},
                                    "verify": {"min_present": 0.0, "max_absent": 1.0, "min_score": -1.0}}))
    conf = ["--config", "config/demo.yaml", "--config", str(over)]
    verify = tmp_path / "verify"
    cand = f"candidates={images / 'selected_pairs.parquet'}"
    assert main(["verify", "pairs", "--study", "coco_counterfactuals", "--input", cand,
                 "--out", str(verify / "pairs.parquet")]) == 0
    assert main(["verify", "vqa", *conf, "--pairs", str(verify / "pairs.parquet"), "--shard", "00000",
                 "--out", str(verify / "shards" / "00000.parquet"), "--no-progress"]) == 0
    assert main(["verify", "merge", *conf, "--study", "coco_counterfactuals", "--input", cand, "--shards",
                 str(verify / "shards" / "00000.parquet"), "--out", str(verify / "vqa.parquet"),
                 "--verified", str(verify / "verified.parquet")]) == 0
    scores = pd.read_parquet(verify / "vqa.parquet")
    assert list(scores.columns) == list(vqa.SCORE_COLUMNS) and scores["item_id"].tolist() == ["1_0", "2_0"]
    verified = pd.read_parquet(verify / "verified.parquet")
    assert verified["id"].tolist() == ["1_0", "2_0"]              # every threshold open: both kept
    assert (verify / verified.loc[0, "image_0"]).resolve() == (images / "shards" / "0.png").resolve()


# --------------------------------------------------------------------------------------------
# adapters
# --------------------------------------------------------------------------------------------
def test_coco_counterfactuals_adapter(tmp_path):
    table = tmp_path / "images" / "selected_pairs.parquet"
    table.parent.mkdir()
    pd.DataFrame({"id": ["7_1", "8_0"], "caption_0": ["a dog", "a cup"], "caption_1": ["a cat", "a mug"],
                  "image_0": ["s/7_1_img_0.png", "s/8_0_img_0.png"], "image_1": ["s/7_1_img_1.png", "s/8_0_img_1.png"]}
                 ).to_parquet(table)
    rows = coco_verify.pair_rows({"candidates": str(table)})
    assert [(r["item_id"], r["caption"], r["partner_caption"]) for r in rows] == [("7_1", "a dog", "a cat"),
                                                                                  ("8_0", "a cup", "a mug")]
    assert rows[0]["partner_image_path"] == str(tmp_path / "images" / "s" / "7_1_img_1.png")
    scores = pd.DataFrame({"item_id": ["7_1", "8_0"], "kept": [False, True]})
    out = coco_verify.verified({"candidates": str(table)}, scores, tmp_path / "verify")
    assert out["id"].tolist() == ["8_0"] and out.loc[0, "image_0"] == "../images/s/8_0_img_0.png"


def test_social_counterfactuals_adapter_pairs_members_in_a_cycle(tmp_path):
    table = tmp_path / "filter" / "kept.parquet"
    table.parent.mkdir()
    members = [("s1", 0, m, f"a photo of a {a} doctor") for m, a in enumerate(["Asian", "Black", "White"])]
    members += [("s2", 3, m, f"a photo of a {a} nurse") for m, a in enumerate(["male", "female"])]
    members += [("s3", 0, 0, "a lone member")]
    frame = pd.DataFrame(members, columns=["set_id", "candidate_index", "member_index", "caption"])
    frame["image_path"] = [f"../generation/{s}_{m}.png" for s, _, m, _ in members]
    frame.to_parquet(table)
    rows = social_verify.pair_rows({"candidates": str(table)})
    assert [r["item_id"] for r in rows] == ["s1:0:0-1", "s1:0:1-2", "s1:0:2-0", "s2:3:0-1"]
    assert rows[2]["caption"] == "a photo of a White doctor" and rows[2]["partner_caption"] == "a photo of a Asian doctor"
    scores = pd.DataFrame({"item_id": [r["item_id"] for r in rows], "kept": [True, True, False, True]})
    out = social_verify.verified({"candidates": str(table)}, scores, tmp_path / "verify")
    assert out["set_id"].tolist() == ["s2", "s2"]      # s1: one pair failed; s3: no pair, not verified
    assert out.loc[0, "image_path"] == "../generation/s2_0.png"


def test_countercurate_adapter_pairs_each_dataset_row_with_its_negative_image(tmp_path):
    from counterfactory.studies.countercurate import verify as cc_verify

    paths = {}
    for name, neg in (("positions", "negative_caption"), ("attributes", "negative")):
        paths[name] = str(tmp_path / f"{name}.parquet")
        pd.DataFrame({"item_id": ["1", "2"], "image_path": ["/d/a.jpg", "/d/b.jpg"],
                      "caption": ["a dog left of a cat", "a red car"], neg: ["a cat left of a dog", "a blue car"],
                      "negative_image": ["/g/1.png", "/g/2.png"]}).to_parquet(paths[name])
    rows = cc_verify.pair_rows(paths)
    assert [r["item_id"] for r in rows] == ["positions:1", "positions:2", "attributes:1", "attributes:2"]
    assert rows[3]["partner_caption"] == "a blue car" and rows[3]["partner_image_path"] == "/g/2.png"
    scores = pd.DataFrame({"item_id": [r["item_id"] for r in rows], "kept": [True, False, False, True]})
    out = cc_verify.verified(paths, scores, tmp_path)
    assert list(zip(out["dataset"], out["item_id"])) == [("positions", "1"), ("attributes", "2")]


def test_cvld_adapter_pairs_each_kept_edit_with_its_original(tmp_path):
    from counterfactory.studies.cvld import verify as cvld_verify

    edits = tmp_path / "edits" / "ip2p" / "edits.parquet"
    edits.parent.mkdir(parents=True)
    pd.DataFrame({"item_id": ["coco_1", "coco_1", "coco_2"], "candidate": [0, 1, 0], "kept": [True, False, True],
                  "path": ["00000/a.png", "00000/b.png", "00000/c.png"]}).to_parquet(edits)
    requests = tmp_path / "edits" / "requests.parquet"
    pd.DataFrame({"item_id": ["coco_1", "coco_2"], "image_path": ["/d/1.jpg", "/d/2.jpg"],
                  "source_prompt": ["A woman with a cup.", "A man on a horse."],
                  "target_prompt": ["A man with a cup.", "A woman on a horse."]}).to_parquet(requests)
    inputs = {"candidates": str(edits), "requests": str(requests)}
    rows = cvld_verify.pair_rows(inputs)
    assert [(r["item_id"], r["caption"], r["partner_caption"]) for r in rows] == [
        ("coco_1:0", "A woman with a cup.", "A man with a cup."), ("coco_2:0", "A man on a horse.", "A woman on a horse.")]
    assert rows[1]["partner_image_path"] == str(edits.parent / "00000" / "c.png")
    out = cvld_verify.verified(inputs, pd.DataFrame({"item_id": ["coco_1:0", "coco_2:0"], "kept": [False, True]}),
                               tmp_path / "verify")
    assert out["item_id"].tolist() == ["coco_2"] and out.loc[0, "path"] == "../edits/ip2p/00000/c.png"


def test_spurious_retrieval_adapter_pairs_each_photograph_with_its_inpainting(tmp_path):
    """Issue 47: the original with "a <removed class>", the inpainted image as partner, no partner caption (a
    one-sided edit); the verified variant keeps the kept items, paths relative to the verify folder."""
    from counterfactory.studies.spurious_retrieval import verify as sr_verify

    requests = tmp_path / "coco" / "selection" / "requests.parquet"
    requests.parent.mkdir(parents=True)
    pd.DataFrame({"item_id": ["i1", "i2"], "image_path": ["/d/1.jpg", "/d/2.jpg"], "category": ["dog", "umbrella"],
                  "removed_categories": [["dog"], ["umbrella", "person"]]}).to_parquet(requests)
    shard = tmp_path / "coco" / "images" / "lama" / "00000" / "shard.parquet"
    shard.parent.mkdir(parents=True)
    pd.DataFrame({"item_id": ["i2", "i1"], "output_path": ["i2.png", "i1.png"]}).to_parquet(shard)
    inputs = {"coco:requests": str(requests), "coco:lama:00000": str(shard)}
    rows = sr_verify.pair_rows(inputs)
    assert [(r["item_id"], r["image_path"], r["caption"], r["partner_caption"]) for r in rows] == [
        ("coco:i2", "/d/2.jpg", "an umbrella", None), ("coco:i1", "/d/1.jpg", "a dog", None)]
    assert rows[1]["partner_image_path"] == str(shard.parent / "i1.png")
    frame = vqa.pair_frame(rows, tmp_path / "verify")
    assert frame["partner_caption"].isna().all()           # the one-sided form of the score
    out = sr_verify.verified(inputs, pd.DataFrame({"item_id": ["coco:i1", "coco:i2"], "kept": [False, True]}),
                             tmp_path / "verify")
    assert out["item_id"].tolist() == ["coco:i2"] and out.loc[0, "removed_categories"] == ["umbrella", "person"]
    assert out.loc[0, "image"] == "../coco/images/lama/00000/i2.png"
    with pytest.raises(InputError, match="requests"):
        sr_verify.pair_rows({"coco:lama:00000": str(shard)})
