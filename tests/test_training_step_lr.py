"""Step-decay learning rate (``lr_scheduler: step``; Kim et al. 2023 §4.1) on a tiny CLIP."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from counterfactory import training
from counterfactory.errors import ConfigError
from counterfactory.models import registry
from counterfactory.training import trainer as trainer_mod


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """12 rows (6 pairs) of small noisy images."""
    from counterfactory.testing import pair_images

    root = tmp_path_factory.mktemp("imgs")
    return root, pair_images(root, [f"number {i}" for i in range(6)], step=30)


def adapter(path):
    cfg = {"models": {"clip_train": {"source": str(path)}}}
    return training.ContrastiveAdapter(registry.load(cfg, "clip_train"), "transformers")


def settings(**kw):
    base = dict(lr=1e-3, batch_size=4, eval_batch_size=4, epochs=1, eval_every=1000, seed=1, data_seed=2,
                lr_scheduler="step", lr_step_epochs=1.0, lr_step_gamma=0.5)
    return training.TrainSettings(**{**base, **kw})


def expected(lr, gamma, size, n):
    return [lr * gamma ** (k // size) for k in range(n)]


@pytest.mark.parametrize("batch, step_epochs, gamma, size", [
    (4, 0.5, 0.5, 2),   # 3 steps an epoch, half an epoch = round(1.5) = 2 steps
    (2, 0.5, 0.5, 3),   # 6 steps an epoch: BLIP's "halved every half epoch"
    (4, 2.0, 0.25, 6),  # CLIP's "every 2 epochs" (3 steps an epoch)
    (12, 0.5, 0.5, 1),  # 1 step an epoch: at least one step between decays
])
def test_lr_after_k_steps_follows_the_step_formula(tiny_clip, dataset, batch, step_epochs, gamma, size):
    root, frame = dataset
    s = settings(batch_size=batch, epochs=3, lr_step_epochs=step_epochs, lr_step_gamma=gamma)
    per_epoch = trainer_mod.steps_per_epoch(frame, s)
    assert per_epoch == len(frame) / batch
    assert trainer_mod.step_size_of(s, per_epoch) == size
    res = training.train(adapter(tiny_clip), frame, frame, s, image_root=root)
    lrs = [h["lr"] for h in res.history]
    assert len(lrs) == 3 * len(frame) // batch
    np.testing.assert_allclose(lrs, expected(1e-3, gamma, size, len(lrs)), rtol=1e-12)


def test_max_steps_cuts_the_run_not_the_step_size(tiny_clip, dataset):
    """The step size comes from the whole plan's epochs, not from a plan cut by max_steps."""
    root, frame = dataset
    s = settings(batch_size=2, epochs=4, lr_step_epochs=0.5, max_steps=7)
    res = training.train(adapter(tiny_clip), frame, frame, s, image_root=root)
    np.testing.assert_allclose([h["lr"] for h in res.history], expected(1e-3, 0.5, 3, 7), rtol=1e-12)


def test_scheduler_is_a_lambda_lr_and_other_names_stay_the_trainers(tiny_clip, dataset, tmp_path):
    import torch

    root, frame = dataset
    t = training.build_trainer(adapter(tiny_clip), frame, frame, settings(batch_size=2, lr_step_epochs=0.5),
                               root, tmp_path / "a")
    t.create_optimizer_and_scheduler(num_training_steps=6)
    assert isinstance(t.lr_scheduler, torch.optim.lr_scheduler.LambdaLR) and t.lr_step_size == 3
    assert t.args.lr_scheduler_type.value == "constant"
    u = training.build_trainer(adapter(tiny_clip), frame, frame, settings(lr_scheduler="cosine"), root,
                               tmp_path / "b")
    u.create_optimizer_and_scheduler(num_training_steps=6)
    assert u.args.lr_scheduler_type.value == "cosine" and u.lr_step_size is None


def test_step_factor_with_warmup():
    f = trainer_mod.step_lr_factor
    assert [f(k, 2, 0.5) for k in range(6)] == [1, 1, 0.5, 0.5, 0.25, 0.25]
    assert [f(k, 2, 0.5, warmup_steps=2) for k in range(4)] == [0, 0.5, 0.5, 0.5]


def _section(repo):
    from counterfactory.config import load_config

    return dict(load_config([repo / "config" / "demo.yaml"])["training"])


def test_sections_without_the_new_keys_still_load(repo):
    section = _section(repo)
    for k in training.TrainSettings.OPTIONAL_KEYS:
        section.pop(k, None)
    s = training.TrainSettings.from_section(section, 1, 2)
    assert s.lr_step_epochs is None and s.lr_step_gamma == 0.5
    assert not set(training.TrainSettings.OPTIONAL_KEYS) & set(training.TrainSettings.SECTION_KEYS)


def test_sections_with_the_new_keys_use_them(repo):
    section = {**_section(repo), "lr_scheduler": "step", "lr_step_epochs": 0.5, "lr_step_gamma": 0.25}
    s = training.TrainSettings.from_section(section, 1, 2)
    assert (s.lr_scheduler, s.lr_step_epochs, s.lr_step_gamma) == ("step", 0.5, 0.25)
    assert training.settings_dict(s)["lr_step_epochs"] == 0.5


@pytest.mark.parametrize("bad, match", [
    ({"lr_step_epochs": None}, "lr_step_epochs > 0"),
    ({"lr_step_epochs": 0}, "lr_step_epochs > 0"),
    ({"lr_step_epochs": -1.0}, "lr_step_epochs > 0"),
    ({"lr_step_epochs": "2"}, "lr_step_epochs > 0"),
    ({"lr_step_epochs": 2, "lr_step_gamma": 0.0}, "lr_step_gamma"),
    ({"lr_step_epochs": 2, "lr_step_gamma": 1.5}, "lr_step_gamma"),
    ({"lr_step_epochs": 2, "lr_step_gamma": -0.5}, "lr_step_gamma"),
])
def test_bad_step_values_are_config_errors_with_a_fix(repo, bad, match):
    section = {**_section(repo), "lr_scheduler": "step", **bad}
    with pytest.raises(ConfigError, match=match) as err:
        training.TrainSettings.from_section(section, 1, 2)
    assert "Fix:" in str(err.value)
    with pytest.raises(ConfigError, match=match):
        settings(**{"lr_step_epochs": None, **bad})


def test_step_keys_are_ignored_by_other_schedulers():
    s = settings(lr_scheduler="linear", lr_step_epochs=None, lr_step_gamma=7.0)
    assert dataclasses.replace(s, lr_step_gamma=0.5).lr_step_gamma == 0.5
