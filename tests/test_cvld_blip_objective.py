"""CVLD's BLIP retrieval fine-tuning under BLIP's official objective (CVLD appendix C "following the official BLIP
implementation"; §4.3 footnote 3): momentum distillation over the queue with same-image positives for the original
queries, the counterfactuals among the candidates with their soft labels, ITM hard negatives never of one image, and
CVLD's counterfactual terms (Eq. 3, 8) added unchanged; ``objective: plain`` is the loss as it was."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from counterfactory.errors import ConfigError
from counterfactory.training import cvld
from counterfactory.training import cvld_losses as losses
from counterfactory.training import model as model_mod

pytestmark = pytest.mark.usefixtures("one_thread")


def _retrieval(path):
    from transformers import BlipForImageTextRetrieval, BlipProcessor

    return BlipForImageTextRetrieval.from_pretrained(path).eval(), BlipProcessor.from_pretrained(path)


def _log_softmax(row):
    top = max(row)
    lse = top + math.log(sum(math.exp(v - top) for v in row))
    return [v - lse for v in row]


def _softmax(row):
    return [math.exp(v) for v in _log_softmax(row)]


# ------------------------------------------------------------------------------------------ ITC, by hand
def test_official_itc_with_counterfactual_candidates_matches_a_hand_computation():
    """N = 2 originals (image ids 0, 1); example 0 has a counterfactual (its own image, id 2) whose caption has
    cosine 0.6 with the original's; a queue of one entry showing image 0; temp 0.5, alpha 0.4."""
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    txt = torch.tensor([[0.6, 0.8], [0.8, 0.6]])
    cf_txt = torch.tensor([[1.0, 0.0]])                  # online: s_0 = cos([.6, .8], [1, 0]) = 0.6
    img_m = torch.tensor([[0.8, 0.6], [0.6, 0.8]])
    txt_m = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    cf_img_m, cf_txt_m = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.6, 0.8]])
    queue = dict(image_queue=torch.tensor([[-1.0, 0.0]]), text_queue=torch.tensor([[0.0, -1.0]]),
                 idx_queue=torch.tensor([0]))
    has_cf, ids, cf_ids = torch.tensor([True, False]), torch.tensor([0, 1]), torch.tensor([2])
    temp, alpha = 0.5, 0.4
    loss = losses.official_itc_loss(img, txt, cf_txt, img_m, txt_m, cf_img_m, cf_txt_m, has_cf, torch.tensor(temp),
                                    alpha, ids, cf_ids, "soft", **queue)

    # candidates: batch (ids 0, 1), the counterfactual (id 2), the queue (id 0). Ground truth: query 0 -> 1 on
    # its own pair and on the queue's entry of image 0, 0.6 on its counterfactual, / 2.6; query 1 -> its pair
    targets = [[1 / 2.6, 0.0, 0.6 / 2.6, 1 / 2.6], [0.0, 1.0, 0.0, 0.0]]
    # momentum texts [1, 0], [0, 1], [.6, .8], [0, -1]; momentum images [.8, .6], [.6, .8], [0, 1], [-1, 0]
    mom_i2t = [[0.8, 0.6, 0.96, -0.6], [0.6, 0.8, 1.0, -0.8]]       # img_m . txt_m_all
    mom_t2i = [[0.8, 0.6, 0.0, -1.0], [0.6, 0.8, 1.0, 0.0]]         # txt_m . img_m_all
    sim_i2t = [[1.0, 0.0, 0.6, 0.0], [0.0, 1.0, 0.8, -1.0]]         # img . txt_m_all
    sim_t2i = [[0.96, 1.0, 0.8, -0.6], [1.0, 0.96, 0.6, -0.8]]      # txt . img_m_all

    def direction(sim, mom):
        total = 0.0
        for i in range(2):
            soft = _softmax([v / temp for v in mom[i]])
            y = [alpha * soft[j] + (1 - alpha) * targets[i][j] for j in range(4)]
            logp = _log_softmax([v / temp for v in sim[i]])
            total += -sum(logp[j] * y[j] for j in range(4))
        return total / 2

    expected = 0.5 * (direction(sim_i2t, mom_i2t) + direction(sim_t2i, mom_t2i))
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    # the counterfactual candidate and its soft label matter: without it (BLIP alone), or with a hard label, the
    # value differs clearly
    alone = model_mod.blip_itc_loss(img, txt, img_m, txt_m, torch.tensor(temp), alpha, ids, **queue)
    hard = losses.official_itc_loss(img, txt, cf_txt, img_m, txt_m, cf_img_m, cf_txt_m, has_cf, torch.tensor(temp),
                                    alpha, ids, cf_ids, "hard", **queue)
    assert abs(float(alone) - expected) > 0.2 and abs(float(hard) - expected) > 0.04


def test_official_targets_give_same_image_positives_and_the_soft_counterpart():
    ids = torch.tensor([4, 4, 7])                                   # rows 0 and 1: two captions of one image
    candidates = torch.tensor([4, 4, 7, 9, 4, model_mod.NO_IMAGE])   # batch, one counterfactual (id 9), queue
    targets = losses.official_itc_targets(ids, candidates, torch.tensor([0]), torch.tensor([0.5]))
    expected = torch.tensor([[1 / 3.5, 1 / 3.5, 0, 0.5 / 3.5, 1 / 3.5, 0],
                             [1 / 3, 1 / 3, 0, 0, 1 / 3, 0],
                             [0, 0, 1, 0, 0, 0]])
    torch.testing.assert_close(targets, expected)


def test_without_counterfactual_candidates_it_is_blip_official_itc_exactly():
    gen = torch.Generator().manual_seed(0)
    unit = lambda n: F.normalize(torch.randn(n, 8, generator=gen), dim=-1)   # noqa: E731
    img, txt, img_m, txt_m, iq, tq = unit(4), unit(4), unit(4), unit(4), unit(6), unit(6)
    ids, idq, temp = torch.tensor([0, 0, 1, 2]), torch.tensor([1, 5, 0, -100, -100, 3]), torch.tensor(0.07)
    ours = losses.official_itc_loss(img, txt, txt[:0], img_m, txt_m, img_m[:0], txt_m[:0], torch.zeros(4, dtype=bool),
                                    temp, 0.4, ids, None, "soft", iq, tq, idq)
    blip = model_mod.blip_itc_loss(img, txt, img_m, txt_m, temp, 0.4, ids, iq, tq, idq)
    assert torch.equal(ours, blip)


# ----------------------------------------------------------------------------------------- ITM negatives
def test_itm_negatives_are_never_of_one_image_nor_the_counterpart():
    # pool: originals 0, 1 (one image), 2; the counterfactual of 0 (row 3). Every row strongly prefers the row
    # that is forbidden to it (logit 50): the same image, or the counterpart
    sim = torch.zeros(4, 4)
    sim[0, 1] = sim[1, 0] = sim[0, 3] = sim[3, 0] = 50.0
    has_cf = torch.tensor([True, False, False])
    ids = torch.tensor([0, 0, 1, 2])
    same = ids[:, None] == ids[None, :]
    forbidden = losses.counterpart_mask(has_cf, True, same)
    assert forbidden[0, 1] and forbidden[1, 0] and forbidden[0, 3] and forbidden[3, 0]
    assert forbidden.sum() == 4 + 4
    plain_text, _ = losses.itm_negatives(sim, has_cf, torch.Generator().manual_seed(0))
    assert plain_text[1].item() == 0                  # without the mask: the other caption's image
    for seed in range(50):
        neg_text, neg_image = losses.itm_negatives(sim, has_cf, torch.Generator().manual_seed(seed), True, same)
        for i, (t, j) in enumerate(zip(neg_text.tolist(), neg_image.tolist())):
            assert not forbidden[i, t] and not forbidden[j, i]
    # Table 3's hard_label variant lets the counterpart be drawn, never the same image
    loose = losses.counterpart_mask(has_cf, False, same)
    assert not loose[0, 3] and loose[0, 1]


def test_pool_image_ids_share_the_source_image_and_give_counterfactuals_their_own():
    table = pd.DataFrame({"image_path": ["b.png", "a.png", "b.png"], "caption": ["x", "y", "z"],
                          "cf_image_path": ["b_cf.png", None, "b_cf2.png"], "cf_caption": ["x~", None, "z~"]})
    has_cf = pd.Series([True, False, True])
    image, cf = cvld.pool_image_ids(table, has_cf)
    assert image[0] == image[2] != image[1]
    assert cf[1] == -1 and len({cf[0], cf[2], image[0], image[1]}) == 4
    assert cvld.pool_image_ids(table.iloc[::-1].reset_index(drop=True), has_cf[::-1].reset_index(drop=True)) == \
        (image[::-1], cf[::-1])                       # ids depend on the files, not the row order


# ------------------------------------------------------------------------------------- the module, on tiny BLIP
def _pool(proc, n_rows=3, shared=True):
    """3 originals (rows 0 and 1 one image when ``shared``), counterfactuals of rows 0 and 2."""
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randn(n_rows + 2, 3, 32, 32, generator=gen)
    if shared:
        pixels[1] = pixels[0]
    texts = ["a man riding a horse", "a person on a horse", "a woman with a cat", "a woman riding a horse",
             "a man with a cat"]
    tokens = proc.tokenizer(texts, padding="longest", return_tensors="pt")
    ids = torch.tensor([0, 0, 1, 2, 3]) if shared else torch.tensor([0, 1, 2, 3, 4])
    return pixels, tokens["input_ids"], tokens["attention_mask"], torch.tensor([True, False, True]), ids


def _old_forward(module, pixel_values, input_ids, attention_mask, has_cf, variant, lam, generator):
    """RetrievalModule.forward as it was before the official objective (the plain loss)."""
    with torch.no_grad():
        module.temp.clamp_(*model_mod.BLIP_TEMP_RANGE)
    n, model = has_cf.shape[0], module.model
    feats = model.vision_model(pixel_values=pixel_values)[0]
    text = model.text_encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
    img = F.normalize(model.vision_proj(feats[:, 0, :]), dim=-1)
    txt = F.normalize(model.text_proj(text[:, 0, :]), dim=-1)
    itc_cf = has_cf if variant.candidates else torch.zeros_like(has_cf)
    m = int(itc_cf.sum())
    itc = losses.cvld_itc_loss(img[:n], txt[:n], img[n:n + m], txt[n:n + m], itc_cf, module.temp, lam,
                               variant.labels, variant.query_extension)
    itm_cf = has_cf if variant.itm_counterfactuals else torch.zeros_like(has_cf)
    p = n + int(itm_cf.sum())
    sim = img[:p] @ txt[:p].T / module.temp
    itm = losses.cvld_itm_loss(model, feats[:p], input_ids[:p], attention_mask[:p], sim, itm_cf, lam, generator,
                               variant.exclude_counterfactuals)
    return itc + itm


@pytest.mark.parametrize("name", sorted(losses.VARIANTS))
def test_plain_reproduces_the_previous_cvld_loss_exactly(tiny_blip, name):
    model, proc = _retrieval(tiny_blip)
    module = losses.RetrievalModule(model).train()
    assert module.objective == "plain" and module.momentum is None
    pixels, ids, mask, has_cf, _ = _pool(proc)
    variant = losses.VARIANTS[name]
    lam = 0.0 if name == "neg_only" else 0.3
    new = module(pixels, ids, mask, has_cf, variant, lam, torch.Generator().manual_seed(5))
    old = _old_forward(module, pixels, ids, mask, has_cf, variant, lam, torch.Generator().manual_seed(5))
    assert torch.equal(new["loss"], old)


def test_counterfactual_terms_are_unchanged_by_the_objective_switch(tiny_blip):
    model, proc = _retrieval(tiny_blip)
    plain = losses.RetrievalModule(model).train()
    official = losses.RetrievalModule(model, "official", queue_size=16, alpha=0.4).train()
    variant = losses.VARIANTS["cvld"]
    for shared in (True, False):
        pixels, ids, mask, has_cf, image_ids = _pool(proc, shared=shared)
        a = plain(pixels, ids, mask, has_cf, variant, 0.3, torch.Generator().manual_seed(1))
        b = official(pixels, ids, mask, has_cf, variant, 0.3, torch.Generator().manual_seed(1), image_ids)
        assert float(a["itc_cf"]) > 0 and torch.equal(a["itc_cf"], b["itc_cf"])   # Eq. 8's counterfactual queries
        assert not torch.equal(a["itc"], b["itc"])                                 # the base ITC is BLIP's now
        if not shared:   # no pair of one image: the ITM masks, draws and terms are the plain ones
            assert float(a["itm_cf"]) > 0 and torch.equal(a["itm_cf"], b["itm_cf"])
            assert torch.equal(a["itm"], b["itm"])


def test_official_forward_updates_queue_and_ramp_and_eval_changes_nothing(tiny_blip):
    model, proc = _retrieval(tiny_blip)
    module = losses.RetrievalModule(model, "official", queue_size=8, alpha=0.4, ramp_steps=4).train()
    assert [module.alpha_at(s) for s in (0, 2, 4, 9)] == [0.0, 0.2, 0.4, 0.4]
    pixels, ids, mask, has_cf, image_ids = _pool(proc)
    with pytest.raises(ConfigError, match="image id"):
        module(pixels, ids, mask, has_cf, losses.VARIANTS["cvld"], 0.3, torch.Generator().manual_seed(0))
    module(pixels, ids, mask, has_cf, losses.VARIANTS["cvld"], 0.3, torch.Generator().manual_seed(0), image_ids)
    q = module.momentum
    # the queue took the 3 originals (never the counterfactuals), with their image ids
    assert int(q.queue_ptr) == 3 and module.step == 1
    assert q.idx_queue.tolist() == [0, 0, 1] + [model_mod.NO_IMAGE] * 5
    module.eval()
    before = q.image_queue.clone()
    out = module(pixels, ids, mask, has_cf, losses.VARIANTS["cvld"], 0.3, torch.Generator().manual_seed(0), image_ids)
    assert torch.isfinite(out["loss"]) and int(q.queue_ptr) == 3 and module.step == 1
    assert torch.equal(q.image_queue, before)
    with pytest.raises(ConfigError, match="objective"):
        losses.RetrievalModule(model, "momentum")


# ------------------------------------------------------------------------------------------ settings, training
def test_settings_default_to_the_official_objective_from_the_schema():
    s = cvld.CVLDSettings.for_task("retrieval")
    assert (s.objective, s.momentum, s.queue_size, s.alpha) == ("official", 0.995, 57600, 0.4)
    assert cvld.CVLDSettings.for_task("retrieval", objective="plain").objective == "plain"
    with pytest.raises(ConfigError, match="objective"):
        cvld.CVLDSettings.for_task("retrieval", objective="itc")
    with pytest.raises(ConfigError, match="queue_size"):
        cvld.CVLDSettings.for_task("retrieval", queue_size=0)


@pytest.fixture
def image_table(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in ("orig0", "orig2", "orig3", "cf0", "cf2"):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(tmp_path / f"{name}.png")
    table = pd.DataFrame({
        "image_path": ["orig0.png", "orig0.png", "orig2.png", "orig3.png"],   # rows 0, 1: one image
        "caption": ["a man riding a horse", "a dog on a bed", "a woman with a cat", "a red car"],
        "cf_image_path": ["cf0.png", None, "cf2.png", ""],
        "cf_caption": ["a woman riding a horse", None, "a man with a cat", ""],
    })
    return table, tmp_path


def test_official_training_is_deterministic_and_saves_the_model_alone(tiny_blip, image_table, tmp_path):
    import json

    from transformers import BlipForImageTextRetrieval

    table, root = image_table
    settings = cvld.CVLDSettings.for_task("retrieval", batch_size=2, max_steps=3, lr=1e-3, queue_size=16)
    assert settings.objective == "official"
    model, proc = _retrieval(tiny_blip)
    first = cvld.train_retrieval(model, proc, table, settings, tmp_path / "ret", root).history
    again, _ = _retrieval(tiny_blip)
    assert [h["loss"] for h in cvld.train_retrieval(again, proc, table, settings, None, root).history] == \
        [h["loss"] for h in first]
    plain, _ = _retrieval(tiny_blip)
    other = cvld.train_retrieval(plain, proc, table, cvld.CVLDSettings.for_task(
        "retrieval", batch_size=2, max_steps=3, lr=1e-3, objective="plain"), None, root).history
    assert [h["loss"] for h in other] != [h["loss"] for h in first]
    loaded = BlipForImageTextRetrieval.from_pretrained(tmp_path / "ret")
    assert set(loaded.state_dict()) == set(model.state_dict())      # no momentum encoder or queue saved
    record = json.loads((tmp_path / "ret" / "cvld.json").read_text())
    assert record["settings"]["objective"] == "official" and record["settings"]["queue_size"] == 16
