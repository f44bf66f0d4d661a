"""The caption stage as files: one shard of the caption table in, three files out.

Output schema (parquet, one file per shard; see docs/file-schemas.md):

* accepted: ``caption_id, source_index, image_id, original, counterfactual, original_word, new_word,
  position, similarity, perplexity``
* rejected: ``caption_id, original, candidate, original_word, new_word, position, mlm_rank, reason,
  similarity, perplexity``
* summary (JSON): counts per rejection reason, timing, the models used, provenance, ``config_digest``
  (:func:`captions_config_digest`) and ``warnings`` (e.g. a shard that accepted nothing).

Bad captions in the input table do not stop the shard: a missing / NaN / blank caption becomes one
rejected row with reason ``empty_caption`` and a caption too long for the models one with ``too_long``
(see :mod:`.captions`). Duplicate ``caption_id`` values in the table are an error (ids name files
downstream). :func:`merge` refuses duplicate caption ids across shards and, given the shard
summaries, shards whose ``config_digest`` values differ.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import pandas as pd

from .. import provenance
from ..data.layouts import ACCEPTED_COLUMNS
from ..data.nltk_data import ensure_nltk_data, nltk_source
from ..device import from_config as device_from_config
from ..errors import input_error, missing_input
from ..io import check_digests, config_digest, read_table, write_json, write_parquet, write_text
from ..models import registry
from ..settings import config_value
from . import captions as cap

log = logging.getLogger(__name__)

REJECTED_COLUMNS = ["caption_id", "original", "candidate", "original_word", "new_word", "position", "mlm_rank",
                    "reason", "similarity", "perplexity"]
RELEASE_KEYS = ("coco-counterfactual-index", "original_caption", "counterfactual_caption")
MODEL_ROLES = ("mlm", "lm", "sentence")


def captions_config_digest(cfg) -> str:
    """sha256 over the canonical JSON of the ``captions`` and ``nltk`` sections and the ``mlm``, ``lm``
    and ``sentence`` model entries: what a caption shard's output depends on."""
    return config_digest(cfg, sections=("captions", "nltk"), model_roles=MODEL_ROLES)


def n_shards(n_items: int, shard_size: int) -> int:
    return max(1, math.ceil(n_items / shard_size))


def read_shard(path: str | Path, shard: int, shard_size: int) -> pd.DataFrame:
    """Rows ``[shard*size, (shard+1)*size)`` of the caption table, with their ``source_index``."""
    path = Path(path)
    if not path.exists():
        raise missing_input(path, "caption table", "run `counterfactory data captions` (rule `data_captions`) first")
    if path.suffix.lower() in (".csv", ".tsv"):
        sep = ", sep='\\t'" if path.suffix.lower() == ".tsv" else ""
        raise input_error(path, None, f"a {path.suffix[1:].upper()} file, but the caption table must be parquet",
                          "make the table with `counterfactory data captions` (or `data own-captions` for your own "
                          "data), or convert yours, keeping ids as text: python -c \"import pandas as pd; "
                          f"pd.read_csv('{path.name}'{sep}, dtype={{'caption_id': str}}).to_parquet("
                          f"'{path.stem}.parquet', index=False)\" (columns caption_id, image_id, caption)")
    table = read_table(path, "caption table", "regenerate it with `counterfactory data captions`",
                       formats=("parquet",))
    for col in ("caption_id", "image_id", "caption"):
        if col not in table.columns:
            raise input_error(path, None, f"missing column {col!r}", "regenerate it with `counterfactory data captions`")
    if len(table) and not (pd.api.types.is_object_dtype(table["caption"]) or
                           pd.api.types.is_string_dtype(table["caption"])):
        raise input_error(path, "column 'caption'", f"holds {table['caption'].dtype} values, not text (every caption "
                          "would be rejected as empty_caption)", "write the captions as strings (check that the "
                          "caption column holds the captions), or regenerate the table with `counterfactory data "
                          "captions`")
    if shard < 0 or (shard > 0 and shard * shard_size >= len(table)):
        raise input_error(path, f"shard {shard}", f"out of range for {len(table)} captions at shard size {shard_size}",
                          "use a shard index below ceil(n_captions / shard_size)")
    dup = table["caption_id"].duplicated(keep=False).to_numpy()
    if dup.any():
        cid = table["caption_id"][dup].iloc[0]
        rows = [int(i) for i in (table["caption_id"] == cid).to_numpy().nonzero()[0]]
        raise input_error(path, f"caption_id {cid!r}", f"duplicate caption_id (rows {rows}; "
                          f"{int(table['caption_id'][dup].nunique())} ids are duplicated)",
                          "caption ids must be unique (they name counterfactuals and image files); regenerate "
                          "the table with `counterfactory data captions` or deduplicate it")
    part = table.iloc[shard * shard_size : (shard + 1) * shard_size].copy()
    part.insert(0, "source_index", range(shard * shard_size, shard * shard_size + len(part)))
    return part


def build_models(cfg: dict, settings: cap.EditSettings):
    device, _ = device_from_config(cfg)
    mlm, mlm_tok = registry.load(cfg, "mlm")
    lm, lm_tok = registry.load(cfg, "lm")
    sentence = registry.load(cfg, "sentence", device=str(device))
    return (
        cap.HFFillMasker(mlm, mlm_tok, device=device),
        cap.SentenceSimilarity(sentence, batch_size=settings.batch_size),
        # B.1.1 / reference code: no BOS, first token unscored (false); true = our BOS variant
        cap.CausalLMPerplexity(lm, lm_tok, device=device,
                               prepend_bos=bool(config_value(cfg["captions"],
                                                                "coco_counterfactuals.captions.perplexity_prepend_bos"))),
    )


def run_shard(cfg: dict, table: str | Path, shard: int, out_accepted: str | Path, out_rejected: str | Path,
              out_summary: str | Path, progress: bool = True, *, models=None, tagger=None) -> dict:
    """Edit one shard. ``models`` = ``(masker, similarity, perplexity)`` and ``tagger`` replace the
    configured models and NLTK (tests pass fakes); by default they are loaded from ``cfg``."""
    section = cfg["captions"]
    settings = cap.EditSettings.from_config(section)
    part = read_shard(table, shard, section["shard_size"])
    if tagger is None:
        # the paper config refuses the home-built tagger (it would change which nouns are masked)
        ensure_nltk_data(cfg["nltk"]["data_dir"], source=nltk_source(cfg))
        tagger = cap.nltk_tagger
    t0 = time.perf_counter()
    masker, similarity, perplexity = models if models is not None else build_models(cfg, settings)
    t_load = time.perf_counter() - t0
    records = part[["caption_id", "source_index", "image_id", "caption"]].to_dict("records")
    for r in records:   # NaN (a missing caption in parquet) is rejected as empty_caption, not tagged
        if not cap.usable_caption(r["caption"]):
            r["caption"] = None
    result = cap.edit_captions(records, tagger, masker, similarity, perplexity, settings, progress=progress)
    accepted = pd.DataFrame(result.accepted, columns=ACCEPTED_COLUMNS)
    rejected = pd.DataFrame(result.rejected, columns=REJECTED_COLUMNS)
    write_parquet(out_rejected, rejected)
    write_parquet(out_accepted, accepted)
    warnings = []
    if len(part) and not len(accepted):
        by_reason = {k: v for k, v in result.counts.get("rejected_by_reason", {}).items() if v}
        warnings.append(f"shard {shard} accepted no counterfactual from {len(part)} captions "
                        f"(rejections by reason: {by_reason or 'none'}; captions without nouns: "
                        f"{result.counts.get('no_nouns', 0)}); check the models and the similarity band "
                        f"captions.similarity_low/high in the config")
    for w in warnings:
        log.warning("%s: %s", table, w)
    summary = {
        "shard": shard,
        "counts": result.counts,
        "accepted_nothing": bool(len(part) and not len(accepted)),
        "warnings": warnings,
        "config_digest": captions_config_digest(cfg),
        "seconds": {"load_models": round(t_load, 3), "edit": round(time.perf_counter() - t0 - t_load, 3)},
        "provenance": provenance.collect(cfg),
    }
    write_json(out_summary, summary)
    log.info("shard %d: %d captions -> %d counterfactuals", shard, len(part), len(accepted))
    return summary


def merge(shards: list[str | Path], out_parquet: str | Path, out_jsonl: str | Path,
          summaries: list[str | Path] | None = None) -> pd.DataFrame:
    """Concatenate accepted shards (sorted by source_index) and write the release-format JSONL
    (``coco-counterfactual-index, original_caption, counterfactual_caption``).

    A caption id in two shards (or twice in one) is an error naming both shards. With ``summaries``
    (the shards' summary JSON files) every summary must record the same ``config_digest``."""
    import json

    if summaries:
        docs = {}
        for path in summaries:
            if not Path(path).exists():
                raise input_error(path, None, "caption shard summary missing", "rerun the caption stage for that shard")
            try:
                docs[str(path)] = json.loads(Path(path).read_text(encoding="utf-8"))
            except ValueError as exc:
                raise input_error(path, None, f"not valid JSON ({exc})", "rerun the caption stage for that shard") from exc
        check_digests(docs, "caption shard", "`counterfactory captions edit`")
    frames = []
    owner: dict[str, str] = {}
    for path in shards:
        if not Path(path).exists():
            raise input_error(path, None, "caption shard missing", "rerun the caption stage for that shard")
        frame = pd.read_parquet(path)
        for cid in frame["caption_id"].astype(str):
            if cid in owner:
                where = "twice in this shard" if owner[cid] == str(path) else f"also in {owner[cid]}"
                raise input_error(path, f"caption_id {cid!r}", f"duplicate caption_id ({where})",
                                  "each caption belongs to exactly one shard; rerun the caption stage with one "
                                  "shard size and merge only that run's shards")
            owner[cid] = str(path)
        frames.append(frame)
    merged = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ACCEPTED_COLUMNS)
    merged = merged.sort_values("source_index", kind="stable").reset_index(drop=True)
    write_parquet(out_parquet, merged)
    release = pd.DataFrame({
        RELEASE_KEYS[0]: merged["caption_id"], RELEASE_KEYS[1]: merged["original"],
        RELEASE_KEYS[2]: merged["counterfactual"],
    })
    write_text(out_jsonl, release.to_json(orient="records", lines=True, force_ascii=False) if len(release) else "")
    return merged
