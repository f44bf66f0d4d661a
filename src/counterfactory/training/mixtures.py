"""Training mixtures of real MS-COCO and COCO-Counterfactuals (COCO-CF appendix B.3.1).

B.3.1 calls one (caption, image) a *sample*; a counterfactual *pair* is two samples. From N selected pairs
and their N real MS-COCO captions the paper builds:

* ``mscoco``: every real sample (N = 17,410);
* ``base``: 50 % of the real samples (8,705) + 25 % of the counterfactual **pairs** (4,352.5 -> 4,353 pairs,
  8,706 samples): 17,411 samples;
* ``medium``: all real samples + 75 % of the counterfactual **samples** (26,115 of 34,820): 43,525 samples,
  so some pairs contribute one member only;
* ``all``: all real samples + all 34,820 counterfactual samples: 52,230 samples.

A mixture is ``real_fraction`` (of the N real samples), ``cf_fraction`` and ``cf_unit`` (``pair``: a
fraction of the N pairs, both members of each; ``sample``: a fraction of the 2N samples). Counts round half
up (4,352.5 -> 4,353). Each mixture is split 80/20 with ``n_val = ceil(val_fraction * n)`` (as HF datasets'
``train_test_split``), giving 13,928 / 13,928 / 34,820 / 41,784 training samples (Tables 3, 4, 12).
``split_by``: ``sample`` splits samples at random (the paper); ``group`` (ours) keeps a pair's members on
one side and still hits ``n_val`` exactly by filling with single samples, or logs why it cannot.
Everything is drawn from one ``numpy.random.Generator`` seeded by ``random_state`` (the paper's splits had
no fixed state; ours are reproducible).
Manifest columns: ``image_path, caption, is_counterfactual, pair_id, split``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.splits import exact as _exact
from ..data.splits import round_half_up
from ..errors import input_error

log = logging.getLogger(__name__)

MANIFEST_COLUMNS = ["image_path", "caption", "is_counterfactual", "pair_id", "split"]
CF_UNITS = ("pair", "sample")
SPLIT_MODES = ("sample", "group")


@dataclass(frozen=True)
class MixtureSpec:
    name: str
    real_fraction: float
    cf_fraction: float
    cf_unit: str = "pair"

    def __post_init__(self):
        if self.cf_unit not in CF_UNITS:
            raise ValueError(f"mixture {self.name!r}: cf_unit must be one of {CF_UNITS}, got {self.cf_unit!r}")


def mixture_specs(section: dict) -> list[MixtureSpec]:
    return [MixtureSpec(name, float(v["real_fraction"]), float(v["cf_fraction"]), str(v.get("cf_unit", "pair")))
            for name, v in section["mixtures"].items()]


def n_validation(n: int, val_fraction: float) -> int:
    """``ceil(val_fraction * n)`` as HF datasets' ``train_test_split``, leaving at least one training sample."""
    if n < 2:
        return 0
    return min(int(math.ceil(_exact(val_fraction * n))), n - 1)


def _sample(n_total: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted positions of ``round_half_up(fraction * n_total)`` of ``range(n_total)``, drawn without replacement."""
    k = min(round_half_up(fraction * n_total), n_total)
    if k >= n_total:
        return np.arange(n_total)
    return np.sort(rng.choice(n_total, size=k, replace=False))


def _split_samples(n: int, n_val: int, rng: np.random.Generator) -> np.ndarray:
    is_val = np.zeros(n, dtype=bool)
    is_val[rng.permutation(n)[:n_val]] = True
    return is_val


def _split_groups(group_codes: np.ndarray, n_val: int, rng: np.random.Generator, name: str) -> np.ndarray:
    """Whole groups (a pair's sampled members, or one real sample) to validation, exactly ``n_val`` samples:
    groups are taken in random order while they fit; a shortfall of one is filled with a single sample
    (or by swapping a chosen single for a pair)."""
    sizes = np.bincount(group_codes)
    order = rng.permutation(len(sizes))
    cum = np.cumsum(sizes[order])
    k = int(np.searchsorted(cum, n_val, side="right"))  # the first k groups in `order` fit
    chosen = list(order[:k])
    rest = order[k:]
    total = int(cum[k - 1]) if k else 0
    if total < n_val:  # short by one: the next group in order is a pair
        singles_left = rest[sizes[rest] == 1]
        chosen_singles = [g for g in chosen if sizes[g] == 1]
        pairs_left = rest[sizes[rest] == 2]
        if len(singles_left):
            chosen.append(singles_left[0])
        elif chosen_singles and len(pairs_left):
            chosen.remove(chosen_singles[-1])
            chosen.append(pairs_left[0])
        else:
            log.warning("mixture %s: split_by=group cannot give exactly %d validation samples (only pairs left); "
                        "using %d", name, n_val, total)
    return np.isin(group_codes, np.asarray(chosen, dtype=group_codes.dtype))


def build_mixture(pairs: pd.DataFrame, real: pd.DataFrame, spec: MixtureSpec, random_state: int,
                  val_fraction: float = 0.2, split_by: str = "sample") -> pd.DataFrame:
    """One manifest. ``pairs``: ``id, caption_0, caption_1, image_0, image_1`` (the image stage's
    selected pairs, ``id`` = caption id). ``real``: ``caption_id, caption, image_path``."""
    if split_by not in SPLIT_MODES:
        raise ValueError(f"split_by must be one of {SPLIT_MODES}, got {split_by!r}")
    rng = np.random.default_rng(random_state)
    by_id = pairs.assign(id=pairs["id"].astype(str)).sort_values("id", kind="stable").reset_index(drop=True)
    pair_ids = by_id["id"].to_numpy()
    real = real.assign(caption_id=real["caption_id"].astype(str)).drop_duplicates("caption_id").set_index("caption_id")
    missing = pd.Index(pair_ids).difference(real.index)
    if len(missing):
        missing = set(missing)
        first = next(p for p in pair_ids if p in missing)
        raise input_error("caption table", f"caption_id {first}", "counterfactual pair without its real caption",
                          "build the mixtures from the same run's caption table and image pairs")
    n = len(pair_ids)

    real_ids = pair_ids[_sample(n, spec.real_fraction, rng)]
    real_rows = pd.DataFrame({"image_path": real.loc[real_ids, "image_path"].to_numpy(),
                              "caption": real.loc[real_ids, "caption"].to_numpy(), "is_counterfactual": False,
                              "pair_id": [f"real:{i}" for i in real_ids]})

    if spec.cf_unit == "pair":
        idx = _sample(n, spec.cf_fraction, rng)
        pos, member = np.repeat(idx, 2), np.tile([0, 1], len(idx))
    else:  # sample: position 2 * pair + member in the 2N counterfactual samples
        flat = _sample(2 * n, spec.cf_fraction, rng)
        pos, member = flat // 2, flat % 2
    chosen = by_id.iloc[pos]
    cf_rows = pd.DataFrame({
        "image_path": np.where(member == 0, chosen["image_0"].to_numpy(), chosen["image_1"].to_numpy()),
        "caption": np.where(member == 0, chosen["caption_0"].to_numpy(), chosen["caption_1"].to_numpy()),
        "is_counterfactual": True, "pair_id": [f"cf:{i}" for i in chosen["id"]]})

    frame = pd.concat([real_rows, cf_rows], ignore_index=True)[MANIFEST_COLUMNS[:-1]]
    frame["is_counterfactual"] = frame["is_counterfactual"].astype(bool)
    n_val = n_validation(len(frame), val_fraction)
    if split_by == "sample":
        is_val = _split_samples(len(frame), n_val, rng)
    else:
        is_val = _split_groups(pd.factorize(frame["pair_id"])[0], n_val, rng, spec.name)
    frame["split"] = np.where(is_val, "val", "train")
    return frame


def real_table(captions: pd.DataFrame, image_dir: str | Path) -> pd.DataFrame:
    """``caption_id, caption, image_path`` from the caption table and the COCO image folder."""
    return pd.DataFrame({
        "caption_id": captions["caption_id"].astype(str),
        "caption": captions["caption"],
        "image_path": [str(Path(image_dir) / f) for f in captions["file_name"]],
    })


def summary(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """|D_train|, |D_train^CF| and % CFs per mixture (the columns of COCO-CF Tables 3, 4, 12)."""
    rows = []
    for name, f in frames.items():
        train = f[f["split"] == "train"]
        n_cf = int(train["is_counterfactual"].sum())
        rows.append({"mixture": name, "n_train": len(train), "n_cf": n_cf,
                     "pct_cf": round(100 * n_cf / len(train), 1) if len(train) else 0.0, "n_val": int((f["split"] == "val").sum())})
    return pd.DataFrame(rows)
