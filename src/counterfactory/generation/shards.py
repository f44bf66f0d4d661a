"""Sharded, resumable image stage: the shard runner with its per-caption resume cache, the shard's
assembly into tables and images, and the merge of shards.

The shard runner (:func:`run_shard`, on the shared :mod:`.runner`) caches each finished caption atomically
in the shard's work folder, so a killed job that is rerun skips finished captions and writes byte-identical
outputs.
Every shard summary records ``config_digest`` (:func:`images_config_digest`: sha256 over the
``images`` section, ``seed`` and the ``sd`` / ``clip_filter`` (and, when configured, ``vae``) model
entries); :func:`merge_shards`
refuses shards whose digests differ.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..data.layouts import SELECTED_SCHEMA
from ..device import with_stage_precision
from ..errors import input_error
from ..filters import ClipScorer, FilterThresholds
from ..io import config_digest, read_table, write_json, write_parquet
from ..models import registry
from ..settings import config_value
from . import runner
from .sampler import GenerationSettings, P2PEngine, build_engine
from .selection import SelectionSettings, overgenerate_caption

log = logging.getLogger(__name__)

PAIR_COLUMNS = ("caption_id", "source_index", "original", "counterfactual")
OPTIONAL_COLUMNS = ("image_id", "original_word", "new_word", "position", "similarity", "perplexity")
MODEL_ROLES = ("sd", "clip_filter")
#: roles the image stage uses only when configured (``vae``: decoder replacing the pipeline's own)
OPTIONAL_MODEL_ROLES = ("vae",)

SCORE_SCHEMA = {
    "caption_id": "object", "source_index": "int64", "candidate_index": "int64", "seed": "uint64",
    "p": "float64", "guidance": "float64", "sim_0": "float64", "sim_1": "float64", "sim_image": "float64",
    "sim_direction": "float64", "passed": "bool", "reject_reason": "object", "selected": "bool", "rank": "int64",
}


_frame = runner.frame


def read_pairs(path: str | os.PathLike):
    """Read and check the caption stage's pair table; errors name file, record and fix."""

    path = Path(path)
    df = read_table(path, "caption-pair table", "run the caption stage first (it writes "
                    "captions/counterfactual_captions.parquet) or pass the right --pairs path", PAIR_COLUMNS,
                    formats=("parquet",))
    for i, row in df.iterrows():
        cid = row["caption_id"]
        if not isinstance(cid, str) or not runner.ID_PATTERN.match(cid):
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


@dataclass
class ShardContext:
    cfg: dict
    settings: GenerationSettings
    thresholds: Any
    selection: SelectionSettings
    n_candidates: int
    global_seed: int
    models: dict


def stage_config(cfg: dict) -> dict:
    """``cfg`` as the image stage runs it: ``images.precision`` (when set) replaces the config-wide ``precision``
    for the Prompt-to-Prompt engine and the CLIP filter. The paper config sets fp16 with ``images.autocast: true``,
    as the InstructPix2Pix generator B.1.2 follows ran both (fp16 autocast over fp32 weights); ``autocast: false``
    casts the weights (pure fp16); null keeps the config's precision (the fast path)."""
    return with_stage_precision(cfg, (cfg.get("images") or {}).get("precision"))


def _shard_context(cfg: dict) -> ShardContext:
    images = cfg.get("images", {})
    filt = images.get("filter", {})
    adaptive = images.get("adaptive", {})
    settings = GenerationSettings.from_config(images, cfg)
    selection = SelectionSettings(
        score_images=str(config_value(filt, "coco_counterfactuals.images.filter.score_images")),
        top_k=int(config_value(filt, "coco_counterfactuals.images.filter.top_k")),
        adaptive=bool(config_value(adaptive, "coco_counterfactuals.images.adaptive.enabled")),
        target_accepted=adaptive.get("target_accepted"),
        keep_all_images=bool(config_value(images, "coco_counterfactuals.images.save_all_candidates")),
    )
    # identifying the models (content fingerprints) must succeed: the resume cache depends on it
    models = registry.configured_models(cfg, roles=model_roles(cfg))
    return ShardContext(cfg=cfg, settings=settings, thresholds=FilterThresholds.from_config(filt),
                        selection=selection, n_candidates=int(config_value(images, "coco_counterfactuals.images.candidates_per_pair")),
                        global_seed=int(config_value(cfg, "seed")), models=models)


def model_roles(cfg: dict) -> tuple[str, ...]:
    """The model roles the image stage depends on: ``sd``, ``clip_filter`` and each configured optional
    role (``vae``). An absent optional role is left out, so configs without it keep their digests and
    resume-cache keys."""
    models = cfg.get("models") or {}
    return MODEL_ROLES + tuple(r for r in OPTIONAL_MODEL_ROLES if models.get(r))


def images_config_digest(cfg: dict) -> str:
    """sha256 over the canonical JSON of the ``images`` section, ``seed`` and the ``sd``,
    ``clip_filter`` (and configured ``vae``) model entries: shards with different digests must not
    be merged."""
    return config_digest(cfg, sections=("images", "seed"), model_roles=model_roles(cfg))


def _caption_fingerprint(ctx: ShardContext, row: dict) -> str:
    return runner.fingerprint({
        "settings": asdict(ctx.settings), "thresholds": asdict(ctx.thresholds),
        "selection": asdict(ctx.selection), "n": ctx.n_candidates, "seed": ctx.global_seed,
        "models": ctx.models, "caption_id": row["caption_id"], "original": row["original"],
        "counterfactual": row["counterfactual"], "version": 1,
    })


def _release_id(caption_id: str, rank: int, top_k: int) -> str:
    return caption_id if top_k == 1 else f"{caption_id}_{rank}"


class ImagePairStage(runner.ShardStage):
    """The image stage on the shard runner: one caption pair per batch (over-generated in candidate batches
    by :func:`.selection.overgenerate_caption`), cached in ``work/<caption_id>/``."""

    def __init__(self, ctx: ShardContext, cache: runner.WorkCache, engine: P2PEngine | None, scorer):
        self.ctx, self.cache, self.engine, self.scorer = ctx, cache, engine, scorer

    def item_id(self, r):
        return r["caption_id"]

    def key(self, r):
        return _caption_fingerprint(self.ctx, r)

    def is_done(self, r, key):
        return self.cache.is_done(r["caption_id"], key)

    def clear(self, r):
        self.cache.clear(r["caption_id"])

    def generate(self, batch):
        ctx = self.ctx
        for r in batch:
            images = ctx.cfg.get("images", {})
            autocast = bool(config_value(images, "coco_counterfactuals.images.autocast"))   # B.1.2: fp16 autocast
            if self.engine is None:
                self.engine = build_engine(ctx.cfg, autocast=autocast)
            if self.scorer is None:
                filt = images.get("filter", {})
                self.scorer = ClipScorer.from_config(
                    ctx.cfg, batch_size=config_value(filt, "coco_counterfactuals.images.filter.batch_size"),
                    autocast=autocast)
            yield r, overgenerate_caption(self.engine, self.scorer, ctx.thresholds, r["caption_id"], r["original"],
                                          r["counterfactual"], ctx.n_candidates, ctx.global_seed, ctx.selection)

    def store(self, r, key, outcome):
        cid = r["caption_id"]
        for s in outcome.scores:
            s["source_index"] = int(r["source_index"])
        for rank, idx, im0, im1 in outcome.selected:
            self.cache.write(cid, f"sel_{rank}_img_0.png", runner.png_bytes(im0))
            self.cache.write(cid, f"sel_{rank}_img_1.png", runner.png_bytes(im1))
        for idx, (im0, im1) in sorted(outcome.all_images.items()):
            self.cache.write(cid, f"candidates/c{idx:04d}_img_0.png", runner.png_bytes(im0))
            self.cache.write(cid, f"candidates/c{idx:04d}_img_1.png", runner.png_bytes(im1))
        self.cache.write_table(cid, "scores.parquet", _frame(outcome.scores, SCORE_SCHEMA))
        n_pass = sum(s["passed"] for s in outcome.scores)
        self.cache.mark_done(cid, key, {"candidates": len(outcome.scores), "passed": n_pass,
                                        "selected": len(outcome.selected), "unet_evals": outcome.unet_evals,
                                        "stopped_early": outcome.stopped_early})
        if n_pass == 0:
            log.info("caption %s: none of %d candidates passed the CLIP filter", cid, len(outcome.scores))


@runner.locks_shard
def run_shard(cfg: dict, pairs_path: str | os.PathLike, shard: int | str, out_dir: str | os.PathLike, *,
              engine: P2PEngine | None = None, scorer=None,
              hook: Callable[[int, str], None] | None = None, progress: bool = True) -> dict:
    """Over-generate, filter and select every caption pair of one shard; write the shard's outputs.

    Outputs in ``out_dir``: ``images/{id}_img_{0|1}.png`` (plus ``images/candidates/`` when
    ``images.save_all_candidates``), ``selected_pairs.parquet``, ``candidate_scores.parquet`` and
    ``summary.json``. Finished captions are cached in ``out_dir/work/<caption_id>/`` (``done.json``
    written last); a rerun reuses them, so an interrupted shard resumes where it stopped. ``hook(k,
    caption_id)`` is called after the k-th caption generated this run is cached (tests use it to simulate
    a kill).
    """
    ctx = _shard_context(stage_config(cfg))
    if engine is not None and engine.settings != ctx.settings:
        raise ValueError(f"the engine's settings {engine.settings} differ from the config's {ctx.settings}")
    shard_idx = int(shard)
    size = int(config_value(cfg.get("images", {}), "coco_counterfactuals.images.shard_size"))
    lo, hi = shard_idx * size, (shard_idx + 1) * size
    pairs_path = Path(pairs_path)
    df = read_pairs(pairs_path)
    part = df[(df["source_index"] >= lo) & (df["source_index"] < hi)].sort_values(
        ["source_index", "caption_id"], kind="mergesort")
    out_dir = Path(out_dir)
    cache = runner.WorkCache(out_dir / "work")

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
    with runner.progress_bar(len(todo), f"images shard {shard_idx:05d}", "caption", progress) as bar:
        runner.run_stage(ImagePairStage(ctx, cache, engine, scorer), todo, hook=hook, bar=bar)
    # the plan a merge checks its shards against: every shard holding pairs of this table must be merged
    plan = {"shard_size": size, "pairs_total": int(len(df)),
            "source_index_max": int(df["source_index"].max()) if len(df) else -1,
            "pairs_digest": runner.fingerprint(df[list(PAIR_COLUMNS)].to_dict("records"))}
    return _assemble_shard(ctx, shard_idx, (lo, hi), todo, rejected, cache, out_dir, ctx.selection.top_k, plan)


def _assemble_shard(ctx: ShardContext, shard_idx: int, bounds: tuple[int, int], todo: list[dict],
                    rejected: list[dict], cache: runner.WorkCache, out_dir: Path, top_k: int, plan: dict) -> dict:
    """Build the shard's outputs from the per-caption cache, deterministically (source_index order)."""
    import pandas as pd

    totals = {"candidates_generated": 0, "candidates_passed": 0, "unet_evals": 0, "stopped_early": 0}

    def build(tmp_images: Path):
        score_frames, selected_rows = [], []
        for r in todo:
            cid = r["caption_id"]
            cdir = cache.dir(cid)
            meta = cache.meta(cid)
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
        with_sel = selected_df["caption_id"].nunique() if len(selected_df) else 0
        summary = {
            "shard": shard_idx, "source_index_range": list(bounds), **plan,
            "captions": len(todo) + len(rejected), "captions_rejected": len(rejected),
            "rejected_captions": rejected, "captions_generated": len(todo),
            "captions_with_selection": int(with_sel), "pairs_selected": len(selected_df),
            **totals,
            "unet_evals_per_selected_pair": (totals["unet_evals"] / len(selected_df)) if len(selected_df) else None,
            "adaptive": ctx.selection.adaptive, "top_k": top_k, "candidates_per_pair": ctx.n_candidates,
            "attention_control": ctx.settings.control, "steps": ctx.settings.steps,
            "batch_size": ctx.settings.batch_size,   # resolved (`auto` -> the device's): the adaptive replay's layout
            "threads": runner.torch_threads(),       # CPU kernels may round differently with another thread count
            "config_digest": images_config_digest(ctx.cfg),
        }
        return {"candidate_scores.parquet": scores_df, "selected_pairs.parquet": selected_df}, summary

    summary = runner.assemble(out_dir, cache, build, keep_work=bool(config_value(ctx.cfg.get("images", {}), "coco_counterfactuals.images.keep_work")))
    log.info("shard %05d: %d pairs selected from %d captions (%d candidates, %d passed, %d UNet evaluations)",
             shard_idx, summary["pairs_selected"], len(todo), totals["candidates_generated"],
             totals["candidates_passed"], totals["unet_evals"])
    return summary


def _check_plan(loaded: dict[str, dict], out_dir: Path) -> None:
    """Every shard of the pair table once: shards ``0 .. source_index_max // shard_size`` (later, empty shards of
    the caption count may be passed too), all made from one pair table, their captions adding up to it."""
    rerun = "`counterfactory images generate`"
    if not loaded:
        return
    older = [label for label, s in loaded.items() if "pairs_total" not in s]
    if older:   # written by an older version: no plan recorded; at least no gap and no shard twice
        log.warning("%s: image shard summary without pairs_total (older version): checking only that the shard "
                    "numbers run from 0 without a gap", older[0])
        numbers = [int(s["shard"]) for s in loaded.values()]
        runner.check_shard_plan(loaded, out_dir, expected=range(max(numbers) + 1), rerun=rerun, exact=False,
                                plan="shard numbers from 0 without a gap")
        return
    tables = {(s["pairs_digest"], s["pairs_total"], s["source_index_max"], s["shard_size"]) for s in loaded.values()}
    if len(tables) > 1:
        raise input_error(out_dir, None, "the shards were made from different caption-pair tables or shard sizes",
                          f"rerun {rerun} for every shard with one --pairs file and one images.shard_size")
    _, total, top, size = tables.pop()
    runner.check_shard_plan(loaded, out_dir, expected=range(top // size + 1 if top >= 0 else 0), exact=False,
                            rerun=rerun, plan=f"{total} caption pairs with source_index up to {top} in shards "
                                              f"of {size}")
    held = sum(int(s.get("captions", 0)) for s in loaded.values())
    if held != total:
        raise input_error(out_dir, None, f"the shards hold {held} of the {total} caption pairs of their table",
                          f"rerun {rerun} for every shard of the table and pass every shard folder")


def merge_shards(shard_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> dict:
    """Concatenate shard outputs (sorted by source_index); image paths become relative to ``out_dir``."""
    import pandas as pd

    out_dir = Path(out_dir)
    sel_frames, score_frames = [], []
    loaded, digest = runner.load_shard_summaries(
        shard_dirs, ("selected_pairs.parquet", "candidate_scores.parquet"), "image shard",
        "`counterfactory images generate`",
        fix="rerun that shard's `counterfactory images generate` job (snakemake does this)")
    summaries = [loaded[str(Path(d) / "summary.json")] for d in shard_dirs]
    _check_plan(loaded, out_dir)
    for d in map(Path, shard_dirs):
        sel = pd.read_parquet(d / "selected_pairs.parquet")
        for col in ("image_0", "image_1"):
            sel[col] = runner.relative_paths(sel[col], d, out_dir)
        sel_frames.append(sel)
        score_frames.append(pd.read_parquet(d / "candidate_scores.parquet"))
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
    summary["batch_size"] = runner.common_value(summaries, "batch_size")   # None: shards differ
    summary["threads"] = runner.common_value(summaries, "threads")
    summary["config_digest"] = digest
    summary["rejected_captions"] = [r for s in summaries for r in s.get("rejected_captions", [])]
    summary["unet_evals_per_selected_pair"] = (summary["unet_evals"] / summary["pairs_selected"]
                                               if summary["pairs_selected"] else None)
    write_json(out_dir / "summary.json", summary)
    return summary
