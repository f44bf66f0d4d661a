"""Settings objects whose defaults are the schema's (``config/schema.yaml``), written nowhere else.

A settings dataclass names the schema section it mirrors with :func:`schema_defaults` (applied under
``@dataclass``); every field the section fills takes the schema's value as its default, so a library call
(``InpaintSettings()``) and a workflow run (the section as the schema validated and filled it) use the same values.
A field written with a default in the class body that the schema also fills is an error at import, and
``tests/test_defaults_in_schema.py`` scans the package for defaults written outside the schema.

:func:`from_section` is the one way to turn a (possibly partial) config section into such an object: the section is
validated and filled by :func:`counterfactory.config.fill_section`, then its keys go to the fields.
:func:`schema_default` is one default of the schema by dotted key (``precision``, ``performance.batch_size``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Mapping

from .config import fill_definition, fill_section, section_schema


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
    parent, _, leaf = dotted.rpartition(".")
    if parent:
        filled = fill_section(parent)
        if leaf not in filled:
            raise KeyError(f"the schema gives {dotted} no default")
        return filled[leaf]
    node = section_schema(dotted)
    if "default" in node:
        return copy.deepcopy(node["default"])
    if node.get("type") == "object" or "properties" in node:
        return fill_section(dotted)
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


def from_section(cls, value: Mapping | None = None, *, section: str | None = None, **extra):
    """``cls`` (a :func:`schema_defaults` dataclass) from a config section: ``value`` validated and filled against
    the schema section (``section``, default the class's own), each field from its key (lists as tuples); fields
    the section does not hold come from ``extra`` or keep their defaults."""
    section = section or cls.__schema_section__
    filled = fill_section(section, dict(value) if value is not None else None)
    keys = cls.__schema_keys__
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {name: _frozen(filled[key]) for name, key in keys.items() if key in filled}
    values.update({k: v for k, v in extra.items() if k in fields})
    return cls(**values)
