"""Batched Prompt-to-Prompt sampler: prompts -> text embeddings, per-candidate initial latents and
sampler noise, batched classifier-free-guided UNet denoising under attention control, VAE decode.

COCO-Counterfactuals §3.2 / B.1.2 generate image pairs with InstructPix2Pix's Prompt-to-Prompt. This
module runs many candidates per UNet call with our own denoising loop around the pipeline's
``unet``/``vae``/``text_encoder``/``scheduler``, because every candidate in a batch has its own
guidance scale and its own attention-control fraction ``p``.

A candidate's randomness comes from its seed only (see :mod:`.selection`): the seed fixes the initial
latent and every step's ancestral-sampler noise (drawn on the CPU from a per-candidate generator), so a
candidate's images do not depend on the batch size (up to floating-point differences of batched
kernels, see ``tests/test_p2p.py``). All members of one candidate (original and edited prompts) share
the initial latent and the sampler noise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from ..device import Performance, autocast_context, engine_dtypes, from_config, place, resolve_batch_size
from ..errors import ConfigError
from ..models import registry
from ..settings import schema_defaults
from .p2p import MODES, AttentionController, install, token_alignment

if TYPE_CHECKING:
    from .selection import Candidate

log = logging.getLogger(__name__)

#: config name -> diffusers scheduler class
SCHEDULERS = {
    "euler_ancestral": "EulerAncestralDiscreteScheduler",
    "euler": "EulerDiscreteScheduler",
    "ddim": "DDIMScheduler",
    "dpmpp_2m": "DPMSolverMultistepScheduler",
}


# --------------------------------------------------------------------------- settings and seeds

@dataclass(frozen=True)
@schema_defaults("coco_counterfactuals.images", keys={"control": "attention_control"})
class GenerationSettings:
    """Generator settings; defaults are the schema's ``coco_counterfactuals.images`` (the InstructPix2Pix generator's,
    its public code, which COCO-Counterfactuals used)."""

    steps: int
    height: int
    width: int
    scheduler: str
    control: str
    p_range: tuple[float, float]
    guidance_range: tuple[float, float]
    hertz_self_fraction: float
    negative_prompt: str
    batch_size: int

    def __post_init__(self):
        if self.control not in MODES:
            raise ConfigError(f"images.attention_control: {self.control!r} is not one of {MODES}")
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(f"images.scheduler: {self.scheduler!r} is not one of {sorted(SCHEDULERS)}")
        for name, (lo, hi) in (("p_range", self.p_range), ("guidance_range", self.guidance_range)):
            if lo > hi:
                raise ConfigError(f"images.{name}: lower bound {lo} exceeds upper bound {hi}. Fix: write [low, high]")
        if self.steps < 1 or self.batch_size < 1:
            raise ConfigError("images.steps and images.batch_size must be >= 1")

    @classmethod
    def from_config(cls, images: dict, cfg: dict | None = None) -> "GenerationSettings":
        """Settings from an ``images`` section (a study view's is complete: the schema fills its defaults; a key a
        partial section lacks keeps the field's default above). ``batch_size: auto`` is resolved on ``cfg``'s
        device (:func:`counterfactory.device.resolve_batch_size`)."""
        return cls(
            steps=int(images.get("steps", cls.steps)),
            height=int(images.get("height", cls.height)),
            width=int(images.get("width", cls.width)),
            scheduler=str(images.get("scheduler", cls.scheduler)),
            control=str(images.get("attention_control", cls.control)),
            p_range=tuple(float(x) for x in images.get("p_range", cls.p_range)),
            guidance_range=tuple(float(x) for x in images.get("guidance_range", cls.guidance_range)),
            hertz_self_fraction=float(images.get("hertz_self_fraction", cls.hertz_self_fraction)),
            negative_prompt=str(images.get("negative_prompt", cls.negative_prompt)),
            batch_size=resolve_batch_size(images.get("batch_size", cls.batch_size), cfg, "sd_candidate"),
        )



# --------------------------------------------------------------------------- engine

@dataclass
class BatchResult:
    """Images ``uint8 (B, G, H, W, 3)`` and final latents ``float32 (B, G, C, h, w)`` of a batch; with
    ``generate(..., float_images=True)`` also the decoded images before 8-bit quantisation, ``float32 (B, G, H, W,
    3)`` in [0, 1] (what InstructPix2Pix's CLIP filter scores)."""

    candidates: list[Candidate]
    images: np.ndarray
    latents: np.ndarray
    float_images: np.ndarray | None = None


class P2PEngine:
    """Batched Prompt-to-Prompt sampler around a diffusers ``StableDiffusionPipeline``."""

    def __init__(self, pipe, settings: GenerationSettings, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, vae=None, performance=None,
                 autocast_dtype: torch.dtype | None = None):
        """``vae``: an ``AutoencoderKL`` that replaces the pipeline's own for decoding (the ``vae``
        model role; the InstructPix2Pix generator decoded with SD's fine-tuned MSE VAE); None = the
        pipeline's VAE. ``performance``: the fast path (:class:`counterfactory.device.Performance`).
        ``dtype``: the weights' (and latents') dtype; ``autocast_dtype``: run text encoder, UNet and VAE under
        ``torch.autocast`` in this dtype (:func:`engine_dtypes`; None = no autocast)."""
        import diffusers

        self.settings = settings
        self.device = torch.device(device)
        self.dtype = dtype
        self.autocast_dtype = autocast_dtype
        self.unet = place(pipe.unet, self.device, dtype, performance, compile=True)
        if vae is not None:
            latent = getattr(vae.config, "latent_channels", None)
            if latent != pipe.unet.config.in_channels:
                raise ConfigError(
                    f"models.vae: the VAE has {latent} latent channels but the sd UNet takes "
                    f"{pipe.unet.config.in_channels}. Fix: use a VAE made for this Stable Diffusion model"
                )
        #: the decoder: the ``vae`` role when given, else the pipeline's own
        self.vae = place(vae if vae is not None else pipe.vae, self.device, dtype, performance)
        self.text_encoder = place(pipe.text_encoder, self.device, dtype, performance)
        self.tokenizer = pipe.tokenizer
        self.scheduler_cls = getattr(diffusers, SCHEDULERS[settings.scheduler])
        self.scheduler_config = pipe.scheduler.config
        self.vae_scale = 2 ** (len(self.vae.config.block_out_channels) - 1)
        down = 2 ** (len(self.unet.config.block_out_channels) - 1)
        if settings.height % (self.vae_scale * down) or settings.width % (self.vae_scale * down):
            raise ConfigError(
                f"images.height/width {settings.height}x{settings.width} must be multiples of "
                f"{self.vae_scale * down} for this model (VAE factor {self.vae_scale} x UNet factor {down})"
            )
        self.latent_shape = (self.unet.config.in_channels, settings.height // self.vae_scale,
                             settings.width // self.vae_scale)
        self.controller = AttentionController(settings.control, settings.hertz_self_fraction, self.device)
        self._original_processors = install(self.unet, self.controller)
        #: rows pushed through the UNet, summed over steps (one row = one latent at one step)
        self.unet_evals = 0
        self._embed_cache: dict[str, tuple[list[int], torch.Tensor]] = {}

    def close(self) -> None:
        """Restore the UNet's original attention processors."""
        self.unet.set_attn_processor(self._original_processors)

    # -------------------------------------------------------------- text
    def token_ids(self, prompt: str) -> list[int]:
        return self._encode(prompt)[0]

    def _encode(self, prompt: str) -> tuple[list[int], torch.Tensor]:
        if prompt not in self._embed_cache:
            ids = self.tokenizer(prompt, padding="max_length", max_length=self.tokenizer.model_max_length,
                                 truncation=True).input_ids
            with torch.no_grad(), self._autocast():
                emb = self.text_encoder(torch.tensor([ids], device=self.device))[0]
            if len(self._embed_cache) > 256:
                self._embed_cache.clear()
            self._embed_cache[prompt] = (list(ids), emb)
        return self._embed_cache[prompt]

    def make_scheduler(self):
        """A fresh scheduler set to ``settings.steps``; Euler-ancestral gets the reference's sigmas
        (:func:`compvis_sigmas`, k-diffusion's over the CompVis table; diffusers' own differ by up to 8.5e-5
        relative at 100 steps)."""
        scheduler = self.scheduler_cls.from_config(self.scheduler_config)
        scheduler.set_timesteps(self.settings.steps, device=self.device)
        if self.settings.scheduler == "euler_ancestral":
            sigmas = compvis_sigmas(scheduler.alphas_cumprod, self.settings.steps)
            scheduler.sigmas = torch.from_numpy(sigmas.astype(np.float32)).to(scheduler.sigmas.device)
        return scheduler

    def _autocast(self):
        return autocast_context(self.device, self.autocast_dtype)

    # -------------------------------------------------------------- sampling
    def _initial_latent(self, gen: torch.Generator, scheduler) -> torch.Tensor:
        x = torch.randn((1, *self.latent_shape), generator=gen, dtype=torch.float32)
        return x * float(scheduler.init_noise_sigma)

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], candidates: Sequence[Candidate],
                 p_override: Sequence[float] | None = None, float_images: bool = False) -> BatchResult:
        """Sample every candidate for the group ``prompts`` = [base, edit_1, ..., edit_K] in one batch;
        ``float_images``: also return the decoded images before quantisation (:class:`BatchResult`)."""
        prompts = list(prompts)
        cands = list(candidates)
        g, b = len(prompts), len(cands)
        if g < 2:
            raise ValueError("generate() needs a base prompt and at least one edited prompt")
        if b == 0:
            raise ValueError("generate() needs at least one candidate")
        s = self.settings
        scheduler = self.make_scheduler()

        encoded = [self._encode(p) for p in prompts]
        cond = torch.cat([e for _, e in encoded])                        # (G, L, D)
        uncond = self._encode(s.negative_prompt)[1]                      # (1, L, D)
        text = torch.cat([uncond.expand(b * g, -1, -1), cond.repeat(b, 1, 1)])

        maps = None
        if self.controller.mode == "hertz_cross":
            base_ids = encoded[0][0]
            maps = torch.stack([torch.from_numpy(token_alignment(base_ids, ids)) for ids, _ in encoded])
        ps = [c.p for c in cands] if p_override is None else list(p_override)
        self.controller.configure(b, g, ps, maps)

        gens = [torch.Generator().manual_seed(c.seed) for c in cands]
        latents = torch.cat([self._initial_latent(gen, scheduler) for gen in gens])
        latents = latents.repeat_interleave(g, dim=0).to(self.device, self.dtype)   # (B·G, C, h, w)
        guidance = torch.tensor([c.guidance for c in cands], dtype=torch.float32)
        guidance = guidance.repeat_interleave(g).view(-1, 1, 1, 1).to(self.device, self.dtype)

        timesteps = scheduler.timesteps
        try:
            for i, t in enumerate(timesteps):
                self.controller.set_step(i, len(timesteps))
                model_in = scheduler.scale_model_input(torch.cat([latents, latents]), t)
                with self._autocast():
                    eps = self.unet(model_in, t, encoder_hidden_states=text).sample
                eps_u, eps_c = eps.chunk(2)
                eps = eps_u + guidance * (eps_c - eps_u)
                # every member of a candidate draws the same sampler noise from the candidate's stream
                row_gens = []
                for gen in gens:
                    state = gen.get_state()
                    for _ in range(g):
                        rg = torch.Generator()
                        rg.set_state(state)
                        row_gens.append(rg)
                latents = scheduler.step(eps, t, latents, generator=row_gens).prev_sample
                for k, gen in enumerate(gens):
                    gen.set_state(row_gens[k * g].get_state())
                self.unet_evals += 2 * b * g
        finally:
            self.controller.reset()
        decoded = self.decode_float(latents)
        images = quantise(decoded)
        return BatchResult(
            candidates=cands,
            images=images.reshape(b, g, *images.shape[1:]),
            latents=latents.float().cpu().numpy().reshape(b, g, *latents.shape[1:]),
            float_images=decoded.reshape(b, g, *decoded.shape[1:]) if float_images else None,
        )

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, chunk: int = 8) -> np.ndarray:
        """Latents -> uint8 (n, H, W, 3), rounding like diffusers' ``numpy_to_pil``; ``chunk`` latents
        per VAE call bound the decoder's memory at 512x512."""
        return quantise(self.decode_float(latents, chunk))

    @torch.no_grad()
    def decode_float(self, latents: torch.Tensor, chunk: int = 8) -> np.ndarray:
        """Latents -> float32 (n, H, W, 3) in [0, 1], before 8-bit quantisation (:func:`quantise`)."""
        out = []
        for s in range(0, latents.shape[0], chunk):
            with self._autocast():
                x = self.vae.decode(latents[s:s + chunk].to(self.dtype) / self.vae.config.scaling_factor).sample
            out.append((x.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy())
        return np.concatenate(out)


def compvis_sigmas(alphas_cumprod, steps: int) -> np.ndarray:
    """The sampler's noise levels as the reference generates them (COCO-Counterfactuals B.1.2: InstructPix2Pix's
    generator, k-diffusion's Euler-ancestral over the CompVis model's sigma table): ``steps`` times evenly spaced
    from the last training step to 0, each sigma interpolated linearly in log sigma between the table's
    neighbours, then a final 0 (``steps + 1`` values, float64). diffusers' ``EulerAncestralDiscreteScheduler``
    places the same times but interpolates sigma itself (up to 8.5e-5 relative apart for SD v1.5 at 100 steps)."""
    ac = np.asarray(alphas_cumprod.cpu() if hasattr(alphas_cumprod, "cpu") else alphas_cumprod, dtype=np.float64)
    log_sigmas = np.log(np.sqrt((1.0 - ac) / ac))
    t = np.linspace(len(ac) - 1, 0, int(steps))
    lo = np.floor(t).astype(int)
    hi = np.minimum(lo + 1, len(ac) - 1)
    w = t - lo
    return np.append(np.exp((1.0 - w) * log_sigmas[lo] + w * log_sigmas[hi]), 0.0)


def quantise(images: np.ndarray) -> np.ndarray:
    """Float images in [0, 1] -> uint8, rounding like diffusers' ``numpy_to_pil`` (what the PNGs hold)."""
    return (np.asarray(images, dtype=np.float32) * 255).round().astype(np.uint8)


def build_engine(cfg: dict, autocast: bool = False) -> P2PEngine:
    """Load the ``sd`` role (and the optional ``vae`` role, which then decodes instead of the
    pipeline's own VAE) in the stage's precision and wrap it (device/precision from
    :func:`counterfactory.device.from_config`; on CPU fp32). ``autocast``: a half precision runs as autocast over
    fp32 weights (``coco_counterfactuals.images.autocast``, :func:`engine_dtypes`); False = weights cast to it."""
    device, dtype = from_config(cfg)
    weights, compute = engine_dtypes(dtype, autocast)
    pipe = registry.load(cfg, "sd", dtype=weights)
    vae = registry.load(cfg, "vae", dtype=weights) if (cfg.get("models") or {}).get("vae") else None
    return P2PEngine(pipe, GenerationSettings.from_config(cfg.get("images", {}), cfg), device, weights, vae=vae,
                     performance=Performance.from_config(cfg), autocast_dtype=compute)
