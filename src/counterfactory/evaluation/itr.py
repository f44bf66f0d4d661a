"""Zero-shot image-text retrieval (§4.2.1, Tables 2 and 13): retrieval sets and the per-model runner.

Recall@K (TR = image→text, IR = text→image, in percent, :func:`counterfactory.metrics.recall_at_k`) on
``MS-COCO`` (the matched real subset), ``COCO-CFs`` (both images of every pair with their own captions)
and the optional ``itr.subsets``; see :mod:`counterfactory.evaluation` for the protocol.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from ..errors import ConfigError, input_error
from ..metrics import recall_at_k
from .readers import (check_files, coco_image_dir, image_files, pair_image_ids, read_captions, read_pairs,
                      read_subset_ids)
from .settings import BASELINE, COCO_CFS, model_columns, settings

log = logging.getLogger(__name__)


@dataclass
class RetrievalSet:
    name: str
    images: list[str]
    texts: list[str]
    text_image: np.ndarray  # text j describes image text_image[j]

    def __post_init__(self):
        self.text_image = np.asarray(self.text_image, dtype=np.int64)


def cf_retrieval_set(pairs: pd.DataFrame, name: str = COCO_CFS) -> RetrievalSet:
    """2N images (``image_0``, ``image_1`` of every pair), each with its own caption."""
    n = len(pairs)
    images = list(pairs["image_0"]) + list(pairs["image_1"])
    texts = list(pairs["caption_0"].astype(str)) + list(pairs["caption_1"].astype(str))
    return RetrievalSet(name, images, texts, np.arange(2 * n))


def coco_retrieval_set(pairs: pd.DataFrame, captions: pd.DataFrame, coco_dir: Path, mode: str = "matched",
                       pairs_path="<pairs>") -> RetrievalSet:
    """The matched MS-COCO subset: the original images of the pairs, with the pairs' original
    captions (``matched``, one per distinct caption) or every caption of those images (``all``)."""
    if mode not in ("matched", "all"):
        raise ConfigError(f"evaluation.itr.coco_captions: {mode!r} is not matched or all")
    image_ids = pair_image_ids(pairs, captions, pairs_path)
    files = image_files(captions, coco_dir)
    uniq = list(dict.fromkeys(image_ids))
    index = {i: k for k, i in enumerate(uniq)}
    if mode == "matched":
        key = pairs["caption_id"].astype(str) if "caption_id" in pairs.columns else pairs["id"]
        frame = pd.DataFrame({"key": key, "text": pairs["caption_0"].astype(str), "image": image_ids})
        frame = frame.drop_duplicates("key")
        texts, owners = list(frame["text"]), [index[i] for i in frame["image"]]
    else:
        sub = captions[captions["image_id"].isin(index)]
        texts, owners = list(sub["caption"].astype(str)), [index[i] for i in sub["image_id"]]
    images = [files[i] for i in uniq]
    check_files(images, "MS-COCO image")
    return RetrievalSet(BASELINE, images, texts, np.asarray(owners))


def _topk_indices(scores: np.ndarray, k: int, axis: int) -> np.ndarray:
    """Indices of the k largest entries along ``axis`` (k capped at the axis length)."""
    k = min(k, scores.shape[axis])
    part = np.argpartition(-scores, k - 1, axis=axis)
    return np.take(part, np.arange(k), axis=axis)


def retrieval_recall(scorer, rset: RetrievalSet, ks: Sequence[int], shortlist=None,
                     shortlist_k: int | None = None) -> dict[str, float]:
    """Recall@K (``image_to_text@K`` = TR@K, ``text_to_image@K`` = IR@K) of ``scorer`` on ``rset``.

    Cross-encoders with a ``shortlist`` (a dual-encoder scorer) follow BLIP: the shortlist ranks all
    candidates, its top ``shortlist_k`` per query are re-scored by the ITM head and every other
    candidate ranks below them (separate shortlists for the two directions)."""
    if scorer.dual or shortlist is None:
        return recall_at_k(scorer.score_matrix(rset.images, rset.texts), rset.text_image, ks)
    if not shortlist.dual:
        raise ConfigError(f"evaluation.itr.shortlist.role: {shortlist.name} is not a dual encoder. "
                          f"Fix: name a CLIP-like role (or a model with head itc)")
    k = int(shortlist_k or max(ks))
    if k < max(ks):
        raise ConfigError(f"evaluation.itr.shortlist.k = {k} is smaller than the largest K ({max(ks)}). "
                          f"Fix: set shortlist.k >= {max(ks)}")
    cand = shortlist.score_matrix(rset.images, rset.texts)
    i2t = _topk_indices(cand, k, axis=1)          # (n_img, k) text candidates per image
    t2i = _topk_indices(cand, k, axis=0)          # (k, n_txt) image candidates per text
    n_img, n_txt = cand.shape
    rows_a = np.repeat(np.arange(n_img), i2t.shape[1])
    cols_a = i2t.ravel()
    rows_b = t2i.ravel()
    cols_b = np.tile(np.arange(n_txt), t2i.shape[0])
    flat = np.unique(np.concatenate([rows_a * n_txt + cols_a, rows_b * n_txt + cols_b]))
    pi, pj = flat // n_txt, flat % n_txt
    log.info("%s on %s: ITM re-ranking of %d shortlisted pairs (k=%d, from %s)", scorer.name, rset.name,
             flat.size, k, shortlist.name)
    s = scorer.score_index_pairs(rset.images, rset.texts, pi, pj)
    lookup = dict(zip(flat.tolist(), s.tolist()))
    m_i2t = np.full((n_img, n_txt), -np.inf, dtype=np.float32)
    m_i2t[rows_a, cols_a] = [lookup[x] for x in (rows_a * n_txt + cols_a).tolist()]
    m_t2i = np.full((n_img, n_txt), -np.inf, dtype=np.float32)
    m_t2i[rows_b, cols_b] = [lookup[x] for x in (rows_b * n_txt + cols_b).tolist()]
    tr = recall_at_k(m_i2t, rset.text_image, ks)
    ir = recall_at_k(m_t2i, rset.text_image, ks)
    return {**{k_: v for k_, v in tr.items() if k_.startswith("image_to_text")},
            **{k_: v for k_, v in ir.items() if k_.startswith("text_to_image")}}


def run_itr(cfg: dict, role: str, pairs_path, captions_path, *, progress: bool = True) -> pd.DataFrame:
    """Recall@K of one model role on MS-COCO (matched), COCO-CFs and the configured subsets.

    Returns a long table: ``role, model, source, scorer, dataset, n_pairs, n_images, n_texts, metric,
    value`` with metrics ``TR@K`` / ``IR@K`` in percent.
    """
    from ..scorers import scorer_from_config

    ev = settings(cfg)["itr"]
    ks = [int(k) for k in ev["ks"]]
    pairs = read_pairs(pairs_path)
    captions = read_captions(captions_path)
    sets = [(coco_retrieval_set(pairs, captions, coco_image_dir(cfg), ev["coco_captions"], pairs_path), len(pairs)),
            (cf_retrieval_set(pairs), len(pairs))]
    for label, path in (ev.get("subsets") or {}).items():
        keep = read_subset_ids(path)
        sub = pairs[pairs["id"].isin(keep)].reset_index(drop=True)
        if sub.empty:
            raise input_error(path, None, "none of its ids is among the selected pairs",
                              "list ids from selected_pairs.parquet")
        sets.append((cf_retrieval_set(sub, name=str(label)), len(sub)))
    for rset, _ in sets[1:]:
        check_files(rset.images, "COCO-CFs image")
    scorer = scorer_from_config(cfg, role, head=ev["head"], progress=progress)
    shortlist, shortlist_k = None, None
    if ev.get("shortlist") and not scorer.dual:
        sl = ev["shortlist"]
        if sl.get("role"):
            shortlist = scorer_from_config(cfg, sl["role"], head="itc", progress=progress)
            shortlist_k = sl.get("k")
    who = {**model_columns(cfg, role), "scorer": type(scorer).__name__}
    rows = []
    for rset, n_pairs in sets:
        rec = retrieval_recall(scorer, rset, ks, shortlist, shortlist_k)
        for direction, short in (("image_to_text", "TR"), ("text_to_image", "IR")):
            for k in ks:
                rows.append({**who, "dataset": rset.name, "n_pairs": n_pairs, "n_images": len(rset.images),
                             "n_texts": len(rset.texts), "metric": f"{short}@{k}", "value": rec[f"{direction}@{k}"]})
        log.info("%s on %s (%d images, %d texts): %s", role, rset.name, len(rset.images), len(rset.texts),
                 ", ".join(f"{r['metric']}={r['value']:.2f}" for r in rows[-2 * len(ks):]))
    return pd.DataFrame(rows)
