"""Compatibility re-exports: the image stage now lives in three modules.

* :mod:`.sampler` — batched Prompt-to-Prompt engine (settings, prompts, latents, UNet loop, decode);
* :mod:`.selection` — candidates and seeds, over-generation, CLIP scoring and top-k selection;
* :mod:`.shards` — the shard runner with its resume cache, shard assembly and merge.

``benchmarks/bench_p2p.py`` and older code import from here; new code should import from those modules.
"""

from __future__ import annotations

from .sampler import SCHEDULERS, BatchResult, GenerationSettings, P2PEngine, build_engine
from .selection import (Candidate, CaptionOutcome, SelectionSettings, candidate_batches, candidate_seed,
                        generate_set, make_candidate, overgenerate_caption)
from .shards import (OPTIONAL_COLUMNS, PAIR_COLUMNS, SCORE_SCHEMA, SELECTED_SCHEMA, ShardContext,
                     images_config_digest, merge_shards, read_pairs, run_shard)

__all__ = [
    "BatchResult", "Candidate", "CaptionOutcome", "GenerationSettings", "OPTIONAL_COLUMNS", "P2PEngine",
    "PAIR_COLUMNS", "SCHEDULERS", "SCORE_SCHEMA", "SELECTED_SCHEMA", "SelectionSettings", "ShardContext",
    "build_engine", "candidate_batches", "candidate_seed", "generate_set", "images_config_digest",
    "make_candidate", "merge_shards", "overgenerate_caption", "read_pairs", "run_shard",
]
