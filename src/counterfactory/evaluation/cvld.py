"""Model scoring for the CVLD evaluations (§5.2–5.4, Tables 1–4, Figure 5) with BLIP.

Every function takes a loaded ``(model, processor)`` pair (``BlipForImageTextRetrieval`` + ``BlipProcessor`` for
scoring, ``BlipForConditionalGeneration`` for captions), runs without gradients in batches and is deterministic:
no randomness is involved, texts are padded per batch with an attention mask and images are preprocessed alone,
so results do not depend on the batch size (up to float rounding). Images are PIL images or file paths.

* :func:`itm_match_scores` — ITM "match" probability of aligned (image, text) pairs;
* :func:`classify_attributes` / :func:`classification_metrics` — zero-shot / adapted CelebA attribute
  classification with a positive and a negative prompt per attribute, and Table 1's AP, mAcc, DEO, ΔAcc;
* :func:`fairface_similarity`, :func:`fairface_retrieval`, :func:`maxskew_curve` — Bias@K and MaxSkew@K of the
  ten Berg et al. (2022) queries on FairFace (Table 2 left, Figure 5 left);
* :func:`itc_itm_rerank` — BLIP's ITC ranking + ITM re-ranking of the ITC shortlist (every BLIP ranking here);
* :func:`retrieval_recall` — text→image Rec@1 and mRec (Table 2 right), ranked by :func:`itc_itm_rerank`;
* :func:`generate_captions` — BLIP captioning with BLIP's decoding settings (Table 4).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..data.celeba import GENDER_INDEPENDENT
from ..errors import ConfigError
from ..metrics.fairness import (average_precision, calibrated_threshold, deo_from_scores, delta_accuracy,
                                intersect_groups, mean_group_accuracy)
from ..metrics.retrieval import bias_at_k, max_skew_at_k, ranking_from_scores, recall_at_k
from ..scorers import BlipItcScorer, BlipItmScorer, load_image
from ..settings import schema_default
from ..training.cvld_losses import class_prompts

log = logging.getLogger(__name__)

#: Berg et al. (2022)'s query template and adjectives, used by CVLD appendix A for FairFace retrieval
FAIRFACE_ADJECTIVES = ("good", "evil", "smart", "dumb", "attractive", "unattractive", "lawful", "criminal",
                       "friendly", "unfriendly")
FAIRFACE_QUERIES = tuple(f"a photo of a {a} person" for a in FAIRFACE_ADJECTIVES)
#: (positive, negative) prompt per CelebA attribute: the training's class prompts (one wording for training and
#: evaluation; ours, CVLD does not publish its prompts)
DEFAULT_PROMPTS = {a: tuple(reversed(class_prompts(a))) for a in GENDER_INDEPENDENT}
#: BLIP's COCO captioning decoding (``configs/caption_coco.yaml`` of salesforce/BLIP: beam 3, length 5..20, prompt
#: "a picture of "), as the schema writes it (``cvld.captioning.generate`` and ``.prompt``)
_CAPTIONING = schema_default("cvld.captioning")


def _itc(model, processor, batch_size: int) -> BlipItcScorer:
    return BlipItcScorer(model, processor, batch_size=batch_size, progress=False, device=model.device)


def _itm(model, processor, batch_size: int, itm_score: str) -> BlipItmScorer:
    return BlipItmScorer(model, processor, itm_score=itm_score, batch_size=batch_size, progress=False,
                         device=model.device)


def itm_match_scores(model, processor, images: Sequence, texts: Sequence[str], *, batch_size: int = 32
                     ) -> np.ndarray:
    """``P(match)`` of BLIP's ITM head (softmax of its two logits, class 1) for aligned pairs
    ``(images[i], texts[i])``; shape ``(n,)``, float32."""
    return _itm(model, processor, batch_size, "probability").score_pairs(list(images), [str(t) for t in texts])


# --------------------------------------------------------------------------------------------
# CelebA attribute classification (Table 1)
# --------------------------------------------------------------------------------------------
def classify_attributes(model, processor, frame: pd.DataFrame, attributes: Sequence[str] = GENDER_INDEPENDENT,
                        prompts: Mapping[str, tuple[str, str]] | None = None, *, head: str = "itc",
                        batch_size: int = 32) -> pd.DataFrame:
    """Zero-shot (or prompt-tuned) binary attribute scores: one row per image of ``frame`` (``image_id``,
    ``image_path``), one column per attribute, ``score = s(image, positive prompt) − s(image, negative prompt)``.

    ``head="itc"`` (default): ``s`` = cosine of BLIP's projected [CLS] embeddings (the score is the log-odds of the
    two-prompt softmax up to BLIP's temperature, so > 0 means "positive" wins); ``head="itm"``: ``s`` = ITM match
    probability. ``prompts`` maps attribute -> (positive, negative); default :data:`DEFAULT_PROMPTS`.
    """
    prompts = dict(DEFAULT_PROMPTS if prompts is None else prompts)
    missing = [a for a in attributes if a not in prompts]
    if missing:
        raise ConfigError(f"classify_attributes: no prompts for {missing}. Fix: give prompts[attribute] = "
                          "(positive prompt, negative prompt)")
    if head not in ("itc", "itm"):
        raise ConfigError(f"classify_attributes: head must be 'itc' or 'itm', got {head!r}")
    texts = [t for a in attributes for t in prompts[a]]
    images = list(frame["image_path"])
    if head == "itc":
        s = _itc(model, processor, batch_size).score_matrix(images, texts)
    else:
        s = _itm(model, processor, batch_size, "probability").score_matrix(images, texts)
    out = pd.DataFrame(s[:, 0::2] - s[:, 1::2], columns=list(attributes))
    out.insert(0, "image_id", list(frame["image_id"]))
    return out


def _column(table, attribute: str, what: str) -> np.ndarray:
    if attribute not in table:
        raise ValueError(f"classification_metrics: {what} has no column {attribute!r}")
    return np.asarray(table[attribute])


def classification_metrics(scores: pd.DataFrame, labels: pd.DataFrame, gender: Sequence, *,
                           val_scores: pd.DataFrame | None = None, val_labels: pd.DataFrame | None = None,
                           attributes: Sequence[str] | None = None, threshold: float = 0.0,
                           n_resamples: int = 0) -> pd.DataFrame:
    """Table 1 metrics per attribute (×100) and their mean over the attributes (last row, ``"mean"``).

    ``scores`` / ``labels``: one column per attribute (rows aligned; labels 0/1), ``gender``: the protected
    attribute per row (CelebA ``Male`` 0/1). Predictions are ``score > t``; ``t`` is calibrated per attribute on
    the validation split (``val_scores`` / ``val_labels``) with Ramaswamy et al.'s rule (reference notes A5:
    the cp-th largest validation score, cp = number of validation positives) when both are given, else
    ``threshold`` (0: the positive prompt must beat the negative one).

    * ``AP``: average precision of the scores (threshold-free);
    * ``mAcc``: mean accuracy over the demographic groups **target × gender** (the same four Y×A groups as ΔAcc;
      our reading of appendix A's "mean accuracy over demographic groups", i.e. group-balanced accuracy);
    * ``DEO``: ``|TPR_male − TPR_female|`` (Ramaswamy et al. 2021); point estimate on the test set, or the median
      of ``n_resamples`` bootstrap resamples as they report when ``n_resamples > 0``;
    * ``ΔAcc``: accuracy of the whole set minus the worst Y×A group (appendix A: "the worst-performing group ...
      and the dataset average"; ``delta_accuracy(..., reference="mean")``).

    An attribute whose DEO or AP is undefined (no positive in a gender) gets NaN with a warning; the mean row
    skips NaN. Columns: ``attribute, AP, mAcc, DEO, ΔAcc, threshold``.
    """
    attributes = list(attributes if attributes is not None else [c for c in scores.columns if c != "image_id"])
    g = np.asarray(gender)
    if len(g) != len(scores) or len(labels) != len(scores):
        raise ValueError(f"classification_metrics: {len(scores)} score rows, {len(labels)} label rows, "
                         f"{len(g)} genders; they must be aligned")
    if (val_scores is None) != (val_labels is None):
        raise ValueError("classification_metrics: give both val_scores and val_labels, or neither")
    rows = []
    for a in attributes:
        s = _column(scores, a, "scores").astype(float)
        y = _column(labels, a, "labels").astype(int)
        t = float(threshold)
        if val_scores is not None:
            t = calibrated_threshold(_column(val_labels, a, "val_labels").astype(int),
                                     _column(val_scores, a, "val_scores").astype(float))
        pred = (s > t).astype(int)
        groups = intersect_groups(y, g)
        row = {"attribute": a, "AP": np.nan, "mAcc": 100 * mean_group_accuracy(y, pred, groups), "DEO": np.nan,
               "ΔAcc": 100 * delta_accuracy(y, pred, groups, reference="mean"), "threshold": t}
        for key, fn in (("AP", lambda: average_precision(y, s)),
                        ("DEO", lambda: deo_from_scores(y, s, g, threshold=t, n_resamples=n_resamples)["deo"])):
            try:
                row[key] = 100 * fn()
            except ValueError as exc:
                log.warning("classification_metrics: %s %s: %s (left as NaN)", a, key, exc)
        rows.append(row)
    table = pd.DataFrame(rows)
    mean = {"attribute": "mean", **{c: float(np.nanmean(table[c])) if table[c].notna().any() else np.nan
                                    for c in ("AP", "mAcc", "DEO", "ΔAcc")}, "threshold": np.nan}
    return pd.concat([table, pd.DataFrame([mean])], ignore_index=True)


# --------------------------------------------------------------------------------------------
# FairFace retrieval fairness (Table 2 left, Figure 5 left)
# --------------------------------------------------------------------------------------------
def fairface_similarity(model, processor, frame: pd.DataFrame, queries: Sequence[str] = FAIRFACE_QUERIES, *,
                        batch_size: int = 32, rerank_k: int | None = None) -> np.ndarray:
    """``(n_queries, n_images)`` ranking score of each query against each image of ``frame`` (``image_path``):
    with ``rerank_k`` BLIP's two-stage retrieval (§4.3: ITC, then ITM re-ranks each query's ITC top ``rerank_k``
    images, :func:`itc_itm_rerank`; deeper images keep their ITC order below); ``None`` the ITC cosine alone."""
    images, queries = list(frame["image_path"]), list(queries)
    itc = _itc(model, processor, batch_size).score_matrix(images, queries)   # (n_images, n_queries)
    if rerank_k is None:
        return itc.T
    itm = _itm(model, processor, batch_size, "logit")
    by_query, _ = itc_itm_rerank(itc, lambda i, j: itm.score_index_pairs(images, queries, i, j), rerank_k, None)
    return by_query.T


def _genders(frame_or_genders) -> list[str]:
    values = frame_or_genders["gender"] if isinstance(frame_or_genders, pd.DataFrame) else frame_or_genders
    out = [str(v).strip().lower() for v in values]
    bad = sorted(set(out) - {"male", "female"})
    if bad:
        raise ValueError(f"gender values must be Male/Female, got {bad[:5]}")
    return out


def fairface_bias_table(similarity: np.ndarray, genders: Sequence[str], queries: Sequence[str],
                        ks: Sequence[int] = (1000, 128)) -> pd.DataFrame:
    """Bias@K and MaxSkew@K per query and K, plus a ``"mean"`` row per K (the Table 2 value).

    Images are ranked per query by descending similarity (ties by image order). ``k_used = min(K, n_images)``
    (FairFace val has 10,954 images, so K = 1000 and 128 are used as given; small sets are capped and the cap
    recorded). ``bias``: signed Bias@K of Wang et al. 2021 ((N_male − N_female)/(N_male + N_female), positive =
    towards men); ``abs_bias``: its absolute value. The mean row averages over queries; Table 2's values are all
    positive and ≈ 1.1–1.2 × MaxSkew, which fits the mean of ``abs_bias`` (the signed mean could cancel across
    queries), so report ``abs_bias`` next to Table 2 and ``bias`` for the direction. ``max_skew``: MaxSkew@K of
    Geyik et al. 2019 over {male, female} with a uniform target (ln, a zero count becomes 1/k).
    """
    sim = np.asarray(similarity, dtype=np.float64)
    g = _genders(genders)
    if sim.shape != (len(queries), len(g)):
        raise ValueError(f"similarity has shape {sim.shape}, expected ({len(queries)}, {len(g)})")
    rows = []
    for q, query in enumerate(queries):
        ranked = [g[i] for i in ranking_from_scores(sim[q])]
        for k in ks:
            ku = min(int(k), len(g))
            b = bias_at_k(ranked, ku)
            rows.append({"query": query, "k": int(k), "k_used": ku, "bias": b, "abs_bias": abs(b),
                         "max_skew": max_skew_at_k(ranked, ku, labels=("male", "female"))})
    table = pd.DataFrame(rows)
    means = (table.groupby(["k", "k_used"], sort=False)[["bias", "abs_bias", "max_skew"]].mean().reset_index()
             .assign(query="mean"))
    return pd.concat([table, means[table.columns]], ignore_index=True)


def fairface_retrieval(model, processor, frame: pd.DataFrame, queries: Sequence[str] = FAIRFACE_QUERIES,
                       ks: Sequence[int] = (1000, 128), *, batch_size: int = 32) -> pd.DataFrame:
    """:func:`fairface_bias_table` of :func:`fairface_similarity` on a FairFace frame (``image_path``, ``gender``)."""
    sim = fairface_similarity(model, processor, frame, queries, batch_size=batch_size)
    return fairface_bias_table(sim, list(frame["gender"]), queries, ks)


def maxskew_curve(similarity: np.ndarray, genders: Sequence[str], ks: Sequence[int] | None = None) -> pd.DataFrame:
    """Figure 5 (left): MaxSkew@K averaged over the queries (rows of ``similarity``) for each K in ``ks``
    (default 1..n_images). Columns ``k, max_skew``."""
    sim = np.asarray(similarity, dtype=np.float64)
    g = _genders(genders)
    if sim.ndim != 2 or sim.shape[1] != len(g):
        raise ValueError(f"similarity must be (n_queries, {len(g)}), got {sim.shape}")
    ks = list(range(1, len(g) + 1)) if ks is None else [int(k) for k in ks]
    ranked = [[g[i] for i in ranking_from_scores(row)] for row in sim]
    return pd.DataFrame({"k": ks, "max_skew": [float(np.mean([max_skew_at_k(r, k, labels=("male", "female"))
                                                              for r in ranked])) for k in ks]})


# --------------------------------------------------------------------------------------------
# COCO / Flickr30k retrieval (Table 2 right)
# --------------------------------------------------------------------------------------------
def itc_itm_rerank(itc: np.ndarray, itm_pairs, k_per_column: int | None, k_per_row: int | None
                   ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """BLIP's two-stage ranking (``evaluation`` in BLIP's ``train_retrieval.py``) on an ``(n_rows, n_cols)`` ITC
    matrix (rows = images, columns = texts): the top ``k_per_column`` rows of each column (text→image) and the top
    ``k_per_row`` columns of each row (image→text) are re-scored with ``ITM match logit + ITC`` and rank above every
    other entry; the others keep their ITC order below them (BLIP leaves them at −100; the order only matters for
    K deeper than the re-ranked depth, e.g. FairFace's Bias@1K). ``itm_pairs(rows, cols)`` returns the ITM logits of
    those index pairs; a pair in both shortlists is scored once. Returns ``(by_column, by_row)`` (None for a
    direction whose k is None). The one re-ranking of CVLD's and the spurious-retrieval study's BLIP evaluations."""
    itc = np.asarray(itc, dtype=np.float64)
    n_r, n_c = itc.shape
    k_c = 0 if k_per_column is None else min(int(k_per_column), n_r)
    k_r = 0 if k_per_row is None else min(int(k_per_row), n_c)
    by_col = (np.argsort(-itc, axis=0, kind="stable")[:k_c] if k_c          # (k, n_cols) rows per column
              else np.zeros((0, n_c), dtype=np.int64))
    by_row = (np.argsort(-itc, axis=1, kind="stable")[:, :k_r] if k_r       # (n_rows, k) columns per row
              else np.zeros((n_r, 0), dtype=np.int64))
    pi = np.concatenate([by_col.ravel(), np.repeat(np.arange(n_r), k_r)])
    pj = np.concatenate([np.tile(np.arange(n_c), k_c), by_row.ravel()])
    flat, inverse = np.unique(pi * n_c + pj, return_inverse=True)
    logit = np.asarray(itm_pairs(flat // n_c, flat % n_c), dtype=np.float64) if flat.size else np.zeros(0)
    fused = (logit + itc.ravel()[flat])[inverse]

    def ranked(sel: slice) -> np.ndarray:
        vals = fused[sel]
        below = itc - itc.max() + (vals.min() if vals.size else 0.0) - 1.0   # ITC order, under every re-ranked entry
        out = below.copy()
        out[pi[sel], pj[sel]] = vals
        return out

    nt = k_c * n_c
    return (ranked(slice(0, nt)) if k_per_column is not None else None,
            ranked(slice(nt, None)) if k_per_row is not None else None)


def retrieval_recall(model, processor, images: Sequence, captions: Sequence[Sequence[str]] | Sequence[str],
                     text_image: Sequence[int] | None = None, *, rerank_k: int | None = 256,
                     ks: Sequence[int] = (1, 5, 10), batch_size: int = 32) -> dict[str, float]:
    """Image-text retrieval Recall@K in percent with BLIP's evaluation procedure (``evaluation`` in BLIP's
    ``train_retrieval.py``): ITC cosine similarities rank every candidate; with ``rerank_k`` (default 256, BLIP's
    COCO ``k_test``; 128 for Flickr30k) the top ``rerank_k`` candidates of each query are re-scored with
    ``ITM match logit + ITC cosine`` and rank above all others (separately for text→image and image→text);
    ``rerank_k=None`` is ITC only.

    ``captions`` is a list of caption lists (one list per image) or, with ``text_image``, a flat list with the
    image index of each caption. Returns every ``image_to_text@K`` / ``text_to_image@K`` of
    :func:`counterfactory.metrics.recall_at_k`, plus ``rec@1`` = text→image R@1 and ``mrec`` = the mean of
    text→image R@1/5/10 (the paper's Rec@1 and mRec), and ``rerank_k`` as used (capped at the set sizes).
    """
    if text_image is None:
        texts = [str(c) for caps in captions for c in caps]
        owner = np.array([i for i, caps in enumerate(captions) for _ in caps], dtype=np.int64)
    else:
        texts, owner = [str(c) for c in captions], np.asarray(text_image, dtype=np.int64)
    images = list(images)
    ks = sorted({int(k) for k in ks} | {1, 5, 10})
    itc = _itc(model, processor, batch_size).score_matrix(images, texts)   # (n_img, n_txt) cosine
    n_img, n_txt = itc.shape
    if rerank_k is None:
        res = recall_at_k(itc, owner, ks)
        used = None
    else:
        k_t2i, k_i2t = min(int(rerank_k), n_img), min(int(rerank_k), n_txt)
        if min(k_t2i, k_i2t) < min(max(ks), n_img, n_txt):
            raise ConfigError(f"retrieval_recall: rerank_k={rerank_k} is smaller than the largest K ({max(ks)}). "
                              "Fix: use rerank_k >= max(ks)")
        itm = _itm(model, processor, batch_size, "logit")
        m_t2i, m_i2t = itc_itm_rerank(itc, lambda i, j: itm.score_index_pairs(images, texts, i, j), k_t2i, k_i2t)
        res = {**{k: v for k, v in recall_at_k(m_i2t, owner, ks).items() if k.startswith("image_to_text")},
               **{k: v for k, v in recall_at_k(m_t2i, owner, ks).items() if k.startswith("text_to_image")}}
        used = k_t2i
    res["rec@1"] = res["text_to_image@1"]
    res["mrec"] = float(np.mean([res[f"text_to_image@{k}"] for k in (1, 5, 10)]))
    res["rerank_k"] = used
    return res


# --------------------------------------------------------------------------------------------
# Captioning (Table 4)
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def generate_captions(model, processor, images: Sequence, max_length: int = _CAPTIONING["generate"]["max_length"],
                      num_beams: int = _CAPTIONING["generate"]["num_beams"], *,
                      min_length: int = _CAPTIONING["generate"]["min_length"],
                      prompt: str | None = _CAPTIONING["prompt"], batch_size: int = 16) -> list[str]:
    """Captions with BLIP's COCO decoding: beam search (``num_beams`` 3), ``min_length`` 5 and ``max_length`` 20
    tokens including the prompt, prompt ``"a picture of "`` (BLIP's ``caption_coco.yaml``), deterministic
    (``do_sample=False``). The prompt is removed from the returned captions, as BLIP does. Images are not padded
    and the prompt is the same for all, so captions do not depend on the batch size.

    (:func:`counterfactory.generation.captioning.caption_batch` is the registry-driven captioner of another study;
    it has no ``min_length``, which BLIP's COCO numbers depend on, hence this variant.)
    """
    for name, v in (("max_length", max_length), ("num_beams", num_beams), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"generate_captions: {name} must be an integer >= 1, got {v!r}")
    model.eval()
    device = model.device
    out: list[str] = []
    for start in range(0, len(images), batch_size):
        pil = [load_image(im) for im in images[start:start + batch_size]]
        kw: dict[str, Any] = {"images": pil, "return_tensors": "pt"}
        if prompt:
            kw["text"] = [prompt] * len(pil)
        inputs = {k: v.to(device) for k, v in processor(**kw).items() if isinstance(v, torch.Tensor)}
        seqs = model.generate(**inputs, do_sample=False, num_beams=num_beams, max_length=max_length,
                              min_length=min(min_length, max_length))
        for text in processor.batch_decode(seqs, skip_special_tokens=True):
            text = text.strip()
            if prompt and text.startswith(prompt.strip()):
                text = text[len(prompt.strip()):].strip()
            out.append(text)
    return out
