"""Spurious-correlation retrieval study (Kim, Koepke, Schmid & Akata, 2023, "Exposing and Mitigating Spurious
Correlations for Cross-Modal Retrieval"): synthetic images with the objects of one class (or of several heavily
overlapping classes) removed, scored with ODmAP@k (:func:`counterfactory.metrics.odmap_at_k`).

Modules:

* :mod:`.regions` — region selection (§3.1, Eq. 1-3 and the appendix pseudo-code): which (image, class) pairs
  are removed, alone or together with the classes they cover, and which are skipped; CLI ``counterfactory spurious
  select``.

The study's short name is ``spurious``: CLI group ``counterfactory spurious`` (:mod:`counterfactory.commands.spurious`;
``odmap`` is an alias), rules ``spurious_*`` in ``rules/study_spurious_retrieval.smk``.
"""

from __future__ import annotations

STUDY = "spurious_retrieval"
#: the study's modules, in pipeline order
MODULES = ("regions",)
