"""One fine-tuning run, evaluated (COCO-Counterfactuals §5, appendix B.3; reused by every study's runs).

:func:`run_one` trains a model role on one mixture with one (seed, data_seed) through
:func:`counterfactory.training.runs.train_one` (or takes it as loaded, for a table's pre-trained row),
evaluates the kept checkpoint through the ordinary loaders -- Karpathy-split retrieval Recall@K
(:func:`evaluate_retrieval`), zero-shot classification, and optionally retrieval on counterfactual pairs
(:func:`evaluate_pairs`) -- and writes the tidy rows ``experiment, mixture, seed, data_seed, metric, value``,
``history.csv`` and ``run.json``. It lives above training because it runs both.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.karpathy import image_paths, load_karpathy
from ..io import write_csv, write_json
from ..metrics import recall_at_k
from ..training.runs import (CLASSIFICATION_MEAN, HISTORY_COLUMNS, RUN_COLUMNS, _settings, retrieval_specs,
                             stage_config, train_one)
from . import classify
from .readers import read_pairs

log = logging.getLogger(__name__)


def _recall_metrics(name: str, sim: np.ndarray, text_image: np.ndarray, ks) -> dict[str, float]:
    recall = recall_at_k(sim, text_image, ks=tuple(ks))
    out = {f"{name}/{k}": v for k, v in recall.items()}
    out[f"{name}/mean"] = float(np.mean(list(recall.values())))
    return out


def evaluate_retrieval(cfg: dict, role: str, spec: dict, progress: bool = False) -> dict[str, float]:
    """Image-text retrieval Recall@K on a Karpathy-format split (Flickr30k 1K test in Table 3, the MS-COCO
    test set in Table 12)."""
    from ..scorers import scorer_from_config

    table = load_karpathy(spec["karpathy_json"], split=spec["split"], image_root=spec["image_root"])
    paths = image_paths(table, spec["image_root"], spec["karpathy_json"])   # image_root/filepath/filename
    images = list(dict.fromkeys(paths))
    index = {name: i for i, name in enumerate(images)}
    scorer = scorer_from_config(cfg, role, head="itc", progress=progress)
    img = scorer.encode_images(images)
    txt = scorer.encode_texts(table["caption"].tolist())
    return _recall_metrics(spec["name"], img @ txt.T, np.array([index[p] for p in paths]), spec["ks"])


def evaluate_pairs(cfg: dict, role: str, pairs_path: str | Path, name: str, ks=(1, 5, 10),
                   progress: bool = False) -> dict[str, float]:
    """Recall@K on counterfactual pairs (appendix A.1, the withheld COCO-CFs test set): the retrieval space is
    both images and both captions of every pair; caption_i describes image_i."""
    from ..scorers import scorer_from_config

    pairs = read_pairs(pairs_path)
    images = [*pairs["image_0"], *pairs["image_1"]]
    texts = [*pairs["caption_0"], *pairs["caption_1"]]
    scorer = scorer_from_config(cfg, role, head="itc", progress=progress)
    img, txt = scorer.encode_images([str(p) for p in images]), scorer.encode_texts(texts)
    return _recall_metrics(name, img @ txt.T, np.arange(len(texts)), ks)


def run_one(cfg: dict, manifest: str | Path, mixture: str, seed: int, data_seed: int, out_dir: str | Path,
            progress: bool = True, eval_pairs: str | Path | None = None, eval_pairs_name: str = "coco_cfs_test",
            default_eval: bool = True, role: str = "clip_train", experiment: str | None = None,
            train: bool = True, recipe: dict | None = None) -> pd.DataFrame:
    """Train one (mixture, seed) run of the model of ``role``, keep the best checkpoint and evaluate it: the
    evaluations of ``training.eval`` (unless ``default_eval`` is false) and, with ``eval_pairs``, retrieval on
    those counterfactual pairs (the in-domain test set of appendix A.1). ``experiment`` names the runs'
    experiment (default ``training.experiment``; the A.1 runs use the model role, one experiment per model).
    ``train=False`` evaluates the model as loaded (the pre-trained row of Table 5); the manifest is not read.
    ``recipe`` replaces settings of ``training`` for this run (A.1's per-model recipe, ``in_domain.recipes``)."""
    from ..training import settings_dict

    if recipe:
        cfg = copy.copy(cfg)
        cfg["training"] = {**cfg["training"], **recipe}
    cfg = stage_config(cfg)   # training.precision (paper config: fp32) for the training and its evaluations
    section = cfg["training"]
    out_dir = Path(out_dir)
    if train:
        settings, history, best_step, best_val = train_one(cfg, manifest, seed, data_seed, out_dir, progress, role)
        # evaluate the best checkpoint through the ordinary loaders (the role -> the checkpoint)
        eval_cfg = copy.deepcopy(cfg)
        eval_cfg["models"][role] = {**eval_cfg["models"][role], "source": str(out_dir / "checkpoint")}
    else:  # the pre-trained row of a table: the same evaluations of the untouched model
        settings = _settings(cfg, seed, data_seed)
        history, best_step, best_val, eval_cfg = [], 0, float("nan"), cfg
    write_csv(out_dir / "history.csv", pd.DataFrame(history, columns=HISTORY_COLUMNS))
    metrics = {"val_loss": best_val} if train else {}
    ev = section["eval"] if default_eval else {}
    for spec in retrieval_specs(ev):
        metrics.update(evaluate_retrieval(eval_cfg, role, spec, progress))
    top1 = {}
    for dataset in ev.get("classification") or []:
        res = classify.run_classification(eval_cfg, role, dataset, progress=progress)
        top1[dataset] = metrics[f"{dataset}/top1"] = res["top1"]
    if top1:  # Table 4's Mean column: per run, so it is summarised and t-tested like any metric
        metrics[CLASSIFICATION_MEAN] = float(np.mean(list(top1.values())))
    if eval_pairs:
        metrics.update(evaluate_pairs(eval_cfg, role, eval_pairs, eval_pairs_name, progress=progress))
    rows = pd.DataFrame([{"experiment": experiment or section["experiment"], "mixture": mixture, "seed": seed,
                          "data_seed": data_seed, "metric": k, "value": float(v)} for k, v in metrics.items()],
                        columns=RUN_COLUMNS)
    write_json(out_dir / "run.json", {"trained": train, "role": role, "best_step": best_step,
                                       "best_val_loss": best_val, "steps": len(history),
                                       "settings": settings_dict(settings)})
    write_csv(out_dir / "metrics.csv", rows)
    return rows
