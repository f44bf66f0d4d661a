"""Label-frequency analysis (COCO-CF appendix A.2)."""

from __future__ import annotations

import pandas as pd

from counterfactory.studies.coco_counterfactuals.label_frequency import correlate_or_explain, label_frequency


def test_label_frequency_counts_pairs_not_words():
    subjects = pd.DataFrame({"original_word": ["dog", "Cats", "table", "bus"], "new_word": ["cat", "horse", "chair", "boxes"]})
    # pair 0 matches twice but counts once; "Cats" matches "cat"; "boxes" matches "box"; "table"/"chair" none
    assert label_frequency(subjects, ["cat", "dog", "box", "hot dog"]) == 3
    assert label_frequency(subjects, ["airplane"]) == 0


def test_correlation_undefined_is_explained_not_raised():
    table = pd.DataFrame({"label_frequency": [1, 1, 1], "delta": [0.1, 0.2, 0.3]})
    out = correlate_or_explain(table, "label_frequency", "delta", source="t")
    assert out["pearson_r"] is None and "undefined" in out["note"]


def test_correlation_matches_paper_table6():
    # COCO-CF Table 6: label frequency and the base/medium/all deltas of six datasets
    freq = {"CIFAR100": 3446, "Caltech101": 354, "Caltech256": 744, "CIFAR10": 398, "ImageNet": 887, "Food101": 28}
    deltas = {"CIFAR100": (2.50, 2.63, 1.80), "Caltech101": (2.31, 2.55, 2.45), "Caltech256": (1.78, 1.52, 1.16),
              "CIFAR10": (0.65, 0.36, -0.29), "ImageNet": (0.41, -0.03, -0.37), "Food101": (-1.04, -2.05, -2.11)}
    table = pd.DataFrame([{"label_frequency": freq[d], "delta": v} for d in freq for v in deltas[d]])
    out = correlate_or_explain(table, "label_frequency", "delta", source="table6")
    assert out["n"] == 18 and round(out["pearson_r"], 3) == 0.522
