"""Loader of the ``vlm`` role: the generative vision-language model of CounterCurate (§3.5, §4).

The paper fine-tunes and evaluates LLaVA-1.5 (Liu et al., 2023a; CounterCurate §4, "we select ... LLaVA-1.5
as base models"). Its transformers port (``llava-hf/llava-1.5-7b-hf`` / ``-13b-hf``) is a
``LlavaForConditionalGeneration`` (CLIP ViT-L/14-336 vision tower, MLP projector, Vicuna/Llama decoder) with a
``LlavaProcessor`` (``CLIPImageProcessor`` + Llama tokenizer + chat template). The role loads any such
checkpoint -- a hub id, a downloaded folder, the tiny stand-in of :mod:`counterfactory.models.tiny_vlm`, or a
checkpoint written by ``counterfactory countercurate vlm-train`` (LoRA already merged) -- with
``LlavaForConditionalGeneration.from_pretrained`` and ``AutoProcessor.from_pretrained`` (never
``trust_remote_code``) and returns ``(model, processor)`` with the model in eval mode.
"""

from __future__ import annotations

from .base import ModelSpec, _hf_kwargs, _src, _transformers_dtype, register_loader


@register_loader("vlm:transformers")
def load_vlm_transformers(spec: ModelSpec, kw: dict):
    """``(LlavaForConditionalGeneration, processor)`` of a LLaVA-1.5-class checkpoint (id or folder)."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(_src(spec), **_hf_kwargs(spec), **_transformers_dtype(kw))
    processor = AutoProcessor.from_pretrained(_src(spec), **_hf_kwargs(spec))
    if getattr(processor, "tokenizer", None) is None or getattr(processor, "image_processor", None) is None:
        raise ValueError(f"{type(processor).__name__} has no tokenizer and image processor; a LLaVA checkpoint "
                         "needs both (save the LlavaProcessor with save_pretrained next to the weights)")
    return model.eval(), processor
