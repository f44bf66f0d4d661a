"""``counterfactory countercurate generate`` / ``generate-merge``: grounded generation jobs of CounterCurate
(GLIGEN text-box generation §3.2, GLIGEN inpainting §3.3 / appendix C, text-to-image in DALLE-3's role
§3.4) for one shard of requests, and the merge of the shards.

The work is done by :mod:`counterfactory.generation.grounded`; this module only wires the command line.
"""

from __future__ import annotations

from ...commands import add_shard_job_options
from . import STUDY


def add_cli(subparsers) -> None:
    """Register ``generate`` and ``generate-merge`` under ``counterfactory countercurate``."""
    g = subparsers.add_parser(
        "generate",
        help="grounded generation / inpainting / text-to-image for one shard of requests (§3.2-3.4)",
        description="CounterCurate §3.2-3.4: for every request of the shard (items ranked shard*S .. (shard+1)*S-1 "
                    "in sorted item_id order, S = grounded.shard_size) generate one image: kind generate = GLIGEN "
                    "text-box generation (models.gligen), inpaint = GLIGEN text-box inpainting of image_path "
                    "(models.gligen_inpaint), t2i = plain text-to-image (models.t2i, DALLE-3's role). Items of one "
                    "kind run grounded.batch_size at a time; each item's randomness comes from its item_id. "
                    "Writes OUT_DIR/images/<item_id>.png, OUT_DIR/generated.parquet and OUT_DIR/summary.json; "
                    "finished items are cached in OUT_DIR/work/, so a killed job resumes with identical files.",
    )
    add_shard_job_options(g, "--requests", "FILE.parquet",
                          "requests table (item_id, kind, prompt, phrases, boxes, image_path, mask_box)")
    g.set_defaults(func=_generate)

    m = subparsers.add_parser(
        "generate-merge",
        help="concatenate the grounded-generation shards into one table",
        description="Read generated.parquet and summary.json of every shard folder and write OUT_DIR/generated.parquet "
                    "(sorted by item_id; image paths relative to OUT_DIR) and OUT_DIR/summary.json. Refused: a "
                    "missing shard output or shard, shards made with different settings (config_digest) or from "
                    "different requests tables.",
    )
    m.add_argument("--shard-dirs", nargs="+", required=True, metavar="DIR", help="shard output folders")
    m.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the merged table")
    m.set_defaults(func=_merge)

    s = subparsers.add_parser("generate-shards", help="the shard ids of a requests table, one per line")
    s.add_argument("--config", action="append", required=True, metavar="YAML", help="configuration (grounded.shard_size)")
    s.add_argument("--requests", required=True, metavar="FILE.parquet", help="requests table")
    s.add_argument("--out", required=True, metavar="FILE.txt")
    s.set_defaults(func=_shards)


def _shards(args) -> int:
    """Shard ids ``00000`` .. covering the requests at ``grounded.shard_size`` items per shard (at least one)."""
    from ...generation.grounded import GroundedSettings, read_requests
    from ...io import write_text
    from ...workflow import shard_ids

    settings = GroundedSettings.from_config(_load_config(args.config).get("grounded"))
    ids = shard_ids(len(read_requests(args.requests)), settings.shard_size)
    write_text(args.out, "\n".join(ids) + "\n")
    print(f"{len(ids)} shard(s) -> {args.out}")
    return 0


def _load_config(paths):
    from ...config import load_config

    return load_config(paths, study=STUDY)


def _generate(args) -> int:
    import torch

    from ...generation.grounded import run_grounded_shard

    cfg = _load_config(args.config)
    if args.threads:
        torch.set_num_threads(args.threads)
    s = run_grounded_shard(cfg, args.requests, args.shard, args.out_dir, progress=not args.no_progress)
    kinds = ", ".join(f"{n} {k}" for k, n in s["items_by_kind"].items() if n)
    print(f"grounded shard {args.shard:05d}: {s['items']} images ({kinds or 'none'}; {s['items_generated_this_run']} "
          f"generated now in {s['pipeline_calls_this_run']} pipeline calls) -> {args.out_dir}")
    return 0


def _merge(args) -> int:
    from ...generation.grounded import merge_grounded_shards

    s = merge_grounded_shards(args.shard_dirs, args.out_dir)
    print(f"merged {s['shards']} grounded shards: {s['items']} images -> {args.out_dir}")
    return 0
