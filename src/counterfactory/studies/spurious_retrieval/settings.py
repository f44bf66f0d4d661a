"""Settings of the spurious-correlation retrieval study (config section ``spurious_retrieval``).

Every default is written once, in the schema (``config/schema.yaml``), with the paper section it comes from (Kim,
Koepke, Schmid & Akata 2023, "Exposing and Mitigating Spurious Correlations for Cross-Modal Retrieval"); "ours"
marks choices the paper leaves open. :func:`settings` takes the sections as the schema validated and filled them
(unknown keys are refused at every depth) and checks the cross-key rules. Region selection is read by
:mod:`.regions` (α1 0.4, α2 0.8, α3 0.7, §3.1).

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
      appendix_b_models: [clip_train]       # appendix B: CLIP fine-tuned on D_s (|D_s| = |D'|) and on D' alone
      appendix_b_datasets: [coco]
    training:
      models: {clip_train: clip, itm_blip: blip, vsepp: vsepp}   # §4.1: CLIP ViT-B, BLIP (ViT-B, BERT) and VSE++
                                            # (VGG19, Bi-GRU); role -> recipe; vsepp: no zero-shot run
      seeds: {first: 0, count: 3, data_seed_offset: 1}   # ours: the paper reports single runs
      zeroshot: true                        # Tables 1-2 "(zeroshot)" rows
      clip: {lr: 2.0e-6, batch_size: 256, epochs: 10, lr_scheduler: step, lr_step_epochs: 2, ...}   # §4.1
      blip: {lr: 1.0e-5, batch_size: 16, epochs: 2, lr_scheduler: step, lr_step_epochs: 0.5, ...}   # §4.1
      vsepp: {lr: 1.0e-4, batch_size: 256, epochs: 10, lr_scheduler: step, lr_step_epochs: 2, ...}   # §4.1
    evaluation: {ks: [1, 5, 10], batch_size: 256}   # §3.2 ODmAP@1/5/10; Table 2 R@1/5/10

The defaults above are the schema's (``spurious_retrieval`` in ``config/schema.yaml``, each with its paper section;
docs/config-reference.md lists them); this module checks the cross-key rules the schema cannot express.

VSE++ (the paper's third model, VGG19 + Bi-GRU with its hardest-negative triplet loss) is the ``vsepp`` recipe: our
own implementation (:mod:`counterfactory.models.vsepp`), built fresh and trained by the shared trainer; it has no
pre-trained model, so no zero-shot run (:func:`has_zeroshot`).
"""

from __future__ import annotations

import copy
import math
from typing import Mapping

from ...errors import ConfigError
from ...settings import seed_pairs as expand_seed_pairs
from ..sections import Sections, study_settings

SECTION = "spurious_retrieval"
DATASETS = ("coco", "flickr30k")
TEXT_METHODS = ("np_removal", "prompt", "captioner")
IMAGE_METHODS = ("lama", "opencv", "zero", "mean", "blur")
SPLITS = ("train", "val", "test")
#: mixtures of every run: the fine-tuned baseline (D only), ours (D + D') and the zero-shot model
FINETUNE, OURS, ZEROSHOT = "finetune", "ours", "zeroshot"
#: appendix B's extra training sets: D_s (a random part of D as large as D') and D' alone
D_S, D_PRIME = "d_s", "d_prime"
RESERVED = (FINETUNE, ZEROSHOT, D_S, D_PRIME)

RECIPES = ("clip", "blip", "vsepp")
#: recipes without a pre-trained model to score zero-shot (Tables 1-2 have no "VSE++ (zeroshot)" row)
NO_ZEROSHOT = ("vsepp",)


def _fail(key: str, message: str, fix: str) -> ConfigError:
    return ConfigError(f"{SECTION}.{key}: {message}. Fix: {fix}")


class Settings(Sections):
    """The study's settings; a section the job's configuration did not include is an error, not a default."""

    section = SECTION
    rules_file = "rules/study_spurious_retrieval.smk"

    def __missing__(self, key):
        if key == "selection":      # selection is read by .regions
            raise KeyError(key)
        return super().__missing__(key)


def settings(cfg: Mapping | None) -> Settings:
    """The study's settings (its schema sections, defaults filled by the schema) from a study view or a full
    configuration; a partial section (tests, library use) is validated and filled the same way
    (:func:`counterfactory.config.fill_section`). A job's partial view (:class:`counterfactory.config.ConfigView`)
    gives only the sections its rule declared."""
    out = study_settings(cfg, SECTION, Settings, skip=("selection",))
    _check(out)
    return out


def _check(s: dict) -> None:
    """Cross-key rules the schema cannot express (types, ranges and enums are the schema's)."""
    has = s.__contains__
    if has("mixtures"):
        _check_mixtures(s, s["inpaint"]["methods"] if has("inpaint") else None)
    if has("training"):
        _check_training(s)


def _check_mixtures(s: dict, image_methods) -> None:
    mx = s["mixtures"]
    for vname, spec in mx["variants"].items():
        used = vname == OURS or vname in mx["table3"]
        if spec["image"] not in IMAGE_METHODS or (used and image_methods is not None and spec["image"] not in image_methods):
            raise _fail(f"mixtures.variants.{vname}.image", f"{spec['image']!r} is not in inpaint.methods",
                        f"add it to inpaint.methods or use one of {', '.join(image_methods or IMAGE_METHODS)}")
        if vname in RESERVED or vname.startswith("ratio_"):
            raise _fail(f"mixtures.variants.{vname}", "reserved name", "rename the variant")
    if OURS not in mx["variants"]:
        raise _fail("mixtures.variants", "no 'ours' variant (the D + D' rows of Tables 1-2)", "define variants.ours")
    if mx["variants"][OURS]["text"] != "np_removal":
        raise _fail("mixtures.variants.ours.text", "the ratio sweep draws from the noun-phrase captions",
                    "keep text: np_removal for ours")
    for name in mx["table3"]:
        if name not in mx["variants"]:
            raise _fail("mixtures.table3", f"{name!r} is not a variant", f"use {', '.join(mx['variants'])}")


def _check_training(s: dict) -> None:
    models = s["training"]["models"]
    bad = [r for r in s["training"].get("start_roles") or {} if r not in models]
    if bad:
        raise _fail("training.start_roles", f"{', '.join(bad)} not in training.models", "key it by a trained role")
    if "mixtures" in s:
        for key in ("table3_models", "ratio_models", "appendix_b_models"):
            bad = [m for m in s["mixtures"][key] if m not in models]
            if bad:
                raise _fail(f"mixtures.{key}", f"{', '.join(bad)} not in training.models", "list trained roles only")


def _check_evaluation(s: dict) -> None:
    ks = s["evaluation"]["ks"]
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise _fail("evaluation.ks", f"{ks!r}", "use positive integers such as [1, 5, 10]")


def inpaint_settings(s: dict):
    """The :class:`counterfactory.generation.inpaint.InpaintSettings` of the study's ``inpaint`` section (its
    fill keys; ``mean_of: masked`` = §4.4's mean padding, the mean colour of the removed region B^r)."""
    from ...generation.inpaint import InpaintSettings

    return InpaintSettings.from_config({k: v for k, v in s["inpaint"].items()
                                        if k not in ("methods", "shards", "batch_size")})


def start_role(s: dict, dataset: str, role: str) -> str:
    """The model role a run of ``role`` on ``dataset`` starts from: ``training.start_roles.<role>.<dataset>``, else
    ``role`` itself (e.g. VSE++'s published COCO and Flickr30k checkpoints, each with its own vocabulary)."""
    return ((s["training"].get("start_roles") or {}).get(role) or {}).get(dataset, role)


def has_zeroshot(s: dict, role: str) -> bool:
    """Whether ``role`` has a zero-shot run: every role but those trained with a :data:`NO_ZEROSHOT` recipe."""
    return s["training"]["models"].get(role) not in NO_ZEROSHOT


def ratio_name(ratio: float) -> str:
    """Mixture name of one point of Figure 4 (``ratio_0.1``)."""
    return f"ratio_{float(ratio):g}"


def ratio_of(mixture: str) -> float | None:
    return float(mixture[len("ratio_"):]) if mixture.startswith("ratio_") else None


def mixtures(s: dict, dataset: str, role: str) -> list[str]:
    """Every mixture trained for ``role`` on ``dataset`` (zero-shot excluded): finetune, ours, the Table 3
    variants, the Figure 4 ratios and appendix B's D_s and D' where configured."""
    mx = s["mixtures"]
    out = [FINETUNE, OURS]
    if role in mx["table3_models"] and dataset in mx["table3_datasets"]:
        out += [v for v in mx["table3"] if v not in out]
    if role in mx["ratio_models"] and dataset in mx["ratio_datasets"]:
        out += [ratio_name(r) for r in mx["ratios"]]
    if appendix_b(s, dataset, role):
        out += [D_S, D_PRIME]
    return out


def appendix_b(s: dict, dataset: str, role: str | None = None) -> bool:
    """Whether appendix B's D_s and D' runs are trained on ``dataset`` (for ``role``, or for some role)."""
    mx = s["mixtures"]
    roles = mx["appendix_b_models"] if role is None else [role]
    return dataset in mx["appendix_b_datasets"] and any(r in mx["appendix_b_models"] for r in roles)


def needed_variants(s: dict, dataset: str | None = None) -> list[str]:
    """The D' variants some run (of ``dataset``, default every dataset) trains on: ours and the Table 3 ones."""
    used = {OURS}
    for dataset in [dataset] if dataset else s["data"]["datasets"]:
        for role in s["training"]["models"]:
            used |= {m for m in mixtures(s, dataset, role) if m in s["mixtures"]["variants"]}
    # Table 3's order: ours, then the table3 list as configured (a mapping's key order does not survive the
    # workflow's config view, a list's does), then any other variant by name
    order = [OURS] + [v for v in s["mixtures"]["table3"] if v != OURS]
    order += sorted(v for v in s["mixtures"]["variants"] if v not in order)
    return [v for v in order if v in used and v in s["mixtures"]["variants"]]


def text_methods(s: dict, dataset: str | None = None) -> list[str]:
    return sorted({s["mixtures"]["variants"][v]["text"] for v in needed_variants(s, dataset)})


def image_methods(s: dict, dataset: str | None = None) -> list[str]:
    """Inpainting methods some variant uses, in ``inpaint.methods`` order."""
    used = {s["mixtures"]["variants"][v]["image"] for v in needed_variants(s, dataset)}
    return [m for m in s["inpaint"]["methods"] if m in used]


def seed_pairs(s: dict) -> list[tuple[int, int]]:
    """(seed, data_seed) of every run of ``training.seeds``."""
    return expand_seed_pairs(s["training"]["seeds"])


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
