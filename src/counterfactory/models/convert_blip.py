"""Convert an original BLIP checkpoint (salesforce/BLIP layout) into a transformers BLIP folder.

Both the spurious-correlation retrieval paper (§4.1, "BLIP (zeroshot)" and "BLIP (finetune)" rows of Tables 1-2) and
CVLD (§5, the BLIP^PT rows of Tables 1, 2 and 4; every adapted model starts from it) start from PRE-TRAINED BLIP.
Its weights are published only as the original repository's ``.pth`` files (``model_base.pth``,
``model_base_capfilt_large.pth``, ...); the hub's ``Salesforce/blip-itm-base-coco`` and
``Salesforce/blip-image-captioning-base`` are already fine-tuned on COCO. :func:`convert` maps the original state
dict onto transformers' classes:

* ``kind="itm"`` -> ``BlipForImageTextRetrieval`` (vision transformer, text encoder with cross-attention,
  ``vision_proj`` / ``text_proj`` for ITC, ``itm_head`` for ITM);
* ``kind="captioning"`` -> ``BlipForConditionalGeneration`` (vision transformer, ``text_decoder``).

Key layout. The text parts keep their names (transformers' BLIP text model mirrors BLIP's ``med.py``). The vision
transformer is renamed: ``visual_encoder.{cls_token, pos_embed, patch_embed.proj}`` become
``vision_model.embeddings.{class_embedding, position_embedding, patch_embedding}``; ``blocks.N.{norm1, attn.qkv,
attn.proj, norm2, mlp}`` become ``encoder.layers.N.{layer_norm1, self_attn.qkv, self_attn.projection, layer_norm2,
mlp}``; the final ``norm`` becomes ``post_layernorm``. Parts of the original that the chosen class has no place for
are dropped by name and listed in the folder's manifest: the pre-training momentum copies (``*_m``), the
contrastive queues, ``temp``, BERT's ``position_ids`` buffers, and the other kind's modules (the decoder for
``itm``; the text encoder and heads for ``captioning``). Any other key is an error naming it; so is any weight of the
transformers class that the checkpoint does not provide, and any shape that does not match.

Configuration. The config and the processor (tokenizer with BLIP's ``[DEC]``/``[ENC]`` tokens, image processor)
come from ``base`` (a transformers BLIP folder or hub id of the same size, e.g. ``Salesforce/blip-itm-base-coco``);
its sizes must agree with the checkpoint's tensors (the checkpoint carries no config), else an error names each
disagreement. Two settings follow the original code rather than the hub ports: the vision transformer's layer-norm
epsilon is 1e-6 (BLIP's ``vit.py``), and the captioning decoder's loss uses label smoothing 0.1 (BLIP's ``med.py``
decoder loss). The resolution is the checkpoint's own (224 pixels for the pre-training checkpoints) unless
``image_size`` asks for another; then the position embeddings are resized bicubically, as BLIP's own
``load_checkpoint`` does before fine-tuning or evaluating at 384. The processor's image size follows.

BLIP's text conventions stay the caller's (as with any transformers BLIP folder): the captioning decoder starts with
``[DEC]`` (``generate`` puts it in place of ``[CLS]``) and BLIP captions with the prompt ``"a picture of "``; BLIP's
ITM reads ``[ENC]`` in place of ``[CLS]``. The output folder is written atomically, with
``counterfactory-manifest.json`` (sha256 of every file, the source checkpoint's sha256, what was dropped).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import CounterFactoryError
from ..io import file_sha256
from .identity import save_with_manifest

#: transformers class of each kind
CLASSES = {"itm": "BlipForImageTextRetrieval", "captioning": "BlipForConditionalGeneration"}
#: default --base of each kind: a ViT-B transformers BLIP folder whose config and processor are used (not its weights)
HUB_BASES = {"itm": "Salesforce/blip-itm-base-coco", "captioning": "Salesforce/blip-image-captioning-base"}
#: original top-level modules each kind keeps (everything else of the original layout is dropped by name)
KEEP = {"itm": ("visual_encoder", "text_encoder", "vision_proj", "text_proj", "itm_head"),
        "captioning": ("visual_encoder", "text_decoder")}
#: original top-level names that a conversion may drop: pre-training momentum copies, queues and temperature,
#: and the modules the other kind keeps
KNOWN = frozenset({"visual_encoder", "text_encoder", "text_decoder", "vision_proj", "text_proj", "itm_head",
                   "visual_encoder_m", "text_encoder_m", "vision_proj_m", "text_proj_m",
                   "image_queue", "text_queue", "idx_queue", "ptr_queue", "queue_ptr", "temp"})
#: layer-norm epsilon of BLIP's vision transformer (``partial(nn.LayerNorm, eps=1e-6)`` in its ``vit.py``)
VIT_LAYER_NORM_EPS = 1e-6
#: label smoothing of BLIP's decoder loss (``CrossEntropyLoss(label_smoothing=0.1)`` in its ``med.py``)
DECODER_LABEL_SMOOTHING = 0.1
BUILDER = "counterfactory models convert-blip"
#: where the original checkpoints are published (BLIP's README)
RELEASE_URL = "https://storage.googleapis.com/sfr-vision-language-research/BLIP/models/"

_VISION = [  # (pattern inside visual_encoder., replacement inside vision_model.)
    (r"cls_token", "embeddings.class_embedding"),
    (r"pos_embed", "embeddings.position_embedding"),
    (r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embedding.\1"),
    (r"blocks\.(\d+)\.norm1\.(weight|bias)", r"encoder.layers.\1.layer_norm1.\2"),
    (r"blocks\.(\d+)\.norm2\.(weight|bias)", r"encoder.layers.\1.layer_norm2.\2"),
    (r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)", r"encoder.layers.\1.self_attn.qkv.\2"),
    (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"encoder.layers.\1.self_attn.projection.\2"),
    (r"blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"encoder.layers.\1.mlp.\2.\3"),
    (r"norm\.(weight|bias)", r"post_layernorm.\1"),
]


#: the original checkpoint each role of the paper config is converted from (BLIP's own fine-tuning starting points)
ROLE_CHECKPOINTS = {"itm_blip": ("model_base.pth", "itm"),
                    "captioner_pretrained": ("model_base_capfilt_large.pth", "captioning")}


def setup_hint(role: str, folder: str | os.PathLike) -> str | None:
    """How to make a missing converted folder of ``role`` (None for roles that are not BLIP's)."""
    if role not in ROLE_CHECKPOINTS:
        return None
    name, kind = ROLE_CHECKPOINTS[role]
    return (f"download pre-trained BLIP ({RELEASE_URL}{name}) and convert it: `counterfactory models convert-blip "
            f"--checkpoint {name} --kind {kind} --base {HUB_BASES[kind]} --out {folder}` (docs/models.md, "
            f"\"Pre-trained BLIP\"), or put a transformers BLIP folder at {folder}")


class BlipConversionError(CounterFactoryError):
    """An original BLIP checkpoint cannot be converted: names the file, the keys and the fix."""


def _fail(path, problem: str, fix: str) -> BlipConversionError:
    return BlipConversionError(f"{path}: {problem}. Fix: {fix}")


def _listing(keys, limit: int = 12) -> str:
    keys = sorted(keys)
    more = f" (and {len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def rename(key: str, kind: str) -> str | None:
    """The transformers name of original key ``key`` for ``kind``, or None when ``kind`` drops it. Raises
    :class:`KeyError` for a key that is no part of BLIP's layout."""
    top, _, rest = key.partition(".")
    if top not in KNOWN:
        raise KeyError(key)
    if top not in KEEP[kind] or rest.endswith("embeddings.position_ids"):
        return None
    if top != "visual_encoder":
        return key
    for pattern, repl in _VISION:
        if re.fullmatch(pattern, rest):
            return "vision_model." + re.sub(pattern, repl, rest)
    raise KeyError(key)


def load_state_dict(path: str | os.PathLike) -> dict:
    """The state dict of an original BLIP checkpoint (``{"model": state_dict}`` as BLIP saves it, or a bare one)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise _fail(path, "no such checkpoint file", f"download it from {RELEASE_URL} (e.g. model_base.pth) and "
                    "pass its path to --checkpoint")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise _fail(path, f"not a readable PyTorch checkpoint of tensors (read with weights_only=True: "
                    f"{type(exc).__name__}: {exc})", f"download it again from {RELEASE_URL}") from exc
    state = obj.get("model", obj) if isinstance(obj, dict) else None
    if not isinstance(state, dict) or not state or not all(isinstance(k, str) for k in state):
        raise _fail(path, "holds no state dict (expected {'model': {name: tensor}} as BLIP saves)",
                    f"pass an original BLIP checkpoint from {RELEASE_URL}")
    return state


def map_state_dict(state: dict, kind: str, path="checkpoint") -> tuple[dict, list[str]]:
    """``(transformers state dict, dropped original keys)``; unknown keys raise naming them."""
    if kind not in CLASSES:
        raise _fail(path, f"unknown kind {kind!r}", f"use one of {', '.join(CLASSES)}")
    mapped, dropped, unknown = {}, [], []
    for key, value in state.items():
        try:
            new = rename(key, kind)
        except KeyError:
            unknown.append(key)
            continue
        if new is None:
            dropped.append(key)
        else:
            mapped[new] = value
    if unknown:
        raise _fail(path, f"{len(unknown)} key(s) are not part of BLIP's checkpoint layout: {_listing(unknown)}",
                    "pass an original salesforce/BLIP checkpoint (model_base*.pth, model_large*.pth or a fine-tuned "
                    "one); a transformers checkpoint needs no conversion")
    missing = [top for top in KEEP[kind] if not any(k.startswith(top + ".") for k in state)]
    if missing:
        raise _fail(path, f"kind {kind!r} needs {', '.join(missing)}, which this checkpoint lacks",
                    "use a pre-training checkpoint (it has every part) or the kind that matches a fine-tuned "
                    "checkpoint (retrieval checkpoints: itm; captioning checkpoints: captioning)")
    return mapped, sorted(dropped)


def _sizes(state: dict, kind: str) -> dict:
    """Model sizes read off the original tensors (the checkpoint carries no config)."""
    text = "text_encoder" if kind == "itm" else "text_decoder.bert"
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"visual_encoder\.blocks\.(\d+)\.", k))}
    layers = {int(m.group(1)) for k in state if (m := re.match(rf"{re.escape(text)}\.encoder\.layer\.(\d+)\.", k))}
    words = state[f"{text}.embeddings.word_embeddings.weight"]
    sizes = {
        "vision_config.hidden_size": state["visual_encoder.cls_token"].shape[-1],
        "vision_config.num_hidden_layers": len(blocks),
        "vision_config.intermediate_size": state["visual_encoder.blocks.0.mlp.fc1.weight"].shape[0],
        "vision_config.patch_size": state["visual_encoder.patch_embed.proj.weight"].shape[-1],
        "text_config.vocab_size": words.shape[0],
        "text_config.hidden_size": words.shape[1],
        "text_config.num_hidden_layers": len(layers),
        "text_config.intermediate_size": state[f"{text}.encoder.layer.0.intermediate.dense.weight"].shape[0],
        "text_config.max_position_embeddings": state[f"{text}.embeddings.position_embeddings.weight"].shape[0],
        "text_config.encoder_hidden_size": state[f"{text}.encoder.layer.0.crossattention.self.key.weight"].shape[1],
    }
    if kind == "itm":
        sizes["image_text_hidden_size"] = state["vision_proj.weight"].shape[0]
    return {k: int(v) for k, v in sizes.items()}


def _get(config, dotted: str):
    obj = config
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _grid(num_positions: int, path) -> int:
    side = round((num_positions - 1) ** 0.5)
    if side * side != num_positions - 1:
        raise _fail(path, f"visual_encoder.pos_embed has {num_positions} positions, not 1 + a square grid",
                    "pass an original BLIP checkpoint")
    return side


def resize_position_embedding(pos, grid: int):
    """BLIP's resizing of ViT position embeddings (``load_checkpoint`` before fine-tuning at another resolution):
    the class token's embedding is kept, the patch grid is resized bicubically (``align_corners=False``)."""
    import torch
    import torch.nn.functional as F

    old = round((pos.shape[1] - 1) ** 0.5)
    if old == grid:
        return pos
    cls, patches = pos[:, :1], pos[:, 1:]
    patches = patches.reshape(1, old, old, pos.shape[-1]).permute(0, 3, 1, 2)
    patches = F.interpolate(patches.float(), size=(grid, grid), mode="bicubic", align_corners=False)
    patches = patches.permute(0, 2, 3, 1).reshape(1, grid * grid, pos.shape[-1]).to(pos.dtype)
    return torch.cat([cls, patches], dim=1)


def _sha256(path: Path) -> str:
    return file_sha256(path)


def build_model(state: dict, kind: str, base: str, *, image_size: int | None = None, path="checkpoint"):
    """``(transformers model, processor, info)`` from an original state dict, with ``base``'s config and
    processor; ``info`` records what was dropped and changed."""
    import torch
    import transformers
    from transformers import AutoProcessor, BlipConfig

    mapped, dropped = map_state_dict(state, kind, path)
    try:
        config = BlipConfig.from_pretrained(base)
        processor = AutoProcessor.from_pretrained(base)
    except Exception as exc:
        raise _fail(base, f"cannot load a BLIP config and processor ({type(exc).__name__}: {exc})",
                    "pass --base a transformers BLIP folder or hub id of the checkpoint's size (ViT-B: "
                    "Salesforce/blip-itm-base-coco for itm, Salesforce/blip-image-captioning-base for captioning), "
                    "downloaded beforehand when offline") from exc
    wrong = [f"{name}: checkpoint {have}, base {_get(config, name)}" for name, have in _sizes(state, kind).items()
             if _get(config, name) != have]
    if wrong:
        raise _fail(path, f"sizes differ from the --base config {base}: {'; '.join(wrong)}",
                    "pass --base a transformers BLIP model of the same size as the checkpoint (ViT-B checkpoints: "
                    "Salesforce/blip-itm-base-coco or Salesforce/blip-image-captioning-base; ViT-L: the -large ones)")
    vision = config.vision_config
    source_grid = _grid(mapped["vision_model.embeddings.position_embedding"].shape[1], path)
    target = int(image_size or source_grid * vision.patch_size)
    if target % vision.patch_size:
        raise _fail(base, f"image size {target} is not a multiple of the patch size {vision.patch_size}",
                    "pass --image-size a multiple of the patch size (BLIP: 224 or 384)")
    key = "vision_model.embeddings.position_embedding"
    mapped[key] = resize_position_embedding(mapped[key], target // vision.patch_size)
    vision.image_size = target
    vision.layer_norm_eps = VIT_LAYER_NORM_EPS
    if kind == "captioning":
        config.text_config.label_smoothing = DECODER_LABEL_SMOOTHING
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is not None:
        image_processor.size = {"height": target, "width": target}

    model_cls = getattr(transformers, CLASSES[kind])
    with torch.device("meta"):
        skeleton = model_cls(config)
    expected = skeleton.state_dict()
    tied = set(getattr(skeleton, "all_tied_weights_keys", None) or getattr(skeleton, "_tied_weights_keys", None)
                or {})
    unexpected = sorted(set(mapped) - set(expected))
    missing = sorted(k for k in set(expected) - set(mapped) if k not in tied)
    if unexpected or missing:
        parts = ([f"no place in {CLASSES[kind]} for {_listing(unexpected)}"] if unexpected else []) + (
            [f"{CLASSES[kind]} weights the checkpoint lacks: {_listing(missing)}"] if missing else [])
        raise _fail(path, "; ".join(parts), "pass an original BLIP checkpoint of the matching kind and a --base of "
                    "the same architecture")
    shapes = [f"{k}: checkpoint {tuple(v.shape)}, {CLASSES[kind]} {tuple(expected[k].shape)}"
              for k, v in mapped.items() if tuple(v.shape) != tuple(expected[k].shape)]
    if shapes:
        raise _fail(path, f"shape mismatch: {_listing(shapes, 6)}", "pass a --base of the checkpoint's architecture")
    model = model_cls(config)
    result = model.load_state_dict({k: v.to(expected[k].dtype) for k, v in mapped.items()}, strict=False)
    left = sorted(k for k in result.missing_keys if k not in tied)
    if left or result.unexpected_keys:
        raise _fail(path, f"loading left missing {_listing(left)} / unexpected {_listing(result.unexpected_keys)}",
                    "report this checkpoint; the key mapping does not cover it")
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    summary: dict[str, int] = {}
    for key in dropped:  # per original module (hundreds of keys in a real checkpoint)
        top = key.split(".")[0] if not key.endswith("position_ids") else "position_ids buffers"
        summary[top] = summary.get(top, 0) + 1
    info = {"kind": kind, "class": CLASSES[kind], "base": str(base), "dropped": dict(sorted(summary.items())),
            "image_size": target, "source_image_size": source_grid * vision.patch_size,
            "vision_layer_norm_eps": VIT_LAYER_NORM_EPS,
            **({"label_smoothing": DECODER_LABEL_SMOOTHING} if kind == "captioning" else {})}
    return model.eval(), processor, info


def convert(checkpoint: str | os.PathLike, kind: str, out: str | os.PathLike, base: str, *,
            image_size: int | None = None) -> Path:
    """Convert ``checkpoint`` (original BLIP layout) to a transformers folder ``out`` (written atomically, with a
    manifest naming the source checkpoint's sha256); returns ``out``."""
    checkpoint = Path(checkpoint)
    state = load_state_dict(checkpoint)
    model, processor, info = build_model(state, kind, base, image_size=image_size, path=checkpoint)
    return save_with_manifest(out, model, processor, builder=BUILDER, source_checkpoint=checkpoint.name,
                              source_sha256=_sha256(checkpoint), **info)
