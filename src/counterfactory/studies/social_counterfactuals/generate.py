"""``counterfactory social generate`` / ``generate-merge``: over-generation of counterfactual image sets
(SocialCounterfactuals §3.3) for one shard of caption sets, and the merge of the shards.

The work is done by :mod:`counterfactory.generation.sets`; this module only wires the command line.
"""

from __future__ import annotations

from ...commands import add_shard_job_options
from . import STUDY


def add_cli(subparsers) -> None:
    """Register ``generate`` and ``generate-merge`` under ``counterfactory social``."""
    g = subparsers.add_parser(
        "generate",
        help="over-generate Prompt-to-Prompt image sets for one shard of caption sets (§3.3)",
        description="SocialCounterfactuals §3.3: for every caption set of the shard (sets ranked "
                    "shard*S .. (shard+1)*S-1 in sorted set_id order, S = images.set_shard_size), generate "
                    "images.candidates_per_set candidate sets (paper: 100), each with p ~ U(0.1, 0.9) and "
                    "guidance ~ U(7.5, 15), all members of a candidate in one batched UNet call sharing the base "
                    "caption's attention. Writes OUT_DIR/images/<set_id>/c<candidate>_m<member>.png, "
                    "OUT_DIR/candidates.parquet (one row per image) and OUT_DIR/summary.json. Finished sets are "
                    "cached in OUT_DIR/work/, so rerunning a killed job resumes and gives identical files. "
                    "No filtering here: the §3.4 filters are later steps.",
    )
    add_shard_job_options(g, "--sets", "SETS.parquet",
                          "caption-set table (set_id, member_index, caption, segment, prefix, subject, a1_type, a1, "
                          "a2_type, a2)")
    g.set_defaults(func=_generate)

    m = subparsers.add_parser(
        "generate-merge",
        help="concatenate the set-generation shards into one candidates table",
        description="Read candidates.parquet and summary.json of every shard folder and write OUT_DIR/"
                    "candidates.parquet (sorted by set_id, candidate, member) and OUT_DIR/summary.json. Image "
                    "paths become relative to OUT_DIR (or, with --copy-images, images are hard-linked/copied to "
                    "OUT_DIR/images/). Refused: a missing shard output or shard number, shards made with "
                    "different settings (config_digest) or from different caption-set tables (sets_digest).",
    )
    m.add_argument("--shard-dirs", nargs="+", required=True, metavar="DIR", help="shard output folders")
    m.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the merged table")
    m.add_argument("--copy-images", action="store_true", help="hard-link (else copy) the images into OUT_DIR/images")
    m.set_defaults(func=_merge)


def _load_config(paths):
    from ...config import load_config

    return load_config(paths, study=STUDY)


def _generate(args) -> int:
    import torch

    from ...generation.sets import run_set_shard

    cfg = _load_config(args.config)
    if args.threads:
        torch.set_num_threads(args.threads)
    s = run_set_shard(cfg, args.sets, args.shard, args.out_dir, progress=not args.no_progress)
    print(f"set shard {args.shard:05d}: {s['sets']} caption sets, {s['candidates_generated']} candidate sets, "
          f"{s['images']} images ({s['unet_evals']} UNet evaluations) -> {args.out_dir}")
    return 0


def _merge(args) -> int:
    from ...generation.sets import merge_set_shards

    s = merge_set_shards(args.shard_dirs, args.out_dir, copy_images=args.copy_images)
    print(f"merged {s['shards']} set shards: {s['sets']} caption sets, {s['images']} images -> {args.out_dir}")
    return 0
