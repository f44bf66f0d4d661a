"""The request table of CounterCurate's grounded generation (:mod:`.grounded`): one parquet row per item
with ``item_id``, ``kind`` (``generate`` | ``inpaint`` | ``t2i``), ``prompt``, ``phrases``, ``boxes`` (normalised
``[x1, y1, x2, y2]``, one per phrase), ``image_path`` (``inpaint``: the source image; relative to the requests
file's folder) and ``mask_box`` (``inpaint``, optional). :func:`read_requests` checks every row; each problem is
one error naming the file, the record and the fix."""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import input_error
from ..io import read_table
from ..text.captions import prompt_text_problem
from .runner import ID_PATTERN as _ID_PATTERN
from .runner import fingerprint as _fingerprint

KINDS = ("generate", "inpaint", "t2i")
#: the model role that serves each request kind
ROLE_OF_KIND = {"generate": "gligen", "inpaint": "gligen_inpaint", "t2i": "t2i"}
REQUIRED_COLUMNS = ("item_id", "kind", "prompt")
OPTIONAL_COLUMNS = ("phrases", "boxes", "image_path", "mask_box")
#: objects diffusers' GLIGEN pipeline (and GLIGEN) pads the grounding tokens to
MAX_OBJS = 30


@dataclass(frozen=True)
class GroundedRequest:
    item_id: str
    kind: str
    prompt: str
    phrases: tuple[str, ...] = ()
    boxes: tuple[tuple[float, float, float, float], ...] = ()
    source: str | None = None              # image_path as written in the table
    image: Path | None = None              # resolved source image (inpaint)
    mask_box: tuple[float, float, float, float] | None = None
    row: int = 0

    @property
    def role(self) -> str:
        return ROLE_OF_KIND[self.kind]


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return False


def _as_list(value: Any) -> list | None:
    """A parquet list cell (numpy array, list, tuple) as a Python list; None when missing."""
    if _is_missing(value):
        return None
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [v.tolist() if isinstance(v, np.ndarray) else v for v in value]
    return value  # wrong type: reported by the caller


def _check_box(value: Any, what: str) -> tuple[float, float, float, float]:
    """A normalised [x1, y1, x2, y2] box, else ValueError describing the problem."""
    box = _as_list(value)
    if not isinstance(box, list) or len(box) != 4:
        raise ValueError(f"{what} {value!r} is not a list of 4 numbers [x1, y1, x2, y2]")
    try:
        x1, y1, x2, y2 = (float(v) for v in box)
    except (TypeError, ValueError):
        raise ValueError(f"{what} {box!r} is not a list of 4 numbers [x1, y1, x2, y2]") from None
    if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in (x1, y1, x2, y2)):
        raise ValueError(f"{what} {box!r} is outside [0, 1] (boxes are normalised by image width and height)")
    if not (x1 < x2 and y1 < y2):
        raise ValueError(f"{what} {box!r} is empty (needs x1 < x2 and y1 < y2)")
    return (x1, y1, x2, y2)


def _parse_row(path: Path, i: int, r: dict) -> GroundedRequest:
    item_id = r.get("item_id")
    record = f"{i} (item_id {item_id!r})"

    def bad(problem: str, fix: str):
        return input_error(path, record, problem, fix)

    if not isinstance(item_id, str) or not _ID_PATTERN.match(item_id):
        raise bad(f"item_id {item_id!r} is not a non-empty [A-Za-z0-9_.-] string (it names the image file)",
                  "give every request a unique id of letters, digits, '_', '.', '-'")
    kind = r.get("kind")
    if kind not in KINDS:
        raise bad(f"kind {kind!r} is not one of {list(KINDS)}",
                  "use generate (GLIGEN text-box), inpaint (GLIGEN inpainting) or t2i (plain text-to-image)")
    prompt = r.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad("prompt is empty", "every request needs a non-empty prompt")
    problem = prompt_text_problem(prompt)
    if problem:   # a tab or another control character the text encoder's tokenizer would silently drop
        raise bad(f"prompt {prompt!r}: {problem}", "write the prompt as one line of plain text")
    phrases = _as_list(r.get("phrases")) or []
    boxes_raw = _as_list(r.get("boxes")) or []
    if not isinstance(phrases, list) or not all(isinstance(p, str) and p.strip() for p in phrases):
        raise bad(f"phrases {r.get('phrases')!r} is not a list of non-empty strings",
                  "write one grounding phrase per box")
    if not isinstance(boxes_raw, list):
        raise bad(f"boxes {r.get('boxes')!r} is not a list of [x1, y1, x2, y2] boxes", "write a list of boxes")
    try:
        boxes = tuple(_check_box(b, f"box {k}") for k, b in enumerate(boxes_raw))
    except ValueError as exc:
        raise bad(str(exc), "give normalised boxes [x1, y1, x2, y2] with 0 <= x1 < x2 <= 1 and 0 <= y1 < y2 <= 1")
    if boxes and not phrases:
        raise bad(f"{len(boxes)} box(es) but the phrase list is empty",
                  "give one grounding phrase per box (GLIGEN grounds phrases, not bare boxes)")
    if len(phrases) != len(boxes):
        raise bad(f"{len(phrases)} phrase(s) but {len(boxes)} box(es)", "give exactly one box per phrase")
    if len(boxes) > MAX_OBJS:
        raise bad(f"{len(boxes)} boxes; GLIGEN grounds at most {MAX_OBJS} objects",
                  f"split the request or keep the {MAX_OBJS} most important boxes")
    source = r.get("image_path")
    source = None if _is_missing(source) or (isinstance(source, str) and not source.strip()) else source
    mask_raw = r.get("mask_box")
    mask_box = None
    if not _is_missing(mask_raw) and _as_list(mask_raw) is not None:
        try:
            mask_box = _check_box(mask_raw, "mask_box")
        except ValueError as exc:
            raise bad(str(exc), "give mask_box as a normalised [x1, y1, x2, y2] inside [0, 1]")
    image = None
    if kind == "t2i":
        if boxes:
            raise bad("a t2i request has boxes", "use kind generate for box-grounded generation, or drop the boxes")
    elif not boxes:
        raise bad(f"a {kind} request has no phrases/boxes", "give at least one grounding phrase with its box")
    if kind == "inpaint":
        if not isinstance(source, str):
            raise bad("an inpaint request has no image_path (the source image)",
                      "set image_path to the image to inpaint (relative paths are relative to the requests file)")
        image = Path(os.path.expanduser(source))
        if not image.is_absolute():
            image = path.parent / image
    else:
        if source is not None:
            raise bad(f"a {kind} request has image_path {source!r}", "image_path is only for kind inpaint")
        if mask_box is not None:
            raise bad(f"a {kind} request has a mask_box", "mask_box is only for kind inpaint")
    return GroundedRequest(item_id=item_id, kind=kind, prompt=prompt, phrases=tuple(phrases), boxes=boxes,
                           source=source, image=image, mask_box=mask_box, row=i)


def read_requests(path: str | os.PathLike) -> list[GroundedRequest]:
    """Read and check the requests table; every problem raises one error naming file, record and fix.
    Returns the requests sorted by ``item_id``."""

    path = Path(path)
    df = read_table(path, "grounded-generation requests table",
                    "write the requests (item_id, kind, prompt, phrases, boxes, image_path, mask_box; optionally "
                    f"{', '.join(OPTIONAL_COLUMNS)}) first or pass the right --requests path", REQUIRED_COLUMNS,
                    formats=("parquet",))
    cols = [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in df.columns]
    reqs = [_parse_row(path, i, r) for i, r in enumerate(df[cols].to_dict("records"))]
    seen: dict[str, int] = {}
    for q in reqs:
        if q.item_id in seen:
            raise input_error(path, f"{q.row} (item_id {q.item_id!r})",
                              f"duplicate item_id (also record {seen[q.item_id]})", "item ids must be unique")
        seen[q.item_id] = q.row
    return sorted(reqs, key=lambda q: q.item_id)


def requests_digest(reqs: Sequence[GroundedRequest]) -> str:
    """Identity of a requests table's content (merges refuse shards of different tables)."""
    return _fingerprint([[q.item_id, q.kind, q.prompt, list(q.phrases), [list(b) for b in q.boxes], q.source,
                          list(q.mask_box) if q.mask_box else None] for q in reqs])


def _check_source(path: Path, q: GroundedRequest) -> str:
    """sha256 of an inpaint request's source image; a missing or unreadable image is an input error."""
    from PIL import Image

    record = f"{q.row} (item_id {q.item_id!r})"
    if not q.image.is_file():
        raise input_error(path, record, f"source image {q.source!r} not found (looked for {q.image.absolute()})",
                          "fix image_path (relative paths are relative to the requests file's folder) or add the image")
    try:
        with Image.open(q.image) as im:
            im.verify()
        data = q.image.read_bytes()
    except Exception as exc:  # PIL raises several types
        raise input_error(path, record, f"source image {q.image} is not a readable image ({exc})",
                          "replace the file with a valid PNG/JPEG") from exc
    return hashlib.sha256(data).hexdigest()
