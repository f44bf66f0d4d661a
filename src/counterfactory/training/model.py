"""The models and the losses (the part of training this package owns; the Trainer does the rest).

* :class:`ContrastiveAdapter`: one face over the contrastive (ITC) models we fine-tune — HF ``CLIPModel``,
  open_clip, ``BridgeTowerForContrastiveLearning`` and FLAVA (``FlavaForPreTraining`` / ``FlavaModel``) —
  with their processors: image and text preprocessing, and saving a checkpoint the registry reloads;
* :class:`ContrastiveModule`: the ``nn.Module`` handed to the Trainer; ``forward`` returns normalised
  image and text embeddings (BridgeTower also its cross-modal embedding) and the logit scale, so a
  data-parallel wrapper gathers whole batches and the contrastive loss sees every negative;
* :func:`clip_loss`, :func:`contrastive_loss`, :func:`recipe_loss`: symmetric InfoNCE, each model's own
  contrastive objective, and the recipes' losses on top of it.

Objectives (what each class's authors train with; COCO-CF appendix A.1 fine-tunes CLIP, BridgeTower and
FLAVA for retrieval without naming the loss, so each keeps its own):

* CLIP / open_clip / FLAVA: symmetric InfoNCE over image x text logits (FLAVA's global contrastive loss
  projects the unimodal [CLS] states, as ``FlavaForPreTraining`` does);
* BridgeTower: ``BridgeTowerForContrastiveLearning``'s loss, the mean of text->image, text->cross-modal
  and image->cross-modal cross-entropies (a test checks it equals the class's ``return_loss=True``).
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
}


def model_kind(model: nn.Module, library: str) -> str:
    """``open_clip``, ``clip``, ``bridgetower`` or ``flava``; other classes cannot be fine-tuned here."""
    if library == "open_clip":
        return "open_clip"
    name = type(model).__name__
    if name not in KINDS:
        raise ConfigError(
            f"training: {name} has no contrastive fine-tuning adapter. Fix: fine-tune a CLIPModel, an open_clip "
            f"model, BridgeTower (loaded with its ITC heads) or FLAVA; supported classes: {sorted(KINDS)}")
    return KINDS[name]


class ContrastiveModule(nn.Module):
    """``forward(pixel_values, input_ids, attention_mask | text, [pixel_mask])`` -> ``image_embeds``,
    ``text_embeds`` (L2-normalised; BridgeTower also ``cross_embeds``) and ``logit_scale`` (``exp`` of
    the model's learned temperature)."""

    def __init__(self, model: nn.Module, library: str):
        super().__init__()
        self.model = model
        self.library = library
        self.kind = model_kind(model, library)
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
        flava = getattr(self.model, "flava", self.model)  # FlavaForPreTraining wraps a FlavaModel
        img = _features(flava.get_image_features(pixel_values=pixel_values))[:, 0, :]
        text_kw = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            text_kw["token_type_ids"] = token_type_ids
        txt = _features(flava.get_text_features(**text_kw))[:, 0, :]
        return {"image_embeds": F.normalize(img, dim=-1), "text_embeds": F.normalize(txt, dim=-1),
                "logit_scale": flava.logit_scale.exp()}


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
    :func:`clip_loss` (hard negatives after the pairs)."""
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
