"""Study modules: only what is specific to one paper (its table layouts, its rules of thumb).

Everything shared by the five studies lives in the stage packages (``data``, ``text``, ``generation``,
``filters``, ``training``, ``evaluation``, ``stats``, ``tables``); a study's Snakemake rules are in
``rules/studies/<study>.smk`` and its settings in the config section of the same name.
"""

from __future__ import annotations

import importlib


def module(study: str):
    """The study module ``counterfactory.studies.<study>``."""
    return importlib.import_module(f"{__name__}.{study}")
