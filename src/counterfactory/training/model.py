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
* BLIP (Kim et al. 2023 §4.1 fine-tune it with its own retrieval objective): ITC + ITM, as BLIP's
  ``blip_retrieval.py`` ``forward``: symmetric InfoNCE of the projected unimodal [CLS] embeddings at
  ``1 / temp`` (a learnable temperature, 0.07 at the start, clamped to [0.001, 0.5]), plus the cross-entropy
  of the ITM head on each (image, caption) pair (label 1) and on one negative caption per image and one
  negative image per caption (label 0), drawn from the softmax of the in-batch ITC similarities with the
  pair itself masked out (see :func:`blip_itm_loss`). What we leave out of BLIP's recipe: the momentum
  encoder, its feature queue and momentum distillation (``alpha``), and the ``idx``-based masking of other
  captions of the same image (negatives are every other row of the batch, as in our InfoNCE). The ITM pass
  feeds the captions' token ids as given (HF ``BlipForImageTextRetrieval`` does, and so does our ITM
  scorer), without the original code's ``[ENC]`` token swap.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError

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
    which :func:`contrastive_loss` adds to the ITC loss."""

    def __init__(self, model: nn.Module, library: str):
        super().__init__()
        self.model = model
        self.library = library
        self.kind = model_kind(model, library)
        if self.kind == "blip":
            self.blip_temp = nn.Parameter(torch.tensor(BLIP_TEMP_INIT))
        # the Trainer's checkpoints leave tied weights out (see ContrastiveTrainer._save); reloading the best
        # one then re-ties them instead of warning about missing keys
        self._keys_to_ignore_on_save = aliases(self.state_dict())

    def tie_weights(self) -> None:
        tie = getattr(self.model, "tie_weights", None)
        if tie is not None:
            tie()

    def forward(self, pixel_values, input_ids=None, attention_mask=None, text=None, pixel_mask=None,
                token_type_ids=None) -> dict[str, torch.Tensor]:
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
            return self._blip(pixel_values, input_ids, attention_mask)
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


    def _blip(self, pixel_values, input_ids, attention_mask) -> dict[str, torch.Tensor]:
        if pixel_values.shape[0] != input_ids.shape[0]:
            raise ConfigError(
                f"training: BLIP's ITM loss needs one caption per image, got {pixel_values.shape[0]} images and "
                f"{input_ids.shape[0]} captions (hard negatives?). Fix: drop the manifest's hard_negative_* "
                "columns for BLIP, or train a two-tower model (CLIP, open_clip, FLAVA) for the single-negative "
                "variants")
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
        itm = blip_itm_loss(model, image_feats, input_ids, attention_mask, logit_scale * img @ txt.T, generator)
        return {"image_embeds": img, "text_embeds": txt, "logit_scale": logit_scale, "itm_loss": itm}


def blip_negatives(logits_per_image: torch.Tensor, generator: torch.Generator | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """BLIP's hard-negative draw for ITM: ``(negative text per image, negative image per text)``, indices
    sampled with ``torch.multinomial`` from the row-wise softmax of the image x text (and text x image)
    logits with the diagonal (the pair itself) set to 0. Sampled on the CPU with ``generator`` (the same
    draw on any device). A row whose off-diagonal weights underflow to 0 draws uniformly among the others.
    Needs at least two rows."""
    with torch.no_grad():
        logits = logits_per_image.detach().float().cpu()
        n = logits.shape[0]
        eye = torch.eye(n, dtype=torch.bool)
        picks = []
        for sim in (logits, logits.T):
            weights = F.softmax(sim, dim=1).masked_fill(eye, 0.0)
            dead = weights.sum(dim=1) <= 0
            if dead.any():
                weights[dead] = (~eye[dead]).float()
            picks.append(torch.multinomial(weights, 1, generator=generator).squeeze(1))
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
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """BLIP's ITM loss on one batch of ``B`` pairs: cross-entropy of ``itm_head`` over the ``B`` pairs
    (label 1), each image with a negative caption and each caption with a negative image (``2B``, label 0),
    negatives from :func:`blip_negatives`. A batch of one pair has no negative: the loss is 0 (with a
    graph, so the Trainer's backward still runs)."""
    n = image_feats.shape[0]
    if n < 2:
        return image_feats.sum() * 0.0
    neg_text, neg_image = blip_negatives(logits_per_image, generator)
    feats = torch.cat([image_feats, image_feats, image_feats[neg_image]])
    ids = torch.cat([input_ids, input_ids[neg_text], input_ids])
    mask = torch.cat([attention_mask, attention_mask[neg_text], attention_mask])
    logits = blip_itm_logits(model, feats, ids, mask)
    labels = torch.cat([torch.ones(n, dtype=torch.long), torch.zeros(2 * n, dtype=torch.long)]).to(logits.device)
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
    :func:`clip_loss` (hard negatives after the pairs). BLIP: ITC + ``out["itm_loss"]`` (the mean over
    data-parallel replicas when gathered). VSE++: its triplet ranking loss (:mod:`.vsepp_loss`)."""
    if "hinge_margin" in out:
        from .vsepp_loss import loss_of_outputs

        return loss_of_outputs(out, n_pairs)
    if "itm_loss" in out:
        if n_pairs is not None and not (out["image_embeds"].shape[0] == out["text_embeds"].shape[0] == int(n_pairs)):
            raise ConfigError("training: BLIP's ITM loss scores (image, caption) pairs and cannot take unpaired "
                              "hard negatives. Fix: drop the manifest's hard_negative_* columns for BLIP, or train "
                              "a two-tower model (CLIP, open_clip, FLAVA) for the single-negative variants")
        return clip_loss(logits_of(out), n_pairs) + out["itm_loss"].mean()
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
        from ..io import follow_umask

        follow_umask(out_dir)  # safetensors writes its weights 0600 whatever the umask
