"""``counterfactory captions``: counterfactual captions by noun substitution (COCO-CF §3.1). This module is the
command line only, declared as data (``commands.Step``); the work is :mod:`counterfactory.text.caption_stage`."""

from __future__ import annotations

from ..config import load_config
from . import CONFIG, NO_PROGRESS, OUT, Param, Step, lazy_module, registrar

# imported when a subcommand runs (the caption stage imports the models); building the parser does not
caption_stage = lazy_module("counterfactory.text.caption_stage")


def _edit(args) -> int:
    cfg = load_config(args.config)
    caption_stage.run_shard(cfg, args.captions, args.shard, args.out, args.out_rejected, args.out_summary,
                            progress=not args.no_progress)
    return 0


def _merge(args) -> int:
    caption_stage.merge(args.shards, args.out, args.jsonl, summaries=args.summaries)
    return 0


EDIT = Step(
    "edit", help="run one shard: mask nouns, MLM fills, POS/similarity/perplexity filters",
    description="Reads one shard of the caption table (from `counterfactory data captions`) and writes the accepted "
                "counterfactual captions and the rejected candidates (parquet), and a JSON summary of counts, timing "
                "and provenance.",
    params=(CONFIG,
            Param("--captions", required=True, help="caption table parquet from `counterfactory data captions`"),
            Param("--shard", type=int, required=True, help="shard index; rows [shard*size, (shard+1)*size)"),
            OUT.but(metavar=None, help="accepted counterfactuals (parquet)"),
            Param("--out-rejected", former=("--rejected",), required=True, metavar="FILE.parquet",
                  help="rejected candidates with reasons (parquet)"),
            Param("--out-summary", former=("--summary",), required=True, metavar="FILE.json",
                  help="counts, timing, provenance and config_digest (JSON)"),
            NO_PROGRESS),
    run=_edit)

MERGE = Step(
    "merge", help="merge accepted shards; also write the release-format JSONL",
    description="Reads the accepted-caption parquet files of every shard (and, with --summaries, their summaries); "
                "writes one merged parquet table and the release-format JSONL.",
    params=(Param("shards", nargs="+", help="accepted shard parquet files"),
            OUT.but(metavar=None, help="merged parquet"),
            Param("--jsonl", required=True, help="release JSONL (coco-counterfactual-index, original_caption, ...)"),
            Param("--summaries", nargs="+", metavar="FILE", default=None,
                  help="the shards' summary JSON files: merging refuses shards whose config_digest differ (made with "
                       "different captions/nltk/model settings)")),
    run=_merge)

CAPTIONS = Step(
    "captions", help="counterfactual captions by single-noun substitution (COCO-CF §3.1)",
    description="Counterfactual captions by single-noun substitution (COCO-Counterfactuals §3.1): one job per shard "
                "of captions, then a merge.",
    steps=(EDIT, MERGE))

register = registrar(CAPTIONS)
