"""CVLD's losses (CVLD §4, Eq. 3 and Eq. 5-9, Table 3): the part of CVLD that is not a training loop.

* **Classification** (§4.2): BLIP's ITM head over class prompts ``p(c)`` (:data:`CELEBA_PROMPTS`);
  ``CE(B) + lambda * CE(B~)`` with the counterfactual images keeping their labels.
* **Retrieval** (§4.3): :func:`cvld_itc_loss` (candidate extension with soft labels, query extension of Eq. 8)
  and :func:`cvld_itm_loss` (counterparts never drawn as hard negatives), the ablation variants of Table 3
  (:data:`VARIANTS`) and :class:`RetrievalModule` (BLIP's ITC projections and temperature). Two objectives for
  BLIP's own ITC + ITM (``objective``; CVLD appendix C "following the official BLIP implementation", and §4.3
  footnote 3 "BLIP also uses a momentum encoder to augment positive and negative sets, omitted here for
  simplicity"): ``official`` (default of ``cvld.retrieval.train``) is BLIP's retrieval fine-tuning
  (:mod:`.model`: momentum encoders, queues, momentum distillation, same-image positives and ITM masks) for the
  original queries, the counterfactual terms of Eq. 3 / 8 added on top as they are; ``plain`` is BLIP's ITC +
  ITM in the batch alone (:func:`cvld_itc_loss`, :func:`cvld_itm_loss`), the loss before the official one.
* **Captioning** (§4.4, Eq. 9): BLIP's language-modelling loss on (I, T) plus lambda times the same loss on the
  intervened pairs.

The loops that drive them (AdamW under BLIP's per-epoch cosine schedule, seeded by row ids) are in
:mod:`counterfactory.training.cvld`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .model import (BLIP_OBJECTIVES, BLIP_TEMP_INIT, BLIP_TEMP_RANGE, BlipMomentum, blip_distilled_itc,
                    blip_itm_logits)


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


def counterpart_weights(txt_emb: torch.Tensor, cf_txt_emb: torch.Tensor, has_cf: torch.Tensor,
                        labels: str = "soft") -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx, s)``: the positions of the examples that have a counterfactual (``has_cf`` order) and the weight
    ``s_i = max(0, cos(T_i, T~_i))`` of each one's counterpart in the ITC targets, the unimodal similarity of the
    ITC text embeddings, detached (§4.3 "use the unimodal similarity ... to supervise ITC learning");
    ``labels="hard"``: 0 (Table 3 "Hard label")."""
    if labels not in ("soft", "hard"):
        raise ConfigError(f"CVLD: labels must be 'soft' or 'hard', got {labels!r}. Fix: use one of them")
    has_cf = has_cf.to(torch.bool)
    cf_txt = _compact(cf_txt_emb, has_cf)
    idx = torch.nonzero(has_cf.cpu()).squeeze(1).to(txt_emb.device)
    m = idx.shape[0]
    if labels == "soft" and m:
        s = F.cosine_similarity(txt_emb[idx].detach().float(), cf_txt.detach().float(), dim=-1).clamp(min=0)
    else:
        s = torch.zeros(m, device=txt_emb.device)
    return idx, s


def itc_targets(txt_emb: torch.Tensor, cf_txt_emb: torch.Tensor, has_cf: torch.Tensor,
                labels: str = "soft") -> torch.Tensor:
    """(N + M, N + M) target distributions over the candidates ``originals ∪ counterfactuals`` (originals
    first, then the counterfactuals in ``has_cf`` order) for the same queries. Original ``i`` puts weight 1
    on itself and ``s_i`` on its counterfactual, the counterfactual weight 1 on itself and ``s_i`` on its
    original, where ``s_i = max(0, cos(T_i, T~_i))`` is the unimodal similarity of the ITC text embeddings
    (detached); each row is divided by its sum (``1 + s_i``), our reading of "supervise ITC learning" with
    the similarity (§4.3). ``labels="hard"``: ``s_i = 0``, one-hot targets (Table 3 "Hard label")."""
    n = has_cf.shape[0]
    idx, s = counterpart_weights(txt_emb, cf_txt_emb, has_cf, labels)
    m = idx.shape[0]
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


def official_itc_targets(image_ids: torch.Tensor, candidate_ids: torch.Tensor, idx: torch.Tensor,
                         s: torch.Tensor) -> torch.Tensor:
    """``(N, C)`` ground truth of the original queries under the official objective. Candidates: the ``N``
    originals, the ``M`` counterfactuals (``has_cf`` order), then the queue (``candidate_ids``: their image
    ids). Query ``i`` puts weight 1 on every candidate with its image id (BLIP's ``sim_targets``: the batch's
    other captions of the image and the queue's entries of it) and ``s_k`` (:func:`counterpart_weights`) on
    its own counterfactual, candidate ``N + k`` for ``idx[k] = i`` (CVLD's soft label; 1 if the counterfactual
    is a file of the query's image); rows divided by their sums. No counterfactual: BLIP's
    :func:`..model.same_image_targets`; no shared image and no queue: the original rows of :func:`itc_targets`."""
    n, m = image_ids.shape[0], idx.shape[0]
    pos = (image_ids.reshape(-1, 1) == candidate_ids.reshape(1, -1)).float()
    if m:
        cf_pos = n + torch.arange(m, device=pos.device)
        pos[idx.to(pos.device), cf_pos] = torch.maximum(pos[idx.to(pos.device), cf_pos], s.to(pos.dtype))
    return pos / pos.sum(dim=1, keepdim=True)


def official_itc_loss(img_emb, txt_emb, cf_txt_emb, img_m, txt_m, cf_img_m, cf_txt_m, has_cf, temperature,
                      alpha: float, image_ids, cf_image_ids, labels: str = "soft", image_queue=None, text_queue=None,
                      idx_queue=None) -> torch.Tensor:
    """BLIP's official ITC (:func:`..model.blip_itc_loss`, ``blip_retrieval.py``) for the ``N`` original queries
    with CVLD's candidate extension (§4.3): the candidates are the momentum embeddings of the originals
    (``img_m``, ``txt_m``), of the counterfactuals (``cf_img_m``, ``cf_txt_m``: one row per counterfactual, in
    ``has_cf`` order; image ids ``cf_image_ids``) and of the queue; ground truth :func:`official_itc_targets`
    (same-image positives, soft counterparts from the online text embeddings ``txt_emb`` / ``cf_txt_emb``),
    distilled with weight ``alpha`` as :func:`..model.blip_distilled_itc`. No counterfactual candidates: exactly
    :func:`..model.blip_itc_loss`. The counterfactual queries (Eq. 8's ``lambda`` term) are not here: they stay
    CVLD's in-batch terms (:func:`itc_terms`)."""
    has_cf = has_cf.to(torch.bool)
    m = int(has_cf.sum())
    ids = image_ids.reshape(-1).to(img_emb.device, torch.long)
    parts = [(ids, img_m, txt_m)]
    if m:
        cf_ids = cf_image_ids.reshape(-1).to(ids.device, torch.long)
        if cf_ids.shape[0] == has_cf.shape[0] != m:     # one id per example: those with a counterfactual
            cf_ids = cf_ids[has_cf.to(ids.device)]
        if cf_ids.shape[0] != m:
            raise ConfigError(f"CVLD: {cf_ids.shape[0]} counterfactual image ids for {m} counterfactuals. Fix: "
                              "pass one image id per counterfactual")
        parts.append((cf_ids, _compact(cf_img_m, has_cf), _compact(cf_txt_m, has_cf)))
    if image_queue is not None:
        parts.append((idx_queue.reshape(-1).to(ids.device, torch.long), image_queue.to(img_m.dtype),
                      text_queue.to(txt_m.dtype)))
    ids_all, img_m_all, txt_m_all = (torch.cat(x) if len(parts) > 1 else x[0] for x in zip(*parts))
    if ids.shape[0] != img_emb.shape[0]:
        raise ConfigError(f"CVLD: {ids.shape[0]} image ids for {img_emb.shape[0]} originals. Fix: pass one image "
                          "id per original")
    with torch.no_grad():
        if m:
            idx, s = counterpart_weights(txt_emb, cf_txt_emb, has_cf, labels)
        else:
            idx, s = torch.zeros(0, dtype=torch.long, device=ids.device), torch.zeros(0, device=ids.device)
        targets = official_itc_targets(ids, ids_all, idx, s)
    return blip_distilled_itc(img_emb, txt_emb, img_m, txt_m, img_m_all, txt_m_all, targets, temperature, alpha)


def counterpart_mask(has_cf: torch.Tensor, exclude_counterfactuals: bool = True,
                     same: torch.Tensor | None = None) -> torch.Tensor:
    """(P, P) bool, P = N + M (originals, then counterfactuals in ``has_cf`` order): True where a pair may
    not be drawn as a hard negative: the pair itself and, with ``exclude_counterfactuals``, an example's
    own counterfactual (and, for a counterfactual, its original); with ``same`` ((P, P) bool, True where two
    pool rows show the same image: the official objective's BLIP ``idx`` mask) every same-image pair too."""
    has_cf = has_cf.to(torch.bool).cpu()
    n, idx = has_cf.shape[0], torch.nonzero(has_cf).squeeze(1)
    p = n + idx.shape[0]
    forbidden = torch.eye(p, dtype=torch.bool)
    if exclude_counterfactuals:
        cf_pos = n + torch.arange(idx.shape[0])
        forbidden[idx, cf_pos] = True
        forbidden[cf_pos, idx] = True
    if same is not None:
        if tuple(same.shape) != (p, p):
            raise ConfigError(f"CVLD: a same-image mask of shape {tuple(same.shape)} for a pool of {p} pairs. Fix: "
                              "compare the image ids of originals + counterfactuals")
        forbidden = forbidden | same.detach().to("cpu", torch.bool)
    return forbidden


def itm_negatives(sim_i2t: torch.Tensor, has_cf: torch.Tensor, generator: torch.Generator | None = None,
                  exclude_counterfactuals: bool = True, same: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """BLIP's hard-negative draw over the pool ``originals ∪ counterfactuals``: one negative text per
    image and one negative image per text, by ``torch.multinomial`` from the softmax of the ITC
    similarities with :func:`counterpart_mask` zeroed (``same``: same-image pairs too; drawn on the CPU with
    ``generator``). A row whose allowed weights underflow draws uniformly among the allowed; a row with none
    allowed gets -1."""
    forbidden = counterpart_mask(has_cf, exclude_counterfactuals, same)
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
                  generator: torch.Generator | None = None, exclude_counterfactuals: bool = True,
                  same: torch.Tensor | None = None) -> torch.Tensor:
    """Debiased ITM (§4.3): BLIP's ITM cross-entropy over the pool ``originals ∪ counterfactuals`` (rows of
    ``image_feats`` / ``input_ids``: the N originals, then the M counterfactuals in ``has_cf`` order). Each
    pair is a positive; each image gets a negative text and each text a negative image from
    :func:`itm_negatives` (an example's own counterfactual never drawn; with ``same``, the official
    objective's same-image mask, no pair of one image either). Loss: the mean cross-entropy of the originals'
    positive and negative pairs plus ``lam`` times that of the counterfactual pairs (Eq. 3), the two parts of
    :func:`itm_terms`. With no counterfactuals this is :func:`..model.blip_itm_loss` (0 when no negative can be
    drawn)."""
    terms = itm_terms(model, image_feats, input_ids, attention_mask, sim_i2t, has_cf, generator,
                      exclude_counterfactuals, same)
    loss = terms["itm"]
    if lam and terms["itm_cf"] is not None:
        loss = loss + lam * terms["itm_cf"]
    return loss


def itm_terms(model: nn.Module, image_feats: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              sim_i2t: torch.Tensor, has_cf: torch.Tensor, generator: torch.Generator | None = None,
              exclude_counterfactuals: bool = True, same: torch.Tensor | None = None) -> dict:
    """The parts of :func:`cvld_itm_loss`: ``itm``, the mean cross-entropy of the originals' positive and
    negative pairs, and ``itm_cf``, that of the counterfactual pairs (``None`` when the pool has none)."""
    has_cf = has_cf.to(torch.bool)
    n, p = has_cf.shape[0], image_feats.shape[0]
    if p != n + int(has_cf.sum()):
        raise ConfigError(f"CVLD: {p} pool rows for {n} examples with {int(has_cf.sum())} counterfactuals. Fix: "
                          "stack the originals and then their counterfactuals")
    neg_text, neg_image = itm_negatives(sim_i2t, has_cf, generator, exclude_counterfactuals, same)
    rows = torch.arange(p, device=image_feats.device)
    ok_t, ok_i = neg_text >= 0, neg_image >= 0
    if not (ok_t.any() or ok_i.any()):  # e.g. a batch of one: no negative, loss 0 as blip_itm_loss
        return {"itm": image_feats.sum() * 0.0, "itm_cf": None}
    img_idx = torch.cat([rows, rows[ok_t], neg_image[ok_i]])
    txt_idx = torch.cat([rows, neg_text[ok_t], rows[ok_i]])
    anchor = torch.cat([rows, rows[ok_t], rows[ok_i]])  # the pair each entry belongs to
    labels = torch.cat([torch.ones(p, dtype=torch.long), torch.zeros(int(ok_t.sum()) + int(ok_i.sum()),
                                                                     dtype=torch.long)]).to(image_feats.device)
    logits = blip_itm_logits(model, image_feats[img_idx], input_ids[txt_idx], attention_mask[txt_idx])
    ce = F.cross_entropy(logits, labels, reduction="none")
    original = anchor < n
    return {"itm": ce[original].mean(), "itm_cf": ce[~original].mean() if (~original).any() else None}


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
    [0.001, 0.5] as :class:`..model.ContrastiveModule`; training-only, not saved with the model).

    ``objective`` (module docstring; :func:`counterfactory.training.cvld.train_retrieval` passes
    ``cvld.retrieval.train.objective``, official by default): ``plain`` (this class's default, the loss before
    the official objective) is :func:`cvld_itc_loss` + :func:`cvld_itm_loss` in the batch. ``official`` also
    holds ``momentum`` (:class:`..model.BlipMomentum`: EMA copies of the unimodal encoders and projections,
    updated before every training forward encodes the batch, and queues of ``queue_size`` momentum
    embeddings with their image ids, which take the batch's originals after each step) and needs each pool
    row's image id (``image_ids``). Its loss:

    * ITC: :func:`official_itc_loss` for the original queries (momentum distillation with ``alpha``, ramped
      linearly from 0 over ``ramp_steps`` training forwards as BLIP's first epoch; same-image positives;
      the intervened images / texts among the candidates with their soft labels when the variant extends the
      candidates) plus, under query extension, ``lam * (t2i_cf + i2t_cf) / 2`` of :func:`itc_terms`,
      CVLD's counterfactual queries in the batch, the same terms as under ``plain``;
    * ITM: :func:`cvld_itm_loss` with BLIP's same-image mask added to CVLD's counterpart mask (no pair of one
      image is drawn as a hard negative), the counterfactual pairs weighted ``lam`` as under ``plain``.

    The queue takes only the originals (ours: an enqueued counterfactual would be a hard-label negative of
    its own original in a later step, against §4.3's soft labels). In eval mode nothing is updated: in-batch,
    ``alpha`` 0, the online embeddings as the momentum ones."""

    def __init__(self, model: nn.Module, objective: str = "plain", momentum: float = 0.995, queue_size: int = 57600,
                 alpha: float = 0.4, ramp_steps: int = 0):
        super().__init__()
        if objective not in BLIP_OBJECTIVES:
            raise ConfigError(f"CVLD: unknown BLIP objective {objective!r}. Fix: use one of {list(BLIP_OBJECTIVES)}")
        if not 0.0 <= float(alpha) <= 1.0 or int(ramp_steps) < 0:
            raise ConfigError(f"CVLD: alpha must be in [0, 1] and ramp_steps >= 0, got {alpha!r} and {ramp_steps!r}. "
                              "Fix: use BLIP's 0.4 and one epoch of steps")
        self.model = model
        self.temp = nn.Parameter(torch.tensor(BLIP_TEMP_INIT))
        self.momentum = BlipMomentum(model, momentum, queue_size) if objective == "official" else None
        self.alpha, self.ramp_steps = float(alpha), int(ramp_steps)
        #: training forwards so far (the alpha ramp's step; CVLD's loop runs one per optimiser step)
        self.step = 0

    @property
    def objective(self) -> str:
        return "plain" if self.momentum is None else "official"

    def alpha_at(self, step: int) -> float:
        """``alpha * min(1, step / ramp_steps)`` (BLIP's ramp over the first epoch; ``alpha`` when no ramp)."""
        if self.ramp_steps <= 0:
            return self.alpha
        return self.alpha * min(1.0, step / self.ramp_steps)

    def forward(self, pixel_values, input_ids, attention_mask, has_cf, variant: RetrievalVariant, lam: float,
                generator: torch.Generator | None = None, image_ids: torch.Tensor | None = None
                ) -> dict[str, torch.Tensor]:
        """Pool rows: the N originals, then the M counterfactuals in ``has_cf`` order; ``image_ids``: one per
        pool row (official objective). Returns ``loss`` and its detached parts: ``itc`` and ``itm`` (the whole
        ITC and ITM terms), ``itc_cf`` and ``itm_cf`` (the counterfactual terms before ``lam``; 0 when absent)."""
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
        itm_cf = has_cf if variant.itm_counterfactuals else torch.zeros_like(has_cf)
        p = n + int(itm_cf.sum())
        terms = itc_terms(img[:n], txt[:n], img[n:n + m], txt[n:n + m], itc_cf, self.temp, variant.labels)
        query_ext = variant.query_extension and lam
        cf_part = 0.5 * (terms["t2i_cf"] + terms["i2t_cf"])
        same = None
        if self.momentum is None:
            itc = cvld_itc_loss(img[:n], txt[:n], img[n:n + m], txt[n:n + m], itc_cf, self.temp, lam,
                                variant.labels, variant.query_extension)
        else:
            ids = self._pool_ids(image_ids, pixel_values.shape[0])
            base = self._official_itc(pixel_values, input_ids, attention_mask, img, txt, ids, itc_cf, n, m,
                                      variant.labels)
            itc = base + lam * cf_part if query_ext else base
            same = ids[:p, None] == ids[None, :p]
        sim = img[:p] @ txt[:p].T / self.temp
        itm_parts = itm_terms(model, feats[:p], input_ids[:p], attention_mask[:p], sim, itm_cf, generator,
                              variant.exclude_counterfactuals, same)
        itm = itm_parts["itm"]
        if lam and itm_parts["itm_cf"] is not None:
            itm = itm + lam * itm_parts["itm_cf"]
        zero = img.new_zeros(())
        return {"loss": itc + itm, "itc": itc.detach(), "itm": itm.detach(),
                "itc_cf": cf_part.detach() if m and variant.query_extension else zero,
                "itm_cf": itm_parts["itm_cf"].detach() if itm_parts["itm_cf"] is not None else zero}

    def _pool_ids(self, image_ids, rows: int) -> torch.Tensor:
        if image_ids is None:
            raise ConfigError("CVLD: BLIP's official objective needs each pool row's image id. Fix: pass image_ids "
                              "(training.data.image_id_map over the originals' and counterfactuals' paths), or use "
                              "objective: plain")
        ids = image_ids.reshape(-1).to(self.temp.device, torch.long)
        if ids.shape[0] != rows or bool((ids < 0).any()):
            raise ConfigError(f"CVLD: BLIP needs one image id >= 0 per pool row, got {ids.tolist()} for {rows} rows. "
                              "Fix: number the images from 0 (training.data.image_id_map)")
        return ids

    def _official_itc(self, pixel_values, input_ids, attention_mask, img, txt, ids, itc_cf, n, m, labels):
        """:func:`official_itc_loss` of the originals; in training the momentum step, then the queue update."""
        momentum = self.momentum
        if not self.training:
            return official_itc_loss(img[:n], txt[:n], txt[n:n + m], img[:n].detach(), txt[:n].detach(),
                                     img[n:n + m].detach(), txt[n:n + m].detach(), itc_cf, self.temp, 0.0,
                                     ids[:n], ids[n:n + m], labels)
        alpha = self.alpha_at(self.step)
        rows = n + m
        with torch.no_grad():   # BLIP: EMA update, momentum features, loss, then the queues take the batch
            momentum.update(self.model)
            img_m, txt_m = momentum.features(pixel_values[:rows], input_ids[:rows], attention_mask[:rows])
        loss = official_itc_loss(img[:n], txt[:n], txt[n:n + m], img_m[:n], txt_m[:n], img_m[n:], txt_m[n:], itc_cf,
                                 self.temp, alpha, ids[:n], ids[n:n + m], labels, momentum.image_queue,
                                 momentum.text_queue, momentum.idx_queue)
        momentum.enqueue(img_m[:n], txt_m[:n], ids[:n])
        self.step += 1
        return loss


# --------------------------------------------------------------------------- captioning (§4.4)

def prompt_length(tokenizer, prompt: str) -> int:
    """Leading token positions of a caption that begins with ``prompt`` which BLIP leaves out of its captioning
    loss: the prompt's tokens with the start token, without the closing separator (BLIP's ``prompt_length``);
    0 for no prompt."""
    return max(0, len(tokenizer(prompt).input_ids) - 1) if prompt else 0


def caption_lm_loss(model: nn.Module, pixel_values: torch.Tensor, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, prompt_tokens: int = 0) -> torch.Tensor:
    """Eq. 9, ``-log p(T | I)``: ``BlipForConditionalGeneration``'s language-modelling loss (mean over the
    caption tokens), with BLIP's decoder input: the first token replaced by the decoder's bos token
    (``[DEC]``, what ``generate`` starts from) and padding left out of the targets. ``prompt_tokens``: the first
    positions (the start token and the prompt, :func:`prompt_length`) are context only, not targets, as in BLIP's
    captioning fine-tuning, so the loss is the mean over the caption's own tokens."""
    ids = input_ids.clone()
    ids[:, 0] = model.config.text_config.bos_token_id
    labels = ids.masked_fill(attention_mask == 0, -100)
    if prompt_tokens:
        labels[:, :int(prompt_tokens)] = -100
    return model(pixel_values=pixel_values, input_ids=ids, attention_mask=attention_mask, labels=labels).loss


def captioning_loss(model: nn.Module, pixel_values, input_ids, attention_mask, cf_pixel_values=None,
                    cf_input_ids=None, cf_attention_mask=None, lam: float = 0.3, prompt_tokens: int = 0
                    ) -> torch.Tensor:
    """Eq. 3 with Eq. 9: ``LM(I, T) + lam * LM(I~, T~)`` over the intervened pairs (lambda 0.3, appendix C);
    ``prompt_tokens`` as in :func:`caption_lm_loss` (both captions carry the same prompt)."""
    loss = caption_lm_loss(model, pixel_values, input_ids, attention_mask, prompt_tokens)
    if lam and cf_pixel_values is not None and cf_pixel_values.shape[0] > 0:
        loss = loss + lam * caption_lm_loss(model, cf_pixel_values, cf_input_ids, cf_attention_mask, prompt_tokens)
    return loss
