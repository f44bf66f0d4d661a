"""Object removal by inpainting (spurious-correlation retrieval study, §3.1 and Table 3).

The synthetic image ``x'`` removes every box of a class from ``x`` and fills the removed region.
The paper fills it with an inpainting model (``lama``) and compares against three paddings (Table 3);
``opencv`` is a classical inpainting baseline. Every method returns an RGB ``uint8`` image whose pixels
outside the mask are exactly the input pixels (pasted back):

* ``zero`` -- the masked pixels are set to 0 (black).
* ``mean`` -- the masked pixels are set to one colour: the per-channel mean, rounded to the nearest
  integer, of the removed region itself (``mean_of: masked``, the schema's default: the paper's text, §4
  "Impact of different methods", says "the average pixel values of B^r"), or of the pixels *outside* the mask
  (``mean_of: unmasked``, ours: it does not leak the removed object's mean colour into ``x'``; an image that
  is masked everywhere falls back to the mean of the whole image).
* ``blur`` -- the masked pixels are taken from a Gaussian blur of the whole image
  (``cv2.GaussianBlur``, ``BORDER_REFLECT_101``) with standard deviation ``blur_sigma`` (pixels) and a
  square kernel of side ``blur_kernel`` (odd; 0 = ``2 * ceil(3 * sigma) + 1``).
* ``opencv`` -- lama-cleaner's ``OpenCV2`` model (``cv2.inpaint``) with ``cv2_flag`` (``INPAINT_TELEA``
  default, or ``INPAINT_NS``, lama-cleaner's own default) and ``cv2_radius``.
* ``lama`` -- LaMa through lama-cleaner (:func:`load_lama`, role ``inpaint``).

**How lama-cleaner is called.** :func:`load_lama` (:mod:`counterfactory.models.loaders_inpaint`, re-exported
here) loads the local ``big-lama.pt`` through lama-cleaner without its download, md5 check or file
deletion; lama-cleaner's loguru messages (two INFO lines per image) are disabled.
:func:`lama_cleaner_call` is lama-cleaner's own single-image path: ``LaMa(image RGB uint8, mask uint8 0/255, Config)`` pads to a multiple of 8
(symmetric), runs the TorchScript model on a batch of one (the mask reaches it as an int64 0/1 tensor),
converts the float output with ``clip(x * 255).astype(uint8)`` and returns a float64 **BGR** image with
the unmasked pixels blended back; it is converted to RGB ``uint8`` here.

**Batching.** lama-cleaner handles one image per call. :func:`lama_batch` does what its
``hd_strategy: Original`` path does -- same symmetric padding to a multiple of 8, same ``/ 255`` float32
input, same int64 mask, same truncating conversion, same paste-back -- for a batch of same-size images
in one TorchScript call. The tests check it against :func:`lama_cleaner_call` on the tiny model.
The pixels agree up to float rounding: CPU (and GPU) kernels may accumulate in a different order for a
different batch size, and a float output lying within one ulp of an integer level can then truncate to the
neighbouring ``uint8`` value. Measured on the tiny model: 1 of 786,432 values off by 1 (64 images of
64x64, batch 8 vs 1); none on the tests' images. So outputs are a deterministic function of the inputs and
the batch composition; a resumed run (other batch companions) or another ``batch_size`` may change such rare
values by 1. Batching pays off where per-call overhead dominates (GPUs; small images): on 1 CPU thread the
tiny model ran 1.3-1.7x faster batched (batch 8) than lama-cleaner's call at 64x64 but only 0.38-0.44x as
fast at 256x256 (two runs each on shared cores), where a batch's activations no longer fit the CPU caches
(``benchmarks/bench_inpaint.py``); choose ``batch_size`` per device (1 on CPU for large images).
:func:`fill_batch` groups images by size (padding to a common size would change the context near the
borders) and uses it whenever ``hd_strategy`` is ``Original`` and ``batched`` is true; with ``Resize`` or
``Crop`` every image goes through lama-cleaner's own call.

**Shards.** :func:`inpaint_shard` (on the shared :mod:`.runner`, cache :class:`.runner.PngKeyCache`) writes
``OUT_DIR/<item_id>.png`` per item and ``OUT_DIR/shard.parquet``.
Each PNG is written to a temporary file and renamed (:func:`counterfactory.io.atomic_path`; leftovers of
a killed write are removed) and carries a ``counterfactory-inpaint`` text chunk: a sha256 over the method,
its settings, the model's content fingerprint and the source image and mask. A rerun skips an item whose
PNG verifies (complete chunks, CRCs) and carries the expected key, and redoes it otherwise. Nothing is
random: outputs depend only on the inputs, the settings and the model.

Masks come from :mod:`.inpaint_inputs` (a ``mask``, ``segmentation`` or ``boxes`` column).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ConfigError, InputError, input_error
from ..io import write_parquet
from ..models import registry
from ..models.loaders_inpaint import LAMA_FILE, _quiet_lama_cleaner, lama_file, load_lama  # noqa: F401
from ..models.registry import fingerprint
from ..settings import schema_defaults
from . import runner
from .inpaint_inputs import (_item_mask, _read_image, _resolve, _segmentation_mask, boxes_to_mask,  # noqa: F401
                             item_rows)

log = logging.getLogger(__name__)

METHODS = ("zero", "mean", "blur", "opencv", "lama")
#: PNG text chunk holding the output's key (what it was made from)
KEY_FIELD = "counterfactory-inpaint"
#: lama-cleaner's padding modulus for LaMa (``LaMa.pad_mod``)
PAD_MOD = 8
_CV2_FLAGS = ("INPAINT_TELEA", "INPAINT_NS")
_HD_STRATEGIES = ("Original", "Resize", "Crop")

MANIFEST_SCHEMA = {
    "item_id": "object", "image_path": "object", "output_path": "object", "method": "object",
    "height": "int64", "width": "int64", "mask_pixels": "int64", "mask_fraction": "float64", "key": "object",
}


@dataclass(frozen=True)
@schema_defaults("spurious_retrieval.inpaint")
class InpaintSettings:
    """Settings of the fill methods (see the module docstring); :meth:`from_config` reads a config section. The
    defaults are the schema's (``spurious_retrieval.inpaint``)."""

    mean_of: str
    blur_sigma: float
    blur_kernel: int
    cv2_flag: str
    cv2_radius: int
    dilate: int
    hd_strategy: str
    hd_strategy_crop_margin: int
    hd_strategy_crop_trigger_size: int
    hd_strategy_resize_limit: int
    batched: bool

    def __post_init__(self):
        if self.mean_of not in ("unmasked", "masked"):
            raise ConfigError(f"inpaint.mean_of: {self.mean_of!r}. Fix: use unmasked or masked")
        if not self.blur_sigma > 0:
            raise ConfigError(f"inpaint.blur_sigma: {self.blur_sigma!r}. Fix: use a positive number of pixels")
        if self.blur_kernel < 0 or (self.blur_kernel and self.blur_kernel % 2 == 0):
            raise ConfigError(f"inpaint.blur_kernel: {self.blur_kernel!r}. Fix: use an odd side or 0 (from sigma)")
        if self.cv2_flag not in _CV2_FLAGS:
            raise ConfigError(f"inpaint.cv2_flag: {self.cv2_flag!r}. Fix: use one of {', '.join(_CV2_FLAGS)}")
        if self.cv2_radius < 1:
            raise ConfigError(f"inpaint.cv2_radius: {self.cv2_radius!r}. Fix: use a positive radius")
        if self.dilate < 0:
            raise ConfigError(f"inpaint.dilate: {self.dilate!r}. Fix: use 0 or a positive number of pixels")
        if self.hd_strategy not in _HD_STRATEGIES:
            raise ConfigError(f"inpaint.hd_strategy: {self.hd_strategy!r}. Fix: use one of "
                              f"{', '.join(_HD_STRATEGIES)}")

    @classmethod
    def from_config(cls, section: dict | None) -> InpaintSettings:
        """Settings from a config section (unknown keys are an error naming them)."""
        section = dict(section or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(section) - known - {"method", "batch_size"})
        if unknown:
            raise ConfigError(f"inpaint: unknown keys {unknown}. Fix: use only {sorted(known)}")
        return cls(**{k: v for k, v in section.items() if k in known})

    @property
    def kernel(self) -> int:
        """Side of the Gaussian kernel of ``blur``: ``blur_kernel`` or ``2 * ceil(3 * sigma) + 1``."""
        return self.blur_kernel or 2 * math.ceil(3 * self.blur_sigma) + 1

    def relevant(self, method: str) -> dict:
        """The settings that change ``method``'s output (part of each output's key)."""
        fields = {"zero": (), "mean": ("mean_of",), "blur": ("blur_sigma", "blur_kernel"),
                  "opencv": ("cv2_flag", "cv2_radius"),
                  "lama": ("hd_strategy", "hd_strategy_crop_margin", "hd_strategy_crop_trigger_size",
                           "hd_strategy_resize_limit")}[method]
        return {"dilate": self.dilate, **{k: v for k, v in asdict(self).items() if k in fields}}


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ConfigError(f"inpaint method {method!r} is unknown. Fix: use one of {', '.join(METHODS)}")
    return method


def lama_config(settings: InpaintSettings | None = None):
    """lama-cleaner's ``schema.Config`` for ``settings`` (required fields filled; LDM steps are unused by
    LaMa and OpenCV)."""
    _quiet_lama_cleaner()
    from lama_cleaner.schema import Config

    s = settings or InpaintSettings()
    return Config(ldm_steps=1, hd_strategy=s.hd_strategy, hd_strategy_crop_margin=s.hd_strategy_crop_margin,
                  hd_strategy_crop_trigger_size=s.hd_strategy_crop_trigger_size,
                  hd_strategy_resize_limit=s.hd_strategy_resize_limit, cv2_flag=s.cv2_flag,
                  cv2_radius=s.cv2_radius)


# --------------------------------------------------------------------------- masks


def _check_pair(image: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be uint8 [H, W, 3] RGB, got {image.dtype} {image.shape}")
    mask = np.asarray(mask)
    if mask.ndim == 3 and mask.shape[2] == 1:
        mask = mask[:, :, 0]
    if mask.shape != image.shape[:2]:
        raise ValueError(f"mask is {mask.shape[0]}x{mask.shape[1]} (HxW) but the image is "
                         f"{image.shape[0]}x{image.shape[1]}")
    return image, mask.astype(bool, copy=False)


def _paste(filled: np.ndarray, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``filled`` inside the mask, ``image`` outside (exact input pixels)."""
    return np.where(mask[:, :, None], filled, image).astype(np.uint8)


# --------------------------------------------------------------------------- simple fills


def fill_zero(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Masked pixels set to 0."""
    out = image.copy()
    out[mask] = 0
    return out


def mean_colour(image: np.ndarray, mask: np.ndarray, mean_of: str = InpaintSettings.mean_of) -> np.ndarray:
    """The ``uint8`` RGB colour of ``mean``: per-channel mean of the unmasked (or masked) pixels, rounded
    half to even; falls back to the whole image when that set is empty."""
    region = ~mask if mean_of == "unmasked" else mask
    pixels = image[region] if region.any() else image.reshape(-1, 3)
    return np.rint(pixels.astype(np.float64).mean(axis=0)).astype(np.uint8)


def fill_mean(image: np.ndarray, mask: np.ndarray, mean_of: str = InpaintSettings.mean_of) -> np.ndarray:
    """Masked pixels set to :func:`mean_colour`."""
    out = image.copy()
    out[mask] = mean_colour(image, mask, mean_of)
    return out


def blurred(image: np.ndarray, sigma: float, kernel: int) -> np.ndarray:
    """Gaussian blur of the whole image (``BORDER_REFLECT_101``), ``uint8``."""
    import cv2

    return cv2.GaussianBlur(np.ascontiguousarray(image), (kernel, kernel), sigmaX=sigma, sigmaY=sigma,
                            borderType=cv2.BORDER_REFLECT_101)


def fill_blur(image: np.ndarray, mask: np.ndarray, sigma: float = 8.0, kernel: int = 0) -> np.ndarray:
    """Masked pixels taken from :func:`blurred` (kernel 0: ``2 * ceil(3 * sigma) + 1``)."""
    kernel = kernel or 2 * math.ceil(3 * sigma) + 1
    return _paste(blurred(image, sigma, kernel), image, mask)


# --------------------------------------------------------------------------- lama-cleaner


def _to_rgb_uint8(bgr: np.ndarray) -> np.ndarray:
    """lama-cleaner's float64 BGR output -> RGB ``uint8`` (values are integral for a 0/255 mask)."""
    return np.ascontiguousarray(np.clip(np.rint(bgr), 0, 255).astype(np.uint8)[:, :, ::-1])


def lama_cleaner_call(model, image: np.ndarray, mask: np.ndarray, settings: InpaintSettings | None = None
                      ) -> np.ndarray:
    """One image through lama-cleaner's own ``InpaintModel.__call__`` (``LaMa`` or ``OpenCV2``): RGB
    ``uint8`` in, mask as ``uint8`` 0/255, float64 BGR out -> RGB ``uint8``, unmasked pixels pasted back."""
    image, mask = _check_pair(image, mask)
    out = model(np.ascontiguousarray(image), mask.astype(np.uint8) * 255, lama_config(settings))
    return _paste(_to_rgb_uint8(out), image, mask)


def _pad(arr: np.ndarray, mod: int = PAD_MOD) -> np.ndarray:
    """lama-cleaner's ``pad_img_to_modulo`` (symmetric padding at the bottom and right)."""
    h, w = arr.shape[:2]
    ph, pw = -h % mod, -w % mod
    widths = ((0, ph), (0, pw)) + ((0, 0),) * (arr.ndim - 2)
    return np.pad(arr, widths, mode="symmetric") if ph or pw else arr


def lama_batch(model, images: Sequence[np.ndarray], masks: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Same-size images through the TorchScript model of a loaded ``LaMa`` in one call (lama-cleaner's
    ``Original`` path, batched: see the module docstring). Returns RGB ``uint8`` images."""
    import torch

    if not images:
        return []
    pairs = [_check_pair(im, m) for im, m in zip(images, masks, strict=True)]
    h, w = pairs[0][0].shape[:2]
    if any(im.shape[:2] != (h, w) for im, _ in pairs):
        raise ValueError("lama_batch needs images of one size; group them first (fill_batch does)")
    net = getattr(model, "model", model)
    device = getattr(model, "device", None) or next(net.parameters()).device
    img = np.stack([_pad(im) for im, _ in pairs]).astype(np.float32) / 255          # [B, Hp, Wp, 3]
    msk = np.stack([_pad(m.astype(np.uint8)) for _, m in pairs])[:, None] > 0        # [B, 1, Hp, Wp]
    with torch.inference_mode():
        x = torch.from_numpy(np.ascontiguousarray(img.transpose(0, 3, 1, 2))).to(device)
        mt = torch.from_numpy(msk.astype(np.int64)).to(device)
        out = net(x, mt)[:, :, :h, :w].permute(0, 2, 3, 1).float().cpu().numpy()
    out = np.clip(out * 255, 0, 255).astype(np.uint8)
    return [_paste(o, im, m) for o, (im, m) in zip(out, pairs)]


def opencv_model():
    """lama-cleaner's ``OpenCV2`` inpainting model (``cv2.inpaint``; runs on the CPU)."""
    _quiet_lama_cleaner()
    from lama_cleaner.model.opencv2 import OpenCV2

    return OpenCV2("cpu")


# --------------------------------------------------------------------------- fill


def fill(image: np.ndarray, mask: np.ndarray, method: str, *, settings: InpaintSettings | None = None,
         model=None) -> np.ndarray:
    """Remove the masked region of ``image`` (``uint8`` [H, W, 3] RGB; ``mask`` bool [H, W], True =
    remove) with ``method`` (``zero``, ``mean``, ``blur``, ``opencv``, ``lama``); returns ``uint8`` RGB
    equal to ``image`` outside the mask. ``lama`` needs ``model`` (from :func:`load_lama` or the
    registry's ``inpaint`` role) and uses lama-cleaner's own single-image call; ``opencv`` builds
    lama-cleaner's ``OpenCV2`` unless given as ``model``."""
    _check_method(method)
    s = settings or InpaintSettings()
    image, mask = _check_pair(image, mask)
    if not mask.any():
        return image.copy()
    if method == "zero":
        return fill_zero(image, mask)
    if method == "mean":
        return fill_mean(image, mask, s.mean_of)
    if method == "blur":
        return fill_blur(image, mask, s.blur_sigma, s.kernel)
    if method == "opencv":
        return lama_cleaner_call(model or opencv_model(), image, mask, s)
    if model is None:
        raise ConfigError("inpaint method lama needs the loaded model. Fix: pass model=registry.load(cfg, 'inpaint')")
    return lama_cleaner_call(model, image, mask, s)


def fill_batch(images: Sequence[np.ndarray], masks: Sequence[np.ndarray], method: str, *,
               settings: InpaintSettings | None = None, model=None, batch_size: int = 8) -> list[np.ndarray]:
    """:func:`fill` for many images, in order. ``lama`` with ``hd_strategy: Original`` and ``batched``
    runs :func:`lama_batch` on up to ``batch_size`` same-size images per call; everything else goes one
    image at a time."""
    _check_method(method)
    s = settings or InpaintSettings()
    if batch_size < 1:
        raise ConfigError(f"inpaint batch_size {batch_size}. Fix: use 1 or more")
    if method == "opencv" and model is None:
        model = opencv_model()
    if not (method == "lama" and s.batched and s.hd_strategy == "Original"):
        return [fill(im, m, method, settings=s, model=model) for im, m in zip(images, masks, strict=True)]
    if model is None:
        raise ConfigError("inpaint method lama needs the loaded model. Fix: pass model=registry.load(cfg, 'inpaint')")
    out: list[np.ndarray | None] = [None] * len(images)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (im, m) in enumerate(zip(images, masks, strict=True)):
        im, m = _check_pair(im, m)
        if not m.any():
            out[i] = im.copy()
        else:
            groups.setdefault(im.shape[:2], []).append(i)
    for idx in groups.values():
        for lo in range(0, len(idx), batch_size):
            part = idx[lo:lo + batch_size]
            for i, res in zip(part, lama_batch(model, [images[i] for i in part], [masks[i] for i in part])):
                out[i] = res
    return out  # type: ignore[return-value]


# --------------------------------------------------------------------------- shards


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _item_key(method: str, settings: InpaintSettings, model_id: str | None, image_sha: str,
              mask: np.ndarray) -> str:
    mask_sha = _sha256(f"{mask.shape}".encode() + np.packbits(mask).tobytes())
    payload = {"method": method, "settings": settings.relevant(method), "model": model_id,
               "image": image_sha, "mask": mask_sha}
    return _sha256(json.dumps(payload, sort_keys=True).encode())


#: an output PNG is its own done-marker: complete (chunks and CRCs verify), RGB, of its size, with its key
_PNG = runner.PngKeyCache(KEY_FIELD)


def _model_id(method: str, model) -> str | None:
    if method != "lama":
        return None
    file = getattr(model, "counterfactory_file", None)
    if file is None:
        return f"unidentified:{type(getattr(model, 'model', model)).__name__}"

    return fingerprint(file)


class InpaintStage(runner.ShardStage):
    """Object removal on the shard runner: items are ``{"item_id", "image", "mask", "key", "target"}``; an
    item is done when its output PNG verifies with its key; batches hold same-size images (:func:`_plan`)."""

    def __init__(self, method: str, settings: InpaintSettings, model, batch_size: int):
        self.method, self.settings, self.model, self.batch_size = method, settings, model, batch_size
        self.calls = 0

    def key(self, item):
        return item["key"]

    def is_done(self, item, key):
        h, w = item["image"].shape[:2]
        return _PNG.read(item["target"], key, (w, h), mode="RGB") is not None

    def plan(self, items):
        return _plan(items, self.batch_size)

    def generate(self, batch):
        results = fill_batch([t["image"] for t in batch], [t["mask"] for t in batch], self.method,
                             settings=self.settings, model=self.model, batch_size=self.batch_size)
        self.calls += _calls(self.method, self.settings, batch)
        yield from zip(batch, results)

    def store(self, item, key, result):
        _PNG.write(item["target"], result, key)


@runner.locks_shard
def inpaint_shard(items, method: str, out_dir: str | os.PathLike, batch_size: int = 8, device: Any = "auto", *,
                  settings: InpaintSettings | None = None, model=None, cfg: dict | None = None,
                  image_root: str | os.PathLike | None = None, source: str = "<items>", progress: bool = True,
                  hook: Callable[[int, str], None] | None = None) -> dict:
    """Inpaint every row of ``items`` (a DataFrame with ``item_id``, ``image_path`` and ``mask``,
    ``segmentation`` or ``boxes``) with ``method`` into ``OUT_DIR/<item_id>.png`` and write ``OUT_DIR/shard.parquet``
    (:data:`MANIFEST_SCHEMA`: item, source and output paths, method, size, masked pixels and the key).

    ``lama`` uses ``model`` or loads role ``inpaint`` through the registry from ``cfg`` on ``device``.
    Relative image and mask paths are resolved against ``image_root`` (else the working directory);
    ``source`` names the items' file in error messages. Resumable: an item whose PNG is complete and
    carries its key is skipped (see the module docstring). ``hook(k, item_id)`` runs after the k-th
    newly written PNG (tests use it to simulate a kill). Returns ``{"items", "written", "skipped",
    "model_calls", "method"}``."""
    _check_method(method)
    s = settings or InpaintSettings()
    if batch_size < 1:
        raise ConfigError(f"inpaint batch_size {batch_size}. Fix: use 1 or more")
    missing = [c for c in ("item_id", "image_path") if c not in items.columns]
    if missing or not ({"mask", "segmentation", "boxes"} & set(items.columns)):
        raise input_error(source, None, f"missing columns {missing or ['mask, segmentation or boxes']}",
                          "give item_id, image_path and a mask (path or array), segmentation (COCO JSON) or boxes "
                          "([x1, y1, x2, y2]) column")
    rows = item_rows(items, source)
    root = Path(image_root) if image_root is not None else None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if method == "lama" and model is None:
        if cfg is None:
            raise ConfigError("inpaint method lama needs cfg (models.inpaint) or a loaded model")

        model = registry.load(cfg, "inpaint", device=device)
    elif method == "opencv" and model is None:
        model = opencv_model()
    model_id = _model_id(method, model)

    _remove_stale_outputs(out_dir, {row["item_id"] for row in rows})
    window = max(8 * batch_size, 64)  # items read at a time (grouped by size for batched LaMa)
    stage = InpaintStage(method, s, model, batch_size)
    manifest, stats = [], runner.RunStats()
    with runner.progress_bar(len(rows), f"inpaint ({method})", "image", progress) as bar:
        for lo in range(0, len(rows), window):
            prepared = []
            for row in rows[lo:lo + window]:
                item_id = row["item_id"]
                image, data = _read_image(_resolve(row["image_path"], root), source, item_id)
                mask = _item_mask(row, image.shape[:2], s, root, source)
                key = _item_key(method, s, model_id, _sha256(data), mask)
                target = out_dir / f"{item_id}.png"
                h, w = image.shape[:2]
                manifest.append({"item_id": item_id, "image_path": str(row["image_path"]),
                                 "output_path": target.name, "method": method, "height": h, "width": w,
                                 "mask_pixels": int(mask.sum()), "mask_fraction": float(mask.mean()), "key": key})
                prepared.append({"item_id": item_id, "image": image, "mask": mask, "key": key, "target": target})
            runner.run_stage(stage, prepared, hook=hook, bar=bar, stats=stats)
    write_parquet(out_dir / "shard.parquet", runner.frame(manifest, MANIFEST_SCHEMA))
    return {"items": len(rows), "written": stats.generated, "skipped": stats.skipped, "model_calls": stage.calls,
            "method": method}


def _remove_stale_outputs(out_dir: Path, ids: set[str]) -> None:
    """One pass over ``out_dir``: remove temporaries ``.<item_id>.png.tmp-XXXXXXXX.png`` left by killed writes
    of this shard's items (a skipped item's leftover would otherwise stay)."""
    pattern = re.compile(r"^\.(.+)\.png\.tmp-[A-Za-z0-9_]{8}\.png$")
    with os.scandir(out_dir) as entries:
        for entry in entries:
            m = pattern.match(entry.name)
            if m and m.group(1) in ids and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                log.warning("removed %s, left behind by an interrupted write", entry.path)


def _plan(todo: list, batch_size: int) -> list[list]:
    """Chunks of at most ``batch_size`` same-size items (sizes in order of first appearance)."""
    groups: dict[tuple[int, int], list] = {}
    for t in todo:
        groups.setdefault(t["image"].shape[:2], []).append(t)
    return [g[i:i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]


def _calls(method: str, s: InpaintSettings, part: list) -> int:
    """Model calls made for one same-size chunk: 1 for batched LaMa, one per masked image for lama-cleaner's
    own calls, none for the paddings."""
    masked = sum(bool(t["mask"].any()) for t in part)
    if method in ("zero", "mean", "blur") or not masked:
        return 0
    if method == "lama" and s.batched and s.hd_strategy == "Original":
        return 1
    return masked


__all__ = [
    "InpaintSettings", "InputError", "KEY_FIELD", "LAMA_FILE", "METHODS", "blurred", "boxes_to_mask", "fill",
    "fill_batch", "fill_blur", "fill_mean", "fill_zero", "inpaint_shard", "lama_batch", "lama_cleaner_call",
    "lama_config", "load_lama", "mean_colour", "opencv_model",
]
