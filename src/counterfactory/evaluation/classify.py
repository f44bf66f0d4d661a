"""Zero-shot image classification (§5.2, Table 4): class prompts, top-k accuracy and the runner.

Class text embeddings come from prompt templates (``"a photo of a {c}."`` by default; several templates
are averaged, CLIP's prompt ensembling: each prompt embedding L2-normalised, the mean over a class's
templates renormalised); prediction = argmax over classes of the image-class cosine; top-k accuracy in
percent. Templates are used verbatim (``{c}`` -> the class name; no period is added).

Per dataset, ``evaluation.classification.datasets.<name>.templates`` replaces the global
``evaluation.classification.templates``; either is a list or ``builtin:<name>`` (a list of
``resources/zeroshot/templates.yaml``: CLIP's released per-dataset prompts). Class names come from
``datasets.<name>.class_names`` (:func:`counterfactory.data.classification.resolve_class_names`).
Datasets are read by :mod:`counterfactory.data.classification`.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from ..data.classification import BUILTIN, builtin_templates, load_dataset
from ..errors import ConfigError
from .settings import model_columns, settings

log = logging.getLogger(__name__)


def check_templates(templates: Sequence[str] | str, key: str = "evaluation.classification.templates") -> list[str]:
    """The template list of a ``templates`` setting (a list, or ``builtin:<name>``), each with ``{c}``."""
    if isinstance(templates, str):
        if not templates.startswith(BUILTIN):
            raise ConfigError(f"{key}: {templates!r} is neither a list nor builtin:<name> (known: "
                              f"{sorted(builtin_templates())}). Fix: e.g. ['a photo of a {{c}}.']")
        templates = builtin_templates(templates[len(BUILTIN):])
    templates = [str(t) for t in templates]
    if not templates:
        raise ConfigError(f"{key} is empty. Fix: e.g. ['a photo of a {{c}}.']")
    for t in templates:
        if "{c}" not in t:
            raise ConfigError(f"{key}: {t!r} has no {{c}} placeholder. "
                              f"Fix: write the class name position as {{c}}, e.g. 'a photo of a {{c}}.'")
    return templates


def dataset_templates(ev: dict, dataset: str) -> list[str]:
    """The templates of one dataset: ``datasets.<name>.templates`` if set, else the global list."""
    spec = (ev.get("datasets") or {}).get(dataset) or {}
    if spec.get("templates") is not None:
        return check_templates(spec["templates"], f"evaluation.classification.datasets.{dataset}.templates")
    return check_templates(ev["templates"])


def class_prompts(classes: Sequence[str], templates: Sequence[str]) -> list[str]:
    """Prompt texts, class-major: ``[t.replace('{c}', c) for c in classes for t in templates]``."""
    return [t.replace("{c}", c) for c in classes for t in templates]


def class_text_embeddings(scorer, classes: Sequence[str], templates: Sequence[str]) -> np.ndarray:
    """(C, d) L2-normalised class embeddings: each prompt embedding L2-normalised, averaged over the
    templates, renormalised (CLIP's prompt ensembling)."""
    templates = check_templates(templates)
    emb = np.asarray(scorer.encode_texts(class_prompts(classes, templates)), dtype=np.float64)
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    emb = emb.reshape(len(classes), len(templates), -1).mean(axis=1)
    return emb / np.linalg.norm(emb, axis=1, keepdims=True)


def merge_same_names(classes: Sequence[str], labels) -> tuple[list[str], np.ndarray]:
    """Classes that share a prompt name are one class (e.g. Caltech-101's ``Faces`` and ``Faces_easy`` mapped
    to "face"): names deduplicated in first-seen order, labels remapped. Without this, two identical text
    embeddings would split the votes arbitrarily."""
    names = list(dict.fromkeys(classes))
    index = {name: i for i, name in enumerate(names)}
    remap = np.array([index[c] for c in classes], dtype=np.int64)
    return names, remap[np.asarray(labels, dtype=np.int64)]


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, ks: Sequence[int]) -> dict[int, float]:
    """Top-k accuracy in percent (``sklearn.metrics.top_k_accuracy_score``).

    Conventions: an image counts for k if its label is among the k highest logits; **ties go to the
    lower class index**; k >= the number of classes counts every image as correct.

    sklearn breaks ties the other way (a stable ascending sort, reversed: the *higher* index wins), so
    the class axis is reversed before the call; it also reads two score columns as a binary problem
    (it then expects 1-D scores), so a two-class problem gets a never-ranked extra column.
    """
    from sklearn.metrics import top_k_accuracy_score

    logits = np.asarray(logits, dtype=np.float64)
    labels = np.asarray(labels)
    if logits.ndim != 2 or logits.shape[0] != labels.shape[0]:
        raise ValueError(f"logits {logits.shape} and labels {labels.shape} do not match")
    n_classes = logits.shape[1]
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"labels must lie in [0, {n_classes}), got {labels.min()}..{labels.max()}")
    scores = logits[:, ::-1]                        # reversed class axis: sklearn's tie rule = ours
    targets = n_classes - 1 - labels
    if n_classes == 2:
        scores = np.column_stack([np.full(len(scores), scores.min() - 1.0), scores])
        targets = targets + 1
    columns = np.arange(scores.shape[1])
    out = {}
    for k in ks:
        k = int(k)
        out[k] = 100.0 if k >= n_classes else 100.0 * top_k_accuracy_score(targets, scores, k=k, labels=columns)
    return out


def run_classification(cfg: dict, role: str, dataset: str, *, progress: bool = True) -> dict:
    """Zero-shot top-k accuracy of one (dual-encoder) role on one configured dataset."""
    from ..scorers import scorer_from_config

    ev = settings(cfg)["classification"]
    datasets = ev.get("datasets") or {}
    if dataset not in datasets:
        raise ConfigError(f"evaluation.classification.datasets has no {dataset!r} (configured: {sorted(datasets)}). "
                          f"Fix: add it with format and root")
    spec = dict(datasets[dataset])
    if ev.get("max_per_class") and not spec.get("max_per_class"):
        spec["max_per_class"] = ev["max_per_class"]
    templates = dataset_templates(ev, dataset)
    ds = load_dataset(dataset, spec)
    scorer = scorer_from_config(cfg, role, head="itc", progress=progress)
    if not scorer.dual:
        raise ConfigError(f"evaluation.classification.models: {role} ({type(scorer.model).__name__}) has no "
                          f"contrastive head for zero-shot classification. Fix: list CLIP-like roles only")
    classes, labels = merge_same_names(ds.classes, ds.labels)
    if len(classes) < len(ds.classes):
        log.info("%s: %d classes share a prompt name with another and were merged", dataset,
                 len(ds.classes) - len(classes))
    weights = class_text_embeddings(scorer, classes, templates)
    logits = scorer.encode_images(ds.images) @ weights.T
    acc = topk_accuracy(logits, labels, [int(k) for k in ev["topk"]])
    result = {**model_columns(cfg, role), "dataset": dataset, "format": ds.format, "n_images": len(ds),
              "n_classes": len(classes), "templates": templates,
              "class_names": spec.get("class_names") or "dataset",
              **{f"top{k}": v for k, v in acc.items()}}
    log.info("%s on %s (%d images, %d classes): %s", role, dataset, len(ds), len(ds.classes),
             ", ".join(f"top-{k} {v:.2f}%" for k, v in acc.items()))
    return result
