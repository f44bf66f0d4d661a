"""Reader for Karpathy split files (``dataset_coco.json``, ``dataset_flickr30k.json``).

Structure: ``{"images": [{filepath?, filename, imgid, split, sentids, sentences: [{raw, tokens, imgid,
sentid}], cocoid?}], "dataset": "coco"|"flickr30k"}``; splits are train / val / test / restval.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import input_error
from .coco import read_json

COLUMNS = ["image_id", "filename", "filepath", "split", "sentid", "caption"]


def load_karpathy(path: str | Path, split: str | None = None) -> pd.DataFrame:
    """One row per sentence (every sentence kept), optionally only ``split``."""
    path = Path(path)
    doc = read_json(path, "Karpathy split file")
    if not isinstance(doc, dict) or "images" not in doc:
        raise input_error(path, None, "missing top-level key 'images'", "use dataset_coco.json / dataset_flickr30k.json")
    rows = []
    for i, img in enumerate(doc["images"]):
        for key in ("filename", "split", "sentences"):
            if key not in img:
                raise input_error(path, f"images[{i}]", f"missing key {key!r}", "fix or remove that record")
        if split is not None and img["split"] != split:
            continue
        image_id = img.get("cocoid", img.get("imgid"))
        if image_id is None:
            raise input_error(path, f"images[{i}]", "neither 'cocoid' nor 'imgid'", "fix that record")
        for j, sent in enumerate(img["sentences"]):
            raw = sent.get("raw") if isinstance(sent, dict) else None
            if not isinstance(raw, str) or not raw.strip():
                raise input_error(path, f"images[{i}].sentences[{j}]", "missing or empty 'raw'", "fix that sentence")
            rows.append((int(image_id), img["filename"], img.get("filepath", ""), img["split"],
                         int(sent.get("sentid", -1)), raw.strip()))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    if split is not None and frame.empty:
        raise input_error(path, None, f"no images in split {split!r}", "use one of train, val, test, restval")
    return frame
