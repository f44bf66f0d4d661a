"""The inputs of object removal (:mod:`.inpaint`) and of CVLD editing (:mod:`.editing`): item rows with safe,
unique ids, their images and their masks.

Masks come from a ``mask`` column (a path to a mask image, nonzero = remove, or a boolean array), a
``segmentation`` column (JSON ``{"size": [height, width], "objects": [COCO segmentation, ...]}``: the union of
COCO polygons / RLEs, rasterised by pycocotools; an empty string falls through to the boxes) or a ``boxes``
column (pixel ``[x1, y1, x2, y2]`` boxes, :func:`boxes_to_mask`).
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..data.coco import segmentation_mask
from ..errors import input_error
from ..rgb import to_rgb
from .runner import ID_PATTERN as _ID_PATTERN

if TYPE_CHECKING:
    from .inpaint import InpaintSettings


def boxes_to_mask(boxes, height: int, width: int, dilate: int = 0) -> np.ndarray:
    """Boolean ``[height, width]`` mask of the union of pixel boxes ``[[x1, y1, x2, y2], ...]``.

    Pixel ``(row r, column c)`` covers ``[c, c + 1) x [r, r + 1)``; it is in the mask when a box,
    grown by ``dilate`` pixels on every side, overlaps it with positive area (``c + 1 > x1 - dilate``
    and ``c < x2 + dilate``, likewise for rows), so a fractional box covers every pixel it touches
    (``[0.5, 0.5, 2.0, 2.0]`` -> rows and columns 0 and 1). Growing each box equals dilating the union
    with a square of side ``2 * dilate + 1``. Boxes are clipped to the image: parts outside it are
    dropped, a box entirely outside it adds nothing, as does a box of zero width or height.
    A box with ``x2 < x1`` or ``y2 < y1`` or a non-finite coordinate raises :class:`ValueError`.
    Vectorised: one ``[H, N] @ [N, W]`` product of row and column coverage.
    """
    b = np.asarray(boxes if boxes is not None else [], dtype=np.float64)
    if b.size == 0:
        return np.zeros((height, width), dtype=bool)
    if b.ndim == 1 and b.shape[0] == 4:
        b = b[None]
    if b.ndim != 2 or b.shape[1] != 4:
        raise ValueError(f"boxes must be a list of [x1, y1, x2, y2], got an array of shape {b.shape}")
    if not np.isfinite(b).all():
        raise ValueError(f"boxes hold a non-finite coordinate: {b[~np.isfinite(b).all(1)].tolist()}")
    bad = (b[:, 2] < b[:, 0]) | (b[:, 3] < b[:, 1])
    if bad.any():
        raise ValueError(f"box {b[bad][0].tolist()} has x2 < x1 or y2 < y1 (boxes are [x1, y1, x2, y2] pixels)")
    if dilate < 0:
        raise ValueError(f"dilate must be >= 0, got {dilate}")
    nonempty = (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])
    b = b[nonempty]
    x1, y1, x2, y2 = (b[:, i] for i in range(4))
    x1, y1, x2, y2 = x1 - dilate, y1 - dilate, x2 + dilate, y2 + dilate
    cols = np.arange(width, dtype=np.float64)
    rows = np.arange(height, dtype=np.float64)
    in_x = (cols[None, :] + 1 > x1[:, None]) & (cols[None, :] < x2[:, None])      # [N, W]
    in_y = (rows[None, :] + 1 > y1[:, None]) & (rows[None, :] < y2[:, None])      # [N, H]
    return (in_y.T.astype(np.float32) @ in_x.astype(np.float32)) > 0


def _resolve(path: str, root: Path | None) -> Path:
    p = Path(os.path.expanduser(str(path)))
    return p if p.is_absolute() or root is None else root / p


def _read_image(path: Path, source: str, item_id: str) -> tuple[np.ndarray, bytes]:
    from PIL import Image, UnidentifiedImageError

    try:
        data = path.read_bytes()
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(to_rgb(im, path)), data
    except FileNotFoundError:
        raise input_error(source, item_id, f"image {path} not found",
                          "check image_path (relative paths are relative to image_root)") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise input_error(source, item_id, f"image {path} is not a readable image ({exc})",
                          "replace or re-download the image") from None


def _item_mask(row: dict, shape: tuple[int, int], settings: InpaintSettings, root: Path | None, source: str
               ) -> np.ndarray:
    from PIL import Image

    item_id = row["item_id"]
    h, w = shape
    segmentation = row.get("segmentation")
    has_mask = "mask" in row and row["mask"] is not None \
        and not (isinstance(row["mask"], float) and math.isnan(row["mask"]))
    if has_mask or (isinstance(segmentation, str) and segmentation):
        value = row["mask"] if has_mask else None
        if value is None:
            mask = _segmentation_mask(segmentation, source, item_id)
        elif isinstance(value, (str, os.PathLike)):
            path = _resolve(value, root)
            try:
                with Image.open(path) as im:
                    mask = np.asarray(im.convert("L")) > 0
            except (OSError, ValueError) as exc:
                raise input_error(source, item_id, f"mask {path} is not a readable image ({exc})",
                                  "point the mask column at a mask image (nonzero = remove)") from None
        else:
            mask = np.asarray(value).astype(bool)
        if mask.shape != (h, w):
            raise input_error(source, item_id,
                              f"mask is {'x'.join(map(str, mask.shape))} (HxW) but its image is {h}x{w}",
                              "give a mask of the image's size (height x width)")
        if settings.dilate:
            import cv2

            k = 2 * settings.dilate + 1
            mask = cv2.dilate(mask.astype(np.uint8), np.ones((k, k), np.uint8)) > 0
        return mask
    boxes = row.get("boxes")
    if boxes is not None and not isinstance(boxes, np.ndarray):
        boxes = list(boxes)
    if boxes is not None and len(boxes) and isinstance(boxes[0], np.ndarray):
        boxes = np.stack(boxes)
    try:
        return boxes_to_mask(boxes, h, w, dilate=settings.dilate)
    except ValueError as exc:
        raise input_error(source, item_id, f"bad boxes ({exc})", "give pixel [x1, y1, x2, y2] boxes") from None


def _segmentation_mask(text: str, source: str, item_id) -> np.ndarray:
    """The union of the COCO segmentations of a ``segmentation`` cell (module docstring)."""
    try:
        spec = json.loads(text)
        height, width = (int(v) for v in spec["size"])
        objects = spec["objects"]
        if not isinstance(objects, list) or not objects:
            raise ValueError("'objects' must be a non-empty list of COCO segmentations")
        mask = np.zeros((height, width), dtype=bool)
        for k, seg in enumerate(objects):
            try:
                mask |= segmentation_mask(seg, height, width)
            except ValueError as exc:
                raise ValueError(f"object {k}: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise input_error(source, item_id, f"bad segmentation ({exc})",
                          'give JSON {"size": [height, width], "objects": [COCO polygons or RLEs]}') from None
    return mask


def item_rows(items, source: str) -> list[dict]:
    """``items`` as row dicts whose ``item_id`` (a string) is a safe, unique file name; the first bad row is an
    :class:`InputError` naming ``source`` and the row (shared by the sharded image steps)."""
    rows = items.to_dict("records")
    seen: set[str] = set()
    for i, row in enumerate(rows):
        item_id = str(row["item_id"])
        if not _ID_PATTERN.match(item_id):
            raise input_error(source, i, f"item_id {item_id!r} is not a safe file name",
                              "use letters, digits, '_', '-' and '.' only")
        if item_id in seen:
            raise input_error(source, i, f"item_id {item_id!r} occurs twice", "make item ids unique")
        seen.add(item_id)
        row["item_id"] = item_id
    return rows
