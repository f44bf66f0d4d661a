"""Mixtures (COCO-CF appendix B.3.1): the paper's pool and training sizes from 17,410 pairs, the unit of
sampling (pairs for base, samples for medium/all), the ceil-based 80/20 split, group mode, reproducibility."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from counterfactory.errors import InputError
from counterfactory.training import mixtures as mx

ROOT = Path(__file__).resolve().parents[1]
N_PAPER = 17_410
# B.3.1 (a)-(d) as in config/config.yaml
PAPER = {"mscoco": mx.MixtureSpec("mscoco", 1.0, 0.0), "base": mx.MixtureSpec("base", 0.5, 0.25, "pair"),
         "medium": mx.MixtureSpec("medium", 1.0, 0.75, "sample"), "all": mx.MixtureSpec("all", 1.0, 1.0, "sample")}
# name: (pool size, real samples, CF samples in the pool, training size)
EXPECTED = {"mscoco": (17_410, 17_410, 0, 13_928), "base": (17_411, 8_705, 8_706, 13_928),
            "medium": (43_525, 17_410, 26_115, 34_820), "all": (52_230, 17_410, 34_820, 41_784)}


def make_inputs(n: int, extra_real: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    ids = [f"{i}_0" for i in range(n)]
    pairs = pd.DataFrame({"id": ids, "caption_0": [f"a dog {i}" for i in range(n)],
                          "caption_1": [f"a cat {i}" for i in range(n)], "image_0": [f"g/{i}_img_0.png" for i in range(n)],
                          "image_1": [f"g/{i}_img_1.png" for i in range(n)]})
    m = n + extra_real
    real = pd.DataFrame({"caption_id": [f"{i}_0" for i in range(m)], "caption": [f"real {i}" for i in range(m)],
                         "image_path": [f"coco/{i}.jpg" for i in range(m)]})
    return pairs, real


@pytest.fixture(scope="module")
def paper_inputs():
    return make_inputs(N_PAPER, extra_real=7)


@pytest.fixture(scope="module")
def paper_mixtures(paper_inputs):
    pairs, real = paper_inputs
    return {name: mx.build_mixture(pairs, real, spec, random_state=42, val_fraction=0.2, split_by="sample")
            for name, spec in PAPER.items()}


@pytest.fixture
def small():
    return make_inputs(40, extra_real=5)


@pytest.mark.parametrize("name", list(PAPER))
def test_paper_pool_and_training_sizes(paper_mixtures, name):
    m = paper_mixtures[name]
    pool, n_real, n_cf, n_train = EXPECTED[name]
    assert list(m.columns) == mx.MANIFEST_COLUMNS
    assert len(m) == pool
    assert (~m["is_counterfactual"]).sum() == n_real
    assert m["is_counterfactual"].sum() == n_cf
    train = m[m["split"] == "train"]
    assert len(train) == n_train
    assert (m["split"] == "val").sum() == pool - n_train
    # the training CF count is part of the pool's CFs, and the validation holds the rest
    assert 0 <= train["is_counterfactual"].sum() <= n_cf
    assert train["is_counterfactual"].sum() + m[m["split"] == "val"]["is_counterfactual"].sum() == n_cf
    assert not m.duplicated(["image_path", "caption"]).any()


def test_paper_cf_units(paper_mixtures):
    cf_sizes = {name: m[m["is_counterfactual"]].groupby("pair_id").size() for name, m in paper_mixtures.items()}
    assert (cf_sizes["base"] == 2).all() and len(cf_sizes["base"]) == 4_353  # 4,352.5 pairs round half up
    assert (cf_sizes["medium"] == 1).any() and (cf_sizes["medium"] == 2).any()  # samples, not pairs
    assert (cf_sizes["all"] == 2).all() and len(cf_sizes["all"]) == N_PAPER
    base_train_cf = int(paper_mixtures["base"].query("split == 'train'")["is_counterfactual"].sum())
    assert 6_000 < base_train_cf < 7_900  # ~80 % of 8,706 (Table 12 reports 6,939 for its own random split)


def test_summary_matches_table_sizes(paper_mixtures):
    s = mx.summary(paper_mixtures).set_index("mixture")
    assert s["n_train"].to_dict() == {n: e[3] for n, e in EXPECTED.items()}
    assert s.at["mscoco", "pct_cf"] == 0.0 and s.at["all", "pct_cf"] > 60
    assert list(s.reset_index().columns) == ["mixture", "n_train", "n_cf", "pct_cf", "n_val"]


@pytest.mark.parametrize("name", ["base", "medium", "all"])
def test_group_split_keeps_pairs_together_and_is_exact(paper_inputs, name):
    pairs, real = paper_inputs
    m = mx.build_mixture(pairs, real, PAPER[name], random_state=3, split_by="group")
    pool, _, _, n_train = EXPECTED[name]
    assert len(m) == pool and (m["split"] == "train").sum() == n_train
    assert (m.groupby("pair_id")["split"].nunique() == 1).all()


def test_sample_split_may_separate_a_pair(paper_mixtures):
    m = paper_mixtures["all"]
    assert (m[m["is_counterfactual"]].groupby("pair_id")["split"].nunique() == 2).any()


def test_group_split_reports_when_exact_is_impossible(small, caplog):
    pairs, real = small
    # 40 pairs, nothing real: 80 samples in pairs only, n_val = 16 works; with val 0.21 -> ceil(16.8) = 17 cannot
    spec = mx.MixtureSpec("cf_only", 0.0, 1.0, "pair")
    assert (mx.build_mixture(pairs, real, spec, 0, 0.2, "group")["split"] == "val").sum() == 16
    with caplog.at_level(logging.WARNING, logger=mx.__name__):
        m = mx.build_mixture(pairs, real, spec, 0, 0.21, "group")
    assert (m["split"] == "val").sum() == 16
    assert "cannot give exactly 17 validation samples" in caplog.text


def test_group_split_swaps_a_single_for_a_pair(small):
    pairs, real = small
    # 1 real single + 40 pairs = 81; n_val = ceil(16.2) = 17 needs the single whatever the order
    spec = mx.MixtureSpec("one_real", 1 / 40, 1.0, "pair")
    for seed in range(20):
        m = mx.build_mixture(pairs, real, spec, seed, 0.2, "group")
        assert len(m) == 81 and (m["split"] == "val").sum() == 17
        assert (m.groupby("pair_id")["split"].nunique() == 1).all()


@pytest.mark.parametrize("split_by", ["sample", "group"])
def test_random_state_reproducible(small, split_by):
    pairs, real = small
    spec = mx.MixtureSpec("medium", 1.0, 0.75, "sample")
    a = mx.build_mixture(pairs, real, spec, random_state=7, split_by=split_by)
    b = mx.build_mixture(pairs, real, spec, random_state=7, split_by=split_by)
    c = mx.build_mixture(pairs, real, spec, random_state=8, split_by=split_by)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)
    # pair order in the input does not matter
    shuffled = pairs.sample(frac=1.0, random_state=1)
    pd.testing.assert_frame_equal(a, mx.build_mixture(shuffled, real, spec, random_state=7, split_by=split_by))


def test_rounding_and_validation_count():
    assert mx.round_half_up(0.25 * 17_410) == 4_353 and mx.round_half_up(0.5 * 17_411) == 8_706
    assert mx.round_half_up(2.5) == 3 and mx.round_half_up(2.4999) == 2
    assert [mx.n_validation(n, 0.2) for n in (17_410, 17_411, 43_525, 52_230)] == [3_482, 3_483, 8_705, 10_446]
    assert mx.n_validation(1, 0.2) == 0 and mx.n_validation(2, 0.2) == 1 and mx.n_validation(3, 0.9) == 2


def test_mixture_specs_from_config():
    section = {"mixtures": {"mscoco": {"real_fraction": 1.0, "cf_fraction": 0.0},
                            "medium": {"real_fraction": 1.0, "cf_fraction": 0.75, "cf_unit": "sample"}}}
    assert mx.mixture_specs(section) == [mx.MixtureSpec("mscoco", 1.0, 0.0, "pair"), PAPER["medium"]]
    with pytest.raises(ValueError, match="cf_unit"):
        mx.MixtureSpec("x", 1.0, 1.0, "pairs")


@pytest.mark.parametrize("name", ["config.yaml", "demo.yaml"])
def test_paper_and_demo_configs_use_b31_mixtures(name):
    from counterfactory.config import load_config

    view = load_config([ROOT / "config" / name], study="coco_counterfactuals")
    section = view["training"]
    assert section["split_by"] == "sample" and section["val_fraction"] == 0.2
    assert {s.name: s for s in mx.mixture_specs(section)} == PAPER


def test_schema_defaults_and_rejects_old_key():
    from counterfactory.config import ConfigError, load_config

    base = {"training": {"mixtures": {"m": {"real_fraction": 1.0, "cf_fraction": 0.5}}}}
    view = load_config([ROOT / "config" / "demo.yaml"], overrides=base, study="coco_counterfactuals")
    assert view["training"]["mixtures"]["m"]["cf_unit"] == "pair"
    old = {"training": {"mixtures": {"m": {"real_fraction": 1.0, "cf_pair_fraction": 0.5}}}}
    with pytest.raises(ConfigError):
        load_config([ROOT / "config" / "demo.yaml"], overrides=old, study="coco_counterfactuals")
    bad = {"training": {"split_by": "pair"}}
    with pytest.raises(ConfigError):
        load_config([ROOT / "config" / "demo.yaml"], overrides=bad, study="coco_counterfactuals")


def test_pair_without_real_caption_is_an_error(small):
    pairs, real = small
    with pytest.raises(InputError, match="caption_id 39_0"):
        mx.build_mixture(pairs, real[real["caption_id"] != "39_0"], mx.MixtureSpec("all", 1, 1), 0)


def test_no_real_or_no_cf(small):
    pairs, real = small
    m = mx.build_mixture(pairs, real, mx.MixtureSpec("none", 0.0, 0.0), 0)
    assert m.empty and list(m.columns) == mx.MANIFEST_COLUMNS
    m = mx.build_mixture(pairs, real, mx.MixtureSpec("cf", 0.0, 0.5, "sample"), 0)
    assert len(m) == 40 and m["is_counterfactual"].all() and m["is_counterfactual"].dtype == np.bool_
