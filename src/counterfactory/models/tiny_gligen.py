"""Tiny stand-ins for CounterCurate's grounded-generation roles (``gligen``, ``gligen_inpaint``, ``t2i``).

Same classes as the paper-scale models, randomly initialised with a fixed seed and saved with
diffusers' ``save_pretrained`` (safetensors), so the registry's loaders read them back by path:

* ``gligen``: a :class:`~diffusers.StableDiffusionGLIGENPipeline` folder (the class of
  gligen/gligen-generation-text-box, CounterCurate §3.2) whose ``UNet2DConditionModel`` is built with
  ``attention_type="gated"``: every transformer block gets GLIGEN's gated self-attention fuser
  (``GatedSelfAttentionDense``) and the UNet gets the box/phrase ``position_net``
  (``GLIGENTextBoundingboxProjection``). The fuser gates ``alpha_attn`` / ``alpha_dense`` start at 0
  in diffusers (a freshly added GLIGEN layer is the identity); the stand-in sets them to 1 so the
  boxes visibly steer its (meaningless) images, as they do in the trained checkpoints.
* ``gligen_inpaint``: the same with a 9-channel UNet input (4 noisy latents + 4 masked source latents
  + 1 mask), the layout of gligen/gligen-inpainting-text-box (§3.3): diffusers'
  ``StableDiffusionGLIGENPipeline`` concatenates ``(masked latent, mask)`` to the UNet input whenever
  ``gligen_inpaint_image`` is given.
* ``t2i``: a :class:`~diffusers.StableDiffusionXLPipeline`, the class of the paper config's open model standing
  in for DALLE-3 (§3.4, ``stabilityai/stable-diffusion-xl-base-1.0``): a UNet with SDXL's ``text_time`` added
  conditioning (pooled text embedding + size/crop micro-conditioning) cross-attending to the concatenated hidden
  states of two CLIP text encoders (the second with a projection), the SDXL VAE scaling factor and an Euler
  scheduler.

All three share the tiny ``sd``'s VAE / text-encoder widths and the exact CLIP tokenizer
(:mod:`counterfactory.models.tiny_vision`); the GLIGEN folders use diffusers' ``PNDMScheduler`` with
SD v1's noise schedule (the PLMS sampler GLIGEN's own inference script uses). Images made with these
models show that the pipeline runs; they carry no meaning.
"""

from __future__ import annotations

from pathlib import Path

from .tiny_common import clip_tokenizer
from .tiny_vision import TINY_IMAGE_SIZE, TINY_TEXT_WIDTH, _text_config_kwargs, tiny_vae

#: value the stand-in gives the GLIGEN fuser gates (diffusers initialises them to 0 = no grounding)
GATE_VALUE = 1.0


def _gligen_pipeline(out: Path, seed: int, in_channels: int) -> None:
    import torch
    from diffusers import PNDMScheduler, StableDiffusionGLIGENPipeline, UNet2DConditionModel
    from diffusers.models.attention import GatedSelfAttentionDense
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=TINY_IMAGE_SIZE // 8, in_channels=in_channels, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=TINY_TEXT_WIDTH,
        attention_head_dim=2, norm_num_groups=32, attention_type="gated",
    )
    with torch.no_grad():
        for module in unet.modules():
            if isinstance(module, GatedSelfAttentionDense):
                module.alpha_attn.fill_(GATE_VALUE)
                module.alpha_dense.fill_(GATE_VALUE)
    torch.manual_seed(seed + 1)
    vae = tiny_vae()
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(CLIPTextConfig(**_text_config_kwargs()))
    scheduler = PNDMScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        skip_prk_steps=True, set_alpha_to_one=False, steps_offset=1,
    )
    pipe = StableDiffusionGLIGENPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=clip_tokenizer(), unet=unet, scheduler=scheduler,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    pipe.save_pretrained(out, safe_serialization=True)


def build_gligen(out: Path, seed: int = 0) -> None:
    """Tiny ``StableDiffusionGLIGENPipeline`` for text-box generation (4-channel gated UNet)."""
    _gligen_pipeline(out, seed, in_channels=4)


def build_gligen_inpaint(out: Path, seed: int = 0) -> None:
    """Tiny ``StableDiffusionGLIGENPipeline`` for text-box inpainting (9-channel gated UNet)."""
    _gligen_pipeline(out, seed + 100, in_channels=9)


def build_t2i(out: Path, seed: int = 0) -> None:
    """Tiny ``StableDiffusionXLPipeline`` in DALLE-3's role (module docstring)."""
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    seed += 200
    time_dim = 8   # SDXL: 256 per micro-conditioning number, 6 numbers (original size, crop, target size)
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=TINY_IMAGE_SIZE // 8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=2 * TINY_TEXT_WIDTH,
        attention_head_dim=2, norm_num_groups=32, use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=time_dim, projection_class_embeddings_input_dim=6 * time_dim + TINY_TEXT_WIDTH,
    )
    torch.manual_seed(seed + 1)
    vae = tiny_vae(scaling_factor=0.13025)   # SDXL's latent scaling
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(CLIPTextConfig(**_text_config_kwargs()))
    torch.manual_seed(seed + 3)
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**_text_config_kwargs(),
                                                                projection_dim=TINY_TEXT_WIDTH))
    # SDXL base's scheduler settings (scaled-linear betas 0.00085..0.012, leading timesteps)
    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        steps_offset=1, timestep_spacing="leading",
    )
    pipe = StableDiffusionXLPipeline(
        vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2, tokenizer=clip_tokenizer(),
        tokenizer_2=clip_tokenizer(), unet=unet, scheduler=scheduler,
    )
    pipe.save_pretrained(out, safe_serialization=True)


BUILDERS = {"gligen": build_gligen, "gligen_inpaint": build_gligen_inpaint, "t2i": build_t2i}
