"""Loader of the ``nsfw`` role: an image classifier for SocialCounterfactuals' NSFW filter (§3.4, §8.3).

The paper uses ``Falconsai/nsfw_image_detection`` (§8.3, footnote 9): a ``ViTForImageClassification``
fine-tuned from google/vit-base-patch16-224-in21k with the two classes ``normal`` and ``nsfw``. The role
loads any transformers image-classification checkpoint with ``AutoModelForImageClassification`` and
``AutoImageProcessor`` (never ``trust_remote_code``) and returns ``(model, image_processor)``; the class
names come from the checkpoint's ``config.id2label``. The tiny offline stand-in is built by
:func:`counterfactory.models.tiny_nsfw.build_nsfw`.
"""

from __future__ import annotations

from .base import ModelSpec, _hf_kwargs, _src, _transformers_dtype, register_loader


@register_loader("nsfw:transformers")
def load_nsfw_transformers(spec: ModelSpec, kw: dict):
    """``(model, image_processor)`` of an image-classification checkpoint (Falconsai/nsfw_image_detection)."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(_src(spec), **_hf_kwargs(spec), **_transformers_dtype(kw))
    processor = AutoImageProcessor.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), processor
