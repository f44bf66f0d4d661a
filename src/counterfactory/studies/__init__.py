"""Study modules: only what is specific to one paper (its table layouts, its rules of thumb).

Everything shared by the five studies lives in the stage packages (``data``, ``text``, ``generation``,
``filters``, ``training``, ``evaluation``, ``stats``, ``tables``); a study's Snakemake rules are in
``rules/study_<study>.smk`` and its settings in the config section of the same name.
"""

from __future__ import annotations

import importlib

#: each study's title and paper, as the report and the dataset cards name them (full references: CITATION.cff)
STUDIES = {
    "coco_counterfactuals": ("COCO-Counterfactuals",
                             "COCO-Counterfactuals: Automatically Constructed Counterfactual Examples for Image-Text "
                             "Pairs (Le et al.)"),
    "social_counterfactuals": ("SocialCounterfactuals",
                               "SocialCounterfactuals: Probing and Mitigating Intersectional Social Biases in "
                               "Vision-Language Models with Counterfactual Examples (Howard et al.)"),
    "countercurate": ("CounterCurate",
                      "CounterCurate: Enhancing Physical and Semantic Visio-Linguistic Compositional Reasoning via "
                      "Counterfactual Examples (Zhang et al.)"),
    "spurious_retrieval": ("Spurious correlations in cross-modal retrieval",
                           "Exposing and Mitigating Spurious Correlations for Cross-Modal Retrieval (Kim et al.)"),
    "cvld": ("CVLD", "Debias Your VLM with Counterfactuals: A Unified Approach (CVLD)"),
}


def title(study: str) -> str:
    """The study's display title (its code name when unknown)."""
    return STUDIES.get(study, (study, ""))[0]


def module(study: str):
    """The study module ``counterfactory.studies.<study>``."""
    return importlib.import_module(f"{__name__}.{study}")
