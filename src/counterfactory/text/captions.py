"""Counterfactual captions by single-noun substitution (COCO-Counterfactuals §3.1, appendix B.1.1).

For each original caption:

1. tokenise and POS-tag it with NLTK (``word_tokenize`` + ``pos_tag``);
2. mask each noun tagged in ``mask_tags`` (NN/NNS) in turn and take the masked language model's
   ``top_k`` (10) most probable fills;
3. keep a fill only if it is a whole word, differs from the original word, and re-tokenising the new
   caption keeps the token count with the fill at the same position tagged in ``fill_tags``
   (NN/NNS/NNP);
4. keep candidates whose sentence similarity to the original lies in ``(similarity_low,
   similarity_high]`` = (0.8, 0.91];
5. score the survivors' perplexity with a causal LM and keep the lowest (one per caption). The paper
   config scores as the reference code does (:class:`CausalLMPerplexity` with ``prepend_bos=False``):
   no BOS token, the first token is not scored, perplexity = exp(mean NLL of tokens 2..n). A candidate
   whose perplexity is undefined (a single LM token without BOS: nothing to score) is rejected with
   reason ``perplexity_undefined`` rather than ranked.

Every rejected candidate is kept with the reason, so the filter funnel can be audited.

Bad input captions do not stop a shard: a caption that is missing, NaN, not text or only whitespace is
rejected as a whole with reason ``empty_caption``; a caption whose tokens do not fit the masked LM (512
positions for RoBERTa-base; the tiny model's 64) or the causal LM is rejected with reason ``too_long``
(a longer candidate is rejected with ``too_long`` at the perplexity step). Such caption-level rows have
an empty ``candidate``/``original_word``/``new_word`` and ``position = mlm_rank = -1``; both reasons are
counted in the shard summary (``counts``).
The three models are passed in behind small interfaces (:class:`FillMasker`, :class:`Similarity`,
:class:`Perplexity`) so the logic is testable with fakes; :func:`from_config` builds the real ones.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence

import numpy as np

from ..settings import config_value, schema_defaults

log = logging.getLogger(__name__)

# rejection reasons (the ``reason`` column of the rejected-candidates table)
NOT_WHOLE_WORD = "not_whole_word"
SAME_WORD = "same_word"
DUPLICATE = "duplicate"
TOKEN_COUNT_CHANGED = "token_count_changed"
NOT_NOUN = "fill_not_tagged_noun"
SIMILARITY_BELOW = "similarity_not_above_low"
SIMILARITY_ABOVE = "similarity_above_high"
NOT_LOWEST_PERPLEXITY = "not_lowest_perplexity"
EMPTY_CAPTION = "empty_caption"   # caption-level: missing, NaN, non-text or blank caption
TOO_LONG = "too_long"             # caption (or candidate) longer than the MLM's / LM's positions
PERPLEXITY_UNDEFINED = "perplexity_undefined"  # no scored token (1-token candidate without BOS): NaN
# which fills may be kept (B.1.1): the authors' code, or our stricter variant
FILL_RULES = ("reference", "strict")
REASONS = (NOT_WHOLE_WORD, SAME_WORD, DUPLICATE, TOKEN_COUNT_CHANGED, NOT_NOUN, SIMILARITY_BELOW,
           SIMILARITY_ABOVE, NOT_LOWEST_PERPLEXITY, EMPTY_CAPTION, TOO_LONG, PERPLEXITY_UNDEFINED)


@dataclass(frozen=True)
@schema_defaults("coco_counterfactuals.captions",
                 keys={"top_k": "mlm_top_k", "per_caption": "counterfactuals_per_caption"})
class EditSettings:
    """Settings of the caption stage; defaults are the paper's (§3.1, B.1.1), as the schema writes them
    (``coco_counterfactuals.captions``)."""

    mask_tags: tuple[str, ...]
    fill_tags: tuple[str, ...]
    top_k: int
    similarity_low: float
    similarity_high: float
    per_caption: int
    batch_size: int
    fill_rule: str  # "reference" (the authors' code) or "strict" (ours); see check_fill

    def __post_init__(self):
        if self.fill_rule not in FILL_RULES:
            raise ValueError(f"fill_rule must be one of {FILL_RULES}, not {self.fill_rule!r}")

    @classmethod
    def from_config(cls, section: dict) -> "EditSettings":
        return cls(
            mask_tags=tuple(section["mask_tags"]),
            fill_tags=tuple(section["fill_tags"]),
            top_k=int(section["mlm_top_k"]),
            similarity_low=float(section["similarity_low"]),
            similarity_high=float(section["similarity_high"]),
            per_caption=int(section["counterfactuals_per_caption"]),
            batch_size=int(section["batch_size"]),
            fill_rule=str(config_value(section, "coco_counterfactuals.captions.fill_rule")),
        )

    def in_band(self, sim: float) -> bool:
        """The similarity band is open below and closed above: ``low < sim <= high``."""
        return self.similarity_low < sim <= self.similarity_high


@dataclass(frozen=True)
class Fill:
    """One MLM proposal for a masked position."""

    word: str  # the proposed text, stripped of the tokenizer's word-boundary marker
    word_start: bool  # the token begins a new word (carries the leading-space marker)
    rank: int  # 0 = most probable
    sequence: str | None = None  # the whole masked text decoded with this fill (what a fill-mask pipeline returns)


class FillMasker(Protocol):
    mask_token: str

    def fill(self, masked_texts: Sequence[str], top_k: int) -> list[list[Fill]]:
        """For each text (one mask token each), the ``top_k`` proposals in rank order."""


class Similarity(Protocol):
    def similarity(self, a: Sequence[str], b: Sequence[str]) -> np.ndarray:
        """Cosine similarity of each pair ``(a[i], b[i])``."""


class Perplexity(Protocol):
    def perplexity(self, texts: Sequence[str]) -> np.ndarray:
        """Perplexity of each text."""


class Tagger(Protocol):
    def __call__(self, text: str) -> list[tuple[str, str]]:
        """Tokens of ``text`` with their POS tags."""


# --------------------------------------------------------------------------- tokens and masks

def token_spans(text: str, tokens: Sequence[str]) -> list[tuple[int, int]] | None:
    """Character span of each token in ``text`` (None if the tokens cannot be aligned).

    NLTK rewrites double quotes as ````` and ``''``; those are matched against ``"``.
    """
    spans, cursor = [], 0
    for tok in tokens:
        candidates = [tok] + (['"'] if tok in ("``", "''") else [])
        best = None
        for cand in candidates:
            pos = text.find(cand, cursor)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, pos + len(cand))
        if best is None or text[cursor:best[0]].strip():
            return None
        spans.append(best)
        cursor = best[1]
    return spans


@dataclass
class MaskSite:
    """One noun of one caption, masked."""

    caption_key: int  # index into the shard's caption list
    position: int  # token index of the noun
    start: int
    end: int
    original_word: str
    masked_text: str


def mask_sites(key: int, text: str, tagged: Sequence[tuple[str, str]], mask_token: str,
               mask_tags: Iterable[str]) -> list[MaskSite]:
    """Every noun (tag in ``mask_tags``) of ``text`` replaced, one at a time, by ``mask_token``."""
    mask_tags = set(mask_tags)
    spans = token_spans(text, [t for t, _ in tagged])
    if spans is None:
        return []
    sites = []
    for i, ((tok, tag), (s, e)) in enumerate(zip(tagged, spans)):
        if tag in mask_tags:
            sites.append(MaskSite(key, i, s, e, text[s:e], text[:s] + mask_token + text[e:]))
    return sites


def substitute(text: str, site: MaskSite, word: str) -> str:
    return text[: site.start] + word + text[site.end:]


def decoded_sequence(text: str, site: MaskSite, fill: Fill) -> str:
    """The candidate as a fill-mask pipeline returns it: the masked text decoded with the fill in place. The
    model's own decoding when the masker gives it (``fill.sequence``); otherwise a token that does not start a
    word is glued to the word before it, as a byte-level BPE decoder does."""
    if fill.sequence is not None:
        return fill.sequence
    before = text[: site.start]
    if not fill.word_start:
        before = before.rstrip(" ")
    return before + fill.word + text[site.end:]


def check_fill(text: str, site: MaskSite, fill: Fill, tagger: Tagger, n_tokens: int,
               fill_tags: Iterable[str], rule: str = "reference") -> tuple[str | None, str]:
    """Return ``(reason, candidate_text)``: reason is None when the fill is acceptable.

    ``rule="reference"`` (the authors' code, B.1.1): ``text`` is the NLTK tokens joined by spaces, the candidate
    is the decoded sequence, and a fill is kept when the candidate has the same NLTK token count and the token
    at the noun's position is tagged as in ``fill_tags`` (any spelling: "t-shirt", "3D"). ``rule="strict"``
    (ours): the fill replaces the noun inside the original text and must be one alphabetic word starting where
    the noun started. Both reject the original word itself (the reference does too, through the similarity
    band's upper bound: an unchanged caption scores ~1)."""
    word = fill.word
    if rule == "reference":
        candidate = decoded_sequence(text, site, fill)
        if not word.strip():
            return NOT_WHOLE_WORD, candidate
    else:
        candidate = substitute(text, site, word)
        preceded_by_space = site.start > 0 and text[site.start - 1].isspace()
        if not word or not word.isalpha() or (preceded_by_space and not fill.word_start):
            return NOT_WHOLE_WORD, candidate
    if word.lower() == site.original_word.lower():
        return SAME_WORD, candidate
    tagged = tagger(candidate)
    if len(tagged) != n_tokens:
        return TOKEN_COUNT_CHANGED, candidate
    tok, tag = tagged[site.position]
    if tag not in set(fill_tags) or (rule == "strict" and tok != word):
        return NOT_NOUN, candidate
    return None, candidate


# --------------------------------------------------------------------------- the editor

@dataclass
class CaptionResult:
    accepted: list[dict] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)
    counts: dict = field(default_factory=dict)


def prompt_text_problem(text) -> str | None:
    """Why ``text`` cannot be a caption that is passed on as a generation prompt (None when it can): not a
    string, blank, or holding a control character (a tab, a line break, an escape or another character of
    Unicode category Cc, or a line / paragraph separator), which a text encoder's tokenizer silently drops
    or turns into a space, so the image would be drawn for another text than the one recorded. The shared
    check wherever a caption becomes a prompt (model answers, request tables)."""
    import unicodedata

    if not isinstance(text, str):
        kind = "a number" if isinstance(text, (int, float, np.number)) and not isinstance(text, bool) \
            else f"a {type(text).__name__}"
        return f"{text!r} is {kind}, not a string"
    if not text.strip():
        return "empty text"
    for i, ch in enumerate(text):
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            name = {"\t": "a tab", "\n": "a line break", "\r": "a carriage return"}.get(ch, "a control character")
            return f"{text!r:.80} holds {name} (U+{ord(ch):04X}) at character {i}"
    return None


def usable_caption(text) -> bool:
    """A caption the editor can work on: a non-blank string (None, NaN and numbers are not)."""
    return isinstance(text, str) and bool(text.strip())


def _too_long(text: str, *models) -> bool:
    """Whether any model with a ``too_long(text)`` method says ``text`` exceeds its positions."""
    return any(getattr(m, "too_long", None) is not None and m.too_long(text) for m in models)


def _batches(seq: Sequence, size: int):
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def edit_captions(
    captions: Sequence[dict],
    tagger: Tagger,
    masker: FillMasker,
    similarity: Similarity,
    perplexity: Perplexity,
    settings: EditSettings = EditSettings(),
    progress: bool = False,
) -> CaptionResult:
    """Create counterfactual captions for ``captions`` (dicts with ``caption_id`` and ``caption``,
    any other keys are carried into the output). All model calls are batched across the captions."""
    from tqdm.auto import tqdm

    result = CaptionResult()
    counts = {"captions": len(captions), "no_nouns": 0, "no_candidate": 0, "accepted": 0, "untokenisable": 0,
              EMPTY_CAPTION: 0, TOO_LONG: 0}

    def reject_caption(c: dict, reason: str) -> None:
        counts[reason] += 1
        text = c.get("caption")
        result.rejected.append({
            "caption_id": c["caption_id"], "original": text if isinstance(text, str) else "", "candidate": "",
            "original_word": "", "new_word": "", "position": -1, "mlm_rank": -1, "reason": reason,
            "similarity": math.nan, "perplexity": math.nan,
        })

    tagged_all: list[list[tuple[str, str]]] = []
    sites: list[MaskSite] = []
    # the text each caption's nouns are masked in: the caption itself (strict), or its NLTK tokens joined by
    # spaces (reference, as the authors' code feeds the MLM)
    masked_source: dict[int, str] = {}
    for key, c in enumerate(captions):
        text = c.get("caption")
        if not usable_caption(text):
            log.warning("caption %s: empty or missing caption (%r); rejected as %s", c["caption_id"], text,
                        EMPTY_CAPTION)
            reject_caption(c, EMPTY_CAPTION)
            tagged_all.append([])
            continue
        if _too_long(text, masker, perplexity):
            log.warning("caption %s: %d characters do not fit the language models' positions; rejected as %s",
                        c["caption_id"], len(text), TOO_LONG)
            reject_caption(c, TOO_LONG)
            tagged_all.append([])
            continue
        tagged = tagger(text)
        tagged_all.append(tagged)
        if settings.fill_rule == "reference":
            text = masked_source[key] = " ".join(t for t, _ in tagged)
        if token_spans(text, [t for t, _ in tagged]) is None:
            counts["untokenisable"] += 1
            log.warning("caption %s: tokens do not align with the text; skipped", c["caption_id"])
            continue
        found = mask_sites(key, text, tagged, masker.mask_token, settings.mask_tags)
        if any(_too_long(site.masked_text, masker) for site in found):
            reject_caption(c, TOO_LONG)
            continue
        if not found:
            counts["no_nouns"] += 1
        sites.extend(found)
    counts["masked_nouns"] = len(sites)

    # 1) MLM fills, batched over every masked noun of the shard
    fills: list[list[Fill]] = []
    for batch in tqdm(list(_batches(sites, settings.batch_size)), desc="mlm", disable=not progress):
        fills.extend(masker.fill([s.masked_text for s in batch], settings.top_k))

    def reject(site: MaskSite, fill: Fill, text: str, reason: str, **extra):
        c = captions[site.caption_key]
        result.rejected.append({
            "caption_id": c["caption_id"], "original": c["caption"], "candidate": text,
            "original_word": site.original_word, "new_word": fill.word, "position": site.position,
            "mlm_rank": fill.rank, "reason": reason, "similarity": extra.get("similarity", math.nan),
            "perplexity": extra.get("perplexity", math.nan),
        })

    # 2) lexical and POS filters
    survivors: list[tuple[MaskSite, Fill, str]] = []
    seen: set[tuple[int, str]] = set()
    for site, proposals in zip(sites, fills):
        text = masked_source.get(site.caption_key, captions[site.caption_key]["caption"])
        n_tokens = len(tagged_all[site.caption_key])
        for fill in proposals:
            reason, candidate = check_fill(text, site, fill, tagger, n_tokens, settings.fill_tags,
                                           settings.fill_rule)
            if reason is None and (site.caption_key, candidate) in seen:
                reason = DUPLICATE
            if reason is not None:
                reject(site, fill, candidate, reason)
                continue
            seen.add((site.caption_key, candidate))
            survivors.append((site, fill, candidate))

    # 3) sentence-similarity band, batched
    sims: list[float] = []
    for batch in tqdm(list(_batches(survivors, settings.batch_size)), desc="similarity", disable=not progress):
        originals = [captions[s.caption_key]["caption"] for s, _, _ in batch]
        sims.extend(float(x) for x in similarity.similarity(originals, [c for _, _, c in batch]))
    in_band = []
    for (site, fill, cand), sim in zip(survivors, sims):
        if settings.in_band(sim) and _too_long(cand, perplexity):
            reject(site, fill, cand, TOO_LONG, similarity=sim)
        elif settings.in_band(sim):
            in_band.append((site, fill, cand, sim))
        else:
            reason = SIMILARITY_BELOW if sim <= settings.similarity_low else SIMILARITY_ABOVE
            reject(site, fill, cand, reason, similarity=sim)

    # 4) perplexity, batched; the lowest wins per caption
    ppls: list[float] = []
    for batch in tqdm(list(_batches(in_band, settings.batch_size)), desc="perplexity", disable=not progress):
        ppls.extend(float(x) for x in perplexity.perplexity([c for _, _, c, _ in batch]))
    by_caption: dict[int, list] = {}
    for (site, fill, cand, sim), ppl in zip(in_band, ppls):
        if not math.isfinite(ppl):
            reject(site, fill, cand, PERPLEXITY_UNDEFINED, similarity=sim, perplexity=ppl)
            continue
        by_caption.setdefault(site.caption_key, []).append((ppl, site.position, fill.rank, site, fill, cand, sim))
    for key in range(len(captions)):
        ranked = sorted(by_caption.get(key, []), key=lambda r: r[:3])
        if not ranked and any(s.caption_key == key for s in sites):
            counts["no_candidate"] += 1
        for rank, (ppl, _, _, site, fill, cand, sim) in enumerate(ranked):
            if rank >= settings.per_caption:
                reject(site, fill, cand, NOT_LOWEST_PERPLEXITY, similarity=sim, perplexity=ppl)
                continue
            c = captions[key]
            row = {k: v for k, v in c.items() if k != "caption"}
            row.update({
                "original": c["caption"], "counterfactual": cand, "original_word": site.original_word,
                "new_word": fill.word, "position": site.position, "similarity": sim, "perplexity": ppl,
            })
            result.accepted.append(row)
    counts["accepted"] = len(result.accepted)
    counts["rejected_by_reason"] = {r: sum(1 for x in result.rejected if x["reason"] == r) for r in REASONS}
    result.counts = counts
    return result


# --------------------------------------------------------------------------- real model adapters

def max_positions(model, tokenizer) -> int:
    """Tokens a transformers model can take: its position table (RoBERTa-style tables reserve
    ``padding_idx + 1`` slots: 514 -> 512) and the tokenizer's ``model_max_length``, whichever is less."""
    config = getattr(model, "config", None)
    limits = []
    n = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if n:
        if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert", "longformer"):
            n -= (getattr(config, "pad_token_id", 1) or 0) + 1
        limits.append(int(n))
    m = getattr(tokenizer, "model_max_length", None)
    if isinstance(m, int) and 0 < m < 1_000_000:
        limits.append(m)
    return min(limits) if limits else 1_000_000_000


class HFFillMasker:
    """Fill-mask with any ``AutoModelForMaskedLM`` (RoBERTa-base in the paper), batched."""

    def __init__(self, model, tokenizer, device="cpu"):
        self.model, self.tokenizer, self.device = model.to(device), tokenizer, device
        self.mask_token = tokenizer.mask_token
        self.max_tokens = max_positions(model, tokenizer)

    def too_long(self, text: str) -> bool:
        """More tokens (with special tokens) than the model has positions: it would crash."""
        return len(self.tokenizer(text, verbose=False)["input_ids"]) > self.max_tokens

    def _decode(self, token_id: int) -> tuple[str, bool]:
        """The token's text and whether it starts a word (byte-level BPE "Ġ", SentencePiece "▁")."""
        piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
        text = self.tokenizer.convert_tokens_to_string([piece])
        return text.strip(), text[:1].isspace() or piece.startswith("▁")

    def fill(self, masked_texts, top_k):
        import torch

        enc = self.tokenizer(list(masked_texts), return_tensors="pt", padding=True).to(self.device)
        with torch.inference_mode():
            logits = self.model(**enc).logits
        rows, cols = (enc["input_ids"] == self.tokenizer.mask_token_id).nonzero(as_tuple=True)
        if len(rows) != len(masked_texts):
            raise ValueError("each masked text must contain exactly one mask token")
        top = logits[rows, cols].topk(top_k, dim=-1).indices.tolist()
        out = []
        for row, col, ids in zip(rows.tolist(), cols.tolist(), top):
            tokens = enc["input_ids"][row][enc["attention_mask"][row].bool()].tolist()
            position = col - int((~enc["attention_mask"][row][:col].bool()).sum())  # left padding
            fills = []
            for rank, tid in enumerate(ids):
                word, start = self._decode(tid)
                tokens[position] = int(tid)
                # as transformers' fill-mask pipeline builds its "sequence"
                sequence = self.tokenizer.decode(tokens, skip_special_tokens=True)
                fills.append(Fill(word, start, rank, sequence))
            out.append(fills)
        return out


class SentenceSimilarity:
    """Cosine similarity with a sentence-transformers model (all-MiniLM-L6-v2 in the paper)."""

    def __init__(self, model, batch_size: int = 64):
        self.model, self.batch_size = model, batch_size
        self._cache: dict[str, np.ndarray] = {}

    def _embed(self, texts):
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            emb = self.model.encode(missing, batch_size=self.batch_size, convert_to_numpy=True,
                                    normalize_embeddings=True, show_progress_bar=False)
            self._cache.update(zip(missing, emb))
        return np.stack([self._cache[t] for t in texts])

    def similarity(self, a, b):
        return np.sum(self._embed(list(a)) * self._embed(list(b)), axis=1)


class CausalLMPerplexity:
    """Perplexity exp(mean token NLL) under a causal LM (GPT-2 large in the paper, B.1.1), batched.

    ``prepend_bos=False`` (the paper config, as the reference code scores): the text's own tokens
    ``t_1..t_n`` without BOS; ``t_1`` is only context, perplexity = exp(mean of -log P(t_k | t_<k) for
    k = 2..n). A 1-token text has nothing to score: its perplexity is NaN (the caption logic rejects it
    as ``perplexity_undefined``). ``prepend_bos=True`` (our option): the text is conditioned on the
    LM's BOS token so the first word is scored too (mean over k = 1..n).
    """

    def __init__(self, model, tokenizer, device="cpu", prepend_bos: bool = False):
        self.model, self.tokenizer, self.device, self.prepend_bos = model.to(device), tokenizer, device, prepend_bos
        self.max_tokens = max_positions(model, tokenizer)

    def too_long(self, text: str) -> bool:
        n = len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        return n + int(self.prepend_bos and self.tokenizer.bos_token_id is not None) > self.max_tokens

    def perplexity(self, texts):
        import torch

        bos = self.tokenizer.bos_token_id
        seqs = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        if self.prepend_bos and bos is not None:
            seqs = [[bos] + s for s in seqs]
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        valid = mask[:, 1:].float()
        count = valid.sum(1)
        nll = -(logp * valid).sum(1) / count.clamp(min=1)
        nll = torch.where(count > 0, nll, torch.full_like(nll, float("nan")))  # nothing scored: undefined
        return torch.exp(nll).cpu().numpy()


def nltk_tagger(text: str) -> list[tuple[str, str]]:
    """NLTK's ``word_tokenize`` + ``pos_tag`` (punkt + averaged perceptron tagger, B.1.1)."""
    import nltk

    return nltk.pos_tag(nltk.word_tokenize(text))
