"""Tiny stand-ins for the CVLD editing roles (``editor``, ``image_encoder``).

Same classes as the paper-scale models, randomly initialised with a fixed seed and saved with the
libraries' own ``save_pretrained`` (safetensors), so :mod:`counterfactory.models.loaders_editing` reads
them back by path:

* ``editor``: a :class:`~diffusers.StableDiffusionInstructPix2PixPipeline` folder (the class of
  timbrooks/instruct-pix2pix, CVLD §3.3). Its VAE, text encoder, tokenizer and scheduler are those of the
  tiny ``sd`` (:func:`counterfactory.models.tiny_vision.build_sd` is called and its parts reused); the UNet
  has the tiny ``sd`` UNet's configuration with 8 input channels (4 noisy latents + 4 image latents, the
  InstructPix2Pix layout). InstructPix2Pix zero-initialises the 4 extra input channels of SD's ``conv_in``;
  the stand-in draws them at random instead, so its (meaningless) edits depend on the input image.
* ``image_encoder``: a tiny :class:`~transformers.SwinModel` (the class of microsoft/swin-*, the
  "pre-trained Swin transformer" of §5.1) on 32x32 inputs, with a ``ViTImageProcessor`` (what
  ``AutoImageProcessor`` gives for Swin checkpoints) saved beside it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .tiny_vision import build_sd

#: input side of the tiny Swin encoder
TINY_SWIN_IMAGE_SIZE = 32


def build_editor(out: Path, seed: int = 0) -> None:
    """Tiny ``StableDiffusionInstructPix2PixPipeline`` saved as a diffusers folder."""
    import torch
    from diffusers import StableDiffusionInstructPix2PixPipeline, StableDiffusionPipeline, UNet2DConditionModel

    with tempfile.TemporaryDirectory() as tmp:
        build_sd(Path(tmp), seed + 300)
        sd = StableDiffusionPipeline.from_pretrained(tmp, safety_checker=None, requires_safety_checker=False)
    torch.manual_seed(seed + 301)
    unet = UNet2DConditionModel.from_config(sd.unet.config, in_channels=8)
    pipe = StableDiffusionInstructPix2PixPipeline(
        vae=sd.vae, text_encoder=sd.text_encoder, tokenizer=sd.tokenizer, unet=unet, scheduler=sd.scheduler,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    pipe.save_pretrained(out, safe_serialization=True)


def build_image_encoder(out: Path, seed: int = 0) -> None:
    """Tiny ``SwinModel`` (two stages, window 4 on 32x32 inputs) + ``ViTImageProcessor``."""
    import torch
    from transformers import SwinConfig, SwinModel, ViTImageProcessor

    torch.manual_seed(seed)
    config = SwinConfig(image_size=TINY_SWIN_IMAGE_SIZE, patch_size=4, embed_dim=16, depths=[1, 1],
                        num_heads=[2, 4], window_size=4, mlp_ratio=2.0)
    SwinModel(config).save_pretrained(out, safe_serialization=True)
    ViTImageProcessor(size={"height": TINY_SWIN_IMAGE_SIZE, "width": TINY_SWIN_IMAGE_SIZE},
                      image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(out)


BUILDERS = {"editor": build_editor, "image_encoder": build_image_encoder}
