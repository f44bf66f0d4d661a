"""Grounded generation for CounterCurate (Zhang et al., 2024): GLIGEN text-box generation (§3.2),
GLIGEN text-box inpainting (§3.3, appendix C) and plain text-to-image generation (§3.4), on diffusers.

Requests (one parquet row per item): ``item_id``, ``kind`` (``generate`` | ``inpaint`` | ``t2i``),
``prompt``, ``phrases`` (list of str), ``boxes`` (list of normalised ``[x1, y1, x2, y2]``, one per
phrase), ``image_path`` (``inpaint``: the source image; a relative path is relative to the requests
file's folder) and ``mask_box`` (``inpaint``, optional: a normalised box regenerated besides the
phrase boxes). Roles: ``generate`` -> ``gligen`` (gligen/gligen-generation-text-box), ``inpaint`` ->
``gligen_inpaint`` (gligen/gligen-inpainting-text-box), ``t2i`` -> ``t2i`` (the open text-to-image
pipeline standing in for DALLE-3; paper config: SDXL base, ``StableDiffusionXLPipeline``). ``t2i`` images
are ``t2i_width x t2i_height`` (default 1024 x 1024: DALLE-3's "hd" images, §4.1, and SDXL's native size).
The pipelines are read and run in ``grounded.precision`` (null: the config-wide ``precision``; :func:`stage_config`).

Sampling follows diffusers' ``StableDiffusionGLIGENPipeline.__call__`` step by step (prompt and
negative-prompt embeddings, per-phrase CLIP pooled embeddings and boxes padded to 30 objects for the
UNet's ``position_net``, classifier-free guidance with the grounding masked out of the unconditional
half, GLIGEN's scheduled sampling -- the gated fusers run for the first ``int(beta * len(timesteps))``
steps -- and, for inpainting, the known region of the latent replaced by the noised source latent
before every step, with ``(masked source latent, mask)`` concatenated to the 9-channel UNet input).
It is re-implemented here rather than called because the pipeline takes one phrase/box list and one
inpainting image per call and draws the inpainting noise from torch's global RNG; here every batch
row has its own phrases, boxes, source image and ``torch.Generator`` (seeded from the item id with
:func:`counterfactory.generation.selection.candidate_seed`), so a batch of items gives each item
the image it gets alone (up to CPU batched-kernel rounding) and reruns are bit-identical. For a single
text-box item the result equals the pipeline's own call with the same generator (tested).

Differences from diffusers' pipeline, following GLIGEN's own inference script (``gligen_inference.py``,
which the authors' ``datasets/gligen_inference_*.py`` call): the source image is resized to
``width x height`` without centre-cropping (the boxes are normalised by the original width and height,
so a crop would move them off their objects); the latent mask is drawn with x scaled by the latent
width and y by the latent height. ``grounded.inpaint_paste_back`` (default false, as GLIGEN) copies
the source pixels back outside the regenerated region; without it pixels outside the boxes are the
VAE's reconstruction of the source (GLIGEN only blends latents).

Sharding, resumption and merge run on the shared shard runner (:mod:`.runner`): shard ``k`` holds the
items ranked ``k*S .. (k+1)*S - 1`` in sorted ``item_id`` order (``S = grounded.shard_size``); finished
items are cached in ``OUT_DIR/work/<item_id>/`` (``done.json``, with the fingerprint of the settings, the
model's content fingerprint and the request, written last). Batches are formed from the shard's full item
list, and a batch with any item not cached is generated whole, so a killed and rerun job writes
byte-identical files. The request table is read and checked by :mod:`.grounded_requests`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..device import from_config, place_pipeline, with_stage_precision
from ..errors import ConfigError, input_error
from ..io import config_digest, write_json, write_parquet
from ..models import registry
from ..rgb import to_rgb
from ..settings import config_value, schema_defaults
from . import runner
from .grounded_requests import (KINDS, MAX_OBJS, OPTIONAL_COLUMNS, REQUIRED_COLUMNS, ROLE_OF_KIND,  # noqa: F401
                                GroundedRequest, _check_source, read_requests, requests_digest)

log = logging.getLogger(__name__)

MODEL_ROLES = ("gligen", "gligen_inpaint", "t2i")

GENERATED_SCHEMA = {
    "item_id": "object", "kind": "object", "prompt": "object", "phrases": "object", "boxes": "object",
    "source_image_path": "object", "mask_box": "object", "seed": "uint64", "image_path": "object",
}


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
@schema_defaults("countercurate.grounded")
class GroundedSettings:
    """The ``grounded`` config section (CounterCurate §3.2-3.4; GLIGEN inference settings); the defaults are the
    schema's (``countercurate.grounded``), for a run and for direct library use alike. ``negative_prompt``: the
    authors' GLIGEN scripts' (CounterCurate repository, datasets/gligen_inference_up_down.py and
    gligen_inference_count.py, ``--negative_prompt`` default)."""

    steps: int
    guidance: float
    height: int
    width: int
    #: fraction of the steps with the GLIGEN fusers on; 1.0 = grounding at every step, which is what the
    #: authors ran (GLIGEN's ``alpha_generator`` defaults to ``[1, 0, 0]`` and their metas set no
    #: ``alpha_type``); diffusers' default is 0.3
    scheduled_sampling_beta: float
    negative_prompt: str | None
    batch_size: int
    shard_size: int
    inpaint_paste_back: bool
    #: t2i image size: DALLE-3 "hd" quality (§4.1) is 1024 x 1024, also SDXL base's native size
    t2i_height: int
    t2i_width: int

    @classmethod
    def from_config(cls, section: dict | None) -> "GroundedSettings":
        section = dict(section or {})
        known = {f for f in cls.__dataclass_fields__} | {"keep_work", "precision"}   # read by stage_config / runner
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(f"grounded: unknown key(s) {unknown}. Fix: use only {sorted(known)}")
        fields = {f: section.get(f, getattr(cls, f)) for f in cls.__dataclass_fields__}  # absent: library defaults
        neg = fields["negative_prompt"]
        try:
            out = cls(
                steps=int(fields["steps"]), guidance=float(fields["guidance"]), height=int(fields["height"]),
                width=int(fields["width"]), scheduled_sampling_beta=float(fields["scheduled_sampling_beta"]),
                negative_prompt=neg if isinstance(neg, str) and neg.strip() else None,
                batch_size=int(fields["batch_size"]), shard_size=int(fields["shard_size"]),
                inpaint_paste_back=bool(fields["inpaint_paste_back"]), t2i_height=int(fields["t2i_height"]),
                t2i_width=int(fields["t2i_width"]),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"grounded: {exc}. Fix: steps, height, width, t2i_height, t2i_width, batch_size, "
                              "shard_size are integers; "
                              "guidance and scheduled_sampling_beta numbers") from exc
        checks = [
            ("steps", out.steps >= 1, "an integer >= 1 (paper: 50)"),
            ("guidance", out.guidance >= 0, "a number >= 0 (paper: 7.5)"),
            ("height", out.height >= 8 and out.height % 8 == 0, "a positive multiple of 8 (paper: 512)"),
            ("width", out.width >= 8 and out.width % 8 == 0, "a positive multiple of 8 (paper: 512)"),
            ("t2i_height", out.t2i_height >= 8 and out.t2i_height % 8 == 0, "a positive multiple of 8 (hd: 1024)"),
            ("t2i_width", out.t2i_width >= 8 and out.t2i_width % 8 == 0, "a positive multiple of 8 (hd: 1024)"),
            ("scheduled_sampling_beta", 0.0 <= out.scheduled_sampling_beta <= 1.0, "a number in [0, 1]"),
            ("batch_size", out.batch_size >= 1, "an integer >= 1"),
            ("shard_size", out.shard_size >= 1, "an integer >= 1"),
        ]
        for key, ok, want in checks:
            if not ok:
                raise ConfigError(f"grounded.{key} = {section.get(key)!r} is invalid. Fix: set it to {want}")
        return out

    def output_key(self) -> dict:
        """The settings an item's image depends on (not batch_size / shard_size: the image of an item
        does not depend on its batch beyond float rounding)."""
        d = asdict(self)
        d.pop("batch_size")
        d.pop("shard_size")
        return d


def stage_config(cfg: dict) -> dict:
    """``cfg`` as grounded generation runs it: ``grounded.precision`` (when set) replaces the config-wide
    ``precision`` for the GLIGEN and t2i pipelines (their weights are read and run in it); null keeps the config's."""
    return with_stage_precision(cfg, (cfg.get("grounded") or {}).get("precision"))


def model_roles(cfg: dict) -> tuple[str, ...]:
    """The grounded roles configured in ``cfg`` (the digest covers exactly these)."""
    models = cfg.get("models") or {}
    return tuple(r for r in MODEL_ROLES if models.get(r))


def grounded_config_digest(cfg: dict) -> str:
    """sha256 over the ``grounded`` section, ``seed`` and the configured grounded model entries:
    shards with different digests are not merged."""
    return config_digest(cfg, sections=("grounded", "seed"), model_roles=model_roles(cfg))


# --------------------------------------------------------------------------- sampling


def item_seed(global_seed: int, item_id: str) -> int:
    """64-bit seed of an item: :func:`.selection.candidate_seed` with candidate index 0 (one image per request)."""
    return runner.item_seed(global_seed, item_id, 0)


def _latent_keep_mask(boxes: Sequence[Sequence[float]], h: int, w: int):
    """1 where the source latent is kept, 0 inside each box (GLIGEN's ``draw_masks_from_boxes``:
    corners truncated to the latent grid)."""
    import torch

    mask = torch.ones(h, w)
    for x1, y1, x2, y2 in boxes:
        mask[int(y1 * h):int(y2 * h), int(x1 * w):int(x2 * w)] = 0
    return mask


def _load_source(q: GroundedRequest, width: int, height: int, requests_path: Path | None = None) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(q.image) as im:
            # GLIGEN's inference script: resize to the model's size, no crop (the boxes stay on their objects)
            return np.asarray(to_rgb(im, q.image).resize((width, height), Image.BICUBIC))
    except Exception as exc:
        raise input_error(requests_path or q.image, f"{q.row} (item_id {q.item_id!r})",
                          f"source image {q.image} could not be read ({exc})", "replace it with a valid image") from exc


def _to_uint8(images) -> np.ndarray:
    x = (images.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
    return (x * 255).round().astype(np.uint8)


def _place(pipe, cfg: dict):
    place_pipeline(pipe, cfg)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def gligen_batch(pipe, settings: GroundedSettings, items: Sequence[GroundedRequest], seeds: Sequence[int], *,
                 sources: Sequence[np.ndarray] | None = None, return_latents: bool = False):
    """One batched GLIGEN call: ``generate`` items (``sources`` None) or ``inpaint`` items (``sources``:
    their source images as uint8 ``(height, width, 3)``). Returns uint8 ``(B, height, width, 3)``, with
``return_latents`` also ``{"latents", "source_latents", "keep"}`` (final latents; inpainting: the
source latents and the 0/1 latent mask of the known region).

    Follows ``StableDiffusionGLIGENPipeline.__call__`` (see the module docstring) with per-row
    phrases, boxes, source latents and generators."""
    import torch
    from diffusers.models.attention import GatedSelfAttentionDense
    from diffusers.utils.torch_utils import randn_tensor

    inpaint = sources is not None
    b = len(items)
    device = pipe._execution_device
    dtype = pipe.unet.dtype
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    do_cfg = settings.guidance > 1.0

    with torch.no_grad():
        neg = [settings.negative_prompt] * b if settings.negative_prompt else None
        cond, uncond = pipe.encode_prompt([q.prompt for q in items], device, 1, do_cfg, neg)
        text = torch.cat([uncond, cond]) if do_cfg else cond

        scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
        scheduler.set_timesteps(settings.steps, device=device)
        timesteps = scheduler.timesteps
        scale = pipe.vae_scale_factor
        h, w = settings.height // scale, settings.width // scale
        latents = randn_tensor((b, 4, h, w), generator=gens, device=device, dtype=dtype)
        latents = latents * scheduler.init_noise_sigma

        # grounding tokens: per item, phrases -> CLIP pooled text features (as the pipeline), boxes, masks
        dim = pipe.unet.config.cross_attention_dim
        boxes = torch.zeros(b, MAX_OBJS, 4, device=device, dtype=dtype)
        embeds = torch.zeros(b, MAX_OBJS, dim, device=device, dtype=dtype)
        masks = torch.zeros(b, MAX_OBJS, device=device, dtype=dtype)
        for k, q in enumerate(items):
            n = len(q.boxes)
            tok = pipe.tokenizer(list(q.phrases), padding=True, return_tensors="pt").to(device)
            embeds[k, :n] = pipe.text_encoder(**tok).pooler_output.to(dtype)
            boxes[k, :n] = torch.tensor(q.boxes, dtype=dtype, device=device)
            masks[k, :n] = 1
        if do_cfg:
            boxes, embeds = torch.cat([boxes, boxes]), torch.cat([embeds, embeds])
            masks = torch.cat([torch.zeros_like(masks), masks])  # no grounding in the unconditional half
        gligen = {"boxes": boxes, "positive_embeddings": embeds, "masks": masks}

        if inpaint:
            z0, keep = [], []
            for q, src, gen in zip(items, sources, gens):
                x = torch.from_numpy(np.array(src, dtype=np.uint8)).permute(2, 0, 1)[None].float() / 127.5 - 1.0
                dist = pipe.vae.encode(x.to(pipe.vae.device, pipe.vae.dtype)).latent_dist
                z0.append(pipe.vae.config.scaling_factor * dist.sample(generator=gen))
                region = list(q.boxes) + ([q.mask_box] if q.mask_box else [])
                keep.append(_latent_keep_mask(region, h, w)[None, None])
            z0 = torch.cat(z0).to(device, dtype)
            keep = torch.cat(keep).to(device, dtype)
            extra = torch.cat([z0 * keep, keep], dim=1)
            if do_cfg:
                extra = torch.cat([extra, extra])

        fusers = [m for m in pipe.unet.modules() if type(m) is GatedSelfAttentionDense]
        n_grounded = int(settings.scheduled_sampling_beta * len(timesteps))
        step_kwargs = pipe.prepare_extra_step_kwargs(gens, 0.0)
        try:
            for m in fusers:
                m.enabled = True
            for i, t in enumerate(timesteps):
                if i == n_grounded:  # GLIGEN scheduled sampling: plain SD for the remaining steps
                    for m in fusers:
                        m.enabled = False
                if inpaint:
                    noise = randn_tensor(z0.shape, generator=gens, device=device, dtype=dtype)
                    z_t = scheduler.add_noise(z0, noise, t.reshape(1).repeat(b))
                    latents = z_t * keep + latents * (1 - keep)
                model_in = torch.cat([latents, latents]) if do_cfg else latents
                model_in = scheduler.scale_model_input(model_in, t)
                if inpaint:
                    model_in = torch.cat([model_in, extra], dim=1)
                eps = pipe.unet(model_in, t, encoder_hidden_states=text,
                                cross_attention_kwargs={"gligen": gligen}).sample
                if do_cfg:
                    eps_u, eps_c = eps.chunk(2)
                    eps = eps_u + settings.guidance * (eps_c - eps_u)
                latents = scheduler.step(eps, t, latents, **step_kwargs).prev_sample
        finally:
            for m in fusers:
                m.enabled = True
        images = _to_uint8(pipe.vae.decode(latents / pipe.vae.config.scaling_factor).sample)

    if inpaint and settings.inpaint_paste_back:
        k = keep.cpu().numpy()[:, 0].repeat(scale, axis=1).repeat(scale, axis=2)[..., None]
        images = np.where(k > 0.5, np.stack(sources), images).astype(np.uint8)
    if return_latents:
        return images, {"latents": latents.float().cpu(), "source_latents": z0.float().cpu() if inpaint else None,
                        "keep": keep.float().cpu() if inpaint else None}
    return images


def t2i_batch(pipe, settings: GroundedSettings, items: Sequence[GroundedRequest], seeds: Sequence[int]) -> np.ndarray:
    """One batched call of the t2i pipeline (SD or SDXL; one generator per row), ``t2i_width x t2i_height``;
    uint8 ``(B, H, W, 3)``.
    No negative prompt: DALLE-3, whose role this plays (§3.4), takes none."""
    import torch

    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    out = pipe(prompt=[q.prompt for q in items], height=settings.t2i_height, width=settings.t2i_width,
               num_inference_steps=settings.steps, guidance_scale=settings.guidance, generator=gens,
               output_type="np")
    return (np.asarray(out.images) * 255).round().astype(np.uint8)


# --------------------------------------------------------------------------- shard runner


@dataclass
class GroundedContext:
    cfg: dict
    settings: GroundedSettings
    global_seed: int
    models: dict
    requests_path: Path
    requests: list[GroundedRequest]
    source_sha: dict[str, str] = field(default_factory=dict)


def _item_fingerprint(ctx: GroundedContext, q: GroundedRequest) -> str:
    return runner.fingerprint({
        "settings": ctx.settings.output_key(), "seed": ctx.global_seed, "model": ctx.models[q.role],
        "item_id": q.item_id, "kind": q.kind, "prompt": q.prompt, "phrases": list(q.phrases),
        "boxes": [list(b) for b in q.boxes], "mask_box": list(q.mask_box) if q.mask_box else None,
        "source_sha256": ctx.source_sha.get(q.item_id), "version": 1,
    })


shard_bounds = runner.shard_bounds


def plan_batches(items: Sequence[GroundedRequest], batch_size: int) -> list[list[GroundedRequest]]:
    """Batches of one kind (one pipeline) each, in kind order then item_id order. Items with different
    numbers of boxes share a batch: the UNet's position net takes per-row boxes padded to 30 objects."""
    out = []
    for kind in KINDS:
        of_kind = [q for q in items if q.kind == kind]
        out += [of_kind[s:s + batch_size] for s in range(0, len(of_kind), batch_size)]
    return out


class GroundedStage(runner.ShardStage):
    """Grounded generation on the shard runner: batches of one kind planned over the whole shard (a batch
    with any item not cached is generated whole), one ``image.png`` per item in ``work/<item_id>/``."""

    whole_batches = True

    def __init__(self, ctx: GroundedContext, cache: runner.WorkCache, pipes: dict):
        self.ctx, self.cache, self.pipes, self.placed = ctx, cache, pipes, set()

    def key(self, q):
        return _item_fingerprint(self.ctx, q)

    def is_done(self, q, key):
        return self.cache.is_done(q.item_id, key)

    def clear(self, q):
        self.cache.clear(q.item_id)

    def plan(self, items):
        return plan_batches(items, self.ctx.settings.batch_size)

    def generate(self, batch):
        ctx, role = self.ctx, batch[0].role
        if role not in self.pipes:   # read in the stage's precision (auto: fp32 on CPU), then placed in it
            self.pipes[role] = registry.load(ctx.cfg, role, dtype=from_config(ctx.cfg)[1])
        if role not in self.placed:
            self.pipes[role] = _place(self.pipes[role], ctx.cfg)
            self.placed.add(role)
        seeds = [item_seed(ctx.global_seed, q.item_id) for q in batch]
        if batch[0].kind == "t2i":
            images = t2i_batch(self.pipes[role], ctx.settings, batch, seeds)
        else:
            sources = ([_load_source(q, ctx.settings.width, ctx.settings.height, ctx.requests_path) for q in batch]
                       if batch[0].kind == "inpaint" else None)
            images = gligen_batch(self.pipes[role], ctx.settings, batch, seeds, sources=sources)
        yield from zip(batch, zip(seeds, images))

    def store(self, q, key, result):
        seed, image = result
        self.cache.write(q.item_id, "image.png", runner.png_bytes(image))
        self.cache.mark_done(q.item_id, key, {"seed": str(seed)})


@runner.locks_shard
def run_grounded_shard(cfg: dict, requests_path: str | os.PathLike, shard: int | str, out_dir: str | os.PathLike,
                       *, pipes: dict | None = None, hook: Callable[[int, str], None] | None = None,
                       progress: bool = True) -> dict:
    """Generate every request of one shard (CounterCurate §3.2 GLIGEN generation, §3.3 GLIGEN
    inpainting, §3.4 text-to-image) and write ``OUT_DIR/images/<item_id>.png``,
    ``OUT_DIR/generated.parquet`` (request columns, the source image as ``source_image_path``, ``seed``,
    ``image_path`` relative to OUT_DIR) and ``OUT_DIR/summary.json`` (with ``config_digest``).

    ``pipes`` maps roles (``gligen``, ``gligen_inpaint``, ``t2i``) to loaded pipelines; missing roles
    are loaded through the registry when needed. ``hook(k, item_id)`` runs after the k-th newly
    generated item is cached (tests use it to simulate a kill)."""
    cfg = stage_config(cfg)
    settings = GroundedSettings.from_config(cfg.get("grounded"))
    requests_path = Path(requests_path)
    reqs = read_requests(requests_path)
    shard_idx = int(shard)
    lo, hi = shard_bounds(shard_idx, settings.shard_size)
    part = reqs[lo:hi]
    roles = sorted({q.role for q in part})
    for role in roles:
        registry.model_spec(cfg, role)  # a ConfigError naming models.<role> when it is not configured
    ctx = GroundedContext(cfg=cfg, settings=settings, global_seed=int(config_value(cfg, "seed")),
                          models=registry.configured_models(cfg, roles=roles), requests_path=requests_path,
                          requests=reqs)
    for q in part:
        if q.kind == "inpaint":
            ctx.source_sha[q.item_id] = _check_source(requests_path, q)
    out_dir = Path(out_dir)
    cache = runner.WorkCache(out_dir / "work", require=("image.png",))
    log.info("grounded shard %05d: items [%d, %d) of %d: %d requests", shard_idx, lo, hi, len(reqs), len(part))
    with runner.progress_bar(len(part), f"grounded shard {shard_idx:05d}", "image", progress) as bar:
        stats = runner.run_stage(GroundedStage(ctx, cache, dict(pipes or {})), part, hook=hook, bar=bar)
    return _assemble(ctx, shard_idx, (lo, hi), part, cache, out_dir, stats.batches, stats.generated)


def _request_row(q: GroundedRequest) -> dict:
    return {"item_id": q.item_id, "kind": q.kind, "prompt": q.prompt, "phrases": list(q.phrases),
            "boxes": [list(b) for b in q.boxes], "source_image_path": q.source,
            "mask_box": list(q.mask_box) if q.mask_box else None}


def _assemble(ctx: GroundedContext, shard_idx: int, bounds: tuple[int, int], part: list[GroundedRequest],
              cache: runner.WorkCache, out_dir: Path, calls: int, generated: int) -> dict:
    import shutil

    def build(images: Path):
        rows = []
        for q in part:
            shutil.copyfile(cache.dir(q.item_id) / "image.png", images / f"{q.item_id}.png")
            rows.append({**_request_row(q), "seed": np.uint64(item_seed(ctx.global_seed, q.item_id)),
                         "image_path": f"images/{q.item_id}.png"})
        s = ctx.settings
        summary = {
            "shard": shard_idx, "item_range": list(bounds), "shard_size": s.shard_size,
            "requests_total": len(ctx.requests), "items": len(part),
            "items_by_kind": {kind: sum(q.kind == kind for q in part) for kind in KINDS},
            "batch_size": s.batch_size, "threads": runner.torch_threads(),
            "steps": s.steps, "guidance": s.guidance, "scheduled_sampling_beta": s.scheduled_sampling_beta,
            "requests_digest": requests_digest(ctx.requests), "config_digest": grounded_config_digest(ctx.cfg),
        }
        return {"generated.parquet": runner.frame(rows, GENERATED_SCHEMA)}, summary

    summary = runner.assemble(out_dir, cache, build,
                              keep_work=bool(config_value(ctx.cfg.get("grounded") or {},
                                                          "countercurate.grounded.keep_work")))
    log.info("grounded shard %05d: %d images (%d generated now in %d pipeline calls)", shard_idx, len(part),
             generated, calls)
    # this run's work counts are returned and logged, never written: a resumed shard's files are byte-identical
    return {**summary, "items_generated_this_run": generated, "pipeline_calls_this_run": calls}


def merge_grounded_shards(shard_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> dict:
    """Concatenate the shards' ``generated.parquet`` (sorted by item_id; image paths made relative to
    ``out_dir``). Refused: a missing shard output or shard, shards with different ``config_digest`` or
    made from different requests tables, an item in two shards."""
    import math

    import pandas as pd

    out_dir = Path(out_dir)
    rerun = "`counterfactory countercurate generate`"
    summaries, digest = runner.load_shard_summaries(shard_dirs, ("generated.parquet",), "grounded-generation shard",
                                                    rerun)
    tables = {s.get("requests_digest") for s in summaries.values()}
    if len(tables) > 1:
        raise input_error(out_dir, None, "the shards were made from different requests tables",
                          f"rerun {rerun} for every shard with one --requests file")
    if summaries:
        first = next(iter(summaries.values()))
        expected = range(math.ceil(first["requests_total"] / first["shard_size"]))
        runner.check_shard_plan(summaries, out_dir, expected=expected, rerun=rerun,
                                plan=f"expected each of {list(expected)} once: {first['requests_total']} requests "
                                     f"in shards of {first['shard_size']}")
    frames = []
    for d in map(Path, shard_dirs):
        df = pd.read_parquet(d / "generated.parquet")
        df["image_path"] = runner.relative_paths(df["image_path"], d, out_dir)
        frames.append(df)
    merged = pd.concat(frames, ignore_index=True) if frames else runner.frame([], GENERATED_SCHEMA)
    merged = merged.sort_values("item_id", kind="mergesort").reset_index(drop=True)
    dup = merged["item_id"][merged["item_id"].duplicated()]
    if len(dup):
        raise input_error(out_dir, None, f"item_id {dup.iloc[0]!r} is in two shards",
                          "merge the shards of one run (one grounded.shard_size) only")
    write_parquet(out_dir / "generated.parquet", merged)
    by_kind = {kind: int(sum(s["items_by_kind"].get(kind, 0) for s in summaries.values())) for kind in KINDS}
    summary = {"shards": len(summaries), "items": int(len(merged)), "items_by_kind": by_kind,
               "batch_size": runner.common_value(summaries.values(), "batch_size"),
               "threads": runner.common_value(summaries.values(), "threads"),
               "config_digest": digest, "requests_digest": next(iter(tables), None)}
    write_json(out_dir / "summary.json", summary)
    return summary
