"""The models and the losses (the part of training this package owns; the Trainer does the rest).

* :class:`ContrastiveAdapter`: one face over a HF ``CLIPModel`` (+ processor) and open_clip (model,
  preprocess, tokenizer): image and text preprocessing, and saving a checkpoint the registry reloads;
* :class:`ContrastiveModule`: the ``nn.Module`` handed to the Trainer; ``forward`` returns normalised
  image and text embeddings and the logit scale (so a data-parallel wrapper gathers whole batches and
  the contrastive loss sees every negative);
* :func:`clip_loss`, :func:`recipe_loss`: symmetric InfoNCE, and the recipes' losses on top of it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

PARTNER = "partner_"


class ContrastiveModule(nn.Module):
    """``forward(pixel_values, input_ids, attention_mask | text)`` -> ``image_embeds``, ``text_embeds``
    (L2-normalised) and ``logit_scale`` (``exp`` of the model's learned temperature)."""

    def __init__(self, model: nn.Module, library: str):
        super().__init__()
        self.model = model
        self.library = library

    def forward(self, pixel_values, input_ids=None, attention_mask=None, text=None) -> dict[str, torch.Tensor]:
        if self.library == "open_clip":
            img = F.normalize(self.model.encode_image(pixel_values), dim=-1)
            txt = F.normalize(self.model.encode_text(text), dim=-1)
        else:
            out = self.model(pixel_values=pixel_values, input_ids=input_ids, attention_mask=attention_mask)
            img, txt = out.image_embeds, out.text_embeds
        return {"image_embeds": img, "text_embeds": txt, "logit_scale": self.model.logit_scale.exp()}


def clip_loss(logits_per_image: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE: cross-entropy over rows and columns with the diagonal as targets."""
    targets = torch.arange(logits_per_image.shape[0], device=logits_per_image.device)
    return 0.5 * (F.cross_entropy(logits_per_image, targets) + F.cross_entropy(logits_per_image.T, targets))


def logits_of(out: dict[str, torch.Tensor]) -> torch.Tensor:
    """Image x text logits; ``logit_scale`` may come back as a vector from a data-parallel gather."""
    scale = out["logit_scale"].reshape(-1)[0]
    return scale * out["image_embeds"] @ out["text_embeds"].T


def recipe_loss(model: nn.Module, inputs: dict[str, torch.Tensor], cvld_lambda: float = 0.0) -> torch.Tensor:
    """``l(B)`` for plain and grouping batches (grouping differs only in how batches are made), and
    CVLD eq. 3 ``l(B) + lambda * l(B~)`` when the batch carries ``partner_*`` inputs."""
    own = {k: v for k, v in inputs.items() if not k.startswith(PARTNER)}
    loss = clip_loss(logits_of(model(**own)))
    partner = {k[len(PARTNER):]: v for k, v in inputs.items() if k.startswith(PARTNER)}
    if partner and cvld_lambda:
        loss = loss + cvld_lambda * clip_loss(logits_of(model(**partner)))
    return loss


class ContrastiveAdapter:
    """Preprocessing and saving for HF ``CLIPModel`` (+ processor) and open_clip (model, preprocess,
    tokenizer). ``device`` is where training runs (the Trainer places the model and the batches)."""

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
        self.max_length = self._text_length(max_length)

    def _text_length(self, wanted: int | None) -> int:
        if self.library == "open_clip":
            limit = int(getattr(self.model, "context_length", 77))
        else:
            limit = int(self.model.config.text_config.max_position_embeddings)
        if wanted is None:
            return limit
        if wanted > limit:
            log.warning("training.max_length %d exceeds the model's text context (%d); using %d", wanted, limit, limit)
            return limit
        return int(wanted)

    def parameters(self):
        return self.model.parameters()

    def pixels(self, images) -> torch.Tensor:
        if self.library == "open_clip":
            return torch.stack([self.preprocess(im) for im in images])
        return self.processor(images=list(images), return_tensors="pt")["pixel_values"]

    def tokens(self, texts) -> dict[str, torch.Tensor]:
        """Text padded (and truncated) to ``max_length`` tokens (77 in B.3.2, CLIP's context)."""
        if self.library == "open_clip":
            return {"text": self.tokenizer(list(texts), context_length=self.max_length)}
        enc = self.processor(text=list(texts), return_tensors="pt", padding="max_length", truncation=True,
                             max_length=self.max_length)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

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
