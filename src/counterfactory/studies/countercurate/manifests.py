"""CounterCurate fine-tuning manifests (Zhang et al., 2024, §3.5, §4.1, §4.2): the three datasets' training pairs as
trainer manifests per variant, and as conversation tables for the generative family.

:func:`write_manifests` reads each dataset table (:func:`read_dataset`), keeps its training images (Positions' 4:1
split by image, §4.2; all of Counting and Attributes, §4.1, or a :func:`split_by_image` option), optionally holds
some out for validation, and writes one trainer manifest per dataset and
variant (:func:`manifest_frame`) and the ``vlm`` conversation tables (:func:`vlm_frame`). The variants, settings and
runs are :mod:`.training`, which re-exports every name here.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from ...data import flickr30k_entities as f30k
from ...errors import input_error
from ...io import write_csv, write_parquet
from .positions import split_images
from .training import DATASETS, MANIFEST_COLUMNS, NEEDS, SUMMARY_COLUMNS, VLM_MIXTURE, settings, variants_info

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# manifests
# ----------------------------------------------------------------------------------------------------------------
def _absolute(value, base: Path) -> str:
    p = Path(str(value))
    return str(p if p.is_absolute() else (base / p).resolve())


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == ""


def _attributes_images(cfg: Mapping | None, images_dir: str | Path | None) -> Path | None:
    """Where Flickr30k-Attributes' positive images are: ``images_dir``, else ``data.images``, else
    ``<data.entities_root>/flickr30k-images`` (the table has ``image_id`` but no ``image_path``)."""
    if images_dir:
        return Path(images_dir)
    data = (cfg or {}).get("data") or {}
    if data.get("images"):
        return Path(data["images"])
    if data.get("entities_root"):
        return Path(data["entities_root"]) / f30k.IMAGES
    return None


def read_dataset(path: str | Path, dataset: str, cfg: Mapping | None = None,
                 images_dir: str | Path | None = None) -> pd.DataFrame:
    """One dataset table as pairs ``item_id, image_id, image_path, caption, negative_image, negative_caption,
    subset, split`` (``split`` train/test where the table has one, else None); paths absolute (relative ones
    against the table's folder)."""
    path = Path(path)
    if not path.is_file():
        raise input_error(path.resolve(), None, f"{dataset} dataset not found",
                          "run 'counterfactory countercurate datasets' first (or pass --datasets)")
    frame = pd.read_parquet(path).reset_index(drop=True)
    if dataset == "attributes":
        frame = frame.rename(columns={"negative": "negative_caption"})
        if "status" in frame.columns:
            frame = frame[frame["status"] == "accepted"].reset_index(drop=True)
        if "image_path" not in frame.columns:
            root = _attributes_images(cfg, images_dir)
            if root is None and len(frame):
                raise input_error(path, None, "no image_path column and no Flickr30k images folder to find the "
                                  "positive images in", "pass --images DIR or set countercurate.data.images / "
                                  "data.entities_root")
            frame["image_path"] = [str(root / f"{i}.jpg") if root is not None else None for i in frame["image_id"]]
    need = ["item_id", "image_id", "image_path", "caption", "negative_caption", "negative_image"]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {', '.join(missing)}",
                          "use the table written by 'counterfactory countercurate datasets'")
    dup = frame["item_id"].astype(str).duplicated()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise input_error(path, f"row {i} (item_id {frame['item_id'].iloc[i]!r})", "item_id repeated",
                          "item ids identify training pairs; make them unique")
    out = frame[need].copy()
    out["item_id"] = out["item_id"].astype(str)
    out["image_id"] = out["image_id"].astype(str)
    for col in ("subset", "split"):
        out[col] = [None if _missing(v) else str(v) for v in frame[col]] if col in frame.columns else None
    base = path.parent
    for col in ("image_path", "negative_image"):
        out[col] = [None if _missing(v) else _absolute(v, base) for v in out[col]]
    return out


def split_by_image(image_ids, fraction: float, random_state: int, sides=("train", "test")) -> dict[str, str]:
    """``{image_id: side}``: §4.2's 4:1 split by image (``fraction`` of the images on the first side), the same
    rule as :func:`.positions.split_images` (sorted ids shuffled with ``random_state``)."""
    split = split_images(image_ids, fraction, random_state)
    return {k: (sides[0] if v == "train" else sides[1]) for k, v in split.items()}


def _check_files(pairs: pd.DataFrame, source: Path, needs_negative_image: bool) -> None:
    for i, row in enumerate(pairs.itertuples(index=False)):
        cols = (("image_path", "positive image"), ("negative_image", "negative image"))
        for col, what in cols if needs_negative_image else cols[:1]:
            value = getattr(row, col)
            if _missing(value) or not Path(value).is_file():
                raise input_error(source, f"row {row.row} (item_id {row.item_id!r})",
                                  f"{what} {'missing' if _missing(value) else 'file not found: ' + str(value)}",
                                  "rerun the generation / datasets steps for this item or drop it from the table")


def manifest_frame(pairs: pd.DataFrame, variant: str, dataset: str) -> pd.DataFrame:
    """Trainer manifest rows of ``pairs`` (which carry ``split`` train/val).

    ``grouping`` / ``no_grouping``: one *group* per distinct positive (image, caption) of a side: the positive
    once, then every negative (``negative_image``, ``negative_caption``, ``is_counterfactual``) of its items, all
    sharing ``pair_id`` = the first item's id (§3.5: a positive is grouped with its negatives; on
    Flickr30k-Attributes a caption has up to three negatives -- noun, adjective, swap -- so a group has up to four
    rows and the positive never appears twice in a batch; on Positions and Counting each item is its own group of
    two). ``no_negatives`` keeps one row per distinct positive. The single-negative variants keep the positive
    rows with the pair's negative caption (``no_negative_images``) or image (``no_negative_captions``) as the
    row's hard negative."""
    base = {"pair_id": pairs["item_id"], "split": pairs["split"], "item_id": pairs["item_id"],
            "image_id": pairs["image_id"], "dataset": dataset, "subset": pairs["subset"]}
    pos = pd.DataFrame({"image_path": pairs["image_path"], "caption": pairs["caption"], "is_counterfactual": False,
                        **base})
    if variant == "no_negatives":
        out = pos.drop_duplicates(subset=["split", "image_path", "caption"], keep="first")
    elif variant in ("no_negative_images", "no_negative_captions"):
        column, source = (("hard_negative_caption", "negative_caption") if variant == "no_negative_images"
                          else ("hard_negative_image", "negative_image"))
        return pos.assign(**{column: pairs[source].to_numpy()})[[*MANIFEST_COLUMNS, column]].reset_index(drop=True)
    else:
        key = (pairs["split"].astype(str) + "\x1f" + pairs["image_path"].astype(str) + "\x1f"
               + pairs["caption"].astype(str)).reset_index(drop=True)
        first_row = key.groupby(key, sort=False).transform(lambda k: k.index[0]).to_numpy()
        group_id = pairs["item_id"].to_numpy()[first_row]
        pos = pos.reset_index(drop=True).assign(pair_id=group_id, order=first_row)
        neg = pd.DataFrame({"image_path": pairs["negative_image"], "caption": pairs["negative_caption"],
                            "is_counterfactual": True, **base}).reset_index(drop=True)
        neg = neg.assign(pair_id=group_id, order=first_row)
        out = pd.concat([pos[~key.duplicated().to_numpy()], neg])
        out = out.sort_values(["order", "is_counterfactual"], kind="stable")  # a group's rows together, positive first
    return out[MANIFEST_COLUMNS].reset_index(drop=True)


def vlm_frame(pairs: pd.DataFrame) -> pd.DataFrame:
    """Rows of :func:`.vlm.read_pairs` (``image_path, caption, negative_caption, negative_image_path``): each pair
    becomes the conversations of :func:`.vlm_finetune.conversations` (its positive and its negative image)."""
    from .vlm import COLUMNS, NEGATIVE_IMAGE

    frame = pairs.rename(columns={"negative_image": NEGATIVE_IMAGE})
    return frame[[*COLUMNS, NEGATIVE_IMAGE, "item_id", "image_id"]].reset_index(drop=True)


def write_manifests(datasets_dir: str | Path, out_dir: str | Path, cfg: Mapping | None = None, *,
                    images_dir: str | Path | None = None) -> pd.DataFrame:
    """Write ``<dataset>_<variant>.parquet`` for every configured dataset and variant, ``<dataset>_images.csv``
    (``image_id, split``: train / val / test, the record of both splits) and ``summary.csv``; return the summary
    (``dataset, variant, split, rows, pairs, images``).

    Only training images are used: Flickr30k-Positions' own ``split == train`` (§4.2's 4:1 split); Counting and
    Attributes are fine-tuned on the whole curated set (``train_fraction: 1``, §4.1: their benchmarks are
    PointQA-LookTwice and SugarCrepe), or, as an option (ours), split by image with ``train_fraction`` (0.8 =
    §4.2's 4:1 rule). ``val_fraction`` (0 in the paper config; ours) of the training images go to ``split = val``
    (validation, checkpoint selection with ``checkpoint: best_val``): whole images, so a pair and every pair of
    the same image stay on one side. A missing positive or negative image file is an error naming the table and
    the row."""
    s = settings(cfg)
    datasets_dir, out_dir = Path(datasets_dir), Path(out_dir)

    rows = []
    for dataset in [d for d in DATASETS if d in s["datasets"] or d in s["vlm"]["datasets"]]:
        source = datasets_dir / f"{dataset}.parquet"
        pairs = read_dataset(source, dataset, cfg, images_dir).assign(row=lambda f: np.arange(len(f)))
        ids = sorted(set(pairs["image_id"]))
        if dataset == "positions" and pairs["split"].notna().all():
            side = dict(zip(pairs["image_id"], pairs["split"]))
        else:
            side = split_by_image(ids, float(s["train_fraction"]), int(s["random_state"]))
        train_ids = [i for i in ids if side[i] == "train"]
        val = split_by_image(train_ids, 1.0 - float(s["val_fraction"]), int(s["random_state"]) + 1, ("train", "val")) \
            if s["val_fraction"] > 0 else {i: "train" for i in train_ids}
        side.update(val)
        write_csv(out_dir / f"{dataset}_images.csv",
                  pd.DataFrame({"image_id": ids, "split": [side[i] for i in ids]}, columns=["image_id", "split"]))
        pairs["split"] = pairs["image_id"].map(side)
        pairs = pairs[pairs["split"].isin(["train", "val"])]
        if pairs.empty:
            log.warning("%s: no training pairs; its manifests are empty", source)
        if dataset in s["vlm"]["datasets"]:
            _check_files(pairs, source, True)
            for split in ("train", "val"):
                part = pairs[pairs["split"] == split]
                write_parquet(out_dir / f"{dataset}_{VLM_MIXTURE}_{split}.parquet", vlm_frame(part))
                rows.append({"dataset": dataset, "variant": VLM_MIXTURE, "split": split, "rows": len(part),
                             "pairs": part["item_id"].nunique(), "images": part["image_id"].nunique()})
        for variant in s["variants"][dataset] if dataset in s["datasets"] else []:
            _check_files(pairs, source, NEEDS[variant][0])
            frame = manifest_frame(pairs, variant, dataset)
            write_parquet(out_dir / f"{dataset}_{variant}.parquet", frame)
            for split in ("train", "val"):
                part = frame[frame["split"] == split]
                rows.append({"dataset": dataset, "variant": variant, "split": split, "rows": len(part),
                             "pairs": part["pair_id"].nunique(), "images": part["image_id"].nunique()})
    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    write_csv(out_dir / "summary.csv", summary)
    write_csv(out_dir / "variants.csv", variants_info())
    return summary
