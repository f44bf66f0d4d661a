"""Trainer (COCO-CF B.3.2 / CounterCurate grouping / CVLD eq. 3) on a tiny CLIP and synthetic images."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from counterfactory import training
from counterfactory.models import registry


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    from counterfactory.models import tiny

    out = tmp_path_factory.mktemp("clip")
    tiny.build("clip_eval", out)
    return out / "clip_eval"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """8 pairs: original + counterfactual, distinct solid-colour images and captions."""
    root = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    rows = []
    colours = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"]
    for i, c in enumerate(colours):
        for cf in (0, 1):
            arr = (rng.random((32, 32, 3)) * 60 + (i * 24 + cf * 100) % 255).astype(np.uint8)
            name = f"{i}_{cf}.png"
            Image.fromarray(arr).save(root / name)
            rows.append({"image_path": name, "caption": f"a {c} {'dog' if cf == 0 else 'cat'}",
                         "is_counterfactual": bool(cf), "pair_id": f"p{i}"})
    return root, pd.DataFrame(rows)


def adapter(path):
    cfg = {"models": {"clip_train": {"source": str(path)}}}
    return training.ContrastiveAdapter(registry.load(cfg, "clip_train"), "transformers")


def test_loss_decreases_on_tiny_overfit_set(tiny_clip, dataset):
    root, frame = dataset
    a = adapter(tiny_clip)
    s = training.TrainSettings(lr=1e-3, weight_decay=0.0, batch_size=16, epochs=30, eval_every=1000, seed=1,
                               data_seed=2)
    res = training.train(a, frame, frame, s, image_root=root)
    losses = [h["train_loss"] for h in res.history]
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])
    assert np.mean(losses[-3:]) < np.log(16)  # better than chance for a batch of 16


def test_grouping_keeps_each_pair_in_one_batch(dataset):
    _, frame = dataset
    for seed in range(5):
        batches = training.make_batches(frame, batch_size=5, data_seed=seed, grouping=True)
        where = {}
        for b, rows in enumerate(batches):
            for r in rows:
                where.setdefault(frame.at[r, "pair_id"], set()).add(b)
        assert all(len(v) == 1 for v in where.values())
        assert sorted(r for rows in batches for r in rows) == list(range(len(frame)))


def test_cvld_lambda_zero_equals_plain_training_on_originals(tiny_clip, dataset):
    root, frame = dataset
    common = dict(lr=1e-4, weight_decay=0.01, batch_size=4, epochs=1, eval_every=1000, seed=3, data_seed=4)
    a = adapter(tiny_clip)
    training.train(a, frame, frame, training.TrainSettings(recipe="cvld", cvld_lambda=0.0, **common), image_root=root)
    b = adapter(tiny_clip)
    originals = frame[~frame["is_counterfactual"]]
    training.train(b, originals, frame, training.TrainSettings(recipe="plain", **common), image_root=root)
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n
    c = adapter(tiny_clip)
    training.train(c, frame, frame, training.TrainSettings(recipe="cvld", cvld_lambda=1.0, **common), image_root=root)
    assert any(not torch.equal(p, q) for p, q in zip(a.model.parameters(), c.model.parameters()))


def test_same_seeds_give_identical_weights(tiny_clip, dataset, tmp_path):
    root, frame = dataset
    s = training.TrainSettings(lr=1e-4, batch_size=4, epochs=1, eval_every=2, seed=5, data_seed=6)
    runs = []
    for k in range(2):
        a = adapter(tiny_clip)
        res = training.train(a, frame, frame, s, image_root=root, out_dir=tmp_path / f"run{k}")
        runs.append((a, res))
    for p, q in zip(runs[0][0].model.parameters(), runs[1][0].model.parameters()):
        assert torch.equal(p, q)
    assert runs[0][1].best_step == runs[1][1].best_step >= 2
    assert (tmp_path / "run0" / "model.safetensors").exists()
    other = adapter(tiny_clip)
    training.train(other, frame, frame, training.TrainSettings(**{**s.__dict__, "data_seed": 7}), image_root=root)
    assert any(not torch.equal(p, q) for p, q in zip(other.model.parameters(), runs[0][0].model.parameters()))


def test_bad_manifest_names_file_and_fix(tmp_path):
    from counterfactory.errors import InputError

    path = tmp_path / "m.csv"
    pd.DataFrame({"image_path": ["a.png"], "caption": ["x"]}).to_csv(path, index=False)
    with pytest.raises(InputError, match="m.csv.*missing columns"):
        training.read_manifest(path)


def test_open_clip_checkpoint_reloads_through_the_registry(dataset, tmp_path):
    """An open_clip model trains with the same loop and its best checkpoint loads back as `local-dir:`."""
    from counterfactory.models import tiny

    tiny.build("clip_open_clip", tmp_path)
    root, frame = dataset
    cfg = {"models": {"clip_train": {"source": str(tmp_path / "clip_open_clip"), "library": "open_clip"}}}
    spec = registry.model_spec(cfg, "clip_train")
    a = training.ContrastiveAdapter(registry.load(cfg, "clip_train"), "open_clip", spec.local_path)
    s = training.TrainSettings(lr=1e-4, batch_size=4, epochs=1, eval_every=2, seed=1, data_seed=2, max_steps=2)
    training.train(a, frame, frame, s, image_root=root, out_dir=tmp_path / "ckpt")
    again = {"models": {"clip_train": {"source": str(tmp_path / "ckpt"), "library": "open_clip"}}}
    model = registry.load(again, "clip_train")[0]
    for (n, p), q in zip(a.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(p, q), n
