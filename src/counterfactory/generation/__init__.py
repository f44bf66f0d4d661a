"""Counterfactual image generation: Prompt-to-Prompt attention control (:mod:`.p2p`), the batched
sampler (:mod:`.sampler`), seed-deterministic over-generation and CLIP selection (:mod:`.selection`)
and sharded, resumable runs (:mod:`.shards`). :mod:`.engine` re-exports them for older imports."""

from .p2p import MODES, AttentionController, P2PAttnProcessor, apply_alignment, controlled, token_alignment
from .sampler import BatchResult, GenerationSettings, P2PEngine, build_engine
from .selection import Candidate, candidate_seed, generate_set, make_candidate, overgenerate_caption
from .shards import merge_shards, run_shard

__all__ = [
    "AttentionController", "BatchResult", "Candidate", "GenerationSettings", "MODES", "P2PAttnProcessor",
    "P2PEngine", "apply_alignment", "build_engine", "candidate_seed", "controlled", "generate_set",
    "make_candidate", "merge_shards", "overgenerate_caption", "run_shard", "token_alignment",
]
