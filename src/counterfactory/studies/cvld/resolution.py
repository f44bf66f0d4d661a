"""Input resolution of the BLIP models (``retrieval.image_size``, ``captioning.image_size``).

Table 2's rows and Table 3 use 224×224 inputs (Table 2's subscripted rows 384×384); Table 4's adapted captioners
use 384×384. :func:`set_resolution` moves a loaded BLIP (retrieval or captioning) and its processor to a square input
size as BLIP does when it loads a checkpoint at another resolution: the patch position embeddings are resampled
bicubically on their grid (the class position is kept) and the image processor resizes to the new size. The model's
config records the size, so a checkpoint saved after training loads at it.
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import ConfigError


def current_size(model) -> int:
    return int(model.vision_model.embeddings.image_size)


def set_resolution(model, processor, size: int | None):
    """Resize ``model`` (a transformers BLIP with ``vision_model``) and ``processor`` to ``size`` pixels in place;
    ``None`` or the current size changes nothing. Returns ``(model, processor)``."""
    if size is None:
        return model, processor
    emb = model.vision_model.embeddings
    size, patch = int(size), int(emb.patch_size)
    if size % patch:
        raise ConfigError(f"cvld image_size: {size} is not a multiple of the patch size {patch}. Fix: use e.g. 224 or "
                          "384 (patch 16)")
    if size != int(emb.image_size):
        old = emb.position_embedding.data
        grid, dim = int(round((old.shape[1] - 1) ** 0.5)), old.shape[-1]
        new_grid = size // patch
        patches = old[:, 1:].reshape(1, grid, grid, dim).permute(0, 3, 1, 2).float()
        patches = nn.functional.interpolate(patches, size=(new_grid, new_grid), mode="bicubic", align_corners=False)
        patches = patches.permute(0, 2, 3, 1).reshape(1, new_grid * new_grid, dim).to(old.dtype)
        with torch.no_grad():
            emb.position_embedding = nn.Parameter(torch.cat([old[:, :1], patches], dim=1),
                                                  requires_grad=emb.position_embedding.requires_grad)
        emb.image_size = size
        emb.num_patches = new_grid * new_grid
        emb.num_positions = emb.num_patches + 1
        model.config.vision_config.image_size = size
        emb.config.image_size = size
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is not None:
        image_processor.size = {"height": size, "width": size}
    return model, processor
