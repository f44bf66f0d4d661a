"""The datasets of the study and the removal requests (§3.1, §4.1).

* :func:`load_captions`: every caption of a dataset with its image file and split (Karpathy splits mapped by
  ``data.splits``: COCO's ``restval`` trains, §4.1 "113,287 images for training"); Flickr30k captions come from
  Flickr30k Entities' ``Sentences/`` (the same five captions, with the phrase annotations the study needs).
* :func:`select`: region selection (:mod:`.regions`) on the images of the Karpathy file, then one removal request
  per selected (image, class): the removed classes, the classes left in the image, and the boxes to erase as
  integer pixel boxes ``[x1, y1, x2, y2]`` covering exactly the pixels of the selection's masks (pixel-centre
  rule), the image file, the split and the shard. With ``selection.mask_mode: segmentation`` the request also carries
  the removed objects' COCO segmentations (``segmentation``: JSON ``{"size": [h, w], "objects": [...]}``, empty in
  box mode), which the inpainting step rasterises instead of the boxes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ...data import flickr30k_entities as fe
from ...data.check import check_image_sizes
from ...data.karpathy import image_paths, load_karpathy
from ...errors import ConfigError, input_error
from . import regions

log = logging.getLogger(__name__)

CAPTION_COLUMNS = ["image_id", "split", "caption_index", "caption", "image_path"]
REQUEST_COLUMNS = ["item_id", "dataset", "image_id", "split", "image_path", "category", "mode",
                   "removed_categories", "present_categories", "boxes", "removed_area_ratio", "shard",
                   "segmentation"]


def _source(s: dict, dataset: str) -> dict:
    src = s["data"][dataset]
    missing = [k for k in ("karpathy_json", "image_root") if not src.get(k)]
    if dataset == "coco" and not src.get("instances"):
        missing.append("instances")
    if dataset == "flickr30k" and not src.get("entities_root"):
        missing.append("entities_root")
    if missing:
        raise ConfigError(f"spurious_retrieval.data.{dataset}: no {', '.join(missing)}. Fix: point them at the "
                          "official files (docs/studies/spurious_retrieval.md)")
    return src


def _split_map(s: dict) -> dict[str, str]:
    out = {}
    for ours, theirs in s["data"]["splits"].items():
        for name in theirs:
            out[name] = ours
    return out


def load_captions(s: dict, dataset: str) -> pd.DataFrame:
    """:data:`CAPTION_COLUMNS` for every image of the Karpathy file in a mapped split (COCO: ``image_id`` = COCO
    id; Flickr30k: the image's file stem, as Flickr30k Entities names it)."""
    src = _source(s, dataset)
    table = load_karpathy(src["karpathy_json"], image_root=src["image_root"])
    mapping = _split_map(s)
    table = table[table["split"].isin(mapping)].copy()
    table["split"] = table["split"].map(mapping)
    table["image_path"] = image_paths(table, src["image_root"], src["karpathy_json"])
    if dataset == "flickr30k":
        table["image_id"] = table["filename"].map(lambda f: Path(f).stem)
        table = _flickr_sentences(src["entities_root"], table)
    table["caption_index"] = table.groupby("image_id", sort=False).cumcount()
    return table[CAPTION_COLUMNS].reset_index(drop=True)


def _flickr_sentences(root, table: pd.DataFrame) -> pd.DataFrame:
    """The Entities sentences (one row each) for the images of ``table``."""
    firsts = table.drop_duplicates("image_id")
    rows = []
    for im in fe.iter_images(root, list(firsts["image_id"])):
        info = firsts[firsts["image_id"] == im.image_id].iloc[0]
        for sentence in im.sentences:
            rows.append({"image_id": im.image_id, "split": info["split"], "caption": sentence,
                         "image_path": info["image_path"]})
    return pd.DataFrame(rows, columns=["image_id", "split", "caption", "image_path"])


def flickr_phrases(root, image_ids) -> dict[tuple[str, int], list]:
    """(image id, sentence index) -> the annotated phrases of that sentence."""
    out: dict[tuple[str, int], list] = {}
    for im in fe.iter_images(root, list(image_ids)):
        for phrase in im.phrases:
            out.setdefault((im.image_id, phrase.sentence_index), []).append(phrase)
    return out


def _objects(s: dict, dataset: str, params: dict, image_ids) -> tuple[pd.DataFrame, pd.DataFrame, list[str], str]:
    src = _source(s, dataset)
    if dataset == "flickr30k":
        images, objects, known = regions.flickr_objects(src["entities_root"], params["classes"], list(image_ids))
        return images, objects, known, str(src["entities_root"])
    parts = [regions.coco_objects(path) for path in src["instances"]]
    images = pd.concat([p[0] for p in parts], ignore_index=True)
    objects = pd.concat([p[1] for p in parts], ignore_index=True)
    known = list(dict.fromkeys(name for p in parts for name in p[2]))
    dup = images["image_id"].duplicated()
    if dup.any():
        row = images[dup].iloc[0]
        raise input_error(row["source"], row["record"], f"image id {row['image_id']} is in two instances files",
                          "list each instances file once (train2014 and val2014 are disjoint)")
    keep = images["image_id"].isin(set(image_ids))
    return images[keep], objects[objects["image_id"].isin(set(image_ids))], known, ", ".join(src["instances"])


def shard_of(item_id: str, shards: int) -> int:
    """Stable shard of an item (sha1 of its id): the layout does not depend on the order or number of items."""
    return int.from_bytes(hashlib.sha1(item_id.encode()).digest()[:8], "big") % int(shards)


def pixel_boxes(objects: pd.DataFrame, width: int, height: int) -> list[list[int]]:
    """Integer ``[x1, y1, x2, y2]`` boxes covering exactly the pixels :func:`regions.union_mask` covers."""
    x0, x1 = regions.pixel_spans(objects["x"].to_numpy(), objects["w"].to_numpy(), width)
    y0, y1 = regions.pixel_spans(objects["y"].to_numpy(), objects["h"].to_numpy(), height)
    return [[int(a), int(b), int(c), int(d)] for a, b, c, d in zip(x0, y0, x1, y1) if c > a and d > b]


def select(s: dict, params: dict, dataset: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(selection, requests)``: the selection table (:data:`regions.COLUMNS` + ``split``) of every image of the
    dataset's splits, and one request (:data:`REQUEST_COLUMNS`) per selected row."""
    captions = load_captions(s, dataset)
    first = captions.drop_duplicates("image_id").set_index("image_id")
    images, objects, known, source = _objects(s, dataset, params, first.index)
    missing = sorted(set(first.index) - set(images["image_id"]), key=str)
    if missing:
        log.warning("%s: %d images of the Karpathy file have no entry in the box annotations (e.g. %s); they have "
                    "no candidates", dataset, len(missing), missing[0])
    table = regions.select_regions(images, objects, params, source=source, known_classes=known)
    table.insert(1, "split", table["image_id"].map(first["split"]).to_numpy())
    groups = objects.groupby("image_id", sort=False)
    rows = []
    shards = s["inpaint"]["shards"]
    for r in table[table["selected"]].itertuples(index=False):
        objs = groups.get_group(r.image_id)
        removed = list(r.removed_categories)
        present = [c for c in dict.fromkeys(objs["category"]) if c not in removed]
        gone = objs[objs["category"].isin(removed)]
        boxes = pixel_boxes(gone, r.image_width, r.image_height)
        segmentation = json.dumps({"size": [int(r.image_height), int(r.image_width)],
                                   "objects": list(gone["segmentation"])}, default=_plain) \
            if params["mask_mode"] == "segmentation" else ""
        item_id = f"{dataset}_{r.image_id}_{r.category_id}"
        rows.append({"item_id": item_id, "dataset": dataset, "image_id": r.image_id, "split": r.split,
                     "image_path": first.at[r.image_id, "image_path"], "category": r.category, "mode": r.mode,
                     "removed_categories": removed, "present_categories": sorted(present),
                     "boxes": boxes, "removed_area_ratio": float(r.removed_area_ratio),
                     "shard": shard_of(item_id, shards), "segmentation": segmentation})
    requests = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    check_image_sizes(images, zip(requests["image_id"], requests["image_path"]))   # declared = file (issue 31.1)
    return table, requests


def _plain(value):
    """JSON for the NumPy values pandas leaves in parsed annotations."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_requests(path) -> pd.DataFrame:
    frame = pd.read_parquet(path)
    if "segmentation" not in frame.columns:                        # requests written before the mask option
        frame["segmentation"] = ""
    missing = [c for c in REQUEST_COLUMNS if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing columns {missing}", "rebuild it with `counterfactory spurious select`")
    frame["boxes"] = [np.asarray([np.asarray(b) for b in boxes]).reshape(-1, 4).tolist() for boxes in frame["boxes"]]
    return frame
