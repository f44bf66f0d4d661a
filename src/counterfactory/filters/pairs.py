"""CLIP filtering and selection of over-generated counterfactual image pairs (and sets).

Follows InstructPix2Pix's data filter, which COCO-Counterfactuals adopts (§3.2, B.1.2; reference
Brooks et al., CVPR 2023, and its public generator):

* images in [0, 1] are resized bicubically to the CLIP model's input size **without cropping** and
  normalised with the model's mean/std; texts are tokenised with truncation;
* image and text features are **L2-normalised**;
* ``sim_0 = cos(I0, T0)``, ``sim_1 = cos(I1, T1)`` (image-caption), ``sim_image = cos(I0, I1)``,
  ``sim_direction = cos(I1 - I0, T1 - T0)`` (Gal et al. 2022; differences of normalised features);
* a candidate passes when ``sim_0 >= 0.2``, ``sim_1 >= 0.2``, ``sim_image >= 0.7`` and
  ``sim_direction >= 0.2`` (all inclusive: exactly 0.2 passes); survivors are sorted by
  ``sim_direction`` (descending, ties by candidate index) and the top ``k`` are kept (k = 1 in the
  paper: "the best image pair is chosen").

Scores are computed from the decoded float images before 8-bit quantisation, as InstructPix2Pix's
filter scores them (config ``images.filter.score_images: decoded``); ``png`` (ours, option) scores the 8-bit
images that are written to disk, so the scores can be recomputed from the stored PNGs. A non-finite score never passes: the candidate is rejected with reason
``non_finite_score`` and a warning is logged.

**Undefined direction.** The same image embedded at two batch positions (or with a different number
of CPU threads) gives features that differ by rounding noise (about 1e-7 relative in fp32, more in
fp16/bf16). For two identical images ``I1 - I0`` is then that noise, and its *direction* is arbitrary:
it can pass ``sim_direction >= 0.2`` by chance. So ``sim_direction`` is NaN ("undefined") whenever
``||I1 - I0||`` or ``||T1 - T0||`` (raw features, before normalisation) is below
:data:`DIRECTION_REL_TOL` (1e-3) times the mean norm of the two embeddings; the candidate is rejected
with reason ``direction_undefined`` (logged at debug level: identical pairs are expected, not a bug).
The tolerance is ``FilterThresholds.direction_rel_tol`` (config key ``images.filter.direction_rel_tol``).
This rejection is ours: the reference filter (InstructPix2Pix's) has none, so the paper config and
:data:`PAPER_DIRECTION_REL_TOL` leave it off (0: a direction is undefined only when a difference is exactly
zero, which gives a non-finite score). 1e-3 (:data:`DIRECTION_REL_TOL`, the option) is four orders of
magnitude above fp32 noise and about ten times below the smallest difference of two distinct generated
images we observed; raise it for fp16 scorers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..device import Performance, autocast_context, engine_dtypes, from_config, place, resolve_batch_size
from ..models import registry
from ..settings import schema_defaults

log = logging.getLogger(__name__)

SCORE_COLUMNS = ("sim_0", "sim_1", "sim_image", "sim_direction")

#: ``||x1 - x0|| < DIRECTION_REL_TOL * mean(||x0||, ||x1||)`` (image or text features) makes the
#: directional similarity undefined (NaN, rejection reason :data:`DIRECTION_UNDEFINED`)
DIRECTION_REL_TOL = 1e-3
#: the paper config's tolerance: off, as the reference filter (COCO-Counterfactuals B.1.2, InstructPix2Pix's)
PAPER_DIRECTION_REL_TOL = 0.0
DIRECTION_UNDEFINED = "direction_undefined"
NON_FINITE = "non_finite_score"

# CLIP's published normalisation constants (used when a model does not carry its own)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
@schema_defaults("coco_counterfactuals.images.filter")
class FilterThresholds:
    """Inclusive lower bounds (COCO-Counterfactuals B.1.2; InstructPix2Pix generator); the defaults are the schema's
    (``coco_counterfactuals.images.filter``: 0.2, 0.7, 0.2 and ``direction_rel_tol`` 0, off as the reference
    filter, :data:`PAPER_DIRECTION_REL_TOL`)."""

    image_caption_min: float
    image_image_min: float
    direction_min: float
    #: relative tolerance below which a feature difference has no direction (see module docstring)
    direction_rel_tol: float

    @classmethod
    def from_config(cls, filt: dict) -> "FilterThresholds":
        return cls(**{name: float(filt.get(name, getattr(cls, name)))
                      for name in ("image_caption_min", "image_image_min", "direction_min", "direction_rel_tol")})


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return x / norm  # a zero or non-finite row becomes non-finite and is rejected downstream


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def _negligible(a: np.ndarray, b: np.ndarray, rel_tol: float) -> np.ndarray:
    """Rows where ``||b - a|| < rel_tol * mean(||a||, ||b||)`` (raw, unnormalised features), or ``b == a`` (a zero
    difference has no direction at any tolerance, 0 included)."""
    scale = 0.5 * (np.linalg.norm(a, axis=-1) + np.linalg.norm(b, axis=-1))
    diff = np.linalg.norm(b - a, axis=-1)
    with np.errstate(invalid="ignore"):
        return (diff < rel_tol * scale) | (diff == 0)


def pair_scores(text_0: Any, text_1: Any, image_0: Any, image_1: Any,
                rel_tol: float = DIRECTION_REL_TOL) -> dict[str, np.ndarray]:
    """The four filter scores of each row; embeddings of shape (n, d), normalised here.

    ``sim_direction`` is NaN when the image or text difference is negligible (below ``rel_tol`` times
    the mean norm, see :data:`DIRECTION_REL_TOL`): identical images or texts have no direction, and
    rounding noise must not be mistaken for one. The extra boolean entry ``direction_undefined`` marks
    those rows; :func:`apply_thresholds` rejects them as ``direction_undefined``.
    """
    raw = [np.asarray(np.atleast_2d(x), dtype=np.float64) for x in (text_0, text_1, image_0, image_1)]
    t0, t1, i0, i1 = (_normalise(x) for x in raw)
    t0, t1 = np.broadcast_to(t0, i0.shape), np.broadcast_to(t1, i1.shape)
    rt0, rt1 = np.broadcast_to(raw[0], raw[2].shape), np.broadcast_to(raw[1], raw[3].shape)
    undefined = _negligible(raw[2], raw[3], rel_tol) | _negligible(rt0, rt1, rel_tol)
    direction = _cos(i1 - i0, t1 - t0)
    direction = np.where(undefined, np.nan, direction)
    return {
        "sim_0": np.sum(i0 * t0, axis=-1),
        "sim_1": np.sum(i1 * t1, axis=-1),
        "sim_image": np.sum(i0 * i1, axis=-1),
        "sim_direction": direction,
        DIRECTION_UNDEFINED: undefined,
    }


def apply_thresholds(scores: dict[str, Sequence[float]], th: FilterThresholds,
                     labels: Sequence[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """``(passed, reasons)``: inclusive thresholds; ``reasons[i]`` lists every failed test ("" = pass).

    Rows that :func:`pair_scores` marked ``direction_undefined`` fail with that reason (plus any other
    failed test). Other non-finite scores fail with ``non_finite_score`` and are logged as a warning
    (with ``labels[i]`` if given).
    """
    s = {k: np.asarray(scores[k], dtype=np.float64) for k in SCORE_COLUMNS}
    n = len(s["sim_0"])
    undefined = np.asarray(scores.get(DIRECTION_UNDEFINED, np.zeros(n, dtype=bool)), dtype=bool).reshape(n)
    passed = np.ones(n, dtype=bool)
    reasons: list[list[str]] = [[] for _ in range(n)]
    finite = np.all([np.isfinite(s[k]) | ((k == "sim_direction") & undefined) for k in SCORE_COLUMNS], axis=0)
    tests = [
        ("sim_0", th.image_caption_min), ("sim_1", th.image_caption_min),
        ("sim_image", th.image_image_min), ("sim_direction", th.direction_min),
    ]
    for i in range(n):
        label = labels[i] if labels is not None else i
        if not finite[i]:
            passed[i] = False
            reasons[i].append(NON_FINITE)
            bad = {k: float(s[k][i]) for k in SCORE_COLUMNS if not np.isfinite(s[k][i])}
            log.warning("candidate %s rejected: non-finite CLIP score(s) %s", label, bad)
            continue
        for key, low in tests:
            if key == "sim_direction" and undefined[i]:
                passed[i] = False
                reasons[i].append(DIRECTION_UNDEFINED)
                log.debug("candidate %s rejected: the image or text difference is below the relative "
                          "tolerance, so the edit direction is undefined", label)
            elif not s[key][i] >= low:
                passed[i] = False
                reasons[i].append(f"{key}<{low:g}")
    return passed, [";".join(r) for r in reasons]


def select_top(candidate_index: Sequence[int], sim_direction: Sequence[float], passed: Sequence[bool],
               top_k: int) -> list[int]:
    """Positions of the best ``top_k`` passing candidates by ``sim_direction`` (ties: lower index)."""
    idx = np.asarray(candidate_index)
    sd = np.asarray(sim_direction, dtype=np.float64)
    ok = np.flatnonzero(np.asarray(passed, dtype=bool))
    order = sorted(ok.tolist(), key=lambda i: (-sd[i], int(idx[i])))
    return order[:top_k]


def set_scores(texts: np.ndarray, images: np.ndarray, rel_tol: float = DIRECTION_REL_TOL) -> dict[str, np.ndarray]:
    """Scores of counterfactual *sets* (SocialCounterfactuals §3.4 style, our aggregation).

    ``texts``: (G, d) embeddings of [base, edit_1..edit_K]; ``images``: (n, G, d). For each edited
    member ``g`` the pair (base, g) gets the four pair scores; a set is summarised by the minimum over
    members of each score (``sim_0`` is the base image-caption score), so a set passes only if every
    base-member pair passes. A set's direction is undefined when any member's is.
    """
    texts = np.asarray(texts)
    images = np.asarray(images)
    n, g, _ = images.shape
    per = [pair_scores(np.repeat(texts[:1], n, 0), np.repeat(texts[m:m + 1], n, 0), images[:, 0], images[:, m],
                       rel_tol=rel_tol)
           for m in range(1, g)]
    out = {k: np.min(np.stack([p[k] for p in per]), axis=0) for k in SCORE_COLUMNS}
    out[DIRECTION_UNDEFINED] = np.any(np.stack([p[DIRECTION_UNDEFINED] for p in per]), axis=0)
    out["sim_direction"] = np.where(out[DIRECTION_UNDEFINED], np.nan, out["sim_direction"])
    return out


# --------------------------------------------------------------------------- CLIP model wrapper

class ClipScorer:
    """Embeds uint8 images and texts with the ``clip_filter`` role (transformers or open_clip)."""

    def __init__(self, loaded: Any, library: str, device: torch.device, dtype: torch.dtype = torch.float32,
                 batch_size: int = 32, direction_rel_tol: float = DIRECTION_REL_TOL, performance=None,
                 autocast_dtype: torch.dtype | None = None):
        """``performance``: a :class:`counterfactory.device.Performance` (fast path), None = plain placement.
        ``dtype``: the weights'; ``autocast_dtype``: embed under ``torch.autocast`` in it (None = no autocast)."""
        self.library = library
        self.direction_rel_tol = float(direction_rel_tol)
        self.device = device
        self.dtype = dtype
        self.autocast_dtype = autocast_dtype
        self.batch_size = int(batch_size)
        if library == "open_clip":
            model, _, tokenizer = loaded
            self.model = place(model, device, dtype, performance)
            self.tokenizer = tokenizer
            size = getattr(model.visual, "image_size", 224)
            cfg = getattr(model.visual, "preprocess_cfg", {}) or {}
            mean, std = cfg.get("mean", CLIP_MEAN), cfg.get("std", CLIP_STD)
        else:
            model, processor = loaded
            self.model = place(model, device, dtype, performance)
            self.tokenizer = processor.tokenizer
            size = model.config.vision_config.image_size
            ip = processor.image_processor
            mean, std = getattr(ip, "image_mean", None) or CLIP_MEAN, getattr(ip, "image_std", None) or CLIP_STD
        self.size = tuple(size) if isinstance(size, (tuple, list)) else (int(size), int(size))
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)

    @classmethod
    def from_config(cls, cfg: dict, role: str = "clip_filter", batch_size: int = 32,
                    autocast: bool = False) -> "ClipScorer":
        """``autocast``: a half precision embeds under autocast over fp32 weights (the image stage's
        ``images.autocast``, as the InstructPix2Pix generator's filter); False = weights cast to it."""
        device, dtype = from_config(cfg)
        dtype, compute = engine_dtypes(dtype, autocast)
        spec = registry.model_spec(cfg, role)
        filt = ((cfg["images"] if "images" in cfg else None) or {}).get("filter") or {}   # optional section
        return cls(registry.load(cfg, role), spec.library, device, dtype,
                   batch_size=resolve_batch_size(batch_size, cfg, "clip_image"),
                   direction_rel_tol=FilterThresholds.from_config(filt).direction_rel_tol,
                   performance=Performance.from_config(cfg), autocast_dtype=compute)

    def _pixels(self, images: np.ndarray) -> torch.Tensor:
        """uint8 images (/ 255) or float images already in [0, 1] (the decoded images before quantisation),
        (n, H, W, 3) -> normalised CLIP input."""
        images = np.ascontiguousarray(images)
        x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
        if images.dtype == np.uint8:
            x = x / 255.0
        if tuple(x.shape[-2:]) != self.size:
            x = torch.nn.functional.interpolate(x, size=self.size, mode="bicubic", align_corners=False)
        return (x - self.mean) / self.std

    @staticmethod
    def _features(out: Any) -> torch.Tensor:
        if isinstance(out, torch.Tensor):
            return out
        return out.pooler_output if getattr(out, "pooler_output", None) is not None else out[0]

    @torch.no_grad()
    def embed_images(self, images: np.ndarray) -> np.ndarray:
        """uint8 or float in [0, 1] (n, H, W, 3) -> (n, d) float64 features (not yet normalised)."""
        feats = []
        for s in range(0, len(images), self.batch_size):
            px = self._pixels(images[s:s + self.batch_size]).to(self.device, self.dtype)
            with autocast_context(self.device, self.autocast_dtype):
                if self.library == "open_clip":
                    f = self.model.encode_image(px)
                else:
                    f = self._features(self.model.get_image_features(pixel_values=px))
            feats.append(f.float().cpu().numpy().astype(np.float64))
        return np.concatenate(feats) if feats else np.zeros((0, 0))

    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float64 text features (truncated to the model's context length)."""
        texts = list(texts)
        with autocast_context(self.device, self.autocast_dtype):
            if self.library == "open_clip":
                f = self.model.encode_text(self.tokenizer(texts).to(self.device))
            else:
                tok = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(self.device)
                f = self._features(self.model.get_text_features(input_ids=tok["input_ids"],
                                                                attention_mask=tok["attention_mask"]))
        return f.float().cpu().numpy().astype(np.float64)

    def score_pairs(self, text_0: str, text_1: str, images_0: np.ndarray, images_1: np.ndarray) -> dict[str, np.ndarray]:
        """Scores of ``n`` candidate pairs for one caption pair; images uint8 or float in [0, 1] (n, H, W, 3).

        Identical images (or texts) give ``sim_direction`` NaN and ``direction_undefined`` True whatever
        their batch positions: their feature difference is rounding noise, below the tolerance."""
        t = self.embed_texts([text_0, text_1])
        n = len(images_0)
        feats = self.embed_images(np.concatenate([images_0, images_1]))
        return pair_scores(t[0:1], t[1:2], feats[:n], feats[n:], rel_tol=self.direction_rel_tol)
