"""CVLD image editing: m edits per example, the Swin top-k filter, and the resumable shard runner.

CVLD §3.3 ("Image editing") edits every real image either with InstructPix2Pix (``ip2p``, role ``editor``: an edit
instruction such as "turn the man into a woman") or with null-text inversion + Prompt-to-Prompt (``null_text``,
role ``sd``: a source and a target caption; :mod:`.inversion`). Because single edits are unreliable, each
example is edited ``m`` times and the ``k`` candidates whose pooled image features (role ``image_encoder``, a
pre-trained Swin transformer) are closest in cosine similarity to the original image are kept; §5.1: m = 10,
k = 3. §3.3 "Image-only intervention" (CelebA) uses the same procedure with manual prompts.

The m candidates of an example differ by a seed and by parameters drawn from it (:func:`edit_params`); the seed is
a function of ``(global_seed, item id, j)`` only (:func:`~.selection.candidate_seed`), so results do not depend on
batch size, shard layout or thread count:

* ``ip2p``: text guidance ``guidance_scale ~ U[5, 10]`` and image guidance ``image_guidance_scale ~ U[1.0, 2.0]``,
  the ranges InstructPix2Pix's authors suggest exploring (its defaults 7.5 and 1.5 lie inside); the seed also
  fixes the initial latent and the ancestral sampler's noise (one ``torch.Generator`` per candidate).
* ``null_text``: the fraction of steps with cross-attention replaced ``cross ~ U[0.2, 0.8]`` and with
  self-attention replaced ``self ~ U[0.2, 0.6]`` (ours; Hertz et al. tune these per edit); the inversion is shared
  by all m candidates (and cached on disk).

:func:`ip2p_edit` runs InstructPix2Pix with our own denoising loop around the pipeline's modules (the pipeline's
``__call__`` takes one guidance pair per call; here every candidate has its own), with the same classifier-free
guidance as diffusers' ``StableDiffusionInstructPix2PixPipeline`` (rows: text+image, image only, neither;
``eps = e_none + g_text (e_text - e_image) + g_image (e_image - e_none)``; image latents = the VAE posterior's mode,
unscaled) and the pipeline's scheduler (Euler ancestral for InstructPix2Pix). ``steps`` defaults to 100, the
pipeline's default; the image size to 512 (ours; images are resized to a square, aspect not kept).

:func:`edit_shard` writes the k kept images ``OUT_DIR/<item_id>_<rank>.png`` (rank 0 = most similar) atomically,
each with a ``counterfactory-edit`` PNG text chunk holding the item's key (method, settings, model fingerprints,
the source image's sha256 and prompts) plus its rank, and a ``counterfactory-edit-rows`` chunk with the item's
candidate rows; a rerun skips an item whose k PNGs verify with the expected key (and takes its manifest rows from
them), and redoes it otherwise (the shared :mod:`.runner` with a :class:`.runner.PngKeyCache`).
``OUT_DIR/shard.parquet`` has one row per candidate (:data:`MANIFEST_SCHEMA`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..device import resolve_device
from ..errors import ConfigError, input_error
from ..io import write_parquet
from ..models import loaders_editing  # noqa: F401  (registers the editor / image_encoder loaders)
from ..models import registry
from ..models.registry import fingerprint
from ..settings import schema_default, schema_defaults
from . import runner
from .inpaint_inputs import _read_image, _resolve, item_rows
from .inversion import (InversionSettings, decode, embed, fit_image, model_fingerprint, null_text_invert, p2p_edit,
                        to_tensor)
from .selection import candidate_seed

log = logging.getLogger(__name__)

METHODS = ("ip2p", "null_text")
#: other names accepted for a method
ALIASES = {"p2p": "null_text", "instructpix2pix": "ip2p"}
KEY_FIELD = "counterfactory-edit"
ROWS_FIELD = "counterfactory-edit-rows"
MANIFEST_SCHEMA = {"item_id": "object", "candidate": "int64", "seed": "int64", "params": "object",
                   "similarity": "float64", "kept": "bool", "rank": "int64", "path": "object"}


@dataclass(frozen=True)
@schema_defaults("cvld.editing.settings")
class EditSettings:
    """Editing settings (module docstring), defaults the schema's (``cvld.editing.settings``, ``m`` and ``k`` of
    ``cvld.editing``): m = 10 and k = 3 from §5.1; ``steps`` (InstructPix2Pix sampling steps,
    the pipeline's default 100); ``size`` (square working resolution, ours); the parameter ranges; the null-text
    settings of Mokady et al. 2023 (50 DDIM steps, guidance 7.5, 10 Adam iterations at lr 1e-2, early stop at
    ``1e-5 + i * 2e-5``); ``save_all`` also writes dropped candidates; ``global_seed`` salts every seed."""

    m: int = schema_default("cvld.editing.m")
    k: int = schema_default("cvld.editing.k")
    size: int
    steps: int
    guidance_range: tuple[float, float]
    image_guidance_range: tuple[float, float]
    cross_range: tuple[float, float]
    self_range: tuple[float, float]
    inversion_steps: int
    null_guidance: float
    inner_steps: int
    null_lr: float
    null_epsilon: float
    null_epsilon_step: float
    save_all: bool
    global_seed: int

    def __post_init__(self):
        if self.m < 1 or self.k < 1:
            raise ConfigError(f"editing: m = {self.m}, k = {self.k}. Fix: use positive numbers (the paper: 10 and 3)")
        if self.k > self.m:
            raise ConfigError(f"editing: k = {self.k} is above m = {self.m}. Fix: keep k <= m (the paper: 3 of 10)")
        for name in ("guidance_range", "image_guidance_range", "cross_range", "self_range"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ConfigError(f"editing.settings.{name}: [{lo}, {hi}]. Fix: write [low, high]")
        if self.size % 8 or self.steps < 1:
            raise ConfigError(f"editing.settings: size {self.size} must be a multiple of 8 and steps >= 1")

    @classmethod
    def from_config(cls, section: dict | None) -> "EditSettings":
        """Settings from a config section (``cvld.editing.settings`` plus optional ``m``/``k``); unknown keys
        are an error naming them."""
        section = dict(section or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(f"editing settings: unknown keys {unknown}. Fix: use only {sorted(known)}")
        for name in ("guidance_range", "image_guidance_range", "cross_range", "self_range"):
            if name in section:
                section[name] = tuple(float(x) for x in section[name])
        return cls(**section)

    def inversion(self) -> InversionSettings:
        """The null-text inversion settings."""
        return InversionSettings(steps=self.inversion_steps, guidance=self.null_guidance, inner_steps=self.inner_steps,
                                 lr=self.null_lr, epsilon=self.null_epsilon, epsilon_step=self.null_epsilon_step,
                                 size=self.size)

    def relevant(self, method: str) -> dict:
        """The settings that change ``method``'s candidates (part of each item's key)."""
        shared = {"m": self.m, "size": self.size, "global_seed": self.global_seed}
        if method == "ip2p":
            return {**shared, "steps": self.steps, "guidance_range": self.guidance_range,
                    "image_guidance_range": self.image_guidance_range}
        return {**shared, "cross_range": self.cross_range, "self_range": self.self_range,
                "inversion": asdict(self.inversion())}


def check_method(method: str) -> str:
    method = ALIASES.get(method, method)
    if method not in METHODS:
        raise ConfigError(f"editing method {method!r} is unknown. Fix: use one of {', '.join(METHODS)}")
    return method


def edit_params(item_id: str, j: int, settings: EditSettings, method: str) -> dict:
    """Seed and parameters of candidate ``j`` of ``item_id``: ``{"seed", "guidance_scale", "image_guidance_scale"}``
    (ip2p) or ``{"seed", "cross", "self"}`` (null_text), drawn from the seed (module docstring)."""
    seed = candidate_seed(settings.global_seed, str(item_id), j)
    rng = np.random.Generator(np.random.PCG64(seed))
    if check_method(method) == "ip2p":
        return {"seed": seed, "guidance_scale": float(rng.uniform(*settings.guidance_range)),
                "image_guidance_scale": float(rng.uniform(*settings.image_guidance_range))}
    return {"seed": seed, "cross": float(rng.uniform(*settings.cross_range)),
            "self": float(rng.uniform(*settings.self_range))}


# --------------------------------------------------------------------------- InstructPix2Pix


@torch.no_grad()
def ip2p_edit(pipe, images: Sequence[np.ndarray], prompts: Sequence[str], seeds: Sequence[int],
              settings: EditSettings | None = None, params: Sequence[dict] | None = None) -> list[np.ndarray]:
    """InstructPix2Pix edits of ``images`` (``uint8`` RGB, resized to ``settings.size``) by ``prompts``, one batch.
    Item ``i`` draws its initial latent and sampler noise from ``torch.Generator().manual_seed(seeds[i])`` and uses
    ``params[i]["guidance_scale"]`` / ``["image_guidance_scale"]`` (default 7.5 / 1.5, the pipeline's), so its
    result does not depend on the rest of the batch. Returns ``uint8`` images."""
    s = settings or EditSettings()
    n = len(images)
    if not (n == len(prompts) == len(seeds)) or (params is not None and len(params) != n):
        raise ValueError(f"ip2p_edit: {n} images, {len(prompts)} prompts, {len(seeds)} seeds"
                         + ("" if params is None else f", {len(params)} params") + " -- give one of each per item")
    if n == 0:
        return []

    params = list(params) if params is not None else [{}] * n
    unet, vae = pipe.unet, pipe.vae
    dev, dtype = unet.device, unet.dtype
    x = to_tensor([fit_image(im, s.size) for im in images], dev, dtype)
    image_latents = vae.encode(x).latent_dist.mode()
    cond = torch.cat([embed(pipe, p)[1] for p in prompts])
    none = embed(pipe, "")[1].expand(n, -1, -1)
    text = torch.cat([cond, none, none])
    image_rows = torch.cat([image_latents, image_latents, torch.zeros_like(image_latents)])
    shape = lambda key, default: torch.tensor([float(p.get(key, default)) for p in params],  # noqa: E731
                                              device=dev, dtype=dtype).view(-1, 1, 1, 1)
    g_text, g_image = shape("guidance_scale", 7.5), shape("image_guidance_scale", 1.5)

    sched = pipe.scheduler.__class__.from_config(pipe.scheduler.config)
    sched.set_timesteps(s.steps, device=dev)
    gens = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    latent_shape = (1, vae.config.latent_channels, *image_latents.shape[2:])
    latents = torch.cat([torch.randn(latent_shape, generator=g) for g in gens]).to(dev, dtype)
    latents = latents * sched.init_noise_sigma
    for t in sched.timesteps:
        model_in = sched.scale_model_input(torch.cat([latents] * 3), t)
        eps = unet(torch.cat([model_in, image_rows], dim=1), t, encoder_hidden_states=text).sample
        e_text, e_image, e_none = eps.chunk(3)
        eps = e_none + g_text * (e_text - e_image) + g_image * (e_image - e_none)
        latents = sched.step(eps, t, latents, generator=gens).prev_sample
    return decode(vae, latents)


# --------------------------------------------------------------------------- top-k by Swin similarity


def rank_by_similarity(original: torch.Tensor | np.ndarray, candidates: torch.Tensor | np.ndarray, k: int
                       ) -> tuple[list[int], np.ndarray]:
    """Indices of the ``k`` candidate feature rows with the highest cosine similarity to ``original`` (highest
    first; ties -- similarities equal to 12 decimals, so that scaled copies of one feature tie despite float
    rounding -- broken by the lower index) and all similarities (float64, candidate order)."""
    o = torch.as_tensor(np.asarray(original), dtype=torch.float64).reshape(1, -1)
    c = torch.as_tensor(np.asarray(candidates), dtype=torch.float64).reshape(len(candidates), -1)
    sims = torch.nn.functional.cosine_similarity(c, o, dim=1).numpy()
    rounded = np.round(sims, 12)
    order = sorted(range(len(sims)), key=lambda i: (-rounded[i], i))
    return order[:k], sims


@torch.no_grad()
def image_features(encoder, processor, images: Sequence[np.ndarray]) -> torch.Tensor:
    """Pooled features (``pooler_output``: Swin's average-pooled last stage; else the token mean) of ``images``."""
    inputs = processor(images=list(images), return_tensors="pt")
    out = encoder(pixel_values=inputs["pixel_values"].to(encoder.device, encoder.dtype))
    pooled = getattr(out, "pooler_output", None)
    return (pooled if pooled is not None else out.last_hidden_state.mean(dim=1)).float().cpu()


def select_top_k(encoder, processor, original: np.ndarray, candidates: Sequence[np.ndarray], k: int
                 ) -> tuple[list[int], np.ndarray]:
    """The ``k`` candidates closest to ``original`` by cosine similarity of pooled image-encoder features (§3.3,
    §5.1): ``(indices, similarities of all candidates)``."""
    feats = image_features(encoder, processor, [original, *candidates])
    return rank_by_similarity(feats[0], feats[1:], k)


# --------------------------------------------------------------------------- shards


def _check_items(items, method: str, source: str) -> list[dict]:
    prompts = ["edit_prompt"] if method == "ip2p" else ["source_prompt", "target_prompt"]
    missing = [c for c in ("item_id", "image_path", *prompts) if c not in items.columns]
    if missing:
        raise input_error(source, None, f"missing columns {missing} for method {method}",
                          f"give item_id, image_path and {' and '.join(prompts)}")
    rows = item_rows(items, source)
    for i, row in enumerate(rows):
        for col in prompts:
            if not isinstance(row[col], str) or not row[col].strip():
                raise input_error(source, f"{i} (item {row['item_id']})", f"{col} is empty ({row[col]!r})",
                                  f"give a non-empty {col}, or drop the item")
    return rows


def _item_key(method: str, s: EditSettings, model_ids: dict, image_sha: str, row: dict) -> str:
    prompts = {c: row[c] for c in ("edit_prompt", "source_prompt", "target_prompt") if c in row}
    payload = {"method": method, "settings": s.relevant(method), "models": model_ids, "image": image_sha,
               "prompts": prompts, "item_id": row["item_id"]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


_PNG = runner.PngKeyCache(KEY_FIELD)


def _verified_rows(paths: list[Path], key: str, size: int) -> list[dict] | None:
    """The candidate rows stored in an item's PNGs when every one is complete and carries ``key`` (+ rank)."""
    rows = None
    try:
        for rank, path in enumerate(paths):
            info = _PNG.read(path, f"{key}:{rank}", (size, size))
            if info is None:
                return None
            rows = rows or json.loads(info.get(ROWS_FIELD))
        return rows
    except (ValueError, TypeError):
        return None


def _write_png(path: Path, image: np.ndarray, key: str, rows_json: str) -> None:
    _PNG.write(path, image, key, {ROWS_FIELD: rows_json})


def _finish_item(item: dict, candidates: list[np.ndarray], encoder, processor, s: EditSettings, out_dir: Path
                 ) -> list[dict]:
    """Score an item's m candidates, write the k kept (and, with ``save_all``, the dropped ones); its rows."""
    kept, sims = select_top_k(encoder, processor, item["image"], candidates, s.k)
    rank_of = {j: r for r, j in enumerate(kept)}
    rows = []
    for j, params in enumerate(item["params"]):
        rank = rank_of.get(j, -1)
        name = f"{item['item_id']}_{rank}.png" if rank >= 0 else (
            f"{item['item_id']}_c{j}.png" if s.save_all else "")
        rows.append({"item_id": item["item_id"], "candidate": j, "seed": params["seed"],
                     "params": json.dumps({k: v for k, v in params.items() if k != "seed"}, sort_keys=True),
                     "similarity": float(sims[j]), "kept": rank >= 0, "rank": rank, "path": name})
    text = json.dumps(rows, sort_keys=True)
    for j in ([*range(len(candidates))] if s.save_all else kept):
        rank = rank_of.get(j, -1)
        if rank < 0:
            _write_png(out_dir / rows[j]["path"], candidates[j], f"{item['key']}:dropped", text)
    for rank, j in enumerate(kept):   # the kept PNGs last: their presence marks the item done
        _write_png(out_dir / rows[j]["path"], candidates[j], f"{item['key']}:{rank}", text)
    return rows


def _load(cfg: dict | None, role: str, device, dtype=None):
    if cfg is None:
        raise ConfigError(f"editing needs the {role} model: pass it or a cfg with models.{role}")

    return registry.load(cfg, role, device=device, **({"dtype": dtype} if dtype is not None else {}))


class EditStage(runner.ShardStage):
    """CVLD editing on the shard runner: items are the rows plus ``image`` (fitted) and ``key``; an item is done
    when its k kept PNGs verify with its key (their rows chunk gives its manifest rows). ``ip2p`` batches
    ``batch_size`` candidates across items (an item completes with its last candidate); ``null_text`` runs one
    item per batch (its inversion, then its candidates ``batch_size`` at a time)."""

    def __init__(self, method: str, s: EditSettings, pipe, encoder: tuple, batch_size: int, out_dir: Path,
                 cache: Path):
        self.method, self.s, self.pipe, self.encoder = method, s, pipe, encoder
        self.batch_size, self.out_dir, self.cache = batch_size, out_dir, cache
        self.manifest: dict[str, list[dict]] = {}
        self.partial: dict[str, list] = {}
        self.made = 0

    def key(self, item):
        return item["key"]

    def is_done(self, item, key):
        paths = [self.out_dir / f"{item['item_id']}_{r}.png" for r in range(self.s.k)]
        done = _verified_rows(paths, key, self.s.size)
        if done is not None:
            self.manifest[item["item_id"]] = done
        return done is not None

    def plan(self, items):
        s = self.s
        for item in items:
            item["params"] = [edit_params(item["item_id"], j, s, self.method) for j in range(s.m)]
        if self.method != "ip2p":
            return [[item] for item in items]
        flat = [(item, j) for item in items for j in range(s.m)]
        return [flat[lo:lo + self.batch_size] for lo in range(0, len(flat), self.batch_size)]

    def generate(self, batch):
        s = self.s
        if self.method == "ip2p":
            out = ip2p_edit(self.pipe, [it["image"] for it, _ in batch], [it["edit_prompt"] for it, _ in batch],
                            [it["params"][j]["seed"] for it, j in batch], s, [it["params"][j] for it, j in batch])
            self.made += len(batch)
            for (item, j), image in zip(batch, out):
                self.partial.setdefault(item["item_id"], [None] * s.m)[j] = image
                if j == s.m - 1:   # an item's candidates are consecutive: the last one completes it
                    yield item, self.partial.pop(item["item_id"])
            return
        for item in batch:
            inv = null_text_invert(self.pipe, item["image"], item["source_prompt"], s, cache_dir=self.cache)
            candidates = []
            for lo in range(0, s.m, self.batch_size):
                candidates += p2p_edit(self.pipe, inv, item["source_prompt"], item["target_prompt"],
                                       item["params"][lo:lo + self.batch_size])
            self.made += s.m
            yield item, candidates

    def store(self, item, key, candidates):
        self.manifest[item["item_id"]] = _finish_item(item, candidates, *self.encoder, self.s, self.out_dir)


@runner.locks_shard
def edit_shard(items, method: str, out_dir: str | os.PathLike, cfg: dict | None = None,
               settings: EditSettings | None = None, batch_size: int = 10, device: Any = "auto",
               cache_dir: str | os.PathLike | None = None, progress: bool = True, *, editor=None, encoder=None,
               image_root: str | os.PathLike | None = None, source: str = "<items>",
               hook: Callable[[int, str], None] | None = None, dtype: torch.dtype = torch.float32) -> dict:
    """Edit every row of ``items`` (DataFrame: ``item_id``, ``image_path`` and ``edit_prompt`` for ``ip2p`` or
    ``source_prompt``/``target_prompt`` for ``null_text``) m times, keep the k most similar to the original, and
    write ``OUT_DIR/<item_id>_<rank>.png`` and ``OUT_DIR/shard.parquet`` (module docstring).

    ``editor`` (an InstructPix2Pix or Stable Diffusion pipeline) and ``encoder`` (``(model, processor)``) default to
    roles ``editor``/``sd`` (weights read in ``dtype``, default fp32: the stage has no precision setting and runs
    in the dtype it loads) and ``image_encoder`` loaded from ``cfg`` on ``device``. ``batch_size`` candidates go
    through the UNet together (ip2p mixes items; null_text batches one item's candidates). Inversions are cached
    in ``cache_dir`` (default ``OUT_DIR/.inversions``). ``hook(n, item_id)`` runs after the n-th newly written item.
    Returns ``{"items", "written", "skipped", "candidates", "method"}``."""
    method = check_method(method)
    s = settings or EditSettings()
    if batch_size < 1:
        raise ConfigError(f"editing batch_size {batch_size}. Fix: use 1 or more")
    rows = _check_items(items, method, source)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = device if isinstance(device, torch.device) else resolve_device(str(device))
    pipe = editor if editor is not None else _load(cfg, "editor" if method == "ip2p" else "sd", dev, dtype).to(dev)
    enc_model, enc_proc = encoder if encoder is not None else _load(cfg, "image_encoder", dev)
    enc_model = enc_model.to(dev)
    model_ids = {"editor": model_fingerprint(pipe), "image_encoder": _encoder_id(enc_model)}
    root = Path(image_root) if image_root is not None else None
    cache = Path(cache_dir) if cache_dir is not None else out_dir / ".inversions"

    stage = EditStage(method, s, pipe, (enc_model, enc_proc), batch_size, out_dir, cache)
    with runner.progress_bar(len(rows), f"edit ({method})", "image", progress) as bar:
        items = []
        for row in rows:
            image, data = _read_image(_resolve(row["image_path"], root), source, row["item_id"])
            key = _item_key(method, s, model_ids, hashlib.sha256(data).hexdigest(), row)
            items.append({**row, "image": fit_image(image, s.size), "key": key})
        stats = runner.run_stage(stage, items, hook=hook, bar=bar)
    write_parquet(out_dir / "shard.parquet",
                  runner.frame([r for row in rows for r in stage.manifest[row["item_id"]]], MANIFEST_SCHEMA))
    return {"items": len(rows), "written": stats.generated, "skipped": stats.skipped, "candidates": stage.made,
            "method": method}


def merge_manifests(shard_manifests: Sequence[str | os.PathLike], out: str | os.PathLike) -> int:
    """Concatenate edit shard manifests (``<method>/<shard>/shard.parquet``, in the order given) into one manifest
    ``out`` in their parent folder (``<method>/edits.parquet``), each ``path`` prefixed with its shard's folder so
    that it stays relative to the manifest; returns the row count. A training run then reads one file instead of
    one per shard (the DAG has one edge per run, not one per run and shard)."""
    import pandas as pd

    out = Path(out)
    frames = []
    for path in shard_manifests:
        path = Path(path)
        if path.parent.parent.resolve() != out.parent.resolve():
            raise ConfigError(f"{path}: not a shard of {out.parent} (<method>/<shard>/shard.parquet). Fix: merge "
                              "the shards of one method into that method's folder")
        frame = pd.read_parquet(path)
        frame["path"] = [f"{path.parent.name}/{Path(str(p)).name}" for p in frame["path"]]
        frames.append(frame)
    merged = (pd.concat(frames, ignore_index=True) if frames
              else pd.DataFrame({k: pd.Series(dtype=v) for k, v in MANIFEST_SCHEMA.items()}))
    write_parquet(out, merged)
    return len(merged)


def _encoder_id(model) -> str:
    path = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
    if path and Path(path).is_dir():
        return fingerprint(path)
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode() + tensor.detach().float().cpu().numpy().tobytes())
    return "weights:" + digest.hexdigest()


__all__ = ["EditSettings", "KEY_FIELD", "MANIFEST_SCHEMA", "METHODS", "check_method", "edit_params", "edit_shard",
           "image_features", "ip2p_edit", "rank_by_similarity", "select_top_k"]
