"""Captioning quality and gender-fairness metrics of CVLD §5.4 (Table 4) and appendix A.

Quality: :func:`coco_caption_scores` — BLEU-4, CIDEr (COCO) and SPICE (nocaps) with ``pycocoevalcap``, after its
PTB tokenizer (Stanford CoreNLP 3.4.1, bundled; needs Java).

Fairness, following Hirota, Nakashima & Garcia 2022 ("Quantifying Societal Bias Amplification in Image Captioning",
CVPR) as CVLD appendix A says:

* :func:`gender_of_caption` / :func:`gender_from_references`: gender named by a caption / by an image's human
  captions, from the word lists in ``resources/cvld/caption_gender_words.yaml`` (Hirota et al.'s lists + plurals);
* :func:`gender_error`: share of wrongly gendered captions (Burns/Hendricks et al. 2018 "error");
* :func:`caption_bias_amplification`: Zhao et al. 2017 BA of (gender, object word) co-occurrence, human captions vs
  model captions, via :func:`counterfactory.metrics.fairness.bias_amplification`;
* :func:`lic`: leakage LIC (Hirota et al. 2022) with a TF-IDF + logistic-regression classifier standing in for
  their LSTM / BERT.

Percent values (×100) are returned where Table 4 prints percent.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from importlib import resources
from typing import Any, Hashable, Mapping, Sequence

import numpy as np
import yaml

from ..errors import ConfigError
from ..text.noun_phrases import COCO_CATEGORIES, inflections, words_of
from .fairness import bias_amplification, lic_score

log = logging.getLogger(__name__)

MALE, FEMALE, NEUTRAL = "male", "female", "neutral"
#: the token that replaces gendered words before the LIC classifier (Hirota et al. 2022)
MASK_TOKEN = "genderword"

__all__ = ["coco_caption_scores", "spice_available", "gender_words", "gender_of_caption", "gender_from_references",
           "gender_error", "caption_objects", "caption_bias_amplification", "mask_gender_words", "lic"]


# --------------------------------------------------------------------------------------------
# BLEU-4, CIDEr, SPICE (pycocoevalcap)
# --------------------------------------------------------------------------------------------
def spice_available() -> str | None:
    """None when SPICE can run here, else the reason it cannot (no Java, or the SPICE jar / the Stanford CoreNLP
    3.6.0 jars that ``pycocoevalcap`` would download at first use are missing; nothing is downloaded here)."""
    if shutil.which("java") is None:
        return "no Java runtime on PATH"
    try:
        from pycocoevalcap.spice import spice as spice_mod
    except ImportError as exc:  # pragma: no cover - pycocoevalcap is a dependency
        return f"pycocoevalcap is not importable ({exc})"
    folder = os.path.dirname(spice_mod.__file__)
    need = [os.path.join(folder, spice_mod.SPICE_JAR),
            os.path.join(folder, "lib", "stanford-corenlp-3.6.0.jar"),
            os.path.join(folder, "lib", "stanford-corenlp-3.6.0-models.jar")]
    missing = [p for p in need if not os.path.isfile(p)]
    if missing:
        return (f"missing {', '.join(os.path.basename(p) for p in missing)} in {os.path.dirname(missing[0])} "
                "(get_stanford_models.py would download them; downloads are not done at run time)")
    return None


def _ptb_tokenize(captions: Mapping[Hashable, list[str]]) -> dict[Hashable, list[str]]:
    """pycocoevalcap's PTB tokenization (lower case, punctuation removed); a clear error when it cannot run."""
    if shutil.which("java") is None:
        raise ConfigError("coco_caption_scores: the PTB tokenizer of pycocoevalcap needs Java, and no 'java' is on "
                          "PATH. Fix: install a Java runtime (e.g. apt-get install default-jre-headless)")
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    data = {k: [{"caption": c} for c in v] for k, v in captions.items()}
    try:
        out = PTBTokenizer().tokenize(data)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"coco_caption_scores: pycocoevalcap's PTB tokenizer failed ({exc}); it writes a temporary "
                          "file next to its jar in site-packages and runs java there. Fix: make that folder "
                          "writable and check 'java -version'") from exc
    if any(len(out.get(k, [])) != len(v) for k, v in captions.items()):
        raise ConfigError("coco_caption_scores: the PTB tokenizer returned a different number of lines than it was "
                          "given (a caption containing a line break or control character?). Fix: clean the captions")
    return out


def coco_caption_scores(references: Mapping[Hashable, Sequence[str]], candidates: Mapping[Hashable, str],
                        spice: bool = True, *, percent: bool = True) -> dict[str, Any]:
    """BLEU-4, CIDEr and SPICE of ``candidates`` (one caption per image id) against ``references`` (a list of
    human captions per image id), the COCO caption evaluation (``pycocoevalcap``, the code behind BLIP's and the
    COCO server's numbers).

    Both are tokenized with pycocoevalcap's PTBTokenizer (Java; if it cannot run, :class:`ConfigError` says why).
    The image ids of the two mappings must be the same. CIDEr is CIDEr-D as in pycocoevalcap (its document
    frequencies come from ``references``, so it depends on the evaluated set). ``SPICE`` is None (with the reason
    in ``SPICE_note`` and the log) when ``spice`` is False or SPICE cannot run (:func:`spice_available`).
    Values ×100 with ``percent`` (Table 4 prints BLEU4 38.5, CIDEr 129.2).
    """
    refs = {k: [str(c) for c in v] for k, v in references.items()}
    cands = {k: str(v) for k, v in candidates.items()}
    if not cands:
        raise ValueError("coco_caption_scores: no candidate captions")
    missing, extra = sorted(set(refs) - set(cands), key=str), sorted(set(cands) - set(refs), key=str)
    if missing or extra:
        raise ValueError(f"coco_caption_scores: image ids differ (no candidate for {missing[:5]}, no references for "
                         f"{extra[:5]}); give one candidate per referenced image")
    empty = [k for k, v in refs.items() if not v]
    if empty:
        raise ValueError(f"coco_caption_scores: image(s) {empty[:5]} have no reference caption")
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider

    gts = _ptb_tokenize(refs)
    res = _ptb_tokenize({k: [v] for k, v in cands.items()})
    scale = 100.0 if percent else 1.0
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, _ = Cider().compute_score(gts, res)
    out: dict[str, Any] = {"BLEU-4": float(bleu[3]) * scale, "CIDEr": float(cider) * scale, "SPICE": None,
                           "SPICE_note": None, "n_images": len(cands)}
    reason = "not requested" if not spice else spice_available()
    if reason is None:
        from pycocoevalcap.spice.spice import Spice

        out["SPICE"] = float(Spice().compute_score(gts, res)[0]) * scale
    else:
        out["SPICE_note"] = f"SPICE not computed: {reason}"
        if spice:
            log.warning("coco_caption_scores: SPICE not computed: %s", reason)
    return out


# --------------------------------------------------------------------------------------------
# Gender words
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def gender_words() -> dict[str, frozenset[str]]:
    """``{"male": masculine words, "female": feminine words}`` from ``resources/cvld/caption_gender_words.yaml``."""
    text = resources.files("counterfactory").joinpath("resources/cvld/caption_gender_words.yaml").read_text("utf-8")
    doc = yaml.safe_load(text)
    out = {}
    for key, gender in (("masculine", MALE), ("feminine", FEMALE)):
        out[gender] = frozenset(w.lower() for part in doc[key].values() for w in part)
    clash = out[MALE] & out[FEMALE]
    if clash:  # pragma: no cover - guards edits of the resource
        raise ConfigError(f"caption_gender_words.yaml: {sorted(clash)} listed as both masculine and feminine. "
                          "Fix: keep each word in one list")
    return out


def _words(caption: str) -> list[str]:
    return words_of(str(caption))


def gender_of_caption(caption: str) -> str:
    """``"male"`` if the caption has a masculine word and no feminine one, ``"female"`` the other way round,
    ``"neutral"`` for neither or both (a mixed caption names no single gender; Burns et al. 2018 count it as
    "other"). Whole words, case-insensitive; apostrophes and hyphens split words ("woman's" -> woman)."""
    words = set(_words(caption))
    lists = gender_words()
    m, f = bool(words & lists[MALE]), bool(words & lists[FEMALE])
    return MALE if m and not f else FEMALE if f and not m else NEUTRAL


def gender_from_references(captions: Sequence[str]) -> str:
    """An image's gender from its human captions (Zhao et al. 2017 / Hirota et al. 2022 COCO labels): ``"male"`` if
    at least one caption names a masculine word and none a feminine word, ``"female"`` likewise, else
    ``"neutral"`` (no gendered word, or both genders mentioned)."""
    words = set().union(*(set(_words(c)) for c in captions)) if captions else set()
    lists = gender_words()
    m, f = bool(words & lists[MALE]), bool(words & lists[FEMALE])
    return MALE if m and not f else FEMALE if f and not m else NEUTRAL


def _genders(values: Sequence[str], name: str) -> list[str]:
    out = [str(v).strip().lower() for v in values]
    bad = sorted({v for v in out if v not in (MALE, FEMALE, NEUTRAL)})
    if bad:
        raise ValueError(f"{name}: values must be male, female or neutral, got {bad[:5]}")
    return out


def gender_error(pred_captions: Sequence[str], gt_gender: Sequence[str], *, denominator: str = "gendered",
                 percent: bool = True) -> float:
    """Gender misclassification rate of captions ("Error" of Table 4).

    Over images whose ground-truth gender is male or female: a caption is *wrong* when it names the other gender
    (:func:`gender_of_caption`); neutral captions are not errors. ``denominator="gendered"`` (default, our reading
    of CVLD's "accuracy of predicting gender of the subject"): wrong / captions that name a gender;
    ``"all"``: wrong / all images with a gendered ground truth (the error rate of Burns/Hendricks et al. 2018,
    which reports neutral captions separately). NaN when the denominator is 0.
    """
    if len(pred_captions) != len(gt_gender):
        raise ValueError(f"gender_error: {len(pred_captions)} captions but {len(gt_gender)} genders")
    if denominator not in ("gendered", "all"):
        raise ValueError(f"denominator: expected 'gendered' or 'all', got {denominator!r}")
    gt = _genders(gt_gender, "gt_gender")
    pred = [gender_of_caption(c) for c in pred_captions]
    pairs = [(p, g) for p, g in zip(pred, gt) if g != NEUTRAL]
    wrong = sum(p != NEUTRAL and p != g for p, g in pairs)
    total = sum(p != NEUTRAL for p, _ in pairs) if denominator == "gendered" else len(pairs)
    if total == 0:
        return float("nan")
    return (100.0 if percent else 1.0) * wrong / total


# --------------------------------------------------------------------------------------------
# Bias amplification
# --------------------------------------------------------------------------------------------
def _object_forms(vocabulary: Sequence[str]) -> dict[tuple[str, ...], int]:
    forms: dict[tuple[str, ...], int] = {}
    for i, name in enumerate(vocabulary):
        words = _words(name)
        if not words:
            raise ValueError(f"vocabulary: entry {name!r} has no word")
        for last in inflections(words[-1]):
            forms[tuple(words[:-1]) + (last,)] = i
    return forms


def caption_objects(captions: Sequence[str], vocabulary: Sequence[str] | None = None) -> np.ndarray:
    """``(n_captions, |vocabulary|)`` 0/1: whether a caption mentions each object word (default: the 80 COCO
    categories; singular or plural, multi-word names as consecutive words, e.g. "traffic lights"; the longest
    name wins where names overlap: "hot dog" is not also a "dog")."""
    if vocabulary is None:
        vocabulary = COCO_CATEGORIES
    forms = _object_forms(vocabulary)
    longest = max(len(f) for f in forms)
    out = np.zeros((len(captions), len(vocabulary)), dtype=bool)
    for r, cap in enumerate(captions):
        words, s = _words(cap), 0
        while s < len(words):            # longest match first: "hot dog" is not also a "dog"
            for n in range(min(longest, len(words) - s), 0, -1):
                hit = forms.get(tuple(words[s:s + n]))
                if hit is not None:
                    out[r, hit] = True
                    break
            s += n if hit is not None else 1
    return out


def caption_bias_amplification(reference_captions: Sequence[Sequence[str]], pred_captions: Sequence[str], *,
                               vocabulary: Sequence[str] | None = None, min_train_count: int = 1,
                               percent: bool = True) -> float:
    """BiasAmp of Table 4: Zhao et al. 2017 bias amplification between gender and object words, ground truth vs
    model captions (the "BA" of Hirota et al. 2022's comparison).

    Per image: reference side = the objects named in any of its human captions (``reference_captions[i]``) with
    the image's gender from :func:`gender_from_references`; prediction side = the objects named in its model
    caption with the caption's gender (:func:`gender_of_caption`). Neutral images / captions are left out.
    Objects = ``vocabulary`` (default: the 80 COCO category names, our choice: Hirota et al. use COCO objects).
    ``BA = (1/|O|) Σ_g Σ_{o: b*(o,g) > 1/2} (b̃(o,g) − b*(o,g))`` computed by
    :func:`counterfactory.metrics.fairness.bias_amplification` (objects need ``min_train_count`` gendered reference
    images and at least one gendered model caption). Positive = the model strengthens the human captions'
    gender-object associations; ×100 with ``percent``.
    """
    if len(reference_captions) != len(pred_captions):
        raise ValueError(f"caption_bias_amplification: {len(reference_captions)} reference sets but "
                         f"{len(pred_captions)} model captions")
    ref_gender = [gender_from_references(list(r)) for r in reference_captions]
    pred_gender = [gender_of_caption(c) for c in pred_captions]
    ref_objects = caption_objects([" . ".join(r) for r in reference_captions], vocabulary)
    pred_objects = caption_objects(list(pred_captions), vocabulary)
    value = bias_amplification(ref_objects, ref_gender, pred_objects, pred_gender, groups=(MALE, FEMALE),
                               min_train_count=min_train_count)
    return (100.0 if percent else 1.0) * value


# --------------------------------------------------------------------------------------------
# LIC (leakage)
# --------------------------------------------------------------------------------------------
def mask_gender_words(caption: str, token: str = MASK_TOKEN) -> str:
    """Lower-cased words of ``caption`` with every gendered word replaced by ``token`` (Hirota et al. 2022)."""
    lists = gender_words()
    every = lists[MALE] | lists[FEMALE]
    return " ".join(token if w in every else w for w in _words(caption))


def lic(captions: Sequence[str], genders: Sequence[str], *, seeds: Sequence[int] = tuple(range(10)),
        test_size: float = 0.1, percent: bool = True) -> dict[str, Any]:
    """Leakage in captions, LIC (Hirota et al. 2022): how well gender can be predicted from gender-masked captions.

    ``captions``: one caption per image (human captions → LIC_D, model captions → LIC_M; LIC_M − LIC_D is the
    amplification); ``genders``: the images' ground-truth ``"male"`` / ``"female"`` (label 1 = female, as there).
    For every seed: gendered words are masked with ``genderword`` (:func:`mask_gender_words`), the images are split
    with ``sklearn.model_selection.train_test_split(test_size, stratify=genders, random_state=seed)``, a TF-IDF
    (words and word pairs) + ``LogisticRegression`` classifier is fitted on the training part and
    :func:`counterfactory.metrics.fairness.lic_score` scores the test part
    (``mean 1[pred == label] · max(p, 1 − p)``).

    Hirota et al. train a 2-layer bidirectional LSTM (or fine-tune BERT) for 20 epochs on a gender-balanced split
    with test ratio 0.1 (their default, kept here); the linear classifier is a lighter, deterministic stand-in, so
    absolute values are not comparable with theirs. Returns ``{"lic": mean over seeds, "std": sample std (ddof=1;
    0 for one seed), "per_seed": [...], "n_train", "n_test"}``, ×100 with ``percent``.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    if len(captions) != len(genders):
        raise ValueError(f"lic: {len(captions)} captions but {len(genders)} genders")
    g = _genders(genders, "genders")
    if NEUTRAL in g:
        raise ValueError("lic: genders must be male or female (leave neutral images out)")
    labels = np.array([gi == FEMALE for gi in g], dtype=np.int64)
    if labels.min() == labels.max():
        raise ValueError("lic: needs captions of both genders")
    texts = np.array([mask_gender_words(c) for c in captions], dtype=object)
    scores, n_train, n_test = [], 0, 0
    for seed in seeds:
        tr, te = train_test_split(np.arange(len(texts)), test_size=test_size, stratify=labels,
                                  random_state=int(seed))
        vec = TfidfVectorizer(ngram_range=(1, 2), token_pattern=r"\S+", lowercase=False)
        clf = LogisticRegression(max_iter=1000)
        clf.fit(vec.fit_transform(texts[tr]), labels[tr])
        p_female = clf.predict_proba(vec.transform(texts[te]))[:, list(clf.classes_).index(1)]
        scores.append(lic_score(p_female, labels[te], percent=percent))
        n_train, n_test = len(tr), len(te)
    arr = np.asarray(scores)
    return {"lic": float(arr.mean()), "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
            "per_seed": arr.tolist(), "n_train": n_train, "n_test": n_test}
