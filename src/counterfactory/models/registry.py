"""Model registry: role -> (library loader, id or path), and the identity of what each role loads.

Every role in ``config['models']`` names a hub id (``roberta-base``) or a local folder
(``resources/models/tiny/mlm``). Loading always goes through the library's real loader
(``from_pretrained(path_or_id)``, ``open_clip.create_model_and_transforms``, ``SentenceTransformer``),
never ``trust_remote_code``; transformers and diffusers prefer ``.safetensors`` weights.
A missing or unloadable model raises one :class:`ModelLoadError` naming the role, what was tried
and how to fix it. Each load is recorded for provenance (:func:`loaded_models`).
The spec, the loader table (:func:`register_loader`) and the loaders' helpers live in :mod:`.base`, which the
``loaders_*`` modules import; this module imports them, so their loaders register (the imports run one way).

Identity is by content: :func:`fingerprint` of a folder is a sha256 over (relative path, sha256 of
content) of every file in it (``.git``, ``__pycache__``, ``*.lock``, logs and our manifest skipped).
Per-file hashes are cached in ``file_hashes.json`` (``$COUNTERFACTORY_CACHE_DIR``, else
``$XDG_CACHE_HOME/counterfactory``, else ``~/.cache/counterfactory``) keyed by the resolved path
and its size, mtime_ns, ctime_ns and inode, so unchanged multi-GB weights are not re-read.
Hub ids are identified by their hub commit (``config._commit_hash`` or the HF-cache snapshot
folder) and, when they resolve in the local cache, by the fingerprint of the snapshot folder.
Anything that cannot be identified raises :class:`ModelIdentityError` -- never an empty key.

Integrity: folders built by ``counterfactory models build-tiny`` carry ``counterfactory-manifest.json``
(sha256 of every file); :func:`verify_folder` checks them, and checks HF-cache snapshots against
their blob names (LFS blobs are named by their sha256, other blobs by their git blob sha1).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import ConfigError, CounterFactoryError, ModelLoadError
from . import sources
# what the loaders share (the spec, the loader table, their helpers), also reachable as ``registry.<name>``
from .base import (_LOADERS, _WEIGHT_SUFFIXES, HALF_VARIANTS, ModelSpec, _diffusers_dtype,  # noqa: F401
                   _hf_kwargs, _hub_candidates, _load_open_clip, _model_files, _names_variant, _src,
                   _transformers_dtype, diffusers_dtype_key, half_variant, register_loader, resolve_hub)
# the identity API, also reachable as ``registry.<name>`` (provenance and the tests use it)
from .identity import (MANIFEST_NAME, HashCache, cache_dir, content_files,  # noqa: F401
                       file_hashes, fingerprint, hf_snapshot, verify_folder, write_manifest)
# the loader modules register their roles' loaders (in .base's table) on import; they import .base, never this module
from . import loaders_clip_family  # noqa: F401  (alip / laclip / slip: SocialCounterfactuals §4.2 released files)
from . import loaders_editing  # noqa: F401  (CVLD: editor = InstructPix2Pix, image_encoder = Swin)
from . import loaders_eval  # noqa: F401  (the evaluation roles: ITM families, open_clip; the captioner)
from . import loaders_inpaint  # noqa: F401  (inpaint = LaMa through lama-cleaner, object removal)
from . import loaders_llm  # noqa: F401  (the llm role: CounterCurate §3.4 / app. A-B, GPT-4(V) stand-in)
from . import loaders_nsfw  # noqa: F401  (the nsfw role: SocialCounterfactuals §3.4)
from . import loaders_text  # noqa: F401  (lic_bert: CVLD Table 4 LIC, Hirota et al.'s BERT leakage classifier)
from . import loaders_vlm  # noqa: F401  (the vlm role: CounterCurate §3.5, LLaVA-1.5)

log = logging.getLogger(__name__)


class ModelIdentityError(ModelLoadError):
    """A model role (or a file) could not be identified by content: names role, path and fix."""


class ModelIntegrityError(ModelLoadError):
    """A model folder's files do not match its manifest or its HF-cache blob names."""


#: default loader library of each role (a config entry may override with ``library:``)
DEFAULT_LIBRARY = {
    "mlm": "transformers",
    "lm": "transformers",
    "sentence": "sentence_transformers",
    "sd": "diffusers",
    "vae": "diffusers",
    "sd_inpaint": "diffusers",
    "gligen": "diffusers",
    "gligen_inpaint": "diffusers",
    "t2i": "diffusers",
    "vlm": "transformers",
    "clip_filter": "transformers",
    "clip_eval": "transformers",
    "clip_train": "transformers",
    "itm": "transformers",
    "nsfw": "transformers",
    "inpaint": "lama_cleaner",
    "editor": "diffusers",
    "llm": "transformers",
    "captioner": "transformers",
    "itm_bridgetower": "transformers",
    "itm_flava": "transformers",
    "itm_vilt": "transformers",
    "itm_blip": "transformers",
    "itm_blip_coco": "transformers",   # CVLD Table 2's BLIP₃₈₄ row: BLIP's COCO retrieval checkpoint, converted
    "clip_open_clip": "open_clip",
    "negclip": "open_clip",  # CounterCurate Table 3: NegCLIP's released OpenCLIP checkpoint, loaders_clip_family
    "alip": "open_clip",     # SocialCounterfactuals §4.2: released checkpoints, loaders_clip_family
    "laclip": "open_clip",
    "slip": "open_clip",
    "vsepp": "vsepp",        # spurious-correlation retrieval §4.1: VSE++ (our torch module, counterfactory.models.vsepp)
    "vsepp_f30k": "vsepp",   # the same, from the release's Flickr30k checkpoint (spurious_retrieval.training.start_roles)
    "inception": "torchvision",  # SocialCounterfactuals §10.3: FID / IS feature network (counterfactory.models.inception)
    "lic_bert": "transformers",  # CVLD Table 4 LIC: Hirota et al.'s BERT leakage classifier (loaders_text)
}


@dataclass
class LoadedModel:
    role: str
    source: str
    library: str
    revision: str | None
    local: bool = False
    resolved: str | None = None
    fingerprint: str | None = None
    commit: str | None = None
    classes: list[str] = field(default_factory=list)


_LOADED: dict[str, LoadedModel] = {}


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


def load(cfg: dict, role: str, **kwargs) -> Any:
    """Load the model of ``role`` with its library's loader; raise :class:`ModelLoadError` on failure.

    ``kwargs`` reach the loader: ``device`` (sentence-transformers, LaMa, ...), ``head`` (ITM families) and
    ``dtype`` (a torch dtype: the weights are read in it -- diffusers' ``torch_dtype`` / ``dtype``, with the
    half-precision ``variant`` when the model has one (:func:`half_variant`), transformers' ``dtype``); no
    ``dtype`` = fp32."""
    spec = model_spec(cfg, role)
    loader = _LOADERS.get(f"{role}:{spec.library}") or _LOADERS.get(role)
    if loader is None:
        raise ConfigError(
            f"models.{role}: no loader for library {spec.library!r}. "
            f"Fix: use one of the libraries this role supports"
        )
    if spec.is_local and not spec.local_path.exists():
        raise ModelLoadError(
            f"role '{role}' ({spec.library}): local model path {spec.local_path} does not exist. "
            f"Fix: {sources.how_to_get(spec, cfg)}"
        )
    if sources.path_like(spec) and not sources.could_be_hub_id(spec):
        raise ModelLoadError(sources.both_readings(spec, cfg))   # not a folder here, and no hub id has 2 slashes
    with _noting_interrupts() as interrupted:
        try:
            obj = loader(spec, kwargs)
        except ModelLoadError:
            raise
        except Exception as exc:  # library errors vary (OSError, ValueError, HF hub errors ...)
            if interrupted["hit"]:   # Ctrl-C that the library turned into another error: the user stopped it
                raise KeyboardInterrupt from exc
            raise ModelLoadError(_load_failure_message(spec, exc, cfg)) from exc
    _record(spec, obj)
    return obj


@contextlib.contextmanager
def _noting_interrupts():
    """Note a Ctrl-C (SIGINT) during a model load: libraries sometimes catch the ``KeyboardInterrupt`` and raise
    another error (a half-read file, a worker thread's failure), which must end as "interrupted", not as "could not
    load ... rebuild it". The handler in place keeps acting as before; only the main thread installs one."""
    state = {"hit": False}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        state["hit"] = True
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)


def _load_failure_message(spec: ModelSpec, exc: Exception, cfg: dict | None = None) -> str:
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
            f"HF_HUB_OFFLINE is set and {spec.source!r} is not in the local cache: on a connected machine "
            f"{sources.how_to_get(spec, cfg)}, or download the model folder and set models.{spec.role}.source "
            f"to its path"
        )
    else:
        fix = (
            f"check the id; {sources.how_to_get(spec, cfg)}, or download the model and set "
            f"models.{spec.role}.source to its local folder; on machines without network set HF_HUB_OFFLINE=1 and "
            f"pre-fill the cache"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if sources.path_like(spec) and resolve_hub(spec)[0] is None:
        # 'probe/clip' may be a folder given without ./ or a hub id: neither was found, so say both readings
        return f"{sources.both_readings(spec, cfg)} (the loader said: {first})"
    return f"role '{spec.role}' ({spec.library}): could not load {tried}: {first}. Fix: {fix}"


# --------------------------------------------------------------------------- role identity


def _identity_error(spec: ModelSpec, path: Path | str, exc: BaseException) -> ModelIdentityError:
    where = getattr(exc, "filename", None) or path
    if isinstance(exc, FileNotFoundError) and Path(str(path)) == spec.local_path and not spec.local_path.exists():
        fix = f"{sources.how_to_get(spec)}; or point models.{spec.role}.source at an existing model folder or a hub id"
    elif isinstance(exc, PermissionError):
        fix = f"make {where} readable by this user (chmod/chown), or copy the model to a readable folder"
    else:
        fix = f"check that {path} is a complete, readable model folder; rebuild or re-download it"
    what = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
    return ModelIdentityError(
        f"role '{spec.role}': cannot identify the model at {path} by content ({what}: {where}). Fix: {fix}")


def identify(spec: ModelSpec, commit: str | None = None) -> dict:
    """Identity of a role's model without loading it: ``local``, ``resolved`` folder, ``fingerprint``
    (64-hex content sha256) and, for hub ids, ``commit`` (``commit`` argument -- e.g. the loaded
    config's ``_commit_hash`` -- else the cached snapshot's folder name). A hub id that is not in the
    local cache has no fingerprint (the hub commit, when known, identifies it). Raises
    :class:`ModelIdentityError` when a local folder is missing or a file cannot be read."""
    if spec.is_local:
        path = spec.local_path
        try:
            if not path.exists():
                raise FileNotFoundError(2, "No such file or directory", str(path))
            fp = fingerprint(path)
            if path.is_dir() and not content_files(path):
                raise ModelIdentityError(
                    f"role '{spec.role}': model folder {path} holds no files. Fix: rebuild or re-download it")
        except OSError as exc:
            raise _identity_error(spec, path, exc) from exc
        out = {"local": True, "resolved": str(path.resolve()), "fingerprint": fp}
        snap = hf_snapshot(path)
        if snap:
            out["commit"] = commit or snap[1]
        return out
    folder, snapshot_commit = resolve_hub(spec)
    out = {"local": False, "resolved": str(folder) if folder else None, "fingerprint": None,
           "commit": commit or snapshot_commit}
    if folder is not None:
        try:
            out["fingerprint"] = fingerprint(folder)
        except OSError as exc:
            raise _identity_error(spec, folder, exc) from exc
    return out


def _record(spec: ModelSpec, obj: Any) -> None:
    objs = obj if isinstance(obj, tuple) else (obj,)
    commit = None
    for o in objs:
        commit = getattr(getattr(o, "config", None), "_commit_hash", None)
        if commit:
            break
    ident = identify(spec, commit=commit if not spec.is_local or hf_snapshot(spec.local_path) else None)
    _LOADED[spec.role] = LoadedModel(
        role=spec.role,
        source=spec.source,
        library=spec.library,
        revision=spec.revision,
        local=ident["local"],
        resolved=ident["resolved"],
        fingerprint=ident["fingerprint"],
        commit=ident.get("commit"),
        classes=[type(o).__name__ for o in objs],
    )


def loaded_models() -> dict[str, dict]:
    """Every role loaded in this process: source, library, configured revision, local or hub,
    resolved path, content fingerprint (64-hex sha256), hub commit when known, loaded classes."""
    return {role: asdict(m) for role, m in sorted(_LOADED.items())}


def configured_models(cfg: dict, roles: Iterable[str] | None = None) -> dict[str, dict]:
    """Each configured role (or only ``roles``) identified without loading it: ``source``,
    ``library``, ``revision``, ``local``, ``resolved`` path, ``fingerprint`` (64-hex content sha256;
    None only for a hub id that is not in the local cache) and, for hub ids, ``commit`` when known.

    Raises :class:`ModelIdentityError` (a :class:`~counterfactory.errors.CounterFactoryError`)
    naming the role, the path and the fix when a local model is missing or unreadable."""
    wanted = sorted(cfg.get("models", {}) if roles is None else roles)
    out = {}
    for role in wanted:
        spec = model_spec(cfg, role)
        out[role] = {"source": spec.source, "library": spec.library, "revision": spec.revision, **identify(spec)}
    return out


def verify_role(cfg: dict, role: str, *, use_cache: bool = False) -> dict:
    """Integrity check of one role's files (see :func:`verify_folder`) without loading it.

    Returns ``{"role", "folder", "method", "problems", "fix"}``; ``folder`` is None for a hub id that
    is not cached. Raises :class:`ModelIdentityError` when the folder cannot be read."""
    spec = model_spec(cfg, role)
    folder = spec.local_path if spec.is_local else resolve_hub(spec)[0]
    report = {"role": role, "folder": str(folder) if folder else None, "method": None, "problems": [], "fix": None}
    if folder is None or not folder.is_dir():
        return report
    try:
        method, problems = verify_folder(folder, use_cache=use_cache)
    except OSError as exc:
        raise _identity_error(spec, folder, exc) from exc
    report.update(method=method, problems=problems)
    if method == "manifest":
        builder = _manifest_builder(folder)
        report["fix"] = (f"rebuild with `counterfactory models build-tiny --config <config> --role {role} --force`"
                         if builder == TINY_BUILDER else
                         f"rebuild with `counterfactory models build-vsepp --captions <training captions> --out {folder}`"
                         if builder == VSEPP_BUILDER else
                         f"restore {folder} from its source (its manifest no longer matches)")
    elif method == "hf-cache":
        repo = hf_snapshot(folder)
        repo_id = repo[0].removeprefix("models--").replace("--", "/") if repo else spec.source
        report["fix"] = (f"re-download: `hf download {repo_id} --revision {repo[1] if repo else 'main'} "
                         f"--force-download` (or delete {folder.parent.parent} and download again)")
    return report


def check_roles(cfg: dict, roles: Iterable[str], *, use_cache: bool = False,
                emit: Callable[[str], None] = print) -> list[str]:
    """``counterfactory models check``: verify each role's files (:func:`verify_role`: manifest / HF-cache blob
    hashes), then load it; ``emit`` gets one line per role (``ok`` with its source, the check made and its
    fingerprint; ``CORRUPT`` per damaged file and the fix; ``FAILED`` with the error). Returns every failure (an
    empty list when every role is intact and loads)."""
    failures: list[str] = []
    for role in roles:
        source = model_spec(cfg, role).source
        try:
            report = verify_role(cfg, role, use_cache=use_cache)
        except CounterFactoryError as exc:
            emit(f"{role}: FAILED {exc}")
            failures.append(str(exc))
            continue
        if report["problems"]:
            for problem in report["problems"]:
                line = f"role '{role}': {problem['path']}: {problem['problem']}. Fix: {report['fix']}"
                emit(f"{role}: CORRUPT {problem['path']}: {problem['problem']}")
                failures.append(line)
            emit(f"{role}: fix: {report['fix']}")
            continue
        try:
            load(cfg, role)
        except CounterFactoryError as exc:
            emit(f"{role}: FAILED {exc}")
            failures.append(str(exc))
            continue
        info = loaded_models()[role]
        checked = {"manifest": "files match the manifest", "hf-cache": "blobs match their hashes",
                   None: "no manifest"}[report["method"]]
        commit = f", commit {info['commit']}" if info.get("commit") else ""
        emit(f"{role}: ok ({source}; {checked}; fingerprint {info['fingerprint']}{commit})")
    return failures


TINY_BUILDER = "counterfactory.models.tiny"
VSEPP_BUILDER = "counterfactory.models.vsepp"   # a fresh VSE++ folder (vsepp.build)


def _manifest_builder(folder: Path) -> str | None:
    try:
        return json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8")).get("builder")
    except (OSError, ValueError, AttributeError):
        return None


# --------------------------------------------------------------------------- loaders

@register_loader("mlm")
def _load_mlm(spec: ModelSpec, kw: dict):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_src(spec), **_hf_kwargs(spec))
    model = AutoModelForMaskedLM.from_pretrained(_src(spec), **_hf_kwargs(spec), **_transformers_dtype(kw))
    return model.eval(), tok


@register_loader("lm")
def _load_lm(spec: ModelSpec, kw: dict):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_src(spec), **_hf_kwargs(spec))
    model = AutoModelForCausalLM.from_pretrained(_src(spec), **_hf_kwargs(spec), **_transformers_dtype(kw))
    return model.eval(), tok


@register_loader("sentence")
def _load_sentence(spec: ModelSpec, kw: dict):
    from sentence_transformers import SentenceTransformer

    revision = None if spec.is_local else spec.revision   # a revision pins hub ids only (schema: ignored for folders)
    return SentenceTransformer(_src(spec), device=kw.get("device", "cpu"), revision=revision)


def _load_hf_clip(spec: ModelSpec, kw: dict):
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(_src(spec), **_hf_kwargs(spec), **_transformers_dtype(kw))
    processor = CLIPProcessor.from_pretrained(_src(spec), **_hf_kwargs(spec))
    return model.eval(), processor


for _role in ("clip_filter", "clip_eval", "clip_train"):
    register_loader(f"{_role}:transformers")(_load_hf_clip)
    register_loader(f"{_role}:open_clip")(_load_open_clip)


@register_loader("sd")
def _load_sd(spec: ModelSpec, kw: dict):
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_pretrained(
        _src(spec), safety_checker=None, requires_safety_checker=False, **_hf_kwargs(spec),
        **_diffusers_dtype(spec, kw))


@register_loader("vae")
def _load_vae(spec: ModelSpec, kw: dict):
    """``AutoencoderKL`` that decodes the ``sd`` role's latents instead of the pipeline's own VAE
    (the paper config: ``stabilityai/sd-vae-ft-mse``, as InstructPix2Pix's generator)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_pretrained(_src(spec), **_hf_kwargs(spec), **_diffusers_dtype(spec, kw)).eval()


@register_loader("gligen")
@register_loader("gligen_inpaint")
def _load_gligen(spec: ModelSpec, kw: dict):
    """``StableDiffusionGLIGENPipeline``: text-box generation (``gligen``: gligen/gligen-generation-text-box,
    CounterCurate §3.2) or text-box inpainting (``gligen_inpaint``: gligen/gligen-inpainting-text-box, §3.3)."""
    from diffusers import StableDiffusionGLIGENPipeline

    return StableDiffusionGLIGENPipeline.from_pretrained(
        _src(spec), safety_checker=None, requires_safety_checker=False, **_hf_kwargs(spec),
        **_diffusers_dtype(spec, kw))


@register_loader("t2i")
def _load_t2i(spec: ModelSpec, kw: dict):
    """The open text-to-image model in DALLE-3's role (CounterCurate §3.4), through diffusers'
    ``AutoPipelineForText2Image``, which picks the class the folder's ``model_index.json`` names (the paper
    config's SDXL base: ``StableDiffusionXLPipeline``; SD 1.x/2.x: ``StableDiffusionPipeline``, loaded without
    its safety checker like every other SD role)."""
    from diffusers import AutoPipelineForText2Image, DiffusionPipeline

    index = DiffusionPipeline.load_config(_src(spec), **_hf_kwargs(spec))
    extra = {"safety_checker": None, "requires_safety_checker": False} if "safety_checker" in index else {}
    return AutoPipelineForText2Image.from_pretrained(_src(spec), **extra, **_hf_kwargs(spec),
                                                     **_diffusers_dtype(spec, kw))


@register_loader("vsepp")
@register_loader("vsepp_f30k")
def _load_vsepp(spec: ModelSpec, kw: dict):
    """``(VSEPP, VSEPPProcessor)`` from a VSE++ folder (config.json, model.safetensors, vocab.json); VSE++ has no
    hub checkpoint: the folder is converted from the release (``counterfactory models convert-vsepp``), made by
    ``counterfactory models build-vsepp`` or by training."""
    from .vsepp import load as load_vsepp

    if not spec.is_local:
        raise ModelLoadError(f"role '{spec.role}' (vsepp): {spec.source!r} is not a local folder, and VSE++ has no hub "
                             f"checkpoint. Fix: {sources.how_to_get(spec)}")
    return load_vsepp(spec.local_path)


@register_loader("inception")
def _load_inception(spec: ModelSpec, kw: dict):
    """:class:`~.inception.InceptionFeatures` from torchvision's inception_v3 weights file or an inception folder
    (FID / IS, SocialCounterfactuals §10.3); there is no hub id: the source is a local file or folder."""
    from . import inception

    if not spec.is_local:
        raise ModelLoadError(f"role '{spec.role}' (inception): {spec.source!r} is not a local file or folder. Fix: "
                             "download torchvision's inception_v3_google-0cc3c7bd.pth and give its path")
    return inception.load(spec.local_path)
