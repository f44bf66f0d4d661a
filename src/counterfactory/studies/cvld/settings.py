"""Settings of the CVLD study (config section ``cvld``): counterfactual interventions on gender by image editing,
and debiased adaptation of BLIP for classification, retrieval and captioning ("Debias your VLM with
counterfactuals: a unified approach", anonymous ICLR submission; ``cvld-debias-vlm-with-counterfactuals.txt``).

Every default is written once, in :data:`DEFAULTS`, with the paper section it comes from; "ours" marks choices the
paper leaves open. :func:`settings` merges a configuration over the defaults (unknown keys refused at any depth,
:mod:`counterfactory.studies.sections`) and checks the values.

Models (roles in ``models:``): ``itm_blip`` (BLIP retrieval: ITC + ITM heads; classification by prompt tuning),
``captioner`` (BLIP captioning), ``editor`` (InstructPix2Pix), ``sd`` (Stable Diffusion for null-text inversion +
Prompt-to-Prompt), ``image_encoder`` (Swin, the top-k filter), ``llm`` (GPT-3.5's role when
``intervention.text_method: llm``).
"""

from __future__ import annotations

from typing import Any, Mapping

from ...errors import ConfigError
from ..sections import FREE, Sections, study_settings

SECTION = "cvld"
TASKS = ("classification", "retrieval", "captioning")
#: appendix A: the 14 gender-independent CelebA attributes (Ramaswamy et al. 2021), CelebA's spelling
CELEBA_ATTRIBUTES = ["Bags_Under_Eyes", "Bangs", "Black_Hair", "Blond_Hair", "Brown_Hair", "Chubby", "Eyeglasses",
                     "Gray_Hair", "High_Cheekbones", "Mouth_Slightly_Open", "Narrow_Eyes", "Smiling",
                     "Wearing_Earrings", "Wearing_Hat"]
#: the training variants: the pre-trained model (no training), plain fine-tuning, balanced data (Tables 2 and 4:
#: BLIP^Bal), CVLD, and Table 3's retrieval ablations
VARIANTS = ("pretrained", "base", "balanced", "cvld", "hard_label", "neg_only", "itc", "itm")
EDIT_METHODS = ("ip2p", "null_text")
TEXT_METHODS = ("rule", "llm")

DEFAULTS: dict[str, Any] = {
    "data": {
        # appendix A: CelebA (classification), COCO (adaptation, retrieval + captioning), Flickr30K (zero-shot
        # retrieval), FairFace (retrieval fairness); official layouts (README, "CVLD")
        "celeba": {"root": None},
        "coco": {"karpathy_json": None, "image_root": None},
        "flickr30k": {"karpathy_json": None, "image_root": None},
        "fairface": {"root": None, "split": "val"},             # Berg et al. 2022 evaluate on the val split
        "splits": {"train": ["train", "restval"], "test": ["test"]},   # Karpathy splits
        "subsets": [0.1, 0.01],                                 # Tables 2 and 4: COCO 10% and 1%
        "subset_seed": 0,                                       # ours: which images form a subset (nested)
        "limit_test": None,                                     # ours: cap on test images (null = all)
    },
    "intervention": {
        "text_method": "rule",      # §3.3 used GPT-3.5; `llm` = the local llm role, `rule` = our word-list swapper
        "min_agree": None,          # appendix B: a majority of an image's captions (3 of 5); an integer overrides
        # §3.3 "Image-only intervention": manual prompts for CelebA (no captions)
        "celeba_prompts": {"Male": {"source": "a photo of a man", "target": "a photo of a woman",
                                    "edit": "turn the man into a woman"},
                           "Female": {"source": "a photo of a woman", "target": "a photo of a man",
                                      "edit": "turn the woman into a man"}},
    },
    "editing": {
        "methods": ["ip2p", "null_text"],   # §3.3: InstructPix2Pix and null-text inversion + Prompt-to-Prompt
        "train_method": "ip2p",             # ours: which method's edits the adaptation uses (the paper uses either)
        "m": 10,                            # §5.1: "m = 10 edited images per example"
        "k": 3,                             # §5.1: "keep the top k = 3" by Swin cosine similarity
        "shards": 64,                       # ours: images per job = |examples| / shards
        "batch_size": 10,                   # ours: one example's m edits per UNet call
        "settings": {FREE: True},           # any key of counterfactory.generation.editing.EditSettings
    },
    "classification": {
        "attributes": list(CELEBA_ATTRIBUTES),
        "shots": [16, 256],                 # Table 1: K-shot, 2K examples (K positive, K negative) per attribute
        "episodes": 10,                     # appendix A: "averaged over 10 independent few-shot episodes"
        "variants": ["pretrained", "base", "cvld"],
        "lambdas": [],                      # Figure 4: the lambda sweep (e.g. [0.25, 0.5, 2.0]); [] = not run
        "figure4_shots": 256,
        "train": {FREE: True, "batch_size": 32, "lr": 1e-2, "lam": 1.0},   # appendix C; §4.2 lambda = 1
        "eval_batch_size": 64,
    },
    "retrieval": {
        "variants": ["pretrained", "base", "balanced", "cvld"],   # Table 2
        "table3": ["hard_label", "neg_only", "itc", "itm"],      # Table 3 (on COCO 1%)
        "table3_subset": 0.01,
        "train": {FREE: True, "epochs": 6, "lr": 1e-5, "batch_size": 128, "lam": 0.3},   # appendix C
        "ks": [1, 5, 10],                   # §5.1: Rec@1 and mRec@K, K in {1, 5, 10}
        "fairface_ks": [1000, 128],         # Table 2: Bias@1K, MaxSkew@1K, Bias@128, MaxSkew@128
        "curve_ks": [10, 20, 50, 100, 200, 500, 1000],   # Figure 5 left (ours: the K grid)
        "rerank_k": 128,                    # BLIP's ITM re-ranking of the ITC top-k (BLIP's COCO setting)
        "eval_batch_size": 64,
    },
    "captioning": {
        "variants": ["pretrained", "base", "balanced", "cvld"],   # Table 4
        "train": {FREE: True, "epochs": 5, "lr": 1e-5, "batch_size": 128, "lam": 0.3},   # appendix C
        "generate": {"max_length": 20, "min_length": 5, "num_beams": 3},   # BLIP's COCO captioning settings
        "lic_seeds": 10,                    # Hirota et al.: leakage classifiers trained 10 times
        "eval_batch_size": 64,
    },
    "seeds": {"first": 0, "count": 3},      # ours: the paper reports single runs (classification: episodes)
    "llm": {FREE: True},                    # the llm role's decoding (counterfactory.text.llm.DEFAULTS)
}


class Settings(Sections):
    section = SECTION
    rules_file = "rules/study_cvld.smk"
    defaults = DEFAULTS


def _fail(key: str, message: str, fix: str) -> ConfigError:
    return ConfigError(f"{SECTION}.{key}: {message}. Fix: {fix}")


def settings(cfg: Mapping | None) -> Settings:
    """The study's settings from a study view or a full configuration (see the module docstring)."""
    s = study_settings(cfg, SECTION, DEFAULTS, Settings)
    _check(s)
    return s


def _positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(key, f"{value!r} is not a positive integer", "use 1 or more")
    return value


def _check(s: Settings) -> None:
    has = s.__contains__
    if has("data"):
        for f in s["data"]["subsets"]:
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
                raise _fail("data.subsets", f"{f!r} is not a share in (0, 1]", "use e.g. [0.1, 0.01]")
    if has("intervention"):
        iv = s["intervention"]
        if iv["text_method"] not in TEXT_METHODS:
            raise _fail("intervention.text_method", f"{iv['text_method']!r}", f"use {', '.join(TEXT_METHODS)}")
        if iv["min_agree"] is not None:
            _positive_int("intervention.min_agree", iv["min_agree"])
    if has("editing"):
        ed = s["editing"]
        bad = [m for m in ed["methods"] if m not in EDIT_METHODS]
        if bad or not ed["methods"]:
            raise _fail("editing.methods", f"{ed['methods']!r}", f"use a non-empty list of {', '.join(EDIT_METHODS)}")
        if ed["train_method"] not in ed["methods"]:
            raise _fail("editing.train_method", f"{ed['train_method']!r} is not in editing.methods",
                        "add it to editing.methods")
        for key in ("m", "k", "shards", "batch_size"):
            _positive_int(f"editing.{key}", ed[key])
        if ed["k"] > ed["m"]:
            raise _fail("editing.k", f"k = {ed['k']} is above m = {ed['m']}", "keep k <= m (the paper: 3 of 10)")
    for task in TASKS:
        if not has(task):
            continue
        bad = [v for v in s[task]["variants"] + s[task].get("table3", []) if v not in VARIANTS]
        if bad:
            raise _fail(f"{task}.variants", f"unknown variant(s) {', '.join(bad)}", f"use {', '.join(VARIANTS)}")
    if has("classification"):
        cl = s["classification"]
        unknown = [a for a in cl["attributes"] if a not in CELEBA_ATTRIBUTES]
        if unknown or not cl["attributes"]:
            raise _fail("classification.attributes", f"{unknown or cl['attributes']!r}",
                        f"use CelebA attributes among {', '.join(CELEBA_ATTRIBUTES)}")
        for k in cl["shots"]:
            _positive_int("classification.shots", k)
        _positive_int("classification.episodes", cl["episodes"])
    if has("seeds"):
        _positive_int("seeds.count", s["seeds"]["count"])


# ------------------------------------------------------------------------------------------- the runs
def seeds(s: Mapping) -> list[int]:
    first, count = int(s["seeds"]["first"]), int(s["seeds"]["count"])
    return list(range(first, first + count))


def subset_name(fraction: float) -> str:
    """``coco10`` for 0.1, ``coco1`` for 0.01 (Tables 2 and 4: "COCO 10%", "COCO 1%")."""
    return f"coco{100 * float(fraction):g}"


def runs(s: Mapping) -> list[dict]:
    """Every (task, setting, variant, seed) the study trains or evaluates. ``setting`` is ``k<K>`` (classification,
    seed = episode) or a COCO subset name; the pre-trained model runs once per task (seed 0, setting ``pt``)."""
    out: list[dict] = []
    if "classification" in s:
        cl = s["classification"]
        for variant in cl["variants"]:
            if variant == "pretrained":
                out.append({"task": "classification", "setting": "pt", "variant": variant, "seed": 0})
                continue
            out += [{"task": "classification", "setting": f"k{k}", "variant": variant, "seed": e}
                    for k in cl["shots"] for e in range(int(cl["episodes"]))]
        for lam in cl["lambdas"]:
            out += [{"task": "classification", "setting": f"k{cl['figure4_shots']}", "variant": f"cvld_lam{lam:g}",
                     "seed": e} for e in range(int(cl["episodes"]))]
    for task in ("retrieval", "captioning"):
        if task not in s:
            continue
        names = list(s[task]["variants"])
        for fraction in s["data"]["subsets"]:
            extra = s[task].get("table3", []) if fraction == s[task].get("table3_subset") else []
            for variant in names + [v for v in extra if v not in names]:
                if variant == "pretrained":
                    continue
                out += [{"task": task, "setting": subset_name(fraction), "variant": variant, "seed": seed}
                        for seed in seeds(s)]
        if "pretrained" in names:
            out.append({"task": task, "setting": "pt", "variant": "pretrained", "seed": 0})
    return out


def lambda_of(s: Mapping, task: str, variant: str) -> float:
    """λ of Eq. 3 for a run: the task's ``train.lam`` (``cvld_lam<λ>`` for Figure 4's sweep); 0 for the
    baselines and ``neg_only`` (Table 3: "no additional loss (λ = 0)")."""
    if variant.startswith("cvld_lam"):
        return float(variant[len("cvld_lam"):])
    if variant in ("cvld", "hard_label", "itc", "itm"):
        return float(s[task]["train"]["lam"])
    return 0.0
