"""``counterfactory images {generate,merge,adaptive-curve}``: COCO-Counterfactuals image stage (§3.2, B.1.2).

``generate`` over-generates Prompt-to-Prompt image pairs for one shard of caption pairs, filters them
with CLIP and keeps the best by directional similarity; ``merge`` concatenates the shards; ``adaptive-curve``
(declared in :mod:`.adaptive`) replays adaptive stopping rules from a fixed-mode run. The command line only,
declared as data (``commands.Step``); the work is :mod:`counterfactory.generation.shards`.
"""

from __future__ import annotations

import logging

from . import OUT_DIR, SHARD_DIRS, Step, registrar, shard_job_params, use_threads
from .adaptive import ADAPTIVE_CURVE

log = logging.getLogger(__name__)


def _generate(args) -> int:
    from ..config import load_config
    from ..generation.shards import run_shard

    cfg = load_config(args.config)
    use_threads(args)
    summary = run_shard(cfg, args.pairs, args.shard, args.out_dir, progress=not args.no_progress)
    print(f"shard {args.shard:05d}: {summary['pairs_selected']} pairs selected for "
          f"{summary['captions_with_selection']}/{summary['captions']} captions "
          f"({summary['captions_rejected']} rejected as bad input, {summary['candidates_generated']} candidates, "
          f"{summary['unet_evals']} UNet evaluations) -> {args.out_dir}")
    return 0


def _merge(args) -> int:
    from ..generation.shards import merge_shards

    summary = merge_shards(args.shard_dirs, args.out_dir)
    print(f"merged {summary['shards']} shards: {summary['pairs_selected']} selected pairs from "
          f"{summary['captions']} captions -> {args.out_dir}")
    return 0


GENERATE = Step(
    "generate", help="generate, filter and select image pairs for one shard of caption pairs",
    description="Process the caption pairs whose source_index lies in [shard*S, (shard+1)*S) "
                "(S = images.shard_size). Writes OUT_DIR/images/{id}_img_{0|1}.png, "
                "OUT_DIR/selected_pairs.parquet (id, caption_0, caption_1, image_0, image_1, scores...), "
                "OUT_DIR/candidate_scores.parquet (every candidate's seed, p, guidance and CLIP scores) and "
                "OUT_DIR/summary.json (counts, rejected captions, UNet evaluations). Finished captions are "
                "cached in OUT_DIR/work/, so rerunning a killed job resumes and gives identical files.",
    params=shard_job_params("--pairs", "PAIRS.parquet",
                            "caption-pair table from the caption stage (counterfactual_captions.parquet)"),
    run=_generate)

MERGE = Step(
    "merge", help="concatenate shard outputs into one selected-pairs table and one candidate-scores table",
    description="Read selected_pairs.parquet, candidate_scores.parquet and summary.json from every shard "
                "folder and write them, sorted by source_index, to OUT_DIR; image paths in the merged "
                "table are relative to OUT_DIR. A missing shard output is an error, and so are shards whose "
                "summaries record different config_digest values (made with different images/seed/model "
                "settings: rerun them).",
    params=(SHARD_DIRS, OUT_DIR.but(help="folder for the merged tables")),
    run=_merge)

IMAGES = Step(
    "images", help="generate counterfactual image pairs with Prompt-to-Prompt and select them with CLIP",
    description="COCO-Counterfactuals §3.2 / B.1.2: for every (original, counterfactual) caption pair, "
                "over-generate candidate image pairs with Prompt-to-Prompt attention control (per "
                "candidate p ~ U(0.1, 0.9), guidance ~ U(7.5, 15)), score them with CLIP (image-caption "
                ">= 0.2, image-image >= 0.7, directional >= 0.2) and keep the best by directional "
                "similarity. All settings live under `images:` in the config.",
    steps=(GENERATE, MERGE, ADAPTIVE_CURVE), metavar="<images command>")

register = registrar(IMAGES)
