"""Study modules: only what is specific to one paper (its table layouts, its rules of thumb).

Everything shared by the five studies lives in the stage packages (``data``, ``text``, ``generation``,
``filters``, ``training``, ``evaluation``, ``stats``, ``tables``); a study's Snakemake rules are in
``rules/study_<study>.smk`` and its settings in the config section of the same name.

Each study is one unit: its package's ``spec`` module declares ``SPEC``, a :class:`counterfactory.workflow.StudySpec`
(title, paper, short name, docs page, implicit model roles, plan rows, dataset files). :func:`specs` finds every
subpackage that has one (ordered by ``SPEC.order``); the titles here, the plan (:mod:`counterfactory.planning`), the
preflight's dataset checks (:mod:`counterfactory.preflight`) and the Snakefile's ``include:`` of the study rules
iterate over them (docs/architecture.md, "Adding a study").
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..workflow import StudySpec

_FOUND: dict[tuple[str, ...], tuple] = {}


def specs() -> tuple["StudySpec", ...]:
    """Every study's spec, in their declared ``order``: each subpackage of this package with a ``spec`` module.
    Found again when this package's ``__path__`` changes (a study added on another path, the tests' toy study)."""
    key = tuple(__path__)
    found = _FOUND.get(key)
    if found is None:
        out = []
        for info in pkgutil.iter_modules(__path__):
            if not info.ispkg:
                continue
            try:
                module = importlib.import_module(f"{__name__}.{info.name}.spec")
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{info.name}.spec":
                    raise
                continue
            spec = module.SPEC
            if spec.name != info.name:
                raise ValueError(f"{module.__name__}: SPEC.name is {spec.name!r}; it must be the package's name")
            out.append(spec)
        found = _FOUND[key] = tuple(sorted(out, key=lambda s: (s.order, s.name)))
    return found


def names() -> list[str]:
    """Every study's name, in order."""
    return [s.name for s in specs()]


def find(study: str) -> "StudySpec | None":
    """The spec of ``study``; None when no study has that name."""
    return next((s for s in specs() if s.name == study), None)


def spec(study: str) -> "StudySpec":
    """The spec of ``study`` (a KeyError naming the known studies when there is none)."""
    found = find(study)
    if found is None:
        raise KeyError(f"no study {study!r}; known: {', '.join(names())}")
    return found


def __getattr__(name: str):
    if name == "STUDIES":
        #: each study's title and paper, as the report and the dataset cards name them (full references:
        #: CITATION.cff); derived from the specs
        return {s.name: (s.title, s.paper) for s in specs()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def exports() -> dict:
    """study -> its export declaration (``SPEC.export``, a ``counterfactory.export.studies.StudyExport``), for every
    study that declares one, in the specs' order (the ``export`` command's choices, the export rules' studies)."""
    return {s.name: s.export for s in specs() if s.export is not None}


def title(study: str) -> str:
    """The study's display title (its code name when unknown)."""
    found = find(study)
    return found.title if found else study


def module(study: str):
    """The study module ``counterfactory.studies.<study>``."""
    return importlib.import_module(f"{__name__}.{study}")


def with_module(part: str) -> tuple[str, ...]:
    """The studies, in order, whose package has a module ``part`` (``verify``: a VQA-check adapter;
    ``filter_cards``: filters declared for cards), found without importing it: a shared step's ``--study`` choices
    come from the study packages, so a new study's adapter is picked up without editing the step."""
    import importlib.util

    return tuple(s for s in names() if importlib.util.find_spec(f"{__name__}.{s}.{part}") is not None)
