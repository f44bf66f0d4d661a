"""The one place that decides which device and precision a stage runs on.

``device: auto`` picks CUDA when present, then Intel Gaudi (HPU, through ``habana_frameworks``),
then CPU. ``hpu`` requires Gaudi's PyTorch bridge and says so when it is missing.
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from .errors import ConfigError

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _hpu_available() -> bool:
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


def resolve_dtype(precision: str = "fp32", device: torch.device | None = None) -> torch.dtype:
    """Map ``precision`` to a dtype; half precision on CPU falls back to fp32 (CPU kernels are fp32)."""
    if precision not in _DTYPES:
        raise ConfigError(f"precision: unknown value {precision!r}. Fix: use fp32, fp16 or bf16")
    if device is not None and device.type == "cpu" and precision == "fp16":
        return torch.float32
    return _DTYPES[precision]


def from_config(cfg: dict) -> tuple[torch.device, torch.dtype]:
    device = resolve_device(cfg.get("device", "auto"))
    return device, resolve_dtype(cfg.get("precision", "fp32"), device)


def release_memory() -> None:
    """Return cached accelerator memory after a model is dropped (one model per role is loaded at a time)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
