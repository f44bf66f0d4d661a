"""Tiny stand-ins for the vision roles (``sd``, ``clip_filter``, ``clip_eval``).

Same classes as the paper-scale models, randomly initialised with a fixed seed and saved with the
libraries' own ``save_pretrained`` (safetensors), so the normal loaders in
:mod:`counterfactory.models.registry` read them back by path:

* ``sd``: a :class:`~diffusers.StableDiffusionPipeline` folder (the class of SD v1.5, B.1.2) with a
  tiny ``UNet2DConditionModel`` (2 resolution levels, cross-attention in every block), a tiny
  ``AutoencoderKL`` with SD's 4 levels (latents 1/8 of the image side: 64x64 images -> 8x8 latents),
  a tiny ``CLIPTextModel`` over the exact CLIP tokenizer (49,408 tokens, 77 positions) and the
  ``EulerAncestralDiscreteScheduler`` with SD v1.5's noise schedule; no safety checker, no feature
  extractor.
* ``clip_filter`` / ``clip_eval``: a tiny ``CLIPModel`` (32x32 input, so the filter resizes the 64x64
  demo images as the real filter resizes 512x512 to 224x224) plus a ``CLIPProcessor`` whose image
  processor resizes/crops to the model's own image size.

Images and scores made with these models show that the pipeline runs; they carry no meaning.
"""

from __future__ import annotations

from pathlib import Path

from .tiny_common import clip_tokenizer

#: image side the tiny SD is built for (the demo config uses the same size)
TINY_IMAGE_SIZE = 64
#: input side of the tiny CLIP models
TINY_CLIP_IMAGE_SIZE = 32
#: width of the tiny text encoders (also the UNet's cross-attention width)
TINY_TEXT_WIDTH = 32

_CLIP_BOS, _CLIP_EOS = 49406, 49407


def _text_config_kwargs() -> dict:
    return dict(
        vocab_size=49408, hidden_size=TINY_TEXT_WIDTH, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=77, bos_token_id=_CLIP_BOS,
        eos_token_id=_CLIP_EOS, pad_token_id=_CLIP_EOS,
    )


def tiny_vae(**changes):
    """The tiny ``AutoencoderKL`` every tiny diffusion stand-in uses (4 latent channels, 4 levels, so it decodes
    the tiny UNets' latents); ``changes`` override config keys (SDXL: ``scaling_factor``). Random weights from
    torch's current seed."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(**{
        "in_channels": 3, "out_channels": 3, "latent_channels": 4, "block_out_channels": (8, 16, 32, 32),
        "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
        "layers_per_block": 1, "norm_num_groups": 8, "sample_size": TINY_IMAGE_SIZE, **changes})


def build_sd(out: Path, seed: int = 0) -> None:
    """Tiny ``StableDiffusionPipeline`` saved as a diffusers folder."""
    import torch
    from diffusers import EulerAncestralDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=TINY_IMAGE_SIZE // 8, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=TINY_TEXT_WIDTH,
        attention_head_dim=2, norm_num_groups=32,
    )
    torch.manual_seed(seed + 1)
    vae = tiny_vae()
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(CLIPTextConfig(**_text_config_kwargs()))
    # SD v1.5's scheduler settings (scaled-linear betas 0.00085..0.012 over 1000 training steps)
    scheduler = EulerAncestralDiscreteScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        steps_offset=1,
    )
    pipe = StableDiffusionPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=clip_tokenizer(), unet=unet, scheduler=scheduler,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    pipe.save_pretrained(out, safe_serialization=True)


def build_clip(out: Path, seed: int = 0) -> None:
    """Tiny ``CLIPModel`` + ``CLIPProcessor`` (the classes of openai/clip-vit-*)."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=_text_config_kwargs(),
        vision_config=dict(image_size=TINY_CLIP_IMAGE_SIZE, patch_size=4, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4),
        projection_dim=32,
    )
    model = CLIPModel(config)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": TINY_CLIP_IMAGE_SIZE},
        crop_size={"height": TINY_CLIP_IMAGE_SIZE, "width": TINY_CLIP_IMAGE_SIZE},
    )
    processor = CLIPProcessor(image_processor=image_processor, tokenizer=clip_tokenizer())
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


BUILDERS = {"sd": build_sd, "clip_filter": build_clip, "clip_eval": build_clip}
