"""Batched Prompt-to-Prompt over-generation of counterfactual image pairs and sets.

COCO-Counterfactuals §3.2 / B.1.2 over-generate 100 image pairs per caption pair with
InstructPix2Pix's Prompt-to-Prompt, ``p ~ U(0.1, 0.9)`` per sample, then filter and select with
CLIP. This module runs that over-generation with many candidates per UNet call and our own denoising
loop around the pipeline's ``unet``/``vae``/``text_encoder``/``scheduler``, because every candidate
in a batch has its own guidance scale and its own attention-control fraction ``p``.

Randomness is a function of ``(global seed, caption id, candidate index)`` only
(:func:`candidate_seed`): the candidate's seed fixes ``p``, the guidance scale, the initial latent
and every step's ancestral-sampler noise (drawn on the CPU from a per-candidate generator), so a
candidate's images do not depend on the batch size, the shard layout or how many jobs ran (up to
floating-point differences of batched kernels, see ``tests/test_p2p.py``). All members of one
candidate (original and edited prompts) share the initial latent and the sampler noise.

The shard runner (:func:`run_shard`) caches each finished caption atomically in the shard's work
folder, so a killed job that is rerun skips finished captions and writes byte-identical outputs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ..errors import ConfigError, input_error
from .p2p import MODES, AttentionController, install, token_alignment

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
class GenerationSettings:
    """Generator settings; defaults are the InstructPix2Pix generator's (reference-code facts)."""

    steps: int = 100
    height: int = 512
    width: int = 512
    scheduler: str = "euler_ancestral"
    control: str = "ip2p_self"
    p_range: tuple[float, float] = (0.1, 0.9)
    guidance_range: tuple[float, float] = (7.5, 15.0)
    hertz_self_fraction: float = 0.0
    negative_prompt: str = ""
    batch_size: int = 4

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
    def from_config(cls, images: dict) -> "GenerationSettings":
        return cls(
            steps=int(images.get("steps", 100)),
            height=int(images.get("height", 512)),
            width=int(images.get("width", 512)),
            scheduler=str(images.get("scheduler", "euler_ancestral")),
            control=str(images.get("attention_control", "ip2p_self")),
            p_range=tuple(float(x) for x in images.get("p_range", (0.1, 0.9))),
            guidance_range=tuple(float(x) for x in images.get("guidance_range", (7.5, 15.0))),
            hertz_self_fraction=float(images.get("hertz_self_fraction", 0.0)),
            negative_prompt=str(images.get("negative_prompt", "")),
            batch_size=int(images.get("batch_size", 4)),
        )


@dataclass(frozen=True)
class Candidate:
    """One over-generation sample: its index, 64-bit seed, attention fraction ``p`` and guidance."""

    index: int
    seed: int
    p: float
    guidance: float


def candidate_seed(global_seed: int, caption_id: str, index: int) -> int:
    """64-bit seed: first 8 bytes (big-endian) of sha256(f"{global_seed}:{caption_id}:{index}")."""
    digest = hashlib.sha256(f"{global_seed}:{caption_id}:{index}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def make_candidate(global_seed: int, caption_id: str, index: int, settings: GenerationSettings) -> Candidate:
    """The candidate's seed, then ``p ~ U(p_range)`` and guidance ``~ U(guidance_range)`` from it."""
    seed = candidate_seed(global_seed, caption_id, index)
    rng = np.random.Generator(np.random.PCG64(seed))
    p = float(rng.uniform(*settings.p_range))
    guidance = float(rng.uniform(*settings.guidance_range))
    return Candidate(index=index, seed=seed, p=p, guidance=guidance)


# --------------------------------------------------------------------------- engine

@dataclass
class BatchResult:
    """Images ``uint8 (B, G, H, W, 3)`` and final latents ``float32 (B, G, C, h, w)`` of a batch."""

    candidates: list[Candidate]
    images: np.ndarray
    latents: np.ndarray


class P2PEngine:
    """Batched Prompt-to-Prompt sampler around a diffusers ``StableDiffusionPipeline``."""

    def __init__(self, pipe, settings: GenerationSettings, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
        import diffusers

        self.settings = settings
        self.device = torch.device(device)
        self.dtype = dtype
        self.unet = _place(pipe.unet, self.device, dtype)
        self.vae = _place(pipe.vae, self.device, dtype)
        self.text_encoder = _place(pipe.text_encoder, self.device, dtype)
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
        self.controller = AttentionController(settings.control, settings.hertz_self_fraction)
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
            with torch.no_grad():
                emb = self.text_encoder(torch.tensor([ids], device=self.device))[0]
            if len(self._embed_cache) > 256:
                self._embed_cache.clear()
            self._embed_cache[prompt] = (list(ids), emb)
        return self._embed_cache[prompt]

    # -------------------------------------------------------------- sampling
    def _initial_latent(self, gen: torch.Generator, scheduler) -> torch.Tensor:
        x = torch.randn((1, *self.latent_shape), generator=gen, dtype=torch.float32)
        return x * float(scheduler.init_noise_sigma)

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], candidates: Sequence[Candidate],
                 p_override: Sequence[float] | None = None) -> BatchResult:
        """Sample every candidate for the group ``prompts`` = [base, edit_1, ..., edit_K] in one batch."""
        prompts = list(prompts)
        cands = list(candidates)
        g, b = len(prompts), len(cands)
        if g < 2:
            raise ValueError("generate() needs a base prompt and at least one edited prompt")
        if b == 0:
            raise ValueError("generate() needs at least one candidate")
        s = self.settings
        scheduler = self.scheduler_cls.from_config(self.scheduler_config)
        scheduler.set_timesteps(s.steps, device=self.device)

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
        images = self.decode(latents)
        return BatchResult(
            candidates=cands,
            images=images.reshape(b, g, *images.shape[1:]),
            latents=latents.float().cpu().numpy().reshape(b, g, *latents.shape[1:]),
        )

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, chunk: int = 8) -> np.ndarray:
        """Latents -> uint8 (n, H, W, 3), rounding like diffusers' ``numpy_to_pil``; ``chunk`` latents
        per VAE call bound the decoder's memory at 512x512."""
        out = []
        for s in range(0, latents.shape[0], chunk):
            x = self.vae.decode(latents[s:s + chunk] / self.vae.config.scaling_factor).sample
            x = (x.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
            out.append((x * 255).round().astype(np.uint8))
        return np.concatenate(out)


def _place(module, device: torch.device, dtype: torch.dtype):
    module = module.to(device)
    if getattr(module, "dtype", dtype) != dtype:
        module = module.to(dtype)
    return module.eval()


def build_engine(cfg: dict) -> P2PEngine:
    """Load the ``sd`` role and wrap it (device/precision from :func:`counterfactory.device.from_config`)."""
    from ..device import from_config
    from ..models import registry

    device, dtype = from_config(cfg)
    pipe = registry.load(cfg, "sd")
    return P2PEngine(pipe, GenerationSettings.from_config(cfg.get("images", {})), device, dtype)


def candidate_batches(global_seed: int, caption_id: str, n: int, settings: GenerationSettings,
                      batch_size: int | None = None) -> Iterator[list[Candidate]]:
    """Candidates 0..n-1 of one caption in batches (batches never mix captions)."""
    bs = batch_size or settings.batch_size
    for start in range(0, n, bs):
        yield [make_candidate(global_seed, caption_id, i, settings) for i in range(start, min(n, start + bs))]


def generate_set(engine: P2PEngine, base: str, edits: Sequence[str], set_id: str, n: int,
                 global_seed: int = 0) -> Iterator[BatchResult]:
    """Counterfactual *sets* (SocialCounterfactuals §3.3): one base prompt plus K edited prompts per
    batch member group, all sharing the base member's initial latent, sampler noise and attention."""
    if not edits:
        raise ValueError("a counterfactual set needs at least one edited prompt")
    for batch in candidate_batches(global_seed, set_id, n, engine.settings):
        yield engine.generate([base, *edits], batch)


# --------------------------------------------------------------------------- per-caption over-generation

@dataclass
class CaptionOutcome:
    """Everything kept from one caption's over-generation."""

    scores: list[dict]
    selected: list[tuple[int, int, np.ndarray, np.ndarray]]   # (rank, candidate index, image 0, image 1)
    unet_evals: int
    stopped_early: bool
    all_images: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class SelectionSettings:
    top_k: int = 1
    adaptive: bool = False
    target_accepted: int | None = None
    keep_all_images: bool = False

    @property
    def target(self) -> int:
        return self.target_accepted or self.top_k


def overgenerate_caption(engine: P2PEngine, scorer, thresholds, caption_id: str, original: str,
                         counterfactual: str, n: int, global_seed: int, selection: SelectionSettings) -> CaptionOutcome:
    """Generate ``n`` candidate pairs (fewer in adaptive mode), score, filter and select the top k.

    Adaptive mode (our addition, off in paper mode) stops after the first batch at which at least
    ``target_accepted`` (default ``top_k``) candidates have passed the filter.
    """
    from ..filters import apply_thresholds, select_top

    scores: list[dict] = []
    kept: dict[int, tuple[np.ndarray, np.ndarray]] = {}    # images of current top-k (or all)
    all_images: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    evals0 = engine.unet_evals
    n_passed = 0
    stopped = False
    for batch in candidate_batches(global_seed, caption_id, n, engine.settings):
        res = engine.generate([original, counterfactual], batch)
        sc = scorer.score_pairs(original, counterfactual, res.images[:, 0], res.images[:, 1])
        labels = [f"{caption_id}#{c.index}" for c in batch]
        passed, reasons = apply_thresholds(sc, thresholds, labels)
        for j, c in enumerate(batch):
            scores.append({
                "caption_id": caption_id, "candidate_index": c.index, "seed": np.uint64(c.seed),
                "p": c.p, "guidance": c.guidance,
                **{k: float(v[j]) for k, v in sc.items()},
                "passed": bool(passed[j]), "reject_reason": reasons[j],
            })
            if selection.keep_all_images:
                all_images[c.index] = (res.images[j, 0], res.images[j, 1])
            if passed[j]:
                kept[c.index] = (res.images[j, 0], res.images[j, 1])
        n_passed += int(passed.sum())
        # keep only the images that can still be selected (memory stays bounded)
        top = select_top([r["candidate_index"] for r in scores], [r["sim_direction"] for r in scores],
                         [r["passed"] for r in scores], selection.top_k)
        keep_idx = {scores[i]["candidate_index"] for i in top}
        kept = {k: v for k, v in kept.items() if k in keep_idx}
        if selection.adaptive and n_passed >= selection.target and len(scores) < n:
            stopped = True
            break
    top = select_top([r["candidate_index"] for r in scores], [r["sim_direction"] for r in scores],
                     [r["passed"] for r in scores], selection.top_k)
    rank_of = {scores[i]["candidate_index"]: r for r, i in enumerate(top)}
    for r in scores:
        r["selected"] = r["candidate_index"] in rank_of
        r["rank"] = rank_of.get(r["candidate_index"], -1)
    selected = [(rank_of[i], i, *kept[i]) for i in sorted(rank_of, key=rank_of.get)]
    return CaptionOutcome(scores=scores, selected=selected, unet_evals=engine.unet_evals - evals0,
                          stopped_early=stopped, all_images=all_images)


# --------------------------------------------------------------------------- shard runner

PAIR_COLUMNS = ("caption_id", "source_index", "original", "counterfactual")
OPTIONAL_COLUMNS = ("image_id", "original_word", "new_word", "position", "similarity", "perplexity")
_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")

SCORE_SCHEMA = {
    "caption_id": "object", "source_index": "int64", "candidate_index": "int64", "seed": "uint64",
    "p": "float64", "guidance": "float64", "sim_0": "float64", "sim_1": "float64", "sim_image": "float64",
    "sim_direction": "float64", "passed": "bool", "reject_reason": "object", "selected": "bool", "rank": "int64",
}
SELECTED_SCHEMA = {
    "id": "object", "caption_0": "object", "caption_1": "object", "image_0": "object", "image_1": "object",
    "caption_id": "object", "source_index": "int64", "image_id": "object", "original_word": "object",
    "new_word": "object", "rank": "int64", "candidate_index": "int64", "seed": "uint64", "p": "float64",
    "guidance": "float64", "sim_0": "float64", "sim_1": "float64", "sim_image": "float64",
    "sim_direction": "float64",
}


def _frame(rows: list[dict], schema: dict):
    import pandas as pd

    df = pd.DataFrame(rows, columns=list(schema))
    return df.astype(schema) if len(df) else pd.DataFrame({k: pd.Series(dtype=v) for k, v in schema.items()})


def read_pairs(path: str | os.PathLike):
    """Read and check the caption stage's pair table; errors name file, record and fix."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "caption-pair table not found",
                          "run the caption stage first (it writes captions/counterfactual_captions.parquet) "
                          "or pass the right --pairs path")
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types
        raise input_error(path, None, f"not a readable parquet file ({exc})", "rerun the caption stage") from exc
    missing = [c for c in PAIR_COLUMNS if c not in df.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {missing}",
                          f"the caption stage must write columns {list(PAIR_COLUMNS)}")
    for i, row in df.iterrows():
        cid = row["caption_id"]
        if not isinstance(cid, str) or not _ID_PATTERN.match(cid):
            raise input_error(path, i, f"caption_id {cid!r} is not a non-empty [A-Za-z0-9_.-] string "
                              "(it names image files)", "fix the caption ids in the caption stage")
    dup = df["caption_id"][df["caption_id"].duplicated()]
    if len(dup):
        raise input_error(path, int(dup.index[0]), f"duplicate caption_id {dup.iloc[0]!r}",
                          "caption ids must be unique; deduplicate the caption table")
    if df["source_index"].isna().any():
        raise input_error(path, int(df.index[df["source_index"].isna()][0]), "source_index is missing",
                          "every pair needs the row index of its caption in the input caption table")
    return df


def _bad_pair_reason(original: Any, counterfactual: Any) -> str | None:
    for name, text in (("original", original), ("counterfactual", counterfactual)):
        if not isinstance(text, str) or not text.strip():
            return f"empty_prompt:{name}"
    if " ".join(original.split()).lower() == " ".join(counterfactual.split()).lower():
        return "identical_pair"
    return None


def _png_bytes(image: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def _write_bytes(target: Path, data: bytes) -> None:
    from ..io import atomic_path

    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class ShardContext:
    cfg: dict
    settings: GenerationSettings
    thresholds: Any
    selection: SelectionSettings
    n_candidates: int
    global_seed: int
    models: dict


def _shard_context(cfg: dict) -> ShardContext:
    from ..filters import FilterThresholds
    from ..models import registry

    images = cfg.get("images", {})
    filt = images.get("filter", {})
    adaptive = images.get("adaptive", {})
    settings = GenerationSettings.from_config(images)
    selection = SelectionSettings(
        top_k=int(filt.get("top_k", 1)),
        adaptive=bool(adaptive.get("enabled", False)),
        target_accepted=adaptive.get("target_accepted"),
        keep_all_images=bool(images.get("save_all_candidates", False)),
    )
    try:
        models = {k: v for k, v in registry.configured_models(cfg).items() if k in ("sd", "clip_filter")}
    except Exception:  # pragma: no cover - provenance only
        models = {}
    return ShardContext(cfg=cfg, settings=settings, thresholds=FilterThresholds.from_config(filt),
                        selection=selection, n_candidates=int(images.get("candidates_per_pair", 100)),
                        global_seed=int(cfg.get("seed", 0)), models=models)


def _caption_fingerprint(ctx: ShardContext, row: dict) -> str:
    return _fingerprint({
        "settings": asdict(ctx.settings), "thresholds": asdict(ctx.thresholds),
        "selection": asdict(ctx.selection), "n": ctx.n_candidates, "seed": ctx.global_seed,
        "models": ctx.models, "caption_id": row["caption_id"], "original": row["original"],
        "counterfactual": row["counterfactual"], "version": 1,
    })


def _release_id(caption_id: str, rank: int, top_k: int) -> str:
    return caption_id if top_k == 1 else f"{caption_id}_{rank}"


def run_shard(cfg: dict, pairs_path: str | os.PathLike, shard: int | str, out_dir: str | os.PathLike, *,
              engine: P2PEngine | None = None, scorer=None,
              hook: Callable[[int, str], None] | None = None, progress: bool = True) -> dict:
    """Over-generate, filter and select every caption pair of one shard; write the shard's outputs.

    Outputs in ``out_dir``: ``images/{id}_img_{0|1}.png`` (plus ``images/candidates/`` when
    ``images.save_all_candidates``), ``selected_pairs.parquet``, ``candidate_scores.parquet`` and
    ``summary.json``. Finished captions are cached in ``out_dir/work/<caption_id>/`` (``done.json``
    written last); a rerun reuses them, so an interrupted shard resumes where it stopped. ``hook(k,
    caption_id)`` is called after the k-th caption of the shard is cached (tests use it to simulate a
    kill).
    """
    from tqdm import tqdm

    from ..io import write_json, write_parquet

    ctx = _shard_context(cfg)
    if engine is not None and engine.settings != ctx.settings:
        raise ValueError(f"the engine's settings {engine.settings} differ from the config's {ctx.settings}")
    shard_idx = int(shard)
    size = int(cfg.get("images", {}).get("shard_size", 50))
    lo, hi = shard_idx * size, (shard_idx + 1) * size
    pairs_path = Path(pairs_path)
    df = read_pairs(pairs_path)
    part = df[(df["source_index"] >= lo) & (df["source_index"] < hi)].sort_values(
        ["source_index", "caption_id"], kind="mergesort")
    out_dir = Path(out_dir)
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    top_k = ctx.selection.top_k

    rows = [dict(r) for _, r in part.iterrows()]
    rejected = []
    todo = []
    for r in rows:
        reason = _bad_pair_reason(r["original"], r["counterfactual"])
        if reason:
            log.warning("%s, caption_id %s: rejected (%s); original=%r counterfactual=%r", pairs_path,
                        r["caption_id"], reason, r["original"], r["counterfactual"])
            rejected.append({"caption_id": r["caption_id"], "source_index": int(r["source_index"]), "reason": reason})
        else:
            todo.append(r)
    log.info("shard %05d: captions with source_index in [%d, %d): %d pairs, %d rejected as bad input",
             shard_idx, lo, hi, len(rows), len(rejected))

    import sys

    # in a log file (Snakemake's per-shard log) update at most every 10 s instead of every second
    bar = tqdm(todo, desc=f"images shard {shard_idx:05d}", unit="caption", disable=not progress,
               mininterval=1.0 if sys.stderr.isatty() else 10.0)
    for k, r in enumerate(bar):
        cid = r["caption_id"]
        cdir = work / cid
        fp = _caption_fingerprint(ctx, r)
        done = cdir / "done.json"
        if done.exists():
            try:
                if json.loads(done.read_text())["fingerprint"] == fp:
                    log.info("caption %s: cached, skipped", cid)
                    continue
            except (ValueError, KeyError):
                pass
            log.info("caption %s: cache is stale or unreadable, regenerating", cid)
        if cdir.exists():
            shutil.rmtree(cdir)
        if engine is None:
            engine = build_engine(cfg)
        if scorer is None:
            from ..filters import ClipScorer

            scorer = ClipScorer.from_config(cfg, batch_size=int(cfg.get("images", {}).get("filter", {}).get("batch_size", 32)))
        outcome = overgenerate_caption(engine, scorer, ctx.thresholds, cid, r["original"], r["counterfactual"],
                                       ctx.n_candidates, ctx.global_seed, ctx.selection)
        for s in outcome.scores:
            s["source_index"] = int(r["source_index"])
        for rank, idx, im0, im1 in outcome.selected:
            _write_bytes(cdir / f"sel_{rank}_img_0.png", _png_bytes(im0))
            _write_bytes(cdir / f"sel_{rank}_img_1.png", _png_bytes(im1))
        for idx, (im0, im1) in sorted(outcome.all_images.items()):
            _write_bytes(cdir / "candidates" / f"c{idx:04d}_img_0.png", _png_bytes(im0))
            _write_bytes(cdir / "candidates" / f"c{idx:04d}_img_1.png", _png_bytes(im1))
        write_parquet(cdir / "scores.parquet", _frame(outcome.scores, SCORE_SCHEMA))
        n_pass = sum(s["passed"] for s in outcome.scores)
        write_json(done, {"fingerprint": fp, "candidates": len(outcome.scores), "passed": n_pass,
                          "selected": len(outcome.selected), "unet_evals": outcome.unet_evals,
                          "stopped_early": outcome.stopped_early})
        if n_pass == 0:
            log.info("caption %s: none of %d candidates passed the CLIP filter", cid, len(outcome.scores))
        bar.set_postfix(passed=n_pass)
        if hook is not None:
            hook(k, cid)

    return _assemble_shard(ctx, shard_idx, (lo, hi), todo, rejected, work, out_dir, top_k)


def _assemble_shard(ctx: ShardContext, shard_idx: int, bounds: tuple[int, int], todo: list[dict],
                    rejected: list[dict], work: Path, out_dir: Path, top_k: int) -> dict:
    """Build the shard's outputs from the per-caption cache, deterministically (source_index order)."""
    import pandas as pd

    from ..io import atomic_dir, write_json, write_parquet

    out_dir.mkdir(parents=True, exist_ok=True)
    score_frames, selected_rows = [], []
    totals = {"candidates_generated": 0, "candidates_passed": 0, "unet_evals": 0, "stopped_early": 0}
    with atomic_dir(out_dir / "images") as tmp_images:
        for r in todo:
            cid = r["caption_id"]
            cdir = work / cid
            meta = json.loads((cdir / "done.json").read_text())
            scores = pd.read_parquet(cdir / "scores.parquet")
            score_frames.append(scores)
            totals["candidates_generated"] += meta["candidates"]
            totals["candidates_passed"] += meta["passed"]
            totals["unet_evals"] += meta["unet_evals"]
            totals["stopped_early"] += int(meta["stopped_early"])
            for s in scores[scores["selected"]].sort_values("rank").to_dict("records"):
                rank = int(s["rank"])
                rid = _release_id(cid, rank, top_k)
                names = []
                for g in (0, 1):
                    name = f"{rid}_img_{g}.png"
                    shutil.copyfile(cdir / f"sel_{rank}_img_{g}.png", tmp_images / name)
                    names.append(f"images/{name}")
                selected_rows.append({
                    "id": rid, "caption_0": r["original"], "caption_1": r["counterfactual"],
                    "image_0": names[0], "image_1": names[1], "caption_id": cid,
                    "source_index": int(r["source_index"]),
                    **{c: (None if pd.isna(r.get(c)) else str(r.get(c))) for c in ("image_id", "original_word", "new_word")},
                    "rank": rank, **{c: s[c] for c in ("candidate_index", "seed", "p", "guidance", "sim_0", "sim_1",
                                                      "sim_image", "sim_direction")},
                })
            cand_dir = cdir / "candidates"
            if cand_dir.exists():
                dest = tmp_images / "candidates" / cid
                dest.mkdir(parents=True, exist_ok=True)
                for f in sorted(cand_dir.iterdir()):
                    shutil.copyfile(f, dest / f.name)

    scores_df = (pd.concat(score_frames, ignore_index=True) if score_frames else _frame([], SCORE_SCHEMA))
    scores_df = scores_df[list(SCORE_SCHEMA)].astype(SCORE_SCHEMA)
    selected_df = _frame(selected_rows, SELECTED_SCHEMA)
    write_parquet(out_dir / "candidate_scores.parquet", scores_df)
    write_parquet(out_dir / "selected_pairs.parquet", selected_df)
    with_sel = selected_df["caption_id"].nunique() if len(selected_df) else 0
    summary = {
        "shard": shard_idx, "source_index_range": list(bounds),
        "captions": len(todo) + len(rejected), "captions_rejected": len(rejected),
        "rejected_captions": rejected, "captions_generated": len(todo),
        "captions_with_selection": int(with_sel), "pairs_selected": len(selected_df),
        **totals,
        "unet_evals_per_selected_pair": (totals["unet_evals"] / len(selected_df)) if len(selected_df) else None,
        "adaptive": ctx.selection.adaptive, "top_k": top_k, "candidates_per_pair": ctx.n_candidates,
        "attention_control": ctx.settings.control, "steps": ctx.settings.steps,
    }
    write_json(out_dir / "summary.json", summary)
    if not bool(ctx.cfg.get("images", {}).get("keep_work", False)):
        shutil.rmtree(work, ignore_errors=True)
    log.info("shard %05d: %d pairs selected from %d captions (%d candidates, %d passed, %d UNet evaluations)",
             shard_idx, len(selected_df), len(todo), totals["candidates_generated"], totals["candidates_passed"],
             totals["unet_evals"])
    return summary


def merge_shards(shard_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> dict:
    """Concatenate shard outputs (sorted by source_index); image paths become relative to ``out_dir``."""
    import pandas as pd

    from ..io import write_json, write_parquet

    out_dir = Path(out_dir)
    sel_frames, score_frames, summaries = [], [], []
    for d in shard_dirs:
        d = Path(d)
        for name in ("selected_pairs.parquet", "candidate_scores.parquet", "summary.json"):
            if not (d / name).exists():
                raise input_error(d / name, None, "shard output missing",
                                  "rerun that shard's `counterfactory images generate` job (snakemake does this)")
        rel = os.path.relpath(d, out_dir).replace(os.sep, "/")
        sel = pd.read_parquet(d / "selected_pairs.parquet")
        for col in ("image_0", "image_1"):
            sel[col] = [f"{rel}/{p}" for p in sel[col]]
        sel_frames.append(sel)
        score_frames.append(pd.read_parquet(d / "candidate_scores.parquet"))
        summaries.append(json.loads((d / "summary.json").read_text()))
    sel = pd.concat(sel_frames, ignore_index=True) if sel_frames else _frame([], SELECTED_SCHEMA)
    scores = pd.concat(score_frames, ignore_index=True) if score_frames else _frame([], SCORE_SCHEMA)
    sel = sel.sort_values(["source_index", "rank"], kind="mergesort").reset_index(drop=True).astype(SELECTED_SCHEMA)
    scores = scores.sort_values(["source_index", "candidate_index"], kind="mergesort").reset_index(drop=True)
    scores = scores.astype(SCORE_SCHEMA)
    if sel["id"].duplicated().any():
        raise input_error(out_dir, None, f"duplicate pair id {sel['id'][sel['id'].duplicated()].iloc[0]!r} across shards",
                          "two shards hold the same caption; rerun the image stage with one shard size")
    write_parquet(out_dir / "selected_pairs.parquet", sel)
    write_parquet(out_dir / "candidate_scores.parquet", scores)
    keys = ("captions", "captions_rejected", "captions_generated", "captions_with_selection", "pairs_selected",
            "candidates_generated", "candidates_passed", "unet_evals", "stopped_early")
    summary = {k: int(sum(s.get(k, 0) for s in summaries)) for k in keys}
    summary["shards"] = len(summaries)
    summary["rejected_captions"] = [r for s in summaries for r in s.get("rejected_captions", [])]
    summary["unet_evals_per_selected_pair"] = (summary["unet_evals"] / summary["pairs_selected"]
                                               if summary["pairs_selected"] else None)
    write_json(out_dir / "summary.json", summary)
    return summary
