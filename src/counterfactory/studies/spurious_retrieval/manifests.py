"""Training sets D, D ∪ D' and the ODmAP queries (§4.1, Table 3, Figure 4).

* ``finetune``: D, every (image, caption) of the train split (five captions per image);
* ``ours`` and each Table 3 variant: D plus D' built from the train split's synthetic images — the image method's
  inpainted file with ``captions.per_image`` caption(s) of the text method per image (§4: one of five by default;
  which one is drawn with a seed from the item id);
* ``ratio_<r>`` (Figure 4): D plus ``round(r * |D|)`` rows drawn from the full D' of ``ours`` (every
  noun-phrase caption of every synthetic image, |D'| / |D| ≈ 0.4 on MS-COCO); capped at the pool with a warning;
* ``d_prime`` and ``d_s`` (appendix B, where ``mixtures.appendix_b_*`` name the dataset): D' of ``ours`` alone, and
  a random part D_s of D with as many rows as that D' (drawn with ``mixtures.random_state``);
* ``queries``: the test split's synthetic images (the ``ours`` image method) with their removed and present classes.

Every manifest holds the val split's real pairs (``split = val``) for checkpoint selection. Trainer columns:
``image_path, caption, is_counterfactual, pair_id, split`` plus ``source`` (``real`` / the variant) and ``item_id``.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import input_error
from ...io import write_csv, write_parquet
from .captions import item_seed
from .data import read_requests
from .settings import D_PRIME, D_S, FINETUNE, OURS, appendix_b, needed_variants, ratio_name

log = logging.getLogger(__name__)

QUERY_COLUMNS = ["item_id", "image_id", "image_path", "removed_categories", "present_categories"]


def inpainted_files(shard_dirs) -> dict[str, str]:
    """item id -> inpainted file from the ``shard.parquet`` of each shard folder."""
    out: dict[str, str] = {}
    for d in shard_dirs:
        d = Path(d)
        path = d / "shard.parquet"
        if not path.is_file():
            raise input_error(path, None, "inpainting shard manifest not found", "rerun that inpainting shard")
        for item, name in pd.read_parquet(path, columns=["item_id", "output_path"]).itertuples(index=False):
            out[str(item)] = str(d / name)
    return out


def _real(captions: pd.DataFrame, split: str, limit: int | None = None) -> pd.DataFrame:
    sub = captions[captions["split"] == split]
    if limit is not None and len(sub) > limit:
        sub = sub.sample(n=int(limit), random_state=0).sort_index()
    return pd.DataFrame({"image_path": sub["image_path"].to_numpy(), "caption": sub["caption"].to_numpy(),
                         "is_counterfactual": False, "pair_id": [f"real_{split}_{i}" for i in range(len(sub))],
                         "split": split, "source": "real",
                         "item_id": [f"{i}_{k}" for i, k in zip(sub["image_id"], sub["caption_index"])]})


def _pick(group: pd.DataFrame, per_image, salt: int) -> pd.DataFrame:
    if per_image == "all" or len(group) <= per_image:
        return group
    rng = random.Random(item_seed(str(group["item_id"].iloc[0]), salt))
    keep = sorted(rng.sample(range(len(group)), int(per_image)))
    return group.iloc[keep]


def variant_rows(s: dict, variant: str, synthetic: pd.DataFrame, files: dict[str, dict[str, str]],
                 per_image=None) -> pd.DataFrame:
    """D' rows of ``variant`` on the train split (``per_image`` default ``captions.per_image``)."""
    spec = s["mixtures"]["variants"][variant]
    per_image = s["captions"]["per_image"] if per_image is None else per_image
    images = files[spec["image"]]
    syn = synthetic[(synthetic["method"] == spec["text"]) & (synthetic["split"] == "train")
                    & synthetic["item_id"].isin(images)]
    salt = int(s["mixtures"]["random_state"])
    picked = [_pick(g, per_image, salt) for _, g in syn.groupby("item_id", sort=True)]
    syn = pd.concat(picked, ignore_index=True) if picked else syn.iloc[0:0]
    return pd.DataFrame({"image_path": [images[i] for i in syn["item_id"]], "caption": syn["caption"].to_numpy(),
                         "is_counterfactual": True,
                         "pair_id": [f"{variant}_{i}_{k}" for i, k in zip(syn["item_id"], syn["caption_index"])],
                         "split": "train", "source": variant, "item_id": syn["item_id"].to_numpy()})


def write_manifests(s: dict, dataset: str, requests: pd.DataFrame, captions: pd.DataFrame, synthetic: pd.DataFrame,
                    files: dict[str, dict[str, str]], out_dir) -> pd.DataFrame:
    """Write ``<mixture>.parquet`` for ``finetune``, every needed variant and every ratio, and ``queries.parquet``;
    return the summary (``mixture, real_rows, synthetic_rows, ratio, val_rows``), also ``summary.csv``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    real = _real(captions, "train")
    val = _real(captions, "val", s["training"]["val_rows"])
    n_real = len(real)
    frames = {FINETUNE: real}
    for variant in needed_variants(s, dataset):
        frames[variant] = pd.concat([real, variant_rows(s, variant, synthetic, files)], ignore_index=True)
    pool = variant_rows(s, OURS, synthetic, files, per_image="all")
    rng = np.random.default_rng(int(s["mixtures"]["random_state"]))
    order = rng.permutation(len(pool))
    for r in s["mixtures"]["ratios"]:
        want = int(np.floor(float(r) * n_real + 0.5))
        if want > len(pool):
            log.warning("ratio %g: %d synthetic rows wanted, the full D' has %d (|D'|/|D| = %.3f); using all", r,
                        want, len(pool), len(pool) / max(n_real, 1))
            want = len(pool)
        frames[ratio_name(r)] = pd.concat([real, pool.iloc[np.sort(order[:want])]], ignore_index=True)
    if appendix_b(s, dataset):
        d_prime = variant_rows(s, OURS, synthetic, files)
        frames[D_PRIME] = d_prime
        n = min(len(d_prime), n_real)
        keep = np.sort(np.random.default_rng(int(s["mixtures"]["random_state"]) + 1).permutation(n_real)[:n])
        frames[D_S] = real.iloc[keep].reset_index(drop=True)
    rows = []
    for name, frame in frames.items():
        full = pd.concat([frame, val], ignore_index=True)
        write_parquet(out_dir / f"{name}.parquet", full)
        n_syn = int(frame["is_counterfactual"].sum())
        rows.append({"mixture": name, "real_rows": int((~frame["is_counterfactual"].astype(bool)).sum()),
                     "synthetic_rows": n_syn,
                     "ratio": n_syn / n_real if n_real else float("nan"), "val_rows": len(val)})
    image_method = s["mixtures"]["variants"][OURS]["image"]
    test = requests[(requests["split"] == "test") & requests["item_id"].isin(files[image_method])]
    queries = pd.DataFrame({"item_id": test["item_id"].to_numpy(), "image_id": test["image_id"].to_numpy(),
                            "image_path": [files[image_method][i] for i in test["item_id"]],
                            "removed_categories": test["removed_categories"].to_numpy(),
                            "present_categories": test["present_categories"].to_numpy()}, columns=QUERY_COLUMNS)
    write_parquet(out_dir / "queries.parquet", queries)
    rows.append({"mixture": "queries", "real_rows": 0, "synthetic_rows": len(queries), "ratio": float("nan"),
                 "val_rows": 0})
    summary = pd.DataFrame(rows)
    write_csv(out_dir / "summary.csv", summary)
    return summary


def write_manifests_files(s: dict, dataset: str, requests_path, gallery_path, synthetic_paths,
                          inpainted: dict[str, list], out_dir) -> pd.DataFrame:
    """:func:`write_manifests` from files: the removal requests, the gallery captions, the synthetic caption tables
    (concatenated in order) and, per image method, its inpainting shard folders (``inpainted``)."""
    files = {method: inpainted_files(folders) for method, folders in inpainted.items()}
    synthetic = pd.concat([pd.read_parquet(p) for p in synthetic_paths], ignore_index=True)
    return write_manifests(s, dataset, read_requests(requests_path), pd.read_parquet(gallery_path), synthetic, files,
                           out_dir)
