"""LIC of Table 4 as Hirota et al. 2022 report it (``captioning.lic``).

CVLD follows Hirota et al., whose reported LIC is the *amplification* LIC_M − LIC_D: a gender classifier is trained
on gender-masked captions and scored on held-out ones (:func:`counterfactory.metrics.fairness.lic_score`), once on
the model's captions (LIC_M) and once per human-caption index on the human captions (LIC_D, averaged over the
indices), every time on a **gender-balanced** split (:func:`counterfactory.metrics.fairness.gender_balanced_split`,
the same images for LIC_M and LIC_D under one seed); values are means over the seeds. A balanced split keeps class
imbalance alone from raising leakage. ``lic: leakage`` (ours, the former default) reports the raw LIC_M on a
stratified split (:func:`counterfactory.metrics.captioning.lic`).

The classifier is TF-IDF (words and word pairs) + logistic regression, a light deterministic stand-in for Hirota et
al.'s LSTM / BERT (ours), so absolute LIC_M and LIC_D are not comparable with theirs; their difference is the
quantity the paper reports.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: Hirota et al.'s test ratio of the leakage classifier's split
TEST_RATIO = 0.1
#: human captions per image used for LIC_D (COCO has five)
MAX_REFERENCES = 5


def _labels(genders: Sequence[str]) -> np.ndarray:
    bad = sorted({g for g in genders if g not in ("male", "female")})
    if bad:
        raise ValueError(f"leakage: genders must be male or female (leave neutral images out), got {bad[:3]}")
    labels = np.array([g == "female" for g in genders], dtype=np.int64)
    if labels.min() == labels.max():
        raise ValueError("leakage: needs captions of both genders")
    return labels


def leakage(captions: Sequence[str], labels: np.ndarray, seeds: Sequence[int], test_ratio: float = TEST_RATIO
            ) -> np.ndarray:
    """LIC (percent) of one caption per image for each seed, on the gender-balanced split of that seed."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from ...metrics.captioning import mask_gender_words
    from ...metrics.fairness import gender_balanced_split, lic_score

    texts = np.array([mask_gender_words(str(c)) for c in captions], dtype=object)
    out = []
    for seed in seeds:
        tr, te = gender_balanced_split(labels, test_ratio, int(seed))
        vec = TfidfVectorizer(ngram_range=(1, 2), token_pattern=r"\S+", lowercase=False)
        clf = LogisticRegression(max_iter=1000)
        clf.fit(vec.fit_transform(texts[tr]), labels[tr])
        p_female = clf.predict_proba(vec.transform(texts[te]))[:, list(clf.classes_).index(1)]
        out.append(lic_score(p_female, labels[te], percent=True))
    return np.asarray(out, dtype=float)


def lic_amplification(model_captions: Sequence[str], references: Sequence[Sequence[str]], genders: Sequence[str],
                      seeds: Sequence[int], test_ratio: float = TEST_RATIO) -> dict[str, float]:
    """``LIC`` = mean over seeds of LIC_M − LIC_D, with ``LIC_M``, ``LIC_D`` and ``LIC/std`` (sample std over seeds,
    0 for one seed). ``references[i]``: the human captions of image i (LIC_D averages caption indices
    0 .. min(5, fewest captions) − 1); ``genders[i]``: its ground truth, male or female."""
    if not (len(model_captions) == len(references) == len(genders)):
        raise ValueError(f"lic_amplification: {len(model_captions)} model captions, {len(references)} reference "
                         f"sets and {len(genders)} genders")
    labels = _labels(list(genders))
    n_refs = min(MAX_REFERENCES, min(len(r) for r in references))
    if n_refs < 1:
        raise ValueError("lic_amplification: an image has no human caption")
    lic_m = leakage(model_captions, labels, seeds, test_ratio)
    lic_d = np.mean([leakage([r[j] for r in references], labels, seeds, test_ratio) for j in range(n_refs)], axis=0)
    diff = lic_m - lic_d
    return {"LIC": float(diff.mean()), "LIC_M": float(lic_m.mean()), "LIC_D": float(lic_d.mean()),
            "LIC/std": float(diff.std(ddof=1)) if diff.size > 1 else 0.0}
