"""COCO-Counterfactuals appendix A.1: the withheld in-domain test set (Tables 5 and 7).

"We withhold 30% of the original-counterfactual paired examples in COCO-Counterfactuals for testing and
train [...] on the remainder, with 56% of the total dataset used for training and 14% used as a
development set." The unit is the counterfactual pair: a pair's two samples are always on one side.

* :func:`split_pairs`: pair id -> ``train`` / ``dev`` / ``test``; ``n_test`` = round-half-up(0.3 n), ``n_dev`` =
  round-half-up(0.2 (n - n_test)) (56 / 14 / 30 %), reproducible from ``random_state``;
* :func:`write_in_domain`: the split, the test pairs (images as absolute paths) and two training manifests in
  the mixtures' format (``split`` = train / val, the dev pairs validating): ``coco_cfs`` (both counterfactual
  samples of every train/dev pair) and ``mscoco`` (the real MS-COCO caption and image of the same pairs),
  the two fine-tuned rows of Table 5.

Fine-tuned runs are evaluated on the test pairs with ``counterfactory train run --eval-pairs``; the pre-trained
rows come from the ITR evaluation with the test pairs as a subset (``evaluate itr --subset``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import ConfigError
from ...io import write_csv, write_parquet
from ...training import mixtures as mx

SPLITS = ("train", "dev", "test")
MIXTURES = ("mscoco", "coco_cfs")


def split_pairs(ids, test_fraction: float = 0.3, dev_fraction: float = 0.2, random_state: int = 42) -> pd.DataFrame:
    """``id, split`` for every pair id (sorted), split by pair into train / dev / test."""
    if not (0 < test_fraction < 1 and 0 <= dev_fraction < 1):
        raise ConfigError(f"in_domain: test_fraction {test_fraction} must be in (0, 1) and dev_fraction "
                          f"{dev_fraction} in [0, 1). Fix: the paper uses 0.3 and 0.2 (56 / 14 / 30 %)")
    ids = np.array(sorted(str(i) for i in ids))
    if len(set(ids)) != len(ids):
        raise ConfigError("in_domain: duplicate pair ids. Fix: split the image stage's selected pairs")
    n_test = mx.round_half_up(test_fraction * len(ids))
    n_dev = mx.round_half_up(dev_fraction * (len(ids) - n_test))
    order = np.random.default_rng(random_state).permutation(len(ids))
    split = np.empty(len(ids), dtype=object)
    split[order[:n_test]] = "test"
    split[order[n_test:n_test + n_dev]] = "dev"
    split[order[n_test + n_dev:]] = "train"
    return pd.DataFrame({"id": ids, "split": split})


def _absolute(paths) -> list[str]:
    return [str(Path(p).resolve()) for p in paths]


def write_in_domain(cfg: dict, pairs_path: str | Path, captions_path: str | Path, out_dir: str | Path) -> pd.DataFrame:
    """Write ``split.parquet``, ``test_pairs.parquet``, ``manifests/<mixture>.parquet`` and ``summary.csv``
    under ``out_dir``; return the summary (per mixture: training / validation sizes, and the test size)."""
    from ...evaluation import read_pairs

    section = cfg["in_domain"]
    pairs = read_pairs(pairs_path)
    pairs = pairs.assign(image_0=_absolute(pairs["image_0"]), image_1=_absolute(pairs["image_1"]))
    split = split_pairs(pairs["id"], section["test_fraction"], section["dev_fraction"], section["random_state"])
    pairs = pairs.merge(split, on="id")
    out_dir = Path(out_dir)
    write_parquet(out_dir / "split.parquet", split)
    write_parquet(out_dir / "test_pairs.parquet", pairs[pairs["split"] == "test"].drop(columns="split"))
    keep = pairs[pairs["split"] != "test"]
    side = np.where(keep["split"] == "train", "train", "val")
    caption_ids = keep["caption_id"] if "caption_id" in keep else keep["id"]
    real = mx.real_table(pd.read_parquet(captions_path), Path(cfg["data"]["coco_root"]) / cfg["data"]["split"])
    real = real.set_index("caption_id")
    missing = [c for c in caption_ids if c not in real.index]
    if missing:
        raise ConfigError(f"{captions_path}: caption {missing[0]} of a selected pair is not in the caption table. "
                          "Fix: build the pairs and the caption table in the same run")
    frames = {
        "mscoco": pd.DataFrame({"image_path": real.loc[caption_ids, "image_path"].to_numpy(),
                                "caption": real.loc[caption_ids, "caption"].to_numpy(), "is_counterfactual": False,
                                "pair_id": [f"real:{i}" for i in keep["id"]], "split": side}),
        "coco_cfs": pd.DataFrame({
            "image_path": np.concatenate([keep["image_0"], keep["image_1"]]),
            "caption": np.concatenate([keep["caption_0"], keep["caption_1"]]), "is_counterfactual": True,
            "pair_id": [f"cf:{i}" for i in keep["id"]] * 2, "split": np.concatenate([side, side])}),
    }
    for name in section["mixtures"]:
        if name not in frames:
            raise ConfigError(f"in_domain.mixtures: unknown {name!r}. Fix: use {', '.join(MIXTURES)}")
        write_parquet(out_dir / "manifests" / f"{name}.parquet", frames[name][mx.MANIFEST_COLUMNS])
    summary = mx.summary({name: frames[name] for name in section["mixtures"]})
    write_csv(out_dir / "summary.csv", summary)
    return summary
