"""ITM score differences (§4.2.2, Figure 3): per-pair inputs, scores and the per-model runner.

``IR_r, IR_c, TR_r, TR_c`` from :func:`counterfactory.metrics.itm_differences` with ``G`` = the model's
ITM score; see :mod:`counterfactory.evaluation` for the roles of ``C_o, I_o, I_o^s, C_c, I_c^s, C_r, I_r``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError, input_error
from ..metrics import itm_differences
from .readers import check_files, coco_image_dir, image_files, pair_image_ids, read_captions, read_pairs
from .settings import ITM_METRICS, ITM_SCORES, model_columns, settings

log = logging.getLogger(__name__)

#: (caption column, image column) of the six ITM scores, in ITM_SCORES order
#: where the random MS-COCO pair (C_r, I_r) is drawn from (``evaluation.itm.random_pool``)
RANDOM_POOLS = ("subset", "matched", "all")
_ITM_PAIRS = (("C_r", "I_r"), ("C_r", "I_o"), ("C_o", "I_r"), ("C_c", "I_c_s"), ("C_c", "I_o_s"), ("C_o", "I_c_s"))


def itm_inputs(pairs: pd.DataFrame, captions: pd.DataFrame, coco_dir: Path, seed: int = 0,
               pool: str = "all", pairs_path="<pairs>") -> pd.DataFrame:
    """Per pair: ``C_o, I_o, I_o_s, C_c, I_c_s`` and a random MS-COCO pair ``C_r, I_r`` with ``I_r != I_o``.

    The random caption is drawn uniformly (``numpy.random.default_rng(seed)``) from a pool, redrawing while
    it belongs to ``I_o``'s image:

    - ``subset``: the pairs' own original captions with their MS-COCO images, i.e. the paper's "MS-COCO
      dataset" of footnote 11 (the 17,410 val2017 captions that have a COCO-Counterfactuals pair);
    - ``matched``: every caption of the pairs' images (about five per image);
    - ``all``: every caption of the caption table (all of val2017).
    """
    if pool not in RANDOM_POOLS:
        raise ConfigError(f"evaluation.itm.random_pool: {pool!r} is not one of {', '.join(RANDOM_POOLS)}")
    image_ids = pair_image_ids(pairs, captions, pairs_path)
    files = image_files(captions, coco_dir)
    if pool == "subset":
        ids = pairs["caption_id"] if "caption_id" in pairs.columns else pairs["id"]
        cand = pd.DataFrame({"caption_id": ids.astype(str).to_numpy(), "image_id": image_ids,
                             "caption": pairs["caption_0"].astype(str).to_numpy()})
    elif pool == "matched":
        cand = captions[captions["image_id"].isin(set(image_ids))]
    else:
        cand = captions
    cand = cand.reset_index(drop=True)
    if cand["image_id"].nunique() < 2:
        raise input_error(pairs_path, None, "random alternatives need captions of at least 2 MS-COCO images",
                          "evaluate on more than one image (or use evaluation.itm.random_pool: all)")
    rng = np.random.default_rng(seed)
    cand_img = cand["image_id"].to_numpy()
    draws = rng.integers(0, len(cand), size=len(pairs))
    own = np.asarray(image_ids, dtype=object)
    for _ in range(1000):
        clash = cand_img[draws] == own
        if not clash.any():
            break
        draws[clash] = rng.integers(0, len(cand), size=int(clash.sum()))
    else:  # pragma: no cover - needs an extremely unbalanced pool
        raise input_error(pairs_path, None, "could not draw random pairs from other images", "use a larger caption pool")
    rnd = cand.iloc[draws].reset_index(drop=True)
    out = pd.DataFrame({
        "id": pairs["id"].to_numpy(),
        "C_o": pairs["caption_0"].astype(str).to_numpy(), "I_o": [files[i] for i in image_ids],
        "I_o_s": pairs["image_0"].to_numpy(),
        "C_c": pairs["caption_1"].astype(str).to_numpy(), "I_c_s": pairs["image_1"].to_numpy(),
        "C_r": rnd["caption"].astype(str).to_numpy(), "I_r": [files[i] for i in rnd["image_id"]],
        "image_id": image_ids, "random_caption_id": rnd["caption_id"].to_numpy(),
    })
    check_files(set(out["I_o"]) | set(out["I_r"]), "MS-COCO image")
    check_files(set(out["I_o_s"]) | set(out["I_c_s"]), "COCO-CFs image")
    return out


def itm_scores(scorer, inputs: pd.DataFrame) -> pd.DataFrame:
    """The six ITM scores and the four differences of every pair, with one scorer call."""
    images = list(dict.fromkeys(p for _, col in _ITM_PAIRS for p in inputs[col]))
    texts = list(dict.fromkeys(t for col, _ in _ITM_PAIRS for t in inputs[col]))
    img_ix = {p: i for i, p in enumerate(images)}
    txt_ix = {t: i for i, t in enumerate(texts)}
    ii = np.concatenate([[img_ix[p] for p in inputs[icol]] for _, icol in _ITM_PAIRS])
    tt = np.concatenate([[txt_ix[t] for t in inputs[ccol]] for ccol, _ in _ITM_PAIRS])
    s = scorer.score_index_pairs(images, texts, ii, tt).reshape(len(_ITM_PAIRS), len(inputs))
    scores = dict(zip(ITM_SCORES, s))
    diffs = itm_differences(**scores)
    out = inputs[["id", "image_id", "random_caption_id"]].copy()
    for name in ITM_SCORES:
        out[name] = scores[name].astype(np.float64)
    for name in ITM_METRICS:
        out[name] = diffs[name]
    return out


def run_itm(cfg: dict, role: str, pairs_path, captions_path, *, progress: bool = True) -> pd.DataFrame:
    """Per-pair ITM scores and differences of one model role (long: one row per pair)."""
    from ..scorers import scorer_from_config

    ev = settings(cfg)["itm"]
    pairs = read_pairs(pairs_path)
    captions = read_captions(captions_path)
    inputs = itm_inputs(pairs, captions, coco_image_dir(cfg), seed=int(ev["seed"]), pool=ev["random_pool"],
                        pairs_path=pairs_path)
    scorer = scorer_from_config(cfg, role, head=ev["head"], progress=progress)
    out = itm_scores(scorer, inputs)
    who = {**model_columns(cfg, role), "scorer": type(scorer).__name__}
    for pos, (col, value) in enumerate(who.items()):
        out.insert(pos, col, value)
    log.info("%s: ITM differences of %d pairs: %s", role, len(out),
             ", ".join(f"{m} mean {out[m].mean():.4g}" for m in ITM_METRICS))
    return out
