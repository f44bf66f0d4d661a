"""Candidates, seeds, over-generation and CLIP selection of one caption pair (or set).

COCO-Counterfactuals §3.2 / B.1.2 over-generate 100 image pairs per caption pair, ``p ~ U(0.1, 0.9)``
per sample, then filter and select with CLIP (:mod:`counterfactory.filters`).

Randomness is a function of ``(global seed, caption id, candidate index)`` only
(:func:`candidate_seed`): the candidate's seed fixes ``p``, the guidance scale, and (in
:mod:`.sampler`) the initial latent and the sampler noise, so a candidate's images do not depend on
the batch size, the shard layout or how many jobs ran.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from ..filters import SCORE_COLUMNS, apply_thresholds, select_top
from .sampler import BatchResult, GenerationSettings, P2PEngine


# --------------------------------------------------------------------------- candidates and seeds

@dataclass(frozen=True)
class Candidate:
    """One over-generation sample: its index, 64-bit seed, attention fraction ``p`` and guidance."""

    index: int
    seed: int
    p: float
    guidance: float


def candidate_seed(global_seed: int, caption_id: str, index: int) -> int:
    """64-bit seed: first 8 bytes (big-endian) of sha256(f"{global_seed}:{caption_id}:{index}")."""
    digest = hashlib.sha256(f"{global_seed}:{caption_id}:{index}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def make_candidate(global_seed: int, caption_id: str, index: int, settings: GenerationSettings) -> Candidate:
    """The candidate's seed, then ``p ~ U(p_range)`` and guidance ``~ U(guidance_range)`` from it."""
    seed = candidate_seed(global_seed, caption_id, index)
    rng = np.random.Generator(np.random.PCG64(seed))
    p = float(rng.uniform(*settings.p_range))
    guidance = float(rng.uniform(*settings.guidance_range))
    return Candidate(index=index, seed=seed, p=p, guidance=guidance)


def candidate_batches(global_seed: int, caption_id: str, n: int, settings: GenerationSettings,
                      batch_size: int | None = None) -> Iterator[list[Candidate]]:
    """Candidates 0..n-1 of one caption in batches (batches never mix captions)."""
    bs = batch_size or settings.batch_size
    for start in range(0, n, bs):
        yield [make_candidate(global_seed, caption_id, i, settings) for i in range(start, min(n, start + bs))]


def generate_set(engine: P2PEngine, base: str, edits: Sequence[str], set_id: str, n: int,
                 global_seed: int = 0) -> Iterator[BatchResult]:
    """Counterfactual *sets* (SocialCounterfactuals §3.3): one base prompt plus K edited prompts per
    batch member group, all sharing the base member's initial latent, sampler noise and attention."""
    if not edits:
        raise ValueError("a counterfactual set needs at least one edited prompt")
    for batch in candidate_batches(global_seed, set_id, n, engine.settings):
        yield engine.generate([base, *edits], batch)


# --------------------------------------------------------------------------- per-caption over-generation

@dataclass
class CaptionOutcome:
    """Everything kept from one caption's over-generation."""

    scores: list[dict]
    selected: list[tuple[int, int, np.ndarray, np.ndarray]]   # (rank, candidate index, image 0, image 1)
    unet_evals: int
    stopped_early: bool
    all_images: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class SelectionSettings:
    #: what the CLIP filter scores: ``decoded`` (the float images before quantisation, B.1.2 / InstructPix2Pix's
    #: filter) or ``png`` (the saved 8-bit images); config ``images.filter.score_images`` (default in the schema)
    score_images: str
    top_k: int = 1
    adaptive: bool = False
    target_accepted: int | None = None
    keep_all_images: bool = False

    @property
    def target(self) -> int:
        return self.target_accepted or self.top_k


def overgenerate_caption(engine: P2PEngine, scorer, thresholds, caption_id: str, original: str,
                         counterfactual: str, n: int, global_seed: int, selection: SelectionSettings) -> CaptionOutcome:
    """Generate ``n`` candidate pairs (fewer in adaptive mode), score, filter and select the top k.

    Adaptive mode (our addition, off in paper mode) stops after the first batch at which at least
    ``target_accepted`` (default ``top_k``) candidates have passed the filter.
    """
    scores: list[dict] = []
    kept: dict[int, tuple[np.ndarray, np.ndarray]] = {}    # images of current top-k (or all)
    all_images: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    evals0 = engine.unet_evals
    n_passed = 0
    stopped = False
    decoded = selection.score_images == "decoded"
    if not decoded and selection.score_images != "png":
        raise ValueError(f"images.filter.score_images: {selection.score_images!r} is not decoded or png")
    for batch in candidate_batches(global_seed, caption_id, n, engine.settings):
        res = engine.generate([original, counterfactual], batch, float_images=decoded)
        scored = res.float_images if decoded else res.images       # the PNGs hold res.images either way
        sc = scorer.score_pairs(original, counterfactual, scored[:, 0], scored[:, 1])
        labels = [f"{caption_id}#{c.index}" for c in batch]
        passed, reasons = apply_thresholds(sc, thresholds, labels)
        for j, c in enumerate(batch):
            scores.append({
                "caption_id": caption_id, "candidate_index": c.index, "seed": np.uint64(c.seed),
                "p": c.p, "guidance": c.guidance,
                **{k: float(sc[k][j]) for k in SCORE_COLUMNS},
                "passed": bool(passed[j]), "reject_reason": reasons[j],
            })
            if selection.keep_all_images:
                all_images[c.index] = (res.images[j, 0], res.images[j, 1])
            if passed[j]:
                kept[c.index] = (res.images[j, 0], res.images[j, 1])
        n_passed += int(passed.sum())
        # keep only the images that can still be selected (memory stays bounded)
        top = select_top([r["candidate_index"] for r in scores], [r["sim_direction"] for r in scores],
                         [r["passed"] for r in scores], selection.top_k)
        keep_idx = {scores[i]["candidate_index"] for i in top}
        kept = {k: v for k, v in kept.items() if k in keep_idx}
        if selection.adaptive and n_passed >= selection.target and len(scores) < n:
            stopped = True
            break
    top = select_top([r["candidate_index"] for r in scores], [r["sim_direction"] for r in scores],
                     [r["passed"] for r in scores], selection.top_k)
    rank_of = {scores[i]["candidate_index"]: r for r, i in enumerate(top)}
    for r in scores:
        r["selected"] = r["candidate_index"] in rank_of
        r["rank"] = rank_of.get(r["candidate_index"], -1)
    selected = [(rank_of[i], i, *kept[i]) for i in sorted(rank_of, key=rank_of.get)]
    return CaptionOutcome(scores=scores, selected=selected, unet_evals=engine.unet_evals - evals0,
                          stopped_early=stopped, all_images=all_images)
