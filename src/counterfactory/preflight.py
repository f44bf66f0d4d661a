"""Preflight: is everything a run needs in place, before the run starts? Nothing is loaded, nothing is written.

:func:`preflight` returns one :class:`Check` per thing a run of the enabled studies needs, each with its full dotted
config key and, when it fails, where to get it:

* **model** — every model role an enabled study uses (:func:`study_roles`) resolves: a complete local folder (its
  ``config.json`` / ``model_index.json`` and weight files), the Hugging Face cache, or (online only) the hub; a tiny
  stand-in of the offline demo that is not built yet counts, since the workflow's ``models_build_tiny`` builds it.
  Its class is what its stage needs (:data:`ROLE_NEEDS`): read from the folder's configuration files (for a hub id
  that is not cached, from the hub's copy of that one file when online), never from the weights.
* **dataset** — every user-provided dataset an enabled study reads is in place in its official layout (the files
  the workflow declares as inputs, :func:`dataset_requirements`).
* **nltk** — the NLTK data the caption stage tags with (``nltk.source: real``: the real punkt and tagger).
* **disk** — the file system holding ``results/`` has the room :func:`counterfactory.planning.plan` estimates.
* **gpu-memory** — with a CUDA device visible, the largest role's weights fit in the memory the fast path may use
  (``performance.memory_fraction``); skipped on CPU. ``batch_size: auto`` sizes batches to what is left.

A check's ``status`` is ``ok``, ``fetch`` (a hub id that is not cached: downloaded on first use; online only),
``build`` (a tiny stand-in the workflow builds), ``skip`` (not applicable) or ``FAIL``; a preflight passes when no
check fails. The Snakefile runs the dataset and model checks once at start-up (:func:`startup`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import catalogue, planning, studies
from .config import SHARED_SECTIONS, study_view
from .data import nltk_data as nd
from .data.karpathy import layout_problem
from .device import resolve_device, total_memory
from .errors import ConfigError, CounterFactoryError
from .models import pins, registry, sources
from .overview import study_roles as named_roles
from .settings import config_value

# what a study's dataset needs are made of lives below the studies (counterfactory.workflow), each study's own in its
# ``studies/<study>/spec.py``; re-exported here by their old names
from .studies.countercurate.spec import CC_BENCHMARK_KEYS  # noqa: F401
from .workflow import Need  # noqa: F401
from .workflow import classification_needs as _classification_needs  # noqa: F401
from .workflow import images_source as _images_source  # noqa: F401
from .workflow import karpathy_needs as _karpathy  # noqa: F401

OK, FETCH, BUILD, SKIP, FAIL = "ok", "fetch", "build", "skip", "FAIL"
PASSING = (OK, FETCH, BUILD, SKIP)
#: files that hold weights (any one is enough for a folder to count as complete)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5", ".gguf", ".onnx")


@dataclass
class Check:
    """One line of the preflight table."""

    check: str      # model | model-class | dataset | nltk | disk | gpu-memory
    key: str        # the full dotted config key (or what the check is about)
    status: str     # ok | fetch | build | skip | FAIL
    detail: str = ""
    fix: str = ""
    path: str = ""  # the file or folder a dataset check is about (grouping, the download script)

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    def as_dict(self) -> dict:
        return asdict(self)


def passed(checks: Iterable[Check]) -> bool:
    """True when no check failed."""
    return all(c.passed for c in checks)


# --------------------------------------------------------------------------- model roles: which, and what class




def study_roles(cfg: dict, study: str) -> list[str]:
    """The configured model roles ``study`` uses: its stages' roles, the roles its section names, implicit ones."""
    configured = set(cfg.get("models") or {})
    view = study_view(cfg, study)
    section = {k: v for k, v in dict(view).items() if k not in SHARED_SECTIONS}   # the study's own keys
    found = studies.find(study)   # roles it uses without naming them in its section (StudySpec.roles)
    roles = set(named_roles(study, section, configured)) | set(found.roles if found else ())
    return sorted(roles & configured)


def _pipeline(classes: set[str], unet_in: int | None, what: str) -> dict:
    return {"kind": "pipeline", "classes": classes, "unet_in": unet_in, "what": what}


def _arch(suffixes: tuple[str, ...], what: str) -> dict:
    return {"kind": "transformers", "architectures": suffixes, "what": what}


def _model_type(types: tuple[str, ...], what: str) -> dict:
    return {"kind": "transformers", "model_types": types, "what": what}


#: what each role's stage needs, read from the folder's configuration (see the loaders in counterfactory.models)
ROLE_NEEDS: dict[str, dict] = {
    "sd": _pipeline({"StableDiffusionPipeline"}, 4, "a Stable Diffusion 1.x/2.x text-to-image pipeline"),
    "t2i": _pipeline({"StableDiffusionXLPipeline", "StableDiffusionPipeline"}, 4,
                     "an SDXL (paper: SDXL base) or SD 1.x/2.x text-to-image pipeline"),
    "editor": _pipeline({"StableDiffusionInstructPix2PixPipeline"}, 8,
                        "an InstructPix2Pix pipeline (8-channel UNet: latents + image)"),
    "gligen": _pipeline({"StableDiffusionGLIGENPipeline"}, 4, "a GLIGEN text-box generation pipeline (4-channel UNet)"),
    "gligen_inpaint": _pipeline({"StableDiffusionGLIGENPipeline"}, 9,
                                "a GLIGEN inpainting pipeline (9-channel UNet: latents + mask + masked image)"),
    "sd_inpaint": _pipeline({"StableDiffusionInpaintPipeline"}, 9, "a Stable Diffusion inpainting pipeline (9-channel "
                                                                   "UNet)"),
    "vae": {"kind": "diffusers-model", "classes": {"AutoencoderKL"}, "what": "a diffusers AutoencoderKL"},
    "clip_filter": _model_type(("clip",), "a CLIP model (CLIPModel)"),
    "clip_eval": _model_type(("clip",), "a CLIP model (CLIPModel)"),
    "clip_train": _model_type(("clip",), "a CLIP model (CLIPModel)"),
    "itm": _model_type(("bridgetower", "flava", "vilt", "blip", "clip"), "an image-text matching model"),
    "itm_bridgetower": _model_type(("bridgetower",), "a BridgeTower model"),
    "itm_flava": _model_type(("flava",), "a FLAVA model"),
    "itm_vilt": _model_type(("vilt",), "a ViLT retrieval model"),
    "itm_blip": _model_type(("blip",), "a BLIP image-text retrieval model (BlipForImageTextRetrieval)"),
    "captioner": _arch(("ForConditionalGeneration", "ImageTextToText"), "an image captioning model (paper: BLIP)"),
    "captioner_pretrained": _arch(("ForConditionalGeneration", "ImageTextToText"),
                                  "a pre-trained image captioning model (CVLD: BLIP^PT, converted)"),
    "nsfw": _arch(("ForImageClassification",), "an image classifier (paper: a ViT NSFW classifier)"),
    "image_encoder": _model_type(("swin", "swinv2"), "a Swin image encoder"),
    "lic_bert": _model_type(("bert",), "a BERT model (CVLD LIC, Hirota et al.: bert-base-uncased)"),
    "mlm": _arch(("ForMaskedLM",), "a masked language model (paper: RoBERTa-base)"),
    "lm": _arch(("ForCausalLM", "LMHeadModel"), "a causal language model (paper: GPT-2 large)"),
    "llm": _arch(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"), "a causal chat language model"),
    "vlm": _model_type(("llava",), "a LLaVA model (LlavaForConditionalGeneration)"),
}


def _read_json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _has_weights(folder: Path) -> bool:
    return any(p.suffix in WEIGHT_SUFFIXES for p in folder.rglob("*") if p.is_file())


def class_problem(role: str, library: str, files: Callable[[str], dict | None], where: str) -> str | None:
    """Why the model whose configuration files ``files(name)`` returns (parsed JSON, or None when absent) does not
    fit ``role``'s stage; None when it does (or when nothing is known about the role)."""
    need = ROLE_NEEDS.get(role)
    if library == "sentence_transformers":
        if files("modules.json") is None and files("config.json") is None:
            return f"{where} has neither modules.json nor config.json: not a sentence-transformers model"
        return None
    if need is None or library not in ("transformers", "diffusers"):
        return None
    if need["kind"] == "pipeline":
        index = files("model_index.json")
        if index is None:
            config = files("config.json")
            got = (f"a {config.get('model_type', '?')} model ({', '.join(config.get('architectures') or []) or '?'})"
                   if config else "no model_index.json")
            return f"{where} is {got}, not a diffusers pipeline; the stage needs {need['what']}"
        name = index.get("_class_name")
        if name not in need["classes"]:
            return f"{where} is a {name} pipeline; the stage needs {need['what']}"
        unet = files("unet/config.json")
        if need["unet_in"] is not None and unet is not None and unet.get("in_channels") != need["unet_in"]:
            return (f"{where}: its UNet takes {unet.get('in_channels')} input channels; the stage needs "
                    f"{need['what']}")
        return None
    config = files("config.json")
    if config is None:
        return f"{where} has no config.json; the stage needs {need['what']}"
    if need["kind"] == "diffusers-model":
        got = config.get("_class_name") or config.get("model_type") or "?"
        return None if got in need["classes"] else f"{where} is {got}; the stage needs {need['what']}"
    model_type = config.get("model_type")
    arches = config.get("architectures") or []
    if "model_types" in need and model_type not in need["model_types"]:
        return f"{where} is a {model_type or '?'} model; the stage needs {need['what']}"
    if "architectures" in need and not any(part in a for a in arches for part in need["architectures"]):
        return (f"{where} is a {model_type or '?'} model ({', '.join(arches) or 'no architectures listed'}); the "
                f"stage needs {need['what']}")
    return None


def _folder_files(folder: Path) -> Callable[[str], dict | None]:
    return lambda name: _read_json(folder / name)


def _hub_files(repo: str, revision: str | None) -> Callable[[str], dict | None]:
    """Configuration files of a hub repository, one small download each (never weights); None when absent."""
    from huggingface_hub import hf_hub_download

    def get(name: str) -> dict | None:
        try:
            return _read_json(Path(hf_hub_download(repo, name, revision=revision)))
        except Exception:  # absent file, no network: the hub library raises various types
            return None

    return get


def _hub_reachable(repo: str, revision: str | None) -> str | None:
    """None when the hub answers for ``repo``; else why not (one line)."""
    try:
        from huggingface_hub import model_info

        model_info(repo, revision=revision, timeout=10)
        return None
    except Exception as exc:  # network errors, 404s, gated repositories
        text = str(exc).strip().splitlines()
        return text[0] if text else type(exc).__name__


def _cached_elsewhere(spec) -> str | None:
    """The commits (12 characters each) the local Hugging Face cache holds for a hub role whose pinned revision it
    lacks; None when the repository is not cached at all."""
    cached = pins.cached_repos()
    repo = next((cached[i] for i in pins.candidates(spec) if i in cached), None)
    if repo is None or not repo.commits or pins.resolve_pinned(repo, spec.revision):
        return None
    return ", ".join(c[:12] for c in repo.commits)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def check_role(cfg: dict, role: str, *, online: bool | None = None, quick: bool = False) -> list[Check]:
    """The ``model`` check of ``role`` and, when its files can be read, its ``model-class`` check. ``quick``: leave
    out what needs a heavy import (open_clip's table of pretrained weights, which imports torch)."""
    key = f"models.{role}.source"
    try:
        spec = registry.model_spec(cfg, role)
    except Exception as exc:
        return [Check("model", f"models.{role}", FAIL, str(exc).split(". Fix:")[0], f"add models.{role}")]
    def fix() -> str:   # computed only when needed: an open_clip fix imports open_clip (and torch)
        return sources.how_to_get(spec, cfg)

    online = (not _offline()) if online is None else online and not _offline()
    if spec.library == "lama_cleaner":
        path = spec.local_path
        target = path if path.suffix == ".pt" else path / sources.BIG_LAMA_FILE
        if target.is_file() and target.stat().st_size > 0:
            return [Check("model", key, OK, f"{target}")]
        if sources.is_tiny(spec, cfg):
            return [Check("model", key, BUILD, f"{path}: the workflow's models_build_tiny builds it")]
        return [Check("model", key, FAIL, f"{target} not found", fix())]
    if spec.library == "open_clip":
        if quick and not spec.is_local and not spec.source.startswith("hf-hub:"):
            return [Check("model", key, SKIP, f"open_clip {spec.source} pretrained={spec.pretrained}: not looked up "
                                              "at start-up (`counterfactory preflight` does)")]
        return [_check_open_clip(spec, cfg, online)]
    if spec.is_local:
        folder = spec.local_path
        if not folder.exists():
            if sources.is_tiny(spec, cfg):
                return [Check("model", key, BUILD, f"{folder}: the workflow's models_build_tiny builds it")]
            return [Check("model", key, FAIL, f"local folder {folder} not found", fix())]
        if not folder.is_dir():
            return [Check("model", key, FAIL, f"{folder} is a file, not a model folder", fix())]
        if not (folder / "config.json").is_file() and not (folder / "model_index.json").is_file():
            return [Check("model", key, FAIL, f"{folder} has neither config.json nor model_index.json", fix())]
        if not _has_weights(folder):
            return [Check("model", key, FAIL, f"{folder} holds no weight files ({', '.join(WEIGHT_SUFFIXES[:3])} ...)",
                          fix())]
        out = [Check("model", key, OK, f"local folder {folder}")]
        problem = class_problem(role, spec.library, _folder_files(folder), str(folder))
        return out + [_class_check(role, problem, spec)]
    folder, commit = registry.resolve_hub(spec)
    repo = sources.hub_id(spec)
    if folder is not None:
        out = [Check("model", key, OK, f"{repo} in the Hugging Face cache" + (f" ({commit[:12]})" if commit else ""))]
        problem = class_problem(role, spec.library, _folder_files(folder), repo)
        return out + [_class_check(role, problem, spec)]
    if spec.revision and (elsewhere := _cached_elsewhere(spec)):
        # cached, but not at the pinned commit: the pin is what is missing (`hf download <id> --revision <pin>`)
        detail = (f"{repo} is in the Hugging Face cache at {elsewhere}, not at the pinned revision {spec.revision}")
        if not online:
            if _offline():
                return [Check("model", f"models.{role}.revision", FAIL, f"{detail} and HF_HUB_OFFLINE is set", fix())]
            return [Check("model", f"models.{role}.revision", FETCH, f"{detail}: downloaded on first use (needs the "
                                                                    "network; not checked now)", fix())]
    if not online:
        if _offline():
            pinned = f" at revision {spec.revision}" if spec.revision else ""
            return [Check("model", key, FAIL, f"{repo} is not in the Hugging Face cache{pinned} and HF_HUB_OFFLINE is "
                                              "set", fix())]
        return [Check("model", key, FETCH, f"{repo} is not in the Hugging Face cache: downloaded on first use "
                                           "(needs the network; not checked now)", fix())]
    why = _hub_reachable(repo, spec.revision)
    if why:
        return [Check("model", key, FAIL, f"{repo} is not cached and the hub did not answer: {why}", fix())]
    out = [Check("model", key, FETCH, f"{repo} is not cached: fetched from the hub on first use", fix())]
    problem = class_problem(role, spec.library, _hub_files(repo, spec.revision), repo)
    return out + [_class_check(role, problem, spec)]


def _class_check(role: str, problem: str | None, spec) -> Check:
    need = (ROLE_NEEDS.get(role) or {}).get("what", f"a {spec.library} model")
    if problem is None:
        return Check("model-class", f"models.{role}.source", OK, need)
    return Check("model-class", f"models.{role}.source", FAIL, problem,
                 f"point models.{role}.source at {need}")


def _check_open_clip(spec, cfg: dict, online: bool) -> Check:
    key = f"models.{spec.role}.source"
    fix = sources.how_to_get(spec, cfg)
    if spec.is_local:
        folder = spec.local_path
        if not folder.exists() and sources.is_tiny(spec, cfg):
            return Check("model", key, BUILD, f"{folder}: the workflow's models_build_tiny builds it")
        if not (folder / "open_clip_config.json").is_file() or not _has_weights(folder):
            return Check("model", key, FAIL, f"{folder} is not a complete open_clip folder (open_clip_config.json "
                                             "and weights)", fix)
        return Check("model", key, OK, f"open_clip folder {folder}")
    pretrained = str(spec.pretrained or "")
    if pretrained.endswith((".pt", ".pth", ".bin", ".safetensors")) or os.sep in pretrained:
        # a weights file (a released checkpoint that is not on the hub: NegCLIP, ALIP, LaCLIP, SLIP)
        wkey = f"models.{spec.role}.pretrained"
        if Path(pretrained).is_file():
            return Check("model", wkey, OK, f"{spec.source} with the weights file {pretrained}")
        return Check("model", wkey, FAIL, f"{pretrained}: no such weights file", fix)
    weights = sources.open_clip_weights(spec)
    if weights.get("hf_hub"):
        from huggingface_hub import try_to_load_from_cache

        files = [weights["file"]] if weights["file"] else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        if any(isinstance(try_to_load_from_cache(weights["hf_hub"], f), str) for f in files):
            return Check("model", key, OK, f"{spec.source} pretrained={spec.pretrained}: {weights['hf_hub']} cached")
        status = FAIL if _offline() else FETCH
        return Check("model", key, status, f"{weights['hf_hub']} (open_clip {spec.source} pretrained="
                                           f"{spec.pretrained}) is not in the Hugging Face cache", fix)
    if weights.get("url"):
        return Check("model", key, FETCH if not _offline() else FAIL,
                     f"open_clip downloads {weights['url']} on first use", fix)
    return Check("model", key, FAIL, f"open_clip knows no pretrained={spec.pretrained!r} for {spec.source}", fix)


def model_checks(cfg: dict, *, online: bool | None = None, quick: bool = False) -> list[Check]:
    """The model and model-class checks of every role the enabled studies use (each role once), then the checks of
    what a study's settings ask of a role (:func:`attributes_role_check`)."""
    roles = sorted({r for study in cfg.get("studies") or [] for r in study_roles(cfg, study)})
    out = [c for role in roles for c in check_role(cfg, role, online=online, quick=quick)]
    return out + attributes_role_check(cfg)


def attributes_role_check(cfg: dict) -> list[Check]:
    """CounterCurate §3.4 / app. A: when ``countercurate.attributes.images`` asks for pictures, the answering role
    (``attributes.role``) must be a vision-language checkpoint -- its config.json (local folder or hub cache; no
    weights are loaded) has a ``vision_config``. Nothing is said while the model is not on disk (its model check
    reports that)."""
    if "countercurate" not in (cfg.get("studies") or []) or not isinstance(cfg.get("countercurate"), dict):
        return []

    section = cfg["countercurate"].get("attributes") or {}
    role = config_value(section, "countercurate.attributes.role")
    images = config_value(section, "countercurate.attributes.images")
    key = "countercurate.attributes.role"
    if images == "none":
        return []
    if role not in (cfg.get("models") or {}):
        return [Check("model-class", key, FAIL, f"attributes.role is {role!r}, but models.{role} is not configured",
                      f"add models.{role} (a vision-language chat model, e.g. llava-hf/llava-1.5-7b-hf) or set "
                      "countercurate.attributes.role to a configured vision-language role")]
    spec = registry.model_spec(cfg, role)
    folder = spec.local_path if spec.is_local else registry.resolve_hub(spec)[0]
    config = _read_json(Path(folder) / "config.json") if folder is not None else None
    if config is None:
        return []
    where = f"models.{role} ({spec.source})"
    if config.get("vision_config") is not None:
        return [Check("model-class", key, OK, f"{where} is a vision-language checkpoint (attributes.images: {images})")]
    return [Check("model-class", key, FAIL,
                  f"{where} has no vision_config (a text-only model), but attributes.images is {images!r}: it cannot "
                  "see the photograph and its box-annotated copy GPT-4V saw",
                  "set countercurate.attributes.role to a vision-language role (vlm), or images: none (text only, "
                  "boxes as coordinates in the prompt)")]


# --------------------------------------------------------------------------- datasets

#: where to get each dataset (one line each; the study pages in docs/studies/ say more)
SOURCES = {
    "image_quality": "a folder of reference images (§10.3: ImageNet val, the catalogue's classification/imagenet/val; "
                     "a LAION-2B sample)",
    "coco2017": "MS-COCO 2017 (val2017 images + annotations_trainval2017.zip) from https://cocodataset.org/#download",
    "coco2014": "MS-COCO 2014 (train2014/val2014 images + annotations_trainval2014.zip) from "
                "https://cocodataset.org/#download",
    "karpathy": "the Karpathy splits (dataset_coco.json, dataset_flickr30k.json in caption_datasets.zip) from "
                "https://cs.stanford.edu/people/karpathy/deepimagesent/",
    "flickr30k": "the Flickr30k images (flickr30k-images/) from https://shannon.cs.illinois.edu/DenotationGraph/",
    "flickr30k_entities": "Flickr30k Entities (annotations.zip: Annotations/, Sentences/) from "
                          "https://github.com/BryanPlummer/flickr30k_entities, with the Flickr30k images",
    "cifar10": "CIFAR-10 python version (cifar-10-python.tar.gz) from https://www.cs.toronto.edu/~kriz/cifar.html",
    "cifar100": "CIFAR-100 python version (cifar-100-python.tar.gz) from https://www.cs.toronto.edu/~kriz/cifar.html",
    "food101": "Food-101 (food-101.tar.gz) from https://data.vision.ee.ethz.ch/cvl/datasets_extra/food-101/",
    "caltech101": "Caltech-101 (101_ObjectCategories) from https://data.caltech.edu",
    "caltech256": "Caltech-256 (256_ObjectCategories) from https://data.caltech.edu",
    "imagenet": "the ILSVRC-2012 validation images in class folders and LOC_synset_mapping.txt from "
                "https://image-net.org",
    "celeba": "CelebA (img_align_celeba/, list_attr_celeba.txt, list_eval_partition.txt) from "
              "https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html",
    "fairface": "FairFace (padding 1.25: val/ and fairface_label_val.csv) from https://github.com/joojs/fairface",
    "sugarcrepe": "SugarCrepe's JSON files from https://github.com/RAIVNLab/sugar-crepe, with the COCO val2017 images",
    "winoground": "Winoground (examples.jsonl, images/) from https://huggingface.co/datasets/facebook/winoground",
    "looktwice": "the LookTwice-QA release (Mani et al., arXiv:2011.13681) with its Visual Genome images",
    "pata": "the PATA release (DeAR, CVPR 2023): pata_fairness.files.lst, captions JSON and the images of its URL list",
    "visogender": "the VisoGender release (OO/OP TSVs and the images of their URLs)",
    "own": "your own data (docs/own-data.md; `counterfactory data own-check --config <config>` lists its problems)",
    "release": "the published release (docs/own-data.md)",
}


def __getattr__(name: str):
    """Names derived from the study specs (``counterfactory.studies.specs()``): ``STUDY_DATA`` (study -> its dataset
    needs), ``_IMPLICIT_ROLES`` (study -> roles it uses without naming them), ``_DOCS`` (study -> its page)."""
    if name == "STUDY_DATA":
        return {s.name: s.needs for s in studies.specs()}
    if name == "_IMPLICIT_ROLES":
        return {s.name: s.roles for s in studies.specs() if s.roles}
    if name == "_DOCS":
        return _docs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _docs() -> dict[str, str]:
    return {s.name: s.docs_page for s in studies.specs()}


def dataset_requirements(cfg: dict) -> list[Need]:
    """Every user-provided dataset file or folder the enabled studies read (the workflow's input files)."""
    out = []
    for study in cfg.get("studies") or []:
        out += studies.spec(study).needs(study, study_view(cfg, study))
    return out


def _fix(need: Need, study: str) -> str:
    where = SOURCES.get(need.source, "")
    doc = _docs().get(study, "docs/")
    return (f"get {where}; put it at the path or set {need.key}" if where else f"set {need.key}") + f" ({doc})"


def dataset_checks(cfg: dict) -> list[Check]:
    """One ``dataset`` check per requirement (each path once per key)."""
    out, seen = [], set()
    for need in dataset_requirements(cfg):
        if (need.key, need.path) in seen:
            continue
        seen.add((need.key, need.path))
        study = need.key.split(".", 1)[0]
        if need.problem:
            out.append(Check("dataset", need.key, FAIL, need.problem, _fix(need, study), need.path or ""))
            continue
        if not need.path:
            out.append(Check("dataset", need.key, FAIL, "not set", _fix(need, study)))
            continue
        path = Path(need.path)
        if not path.exists():
            out.append(Check("dataset", need.key, FAIL, f"{path} not found", _fix(need, study), str(path)))
            continue
        missing = [name for name in need.inside if not (path / name.rstrip("/")).exists()
                   or (name.endswith("/") and not (path / name.rstrip("/")).is_dir())]
        if missing:
            out.append(Check("dataset", need.key, FAIL, f"{path} lacks {', '.join(missing)} (official layout)",
                             _fix(need, study), str(path)))
            continue
        if need.image_root:   # a Karpathy file: are its images where the rules will open them?

            problem = layout_problem(path, need.image_root, need.splits or None)
            if problem:
                image_key = need.key.rsplit(".", 1)[0] + ".image_root"
                out.append(Check("dataset", image_key, FAIL, problem,
                                 f"point {image_key} (or the catalogue's data.<dataset>.root) at the folder holding "
                                 f"the split file's folders ({_docs().get(study, 'docs/')}, docs/data.md)",
                                 str(need.image_root)))
                continue
        out.append(Check("dataset", need.key, OK, str(path), "", str(path)))
    return out


# --------------------------------------------------------------------------- NLTK, disk, GPU memory


def nltk_check(cfg: dict) -> Check:
    """The real NLTK data (``nltk.source: real``) is findable; the offline build is made by the workflow."""
    source = nd.nltk_source(cfg)
    if source == "offline":
        return Check("nltk", "nltk.source", BUILD, "offline: the workflow's nltk_prepare builds the home-made tagger")
    data_dir = (cfg.get("nltk") or {}).get("data_dir")
    if data_dir and Path(data_dir).is_dir():
        info = nd.describe_nltk_data(data_dir, source=source)
        if not info["missing"] and info["mode"] != "offline":
            return Check("nltk", "nltk.data_dir", OK, f"{data_dir} ({info['mode']})")
    try:
        found = nd.find_real_nltk_data()
    except nd.NltkDataMissing as exc:
        return Check("nltk", "nltk.source", FAIL, "the real punkt_tab / averaged_perceptron_tagger_eng are not found",
                     str(exc).split("Fix: ", 1)[-1])
    return Check("nltk", "nltk.source", OK, "real NLTK data: " + ", ".join(str(p) for p in found.values()))


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 1e3:,.1f} kB"


def disk_check(cfg: dict, results_root: str | Path = ".", throughput=None) -> Check:
    """Free space on the file system of ``results/<run_name>`` against the plan's disk estimate."""
    where = Path(results_root) / "results" / str(cfg.get("run_name", "paper"))
    try:
        frame = planning.plan(cfg, throughput, results_root=results_root)
    except Exception as exc:   # an estimate that cannot be made is not a failed run
        return Check("disk", "run_name", SKIP, f"no estimate: {str(exc).splitlines()[0]}")
    need = float(frame["disk_bytes"].dropna().sum())
    free = shutil.disk_usage(_existing(where)).free
    detail = f"{where}: {_bytes(free)} free, the plan estimates {_bytes(need)} of images (`counterfactory plan`)"
    if free >= need:
        return Check("disk", "run_name", OK, detail)
    return Check("disk", "run_name", FAIL, detail,
                 f"free {_bytes(need - free)} on that file system, or run from a folder on a larger one")


def _weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def gpu_memory_check(cfg: dict) -> Check:
    """With a CUDA device visible: the largest local or cached role's weights fit in ``performance.memory_fraction``
    of its memory (``batch_size: auto`` then sizes batches to the rest); skipped on CPU."""
    try:
        found = total_memory(resolve_device(str(cfg.get("device") or "auto")))
    except ConfigError as err:
        return Check("gpu-memory", "device", FAIL, str(err), "set device to auto, cpu, cuda or hpu")
    if found is None:
        return Check("gpu-memory", "device", SKIP, "no accelerator whose memory can be read (CPU): nothing to size")

    fraction = float((cfg.get("performance") or {}).get("memory_fraction") or 0.8)
    total, device_name = found
    sizes = {}
    for role in sorted({r for s in cfg.get("studies") or [] for r in study_roles(cfg, s)}):
        spec = registry.model_spec(cfg, role)
        folder = spec.local_path if spec.is_local else registry.resolve_hub(spec)[0]
        if folder is not None and Path(folder).is_dir():
            sizes[role] = _weights_bytes(Path(folder))
    if not sizes:
        return Check("gpu-memory", "performance.memory_fraction", SKIP, "no role's weights are on disk yet")
    role, size = max(sizes.items(), key=lambda kv: kv[1])
    detail = (f"{device_name}: {_bytes(total)}; largest role {role}: {_bytes(size)} of weights "
              f"(stored precision), {fraction:.0%} usable")
    if size <= total * fraction:
        return Check("gpu-memory", "performance.memory_fraction", OK, detail)
    return Check("gpu-memory", f"models.{role}", FAIL, detail,
                 "use a device with more memory, a half-precision checkpoint, or raise performance.memory_fraction")


# --------------------------------------------------------------------------- all of it


def preflight(cfg: dict, *, online: bool | None = None, results_root: str | Path = ".", throughput=None,
              parts: Iterable[str] = ("dataset", "model", "nltk", "disk", "gpu-memory"), quick: bool = False
              ) -> list[Check]:
    """Every check of a validated full configuration (module docstring), datasets first."""
    parts = set(parts)
    out: list[Check] = []
    if "dataset" in parts:
        out += dataset_checks(cfg)
    if "model" in parts:
        out += model_checks(cfg, online=online, quick=quick)
    if "nltk" in parts:
        out.append(nltk_check(cfg))
    if "disk" in parts:
        out.append(disk_check(cfg, results_root, throughput))
    if "gpu-memory" in parts:
        out.append(gpu_memory_check(cfg))
    return out


def only_studies(cfg: dict, names: Iterable[str]) -> dict:
    """``cfg`` (changed in place) with ``studies:`` narrowed to ``names``, each one of the config's studies (another
    is a :class:`ConfigError` naming them)."""
    names = list(names)
    unknown = [s for s in names if s not in cfg["studies"]]
    if unknown:
        raise ConfigError(f"--study {', '.join(unknown)}: not among the config's studies "
                          f"({', '.join(cfg['studies'])}). Fix: name one of those")
    cfg["studies"] = names
    return cfg


def report_json(checks: list[Check], config_paths: Iterable) -> str:
    """The checks as a JSON document (the configuration files, whether the preflight passed, every check)."""
    doc = {"config": [str(c) for c in config_paths], "passed": passed(checks), "checks": [c.as_dict() for c in checks]}
    return json.dumps(doc, indent=2) + "\n"


def to_table(checks: list[Check], *, only_problems: bool = False) -> str:
    """The checks as one aligned text table: check, key, status, detail / fix."""
    rows = [c for c in checks if not only_problems or not c.passed]
    head = ("check", "key", "status", "detail / fix")
    body = [(c.check, c.key, c.status, c.detail + (f" — fix: {c.fix}" if c.fix and not c.passed else ""))
            for c in rows]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(3)]

    def line(row) -> str:
        return "  ".join(str(v).ljust(widths[i]) for i, v in enumerate(row[:3])) + "  " + row[3]

    return "\n".join([line(head), line(tuple("-" * w for w in widths) + ("-" * 12,)), *map(line, body)])


def summary(checks: list[Check]) -> str:
    failed = [c for c in checks if not c.passed]
    if not failed:
        return f"preflight: all {len(checks)} checks passed"
    kinds: dict[str, int] = {}
    for c in failed:
        kind = "model" if c.check.startswith("model") else c.check
        kinds[kind] = kinds.get(kind, 0) + 1
    return (f"preflight: {len(checks)} checks, {len(failed)} failed ("
            + ", ".join(f"{n} {k}" for k, n in kinds.items()) + ")")


def _wrap(text: str, indent: str, width: int = 110) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False, break_long_words=False) or [indent]


def _dataset_block(cfg: dict | None, name: str, items: list[tuple], shown: set | None = None) -> list[str]:
    """One catalogue dataset of one study: a missing folder is one line with its source; otherwise each file that
    is missing or wrong, with the config keys that name it; the source once."""
    known = cfg is not None and name in catalogue.DATASETS
    failed = [it for it in items if it[0] == FAIL]
    if not known:
        lines = ["  other data"]
        for status, detail, fix, keys in items:
            lines += _wrap(f"{status:<5} {detail}", "    ")
            lines += _wrap("key: " + ", ".join(keys), "          ")
            if fix and status == FAIL:
                lines += _wrap(f"fix: {fix}", "          ")
        return lines
    d = catalogue.DATASETS[name]
    root = catalogue.dataset_root(cfg, name)
    keys = [k for it in failed for k in it[3]]
    if failed and not Path(root).exists():
        if shown is not None and name in shown:
            return _wrap(f"FAIL  data.{name}: {root}/ does not exist (above); read through: "
                         + ", ".join(dict.fromkeys(keys)), "  ")
        if shown is not None:
            shown.add(name)
        lines = _wrap(f"FAIL  data.{name}: {root}/ does not exist ({d.title}, {d.size})", "  ")
        lines += _wrap("get: " + d.source + f"; licence: {d.licence}; layout: docs/data.md", "        ")
        lines += _wrap("read through: " + ", ".join(dict.fromkeys(keys)), "        ")
        return lines
    status = FAIL if failed else OK
    lines = [f"  {status:<5} data.{name} ({root})"]
    for st, detail, fix, item_keys in items:
        if st == OK:
            continue
        lines += _wrap(f"{st:<5} {detail}", "    ")
        lines += _wrap("key: " + ", ".join(item_keys), "          ")
    if failed:
        lines += _wrap("get: " + d.source + f"; licence: {d.licence}; layout: docs/data.md", "        ")
    return lines


def render(checks: list[Check], cfg: dict | None = None, *, only_problems: bool = False) -> str:
    """The checks for a person: the summary first, then one block per study (its datasets, each path once with
    every config key that names it, grouped by catalogue dataset), the model roles, then NLTK / disk / GPU; short
    lines, each failure with its fix."""
    rows = [c for c in checks if not only_problems or not c.passed]
    lines = [summary(checks)]
    shown: set[str] = set()
    docs = _docs()
    blocks: dict[str, list[Check]] = {}
    for c in rows:
        if c.check == "dataset":
            group = c.key.split(".", 1)[0]
        elif c.check.startswith("model"):
            group = "model roles (shared by the studies)"
        else:
            group = "NLTK data, disk, accelerator"
        blocks.setdefault(group, []).append(c)
    for group, members in blocks.items():
        lines += ["", group]
        if group in docs:
            merged: dict[tuple, list[str]] = {}
            for c in members:
                merged.setdefault((c.status, c.detail, c.fix, c.path), []).append(c.key)
            by_dataset: dict[str, list[tuple]] = {}
            for (status, detail, fix, path), keys in merged.items():
                name = (catalogue.owner(cfg, path) if cfg is not None and path else None) or "other"
                by_dataset.setdefault(name, []).append((status, detail, fix, keys))
            for name, items in by_dataset.items():
                lines += _dataset_block(cfg, name, items, shown)
        else:
            for c in members:
                lines += _wrap(f"{c.status:<5} {c.key}: {c.detail}", "  ")
                if c.fix and not c.passed:
                    lines += _wrap(f"fix: {c.fix}", "        ")
    return "\n".join(lines)


def download_script(checks: list[Check], cfg: dict) -> str:
    """A shell script that makes the folders of every missing dataset and model file and says, per dataset, where to
    get it (source, size, licence from the catalogue); hub roles that are not cached get their `hf download` line
    with the pinned revision. Nothing is downloaded by writing it; the user reads and runs it."""
    import shlex

    failed = [c for c in checks if not c.passed]
    out = ["#!/usr/bin/env bash", "# Written by `counterfactory preflight --script`: what is still missing for this "
           "configuration.", "# Datasets need an account or a licence agreement: each block says where to get it; "
           "hub models download with `hf`.", "set -euo pipefail", ""]
    seen: set[str] = set()
    for name, d in catalogue.DATASETS.items():
        missing = [c for c in failed if c.check == "dataset" and c.path
                   and catalogue.owner(cfg, c.path) == name]
        if not missing:
            continue
        root = catalogue.dataset_root(cfg, name)
        out += [f"# --- data.{name}: {d.title} ({d.size}; licence: {d.licence})", f"# source: {d.source}",
                f"mkdir -p {shlex.quote(root)}"]
        for c in missing:
            if c.path not in seen:
                seen.add(c.path)
                out.append(f"# missing: {c.path}  ({c.key})")
        out.append("")
    others = [c for c in failed if c.check == "dataset" and c.path not in seen]
    for c in others:
        out += [f"# {c.key}: {c.detail}", f"# fix: {c.fix}", ""]
    for c in failed:
        if c.check.startswith("model"):
            command = c.fix[c.fix.find("`") + 1:c.fix.find("`", c.fix.find("`") + 1)] if "`" in c.fix else ""
            out.append(f"# {c.key}: {c.detail}")
            out.append(command if command.startswith(("hf ", "counterfactory ", "mkdir ", "wget ", "curl "))
                       else f"# fix: {c.fix}")
            out.append("")
    return "\n".join(out) + "\n"


def startup(cfg: dict) -> tuple[list[Check], str | None]:
    """The Snakefile's start-up check: datasets and models of the enabled studies, offline (the hub is not asked).

    Returns ``(checks, message)``: ``message`` is None when nothing failed, else one text naming every failed check
    with its full config key and fix (the table), to stop the run with before any job."""
    checks = preflight(cfg, online=False, parts=("dataset", "model"), quick=True)
    failed = [c for c in checks if not c.passed]
    if not failed:
        return checks, None
    datasets = sum(c.check == "dataset" for c in failed)
    models = len(failed) - datasets
    message = (f"{len(failed)} problem(s) before the run can start ({datasets} dataset(s), {models} model "
               f"role(s)); each with its config key and where to get it:\n{render(failed, cfg)}\n"
               "Fix: put each in place or change its key (an evaluation dataset can be switched off, "
               "docs/own-data.md); `counterfactory preflight --config <config>` checks again, with disk and NLTK "
               "data; the offline demo runs with `--configfile config/demo.yaml`.")
    return checks, message


class PreflightError(CounterFactoryError):
    """The start-up check found problems: the message lists each with its config key and fix."""


class StartupGate:
    """The Snakefile's start-up check of ``all`` (an input function returning no files): :func:`startup` once per
    process. A failed dataset check stops the planning (the shards follow from the data), dry run or not; a failed
    model check stops a real run before its first job and is only reported (``warn``, once) by a dry run."""

    def __init__(self) -> None:
        self.checks: list[Check] | None = None
        self.message: str | None = None

    def check(self, cfg: dict, dry_run: bool, warn: Callable[[str], Any] = print) -> list[str]:
        if self.checks is None:
            self.checks, self.message = startup(cfg)
            if self.message:
                datasets_ok = passed(c for c in self.checks if c.check == "dataset")
                if not dry_run or not datasets_ok:
                    raise PreflightError(self.message)
                warn(f"{self.message}\n(dry run: planned anyway; a real run stops here)")
        elif self.message and not dry_run:
            raise PreflightError(self.message)
        return []


# --------------------------------------------------------------------------- what the DAG reads = what preflight checks

_CHECKED: dict[int, tuple[dict, frozenset]] = {}


def preflight_paths(cfg: dict) -> frozenset:
    """Every dataset path preflight checks for ``cfg`` (normalised), computed once per config object."""
    hit = _CHECKED.get(id(cfg))
    if hit is None or hit[0] is not cfg:
        paths = frozenset(os.path.normpath(n.path) for n in dataset_requirements(cfg) if n.path)
        hit = _CHECKED[id(cfg)] = (cfg, paths)
    return hit[1]


def check_source_read(cfg: dict, key: str, path: str) -> None:
    """The DAG's input functions call this for every user-provided file they declare: it must be one preflight
    checks (or inside one of its folders), so `counterfactory preflight` and the DAG's own check cannot drift. With
    ``COUNTERFACTORY_DATA_READS=<file>`` each read is also appended there (``key<TAB>path``; the tests compare)."""
    norm = os.path.normpath(str(path))
    checked = preflight_paths(cfg)
    if norm not in checked and not any(norm.startswith(p.rstrip(os.sep) + os.sep) for p in checked):
        raise ConfigError(f"{key}: the workflow reads {path}, which counterfactory.preflight does not check "
                          "(an internal inconsistency). Fix: add it to the study's needs in "
                          "counterfactory/studies/<study>/spec.py")
    log = os.environ.get("COUNTERFACTORY_DATA_READS")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{key}\t{norm}\n")
