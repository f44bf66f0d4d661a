"""Settings of the spurious-correlation retrieval study (config section ``spurious_retrieval``).

Every default is written once, here, with the paper section it comes from (Kim, Koepke, Schmid & Akata 2023,
"Exposing and Mitigating Spurious Correlations for Cross-Modal Retrieval"); "ours" marks choices the paper leaves
open. The schema (``config/schema.yaml``) types the section; :func:`settings` merges a config over these defaults
(mappings one level deep) and refuses unknown keys. Region selection has its own defaults in :mod:`.regions`
(α1 0.4, α2 0.8, α3 0.7, §3.1).

Configuration (study section ``spurious_retrieval``)::

    data:
      datasets: [coco, flickr30k]          # §4.1: MS-COCO and Flickr30k (Karpathy splits)
      coco: {karpathy_json, image_root, instances: [instances_train2014.json, instances_val2014.json]}
      flickr30k: {karpathy_json, image_root, entities_root}
      splits: {train: [train, restval], val: [val], test: [test]}   # §4.1: 113,287 / 5,000 / 5,000 (COCO)
    selection: {alpha1: 0.4, alpha2: 0.8, alpha3: 0.7, rule: pseudocode, mask_mode: box, classes: null}
    inpaint:
      methods: [lama, zero, mean, blur]    # §3.1 inpainting (LaMa here) and Table 3's paddings
      shards: 64                            # ours: images are split into this many jobs (by item id)
      batch_size: 8                         # ours; + any key of counterfactory.generation.inpaint.InpaintSettings
    captions:
      per_image: 1                          # §4 "Impact of varying the ratio": one synthetic caption of five per image
      keep_unmatched: true                  # ours: a caption naming no removed class still describes x'
      prompt_templates: openai_imagenet     # §3.3 "we use 80 prompts": CLIP's 80 ImageNet templates (open_clip)
      prompt_article: false                 # §3.3 example "A photo of person and dog"
      captioner: {batch_size: 32, max_new_tokens: 30, num_beams: 1}   # Table 3 "capt. model" (ClipCap there)
    mixtures:
      variants:                             # Table 3: text synthesis x image synthesis of D'
        ours: {text: np_removal, image: lama}
        np_blur: {text: np_removal, image: blur}
        np_zero: {text: np_removal, image: zero}
        np_mean: {text: np_removal, image: mean}
        captioner: {text: captioner, image: lama}
        prompts: {text: prompt, image: lama}
      table3: [np_blur, np_zero, np_mean, captioner, prompts]   # trained for the Table 3 models/datasets only
      table3_models: [clip_train]           # Table 3: CLIP (finetuned) on MS-COCO
      table3_datasets: [coco]
      ratios: [0.05, 0.1, 0.2, 0.3, 0.4]     # Figure 4: |D'_sub| / |D| (0 = the fine-tuned baseline)
      ratio_models: [clip_train]
      ratio_datasets: [coco]
      random_state: 0                       # ours: which caption / which D' rows are drawn
    training:
      models: {clip_train: clip, itm_blip: blip}   # §4.1: CLIP ViT-B and BLIP (ViT-B, BERT); role -> recipe
      seeds: {first: 0, count: 3, data_seed_offset: 1}   # ours: the paper reports single runs
      zeroshot: true                        # Tables 1-2 "(zeroshot)" rows
      clip: {lr: 2.0e-6, batch_size: 256, epochs: 10, lr_scheduler: step, lr_step_epochs: 2, ...}   # §4.1
      blip: {lr: 1.0e-5, batch_size: 16, epochs: 2, lr_scheduler: step, lr_step_epochs: 0.5, ...}   # §4.1
    evaluation: {ks: [1, 5, 10], batch_size: 256}   # §3.2 ODmAP@1/5/10; Table 2 R@1/5/10

VSE++ (the paper's third model, VGG19 + Bi-GRU with a triplet loss) has no maintained implementation on PyPI; it
is not included (README).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping

from ...errors import ConfigError

SECTION = "spurious_retrieval"
DATASETS = ("coco", "flickr30k")
TEXT_METHODS = ("np_removal", "prompt", "captioner")
IMAGE_METHODS = ("lama", "opencv", "zero", "mean", "blur")
SPLITS = ("train", "val", "test")
#: mixtures of every run: the fine-tuned baseline (D only), ours (D + D') and the zero-shot model
FINETUNE, OURS, ZEROSHOT = "finetune", "ours", "zeroshot"

DEFAULTS: dict[str, Any] = {
    "data": {
        "datasets": list(DATASETS),
        "coco": {"karpathy_json": None, "image_root": None, "instances": []},
        "flickr30k": {"karpathy_json": None, "image_root": None, "entities_root": None},
        "splits": {"train": ["train", "restval"], "val": ["val"], "test": ["test"]},
    },
    "inpaint": {"methods": ["lama", "zero", "mean", "blur"], "shards": 64, "batch_size": 8},
    "captions": {"per_image": 1, "keep_unmatched": True, "prompt_templates": "openai_imagenet",
                 "prompt_article": False, "captioner": {"batch_size": 32, "max_new_tokens": 30, "num_beams": 1}},
    "mixtures": {
        "variants": {"ours": {"text": "np_removal", "image": "lama"},
                     "np_blur": {"text": "np_removal", "image": "blur"},
                     "np_zero": {"text": "np_removal", "image": "zero"},
                     "np_mean": {"text": "np_removal", "image": "mean"},
                     "captioner": {"text": "captioner", "image": "lama"},
                     "prompts": {"text": "prompt", "image": "lama"}},
        "table3": ["np_blur", "np_zero", "np_mean", "captioner", "prompts"],
        "table3_models": ["clip_train"], "table3_datasets": ["coco"],
        "ratios": [0.05, 0.1, 0.2, 0.3, 0.4],
        "ratio_models": ["clip_train"], "ratio_datasets": ["coco"],
        "random_state": 0,
    },
    "training": {
        "models": {"clip_train": "clip", "itm_blip": "blip"},
        "seeds": {"first": 0, "count": 3, "data_seed_offset": 1},
        "zeroshot": True,
        "val_rows": None,   # ours: cap on validation rows for checkpoint selection (null = the whole val split)
        "common": {"eval_every": "epoch", "eval_batch_size": None, "max_steps": None, "max_length": 77,
                   "dataloader_workers": 4, "deterministic": True, "cpu_threads": 1, "no_decay": ["bias", "LayerNorm"],
                   "warmup_steps": 0, "max_grad_norm": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999,
                   "adam_epsilon": 1e-8, "recipe": "plain", "cvld_lambda": 0.0},
        # §4.1: "10 epochs with a batch size of 256 ... Adam ... 2e-6 for CLIP ... rate of 0.5 every 2 epochs";
        # Adam = AdamW without weight decay
        "clip": {"lr": 2e-6, "batch_size": 256, "epochs": 10, "optimizer": "adamw_torch", "weight_decay": 0.0,
                 "lr_scheduler": "step", "lr_step_epochs": 2.0, "lr_step_gamma": 0.5},
        # §4.1: "2 epochs with a batch size of 16 ... AdamW ... 1e-5 ... rate of 0.5 every half epoch";
        # weight decay 0.05 is BLIP's own retrieval fine-tuning value (ours: the paper is silent)
        "blip": {"lr": 1e-5, "batch_size": 16, "epochs": 2, "optimizer": "adamw_torch", "weight_decay": 0.05,
                 "lr_scheduler": "step", "lr_step_epochs": 0.5, "lr_step_gamma": 0.5},
    },
    "evaluation": {"ks": [1, 5, 10], "batch_size": 256},
}
RECIPES = ("clip", "blip")
_NESTED = {"data": ("coco", "flickr30k", "splits"), "captions": ("captioner",),
           "training": RECIPES + ("common", "seeds"),
           "mixtures": ()}


def _fail(key: str, message: str, fix: str) -> ConfigError:
    return ConfigError(f"{SECTION}.{key}: {message}. Fix: {fix}")


def _merge(default: dict, own: Mapping, where: str, nested: tuple[str, ...]) -> dict:
    unknown = sorted(set(own) - set(default))
    if unknown:
        raise _fail(where, f"unknown key(s) {', '.join(unknown)}", f"use {', '.join(default)}")
    out = copy.deepcopy(default)
    for key, value in own.items():
        if key in nested:
            if not isinstance(value, Mapping):
                raise _fail(f"{where}.{key}", f"expected a mapping, got {type(value).__name__}", "write key: value pairs")
            allowed = set(out[key]) | (set(DEFAULTS["training"]["common"]) if key in RECIPES else set())
            if key in RECIPES:
                allowed |= {"lr_step_epochs", "lr_step_gamma", "optimizer", "weight_decay", "lr_scheduler"}
            bad = sorted(set(value) - allowed) if key != "splits" else sorted(set(value) - set(SPLITS))
            if bad:
                raise _fail(f"{where}.{key}", f"unknown key(s) {', '.join(bad)}", f"use {', '.join(sorted(allowed))}")
            out[key].update(copy.deepcopy(dict(value)))
        elif key == "variants" and value is not None:
            out[key] = copy.deepcopy(dict(value))
        else:
            out[key] = copy.deepcopy(value)
    return out


class Settings(dict):
    """The study's settings; a section the job's configuration did not include is an error, not a default."""

    def __missing__(self, key):
        if key in DEFAULTS:
            raise ConfigError(f"this job was not given the config section {SECTION}.{key}. Fix: add '{key}' to the "
                              "sections the rule passes in params (rules/study_spurious_retrieval.smk, job_config)")
        raise KeyError(key)


def settings(cfg: Mapping | None) -> Settings:
    """The study's settings (the sections of :data:`DEFAULTS`) from a study view or a full configuration. A job's
    partial view (:class:`counterfactory.config.ConfigView`) gives only the sections its rule declared."""
    cfg = cfg if cfg is not None else {}
    nested = dict.get(cfg, SECTION) if isinstance(cfg, dict) else None
    own = nested if isinstance(nested, Mapping) else cfg
    partial = bool(getattr(own, "partial", False))
    out = Settings()
    for name, default in DEFAULTS.items():
        if partial and not dict.__contains__(own, name):
            continue
        value = dict.get(own, name) if isinstance(own, dict) else None
        out[name] = _merge(default, dict(value or {}), name, _NESTED.get(name, ()))
    _check(out)
    return out


def _check(s: dict) -> None:
    has = s.__contains__
    if has("data"):
        _check_data(s)
    if has("inpaint"):
        _check_inpaint(s)
    if has("captions"):
        _check_captions(s)
    if has("mixtures"):
        _check_mixtures(s, s["inpaint"]["methods"] if has("inpaint") else None)
    if has("training"):
        _check_training(s)
    if has("evaluation"):
        _check_evaluation(s)


def _check_data(s: dict) -> None:
    for name in s["data"]["datasets"]:
        if name not in DATASETS:
            raise _fail("data.datasets", f"unknown dataset {name!r}", f"use {', '.join(DATASETS)}")


def _check_inpaint(s: dict) -> None:
    for method in s["inpaint"]["methods"]:
        if method not in IMAGE_METHODS:
            raise _fail("inpaint.methods", f"unknown method {method!r}", f"use {', '.join(IMAGE_METHODS)}")
    for key in ("shards", "batch_size"):
        v = s["inpaint"][key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise _fail(f"inpaint.{key}", f"{v!r} is not a positive integer", "use 1 or more")


def _check_captions(s: dict) -> None:
    per_image = s["captions"]["per_image"]
    if per_image != "all" and (isinstance(per_image, bool) or not isinstance(per_image, int) or per_image < 1):
        raise _fail("captions.per_image", f"{per_image!r}", "use a positive integer (1 = the paper) or 'all'")


def _check_mixtures(s: dict, image_methods) -> None:
    mx = s["mixtures"]
    for vname, spec in mx["variants"].items():
        if not isinstance(spec, Mapping) or set(spec) != {"text", "image"}:
            raise _fail(f"mixtures.variants.{vname}", f"{spec!r} is not {{text, image}}",
                        "write e.g. {text: np_removal, image: lama}")
        if spec["text"] not in TEXT_METHODS:
            raise _fail(f"mixtures.variants.{vname}.text", f"unknown {spec['text']!r}", f"use {', '.join(TEXT_METHODS)}")
        used = vname == OURS or vname in mx["table3"]
        if spec["image"] not in IMAGE_METHODS or (used and image_methods is not None and spec["image"] not in image_methods):
            raise _fail(f"mixtures.variants.{vname}.image", f"{spec['image']!r} is not in inpaint.methods",
                        f"add it to inpaint.methods or use one of {', '.join(image_methods or IMAGE_METHODS)}")
        if vname in (FINETUNE, ZEROSHOT) or vname.startswith("ratio_"):
            raise _fail(f"mixtures.variants.{vname}", "reserved name", "rename the variant")
    if OURS not in mx["variants"]:
        raise _fail("mixtures.variants", "no 'ours' variant (the D + D' rows of Tables 1-2)", "define variants.ours")
    if mx["variants"][OURS]["text"] != "np_removal":
        raise _fail("mixtures.variants.ours.text", "the ratio sweep draws from the noun-phrase captions",
                    "keep text: np_removal for ours")
    for name in mx["table3"]:
        if name not in mx["variants"]:
            raise _fail("mixtures.table3", f"{name!r} is not a variant", f"use {', '.join(mx['variants'])}")
    for r in mx["ratios"]:
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r <= 1:
            raise _fail("mixtures.ratios", f"{r!r} is not in (0, 1]", "use shares of |D| such as 0.1")
    for key in ("table3_datasets", "ratio_datasets"):
        bad = [d for d in mx[key] if d not in DATASETS]
        if bad:
            raise _fail(f"mixtures.{key}", f"unknown dataset(s) {', '.join(bad)}", f"use {', '.join(DATASETS)}")


def _check_training(s: dict) -> None:
    models = s["training"]["models"]
    if not isinstance(models, Mapping) or not models:
        raise _fail("training.models", f"{models!r}", "map model roles to a recipe, e.g. {clip_train: clip}")
    for role, recipe in models.items():
        if recipe not in RECIPES:
            raise _fail(f"training.models.{role}", f"unknown recipe {recipe!r}", f"use {', '.join(RECIPES)}")
    if "mixtures" in s:
        for key in ("table3_models", "ratio_models"):
            bad = [m for m in s["mixtures"][key] if m not in models]
            if bad:
                raise _fail(f"mixtures.{key}", f"{', '.join(bad)} not in training.models", "list trained roles only")


def _check_evaluation(s: dict) -> None:
    ks = s["evaluation"]["ks"]
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise _fail("evaluation.ks", f"{ks!r}", "use positive integers such as [1, 5, 10]")


def ratio_name(ratio: float) -> str:
    """Mixture name of one point of Figure 4 (``ratio_0.1``)."""
    return f"ratio_{float(ratio):g}"


def ratio_of(mixture: str) -> float | None:
    return float(mixture[len("ratio_"):]) if mixture.startswith("ratio_") else None


def mixtures(s: dict, dataset: str, role: str) -> list[str]:
    """Every mixture trained for ``role`` on ``dataset`` (zero-shot excluded): finetune, ours, the Table 3
    variants and the Figure 4 ratios where configured."""
    mx = s["mixtures"]
    out = [FINETUNE, OURS]
    if role in mx["table3_models"] and dataset in mx["table3_datasets"]:
        out += [v for v in mx["table3"] if v not in out]
    if role in mx["ratio_models"] and dataset in mx["ratio_datasets"]:
        out += [ratio_name(r) for r in mx["ratios"]]
    return out


def needed_variants(s: dict, dataset: str | None = None) -> list[str]:
    """The D' variants some run (of ``dataset``, default every dataset) trains on: ours and the Table 3 ones."""
    used = {OURS}
    for dataset in [dataset] if dataset else s["data"]["datasets"]:
        for role in s["training"]["models"]:
            used |= {m for m in mixtures(s, dataset, role) if m in s["mixtures"]["variants"]}
    return [v for v in s["mixtures"]["variants"] if v in used]


def text_methods(s: dict, dataset: str | None = None) -> list[str]:
    return sorted({s["mixtures"]["variants"][v]["text"] for v in needed_variants(s, dataset)})


def image_methods(s: dict, dataset: str | None = None) -> list[str]:
    """Inpainting methods some variant uses, in ``inpaint.methods`` order."""
    used = {s["mixtures"]["variants"][v]["image"] for v in needed_variants(s, dataset)}
    return [m for m in s["inpaint"]["methods"] if m in used]


def seed_pairs(s: dict) -> list[tuple[int, int]]:
    seeds = s["training"]["seeds"]
    first, count, off = int(seeds["first"]), int(seeds["count"]), int(seeds.get("data_seed_offset", 1))
    return [(first + i, first + i + off) for i in range(count)]


def training_section(s: dict, role: str, train_rows: int) -> dict:
    """The trainer section (``TrainSettings`` keys, ``experiment`` and an empty ``eval``) of ``role``'s recipe;
    ``eval_every: epoch`` becomes ``ceil(train_rows / batch_size)`` steps."""
    from ...training import TrainSettings

    recipe = s["training"]["models"][role]
    merged = {**s["training"]["common"], **s["training"][recipe]}
    eval_every = merged["eval_every"]
    if eval_every == "epoch":
        eval_every = max(1, math.ceil(train_rows / int(merged["batch_size"])))
    elif isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1:
        raise _fail("training.common.eval_every", f"{eval_every!r}", "a positive integer or 'epoch'")
    keys = set(TrainSettings.SECTION_KEYS) | set(getattr(TrainSettings, "OPTIONAL_KEYS", ()))
    section = {k: copy.deepcopy(v) for k, v in merged.items() if k in keys}
    section["eval_every"] = int(eval_every)
    if section.get("eval_batch_size") is None:
        section["eval_batch_size"] = int(merged["batch_size"])
    section["experiment"] = role
    section["eval"] = {}
    return section
