"""Loaders for the evaluation roles (COCO-Counterfactuals §4.2, appendix A.6) and the ``captioner`` role.

Registered with :func:`counterfactory.models.base.register_loader`, so these roles load through
``registry.load(cfg, role)`` like every other model. Each transformers role returns
``(model, processor)``; the model class is chosen from the checkpoint's ``config.json``
(``model_type``), never with ``trust_remote_code``:

===============  ==========================================  ==================================
``model_type``   class loaded                                 paper-scale checkpoint (A.6)
===============  ==========================================  ==================================
``bridgetower``  ``BridgeTowerForImageAndTextRetrieval``      BridgeTower/bridgetower-large-itm-mlm-itc
                 (``...ForContrastiveLearning`` when the
                 loader is called with ``head="itc"``)
``flava``        ``FlavaForPreTraining`` (ITM head + ITC)     facebook/flava-full
``vilt``         ``ViltForImageAndTextRetrieval``             dandelin/vilt-b32-finetuned-coco
``blip``         ``BlipForImageTextRetrieval``                Salesforce/blip-itm-base-coco
``clip``         ``CLIPModel``                                openai/clip-vit-base-patch32
===============  ==========================================  ==================================

With ``library: open_clip`` a role is loaded by open_clip (``(model, preprocess, tokenizer)``), as the
CLIP roles are in the registry.
"""

from __future__ import annotations

from ..errors import ModelLoadError
from . import base
from .base import ModelSpec, _hf_kwargs, _src, _transformers_dtype, register_loader

#: evaluation roles that hold an image-text matching (or CLIP) model
EVAL_ROLES = ("itm", "itm_bridgetower", "itm_flava", "itm_vilt", "itm_blip", "itm_blip_coco", "clip_open_clip")

#: model_type in config.json -> (transformers model class, what it is used for)
ITM_CLASSES = {
    "bridgetower": "BridgeTowerForImageAndTextRetrieval",
    "flava": "FlavaForPreTraining",
    "vilt": "ViltForImageAndTextRetrieval",
    "blip": "BlipForImageTextRetrieval",
    "clip": "CLIPModel",
}


def load_itm_transformers(spec: ModelSpec, kw: dict):
    """``(model, processor)`` for an ITM-capable transformers checkpoint (class from ``model_type``)."""
    import transformers
    from transformers import AutoConfig, AutoProcessor

    if spec.is_local and (spec.local_path / "open_clip_config.json").exists():
        raise ModelLoadError(
            f"role '{spec.role}': {spec.local_path} is an open_clip model folder. "
            f"Fix: set models.{spec.role}.library: open_clip"
        )
    config = AutoConfig.from_pretrained(_src(spec), **_hf_kwargs(spec))
    model_type = getattr(config, "model_type", None)
    if model_type not in ITM_CLASSES:
        raise ModelLoadError(
            f"role '{spec.role}': {spec.source} is a {model_type!r} model, which has no image-text matching "
            f"adapter. Fix: point models.{spec.role}.source at a checkpoint of one of "
            f"{sorted(ITM_CLASSES)} (e.g. BridgeTower/bridgetower-large-itm-mlm-itc, facebook/flava-full, "
            f"dandelin/vilt-b32-finetuned-coco, Salesforce/blip-itm-base-coco, openai/clip-vit-base-patch32)"
        )
    cls_name = ITM_CLASSES[model_type]
    if model_type == "bridgetower" and kw.get("head") == "itc":
        # the contrastive heads live in the same checkpoint (bridgetower-large-itm-mlm-itc)
        cls_name = "BridgeTowerForContrastiveLearning"
    cls = getattr(transformers, cls_name)
    model = cls.from_pretrained(_src(spec), **_hf_kwargs(spec), **_transformers_dtype(kw))
    processor = AutoProcessor.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), processor


def load_open_clip(spec: ModelSpec, kw: dict):
    return base._load_open_clip(spec, kw)


for _role in EVAL_ROLES:
    register_loader(f"{_role}:transformers")(load_itm_transformers)
    register_loader(f"{_role}:open_clip")(load_open_clip)


#: role of the image-to-text (captioning) model: Kim et al. 2023 "capt. model" (ClipCap, Table 3); BLIP
#: captioning (Salesforce/blip-image-captioning-base) at paper scale here
CAPTIONER_ROLE = "captioner"
#: CVLD's captioner (§5.4, BLIP^PT): pre-trained BLIP captioning, converted from the original checkpoint
PRETRAINED_CAPTIONER_ROLE = "captioner_pretrained"


@register_loader(f"{PRETRAINED_CAPTIONER_ROLE}:transformers")
@register_loader(f"{CAPTIONER_ROLE}:transformers")
def load_captioner(spec: ModelSpec, kw: dict):
    """``(model, processor)`` of an image-to-text checkpoint: ``AutoModelForImageTextToText`` (BLIP captioning
    loads as ``BlipForConditionalGeneration``) and ``AutoProcessor``, never ``trust_remote_code``."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if spec.is_local and (spec.local_path / "open_clip_config.json").exists():
        raise ModelLoadError(
            f"role '{spec.role}': {spec.local_path} is an open_clip model folder, not an image-to-text model. "
            f"Fix: point models.{spec.role}.source at a captioning checkpoint "
            f"(e.g. Salesforce/blip-image-captioning-base)"
        )
    model = AutoModelForImageTextToText.from_pretrained(_src(spec), **_hf_kwargs(spec), **_transformers_dtype(kw))
    processor = AutoProcessor.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), processor
