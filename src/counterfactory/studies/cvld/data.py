"""The study's data: COCO / Flickr30K captions (Karpathy splits), the nested COCO subsets of Tables 2 and 4, and the
editing requests (one per example to intervene on).

* :func:`captions`: one row per caption with its image file and split (``restval`` trains, as in BLIP).
* :func:`subset_of`: COCO "10%" / "1%" are drawn by a hash of (image id, ``data.subset_seed``), so a smaller subset
  is always inside a larger one and membership does not depend on the file's order.
* :func:`coco_requests`: the accepted interventions of the largest subset's training images (appendix B's majority
  vote), with the edit prompt (InstructPix2Pix) and the source / target captions (null-text + Prompt-to-Prompt) of
  the first caption that voted for the winning edit.
* :func:`celeba_requests`: every CelebA training image some K-shot episode uses, with §3.3's manual prompts chosen by
  its ``Male`` label.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from ...data.karpathy import image_paths, load_karpathy
from ...errors import ConfigError, input_error

CAPTION_COLUMNS = ["caption_id", "image_id", "split", "caption", "image_path"]
REQUEST_COLUMNS = ["item_id", "dataset", "image_id", "image_path", "edit_prompt", "source_prompt", "target_prompt",
                   "shard"]


def _paths(s: dict, dataset: str, keys: tuple[str, ...]) -> dict:
    src = s["data"][dataset]
    missing = [k for k in keys if not src.get(k)]
    if missing:
        raise ConfigError(f"cvld.data.{dataset}: no {', '.join(missing)}. Fix: point it at the official files "
                          "(docs/studies/cvld.md)")
    return src


def captions(s: dict, dataset: str = "coco") -> pd.DataFrame:
    """:data:`CAPTION_COLUMNS` of the Karpathy file's train (train + restval) and test images."""
    src = _paths(s, dataset, ("karpathy_json", "image_root"))
    table = load_karpathy(src["karpathy_json"])
    mapping = {name: ours for ours, theirs in s["data"]["splits"].items() for name in theirs}
    table = table[table["split"].isin(mapping)].copy()
    table["split"] = table["split"].map(mapping)
    for split in ("train", "test") if dataset == "coco" else ("test",):   # checked before any work (issue 45.8)
        if not (table["split"] == split).any():
            theirs = ", ".join(k for k, v in mapping.items() if v == split)
            raise input_error(src["karpathy_json"], f"split {split!r}", f"no images in the {split} split (Karpathy "
                              f"splits {theirs}; cvld.data.splits); the runs would train or evaluate on nothing",
                              f"use a Karpathy file with {split} images or change cvld.data.splits")
    table["image_path"] = image_paths(table, src["image_root"], src["karpathy_json"])
    table["caption_id"] = table["image_id"].astype(str) + "_" + \
        table.groupby("image_id", sort=False).cumcount().astype(str)
    limit = s["data"]["limit_test"]
    if limit is not None:
        test_ids = table.loc[table["split"] == "test", "image_id"].drop_duplicates().iloc[:int(limit)]
        table = table[(table["split"] != "test") | table["image_id"].isin(test_ids)]
    return table[CAPTION_COLUMNS].reset_index(drop=True)


def nocaps(s: dict) -> tuple[list[str], list[list[str]], list]:
    """The nocaps validation images, their human captions and ids, from the public annotation file
    (``data.nocaps.annotations``: COCO caption format, ``images`` with ``id`` and ``file_name``, ``annotations``
    with ``image_id`` and ``caption``). Images without a caption are left out."""
    import json

    src = _paths(s, "nocaps", ("annotations", "image_root"))
    path = Path(src["annotations"])
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise input_error(path, None, f"cannot read the nocaps annotations ({exc})",
                          "point cvld.data.nocaps.annotations at nocaps_val_4500_captions.json") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list) or \
            not isinstance(doc.get("annotations"), list):
        raise input_error(path, None, "expected an object with 'images' and 'annotations' lists",
                          "use the nocaps validation annotation file (COCO caption format)")
    refs: dict = {}
    for i, ann in enumerate(doc["annotations"]):
        if not isinstance(ann, dict) or "image_id" not in ann or not isinstance(ann.get("caption"), str):
            raise input_error(path, f"annotations[{i}]", "needs an image_id and a caption string",
                              "use the nocaps validation annotation file")
        refs.setdefault(ann["image_id"], []).append(ann["caption"])
    root = Path(src["image_root"])
    images, captions, ids = [], [], []
    for i, img in enumerate(doc["images"]):
        if not isinstance(img, dict) or "id" not in img or not isinstance(img.get("file_name"), str):
            raise input_error(path, f"images[{i}]", "needs an id and a file_name", "use the nocaps validation file")
        if img["id"] in refs:
            images.append(str(root / img["file_name"]))
            captions.append(refs[img["id"]])
            ids.append(img["id"])
    return images, captions, ids


def unit_hash(key: str) -> float:
    """A stable number in [0, 1) from ``key`` (sha1; the same in every process)."""
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big") / 2.0 ** 64


def subset_of(image_ids, fraction: float, seed: int = 0) -> np.ndarray:
    """Boolean membership of COCO's ``fraction`` subset (nested across fractions, see the module docstring)."""
    return np.array([unit_hash(f"{seed}:{i}") < float(fraction) for i in image_ids], dtype=bool)


def shard_of(item_id: str, shards: int) -> int:
    return int(unit_hash(f"shard:{item_id}") * int(shards))


def coco_requests(s: dict, interventions: pd.DataFrame, votes: pd.DataFrame) -> pd.DataFrame:
    """One editing request per accepted training image of the largest subset. ``interventions``: one row per
    caption (``caption_id, image_id, caption, intervened, edit_prompt``); ``votes``: the per-image majority vote
    (``image_id, edit_prompt, accepted``)."""
    accepted = votes[votes["accepted"]].set_index("image_id")["edit_prompt"]
    rows = interventions[interventions["image_id"].isin(accepted.index)]
    rows = rows[rows["edit_prompt"].to_numpy() == accepted.reindex(rows["image_id"]).to_numpy()]
    first = rows.drop_duplicates("image_id")
    shards = s["editing"]["shards"]
    out = pd.DataFrame({
        "item_id": [f"coco_{i}" for i in first["image_id"]], "dataset": "coco", "image_id": first["image_id"],
        "image_path": first["image_path"], "edit_prompt": first["edit_prompt"], "source_prompt": first["caption"],
        "target_prompt": first["intervened"]})
    out["shard"] = [shard_of(i, shards) for i in out["item_id"]]
    return out[REQUEST_COLUMNS].reset_index(drop=True)


def celeba_requests(s: dict, images: pd.DataFrame) -> pd.DataFrame:
    """Requests for CelebA training images (``image_id, image_path, Male``) with the manual prompts of
    ``intervention.celeba_prompts`` (§3.3): men are edited into women and women into men."""
    prompts = s["intervention"]["celeba_prompts"]
    shards = s["editing"]["shards"]
    rows = []
    for r in images.itertuples(index=False):
        p = prompts["Male" if int(r.Male) == 1 else "Female"]
        item_id = f"celeba_{Path(str(r.image_id)).stem}"
        rows.append({"item_id": item_id, "dataset": "celeba", "image_id": r.image_id, "image_path": r.image_path,
                     "edit_prompt": p["edit"], "source_prompt": p["source"], "target_prompt": p["target"],
                     "shard": shard_of(item_id, shards)})
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)
