"""Mixtures (COCO-CF appendix B.3.1): sizes, pairs kept together, reproducible 80/20 split by pair."""

from __future__ import annotations

import pandas as pd
import pytest

from counterfactory.training import mixtures as mx


@pytest.fixture
def inputs():
    n = 40
    pairs = pd.DataFrame({"id": [f"{i}_0" for i in range(n)], "caption_0": [f"a dog {i}" for i in range(n)],
                          "caption_1": [f"a cat {i}" for i in range(n)], "image_0": [f"g/{i}_img_0.png" for i in range(n)],
                          "image_1": [f"g/{i}_img_1.png" for i in range(n)]})
    real = pd.DataFrame({"caption_id": [f"{i}_0" for i in range(n + 5)], "caption": [f"real {i}" for i in range(n + 5)],
                         "image_path": [f"coco/{i}.jpg" for i in range(n + 5)]})
    return pairs, real


SPECS = {"mscoco": (1.0, 0.0), "base": (0.5, 0.25), "medium": (1.0, 0.75), "all": (1.0, 1.0)}


@pytest.mark.parametrize("name", list(SPECS))
def test_mixture_sizes_follow_b31(inputs, name):
    pairs, real = inputs
    real_f, cf_f = SPECS[name]
    m = mx.build_mixture(pairs, real, mx.MixtureSpec(name, real_f, cf_f), random_state=42)
    assert (~m["is_counterfactual"]).sum() == round(40 * real_f)
    assert m["is_counterfactual"].sum() == 2 * round(40 * cf_f)
    assert list(m.columns) == mx.MANIFEST_COLUMNS


def test_pairs_stay_together_and_split_is_by_pair(inputs):
    pairs, real = inputs
    m = mx.build_mixture(pairs, real, mx.MixtureSpec("all", 1.0, 1.0), random_state=1)
    cf = m[m["is_counterfactual"]]
    assert (cf.groupby("pair_id").size() == 2).all()
    assert (cf.groupby("pair_id")["split"].nunique() == 1).all()
    groups = m["pair_id"].nunique()
    assert (m.groupby("pair_id")["split"].first() == "val").sum() == round(0.2 * groups)


def test_fixed_random_state_is_reproducible(inputs):
    pairs, real = inputs
    spec = mx.MixtureSpec("base", 0.5, 0.25)
    a = mx.build_mixture(pairs, real, spec, random_state=7)
    b = mx.build_mixture(pairs, real, spec, random_state=7)
    c = mx.build_mixture(pairs, real, spec, random_state=8)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_summary_columns(inputs):
    pairs, real = inputs
    frames = {n: mx.build_mixture(pairs, real, mx.MixtureSpec(n, *SPECS[n]), 0) for n in SPECS}
    s = mx.summary(frames).set_index("mixture")
    assert s.at["mscoco", "pct_cf"] == 0.0 and s.at["all", "pct_cf"] > 60


def test_pair_without_real_caption_is_an_error(inputs):
    from counterfactory.errors import InputError

    pairs, real = inputs
    with pytest.raises(InputError, match="caption_id 39_0"):
        mx.build_mixture(pairs, real[real["caption_id"] != "39_0"], mx.MixtureSpec("all", 1, 1), 0)
