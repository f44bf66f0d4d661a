"""Multimodal deep prompt tuning of transformers' ``BlipForImageTextRetrieval`` (CVLD §4.2, §5.1).

CVLD adapts BLIP to few-shot classification by learning prompt embeddings ``p_I`` and ``p_T`` for the
vision and text transformer encoders while every weight of the model stays frozen (Eq. 5). §5.1 gives the
sizes: ``m = 4`` prompts at the input of each of the first 9 layers of both encoders (the defaults of
:func:`add_prompts`). What the paper leaves open is ours, as follows:

* **Where.** The prompts go right after the ``[CLS]`` token (position 0), so the heads that read position
  0 (BLIP's ITC projections and ITM head) keep reading ``[CLS]``. They are inserted after the embedding
  layers, so they carry no position embedding (as visual prompt tuning does) and use no text positions.
* **Deep prompts.** The prompts of layer 0 are inserted into the embeddings' output; before layer ``i``
  (``0 < i < n_layers``) the ``m`` prompt positions coming out of layer ``i - 1`` are replaced by layer
  ``i``'s prompts. After the last prompted layer the prompt positions are **carried along** through the
  remaining layers (MaPLe / VPT-deep do the same) and stay in the encoders' outputs: the vision output that
  ITM cross-attends to has ``m`` more tokens, and the text output's tokens after ``[CLS]`` are shifted by
  ``m``. The text attention mask gets ``m`` ones after ``[CLS]``.
* **Depth.** ``n_layers`` larger than an encoder's depth prompts every layer of that encoder (tiny test
  models have 2 layers); a warning says so.
* **Initialisation.** Normal with ``init_std`` (0.02), drawn from a ``torch.Generator`` seeded with ``seed``.

It is implemented with module hooks (no copy of transformers' layer code): a forward hook on each
encoder's embeddings, forward pre-hooks on the prompted layers, and a forward pre-hook on the text
encoder extending its attention mask. The prompt tensors live in a submodule ``model.cvld_prompts``
(so ``model.to(device)`` moves them); :func:`remove_prompts` takes hooks and submodule away and restores
the ``requires_grad`` flags, giving back the original forward exactly.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError, input_error
from ..io import atomic_path

log = logging.getLogger(__name__)

#: attribute of the model holding the prompts
ATTR = "cvld_prompts"
#: CVLD §5.1: m = 4 prompts at each of the first 9 layers of both encoders
N_PROMPTS = 4
N_LAYERS = 9


class PromptBank(nn.Module):
    """``vision``: (layers_v, m, width_v) and ``text``: (layers_t, m, width_t) learnable prompts."""

    def __init__(self, vision: torch.Tensor, text: torch.Tensor):
        super().__init__()
        self.vision = nn.Parameter(vision)
        self.text = nn.Parameter(text)
        self._handles: list = []
        self._grad_flags: dict[str, bool] = {}


def _insert(hidden: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
    """``hidden`` with ``prompts`` (m, D) inserted after position 0 for every row."""
    p = prompts.to(hidden.dtype).unsqueeze(0).expand(hidden.shape[0], -1, -1)
    return torch.cat([hidden[:, :1], p, hidden[:, 1:]], dim=1)


def _replace(hidden: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
    """``hidden`` with positions ``1 .. m`` replaced by ``prompts`` (m, D)."""
    m = prompts.shape[0]
    p = prompts.to(hidden.dtype).unsqueeze(0).expand(hidden.shape[0], -1, -1)
    return torch.cat([hidden[:, :1], p, hidden[:, 1 + m:]], dim=1)


def _encoders(model: nn.Module):
    """(vision embeddings, vision layers, text model, text embeddings, text layers) of a BLIP retrieval model."""
    try:
        return (model.vision_model.embeddings, model.vision_model.encoder.layers, model.text_encoder,
                model.text_encoder.embeddings, model.text_encoder.encoder.layer)
    except AttributeError as exc:
        raise ConfigError(f"prompt tuning: {type(model).__name__} is not a BLIP image-text retrieval model "
                          f"({exc}). Fix: load the model as BlipForImageTextRetrieval") from exc


def _depth(n_layers: int, layers, which: str) -> int:
    if n_layers > len(layers):
        log.warning("prompt tuning: %d prompted layers asked, the %s encoder has %d; prompting all of them",
                    n_layers, which, len(layers))
    return min(n_layers, len(layers))


def _layer_hook(bank: PromptBank, which: str, i: int):
    def hook(module, args, kwargs):
        return (_replace(args[0], getattr(bank, which)[i]),) + tuple(args[1:]), kwargs
    return hook


def _embedding_hook(bank: PromptBank, which: str):
    def hook(module, args, output):
        return _insert(output, getattr(bank, which)[0])
    return hook


def _mask_hook(bank: PromptBank):
    def hook(module, args, kwargs):
        positional = kwargs.get("attention_mask") is None and len(args) > 1 and args[1] is not None
        mask = args[1] if positional else kwargs.get("attention_mask")
        if mask is None or kwargs.get("encoder_embeds") is not None:
            return None
        ones = mask.new_ones(mask.shape[0], bank.text.shape[1])
        mask = torch.cat([mask[:, :1], ones, mask[:, 1:]], dim=1)
        if positional:
            return (args[0], mask) + tuple(args[2:]), kwargs
        return args, {**kwargs, "attention_mask": mask}
    return hook


def add_prompts(model: nn.Module, n_prompts: int = N_PROMPTS, n_layers: int = N_LAYERS, init_std: float = 0.02,
                seed: int = 0) -> PromptBank:
    """Add deep prompts to ``model`` (a ``BlipForImageTextRetrieval``) in place and freeze every other
    parameter; returns the prompt bank (also ``model.cvld_prompts``). Defaults: CVLD §5.1."""
    if getattr(model, ATTR, None) is not None:
        raise ConfigError("prompt tuning: the model already has prompts. Fix: call remove_prompts(model) first")
    if n_prompts < 1 or n_layers < 1:
        raise ConfigError(f"prompt tuning: n_prompts and n_layers must be >= 1, got {n_prompts}, {n_layers}. "
                          "Fix: use the paper's 4 prompts at 9 layers or other positive values")
    v_emb, v_layers, _, t_emb, t_layers = _encoders(model)
    nv, nt = _depth(n_layers, v_layers, "vision"), _depth(n_layers, t_layers, "text")
    gen = torch.Generator().manual_seed(int(seed))
    ref = next(model.parameters())
    vision = torch.randn(nv, n_prompts, model.config.vision_config.hidden_size, generator=gen) * init_std
    text = torch.randn(nt, n_prompts, model.config.text_config.hidden_size, generator=gen) * init_std
    return _attach(model, vision.to(ref.device, ref.dtype), text.to(ref.device, ref.dtype))


def _attach(model: nn.Module, vision: torch.Tensor, text: torch.Tensor) -> PromptBank:
    v_emb, v_layers, t_model, t_emb, t_layers = _encoders(model)
    if vision.shape[0] > len(v_layers) or text.shape[0] > len(t_layers) or vision.shape[1] != text.shape[1]:
        raise ConfigError(f"prompt tuning: prompts of shape vision {tuple(vision.shape)} / text {tuple(text.shape)} "
                          f"do not fit a model with {len(v_layers)} vision and {len(t_layers)} text layers. "
                          "Fix: load prompts saved from a model of the same architecture")
    grad_flags = {n: p.requires_grad for n, p in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    bank = PromptBank(vision, text)
    bank._grad_flags = grad_flags
    model.add_module(ATTR, bank)
    handles = [v_emb.register_forward_hook(_embedding_hook(bank, "vision")),
               t_emb.register_forward_hook(_embedding_hook(bank, "text")),
               t_model.register_forward_pre_hook(_mask_hook(bank), with_kwargs=True)]
    handles += [v_layers[i].register_forward_pre_hook(_layer_hook(bank, "vision", i), with_kwargs=True)
                for i in range(1, vision.shape[0])]
    handles += [t_layers[i].register_forward_pre_hook(_layer_hook(bank, "text", i), with_kwargs=True)
                for i in range(1, text.shape[0])]
    bank._handles = handles
    return bank


def prompt_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The learnable prompts of ``model`` (vision, text): what the optimiser updates in Eq. 5."""
    bank = getattr(model, ATTR, None)
    if bank is None:
        raise ConfigError("prompt tuning: the model has no prompts. Fix: call add_prompts(model) first")
    return [bank.vision, bank.text]


def remove_prompts(model: nn.Module) -> None:
    """Remove the prompts and hooks; the parameters get their ``requires_grad`` flags back."""
    bank = getattr(model, ATTR, None)
    if bank is None:
        return
    for handle in bank._handles:
        handle.remove()
    delattr(model, ATTR)
    for name, p in model.named_parameters():
        p.requires_grad_(bank._grad_flags.get(name, True))


def save_prompts(model: nn.Module, path: str | Path) -> Path:
    """Write the prompt tensors alone (safetensors, atomically), with their sizes in the metadata."""
    from safetensors.torch import save_file

    vision, text = (p.detach().cpu().contiguous() for p in prompt_parameters(model))
    meta = {"n_prompts": str(vision.shape[1]), "vision_layers": str(vision.shape[0]),
            "text_layers": str(text.shape[0]), "format": "counterfactory.cvld_prompts"}
    with atomic_path(path) as tmp:
        save_file({"vision": vision, "text": text}, str(tmp), metadata=meta)
    return Path(path)


def load_prompts(model: nn.Module, path: str | Path) -> PromptBank:
    """Attach the prompts saved by :func:`save_prompts` to ``model`` (replacing any it has)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "prompt file not found", "train with train_classification first, or fix the path")
    tensors = load_file(str(path))
    if set(tensors) != {"vision", "text"}:
        raise input_error(path, None, f"tensors {sorted(tensors)} are not CVLD prompts (vision, text)",
                          "pass a file written by save_prompts")
    remove_prompts(model)
    ref = next(model.parameters())
    return _attach(model, tensors["vision"].to(ref.device, ref.dtype), tensors["text"].to(ref.device, ref.dtype))


def prompt_summary(model: nn.Module) -> str:
    """One line: the prompt shapes (for logs and run records)."""
    vision, text = prompt_parameters(model)
    return json.dumps({"vision": list(vision.shape), "text": list(text.shape)})
