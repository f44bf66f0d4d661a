"""The caption stage as files: one shard of the caption table in, three files out.

Output schema (parquet, one file per shard; see README "File schemas"):

* accepted: ``caption_id, source_index, image_id, original, counterfactual, original_word, new_word,
  position, similarity, perplexity``
* rejected: ``caption_id, original, candidate, original_word, new_word, position, mlm_rank, reason,
  similarity, perplexity``
* summary (JSON): counts per rejection reason, timing, the models used and provenance.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import pandas as pd

from .. import provenance
from ..device import from_config as device_from_config
from ..errors import input_error
from ..io import write_json, write_parquet, write_text
from ..models import registry
from . import captions as cap

log = logging.getLogger(__name__)

ACCEPTED_COLUMNS = ["caption_id", "source_index", "image_id", "original", "counterfactual", "original_word",
                    "new_word", "position", "similarity", "perplexity"]
REJECTED_COLUMNS = ["caption_id", "original", "candidate", "original_word", "new_word", "position", "mlm_rank",
                    "reason", "similarity", "perplexity"]
RELEASE_KEYS = ("coco-counterfactual-index", "original_caption", "counterfactual_caption")


def n_shards(n_items: int, shard_size: int) -> int:
    return max(1, math.ceil(n_items / shard_size))


def read_shard(path: str | Path, shard: int, shard_size: int) -> pd.DataFrame:
    """Rows ``[shard*size, (shard+1)*size)`` of the caption table, with their ``source_index``."""
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "caption table not found",
                          "run `counterfactory data captions` (rule `caption_table`) first")
    table = pd.read_parquet(path)
    for col in ("caption_id", "image_id", "caption"):
        if col not in table.columns:
            raise input_error(path, None, f"missing column {col!r}", "regenerate it with `counterfactory data captions`")
    if shard < 0 or (shard > 0 and shard * shard_size >= len(table)):
        raise input_error(path, f"shard {shard}", f"out of range for {len(table)} captions at shard size {shard_size}",
                          "use a shard index below ceil(n_captions / shard_size)")
    part = table.iloc[shard * shard_size : (shard + 1) * shard_size].copy()
    part.insert(0, "source_index", range(shard * shard_size, shard * shard_size + len(part)))
    empty = part["caption"].astype(str).str.strip() == ""
    if empty.any():
        row = part[empty].iloc[0]
        raise input_error(path, f"caption_id {row['caption_id']}", "empty caption", "drop or fix that caption")
    return part


def build_models(cfg: dict, settings: cap.EditSettings):
    device, _ = device_from_config(cfg)
    mlm, mlm_tok = registry.load(cfg, "mlm")
    lm, lm_tok = registry.load(cfg, "lm")
    sentence = registry.load(cfg, "sentence", device=str(device))
    return (
        cap.HFFillMasker(mlm, mlm_tok, device=device),
        cap.SentenceSimilarity(sentence, batch_size=settings.batch_size),
        cap.CausalLMPerplexity(lm, lm_tok, device=device, prepend_bos=cfg["captions"]["perplexity_prepend_bos"]),
    )


def run_shard(cfg: dict, table: str | Path, shard: int, out_accepted: str | Path, out_rejected: str | Path,
              out_summary: str | Path, progress: bool = True) -> dict:
    from .nltk_data import ensure_nltk_data

    section = cfg["captions"]
    settings = cap.EditSettings.from_config(section)
    part = read_shard(table, shard, section["shard_size"])
    ensure_nltk_data(cfg["nltk"]["data_dir"])
    t0 = time.perf_counter()
    masker, similarity, perplexity = build_models(cfg, settings)
    t_load = time.perf_counter() - t0
    records = part[["caption_id", "source_index", "image_id", "caption"]].to_dict("records")
    result = cap.edit_captions(records, cap.nltk_tagger, masker, similarity, perplexity, settings, progress=progress)
    accepted = pd.DataFrame(result.accepted, columns=ACCEPTED_COLUMNS)
    rejected = pd.DataFrame(result.rejected, columns=REJECTED_COLUMNS)
    write_parquet(out_rejected, rejected)
    write_parquet(out_accepted, accepted)
    summary = {
        "shard": shard,
        "counts": result.counts,
        "seconds": {"load_models": round(t_load, 3), "edit": round(time.perf_counter() - t0 - t_load, 3)},
        "provenance": provenance.collect(cfg),
    }
    write_json(out_summary, summary)
    log.info("shard %d: %d captions -> %d counterfactuals", shard, len(part), len(accepted))
    return summary


def merge(shards: list[str | Path], out_parquet: str | Path, out_jsonl: str | Path) -> pd.DataFrame:
    """Concatenate accepted shards (sorted by source_index) and write the release-format JSONL
    (``coco-counterfactual-index, original_caption, counterfactual_caption``)."""
    frames = []
    for path in shards:
        if not Path(path).exists():
            raise input_error(path, None, "caption shard missing", "rerun the caption stage for that shard")
        frames.append(pd.read_parquet(path))
    merged = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ACCEPTED_COLUMNS)
    merged = merged.sort_values("source_index", kind="stable").reset_index(drop=True)
    write_parquet(out_parquet, merged)
    release = pd.DataFrame({
        RELEASE_KEYS[0]: merged["caption_id"], RELEASE_KEYS[1]: merged["original"],
        RELEASE_KEYS[2]: merged["counterfactual"],
    })
    write_text(out_jsonl, release.to_json(orient="records", lines=True, force_ascii=False) if len(release) else "")
    return merged
