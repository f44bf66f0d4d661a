"""Loaders of the CVLD editing roles, registered with :func:`counterfactory.models.base.register_loader`.

* ``editor`` (diffusers): ``StableDiffusionInstructPix2PixPipeline.from_pretrained(path)`` -- InstructPix2Pix
  (timbrooks/instruct-pix2pix at paper scale, CVLD §3.3), without a safety checker; ``dtype=`` loads it in that
  precision (its ``fp16`` weight variant for a half dtype when the repository has one).
* ``image_encoder`` (transformers): ``(AutoModel, AutoImageProcessor)`` -- the Swin encoder of the top-k filter
  (§5.1, e.g. microsoft/swin-base-patch4-window7-224), never ``trust_remote_code``.

The null-text inversion + Prompt-to-Prompt path uses the existing ``sd`` role (a ``StableDiffusionPipeline``).
"""

from __future__ import annotations

from .base import ModelSpec, _diffusers_dtype, _hf_kwargs, _src, _transformers_dtype, register_loader


@register_loader("editor:diffusers")
def load_editor(spec: ModelSpec, kw: dict):
    """The InstructPix2Pix pipeline of the ``editor`` role."""
    from diffusers import StableDiffusionInstructPix2PixPipeline

    return StableDiffusionInstructPix2PixPipeline.from_pretrained(
        _src(spec), safety_checker=None, requires_safety_checker=False, **_hf_kwargs(spec),
        **_diffusers_dtype(spec, kw))


@register_loader("image_encoder:transformers")
def load_image_encoder(spec: ModelSpec, kw: dict):
    """``(model, image_processor)`` of the ``image_encoder`` role (a Swin checkpoint at paper scale)."""
    from transformers import AutoImageProcessor, AutoModel

    model = AutoModel.from_pretrained(_src(spec), **_hf_kwargs(spec), **_transformers_dtype(kw))
    processor = AutoImageProcessor.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), processor
