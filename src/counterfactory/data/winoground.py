"""Reader for Winoground (Thrush et al., CVPR 2022; the gated HF dataset ``facebook/winoground``), evaluated in
CounterCurate appendix E (Table 7).

Files (reference notes B6)
--------------------------
* ``data/examples.jsonl``: one JSON object per line with ``id`` (int), ``image_0``, ``image_1`` (file stems),
  ``caption_0``, ``caption_1``, ``tag``, ``secondary_tag`` (string), ``num_main_preds`` (int), ``collapsed_tag``;
  400 lines in the single (test) split. Caption 0 belongs to image 0 and caption 1 to image 1.
* ``data/images.zip``, unpacked to ``images/<stem>.png``.

Output
------
:func:`read_winoground` returns one row per example with the columns :data:`COLUMNS`; ``image_0_path`` /
``image_1_path`` are absolute paths ``<images_dir>/<stem><ext>`` (``ext`` default ``.png``). Only ``id``, the image
stems and the captions are required; the tag fields are kept when present (empty otherwise).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from ..errors import describe_path, input_error
from .paths import join_under

log = logging.getLogger(__name__)

REQUIRED = ("id", "image_0", "image_1", "caption_0", "caption_1")
OPTIONAL = ("tag", "secondary_tag", "num_main_preds", "collapsed_tag")
COLUMNS = ["id", "image_0", "image_1", "caption_0", "caption_1", *OPTIONAL, "image_0_path", "image_1_path"]
FIX = ("use the official data/examples.jsonl of facebook/winoground (one object per line with id, image_0, image_1, "
       "caption_0, caption_1, tag, secondary_tag, num_main_preds, collapsed_tag)")


def read_examples(path: str | Path) -> pd.DataFrame:
    """``examples.jsonl`` as a frame (file order; blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise input_error(describe_path(path), None, "Winoground examples file not found",
                          "point benchmarks.winoground.examples at data/examples.jsonl of facebook/winoground")
    rows, seen = [], {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"line {lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise input_error(path, where, f"not valid JSON ({exc.msg} at column {exc.colno})", FIX) from exc
            if not isinstance(rec, dict):
                raise input_error(path, where, f"is a JSON {type(rec).__name__}, not an object", FIX)
            missing = [k for k in REQUIRED if k not in rec]
            if missing:
                raise input_error(path, where, f"missing key {', '.join(map(repr, missing))}", FIX)
            for k in REQUIRED[1:]:
                if not isinstance(rec[k], str) or not rec[k].strip():
                    raise input_error(path, where, f"{k!r} is {rec[k]!r}, not a non-empty string", FIX)
            if rec["id"] in seen:
                raise input_error(path, where, f"id {rec['id']!r} repeats line {seen[rec['id']]}", FIX)
            seen[rec["id"]] = lineno
            rows.append({k: rec.get(k) for k in (*REQUIRED, *OPTIONAL)})
    if not rows:
        raise input_error(path, None, "has no examples", FIX)
    return pd.DataFrame(rows, columns=[*REQUIRED, *OPTIONAL])


def read_winoground(examples: str | Path, images_dir: str | Path | None = None, *, ext: str = ".png",
                    check_images: bool = True) -> pd.DataFrame:
    """Winoground examples with absolute image paths under ``images_dir`` (``images/`` of the unpacked
    ``images.zip``). With ``check_images`` a missing image is an error naming the line's id and the path."""
    frame = read_examples(examples)
    if images_dir is None:
        frame["image_0_path"] = None
        frame["image_1_path"] = None
        return frame[COLUMNS]
    root = Path(images_dir).resolve()
    for side in ("image_0", "image_1"):
        frame[f"{side}_path"] = [str(join_under(root, f"{stem}{ext}", source=examples, record=f"id {i}",
                                                key="benchmarks.winoground.images"))
                                 for i, stem in zip(frame["id"], frame[side])]
        if check_images:
            exists = frame[f"{side}_path"].map(lambda p: Path(p).is_file())
            if not exists.all():
                bad = frame[~exists].iloc[0]
                raise input_error(examples, f"id {bad['id']}",
                                  f"{side} {bad[f'{side}_path']} not found ({int((~exists).sum())} missing)",
                                  "point benchmarks.winoground.images at the folder unpacked from data/images.zip")
    return frame[COLUMNS]
