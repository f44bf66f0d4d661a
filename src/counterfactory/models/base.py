"""What the model registry and its loader modules share: :class:`ModelSpec`, the loader table
(:func:`register_loader`) and the helpers every loader uses (``from_pretrained`` arguments, the dtype / weight
variant of a load, open_clip's loader, the local HF-cache lookup of a hub id).

:mod:`.registry` (``load``, identity, checks) and the ``loaders_*`` modules import this module; it imports none of
them, so registration by import runs one way: the registry imports its loader modules, each loader module registers
its loaders here. The names are also reachable as ``registry.<name>``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .identity import hf_snapshot


@dataclass(frozen=True)
class ModelSpec:
    role: str
    source: str
    library: str
    revision: str | None = None
    pretrained: str | None = None

    @property
    def is_local(self) -> bool:
        """A source is a local folder if it exists on disk or is written like a path."""
        s = self.source
        if s.startswith("local-dir:"):
            return True
        return Path(s).exists() or s.startswith(("/", "./", "../", "~")) or s.startswith("resources/")

    @property
    def local_path(self) -> Path:
        return Path(os.path.expanduser(self.source.removeprefix("local-dir:")))


#: loader of each kind (``"<role>"`` or ``"<role>:<library>"``), filled by :func:`register_loader`
_LOADERS: dict[str, Callable[[ModelSpec, dict], Any]] = {}


def register_loader(kind: str):
    """Decorator: register the loader for ``kind`` (``"<role>"`` or ``"<role>:<library>"``)."""

    def deco(fn):
        _LOADERS[kind] = fn
        return fn

    return deco


def _hub_candidates(spec: ModelSpec) -> list[str]:
    source = spec.source
    if spec.library == "open_clip" and not source.startswith("hf-hub:"):
        return []  # open_clip architecture names (ViT-B-32) are not hub ids
    repo_id = source.removeprefix("hf-hub:")
    out = [repo_id]
    if spec.library == "sentence_transformers" and "/" not in repo_id:
        out.insert(0, f"sentence-transformers/{repo_id}")
    return out


def resolve_hub(spec: ModelSpec) -> tuple[Path | None, str | None]:
    """``(snapshot folder, commit)`` of a hub id in the local HF cache, or ``(None, None)`` when it is
    not cached (never contacts the hub)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None, None
    for repo_id in _hub_candidates(spec):
        try:
            folder = Path(snapshot_download(repo_id, revision=spec.revision, local_files_only=True))
        except Exception:  # not cached, invalid id, ...: the hub library raises various types
            continue
        if folder.is_dir():
            snap = hf_snapshot(folder)
            return folder, snap[1] if snap else None
    return None, None


def _hf_kwargs(spec: ModelSpec) -> dict:
    kw: dict[str, Any] = {}
    if spec.revision and not spec.is_local:
        kw["revision"] = spec.revision
    return kw


def _src(spec: ModelSpec) -> str:
    return str(spec.local_path) if spec.is_local else spec.source


#: weight variants a half-precision load prefers, in order (the hub's diffusers repositories store their
#: half-precision weights as ``<name>.fp16.safetensors`` beside the fp32 ones, e.g. SDXL base; a bf16 load
#: takes fp16 weights when no bf16 ones exist: half the bytes read, then one cast)
HALF_VARIANTS = {"float16": ("fp16",), "bfloat16": ("bf16", "fp16")}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json")


def _names_variant(name: str, variant: str) -> bool:
    """Whether file ``name`` is a weight file (or shard index) of ``variant``: ``x.fp16.safetensors``,
    ``x-00001-of-00002.fp16.safetensors``, ``x.safetensors.index.fp16.json``, legacy ``x.fp16-00001-of-00002.bin``."""
    if not name.endswith(_WEIGHT_SUFFIXES) or (name.endswith(".json") and ".index." not in name):
        return False
    return any(part == variant or part.startswith(f"{variant}-") for part in name.split(".")[1:-1])


def _model_files(spec: ModelSpec) -> list[str] | None:
    """Relative paths (top level and one folder down) of the files of a role's model: the local folder, the hub
    id's cached snapshot, else the hub's file list when online; None when unknown (offline and not cached)."""
    folder = spec.local_path if spec.is_local else resolve_hub(spec)[0]
    if folder is not None:
        if not folder.is_dir():
            return None
        return [p.relative_to(folder).as_posix() for p in folder.glob("*") if p.is_file()] + \
               [p.relative_to(folder).as_posix() for p in folder.glob("*/*") if p.is_file()]
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        return None
    try:
        from huggingface_hub import list_repo_files

        return list(list_repo_files(spec.source.removeprefix("hf-hub:"), revision=spec.revision))
    except Exception:  # no network, private or unknown id: the load itself reports what is wrong
        return None


def half_variant(spec: ModelSpec, dtype: Any) -> str | None:
    """The weight variant a load in ``dtype`` reads: for fp16 / bf16, the first of :data:`HALF_VARIANTS` whose files
    the role's model has (``fp16`` for SDXL base's repository); None for fp32, or when it has none (the default
    files are read and cast, e.g. a folder saved in fp16 under the default names)."""
    names = HALF_VARIANTS.get(str(dtype).removeprefix("torch."), ())
    files = _model_files(spec) if names else None
    for variant in names:
        if files and any(_names_variant(f.rsplit("/", 1)[-1], variant) for f in files):
            return variant
    return None


def diffusers_dtype_key() -> str:
    """The ``from_pretrained`` keyword of a diffusers load's dtype: ``dtype`` where diffusers has it (it deprecates
    ``torch_dtype``, which older releases take alone)."""
    import diffusers.utils

    return "dtype" if hasattr(diffusers.utils, "_resolve_dtype") else "torch_dtype"


def _diffusers_dtype(spec: ModelSpec, kw: dict) -> dict:
    """The dtype (``torch_dtype`` / ``dtype``, :func:`diffusers_dtype_key`) and the half-precision ``variant`` when
    the model has one, of a diffusers load, from ``registry.load(..., dtype=...)``: the weights are read in the
    stage's precision instead of fp32 then cast (half the host memory at paper scale). No ``dtype``: fp32, asked
    for explicitly -- left to the libraries, a folder saved in fp16 loads as two dtypes (transformers reads the text
    encoder in its saved dtype, diffusers the UNet in fp32) and fails on its first step."""
    import torch

    dtype = kw.get("dtype") or torch.float32
    variant = half_variant(spec, dtype)
    return {diffusers_dtype_key(): dtype, **({"variant": variant} if variant else {})}


def _transformers_dtype(kw: dict) -> dict:
    """``dtype`` of a transformers load: the caller's ``registry.load(..., dtype=...)``, else fp32 asked for
    explicitly. transformers 5 reads a checkpoint in its saved dtype by default (``dtype="auto"``): LLaVA-1.5's
    fp16 or Qwen2.5's bf16 weights would then run in half precision on the CPU (its slow reference GEMM) and be
    trained as half-precision master weights (AdamW updates of lr 2e-6 lost to rounding)."""
    import torch

    return {"dtype": kw.get("dtype") or torch.float32}


def _load_open_clip(spec: ModelSpec, kw: dict):
    import open_clip

    name = spec.source
    if spec.is_local and not name.startswith("local-dir:"):
        name = f"local-dir:{spec.local_path}"
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=spec.pretrained)
    tokenizer = open_clip.get_tokenizer(name)
    return model.eval(), preprocess, tokenizer
