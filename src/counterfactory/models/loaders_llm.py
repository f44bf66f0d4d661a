"""Loader of the ``llm`` role: the local instruction-tuned model in GPT-4(V)'s role (CounterCurate §3.2 and
app. B: rewriting above/below captions; §3.4 and app. A: Flickr30k-Attributes negatives).

The paper queries closed models; here any local chat model fills the role, loaded with the library's own
loaders (never ``trust_remote_code``):

* a text-only checkpoint (e.g. ``Qwen/Qwen2.5-7B-Instruct``) -> ``AutoModelForCausalLM`` + ``AutoTokenizer``;
  returns ``(model, tokenizer)``;
* a vision-language checkpoint -- its ``config.json`` has a ``vision_config`` (LLaVA, Qwen2-VL, Idefics ...)
  -> ``AutoModelForImageTextToText`` + ``AutoProcessor``; returns ``(model, processor)``, and the ``llm``
  tasks then also see the (box-annotated) image, as GPT-4V did in app. A.

Either way the tokenizer must carry a chat template (``apply_chat_template``); a checkpoint without one is a
:class:`~counterfactory.errors.ModelLoadError` naming the fix. ``registry.load(cfg, "llm", dtype=...)``
passes a torch dtype through to ``from_pretrained``. The tiny offline stand-in is built by
:func:`counterfactory.models.tiny_llm.build_llm`.
"""

from __future__ import annotations

from ..errors import ModelLoadError
from .base import ModelSpec, _hf_kwargs, _src, _transformers_dtype, register_loader


def is_vision_language(config) -> bool:
    """True for a checkpoint whose config has a vision tower (``vision_config``)."""
    return getattr(config, "vision_config", None) is not None


@register_loader("llm:transformers")
def load_llm_transformers(spec: ModelSpec, kw: dict):
    """``(model, tokenizer)`` of a causal chat LM, or ``(model, processor)`` of a vision-language chat model."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    extra = {**_hf_kwargs(spec), **_transformers_dtype(kw)}
    config = AutoConfig.from_pretrained(_src(spec), **_hf_kwargs(spec))
    if is_vision_language(config):
        processor = AutoProcessor.from_pretrained(_src(spec), **_hf_kwargs(spec))
        model = AutoModelForImageTextToText.from_pretrained(_src(spec), **extra)
        tokenizer, out = processor.tokenizer, (model.eval(), processor)
    else:
        tokenizer = AutoTokenizer.from_pretrained(_src(spec), **_hf_kwargs(spec))
        model = AutoModelForCausalLM.from_pretrained(_src(spec), **extra)
        out = (model.eval(), tokenizer)
    template = getattr(out[1], "chat_template", None) or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ModelLoadError(
            f"role 'llm': {spec.source} has no chat template, so instructions cannot be formatted for it. "
            f"Fix: point models.llm.source at an instruction-tuned (chat) checkpoint, e.g. Qwen/Qwen2.5-7B-Instruct"
        )
    return out
