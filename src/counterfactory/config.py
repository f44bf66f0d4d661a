"""Configuration: YAML files validated against ``config/schema.yaml``.

The same schema is used by the Snakefile (``snakemake.utils.validate``) and by every CLI stage, so a
typo fails at start-up in both. Defaults declared in the schema are filled in on validation.
"""

from __future__ import annotations

import copy
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


def validate_config(cfg: dict, source: str = "<config>") -> dict:
    """Validate ``cfg`` in place (filling schema defaults) and return it; raise :class:`ConfigError`."""
    schema = load_schema()
    validator = _fill_defaults(jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors[:10]:
            where = ".".join(str(p) for p in err.absolute_path) or "<top level>"
            lines.append(f"  {where}: {err.message}")
        raise ConfigError(
            f"{source}: configuration does not match {schema_path()}:\n" + "\n".join(lines)
            + "\nFix: correct the keys above (see config/config.yaml for every key with its default)."
        )
    return cfg


def load_config(paths: Iterable[str | os.PathLike], overrides: dict | None = None) -> dict:
    """Load and merge YAML config files (later files win), apply ``overrides``, validate."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ConfigError("no configuration file given. Fix: pass --config config/demo.yaml (or config/config.yaml)")
    cfg: dict[str, Any] = {}
    for path in paths:
        if not path.exists():
            raise ConfigError(f"{path}: configuration file not found. Fix: check the path")
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc}). Fix: correct the syntax") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
        cfg = deep_merge(cfg, data)
    if overrides:
        cfg = deep_merge(cfg, overrides)
    return validate_config(cfg, source=", ".join(str(p) for p in paths))


def results_dir(cfg: dict) -> Path:
    """``results/<run_name>``: where every stage of this run writes."""
    return Path("results") / cfg["run_name"]
