"""Study settings from one config section: the schema (``config/schema.yaml``) holds every default (with the paper
section it comes from) and refuses unknown keys at every depth; :func:`study_settings` takes a study's sections as
the schema validated and filled them (:func:`counterfactory.config.fill_section`), so a partial section (tests,
library use) gets the same values as a validated view.

:class:`Sections` is the result. A job's configuration holds only the sections its rule declared
(``job_config`` in ``rules/common.smk``); reading another one is a :class:`ConfigError` rather than a silent default,
so a rule that forgets a section it depends on fails loudly instead of ignoring a config edit.
"""

from __future__ import annotations

from typing import Mapping

from ..config import fill_section, section_names
from ..errors import ConfigError


class Sections(dict):
    """Merged settings of one study; a section absent from a job's partial view raises :class:`ConfigError`."""

    section = "<study>"
    rules_file = "rules/<study>.smk"

    def __missing__(self, key):
        if key in section_names(self.section):
            raise ConfigError(f"this job was not given the config section {self.section}.{key}. Fix: add '{key}' to "
                              f"the sections the rule passes in params ({self.rules_file}, job_config)")
        raise KeyError(key)


def study_settings(cfg: Mapping | None, section: str, cls: type[Sections], skip: tuple[str, ...] = ()) -> Sections:
    """``cls`` filled from ``cfg`` (a full configuration, a study view, or ``None``): every schema section of the
    study validated with its defaults filled, except the sections a job's partial view leaves out and ``skip``
    (sections another module reads). The one way a study's config sections become its settings."""
    cfg = cfg if cfg is not None else {}
    nested = dict.get(cfg, section) if isinstance(cfg, dict) else None
    own = nested if isinstance(nested, Mapping) else cfg
    partial = bool(getattr(own, "partial", False))
    out = cls()
    for name in section_names(section):
        if name in skip or (partial and not dict.__contains__(own, name)):
            continue
        value = dict.get(own, name) if isinstance(own, dict) else None
        out[name] = fill_section(f"{section}.{name}", value)
    return out
