"""VSE++'s triplet ranking loss (Faghri et al. 2018, §3), the objective of the VSE++ model of the
spurious-correlation retrieval paper (Kim et al. 2023 §4.1: "VSE++ is trained with a triplet loss").

For a batch of ``n`` (image, caption) pairs with L2-normalised embeddings, ``s(i, c)`` is their cosine. Each
pair is an anchor twice: the image ``i`` against every other caption ``c'`` and the caption ``c`` against every
other image ``i'``, with a hinge ``[margin - s(i, c) + s(i, c')]_+`` (and ``[margin - s(i, c) + s(i', c)]_+``).

* **max of hinges** (VSE++'s MH loss, ``max_violation=True``): per anchor only the hardest negative of the
  batch counts -- the largest hinge of the image's row and of the caption's column -- and the loss is the sum
  over the batch of those two maxima;
* **sum of hinges** (``max_violation=False``, VSE0 in the VSE++ paper): every negative's hinge is summed.

Hard negatives beyond the pairs (``n_pairs`` < the number of images or captions, see
:data:`counterfactory.training.model.N_PAIRS`) are candidates only: extra captions are negatives of the pairs'
images, extra images negatives of the pairs' captions, never anchors. Like VSE++ the loss is a sum over the
batch, not a mean.
"""

from __future__ import annotations

import torch

#: VSE++'s margin alpha (§3 of the VSE++ paper; Kim et al. use VSE++ as published)
MARGIN = 0.2


def _scores(image_embeds: torch.Tensor, text_embeds: torch.Tensor) -> torch.Tensor:
    """Cosines in fp32 also under mixed precision: the hinges compare differences of a few hundredths."""
    with torch.autocast(device_type=image_embeds.device.type, enabled=False):
        return image_embeds.float() @ text_embeds.float().T


def _hinges(image_embeds: torch.Tensor, text_embeds: torch.Tensor, margin: float, n_pairs: int | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(caption hinges (n, n_texts), image hinges (n_images, n))``: row ``i`` of the first holds image ``i``'s
    hinge against every caption, column ``j`` of the second caption ``j``'s against every image; the positive
    pair's own entry is 0."""
    scores = _scores(image_embeds, text_embeds)
    n = min(scores.shape) if n_pairs is None else int(n_pairs)
    positive = scores.diagonal()[:n]
    idx = torch.arange(n, device=scores.device)
    captions = (margin + scores[:n] - positive[:, None]).clamp(min=0)
    images = (margin + scores[:, :n] - positive[None, :]).clamp(min=0)
    eye_c = torch.zeros_like(captions, dtype=torch.bool)
    eye_c[idx, idx] = True
    eye_i = torch.zeros_like(images, dtype=torch.bool)
    eye_i[idx, idx] = True
    return captions.masked_fill(eye_c, 0.0), images.masked_fill(eye_i, 0.0)


def hinge_triplet_loss(image_embeds: torch.Tensor, text_embeds: torch.Tensor, margin: float = MARGIN,
                       max_violation: bool = True, n_pairs: int | None = None) -> torch.Tensor:
    """VSE++'s loss (module docstring): the first ``n_pairs`` images and captions are pairs (all of a square
    batch when None); ``max_violation`` picks the max of hinges (VSE++) over the sum of hinges (VSE0)."""
    captions, images = _hinges(image_embeds, text_embeds, float(margin), n_pairs)
    if max_violation:
        return captions.max(dim=1).values.sum() + images.max(dim=0).values.sum()
    return captions.sum() + images.sum()


def hardest_negatives(image_embeds: torch.Tensor, text_embeds: torch.Tensor, n_pairs: int | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hardest caption of each pair's image, hardest image of each pair's caption)``: the negatives the max
    of hinges trains against (the most similar non-matching caption per row, image per column)."""
    scores = _scores(image_embeds, text_embeds)
    n = min(scores.shape) if n_pairs is None else int(n_pairs)
    idx = torch.arange(n, device=scores.device)
    rows = scores[:n].clone()
    rows[idx, idx] = float("-inf")
    cols = scores[:, :n].clone()
    cols[idx, idx] = float("-inf")
    return rows.argmax(dim=1), cols.argmax(dim=0)


def loss_of_outputs(out: dict[str, torch.Tensor], n_pairs: int | None = None) -> torch.Tensor:
    """The loss of a VSE++ forward's outputs (``image_embeds``, ``text_embeds``, ``hinge_margin``,
    ``hinge_max_violation``; the last two may come back as vectors from a data-parallel gather)."""
    margin = float(out["hinge_margin"].reshape(-1)[0])
    max_violation = bool(out["hinge_max_violation"].reshape(-1)[0] > 0)
    return hinge_triplet_loss(out["image_embeds"], out["text_embeds"], margin, max_violation, n_pairs)
