"""Image-text scorers: one interface over dual encoders (CLIP, open_clip, and the contrastive "ITC" heads
of FLAVA, BLIP and BridgeTower) and cross-encoders with an image-text matching (ITM) head (BLIP, ViLT,
FLAVA, BridgeTower).

Interface (every scorer)
------------------------
``images`` are PIL images or paths to image files (opened lazily, batch by batch, converted to RGB);
``texts`` are strings.

* ``score_pairs(images, texts) -> (n,)``: the score ``G(texts[i], images[i])`` of *aligned* pairs
  (``len(images) == len(texts)``). This is the ITM score ``G`` of COCO-Counterfactuals §4.2.2.
* ``score_matrix(images, texts) -> (n_images, n_texts)``: every image against every text, laid out
  as :func:`counterfactory.metrics.recall_at_k` expects (``[i, j]`` = image ``i``, text ``j``).
* ``score_index_pairs(images, texts, image_idx, text_idx) -> (m,)``: the pairs
  ``(images[image_idx[k]], texts[text_idx[k]])`` (used for shortlist re-ranking).

Dual encoders (``scorer.dual is True``) also have

* ``encode_images(images) -> (n, d)`` and ``encode_texts(texts) -> (n, d)``: float32 embeddings,
  **L2-normalised** (each row has norm 1);

and their score is ``logit_scale · cos(image, text)`` (``logit_scale`` is the model's learned
temperature, exponentiated; 1 for BLIP's contrastive head, which has none), i.e. CLIP's
``logits_per_image`` / ``logits_per_text``: the ITM score used for CLIP in the paper's reference code.

Cross-encoder scores are the ITM head's **match logit** (``itm_score: logit``, default): class 1 of
the two-way heads of BLIP, FLAVA and BridgeTower, the single ranking logit of ViLT. With
``itm_score: probability`` they are the softmax probability of class 1 (sigmoid for ViLT).

Scores do not depend on the batch size beyond floating-point noise: texts are padded per batch to the
longest text in that batch with an attention mask, and images of one model are preprocessed alike.

Build scorers with :func:`scorer_from_config` (model from ``registry.load(cfg, role)``, options
from ``evaluation.scorers.<role>``, device/precision from :mod:`counterfactory.device`).

Image classifiers: :class:`NsfwClassifier` (the ``nsfw`` role: class probabilities per image).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .errors import ConfigError, input_error
from .models import loaders_eval  # noqa: F401  (registers the evaluation roles' loaders)
from .models import registry
from .rgb import to_rgb

log = logging.getLogger(__name__)

ImageLike = Any  # PIL.Image.Image | str | os.PathLike

#: default scorer options (overridden by ``evaluation.scorers.<role>`` and keyword arguments)
DEFAULT_OPTIONS = {
    "batch_size": 32,         # images / texts / pairs per forward pass
    "itm_score": "logit",     # logit | probability
    "max_exhaustive_pairs": 2_000_000,  # score_matrix guard for cross-encoders
}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def load_image(image: ImageLike):
    """A PIL RGB image from a PIL image or a path (clear error naming the file when unreadable)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image if image.mode == "RGB" else to_rgb(image)
    path = Path(os.fspath(image))
    try:
        with Image.open(path) as im:
            im.load()
            return to_rgb(im, path)
    except FileNotFoundError:
        raise input_error(path, None, "image file not found",
                          "check that the image stage / dataset wrote this file, or fix the path") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise input_error(path, None, f"not a readable image ({exc})", "replace or delete the corrupt file") from exc


def _batches(n: int, size: int) -> Iterable[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def _model_output_features(out) -> torch.Tensor:
    """transformers 5 ``get_*_features`` return a model output; older versions a tensor."""
    if isinstance(out, torch.Tensor):
        return out
    return out.pooler_output


def _l2(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.float(), dim=-1)


class Scorer:
    """Common base: batching, device, progress bars. Subclasses implement the model calls."""

    dual = False

    def __init__(self, model, *, name: str = "", device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, batch_size: int = 32, progress: bool = True,
                 performance=None):
        from .device import place

        if batch_size < 1:
            raise ConfigError(f"scorer {name}: batch_size must be >= 1, got {batch_size}")
        self.device = torch.device(device)
        self.dtype = dtype
        if isinstance(model, torch.nn.Module):   # ``performance``: the fast path (counterfactory.device.place)
            model = place(model, self.device, dtype, performance)
        self.model = model.to(self.device, dtype=dtype) if hasattr(model, "to") else model
        if hasattr(self.model, "eval"):
            self.model.eval()
        self.name = name or type(model).__name__
        self.batch_size = int(batch_size)
        self.progress = progress

    def _bar(self, iterable, total: int, desc: str):
        return tqdm(iterable, total=total, desc=f"{self.name}: {desc}", unit="batch", leave=False,
                    disable=not self.progress or total <= 1, mininterval=2.0)

    def _pixels(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, dtype=self.dtype)

    # interface ---------------------------------------------------------------------------
    def score_pairs(self, images: Sequence[ImageLike], texts: Sequence[str]) -> np.ndarray:
        if len(images) != len(texts):
            raise ValueError(f"score_pairs: {len(images)} images but {len(texts)} texts; pairs must be aligned")
        idx = np.arange(len(images))
        return self.score_index_pairs(images, texts, idx, idx)

    def score_matrix(self, images: Sequence[ImageLike], texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    def score_index_pairs(self, images, texts, image_idx, text_idx) -> np.ndarray:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "class": type(self.model).__name__, "kind": "dual" if self.dual else "cross",
                "scorer": type(self).__name__}


# --------------------------------------------------------------------------------------------
# dual encoders
# --------------------------------------------------------------------------------------------
class DualEncoderScorer(Scorer):
    """Scores are ``logit_scale · cos(image, text)`` over L2-normalised embeddings."""

    dual = True
    logit_scale: float = 1.0

    def _embed_images(self, pil_images: list) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _embed_texts(self, texts: list[str]) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.inference_mode()
    def encode_images(self, images: Sequence[ImageLike]) -> np.ndarray:
        """(n, d) float32, each row L2-normalised."""
        out = []
        n = len(images)
        for sl in self._bar(_batches(n, self.batch_size), -(-n // self.batch_size), "images"):
            out.append(_l2(self._embed_images([load_image(im) for im in images[sl]])).cpu())
        if not out:
            raise ValueError("encode_images: no images given")
        return torch.cat(out).numpy().astype(np.float32)

    @torch.inference_mode()
    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32, each row L2-normalised."""
        texts = [str(t) for t in texts]
        out = []
        n = len(texts)
        for sl in self._bar(_batches(n, self.batch_size), -(-n // self.batch_size), "texts"):
            out.append(_l2(self._embed_texts(texts[sl])).cpu())
        if not out:
            raise ValueError("encode_texts: no texts given")
        return torch.cat(out).numpy().astype(np.float32)

    def score_embeddings(self, image_emb: np.ndarray, text_emb: np.ndarray) -> np.ndarray:
        """(n_images, n_texts) scores from embeddings made by :meth:`encode_images` / :meth:`encode_texts`."""
        sim = np.asarray(image_emb, dtype=np.float32) @ np.asarray(text_emb, dtype=np.float32).T
        sim *= np.float32(self.logit_scale)  # in place: the matrix can be large (n_images x n_texts)
        return sim

    def score_matrix(self, images, texts) -> np.ndarray:
        return self.score_embeddings(self.encode_images(images), self.encode_texts(texts))

    def score_index_pairs(self, images, texts, image_idx, text_idx) -> np.ndarray:
        image_idx, text_idx = np.asarray(image_idx, dtype=np.intp), np.asarray(text_idx, dtype=np.intp)
        ui, inv_i = np.unique(image_idx, return_inverse=True)
        ut, inv_t = np.unique(text_idx, return_inverse=True)
        ie = self.encode_images([images[i] for i in ui])
        te = self.encode_texts([texts[j] for j in ut])
        return (self.logit_scale * np.sum(ie[inv_i] * te[inv_t], axis=1)).astype(np.float32)


class HFClipScorer(DualEncoderScorer):
    """transformers ``CLIPModel`` + ``CLIPProcessor``."""

    def __init__(self, model, processor, **kw):
        super().__init__(model, **kw)
        self.processor = processor
        self.logit_scale = float(self.model.logit_scale.detach().exp().item())
        self.max_length = int(self.model.config.text_config.max_position_embeddings)

    def _embed_images(self, pil_images):
        pix = self.processor.image_processor(images=pil_images, return_tensors="pt")["pixel_values"]
        return _model_output_features(self.model.get_image_features(pixel_values=self._pixels(pix)))

    def _embed_texts(self, texts):
        tok = self.processor.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                       return_tensors="pt")
        return _model_output_features(self.model.get_text_features(
            input_ids=tok["input_ids"].to(self.device), attention_mask=tok["attention_mask"].to(self.device)))


class OpenClipScorer(DualEncoderScorer):
    """open_clip model + its preprocess transform + tokenizer."""

    def __init__(self, model, preprocess, tokenizer, **kw):
        super().__init__(model, **kw)
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        scale = getattr(self.model, "logit_scale", None)
        self.logit_scale = float(scale.detach().exp().item()) if scale is not None else 1.0

    def _embed_images(self, pil_images):
        pix = torch.stack([self.preprocess(im) for im in pil_images])
        return self.model.encode_image(self._pixels(pix))

    def _embed_texts(self, texts):
        return self.model.encode_text(self.tokenizer(texts).to(self.device))


class VseppScorer(DualEncoderScorer):
    """VSE++ (:mod:`counterfactory.models.vsepp`) + its processor: the cosine of the L2-normalised image and
    caption embeddings (no temperature, as VSE++ ranks)."""

    def __init__(self, model, processor, **kw):
        super().__init__(model, **kw)
        self.processor = processor

    def _embed_images(self, pil_images):
        pix = self.processor.image_processor(images=pil_images, return_tensors="pt")["pixel_values"]
        return self.model.encode_image(self._pixels(pix))

    def _embed_texts(self, texts):
        tok = self.processor.tokenizer(texts, return_tensors="pt", padding=True, truncation=True)
        return self.model.encode_text(tok["input_ids"].to(self.device), tok["attention_mask"].to(self.device))


#: what a FLAVA dual-encoder scorer embeds (:class:`FlavaItcScorer`)
FLAVA_EMBEDDINGS = ("projected", "pooler")


class FlavaItcScorer(DualEncoderScorer):
    """FLAVA as a dual encoder over its unimodal encoders.

    ``embedding``: ``projected`` (default) — the global contrastive head's embeddings, the [CLS] token through the
    image / text projection (``get_image_features`` / ``get_text_features``, what FLAVA's contrastive loss compares);
    ``pooler`` — the encoders' unprojected ``pooler_output`` (dense + tanh on the [CLS] token of
    ``image_model`` / ``text_model``), the embedding SocialCounterfactuals' evaluation ranks images with. Scores are
    ``logit_scale · cos`` either way (the rankings are what the probes use)."""

    def __init__(self, model, processor, embedding: str = "projected", **kw):
        if embedding not in FLAVA_EMBEDDINGS:
            raise ConfigError(f"FLAVA embedding must be one of {', '.join(FLAVA_EMBEDDINGS)}, got {embedding!r}")
        super().__init__(model, **kw)
        self.processor = processor
        self.embedding = embedding
        self.flava = getattr(self.model, "flava", self.model)  # FlavaForPreTraining or FlavaModel
        self.logit_scale = float(self.flava.logit_scale.detach().exp().item())
        self.max_length = _max_text_length(processor.tokenizer, self.flava.config.text_config)
        if embedding == "pooler":
            dims = (self.flava.config.image_config.hidden_size, self.flava.config.text_config.hidden_size)
            if dims[0] != dims[1]:
                raise ConfigError(f"FLAVA embedding 'pooler': the image and text encoders have different widths "
                                  f"{dims}, so their pooler outputs cannot be compared. Fix: use 'projected'")

    def _embed_images(self, pil_images):
        pix = self._pixels(self.processor.image_processor(images=pil_images, return_tensors="pt")["pixel_values"])
        if self.embedding == "pooler":
            return self.flava.image_model(pixel_values=pix).pooler_output
        return _model_output_features(self.flava.get_image_features(pixel_values=pix))[:, 0, :]

    def _embed_texts(self, texts):
        tok = _tokenize(self.processor.tokenizer, texts, self.max_length, self.device)
        tok = {k: v for k, v in tok.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        if self.embedding == "pooler":
            return self.flava.text_model(**tok).pooler_output
        return _model_output_features(self.flava.get_text_features(**tok))[:, 0, :]


class BridgeTowerItcScorer(DualEncoderScorer):
    """``BridgeTowerForContrastiveLearning``: the ITC text / image embeddings.

    Both come from the *unimodal* towers (the last text-encoder layer's [CLS], and the vision tower's
    [CLS] after ``ln_post`` and the cross-modal image transform), so a text's embedding does not depend
    on the image it is paired with. The model's forward needs both modalities, so texts are encoded
    next to a fixed blank image and images next to an empty text; only the matching output is kept.
    """

    def __init__(self, model, processor, **kw):
        super().__init__(model, **kw)
        self.processor = processor
        self.logit_scale = float(self.model.logit_scale.detach().exp().item())
        self.max_length = _max_text_length(processor.tokenizer, self.model.config.text_config, 2)
        self._blank = None

    def _blank_pixels(self, n: int) -> dict[str, torch.Tensor]:
        if self._blank is None:
            from PIL import Image

            side = 64
            out = self.processor.image_processor(images=[Image.new("RGB", (side, side))], return_tensors="pt")
            self._blank = {k: out[k] for k in ("pixel_values", "pixel_mask") if k in out}
        return {k: (self._pixels(v) if v.is_floating_point() else v.to(self.device)).expand(n, *v.shape[1:])
                for k, v in self._blank.items()}

    def _embed_images(self, pil_images):
        out = self.processor.image_processor(images=pil_images, return_tensors="pt")
        im = {k: (self._pixels(out[k]) if out[k].is_floating_point() else out[k].to(self.device))
              for k in ("pixel_values", "pixel_mask") if k in out}
        tok = _tokenize(self.processor.tokenizer, [""] * len(pil_images), self.max_length, self.device)
        return self.model(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"], **im).image_embeds

    def _embed_texts(self, texts):
        tok = _tokenize(self.processor.tokenizer, texts, self.max_length, self.device)
        return self.model(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"],
                          **self._blank_pixels(len(texts))).text_embeds


class BlipItcScorer(DualEncoderScorer):
    """BLIP's contrastive head (``BlipForImageTextRetrieval(use_itm_head=False)``): cosine of projected [CLS]."""

    def __init__(self, model, processor, **kw):
        super().__init__(model, **kw)
        self.processor = processor
        self.logit_scale = 1.0
        self.max_length = _max_text_length(processor.tokenizer, self.model.config.text_config)

    def _embed_images(self, pil_images):
        pix = self.processor.image_processor(images=pil_images, return_tensors="pt")["pixel_values"]
        hidden = self.model.vision_model(pixel_values=self._pixels(pix)).last_hidden_state
        return self.model.vision_proj(hidden[:, 0, :])

    def _embed_texts(self, texts):
        tok = _tokenize(self.processor.tokenizer, texts, self.max_length, self.device)
        hidden = self.model.text_encoder(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"]).last_hidden_state
        return self.model.text_proj(hidden[:, 0, :])


# --------------------------------------------------------------------------------------------
# cross-encoders (ITM heads)
# --------------------------------------------------------------------------------------------
def _max_text_length(tokenizer, text_config, offset: int = 0) -> int:
    limit = int(getattr(text_config, "max_position_embeddings", 512)) - offset
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < 100_000:
        limit = min(limit, tok_max)
    return limit


def _tokenize(tokenizer, texts: list[str], max_length: int, device) -> dict[str, torch.Tensor]:
    tok = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return {k: v.to(device) for k, v in tok.items()}


class ItmScorer(Scorer):
    """Cross-encoder: every (image, text) pair runs through the model. Subclasses define the call."""

    text_keys: tuple[str, ...] = ("input_ids", "attention_mask")
    image_keys: tuple[str, ...] = ("pixel_values",)

    def __init__(self, model, processor, *, itm_score: str = "logit", max_exhaustive_pairs: int = 2_000_000,
                 text_offset: int = 0, **kw):
        super().__init__(model, **kw)
        if itm_score not in ("logit", "probability"):
            raise ConfigError(f"scorer {self.name}: itm_score must be 'logit' or 'probability', got {itm_score!r}")
        self.processor = processor
        self.itm_score = itm_score
        self.max_exhaustive_pairs = int(max_exhaustive_pairs)
        text_config = getattr(self.model.config, "text_config", self.model.config)
        self.max_length = _max_text_length(processor.tokenizer, text_config, text_offset)

    # model-specific ----------------------------------------------------------------------
    def _head(self, image_inputs: dict, text_inputs: dict) -> torch.Tensor:  # pragma: no cover - abstract
        """Raw ITM head output for aligned rows: (B, 2) two-way logits or (B, 1) ranking logit."""
        raise NotImplementedError

    # shared ------------------------------------------------------------------------------
    def _prepare_images(self, pil_images: list) -> dict[str, torch.Tensor]:
        out = self.processor.image_processor(images=pil_images, return_tensors="pt")
        return {k: out[k] for k in self.image_keys if k in out}

    def _prepare_texts(self, texts: list[str]) -> dict[str, torch.Tensor]:
        tok = self.processor.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                       return_tensors="pt")
        return {k: tok[k] for k in self.text_keys if k in tok}

    def _to_score(self, head: torch.Tensor) -> torch.Tensor:
        head = head.float()
        if head.shape[-1] == 1:
            return torch.sigmoid(head[:, 0]) if self.itm_score == "probability" else head[:, 0]
        if self.itm_score == "probability":
            return torch.softmax(head, dim=-1)[:, 1]
        return head[:, 1]

    @torch.inference_mode()
    def score_index_pairs(self, images, texts, image_idx, text_idx) -> np.ndarray:
        image_idx = np.asarray(image_idx, dtype=np.intp).ravel()
        text_idx = np.asarray(text_idx, dtype=np.intp).ravel()
        if image_idx.shape != text_idx.shape:
            raise ValueError(f"image_idx has {image_idx.size} entries but text_idx has {text_idx.size}")
        scores = np.empty(image_idx.size, dtype=np.float32)
        if image_idx.size == 0:
            return scores
        texts = [str(t) for t in texts]
        # Pairs are grouped by image; images are preprocessed in chunks of batch_size distinct images,
        # texts are tokenised per batch of pairs (padded to the longest text of that batch).
        order = np.argsort(image_idx, kind="stable")
        sorted_img = image_idx[order]
        uniq = np.unique(image_idx)
        chunks = []
        for chunk in _batches(len(uniq), self.batch_size):
            chunk_ids = uniq[chunk]
            lo = np.searchsorted(sorted_img, chunk_ids[0], side="left")
            hi = np.searchsorted(sorted_img, chunk_ids[-1], side="right")
            chunks.append((chunk_ids, order[lo:hi]))
        bar = self._bar(None, sum(-(-rows.size // self.batch_size) for _, rows in chunks), "pairs")
        for chunk_ids, rows in chunks:
            img_inputs = self._prepare_images([load_image(images[i]) for i in chunk_ids])
            local = {int(i): k for k, i in enumerate(chunk_ids)}
            for sl in _batches(rows.size, self.batch_size):
                r = rows[sl]
                sel = torch.as_tensor([local[int(i)] for i in image_idx[r]], dtype=torch.long)
                im = {k: (self._pixels(v[sel]) if v.is_floating_point() else v[sel].to(self.device))
                      for k, v in img_inputs.items()}
                tx = {k: v.to(self.device) for k, v in self._prepare_texts([texts[j] for j in text_idx[r]]).items()}
                scores[r] = self._to_score(self._head(im, tx)).cpu().numpy()
                bar.update(1)
        bar.close()
        return scores

    def score_matrix(self, images, texts) -> np.ndarray:
        n_i, n_t = len(images), len(texts)
        if n_i * n_t > self.max_exhaustive_pairs:
            raise ConfigError(
                f"scorer {self.name}: exhaustive cross-encoder scoring of {n_i} images x {n_t} texts "
                f"= {n_i * n_t:,} forward passes exceeds max_exhaustive_pairs ({self.max_exhaustive_pairs:,}). "
                f"Fix: set evaluation.itr.shortlist (a dual-encoder role and k, BLIP-style re-ranking) or raise "
                f"evaluation.scorers.<role>.max_exhaustive_pairs"
            )
        ii, tt = np.meshgrid(np.arange(n_i), np.arange(n_t), indexing="ij")
        return self.score_index_pairs(images, texts, ii.ravel(), tt.ravel()).reshape(n_i, n_t)


class BlipItmScorer(ItmScorer):
    """``BlipForImageTextRetrieval`` with ``use_itm_head=True``; score = match logit (class 1)."""

    def _head(self, im, tx):
        # Same computation as ``model(..., use_itm_head=True).itm_score``, with the image attention
        # mask created on the model's device (the library builds it on the CPU).
        image_embeds = self.model.vision_model(pixel_values=im["pixel_values"]).last_hidden_state
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=image_embeds.device)
        hidden = self.model.text_encoder(input_ids=tx["input_ids"], attention_mask=tx["attention_mask"],
                                         encoder_hidden_states=image_embeds,
                                         encoder_attention_mask=image_atts).last_hidden_state
        return self.model.itm_head(hidden[:, 0, :])


class ViltItmScorer(ItmScorer):
    """``ViltForImageAndTextRetrieval``; score = the ranking logit."""

    text_keys = ("input_ids", "attention_mask", "token_type_ids")
    image_keys = ("pixel_values", "pixel_mask")

    def _head(self, im, tx):
        return self.model(**im, **tx).logits


class FlavaItmScorer(ItmScorer):
    """``FlavaForPreTraining``'s ITM head on the multimodal encoder output; score = match logit.

    ``FlavaForPreTraining.forward`` computes ``itm_head(multimodal_masked_embeddings)`` where the
    "masked" text is the unmasked text at inference, i.e. ``itm_head(flava(...).multimodal_embeddings)``;
    we call exactly that, skipping the second encoder pass and the pre-training heads.
    """

    text_keys = ("input_ids", "attention_mask", "token_type_ids")

    def _head(self, im, tx):
        out = self.model.flava(pixel_values=im["pixel_values"], **tx, skip_multimodal_encoder=False)
        return self.model.itm_head(out.multimodal_embeddings)


class BridgeTowerItmScorer(ItmScorer):
    """``BridgeTowerForImageAndTextRetrieval``; score = match logit (class 1)."""

    image_keys = ("pixel_values", "pixel_mask")

    def __init__(self, model, processor, **kw):
        # RoBERTa-style position ids start after the padding index: 2 positions are not usable
        super().__init__(model, processor, text_offset=2, **kw)

    def _head(self, im, tx):
        return self.model(**im, **tx).logits


# --------------------------------------------------------------------------------------------
# factory
# --------------------------------------------------------------------------------------------
#: model class -> (scorer with the ITM head, scorer with the contrastive head or None)
_ITM_BY_CLASS = {
    "BlipForImageTextRetrieval": (BlipItmScorer, BlipItcScorer),
    "ViltForImageAndTextRetrieval": (ViltItmScorer, None),
    "FlavaForPreTraining": (FlavaItmScorer, FlavaItcScorer),
    "BridgeTowerForImageAndTextRetrieval": (BridgeTowerItmScorer, None),
    "BridgeTowerForContrastiveLearning": (None, BridgeTowerItcScorer),
}


def scorer_options(cfg: dict, role: str, **overrides) -> dict:
    """Options of ``role``: defaults < ``evaluation.batch_size`` < ``evaluation.scorers.<role>`` < overrides."""
    ev = cfg.get("evaluation") or {}
    opts = dict(DEFAULT_OPTIONS)
    if ev.get("batch_size"):
        opts["batch_size"] = ev["batch_size"]
    opts.update((ev.get("scorers") or {}).get(role) or {})
    opts.update({k: v for k, v in overrides.items() if v is not None})
    return opts


def wrap_model(loaded, *, name: str, head: str = "auto", itm_score: str = "logit",
               max_exhaustive_pairs: int = 2_000_000, flava_embedding: str = "projected", **kw) -> Scorer:
    """The scorer for an object returned by ``registry.load`` (``(model, processor)`` for transformers,
    ``(model, preprocess, tokenizer)`` for open_clip). ``flava_embedding``: what FLAVA's contrastive-head scorer
    embeds (:data:`FLAVA_EMBEDDINGS`, see :class:`FlavaItcScorer`); other models ignore it."""
    if head not in ("auto", "itm", "itc"):
        raise ConfigError(f"scorer {name}: head must be auto, itm or itc, got {head!r}")
    if isinstance(loaded, tuple) and len(loaded) == 3:
        return OpenClipScorer(*loaded, name=name, **kw)
    if not (isinstance(loaded, tuple) and len(loaded) == 2):
        raise ConfigError(f"scorer {name}: expected (model, processor) from the model loader, got {type(loaded).__name__}")
    model, processor = loaded
    cls_name = type(model).__name__
    if cls_name == "CLIPModel":
        return HFClipScorer(model, processor, name=name, **kw)
    if cls_name == "VSEPP":
        return VseppScorer(model, processor, name=name, **kw)
    if cls_name not in _ITM_BY_CLASS:
        raise ConfigError(
            f"scorer {name}: no adapter for {cls_name}. Fix: use a CLIPModel, open_clip model, "
            f"{', '.join(sorted(_ITM_BY_CLASS))}"
        )
    itm_cls, itc_cls = _ITM_BY_CLASS[cls_name]
    if head == "itc" and itc_cls is None:
        log.warning("scorer %s: %s has no contrastive (itc) head; scoring with its ITM head", name, cls_name)
        head = "itm"
    if head == "itm" and itm_cls is None:
        raise ConfigError(f"scorer {name}: {cls_name} was loaded without its ITM head. Fix: load it with head='itm'")
    if head == "itc" or (head == "auto" and itm_cls is None):
        if itc_cls is FlavaItcScorer:
            return itc_cls(model, processor, name=name, embedding=flava_embedding, **kw)
        return itc_cls(model, processor, name=name, **kw)
    return itm_cls(model, processor, name=name, itm_score=itm_score, max_exhaustive_pairs=max_exhaustive_pairs, **kw)


def scorer_from_config(cfg: dict, role: str, *, head: str = "itm", progress: bool = True,
                       flava_embedding: str = "projected", **overrides) -> Scorer:
    """Load ``role`` through the model registry and wrap it in the matching scorer.

    ``head``: ``itm`` scores with the image-text matching head of cross-encoders (BLIP, ViLT, FLAVA,
    BridgeTower); ``itc`` with their contrastive (dual-encoder) head where they have one (FLAVA, BLIP,
    BridgeTower; ViLT falls back to ITM with a warning). CLIP / open_clip have one score either way.
    Options come from ``evaluation.scorers.<role>`` (``batch_size``, ``itm_score: logit|probability``,
    ``max_exhaustive_pairs``) and ``overrides``; the device and precision from the config's
    ``device`` / ``precision`` through :mod:`counterfactory.device`. ``flava_embedding``: see :func:`wrap_model`.
    """
    from . import device as device_mod

    opts = scorer_options(cfg, role, **overrides)
    dev, dtype = device_mod.from_config(cfg)
    loaded = registry.load(cfg, role, head=head)
    scorer = wrap_model(loaded, name=role, head=head, itm_score=opts["itm_score"],
                        max_exhaustive_pairs=opts["max_exhaustive_pairs"], flava_embedding=flava_embedding,
                        device=dev, dtype=dtype,
                        batch_size=int(opts["batch_size"]), progress=progress,
                        performance=device_mod.Performance.from_config(cfg))
    log.info("scorer %s: %s (%s) on %s/%s", role, type(scorer).__name__, registry.model_spec(cfg, role).source,
             dev, dtype)
    return scorer


# --------------------------------------------------------------------------------------------
# image classifiers
# --------------------------------------------------------------------------------------------


class NsfwClassifier:
    """The ``nsfw`` role's image classifier (SocialCounterfactuals' NSFW filter, §3.4, §8.3; loader
    :mod:`counterfactory.models.loaders_nsfw`): ``probabilities(images) -> (n, k)`` in the order of ``labels``."""

    def __init__(self, model, processor, *, device: Any = "cpu", dtype: Any = None, batch_size: int = 32,
                 progress: bool = False):
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self.model = model.to(self.device, dtype=self.dtype).eval()
        self.processor = processor
        self.batch_size = int(batch_size)
        self.progress = progress
        id2label = {int(k): str(v) for k, v in (model.config.id2label or {}).items()}
        self.labels = [id2label.get(i, str(i)) for i in range(int(model.config.num_labels))]

    @classmethod
    def from_config(cls, cfg: Mapping, role: str = "nsfw", batch_size: int = 32, progress: bool = False):
        from . import device as device_mod

        dev, dtype = device_mod.from_config(cfg)
        model, processor = registry.load(cfg, role)
        return cls(model, processor, device=dev, dtype=dtype, batch_size=batch_size, progress=progress)

    def probabilities(self, images: Sequence[Any]) -> np.ndarray:
        """(n, k) float64 softmax probabilities; images are paths or PIL images."""
        out = []
        starts = range(0, len(images), self.batch_size)
        for s in tqdm(starts, desc="nsfw", unit="batch", leave=False, disable=not self.progress):
            batch = [load_image(im) for im in images[s:s + self.batch_size]]
            pixels = self.processor(images=batch, return_tensors="pt")["pixel_values"]
            with torch.inference_mode():
                logits = self.model(pixel_values=pixels.to(self.device, dtype=self.dtype)).logits
            out.append(torch.softmax(logits.float(), dim=-1).cpu().numpy().astype(np.float64))
        return np.concatenate(out) if out else np.zeros((0, len(self.labels)))
