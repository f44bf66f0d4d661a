"""One caption per image with the ``captioner`` role (spurious-correlation retrieval study, Table 3 "capt. model").

Kim et al. 2023 caption the inpainted images with an image-to-text model (ClipCap in the paper); here any
transformers image-to-text checkpoint that loads with ``AutoModelForImageTextToText`` + ``AutoProcessor``
serves (BLIP captioning, ``Salesforce/blip-image-captioning-base``, at paper scale; a tiny randomly
initialised BLIP in the demo and the tests, :func:`counterfactory.models.tiny_eval.build_blip_captioner`).

:func:`caption_images` loads the role through the model registry (so the load is recorded for
provenance), runs batches on the config's ``device`` / ``precision`` (:mod:`counterfactory.device`) and
decodes greedily (``do_sample=False``; ``num_beams`` 1 by default, beam search when larger), so the captions
are deterministic. Images are not padded and an optional text ``prompt`` is the same for every image, so no
row of a batch sees another row's padding: the captions do not depend on the batch size (up to float
rounding of a near-tie between two tokens, which greedy decoding could resolve differently on another
device or precision).

The caption is the decoded output sequence without special tokens, stripped of surrounding white space.
With a ``prompt``, BLIP returns it as the caption's beginning (its documented use, e.g. ``"a picture of"``
+ continuation); a model whose ``generate`` echoes the prompt's tokens verbatim (decoder-only models) has
them removed, so only the continuation is returned. An empty caption stays ``""`` -- callers decide what
to do with it. A missing or unreadable image raises :class:`~counterfactory.errors.InputError` naming the
file; existence is checked for every path before the model is loaded.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from .. import device as device_mod
from ..errors import ConfigError, input_error
from ..models import registry
from ..scorers import load_image
from ..settings import schema_default

log = logging.getLogger(__name__)

ROLE = "captioner"
#: the schema section whose defaults :func:`caption_images` takes (spurious retrieval, Table 3 "capt. model")
SECTION = "spurious_retrieval.captions.captioner"
_SCHEMA = schema_default(SECTION)


def _check_paths(paths: Sequence[str | os.PathLike]) -> list[Path]:
    out = []
    for i, p in enumerate(paths):
        if not isinstance(p, (str, os.PathLike)):
            raise input_error(f"image {i}", None, f"expected a file path, got {type(p).__name__}",
                              "pass the image files' paths")
        path = Path(os.fspath(p))
        if not path.is_file():
            problem = "is a folder, not an image file" if path.is_dir() else "image file not found"
            raise input_error(path, None, problem,
                              "check that the inpainting stage / dataset wrote this file, or fix the path")
        out.append(path)
    return out


def _to_device(inputs, device: torch.device, dtype: torch.dtype) -> dict:
    moved = {}
    for key, value in dict(inputs).items():
        if isinstance(value, torch.Tensor):
            value = value.to(device, dtype=dtype) if value.is_floating_point() else value.to(device)
        moved[key] = value
    return moved


def _decode(processor, sequences: torch.Tensor) -> list[str]:
    decoder = processor if hasattr(processor, "batch_decode") else processor.tokenizer
    return [text.strip() for text in decoder.batch_decode(sequences, skip_special_tokens=True)]


def caption_batch(model, processor, images: Sequence, *, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32, max_new_tokens: int = _SCHEMA["max_new_tokens"],
                  prompt: str | None = None, num_beams: int = _SCHEMA["num_beams"]) -> list[str]:
    """Captions of one batch of PIL RGB ``images`` with a loaded ``(model, processor)`` already on
    ``device`` / ``dtype`` (greedy, or beam search with ``num_beams`` > 1)."""
    if not images:
        return []
    device = torch.device(device)
    kwargs = {"images": list(images), "return_tensors": "pt"}
    if prompt is not None:
        kwargs["text"] = [prompt] * len(images)
    inputs = _to_device(processor(**kwargs), device, dtype)
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, num_beams=num_beams, max_new_tokens=max_new_tokens)
    if not isinstance(out, torch.Tensor):  # return_dict_in_generate set in a checkpoint's generation config
        out = out.sequences
    prompt_ids = inputs.get("input_ids")
    if prompt_ids is not None:
        n = prompt_ids.shape[1]
        if out.shape[1] >= n and torch.equal(out[:, :n].to(prompt_ids.device), prompt_ids):
            out = out[:, n:]  # decoder-only model: drop the echoed prompt
    return _decode(processor, out)


def caption_images(cfg: dict, paths: Sequence[str | Path], *, role: str = ROLE,
                   batch_size: int = _SCHEMA["batch_size"], max_new_tokens: int = _SCHEMA["max_new_tokens"],
                   prompt: str | None = None, num_beams: int = _SCHEMA["num_beams"],
                   progress: bool = True) -> list[str]:
    """One caption per image file in ``paths``, in input order.

    Loads ``role`` (default ``captioner``) with :func:`counterfactory.models.registry.load`, moves it to the
    config's ``device`` and ``precision``, and captions ``batch_size`` images at a time with greedy decoding
    (``num_beams`` > 1: beam search) of at most ``max_new_tokens`` tokens, conditioned on ``prompt`` when
    given. Returns stripped captions (``""`` when the model wrote only special tokens).

    Raises :class:`~counterfactory.errors.InputError` naming the file for a missing or unreadable image,
    :class:`~counterfactory.errors.ConfigError` for bad options and
    :class:`~counterfactory.errors.ModelLoadError` when the role cannot be loaded.
    """
    for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens), ("num_beams", num_beams)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"caption_images: {name} must be an integer >= 1, got {value!r}")
    if prompt is not None and not isinstance(prompt, str):
        raise ConfigError(f"caption_images: prompt must be a string or None, got {type(prompt).__name__}")
    files = _check_paths(paths)
    if not files:
        return []

    device, dtype = device_mod.from_config(cfg)
    model, processor = registry.load(cfg, role)
    model = model.to(device, dtype=dtype).eval()
    log.info("captioning %d images with %s (%s) on %s/%s, batch %d, max %d new tokens, %d beam(s)",
             len(files), role, registry.model_spec(cfg, role).source, device, dtype, batch_size,
             max_new_tokens, num_beams)
    n_batches = (len(files) + batch_size - 1) // batch_size
    captions: list[str] = []
    try:
        for start in tqdm(range(0, len(files), batch_size), total=n_batches, desc=f"{role}: captions",
                          unit="batch", leave=False, disable=not progress or n_batches <= 1, mininterval=2.0):
            images = [load_image(p) for p in files[start:start + batch_size]]
            captions.extend(caption_batch(model, processor, images, device=device, dtype=dtype,
                                          max_new_tokens=max_new_tokens, prompt=prompt, num_beams=num_beams))
    finally:
        del model
        device_mod.release_memory()
    empty = sum(1 for c in captions if not c)
    if empty:
        log.warning("%s: %d of %d captions are empty", role, empty, len(captions))
    return captions
