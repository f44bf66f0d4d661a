"""Prompt-to-Prompt attention control for diffusers' ``UNet2DConditionModel``, as attention processors.

Batch layout
------------
One UNet call denoises ``B`` *candidates*, each a *group* of ``G`` prompts: member 0 is the base
(original) prompt, members 1..G-1 are edited prompts (``G = 2`` for a COCO-Counterfactuals pair,
``G = 1 + K`` for a SocialCounterfactuals set). With classifier-free guidance the UNet sees
``R = 2·B·G`` rows::

    row = half · (B·G) + b · G + g        half 0 = unconditional, half 1 = conditional

Control modes (per candidate ``b`` with its own fraction ``p_b``; step ``i`` of ``T``, fraction ``i/T``)
--------------------------------------------------------------------------------------------------
``ip2p_self``
    InstructPix2Pix's variant (Brooks et al. 2023, used by COCO-Counterfactuals §3.2 / B.1.2):
    while ``i/T < p_b`` every edited member's **self-attention** probabilities are replaced by the
    base member's (same candidate, same CFG half; both halves are controlled). The edited member
    still attends over its *own* values, so only the spatial layout is shared.
``hertz_cross``
    Hertz et al. (2022) word swap: while ``i/T < p_b`` every edited member's **cross-attention**
    probabilities (conditional half only; the unconditional prompts are identical) are the base
    member's, carried over to the edited prompt's tokens by :func:`token_alignment` so that swapped
    words of different token lengths line up. Optionally self-attention is also copied while
    ``i/T < self_fraction`` (a fixed fraction, 0 by default).
``none``
    No attention control (the members only share the initial latent and the sampler noise).

The base member's rows are never modified, so control cannot change the original image: the
processors compute attention explicitly (softmax(QKᵀ·scale)·V, like diffusers' ``AttnProcessor``)
for every row in every mode, so the base rows follow exactly the same arithmetic with and without
control. This implementation is our own; it does not reuse Prompt-to-Prompt code.
"""

from __future__ import annotations

import contextlib
import difflib
from typing import Iterator, Sequence

import numpy as np
import torch

MODES = ("ip2p_self", "hertz_cross", "none")

#: attention-probability elements materialised at once (rows·heads·queries·keys); larger batches are
#: processed in chunks aligned to candidate groups (never splits a base row from its edited rows)
DEFAULT_MAX_ELEMENTS = 2**28


def token_alignment(src_ids: Sequence[int], dst_ids: Sequence[int]) -> np.ndarray:
    """Map attention over ``src_ids`` tokens onto ``dst_ids`` tokens: matrix ``M`` of shape (Ls, Ld).

    ``M[i, j]`` is the share of the attention paid to source token ``i`` that goes to destination
    token ``j`` (so edited-prompt attention = base attention @ M). Built from a longest-matching-block
    diff of the two token-id sequences (``difflib``, no junk heuristic):

    * equal runs map one-to-one (tokens after a swapped word shift by the length difference);
    * a replaced run (the swapped word: ``k`` source tokens -> ``m`` destination tokens) spreads each
      source token's attention evenly over the ``m`` destination tokens (weight ``1/m``);
    * source tokens with no counterpart (e.g. padding pushed off the end) map nowhere, destination
      tokens with no source receive nothing; :func:`apply_alignment` renormalises rows to sum to 1.
    """
    src, dst = list(src_ids), list(dst_ids)
    m = np.zeros((len(src), len(dst)), dtype=np.float32)
    matcher = difflib.SequenceMatcher(None, src, dst, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for t in range(i2 - i1):
                m[i1 + t, j1 + t] = 1.0
        elif op == "replace":
            m[i1:i2, j1:j2] = 1.0 / (j2 - j1)
        # "delete": source tokens without counterpart; "insert": destination tokens without source
    return m


def apply_alignment(probs: torch.Tensor, mapping: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Carry attention probabilities over keys (last dim) through ``mapping`` and renormalise rows.

    ``probs``: (..., Ls); ``mapping``: (Ls, Ld) or broadcastable batch (..., Ls, Ld) matching the
    leading dim of ``probs`` when 4-D. Returns (..., Ld) with rows summing to 1.
    """
    if mapping.dim() == 2:
        out = probs @ mapping
    else:  # probs (n, heads, q, Ls), mapping (n, Ls, Ld)
        out = torch.einsum("nhqs,nsd->nhqd", probs, mapping)
    return out / out.sum(dim=-1, keepdim=True).clamp_min(eps)


class AttentionController:
    """State shared by every :class:`P2PAttnProcessor` of one UNet: which rows copy from which.

    Call :meth:`configure` once per batch and :meth:`set_step` before every UNet call; between
    batches :meth:`reset` makes every processor a plain attention.
    """

    def __init__(self, mode: str = "ip2p_self", self_fraction: float = 0.0,
                 max_elements: int = DEFAULT_MAX_ELEMENTS):
        if mode not in MODES:
            raise ValueError(f"unknown attention control mode {mode!r}; use one of {MODES}")
        self.mode = mode
        self.self_fraction = float(self_fraction)
        self.max_elements = int(max_elements)
        self.reset()

    # ------------------------------------------------------------------ batch / step state
    def reset(self) -> None:
        self.n_candidates = 0
        self.group_size = 0
        self.p: torch.Tensor | None = None
        self.maps: torch.Tensor | None = None
        self.self_src: torch.Tensor | None = None     # (R,) long, or None when nothing is copied
        self.cross_map_index: torch.Tensor | None = None  # (R,) long, -1 = untouched
        self.cross_src: torch.Tensor | None = None
        self.calls = {"self": 0, "cross": 0, "self_edited": 0, "cross_edited": 0}

    def configure(self, n_candidates: int, group_size: int, p: Sequence[float],
                  maps: torch.Tensor | None = None) -> None:
        """Set up a batch of ``n_candidates`` groups of ``group_size`` members with fractions ``p``.

        ``maps`` (``hertz_cross`` only): (G, L, L) token alignments from the base prompt to each
        member (row 0 unused).
        """
        if group_size < 2:
            raise ValueError("a candidate needs a base prompt and at least one edited prompt")
        if len(p) != n_candidates:
            raise ValueError(f"{len(p)} fractions p for {n_candidates} candidates")
        if self.mode == "hertz_cross" and maps is None:
            raise ValueError("hertz_cross control needs the token alignment maps")
        self.n_candidates = int(n_candidates)
        self.group_size = int(group_size)
        self.p = torch.as_tensor(np.asarray(p, dtype=np.float64))
        self.maps = maps
        self.self_src = self.cross_src = self.cross_map_index = None

    @property
    def rows(self) -> int:
        return 2 * self.n_candidates * self.group_size

    def set_step(self, step: int, total: int) -> None:
        """Activate control for the candidates whose fraction exceeds ``step / total``."""
        if self.n_candidates == 0:
            return
        frac = step / total
        b, g = self.n_candidates, self.group_size
        rows = torch.arange(self.rows)
        base_rows = rows - (rows % g)                 # row of member 0 of the same candidate and half
        member = rows % g
        cand = (rows % (b * g)) // g
        half = rows // (b * g)
        self_on = torch.zeros(b, dtype=torch.bool)
        cross_on = torch.zeros(b, dtype=torch.bool)
        if self.mode == "ip2p_self":
            self_on = frac < self.p
        elif self.mode == "hertz_cross":
            cross_on = frac < self.p
            self_on = torch.full((b,), frac < self.self_fraction, dtype=torch.bool)
        copy_self = self_on[cand] & (member > 0)
        self.self_src = torch.where(copy_self, base_rows, rows) if bool(copy_self.any()) else None
        copy_cross = cross_on[cand] & (member > 0) & (half == 1)
        if bool(copy_cross.any()):
            self.cross_src = torch.where(copy_cross, base_rows, rows)
            self.cross_map_index = torch.where(copy_cross, member, torch.full_like(member, -1))
        else:
            self.cross_src = self.cross_map_index = None

    # ------------------------------------------------------------------ editing
    def _chunks(self, rows: int, per_row: int) -> Iterator[tuple[int, int]]:
        g = max(self.group_size, 1)
        groups = max(1, self.max_elements // max(per_row * g, 1))
        step = groups * g
        for r0 in range(0, rows, step):
            yield r0, min(rows, r0 + step)

    def edit(self, probs: torch.Tensor, r0: int, r1: int, is_cross: bool) -> torch.Tensor:
        """Edit probabilities (rows r0..r1, heads, q, k) of one chunk; sources lie inside the chunk."""
        kind = "cross" if is_cross else "self"
        self.calls[kind] += 1
        if self.n_candidates == 0:
            return probs
        if probs.shape[0] != r1 - r0 or r1 > self.rows:
            raise RuntimeError(
                f"attention control was configured for {self.rows} UNet rows but got rows {r0}..{r1}; "
                f"configure the controller for every batch"
            )
        if not is_cross:
            if self.self_src is None:
                return probs
            src = self.self_src[r0:r1] - r0
            self.calls["self_edited"] += 1
            return probs.index_select(0, src.to(probs.device))
        if self.cross_src is None:
            return probs
        idx = self.cross_map_index[r0:r1]
        active = idx >= 0
        if not bool(active.any()):
            return probs
        self.calls["cross_edited"] += 1
        dev = probs.device
        rows_active = torch.nonzero(active).flatten().to(dev)
        src = (self.cross_src[r0:r1][active] - r0).to(dev)
        maps = self.maps.to(device=dev, dtype=probs.dtype)[idx[active].to(dev)]
        out = probs.clone()
        out[rows_active] = apply_alignment(probs[src], maps)
        return out


class P2PAttnProcessor:
    """Attention processor computing softmax(QKᵀ·scale)·V explicitly so the controller can edit it."""

    def __init__(self, controller: AttentionController):
        self.controller = controller

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, temb: torch.Tensor | None = None) -> torch.Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            n, channels, height, width = hidden_states.shape
            hidden_states = hidden_states.view(n, channels, height * width).transpose(1, 2)
        is_cross = encoder_hidden_states is not None
        rows, key_len = (encoder_hidden_states if is_cross else hidden_states).shape[:2]
        attention_mask = attn.prepare_attention_mask(attention_mask, key_len, rows)
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)
        context = hidden_states
        if is_cross:
            context = attn.norm_encoder_hidden_states(encoder_hidden_states) if attn.norm_cross else encoder_hidden_states
        key, value = attn.to_k(context), attn.to_v(context)
        heads = attn.heads
        query = attn.head_to_batch_dim(query)    # (rows·heads, q, d)
        key = attn.head_to_batch_dim(key)
        value = attn.head_to_batch_dim(value)
        q_len = query.shape[1]

        outputs = []
        ctrl = self.controller
        for r0, r1 in ctrl._chunks(rows, heads * q_len * key_len):
            sl = slice(r0 * heads, r1 * heads)
            mask = attention_mask[sl] if attention_mask is not None else None
            probs = attn.get_attention_scores(query[sl], key[sl], mask)
            probs = probs.view(r1 - r0, heads, q_len, key_len)
            probs = ctrl.edit(probs, r0, r1, is_cross)
            probs = probs.reshape((r1 - r0) * heads, q_len, key_len).to(value.dtype)
            outputs.append(torch.bmm(probs, value[sl]))
        hidden_states = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
        hidden_states = attn.batch_to_head_dim(hidden_states)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(n, channels, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


@contextlib.contextmanager
def controlled(unet, controller: AttentionController) -> Iterator[AttentionController]:
    """Install :class:`P2PAttnProcessor` on every attention layer of ``unet``; restore on exit."""
    original = dict(unet.attn_processors)
    unet.set_attn_processor({name: P2PAttnProcessor(controller) for name in original})
    try:
        yield controller
    finally:
        unet.set_attn_processor(original)


def install(unet, controller: AttentionController) -> dict:
    """Install the processors permanently; returns the previous processors (for ``set_attn_processor``)."""
    original = dict(unet.attn_processors)
    unet.set_attn_processor({name: P2PAttnProcessor(controller) for name in original})
    return original
