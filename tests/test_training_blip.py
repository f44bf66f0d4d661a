"""BLIP (``BlipForImageTextRetrieval``) fine-tuning with its own ITC + ITM objective (Kim et al. 2023 §4.1)
on the tiny BLIP of the evaluation roles."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from counterfactory import training
from counterfactory.errors import ConfigError
from counterfactory.models import registry
from counterfactory.training import model as model_mod

ROLE = "itm_blip"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """6 pairs: original + counterfactual, distinct noisy-colour images and captions."""
    from counterfactory.testing import pair_images

    root = tmp_path_factory.mktemp("imgs")
    return root, pair_images(root, ["red", "green", "blue", "yellow", "purple", "orange"], step=30)


def cfg_of(path):
    return {"models": {ROLE: {"source": str(path)}}}


def adapter(path):
    from counterfactory.training.runs import _adapter

    return _adapter(cfg_of(path), ROLE)


def settings(**kw):
    base = dict(lr=1e-3, batch_size=4, eval_batch_size=4, epochs=1, eval_every=1000, seed=1, data_seed=2,
                objective="plain")   # the in-batch objective (the official one: tests/test_blip_objective.py)
    return training.TrainSettings(**{**base, **kw})


def batch_of(a, root, frame, rows):
    images = [Image.open(root / p).convert("RGB") for p in frame["image_path"].iloc[rows]]
    return {**a.image_inputs(images), **a.tokens(frame["caption"].iloc[rows].tolist())}


def test_kind_processor_and_forward(tiny_blip, dataset):
    root, frame = dataset
    a = adapter(tiny_blip)
    assert a.kind == "blip" and training.model_kind(a.model, "transformers") == "blip"
    assert model_mod.KINDS["BlipForImageTextRetrieval"] == "blip"
    assert a.max_length == a.model.config.text_config.max_position_embeddings  # 77 capped to the tiny's 40
    batch = batch_of(a, root, frame, range(5))
    assert set(batch) == {"pixel_values", "input_ids", "attention_mask"}
    assert batch["pixel_values"].shape == (5, 3, 32, 32) and batch["input_ids"].shape == (5, a.max_length)
    assert isinstance(a.module.blip_temp, torch.nn.Parameter)
    assert float(a.module.blip_temp.detach()) == pytest.approx(0.07)
    assert "blip_temp" in dict(a.module.named_parameters())
    out = a.module(**batch)
    dim = a.model.config.image_text_hidden_size
    assert out["image_embeds"].shape == out["text_embeds"].shape == (5, dim)
    for k in ("image_embeds", "text_embeds"):
        torch.testing.assert_close(out[k].norm(dim=-1), torch.ones(5))
    assert float(out["logit_scale"].detach()) == pytest.approx(1 / 0.07)
    assert out["itm_loss"].shape == () and math.isfinite(float(out["itm_loss"].detach()))
    # the same embeddings as the HF class's ITC path (use_itm_head=False scores their cosine)
    with torch.no_grad():
        hf = a.model(**batch, use_itm_head=False).itm_score
    torch.testing.assert_close(out["image_embeds"] @ out["text_embeds"].T, hf, rtol=1e-5, atol=1e-6)


def test_temperature_is_clamped_like_blip(tiny_blip, dataset):
    root, frame = dataset
    a = adapter(tiny_blip)
    batch = batch_of(a, root, frame, range(3))
    with torch.no_grad():
        a.module.blip_temp.fill_(2.0)
    assert float(a.module(**batch)["logit_scale"].detach()) == pytest.approx(2.0)  # 1 / 0.5
    with torch.no_grad():
        a.module.blip_temp.fill_(1e-5)
    a.module(**batch)
    assert float(a.module.blip_temp.detach()) == pytest.approx(0.001)


def _by_hand(a, batch, generator):
    """ITC + ITM written out from the HF model's parts and its own ITM forward."""
    m = a.model
    feats = m.vision_model(pixel_values=batch["pixel_values"]).last_hidden_state
    text = m.text_encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    img = F.normalize(m.vision_proj(feats[:, 0]), dim=-1)
    txt = F.normalize(m.text_proj(text[:, 0]), dim=-1)
    sim = img @ txt.T / 0.07
    n = sim.shape[0]
    target = torch.arange(n)
    itc = (F.cross_entropy(sim, target) + F.cross_entropy(sim.T, target)) / 2
    w_i2t = F.softmax(sim, dim=1).masked_fill(torch.eye(n, dtype=torch.bool), 0)
    w_t2i = F.softmax(sim.T, dim=1).masked_fill(torch.eye(n, dtype=torch.bool), 0)
    neg_text = torch.multinomial(w_i2t, 1, generator=generator).squeeze(1)
    neg_image = torch.multinomial(w_t2i, 1, generator=generator).squeeze(1)
    assert not (neg_text == target).any() and not (neg_image == target).any()
    pix, ids, mask = batch["pixel_values"], batch["input_ids"], batch["attention_mask"]
    pos = m(pixel_values=pix, input_ids=ids, attention_mask=mask, use_itm_head=True).itm_score
    neg_t = m(pixel_values=pix, input_ids=ids[neg_text], attention_mask=mask[neg_text], use_itm_head=True).itm_score
    neg_i = m(pixel_values=pix[neg_image], input_ids=ids, attention_mask=mask, use_itm_head=True).itm_score
    logits = torch.cat([pos, neg_t, neg_i])
    labels = torch.cat([torch.ones(n, dtype=torch.long), torch.zeros(2 * n, dtype=torch.long)])
    return itc, F.cross_entropy(logits, labels)


def test_loss_is_itc_plus_itm_computed_by_hand(tiny_blip, dataset):
    root, frame = dataset
    a = adapter(tiny_blip)
    a.module.eval()  # eval: the negatives are drawn with the fixed BLIP_EVAL_SEED
    batch = batch_of(a, root, frame, range(6))
    with torch.no_grad():
        ours = training.recipe_loss(a.module, batch)
        out = a.module(**batch)
        itc, itm = _by_hand(a, batch, torch.Generator().manual_seed(model_mod.BLIP_EVAL_SEED))
    assert math.isfinite(float(ours)) and float(itm) > 0
    assert float(out["itm_loss"]) == pytest.approx(float(itm), rel=1e-5)
    assert float(training.clip_loss(model_mod.logits_of(out))) == pytest.approx(float(itc), rel=1e-5)
    assert float(ours) == pytest.approx(float(itc + itm), rel=1e-5)
    # repeatable in eval mode, and the global RNG is left alone
    state = torch.get_rng_state()
    with torch.no_grad():
        assert float(training.recipe_loss(a.module, batch)) == float(ours)
    assert torch.equal(state, torch.get_rng_state())


def test_training_mode_draws_follow_the_global_seed(tiny_blip, dataset):
    root, frame = dataset
    a = adapter(tiny_blip)
    a.module.train()
    batch = batch_of(a, root, frame, range(6))
    losses = []
    for _ in range(2):
        torch.manual_seed(5)
        with torch.no_grad():
            losses.append(float(a.module(**batch)["itm_loss"]))
    assert losses[0] == losses[1]


def test_negatives_avoid_the_pair_and_follow_the_similarities():
    logits = torch.tensor([[9.0, 50.0, 0.0], [0.0, 9.0, 50.0], [50.0, 0.0, 9.0]])
    neg_text, neg_image = model_mod.blip_negatives(logits, torch.Generator().manual_seed(0))
    assert neg_text.tolist() == [1, 2, 0]  # each image's most similar other caption
    assert neg_image.tolist() == [2, 0, 1]  # each caption's most similar other image
    # underflow to all-zero weights: uniform over the other rows, never the pair
    peaked = torch.eye(4) * 1e4
    for seed in range(5):
        t, i = model_mod.blip_negatives(peaked, torch.Generator().manual_seed(seed))
        assert not (t == torch.arange(4)).any() and not (i == torch.arange(4)).any()


def test_one_pair_batch_has_zero_itm_loss(tiny_blip, dataset):
    root, frame = dataset
    a = adapter(tiny_blip)
    out = a.module(**batch_of(a, root, frame, [0]))
    assert float(out["itm_loss"].detach()) == 0.0 and out["itm_loss"].requires_grad


def test_hard_negatives_are_refused(tiny_blip, dataset):
    root, frame = dataset
    a = adapter(tiny_blip)
    images = [Image.open(root / p).convert("RGB") for p in frame["image_path"][:3]]
    batch = {**a.image_inputs(images), **a.tokens(frame["caption"][:4].tolist()), model_mod.N_PAIRS: torch.tensor(3)}
    with pytest.raises(ConfigError, match="BLIP's ITM loss"):
        training.recipe_loss(a.module, batch)
    out = a.module(**batch_of(a, root, frame, range(3)))
    with pytest.raises(ConfigError, match="Fix:"):
        training.contrastive_loss({**out, "image_embeds": torch.cat([out["image_embeds"]] * 2)}, 3)


def _train(path, root, frame, out_dir, **kw):
    a = adapter(path)
    res = training.train(a, frame, frame, settings(eval_every=2, max_steps=2, **kw), image_root=root,
                         out_dir=out_dir)
    return a, res


def test_two_steps_train_deterministically_and_the_checkpoint_reloads_for_scoring(tiny_blip, dataset, tmp_path):
    from transformers import BlipForImageTextRetrieval

    from counterfactory.scorers import scorer_from_config

    root, frame = dataset
    before = adapter(tiny_blip)
    initial = {n: p.detach().clone() for n, p in before.model.named_parameters()}
    a, res = _train(tiny_blip, root, frame, tmp_path / "ckpt")
    assert len(res.history) == 2 and res.best_step == 2
    assert all(math.isfinite(h["train_loss"]) for h in res.history) and math.isfinite(res.best_val_loss)
    changed = [n for n, p in a.model.named_parameters() if not torch.equal(p, initial[n])]
    for part in ("vision_proj", "text_proj", "itm_head", "vision_model", "text_encoder"):
        assert any(n.startswith(part) for n in changed), part
    assert float(a.module.blip_temp.detach()) != pytest.approx(0.07, abs=0)  # the temperature is learned too

    # deterministic for a fixed seed
    b, res_b = _train(tiny_blip, root, frame, tmp_path / "ckpt_b")
    assert [h["train_loss"] for h in res_b.history] == [h["train_loss"] for h in res.history]
    assert res_b.best_val_loss == res.best_val_loss
    for (n, p), q in zip(a.module.state_dict().items(), b.module.state_dict().values()):
        assert torch.equal(p, q), n

    # the folder is a plain BlipForImageTextRetrieval (the temperature is training-only state)
    reloaded = BlipForImageTextRetrieval.from_pretrained(tmp_path / "ckpt")
    state = reloaded.state_dict()
    assert not any("blip_temp" in k for k in state)
    for n, p in a.model.state_dict().items():
        assert torch.equal(p, state[n]), n
    model, _processor = registry.load(cfg_of(tmp_path / "ckpt"), ROLE)
    assert type(model).__name__ == "BlipForImageTextRetrieval"

    # and scores through the ITC scorer with the trained embeddings
    scorer = scorer_from_config(cfg_of(tmp_path / "ckpt"), ROLE, head="itc", progress=False)
    images = [str(root / p) for p in frame["image_path"][:4]]
    texts = frame["caption"][:4].tolist()
    a.module.eval()
    with torch.no_grad():
        out = a.module(**{**a.image_inputs([Image.open(p).convert("RGB") for p in images]), **a.tokens(texts)})
    np.testing.assert_allclose(scorer.encode_images(images), out["image_embeds"].numpy(), atol=1e-5)
    np.testing.assert_allclose(scorer.encode_texts(texts), out["text_embeds"].numpy(), atol=1e-5)
    itm = scorer_from_config(cfg_of(tmp_path / "ckpt"), ROLE, head="itm", progress=False)
    assert np.isfinite(itm.score_matrix(images, texts)).all()


def test_different_seed_gives_different_run(tiny_blip, dataset, tmp_path):
    root, frame = dataset
    _, res = _train(tiny_blip, root, frame, None)
    _, other = _train(tiny_blip, root, frame, None, seed=3)
    assert [h["train_loss"] for h in res.history] != [h["train_loss"] for h in other.history]
