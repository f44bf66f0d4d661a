"""Configuration: YAML files validated against ``config/schema.yaml``.

The same schema is used by the Snakefile (``snakemake.utils.validate``) and by every CLI stage, so a
typo fails at start-up in both. Defaults declared in the schema are filled in on validation.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path
from typing import Any, Iterable

import jsonschema
import yaml

from . import catalogue
from .errors import ConfigError
from .io import write_text

#: the schema ships inside the package; ``config/schema.yaml`` is a symbolic link to it
_SCHEMA = Path(__file__).resolve().parent / "resources" / "config_schema.yaml"


def schema_path() -> Path:
    """Path of the JSON schema (written in YAML) that every configuration must match."""
    return _SCHEMA


@functools.lru_cache(maxsize=1)
def _schema_cached(mtime: float) -> dict:
    with open(schema_path(), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def load_schema() -> dict:
    """The schema (a fresh copy; the parsed file is cached until it changes)."""
    return copy.deepcopy(_schema_cached(schema_path().stat().st_mtime))


def section_schema(dotted: str, schema: dict | None = None) -> dict:
    """The sub-schema of a dotted section (``spurious_retrieval.inpaint``), ``$ref``s resolvable (definitions kept)."""
    schema = schema or load_schema()
    node = schema
    for part in dotted.split("."):
        try:
            node = node["properties"][part]
        except KeyError:
            raise KeyError(f"the schema has no section {dotted!r}") from None
    return {**node, "definitions": schema.get("definitions", {})}


def fill_definition(name: str, value: Any = None, where: str | None = None, source: str = "<config>") -> dict:
    """Like :func:`fill_section` for a schema definition shared by several sections (``llm_decoding``)."""
    instance = copy.deepcopy(dict(value)) if isinstance(value, dict) else ({} if value is None else copy.deepcopy(value))
    validator = _definition_validator(name, schema_path().stat().st_mtime)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        raise _errors_to_config_error(errors, source, prefix=where or name)
    return instance


@functools.lru_cache(maxsize=None)
def _definition_validator(name: str, mtime: float):
    schema = _schema_cached(mtime)
    return _filling_validator()({**schema["definitions"][name], "definitions": schema["definitions"]})


def section_names(study: str) -> list[str]:
    """The sections of a study (the keys of its schema section, schema order)."""
    return list(_schema_cached(schema_path().stat().st_mtime)["properties"][study]["properties"])


def fill_section(dotted: str, value: Any = None, source: str = "<config>") -> dict:
    """``value`` (a section of a configuration, e.g. ``spurious_retrieval.inpaint``; ``None`` = empty) validated
    against its sub-schema with the schema defaults filled in: what the section of a validated view holds. Library
    code and tests that start from a partial section use this instead of restating defaults. A mistake is a
    :class:`ConfigError` naming the full dotted key."""
    mtime = schema_path().stat().st_mtime
    try:
        text = json.dumps(value, default=str)   # key order kept: mapping order is table order
    except (TypeError, ValueError):
        text = None
    if text is not None:
        hit = _FILLED.get((dotted, mtime, text))
        if hit is not None:
            return copy.deepcopy(hit)
    instance = copy.deepcopy(dict(value)) if isinstance(value, dict) else ({} if value is None else copy.deepcopy(value))
    validator = _section_validator(dotted, mtime)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        raise _errors_to_config_error(errors, source, prefix=dotted)
    if text is not None:
        if len(_FILLED) > 512:
            _FILLED.clear()
        _FILLED[(dotted, mtime, text)] = copy.deepcopy(instance)
    return instance


#: filled sections by (section, schema version, JSON of the value): input functions ask for the same settings once
#: per job (a paper-scale DAG: ~3,400 times); a copy is handed out each time
_FILLED: dict[tuple[str, float, str], Any] = {}


@functools.lru_cache(maxsize=None)
def _section_validator(dotted: str, mtime: float):
    """A default-filling validator of one section (cached: settings are read by many Snakemake input functions).
    Validation fills a deep copy of each default, so the cached schema is never changed."""
    return _filling_validator()(section_schema(dotted, _schema_cached(mtime)))


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


@functools.lru_cache(maxsize=1)
def _filling_validator():
    """Draft 2020-12 validator class that fills ``default``s while validating."""
    return _fill_defaults(jsonschema.Draft202012Validator)


#: sections shared by every study; every other top-level key of a view comes from the study's section
SHARED_SECTIONS = ("run_name", "device", "precision", "performance", "seed", "models", "tiny_models", "nltk", "score",
                   "verify", "filters")
def study_roles(study: str | None = None, schema: dict | None = None):
    """Model roles each study cannot run without with its default settings (checked at start-up; the roles a study's
    settings name, e.g. ``spurious_retrieval.training.models`` or ``countercurate.evaluation.roles``, come on top),
    as the study's schema section declares them (``x-required-roles``, with the paper sections): a mapping of every
    study, or one study's tuple (empty for a study the schema does not know)."""
    schema = schema or load_schema()
    roles = {name: tuple(node.get("x-required-roles") or ())
             for name, node in schema["properties"].items() if name in studies(schema)}
    return roles if study is None else roles.get(study, ())


#: marks a job configuration file written by the Snakefile (see :func:`write_job_config`)
JOB_KEY = "counterfactory_job"


def studies(schema: dict | None = None) -> list[str]:
    """Every study the schema knows (each has a top-level section of that name)."""
    schema = schema or load_schema()
    return list(schema["properties"]["studies"]["items"]["enum"])


def _error_line(err, prefix: str = "") -> str:
    """One line naming the dotted key at fault; an unknown key is named in full (``cvld.editing.shardz``)."""
    if err.validator in ("oneOf", "anyOf") and err.context:
        # name the mistake inside the alternative whose type matched (e.g. a bad item of a list), if there is one
        relevant = [e for e in err.context if not (e.validator in ("type", "const") and not e.relative_path)]
        if relevant:
            return _error_line(jsonschema.exceptions.best_match(relevant), prefix)
    path = [prefix] if prefix else []
    where = ".".join(path + [str(p) for p in err.absolute_path]) or "<top level>"
    if err.validator == "additionalProperties" and isinstance(err.instance, dict) \
            and isinstance(err.schema, dict) and err.validator_value is False:
        known = list(err.schema.get("properties", {}))
        extra = [str(k) for k in err.instance if k not in known]
        full = ", ".join(f"{where}.{k}" if where != "<top level>" else k for k in extra)
        return f"{where}: unknown key(s) {', '.join(extra)} ({full}); known: {', '.join(known) or 'none'}"
    return f"{where}: {err.message}"


def _errors_to_config_error(errors, source: str, prefix: str = "") -> ConfigError:
    lines = []
    for err in errors[:10]:
        lines.append("  " + _error_line(err, prefix))
    more = f"\n  ... and {len(errors) - 10} more" if len(errors) > 10 else ""
    return ConfigError(
        f"{source}: configuration does not match {schema_path()}:\n" + "\n".join(lines) + more
        + "\nFix: correct the keys above (docs/config-reference.md lists every key with its type and default)."
    )


def _check_semantics(cfg: dict, source: str) -> None:
    """Checks a JSON schema cannot express (orders of bounds); one error naming every key at fault."""
    problems = []
    run_name = cfg.get("run_name")
    if isinstance(run_name, str) and (run_name in (".", "..") or Path(run_name).name != run_name):
        problems.append(f"  run_name: {run_name!r} is not one plain folder name (results/{run_name}/ would "
                        "leave results/); use letters, digits, '_', '-' and '.' other than '.' or '..' alone")
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
        missing = [r for r in study_roles(study) if r not in (cfg.get("models") or {})]
        if missing:
            problems.append(f"  models: study '{study}' needs the roles {', '.join(missing)} "
                            f"({', '.join('models.' + r for r in missing)} missing)")
        if study not in cfg:
            problems.append(f"  studies: '{study}' is listed but the config has no '{study}:' section")
        cap = (cfg.get("cvld") or {}).get("captioning") if study == "cvld" else None
        if isinstance(cap, dict) and cap.get("lic") == "amplification" and cap.get("lic_classifier") == "bert" \
                and "lic_bert" not in (cfg.get("models") or {}):   # Table 4 LIC's BERT (Hirota et al. 2022 §4)
            problems.append("  models: cvld.captioning.lic_classifier bert fine-tunes the role lic_bert "
                            "(models.lic_bert missing; Hirota et al.: bert-base-uncased), or set "
                            "cvld.captioning.lic_classifier: tfidf")
        in_domain = (cfg.get(study) or {}).get("in_domain") or {}
        if in_domain.get("enabled"):
            unknown = [r for r in in_domain.get("models", []) if r not in (cfg.get("models") or {})]
            if unknown:
                problems.append(f"  {study}.in_domain.models: {', '.join(unknown)} not under models:")
    if problems:
        raise ConfigError(f"{source}: inconsistent configuration:\n" + "\n".join(problems)
                          + "\nFix: correct the values above.")


def validate_config(cfg: dict, source: str = "<config>") -> dict:
    """Validate a full configuration in place (filling schema defaults) and return it; raise :class:`ConfigError`.
    The studies' data paths the config leaves out are first filled from the data catalogue
    (:func:`counterfactory.catalogue.resolve`)."""
    if isinstance(cfg.get("data", {}), dict) and isinstance(cfg.get("data_root", ""), str):
        catalogue.resolve(cfg)
    schema = load_schema()
    validator = _filling_validator()(schema)
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


#: settings under ``models.<role>`` that only name things in tables, figures, the report and cards; they are left out
#: of every job configuration, so renaming a model reruns no evaluation, training or export job: table steps get
#: the names as ``--label ROLE=NAME`` flags (rule params), which rerun exactly those steps
TABLE_ONLY_MODEL_KEYS = ("display_name",)


def _drop_table_only(data: dict) -> None:
    for entry in (data.get("models") or {}).values():
        if isinstance(entry, dict):
            for k in TABLE_ONLY_MODEL_KEYS:
                entry.pop(k, None)


def job_config(cfg: dict, study: str | None, keys: Iterable[str], view: dict | None = None) -> dict:
    """The part of ``study``'s view a job depends on: ``keys`` are dotted section names. A study's job also carries
    ``run_name``; a shared job (``study`` None: tiny models, NLTK data) does not, so runs with other run names
    (the own-data demo) reuse its outputs instead of rebuilding them. Display names
    (:data:`TABLE_ONLY_MODEL_KEYS`) are left out. ``view``: the study's view, when the caller has it already (the
    Snakefile caches it)."""
    if view is None:
        view = study_view(cfg, study) if study else {k: cfg[k] for k in SHARED_SECTIONS if k in cfg}
    keys = sorted(set(keys) | ({"run_name"} if study else set()))
    data = _select(view, keys)
    _drop_table_only(data)
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
    path, text = job_config_file(cfg, study, keys, folder)
    if not Path(path).exists():
        write_text(path, text)
    return path


#: YAML text of each job configuration already rendered in this process, by digest and sections: a paper-scale DAG
#: has ~3,700 jobs but a few hundred distinct configurations, and rendering YAML dominated its planning time
_JOB_TEXT: dict[tuple[str, tuple[str, ...]], str] = {}


def job_config_file(cfg: dict, study: str | None, keys: Iterable[str],
                    folder: str | os.PathLike = ".snakemake/counterfactory/jobs",
                    view: dict | None = None) -> tuple[str, str]:
    """``(path, YAML text)`` of the job configuration :func:`write_job_config` writes, without writing it
    (the Snakefile plans with the path and a local rule writes the text, so parsing writes nothing)."""
    data = job_config(cfg, study, keys, view=view)
    key = digest(data)
    sections = tuple(sorted(set(keys)))
    text = _JOB_TEXT.get((key, sections))
    if text is None:
        data[JOB_KEY] = {"digest": key, "sections": list(sections)}
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        text = _JOB_TEXT[(key, sections)] = yaml.dump(data, Dumper=dumper, sort_keys=True)
    return str(Path(folder) / f"{key[:20]}.yaml"), text


def yaml_syntax_error(path: str | os.PathLike, exc: Exception) -> ConfigError:
    """One line for a YAML syntax error: the file, the line and column (1-based) and the problem."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(path)
    problem = " ".join(filter(None, [getattr(exc, "context", None), getattr(exc, "problem", None)])) or str(exc)
    problem = " ".join(problem.split())
    return ConfigError(f"{where}: not valid YAML ({problem}). Fix: correct the syntax there (indent with "
                       "spaces, close brackets and quotes)")


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping, at any depth (YAML would keep the last
    value and drop the first without a word): a ``ConstructorError`` naming both lines."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:           # an unhashable key: PyYAML's own error follows
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found the key {key!r} twice: first at line {first + 1}, again at line "
                        f"{key_node.start_mark.line + 1} (the first value would be silently lost); keep one",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(stream):
    """``yaml.safe_load`` of a config file's text or stream, with duplicate keys an error (:class:`UniqueKeyLoader`)."""
    return yaml.load(stream, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _not_utf8(path: str | os.PathLike, exc: UnicodeDecodeError) -> ConfigError:
    """A config file that is not UTF-8: the line and column of the first bad byte."""
    data = Path(path).read_bytes()[:exc.start]
    line = data.count(b"\n") + 1
    column = exc.start - (data.rfind(b"\n") + 1) + 1
    return ConfigError(f"{path}, line {line}, column {column}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}; "
                       "e.g. saved as Latin-1). Fix: save the file as UTF-8")


def check_yaml_syntax(paths: Iterable[str | os.PathLike]) -> None:
    """Parse each existing file of ``paths`` as YAML; the first syntax error, duplicate key or non-UTF-8 byte is a
    :class:`ConfigError` naming the file and line (the Snakefile runs this on its config files before Snakemake
    parses them)."""
    for p in paths:
        if not Path(p).is_file():
            continue
        try:
            with open(p, encoding="utf-8") as fh:
                load_yaml(fh)
        except yaml.YAMLError as exc:
            raise yaml_syntax_error(p, exc) from exc
        except UnicodeDecodeError as exc:
            raise _not_utf8(p, exc) from None


def read_yaml(path: Path) -> dict:
    """A YAML mapping from ``path``; a missing file, bad syntax or a non-mapping is a :class:`ConfigError`."""
    if not path.exists():
        raise ConfigError(f"{path.resolve()}: configuration file not found (working directory {Path.cwd()}). "
                          "Fix: check the path")
    try:
        with open(path, encoding="utf-8") as fh:
            data = load_yaml(fh) or {}
    except yaml.YAMLError as exc:
        raise yaml_syntax_error(path, exc) from exc
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def role_origins(layers: Iterable[tuple[str, dict]], cfg: dict | None = None) -> dict[str, dict]:
    """Where each model role's source comes from: ``{role: {"source", "file"}}`` over ``layers`` (``(label,
    mapping)`` in the order they are merged, later ones win; the label of the last layer that sets the role's
    ``source``). ``cfg`` (the merged configuration) limits the roles to those its enabled studies use."""
    origins: dict[str, dict] = {}
    for label, doc in layers:
        for role, entry in ((doc or {}).get("models") or {}).items():
            source = entry if isinstance(entry, str) else entry.get("source") if isinstance(entry, dict) else None
            if source is not None:
                origins[role] = {"source": str(source), "file": str(label)}
    if cfg is not None:
        used = {r for study in cfg.get("studies") or () for r in study_roles(study)}
        origins = {r: o for r, o in origins.items() if r in used}

        for o in origins.values():   # a {models}/... source as the data catalogue resolves it
            if o["source"].startswith("{"):
                o["source"] = catalogue.expand(cfg, o["source"])
    return dict(sorted(origins.items()))


def describe_role_origins(origins: dict[str, dict], base: str = "config/config.yaml") -> str:
    """The lines a dry run prints: each role, its source and the file that set it; a hub id inherited from
    ``base`` under other config files is marked (an overlay that leaves a role out runs the paper's model)."""
    layered = len({o["file"] for o in origins.values()}) > 1 or any(o["file"] != base for o in origins.values())
    lines = ["model roles (source <- the file that set it):"]
    for role, o in origins.items():
        local = o["source"].startswith(("/", "./", "../", "~", "local-dir:", "resources/"))
        hub = not (local or Path(o["source"]).exists())
        mark = (f"  [inherited from {base}: a hub model; set models.{role}.source in your config to use another]"
                if layered and hub and o["file"] == base else "")
        lines.append(f"  {role}: {o['source']} <- {o['file']}{mark}")
    return "\n".join(lines)


def workflow_layers(configfiles: Iterable[str | os.PathLike] = (), overrides: dict | None = None,
                    base: str = "config/config.yaml") -> list[tuple[str, dict]]:
    """The ``(label, mapping)`` layers of a Snakemake run's configuration in merge order: ``base`` (the
    Snakefile's ``configfile:``), then each ``--configfile`` in order, then the ``--config`` pairs."""
    layers = [(base, read_yaml(Path(base)))] if Path(base).is_file() else []
    for f in configfiles:
        if Path(f).resolve() != Path(base).resolve():
            shown = os.path.relpath(f) if Path(f).is_absolute() else str(f)
            layers.append((str(f) if shown.startswith("..") else shown, read_yaml(Path(f))))
    if overrides:
        layers.append(("--config", dict(overrides)))
    return layers


def workflow_role_origins(cfg: dict, configfiles: Iterable[str | os.PathLike] = (), overrides: dict | None = None,
                          base: str = "config/config.yaml") -> str:
    """:func:`describe_role_origins` of a Snakemake run (:func:`workflow_layers`); the roles of the enabled
    studies of ``cfg``."""
    return describe_role_origins(role_origins(workflow_layers(configfiles, overrides, base), cfg), base)


def drop_replaced_revisions(cfg: dict, layers: Iterable[dict | tuple[str, dict]]) -> list[str]:
    """Drop, in place, each ``models.<role>.revision`` of the merged ``cfg`` that was written for another source.

    A revision pins a commit of the hub id it was written next to (the paper config pins its hub ids). When a
    later layer (an overlay file, ``--config``) gives the role another ``source`` and no ``revision`` of its
    own, merging would keep the old pin and ask the new source for a commit it does not have (or pin a local
    folder); the pin is dropped instead. ``layers`` are the merged mappings (or ``(label, mapping)`` pairs) in
    merge order. Returns the roles whose pin was dropped."""
    source: dict[str, Any] = {}       # the role's source after each layer
    pinned_for: dict[str, Any] = {}   # the source each role's latest revision was written for
    for layer in layers:
        doc = layer[1] if isinstance(layer, tuple) else layer
        models = (doc.get("models") if isinstance(doc, dict) else None) or {}
        for role, entry in models.items():
            if isinstance(entry, dict):
                source[role] = entry.get("source", source.get(role))
                if "revision" in entry:
                    pinned_for[role] = source[role]
            else:                     # a bare string replaces the whole entry
                source[role] = entry
                pinned_for.pop(role, None)
    dropped = []
    for role, entry in (cfg.get("models") or {}).items():
        if (isinstance(entry, dict) and "revision" in entry and role in pinned_for
                and pinned_for[role] != entry.get("source")):
            del entry["revision"]
            dropped.append(role)
    return dropped


def is_config_layer(doc: dict) -> bool:
    """Whether a YAML mapping is (a layer of) a full configuration: a job configuration, or a non-empty mapping
    whose keys are all top-level keys of the schema (``run_name``, ``seed``, ``models``, a study's section ...).
    An overlay holding only ``run_name:`` is such a layer, and every command that accepts ``--config`` more
    than once merges it the same way (later files win)."""
    if not isinstance(doc, dict) or not doc:
        return False
    return JOB_KEY in doc or set(doc) <= set(load_schema()["properties"]) | {"study"}


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
    drop_replaced_revisions(cfg, docs)
    validate_config(cfg, source=source)
    view = study_view(cfg, study, source=source)
    if overrides:
        view = deep_merge(dict(view), overrides)
        validator = _filling_validator()(_view_schema(view["study"]))
        errors = sorted(validator.iter_errors(view), key=lambda e: list(e.absolute_path))
        if errors:
            raise _errors_to_config_error(errors, source)
        view = ConfigView(view, source=source)
    return view


def load_full_config(paths: Iterable[str | os.PathLike]) -> dict:
    """Load, merge and validate full configuration files (every study), without taking a view."""
    cfg: dict[str, Any] = {}
    docs = [read_yaml(Path(p)) for p in paths]
    for data in docs:
        cfg = deep_merge(cfg, data)
    drop_replaced_revisions(cfg, docs)
    return validate_config(cfg, source=", ".join(str(p) for p in paths))


def results_dir(cfg: dict) -> Path:
    """``results/<run_name>/<study>``: where every stage of this study writes."""
    base = Path("results") / cfg["run_name"]
    study = dict.get(cfg, "study") if isinstance(cfg, dict) else None
    return base / study if study else base


# ----------------------------------------------------------------------------------- reference page of the schema
def _resolve(node: dict, schema: dict) -> dict:
    """``node`` with a ``$ref`` to ``#/definitions/<name>`` merged under its own keys (properties merged)."""
    ref = node.get("$ref")
    if not ref:
        return node
    target = _resolve(schema["definitions"][ref.rsplit("/", 1)[-1]], schema)
    out = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    if "properties" in target and "properties" in node:
        props = copy.deepcopy(target["properties"])
        for key, value in node["properties"].items():
            props[key] = {**props.get(key, {}), **value}
        out["properties"] = props
    return out


def _type_text(node: dict, schema: dict) -> str:
    node = _resolve(node, schema)
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    for key in ("oneOf", "anyOf"):
        if key in node:
            return " or ".join(_type_text(branch, schema) for branch in node[key])
    types = node.get("type", "any")
    types = types if isinstance(types, list) else [types]
    parts = []
    for t in types:
        if t == "array" and isinstance(node.get("items"), dict):
            parts.append(f"list of {_type_text(node['items'], schema)}")
        elif t == "object" and isinstance(node.get("additionalProperties"), dict) and not node.get("properties"):
            parts.append(f"mapping of {_type_text(node['additionalProperties'], schema)}")
        else:
            parts.append(str(t))
    text = " or ".join(parts)
    bounds = [f"{sym} {node[key]}" for key, sym in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                     ("maximum", "<="), ("exclusiveMaximum", "<"))
              if key in node and not isinstance(node[key], bool)]
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _reference_rows(node: dict, path: str, schema: dict, rows: list) -> None:
    node = _resolve(node, schema)
    for branch in node.get("oneOf", []):
        branch = _resolve(branch, schema)
        if branch.get("properties"):
            node = {**branch, **{k: v for k, v in node.items() if k != "oneOf"}}
    if path:
        default = f"`{json.dumps(node['default'], ensure_ascii=False)}`" if "default" in node else ""
        rows.append((path, _type_text(node, schema), default, _cell(node.get("description", ""))))
    for key, sub in (node.get("properties") or {}).items():
        _reference_rows(sub, f"{path}.{key}" if path else key, schema, rows)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and (_resolve(extra, schema).get("properties")):
        _reference_rows(extra, f"{path}.<name>", schema, rows)
    items = node.get("items")
    if isinstance(items, dict) and _resolve(items, schema).get("properties"):
        _reference_rows(items, f"{path}[]", schema, rows)


def reference_markdown(schema: dict | None = None) -> str:
    """The configuration reference (docs/config-reference.md): every key of the schema as a dotted path with its
    type, default and description (the paper section it comes from). Written by ``scripts/config_reference.py``;
    a test checks that the committed page equals this text."""
    schema = schema or load_schema()
    out = ["# Configuration reference", "",
           "<!-- generated from src/counterfactory/resources/config_schema.yaml by scripts/config_reference.py; "
           "do not edit -->", "",
           "Every key of a configuration file (`config/config.yaml`, `config/demo.yaml`), generated from the schema "
           "(`config/schema.yaml`), the one place defaults are written. A key left out takes its default; an "
           "unknown key, at any depth, fails at start-up naming it. `<name>` stands for a name you choose, `[]` for "
           "an item of a list.", ""]
    for top, sub in schema["properties"].items():
        rows: list = []
        _reference_rows({"properties": {top: sub}}, "", schema, rows)
        out += [f"## `{top}`", ""]
        description = _resolve(sub, schema).get("description")
        if description:
            out += [" ".join(description.split()), ""]
        out += ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
        out += [f"| `{p}` | {_cell(t)} | {_cell(d)} | {desc} |" for p, t, d, desc in rows]
        out.append("")
    return "\n".join(out)


def write_reference(path: str | os.PathLike = "docs/config-reference.md") -> Path:
    """Write :func:`reference_markdown` to ``path`` and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reference_markdown(), encoding="utf-8")
    return path
