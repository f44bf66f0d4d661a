"""True-size stand-ins of the studies' image models: the published architectures with random weights.

Same classes, same shapes and therefore the same FLOPs as the checkpoints the papers used, built from
their published configurations written out below (no download, no weights), for speed measurements
(``benchmarks/bench_true_size.py``). Their images are noise: they measure cost, not quality.

* Stable Diffusion v1.5 (COCO-Counterfactuals §3.2 / B.1.2 and SocialCounterfactuals §3.3 generate with
  InstructPix2Pix's Prompt-to-Prompt on SD v1.5): ``unet/config.json``, ``vae/config.json``,
  ``text_encoder/config.json`` and ``scheduler/scheduler_config.json`` of the model repository
  ``runwayml/stable-diffusion-v1-5`` (the same as ``CompVis/stable-diffusion-v1-4``: v1.5 only retrained
  the weights). The text encoder is the text tower of OpenAI's CLIP ViT-L/14.
* GLIGEN (CounterCurate §3.2, §3.3): ``gligen/gligen-generation-text-box`` / ``-inpainting-text-box``, in
  diffusers ``masterful/gligen-1-4-generation-text-box`` / ``-inpainting-text-box``: the SD v1.4 UNet with
  ``attention_type="gated"`` (a gated self-attention fuser in every transformer block plus the box/phrase
  ``position_net``, text-only features of width 768); the inpainting model takes 9 input channels
  (noisy latent 4 + masked source latent 4 + mask 1). Scheduler: PNDM (GLIGEN's PLMS sampler).
* InstructPix2Pix (CVLD §3.3, ``timbrooks/instruct-pix2pix``): the SD v1.5 UNet with 8 input channels
  (noisy latent 4 + image latent 4) and the Euler-ancestral scheduler.
* SDXL base 1.0 (CounterCurate §3.4's t2i role in the paper config, DALLE-3's stand-in;
  ``stabilityai/stable-diffusion-xl-base-1.0``): ``unet/config.json`` (2,567.5 M parameters: three levels,
  1/2/10 transformer layers, ``text_time`` added conditioning), ``text_encoder`` (CLIP ViT-L/14 text, as SD v1.5)
  and ``text_encoder_2`` (OpenCLIP ViT-bigG/14 text with projection, 694.7 M), the SD VAE with SDXL's scaling
  factor, Euler scheduler.
* SD inpainting (``runwayml/stable-diffusion-inpainting``, registry role ``sd_inpaint``; no stage uses it):
  9 input channels.
* Big LaMa (spurious-correlation retrieval §3.1 object removal, through lama-cleaner's ``big-lama.pt``):
  LaMa's ``FFCResNetGenerator`` with the ``configs/training/big-lama.yaml`` settings of Suvorov et al. 2022
  (ngf 64, 3 downsamplings, 18 fast-Fourier-convolution residual blocks with global ratio 0.75, sigmoid
  output), wrapped like the exported TorchScript: ``forward(image [B,3,H,W] in [0,1], mask [B,1,H,W])``
  returns the prediction pasted into the unmasked image. About 51 M parameters (LaMa paper, Table 6).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import nn

# --------------------------------------------------------------------------- published configurations

#: runwayml/stable-diffusion-v1-5, unet/config.json (architecture keys)
SD15_UNET: dict[str, Any] = {
    "sample_size": 64, "in_channels": 4, "out_channels": 4, "center_input_sample": False,
    "flip_sin_to_cos": True, "freq_shift": 0,
    "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    "block_out_channels": (320, 640, 1280, 1280), "layers_per_block": 2, "downsample_padding": 1,
    "mid_block_scale_factor": 1, "act_fn": "silu", "norm_num_groups": 32, "norm_eps": 1e-5,
    "cross_attention_dim": 768, "attention_head_dim": 8,
}
#: runwayml/stable-diffusion-v1-5, vae/config.json
SD15_VAE: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 4, "sample_size": 512,
    "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512), "layers_per_block": 2, "act_fn": "silu",
    "norm_num_groups": 32, "scaling_factor": 0.18215,
}
#: runwayml/stable-diffusion-v1-5, text_encoder/config.json (CLIP ViT-L/14 text tower)
SD15_TEXT: dict[str, Any] = {
    "vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
    "num_attention_heads": 12, "max_position_embeddings": 77, "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5, "projection_dim": 768, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1,
}
#: runwayml/stable-diffusion-v1-5, scheduler/scheduler_config.json (PNDM; the P2P engine builds its
#: Euler-ancestral sampler from the same betas)
SD15_SCHEDULER: dict[str, Any] = {
    "num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1, "clip_sample": False,
}
#: what each variant changes in the SD v1.5 UNet (model cards / unet/config.json of each repository)
UNET_VARIANTS: dict[str, dict[str, Any]] = {
    "sd": {},
    "gligen": {"attention_type": "gated"},                      # masterful/gligen-1-4-generation-text-box
    "gligen_inpaint": {"attention_type": "gated", "in_channels": 9},  # masterful/gligen-1-4-inpainting-text-box
    "ip2p": {"in_channels": 8},                                  # timbrooks/instruct-pix2pix
    "sd_inpaint": {"in_channels": 9},                            # runwayml/stable-diffusion-inpainting
}
#: stabilityai/stable-diffusion-xl-base-1.0, unet/config.json (architecture keys)
SDXL_UNET: dict[str, Any] = {
    "sample_size": 128, "in_channels": 4, "out_channels": 4, "center_input_sample": False,
    "flip_sin_to_cos": True, "freq_shift": 0,
    "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    "block_out_channels": (320, 640, 1280), "layers_per_block": 2, "downsample_padding": 1,
    "mid_block_scale_factor": 1, "act_fn": "silu", "norm_num_groups": 32, "norm_eps": 1e-5,
    "cross_attention_dim": 2048, "attention_head_dim": (5, 10, 20), "transformer_layers_per_block": (1, 2, 10),
    "use_linear_projection": True, "addition_embed_type": "text_time", "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
}
#: stabilityai/stable-diffusion-xl-base-1.0, text_encoder_2/config.json (OpenCLIP ViT-bigG/14 text tower)
SDXL_TEXT_2: dict[str, Any] = {
    "vocab_size": 49408, "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
    "num_attention_heads": 20, "max_position_embeddings": 77, "hidden_act": "gelu", "layer_norm_eps": 1e-5,
    "projection_dim": 1280, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1,
}
#: stabilityai/stable-diffusion-xl-base-1.0: vae/config.json differs from SD v1.5's in these keys only;
#: scheduler/scheduler_config.json (EulerDiscreteScheduler)
SDXL_VAE_CHANGES: dict[str, Any] = {"sample_size": 1024, "scaling_factor": 0.13025, "force_upcast": True}
SDXL_SCHEDULER: dict[str, Any] = {
    "num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "steps_offset": 1, "timestep_spacing": "leading", "interpolation_type": "linear",
    "prediction_type": "epsilon",
}
#: LaMa configs/training/big-lama.yaml, generator section
BIG_LAMA: dict[str, Any] = {"input_nc": 4, "output_nc": 3, "ngf": 64, "n_downsampling": 3, "n_blocks": 18,
                            "max_features": 1024, "ratio_g": 0.75}


# --------------------------------------------------------------------------- Stable Diffusion parts

def unet(variant: str = "sd"):
    """``UNet2DConditionModel`` of SD v1.5, changed as :data:`UNET_VARIANTS` says, or SDXL's (``sdxl``); random
    weights (built on the current default device: wrap in ``with torch.device("meta")`` to count parameters for
    free)."""
    from diffusers import UNet2DConditionModel

    if variant == "sdxl":
        return UNet2DConditionModel(**SDXL_UNET)
    return UNet2DConditionModel(**{**SD15_UNET, **UNET_VARIANTS[variant]})


def vae(variant: str = "sd"):
    """SD v1.5's ``AutoencoderKL`` (83.65 M parameters); ``sdxl``: the same architecture, SDXL's scaling."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(**{**SD15_VAE, **(SDXL_VAE_CHANGES if variant == "sdxl" else {})})


def text_encoder_2():
    """SDXL's second text encoder: ``CLIPTextModelWithProjection``, OpenCLIP ViT-bigG/14 text (694.66 M)."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    return CLIPTextModelWithProjection(CLIPTextConfig(**SDXL_TEXT_2))


def text_encoder():
    """SD v1.5's ``CLIPTextModel`` (CLIP ViT-L/14 text tower, 123.06 M parameters)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(CLIPTextConfig(**SD15_TEXT))


def tokenizer():
    """The exact CLIP BPE tokenizer, built offline from the BPE file open_clip ships (77 tokens); where
    open_clip is not installed, a whitespace word-level stand-in with CLIP's start/end ids (every word
    maps to id 0): the text encoder always sees 77 positions, so its cost does not depend on the ids."""
    max_len = SD15_TEXT["max_position_embeddings"]
    try:
        from counterfactory.models.tiny import clip_tokenizer

        return clip_tokenizer(max_len)
    except ImportError:
        from tokenizers import Tokenizer, models, pre_tokenizers, processors
        from transformers import PreTrainedTokenizerFast

        bos, eos = ("<|startoftext|>", 49406), ("<|endoftext|>", 49407)
        tok = Tokenizer(models.WordLevel({"<unk>": 0, bos[0]: bos[1], eos[0]: eos[1]}, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.post_processor = processors.TemplateProcessing(single=f"{bos[0]} $A {eos[0]}", special_tokens=[bos, eos])
        return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_len, bos_token=bos[0],
                                       eos_token=eos[0], pad_token=eos[0], unk_token="<unk>")


def pipeline(kind: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """A diffusers pipeline of true-size random modules, on ``device`` in ``dtype``:
    ``sd`` (``StableDiffusionPipeline``, Euler-ancestral is built from its betas by the P2P engine),
    ``gligen`` / ``gligen_inpaint`` (``StableDiffusionGLIGENPipeline``, PNDM; fuser gates set to 1 as in
    trained checkpoints, diffusers starts them at 0), ``ip2p`` (``StableDiffusionInstructPix2PixPipeline``,
    Euler-ancestral), ``sdxl`` (``StableDiffusionXLPipeline``, Euler; the t2i role). Modules are built directly
    on ``device`` (fast on a GPU)."""
    import diffusers

    with torch.device(device):
        parts = {"unet": unet(kind), "vae": vae(kind), "text_encoder": text_encoder()}
        if kind == "sdxl":
            parts["text_encoder_2"] = text_encoder_2()
    extras = {"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False}
    if kind.startswith("gligen"):
        from diffusers.models.attention import GatedSelfAttentionDense

        with torch.no_grad():
            for m in parts["unet"].modules():
                if isinstance(m, GatedSelfAttentionDense):
                    m.alpha_attn.fill_(1.0)
                    m.alpha_dense.fill_(1.0)
        cls, sched = diffusers.StableDiffusionGLIGENPipeline, diffusers.PNDMScheduler.from_config(SD15_SCHEDULER)
    elif kind == "ip2p":
        cls = diffusers.StableDiffusionInstructPix2PixPipeline
        sched = diffusers.EulerAncestralDiscreteScheduler.from_config(SD15_SCHEDULER)
    elif kind == "sd":
        cls, sched = diffusers.StableDiffusionPipeline, diffusers.PNDMScheduler.from_config(SD15_SCHEDULER)
    elif kind == "sdxl":     # no safety checker in SDXL's pipeline; a second tokenizer for its second encoder
        cls, sched = diffusers.StableDiffusionXLPipeline, diffusers.EulerDiscreteScheduler.from_config(SDXL_SCHEDULER)
        extras = {"tokenizer_2": tokenizer()}
    else:
        raise ValueError(f"no pipeline kind {kind!r}: use sd, sdxl, gligen, gligen_inpaint or ip2p")
    pipe = cls(**parts, tokenizer=tokenizer(), scheduler=sched, **extras)
    pipe.to(device, dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# --------------------------------------------------------------------------- Big LaMa (FFC ResNet generator)

class FourierUnit(nn.Module):
    """Pointwise conv + BN + ReLU in the 2-D real-FFT domain (real and imaginary parts as channels).
    The FFT runs in float32 (cuFFT has no bfloat16)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(2 * channels, 2 * channels, 1, bias=False)
        self.bn = nn.BatchNorm2d(2 * channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        f = torch.fft.rfftn(x.float(), dim=(-2, -1), norm="ortho")
        f = torch.stack((f.real, f.imag), dim=2).reshape(b, 2 * c, h, -1).to(x.dtype)
        f = torch.relu(self.bn(self.conv(f))).float().reshape(b, c, 2, h, -1)
        out = torch.fft.irfftn(torch.complex(f[:, :, 0], f[:, :, 1]), s=(h, w), dim=(-2, -1), norm="ortho")
        return out.to(x.dtype)


class SpectralTransform(nn.Module):
    """LaMa's global branch: 1x1 conv down to half width, Fourier unit, residual, 1x1 conv back."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(cin, cout // 2, 1, bias=False), nn.BatchNorm2d(cout // 2), nn.ReLU())
        self.fu = FourierUnit(cout // 2)
        self.conv2 = nn.Conv2d(cout // 2, cout, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(x + self.fu(x))


class FFC(nn.Module):
    """Fast Fourier convolution (Chi et al. 2020) + BN + ReLU on a (local, global) channel split; a branch
    with no channels is skipped. ``x`` is a tensor (no global part) or a ``(local, global)`` pair."""

    def __init__(self, cin: int, cout: int, k: int, gin: float, gout: float, stride: int = 1, padding: int = 0):
        super().__init__()
        in_g, out_g = int(cin * gin), int(cout * gout)
        in_l, out_l = cin - in_g, cout - out_g
        conv = lambda a, b: nn.Conv2d(a, b, k, stride, padding, bias=False, padding_mode="reflect")  # noqa: E731
        self.l2l = conv(in_l, out_l) if in_l and out_l else None
        self.l2g = conv(in_l, out_g) if in_l and out_g else None
        self.g2l = conv(in_g, out_l) if in_g and out_l else None
        self.g2g = SpectralTransform(in_g, out_g) if in_g and out_g else None
        self.bn_l = nn.BatchNorm2d(out_l) if out_l else None
        self.bn_g = nn.BatchNorm2d(out_g) if out_g else None

    def forward(self, x):
        xl, xg = x if isinstance(x, tuple) else (x, None)
        parts_l = [m(v) for m, v in ((self.l2l, xl), (self.g2l, xg)) if m is not None]
        parts_g = [m(v) for m, v in ((self.l2g, xl), (self.g2g, xg)) if m is not None]
        yl = torch.relu(self.bn_l(sum(parts_l))) if parts_l else None
        yg = torch.relu(self.bn_g(sum(parts_g))) if parts_g else None
        return yl, yg


class FFCBlock(nn.Module):
    def __init__(self, dim: int, ratio: float):
        super().__init__()
        self.conv1 = FFC(dim, dim, 3, ratio, ratio, padding=1)
        self.conv2 = FFC(dim, dim, 3, ratio, ratio, padding=1)

    def forward(self, x):
        yl, yg = self.conv2(self.conv1(x))
        return x[0] + yl, x[1] + yg


class BigLaMa(nn.Module):
    """Big LaMa's generator (:data:`BIG_LAMA`) behind the TorchScript interface lama-cleaner calls."""

    def __init__(self, input_nc=4, output_nc=3, ngf=64, n_downsampling=3, n_blocks=18, max_features=1024,
                 ratio_g=0.75):
        super().__init__()
        ch = lambda mult: min(max_features, int(ngf * mult))  # noqa: E731
        self.stem = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(input_nc, ngf, 7, bias=False),
                                  nn.BatchNorm2d(ngf), nn.ReLU())
        self.down = nn.ModuleList(
            FFC(ch(2 ** i), ch(2 ** (i + 1)), 3, 0.0, ratio_g if i == n_downsampling - 1 else 0.0, stride=2,
                padding=1) for i in range(n_downsampling))
        self.blocks = nn.Sequential(*(FFCBlock(ch(2 ** n_downsampling), ratio_g) for _ in range(n_blocks)))
        up: list[nn.Module] = []
        for i in range(n_downsampling):
            mult = 2 ** (n_downsampling - i)
            up += [nn.ConvTranspose2d(ch(mult), ch(mult / 2), 3, stride=2, padding=1, output_padding=1),
                   nn.BatchNorm2d(ch(mult / 2)), nn.ReLU()]
        self.up = nn.Sequential(*up, nn.ReflectionPad2d(3), nn.Conv2d(ngf, output_nc, 7), nn.Sigmoid())

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        dtype = self.up[-2].weight.dtype
        img, m = image.to(dtype), (mask > 0).to(dtype)
        x = self.stem(torch.cat([img * (1 - m), m], dim=1))
        for layer in self.down:
            x = layer(x)
        pred = self.up(torch.cat(self.blocks(x), dim=1))
        return (m * pred + (1 - m) * img).to(image.dtype)


def big_lama() -> BigLaMa:
    """Big LaMa with random weights, in eval mode."""
    return BigLaMa(**BIG_LAMA).eval()


# --------------------------------------------------------------------------- counting

def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of running ``fn()`` by PyTorch's ``FlopCounterMode`` (a multiply-add counts 2; matmuls,
    convolutions and attention kernels only: normalisations, activations and FFTs are not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn()
    return int(counter.get_total_flops())


def unet_flops(variant: str, height: int, width: int, text_tokens: int = 77, objects: int = 30) -> int:
    """FLOPs of one UNet evaluation of one item (batch 1) at ``height x width`` pixels (latent / 8),
    counted on the meta device (no memory, no compute) with diffusers' explicit attention processor
    (``AttnProcessor``: Q·K and A·V as batched matmuls, whatever kernel the run itself uses). GLIGEN
    variants run with the grounding tokens of ``objects`` boxes (the pipeline pads to 30) and the fusers on; SDXL
    with its added text/time conditioning."""
    from diffusers.models.attention_processor import AttnProcessor

    with torch.device("meta"):
        net = unet(variant).eval()
        net.set_attn_processor(AttnProcessor())
        c = net.config
        x = torch.zeros(1, c.in_channels, height // 8, width // 8)
        text = torch.zeros(1, text_tokens, c.cross_attention_dim)
        t = torch.tensor([999])
        kwargs = {}
        if variant == "sdxl":      # pooled bigG text embedding (1280) + 6 size/crop numbers
            kwargs["added_cond_kwargs"] = {"text_embeds": torch.zeros(1, 1280), "time_ids": torch.zeros(1, 6)}
        if variant.startswith("gligen"):
            kwargs["cross_attention_kwargs"] = {"gligen": {
                "boxes": torch.zeros(1, objects, 4), "positive_embeddings": torch.zeros(1, objects, 768),
                "masks": torch.ones(1, objects)}}
    return count_flops(lambda: net(x, t, encoder_hidden_states=text, **kwargs))


def lama_flops(height: int, width: int) -> int:
    """FLOPs of one Big LaMa forward of one ``height x width`` image (convolutions; the FFTs are not counted)."""
    with torch.device("meta"):
        net = big_lama()
        x, m = torch.zeros(1, 3, height, width), torch.zeros(1, 1, height, width)
    return count_flops(lambda: net(x, m))


@contextlib.contextmanager
def counting_rows(module: nn.Module):
    """Count the rows (batch entries) pushed through ``module``'s forward: yields a one-item list whose
    value grows by the batch size of every call (first positional tensor or ``sample``/``image``)."""
    seen = [0]

    def hook(_mod, args, kwargs):
        x = args[0] if args else kwargs.get("sample", kwargs.get("image"))
        seen[0] += int(x.shape[0])

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()
