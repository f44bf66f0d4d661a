"""Settings of the CVLD study (config section ``cvld``): counterfactual interventions on gender by image editing,
and debiased adaptation of BLIP for classification, retrieval and captioning ("Debias your VLM with
counterfactuals: a unified approach", anonymous ICLR submission).

Every default is written once, in the schema (``cvld`` in ``config/schema.yaml``; docs/config-reference.md), with
the paper section it comes from; "ours" marks choices the paper leaves open. :func:`settings` takes the sections as
the schema validated and filled them (unknown keys refused at any depth, :mod:`counterfactory.studies.sections`)
and checks the cross-key rules the schema cannot express.

Models (roles in ``models:``): ``itm_blip`` (BLIP retrieval: ITC + ITM heads; classification by prompt tuning),
``captioner`` (BLIP captioning), ``editor`` (InstructPix2Pix), ``sd`` (Stable Diffusion for null-text inversion +
Prompt-to-Prompt), ``image_encoder`` (Swin, the top-k filter), ``llm`` (GPT-3.5's role when
``intervention.text_method: llm``).
"""

from __future__ import annotations

from typing import Mapping

from ...errors import ConfigError
from ...settings import seed_list
from ..sections import Sections, study_settings

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
#: the classification setting of Table 1's full-data row (the whole CelebA training split)
FULL = "full"
TEXT_METHODS = ("rule", "llm")
#: Table 2's subscripted rows run at ``retrieval.hires.image_size``: their setting is ``<subset>-<size>``
#: (``coco10-384``); Table 2's full-data BLIP₃₈₄ row is the setting ``full-<size>``
SIZE_SEP = "-"

class Settings(Sections):
    section = SECTION
    rules_file = "rules/study_cvld.smk"


def _fail(key: str, message: str, fix: str) -> ConfigError:
    return ConfigError(f"{SECTION}.{key}: {message}. Fix: {fix}")


def settings(cfg: Mapping | None) -> Settings:
    """The study's settings from a study view or a full configuration (see the module docstring)."""
    s = study_settings(cfg, SECTION, Settings)
    _check(s)
    return s


def _check(s: Settings) -> None:
    """Cross-key rules (types, ranges and enums are the schema's)."""
    if "editing" in s:
        ed = s["editing"]
        if ed["train_method"] not in ed["methods"]:
            raise _fail("editing.train_method", f"{ed['train_method']!r} is not in editing.methods",
                        "add it to editing.methods")
        if ed["k"] > ed["m"]:
            raise _fail("editing.k", f"k = {ed['k']} is above m = {ed['m']}", "keep k <= m (the paper: 3 of 10)")
    h = hires(s) if "retrieval" in s else None
    if h and "pretrained" in h["variants"]:
        raise _fail("retrieval.hires.variants", "'pretrained' is not trained at another size (Table 2's BLIP^PT is "
                    "224 px)", "list base, balanced, cvld or the Table 3 ablations")


# ------------------------------------------------------------------------------------------- the runs
def seeds(s: Mapping) -> list[int]:
    return seed_list(s["seeds"])


def subset_name(fraction: float) -> str:
    """``coco10`` for 0.1, ``coco1`` for 0.01 (Tables 2 and 4: "COCO 10%", "COCO 1%")."""
    return f"coco{100 * float(fraction):g}"


def hires_setting(name: str, size: int) -> str:
    """The setting of a Table 2 row at ``size`` pixels: ``coco10-384``; ``full-384`` for the full-data row."""
    return f"{name}{SIZE_SEP}{int(size)}"


def split_setting(setting: str) -> tuple[str, int | None]:
    """``(subset or setting name, image size or None)`` of a setting: ``coco10-384`` -> ``("coco10", 384)``."""
    name, sep, size = str(setting).rpartition(SIZE_SEP)
    if sep and size.isdigit():
        return name, int(size)
    return str(setting), None


def hires(s: Mapping) -> dict | None:
    """``retrieval.hires`` when Table 2's subscripted rows are run (its ``image_size`` set), else None."""
    h = (s.get("retrieval") or {}).get("hires") or {}
    return dict(h) if h.get("image_size") else None


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
        if cl["full_data"]:                   # Table 1's full-data BLIP row
            out.append({"task": "classification", "setting": FULL, "variant": "base", "seed": 0})
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
    h = hires(s) if "retrieval" in s else None
    if h:                                    # Table 2's subscripted rows: the same runs at the higher resolution
        for fraction in s["data"]["subsets"]:
            out += [{"task": "retrieval", "setting": hires_setting(subset_name(fraction), h["image_size"]),
                     "variant": v, "seed": seed} for v in h["variants"] for seed in seeds(s)]
        if h["full_data_role"]:              # Table 2's BLIP₃₈₄ row: BLIP fine-tuned on all of COCO, as released
            out.append({"task": "retrieval", "setting": hires_setting(FULL, h["image_size"]), "variant": "base",
                        "seed": 0})
    return out


def rerank_depth(s: Mapping, dataset: str) -> int:
    """ITM re-ranking depth of the retrieval test set ``dataset`` (``coco`` or ``flickr30k``): appendix A follows
    BLIP's standard procedure, which re-ranks the ITC top 256 on COCO and the top 128 on Flickr30K."""
    k = s["retrieval"]["rerank_k"]
    return int(k[dataset]) if isinstance(k, Mapping) else int(k)


def lambda_of(s: Mapping, task: str, variant: str) -> float:
    """λ of Eq. 3 for a run: the task's ``train.lam`` (``cvld_lam<λ>`` for Figure 4's sweep); 0 for the
    baselines and ``neg_only`` (Table 3: "no additional loss (λ = 0)")."""
    if variant.startswith("cvld_lam"):
        return float(variant[len("cvld_lam"):])
    if variant in ("cvld", "hard_label", "itc", "itm"):
        return float(s[task]["train"]["lam"])
    return 0.0
