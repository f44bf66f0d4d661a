"""CVLD debiased adaptation of BLIP (CVLD §4, §5.1-5.4, appendix C, Table 3): losses and training loops.

Every task uses the augmented loss of Eq. 3, ``L = l(B) + lambda * l(B~)``, where ``B~`` holds the
intervened (counterfactual) pairs of the batch's examples that have one.

* **Classification** (§4.2): zero-shot classification with BLIP's ITM head over class prompts ``p(c)``
  (:data:`CELEBA_PROMPTS`), few-shot adapted by multimodal prompt tuning (:mod:`.prompt_tuning`), loss
  ``CE(B) + lambda * CE(B~)`` with the counterfactual images keeping their labels (lambda = 1).
* **Retrieval** (§4.3): BLIP's ITC + ITM with counterfactuals, :func:`cvld_itc_loss` (candidate extension
  with soft labels, query extension of Eq. 8) and :func:`cvld_itm_loss` (counterparts never drawn as hard
  negatives), and the ablation variants of Table 3 (:data:`VARIANTS`); full fine-tuning.
* **Captioning** (§4.4, Eq. 9): BLIP's language-modelling loss on (I, T) plus lambda times the same loss on
  the intervened pairs; full fine-tuning.

Training tables have the columns ``image_path``, ``caption``, ``cf_image_path``, ``cf_caption`` (the last
two empty or null when an example has no counterfactual) and, for classification, ``label`` (0/1); an
optional ``id`` column names rows (otherwise image path + caption). Appendix C's settings are the defaults
of :meth:`CVLDSettings.for_task`; the optimiser is AdamW with weight decay 0.05 on every parameter and the
learning rate follows a cosine decay per epoch to 0, as BLIP's official fine-tuning configs
(``retrieval_coco.yaml`` / ``caption_coco.yaml``: ``weight_decay: 0.05``, ``cosine_lr_schedule``).
Runs are deterministic given the seed: batch order, dropout and ITM negatives are seeded from the seed and
the rows' ids, never from positions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, input_error
from .model import BLIP_TEMP_INIT, BLIP_TEMP_RANGE, blip_itm_logits
from .prompt_tuning import ATTR, add_prompts, prompt_parameters, save_prompts

log = logging.getLogger(__name__)

TASKS = ("classification", "retrieval", "captioning")
#: CVLD §5.2 / appendix A: results are averaged over 10 few-shot episodes
N_EPISODES = 10

# --------------------------------------------------------------------------- class prompts (ours)

#: CelebA attribute -> (prompt of the negative class, prompt of the positive class) for the 14
#: gender-independent attributes of CVLD appendix A. The paper only shows the template "a photo of a [c]";
#: these sentences are our choice.
CELEBA_PROMPTS: dict[str, tuple[str, str]] = {
    "Bags_Under_Eyes": ("a photo of a person without bags under the eyes", "a photo of a person with bags under the eyes"),
    "Bangs": ("a photo of a person without bangs", "a photo of a person with bangs"),
    "Black_Hair": ("a photo of a person without black hair", "a photo of a person with black hair"),
    "Blond_Hair": ("a photo of a person without blond hair", "a photo of a person with blond hair"),
    "Brown_Hair": ("a photo of a person without brown hair", "a photo of a person with brown hair"),
    "Chubby": ("a photo of a person who is not chubby", "a photo of a chubby person"),
    "Eyeglasses": ("a photo of a person without eyeglasses", "a photo of a person with eyeglasses"),
    "Gray_Hair": ("a photo of a person without gray hair", "a photo of a person with gray hair"),
    "High_Cheekbones": ("a photo of a person without high cheekbones", "a photo of a person with high cheekbones"),
    "Mouth_Slightly_Open": ("a photo of a person with a closed mouth", "a photo of a person with the mouth slightly open"),
    "Narrow_Eyes": ("a photo of a person without narrow eyes", "a photo of a person with narrow eyes"),
    "Smiling": ("a photo of a person who is not smiling", "a photo of a smiling person"),
    "Wearing_Earrings": ("a photo of a person not wearing earrings", "a photo of a person wearing earrings"),
    "Wearing_Hat": ("a photo of a person not wearing a hat", "a photo of a person wearing a hat"),
}


def class_prompts(attribute: str) -> tuple[str, str]:
    """(negative, positive) prompt texts of a binary attribute: :data:`CELEBA_PROMPTS`, or for another
    name "a photo of a person without / with <name in lower-case words>"."""
    if attribute in CELEBA_PROMPTS:
        return CELEBA_PROMPTS[attribute]
    words = attribute.replace("_", " ").lower()
    return f"a photo of a person without {words}", f"a photo of a person with {words}"


# --------------------------------------------------------------------------- classification (§4.2)

def classification_logits(model: nn.Module, pixel_values: torch.Tensor, prompt_tokens) -> torch.Tensor:
    """(batch, n_classes) scores ``g(I, p(c))`` of Eq. 4 from BLIP's ITM head: the log-odds of "match",
    ``itm[1] - itm[0]`` (ranks classes as BLIP's match probability does). ``prompt_tokens``: the tokenised
    class prompts (``input_ids`` and ``attention_mask`` of shape (n_classes, length))."""
    feats = model.vision_model(pixel_values=pixel_values)[0]
    n, c = feats.shape[0], prompt_tokens["input_ids"].shape[0]
    ids = prompt_tokens["input_ids"].to(feats.device).repeat(n, 1)
    mask = prompt_tokens["attention_mask"].to(feats.device).repeat(n, 1)
    itm = blip_itm_logits(model, feats.repeat_interleave(c, dim=0), ids, mask).view(n, c, 2)
    return itm[..., 1] - itm[..., 0]


def classification_loss(model: nn.Module, prompt_tokens, pixel_values: torch.Tensor, labels: torch.Tensor,
                        cf_pixel_values: torch.Tensor | None = None, cf_labels: torch.Tensor | None = None,
                        lam: float = 1.0) -> torch.Tensor:
    """Eq. 3 with the cross-entropy of :func:`classification_logits`: ``CE(B) + lam * CE(B~)``; the
    counterfactual images carry the labels of their originals (``cf_labels``). lam = 1 (§4.2)."""
    has_cf = cf_pixel_values is not None and cf_pixel_values.shape[0] > 0 and lam != 0
    pixels = torch.cat([pixel_values, cf_pixel_values]) if has_cf else pixel_values
    logits = classification_logits(model, pixels, prompt_tokens)
    n = pixel_values.shape[0]
    loss = F.cross_entropy(logits[:n], labels.to(logits.device))
    if has_cf:
        loss = loss + lam * F.cross_entropy(logits[n:], cf_labels.to(logits.device))
    return loss


# --------------------------------------------------------------------------- retrieval (§4.3)

def _compact(cf: torch.Tensor, has_cf: torch.Tensor) -> torch.Tensor:
    """Counterfactual rows in ``has_cf`` order: ``cf`` is either one row per example (N) or one per
    counterfactual (M = has_cf.sum())."""
    m = int(has_cf.sum())
    if cf.shape[0] == m:
        return cf
    if cf.shape[0] == has_cf.shape[0]:
        return cf[has_cf]
    raise ConfigError(f"CVLD: {cf.shape[0]} counterfactual embeddings for {has_cf.shape[0]} examples of which {m} "
                      "have a counterfactual. Fix: pass one row per example or one per counterfactual")


def _soft_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    return -(targets * logits.log_softmax(dim=-1)).sum(dim=-1).mean()


def itc_targets(txt_emb: torch.Tensor, cf_txt_emb: torch.Tensor, has_cf: torch.Tensor,
                labels: str = "soft") -> torch.Tensor:
    """(N + M, N + M) target distributions over the candidates ``originals ∪ counterfactuals`` (originals
    first, then the counterfactuals in ``has_cf`` order) for the same queries. Original ``i`` puts weight 1
    on itself and ``s_i`` on its counterfactual, the counterfactual weight 1 on itself and ``s_i`` on its
    original, where ``s_i = max(0, cos(T_i, T~_i))`` is the unimodal similarity of the ITC text embeddings
    (detached); each row is divided by its sum (``1 + s_i``), our reading of "supervise ITC learning" with
    the similarity (§4.3). ``labels="hard"``: ``s_i = 0``, one-hot targets (Table 3 "Hard label")."""
    if labels not in ("soft", "hard"):
        raise ConfigError(f"CVLD: labels must be 'soft' or 'hard', got {labels!r}. Fix: use one of them")
    has_cf = has_cf.to(torch.bool)
    n, cf_txt = has_cf.shape[0], _compact(cf_txt_emb, has_cf)
    idx = torch.nonzero(has_cf.cpu()).squeeze(1).to(txt_emb.device)
    m = idx.shape[0]
    if labels == "soft" and m:
        s = F.cosine_similarity(txt_emb[idx].detach().float(), cf_txt.detach().float(), dim=-1).clamp(min=0)
    else:
        s = torch.zeros(m, device=txt_emb.device)
    targets = torch.eye(n + m, device=txt_emb.device)
    cf_pos = n + torch.arange(m, device=txt_emb.device)
    targets[idx, cf_pos] = s
    targets[cf_pos, idx] = s
    return targets / targets.sum(dim=1, keepdim=True)


def itc_terms(img_emb, txt_emb, cf_img_emb, cf_txt_emb, has_cf, temperature, labels: str = "soft") -> dict:
    """The four parts of :func:`cvld_itc_loss`: ``t2i`` (original text queries against images ∪ intervened
    images), ``t2i_cf`` (counterfactual text queries, same candidates), ``i2t`` and ``i2t_cf`` (the mirror:
    image queries against texts ∪ intervened texts). Each is the mean soft-label cross-entropy over its
    queries, logits ``<query, candidate> / temperature`` of L2-normalised embeddings."""
    has_cf = has_cf.to(torch.bool)
    n = has_cf.shape[0]
    images = torch.cat([img_emb, _compact(cf_img_emb, has_cf)])
    texts = torch.cat([txt_emb, _compact(cf_txt_emb, has_cf)])
    targets = itc_targets(txt_emb, cf_txt_emb, has_cf, labels).to(images.dtype)
    t2i = texts @ images.T / temperature
    i2t = images @ texts.T / temperature
    return {"t2i": _soft_ce(t2i[:n], targets[:n]), "t2i_cf": _soft_ce(t2i[n:], targets[n:]),
            "i2t": _soft_ce(i2t[:n], targets[:n]), "i2t_cf": _soft_ce(i2t[n:], targets[n:])}


def cvld_itc_loss(img_emb, txt_emb, cf_img_emb, cf_txt_emb, has_cf, temperature, lam: float,
                  labels: str = "soft", query_extension: bool = True) -> torch.Tensor:
    """Debiased ITC (§4.3, Eq. 7-8). Candidates: the batch's images plus the intervened images of the
    examples that have one (``has_cf``), targets of :func:`itc_targets`. With ``query_extension`` the
    counterfactual captions are queries too, weighted ``lam`` (Eq. 8). As BLIP, the loss is the mean of
    the text->image and image->text directions; image->text mirrors it (image queries against the texts
    plus the intervened texts; intervened images as extra queries under query extension):
    ``0.5 * (t2i + lam * t2i_cf + i2t + lam * i2t_cf)``. Counterfactual embeddings: one row per example
    (rows without one are ignored) or one per counterfactual. No counterfactuals: BLIP's plain ITC."""
    terms = itc_terms(img_emb, txt_emb, cf_img_emb, cf_txt_emb, has_cf, temperature, labels)
    t2i, i2t = terms["t2i"], terms["i2t"]
    if query_extension and lam:
        t2i, i2t = t2i + lam * terms["t2i_cf"], i2t + lam * terms["i2t_cf"]
    return 0.5 * (t2i + i2t)


def counterpart_mask(has_cf: torch.Tensor, exclude_counterfactuals: bool = True) -> torch.Tensor:
    """(P, P) bool, P = N + M (originals, then counterfactuals in ``has_cf`` order): True where a pair may
    not be drawn as a hard negative: the pair itself and, with ``exclude_counterfactuals``, an example's
    own counterfactual (and, for a counterfactual, its original)."""
    has_cf = has_cf.to(torch.bool).cpu()
    n, idx = has_cf.shape[0], torch.nonzero(has_cf).squeeze(1)
    p = n + idx.shape[0]
    forbidden = torch.eye(p, dtype=torch.bool)
    if exclude_counterfactuals:
        cf_pos = n + torch.arange(idx.shape[0])
        forbidden[idx, cf_pos] = True
        forbidden[cf_pos, idx] = True
    return forbidden


def itm_negatives(sim_i2t: torch.Tensor, has_cf: torch.Tensor, generator: torch.Generator | None = None,
                  exclude_counterfactuals: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """BLIP's hard-negative draw over the pool ``originals ∪ counterfactuals``: one negative text per
    image and one negative image per text, by ``torch.multinomial`` from the softmax of the ITC
    similarities with :func:`counterpart_mask` zeroed (drawn on the CPU with ``generator``). A row whose
    allowed weights underflow draws uniformly among the allowed; a row with none allowed gets -1."""
    forbidden = counterpart_mask(has_cf, exclude_counterfactuals)
    with torch.no_grad():
        sim = sim_i2t.detach().float().cpu()
        if sim.shape != forbidden.shape:
            raise ConfigError(f"CVLD: similarities of shape {tuple(sim.shape)} for a pool of {forbidden.shape[0]} "
                              "pairs. Fix: pass the ITC similarities of originals + counterfactuals")
        picks = []
        for s in (sim, sim.T):
            weights = F.softmax(s, dim=1).masked_fill(forbidden, 0.0)
            dead = weights.sum(dim=1) <= 0
            weights[dead] = (~forbidden[dead]).float()
            none = weights.sum(dim=1) <= 0
            weights[none] = 1.0
            pick = torch.multinomial(weights, 1, generator=generator).squeeze(1)
            picks.append(pick.masked_fill(none, -1))
    return picks[0].to(sim_i2t.device), picks[1].to(sim_i2t.device)


def cvld_itm_loss(model: nn.Module, image_feats: torch.Tensor, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor, sim_i2t: torch.Tensor, has_cf: torch.Tensor, lam: float,
                  generator: torch.Generator | None = None, exclude_counterfactuals: bool = True) -> torch.Tensor:
    """Debiased ITM (§4.3): BLIP's ITM cross-entropy over the pool ``originals ∪ counterfactuals`` (rows of
    ``image_feats`` / ``input_ids``: the N originals, then the M counterfactuals in ``has_cf`` order). Each
    pair is a positive; each image gets a negative text and each text a negative image from
    :func:`itm_negatives` (an example's own counterfactual never drawn). Loss: the mean cross-entropy of
    the originals' positive and negative pairs plus ``lam`` times that of the counterfactual pairs (Eq. 3).
    With no counterfactuals this is :func:`..model.blip_itm_loss` (0 when no negative can be drawn)."""
    has_cf = has_cf.to(torch.bool)
    n, p = has_cf.shape[0], image_feats.shape[0]
    if p != n + int(has_cf.sum()):
        raise ConfigError(f"CVLD: {p} pool rows for {n} examples with {int(has_cf.sum())} counterfactuals. Fix: "
                          "stack the originals and then their counterfactuals")
    neg_text, neg_image = itm_negatives(sim_i2t, has_cf, generator, exclude_counterfactuals)
    rows = torch.arange(p, device=image_feats.device)
    ok_t, ok_i = neg_text >= 0, neg_image >= 0
    if not (ok_t.any() or ok_i.any()):  # e.g. a batch of one: no negative, loss 0 as blip_itm_loss
        return image_feats.sum() * 0.0
    img_idx = torch.cat([rows, rows[ok_t], neg_image[ok_i]])
    txt_idx = torch.cat([rows, neg_text[ok_t], rows[ok_i]])
    anchor = torch.cat([rows, rows[ok_t], rows[ok_i]])  # the pair each entry belongs to
    labels = torch.cat([torch.ones(p, dtype=torch.long), torch.zeros(int(ok_t.sum()) + int(ok_i.sum()),
                                                                     dtype=torch.long)]).to(image_feats.device)
    logits = blip_itm_logits(model, image_feats[img_idx], input_ids[txt_idx], attention_mask[txt_idx])
    ce = F.cross_entropy(logits, labels, reduction="none")
    original = anchor < n
    loss = ce[original].mean()
    if lam and (~original).any():
        loss = loss + lam * ce[~original].mean()
    return loss


@dataclass(frozen=True)
class RetrievalVariant:
    """Which parts of CVLD a retrieval run uses (Table 3)."""

    candidates: bool  # intervened images/texts join the ITC candidates
    labels: str  # "soft" | "hard" ITC targets for the counterparts
    query_extension: bool  # counterfactual queries (Eq. 8), weighted lambda
    itm_counterfactuals: bool  # counterfactual pairs in the ITM loss, weighted lambda
    exclude_counterfactuals: bool  # counterparts never drawn as ITM hard negatives


#: Table 3's variants. Our readings where the paper is brief: "hard_label" is full CVLD with one-hot ITC
#: targets and counterparts allowed as ITM hard negatives ("all counterfactual examples are considered
#: negatives"); "neg_only" adds the intervened images/texts as plain negative candidates to ITC and uses
#: no counterfactual loss term (lambda = 0), ITM plain; "itc"/"itm" debias one objective, the other plain.
VARIANTS: dict[str, RetrievalVariant] = {
    "base": RetrievalVariant(False, "soft", False, False, True),
    "hard_label": RetrievalVariant(True, "hard", True, True, False),
    "neg_only": RetrievalVariant(True, "hard", False, False, True),
    "itc": RetrievalVariant(True, "soft", True, False, True),
    "itm": RetrievalVariant(False, "soft", False, True, True),
    "cvld": RetrievalVariant(True, "soft", True, True, True),
}


def retrieval_variant(name: str) -> RetrievalVariant:
    if name not in VARIANTS:
        raise ConfigError(f"CVLD: unknown retrieval variant {name!r}. Fix: use one of {sorted(VARIANTS)}")
    return VARIANTS[name]


class RetrievalModule(nn.Module):
    """BLIP ITC + ITM with CVLD. Holds the model and BLIP's learnable temperature (0.07, clamped to
    [0.001, 0.5] as :class:`..model.ContrastiveModule`; training-only, not saved with the model)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.temp = nn.Parameter(torch.tensor(BLIP_TEMP_INIT))

    def forward(self, pixel_values, input_ids, attention_mask, has_cf, variant: RetrievalVariant, lam: float,
                generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Pool rows: the N originals, then the M counterfactuals in ``has_cf`` order."""
        with torch.no_grad():
            self.temp.clamp_(*BLIP_TEMP_RANGE)
        has_cf = has_cf.to(torch.bool)
        n = has_cf.shape[0]
        model = self.model
        feats = model.vision_model(pixel_values=pixel_values)[0]
        text = model.text_encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        img = F.normalize(model.vision_proj(feats[:, 0, :]), dim=-1)
        txt = F.normalize(model.text_proj(text[:, 0, :]), dim=-1)
        itc_cf = has_cf if variant.candidates else torch.zeros_like(has_cf)
        m = int(itc_cf.sum())
        itc = cvld_itc_loss(img[:n], txt[:n], img[n:n + m], txt[n:n + m], itc_cf, self.temp, lam,
                            variant.labels, variant.query_extension)
        itm_cf = has_cf if variant.itm_counterfactuals else torch.zeros_like(has_cf)
        p = n + int(itm_cf.sum())
        sim = img[:p] @ txt[:p].T / self.temp
        itm = cvld_itm_loss(model, feats[:p], input_ids[:p], attention_mask[:p], sim, itm_cf, lam, generator,
                            variant.exclude_counterfactuals)
        return {"loss": itc + itm, "itc": itc.detach(), "itm": itm.detach()}


# --------------------------------------------------------------------------- captioning (§4.4)

def caption_lm_loss(model: nn.Module, pixel_values: torch.Tensor, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 9, ``-log p(T | I)``: ``BlipForConditionalGeneration``'s language-modelling loss (mean over the
    caption tokens), with BLIP's decoder input: the first token replaced by the decoder's bos token
    (``[DEC]``, what ``generate`` starts from) and padding left out of the targets."""
    ids = input_ids.clone()
    ids[:, 0] = model.config.text_config.bos_token_id
    labels = ids.masked_fill(attention_mask == 0, -100)
    return model(pixel_values=pixel_values, input_ids=ids, attention_mask=attention_mask, labels=labels).loss


def captioning_loss(model: nn.Module, pixel_values, input_ids, attention_mask, cf_pixel_values=None,
                    cf_input_ids=None, cf_attention_mask=None, lam: float = 0.3) -> torch.Tensor:
    """Eq. 3 with Eq. 9: ``LM(I, T) + lam * LM(I~, T~)`` over the intervened pairs (lambda 0.3, appendix C)."""
    loss = caption_lm_loss(model, pixel_values, input_ids, attention_mask)
    if lam and cf_pixel_values is not None and cf_pixel_values.shape[0] > 0:
        loss = loss + lam * caption_lm_loss(model, cf_pixel_values, cf_input_ids, cf_attention_mask)
    return loss


# --------------------------------------------------------------------------- settings

#: appendix C; classification epochs are not in the paper (our choice: 20)
TASK_DEFAULTS = {
    "classification": dict(epochs=20, lr=1e-2, batch_size=32, lam=1.0, max_length=35),
    "retrieval": dict(epochs=6, lr=1e-5, batch_size=128, lam=0.3, max_length=35),
    "captioning": dict(epochs=5, lr=1e-5, batch_size=128, lam=0.3, max_length=40),
}


@dataclass(frozen=True)
class CVLDSettings:
    """One CVLD run. Use :meth:`for_task` for appendix C's defaults. ``max_length``: text tokens (BLIP's
    retrieval code truncates at 35, its captioning decoder at 40). ``variant``: retrieval only (Table 3).
    ``n_prompts`` / ``n_prompt_layers``: classification's prompt tuning (§5.1)."""

    task: str
    epochs: int
    lr: float
    batch_size: int
    lam: float
    max_length: int = 35
    weight_decay: float = 0.05  # BLIP's fine-tuning configs
    variant: str = "cvld"
    max_steps: int | None = None
    seed: int = 0
    n_prompts: int = 4
    n_prompt_layers: int = 9
    progress: bool = False

    def __post_init__(self):
        if self.task not in TASKS:
            raise ConfigError(f"CVLD: unknown task {self.task!r}. Fix: use one of {list(TASKS)}")
        retrieval_variant(self.variant)
        if self.epochs < 1 or self.batch_size < 1 or (self.max_steps is not None and self.max_steps < 1):
            raise ConfigError(f"CVLD: epochs, batch_size and max_steps must be >= 1 (got {self.epochs}, "
                              f"{self.batch_size}, {self.max_steps}). Fix: set positive values")
        if self.lam < 0:
            raise ConfigError(f"CVLD: lambda must be >= 0, got {self.lam}. Fix: use 0 (no counterfactual term) or more")

    @classmethod
    def for_task(cls, task: str, **overrides) -> "CVLDSettings":
        if task not in TASK_DEFAULTS:
            raise ConfigError(f"CVLD: unknown task {task!r}. Fix: use one of {list(TASKS)}")
        return cls(task=task, **{**TASK_DEFAULTS[task], **overrides})


@dataclass
class CVLDResult:
    history: list[dict] = field(default_factory=list)
    out_dir: Path | None = None


# --------------------------------------------------------------------------- few-shot episodes, BLIP^Bal

def _rank_key(*parts) -> str:
    return hashlib.sha1(":".join(str(p) for p in parts).encode("utf-8")).hexdigest()


def _seed_of(*parts) -> int:
    return int(_rank_key(*parts)[:15], 16)


def _row_keys(frame: pd.DataFrame, id_col: str | None = None) -> list[str]:
    if id_col is not None:
        return frame[id_col].astype(str).tolist()
    if "id" in frame.columns:
        return frame["id"].astype(str).tolist()
    if "image_path" in frame.columns:
        caption = frame["caption"].astype(str) if "caption" in frame.columns else ""
        return (frame["image_path"].astype(str) + "\n" + caption).tolist()
    return [str(i) for i in frame.index]


def sample_episode(labels_frame: pd.DataFrame, attribute: str, k: int, episode: int, seed: int = 0,
                   id_col: str | None = None) -> pd.DataFrame:
    """A K-shot episode (§5.2): K rows with ``attribute == 1`` then K with ``attribute == 0``. Rows are
    ranked by sha1 of (seed, attribute, k, episode, row id) and the first K of each class are kept, so an
    episode depends on those values and the rows' ids only (not on the table's order). Row ids:
    ``id_col``, else an ``id`` column, else image path + caption, else the index."""
    source = labels_frame.attrs.get("source", "labels table")
    if attribute not in labels_frame.columns:
        raise input_error(source, None, f"no column {attribute!r}", "pass one of the attribute columns "
                          f"{[c for c in labels_frame.columns if c in CELEBA_PROMPTS] or list(labels_frame.columns)}")
    values = labels_frame[attribute]
    bad = ~values.isin([0, 1])
    if bad.any():
        raise input_error(source, f"row {int(np.flatnonzero(bad)[0])}", f"{attribute} is {values[bad].iloc[0]!r}, "
                          "not 0/1", "map CelebA's -1/1 values to 0/1 ((x + 1) // 2)")
    keys = _row_keys(labels_frame, id_col)
    ranks = pd.Series([_rank_key(seed, attribute, k, episode, key) for key in keys], index=labels_frame.index)
    parts = []
    for value in (1, 0):
        pool = ranks[values == value].sort_values(kind="stable")
        if len(pool) < k:
            raise input_error(source, None, f"{len(pool)} rows with {attribute} = {value}, fewer than K = {k}",
                              "use a smaller K or a larger training table")
        parts.append(labels_frame.loc[pool.index[:k]])
    return pd.concat(parts)


def balanced_subset(frame: pd.DataFrame, group_col: str, seed: int = 0, id_col: str | None = None) -> pd.DataFrame:
    """BLIP^Bal's training set (Tables 2 and 4): every group of ``group_col`` (e.g. gender) downsampled to
    the size of the smallest group, keeping the rows of each group that rank first by sha1 of (seed, row
    id). Rows with no group (null or empty: no person) are all kept, as are the table's order and index.
    Downsampling rather than oversampling is our reading of "balanced sampling" (§5.3: resampling
    "effectively reduces the sample count")."""
    if group_col not in frame.columns:
        raise input_error(frame.attrs.get("source", "training table"), None, f"no column {group_col!r}",
                          "pass the column holding the protected group (e.g. gender)")
    groups = frame[group_col]
    grouped = groups.notna() & (groups.astype(str).str.strip() != "")
    if not grouped.any():
        return frame.copy()
    sizes = groups[grouped].value_counts()
    keep = ~grouped
    keys = pd.Series(_row_keys(frame, id_col), index=frame.index)
    for value in sizes.index:
        members = keys[grouped & (groups == value)]
        ranks = members.map(lambda key: _rank_key(seed, "balanced", key)).sort_values(kind="stable")
        keep.loc[ranks.index[: int(sizes.min())]] = True
    return frame[keep].copy()


# --------------------------------------------------------------------------- data

def _blank(values: pd.Series) -> pd.Series:
    return values.isna() | (values.astype(str).str.strip() == "")


def _check_table(table: pd.DataFrame, task: str) -> pd.DataFrame:
    source = table.attrs.get("source", "training table")
    need = {"classification": ["image_path", "cf_image_path", "label"],
            "retrieval": ["image_path", "caption", "cf_image_path", "cf_caption"],
            "captioning": ["image_path", "caption", "cf_image_path", "cf_caption"]}[task]
    missing = [c for c in need if c not in table.columns]
    if missing:
        raise input_error(source, None, f"missing columns {missing}", f"a {task} table needs {need} (cf_* empty "
                          "when an example has no counterfactual)")
    if len(table) == 0:
        raise input_error(source, None, "no rows", "check the training split")
    table = table.reset_index(drop=True)
    if _blank(table["image_path"]).any():
        raise input_error(source, f"row {int(np.flatnonzero(_blank(table['image_path']))[0])}", "empty image_path",
                          "fill it or drop the row")
    if task == "classification":
        bad = ~table["label"].isin([0, 1])
        if bad.any():
            raise input_error(source, f"row {int(np.flatnonzero(bad)[0])}", f"label {table['label'][bad].iloc[0]!r} "
                              "is not 0/1", "map the attribute to 0/1")
    else:
        if _blank(table["caption"]).any():
            raise input_error(source, f"row {int(np.flatnonzero(_blank(table['caption']))[0])}", "empty caption",
                              "fill it or drop the row")
        half = _blank(table["cf_image_path"]) != _blank(table["cf_caption"])
        if half.any():
            raise input_error(source, f"row {int(np.flatnonzero(half)[0])}", "a counterfactual image without a "
                              "caption or a caption without an image", "give both cf_image_path and cf_caption, or neither")
    return table


def _images(paths: Sequence[str], rows: Sequence[int], root: Path, processor, source: str) -> torch.Tensor:
    from PIL import Image

    images = []
    for path, row in zip(paths, rows):
        full = root / str(path)
        try:
            with Image.open(full) as im:
                images.append(im.convert("RGB"))
        except (OSError, ValueError) as exc:
            raise input_error(source, f"row {row}", f"cannot read image {full} ({exc})",
                              "fix the path (relative to the image root) or the file") from exc
    return processor.image_processor(images=images, return_tensors="pt")["pixel_values"]


def _tokens(processor, texts: Sequence[str], max_length: int):
    return processor.tokenizer(list(texts), padding="longest", truncation=True, max_length=max_length,
                               return_tensors="pt")


# --------------------------------------------------------------------------- loops

def _cosine_factor(step: int, steps_per_epoch: int, epochs: int) -> float:
    """BLIP's ``cosine_lr_schedule`` (min_lr 0), set once per epoch: ``0.5 * (1 + cos(pi * epoch / epochs))``."""
    return 0.5 * (1.0 + math.cos(math.pi * (step // steps_per_epoch) / epochs))


def _batches(keys: Sequence[str], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    order = sorted(range(len(keys)), key=lambda i: (_rank_key(seed, "epoch", epoch, keys[i]), i))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def _fit(params: list[nn.Parameter], keys: Sequence[str], settings: CVLDSettings,
         step_loss: Callable[[list[int], torch.Generator], torch.Tensor]) -> list[dict]:
    """AdamW + BLIP's per-epoch cosine schedule over seeded batches. Each step seeds dropout and the ITM
    draw from (seed, the batch's row ids); the global RNG is restored afterwards."""
    from tqdm.auto import tqdm

    per_epoch = math.ceil(len(keys) / settings.batch_size)
    total = per_epoch * settings.epochs
    if settings.max_steps is not None:
        total = min(total, settings.max_steps)
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _cosine_factor(s, per_epoch, settings.epochs))
    history, step = [], 0
    with torch.random.fork_rng(devices=[]), tqdm(total=total, disable=not settings.progress,
                                                  desc=f"CVLD {settings.task}") as bar:
        for epoch in range(settings.epochs):
            for rows in _batches(keys, settings.batch_size, settings.seed, epoch):
                if step >= total:
                    return history
                batch_seed = _seed_of(settings.seed, "step", *(keys[r] for r in rows))
                torch.manual_seed(batch_seed)
                generator = torch.Generator().manual_seed(batch_seed)
                lr = optimizer.param_groups[0]["lr"]
                loss = step_loss(rows, generator)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1
                history.append({"step": step, "epoch": epoch, "loss": float(loss.detach()), "lr": lr})
                bar.update(1)
                bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
    return history


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _record(settings: CVLDSettings, history: list[dict], extra: dict | None = None) -> str:
    return json.dumps({"settings": asdict(settings), "history": history, **(extra or {})}, indent=2, sort_keys=True)


def train_classification(model: nn.Module, processor, table: pd.DataFrame, attribute: str,
                         settings: CVLDSettings | None = None, out_dir: str | Path | None = None,
                         image_root: str | Path = ".") -> CVLDResult:
    """Few-shot CVLD classification (§4.2, §5.2) of a ``BlipForImageTextRetrieval``: deep prompts are
    added (unless the model has them; seed ``settings.seed``) and only they are trained on Eq. 3 with
    :func:`classification_loss` (rows with ``cf_image_path`` contribute their counterfactual). The frozen
    model runs in eval mode (no dropout; our choice). Saves ``prompts.safetensors`` and ``cvld.json``."""
    settings = settings or CVLDSettings.for_task("classification")
    if "label" not in table.columns and attribute in table.columns:  # a sample_episode frame
        table = table.assign(label=table[attribute])
    table = _check_table(table, "classification")
    source, root = table.attrs.get("source", "training table"), Path(image_root)
    if getattr(model, ATTR, None) is None:
        add_prompts(model, settings.n_prompts, settings.n_prompt_layers, seed=settings.seed)
    model.eval()
    device = _device(model)
    prompt_tokens = {k: v.to(device) for k, v in _tokens(processor, class_prompts(attribute), settings.max_length).items()}
    has_cf = ~_blank(table["cf_image_path"])

    def step_loss(rows, generator):
        sub = table.iloc[rows]
        pixels = _images(sub["image_path"], rows, root, processor, source).to(device)
        labels = torch.tensor(sub["label"].astype(int).to_numpy())
        cf_rows = [r for r in rows if has_cf[r]]
        cf_pixels = _images(table["cf_image_path"][cf_rows], cf_rows, root, processor, source).to(device) \
            if cf_rows and settings.lam else None
        cf_labels = torch.tensor(table["label"][cf_rows].astype(int).to_numpy())
        return classification_loss(model, prompt_tokens, pixels, labels, cf_pixels, cf_labels, settings.lam)

    history = _fit(prompt_parameters(model), _row_keys(table), settings, step_loss)
    if out_dir is not None:
        from ..io import atomic_dir

        with atomic_dir(out_dir) as tmp:
            save_prompts(model, tmp / "prompts.safetensors")
            (tmp / "cvld.json").write_text(_record(settings, history, {"attribute": attribute,
                                                                        "class_prompts": class_prompts(attribute)}))
    return CVLDResult(history, Path(out_dir) if out_dir is not None else None)


def _pool_batch(table, rows, has_cf, root, processor, settings, source, device):
    """Pixels and tokens of the pool: the rows' originals, then the counterfactuals of those that have one."""
    cf_rows = [r for r in rows if has_cf[r]]
    paths = list(table["image_path"][rows]) + list(table["cf_image_path"][cf_rows])
    texts = list(table["caption"][rows]) + list(table["cf_caption"][cf_rows])
    pixels = _images(paths, list(rows) + cf_rows, root, processor, source).to(device)
    tokens = {k: v.to(device) for k, v in _tokens(processor, texts, settings.max_length).items()}
    return pixels, tokens, torch.tensor([bool(has_cf[r]) for r in rows])


def _save_model(model, processor, out_dir, settings, history) -> None:
    from ..io import atomic_dir

    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        (tmp / "cvld.json").write_text(_record(settings, history))


def train_retrieval(model: nn.Module, processor, table: pd.DataFrame, settings: CVLDSettings | None = None,
                    out_dir: str | Path | None = None, image_root: str | Path = ".") -> CVLDResult:
    """CVLD retrieval fine-tuning (§4.3, §5.3) of the whole ``BlipForImageTextRetrieval`` with
    :class:`RetrievalModule` and ``settings.variant`` (Table 3). Saves the model (loadable with
    ``from_pretrained``; the temperature is dropped), the processor and ``cvld.json``."""
    settings = settings or CVLDSettings.for_task("retrieval")
    table = _check_table(table, "retrieval")
    source, root = table.attrs.get("source", "training table"), Path(image_root)
    module = RetrievalModule(model).to(_device(model))
    module.train()
    variant = retrieval_variant(settings.variant)
    has_cf = ~_blank(table["cf_image_path"])
    if not (variant.candidates or variant.itm_counterfactuals):
        has_cf[:] = False

    def step_loss(rows, generator):
        pixels, tokens, cf = _pool_batch(table, rows, has_cf, root, processor, settings, source, _device(model))
        return module(pixels, tokens["input_ids"], tokens["attention_mask"], cf, variant, settings.lam,
                      generator)["loss"]

    history = _fit(list(module.parameters()), _row_keys(table), settings, step_loss)
    model.eval()
    if out_dir is not None:
        _save_model(model, processor, out_dir, settings, history)
    return CVLDResult(history, Path(out_dir) if out_dir is not None else None)


def train_captioning(model: nn.Module, processor, table: pd.DataFrame, settings: CVLDSettings | None = None,
                     out_dir: str | Path | None = None, image_root: str | Path = ".") -> CVLDResult:
    """CVLD captioning fine-tuning (§4.4, §5.4) of a ``BlipForConditionalGeneration`` on
    :func:`captioning_loss`. Saves the model, the processor and ``cvld.json``."""
    settings = settings or CVLDSettings.for_task("captioning")
    table = _check_table(table, "captioning")
    source, root = table.attrs.get("source", "training table"), Path(image_root)
    model.train()
    has_cf = ~_blank(table["cf_image_path"])

    def step_loss(rows, generator):
        pixels, tokens, cf = _pool_batch(table, rows, has_cf, root, processor, settings, source, _device(model))
        n = len(rows)
        ids, mask = tokens["input_ids"], tokens["attention_mask"]
        return captioning_loss(model, pixels[:n], ids[:n], mask[:n], pixels[n:], ids[n:], mask[n:], settings.lam)

    history = _fit([p for p in model.parameters() if p.requires_grad], _row_keys(table), settings, step_loss)
    model.eval()
    if out_dir is not None:
        _save_model(model, processor, out_dir, settings, history)
    return CVLDResult(history, Path(out_dir) if out_dir is not None else None)


def train(task: str, model: nn.Module, processor, table: pd.DataFrame, settings: CVLDSettings | None = None,
          out_dir: str | Path | None = None, image_root: str | Path = ".", attribute: str | None = None) -> CVLDResult:
    """One entry for the three tasks (``attribute``: classification's target column)."""
    settings = settings or CVLDSettings.for_task(task)
    if settings.task != task:
        raise ConfigError(f"CVLD: settings for {settings.task!r} given to a {task!r} run. Fix: use "
                          f"CVLDSettings.for_task({task!r})")
    if task == "classification":
        if attribute is None:
            raise ConfigError("CVLD: classification needs the target attribute. Fix: pass attribute=<column>")
        return train_classification(model, processor, table, attribute, settings, out_dir, image_root)
    if task == "retrieval":
        return train_retrieval(model, processor, table, settings, out_dir, image_root)
    return train_captioning(model, processor, table, settings, out_dir, image_root)
