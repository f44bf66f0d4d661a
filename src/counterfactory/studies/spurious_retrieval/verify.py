"""The spurious-retrieval study's candidates for the VQA check (:mod:`counterfactory.filters.vqa`, docs/verify.md).

Each object removal of the study's own image method (``mixtures.variants.ours.image``: the inpainted images of
D', §3.1) is one item: the original photograph with the caption "a <class>" (the request's selected ``category``,
the class that was removed) and its partner, the inpainted image with that object removed, with no partner caption:
a one-sided edit, so only "a <class>" must be present in the photograph and absent from the inpainting. Item id:
``<dataset>:<item_id>``.

Inputs (``--input NAME=PATH``), per dataset: ``<dataset>:requests`` (``selection/requests.parquet``: the image and
the class of each item) and ``<dataset>:<method>:<shard>`` (each inpainting shard,
``images/<method>/<shard>/shard.parquet``, output paths relative to the shard folder). Original image paths are as
the requests hold them (absolute, or relative to the working directory like the study's data paths).

The verified variant is the inpainted items the VQA check keeps: ``item_id``, ``dataset``, ``category``,
``removed_categories``, ``method``, ``image`` (the inpainted image, relative to the verify folder) and
``original_image`` (relative to it too unless absolute).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ...errors import input_error
from ...filters import vqa

REQUEST_COLUMNS = ("item_id", "image_path", "category")
SHARD_COLUMNS = ("item_id", "output_path")


def caption(category: str) -> str:
    """``a <class>`` (``an`` before a vowel): the removed object as a caption."""
    text = str(category).strip()
    return f"{'an' if text[:1].lower() in 'aeiou' else 'a'} {text}"


def _datasets(inputs: dict[str, str]) -> dict[str, dict]:
    """dataset -> {"requests": path, "shards": [(method, path)]} from the input names."""
    out: dict[str, dict] = {}
    for name, path in inputs.items():
        parts = name.split(":")
        entry = out.setdefault(parts[0], {"requests": None, "shards": []})
        if parts[1:] == ["requests"]:
            entry["requests"] = path
        elif len(parts) == 3:
            entry["shards"].append((parts[1], path))
        else:
            raise input_error(path, None, f"input name {name!r} is neither <dataset>:requests nor "
                              "<dataset>:<method>:<shard>", "name each input as docs/verify.md lists")
    for dataset, entry in out.items():
        if entry["requests"] is None:
            raise input_error(dataset, None, "inpainting shards without their requests",
                              f"pass --input {dataset}:requests=<dataset>/selection/requests.parquet")
    return out


def _items(inputs: dict[str, str]) -> pd.DataFrame:
    """One row per inpainted item: dataset, item_id, category, removed_categories, method, original image path (as
    the requests hold it) and the inpainted image's path (resolved against its shard folder)."""
    rows = []
    for dataset, entry in sorted(_datasets(inputs).items()):
        requests = vqa.read_table(entry["requests"], REQUEST_COLUMNS, "inpainting requests").set_index("item_id")
        for method, shard in sorted(entry["shards"], key=lambda x: x[1]):
            for r in vqa.read_table(shard, SHARD_COLUMNS, "inpainting shard").to_dict("records"):
                if r["item_id"] not in requests.index:
                    raise input_error(shard, f"item_id {r['item_id']}", "no request of that item",
                                      f"pass the requests the shard was made from ({entry['requests']})")
                req = requests.loc[r["item_id"]]
                removed = req.get("removed_categories") if "removed_categories" in requests.columns else None
                rows.append({"item_id": f"{dataset}:{r['item_id']}", "dataset": dataset, "category": str(req["category"]),
                             "removed_categories": [str(c) for c in removed] if removed is not None else
                             [str(req["category"])], "method": method, "original_image": str(req["image_path"]),
                             "image": vqa.resolve(Path(shard).parent, str(r["output_path"]))})
    return pd.DataFrame(rows, columns=["item_id", "dataset", "category", "removed_categories", "method",
                                       "original_image", "image"])


def pair_rows(inputs: dict[str, str]) -> list[dict]:
    """Pair-table rows: the photograph with "a <class>", the inpainting as partner, no partner caption."""
    return [{"item_id": r["item_id"], "image_path": r["original_image"], "caption": caption(r["category"]),
             "partner_image_path": r["image"], "partner_caption": None} for r in _items(inputs).to_dict("records")]


def verified(inputs: dict[str, str], scores: pd.DataFrame, out_dir: str | os.PathLike) -> pd.DataFrame:
    """The inpainted items the VQA check keeps, image paths relative to ``out_dir``."""
    items = _items(inputs)
    out = items[items["item_id"].isin(vqa.kept_ids(scores))].reset_index(drop=True)
    out["image"] = [os.path.relpath(os.path.abspath(p), os.path.abspath(out_dir)) for p in out["image"]]
    out["original_image"] = vqa.rebase(out["original_image"].tolist(), os.getcwd(), out_dir)   # absolute: as is
    return out
