"""Study settings from one config section: defaults written once (with the paper section they come from) merged
with the user's section at every level; an unknown key anywhere is a :class:`ConfigError` naming its full path.

:class:`Sections` is the merged result. A job's configuration holds only the sections its rule declared
(``job_config`` in ``rules/common.smk``); reading another one is a :class:`ConfigError` rather than a silent default,
so a rule that forgets a section it depends on fails loudly instead of ignoring a config edit.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from ..errors import ConfigError

#: keys whose value is a free mapping (names chosen by the user), not a fixed set of settings
FREE = "__free__"


def merge(default: Any, own: Any, where: str) -> Any:
    """``default`` updated with ``own``: mappings merge key by key (unknown keys refused unless ``default`` has
    :data:`FREE`), anything else is replaced."""
    if not isinstance(default, Mapping):
        return copy.deepcopy(own)
    if own is None:
        own = {}
    if not isinstance(own, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(own).__name__} ({own!r:.60}). Fix: write key: value "
                          "pairs (see the defaults in the study's settings module)")
    free = bool(default.get(FREE))
    known = [k for k in default if k != FREE]
    unknown = sorted(set(own) - set(known))
    if unknown and not free:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}. Fix: use {', '.join(known)}")
    out = {k: merge(v, None, f"{where}.{k}") if isinstance(v, Mapping) else copy.deepcopy(v)
           for k, v in default.items() if k != FREE}
    for key, value in own.items():
        out[key] = merge(default[key], value, f"{where}.{key}") if key in default else copy.deepcopy(value)
    return out


class Sections(dict):
    """Merged settings of one study; a section absent from a job's partial view raises :class:`ConfigError`."""

    section = "<study>"
    rules_file = "rules/<study>.smk"
    defaults: dict = {}

    def __missing__(self, key):
        if key in self.defaults:
            raise ConfigError(f"this job was not given the config section {self.section}.{key}. Fix: add '{key}' to "
                              f"the sections the rule passes in params ({self.rules_file}, job_config)")
        raise KeyError(key)


def study_settings(cfg: Mapping | None, section: str, defaults: dict, cls: type[Sections]) -> Sections:
    """``cls`` filled from ``cfg`` (a full configuration, a study view, or ``None``): every section of ``defaults``
    merged with the user's, except the sections a job's partial view leaves out."""
    cfg = cfg if cfg is not None else {}
    nested = dict.get(cfg, section) if isinstance(cfg, dict) else None
    own = nested if isinstance(nested, Mapping) else cfg
    partial = bool(getattr(own, "partial", False))
    out = cls()
    for name, default in defaults.items():
        if partial and not dict.__contains__(own, name):
            continue
        value = dict.get(own, name) if isinstance(own, dict) else None
        out[name] = merge(default, value, f"{section}.{name}")
    return out
