"""ODmAP@k (§3.2) and standard retrieval Recall@K (Table 2) of one model.

ODmAP@k: the synthetic test images are the queries; the gallery is every caption of train + val + test
(:func:`.captions.gallery`). A caption is correct for a query when it mentions none of the removed classes and at
least one class left in the image (:func:`counterfactory.metrics.odmap_relevance`'s rule, here as two boolean
matrix products over the gallery's mention matrix); AP@k and the mean over queries are
:func:`counterfactory.metrics.odmap_at_k` (queries without a correct caption in the gallery are skipped, and
counted in ``ODmAP/queries_skipped``). The AP@k divisor is ``evaluation.odmap_normaliser``: the paper's
mAP@k of its reference [52] (pytorch-metric-learning, Musgrave et al. 2020) divides by the correct captions
inside the top k (``hits_in_top_k``; a query with none scores 0); ``min_k_relevant`` (ours, the
information-retrieval AP@k) and ``relevant`` are options. Every result records the one used as the metric
row ``ODmAP/normaliser=<name>`` (value 1). Gallery captions are encoded once; queries are scored in chunks, so a
616k-caption MS-COCO gallery never needs a full score matrix.

Recall@K: the test split's images and their captions (MS-COCO 5K, Flickr30k 1K), image→text (``TR@K``) and
text→image (``IR@K``), :func:`counterfactory.metrics.recall_at_k`. Both rank by the model's contrastive (ITC)
embeddings; a BLIP role with ``evaluation.blip_rerank_k`` (paper config: 256 COCO / 128 Flickr30k) then re-ranks
each query's ITC top k by ITM logit + ITC, BLIP's own evaluation procedure
(:func:`counterfactory.evaluation.cvld.itc_itm_rerank`, the one shared with CVLD): the paper does not name the
head, but its zero-shot COCO text→image R@1 (55.0) is the figure CVLD reports for BLIP^PT with that procedure.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from ...errors import input_error
from ...metrics import odmap_at_k, recall_at_k

log = logging.getLogger(__name__)

#: query x gallery entries scored at a time
CHUNK_ELEMENTS = 20_000_000


def class_matrix(lists, classes: list[str]) -> np.ndarray:
    """Boolean ``[n, len(classes)]`` indicator of lists of class names."""
    index = {c: j for j, c in enumerate(classes)}
    out = np.zeros((len(lists), len(classes)), dtype=bool)
    for i, names in enumerate(lists):
        for name in names:
            out[i, index[name]] = True
    return out


def relevance(removed: np.ndarray, present: np.ndarray, mentions: np.ndarray) -> np.ndarray:
    """``[n_queries, n_captions]``: caption mentions a present class and no removed class (§3.2)."""
    m = mentions.astype(np.float32).T
    return ((present.astype(np.float32) @ m) > 0) & ~((removed.astype(np.float32) @ m) > 0)


#: the paper's AP@k divisor (§3.2, reference [52]'s library)
PAPER_NORMALISER = "hits_in_top_k"


def normaliser_metric(normaliser: str) -> str:
    """Name of the metric row that records the AP@k normaliser of a result."""
    return f"ODmAP/normaliser={normaliser}"


def odmap(query_emb: np.ndarray, gallery_emb: np.ndarray, removed: np.ndarray, present: np.ndarray,
          mentions: np.ndarray, ks, normaliser: str = PAPER_NORMALISER, rerank=None) -> dict[str, float]:
    """``ODmAP@k`` for each k (percent), ``ODmAP/queries_skipped`` and the normaliser's record row from
    embeddings and class indicators. ``rerank(sim, lo)`` (optional) turns a chunk's ITC scores (queries ``lo`` ..
    ``lo + len(sim)``) into the scores it is ranked by (BLIP's ITM re-ranking)."""
    n_q, n_g = len(query_emb), len(gallery_emb)
    per = {k: np.full(n_q, np.nan) for k in ks}
    step = max(1, CHUNK_ELEMENTS // max(n_g, 1))
    for lo in range(0, n_q, step):
        hi = min(n_q, lo + step)
        sim = query_emb[lo:hi] @ gallery_emb.T
        rel = relevance(removed[lo:hi], present[lo:hi], mentions)
        if not rel.any():
            continue
        if rerank is not None:
            sim = rerank(sim, lo)
        for k in ks:
            _, part = odmap_at_k(sim, rel, min(k, n_g), return_per_query=True, normaliser=normaliser)
            per[k][lo:hi] = part
    out = {}
    for k in ks:
        valid = ~np.isnan(per[k])
        out[f"ODmAP@{k}"] = float(100.0 * per[k][valid].mean()) if valid.any() else float("nan")
    skipped = int(np.isnan(per[ks[0]]).sum())
    if skipped:
        log.info("ODmAP: %d of %d queries have no correct caption in the gallery (skipped)", skipped, n_q)
    out["ODmAP/queries_skipped"] = float(skipped)
    out[normaliser_metric(normaliser)] = 1.0
    return out


def read_gallery(path) -> pd.DataFrame:
    frame = pd.read_parquet(path)
    for col in ("caption", "mentions", "split", "image_path"):
        if col not in frame.columns:
            raise input_error(path, None, f"missing column {col!r}", "rebuild it with `counterfactory spurious captions`")
    return frame


def itm_reranker(scorer, rerank_k: int | None):
    """``(rerank(itc, images, texts, k_per_column, k_per_row), depth)`` for a BLIP ITC scorer and a depth (BLIP's
    ITC + ITM procedure, :func:`counterfactory.evaluation.cvld.itc_itm_rerank`); ``(None, None)`` for other scorers
    or ``rerank_k`` None (ITC only)."""
    from ...scorers import BlipItcScorer, BlipItmScorer

    if rerank_k is None or not isinstance(scorer, BlipItcScorer):
        return None, None
    from ...evaluation.cvld import itc_itm_rerank

    itm = BlipItmScorer(scorer.model, scorer.processor, itm_score="logit", batch_size=scorer.batch_size,
                        progress=False, device=scorer.device)

    def rerank(itc, images, texts, k_per_column, k_per_row):
        return itc_itm_rerank(itc, lambda i, j: itm.score_index_pairs(images, texts, i, j), k_per_column, k_per_row)

    return rerank, int(rerank_k)


def evaluate(cfg, role: str, gallery_path, queries_path, ks=(1, 5, 10), progress: bool = False,
             normaliser: str = PAPER_NORMALISER, rerank_k: int | None = None) -> dict[str, float]:
    """``ODmAP@k``, ``TR@K`` and ``IR@K`` of ``role`` (its configured source, e.g. a fine-tuned checkpoint);
    ``normaliser`` is the AP@k divisor (``evaluation.odmap_normaliser``); ``rerank_k`` the ITM re-ranking depth of
    a BLIP role (``evaluation.blip_rerank_k`` of the dataset; None: ITC only), recorded as ``rerank_k``."""
    from ...scorers import scorer_from_config

    ks = [int(k) for k in ks]
    gallery = read_gallery(gallery_path)
    queries = pd.read_parquet(queries_path)
    scorer = scorer_from_config(cfg, role, head="itc", progress=progress)
    rerank, depth = itm_reranker(scorer, rerank_k)
    out: dict[str, float] = {}
    if depth is not None:
        out["rerank_k"] = float(depth)
    gal_emb = scorer.encode_texts(gallery["caption"].astype(str).tolist())
    if len(queries):
        classes = sorted({c for col in ("removed_categories", "present_categories") for v in queries[col] for c in v}
                         | {c for v in gallery["mentions"] for c in v})
        q_paths = [str(p) for p in queries["image_path"]]
        q_emb = scorer.encode_images(q_paths)
        captions = gallery["caption"].astype(str).tolist()
        chunk_rerank = None
        if rerank is not None:      # image queries: each one's ITC top k captions re-ranked by ITM + ITC
            def chunk_rerank(sim, lo):
                return rerank(sim, q_paths[lo:lo + len(sim)], captions, None, depth)[1]
        out.update(odmap(q_emb, gal_emb, class_matrix(queries["removed_categories"], classes),
                         class_matrix(queries["present_categories"], classes),
                         class_matrix(gallery["mentions"], classes), ks, normaliser, chunk_rerank))
    else:
        log.warning("%s: no ODmAP queries (no selected test image)", queries_path)
    test = gallery[gallery["split"] == "test"].reset_index()
    if len(test):
        paths = [str(p) for p in test["image_path"]]
        images = list(dict.fromkeys(paths))
        index = {p: i for i, p in enumerate(images)}
        img_emb = scorer.encode_images(images)
        txt_emb = gal_emb[test["index"].to_numpy()]
        owner = np.array([index[p] for p in paths])
        itc = img_emb @ txt_emb.T
        if rerank is None:
            tr = ir = itc
        else:                       # BLIP's procedure, each direction re-ranked separately
            ir, tr = rerank(itc, images, test["caption"].astype(str).tolist(), depth, depth)
        rec_tr, rec_ir = recall_at_k(tr, owner, ks), recall_at_k(ir, owner, ks)
        for k in ks:
            out[f"TR@{k}"] = float(rec_tr[f"image_to_text@{k}"])
            out[f"IR@{k}"] = float(rec_ir[f"text_to_image@{k}"])
    return out
