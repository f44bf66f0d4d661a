"""Loaders of the CLIP-family models that SocialCounterfactuals probes beyond CLIP, OpenCLIP and FLAVA
(§4.2, Figure 3; ALIP is also debiased, §5.1 Tables 2, 16, 17): ALIP, LaCLIP and SLIP.

None of them is on the Hugging Face hub; each is a released PyTorch checkpoint file that loads into an open_clip
architecture, either directly or through a key mapping. A role is written like the ``negclip`` role: the open_clip
architecture as ``source`` and the released file as ``pretrained``::

    alip:   {source: ViT-B-32,      library: open_clip, pretrained: data/models/alip/ALIP_YFCC15M_B32.pt}
    laclip: {source: ViT-B-32,      library: open_clip, pretrained: data/models/laclip/laion400m_laclip.pt}
    slip:   {source: SLIP-ViT-B-16, library: open_clip, pretrained: data/models/slip/slip_base_100ep.pt}

========  =============================================  ===========================================================
family    released layout                                how it loads
========  =============================================  ===========================================================
ALIP      open_clip's own keys (ALIP's ``open_alip`` is  ``open_clip.create_model_and_transforms(arch,
          an open_clip fork), a bare state dict saved     pretrained=<file>)``: open_clip strips ``module.`` and
          from the DDP-wrapped model (``module.`` prefix) unwraps ``state_dict`` itself; ViT-B-32, GELU, OpenAI
                                                         mean/std (ALIP's ``open_alip.constants``)
LaCLIP    LAION-400M models: open_clip training          the same direct path (ViT-B-32 ``laion400m_laclip.pt``;
          checkpoints ``{"state_dict": ..., "epoch":     ViT-B-16 / ViT-L-14-quickgelu for the later files)
          ...}`` with open_clip keys
SLIP      SLIP's ``models.py``: ``{"state_dict":         :data:`SLIP_KEY_MAP` into :data:`SLIP_ARCH`, an open_clip
          {"module.visual.<timm ViT-B/16 keys>",          architecture with a timm ``vit_base_patch16_224`` image
          "module.image_projection", "module.<CLIP text   trunk (token pooling, bias-free linear head), the CLIP
          keys>", "module.image_mlp.*"}, "args": ...}``   text tower with QuickGELU, ImageNet mean/std, bilinear
                                                         resize (SLIP's evaluation transform)
========  =============================================  ===========================================================

The SLIP key mapping (:func:`slip_to_open_clip`): ``visual.<k>`` -> ``visual.trunk.<k>`` (the timm ViT's own keys,
unchanged); ``image_projection`` (vision width x embed dim, applied as ``x @ P``) -> ``visual.head.proj.weight``
(its transpose: ``nn.Linear`` computes ``x @ W.T``); the text keys (``token_embedding``, ``positional_embedding``,
``transformer.resblocks.*``, ``ln_final``, ``text_projection``) and ``logit_scale`` are open_clip's names already;
``image_mlp.*`` (SLIP's SimCLR head, used only in pre-training) is dropped. Every other key must match exactly
(``strict`` loading): a shape or name that does not fit raises :class:`ModelLoadError` naming the file.

A fine-tuned checkpoint (the debiasing runs save ``open_clip_model.safetensors`` into a folder, keys already in
open_clip's layout) loads from its folder: with the folder's ``open_clip_config.json`` when it has one, else into
the family's architecture (:data:`FAMILIES`). An open_clip-layout file that open_clip's weights-only loading refuses
(an ``args`` Namespace saved next to the weights) is read by :func:`read_state_dict` and loaded strictly instead.
"""

from __future__ import annotations

import argparse
import logging
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import ModelLoadError
from .base import ModelSpec, _load_open_clip, register_loader

log = logging.getLogger(__name__)

#: the open_clip architecture SLIP's ViT-B/16 checkpoints load into (registered from the JSON next to the schema)
SLIP_ARCH = "SLIP-ViT-B-16"
#: ImageNet statistics: SLIP's evaluation transform (``eval_zeroshot.py``) normalises with them
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Family:
    name: str
    arch: str                 # the released checkpoint's open_clip architecture (paper config)
    layout: str               # "open_clip" (loads directly) or "slip" (SLIP_KEY_MAP)
    url: str                  # where the released file comes from (docs/models.md)
    preprocess: Mapping[str, Any] = field(default_factory=dict)   # create_model_and_transforms overrides


FAMILIES: dict[str, Family] = {
    "alip": Family("ALIP", "ViT-B-32", "open_clip",
                   "https://github.com/deepglint/ALIP (README: ALIP_YFCC15M_B32.pt, Google Drive / BaiduYun)"),
    "laclip": Family("LaCLIP", "ViT-B-32", "open_clip",
                     "https://www.dropbox.com/s/ahj8ys8uufndy9y/laion400m_laclip.pt (github.com/LijieFan/LaCLIP)"),
    # CounterCurate Table 3: NegCLIP (Yuksekgonul et al. 2023), an OpenCLIP ViT-B/32 training checkpoint
    "negclip": Family("NegCLIP", "ViT-B-32", "open_clip",
                      "https://github.com/vinid/neg_clip (README: negclip.pth, Google Drive)"),
    "slip": Family("SLIP", SLIP_ARCH, "slip", "https://dl.fbaipublicfiles.com/slip/slip_base_100ep.pt",
                   {"image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD, "image_interpolation": "bilinear"}),
}

#: SLIP checkpoint prefix -> open_clip prefix (besides ``image_projection``, which is transposed)
SLIP_KEY_MAP = {"visual.": "visual.trunk."}
SLIP_DROPPED = ("image_mlp.",)
#: the weights files a folder may hold (a fine-tuned checkpoint: open_clip_model.safetensors)
FOLDER_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def register_archs() -> None:
    """Make :data:`SLIP_ARCH` known to open_clip (``open_clip.add_model_config``; idempotent)."""
    import open_clip

    if SLIP_ARCH not in open_clip.list_models():
        from importlib import resources

        open_clip.add_model_config(str(resources.files("counterfactory") / "resources" / "open_clip"
                                       / f"{SLIP_ARCH}.json"))


def read_state_dict(path: str | Path) -> dict:
    """The tensors of a released checkpoint: unwraps ``state_dict`` / ``model`` and strips DDP's ``module.``.

    Loaded with ``weights_only=True``; ``argparse.Namespace`` (SLIP and LaCLIP store their ``args``) is the one
    class allowed besides tensors and containers."""
    import torch

    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            obj: Any = load_file(str(path))
        else:
            with torch.serialization.safe_globals([argparse.Namespace]):
                obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and safetensors errors vary
        raise ModelLoadError(f"{path}: not a readable PyTorch checkpoint ({type(exc).__name__}: {exc}). "
                             f"Fix: re-download the released file") from exc
    for key in ("state_dict", "model"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
    if not isinstance(obj, Mapping) or not obj:
        raise ModelLoadError(f"{path}: holds no state dict (a mapping of parameter names to tensors). "
                             f"Fix: point the role's pretrained at the released checkpoint file")
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in obj.items()}


def slip_to_open_clip(state: Mapping[str, Any]) -> dict:
    """SLIP's keys -> :data:`SLIP_ARCH`'s keys (module docstring); ``image_mlp.*`` is dropped."""
    out = {}
    for key, value in state.items():
        if key.startswith(SLIP_DROPPED):
            continue
        if key == "image_projection":
            out["visual.head.proj.weight"] = value.t().contiguous()
            continue
        for old, new in SLIP_KEY_MAP.items():
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    return out


def _load_into(model, state: dict, path: Path, family: Family, arch: str) -> None:
    import torch

    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or shapes:
        what = "; ".join(part for part in (
            f"missing {missing[:3]}{' ...' if len(missing) > 3 else ''}" if missing else "",
            f"unexpected {unexpected[:3]}{' ...' if len(unexpected) > 3 else ''}" if unexpected else "",
            f"shape mismatch {[(k, tuple(state[k].shape), tuple(own[k].shape)) for k in shapes[:2]]}"
            if shapes else "") if part)
        raise ModelLoadError(
            f"{path}: does not fit the open_clip architecture {arch!r} as a {family.name} checkpoint ({what}). "
            f"Fix: use the released {family.name} file ({family.url}) and its architecture as the role's source")
    with torch.no_grad():
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)


def _folder_weights(folder: Path) -> Path:
    for name in FOLDER_WEIGHTS:
        if (folder / name).is_file():
            return folder / name
    raise ModelLoadError(f"{folder}: holds none of {list(FOLDER_WEIGHTS)}. Fix: point the role at a fine-tuned "
                         f"checkpoint folder, or at the architecture with pretrained = the released file")


def load_clip_family(spec: ModelSpec, kw: dict):
    """``(model, preprocess, tokenizer)`` of an ALIP / LaCLIP / SLIP role (module docstring)."""
    import open_clip

    register_archs()
    family = FAMILIES[spec.role]
    if spec.is_local:   # a fine-tuned checkpoint folder (or the released file given as the source)
        path = spec.local_path
        if path.is_dir() and (path / "open_clip_config.json").is_file():
            return _load_open_clip(spec, kw)
        weights, arch = (_folder_weights(path) if path.is_dir() else path), family.arch
        layout = None if path.is_dir() else family.layout   # a fine-tuned folder is in open_clip's layout
    else:
        if not spec.pretrained:
            raise ModelLoadError(
                f"role '{spec.role}' ({family.name}): models.{spec.role}.pretrained is not set. Fix: download the "
                f"released checkpoint ({family.url}) and set models.{spec.role}.pretrained to its path")
        weights, arch, layout = Path(spec.pretrained).expanduser(), spec.source, family.layout
        if not weights.is_file():
            raise ModelLoadError(
                f"role '{spec.role}' ({family.name}): checkpoint {weights} does not exist. Fix: download "
                f"{family.url} to {weights} (or set models.{spec.role}.pretrained to where it is)")
    loaded = None
    if layout == "open_clip":   # the released file is open_clip's own layout: open_clip loads it as it is
        try:
            loaded = open_clip.create_model_and_transforms(arch, pretrained=str(weights), **family.preprocess)
        except pickle.UnpicklingError:   # e.g. an ``args`` Namespace next to the weights: read it ourselves below
            log.info("%s: open_clip's weights-only load refused %s; reading its tensors", spec.role, weights)
    if loaded is not None:
        model, _, preprocess = loaded
    else:
        model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=None, **family.preprocess)
        state = read_state_dict(weights)
        if layout == "slip":
            state = slip_to_open_clip(state)
        _load_into(model, state, weights, family, arch)
    log.info("%s: %s loaded into open_clip %s", spec.role, weights, arch)
    return model.eval(), preprocess, open_clip.get_tokenizer(arch)


for _role in FAMILIES:
    register_loader(f"{_role}:open_clip")(load_clip_family)
