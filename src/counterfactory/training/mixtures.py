"""Training mixtures of real MS-COCO and COCO-Counterfactuals (COCO-CF appendix B.3.1).

* ``mscoco``: the real (caption, COCO image) of every caption that has a counterfactual pair;
* ``base``: 50 % of those real samples + 25 % of the counterfactual pairs;
* ``medium``: all real samples + 75 % of the counterfactual pairs;
* ``all``: all real samples + all counterfactual pairs.

Counterfactual pairs are sampled as pairs (both members or neither), and the 80/20 train/validation
split is made by pair, with a fixed ``random_state`` (the paper's splits were not reproducible; ours are).
Manifest columns: ``image_path, caption, is_counterfactual, pair_id, split``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import input_error

MANIFEST_COLUMNS = ["image_path", "caption", "is_counterfactual", "pair_id", "split"]


@dataclass(frozen=True)
class MixtureSpec:
    name: str
    real_fraction: float
    cf_pair_fraction: float


def mixture_specs(section: dict) -> list[MixtureSpec]:
    return [MixtureSpec(name, float(v["real_fraction"]), float(v["cf_pair_fraction"]))
            for name, v in section["mixtures"].items()]


def _sample(ids: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    n = int(round(fraction * len(ids)))
    return np.sort(rng.choice(ids, size=n, replace=False)) if n < len(ids) else ids


def build_mixture(pairs: pd.DataFrame, real: pd.DataFrame, spec: MixtureSpec, random_state: int,
                  val_fraction: float = 0.2) -> pd.DataFrame:
    """One manifest. ``pairs``: ``id, caption_0, caption_1, image_0, image_1`` (the image stage's
    selected pairs, ``id`` = caption id). ``real``: ``caption_id, caption, image_path``."""
    rng = np.random.default_rng(random_state)
    pair_ids = np.array(sorted(pairs["id"].astype(str)))
    real = real.set_index("caption_id")
    missing = [p for p in pair_ids if p not in real.index]
    if missing:
        raise input_error("caption table", f"caption_id {missing[0]}", "counterfactual pair without its real caption",
                          "build the mixtures from the same run's caption table and image pairs")
    real_ids = _sample(pair_ids, spec.real_fraction, rng)
    cf_ids = _sample(pair_ids, spec.cf_pair_fraction, rng)
    rows = [{"image_path": real.at[i, "image_path"], "caption": real.at[i, "caption"], "is_counterfactual": False,
             "pair_id": f"real:{i}"} for i in real_ids]
    by_id = pairs.assign(id=pairs["id"].astype(str)).set_index("id")
    for i in cf_ids:
        p = by_id.loc[i]
        rows.append({"image_path": p["image_0"], "caption": p["caption_0"], "is_counterfactual": True, "pair_id": f"cf:{i}"})
        rows.append({"image_path": p["image_1"], "caption": p["caption_1"], "is_counterfactual": True, "pair_id": f"cf:{i}"})
    frame = pd.DataFrame(rows, columns=MANIFEST_COLUMNS[:-1])
    groups = np.array(sorted(frame["pair_id"].unique()))
    n_val = int(round(val_fraction * len(groups)))
    val_groups = set(rng.choice(groups, size=n_val, replace=False)) if n_val else set()
    frame["split"] = np.where(frame["pair_id"].isin(val_groups), "val", "train")
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
