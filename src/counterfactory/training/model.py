"""The models and the losses (the part of training this package owns; the Trainer does the rest).

* :class:`ContrastiveAdapter`: one face over the contrastive (ITC) models we fine-tune — HF ``CLIPModel``,
  open_clip, ``BridgeTowerForContrastiveLearning``, FLAVA (``FlavaForPreTraining`` / ``FlavaModel``) and
  BLIP (``BlipForImageTextRetrieval``) — with their processors: image and text preprocessing, and saving a checkpoint the registry reloads;
* :class:`ContrastiveModule`: the ``nn.Module`` handed to the Trainer; ``forward`` returns normalised
  image and text embeddings (BridgeTower also its cross-modal embedding) and the logit scale, so a
  data-parallel wrapper gathers whole batches and the contrastive loss sees every negative;
* :func:`clip_loss`, :func:`contrastive_loss`, :func:`recipe_loss`: symmetric InfoNCE, each model's own
  contrastive objective, and the recipes' losses on top of it.

Objectives (what each class's authors train with; COCO-CF appendix A.1 fine-tunes CLIP, BridgeTower and
FLAVA for retrieval without naming the loss, so each keeps its own):

* CLIP / open_clip / FLAVA: symmetric InfoNCE over image x text logits (FLAVA's global contrastive loss
  projects the unimodal [CLS] states, as ``FlavaForPreTraining`` does);
* VSE++ (:mod:`counterfactory.models.vsepp`, Kim et al. 2023 §4.1): its hardest-negative triplet ranking loss
  (:mod:`.vsepp_loss`), margin and max-of-hinges from the model's config;
* BridgeTower: ``BridgeTowerForContrastiveLearning``'s loss, the mean of text->image, text->cross-modal
  and image->cross-modal cross-entropies (a test checks it equals the class's ``return_loss=True``);
* BLIP (Kim et al. 2023 §4.1 fine-tune it with its own retrieval objective; CVLD appendix C "following the
  official BLIP implementation"): ITC + ITM, as BLIP's ``blip_retrieval.py`` ``forward``. Two objectives
  (:meth:`ContrastiveModule.configure_blip`, the recipe key ``objective``):

  - ``official`` (BLIP's own retrieval fine-tuning, the spurious study's default): ITC with momentum
    distillation. Momentum copies of the vision encoder, ``vision_proj``, the text encoder and ``text_proj``
    (:class:`BlipMomentum`, an EMA of the model with ``momentum`` 0.995, updated at every training forward
    before they encode the batch) and feature queues of their image and text embeddings with the image id of
    each entry (``queue_size`` 57600, filled first-in first-out after each step). The targets of the batch's
    image (text) queries over the momentum texts (images) of batch + queue are ``alpha * softmax(momentum
    similarities) + (1 - alpha) * positives``, where positives are every entry with the query's image id,
    normalised per row (several captions of one image are all positives); the loss is the mean of the
    two directions' soft cross-entropies (:func:`blip_itc_loss`). ``alpha`` (0.4) ramps linearly from 0
    over ``ramp_steps`` optimiser steps (BLIP: over the first epoch). ITM hard negatives are drawn with the
    weights of every same-image pair set to 0, not just the pair itself. The batch carries each pair's
    integer image id (``image_ids``, :func:`counterfactory.training.data.image_id_map`). In eval mode
    (validation loss) nothing is updated: in-batch ITC with the same-image targets, ``alpha`` 0.
  - ``plain`` (library default, other studies): symmetric InfoNCE of the projected unimodal [CLS]
    embeddings over the batch, the diagonal as targets, no momentum encoder, queue or image ids; ITM
    negatives from the in-batch similarities with only the pair itself masked.

  Both: similarities at ``1 / temp`` (a learnable temperature, 0.07 at the start, clamped to
  [0.001, 0.5]), plus the cross-entropy of the ITM head on each (image, caption) pair (label 1) and on one
  negative caption per image and one negative image per caption (label 0), drawn from the softmax of the
  in-batch ITC similarities (see :func:`blip_itm_loss`). The momentum models, queues and temperature are
  training-only state: the saved model folder is the HF model alone. The ITM pass feeds the captions' token
  ids as given (HF ``BlipForImageTextRetrieval`` does, and so does our ITM scorer), without the original
  code's ``[ENC]`` token swap. Single process: the queue takes this process's batch (BLIP gathers it over
  ranks); a data-parallel wrapper's replicas would not carry their momentum and queue updates back.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..io import follow_umask
from .vsepp_loss import loss_of_outputs

log = logging.getLogger(__name__)

PARTNER = "partner_"
#: batch key: the number of (image, caption) pairs before a batch's hard negatives (training.data.Collator)
N_PAIRS = "n_pairs"
#: model class name -> kind (how forward, preprocessing and the loss work)
KINDS = {
    "CLIPModel": "clip",
    "BridgeTowerForContrastiveLearning": "bridgetower",
    "FlavaForPreTraining": "flava",
    "FlavaModel": "flava",
    "BlipForImageTextRetrieval": "blip",
    "VSEPP": "vsepp",   # counterfactory.models.vsepp (Kim et al. 2023 §4.1); its loss: training.vsepp_loss
}
#: BLIP's contrastive temperature: its starting value and the range ``blip_retrieval.py`` clamps it to
BLIP_TEMP_INIT = 0.07
BLIP_TEMP_RANGE = (0.001, 0.5)
#: seed of the ITM negatives' draw in eval mode (validation losses are repeatable and use no global RNG)
BLIP_EVAL_SEED = 0
#: BLIP's fine-tuning objectives (see the module docstring): its own (momentum distillation, queues, image ids)
#: and ours without them
BLIP_OBJECTIVES = ("official", "plain")
#: seed of the random unit vectors the feature queues start with (BLIP: ``torch.randn``, normalised)
BLIP_QUEUE_SEED = 0
#: batch key: each pair's integer image id (``official`` objective; training.data.Collator)
IMAGE_IDS = "image_ids"
#: image id of the queue's initial (random) entries: never an image's (ids are >= 0)
NO_IMAGE = -100


def model_kind(model: nn.Module, library: str) -> str:
    """``open_clip``, ``clip``, ``bridgetower``, ``flava`` or ``blip``; other classes cannot be fine-tuned here."""
    if library == "open_clip":
        return "open_clip"
    name = type(model).__name__
    if name not in KINDS:
        raise ConfigError(
            f"training: {name} has no contrastive fine-tuning adapter. Fix: fine-tune a CLIPModel, an open_clip "
            f"model, BridgeTower (loaded with its ITC heads), FLAVA or BLIP (BlipForImageTextRetrieval); supported classes: {sorted(KINDS)}")
    return KINDS[name]


class ContrastiveModule(nn.Module):
    """``forward(pixel_values, input_ids, attention_mask | text, [pixel_mask])`` -> ``image_embeds``,
    ``text_embeds`` (L2-normalised; BridgeTower also ``cross_embeds``) and ``logit_scale`` (``exp`` of
    the model's learned temperature).

    BLIP: ``logit_scale`` is ``1 / blip_temp``, where ``blip_temp`` is a learnable ``nn.Parameter`` of this
    module (not of the HF model: ``BlipForImageTextRetrieval`` has no temperature), initialised to 0.07
    and clamped in place to [0.001, 0.5] at every forward, as BLIP's code does with ``self.temp``. It is
    training-only state: the Trainer's intermediate checkpoints (this module's state dict) keep it, the
    final checkpoint (:meth:`ContrastiveAdapter.save`, the HF model alone) drops it, so the folder loads as
    a plain ``BlipForImageTextRetrieval``. The forward also returns ``itm_loss`` (:func:`blip_itm_loss`),
    which :func:`contrastive_loss` adds to the ITC loss. :meth:`configure_blip` chooses BLIP's objective
    (``plain`` until called); with ``official`` the forward needs ``image_ids`` and also returns
    ``itc_loss`` (:func:`blip_itc_loss`), and ``blip_momentum`` (:class:`BlipMomentum`) holds the momentum
    models and queues, training-only state like the temperature."""

    def __init__(self, model: nn.Module, library: str):
        super().__init__()
        self.model = model
        self.library = library
        self.kind = model_kind(model, library)
        self.blip_momentum: BlipMomentum | None = None
        self.blip_alpha = 0.0
        self.blip_ramp_steps = 0
        #: training forwards so far (the ``alpha`` ramp's step; the Trainer sets it to its global step)
        self.blip_step = 0
        if self.kind == "blip":
            self.blip_temp = nn.Parameter(torch.tensor(BLIP_TEMP_INIT))
        # the Trainer's checkpoints leave tied weights out (see ContrastiveTrainer._save); reloading the best
        # one then re-ties them instead of warning about missing keys
        self._keys_to_ignore_on_save = aliases(self.state_dict())

    def configure_blip(self, objective: str = "plain", momentum: float = 0.995, queue_size: int = 57600,
                       alpha: float = 0.4, ramp_steps: int = 0) -> None:
        """BLIP's fine-tuning objective (module docstring). ``official``: fresh momentum copies of the model's
        unimodal encoders and projections (:class:`BlipMomentum`, EMA ``momentum``), queues of ``queue_size``
        entries, distillation weight ``alpha`` reached after ``ramp_steps`` training steps (0 = at once);
        ``plain`` drops them. Call before training (the Trainer moves the module to its device)."""
        if objective not in BLIP_OBJECTIVES:
            raise ConfigError(f"training: unknown BLIP objective {objective!r}. Fix: use one of {list(BLIP_OBJECTIVES)}")
        if objective == "official" and self.kind != "blip":
            raise ConfigError(f"training: objective 'official' is BLIP's, not {self.kind}'s. Fix: set objective: "
                              "plain, or fine-tune a BlipForImageTextRetrieval")
        if not 0.0 <= float(momentum) <= 1.0 or not 0.0 <= float(alpha) <= 1.0:
            raise ConfigError(f"training: BLIP momentum and alpha must be in [0, 1], got {momentum!r} and {alpha!r}. "
                              "Fix: use BLIP's 0.995 and 0.4")
        if int(queue_size) < 1 or int(ramp_steps) < 0:
            raise ConfigError(f"training: BLIP queue_size must be >= 1 and ramp_steps >= 0, got {queue_size!r} and "
                              f"{ramp_steps!r}. Fix: use BLIP's 57600 (queue) and one epoch of steps (ramp)")
        self.blip_momentum = BlipMomentum(self.model, momentum, queue_size) if objective == "official" else None
        self.blip_alpha, self.blip_ramp_steps, self.blip_step = float(alpha), int(ramp_steps), 0
        self._keys_to_ignore_on_save = aliases(self.state_dict())

    @property
    def blip_objective(self) -> str:
        return "plain" if self.blip_momentum is None else "official"

    def blip_alpha_at(self, step: int) -> float:
        """``alpha * min(1, step / ramp_steps)`` (BLIP's ramp over the first epoch; ``alpha`` when no ramp)."""
        if self.blip_ramp_steps <= 0:
            return self.blip_alpha
        return self.blip_alpha * min(1.0, step / self.blip_ramp_steps)

    def tie_weights(self) -> None:
        tie = getattr(self.model, "tie_weights", None)
        if tie is not None:
            tie()

    def forward(self, pixel_values, input_ids=None, attention_mask=None, text=None, pixel_mask=None,
                token_type_ids=None, image_ids=None) -> dict[str, torch.Tensor]:
        if self.kind == "open_clip":
            img = F.normalize(self.model.encode_image(pixel_values), dim=-1)
            txt = F.normalize(self.model.encode_text(text), dim=-1)
            return {"image_embeds": img, "text_embeds": txt, "logit_scale": self.model.logit_scale.exp()}
        if self.kind == "clip":
            out = self.model(pixel_values=pixel_values, input_ids=input_ids, attention_mask=attention_mask)
            return {"image_embeds": out.image_embeds, "text_embeds": out.text_embeds,
                    "logit_scale": self.model.logit_scale.exp()}
        if self.kind == "bridgetower":
            extra = {"pixel_mask": pixel_mask} if pixel_mask is not None else {}
            out = self.model(pixel_values=pixel_values, input_ids=input_ids, attention_mask=attention_mask, **extra)
            return {"image_embeds": out.image_embeds, "text_embeds": out.text_embeds,
                    "cross_embeds": out.cross_embeds, "logit_scale": self.model.logit_scale.exp()}
        if self.kind == "blip":
            return self._blip(pixel_values, input_ids, attention_mask, image_ids)
        if self.kind == "vsepp":   # the hinge settings travel with the outputs (VSE++'s loss: training.vsepp_loss)
            img, txt = self.model(pixel_values, input_ids, attention_mask)
            cfg = self.model.config
            return {"image_embeds": img, "text_embeds": txt, "logit_scale": img.new_tensor(1.0),
                    "hinge_margin": torch.tensor(float(cfg.margin), device=img.device),   # fp32 in any precision
                    "hinge_max_violation": torch.tensor(1.0 if cfg.max_violation else 0.0, device=img.device)}
        flava = getattr(self.model, "flava", self.model)  # FlavaForPreTraining wraps a FlavaModel
        img = _features(flava.get_image_features(pixel_values=pixel_values))[:, 0, :]
        text_kw = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            text_kw["token_type_ids"] = token_type_ids
        txt = _features(flava.get_text_features(**text_kw))[:, 0, :]
        return {"image_embeds": F.normalize(img, dim=-1), "text_embeds": F.normalize(txt, dim=-1),
                "logit_scale": flava.logit_scale.exp()}


    def _blip(self, pixel_values, input_ids, attention_mask, image_ids=None) -> dict[str, torch.Tensor]:
        if pixel_values.shape[0] != input_ids.shape[0]:
            raise ConfigError(
                f"training: BLIP's ITM loss needs one caption per image, got {pixel_values.shape[0]} images and "
                f"{input_ids.shape[0]} captions (hard negatives?). Fix: drop the manifest's hard_negative_* "
                "columns for BLIP, or train a two-tower model (CLIP, open_clip, FLAVA) for the single-negative "
                "variants")
        momentum = self.blip_momentum
        if momentum is not None:
            if image_ids is None:
                raise ConfigError("training: BLIP's official objective needs each pair's image id (batch key "
                                  f"{IMAGE_IDS!r}). Fix: build the collator with image_ids "
                                  "(training.data.image_id_map), or configure_blip('plain')")
            idx = image_ids.reshape(-1).to(device=pixel_values.device, dtype=torch.long)
            if idx.shape[0] != pixel_values.shape[0] or bool((idx < 0).any()):
                raise ConfigError(f"training: BLIP needs one image id >= 0 per pair, got {idx.tolist()} for "
                                  f"{pixel_values.shape[0]} pairs. Fix: number the images from 0 "
                                  "(training.data.image_id_map)")
        with torch.no_grad():
            self.blip_temp.clamp_(*BLIP_TEMP_RANGE)
        model = self.model
        image_feats = model.vision_model(pixel_values=pixel_values)[0]
        text_hidden = model.text_encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        img = F.normalize(model.vision_proj(image_feats[:, 0, :]), dim=-1)
        txt = F.normalize(model.text_proj(text_hidden[:, 0, :]), dim=-1)
        logit_scale = 1.0 / self.blip_temp
        if self.training:  # the draw's seed comes from torch's global RNG, which the Trainer seeds
            seed = int(torch.randint(0, 2**62, (1,)).item())
        else:
            seed = BLIP_EVAL_SEED
        generator = torch.Generator(device="cpu").manual_seed(seed)
        out = {"image_embeds": img, "text_embeds": txt, "logit_scale": logit_scale}
        same = None
        if momentum is not None:
            same = idx[:, None] == idx[None, :]
            if self.training:  # BLIP: EMA update, momentum features, loss, then the queues take the batch
                alpha = self.blip_alpha_at(self.blip_step)
                with torch.no_grad():
                    momentum.update(model)
                    img_m, txt_m = momentum.features(pixel_values, input_ids, attention_mask)
                out["itc_loss"] = blip_itc_loss(img, txt, img_m, txt_m, self.blip_temp, alpha, idx,
                                                momentum.image_queue, momentum.text_queue, momentum.idx_queue)
                momentum.enqueue(img_m, txt_m, idx)
                self.blip_step += 1
            else:  # validation: nothing updated; in-batch, same-image targets, no distillation
                out["itc_loss"] = blip_itc_loss(img, txt, img.detach(), txt.detach(), self.blip_temp, 0.0, idx)
        out["itm_loss"] = blip_itm_loss(model, image_feats, input_ids, attention_mask, logit_scale * img @ txt.T,
                                        generator, same)
        return out


class BlipMomentum(nn.Module):
    """BLIP's momentum encoder and feature queues (``blip_retrieval.py``): frozen copies of ``model``'s
    ``vision_model``, ``vision_proj``, ``text_encoder`` and ``text_proj`` (:meth:`update`: EMA
    ``m <- momentum * m + (1 - momentum) * p``), and queues of ``queue_size`` momentum image and text
    embeddings (rows, ``(queue_size, dim)``) with their image ids (``idx_queue``; :data:`NO_IMAGE` for the
    initial entries, random unit vectors drawn with seed :data:`BLIP_QUEUE_SEED`, as BLIP starts them) and the
    write position ``queue_ptr`` (:meth:`enqueue`). Training-only: never part of the saved model folder."""

    PARTS = ("vision_model", "vision_proj", "text_encoder", "text_proj")

    def __init__(self, model: nn.Module, momentum: float = 0.995, queue_size: int = 57600):
        super().__init__()
        self.momentum = float(momentum)
        for name in self.PARTS:
            part = copy.deepcopy(getattr(model, name))
            part.requires_grad_(False)
            setattr(self, name, part)
        dim = int(model.vision_proj.out_features)
        device = model.vision_proj.weight.device
        gen = torch.Generator().manual_seed(BLIP_QUEUE_SEED)
        self.register_buffer("image_queue", F.normalize(torch.randn(queue_size, dim, generator=gen), dim=1).to(device))
        self.register_buffer("text_queue", F.normalize(torch.randn(queue_size, dim, generator=gen), dim=1).to(device))
        self.register_buffer("idx_queue", torch.full((queue_size,), NO_IMAGE, dtype=torch.long, device=device))
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long, device=device))

    @property
    def queue_size(self) -> int:
        return int(self.idx_queue.shape[0])

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One EMA step of every momentum parameter towards ``model``'s (``momentum * m + (1 - momentum) * p``)."""
        m = self.momentum
        for name in self.PARTS:
            for p_m, p in zip(getattr(self, name).parameters(), getattr(model, name).parameters()):
                p_m.mul_(m).add_(p.detach().to(p_m.dtype), alpha=1.0 - m)

    @torch.no_grad()
    def features(self, pixel_values, input_ids, attention_mask) -> tuple[torch.Tensor, torch.Tensor]:
        """L2-normalised momentum image and text embeddings of a batch."""
        image_feats = self.vision_model(pixel_values=pixel_values)[0]
        text_hidden = self.text_encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        return (F.normalize(self.vision_proj(image_feats[:, 0, :]), dim=-1),
                F.normalize(self.text_proj(text_hidden[:, 0, :]), dim=-1))

    @torch.no_grad()
    def enqueue(self, image_embeds: torch.Tensor, text_embeds: torch.Tensor, image_ids: torch.Tensor) -> None:
        """Write a batch over the oldest entries, at ``queue_ptr``, wrapping around the end (BLIP needs the
        queue size to be a multiple of the batch size; we wrap, so any batch size works); a batch larger
        than the queue keeps its last ``queue_size`` rows. The pointer then follows the batch."""
        q, b = self.queue_size, image_embeds.shape[0]
        if b > q:
            image_embeds, text_embeds, image_ids, b = image_embeds[-q:], text_embeds[-q:], image_ids[-q:], q
        ptr = int(self.queue_ptr)
        pos = (ptr + torch.arange(b, device=self.idx_queue.device)) % q
        self.image_queue[pos] = image_embeds.detach().to(self.image_queue.dtype)
        self.text_queue[pos] = text_embeds.detach().to(self.text_queue.dtype)
        self.idx_queue[pos] = image_ids.reshape(-1).to(self.idx_queue.device, torch.long)
        self.queue_ptr.fill_((ptr + b) % q)


def same_image_targets(image_ids: torch.Tensor, candidate_ids: torch.Tensor) -> torch.Tensor:
    """``(B, C)``: for query ``i``, 1 on every candidate with its image id, normalised per row (BLIP's
    ``sim_targets``: all captions of one image are positives). The queries are among the candidates, so
    every row has one."""
    pos = (image_ids.reshape(-1, 1) == candidate_ids.reshape(1, -1)).float()
    return pos / pos.sum(dim=1, keepdim=True)


def blip_itc_loss(img: torch.Tensor, txt: torch.Tensor, img_m: torch.Tensor, txt_m: torch.Tensor,
                  temp: torch.Tensor | float, alpha: float, image_ids: torch.Tensor,
                  image_queue: torch.Tensor | None = None, text_queue: torch.Tensor | None = None,
                  idx_queue: torch.Tensor | None = None) -> torch.Tensor:
    """BLIP's ITC with momentum distillation on a batch of ``B`` pairs (``blip_retrieval.py``).

    Candidates: the momentum embeddings of the batch followed by the queue's (``img_m_all``,
    ``txt_m_all``; image ids ``idx_all``). With ``T = same_image_targets(image_ids, idx_all)``:
    ``loss_i2t = -mean_i sum_j log_softmax(img @ txt_m_all.T / temp)_ij * Y_ij`` with
    ``Y = alpha * softmax(img_m @ txt_m_all.T / temp) + (1 - alpha) * T`` (no gradient through ``Y``),
    ``loss_t2i`` the mirror (``txt`` against ``img_m_all``); the loss is their mean. Queues ``None``: the
    batch alone."""
    idx = image_ids.reshape(-1).to(img.device)
    if image_queue is not None:
        idx_all = torch.cat([idx, idx_queue.reshape(-1).to(idx.device)])
        img_m_all = torch.cat([img_m, image_queue.to(img_m.dtype)])
        txt_m_all = torch.cat([txt_m, text_queue.to(txt_m.dtype)])
    else:
        idx_all, img_m_all, txt_m_all = idx, img_m, txt_m
    with torch.no_grad():
        targets = same_image_targets(idx, idx_all)
    return blip_distilled_itc(img, txt, img_m, txt_m, img_m_all, txt_m_all, targets, temp, alpha)


def blip_distilled_itc(img: torch.Tensor, txt: torch.Tensor, img_m: torch.Tensor, txt_m: torch.Tensor,
                       img_m_all: torch.Tensor, txt_m_all: torch.Tensor, targets: torch.Tensor,
                       temp: torch.Tensor | float, alpha: float) -> torch.Tensor:
    """The distillation step of :func:`blip_itc_loss` once candidates and ground truth are fixed: ``B`` queries
    (``img``, ``txt``; momentum ``img_m``, ``txt_m``), ``C`` momentum candidates (``img_m_all``, ``txt_m_all``)
    and ``targets`` ``(B, C)`` (rows sum to 1; the same for both directions, as BLIP's ``sim_targets``). CVLD's
    official objective (:func:`counterfactory.training.cvld_losses.official_itc_loss`) calls it with the
    counterfactuals among the candidates."""
    with torch.no_grad():
        t = temp.detach() if isinstance(temp, torch.Tensor) else temp
        targets_i2t = alpha * F.softmax((img_m @ txt_m_all.T).float() / t, dim=1) + (1.0 - alpha) * targets
        targets_t2i = alpha * F.softmax((txt_m @ img_m_all.T).float() / t, dim=1) + (1.0 - alpha) * targets
    sim_i2t = (img @ txt_m_all.detach().T).float() / temp
    sim_t2i = (txt @ img_m_all.detach().T).float() / temp
    loss_i2t = -(F.log_softmax(sim_i2t, dim=1) * targets_i2t).sum(dim=1).mean()
    loss_t2i = -(F.log_softmax(sim_t2i, dim=1) * targets_t2i).sum(dim=1).mean()
    return 0.5 * (loss_i2t + loss_t2i)


def blip_negative_weights(logits_per_image: torch.Tensor, same: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights BLIP draws ITM hard negatives from (CPU, float32): the row-wise softmax of the image x
    text logits and of the text x image logits, with every forbidden pair set to exactly 0. Forbidden: the
    pair itself (the diagonal) and, with ``same`` (``(B, B)`` bool, True where two pairs show the same
    image; BLIP's ``idx`` mask), every same-image pair."""
    logits = logits_per_image.detach().float().cpu()
    forbidden = torch.eye(logits.shape[0], dtype=torch.bool)
    if same is not None:
        forbidden = forbidden | same.detach().to("cpu", torch.bool)
    return (F.softmax(logits, dim=1).masked_fill(forbidden, 0.0),
            F.softmax(logits.T, dim=1).masked_fill(forbidden, 0.0))


def blip_negatives(logits_per_image: torch.Tensor, generator: torch.Generator | None = None,
                   same: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """BLIP's hard-negative draw for ITM: ``(negative text per image, negative image per text)``, indices
    sampled with ``torch.multinomial`` from :func:`blip_negative_weights` (the pair itself, and with
    ``same`` every same-image pair, weight 0: never drawn). Sampled on the CPU with ``generator`` (the same
    draw on any device). A row whose allowed weights underflow to 0 draws uniformly among the allowed; a row
    with no allowed candidate (every pair of the batch shows its image) gets -1. Needs at least two rows."""
    with torch.no_grad():
        forbidden = torch.eye(logits_per_image.shape[0], dtype=torch.bool)
        if same is not None:
            forbidden = forbidden | same.detach().to("cpu", torch.bool)
        picks = []
        for weights in blip_negative_weights(logits_per_image, same):
            dead = weights.sum(dim=1) <= 0
            if dead.any():
                weights[dead] = (~forbidden[dead]).float()
            none = weights.sum(dim=1) <= 0
            if none.any():
                weights[none] = 1.0
            pick = torch.multinomial(weights, 1, generator=generator).squeeze(1)
            picks.append(pick.masked_fill(none, -1))
    device = logits_per_image.device
    return picks[0].to(device), picks[1].to(device)


def blip_itm_logits(model: nn.Module, image_feats: torch.Tensor, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor) -> torch.Tensor:
    """``itm_head`` of the text encoder's [CLS] state with cross-attention to ``image_feats`` (the vision
    model's last hidden states), as ``BlipForImageTextRetrieval(use_itm_head=True)``: ``(N, 2)`` logits."""
    image_atts = torch.ones(image_feats.shape[:-1], dtype=torch.long, device=image_feats.device)
    hidden = model.text_encoder(input_ids=input_ids, attention_mask=attention_mask,
                                encoder_hidden_states=image_feats, encoder_attention_mask=image_atts)[0]
    return model.itm_head(hidden[:, 0, :])


def blip_itm_loss(model: nn.Module, image_feats: torch.Tensor, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor, logits_per_image: torch.Tensor,
                  generator: torch.Generator | None = None, same: torch.Tensor | None = None) -> torch.Tensor:
    """BLIP's ITM loss on one batch of ``B`` pairs: cross-entropy of ``itm_head`` over the ``B`` pairs
    (label 1), each image with a negative caption and each caption with a negative image (label 0),
    negatives from :func:`blip_negatives` (``same``: same-image pairs are never negatives; a row with no
    allowed negative contributes its positive only). A batch of one pair, or one where no negative can be
    drawn, has loss 0 (with a graph, so the Trainer's backward still runs)."""
    n = image_feats.shape[0]
    if n < 2:
        return image_feats.sum() * 0.0
    neg_text, neg_image = blip_negatives(logits_per_image, generator, same)
    ok_t, ok_i = neg_text >= 0, neg_image >= 0
    if not (ok_t.any() or ok_i.any()):
        return image_feats.sum() * 0.0
    if ok_t.all() and ok_i.all():   # the usual case (and always without ``same``)
        feats = torch.cat([image_feats, image_feats, image_feats[neg_image]])
        ids = torch.cat([input_ids, input_ids[neg_text], input_ids])
        mask = torch.cat([attention_mask, attention_mask[neg_text], attention_mask])
    else:
        feats = torch.cat([image_feats, image_feats[ok_t], image_feats[neg_image[ok_i]]])
        ids = torch.cat([input_ids, input_ids[neg_text[ok_t]], input_ids[ok_i]])
        mask = torch.cat([attention_mask, attention_mask[neg_text[ok_t]], attention_mask[ok_i]])
    logits = blip_itm_logits(model, feats, ids, mask)
    labels = torch.cat([torch.ones(n, dtype=torch.long),
                        torch.zeros(feats.shape[0] - n, dtype=torch.long)]).to(logits.device)
    return F.cross_entropy(logits, labels)


def aliases(state_dict: dict[str, torch.Tensor]) -> list[str]:
    """Names of the entries that share memory with an earlier entry (tied weights)."""
    seen, out = set(), []
    for name, t in state_dict.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in seen:
            out.append(name)
        seen.add(key)
    return out


def _features(out) -> torch.Tensor:
    """transformers 5 ``get_*_features`` return a model output (projection in ``pooler_output``); older
    versions a tensor."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def clip_loss(logits_per_image: torch.Tensor, n_pairs: int | None = None) -> torch.Tensor:
    """Symmetric InfoNCE: cross-entropy over rows and columns with the diagonal as targets.

    ``n_pairs``: only the first ``n_pairs`` images and captions are pairs; the images after them (rows) and
    the captions after them (columns) are hard negatives, candidates for the pairs but never anchors. With
    square logits and ``n_pairs`` None (or equal to the size) this is the plain CLIP loss."""
    n = logits_per_image.shape[0] if n_pairs is None else int(n_pairs)
    targets = torch.arange(n, device=logits_per_image.device)
    return 0.5 * (F.cross_entropy(logits_per_image[:n], targets) + F.cross_entropy(logits_per_image.T[:n], targets))


def _scale(out: dict[str, torch.Tensor]) -> torch.Tensor:
    """``logit_scale`` may come back as a vector from a data-parallel gather."""
    return out["logit_scale"].reshape(-1)[0]


def logits_of(out: dict[str, torch.Tensor]) -> torch.Tensor:
    """Image x text logits."""
    return _scale(out) * out["image_embeds"] @ out["text_embeds"].T


def contrastive_loss(out: dict[str, torch.Tensor], n_pairs: int | None = None) -> torch.Tensor:
    """The model's own contrastive objective on one batch (see the module docstring); ``n_pairs`` as in
    :func:`clip_loss` (hard negatives after the pairs). BLIP: ITC (``out["itc_loss"]`` under the official
    objective, else :func:`clip_loss`) + ``out["itm_loss"]`` (the mean over data-parallel replicas when
    gathered). VSE++: its triplet ranking loss (:mod:`.vsepp_loss`)."""
    if "hinge_margin" in out:
        return loss_of_outputs(out, n_pairs)
    if "itm_loss" in out:
        if n_pairs is not None and not (out["image_embeds"].shape[0] == out["text_embeds"].shape[0] == int(n_pairs)):
            raise ConfigError("training: BLIP's ITM loss scores (image, caption) pairs and cannot take unpaired "
                              "hard negatives. Fix: drop the manifest's hard_negative_* columns for BLIP, or train "
                              "a two-tower model (CLIP, open_clip, FLAVA) for the single-negative variants")
        itc = out["itc_loss"].mean() if "itc_loss" in out else clip_loss(logits_of(out), n_pairs)
        return itc + out["itm_loss"].mean()
    if "cross_embeds" not in out:
        return clip_loss(logits_of(out), n_pairs)
    if n_pairs is not None and not (out["image_embeds"].shape[0] == out["text_embeds"].shape[0] == int(n_pairs)):
        raise ConfigError("training: BridgeTower's contrastive loss scores (image, caption) pairs through its "
                          "cross-modal encoder and cannot take unpaired hard negatives. Fix: train a two-tower "
                          "model (CLIP, open_clip, FLAVA) for the single-negative variants")
    scale, txt, img, cross = _scale(out), out["text_embeds"], out["image_embeds"], out["cross_embeds"]
    targets = torch.arange(txt.shape[0], device=txt.device)
    terms = [F.cross_entropy(scale * a @ b.T, targets) for a, b in ((txt, img), (txt, cross), (img, cross))]
    return sum(terms) / 3.0


def recipe_loss(model: nn.Module, inputs: dict[str, torch.Tensor], cvld_lambda: float = 0.0) -> torch.Tensor:
    """``l(B)`` for plain and grouping batches (grouping differs only in how batches are made), and
    CVLD eq. 3 ``l(B) + lambda * l(B~)`` when the batch carries ``partner_*`` inputs."""
    own = {k: v for k, v in inputs.items() if not k.startswith(PARTNER) and k != N_PAIRS}
    loss = contrastive_loss(model(**own), inputs.get(N_PAIRS))
    partner = {k[len(PARTNER):]: v for k, v in inputs.items() if k.startswith(PARTNER)}
    if partner and cvld_lambda:
        loss = loss + cvld_lambda * contrastive_loss(model(**partner))
    return loss


class ContrastiveAdapter:
    """Preprocessing and saving for the models of :data:`KINDS` (+ their processors) and open_clip (model,
    preprocess, tokenizer). ``device`` is where training runs (the Trainer places the model and batches)."""

    def __init__(self, loaded, library: str, source_dir: str | Path | None = None, device="cpu",
                 max_length: int | None = 77):
        self.library = library
        self.device = torch.device(device)
        self.source_dir = Path(source_dir) if source_dir else None  # open_clip: where open_clip_config.json is
        if library == "open_clip":
            self.model, self.preprocess, self.tokenizer = loaded
        else:
            self.model, self.processor = loaded
        self.module = ContrastiveModule(self.model, library)
        self.kind = self.module.kind
        self.max_length = self._text_length(max_length)

    def _text_limit(self) -> int:
        if self.kind == "open_clip":
            return int(getattr(self.model, "context_length", 77))
        if self.kind == "vsepp":
            return int(self.model.config.max_length)
        limit = int(self.model.config.text_config.max_position_embeddings)
        if self.kind == "bridgetower":  # RoBERTa positions start after the padding index
            limit -= 2
        tok_max = getattr(self.processor.tokenizer, "model_max_length", None)
        return min(limit, tok_max) if isinstance(tok_max, int) and 0 < tok_max < 100_000 else limit

    def _text_length(self, wanted: int | None) -> int:
        limit = self._text_limit()
        if wanted is None:
            return limit
        if wanted > limit:
            log.warning("training.max_length %d exceeds the model's text context (%d); using %d", wanted, limit, limit)
            return limit
        return int(wanted)

    def parameters(self):
        return self.model.parameters()

    def image_inputs(self, images) -> dict[str, torch.Tensor]:
        """``pixel_values`` (and BridgeTower's ``pixel_mask``: its processor pads a batch to one size)."""
        if self.kind == "open_clip":
            return {"pixel_values": torch.stack([self.preprocess(im) for im in images])}
        processor = getattr(self.processor, "image_processor", self.processor)
        out = processor(images=list(images), return_tensors="pt")
        return {k: out[k] for k in ("pixel_values", "pixel_mask") if k in out}

    def tokens(self, texts) -> dict[str, torch.Tensor]:
        """Text padded (and truncated) to ``max_length`` tokens (77 in B.3.2, CLIP's context)."""
        if self.kind == "open_clip":
            return {"text": self.tokenizer(list(texts), context_length=self.max_length)}
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        enc = tokenizer(list(texts), return_tensors="pt", padding="max_length", truncation=True,
                        max_length=self.max_length)
        keys = ("input_ids", "attention_mask") + (("token_type_ids",) if self.kind == "flava" else ())
        return {k: enc[k] for k in keys if k in enc}

    def save(self, out_dir: str | Path) -> None:
        """A checkpoint the model registry loads by path (HF folder, or open_clip ``local-dir:``)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        if self.library == "open_clip":
            from safetensors.torch import save_file

            save_file({k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()},
                      str(out_dir / "open_clip_model.safetensors"))
            config = self.source_dir / "open_clip_config.json" if self.source_dir else None
            if config is not None and config.exists():  # makes the checkpoint loadable as `local-dir:`
                (out_dir / config.name).write_bytes(config.read_bytes())
        else:
            self.model.save_pretrained(out_dir, safe_serialization=True)
            self.processor.save_pretrained(out_dir)

        follow_umask(out_dir)  # safetensors writes its weights 0600 whatever the umask
