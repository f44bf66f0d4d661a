"""Configuration: YAML files validated against ``config/schema.yaml``.

The same schema is used by the Snakefile (``snakemake.utils.validate``) and by every CLI stage, so a
typo fails at start-up in both. Defaults declared in the schema are filled in on validation.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any, Iterable

import jsonschema
import yaml

from .errors import ConfigError

#: the schema ships inside the package; ``config/schema.yaml`` is a symbolic link to it
_SCHEMA = Path(__file__).resolve().parent / "resources" / "config_schema.yaml"


def schema_path() -> Path:
    """Path of the JSON schema (written in YAML) that every configuration must match."""
    return _SCHEMA


def load_schema() -> dict:
    with open(schema_path(), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def deep_merge(base: dict, override: dict) -> dict:
    """Recursively merge ``override`` into a copy of ``base`` (mappings merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _fill_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, subschema in properties.items():
                if "default" in subschema and prop not in instance:
                    instance[prop] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


#: sections shared by every study; every other top-level key of a view comes from the study's section
SHARED_SECTIONS = ("run_name", "device", "precision", "performance", "seed", "models", "tiny_models", "nltk")
#: model roles each study cannot run without (checked at start-up)
STUDY_ROLES = {"coco_counterfactuals": ("mlm", "lm", "sentence", "sd", "clip_filter"),
               "social_counterfactuals": ("sd", "clip_filter", "nsfw")}
#: marks a job configuration file written by the Snakefile (see :func:`write_job_config`)
JOB_KEY = "counterfactory_job"


def studies(schema: dict | None = None) -> list[str]:
    """Every study the schema knows (each has a top-level section of that name)."""
    schema = schema or load_schema()
    return list(schema["properties"]["studies"]["items"]["enum"])


def _errors_to_config_error(errors, source: str) -> ConfigError:
    lines = []
    for err in errors[:10]:
        where = ".".join(str(p) for p in err.absolute_path) or "<top level>"
        lines.append(f"  {where}: {err.message}")
    more = f"\n  ... and {len(errors) - 10} more" if len(errors) > 10 else ""
    return ConfigError(
        f"{source}: configuration does not match {schema_path()}:\n" + "\n".join(lines) + more
        + "\nFix: correct the keys above (see config/config.yaml for every key with its default)."
    )


def _check_semantics(cfg: dict, source: str) -> None:
    """Checks a JSON schema cannot express (orders of bounds); one error naming every key at fault."""
    problems = []
    for study in cfg.get("studies", []) or []:
        section = cfg.get(study) or {}
        cap = section.get("captions") or {}
        lo, hi = cap.get("similarity_low"), cap.get("similarity_high")
        if lo is not None and hi is not None and not lo < hi:
            problems.append(f"  {study}.captions: similarity_low ({lo}) must be below similarity_high ({hi}); "
                            "the band (low, high] would be empty")
        images = section.get("images") or {}
        for key in ("p_range", "guidance_range"):
            rng = images.get(key)
            if rng and rng[0] > rng[1]:
                problems.append(f"  {study}.images.{key}: {rng} is not [low, high]")
    for study in cfg.get("studies", []) or []:
        missing = [r for r in STUDY_ROLES.get(study, ()) if r not in (cfg.get("models") or {})]
        if missing:
            problems.append(f"  models: study '{study}' needs the roles {', '.join(missing)}")
        if study not in cfg:
            problems.append(f"  studies: '{study}' is listed but the config has no '{study}:' section")
        in_domain = (cfg.get(study) or {}).get("in_domain") or {}
        if in_domain.get("enabled"):
            unknown = [r for r in in_domain.get("models", []) if r not in (cfg.get("models") or {})]
            if unknown:
                problems.append(f"  {study}.in_domain.models: {', '.join(unknown)} not under models:")
    if problems:
        raise ConfigError(f"{source}: inconsistent configuration:\n" + "\n".join(problems)
                          + "\nFix: correct the values above.")


def validate_config(cfg: dict, source: str = "<config>") -> dict:
    """Validate a full configuration in place (filling schema defaults) and return it; raise :class:`ConfigError`."""
    schema = load_schema()
    validator = _fill_defaults(jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        raise _errors_to_config_error(errors, source)
    _check_semantics(cfg, source)
    return cfg


def _view_schema(study: str) -> dict:
    """Schema of a study view: the shared sections plus the study's own sections at top level, none required."""
    schema = load_schema()
    props = {k: v for k, v in schema["properties"].items() if k in SHARED_SECTIONS}
    props.update(schema["properties"][study]["properties"])
    props["study"] = {"type": "string"}
    props[JOB_KEY] = {"type": "object"}
    return {**{k: v for k, v in schema.items() if k not in ("properties", "required")},
            "properties": props, "additionalProperties": False}


@functools.lru_cache(maxsize=None)
def _known_sections(study: str) -> frozenset:
    return frozenset(SHARED_SECTIONS) | frozenset(load_schema()["properties"][study]["properties"])


class ConfigView(dict):
    """What a stage reads: shared sections + one study's sections at top level (``cfg["captions"]``).

    A view made for one job (:func:`write_job_config`) holds only the sections that job declared in its
    rule's ``params``; reading any other section is an error, so undeclared dependencies cannot hide."""

    def __init__(self, data: dict, *, partial: bool = False, source: str = "<config>"):
        super().__init__(data)
        self.partial = partial
        self.source = source

    def _missing(self, key):
        if self.partial and key in _known_sections(self.get_study()):
            raise ConfigError(
                f"{self.source}: this job was not given the config section '{key}'. Fix: add '{key}' to the "
                f"sections the rule passes in params (rules/common.smk, job_config)")
        raise KeyError(key)

    def get_study(self) -> str:
        return dict.get(self, "study") or "coco_counterfactuals"

    def __getitem__(self, key):
        if not dict.__contains__(self, key):
            self._missing(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        if not dict.__contains__(self, key):
            if self.partial and key in _known_sections(self.get_study()):
                self._missing(key)
            return default
        return dict.__getitem__(self, key)

    def __deepcopy__(self, memo):
        return ConfigView(copy.deepcopy(dict(self), memo), partial=self.partial, source=self.source)


def study_view(cfg: dict, study: str | None = None, source: str = "<config>") -> ConfigView:
    """The view of ``study`` (default: the first enabled study) of a validated full configuration."""
    study = study or (cfg.get("studies") or ["coco_counterfactuals"])[0]
    if study not in cfg:
        raise ConfigError(f"{source}: no '{study}:' section. Fix: add it (see config/config.yaml) or pick "
                          f"another study ({', '.join(cfg.get('studies', []))})")
    view = {k: copy.deepcopy(cfg[k]) for k in SHARED_SECTIONS if k in cfg}
    view.update(copy.deepcopy(cfg[study]))
    view["study"] = study
    return ConfigView(view, source=source)


def _select(view: dict, keys: Iterable[str]) -> dict:
    """Sub-dictionary of ``view`` with dotted ``keys`` (``models.mlm`` takes one role of ``models``)."""
    out: dict = {}
    for key in keys:
        parts = key.split(".")
        src, dst = view, out
        for i, part in enumerate(parts):
            if not isinstance(src, dict) or part not in src:
                break
            if i == len(parts) - 1:
                dst[part] = copy.deepcopy(src[part])
            else:
                src = src[part]
                dst = dst.setdefault(part, {})
    return out


def job_config(cfg: dict, study: str | None, keys: Iterable[str]) -> dict:
    """The part of ``study``'s view a job depends on: ``keys`` are dotted section names. A study's job also carries
    ``run_name``; a shared job (``study`` None: tiny models, NLTK data) does not, so runs with other run names
    (the own-data demo) reuse its outputs instead of rebuilding them."""
    view = study_view(cfg, study) if study else {k: cfg[k] for k in SHARED_SECTIONS if k in cfg}
    keys = sorted(set(keys) | ({"run_name"} if study else set()))
    data = _select(view, keys)
    if study:
        data["study"] = study
    return data


def digest(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj`` (what a job's settings are identified by)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def write_job_config(cfg: dict, study: str | None, keys: Iterable[str],
                     folder: str | os.PathLike = ".snakemake/counterfactory/jobs") -> str:
    """Write the settings one job depends on to a file named by their digest and return its path.

    The file is content-addressed: it never changes once written, so a dry run with another config
    while a run is in progress cannot change that run's settings; and the path (a rule parameter)
    changes exactly when those settings change, so Snakemake reruns exactly the affected jobs."""
    from .io import write_text

    data = job_config(cfg, study, keys)
    key = digest(data)
    data[JOB_KEY] = {"digest": key, "sections": sorted(set(keys))}
    path = Path(folder) / f"{key[:20]}.yaml"
    if not path.exists():
        write_text(path, yaml.safe_dump(data, sort_keys=True))
    return str(path)


def read_yaml(path: Path) -> dict:
    """A YAML mapping from ``path``; a missing file, bad syntax or a non-mapping is a :class:`ConfigError`."""
    if not path.exists():
        raise ConfigError(f"{path.resolve()}: configuration file not found (working directory {Path.cwd()}). "
                          "Fix: check the path")
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}). Fix: correct the syntax") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def load_config(paths: Iterable[str | os.PathLike], overrides: dict | None = None,
                study: str | None = None) -> ConfigView:
    """Load config files (later files win), validate, and return the view of ``study``.

    Either full configurations (``config/*.yaml``; merged, validated against the schema, defaults
    filled) or one job configuration written by the Snakefile (:func:`write_job_config`; only the
    sections that job declared). ``overrides`` are given in view form (``{"captions": {...}}``)."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ConfigError("no configuration file given. Fix: pass --config config/demo.yaml (or config/config.yaml)")
    docs = [read_yaml(p) for p in paths]
    source = ", ".join(str(p) for p in paths)
    if any(JOB_KEY in d for d in docs):
        if len(docs) != 1:
            raise ConfigError(f"{source}: a job configuration cannot be merged with other files. Fix: pass it alone")
        data = docs[0]
        study = data.get("study") or "coco_counterfactuals"
        view = deep_merge(data, overrides or {})
        errors = sorted(jsonschema.Draft202012Validator(_view_schema(study)).iter_errors(view),
                        key=lambda e: list(e.absolute_path))
        if errors:
            raise _errors_to_config_error(errors, source)
        return ConfigView(view, partial=True, source=source)
    cfg: dict[str, Any] = {}
    for data in docs:
        cfg = deep_merge(cfg, data)
    validate_config(cfg, source=source)
    view = study_view(cfg, study, source=source)
    if overrides:
        view = deep_merge(dict(view), overrides)
        validator = _fill_defaults(jsonschema.Draft202012Validator)(_view_schema(view["study"]))
        errors = sorted(validator.iter_errors(view), key=lambda e: list(e.absolute_path))
        if errors:
            raise _errors_to_config_error(errors, source)
        view = ConfigView(view, source=source)
    return view


def load_full_config(paths: Iterable[str | os.PathLike]) -> dict:
    """Load, merge and validate full configuration files (every study), without taking a view."""
    cfg: dict[str, Any] = {}
    for p in paths:
        cfg = deep_merge(cfg, read_yaml(Path(p)))
    return validate_config(cfg, source=", ".join(str(p) for p in paths))


def results_dir(cfg: dict) -> Path:
    """``results/<run_name>/<study>``: where every stage of this study writes."""
    base = Path("results") / cfg["run_name"]
    study = dict.get(cfg, "study") if isinstance(cfg, dict) else None
    return base / study if study else base
