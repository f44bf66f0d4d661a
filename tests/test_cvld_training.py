"""CVLD debiased adaptation: prompt tuning, classification / ITC / ITM / captioning losses, episodes,
BLIP^Bal and the three training loops, on tiny BLIP models built from code."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from counterfactory.errors import ConfigError, InputError
from counterfactory.training import cvld
from counterfactory.training import cvld_losses as losses
from counterfactory.training.model import blip_itm_loss, clip_loss
from counterfactory.training.prompt_tuning import (add_prompts, load_prompts, prompt_parameters, remove_prompts,
                                                   save_prompts)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_blips(tmp_path_factory):
    from counterfactory.models.tiny_eval import build_blip, build_blip_captioner

    out = tmp_path_factory.mktemp("cvld_blip")
    build_blip(out / "itm", seed=0)
    build_blip_captioner(out / "cap", seed=0)
    return out


def _retrieval(tiny_blips):
    from transformers import BlipForImageTextRetrieval, BlipProcessor

    return (BlipForImageTextRetrieval.from_pretrained(tiny_blips / "itm").eval(),
            BlipProcessor.from_pretrained(tiny_blips / "itm"))


def _captioner(tiny_blips):
    from transformers import BlipForConditionalGeneration, BlipProcessor

    return (BlipForConditionalGeneration.from_pretrained(tiny_blips / "cap").eval(),
            BlipProcessor.from_pretrained(tiny_blips / "cap"))


def _pixels(n, seed=0):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _itm(model, pixels, tokens):
    return model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"], pixel_values=pixels).itm_score


# --------------------------------------------------------------------------- prompt tuning

def test_prompt_step_updates_only_prompts_and_changes_output(tiny_blips):
    model, proc = _retrieval(tiny_blips)
    tokens = proc.tokenizer(["a photo of a dog", "a cat on a bed"], padding=True, return_tensors="pt")
    pixels = _pixels(2)
    with torch.no_grad():
        before_out = _itm(model, pixels, tokens)
    add_prompts(model, n_prompts=4, n_layers=9, seed=3)
    with torch.no_grad():
        prompted = _itm(model, pixels, tokens)
    assert not torch.allclose(prompted, before_out)
    # [CLS] stays first; the vision output carries the 4 prompts after it (1 + 4 + 16 patches)
    assert model.vision_model(pixel_values=pixels)[0].shape[1] == 1 + 4 + 16
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # an optimiser over every parameter: the frozen ones get no gradient, so weight decay skips them too
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    prompt_tokens = proc.tokenizer(list(losses.class_prompts("Bangs")), padding=True, return_tensors="pt")
    loss = losses.classification_loss(model, prompt_tokens, pixels, torch.tensor([0, 1]), _pixels(2, 1),
                                    torch.tensor([0, 1]), lam=1.0)
    loss.backward()
    opt.step()
    after = model.state_dict()
    for name, value in before.items():
        if name.startswith("cvld_prompts."):
            assert not torch.equal(after[name], value), name
        else:
            assert torch.equal(after[name], value), name
    assert [p.requires_grad for p in prompt_parameters(model)] == [True, True]
    assert sum(p.requires_grad for p in model.parameters()) == 2


def test_remove_prompts_restores_exact_outputs_and_flags(tiny_blips):
    model, proc = _retrieval(tiny_blips)
    tokens = proc.tokenizer(["a photo of a dog", "a cat"], padding=True, return_tensors="pt")
    pixels = _pixels(2)
    with torch.no_grad():
        original = _itm(model, pixels, tokens)
    add_prompts(model, n_layers=2)
    with pytest.raises(ConfigError, match="already has prompts"):
        add_prompts(model)
    remove_prompts(model)
    with torch.no_grad():
        restored = _itm(model, pixels, tokens)
    assert torch.equal(original, restored)
    assert all(p.requires_grad for p in model.parameters())
    assert not hasattr(model, "cvld_prompts")


def test_prompted_text_mask_ignores_padding(tiny_blips):
    """The prompts' mask positions are added after [CLS]: a caption scores the same alone and padded."""
    model, proc = _retrieval(tiny_blips)
    add_prompts(model, n_layers=2, init_std=1.0, seed=1)
    pixels = _pixels(1)
    short = "a dog"
    alone = proc.tokenizer([short], return_tensors="pt")
    padded = proc.tokenizer([short, "a dog on a bed near a red car"], padding=True, return_tensors="pt")
    assert padded["input_ids"].shape[1] > alone["input_ids"].shape[1]
    with torch.no_grad():
        a = _itm(model, pixels, alone)
        b = _itm(model, pixels.repeat(2, 1, 1, 1), padded)[:1]
        itc = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                    pixel_values=pixels.repeat(2, 1, 1, 1), use_itm_head=False).itm_score
        itc_alone = model(input_ids=alone["input_ids"], attention_mask=alone["attention_mask"], pixel_values=pixels,
                          use_itm_head=False).itm_score
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(itc_alone[0, 0], itc[0, 0], rtol=1e-5, atol=1e-6)


def test_save_and_load_prompts(tiny_blips, tmp_path):
    model, proc = _retrieval(tiny_blips)
    add_prompts(model, n_layers=2, init_std=0.5, seed=7)
    path = save_prompts(model, tmp_path / "p.safetensors")
    tokens = proc.tokenizer(["a dog"], return_tensors="pt")
    with torch.no_grad():
        expected = _itm(model, _pixels(1), tokens)
    fresh, _ = _retrieval(tiny_blips)
    load_prompts(fresh, path)
    with torch.no_grad():
        assert torch.equal(_itm(fresh, _pixels(1), tokens), expected)
    with pytest.raises(InputError, match="prompt file not found"):
        load_prompts(fresh, tmp_path / "missing.safetensors")


# --------------------------------------------------------------------------- classification

def test_classification_logits_are_itm_log_odds_per_class(tiny_blips):
    model, proc = _retrieval(tiny_blips)
    prompts = proc.tokenizer(list(losses.class_prompts("Smiling")), padding=True, return_tensors="pt")
    pixels = _pixels(3)
    with torch.no_grad():
        logits = losses.classification_logits(model, pixels, prompts)
        assert logits.shape == (3, 2)
        for c in range(2):
            ids = {k: v[c:c + 1].repeat(3, 1) for k, v in prompts.items()}
            itm = _itm(model, pixels, ids)
            torch.testing.assert_close(logits[:, c], itm[:, 1] - itm[:, 0], rtol=1e-5, atol=1e-6)


def test_classification_loss_eq3(tiny_blips):
    model, proc = _retrieval(tiny_blips)
    add_prompts(model, n_layers=2, init_std=0.5)
    prompts = proc.tokenizer(list(losses.class_prompts("Bangs")), padding=True, return_tensors="pt")
    pixels, cf_pixels, labels = _pixels(3), _pixels(2, 5), torch.tensor([1, 0, 1])
    with torch.no_grad():
        plain = F.cross_entropy(losses.classification_logits(model, pixels, prompts), labels)
        cf = F.cross_entropy(losses.classification_logits(model, cf_pixels, prompts), labels[:2])
        # lambda = 0, or no counterfactuals: plain cross-entropy
        torch.testing.assert_close(losses.classification_loss(model, prompts, pixels, labels, cf_pixels, labels[:2], 0.0), plain)
        torch.testing.assert_close(losses.classification_loss(model, prompts, pixels, labels), plain)
        torch.testing.assert_close(losses.classification_loss(model, prompts, pixels, labels, cf_pixels, labels[:2], 1.0),
                                   plain + cf, rtol=1e-5, atol=1e-6)
    assert losses.class_prompts("Bangs") == ("a photo of a person without bangs", "a photo of a person with bangs")
    assert losses.class_prompts("Rosy_Cheeks")[1] == "a photo of a person with rosy cheeks"
    assert len(losses.CELEBA_PROMPTS) == 14


# --------------------------------------------------------------------------- ITC

def _hand_example():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    txt = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    cf_img = torch.tensor([[0.0, 1.0]])  # example 0's intervened image
    cf_txt = torch.tensor([[0.6, 0.8]])  # cos(T_0, T~_0) = 0.6
    return img, txt, cf_img, cf_txt, torch.tensor([True, False])


def test_itc_soft_labels_hand_computed_2x3():
    img, txt, cf_img, cf_txt, has_cf = _hand_example()
    e = math.e
    # targets of query 0: weight 1 on I_0 and 0.6 on I~_0, normalised -> (0.625, 0, 0.375)
    targets = losses.itc_targets(txt, cf_txt, has_cf)
    torch.testing.assert_close(targets, torch.tensor([[0.625, 0.0, 0.375], [0.0, 1.0, 0.0], [0.375, 0.0, 0.625]]))
    # text -> image: logits [1, 0, 0] and [0, 1, 1]
    t2i = ((math.log(e + 2) - 0.625) + (math.log(1 + 2 * e) - 1.0)) / 2
    # image -> text over (T_0, T_1, T~_0): logits [1, 0, 0.6] and [0, 1, 0.8]
    i2t = ((math.log(e + 1 + e ** 0.6) - (0.625 + 0.375 * 0.6)) + (math.log(1 + e + e ** 0.8) - 1.0)) / 2
    got = losses.cvld_itc_loss(img, txt, cf_img, cf_txt, has_cf, 1.0, lam=0.3, query_extension=False)
    assert got.item() == pytest.approx(0.5 * (t2i + i2t), abs=1e-6)
    # query extension: T~_0 against (I_0, I_1, I~_0): logits [0.6, 0.8, 0.8], targets (0.375, 0, 0.625);
    # I~_0 against (T_0, T_1, T~_0): logits [0, 1, 0.8], same targets
    t2i_cf = math.log(e ** 0.6 + 2 * e ** 0.8) - (0.375 * 0.6 + 0.625 * 0.8)
    i2t_cf = math.log(1 + e + e ** 0.8) - 0.625 * 0.8
    got = losses.cvld_itc_loss(img, txt, cf_img, cf_txt, has_cf, 1.0, lam=0.3)
    assert got.item() == pytest.approx(0.5 * (t2i + 0.3 * t2i_cf + i2t + 0.3 * i2t_cf), abs=1e-6)
    # a negative text similarity is clipped at 0: the counterfactual is then a plain negative
    assert losses.itc_targets(txt, torch.tensor([[-0.6, 0.8]]), has_cf)[0].tolist() == [1.0, 0.0, 0.0]


def _random_batch(n=5, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = [F.normalize(torch.randn(n, d, generator=g), dim=-1) for _ in range(4)]
    return emb, torch.tensor([True, False, True, True, False][:n])


def test_itc_hard_label_is_infonce_over_extended_candidates():
    (img, txt, cf_img, cf_txt), has_cf = _random_batch()
    temp = 0.07
    images, texts = torch.cat([img, cf_img[has_cf]]), torch.cat([txt, cf_txt[has_cf]])
    target = torch.arange(5)
    expected = 0.5 * (F.cross_entropy(txt @ images.T / temp, target) + F.cross_entropy(img @ texts.T / temp, target))
    got = losses.cvld_itc_loss(img, txt, cf_img, cf_txt, has_cf, temp, lam=0.3, labels="hard", query_extension=False)
    torch.testing.assert_close(got, expected)
    # compact counterfactual rows (one per counterfactual) give the same loss
    torch.testing.assert_close(losses.cvld_itc_loss(img, txt, cf_img[has_cf], cf_txt[has_cf], has_cf, temp, 0.3,
                                                  "hard", False), expected)
    # soft labels differ from hard ones
    soft = losses.cvld_itc_loss(img, txt, cf_img, cf_txt, has_cf, temp, lam=0.3, query_extension=False)
    assert not torch.allclose(soft, got)


def test_itc_without_counterfactuals_is_blip_itc():
    (img, txt, cf_img, cf_txt), _ = _random_batch()
    none = torch.zeros(5, dtype=torch.bool)
    expected = clip_loss(img @ txt.T / 0.07)
    torch.testing.assert_close(losses.cvld_itc_loss(img, txt, cf_img, cf_txt, none, 0.07, lam=0.3), expected)


def test_query_extension_adds_lambda_times_counterfactual_query_term():
    (img, txt, cf_img, cf_txt), has_cf = _random_batch(seed=4)
    temp, lam, n = 0.1, 0.3, 5
    idx = [0, 2, 3]
    images = torch.cat([img, cf_img[idx]])
    texts = torch.cat([txt, cf_txt[idx]])
    terms = []
    for queries, cands in ((cf_txt, images), (cf_img, texts)):
        total = 0.0
        for k, i in enumerate(idx):
            s = max(0.0, float(txt[i] @ cf_txt[i]))
            logp = (queries[i] @ cands.T / temp).log_softmax(-1)
            total += -(logp[n + k] + s * logp[i]) / (1 + s)
        terms.append(total / len(idx))
    with_ext = losses.cvld_itc_loss(img, txt, cf_img, cf_txt, has_cf, temp, lam)
    without = losses.cvld_itc_loss(img, txt, cf_img, cf_txt, has_cf, temp, lam, query_extension=False)
    assert (with_ext - without).item() == pytest.approx(lam * 0.5 * float(terms[0] + terms[1]), rel=1e-5)


# --------------------------------------------------------------------------- ITM

def test_itm_never_draws_own_counterfactual():
    has_cf = torch.tensor([True, False, True, True])
    n, pool = 4, 7  # originals 0..3, counterfactuals of 0, 2, 3 at 4, 5, 6
    counterpart = {0: 4, 4: 0, 2: 5, 5: 2, 3: 6, 6: 3}
    # the counterpart gets by far the highest similarity, so a draw that ignored the mask would pick it
    sim = torch.zeros(pool, pool)
    for a, b in counterpart.items():
        sim[a, b] = 8.0
    drawn_counterpart = 0
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        noise = torch.randn(pool, pool, generator=g)
        neg_text, neg_image = losses.itm_negatives(sim + noise, has_cf, g)
        for j in range(pool):
            for pick in (int(neg_text[j]), int(neg_image[j])):
                assert pick != j and pick != counterpart.get(j)
        nt, _ = losses.itm_negatives(sim + noise, has_cf, torch.Generator().manual_seed(seed),
                                   exclude_counterfactuals=False)
        drawn_counterpart += sum(int(nt[j]) == counterpart.get(j) for j in range(pool))
    assert drawn_counterpart > 100  # without the exclusion they dominate the draw
    assert losses.counterpart_mask(has_cf).sum().item() == pool + 6
    assert n + int(has_cf.sum()) == pool


def test_itm_loss_without_counterfactuals_is_blip_itm(tiny_blips):
    model, proc = _retrieval(tiny_blips)
    tokens = proc.tokenizer(["a dog", "a cat on a bed", "a red car"], padding=True, return_tensors="pt")
    with torch.no_grad():
        feats = model.vision_model(pixel_values=_pixels(3))[0]
        sim = torch.randn(3, 3, generator=torch.Generator().manual_seed(1))
        expected = blip_itm_loss(model, feats, tokens["input_ids"], tokens["attention_mask"], sim,
                                 torch.Generator().manual_seed(5))
        got = losses.cvld_itm_loss(model, feats, tokens["input_ids"], tokens["attention_mask"], sim,
                                 torch.zeros(3, dtype=torch.bool), 0.3, torch.Generator().manual_seed(5))
        torch.testing.assert_close(got, expected)
        # one counterfactual (of example 1) appended to the pool: its three entries weigh lambda
        pool_feats = torch.cat([feats, feats[1:2].flip(1)])
        ids = torch.cat([tokens["input_ids"], tokens["input_ids"][1:2]])
        mask = torch.cat([tokens["attention_mask"], tokens["attention_mask"][1:2]])
        has_cf = torch.tensor([False, True, False])
        sim4 = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
        l0 = losses.cvld_itm_loss(model, pool_feats, ids, mask, sim4, has_cf, 0.0, torch.Generator().manual_seed(9))
        l1 = losses.cvld_itm_loss(model, pool_feats, ids, mask, sim4, has_cf, 1.0, torch.Generator().manual_seed(9))
        assert l1 > l0
        one = losses.cvld_itm_loss(model, feats[:1], tokens["input_ids"][:1], tokens["attention_mask"][:1],
                                 sim[:1, :1], torch.zeros(1, dtype=torch.bool), 0.3)
        assert one.item() == 0.0


def test_variants_table3():
    assert set(losses.VARIANTS) == {"base", "hard_label", "neg_only", "itc", "itm", "cvld"}
    assert losses.VARIANTS["cvld"] == losses.RetrievalVariant(True, "soft", True, True, True)
    assert not losses.VARIANTS["base"].candidates and not losses.VARIANTS["base"].itm_counterfactuals
    assert losses.VARIANTS["neg_only"].labels == "hard" and not losses.VARIANTS["neg_only"].query_extension
    with pytest.raises(ConfigError, match="unknown retrieval variant"):
        cvld.CVLDSettings.for_task("retrieval", variant="soft")


# --------------------------------------------------------------------------- captioning

def test_captioning_loss_eq9(tiny_blips):
    model, proc = _captioner(tiny_blips)
    tok = proc.tokenizer(["a man riding a horse", "a dog"], padding=True, return_tensors="pt")
    cf = proc.tokenizer(["a woman riding a horse"], padding=True, return_tensors="pt")
    pixels, cf_pixels = _pixels(2), _pixels(1, 3)
    ids = tok["input_ids"].clone()
    ids[:, 0] = proc.tokenizer.bos_token_id  # [DEC]
    labels = ids.masked_fill(tok["attention_mask"] == 0, -100)
    with torch.no_grad():
        plain = model(pixel_values=pixels, input_ids=ids, attention_mask=tok["attention_mask"], labels=labels).loss
        got0 = losses.captioning_loss(model, pixels, tok["input_ids"], tok["attention_mask"], cf_pixels,
                                    cf["input_ids"], cf["attention_mask"], lam=0.0)
        torch.testing.assert_close(got0, plain)
        torch.testing.assert_close(losses.captioning_loss(model, pixels, tok["input_ids"], tok["attention_mask"]), plain)
        cf_loss = losses.caption_lm_loss(model, cf_pixels, cf["input_ids"], cf["attention_mask"])
        got = losses.captioning_loss(model, pixels, tok["input_ids"], tok["attention_mask"], cf_pixels,
                                   cf["input_ids"], cf["attention_mask"], lam=0.3)
        torch.testing.assert_close(got, plain + 0.3 * cf_loss)
    assert plain.item() > 0


def test_captioning_loss_leaves_blips_prompt_out_of_the_targets(tiny_blips):
    # BLIP trains on "a picture of " + caption with the prompt positions at -100: the loss is the mean over the
    # caption's own tokens (and the closing [SEP]), the prompt is context only
    model, proc = _captioner(tiny_blips)
    prompt = "a picture of "
    n_prompt = losses.prompt_length(proc.tokenizer, prompt)
    assert n_prompt == len(proc.tokenizer(prompt, add_special_tokens=False).input_ids) + 1 and n_prompt > 1
    assert losses.prompt_length(proc.tokenizer, "") == 0
    tok = proc.tokenizer([prompt + "a man riding a horse", prompt + "a dog"], padding=True, return_tensors="pt")
    pixels = _pixels(2)
    ids = tok["input_ids"].clone()
    ids[:, 0] = proc.tokenizer.bos_token_id
    with torch.no_grad():
        logits = model(pixel_values=pixels, input_ids=ids, attention_mask=tok["attention_mask"]).logits
        got = losses.caption_lm_loss(model, pixels, tok["input_ids"], tok["attention_mask"], prompt_tokens=n_prompt)
        with_prompt = losses.caption_lm_loss(model, pixels, tok["input_ids"], tok["attention_mask"])
        cf = losses.captioning_loss(model, pixels, tok["input_ids"], tok["attention_mask"], pixels,
                                    tok["input_ids"], tok["attention_mask"], lam=0.5, prompt_tokens=n_prompt)
    # by hand: position t predicts token t + 1; targets are the caption tokens (index >= n_prompt), not padding
    positions = [(b, t) for b in range(2) for t in range(n_prompt - 1, ids.shape[1] - 1)
                 if tok["attention_mask"][b, t + 1] == 1]
    assert len(positions) == int(tok["attention_mask"].sum()) - 2 * n_prompt
    want = F.cross_entropy(torch.stack([logits[b, t] for b, t in positions]),
                           torch.stack([ids[b, t + 1] for b, t in positions]),
                           label_smoothing=model.config.text_config.label_smoothing)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(cf, 1.5 * got)
    assert abs(got.item() - with_prompt.item()) > 1e-4    # the prompt's tokens are not in the loss


def test_captioning_training_checks_every_caption_carries_the_prompt(tiny_blips):
    model, proc = _captioner(tiny_blips)
    table = pd.DataFrame({"image_path": ["x.png"], "caption": ["a man"], "cf_image_path": [""], "cf_caption": [""]})
    with pytest.raises(InputError, match="row 0: caption 'a man' does not begin with the captioning prompt"):
        cvld.train_captioning(model, proc, table, cvld.CVLDSettings.for_task("captioning"), prompt="a picture of ")


# --------------------------------------------------------------------------- episodes, BLIP^Bal

def _labels_frame(n=40):
    rng = np.random.default_rng(0)
    return pd.DataFrame({"image_id": [f"{i:06d}.jpg" for i in range(n)], "Bangs": rng.integers(0, 2, n),
                         "Male": rng.integers(0, 2, n)})


def test_sample_episode_k_per_class_deterministic_and_varied():
    frame = _labels_frame()
    ep = cvld.sample_episode(frame, "Bangs", 4, episode=0, id_col="image_id")
    assert len(ep) == 8 and ep["Bangs"].tolist() == [1] * 4 + [0] * 4
    assert ep.index.is_unique
    again = cvld.sample_episode(frame, "Bangs", 4, episode=0, id_col="image_id")
    pd.testing.assert_frame_equal(ep, again)
    # independent of the table's row order
    shuffled = frame.sample(frac=1.0, random_state=3)
    assert cvld.sample_episode(shuffled, "Bangs", 4, 0, id_col="image_id")["image_id"].tolist() == ep["image_id"].tolist()
    episodes = {tuple(cvld.sample_episode(frame, "Bangs", 4, e, id_col="image_id")["image_id"])
                for e in range(cvld.N_EPISODES)}
    assert len(episodes) == cvld.N_EPISODES
    with pytest.raises(InputError, match="fewer than K"):
        cvld.sample_episode(frame, "Bangs", 40, 0)
    bad = frame.assign(Bangs=frame["Bangs"] * 2 - 1)
    with pytest.raises(InputError, match="not 0/1"):
        cvld.sample_episode(bad, "Bangs", 2, 0)


def test_balanced_subset_downsamples_majority():
    frame = pd.DataFrame({"id": range(10), "gender": ["male"] * 6 + ["female"] * 2 + [None, ""]})
    out = cvld.balanced_subset(frame, "gender", seed=0)
    assert (out["gender"] == "male").sum() == 2 and (out["gender"] == "female").sum() == 2
    assert {8, 9} <= set(out["id"])  # rows without a group are kept
    assert out["id"].is_monotonic_increasing
    pd.testing.assert_frame_equal(out, cvld.balanced_subset(frame, "gender", seed=0))
    picks = {tuple(cvld.balanced_subset(frame, "gender", seed=s)["id"]) for s in range(6)}
    assert len(picks) > 1


# --------------------------------------------------------------------------- training loops

@pytest.fixture
def image_table(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(4):
        for kind in ("orig", "cf"):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(tmp_path / f"{kind}{i}.png")
    table = pd.DataFrame({
        "image_path": [f"orig{i}.png" for i in range(4)],
        "caption": ["a man riding a horse", "a dog on a bed", "a woman with a cat", "a red car"],
        "cf_image_path": ["cf0.png", None, "cf2.png", ""],
        "cf_caption": ["a woman riding a horse", None, "a man with a cat", ""],
        "label": [1, 0, 1, 0],
    })
    return table, tmp_path


def test_train_classification_prompts_only(tiny_blips, image_table, tmp_path):
    table, root = image_table
    model, proc = _retrieval(tiny_blips)
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    settings = cvld.CVLDSettings.for_task("classification", batch_size=4, max_steps=3, n_prompt_layers=2)
    assert (settings.lr, settings.lam, cvld.CVLDSettings.for_task("classification").batch_size) == (1e-2, 1.0, 32)
    result = cvld.train("classification", model, proc, table, settings, tmp_path / "clf", root, attribute="Bangs")
    losses = [h["loss"] for h in result.history]
    assert len(losses) == 3 and losses[-1] < losses[0]  # one full batch per step: the same rows each time
    for name, value in frozen.items():
        assert torch.equal(model.state_dict()[name], value)
    fresh, _ = _retrieval(tiny_blips)
    load_prompts(fresh, tmp_path / "clf" / "prompts.safetensors")
    for a, b in zip(prompt_parameters(fresh), prompt_parameters(model)):
        assert torch.equal(a, b)
    # deterministic given the seed
    again, _ = _retrieval(tiny_blips)
    rerun = cvld.train_classification(again, proc, table, "Bangs", settings, None, root)
    assert [h["loss"] for h in rerun.history] == losses


def test_train_retrieval_saves_loadable_model(tiny_blips, image_table, tmp_path):
    from transformers import BlipForImageTextRetrieval

    table, root = image_table
    model, proc = _retrieval(tiny_blips)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    settings = cvld.CVLDSettings.for_task("retrieval", batch_size=4, max_steps=2, lr=1e-3)
    assert cvld.CVLDSettings.for_task("retrieval").epochs == 6
    result = cvld.train_retrieval(model, proc, table, settings, tmp_path / "ret", root)
    assert len(result.history) == 2 and result.history[0]["loss"] != result.history[1]["loss"]
    loaded = BlipForImageTextRetrieval.from_pretrained(tmp_path / "ret")
    state = loaded.state_dict()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert any(not torch.equal(state[k], v) for k, v in original.items())
    assert (tmp_path / "ret" / "cvld.json").exists()
    # deterministic given the seed; another variant trains differently
    again, _ = _retrieval(tiny_blips)
    assert [h["loss"] for h in cvld.train_retrieval(again, proc, table, settings, None, root).history] == \
        [h["loss"] for h in result.history]
    base, _ = _retrieval(tiny_blips)
    other = cvld.train_retrieval(base, proc, table, cvld.CVLDSettings.for_task(
        "retrieval", batch_size=4, max_steps=1, lr=1e-3, variant="base"), None, root)
    assert other.history[0]["loss"] != result.history[0]["loss"]


def test_train_captioning_saves_loadable_model(tiny_blips, image_table, tmp_path):
    from transformers import BlipForConditionalGeneration

    table, root = image_table
    model, proc = _captioner(tiny_blips)
    settings = cvld.CVLDSettings.for_task("captioning", batch_size=4, max_steps=3, lr=1e-3)
    result = cvld.train_captioning(model, proc, table, settings, tmp_path / "cap", root)
    losses = [h["loss"] for h in result.history]
    assert len(losses) == 3 and losses[-1] < losses[0]
    loaded = BlipForConditionalGeneration.from_pretrained(tmp_path / "cap")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


def test_training_table_errors(tiny_blips, image_table):
    table, root = image_table
    model, proc = _retrieval(tiny_blips)
    settings = cvld.CVLDSettings.for_task("retrieval", batch_size=4, max_steps=1)
    with pytest.raises(InputError, match="missing columns"):
        cvld.train_retrieval(model, proc, table.drop(columns=["cf_caption"]), settings, None, root)
    half = table.assign(cf_caption=["x", None, "y", "z"])
    with pytest.raises(InputError, match="record row 3.*counterfactual image without a caption"):
        cvld.train_retrieval(model, proc, half, settings, None, root)
    missing = table.assign(image_path=["nope.png"] + table["image_path"].tolist()[1:])
    with pytest.raises(InputError, match="cannot read image"):
        cvld.train_retrieval(model, proc, missing, settings, None, root)
    with pytest.raises(ConfigError, match="unknown task"):
        cvld.CVLDSettings.for_task("vqa")


def test_set_resolution_resamples_position_embeddings_as_blip_does(tiny_blips, tmp_path):
    # Tables 2-3 run retrieval at 224 and Table 4's captioners at 384: the model is moved to the size by bicubic
    # resampling of its patch position grid, which is what transformers' interpolate_pos_encoding computes on the fly
    from counterfactory.studies.cvld import settings as cvld_settings
    from counterfactory.studies.cvld.resolution import current_size, set_resolution

    s = cvld_settings.settings(None)
    assert (s["retrieval"]["image_size"], s["captioning"]["image_size"]) == (224, 384)
    model, proc = _retrieval(tiny_blips)
    old = current_size(model)
    new = 2 * old
    pixels = torch.rand(1, 3, new, new)
    with torch.no_grad():
        expected = model.vision_model(pixel_values=pixels, interpolate_pos_encoding=True).last_hidden_state
    set_resolution(model, proc, new)
    assert current_size(model) == new and model.config.vision_config.image_size == new
    assert proc.image_processor.size == {"height": new, "width": new}
    with torch.no_grad():
        got = model.vision_model(pixel_values=pixels).last_hidden_state
    torch.testing.assert_close(got, expected)
    model.save_pretrained(tmp_path / "m")
    from transformers import BlipForImageTextRetrieval

    assert current_size(BlipForImageTextRetrieval.from_pretrained(tmp_path / "m")) == new
    assert set_resolution(model, proc, None)[0] is model and current_size(model) == new
    with pytest.raises(Exception, match="multiple of the patch size"):
        set_resolution(model, proc, new + 1)
