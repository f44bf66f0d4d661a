"""``counterfactory captions``: counterfactual captions by noun substitution (COCO-CF §3.1)."""

from __future__ import annotations

from ..config import load_config
from . import add_config_option


def _edit(args) -> int:
    from ..text import caption_stage

    cfg = load_config(args.config)
    caption_stage.run_shard(cfg, args.captions, args.shard, args.out, args.rejected, args.summary,
                            progress=not args.no_progress)
    return 0


def _merge(args) -> int:
    from ..text import caption_stage

    caption_stage.merge(args.shards, args.out, args.jsonl, summaries=args.summaries)
    return 0


def register(sub) -> None:
    p = sub.add_parser("captions", help="counterfactual captions by single-noun substitution (COCO-CF §3.1)",
                       description=__doc__)
    s = p.add_subparsers(dest="captions_command", metavar="<step>")
    s.required = True
    e = s.add_parser("edit", help="run one shard: mask nouns, MLM fills, POS/similarity/perplexity filters")
    add_config_option(e)
    e.add_argument("--captions", required=True, help="caption table parquet from `counterfactory data captions`")
    e.add_argument("--shard", type=int, required=True, help="shard index; rows [shard*size, (shard+1)*size)")
    e.add_argument("--out", required=True, help="accepted counterfactuals (parquet)")
    e.add_argument("--rejected", required=True, help="rejected candidates with reasons (parquet)")
    e.add_argument("--summary", required=True, help="counts, timing, provenance and config_digest (JSON)")
    e.add_argument("--no-progress", action="store_true", help="hide progress bars")
    e.set_defaults(func=_edit)
    m = s.add_parser("merge", help="merge accepted shards; also write the release-format JSONL")
    m.add_argument("shards", nargs="+", help="accepted shard parquet files")
    m.add_argument("--out", required=True, help="merged parquet")
    m.add_argument("--jsonl", required=True, help="release JSONL (coco-counterfactual-index, original_caption, ...)")
    m.add_argument("--summaries", nargs="+", metavar="FILE", default=None,
                   help="the shards' summary JSON files: merging refuses shards whose config_digest differ "
                        "(made with different captions/nltk/model settings)")
    m.set_defaults(func=_merge)
