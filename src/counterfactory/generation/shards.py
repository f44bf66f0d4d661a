"""Sharded, resumable image stage: the shard runner with its per-caption resume cache, the shard's
assembly into tables and images, and the merge of shards.

The shard runner (:func:`run_shard`) caches each finished caption atomically in the shard's work
folder, so a killed job that is rerun skips finished captions and writes byte-identical outputs.
Every shard summary records ``config_digest`` (:func:`images_config_digest`: sha256 over the
``images`` section, ``seed`` and the ``sd`` / ``clip_filter`` (and, when configured, ``vae``) model
entries); :func:`merge_shards`
refuses shards whose digests differ.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import input_error, missing_input
from .sampler import GenerationSettings, P2PEngine, build_engine
from .selection import SelectionSettings, overgenerate_caption

log = logging.getLogger(__name__)

PAIR_COLUMNS = ("caption_id", "source_index", "original", "counterfactual")
OPTIONAL_COLUMNS = ("image_id", "original_word", "new_word", "position", "similarity", "perplexity")
MODEL_ROLES = ("sd", "clip_filter")
#: roles the image stage uses only when configured (``vae``: decoder replacing the pipeline's own)
OPTIONAL_MODEL_ROLES = ("vae",)
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
        raise missing_input(path, "caption-pair table",
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
    settings = GenerationSettings.from_config(images, cfg)
    selection = SelectionSettings(
        top_k=int(filt.get("top_k", 1)),
        adaptive=bool(adaptive.get("enabled", False)),
        target_accepted=adaptive.get("target_accepted"),
        keep_all_images=bool(images.get("save_all_candidates", False)),
    )
    # identifying the models (content fingerprints) must succeed: the resume cache depends on it
    models = registry.configured_models(cfg, roles=model_roles(cfg))
    return ShardContext(cfg=cfg, settings=settings, thresholds=FilterThresholds.from_config(filt),
                        selection=selection, n_candidates=int(images.get("candidates_per_pair", 100)),
                        global_seed=int(cfg.get("seed", 0)), models=models)


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
    from ..io import config_digest

    return config_digest(cfg, sections=("images", "seed"), model_roles=model_roles(cfg))


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

            scorer = ClipScorer.from_config(cfg, batch_size=cfg.get("images", {}).get("filter", {}).get("batch_size", 32))
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
        "batch_size": ctx.settings.batch_size,   # resolved (`auto` -> the device's): the adaptive replay's layout
        "config_digest": images_config_digest(ctx.cfg),
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

    from ..io import check_digests, write_json, write_parquet

    out_dir = Path(out_dir)
    sel_frames, score_frames, summaries = [], [], []
    for d in shard_dirs:
        d = Path(d)
        for name in ("selected_pairs.parquet", "candidate_scores.parquet", "summary.json"):
            if not (d / name).exists():
                raise input_error(d / name, None, "shard output missing",
                                  "rerun that shard's `counterfactory images generate` job (snakemake does this)")
    digest = check_digests({str(Path(d) / "summary.json"): json.loads((Path(d) / "summary.json").read_text())
                            for d in shard_dirs}, "image shard", "`counterfactory images generate`")
    for d in shard_dirs:
        d = Path(d)
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
    batch_sizes = {s.get("batch_size") for s in summaries}
    summary["batch_size"] = batch_sizes.pop() if len(batch_sizes) == 1 else None   # None: shards differ
    summary["config_digest"] = digest
    summary["rejected_captions"] = [r for s in summaries for r in s.get("rejected_captions", [])]
    summary["unet_evals_per_selected_pair"] = (summary["unet_evals"] / summary["pairs_selected"]
                                               if summary["pairs_selected"] else None)
    write_json(out_dir / "summary.json", summary)
    return summary
