"""Sharded, resumable over-generation of counterfactual image *sets* (SocialCounterfactuals §3.3).

A caption set holds every caption of one (prefix, subject) for one attribute-type pair (§3.2): member 0
is the base caption, members 1..G-1 the counterfactual captions. For every set we over-generate ``n``
candidate sets (§3.3, §8.4: 100 per set; 5,408,000 images for 54,080 captions) with Prompt-to-Prompt:
each candidate draws ``p ~ U(0.1, 0.9)`` and, following the InstructPix2Pix generator that §3.3 adopts,
guidance ``~ U(7.5, 15)``; all G members of a candidate share its seed, initial latent, sampler noise and
the base member's self-attention, and are denoised in one batched UNet call (the "batched generation of
multiple images with cross attention control" of §3.3). Several candidate sets share a call
(``images.batch_size``, capped by ``images.max_images_per_call``). Candidates are not filtered here:
the three-stage filter of §3.4 / §8.3 is a separate step that reads ``candidates.parquet``, and by
default every set gets exactly ``n`` candidates, as in the paper.

Adaptive mode (ours; ``images.adaptive.enabled``, off in the paper config). After each batch of candidate
sets, the batch is scored with the CLIP stage of the filter (:func:`~counterfactory.studies.
social_counterfactuals.filtering.clip_stage`, ``filter.clip`` thresholds and model role), and the caption
set stops once ``images.adaptive.target`` of its candidate sets have passed. The candidates made are
exactly the non-adaptive run's up to the stopping batch (same seeds, same batches), so a set's outputs are
a prefix of the full run's; all of them (passed or not) are still written, and the filter step scores
them again as usual. Since the CLIP settings and model then decide which candidates exist, they enter the
config digest and the resume fingerprint, in adaptive mode only.

Shards. Sets are ordered by ``sorted(set_id)`` (independent of the table's row order); shard ``k`` holds
sets ``k*S .. (k+1)*S - 1`` with ``S = images.set_shard_size``. Randomness depends only on
``(seed, set_id, candidate index)`` (:func:`.selection.candidate_seed`), and batches never mix sets, so
a set's images are byte-identical whatever the shard size; across batch sizes the candidates and their
parameters are identical and the images agree up to the rounding of batched kernels (see
``tests/test_p2p.py::test_batch_size_independence``).

Resume (the shared :mod:`.runner`). Each finished set is cached in ``OUT/work/<set_id>/`` with an atomic
``done.json`` (written last) holding a fingerprint of the generation settings, the models and the set's
captions; a rerun after a kill skips cached sets and writes byte-identical outputs.

Outputs of a shard (``OUT``): ``images/<set_id>/c<candidate:04d>_m<member:02d>.png``,
``candidates.parquet`` (one row per image, :data:`CANDIDATE_SCHEMA`; ``image_path`` relative to ``OUT``)
and ``summary.json`` (counts, UNet evaluations, ``config_digest``, ``sets_digest``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..device import with_stage_precision
from ..errors import ConfigError, input_error
from ..filters.sets import clip_stage, clip_thresholds
from ..io import atomic_dir, config_digest, read_table, write_json, write_parquet
from ..models import registry
from ..scorers import scorer_from_config
from ..settings import config_value, schema_defaults
from .sampler import GenerationSettings, P2PEngine, build_engine
from .selection import candidate_batches
from . import runner
from .runner import ID_PATTERN as _ID_PATTERN
from .runner import fingerprint as _fingerprint

log = logging.getLogger(__name__)

#: columns the caption-set table must have (one row per caption; §3.2)
SET_COLUMNS = ("set_id", "segment", "prefix", "subject", "a1_type", "a1", "a2_type", "a2", "caption",
               "member_index")
#: optional columns (a third attribute, §10.2); always present in the outputs (null when absent)
OPTIONAL_SET_COLUMNS = ("a3_type", "a3")
#: columns that must be the same for every member of one set (a set = one prefix and subject, §3.2)
SET_CONSTANT_COLUMNS = ("segment", "prefix", "subject")
_META = ("segment", "prefix", "subject", "a1_type", "a1", "a2_type", "a2", "a3_type", "a3")

CANDIDATE_SCHEMA = {
    "set_id": "object", "candidate_index": "int64", "member_index": "int64", "seed": "uint64",
    "p": "float64", "guidance": "float64", "caption": "object", "segment": "object", "prefix": "object",
    "subject": "object", "a1_type": "object", "a1": "object", "a2_type": "object", "a2": "object",
    "a3_type": "object", "a3": "object", "image_path": "object",
}
_CACHE_SCHEMA = {"candidate_index": "int64", "seed": "uint64", "p": "float64", "guidance": "float64"}
#: model roles generation depends on: the ``sd`` pipeline and, when configured, the ``vae`` decoder
_ROLES = ("sd",)
_OPTIONAL_ROLES = ("vae",)
_VERSION = 1
_RERUN = "`counterfactory social generate`"


# --------------------------------------------------------------------------- settings

@dataclass(frozen=True)
@schema_defaults("social_counterfactuals.images")
class SetGenerationSettings:
    """The ``images`` keys of set generation (besides :class:`GenerationSettings`'; defaults: the schema's)."""

    set_shard_size: int
    candidates_per_set: int
    max_images_per_call: int | None

    @classmethod
    def from_config(cls, images: dict) -> "SetGenerationSettings":
        cap = images.get("max_images_per_call")
        out = cls(set_shard_size=int(config_value(images, "social_counterfactuals.images.set_shard_size")),
                  candidates_per_set=int(config_value(images, "social_counterfactuals.images.candidates_per_set")),
                  max_images_per_call=None if cap is None else int(cap))
        if out.set_shard_size < 1 or out.candidates_per_set < 1 or (cap is not None and out.max_images_per_call < 1):
            raise ConfigError("images.set_shard_size, images.candidates_per_set and images.max_images_per_call "
                              "must be >= 1. Fix: correct them in the config")
        return out


@dataclass(frozen=True)
@schema_defaults("social_counterfactuals.images.adaptive")
class AdaptiveSettings:
    """``images.adaptive`` (ours; off = the paper's fixed ``candidates_per_set``): stop a caption set after
    the first batch at which ``target`` of its candidate sets passed the CLIP stage (``filter.clip``)."""

    enabled: bool
    target: int

    @classmethod
    def from_config(cls, images: dict) -> "AdaptiveSettings":
        sec = images.get("adaptive") or {}
        if not isinstance(sec, dict):
            raise ConfigError(f"images.adaptive must be a mapping {{enabled, target}}, got {sec!r}. "
                              "Fix: write e.g. adaptive: {enabled: false, target: 1}")
        enabled, target = sec.get("enabled", cls.enabled), sec.get("target", cls.target)
        if not isinstance(enabled, bool):
            raise ConfigError(f"images.adaptive.enabled must be true or false, got {enabled!r}. Fix: correct it")
        if isinstance(target, bool) or not isinstance(target, int) or target < 1:
            raise ConfigError(f"images.adaptive.target must be an integer >= 1, got {target!r}. "
                              "Fix: the number of candidate sets that must pass the CLIP stage, e.g. 1")
        return cls(enabled=enabled, target=target)


def adaptive_clip(cfg: dict) -> tuple[str, Any]:
    """``(model role, ClipThresholds)`` of ``filter.clip`` (defaults filled in, checked): what adaptive
    mode scores with. Only ``filter.clip`` is read, so a job config holding just that key suffices."""
    return clip_thresholds((cfg.get("filter") or {}).get("clip"), "filter.clip")


def set_batch_size(settings: GenerationSettings, sets: SetGenerationSettings, members: int) -> int:
    """Candidate sets per UNet call for a set of ``members`` captions: ``images.batch_size``, reduced so
    that at most ``images.max_images_per_call`` images (candidates x members) share a call (at least 1)."""
    b = settings.batch_size
    if sets.max_images_per_call is not None:
        b = max(1, min(b, sets.max_images_per_call // members))
    return b


def model_roles(cfg: dict) -> tuple[str, ...]:
    """``sd`` plus each configured optional role (``vae``), plus the ``filter.clip`` role (``clip_filter``)
    in adaptive mode only (it then decides which candidates are generated)."""
    models = cfg.get("models") or {}
    roles = _ROLES + tuple(r for r in _OPTIONAL_ROLES if models.get(r))
    if AdaptiveSettings.from_config(cfg.get("images") or {}).enabled:
        roles += (adaptive_clip(cfg)[0],)
    return roles


def set_config_digest(cfg: dict) -> str:
    """sha256 over exactly the settings set generation reads (the :class:`GenerationSettings` and
    :class:`SetGenerationSettings` keys of ``images``, ``seed``) and the ``sd`` / ``vae`` model entries,
    so filter settings living next to them do not invalidate generated shards. In adaptive mode it also
    covers ``images.adaptive``, ``filter.clip`` (defaults filled in) and the ``filter.clip`` model; when
    adaptive mode is off none of these count (the digest is the non-adaptive one)."""
    images = cfg.get("images") or {}
    keys = set(GenerationSettings.__dataclass_fields__) | set(SetGenerationSettings.__dataclass_fields__)
    keys |= {"attention_control"}     # GenerationSettings.control is read from images.attention_control
    view = {"images": {k: images[k] for k in sorted(keys) if k in images}, "seed": config_value(cfg, "seed"),
            "models": cfg.get("models") or {}}
    sections: tuple[str, ...] = ("images", "seed")
    adaptive = AdaptiveSettings.from_config(images)
    if adaptive.enabled:
        role, thresholds = adaptive_clip(cfg)
        view["images"]["adaptive"] = asdict(adaptive)
        view["adaptive_clip"] = {"role": role, **asdict(thresholds)}
        sections += ("adaptive_clip",)
    return config_digest(view, sections=sections, model_roles=model_roles(cfg))


# --------------------------------------------------------------------------- input

def _clean(value: Any) -> str | None:
    """A metadata cell as str (None for null/NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def _is_index(value: Any) -> bool:
    if isinstance(value, (bool, str, bytes)) or type(value).__name__ == "bool_":
        return False
    try:
        return float(value).is_integer() and float(value) >= 0
    except (TypeError, ValueError):
        return False


def read_sets(path: str | os.PathLike):
    """Read and check the caption-set table; errors name the file, the record and the fix.

    Checks: the columns of :data:`SET_COLUMNS`; every ``set_id`` a non-empty ``[A-Za-z0-9_.-]`` string
    (it names image folders); every caption a non-empty string; ``member_index`` an integer; no duplicate
    ``(set_id, member_index)``; each set's members numbered 0..G-1 with G >= 2 (member 0 = the base
    caption); ``segment``, ``prefix`` and ``subject`` the same within a set. Returns the table with the
    optional columns added (null) and a ``_row`` column (the file's record number), sorted by
    ``(set_id, member_index)``.
    """

    path = Path(path)
    df = read_table(path, "caption-set table",
                    "run `counterfactory social captions` first or pass the right --sets path", SET_COLUMNS,
                    formats=("parquet",))
    df = df.reset_index(drop=True)
    df["_row"] = range(len(df))
    for c in OPTIONAL_SET_COLUMNS:
        if c not in df.columns:
            df[c] = None
    fix_ids = "set ids name image folders; fix them in the caption-set step"
    for i, (sid, cap, m) in enumerate(zip(df["set_id"], df["caption"], df["member_index"])):
        if not isinstance(sid, str) or not _ID_PATTERN.match(sid):
            raise input_error(path, i, f"set_id {sid!r} is not a non-empty [A-Za-z0-9_.-] string", fix_ids)
        if not isinstance(cap, str) or not cap.strip():
            raise input_error(path, i, f"set {sid!r}: empty caption", "every member of a set needs a caption")
        if not _is_index(m):
            raise input_error(path, i, f"set {sid!r}: member_index {m!r} is not a non-negative integer",
                              "member_index numbers a set's captions 0..G-1 (0 = the base caption)")
    df["member_index"] = df["member_index"].astype("int64")
    dup = df.duplicated(["set_id", "member_index"])
    if dup.any():
        i = int(dup.idxmax())
        same = (df["set_id"] == df.at[i, "set_id"]) & (df["member_index"] == df.at[i, "member_index"])
        first = int(df.index[same][0])
        raise input_error(path, i, f"duplicate (set_id, member_index) ({df.at[i, 'set_id']!r}, "
                          f"{int(df.at[i, 'member_index'])}); first at record {first}",
                          "each member of a set appears once; deduplicate the caption-set table")
    df = df.sort_values(["set_id", "member_index"], kind="mergesort")
    for sid, g in df.groupby("set_id", sort=True):
        members = list(g["member_index"])
        rows = list(g["_row"])
        if members != list(range(len(members))):
            want = set(range(len(members)))
            problem = (f"member_index starts at {members[0]}, not 0 (0 = the base caption)" if members[0] != 0
                       else f"member_index has a gap: {sorted(want - set(members))} missing from {members}")
            raise input_error(path, f"{rows[0]} (set_id {sid!r}, records {rows})", problem,
                              "number each set's captions 0..G-1 without gaps")
        if len(members) < 2:
            raise input_error(path, f"{rows[0]} (set_id {sid!r})", "a set with one caption has no counterfactual",
                              "a set needs its base caption and at least one counterfactual caption")
        for col in SET_CONSTANT_COLUMNS:
            values = [_clean(v) for v in g[col]]
            bad = [r for r, v in zip(rows, values) if v != values[0]]
            if bad:
                raise input_error(path, f"{bad[0]} (set_id {sid!r})",
                                  f"{col} {values[rows.index(bad[0])]!r} differs from the base caption's "
                                  f"{values[0]!r} (record {rows[0]})",
                                  f"a set holds the captions of one {col}; fix the caption-set table")
    return df.reset_index(drop=True)


def sets_digest(df) -> str:
    """Content fingerprint of the caption-set table (row order ignored): shards of different tables
    must not be merged."""
    cols = [*SET_COLUMNS, *OPTIONAL_SET_COLUMNS]
    rows = [[_clean(v) if c != "member_index" else int(v) for c, v in zip(cols, rec)]
            for rec in df[cols].itertuples(index=False, name=None)]
    return _fingerprint(sorted(rows, key=lambda r: (r[0], r[cols.index("member_index")])))


# --------------------------------------------------------------------------- shard runner

@dataclass
class SetContext:
    cfg: dict
    settings: GenerationSettings
    sets: SetGenerationSettings
    global_seed: int
    models: dict
    adaptive: AdaptiveSettings = AdaptiveSettings()
    clip_role: str | None = None        # adaptive mode only: the filter.clip model role and thresholds
    clip: Any = None


def stage_config(cfg: dict) -> dict:
    """``cfg`` as set generation runs it: ``images.precision`` (when set) replaces the config-wide ``precision`` for
    the Stable Diffusion engine (and the adaptive mode's CLIP scorer); the paper config sets fp32, as the authors'
    generator ran (its ``--precision hmp`` default falls through to fp32)."""
    return with_stage_precision(cfg, (cfg.get("images") or {}).get("precision"))


def _context(cfg: dict) -> SetContext:
    cfg = stage_config(cfg)
    images = cfg.get("images") or {}
    adaptive = AdaptiveSettings.from_config(images)
    role, thresholds = adaptive_clip(cfg) if adaptive.enabled else (None, None)
    return SetContext(cfg=cfg, settings=GenerationSettings.from_config(images, cfg),
                      sets=SetGenerationSettings.from_config(images), global_seed=int(config_value(cfg, "seed")),
                      # identifying the models (content fingerprints) must succeed: the resume cache depends on it
                      models=registry.configured_models(cfg, roles=model_roles(cfg)),
                      adaptive=adaptive, clip_role=role, clip=thresholds)


def _set_fingerprint(ctx: SetContext, set_id: str, captions: list[str], batch: int) -> str:
    doc = {
        "settings": asdict(replace(ctx.settings, batch_size=batch)), "n": ctx.sets.candidates_per_set,
        "seed": ctx.global_seed, "models": ctx.models, "set_id": set_id, "captions": captions,
        "version": _VERSION,
    }
    if ctx.adaptive.enabled:   # off: the fingerprint of the non-adaptive run (its caches stay valid)
        doc["adaptive"] = {"target": ctx.adaptive.target, "clip_role": ctx.clip_role, **asdict(ctx.clip)}
    return _fingerprint(doc)


def _clip_passed(scorer, text_emb: np.ndarray, images: np.ndarray, thresholds) -> np.ndarray:
    """Which candidate sets of one batch pass the CLIP stage: ``images`` (candidates, members, H, W, 3)
    uint8 (pixel-identical to the PNGs written), ``text_emb`` (members, d) of the set's captions."""
    from PIL import Image

    b, g = images.shape[:2]
    emb = np.asarray(scorer.encode_images([Image.fromarray(im) for im in images.reshape(b * g, *images.shape[2:])]))
    table = clip_stage(emb, np.tile(text_emb, (b, 1)), np.repeat(np.arange(b), g), thresholds)
    return table.sort_values("set_index")["passed"].to_numpy(dtype=bool)


def _clip_scorer(cfg: dict, role: str):
    """The ``filter.clip`` role as a dual encoder (head ``itc``), as the filter step loads it."""
    scorer = scorer_from_config(cfg, role, head="itc", progress=False)
    if not getattr(scorer, "dual", False):
        raise ConfigError(f"images.adaptive: role {role!r} (filter.clip.role) is not a dual encoder (CLIP-like). "
                          f"Fix: point models.{role} at a CLIP checkpoint, or turn images.adaptive.enabled off")
    return scorer


def _image_name(candidate: int, member: int) -> str:
    return f"c{candidate:04d}_m{member:02d}.png"


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


shard_bounds = runner.shard_bounds


class SetStage(runner.ShardStage):
    """Set generation on the shard runner: one caption set per batch (generated in batches of candidate sets,
    its images written to ``work/<set_id>/`` as they come), ``candidates.parquet`` and ``done.json`` last."""

    def __init__(self, ctx: SetContext, cache: runner.WorkCache, groups: dict, engine: P2PEngine | None, scorer):
        self.ctx, self.cache, self.groups, self.engine, self.scorer = ctx, cache, groups, engine, scorer

    def item_id(self, sid):
        return sid

    def _batch(self, sid) -> int:
        return set_batch_size(self.ctx.settings, self.ctx.sets, len(self.groups[sid]))

    def key(self, sid):
        return _set_fingerprint(self.ctx, sid, list(self.groups[sid]["caption"]), self._batch(sid))

    def is_done(self, sid, key):
        return self.cache.is_done(sid, key)

    def clear(self, sid):
        self.cache.clear(sid)

    def generate(self, batch):
        ctx = self.ctx
        for sid in batch:
            captions = list(self.groups[sid]["caption"])
            if self.engine is None:
                self.engine = build_engine(ctx.cfg)
            text_emb = None
            if ctx.adaptive.enabled:
                if self.scorer is None:
                    self.scorer = _clip_scorer(ctx.cfg, ctx.clip_role)
                text_emb = np.asarray(self.scorer.encode_texts(captions))
            evals0 = self.engine.unet_evals
            rows = []
            n_passed, stopped = 0, False
            n = ctx.sets.candidates_per_set
            for cands in candidate_batches(ctx.global_seed, sid, n, ctx.settings, batch_size=self._batch(sid)):
                res = self.engine.generate(captions, cands)
                for j, c in enumerate(cands):
                    for m in range(len(captions)):
                        self.cache.write(sid, _image_name(c.index, m), runner.png_bytes(res.images[j, m]))
                    rows.append({"candidate_index": c.index, "seed": np.uint64(c.seed), "p": c.p,
                                 "guidance": c.guidance})
                if ctx.adaptive.enabled:
                    n_passed += int(_clip_passed(self.scorer, text_emb, res.images, ctx.clip).sum())
                    if n_passed >= ctx.adaptive.target and len(rows) < n:
                        stopped = True
                        break
            if stopped:
                log.info("set %s: %d of the first %d of %d candidate sets passed the CLIP stage; stopped (adaptive)",
                         sid, n_passed, len(rows), n)
            yield sid, {"rows": rows, "members": len(captions), "unet_evals": self.engine.unet_evals - evals0,
                        "stopped_early": stopped, "clip_passed": n_passed if ctx.adaptive.enabled else None}

    def store(self, sid, key, result):
        import pandas as pd

        rows = result.pop("rows")
        self.cache.write_table(sid, "candidates.parquet",
                               pd.DataFrame(rows, columns=list(_CACHE_SCHEMA)).astype(_CACHE_SCHEMA))
        self.cache.mark_done(sid, key, {"candidates": len(rows), "batch_size": self._batch(sid), **result})


@runner.locks_shard
def run_set_shard(cfg: dict, sets_path: str | os.PathLike, shard: int | str, out_dir: str | os.PathLike, *,
                  engine: P2PEngine | None = None, hook: Callable[[int, str], None] | None = None,
                  progress: bool = True, scorer: Any = None) -> dict:
    """Over-generate ``images.candidates_per_set`` candidate sets for every caption set of one shard.

    The shard holds the sets ranked ``shard*S .. (shard+1)*S - 1`` in ``sorted(set_id)`` order
    (``S = images.set_shard_size``). Each set is generated in batches of candidate sets (one UNet call
    per batch, all members of a candidate together; §3.3) and cached in ``out_dir/work/<set_id>/``
    (``done.json`` last). ``hook(k, set_id)`` runs after the k-th set generated this run is cached (tests
    use it to simulate a kill). ``engine``: a ready :class:`P2PEngine` whose settings match the config's (its
    ``batch_size`` is ignored: the config's decides). Adaptive mode (``images.adaptive.enabled``) stops a
    set once ``images.adaptive.target`` candidate sets passed the CLIP stage; ``scorer``: the dual encoder
    it scores with (default: the ``filter.clip.role`` model, loaded when first needed). Returns the shard
    summary (also ``summary.json``).
    """
    ctx = _context(cfg)
    if engine is not None and replace(engine.settings, batch_size=ctx.settings.batch_size) != ctx.settings:
        raise ConfigError(f"the engine's settings {engine.settings} differ from the config's {ctx.settings}")
    shard_idx = int(shard)
    sets_path = Path(sets_path)
    df = read_sets(sets_path)
    set_ids = sorted(df["set_id"].unique())
    lo, hi = shard_bounds(shard_idx, ctx.sets.set_shard_size)
    mine = set_ids[lo:hi]
    groups = {sid: g for sid, g in df[df["set_id"].isin(mine)].groupby("set_id", sort=True)}
    out_dir = Path(out_dir)
    cache = runner.WorkCache(out_dir / "work")
    log.info("set shard %05d: sets [%d, %d) of %d in set_id order: %d sets, %d captions", shard_idx, lo, hi,
             len(set_ids), len(mine), sum(len(g) for g in groups.values()))
    with runner.progress_bar(len(mine), f"social sets shard {shard_idx:05d}", "set", progress) as bar:
        runner.run_stage(SetStage(ctx, cache, groups, engine, scorer), mine, hook=hook, bar=bar)
    return _assemble(ctx, shard_idx, (lo, hi), len(set_ids), sets_digest(df), groups, cache, out_dir)


def _assemble(ctx: SetContext, shard_idx: int, bounds: tuple[int, int], total_sets: int, table_digest: str,
              groups: dict, cache: runner.WorkCache, out_dir: Path) -> dict:
    """The shard's images, ``candidates.parquet`` and ``summary.json`` from the cache, in set_id order."""
    import pandas as pd

    totals = {"candidates_generated": 0, "images": 0, "unet_evals": 0, "sets_stopped_early": 0}

    def build(tmp_images: Path):
        rows = []
        per_set: dict[str, dict] = {}
        by_segment: dict[str, int] = {}
        for sid, g in groups.items():
            sdir = cache.dir(sid)
            meta = cache.meta(sid)
            cands = pd.read_parquet(sdir / "candidates.parquet")
            (tmp_images / sid).mkdir()
            members = g.to_dict("records")
            for c in cands.itertuples(index=False):
                for mem in members:
                    name = _image_name(int(c.candidate_index), int(mem["member_index"]))
                    _link_or_copy(sdir / name, tmp_images / sid / name)
                    rows.append({
                        "set_id": sid, "candidate_index": int(c.candidate_index),
                        "member_index": int(mem["member_index"]), "seed": c.seed, "p": c.p, "guidance": c.guidance,
                        "caption": mem["caption"], **{k: _clean(mem[k]) for k in _META},
                        "image_path": f"images/{sid}/{name}",
                    })
            totals["candidates_generated"] += meta["candidates"]
            totals["images"] += meta["candidates"] * meta["members"]
            totals["unet_evals"] += meta["unet_evals"]
            stopped = bool(meta.get("stopped_early", False))
            totals["sets_stopped_early"] += int(stopped)
            per_set[sid] = {"candidates": meta["candidates"], "unet_evals": meta["unet_evals"],
                            "stopped_early": stopped, "clip_passed": meta.get("clip_passed")}
            seg = str(_clean(members[0]["segment"]))
            by_segment[seg] = by_segment.get(seg, 0) + 1
        table = pd.DataFrame(rows, columns=list(CANDIDATE_SCHEMA)).astype(CANDIDATE_SCHEMA)
        summary = {
            "shard": shard_idx, "set_range": list(bounds), "set_shard_size": ctx.sets.set_shard_size,
            "sets_total": total_sets, "sets": len(groups), "sets_by_segment": dict(sorted(by_segment.items())),
            "captions": int(sum(len(g) for g in groups.values())), **totals,
            "candidates_per_set": ctx.sets.candidates_per_set,
            "unet_evals_per_image": totals["unet_evals"] / totals["images"] if totals["images"] else None,
            "attention_control": ctx.settings.control, "steps": ctx.settings.steps,
            "batch_size": ctx.settings.batch_size, "threads": runner.torch_threads(),
            # off: target and CLIP settings play no part, so they are not reported
            "adaptive": ({**asdict(ctx.adaptive), "clip_role": ctx.clip_role, **asdict(ctx.clip)}
                         if ctx.adaptive.enabled else {"enabled": False}),
            "per_set": per_set,
            "config_digest": set_config_digest(ctx.cfg), "sets_digest": table_digest,
        }
        return {"candidates.parquet": table}, summary

    keep_work = bool(config_value(ctx.cfg.get("images") or {}, "social_counterfactuals.images.keep_work"))
    summary = runner.assemble(out_dir, cache, build, keep_work=keep_work)
    log.info("set shard %05d: %d sets, %d candidate sets, %d images (%d UNet evaluations)", shard_idx,
             len(groups), totals["candidates_generated"], totals["images"], totals["unet_evals"])
    return summary


# --------------------------------------------------------------------------- merge

def merge_set_shards(shard_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
                     copy_images: bool = False) -> dict:
    """Concatenate the shards' ``candidates.parquet`` (sorted by set_id, candidate, member) into
    ``out_dir``. Refuses shards with different ``config_digest`` or ``sets_digest``, a shard listed twice,
    a set in two shards and a missing shard (the shard numbers must cover every set of the table).
    ``copy_images=False``: image paths are rewritten relative to ``out_dir`` (pointing into the shard
    folders); True: images are hard-linked (else copied) to ``out_dir/images/<set_id>/``."""
    import pandas as pd

    out_dir = Path(out_dir)
    dirs = [Path(d) for d in shard_dirs]
    runner.require_shard_files(dirs, ("candidates.parquet", "summary.json"), "set shard output missing",
                               f"rerun that shard's {_RERUN} job")
    resolved = [d.resolve() for d in dirs]
    for i, d in enumerate(resolved):
        if d in resolved[:i]:
            raise input_error(dirs[i], None, "shard folder listed twice", "list each shard folder once")
    summaries, digest = runner.load_shard_summaries(dirs, ("candidates.parquet",), "set shard", _RERUN,
                                                    missing="set shard output missing")
    by_table: dict[Any, list[str]] = {}
    for label, s in summaries.items():
        by_table.setdefault(s.get("sets_digest"), []).append(label)
    if len(by_table) > 1:
        groups = "; ".join(f"{str(d)[:12]}: {', '.join(v)}" for d, v in sorted(by_table.items(), key=str))
        raise input_error("set shard", None, f"shards were made from different caption-set tables ({groups})",
                          f"rerun {_RERUN} for every shard on the same --sets table, then merge again")
    if summaries:
        first = next(iter(summaries.values()))
        runner.check_shard_plan(summaries, out_dir,
                                expected=range(math.ceil(first["sets_total"] / first["set_shard_size"])),
                                plan=f"{first['sets_total']} sets in shards of {first['set_shard_size']}",
                                rerun=_RERUN)
    frames = []
    out_dir.mkdir(parents=True, exist_ok=True)
    with (atomic_dir(out_dir / "images") if copy_images else contextlib.nullcontext()) as tmp_images:
        for d in dirs:
            t = pd.read_parquet(d / "candidates.parquet")
            if copy_images:
                for p in t["image_path"]:
                    target = tmp_images / Path(p).relative_to("images")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    _link_or_copy(d / p, target)
            else:
                t["image_path"] = runner.relative_paths(t["image_path"], d, out_dir)
            frames.append(t)
        table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
            {k: pd.Series(dtype=v) for k, v in CANDIDATE_SCHEMA.items()})
        dup = table.duplicated(["set_id", "candidate_index", "member_index"])
        if dup.any():
            raise input_error(out_dir, None, f"set {table['set_id'][dup].iloc[0]!r} is in two shards",
                              "merge shards of one run (one set_shard_size) only")
    table = table.sort_values(["set_id", "candidate_index", "member_index"], kind="mergesort")
    table = table.reset_index(drop=True)[list(CANDIDATE_SCHEMA)].astype(CANDIDATE_SCHEMA)
    write_parquet(out_dir / "candidates.parquet", table)
    keys = ("sets", "captions", "candidates_generated", "images", "unet_evals", "sets_stopped_early")
    summary = {k: int(sum(s.get(k, 0) for s in summaries.values())) for k in keys}
    segs: dict[str, int] = {}
    for s in summaries.values():
        for k, v in s.get("sets_by_segment", {}).items():
            segs[k] = segs.get(k, 0) + v
    summary.update(shards=len(summaries), sets_by_segment=dict(sorted(segs.items())), config_digest=digest,
                   batch_size=runner.common_value(summaries.values(), "batch_size"),
                   threads=runner.common_value(summaries.values(), "threads"),
                   sets_digest=next(iter(by_table), None), images_copied=copy_images)
    write_json(out_dir / "summary.json", summary)
    return summary
