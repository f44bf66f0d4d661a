"""Model registry: role -> (library loader, id or path).

Every role in ``config['models']`` names a hub id (``roberta-base``) or a local folder
(``resources/models/tiny/mlm``). Loading always goes through the library's real loader
(``from_pretrained(path_or_id)``, ``open_clip.create_model_and_transforms``, ``SentenceTransformer``),
never ``trust_remote_code``; transformers and diffusers prefer ``.safetensors`` weights.
A missing or unloadable model raises one :class:`ModelLoadError` naming the role, what was tried
and how to fix it. Each load is recorded for provenance (:func:`loaded_models`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, ModelLoadError

log = logging.getLogger(__name__)

#: default loader library of each role (a config entry may override with ``library:``)
DEFAULT_LIBRARY = {
    "mlm": "transformers",
    "lm": "transformers",
    "sentence": "sentence_transformers",
    "sd": "diffusers",
    "sd_inpaint": "diffusers",
    "gligen": "diffusers",
    "clip_filter": "transformers",
    "clip_eval": "transformers",
    "clip_train": "transformers",
    "itm": "transformers",
    "nsfw": "diffusers",
    "inpaint": "lama_cleaner",
    "editor": "diffusers",
    "llm": "transformers",
    "captioner": "transformers",
    "itm_bridgetower": "transformers",
    "itm_flava": "transformers",
    "itm_vilt": "transformers",
    "itm_blip": "transformers",
    "clip_open_clip": "open_clip",
}


@dataclass(frozen=True)
class ModelSpec:
    role: str
    source: str
    library: str
    revision: str | None = None
    pretrained: str | None = None

    @property
    def is_local(self) -> bool:
        """A source is a local folder if it exists on disk or is written like a path."""
        s = self.source
        if s.startswith("local-dir:"):
            return True
        return Path(s).exists() or s.startswith(("/", "./", "../", "~")) or s.startswith("resources/")

    @property
    def local_path(self) -> Path:
        return Path(os.path.expanduser(self.source.removeprefix("local-dir:")))


@dataclass
class LoadedModel:
    role: str
    source: str
    library: str
    revision: str | None
    resolved: str | None = None
    fingerprint: str | None = None
    classes: list[str] = field(default_factory=list)


_LOADED: dict[str, LoadedModel] = {}
_LOADERS: dict[str, Callable[[ModelSpec, dict], Any]] = {}


def model_spec(cfg: dict, role: str) -> ModelSpec:
    """The :class:`ModelSpec` of ``role`` from a validated config."""
    models = cfg.get("models", {})
    if role not in models:
        raise ConfigError(
            f"models.{role} is not configured. Fix: add `{role}: {{source: <hub id or local folder>}}` "
            f"under `models:` in your config"
        )
    entry = models[role]
    if isinstance(entry, str):
        entry = {"source": entry}
    return ModelSpec(
        role=role,
        source=entry["source"],
        library=entry.get("library") or DEFAULT_LIBRARY.get(role, "transformers"),
        revision=entry.get("revision"),
        pretrained=entry.get("pretrained"),
    )


def register_loader(kind: str):
    """Decorator: register the loader for ``kind`` (``"<role>"`` or ``"<role>:<library>"``)."""

    def deco(fn):
        _LOADERS[kind] = fn
        return fn

    return deco


def load(cfg: dict, role: str, **kwargs) -> Any:
    """Load the model of ``role`` with its library's loader; raise :class:`ModelLoadError` on failure."""
    spec = model_spec(cfg, role)
    loader = _LOADERS.get(f"{role}:{spec.library}") or _LOADERS.get(role)
    if loader is None:
        raise ConfigError(
            f"models.{role}: no loader for library {spec.library!r}. "
            f"Fix: use one of the libraries this role supports"
        )
    if spec.is_local and not spec.local_path.exists():
        raise ModelLoadError(
            f"role '{role}': local model folder {spec.local_path} does not exist. Fix: for the offline demo "
            f"build the tiny models (`snakemake --configfile config/demo.yaml tiny_models` or "
            f"`counterfactory models build-tiny --config config/demo.yaml`); otherwise point "
            f"models.{role}.source at a downloaded model folder or a hub id"
        )
    try:
        obj = loader(spec, kwargs)
    except ModelLoadError:
        raise
    except Exception as exc:  # library errors vary (OSError, ValueError, HF hub errors ...)
        raise ModelLoadError(_load_failure_message(spec, exc)) from exc
    _record(spec, obj)
    return obj


def _load_failure_message(spec: ModelSpec, exc: Exception) -> str:
    tried = f"local folder {spec.local_path}" if spec.is_local else f"hub id {spec.source!r}"
    if spec.revision:
        tried += f" at revision {spec.revision}"
    offline = os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True")
    if spec.is_local:
        fix = (
            f"check that {spec.local_path} was saved with the {spec.library} library's save_pretrained / "
            f"export for this role, or rebuild it"
        )
    elif offline:
        fix = (
            f"HF_HUB_OFFLINE is set and {spec.source!r} is not in the local cache: on a connected machine run "
            f"`hf download {spec.source}` (fills the cache), or download the model folder and set "
            f"models.{spec.role}.source to its path"
        )
    else:
        fix = (
            f"check the id, or download the model and set models.{spec.role}.source to its local folder; "
            f"on machines without network set HF_HUB_OFFLINE=1 and pre-fill the cache"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"role '{spec.role}' ({spec.library}): could not load {tried}: {first}. Fix: {fix}"


def _fingerprint(path: Path) -> str | None:
    """Short sha256 over the names and sizes of the files in a local model folder (cheap, stable)."""
    if not path.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)}:{f.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def _record(spec: ModelSpec, obj: Any) -> None:
    objs = obj if isinstance(obj, tuple) else (obj,)
    revision = spec.revision
    for o in objs:
        commit = getattr(getattr(o, "config", None), "_commit_hash", None)
        if commit:
            revision = commit
            break
    entry = LoadedModel(
        role=spec.role,
        source=spec.source,
        library=spec.library,
        revision=revision,
        resolved=str(spec.local_path.resolve()) if spec.is_local else None,
        fingerprint=_fingerprint(spec.local_path) if spec.is_local else None,
        classes=[type(o).__name__ for o in objs],
    )
    _LOADED[spec.role] = entry


def loaded_models() -> dict[str, dict]:
    """Every role loaded in this process with its source, revision and resolved path."""
    return {role: asdict(m) for role, m in sorted(_LOADED.items())}


def configured_models(cfg: dict) -> dict[str, dict]:
    """Each configured role's source/revision (and fingerprint when local) without loading it."""
    out = {}
    for role in sorted(cfg.get("models", {})):
        spec = model_spec(cfg, role)
        out[role] = {
            "source": spec.source,
            "library": spec.library,
            "revision": spec.revision,
            "local": spec.is_local,
            "fingerprint": _fingerprint(spec.local_path) if spec.is_local else None,
        }
    return out


def _hf_kwargs(spec: ModelSpec) -> dict:
    kw: dict[str, Any] = {}
    if spec.revision and not spec.is_local:
        kw["revision"] = spec.revision
    return kw


def _src(spec: ModelSpec) -> str:
    return str(spec.local_path) if spec.is_local else spec.source


# --------------------------------------------------------------------------- loaders

@register_loader("mlm")
def _load_mlm(spec: ModelSpec, kw: dict):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_src(spec), **_hf_kwargs(spec))
    model = AutoModelForMaskedLM.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), tok


@register_loader("lm")
def _load_lm(spec: ModelSpec, kw: dict):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_src(spec), **_hf_kwargs(spec))
    model = AutoModelForCausalLM.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), tok


@register_loader("sentence")
def _load_sentence(spec: ModelSpec, kw: dict):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(_src(spec), device=kw.get("device", "cpu"), revision=spec.revision)


def _load_hf_clip(spec: ModelSpec, kw: dict):
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(_src(spec), **_hf_kwargs(spec))
    processor = CLIPProcessor.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), processor


def _load_open_clip(spec: ModelSpec, kw: dict):
    import open_clip

    name = spec.source
    if spec.is_local and not name.startswith("local-dir:"):
        name = f"local-dir:{spec.local_path}"
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=spec.pretrained)
    tokenizer = open_clip.get_tokenizer(name)
    return model.eval(), preprocess, tokenizer


for _role in ("clip_filter", "clip_eval", "clip_train"):
    register_loader(f"{_role}:transformers")(_load_hf_clip)
    register_loader(f"{_role}:open_clip")(_load_open_clip)


@register_loader("sd")
def _load_sd(spec: ModelSpec, kw: dict):
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_pretrained(
        _src(spec), safety_checker=None, requires_safety_checker=False, **_hf_kwargs(spec)
    )


# loaders of the evaluation roles (ITM families, open_clip) register themselves on import
from . import loaders_eval  # noqa: E402,F401
