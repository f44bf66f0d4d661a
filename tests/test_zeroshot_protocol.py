"""Zero-shot classification protocol of the paper config (COCO-CF §5.2, Table 4): one prompt per dataset
without a trailing period, Food101's food prompt, Caltech-101's face classes merged."""

from __future__ import annotations

import numpy as np

from counterfactory.config import load_config
from counterfactory.data.classification import resolve_class_names
from counterfactory.evaluation.classify import class_prompts, dataset_templates, merge_same_names, topk_accuracy


def test_paper_prompts(repo):
    ev = load_config([repo / "config" / "config.yaml"])["evaluation"]["classification"]
    assert dataset_templates(ev, "CIFAR10") == ["a photo of a {c}"]
    assert dataset_templates(ev, "Food101") == ["a photo of {c}, a type of food"]
    assert class_prompts(["pizza"], dataset_templates(ev, "Food101")) == ["a photo of pizza, a type of food"]
    for name in ev["datasets"]:
        assert not any(t.endswith(".") for t in dataset_templates(ev, name)), name


def test_caltech101_faces_merged_into_one_class():
    ids = ["BACKGROUND_Google", "Faces", "Faces_easy", "Leopards", "Motorbikes", "airplanes"]
    names = resolve_class_names("builtin:caltech101_merged", ids, ids, "Caltech101")
    assert names == ["background", "face", "face", "leopard", "motorbike", "airplane"]
    classes, labels = merge_same_names(names, np.array([0, 1, 2, 2, 3, 5]))
    assert classes == ["background", "face", "leopard", "motorbike", "airplane"]
    assert labels.tolist() == [0, 1, 1, 1, 2, 4]


def test_merged_classes_score_as_one():
    # two images of the merged class, one from each folder: with a single "face" column both are correct,
    # whereas two identical "face" columns would have split them by tie order
    names, labels = merge_same_names(["face", "face", "leopard"], np.array([0, 1, 2]))
    logits = np.array([[0.9, 0.1], [0.8, 0.3], [0.2, 0.7]])
    assert topk_accuracy(logits, labels, [1])[1] == 100.0
