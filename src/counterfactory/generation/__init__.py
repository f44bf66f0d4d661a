"""Counterfactual image generation: Prompt-to-Prompt attention control (:mod:`.p2p`) and batched,
seed-deterministic over-generation with sharded, resumable runs (:mod:`.engine`)."""

from .engine import (BatchResult, Candidate, GenerationSettings, P2PEngine, build_engine, candidate_seed,
                     generate_set, make_candidate, merge_shards, overgenerate_caption, run_shard)
from .p2p import MODES, AttentionController, P2PAttnProcessor, apply_alignment, controlled, token_alignment

__all__ = [
    "AttentionController", "BatchResult", "Candidate", "GenerationSettings", "MODES", "P2PAttnProcessor",
    "P2PEngine", "apply_alignment", "build_engine", "candidate_seed", "controlled", "generate_set",
    "make_candidate", "merge_shards", "overgenerate_caption", "run_shard", "token_alignment",
]
