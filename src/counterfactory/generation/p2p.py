"""Prompt-to-Prompt attention control for diffusers' ``UNet2DConditionModel``, as attention processors.

Batch layout
------------
One UNet call denoises ``B`` *candidates*, each a *group* of ``G`` prompts: member 0 is the base
(original) prompt, members 1..G-1 are edited prompts (``G = 2`` for a COCO-Counterfactuals pair,
``G = 1 + K`` for a SocialCounterfactuals set). With classifier-free guidance the UNet sees
``R = 2·B·G`` rows::

    row = half · (B·G) + b · G + g        half 0 = unconditional, half 1 = conditional

Control modes (per candidate ``b`` with its own fraction ``p_b``; step index ``i = 0..T-1`` of ``T``)
--------------------------------------------------------------------------------------------------
``ip2p_self``
    InstructPix2Pix's variant (Brooks et al. 2023, used by COCO-Counterfactuals §3.2 / B.1.2):
    while ``i/(T-1) < p_b`` (strict; :func:`ip2p_active`) every edited member's **self-attention**
    probabilities are replaced by the base member's (same candidate, same CFG half; both halves are
    controlled). The edited member still attends over its *own* values, so only the spatial layout is
    shared. The step fraction is InstructPix2Pix's generator's (``dataset_creation/
    generate_img_dataset.py``, ``sample_euler_ancestral``: copy at step ``i`` iff
    ``threshold > i / (len(sigmas) - 2)`` with ``len(sigmas) = T + 1``), so the last step has fraction
    1 and e.g. T = 100, p = 0.333 copies at steps 0..32 (33 steps; ``i/T`` would give 34). For T = 1
    the only step has fraction 0.
``hertz_cross``
    Hertz et al. (2022) word swap: while ``i/T < p_b`` every edited member's **cross-attention**
    probabilities (conditional half only; the unconditional prompts are identical) are the base
    member's, carried over to the edited prompt's tokens by :func:`token_alignment` so that swapped
    words of different token lengths line up. Optionally self-attention is also copied while
    ``i/T < self_fraction`` (a fixed fraction, 0 by default). This mode deliberately keeps the
    ``i/T`` fraction (:func:`step_fraction`): it is our own approximation of Hertz et al.'s step
    window, not InstructPix2Pix's rule, and no paper config uses it.
``none``
    No attention control (the members only share the initial latent and the sampler noise).

Implementation: copying attention *probabilities* is done without materialising them. The edited
row's self-attention output with the base map is softmax(q_base k_baseᵀ·scale)·v_edit, i.e. ordinary
scaled-dot-product attention with the base row's queries and keys and the edited row's values; the
word-swap output is softmax(q_base k_baseᵀ·scale)·M·v_edit with the row-stochastic token alignment M,
i.e. attention with base queries/keys over the values M·v_edit. So every row goes through
``torch.nn.functional.scaled_dot_product_attention`` (memory-efficient kernels on GPU), the base
rows are never modified (control cannot change the original image), and an edited row whose prompt
equals the base prompt is bit-identical to it. This implementation is our own; it does not reuse
Prompt-to-Prompt code.
"""

from __future__ import annotations

import contextlib
import difflib
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

MODES = ("ip2p_self", "hertz_cross", "none")


def ip2p_fraction(step: int, total: int) -> float:
    """InstructPix2Pix's step fraction ``step / (total - 1)`` (0 for a single step)."""
    return step / (total - 1) if total > 1 else 0.0


def ip2p_active(step: int, total: int, p: float) -> bool:
    """Whether InstructPix2Pix's Prompt-to-Prompt copies self-attention at step index ``step`` of
    ``total``: ``p > step / (total - 1)`` (strict), as in its generator's ``sample_euler_ancestral``."""
    return p > ip2p_fraction(step, total)


def step_fraction(step: int, total: int) -> float:
    """The ``step / total`` fraction of the ``hertz_cross`` mode (our own choice)."""
    return step / total



def token_alignment(src_ids: Sequence[int], dst_ids: Sequence[int]) -> np.ndarray:
    """Map attention over ``src_ids`` tokens onto ``dst_ids`` tokens: row-stochastic ``M`` (Ls, Ld).

    ``M[i, j]`` is the share of the attention paid to source token ``i`` that goes to destination
    token ``j`` (edited-prompt attention = base attention @ M). Built from a longest-matching-block
    diff of the two token-id sequences (``difflib``, no junk heuristic):

    * equal runs map one-to-one (tokens after a swapped word shift by the length difference);
    * a replaced run (the swapped word: ``k`` source tokens -> ``m`` destination tokens) spreads each
      source token's attention evenly over the ``m`` destination tokens (weight ``1/m``);
    * a source run with no counterpart (e.g. padding pushed off the end by a longer word) goes to
      the destination token just before the gap (the last token at the end), so rows sum to 1;
    * destination tokens with no source (inserted words) receive no attention.
    """
    src, dst = list(src_ids), list(dst_ids)
    if not src or not dst:
        raise ValueError("token_alignment needs two non-empty token sequences")
    m = np.zeros((len(src), len(dst)), dtype=np.float32)
    matcher = difflib.SequenceMatcher(None, src, dst, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for t in range(i2 - i1):
                m[i1 + t, j1 + t] = 1.0
        elif op == "replace":
            m[i1:i2, j1:j2] = 1.0 / (j2 - j1)
        elif op == "delete":
            m[i1:i2, min(max(j1 - 1, 0), len(dst) - 1)] = 1.0
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

    def __init__(self, mode: str = "ip2p_self", self_fraction: float = 0.0, device: torch.device | str | None = None):
        """``device``: where the UNet runs; each step's row indices are put there once in :meth:`set_step`, so
        the compiled UNet reads them as a plain input (no host-to-device copy inside its graph)."""
        if mode not in MODES:
            raise ValueError(f"unknown attention control mode {mode!r}; use one of {MODES}")
        self.mode = mode
        self.self_fraction = float(self_fraction)
        self.device = None if device is None else torch.device(device)
        #: how often processors ran / edited something (cumulative; for tests and diagnostics)
        self.calls = {"self": 0, "cross": 0, "self_edited": 0, "cross_edited": 0}
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
        self._on_device: dict = {}

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
        self._on_device = {}

    @property
    def rows(self) -> int:
        return 2 * self.n_candidates * self.group_size

    def set_step(self, step: int, total: int) -> None:
        """Activate control for step index ``step`` (0-based) of ``total``: ``ip2p_self`` copies for the
        candidates with ``p > step / (total - 1)`` (:func:`ip2p_active`), ``hertz_cross`` for
        ``p > step / total`` (:func:`step_fraction`)."""
        if self.n_candidates == 0:
            return
        if not 0 <= step < total:
            raise ValueError(f"step index {step} outside 0..{total - 1}")
        b, g = self.n_candidates, self.group_size
        rows = torch.arange(self.rows)
        base_rows = rows - (rows % g)                 # row of member 0 of the same candidate and half
        member = rows % g
        cand = (rows % (b * g)) // g
        half = rows // (b * g)
        self_on = torch.zeros(b, dtype=torch.bool)
        cross_on = torch.zeros(b, dtype=torch.bool)
        if self.mode == "ip2p_self":
            self_on = torch.tensor([ip2p_active(step, total, float(p)) for p in self.p], dtype=torch.bool)
        elif self.mode == "hertz_cross":
            frac = step_fraction(step, total)
            cross_on = frac < self.p
            self_on = torch.full((b,), frac < self.self_fraction, dtype=torch.bool)
        self._on_device = {}
        copy_self = self_on[cand] & (member > 0)
        self.self_src = torch.where(copy_self, base_rows, rows) if bool(copy_self.any()) else None
        if self.self_src is not None and self.device is not None:
            self.self_src = self.self_src.to(self.device)
        copy_cross = cross_on[cand] & (member > 0) & (half == 1)
        if bool(copy_cross.any()):
            self.cross_src = torch.where(copy_cross, base_rows, rows)
            self.cross_map_index = torch.where(copy_cross, member, torch.full_like(member, -1))
        else:
            self.cross_src = self.cross_map_index = None

    # ------------------------------------------------------------------ editing
    def _dev(self, name: str, device: torch.device) -> torch.Tensor:
        """This step's index tensor ``name`` on ``device`` (copied once per step, not once per layer)."""
        key = (name, str(device))
        if key not in self._on_device:
            self._on_device[key] = getattr(self, name).to(device)
        return self._on_device[key]

    # Traceable by torch.compile without a graph break (``fullgraph=True``, CUDA graphs with ``reduce-overhead``) in
    # the paper's ``ip2p_self`` mode: the per-step state it reads is a device tensor of row indices (an input of
    # the graph, so a new step does not recompile) and whether anything is copied (two graphs: copy / no copy).
    # The diagnostic counters are eager-only: an int the graph read would be guarded on and recompile the UNet
    # at every call (measured on an H200 when this method was traced whole: 8 recompiles, then 0.22x eager).
    def edit_qkv(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_cross: bool):
        """Return (query, key, value), each (rows, heads, tokens, dim), with the control applied."""
        eager = not torch.compiler.is_compiling()
        if eager:
            self.calls["cross" if is_cross else "self"] += 1
        if self.n_candidates == 0:
            return query, key, value
        if query.shape[0] != self.rows:
            raise RuntimeError(
                f"attention control was configured for {self.rows} UNet rows but got {query.shape[0]}; "
                f"configure the controller for every batch"
            )
        if not is_cross:
            if self.self_src is None:
                return query, key, value
            if eager:
                self.calls["self_edited"] += 1
            src = self.self_src if self.self_src.device == query.device else self._dev("self_src", query.device)
            return query.index_select(0, src), key.index_select(0, src), value
        if self.cross_src is None:
            return query, key, value
        return self._edit_cross(query, key, value)

    # the word-swap map gathers a data-dependent set of rows (``nonzero``): a graph break under torch.compile,
    # taken only by ``hertz_cross``, which no paper config uses
    @torch.compiler.disable
    def _edit_cross(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        self.calls["cross_edited"] += 1
        dev = query.device
        src = self._dev("cross_src", dev)
        active = torch.nonzero(self.cross_map_index >= 0).flatten()
        maps = self.maps[self.cross_map_index[active]].to(device=dev, dtype=value.dtype)   # (n, Ls, Ld)
        active = active.to(dev)
        value = value.clone()
        value[active] = torch.einsum("nst,nhtc->nhsc", maps, value[active])
        return query.index_select(0, src), key.index_select(0, src), value


class P2PAttnProcessor:
    """Scaled-dot-product attention whose queries/keys/values the controller may swap (see module doc)."""

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
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, key_len, rows)
            attention_mask = attention_mask.view(rows, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)
        context = hidden_states
        if is_cross:
            context = attn.norm_encoder_hidden_states(encoder_hidden_states) if attn.norm_cross else encoder_hidden_states
        key, value = attn.to_k(context), attn.to_v(context)
        head_dim = key.shape[-1] // attn.heads
        split = lambda x: x.view(rows, -1, attn.heads, head_dim).transpose(1, 2)  # noqa: E731
        query, key, value = self.controller.edit_qkv(split(query), split(key), split(value), is_cross)
        hidden_states = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                       dropout_p=0.0, is_causal=False, scale=attn.scale)
        hidden_states = hidden_states.transpose(1, 2).reshape(rows, -1, attn.heads * head_dim).to(query.dtype)
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
