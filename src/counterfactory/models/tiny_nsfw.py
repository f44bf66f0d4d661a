"""Tiny stand-in for the ``nsfw`` role (SocialCounterfactuals §3.4, §8.3).

Same class as the paper's ``Falconsai/nsfw_image_detection`` (``ViTForImageClassification`` with the
labels ``{0: normal, 1: nsfw}``), randomly initialised with a fixed seed, 32 px input, 32 wide with 2
layers, saved with ``save_pretrained`` (safetensors) together with a ``ViTImageProcessor``, so the
``nsfw`` loader (:mod:`counterfactory.models.loaders_nsfw`) reads it back by path like the hub model.

The classifier's bias is set to :data:`NORMAL_BIAS` in favour of ``normal``, so that with the default
argmax rule the demo flags (almost) nothing and keeps its candidate sets; its weights are scaled up so the
``nsfw`` probability still depends on the image (roughly 0.02-0.3 on random and flat images), and a
probability threshold (``filter.nsfw.threshold``) in that range exercises the flagging path. Its outputs
carry no meaning.
"""

from __future__ import annotations

from pathlib import Path

from .tiny_common import _seed_all

#: image side of the tiny classifier (same as the other tiny vision roles)
TINY_IMAGE_SIZE = 32
#: logit bias of class ``normal`` over ``nsfw`` (half added to one, half subtracted from the other)
NORMAL_BIAS = 3.0
LABELS = {0: "normal", 1: "nsfw"}


def build_nsfw(out: Path, seed: int = 0) -> None:
    """Tiny ``ViTForImageClassification`` + ``ViTImageProcessor`` with labels ``{0: normal, 1: nsfw}``."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    _seed_all(seed)
    config = ViTConfig(
        image_size=TINY_IMAGE_SIZE, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=len(LABELS), id2label=dict(LABELS),
        label2id={v: k for k, v in LABELS.items()},
    )
    model = ViTForImageClassification(config)
    with torch.no_grad():
        model.classifier.weight.mul_(20.0)  # image-dependent spread of the logits (init std 0.02 is ~flat)
        model.classifier.bias.copy_(torch.tensor([NORMAL_BIAS / 2, -NORMAL_BIAS / 2]))
    processor = ViTImageProcessor(size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE},
                                  image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


BUILDERS = {"nsfw": build_nsfw}
