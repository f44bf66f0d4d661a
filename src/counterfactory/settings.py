"""Settings objects whose defaults are the schema's (``config/schema.yaml``), written nowhere else.

A settings dataclass names the schema section it mirrors with :func:`schema_defaults` (applied under
``@dataclass``); every field the section fills takes the schema's value as its default, so a library call
(``InpaintSettings()``) and a workflow run (the section as the schema validated and filled it) use the same values.
A field written with a default in the class body that the schema also fills is an error at import, and
``tests/test_defaults_in_schema.py`` scans the package for defaults written outside the schema.

:func:`schema_default` is one default of the schema by dotted key (``precision``, ``performance.batch_size``);
:func:`config_value` is a key of a (possibly partial) section or its schema default, the replacement of
``section.get("key", <literal>)``. A study's sections become its settings through
:func:`counterfactory.studies.sections.study_settings` (each section validated and filled by
:func:`counterfactory.config.fill_section`); :func:`seed_pairs` / :func:`seed_list` expand every ``seeds`` section.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Mapping

from .config import _resolve, fill_definition, fill_section, load_schema


def _frozen(value: Any) -> Any:
    """A list default as a tuple (lists of lists as tuples of tuples): dataclass defaults must be immutable."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def _filled(section: str) -> dict:
    if section.startswith("#/definitions/"):
        return fill_definition(section.rsplit("/", 1)[-1])
    return fill_section(section)


def schema_default(dotted: str) -> Any:
    """The schema's default of one key (``precision``, ``countercurate.grounded.steps``); a section without a
    ``default`` of its own is its filled defaults. A key the schema gives no default is a ``KeyError``."""
    schema = load_schema()
    node: dict = schema
    for part in dotted.split("."):
        node = _resolve(node, schema)
        try:
            node = node["properties"][part]
        except KeyError:
            raise KeyError(f"the schema has no key {dotted}") from None
    node = _resolve(node, schema)
    if node.get("properties") and isinstance(node.get("default", {}), dict):
        return fill_section(dotted, node.get("default"))      # a section: its own default, filled
    if "default" in node:
        return copy.deepcopy(node["default"])
    raise KeyError(f"the schema gives {dotted} no default")


def schema_defaults(section: str, *, keys: Mapping[str, str] | None = None, skip: tuple[str, ...] = ()):
    """Class decorator (under ``@dataclass``): each annotated field whose config key (``keys`` maps a field to
    another key name; default: the same name) the schema section ``section`` fills gets the schema's value as its
    default (lists as tuples; mappings through a factory). ``section`` is a dotted section or
    ``#/definitions/<name>``. ``skip``: fields that keep no schema default (e.g. filled by the caller)."""
    renames = dict(keys or {})

    def apply(cls):
        filled = _filled(section)
        used = {}
        for name in cls.__dict__.get("__annotations__", {}):
            key = renames.get(name, name)
            if name in skip or key not in filled:
                continue
            if name in cls.__dict__:
                raise TypeError(f"{cls.__name__}.{name}: a default is written in the class body, but the schema "
                                f"holds it ({section}.{key}); remove it there")
            value = filled[key]
            if isinstance(value, dict):
                setattr(cls, name, dataclasses.field(default_factory=functools.partial(copy.deepcopy, value)))
            else:
                setattr(cls, name, _frozen(value))
            used[name] = key
        cls.__schema_section__ = section
        cls.__schema_keys__ = used
        return cls

    return apply


_MISSING = object()


def config_value(cfg: Mapping | None, dotted: str) -> Any:
    """The value of the schema key ``dotted`` in ``cfg``, a mapping at that key's level: ``config_value(cfg,
    "precision")`` on a configuration or study view, ``config_value(images, "social_counterfactuals.images.keep_work")``
    on a section; the schema's default of ``dotted`` when ``cfg`` lacks the key (a partial section of library use).
    A job's partial view that was not given the section still raises (:class:`counterfactory.config.ConfigView`)."""
    key = dotted.rpartition(".")[2]
    value = cfg.get(key, _MISSING) if cfg is not None else _MISSING
    return schema_default(dotted) if value is _MISSING else value


def seed_list(seeds: Mapping) -> list[int]:
    """The run seeds of a ``seeds`` section (``{first, count[, data_seed_offset]}``): ``first .. first + count - 1``."""
    first, count = int(seeds["first"]), int(seeds["count"])
    return list(range(first, first + count))


def seed_pairs(seeds: Mapping) -> list[tuple[int, int]]:
    """``(seed, data_seed)`` of every run of a ``seeds`` section: the data seed is ``seed + data_seed_offset``
    (COCO-CF B.3.2: seeds 107..131 with data seeds 108..132). The one expansion of a seeds section."""
    offset = int(seeds["data_seed_offset"])
    return [(seed, seed + offset) for seed in seed_list(seeds)]
