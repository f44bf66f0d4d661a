"""The one place that decides which device, precision and fast path a stage runs on.

``device: auto`` picks CUDA when present, then Intel Gaudi (HPU, through ``habana_frameworks``),
then CPU. ``hpu`` requires Gaudi's PyTorch bridge and says so when it is missing.

``precision: auto`` (the default) is bf16 on a CUDA GPU that supports it (fp16 on older GPUs) and on
HPU, fp32 on CPU. The ``performance`` section is the rest of the fast path (issue 16): with
``channels_last: true``, modules with convolutions (UNet, VAE, vision towers) on an accelerator go to
``torch.channels_last`` (off by default: measured on an H100 in bf16 with SDPA, the SD v1.5-sized UNet
at 32 rows and the VAE decoder at 8 images ran 12-14 % *slower* channels-last, 5-10 % faster at 8 UNet
rows); ``compile: true`` compiles the UNet with ``torch.compile``; a stage batch size of ``auto``
becomes the largest batch whose measured per-item footprint fits the free accelerator memory
(:func:`auto_batch_size`).
Attention already runs through PyTorch's fused ``scaled_dot_product_attention`` (diffusers'
``AttnProcessor2_0`` and our Prompt-to-Prompt processors), and stays so.

Tolerance of half precision (fp32 vs bf16 on the same candidates, ``tests/test_fast_path.py``):
the image-caption and image-image CLIP cosines (``sim_0``, ``sim_1``, ``sim_image``) move by at most
``PRECISION_ATOL`` = 0.02 (measured: 0.003 on the tiny CLIP); the directional similarity, a cosine of
feature *differences*, moves by at most ``DIRECTION_ATOL / sqrt(2 (1 - sim_image))``
(:func:`direction_tolerance`; measured constant 0.003, documented 0.01), since near-identical images
leave a difference of the size of the rounding. A filter decision can differ only for a candidate
whose score lies within that band of its threshold. channels_last changes no output beyond float
rounding (``LAYOUT_ATOL`` relative, tested in fp32). ``torch.compile`` fuses kernels, which round
differently: in fp32 that is float rounding, in half precision as large as the precision change
itself (tiny SD on an H100, 3 steps, bf16: compiled vs eager max 17/255 per pixel; bf16 vs fp32 40/255).
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .settings import config_value, schema_defaults

if TYPE_CHECKING:  # torch is imported where it is used: a step that needs no device does not pay for it
    import torch

log = logging.getLogger(__name__)

_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # torch dtypes by name
#: half precision vs fp32: bound on image-caption / image-image cosine scores (module docstring)
PRECISION_ATOL = 0.02
#: half precision vs fp32: constant of the directional-similarity bound (:func:`direction_tolerance`)
DIRECTION_ATOL = 0.01
#: channels_last vs the contiguous module (relative, float rounding)
LAYOUT_ATOL = 1e-5


def direction_tolerance(sim_image):
    """Documented bound on how far half precision moves ``sim_direction``: ``DIRECTION_ATOL`` divided
    by the relative size ``sqrt(2 (1 - sim_image))`` of the image-feature difference, at most 2."""
    import numpy as np

    gap = np.sqrt(np.maximum(2.0 * (1.0 - np.asarray(sim_image, dtype=np.float64)), 0.0))
    with np.errstate(divide="ignore"):
        return np.minimum(2.0, DIRECTION_ATOL / gap)


def _hpu_available() -> bool:
    import torch
    if importlib.util.find_spec("habana_frameworks") is None:
        return False
    try:
        import habana_frameworks.torch.core  # noqa: F401  (registers the hpu device)
    except Exception as exc:  # a broken Gaudi install must not crash `device: auto` on other machines
        logging.getLogger(__name__).warning("habana_frameworks is installed but failed to import: %s", exc)
        return False
    return bool(getattr(torch, "hpu", None) and torch.hpu.is_available())


def resolve_device(name: str = "auto") -> torch.device:
    """Map the config's ``device`` value to a :class:`torch.device`."""
    import torch
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _hpu_available():
            return torch.device("hpu")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda was requested but no CUDA GPU is visible. Fix: set device: auto or cpu")
    if name == "hpu" and not _hpu_available():
        raise ConfigError(
            "device: hpu was requested but Intel Gaudi's PyTorch bridge (habana_frameworks) is not "
            "installed or sees no HPU. Fix: run inside Intel's Gaudi PyTorch container, or set device: auto"
        )
    if name not in ("cpu", "cuda", "hpu"):
        raise ConfigError(f"device: unknown value {name!r}. Fix: use auto, cpu, cuda or hpu")
    return torch.device(name)


def _auto_dtype(device: torch.device | None) -> torch.dtype:
    """``precision: auto``: bf16 on HPU and on CUDA GPUs with bf16 (Ampere and later), fp16 on older
    CUDA GPUs, fp32 on CPU (or no device given)."""
    import torch
    if device is None or device.type == "cpu":
        return torch.float32
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def resolve_dtype(precision: str = "auto", device: torch.device | None = None) -> torch.dtype:
    """Map ``precision`` to a dtype; ``auto`` see :func:`_auto_dtype`; fp16 on CPU falls back to fp32
    (CPU kernels are fp32)."""
    import torch
    if precision == "auto":
        return _auto_dtype(device)
    if precision not in _DTYPES:
        raise ConfigError(f"precision: unknown value {precision!r}. Fix: use auto, fp32, fp16 or bf16")
    if device is not None and device.type == "cpu" and precision == "fp16":
        return torch.float32
    return getattr(torch, _DTYPES[precision])


def engine_dtypes(dtype: torch.dtype, autocast: bool) -> tuple[torch.dtype, torch.dtype | None]:
    """``(weight dtype, autocast dtype or None)`` of a stage run in ``dtype``: with ``autocast`` and a half ``dtype``
    the weights stay fp32 and the forward passes run under ``torch.autocast`` in ``dtype`` (COCO-Counterfactuals
    B.1.2: the InstructPix2Pix generator's fp16 autocast); otherwise the weights are cast to ``dtype`` (pure)."""
    import torch
    if autocast and dtype != torch.float32:
        return torch.float32, dtype
    return dtype, None


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` on ``device`` in ``dtype``; a no-op context for None."""
    import contextlib

    import torch
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def from_config(cfg: dict) -> tuple[torch.device, torch.dtype]:
    device = resolve_device(config_value(cfg, "device"))
    return device, resolve_dtype(config_value(cfg, "precision"), device)


def with_stage_precision(cfg: dict, precision: str | None) -> dict:
    """``cfg`` with the config-wide ``precision`` replaced by a stage's own (``None``: ``cfg`` itself), so the stage's
    models load through :func:`from_config` in that precision (e.g. ``social_counterfactuals.images.precision``:
    the authors' SocialCounterfactuals generator ran in fp32). A shallow copy; a :class:`ConfigView` stays one."""
    if precision is None or precision == config_value(cfg, "precision"):
        return cfg
    resolve_dtype(precision)  # an unknown value fails here, naming the fix
    out = copy.copy(cfg)
    out["precision"] = precision
    return out


def release_memory() -> None:
    """Return cached accelerator memory after a model is dropped (one model per role is loaded at a time)."""
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- the fast path


@dataclass(frozen=True)
@schema_defaults("performance")
class Performance:
    """The config's ``performance`` section (defaults: schema, issue 16)."""

    channels_last: bool
    compile: bool
    compile_mode: str
    batch_size: int | str
    max_batch_size: int
    cpu_batch_size: int
    memory_fraction: float

    @classmethod
    def from_config(cls, cfg: dict | None) -> "Performance":
        section = (cfg or {}).get("performance") or {}
        unknown = sorted(set(section) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"performance: unknown keys {unknown}. Fix: use {sorted(cls.__dataclass_fields__)}")
        out = cls(**section)
        if out.batch_size != "auto" and not (isinstance(out.batch_size, int) and out.batch_size >= 1):
            raise ConfigError(f"performance.batch_size: {out.batch_size!r}. Fix: use auto or an integer >= 1")
        if not 0 < out.memory_fraction <= 1:
            raise ConfigError(f"performance.memory_fraction: {out.memory_fraction}. Fix: use a value in (0, 1]")
        return out


def _has_conv(module: torch.nn.Module) -> bool:
    return any(p.dim() == 4 for p in module.parameters())


def to_channels_last(module: torch.nn.Module) -> torch.nn.Module:
    """Store the 4-D (convolution) weights of ``module`` in ``torch.channels_last`` (in place)."""
    import torch
    return module.to(memory_format=torch.channels_last)


def compile_module(module: torch.nn.Module, mode: str = "default", device: torch.device | None = None):
    """``module.compile(mode=...)`` in place (attributes and ``set_attn_processor`` stay reachable);
    where ``torch.compile`` is unavailable, log one line and leave the module eager."""
    import torch
    why = None
    if not callable(getattr(torch, "compile", None)) or not hasattr(module, "compile"):
        why = "this PyTorch has no torch.compile"
    else:
        try:
            import torch._dynamo as dynamo

            if not dynamo.is_dynamo_supported():
                why = "torch.compile does not support this Python version"
        except Exception as exc:  # a broken or stripped-down torch build
            why = f"torch._dynamo cannot be imported ({exc})"
    if why:
        log.warning("performance.compile: %s; running %s uncompiled", why, type(module).__name__)
        return module
    kw = {"backend": "hpu_backend"} if device is not None and device.type == "hpu" else {"mode": mode}
    module.compile(**kw)
    log.info("performance.compile: %s compiled (%s)", type(module).__name__, kw)
    return module


def place(module: Any, device: torch.device, dtype: torch.dtype, perf: Performance | None = None, *,
          compile: bool = False) -> Any:
    """Put ``module`` on ``device`` in ``dtype`` in eval mode, with the fast path of ``perf``: on
    accelerators, channels_last when it has convolutions; ``compile`` marks the one module
    (the UNet) that ``perf.compile`` compiles. ``perf`` None = no layout change, no compile."""
    import torch
    module = module.to(device)
    if getattr(module, "dtype", None) != dtype:
        module = module.to(dtype)
    if hasattr(module, "eval"):
        module = module.eval()
    if perf is None or not isinstance(module, torch.nn.Module):
        return module
    if perf.channels_last and device.type != "cpu" and _has_conv(module):
        module = to_channels_last(module)
    if compile and perf.compile:
        module = compile_module(module, perf.compile_mode, device)
    return module


def place_pipeline(pipe: Any, cfg: dict) -> Any:
    """A diffusers pipeline on the config's device and precision, its UNet/VAE/encoders through
    :func:`place` (the UNet is the module ``performance.compile`` compiles)."""
    import torch
    device, dtype = from_config(cfg)
    perf = Performance.from_config(cfg)
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            placed = place(component, device, dtype, perf, compile=name == "unet")
            if placed is not component:
                setattr(pipe, name, placed)
    return pipe


#: per-item footprints (MiB) at the paper's sizes in half precision, used by :func:`auto_batch_size`:
#: ``sd_candidate`` one COCO-Counterfactuals candidate (2 prompts x 2 CFG rows through the SD v1.5
#: UNet at 64x64 latents = 512x512 images, B.1.2), ``clip_image`` one image through CLIP ViT-L/14 at
#: 224x224 (the filter, B.1.2). Measured peak growth per item on an H100 (bf16, SDPA): 256 MiB and
#: 8.3 MiB; doubled here as headroom (Prompt-to-Prompt state, allocator fragmentation).
FOOTPRINT_MIB = {"sd_candidate": 512.0, "clip_image": 16.0}


def free_memory(device: torch.device) -> int | None:
    """Free bytes on an accelerator, or None where it cannot be read (CPU, a bridge without the API)."""
    import torch
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "hpu":
        reader = getattr(getattr(torch, "hpu", None), "mem_get_info", None)
        return int(reader()[0]) if callable(reader) else None
    return None


def total_memory(device: torch.device) -> tuple[int, str] | None:
    """Total bytes and name of an accelerator, or None where it cannot be read (CPU, a bridge without the API)."""
    import torch
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory), torch.cuda.get_device_name(device)
    if device.type == "hpu":
        reader = getattr(getattr(torch, "hpu", None), "mem_get_info", None)
        return (int(reader()[1]), "Gaudi") if callable(reader) else None
    return None


def auto_batch_size(per_item_mib: float, device: torch.device, perf: Performance | None = None, *,
                    free_bytes: int | None = None, dtype: torch.dtype | None = None) -> int:
    """Largest power of two whose ``per_item_mib`` footprint (half precision; fp32 counts double) fits in
    ``perf.memory_fraction`` of the free accelerator memory, capped at ``perf.max_batch_size``; on CPU,
    or where free memory cannot be read, ``perf.cpu_batch_size``. ``free_bytes`` overrides the reading.
    A power of two keeps the choice (part of the resume fingerprints) stable when free memory varies a little.
    ``dtype`` None = bf16."""
    import torch
    perf = perf or Performance()
    free = free_bytes if free_bytes is not None else free_memory(device)
    if device.type == "cpu" or free is None:
        return perf.cpu_batch_size
    per_item = per_item_mib * (2 if dtype == torch.float32 else 1) * 2**20   # None: bf16
    fits = min(perf.max_batch_size, math.floor(free * perf.memory_fraction / per_item))
    return 1 if fits < 1 else 2 ** int(math.log2(fits))


def resolve_batch_size(value: int | str, cfg: dict | None, item: str) -> int:
    """A stage's batch size: an integer stays; ``auto`` becomes ``performance.batch_size`` when that is
    an integer, else :func:`auto_batch_size` of the documented ``FOOTPRINT_MIB[item]`` on the config's device."""
    if value != "auto":
        return int(value)
    perf = Performance.from_config(cfg)
    if perf.batch_size != "auto":
        return int(perf.batch_size)
    device, dtype = from_config(cfg or {})
    size = auto_batch_size(FOOTPRINT_MIB[item], device, perf, dtype=dtype)
    log.info("batch size auto -> %d (%s on %s, %.0f MiB per item)", size, item, device, FOOTPRINT_MIB[item])
    return size
