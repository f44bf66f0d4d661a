"""Trainer (COCO-CF B.3.2 on transformers.Trainer / CounterCurate grouping / CVLD eq. 3) on tiny CLIPs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from transformers import TrainerCallback

from counterfactory import training
from counterfactory.models import registry


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """8 pairs: original + counterfactual, distinct noisy-colour images and captions."""
    from counterfactory.testing import pair_images

    root = tmp_path_factory.mktemp("imgs")
    return root, pair_images(root, ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"], step=24)


def adapter(path):
    cfg = {"models": {"clip_train": {"source": str(path)}}}
    return training.ContrastiveAdapter(registry.load(cfg, "clip_train"), "transformers")


def settings(**kw):
    base = dict(lr=1e-4, batch_size=4, eval_batch_size=4, epochs=1, eval_every=1000, seed=1, data_seed=2)
    return training.TrainSettings(**{**base, **kw})


class Spy(TrainerCallback):
    """Records the gradient norm after clipping (just before each optimizer step) and the optimizer."""

    def __init__(self):
        self.clipped, self.optimizer = [], None

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        self.clipped.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        self.optimizer = optimizer


def test_defaults_are_b32(repo):
    s = training.TrainSettings()
    assert (s.optimizer, s.adam_beta1, s.adam_beta2, s.adam_epsilon) == ("adamw_torch", 0.9, 0.999, 1e-8)
    assert (s.lr, s.weight_decay, s.lr_scheduler, s.warmup_steps, s.max_grad_norm) == (5e-7, 0.001, "linear", 0, 1.0)
    assert (s.epochs, s.batch_size, s.eval_batch_size, s.eval_every, s.max_length) == (30, 128, 128, 109, 77)
    from counterfactory.config import load_config

    section = load_config([repo / "config" / "config.yaml"])["training"]
    assert training.TrainSettings.from_section(section, 107, 108) == dataclasses.replace(s, seed=107, data_seed=108)


def test_loss_decreases_on_tiny_overfit_set(tiny_clip, dataset):
    root, frame = dataset
    a = adapter(tiny_clip)
    s = settings(lr=1e-3, weight_decay=0.0, batch_size=16, epochs=30)
    res = training.train(a, frame, frame, s, image_root=root)
    losses = [h["train_loss"] for h in res.history]
    assert len(losses) == 30
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])
    assert np.mean(losses[-3:]) < np.log(16)  # better than chance for a batch of 16


def test_schedule_is_linear_to_zero_without_warmup(tiny_clip, dataset):
    root, frame = dataset
    s = settings(lr=1e-3, epochs=2)  # 16 rows / 4 = 4 steps per epoch, 8 in all
    res = training.train(adapter(tiny_clip), frame, frame, s, image_root=root)
    lrs = [h["lr"] for h in res.history]
    total = len(lrs)
    assert total == 8
    for k in (0, 1, 4, 7):  # the rate step k+1 used: lr * (T - k) / T
        assert lrs[k] == pytest.approx(1e-3 * (total - k) / total, rel=1e-9)
    assert [h["epoch"] for h in res.history] == [0] * 4 + [1] * 4
    # max_steps: the decay spans max_steps
    res = training.train(adapter(tiny_clip), frame, frame, dataclasses.replace(s, max_steps=3), image_root=root)
    assert [h["lr"] for h in res.history] == pytest.approx([1e-3, 2e-3 / 3, 1e-3 / 3])


def test_gradients_are_clipped_to_max_grad_norm(tiny_clip, dataset):
    root, frame = dataset
    a = adapter(tiny_clip)
    with torch.no_grad():
        a.model.logit_scale.fill_(math.log(1e4))  # huge logits -> huge gradients
    spy = Spy()
    training.train(a, frame, frame, settings(max_steps=2), image_root=root, callbacks=[spy])
    assert spy.clipped == pytest.approx([1.0, 1.0], rel=1e-4)
    b = adapter(tiny_clip)
    with torch.no_grad():
        b.model.logit_scale.fill_(math.log(1e4))
    spy = Spy()
    training.train(b, frame, frame, settings(max_steps=2, max_grad_norm=0.0), image_root=root, callbacks=[spy])
    assert min(spy.clipped) > 10  # unclipped, the same batches have far larger gradients


def test_no_decay_group_holds_biases_and_layernorm_weights(tiny_clip, dataset):
    root, frame = dataset
    a = adapter(tiny_clip)
    spy = Spy()
    training.train(a, frame, frame, settings(max_steps=1, weight_decay=0.001), image_root=root, callbacks=[spy])
    names = {id(p): n for n, p in a.module.named_parameters()}
    groups = {g["weight_decay"]: {names[id(p)] for p in g["params"]} for g in spy.optimizer.param_groups}
    assert set(groups) == {0.001, 0.0}
    layer_norms = {f"{m}.weight" for m, mod in a.module.named_modules() if isinstance(mod, torch.nn.LayerNorm)}
    assert layer_norms and {n for n in names.values() if n.endswith(".bias")}
    assert groups[0.0] == layer_norms | {n for n in names.values() if n.endswith(".bias")}
    assert {"model.logit_scale", "model.text_model.embeddings.token_embedding.weight"} <= groups[0.001]
    assert not groups[0.0] & groups[0.001] and groups[0.0] | groups[0.001] == set(names.values())
    # configurable: an empty list decays everything; a glob exempts by name
    assert training.no_decay_parameter_names(a.module, []) == set()
    assert training.no_decay_parameter_names(a.module, ["*embedding*"]) == {
        n for n in names.values() if "embedding" in n}


def test_best_validation_checkpoint_is_kept(tiny_clip, dataset, tmp_path):
    """Validation captions are shuffled, so fitting the training pairs makes the validation loss rise;
    the checkpoint kept (and the weights left in the model) are those of the best evaluation."""
    root, frame = dataset
    val = frame.assign(caption=np.roll(frame["caption"].to_numpy(), 3))
    snapshots = {}

    class Snap(TrainerCallback):
        def on_evaluate(self, args, state, control, model=None, **kwargs):
            snapshots[state.global_step] = {k: v.detach().clone() for k, v in model.model.state_dict().items()}

    a = adapter(tiny_clip)
    res = training.train(a, frame, val, settings(lr=3e-3, epochs=4, eval_every=2), image_root=root,
                         out_dir=tmp_path / "ckpt", callbacks=[Snap()])
    evals = {h["step"]: h["val_loss"] for h in res.history if not math.isnan(h["val_loss"])}
    assert sorted(evals) == list(range(2, 17, 2))
    best = min(evals, key=evals.get)
    assert res.best_step == best < 16 and res.best_val_loss == pytest.approx(evals[best])
    kept = registry.load({"models": {"clip_train": {"source": str(tmp_path / "ckpt")}}}, "clip_train")[0]
    for name, value in kept.state_dict().items():
        assert torch.equal(value, snapshots[best][name]), name
        assert torch.equal(a.model.state_dict()[name], value), name
    assert not any(p.name.startswith(".trainer-") for p in tmp_path.iterdir())  # scratch checkpoints removed


def test_same_seeds_give_identical_losses_and_weights(tiny_clip, dataset, tmp_path):
    root, frame = dataset
    s = settings(epochs=1, eval_every=2, seed=5, data_seed=6)
    runs = []
    for k in range(2):
        a = adapter(tiny_clip)
        res = training.train(a, frame, frame, s, image_root=root, out_dir=tmp_path / f"run{k}")
        runs.append((a, res))
    assert pd.DataFrame(runs[0][1].history).equals(pd.DataFrame(runs[1][1].history))
    for p, q in zip(runs[0][0].model.parameters(), runs[1][0].model.parameters()):
        assert torch.equal(p, q)
    assert runs[0][1].best_step == runs[1][1].best_step >= 2
    assert (tmp_path / "run0" / "model.safetensors").exists()
    other = adapter(tiny_clip)
    res = training.train(other, frame, frame, dataclasses.replace(s, data_seed=7), image_root=root)
    assert [h["train_loss"] for h in res.history] != [h["train_loss"] for h in runs[0][1].history]


def test_results_do_not_depend_on_the_callers_thread_count(tiny_clip, dataset):
    root, frame = dataset
    before = torch.get_num_threads()
    losses = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            res = training.train(adapter(tiny_clip), frame, frame, settings(lr=1e-3, epochs=2), image_root=root)
            losses.append([h["train_loss"] for h in res.history])
    finally:
        torch.set_num_threads(before)
    assert losses[0] == losses[1]
    assert torch.get_num_threads() == before


# --------------------------------------------------------------------------- losses against HF's own loss

def _hf_loss(model, processor, frame, rows, root):
    """CLIPModel's built-in contrastive loss (return_loss=True): an independent implementation."""
    images = [Image.open(root / frame.at[r, "image_path"]).convert("RGB") for r in rows]
    enc = processor(text=frame.loc[list(rows), "caption"].tolist(), images=images, return_tensors="pt",
                    padding="max_length", max_length=77, truncation=True)
    return model(**enc, return_loss=True).loss


def test_cvld_loss_equals_independent_computation(tiny_clip, dataset):
    root, frame = dataset
    a = adapter(tiny_clip)
    a.module.eval()
    train_frame = frame.iloc[[0, 1, 2, 3, 4, 6, 8, 9]].reset_index(drop=True)  # pairs p0, p1, p4 and lone p2, p3
    anchors, partners = training.anchors_and_partners(train_frame)
    assert anchors == [0, 2, 4, 5, 6] and partners == {0: 1, 2: 3, 6: 7}
    collate = training.data.Collator(train_frame, a, root, partners)
    batch = collate([0, 2, 4, 6])
    assert batch["partner_pixel_values"].shape[0] == 3 and batch["input_ids"].shape == (4, 77)
    lam = 0.3
    with torch.no_grad():
        ours = training.recipe_loss(a.module, batch, lam)
        expected = _hf_loss(a.model, a.processor, train_frame, [0, 2, 4, 6], root) + \
            lam * _hf_loss(a.model, a.processor, train_frame, [1, 3, 7], root)
        assert float(ours) == pytest.approx(float(expected), rel=1e-5)
        assert float(training.recipe_loss(a.module, batch, 0.0)) == pytest.approx(
            float(_hf_loss(a.model, a.processor, train_frame, [0, 2, 4, 6], root)), rel=1e-5)
    # by hand on fixed embeddings: l = mean of the row and column cross-entropies around the diagonal
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.1, 1.0, 0.3], [0.0, 0.2, 3.0]])
    rows = -torch.log_softmax(logits, 1).diagonal().mean()
    cols = -torch.log_softmax(logits, 0).diagonal().mean()
    assert float(training.clip_loss(logits)) == pytest.approx(float((rows + cols) / 2))


def test_grouping_loss_and_batches(tiny_clip, dataset):
    root, frame = dataset
    for seed in range(5):
        batches = training.make_batches(frame, batch_size=5, data_seed=seed, grouping=True)
        where = {}
        for b, rows in enumerate(batches):
            for r in rows:
                where.setdefault(frame.at[r, "pair_id"], set()).add(b)
        assert all(len(v) == 1 for v in where.values())
        assert sorted(r for rows in batches for r in rows) == list(range(len(frame)))
    plan = training.step_plan(frame, 6, 2, data_seed=3, recipe="grouping")
    assert all(len(b.rows) % 2 == 0 for b in plan)
    a = adapter(tiny_clip)
    a.module.eval()
    collate = training.data.Collator(frame, a, root)
    rows = list(plan[0].rows)
    with torch.no_grad():
        ours = training.recipe_loss(a.module, collate(rows), 1.0)
        assert float(ours) == pytest.approx(float(_hf_loss(a.model, a.processor, frame, rows, root)), rel=1e-5)


def test_cvld_lambda_zero_equals_plain_training_on_anchors(tiny_clip, dataset):
    root, frame = dataset
    common = dict(weight_decay=0.01, seed=3, data_seed=4)
    a = adapter(tiny_clip)
    training.train(a, frame, frame, settings(recipe="cvld", cvld_lambda=0.0, **common), image_root=root)
    b = adapter(tiny_clip)
    originals = frame[~frame["is_counterfactual"]]
    training.train(b, originals, frame, settings(recipe="plain", **common), image_root=root)
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n
    c = adapter(tiny_clip)
    training.train(c, frame, frame, settings(recipe="cvld", cvld_lambda=1.0, **common), image_root=root)
    assert any(not torch.equal(p, q) for p, q in zip(a.model.parameters(), c.model.parameters()))


def test_bad_manifest_names_file_and_fix(tmp_path):
    from counterfactory.errors import InputError

    path = tmp_path / "m.csv"
    pd.DataFrame({"image_path": ["a.png"], "caption": ["x"]}).to_csv(path, index=False)
    with pytest.raises(InputError, match="m.csv.*missing columns"):
        training.read_manifest(path)


def test_section_missing_a_key_is_a_config_error(repo):
    from counterfactory.config import load_config
    from counterfactory.errors import ConfigError

    section = dict(load_config([repo / "config" / "demo.yaml"])["training"])
    del section["max_grad_norm"]
    with pytest.raises(ConfigError, match="max_grad_norm"):
        training.TrainSettings.from_section(section, 1, 2)


def test_open_clip_trains_and_its_checkpoint_reloads_through_the_registry(dataset, tmp_path):
    """An open_clip model trains with the same Trainer and its best checkpoint loads back as `local-dir:`."""
    from counterfactory.models import tiny

    tiny.build("clip_open_clip", tmp_path)
    root, frame = dataset
    cfg = {"models": {"clip_train": {"source": str(tmp_path / "clip_open_clip"), "library": "open_clip"}}}
    spec = registry.model_spec(cfg, "clip_train")
    a = training.ContrastiveAdapter(registry.load(cfg, "clip_train"), "open_clip", spec.local_path)
    exempt = training.no_decay_parameter_names(a.module, ["bias", "LayerNorm"])
    assert "model.ln_final.weight" in exempt and "model.transformer.resblocks.0.ln_1.weight" in exempt
    assert "model.text_projection" not in exempt
    res = training.train(a, frame, frame, settings(eval_every=2, max_steps=2), image_root=root,
                         out_dir=tmp_path / "ckpt")
    assert len(res.history) == 2 and res.best_step == 2
    again = {"models": {"clip_train": {"source": str(tmp_path / "ckpt"), "library": "open_clip"}}}
    model = registry.load(again, "clip_train")[0]
    for (n, p), q in zip(a.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(p, q), n


@pytest.mark.parametrize("role", ["itm_bridgetower", "itm_flava"])
def test_cross_encoders_train_with_their_itc_heads_and_reload_for_scoring(role, dataset, tmp_path):
    """COCO-CF A.1 fine-tunes BridgeTower and FLAVA too: their contrastive heads train on the same Trainer
    and the best checkpoint loads back through the registry, scoring with exactly the trained embeddings."""
    from counterfactory.models import tiny
    from counterfactory.scorers import scorer_from_config
    from counterfactory.training.runs import _adapter

    tiny.build(role, tmp_path)
    root, frame = dataset
    cfg = {"models": {role: {"source": str(tmp_path / role)}}}
    a = _adapter(cfg, role)
    assert a.kind == role.removeprefix("itm_")
    before = {n: p.detach().clone() for n, p in a.model.named_parameters()}
    res = training.train(a, frame, frame, settings(lr=1e-3, eval_every=2, max_steps=2), image_root=root,
                         out_dir=tmp_path / "ckpt")
    assert len(res.history) == 2 and all(math.isfinite(h["train_loss"]) for h in res.history)
    changed = [n for n, p in a.model.named_parameters() if not torch.equal(p, before[n])]
    assert any("itc" in n or "projection" in n for n in changed)
    # the checkpoint scores with the trained weights: same embeddings as the trained module
    scorer = scorer_from_config({"models": {role: {"source": str(tmp_path / "ckpt")}}}, role, head="itc")
    images = [str(root / p) for p in frame["image_path"][:4]]
    texts = frame["caption"][:4].tolist()
    a.module.eval()
    with torch.no_grad():
        batch = {**a.image_inputs([Image.open(p).convert("RGB") for p in images]), **a.tokens(texts)}
        out = a.module(**batch)
    np.testing.assert_allclose(scorer.encode_images(images), out["image_embeds"].numpy(), atol=1e-5)
    np.testing.assert_allclose(scorer.encode_texts(texts), out["text_embeds"].numpy(), atol=1e-5)


def test_bridgetower_loss_is_the_models_own_contrastive_loss(dataset, tmp_path):
    """Our BridgeTower objective (computed from the gathered embeddings) equals the class's return_loss."""
    from counterfactory.models import tiny
    from counterfactory.training.runs import _adapter

    tiny.build("itm_bridgetower", tmp_path)
    root, frame = dataset
    a = _adapter({"models": {"itm_bridgetower": {"source": str(tmp_path / "itm_bridgetower")}}}, "itm_bridgetower")
    a.model.eval()
    images = [Image.open(root / p).convert("RGB") for p in frame["image_path"][:6]]
    batch = {**a.image_inputs(images), **a.tokens(frame["caption"][:6].tolist())}
    with torch.no_grad():
        ours = training.recipe_loss(a.module, batch)
        theirs = a.model(**batch, return_loss=True).loss
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)


def test_classes_without_a_contrastive_adapter_are_refused():
    from counterfactory.errors import ConfigError

    with pytest.raises(ConfigError, match="ViltForImageAndTextRetrieval has no contrastive"):
        training.model_kind(type("ViltForImageAndTextRetrieval", (torch.nn.Module,), {})(), "transformers")


def test_hard_negatives_extend_the_batch_as_candidates_only(tiny_clip, dataset):
    """CounterCurate Table 4's single-negative rows: a row's hard-negative caption (image) is one more column (row)
    of the similarity matrix; only the pairs are anchors."""
    # by hand: 2 pairs, one extra caption (column 2) and one extra image (row 2)
    logits = torch.tensor([[2.0, 0.5, 1.5], [0.1, 1.0, 0.3], [0.4, 0.9, -0.2]])
    i2t = -torch.log_softmax(logits[:2], 1)[[0, 1], [0, 1]].mean()   # image anchors over all 3 captions
    t2i = -torch.log_softmax(logits[:, :2], 0)[[0, 1], [0, 1]].mean()  # caption anchors over all 3 images
    assert float(training.clip_loss(logits, n_pairs=2)) == pytest.approx(float((i2t + t2i) / 2))
    assert float(training.clip_loss(logits[:2, :2], n_pairs=2)) == pytest.approx(float(training.clip_loss(logits[:2, :2])))
    # a close hard negative caption raises the loss of its pair
    close = torch.tensor([[2.0, 0.5, 1.9], [0.1, 1.0, -5.0]])
    far = torch.tensor([[2.0, 0.5, -5.0], [0.1, 1.0, -5.0]])
    assert float(training.clip_loss(close, 2)) > float(training.clip_loss(far, 2))

    from counterfactory.training import data as tdata, model as tmodel

    root, frame = dataset
    pos = frame[~frame["is_counterfactual"]].reset_index(drop=True)
    neg = frame[frame["is_counterfactual"]].reset_index(drop=True)
    captions_only = pos.assign(hard_negative_caption=neg["caption"].where(pos.index != 1))  # row 1 has none
    a = adapter(tiny_clip)
    a.module.eval()
    batch = tdata.Collator(captions_only, a, root)([0, 1, 2])
    assert batch["pixel_values"].shape[0] == 3 and batch["input_ids"].shape[0] == 5 and int(batch["n_pairs"]) == 3
    with torch.no_grad():
        out = a.module(**{k: v for k, v in batch.items() if k != "n_pairs"})
        expected = training.clip_loss(tmodel.logits_of(out), 3)
        assert float(training.recipe_loss(a.module, batch)) == pytest.approx(float(expected), rel=1e-6)
        # the same rows without hard negatives give the plain loss (and no n_pairs)
        plain = tdata.Collator(captions_only, a, root, hard_negatives=False)([0, 1, 2])
        assert "n_pairs" not in plain and plain["input_ids"].shape[0] == 3
        assert float(training.recipe_loss(a.module, plain)) == pytest.approx(
            float(_hf_loss(a.model, a.processor, pos, [0, 1, 2], root)), rel=1e-5)
    images_only = pos.assign(hard_negative_image=neg["image_path"])
    batch = tdata.Collator(images_only, a, root)([3, 4])
    assert batch["pixel_values"].shape[0] == 4 and batch["input_ids"].shape[0] == 2
    # both kinds train (the Trainer carries n_pairs through to the loss) and are deterministic
    for frame_ in (captions_only, images_only):
        res = [training.train(adapter(tiny_clip), frame_, frame_.iloc[:2], settings(max_steps=2), root)
               for _ in range(2)]
        losses = [[h["train_loss"] for h in r.history] for r in res]
        assert losses[0] == losses[1] and len(losses[0]) >= 1 and all(math.isfinite(x) for x in losses[0])


def test_blank_hard_negative_is_an_error(tmp_path):
    path = tmp_path / "m.csv"
    pd.DataFrame({"image_path": ["a.png"], "caption": ["a dog"], "is_counterfactual": [False], "pair_id": ["p"],
                  "hard_negative_caption": ["  "]}).to_csv(path, index=False)
    with pytest.raises(Exception, match=r"m\.csv, record row 0: empty hard_negative_caption"):
        training.read_manifest(path)
