"""Invariants of the batch plans and learning-rate schedules that no end-to-end number would reveal.

Both were broken on purpose in a review and no test noticed: grouped batches growing past ``batch_size``
and CVLD's cosine schedule decaying every step instead of once per epoch (BLIP's ``cosine_lr_schedule``).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from counterfactory.training import cvld
from counterfactory.training.data import make_batches


def _grouped_frame(sizes: list[int]) -> pd.DataFrame:
    rows = [{"pair_id": f"g{g:03d}", "member": m} for g, n in enumerate(sizes) for m in range(n)]
    return pd.DataFrame(rows)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=30), batch_size=st.integers(1, 12),
       seed=st.integers(0, 2**16))
def test_grouped_batches_keep_groups_whole_and_never_exceed_batch_size(sizes, batch_size, seed):
    frame = _grouped_frame(sizes)
    batches = make_batches(frame, batch_size=batch_size, data_seed=seed, grouping=True)
    flat = [r for b in batches for r in b]
    assert sorted(flat) == list(range(len(frame)))  # every row exactly once
    group_of = frame["pair_id"].to_numpy()
    batch_of = {r: i for i, b in enumerate(batches) for r in b}
    for _, rows in frame.groupby("pair_id").indices.items():
        assert len({batch_of[int(r)] for r in rows}) == 1  # a group never split
    for b in batches:
        if len(b) > batch_size:
            # only a group larger than the batch may exceed it, and then it stands alone
            assert len({group_of[r] for r in b}) == 1 and len(b) == sizes[int(group_of[b[0]][1:])]
    if max(sizes) <= batch_size:
        assert all(len(b) <= batch_size for b in batches)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), batch_size=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_ungrouped_batches_are_full_except_the_last(n, batch_size, seed):
    frame = pd.DataFrame({"pair_id": [f"p{i}" for i in range(n)]})
    batches = make_batches(frame, batch_size=batch_size, data_seed=seed, grouping=False)
    assert sorted(r for b in batches for r in b) == list(range(n))
    assert all(len(b) == batch_size for b in batches[:-1]) and 1 <= len(batches[-1]) <= batch_size


@pytest.mark.parametrize("n_keys,batch_size,epochs", [(10, 3, 3), (8, 8, 4), (7, 2, 2)])
def test_cvld_cosine_schedule_is_constant_within_an_epoch(n_keys, batch_size, epochs):
    """CVLD app. C follows BLIP's fine-tuning configs: ``lr_e = lr * 0.5 * (1 + cos(pi * e / E))`` set once
    per epoch e, so every step of an epoch uses the same rate and the first epoch the full rate."""
    weight = torch.nn.Parameter(torch.ones(3))
    run = cvld.CVLDSettings(task="retrieval", epochs=epochs, lr=0.1, batch_size=batch_size, lam=0.3, seed=5)
    keys = [f"k{i}" for i in range(n_keys)]
    history = cvld._fit([weight], keys, run, lambda rows, gen: (weight ** 2).sum() * len(rows))
    per_epoch = math.ceil(n_keys / batch_size)
    assert len(history) == per_epoch * epochs
    for h in history:
        expected = 0.1 * 0.5 * (1 + math.cos(math.pi * h["epoch"] / epochs))
        assert h["lr"] == pytest.approx(expected, rel=1e-12, abs=1e-15), h
    assert [h["epoch"] for h in history] == [e for e in range(epochs) for _ in range(per_epoch)]


def test_cvld_max_steps_cuts_the_run_but_not_the_schedule():
    weight = torch.nn.Parameter(torch.ones(2))
    run = cvld.CVLDSettings(task="retrieval", epochs=4, lr=1.0, batch_size=2, lam=0.3, max_steps=5)
    history = cvld._fit([weight], [f"k{i}" for i in range(4)], run, lambda rows, gen: weight.sum())
    quarter, half = 0.5 * (1 + math.cos(math.pi / 4)), 0.5 * (1 + math.cos(math.pi / 2))
    assert [h["lr"] for h in history] == pytest.approx([1.0, 1.0, quarter, quarter, half])
