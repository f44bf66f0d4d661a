"""DDIM inversion, null-text inversion and Prompt-to-Prompt editing of a real image (CVLD §3.2-3.3).

CVLD edits real images either with InstructPix2Pix (:mod:`.editing`) or with null-text inversion (Mokady et
al. 2023) followed by Prompt-to-Prompt (Hertz et al. 2022). This module implements the second path on the
``sd`` role (a diffusers ``StableDiffusionPipeline``) with our own loops around its ``unet``/``vae``/
``text_encoder``; the DDIM noise schedule (``alphas_cumprod``, timesteps) comes from diffusers'
``DDIMScheduler`` built from the pipeline's scheduler config (``clip_sample=False``, ``set_alpha_to_one=False``,
``timestep_spacing="leading"``: the DDIM setting of Mokady et al.'s reference).

* :func:`ddim_invert` -- the image's VAE latent (``latent_dist.mean`` x scaling factor) is run backwards through
  deterministic DDIM with the *source prompt* at guidance 1 (conditional noise only), giving the trajectory
  ``z_0 .. z_T``; ``steps`` defaults to 50 (Mokady et al.'s setting; the CVLD paper names the method, not steps).
* :func:`null_text_invert` -- starting from ``z_T``, at each step ``i`` the unconditional ("null") text
  embedding is optimised with Adam so that one classifier-free guided DDIM step (guidance 7.5) from the current
  latent lands on ``z_{T-i-1}`` of the inversion trajectory (MSE). Numbers from Mokady et al. 2023: ``inner_steps``
  = 10 Adam iterations per step, learning rate ``1e-2 * (1 - i / 100)`` (floored at a tenth for runs over 90
  steps), early stop once the loss is below ``1e-5 + i * 2e-5``; the optimised embedding of one step initialises
  the next. Returns ``x_T`` and the per-step null embeddings (:class:`Inversion`).
* :func:`reconstruct` -- guided DDIM sampling from ``x_T`` with the per-step null embeddings.
* :func:`p2p_edit` -- Prompt-to-Prompt from the inverted latent: source and target prompt rows share ``x_T`` and
  the null embeddings; the target rows take the source rows' cross-attention maps (carried over by
  :func:`.p2p.token_alignment`, so word swaps of different token lengths and inserted words line up) while
  ``i / T < cross`` and the source rows' self-attention maps while ``i / T < self`` (per candidate). Inserted
  words ("refine" edits) receive no attention during the cross window (Hertz et al. blend in the edited
  prompt's own map for them); after the window every token attends normally. Several candidates (different
  fractions) run in one UNet batch; DDIM with eta 0 is deterministic, so nothing here draws random numbers.

Inversions are cached (:func:`null_text_invert` ``cache_dir``): ``<sha256 key>.pt`` keyed by the sha256 of the
resized image's pixels, the prompt, the inversion settings and the model's content fingerprint
(:func:`model_fingerprint`), so the m edits of an image and a rerun invert once.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..io import atomic_path
from ..models.registry import fingerprint
from ..settings import schema_defaults
from .p2p import AttentionController, controlled, step_fraction, token_alignment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
@schema_defaults("cvld.editing.settings", keys={"steps": "inversion_steps", "guidance": "null_guidance",
                                                "lr": "null_lr", "epsilon": "null_epsilon",
                                                "epsilon_step": "null_epsilon_step"})
class InversionSettings:
    """Null-text inversion settings; defaults from Mokady et al. 2023 (see the module docstring), as the schema
    writes them (``cvld.editing.settings``: ``inversion_steps``, ``null_guidance``, ``inner_steps``, ...)."""

    steps: int
    guidance: float
    inner_steps: int
    lr: float
    epsilon: float
    epsilon_step: float
    size: int

    def __post_init__(self):
        if self.steps < 1 or self.inner_steps < 0 or self.size < 8:
            raise ConfigError(f"inversion settings {self}: steps >= 1, inner_steps >= 0 and size >= 8 are needed")


@dataclass
class Inversion:
    """An inverted image: ``x_T`` (1, C, h, w), ``null_embeddings`` (T, L, D) (one per sampling step, in
    sampling order), the clean latent ``latent`` (1, C, h, w), and how it was made."""

    x_T: torch.Tensor
    null_embeddings: torch.Tensor
    latent: torch.Tensor
    prompt: str
    settings: InversionSettings
    optimisation_steps: int = 0
    cached: bool = False


def _settings(settings: Any) -> InversionSettings:
    if settings is None:
        return InversionSettings()
    return settings.inversion() if hasattr(settings, "inversion") else settings


# --------------------------------------------------------------------------- pieces


def fit_image(image: np.ndarray, size: int) -> np.ndarray:
    """``uint8`` RGB ``image`` resized to ``size`` x ``size`` (PIL Lanczos; ours: no crop, aspect not kept)."""
    from PIL import Image

    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be uint8 [H, W, 3] RGB, got {image.dtype} {image.shape}")
    if image.shape[:2] == (size, size):
        return image
    return np.asarray(Image.fromarray(image).resize((size, size), Image.LANCZOS))


def to_tensor(images: Sequence[np.ndarray], device, dtype) -> torch.Tensor:
    """``uint8`` (H, W, 3) images -> (N, 3, H, W) in [-1, 1]."""
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return x.to(device=device, dtype=dtype)


@torch.no_grad()
def decode(vae, latents: torch.Tensor, chunk: int = 8) -> list[np.ndarray]:
    """Scaled latents -> ``uint8`` RGB images (rounded like diffusers' ``numpy_to_pil``), ``chunk`` latents per VAE
    call: decoding ten 512² edits at once in fp32 peaked at 75 GiB on an H100 (benchmarks/bench_true_size.py)."""
    x = torch.cat([vae.decode(latents[i:i + chunk] / vae.config.scaling_factor).sample
                   for i in range(0, len(latents), chunk)])
    x = (x.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
    return list((x * 255).round().astype(np.uint8))


@torch.no_grad()
def embed(pipe, prompt: str) -> tuple[list[int], torch.Tensor]:
    """Token ids and the (1, L, D) text embedding of ``prompt`` (padded to the tokenizer's length)."""
    ids = pipe.tokenizer(prompt, padding="max_length", max_length=pipe.tokenizer.model_max_length,
                         truncation=True).input_ids
    return list(ids), pipe.text_encoder(torch.tensor([ids], device=pipe.unet.device))[0]


def ddim_schedule(pipe, steps: int):
    """diffusers' ``DDIMScheduler`` for ``pipe`` with ``steps`` timesteps set (see the module docstring)."""
    from diffusers import DDIMScheduler

    sched = DDIMScheduler.from_config(pipe.scheduler.config, clip_sample=False, set_alpha_to_one=False,
                                      timestep_spacing="leading")
    sched.set_timesteps(steps)
    return sched


def _alphas(sched, t: int) -> tuple[float, float]:
    """(alpha-bar at ``t``, alpha-bar one DDIM step earlier) -- the pair a sampling step at ``t`` moves between."""
    prev = t - sched.config.num_train_timesteps // sched.num_inference_steps
    a_prev = sched.alphas_cumprod[prev] if prev >= 0 else sched.final_alpha_cumprod
    return float(sched.alphas_cumprod[t]), float(a_prev)


def _ddim_move(x: torch.Tensor, eps: torch.Tensor, a_from: float, a_to: float) -> torch.Tensor:
    """Deterministic DDIM (eta 0): predicted clean latent from ``x`` at level ``a_from``, re-noised to ``a_to``."""
    x0 = (x - (1 - a_from) ** 0.5 * eps) / a_from ** 0.5
    return a_to ** 0.5 * x0 + (1 - a_to) ** 0.5 * eps


@torch.no_grad()
def encode_image(pipe, image: np.ndarray, size: int) -> torch.Tensor:
    """The scaled VAE latent (``latent_dist.mean``) of ``image`` resized to ``size``."""
    x = to_tensor([fit_image(image, size)], pipe.unet.device, pipe.unet.dtype)
    return pipe.vae.encode(x).latent_dist.mean * pipe.vae.config.scaling_factor


# --------------------------------------------------------------------------- inversion


@torch.no_grad()
def ddim_trajectory(pipe, latent: torch.Tensor, cond: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """DDIM inversion of ``latent`` with text embedding ``cond`` at guidance 1: ``[z_0, ..., z_T]``."""
    sched = ddim_schedule(pipe, steps)
    traj = [latent]
    for t in reversed(sched.timesteps.tolist()):
        a_t, a_prev = _alphas(sched, t)
        eps = pipe.unet(traj[-1], t, encoder_hidden_states=cond).sample
        traj.append(_ddim_move(traj[-1], eps, a_prev, a_t))
    return traj


def ddim_invert(pipe, image: np.ndarray, prompt: str, settings=None) -> Inversion:
    """Plain DDIM inversion: ``x_T`` of ``image`` under ``prompt``; the null embeddings are the unoptimised
    empty-prompt embedding at every step (so :func:`reconstruct` of it is the DDIM-inversion baseline)."""
    s = _settings(settings)
    latent = encode_image(pipe, image, s.size)
    cond = embed(pipe, prompt)[1]
    traj = ddim_trajectory(pipe, latent, cond, s.steps)
    null = embed(pipe, "")[1].expand(s.steps, -1, -1).clone()
    return Inversion(x_T=traj[-1], null_embeddings=null, latent=latent, prompt=prompt, settings=s)


def null_text_invert(pipe, image: np.ndarray, prompt: str, settings=None,
                     cache_dir: str | Path | None = None) -> Inversion:
    """Null-text inversion of ``image`` under the source ``prompt`` (module docstring); cached in ``cache_dir``."""
    s = _settings(settings)
    image = fit_image(image, s.size)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{inversion_key(pipe, image, prompt, s)}.pt"
        hit = _load_cached(path, prompt, s)
        if hit is not None:
            return hit
    latent = encode_image(pipe, image, s.size)
    cond = embed(pipe, prompt)[1]
    traj = ddim_trajectory(pipe, latent, cond, s.steps)
    sched = ddim_schedule(pipe, s.steps)
    uncond = embed(pipe, "")[1].detach().clone()
    x, nulls, iterations = traj[-1], [], 0
    for i, t in enumerate(sched.timesteps.tolist()):
        a_t, a_prev = _alphas(sched, t)
        target = traj[s.steps - i - 1]
        with torch.no_grad():
            eps_c = pipe.unet(x, t, encoder_hidden_states=cond).sample
        uncond = uncond.detach().clone().requires_grad_(True)   # a fresh tensor: Adam updates in place
        opt = torch.optim.Adam([uncond], lr=s.lr * max(1.0 - i / 100.0, 0.1))
        for _ in range(s.inner_steps):
            eps_u = pipe.unet(x, t, encoder_hidden_states=uncond).sample
            step = _ddim_move(x, eps_u + s.guidance * (eps_c - eps_u), a_t, a_prev)
            loss = F.mse_loss(step, target)
            uncond.grad = torch.autograd.grad(loss, uncond)[0]   # no gradients into the model's weights
            opt.step()
            iterations += 1
            if loss.item() < s.epsilon + i * s.epsilon_step:
                break
        uncond = uncond.detach()
        nulls.append(uncond)
        with torch.no_grad():
            eps_u = pipe.unet(x, t, encoder_hidden_states=uncond).sample
            x = _ddim_move(x, eps_u + s.guidance * (eps_c - eps_u), a_t, a_prev)
    inv = Inversion(x_T=traj[-1], null_embeddings=torch.cat(nulls), latent=latent, prompt=prompt, settings=s,
                    optimisation_steps=iterations)
    if path is not None:
        _save_cached(path, inv)
    return inv


# --------------------------------------------------------------------------- sampling and editing


def _controller(cross: Sequence[float], self_: Sequence[float]):
    """A ``hertz_cross`` :class:`~.p2p.AttentionController` whose self-attention window is per candidate."""

    class _PerCandidateSelf(AttentionController):
        def set_step(self, step: int, total: int) -> None:
            super().set_step(step, total)
            if self.n_candidates == 0:
                return
            rows = torch.arange(self.rows)
            member = rows % self.group_size
            cand = (rows % (self.n_candidates * self.group_size)) // self.group_size
            on = torch.tensor([step_fraction(step, total) < f for f in self_], dtype=torch.bool)
            copy = on[cand] & (member > 0)
            self.self_src = torch.where(copy, rows - member, rows) if bool(copy.any()) else None
            self._on_device = {}

    return _PerCandidateSelf("hertz_cross", 0.0)


@torch.no_grad()
def _sample(pipe, inversion: Inversion, cond: torch.Tensor, controller=None) -> torch.Tensor:
    """Guided DDIM from ``x_T`` for the rows of ``cond`` (R, L, D) with the inversion's null embeddings."""
    s = inversion.settings
    sched = ddim_schedule(pipe, s.steps)
    rows = cond.shape[0]
    x = inversion.x_T.to(pipe.unet.device, pipe.unet.dtype).expand(rows, -1, -1, -1)
    null = inversion.null_embeddings.to(pipe.unet.device, pipe.unet.dtype)
    for i, t in enumerate(sched.timesteps.tolist()):
        if controller is not None:
            controller.set_step(i, s.steps)
        a_t, a_prev = _alphas(sched, t)
        text = torch.cat([null[i:i + 1].expand(rows, -1, -1), cond])
        eps_u, eps_c = pipe.unet(torch.cat([x, x]), t, encoder_hidden_states=text).sample.chunk(2)
        x = _ddim_move(x, eps_u + s.guidance * (eps_c - eps_u), a_t, a_prev)
    return x


def reconstruct(pipe, inversion: Inversion, prompt: str | None = None, *, return_latent: bool = False):
    """Sample back from ``inversion`` under ``prompt`` (default: its source prompt): a ``uint8`` image, or the
    final latent (1, C, h, w) with ``return_latent``."""
    latent = _sample(pipe, inversion, embed(pipe, inversion.prompt if prompt is None else prompt)[1])
    return latent if return_latent else decode(pipe.vae, latent)[0]


def p2p_edit(pipe, inversion: Inversion, source_prompt: str, target_prompt: str,
             params: dict | Sequence[dict]) -> list[np.ndarray]:
    """Prompt-to-Prompt edits of the inverted image, one per ``params`` entry ``{"cross": c, "self": s}``
    (fractions of the steps with cross- / self-attention taken from the source rows), in one UNet batch.
    Returns the edited (target-prompt) ``uint8`` images in the order of ``params``."""
    params = [params] if isinstance(params, dict) else list(params)
    if not params:
        return []
    ids_s, emb_s = embed(pipe, source_prompt)
    ids_t, emb_t = embed(pipe, target_prompt)
    maps = torch.stack([torch.from_numpy(token_alignment(ids_s, ids)) for ids in (ids_s, ids_t)])
    controller = _controller([float(p["cross"]) for p in params], [float(p["self"]) for p in params])
    controller.configure(len(params), 2, [float(p["cross"]) for p in params], maps)
    cond = torch.cat([emb_s, emb_t]).repeat(len(params), 1, 1)
    try:
        with controlled(pipe.unet, controller):
            latents = _sample(pipe, inversion, cond, controller)
    finally:
        controller.reset()
    return decode(pipe.vae, latents[1::2])


# --------------------------------------------------------------------------- identity and cache


def model_fingerprint(pipe) -> str:
    """Content identity of a loaded pipeline: :func:`~counterfactory.models.registry.fingerprint` of the folder
    it was loaded from, else a sha256 over its UNet, VAE and text-encoder weights (memoised on the object)."""
    memo = getattr(pipe, "_counterfactory_fingerprint", None)
    if memo:
        return memo
    path = getattr(pipe, "name_or_path", None) or dict(getattr(pipe, "config", {}) or {}).get("_name_or_path")
    if path and Path(path).is_dir():
        value = fingerprint(path)
    else:
        digest = hashlib.sha256()
        for name in ("unet", "vae", "text_encoder"):
            for key, tensor in sorted(getattr(pipe, name).state_dict().items()):
                digest.update(f"{name}.{key}".encode())
                digest.update(tensor.detach().float().cpu().numpy().tobytes())
        value = "weights:" + digest.hexdigest()
    pipe._counterfactory_fingerprint = value
    return value


def image_sha256(image: np.ndarray) -> str:
    """sha256 of a ``uint8`` image's shape and pixels."""
    image = np.ascontiguousarray(image)
    return hashlib.sha256(f"{image.shape}".encode() + image.tobytes()).hexdigest()


def inversion_key(pipe, image: np.ndarray, prompt: str, settings: InversionSettings) -> str:
    """Cache key of an inversion (module docstring); ``image`` already resized."""
    payload = {"image": image_sha256(image), "prompt": prompt, "settings": asdict(settings),
               "model": model_fingerprint(pipe)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _save_cached(path: Path, inv: Inversion) -> None:
    with atomic_path(path) as tmp:
        torch.save({"x_T": inv.x_T.cpu(), "null": inv.null_embeddings.cpu(), "latent": inv.latent.cpu(),
                    "prompt": inv.prompt, "settings": asdict(inv.settings),
                    "optimisation_steps": inv.optimisation_steps}, tmp)


def _load_cached(path: Path, prompt: str, s: InversionSettings) -> Inversion | None:
    if not path.is_file():
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        if data["prompt"] != prompt or data["settings"] != asdict(s):
            raise ValueError("prompt or settings differ")
        return Inversion(x_T=data["x_T"], null_embeddings=data["null"], latent=data["latent"], prompt=prompt,
                         settings=s, optimisation_steps=int(data["optimisation_steps"]), cached=True)
    except Exception as exc:  # a damaged cache file is redone, never trusted
        log.warning("ignoring unreadable inversion cache %s (%s); inverting again", path, exc)
        return None


__all__ = ["Inversion", "InversionSettings", "ddim_invert", "ddim_schedule", "ddim_trajectory", "decode", "embed",
           "encode_image", "fit_image", "image_sha256", "inversion_key", "model_fingerprint", "null_text_invert",
           "p2p_edit", "reconstruct"]
