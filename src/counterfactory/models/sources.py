"""Where a model role's files come from, for the ``Fix:`` of a role that is missing (``models check``, loading).

Each suggestion fits the role's library and kind (:func:`how_to_get`): a Hugging Face hub id is fetched with
``hf download <id>`` (``sentence-transformers/<id>`` for a bare sentence-transformers name); an open_clip role names
an architecture (``ViT-B-32``) and a ``pretrained`` tag, whose weights open_clip takes from the hub repository of
its pretrained table (``laion/CLIP-ViT-B-32-laion2B-s34B-b79K``) or from a URL; the LaMa role (lama_cleaner) is the
``big-lama.pt`` TorchScript file of lama-cleaner's release, by path; a folder under ``tiny_models.out_dir`` is a
tiny stand-in of the offline demo, built by ``counterfactory models build-tiny``. Nothing here touches the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from . import convert_blip
from .loaders_clip_family import FAMILIES

if TYPE_CHECKING:
    from .base import ModelSpec

#: lama-cleaner's release file of Big LaMa (the default ``LAMA_MODEL_URL`` of ``lama_cleaner.model.lama``)
BIG_LAMA_URL = "https://github.com/Sanster/models/releases/download/add_big_lama/big-lama.pt"
#: its md5, as lama-cleaner checks it (``LAMA_MODEL_MD5``)
BIG_LAMA_MD5 = "e3aa4aaa15225a33ec84f9f4bc47e500"
BIG_LAMA_FILE = "big-lama.pt"
#: where ``models build-tiny`` writes when the config has no ``tiny_models.out_dir``
DEFAULT_TINY_DIR = "resources/models/tiny"


def tiny_dir(cfg: dict | None) -> Path:
    """The folder of the tiny stand-ins: ``tiny_models.out_dir`` of ``cfg``, else the builder's default."""
    # dict.get: a job's partial view need not carry tiny_models (a model error must not become a missing-section one)
    section = dict.get(cfg, "tiny_models") if isinstance(cfg, dict) else None
    return Path(((section or {}).get("out_dir")) or DEFAULT_TINY_DIR)


def is_tiny(spec: ModelSpec, cfg: dict | None = None) -> bool:
    """Whether ``spec`` is a tiny stand-in of the offline demo: a local folder directly under the tiny folder."""
    if not spec.is_local:
        return False
    return spec.local_path.parent == tiny_dir(cfg) or spec.local_path.parent.resolve() == tiny_dir(cfg).resolve()


def _build_tiny(spec: ModelSpec) -> str:
    return (f"build the offline demo's tiny stand-in: `counterfactory models build-tiny --config <config> "
            f"--role {spec.role}` (or `snakemake --configfile config/demo.yaml models_build_tiny`)")


def _big_lama(spec: ModelSpec) -> str:
    path = spec.local_path if spec.is_local else Path("data/models/big-lama")
    folder = path.parent if path.suffix == ".pt" else path
    target = path if path.suffix == ".pt" else path / BIG_LAMA_FILE
    return (f"download Big LaMa, lama-cleaner's release file {BIG_LAMA_URL} (md5 {BIG_LAMA_MD5}): "
            f"`mkdir -p {folder} && curl -L -o {target} {BIG_LAMA_URL}`, and set models.{spec.role}.source to "
            f"the file or its folder")


def open_clip_weights(spec: ModelSpec) -> dict:
    """What open_clip loads for an architecture + ``pretrained`` tag: ``{"hf_hub": repo, "file": name or None}``
    or ``{"url": url}`` from open_clip's pretrained table; ``{}`` when the tag is unknown (or open_clip is not
    installed); ``{"tags": [...]}`` lists the tags open_clip knows for the architecture. Local lookups only."""
    try:
        import open_clip
    except ImportError:  # pragma: no cover - open_clip is a dependency
        return {}
    arch = spec.source.removeprefix("hf-hub:")
    cfg = open_clip.get_pretrained_cfg(arch, spec.pretrained or "") if spec.pretrained else {}
    if cfg.get("hf_hub"):
        # open_clip's form: 'org/name/' (default file names) or 'org/name/file'
        repo, _, file = cfg["hf_hub"].rpartition("/")
        return {"hf_hub": repo, "file": file or None}
    if cfg.get("url"):
        return {"url": cfg["url"]}
    return {"tags": list(open_clip.list_pretrained_tags_by_model(arch))}  # [] for an unknown architecture


def _open_clip(spec: ModelSpec) -> str:
    source = spec.source
    if source.startswith("hf-hub:"):
        return f"fill the Hugging Face cache: `hf download {source.removeprefix('hf-hub:')}`"
    if spec.is_local:
        return (f"put an open_clip model folder (open_clip_config.json and the weights) at {spec.local_path}, or "
                f"set models.{spec.role}.source to an architecture name with models.{spec.role}.pretrained")
    released = _released_checkpoint(spec)
    if released:
        return released
    weights = open_clip_weights(spec)
    if weights.get("hf_hub"):
        files = weights["file"] or "--include 'open_clip_*'"
        return (f"fill the Hugging Face cache with the weights open_clip loads for {source} pretrained="
                f"{spec.pretrained}: `hf download {weights['hf_hub']} {files}`")
    if weights.get("url"):
        return (f"download {weights['url']} (open_clip's weights of {source} pretrained={spec.pretrained}) and set "
                f"models.{spec.role}.pretrained to the file's path")
    known = ", ".join(weights.get("tags", [])[:8])
    return (f"set models.{spec.role}.pretrained to a tag open_clip knows for {source}"
            + (f" ({known}, ...)" if known else "") + " or to a weights file; `open_clip.list_pretrained()` lists "
            "them all")


def _released_checkpoint(spec: ModelSpec) -> str | None:
    """A role whose ``pretrained`` is a released weights file that is not on the hub (NegCLIP, ALIP, LaCLIP, SLIP):
    where the file comes from and where the config expects it."""
    pretrained = str(spec.pretrained or "")
    if not pretrained.endswith((".pt", ".pth", ".bin", ".safetensors")):
        return None

    family = FAMILIES.get(spec.role)
    where = f"the released {family.name} checkpoint ({family.url})" if family else "the released weights file"
    return f"download {where} to {pretrained}, or set models.{spec.role}.pretrained to where it is"


def hub_id(spec: ModelSpec) -> str:
    """The hub repository a non-local role's ``hf download`` fetches."""
    repo = spec.source.removeprefix("hf-hub:")
    if spec.library == "sentence_transformers" and "/" not in repo:
        return f"sentence-transformers/{repo}"
    return repo


def path_like(spec: ModelSpec) -> bool:
    """Whether a source that is not a local folder here is also readable as a relative path (``probe/models/sd``,
    ``models/clip``): written with a ``/`` but without ``./``, ``hf-hub:`` or an open_clip architecture name."""
    source = spec.source
    return (not spec.is_local and "/" in source and not source.startswith("hf-hub:") and "://" not in source
            and not (spec.library == "open_clip" and spec.pretrained))


def could_be_hub_id(spec: ModelSpec) -> bool:
    """Hub repository ids are ``owner/name``: one ``/``, no empty part."""
    parts = spec.source.removeprefix("hf-hub:").split("/")
    return len(parts) <= 2 and all(parts)


def both_readings(spec: ModelSpec, cfg: dict | None = None) -> str:
    """The message for a path-like source found neither as a folder nor in the hub cache: both readings, the
    working directory the relative path was resolved against, and the fix for each."""
    import os

    here = Path(os.getcwd()) / spec.source
    offline = os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True")
    hub = (f"as a hub id, {spec.source!r} is not in the Hugging Face cache"
           + (" (HF_HUB_OFFLINE is set, so nothing is downloaded)" if offline else "") if could_be_hub_id(spec) else
           f"as a hub id, {spec.source!r} is impossible (hub ids are 'owner/name', with one '/')")
    fix = f"if it is a folder, give its path as ./{spec.source} or an absolute path, and make sure it exists"
    if could_be_hub_id(spec):
        revision = f" --revision {spec.revision}" if spec.revision else ""
        fix += (f"; if it is a hub id, fill the Hugging Face cache{' on a connected machine' if offline else ''}: "
                f"`hf download {hub_id(spec)}{revision}`")
    return (f"role '{spec.role}' ({spec.library}): models.{spec.role}.source {spec.source!r} was found neither "
            f"way: as a local folder, {here} does not exist (relative to the working directory {os.getcwd()}); "
            f"{hub}. Fix: {fix}")


def how_to_get(spec: ModelSpec, cfg: dict | None = None) -> str:
    """One instruction (no trailing period) saying how to get ``spec``'s files, right for its library and kind."""
    if spec.library == "lama_cleaner":
        return _build_tiny(spec) if is_tiny(spec, cfg) else _big_lama(spec)
    if is_tiny(spec, cfg):
        return _build_tiny(spec)
    if spec.library == "open_clip":
        return _open_clip(spec)
    if spec.library == "vsepp":   # VSE++ has no hub checkpoint: the release's checkpoint, converted
        from .convert_vsepp import RELEASE_URL

        out = spec.local_path if spec.is_local else f"data/models/{spec.role}"
        data = "f30k" if "f30k" in spec.role or "f30k" in str(out) or "flickr" in str(out) else "coco"
        captions = ((cfg or {}).get("spurious_retrieval") or {}).get("data", {}).get("coco", {}).get("karpathy_json") \
            or "data/coco2014/dataset_coco.json"
        return (f"convert the published VSE++ checkpoint: download {RELEASE_URL}runs.tar and {RELEASE_URL}vocab.tar "
                f"on a machine with network access, then `counterfactory models convert-vsepp --checkpoint "
                f"runs/<a full-image VGG19 {data} run>/model_best.pth.tar --vocab vocab/{data}_vocab.pkl --out {out}` "
                f"(or train from scratch: `counterfactory models build-vsepp --captions {captions} --backbone vgg19 "
                f"--out {out}`; docs/models.md#vse), and set models.{spec.role}.source to {out}")
    if spec.library == "torchvision":   # the inception role: torchvision's weights file, no hub id
        out = spec.local_path if spec.is_local else f"data/models/{spec.role}/inception_v3_google-0cc3c7bd.pth"
        return (f"download torchvision's Inception-v3 ImageNet weights (`curl -L -o {out} "
                "https://download.pytorch.org/models/inception_v3_google-0cc3c7bd.pth`) on a machine with network "
                f"access, and set models.{spec.role}.source to that file (docs/models.md)")
    if spec.is_local and (blip := convert_blip.setup_hint(spec.role, spec.local_path)):
        return blip  # pre-trained BLIP exists only in the original layout: convert it
    if spec.is_local:
        return (f"put the model's files at {spec.local_path} (e.g. `hf download <hub id> --local-dir "
                f"{spec.local_path}`), or set models.{spec.role}.source to a hub id")
    revision = f" --revision {spec.revision}" if spec.revision else ""
    return f"fill the Hugging Face cache: `hf download {hub_id(spec)}{revision}`"
