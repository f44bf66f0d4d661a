"""BLIP's official retrieval fine-tuning objective (salesforce/BLIP ``models/blip_retrieval.py``): ITC with momentum
distillation over feature queues, same-image positives, ITM hard negatives that are never a same-image pair,
the EMA momentum update, the queue's wrap-around, and a saved folder without training-only state."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from counterfactory import training
from counterfactory.errors import ConfigError
from counterfactory.training import model as model_mod
from counterfactory.training.data import Collator, image_id_map

ROLE = "itm_blip"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """12 rows of 6 pairs; rows 0 and 1 show the same image (two captions of one image, as COCO's five)."""
    from counterfactory.testing import pair_images

    root = tmp_path_factory.mktemp("imgs")
    frame = pair_images(root, ["red", "green", "blue", "yellow", "purple", "orange"], step=30)
    frame.loc[1, "image_path"] = frame.loc[0, "image_path"]
    return root, frame


def adapter(path):
    from counterfactory.training.runs import _adapter

    return _adapter({"models": {ROLE: {"source": str(path)}}}, ROLE)


def batch_of(a, root, frame, rows, ids=None):
    images = [Image.open(root / p).convert("RGB") for p in frame["image_path"].iloc[list(rows)]]
    batch = {**a.image_inputs(images), **a.tokens(frame["caption"].iloc[list(rows)].tolist())}
    if ids is not None:
        batch[model_mod.IMAGE_IDS] = torch.tensor(ids)
    return batch


def _log_softmax(row):
    top = max(row)
    lse = top + math.log(sum(math.exp(v - top) for v in row))
    return [v - lse for v in row]


def _softmax(row):
    return [math.exp(v) for v in _log_softmax(row)]


# ------------------------------------------------------------------------------------------ ITC, by hand
def test_itc_with_momentum_distillation_matches_a_hand_computation():
    """B = 2 pairs (image ids 0, 1), a queue of one entry showing image 0, temp 0.5, alpha 0.4."""
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    txt = torch.tensor([[0.6, 0.8], [0.8, 0.6]])
    img_m = torch.tensor([[0.8, 0.6], [0.6, 0.8]])
    txt_m = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    image_queue, text_queue, idx_queue = torch.tensor([[-1.0, 0.0]]), torch.tensor([[0.0, -1.0]]), torch.tensor([0])
    temp, alpha = 0.5, 0.4
    loss = model_mod.blip_itc_loss(img, txt, img_m, txt_m, torch.tensor(temp), alpha, torch.tensor([0, 1]),
                                   image_queue, text_queue, idx_queue)

    # candidates: momentum texts [1, 0], [0, 1], queue [0, -1] (ids 0, 1, 0); momentum images [.8, .6], [.6, .8],
    # queue [-1, 0] (ids 0, 1, 0). Same-image targets: row of id 0 -> [1/2, 0, 1/2], row of id 1 -> [0, 1, 0]
    targets = [[0.5, 0.0, 0.5], [0.0, 1.0, 0.0]]
    # dot products written out, divided by temp
    mom_i2t = [[0.8 / temp, 0.6 / temp, -0.6 / temp], [0.6 / temp, 0.8 / temp, -0.8 / temp]]   # img_m . txt_m_all
    mom_t2i = [[0.8 / temp, 0.6 / temp, -1.0 / temp], [0.6 / temp, 0.8 / temp, 0.0 / temp]]   # txt_m . img_m_all
    sim_i2t = [[1.0 / temp, 0.0, 0.0], [0.0, 1.0 / temp, -1.0 / temp]]                       # img . txt_m_all
    sim_t2i = [[(0.48 + 0.48) / temp, (0.36 + 0.64) / temp, -0.6 / temp],                   # txt . img_m_all
               [(0.64 + 0.36) / temp, (0.48 + 0.48) / temp, -0.8 / temp]]

    def direction(sim, mom):
        total = 0.0
        for i in range(2):
            soft = _softmax(mom[i])
            y = [alpha * soft[j] + (1 - alpha) * targets[i][j] for j in range(3)]
            logp = _log_softmax(sim[i])
            total += -sum(logp[j] * y[j] for j in range(3))
        return total / 2

    expected = 0.5 * (direction(sim_i2t, mom_i2t) + direction(sim_t2i, mom_t2i))
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    # the queue matters: without it the value differs clearly
    alone = model_mod.blip_itc_loss(img, txt, img_m, txt_m, torch.tensor(temp), alpha, torch.tensor([0, 1]))
    assert abs(float(alone) - expected) > 0.05


def test_without_queue_distillation_or_shared_images_it_is_the_in_batch_infonce():
    gen = torch.Generator().manual_seed(0)
    img = F.normalize(torch.randn(5, 8, generator=gen), dim=-1)
    txt = F.normalize(torch.randn(5, 8, generator=gen), dim=-1)
    temp = torch.tensor(0.07)
    ours = model_mod.blip_itc_loss(img, txt, img, txt, temp, 0.0, torch.arange(5))
    torch.testing.assert_close(ours, training.clip_loss(img @ txt.T / temp))


def test_gradients_reach_the_student_only():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    txt = torch.tensor([[0.6, 0.8], [0.8, 0.6]], requires_grad=True)
    img_m = torch.tensor([[0.8, 0.6], [0.6, 0.8]], requires_grad=True)
    txt_m = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    model_mod.blip_itc_loss(img, txt, img_m, txt_m, torch.tensor(0.5), 0.4, torch.tensor([0, 1])).backward()
    assert img.grad.abs().sum() > 0 and txt.grad.abs().sum() > 0
    assert img_m.grad is None and txt_m.grad is None


# ------------------------------------------------------------------------------------- same-image positives
def test_same_image_mask_gives_every_caption_of_the_image_as_positive():
    ids = torch.tensor([3, 5, 3])
    candidates = torch.tensor([3, 5, 3, 3, model_mod.NO_IMAGE])   # the batch, then the queue
    targets = model_mod.same_image_targets(ids, candidates)
    expected = torch.tensor([[1 / 3, 0, 1 / 3, 1 / 3, 0], [0, 1, 0, 0, 0], [1 / 3, 0, 1 / 3, 1 / 3, 0]])
    torch.testing.assert_close(targets, expected)
    assert (targets > 0).sum(dim=1).tolist() == [3, 1, 3]


# ----------------------------------------------------------------------------------------- ITM negatives
def test_hard_negatives_are_never_a_pair_of_the_same_image():
    # rows 0 and 1 show one image; each strongly prefers the other (logit 50), which is the diagonal-only draw's
    # pick, so masking only the pair itself would choose the same image nearly always
    logits = torch.tensor([[9.0, 50.0, 0.0, 0.0],
                           [50.0, 9.0, 0.0, 0.0],
                           [0.0, 0.0, 9.0, 50.0],
                           [0.0, 0.0, 50.0, 9.0]])
    ids = torch.tensor([7, 7, 1, 2])
    same = ids[:, None] == ids[None, :]
    w_i2t, w_t2i = model_mod.blip_negative_weights(logits, same)
    for w in (w_i2t, w_t2i):
        assert torch.all(w[same] == 0.0)              # decisive: exactly zero, never drawn
        assert torch.all(w[~same] > 0.0)
    plain_text, _ = model_mod.blip_negatives(logits, torch.Generator().manual_seed(0))
    assert plain_text[:2].tolist() == [1, 0]         # without the mask: the same image
    for seed in range(50):
        neg_text, neg_image = model_mod.blip_negatives(logits, torch.Generator().manual_seed(seed), same)
        for neg in (neg_text, neg_image):
            assert not same[torch.arange(4), neg].any()
    # a batch of one image: no allowed negative anywhere (-1), and the ITM loss has no negative term
    all_same = torch.ones(3, 3, dtype=torch.bool)
    t, i = model_mod.blip_negatives(torch.zeros(3, 3), torch.Generator().manual_seed(0), all_same)
    assert t.tolist() == [-1, -1, -1] and i.tolist() == [-1, -1, -1]


def test_the_same_mask_draw_is_deterministic_given_the_generator():
    logits = torch.randn(6, 6, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([0, 0, 1, 1, 2, 3])
    same = ids[:, None] == ids[None, :]
    a = model_mod.blip_negatives(logits, torch.Generator().manual_seed(4), same)
    b = model_mod.blip_negatives(logits, torch.Generator().manual_seed(4), same)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# ------------------------------------------------------------------------------------ momentum and queues
def test_momentum_update_is_the_ema(tiny_blip):
    from transformers import BlipForImageTextRetrieval

    model = BlipForImageTextRetrieval.from_pretrained(tiny_blip)
    mom = model_mod.BlipMomentum(model, momentum=0.995, queue_size=8)
    for name in mom.PARTS:   # starts as a copy, frozen
        for p_m, p in zip(getattr(mom, name).parameters(), getattr(model, name).parameters()):
            assert torch.equal(p_m, p) and not p_m.requires_grad and p_m.data_ptr() != p.data_ptr()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen))
    old = {name: [p.detach().clone() for p in getattr(mom, name).parameters()] for name in mom.PARTS}
    mom.update(model)
    for name in mom.PARTS:
        for p_old, p_m, p in zip(old[name], getattr(mom, name).parameters(), getattr(model, name).parameters()):
            torch.testing.assert_close(p_m, 0.995 * p_old + 0.005 * p)
    assert not any(p.requires_grad for p in mom.parameters())


def test_queue_enqueue_wraps_around_the_pointer(tiny_blip):
    from transformers import BlipForImageTextRetrieval

    mom = model_mod.BlipMomentum(BlipForImageTextRetrieval.from_pretrained(tiny_blip), queue_size=5)
    dim = mom.image_queue.shape[1]
    assert mom.idx_queue.tolist() == [model_mod.NO_IMAGE] * 5 and int(mom.queue_ptr) == 0
    torch.testing.assert_close(mom.image_queue.norm(dim=1), torch.ones(5))   # BLIP starts with unit vectors

    def feats(start, n):
        return torch.arange(start, start + n, dtype=torch.float32)[:, None].expand(n, dim).clone()

    mom.enqueue(feats(10, 3), -feats(10, 3), torch.tensor([10, 11, 12]))
    assert mom.idx_queue.tolist() == [10, 11, 12, -100, -100] and int(mom.queue_ptr) == 3
    mom.enqueue(feats(20, 3), -feats(20, 3), torch.tensor([20, 21, 22]))   # 3, 4, then wraps to 0
    assert mom.idx_queue.tolist() == [22, 11, 12, 20, 21] and int(mom.queue_ptr) == 1
    assert mom.image_queue[:, 0].tolist() == [22, 11, 12, 20, 21]
    assert mom.text_queue[:, 0].tolist() == [-22, -11, -12, -20, -21]
    mom.enqueue(feats(30, 7), -feats(30, 7), torch.arange(30, 37))           # larger than the queue: its last 5
    assert sorted(mom.idx_queue.tolist()) == [32, 33, 34, 35, 36] and int(mom.queue_ptr) == 1
    assert mom.idx_queue.tolist() == [36, 32, 33, 34, 35]


def test_alpha_ramps_linearly_over_the_ramp_steps(tiny_blip):
    a = adapter(tiny_blip)
    a.module.configure_blip("official", 0.995, 8, 0.4, ramp_steps=10)
    assert [a.module.blip_alpha_at(s) for s in (0, 5, 10, 25)] == pytest.approx([0.0, 0.2, 0.4, 0.4])
    a.module.configure_blip("official", 0.995, 8, 0.4, ramp_steps=0)
    assert a.module.blip_alpha_at(0) == pytest.approx(0.4)


# --------------------------------------------------------------------------------------- the module
def test_official_forward_updates_momentum_and_queue_in_training_only(tiny_blip, dataset):
    root, frame = dataset
    a = adapter(tiny_blip)
    a.module.configure_blip("official", momentum=0.995, queue_size=8, alpha=0.4, ramp_steps=2)
    mom = a.module.blip_momentum
    assert a.module.blip_objective == "official"
    batch = batch_of(a, root, frame, range(4), ids=[0, 0, 1, 2])
    a.module.eval()
    with torch.no_grad():
        out = a.module(**batch)
    assert int(mom.queue_ptr) == 0 and a.module.blip_step == 0      # validation changes nothing
    assert math.isfinite(float(out["itc_loss"])) and math.isfinite(float(out["itm_loss"]))
    a.module.train()
    torch.manual_seed(0)
    out = a.module(**batch)
    loss = training.recipe_loss(a.module, batch)   # a second training forward
    assert int(mom.queue_ptr) == 0 and a.module.blip_step == 2      # 2 x 4 rows: wrapped to the start
    assert mom.idx_queue.tolist() == [0, 0, 1, 2, 0, 0, 1, 2]
    assert math.isfinite(float(out["itc_loss"].detach())) and out["itc_loss"].requires_grad
    loss.backward()
    assert a.module.model.vision_proj.weight.grad is not None
    assert all(p.grad is None for p in mom.parameters())
    with pytest.raises(ConfigError, match="image id"):
        a.module(**batch_of(a, root, frame, range(4)))
    with pytest.raises(ConfigError, match="image id"):
        a.module(**batch_of(a, root, frame, range(4), ids=[0, -1, 1, 2]))
    # one image in the whole batch: no ITM negative can be drawn, the ITM loss is 0 (with a graph)
    itm = a.module(**batch_of(a, root, frame, range(3), ids=[5, 5, 5]))["itm_loss"]
    assert float(itm.detach()) == 0.0 and itm.requires_grad


def test_plain_objective_keeps_the_in_batch_losses(tiny_blip, dataset):
    root, frame = dataset
    a = adapter(tiny_blip)
    a.module.eval()
    batch = batch_of(a, root, frame, range(4))
    with torch.no_grad():
        before = a.module(**batch)
        a.module.configure_blip("plain")
        after = a.module(**batch)
    assert a.module.blip_momentum is None and "itc_loss" not in after
    assert float(before["itm_loss"]) == float(after["itm_loss"])
    with pytest.raises(ConfigError, match="objective"):
        a.module.configure_blip("momentum")


def test_image_ids_are_deterministic_and_reach_the_batch(tiny_blip, dataset):
    root, frame = dataset
    ids = image_id_map(frame)
    assert ids == image_id_map(frame.iloc[::-1])                    # the set of images, not the row order
    assert len(ids) == len(frame) - 1 and ids[frame["image_path"][0]] == ids[frame["image_path"][1]]
    a = adapter(tiny_blip)
    batch = Collator(frame, a, root, image_ids=ids)([0, 1, 2])
    assert batch[model_mod.IMAGE_IDS].tolist() == [ids[frame["image_path"][r]] for r in (0, 1, 2)]
    assert batch[model_mod.IMAGE_IDS][0] == batch[model_mod.IMAGE_IDS][1]
    assert model_mod.IMAGE_IDS not in Collator(frame, a, root)([0, 1, 2])   # plain: unchanged batches


def test_settings_carry_the_objective_from_the_recipe_section():
    from counterfactory.studies.spurious_retrieval import settings as st

    s = st.settings(None)
    blip = s["training"]["blip"]
    assert (blip["objective"], blip["momentum"], blip["queue_size"], blip["alpha"]) == ("official", 0.995, 57600, 0.4)
    ts = training.TrainSettings.from_section(st.training_section(s, "itm_blip", 1000), seed=0, data_seed=1)
    assert (ts.objective, ts.momentum, ts.queue_size, ts.alpha) == ("official", 0.995, 57600, 0.4)
    with pytest.raises(ConfigError, match="objective"):
        training.TrainSettings(lr=1e-3, batch_size=4, eval_batch_size=4, epochs=1, eval_every=10, objective="x")


# --------------------------------------------------------------------------------- training, saving
def test_official_training_is_deterministic_and_saves_a_plain_blip(tiny_blip, dataset, tmp_path):
    from safetensors import safe_open
    from transformers import BlipForImageTextRetrieval

    root, frame = dataset

    def run(out_dir):
        a = adapter(tiny_blip)
        s = training.TrainSettings(lr=1e-3, batch_size=4, eval_batch_size=4, epochs=1, eval_every=2, max_steps=2,
                                   seed=1, data_seed=2, objective="official", queue_size=8)
        return a, training.train(a, frame, frame, s, image_root=root, out_dir=out_dir)

    a, res = run(tmp_path / "ckpt")
    assert len(res.history) == 2 and all(math.isfinite(h["train_loss"]) for h in res.history)
    mom = a.module.blip_momentum
    assert mom is not None and int(mom.queue_ptr) == 0 and (mom.idx_queue >= 0).all()   # 2 steps x 4 rows
    _, res_b = run(tmp_path / "ckpt_b")
    assert [h["train_loss"] for h in res_b.history] == [h["train_loss"] for h in res.history]
    assert res_b.best_val_loss == res.best_val_loss

    files = sorted((tmp_path / "ckpt").glob("*.safetensors"))
    assert files
    keys = set()
    for f in files:
        with safe_open(str(f), "pt") as fh:
            keys |= set(fh.keys())
    assert not any(w in k for k in keys for w in ("momentum", "queue", "blip_temp", "idx_"))
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["architectures"] == ["BlipForImageTextRetrieval"]
    reloaded = BlipForImageTextRetrieval.from_pretrained(tmp_path / "ckpt")
    fresh = BlipForImageTextRetrieval.from_pretrained(tiny_blip)
    assert set(reloaded.state_dict()) == set(fresh.state_dict())
    for n, p in a.model.state_dict().items():
        assert torch.equal(p, reloaded.state_dict()[n]), n
