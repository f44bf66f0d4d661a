"""Region selection for synthetic object-removed images (Kim et al. 2023, §3.1 Eq. 1-3 and appendix C).

For every image with objects of at least two classes and every class ``c^r`` in it (the *candidate*), the region
``B^r`` is the union of the boxes of ``c^r`` (a boolean mask at image resolution: overlapping boxes of one class are
counted once). For every other class ``c`` of the image, ``overlap(c) = area(B^r ∩ B^c) / area(B^c)``: the share of
``c``'s region that removing ``c^r`` would erase. Then (thresholds α1 = 0.4, α2 = 0.8, α3 = 0.7, §3.1):

* **single-class removal** of ``c^r`` when ``overlap(c) < α1`` for every other class (Eq. 1);
* **multi-class removal** of ``{c^r} ∪ C^{r+}`` with ``C^{r+} = {c : overlap(c) > α2}`` (Eq. 2) otherwise, when
  the rule below allows it;
* the candidate is **skipped** when the removed region is too large (Eq. 3) or when neither branch applies.

Every candidate gets exactly one row (:data:`COLUMNS`, sorted by ``image_id, category_id``): ``selected``, the
``reason`` it was skipped (``''`` when selected), the ``mode`` (``'single'`` / ``'multi'`` / ``''``), the removal
set ``removed_category_ids`` = ``{c^r} ∪ C^{r+}`` (for skipped rows: the set the rule looked at), its area share
``removed_area_ratio``, the candidate's own share ``candidate_area_ratio``, ``max_overlap`` and every overlap.

Text (Eq. 1-3) versus pseudo-code (appendix C, Listing 1)
---------------------------------------------------------
The two disagree in three places. ``rule: pseudocode`` (default) follows the listing, ``rule: text`` the equations:

1. **What α3 is applied to.** Pseudo-code: the candidate's own mask ``B^r``, *before* the union with ``C^{r+}``
   (``mask_q.sum() / image size``), so a multi-class removal can erase more than α3 of the image. Text (Eq. 3):
   the removed region ``B'`` = ``B^r`` (single) or the union over ``{c^r} ∪ C^{r+}`` (multi), *after* the union.
2. **The α3 comparison.** Pseudo-code: skip when ``ratio > α3`` (a ratio of exactly α3 is kept). Text: keep only
   when ``ratio < α3`` (exactly α3 is skipped).
3. **When multi-class removal is allowed ("any" versus "all").** Pseudo-code: ``elif any(overlaps > α2)``: one
   class above α2 suffices, and classes with ``α1 <= overlap <= α2`` stay in the image although up to 80 % of
   them is erased. Text: Eq. 1 requires every class that is *kept* to overlap less than α1 ("keep the objects of
   all the classes"), so we read it as: multi-class removal only when ``C^{r+}`` is non-empty **and all** other
   classes are either in ``C^{r+}`` (``> α2``) or preserved (``< α1``). Eq. 2 itself ("for all c^{r+} ∈ C^{r+}")
   only defines the set; this stricter reading is ours.

Both rules agree on Eq. 1 (strict ``< α1`` for all other classes) and on Eq. 2 (strict ``> α2``: an overlap of
exactly 0.8 does not join the removal set), and both consider only images with at least two classes. In the
pseudo-code the area test comes first (a too-large candidate is skipped with reason ``'area'`` whatever its
overlaps); under the text rule the branch is decided first (``'overlap'``), then the area of ``B'`` (``'area'``).
The listing's typos (``classnames_set`` / ``classname_set``, ``[classname]`` for ``[classname_to_remove]``,
``ranger``) do not change its meaning.

Skip reasons: ``'single_class_image'`` (fewer than two classes in the image: not a candidate image, §3.1
"multiple object classes"), ``'empty_region'`` (the candidate's boxes cover no pixel), ``'area'`` (α3),
``'overlap'`` (neither branch). A class whose region is empty has overlap 0 (nothing of it can be erased).

Masks and pixels
----------------
``mask_mode: box`` (the paper: "union all the bboxes"). A box ``[x, y, w, h]`` in pixel coordinates covers the
pixels whose centre lies inside it: columns ``ceil(x - 0.5) <= j < ceil(x + w - 0.5)`` (so an integer box covers
exactly ``w x h`` pixels). Masks are built with NumPy (one matrix product per class), overlaps for all class pairs
with one matrix product per image; no Python loop runs over pixels. ``mask_mode: segmentation`` (COCO only; the
paper uses boxes) makes a class's region the union of its instances' COCO masks -- polygons, uncompressed RLE (crowd)
or compressed RLE -- rasterised by pycocotools (:func:`counterfactory.data.coco.segmentation_mask`), and the removal
requests carry those masks to the inpainting step instead of boxes. An annotation without a usable segmentation, or
an RLE of the wrong size, is an error naming the file and annotation.

Datasets
--------
* MS-COCO: ``instances_<split>.json`` through :func:`counterfactory.data.coco.load_coco_instances` (80 classes;
  boxes outside the image by >= 1 px are an error there, smaller overshoots are clipped). Crowd boxes are kept.
* Flickr30k Entities through :mod:`counterfactory.data.flickr30k_entities`: the classes are the coarse entity types.
  The paper (§4.1) only says that Flickr30k has **4** classes, without naming them. We use
  :data:`FLICKR_CLASSES` = people, animals, vehicles, instruments, our inference: of the 8 types, ``notvisual``
  has no boxes, ``scene`` is mostly a whole-image flag without boxes (and would fail α3), ``other`` is a
  catch-all rather than a class, and ``clothing`` / ``bodyparts`` are parts of people whose boxes lie inside
  person boxes, so they cannot be removed independently of a person (not the "semantically unrelated
  co-occurring objects" the paper targets). The four remaining types are the stand-alone physical objects.
  ``classes`` in the configuration overrides the choice. An entity with several types counts for each selected
  type; a box shared by several entities is counted once per class (masks are unions).

``classes`` (``null`` = every class of the source; for Flickr30k the four above) restricts the object set: objects
of other classes are ignored entirely, as other Flickr30k types are in the paper's four-class setting.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ...config import fill_section
from ...data import flickr30k_entities as fe
from ...data.coco import load_coco_instances, segmentation_mask
from ...errors import ConfigError, input_error

#: configuration section (``spurious_retrieval.selection``)
SECTION = ("spurious_retrieval", "selection")
RULES = ("pseudocode", "text")
MASK_MODES = ("box", "segmentation")
#: the thresholds of §3.1 ("In practice, we select α1 = 0.4", "We select α2 = 0.8", "We use α3 = 0.7") and the
#: other selection keys have their defaults in the schema (``spurious_retrieval.selection``); see :func:`settings`
#: the four Flickr30k Entities types used as classes (our inference, see the module docstring)
FLICKR_CLASSES = ("people", "animals", "vehicles", "instruments")
COLUMNS = ["image_id", "category_id", "category", "removed_category_ids", "removed_categories", "selected", "reason",
           "mode", "removed_area_ratio", "candidate_area_ratio", "max_overlap", "overlaps", "image_width",
           "image_height"]
OBJECT_COLUMNS = ["image_id", "category_id", "category", "x", "y", "w", "h", "source", "record"]
IMAGE_COLUMNS = ["image_id", "width", "height", "source", "record"]
FIX_CONFIG = "edit spurious_retrieval.selection in the configuration (or the matching command-line option)"


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------
def config_section(cfg: dict | None) -> dict:
    """``cfg['spurious_retrieval']['selection']`` (or ``cfg['selection']`` of a study view); ``{}`` when absent."""
    if not cfg:
        return {}
    study = cfg.get(SECTION[0], cfg)
    if not isinstance(study, dict):
        raise ConfigError(f"{SECTION[0]}: must be a mapping, got {type(study).__name__}. Fix: {FIX_CONFIG}")
    section = study.get(SECTION[1]) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{'.'.join(SECTION)}: must be a mapping, got {type(section).__name__}. Fix: {FIX_CONFIG}")
    return section


def settings(cfg: dict | None = None) -> dict:
    """Validated selection settings: the ``spurious_retrieval.selection`` section of ``cfg`` (a full configuration,
    a study view with a ``selection`` key, or ``None``) with the schema's defaults filled. Unknown keys, thresholds
    outside (0, 1], an unknown rule / mask mode or a malformed class list are schema errors; ``alpha1 > alpha2``
    (a cross-key rule) is checked here; all are a :class:`ConfigError` naming the key."""
    out = fill_section(".".join(SECTION), config_section(cfg))
    for name in ("alpha1", "alpha2", "alpha3"):
        out[name] = float(out[name])
    if out["alpha1"] > out["alpha2"]:
        raise ConfigError(f"{'.'.join(SECTION)}: alpha1 = {out['alpha1']} is above alpha2 = {out['alpha2']} "
                          f"(Eq. 1 must be stricter than Eq. 2). Fix: {FIX_CONFIG}")
    return out


def defaults() -> dict:
    """The selection's defaults (the schema's ``spurious_retrieval.selection``)."""
    return settings(None)


# --------------------------------------------------------------------------------------------
# objects per image
# --------------------------------------------------------------------------------------------
def _check_image_sizes(images: pd.DataFrame) -> None:
    """Name the first image whose width or height is not positive."""
    w = images["width"].to_numpy(dtype="float64")
    h = images["height"].to_numpy(dtype="float64")
    bad = ~((w > 0) & (h > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        row = images.iloc[i]
        raise input_error(row["source"], row["record"], f"image {row['image_id']} has size {row['width']} x "
                          f"{row['height']} (width x height); an image needs a positive width and height",
                          "correct the image size (or remove the image), or re-download the official file")


def coco_objects(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """``(images, objects, class names)`` of a COCO ``instances_*.json``: ``images`` has :data:`IMAGE_COLUMNS`,
    ``objects`` one row per box with :data:`OBJECT_COLUMNS` (``x, y, w, h`` in pixels; ``record`` names the
    annotation) plus the annotation's ``segmentation`` (``None`` when absent), the class names are those of
    ``categories`` (with or without boxes)."""
    images, anns, cats = load_coco_instances(path)
    source = str(path)
    imgs = pd.DataFrame({"image_id": images["id"].astype("int64"), "width": images["width"],
                         "height": images["height"], "source": source,
                         "record": [f"images[{i}] (id {v})" for i, v in enumerate(images["id"])]})
    _check_image_sizes(imgs)
    objects = pd.DataFrame({
        "image_id": anns["image_id"].astype("int64"), "category_id": anns["category_id"].astype("int64"),
        "category": anns["name"].astype(object), "x": anns["x"], "y": anns["y"], "w": anns["w"], "h": anns["h"],
        "source": source, "record": [f"annotations[{i}] (id {v})" for i, v in enumerate(anns["id"])]})
    objects["segmentation"] = anns["segmentation"].to_numpy(dtype=object) if "segmentation" in anns else None
    return imgs, objects[OBJECT_COLUMNS + ["segmentation"]], [str(n) for n in cats["name"]]


def flickr_objects(root: str | Path, classes: list[str] | tuple[str, ...] | None = None,
                   image_ids=None) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """``(images, objects, classes)`` of a Flickr30k Entities folder: one object per (box, entity type) for the types in
    ``classes`` (default :data:`FLICKR_CLASSES`); ``category_id`` is the 1-based position of the type in
    :data:`counterfactory.data.flickr30k_entities.TYPES`. Boxes (0-based, inclusive ``x1, y1, x2, y2``) become
    ``x = x1, w = x2 - x1 + 1`` (likewise y). Unknown type names are a :class:`ConfigError`."""
    classes = list(FLICKR_CLASSES if classes is None else classes)
    unknown = [c for c in classes if c not in fe.TYPES or c == "notvisual"]
    if unknown:
        known = ", ".join(t for t in fe.TYPES if t != "notvisual")
        raise ConfigError(f"{'.'.join(SECTION)}.classes: unknown Flickr30k Entities type(s) {', '.join(unknown)} "
                          f"(known: {known}). Fix: {FIX_CONFIG}")
    image_rows, rows = [], []
    for im in fe.iter_images(root, image_ids):
        xml = str(Path(root) / fe.ANNOTATIONS / f"{im.image_id}.xml")
        image_rows.append((im.image_id, im.width, im.height, xml, "<size>"))
        for entity in im.entities.values():
            for t in (t for t in entity.types if t in classes):
                for k, (x1, y1, x2, y2) in enumerate(entity.boxes):
                    rows.append((im.image_id, fe.TYPES.index(t) + 1, t, float(x1), float(y1), float(x2 - x1 + 1),
                                 float(y2 - y1 + 1), xml, f"entity /EN#{entity.entity_id} box {k}"))
    images = pd.DataFrame(image_rows, columns=IMAGE_COLUMNS)
    _check_image_sizes(images)
    return images, pd.DataFrame(rows, columns=OBJECT_COLUMNS), classes


def _check_boxes(objects: pd.DataFrame, sizes: pd.DataFrame) -> None:
    """Name the first box that is not finite, has a negative size or lies outside its image."""
    width = sizes["width"].reindex(objects["image_id"]).to_numpy(dtype="float64")
    height = sizes["height"].reindex(objects["image_id"]).to_numpy(dtype="float64")
    x, y, w, h = (objects[c].to_numpy(dtype="float64") for c in ("x", "y", "w", "h"))
    ok = np.isfinite([x, y, w, h]).all(axis=0) & (w >= 0) & (h >= 0) & (x >= 0) & (y >= 0) \
        & (x + w <= width) & (y + h <= height)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        row = objects.iloc[i]
        raise input_error(row["source"], row["record"],
                          f"box [x, y, w, h] = [{x[i]:g}, {y[i]:g}, {w[i]:g}, {h[i]:g}] of class {row['category']!r} "
                          f"lies outside its {width[i]:g} x {height[i]:g} image {row['image_id']} (or has a negative "
                          "or non-finite size)" + (f" ({int((~ok).sum()) - 1} more boxes like this)"
                                                   if (~ok).sum() > 1 else ""),
                          "fix the box (0 <= x, 0 <= y, x + w <= width, y + h <= height) or the image size")


def restrict_classes(objects: pd.DataFrame, classes: list[str] | None, source: str = "<objects>",
                     known=None) -> pd.DataFrame:
    """Only the objects of ``classes`` (``None``: all); a name not in ``known`` (default: the objects' classes) is a
    :class:`ConfigError`."""
    if classes is None:
        return objects
    known = set(objects["category"] if known is None else known)
    unknown = [c for c in classes if c not in known]
    if unknown:
        listed = ", ".join(sorted(known)[:20]) + (" ..." if len(known) > 20 else "")
        raise ConfigError(f"{'.'.join(SECTION)}.classes: {', '.join(map(repr, unknown))} is not a class of {source} "
                          f"(its classes: {listed or 'none'}). Fix: {FIX_CONFIG}; names are case-sensitive")
    return objects[objects["category"].isin(classes)]


# --------------------------------------------------------------------------------------------
# masks
# --------------------------------------------------------------------------------------------
def pixel_spans(start, length, size: int) -> tuple[np.ndarray, np.ndarray]:
    """First and one-past-last pixel index covered by intervals ``[start, start + length)`` (pixel-centre rule:
    pixel ``j`` is covered when ``start <= j + 0.5 < start + length``), clipped to ``[0, size]``."""
    start = np.asarray(start, dtype="float64")
    stop = start + np.asarray(length, dtype="float64")
    first = np.clip(np.ceil(start - 0.5), 0, size).astype("int64")
    last = np.clip(np.ceil(stop - 0.5), 0, size).astype("int64")
    return first, np.maximum(first, last)


def union_mask(boxes, height: int, width: int) -> np.ndarray:
    """Boolean ``(height, width)`` mask of the union of ``boxes`` (``(n, 4)`` array of ``x, y, w, h``): one matrix
    product of the boxes' row and column indicators (an outer product for one or two boxes), so overlapping boxes
    are counted once."""
    boxes = np.asarray(boxes, dtype="float64").reshape(-1, 4)
    x0, x1 = pixel_spans(boxes[:, 0], boxes[:, 2], width)
    y0, y1 = pixel_spans(boxes[:, 1], boxes[:, 3], height)
    cols, rows = np.arange(width), np.arange(height)
    in_cols = (cols >= x0[:, None]) & (cols < x1[:, None])         # (n, width)
    in_rows = (rows >= y0[:, None]) & (rows < y1[:, None])         # (n, height)
    if len(boxes) <= 2:                                            # broadcasting is faster for one or two boxes
        return (in_rows[:, :, None] & in_cols[:, None, :]).any(axis=0)
    return (in_rows.T.astype("float32") @ in_cols.astype("float32")) > 0


def pack_masks(masks: np.ndarray) -> np.ndarray:
    """``(k, height, width)`` bool masks as ``(k, words)`` uint64 bit sets (zero-padded), for exact pixel counts of
    intersections and unions with ``np.bitwise_count``."""
    packed = np.packbits(masks.reshape(len(masks), -1), axis=1)
    pad = (-packed.shape[1]) % 8
    if pad:
        packed = np.pad(packed, ((0, 0), (0, pad)))
    return np.ascontiguousarray(packed).view(np.uint64)


def pair_areas(packed: np.ndarray) -> np.ndarray:
    """``inter[i, j]`` = pixels in both masks ``i`` and ``j`` (the diagonal: each mask's area), from
    :func:`pack_masks`; exact integers."""
    return np.bitwise_count(packed[:, None, :] & packed[None, :, :]).sum(axis=-1, dtype="int64")


# --------------------------------------------------------------------------------------------
# selection
# --------------------------------------------------------------------------------------------
def decide(n_classes: int, candidate_area: int, overlaps: np.ndarray, candidate_ratio: float, removed_ratio: float,
           params: dict) -> tuple[str, str]:
    """``(mode, reason)`` of one candidate: mode ``'single'`` / ``'multi'`` with reason ``''``, or mode ``''``
    and the skip reason. ``overlaps`` are those of the image's other classes (module docstring for the rules)."""
    a1, a2, a3 = params["alpha1"], params["alpha2"], params["alpha3"]
    if n_classes < 2:
        return "", "single_class_image"
    if candidate_area == 0:
        return "", "empty_region"
    keep_all = bool(np.all(overlaps < a1))                        # Eq. 1
    covered = overlaps > a2                                        # Eq. 2
    if params["rule"] == "pseudocode":
        if candidate_ratio > a3:                                   # Listing 1: B^r only, '>' before the overlaps
            return "", "area"
        if keep_all:
            return "single", ""
        return ("multi", "") if covered.any() else ("", "overlap")
    if keep_all:
        mode = "single"
    elif covered.any() and bool(np.all(covered | (overlaps < a1))):
        mode = "multi"
    else:
        return "", "overlap"
    return (mode, "") if removed_ratio < a3 else ("", "area")    # Eq. 3: B' after the union, '<'


def select_image(masks: np.ndarray, category_ids, categories, params: dict) -> list[dict]:
    """One row per class of one image (``masks``: ``(k, height, width)`` bool, one union mask per class)."""
    k, height, width = masks.shape
    total = float(height * width)
    packed = pack_masks(masks)
    inter = pair_areas(packed)
    areas = np.diag(inter)
    rows = []
    for r in range(k):
        others = np.array([j for j in range(k) if j != r], dtype="int64")
        denom = areas[others]
        overlaps = np.where(denom > 0, inter[r, others] / np.maximum(denom, 1), 0.0)
        plus = others[overlaps > params["alpha2"]]
        removed = np.concatenate([[r], plus]).astype("int64")
        removed_area = int(areas[r]) if plus.size == 0 else \
            int(np.bitwise_count(np.bitwise_or.reduce(packed[removed], axis=0)).sum())
        candidate_ratio, removed_ratio = areas[r] / total, removed_area / total
        mode, reason = decide(k, int(areas[r]), overlaps, candidate_ratio, removed_ratio, params)
        rows.append({
            "category_id": int(category_ids[r]), "category": str(categories[r]),
            "removed_category_ids": [int(category_ids[j]) for j in removed],
            "removed_categories": [str(categories[j]) for j in removed],
            "selected": mode != "", "reason": reason, "mode": mode,
            "removed_area_ratio": float(removed_ratio), "candidate_area_ratio": float(candidate_ratio),
            "max_overlap": float(overlaps.max()) if overlaps.size else float("nan"),
            "overlaps": json.dumps({str(categories[j]): float(o) for j, o in zip(others, overlaps)}),
            "image_width": int(width), "image_height": int(height)})
    return rows


def _image_order(images: pd.DataFrame) -> pd.DataFrame:
    """Images sorted by id: numerically for integer ids and for digit strings, else as text."""
    if pd.api.types.is_integer_dtype(images["image_id"]):
        return images.sort_values("image_id", kind="stable")
    return images.sort_values("image_id", kind="stable",
                              key=lambda s: s.map(lambda v: (0, int(v), "") if str(v).isdigit() else (1, 0, str(v))))


def select_regions(images: pd.DataFrame, objects: pd.DataFrame, params: dict | None = None,
                   source: str = "<objects>", known_classes=None) -> pd.DataFrame:
    """The selection table (:data:`COLUMNS`): one row per (image, class) with at least one object, sorted by
    ``image_id, category_id``. ``images`` / ``objects`` as from :func:`coco_objects` / :func:`flickr_objects`
    (``source`` / ``record`` columns are optional and only used in error messages); ``params`` from
    :func:`settings` (default: the schema's); ``known_classes``: the class names ``params['classes']`` may use
    (default: those of ``objects``)."""
    params = settings({SECTION[0]: {SECTION[1]: params}}) if params is not None else settings(None)
    images = images.copy()
    objects = objects.copy()
    for frame, what in ((images, "image"), (objects, "annotation")):
        if "source" not in frame:
            frame["source"] = source
        if "record" not in frame:
            frame["record"] = [f"{what} {i}" for i in range(len(frame))]
    _check_image_sizes(images)
    missing = ~objects["image_id"].isin(images["image_id"])
    if missing.any():
        row = objects[missing].iloc[0]
        raise input_error(row["source"], row["record"], f"box for unknown image id {row['image_id']}",
                          "use images and boxes from the same file")
    objects = restrict_classes(objects, params["classes"], source, known_classes)
    sizes = images.drop_duplicates("image_id").set_index("image_id")[["width", "height"]]
    _check_boxes(objects, sizes)
    segmented = params["mask_mode"] == "segmentation"
    if segmented and "segmentation" not in objects:
        raise ConfigError(f"{'.'.join(SECTION)}.mask_mode: segmentation, but {source} has no segmentation masks "
                          "(Flickr30k Entities has boxes only). Fix: use mask_mode: box")
    groups = objects.groupby("image_id", sort=False).indices
    arrays = (objects["category_id"].to_numpy(dtype="int64"), objects["category"].to_numpy(dtype=object),
              objects[["x", "y", "w", "h"]].to_numpy(dtype="float64"),
              objects["segmentation"].to_numpy(dtype=object) if segmented else None,
              objects[["source", "record"]].to_numpy(dtype=object))
    rows = []
    for image_id, width, height in _image_order(images)[["image_id", "width", "height"]].itertuples(index=False):
        positions = groups.get(image_id)
        if positions is None or len(positions) == 0:
            continue
        rows.extend(_image_rows(image_id, *(None if a is None else a[positions] for a in arrays), int(width),
                                int(height), params))
    return pd.DataFrame(rows, columns=COLUMNS)


def object_masks(segmentations, where, height: int, width: int) -> np.ndarray:
    """``(n, height, width)`` bool masks of ``n`` COCO segmentations; ``where`` holds each one's ``(source,
    record)`` for the error that names a missing or malformed segmentation."""
    out = np.zeros((len(segmentations), height, width), dtype=bool)
    for k, (seg, (src, record)) in enumerate(zip(segmentations, where)):
        if seg is None or (isinstance(seg, float) and math.isnan(seg)) or (isinstance(seg, (list, tuple))
                                                                           and not seg):
            raise input_error(src, record, "the annotation has no segmentation, but selection.mask_mode is "
                              "segmentation", "use mask_mode: box, or an instances file with segmentation masks")
        try:
            out[k] = segmentation_mask(seg, height, width)
        except ValueError as exc:
            raise input_error(src, record, f"bad segmentation: {exc}",
                              "fix the annotation (or use mask_mode: box)") from None
    return out


def _image_rows(image_id, category_ids: np.ndarray, categories: np.ndarray, boxes: np.ndarray, segmentations,
                where, width: int, height: int, params: dict) -> list[dict]:
    """Class masks of one image (its objects as arrays: union of boxes, or of segmentation masks when
    ``segmentations`` is given), then :func:`select_image`."""
    ids, first = np.unique(category_ids, return_index=True)
    if segmentations is None:
        masks = np.stack([union_mask(boxes[category_ids == cid], height, width) for cid in ids])
    else:
        per_object = object_masks(segmentations, where, height, width)
        masks = np.stack([per_object[category_ids == cid].any(axis=0) for cid in ids])
    rows = select_image(masks, ids, categories[first], params)
    for row in rows:
        row["image_id"] = image_id
    return rows


def summary(table: pd.DataFrame) -> dict:
    """Counts: ``candidates``, ``selected``, ``single``, ``multi`` and ``skipped`` per reason."""
    selected = table[table["selected"]]
    skipped = table[~table["selected"]]
    return {"candidates": int(len(table)), "images": int(table["image_id"].nunique()),
            "selected": int(len(selected)), "single": int((selected["mode"] == "single").sum()),
            "multi": int((selected["mode"] == "multi").sum()),
            "skipped": {str(k): int(v) for k, v in skipped["reason"].value_counts().sort_index().items()}}


def format_summary(counts: dict) -> str:
    """One line for the CLI."""
    skipped = ", ".join(f"{k} {v}" for k, v in counts["skipped"].items()) or "none"
    return (f"{counts['selected']} of {counts['candidates']} candidates of {counts['images']} images selected "
            f"(single {counts['single']}, multi {counts['multi']}); skipped: {skipped}")
