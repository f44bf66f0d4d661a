"""``counterfactory captions``: counterfactual captions by noun substitution (COCO-CF §3.1)."""

from __future__ import annotations

from ..config import load_config
from . import add_config_option, add_progress_option, add_renamed


def _edit(args) -> int:
    from ..text import caption_stage

    cfg = load_config(args.config)
    caption_stage.run_shard(cfg, args.captions, args.shard, args.out, args.out_rejected, args.out_summary,
                            progress=not args.no_progress)
    return 0


def _merge(args) -> int:
    from ..text import caption_stage

    caption_stage.merge(args.shards, args.out, args.jsonl, summaries=args.summaries)
    return 0


def register(sub) -> None:
    p = sub.add_parser("captions", help="counterfactual captions by single-noun substitution (COCO-CF §3.1)",
                       description="Counterfactual captions by single-noun substitution (COCO-Counterfactuals "
                                   "§3.1): one job per shard of captions, then a merge.")
    s = p.add_subparsers(dest="captions_command", metavar="<step>")
    s.required = True
    e = s.add_parser("edit", help="run one shard: mask nouns, MLM fills, POS/similarity/perplexity filters",
                     description="Reads one shard of the caption table (from `counterfactory data captions`) "
                                 "and writes the accepted counterfactual captions and the rejected candidates "
                                 "(parquet), and a JSON summary of counts, timing and provenance.")
    add_config_option(e)
    e.add_argument("--captions", required=True, help="caption table parquet from `counterfactory data captions`")
    e.add_argument("--shard", type=int, required=True, help="shard index; rows [shard*size, (shard+1)*size)")
    e.add_argument("--out", required=True, help="accepted counterfactuals (parquet)")
    add_renamed(e, "--out-rejected", "--rejected", required=True, metavar="FILE.parquet",
                help="rejected candidates with reasons (parquet)")
    add_renamed(e, "--out-summary", "--summary", required=True, metavar="FILE.json",
                help="counts, timing, provenance and config_digest (JSON)")
    add_progress_option(e)
    e.set_defaults(func=_edit)
    m = s.add_parser("merge", help="merge accepted shards; also write the release-format JSONL",
                     description="Reads the accepted-caption parquet files of every shard (and, with "
                                 "--summaries, their summaries); writes one merged parquet table and the "
                                 "release-format JSONL.")
    m.add_argument("shards", nargs="+", help="accepted shard parquet files")
    m.add_argument("--out", required=True, help="merged parquet")
    m.add_argument("--jsonl", required=True, help="release JSONL (coco-counterfactual-index, original_caption, ...)")
    m.add_argument("--summaries", nargs="+", metavar="FILE", default=None,
                   help="the shards' summary JSON files: merging refuses shards whose config_digest differ "
                        "(made with different captions/nltk/model settings)")
    m.set_defaults(func=_merge)
