"""Scorer adapters on tiny randomly initialised models of the real classes (built offline, loaded by path)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from counterfactory.errors import ConfigError, InputError, ModelLoadError
from counterfactory.models import loaders_eval, tiny_eval, tiny_vision
from counterfactory.models.registry import ModelSpec
from counterfactory.scorers import (BlipItmScorer, BridgeTowerItcScorer, BridgeTowerItmScorer, DualEncoderScorer,
                                    FlavaItcScorer, FlavaItmScorer, HFClipScorer, ItmScorer, OpenClipScorer,
                                    ViltItmScorer, scorer_from_config, wrap_model)

ROLES = ("itm_vilt", "itm_blip", "itm_flava", "itm_bridgetower", "clip_open_clip", "clip_eval")
TEXTS = ["a dog on the beach.", "two cats sitting on a red couch", "A man riding a horse",
         "pizza", "a photo of a bicycle near the tree with many people standing next to it"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_eval")
    for role in ROLES:
        builder = tiny_vision.build_clip if role == "clip_eval" else tiny_eval.BUILDERS[role]
        builder(out / role, 0)
    return out


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)) for _ in range(5)]


def _load(model_dir, role, head="itm"):
    lib = "open_clip" if role == "clip_open_clip" else "transformers"
    spec = ModelSpec(role=role, source=str(model_dir / role), library=lib)
    if lib == "open_clip":
        return loaders_eval.load_open_clip(spec, {})
    if role == "clip_eval":
        from counterfactory.models.registry import _load_hf_clip

        return _load_hf_clip(spec, {})
    return loaders_eval.load_itm_transformers(spec, {"head": head})


@pytest.fixture(scope="module")
def loaded(model_dir):
    return {role: _load(model_dir, role) for role in ROLES}


EXPECTED = {"itm_vilt": ViltItmScorer, "itm_blip": BlipItmScorer, "itm_flava": FlavaItmScorer,
            "itm_bridgetower": BridgeTowerItmScorer, "clip_open_clip": OpenClipScorer, "clip_eval": HFClipScorer}


@pytest.mark.parametrize("role", ROLES)
def test_shapes_pairs_and_batch_size_consistency(loaded, images, role):
    scorer = wrap_model(loaded[role], name=role, batch_size=2, progress=False)
    assert type(scorer) is EXPECTED[role]
    m = scorer.score_matrix(images[:3], TEXTS[3:])  # a short and a long text: padding differs per batch
    assert m.shape == (3, 2) and m.dtype == np.float32 and np.isfinite(m).all()
    # arbitrary index pairs pick the matrix entries
    ii, tt = np.array([2, 0, 1]), np.array([0, 1, 1])
    np.testing.assert_allclose(scorer.score_index_pairs(images[:3], TEXTS[3:], ii, tt), m[ii, tt],
                               rtol=1e-4, atol=1e-5)
    # scores do not depend on the batch size (padding is masked)
    scorer.batch_size = 6
    np.testing.assert_allclose(scorer.score_matrix(images[:3], TEXTS[3:]), m, rtol=1e-4, atol=1e-5)
    scorer.batch_size = 1
    p = scorer.score_pairs(images[:2], TEXTS[3:])
    assert p.shape == (2,)
    np.testing.assert_allclose(p, np.diag(m[:2]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("role,head", [("clip_eval", "itm"), ("clip_open_clip", "itm"), ("itm_flava", "itc"),
                                       ("itm_blip", "itc"), ("itm_bridgetower", "itc")])
def test_dual_encoders_normalised_and_scaled(model_dir, images, role, head):
    scorer = wrap_model(_load(model_dir, role, head), name=role, head=head, batch_size=3, progress=False)
    assert scorer.dual and isinstance(scorer, DualEncoderScorer)
    ie, te = scorer.encode_images(images), scorer.encode_texts(TEXTS)
    assert ie.shape[0] == 5 and te.shape[0] == 5 and ie.shape[1] == te.shape[1]
    np.testing.assert_allclose(np.linalg.norm(ie, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(te, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(scorer.score_matrix(images, TEXTS), scorer.logit_scale * ie @ te.T, rtol=1e-5, atol=1e-5)
    scorer.batch_size = 5
    np.testing.assert_allclose(scorer.encode_texts(TEXTS), te, atol=1e-5)
    assert scorer.logit_scale > 0


def test_flava_itm_matches_pretraining_forward(loaded, images):
    model, processor = loaded["itm_flava"]
    scorer = wrap_model(loaded["itm_flava"], name="flava", progress=False)
    inputs = processor(images=images[:2], text=TEXTS[:2], padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = model(**inputs, return_loss=False).itm_logits[:, 1].numpy()
    np.testing.assert_allclose(scorer.score_pairs(images[:2], TEXTS[:2]), ref, rtol=1e-4, atol=1e-5)
    assert isinstance(wrap_model(loaded["itm_flava"], name="f", head="itc", progress=False), FlavaItcScorer)


def test_blip_itm_matches_model_forward(loaded, images):
    model, processor = loaded["itm_blip"]
    scorer = wrap_model(loaded["itm_blip"], name="blip", progress=False)
    inputs = processor(images=images[:2], text=TEXTS[:2], padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = model(**inputs, use_itm_head=True).itm_score[:, 1].numpy()
    np.testing.assert_allclose(scorer.score_pairs(images[:2], TEXTS[:2]), ref, rtol=1e-4, atol=1e-5)


def test_vilt_and_bridgetower_match_model_forward(loaded, images):
    for role, pick in (("itm_vilt", 0), ("itm_bridgetower", 1)):
        model, processor = loaded[role]
        scorer = wrap_model(loaded[role], name=role, progress=False)
        inputs = processor(images=images[:2], text=TEXTS[:2], padding=True, return_tensors="pt")
        with torch.no_grad():
            ref = model(**inputs).logits[:, pick].numpy()
        np.testing.assert_allclose(scorer.score_pairs(images[:2], TEXTS[:2]), ref, rtol=1e-4, atol=1e-5)


def test_bridgetower_itc_text_embedding_does_not_depend_on_image(model_dir, images):
    loaded = _load(model_dir, "itm_bridgetower", head="itc")
    scorer = wrap_model(loaded, name="bt", head="itc", progress=False)
    assert isinstance(scorer, BridgeTowerItcScorer)
    model, processor = loaded
    te = scorer.encode_texts(TEXTS[:2])
    for pair in (images[:2], images[2:4]):
        inputs = processor(images=pair, text=TEXTS[:2], padding=True, return_tensors="pt")
        with torch.no_grad():
            out = model(**inputs)
        np.testing.assert_allclose(out.text_embeds.numpy(), te, atol=1e-5)


def test_probability_scores_and_vilt_has_no_itc_head(loaded, images, caplog):
    s = wrap_model(loaded["itm_bridgetower"], name="bt", itm_score="probability", progress=False)
    p = s.score_pairs(images[:3], TEXTS[:3])
    assert ((p > 0) & (p < 1)).all()
    with caplog.at_level(logging.WARNING):
        vilt = wrap_model(loaded["itm_vilt"], name="vilt", head="itc", progress=False)
    assert isinstance(vilt, ViltItmScorer) and "no contrastive" in caplog.text
    with pytest.raises(ConfigError, match="itm_score"):
        wrap_model(loaded["itm_vilt"], name="vilt", itm_score="softmax", progress=False)


def test_errors(loaded, images, tmp_path, model_dir):
    s = wrap_model(loaded["itm_vilt"], name="vilt", max_exhaustive_pairs=10, progress=False)
    assert isinstance(s, ItmScorer)
    with pytest.raises(ValueError, match="aligned"):
        s.score_pairs(images[:2], TEXTS[:3])
    with pytest.raises(ConfigError, match="shortlist"):
        s.score_matrix(images, TEXTS)
    with pytest.raises(InputError, match="missing.png"):
        s.score_pairs([tmp_path / "missing.png"], ["a dog"])
    from transformers import BertConfig

    BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
               intermediate_size=8).save_pretrained(tmp_path / "bert")
    with pytest.raises(ModelLoadError, match="no image-text matching adapter"):
        loaders_eval.load_itm_transformers(ModelSpec("itm", str(tmp_path / "bert"), "transformers"), {})
    with pytest.raises(ModelLoadError, match="library: open_clip"):
        loaders_eval.load_itm_transformers(ModelSpec("x", str(model_dir / "clip_open_clip"), "transformers"), {})


def test_scorer_from_config_uses_registry_and_device(model_dir):
    cfg = {"device": "cpu", "precision": "fp32",
           "models": {"itm_flava": {"source": str(model_dir / "itm_flava")},
                      "itm": {"source": str(model_dir / "itm_bridgetower")},
                      "clip_open_clip": {"source": str(model_dir / "clip_open_clip"), "library": "open_clip"}},
           "evaluation": {"batch_size": 7, "scorers": {"itm_flava": {"batch_size": 3}}}}
    flava = scorer_from_config(cfg, "itm_flava", progress=False)
    assert isinstance(flava, FlavaItmScorer) and flava.batch_size == 3 and flava.device.type == "cpu"
    assert isinstance(scorer_from_config(cfg, "itm_flava", head="itc", progress=False), FlavaItcScorer)
    bt = scorer_from_config(cfg, "itm", head="itc", progress=False)
    assert isinstance(bt, BridgeTowerItcScorer) and bt.batch_size == 7
    assert isinstance(scorer_from_config(cfg, "itm", progress=False), BridgeTowerItmScorer)
    assert isinstance(scorer_from_config(cfg, "clip_open_clip", progress=False), OpenClipScorer)


def test_tiny_wordpiece_tokenizer_round_trip(model_dir):
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(model_dir / "itm_vilt")
    ids = proc.tokenizer("A photo of a dog on the beach.")["input_ids"]
    tokens = proc.tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "[UNK]" not in tokens
    assert "dog" in tokens and "beach" in tokens


def test_paper_config_figure3_bridgetower_is_the_itm_script_checkpoint():
    """Issue 42 item 11: Figure 3's ITM score differences use the checkpoint of the authors' ITM-score script,
    BridgeTower/bridgetower-large-itm-mlm (role itm); ITR (Table 2) and A.1 keep bridgetower-large-itm-mlm-itc."""
    from counterfactory.config import load_config

    repo = Path(__file__).resolve().parents[1]
    view = load_config([repo / "config" / "config.yaml"], study="coco_counterfactuals")
    models = view["models"]
    itm_roles, itr_roles = view["evaluation"]["itm"]["models"], view["evaluation"]["itr"]["models"]
    bridgetower_itm = [r for r in itm_roles if "bridgetower" in models[r]["source"].lower()]
    assert [models[r]["source"] for r in bridgetower_itm] == ["BridgeTower/bridgetower-large-itm-mlm"]
    assert models["itm_bridgetower"]["source"] == "BridgeTower/bridgetower-large-itm-mlm-itc" and "itm_bridgetower" in itr_roles
    assert models[bridgetower_itm[0]]["display_name"] == "BridgeTower"
    demo = load_config([repo / "config" / "config.yaml", repo / "config" / "demo.yaml"], study="coco_counterfactuals")
    assert demo["evaluation"]["itm"]["models"] == itm_roles and demo["models"]["itm"]["source"].startswith("resources/")
