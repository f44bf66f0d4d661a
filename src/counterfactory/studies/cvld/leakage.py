"""LIC of Table 4 as Hirota et al. 2022 report it (``captioning.lic``).

CVLD follows Hirota et al., whose reported LIC is the *amplification* LIC_M − LIC_D: a gender classifier is trained
on gender-masked captions and scored on held-out ones (:func:`counterfactory.metrics.fairness.lic_score`), once on
the model's captions (LIC_M) and once per human-caption index on the human captions (LIC_D, averaged over the
indices), every time on a **gender-balanced** split (:func:`counterfactory.metrics.fairness.gender_balanced_split`,
the same images for LIC_M and LIC_D under one seed); values are means over the seeds. A balanced split keeps class
imbalance alone from raising leakage. ``lic: leakage`` (ours, the former default) reports the raw LIC_M on a
stratified split (:func:`counterfactory.metrics.captioning.lic`).

The classifier (``captioning.lic_classifier``; LIC_M and LIC_D always use the same one) is either

* ``bert`` (the paper config's default): Hirota et al.'s BERT leakage classifier (§4), a sequence classifier
  fine-tuned from the ``lic_bert`` model role (paper: ``bert-base-uncased``) once per seed and caption set with their
  public code's settings (:mod:`counterfactory.training.text_classifier`); or
* ``tfidf``: TF-IDF (words and word pairs) + logistic regression, a light deterministic stand-in (ours; the demo's),
  whose absolute LIC_M and LIC_D are not comparable with theirs; their difference is the quantity the paper reports.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ...errors import ConfigError
from ...models import registry
from ...training.text_classifier import FineTuneSettings, train_and_predict

#: Hirota et al.'s test ratio of the leakage classifier's split
TEST_RATIO = 0.1
#: human captions per image used for LIC_D (COCO has five)
MAX_REFERENCES = 5
#: the leakage classifiers (``captioning.lic_classifier``)
CLASSIFIERS = ("bert", "tfidf")
#: the model role the BERT classifier is fine-tuned from (Hirota et al. §4: bert-base-uncased)
BERT_ROLE = "lic_bert"


def classifier_roles(captioning: Mapping[str, Any]) -> tuple[str, ...]:
    """The model roles the Table 4 LIC of the ``captioning`` settings fine-tunes: ``(lic_bert,)`` for the
    amplification LIC with ``lic_classifier: bert``, else none."""
    if captioning["lic"] == "amplification" and captioning["lic_classifier"] == "bert":
        return (BERT_ROLE,)
    return ()


def bert_options(cfg: Mapping[str, Any], captioning: Mapping[str, Any], device=None) -> dict[str, Any]:
    """``bert=`` of :func:`lic_amplification` from a configuration: a loader of the ``lic_bert`` role (through the
    model registry, so the load is recorded for provenance) and the ``captioning.lic_bert`` hyper-parameters."""
    if BERT_ROLE not in (cfg.get("models") or {}):
        raise ConfigError(f"models.{BERT_ROLE}: not configured, but captioning.lic_classifier is bert. Fix: add "
                          f"`{BERT_ROLE}: {{source: bert-base-uncased}}` under models (Hirota et al. 2022 §4), or set "
                          "captioning.lic_classifier: tfidf")
    return {"source": lambda: registry.load(cfg, BERT_ROLE), "device": device, **dict(captioning["lic_bert"])}


def _labels(genders: Sequence[str]) -> np.ndarray:
    bad = sorted({g for g in genders if g not in ("male", "female")})
    if bad:
        raise ValueError(f"leakage: genders must be male or female (leave neutral images out), got {bad[:3]}")
    labels = np.array([g == "female" for g in genders], dtype=np.int64)
    if labels.min() == labels.max():
        raise ValueError("leakage: needs captions of both genders")
    return labels


def _tfidf_p_female(train_texts, train_labels, test_texts, seed: int) -> np.ndarray:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vec = TfidfVectorizer(ngram_range=(1, 2), token_pattern=r"\S+", lowercase=False)
    clf = LogisticRegression(max_iter=1000)
    clf.fit(vec.fit_transform(train_texts), train_labels)
    return clf.predict_proba(vec.transform(test_texts))[:, list(clf.classes_).index(1)]


def _bert_p_female(train_texts, train_labels, test_texts, seed: int, bert: Mapping[str, Any]) -> np.ndarray:
    opts = dict(bert)
    if opts.get("source") is None:
        raise ValueError("leakage: classifier bert needs bert={'source': <hub id, folder or loader>, ...}")
    source, revision, device = opts.pop("source"), opts.pop("revision", None), opts.pop("device", None)
    return train_and_predict(source, list(train_texts), train_labels, list(test_texts), seed=int(seed),
                             settings=FineTuneSettings(**opts), revision=revision, device=device)


def leakage(captions: Sequence[str], labels: np.ndarray, seeds: Sequence[int], test_ratio: float = TEST_RATIO,
            classifier: str = "tfidf", bert: Mapping[str, Any] | None = None) -> np.ndarray:
    """LIC (percent) of one caption per image for each seed, on the gender-balanced split of that seed.

    ``classifier``: ``tfidf`` (TF-IDF + logistic regression) or ``bert`` (a fine-tuned sequence classifier, seeded
    with the split's seed); ``bert``: ``source`` (hub id, folder, or a callable returning ``(model, tokenizer)``),
    optional ``revision`` and ``device``, and :class:`~counterfactory.training.text_classifier.FineTuneSettings`
    fields (``epochs``, ``lr``, ``batch_size``, ``max_length``, ...)."""
    from ...metrics.captioning import mask_gender_words
    from ...metrics.fairness import gender_balanced_split, lic_score

    if classifier not in CLASSIFIERS:
        raise ValueError(f"leakage: classifier must be one of {', '.join(CLASSIFIERS)}, got {classifier!r}")
    texts = np.array([mask_gender_words(str(c)) for c in captions], dtype=object)
    out = []
    for seed in seeds:
        tr, te = gender_balanced_split(labels, test_ratio, int(seed))
        if classifier == "bert":
            p_female = _bert_p_female(texts[tr], labels[tr], texts[te], int(seed), bert or {})
        else:
            p_female = _tfidf_p_female(texts[tr], labels[tr], texts[te], int(seed))
        out.append(lic_score(p_female, labels[te], percent=True))
    return np.asarray(out, dtype=float)


def lic_amplification(model_captions: Sequence[str], references: Sequence[Sequence[str]], genders: Sequence[str],
                      seeds: Sequence[int], test_ratio: float = TEST_RATIO, classifier: str = "tfidf",
                      bert: Mapping[str, Any] | None = None) -> dict[str, float]:
    """``LIC`` = mean over seeds of LIC_M − LIC_D, with ``LIC_M``, ``LIC_D`` and ``LIC/std`` (sample std over seeds,
    0 for one seed). ``references[i]``: the human captions of image i (LIC_D averages caption indices
    0 .. min(5, fewest captions) − 1); ``genders[i]``: its ground truth, male or female. ``classifier`` / ``bert``:
    as :func:`leakage`, the same for LIC_M and LIC_D."""
    if not (len(model_captions) == len(references) == len(genders)):
        raise ValueError(f"lic_amplification: {len(model_captions)} model captions, {len(references)} reference "
                         f"sets and {len(genders)} genders")
    labels = _labels(list(genders))
    n_refs = min(MAX_REFERENCES, min(len(r) for r in references))
    if n_refs < 1:
        raise ValueError("lic_amplification: an image has no human caption")
    kw = {"classifier": classifier, "bert": bert}
    lic_m = leakage(model_captions, labels, seeds, test_ratio, **kw)
    lic_d = np.mean([leakage([r[j] for r in references], labels, seeds, test_ratio, **kw) for j in range(n_refs)],
                    axis=0)
    diff = lic_m - lic_d
    return {"LIC": float(diff.mean()), "LIC_M": float(lic_m.mean()), "LIC_D": float(lic_d.mean()),
            "LIC/std": float(diff.std(ddof=1)) if diff.size > 1 else 0.0}
