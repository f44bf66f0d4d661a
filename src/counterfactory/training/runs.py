"""Fine-tuning runs over seeds (COCO-Counterfactuals §5, appendix B.3) as files.

* :func:`write_mixtures`: one manifest per mixture (``training/mixtures/<name>.parquet``) plus a summary
  with |D_train|, |D_train^CF| and % CFs;
* :func:`run_one`: train a model role (``clip_train``; A.1 also BridgeTower and FLAVA) on one mixture
  with one (seed, data_seed) on ``transformers.Trainer``
  (:mod:`counterfactory.training`), keep the best checkpoint, evaluate Flickr30k-1K-style retrieval and
  zero-shot classification, write tidy rows
  ``experiment, mixture, seed, data_seed, metric, value`` and the training curve;
* :func:`collect`: concatenate the per-run rows into the runs table the statistics read.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from . import mixtures as mx
from ..errors import ConfigError, input_error
from ..io import write_csv, write_json, write_parquet

log = logging.getLogger(__name__)

RUN_COLUMNS = ["experiment", "mixture", "seed", "data_seed", "metric", "value"]
HISTORY_COLUMNS = ["step", "epoch", "train_loss", "val_loss", "lr"]


def seed_pairs(section: dict) -> list[tuple[int, int]]:
    """(seed, data_seed) of every run: B.3.2 uses seeds 107..131 with data seeds 108..132."""
    s = section["seeds"]
    return [(s["first"] + i, s["first"] + i + s["data_seed_offset"]) for i in range(s["count"])]


def write_mixtures(cfg: dict, pairs_path: str | Path, captions_path: str | Path, out_dir: str | Path,
                   summary_path: str | Path | None = None) -> pd.DataFrame:
    section = cfg["training"]
    pairs = pd.read_parquet(pairs_path)
    for col in ("id", "caption_0", "caption_1", "image_0", "image_1"):
        if col not in pairs.columns:
            raise input_error(pairs_path, None, f"missing column {col!r}", "use the image stage's selected_pairs.parquet")
    if pairs.empty:
        raise input_error(pairs_path, None, "no selected counterfactual pairs",
                          "the image stage accepted nothing; check its filter thresholds")
    # image paths in the pairs index are relative to its folder; manifests hold paths usable from the cwd
    base = Path(pairs_path).parent
    pairs = pairs.assign(**{c: [str(base / p) if not Path(p).is_absolute() else p for p in pairs[c]]
                            for c in ("image_0", "image_1")})
    captions = pd.read_parquet(captions_path)
    image_dir = Path(cfg["data"]["coco_root"]) / cfg["data"]["split"]
    real = mx.real_table(captions, image_dir)
    frames = {spec.name: mx.build_mixture(pairs, real, spec, section["random_state"], section["val_fraction"],
                                          section.get("split_by", "sample"))
              for spec in mx.mixture_specs(section)}
    out_dir = Path(out_dir)
    for name, frame in frames.items():
        write_parquet(out_dir / f"{name}.parquet", frame)
    summary = mx.summary(frames)
    write_csv(Path(summary_path) if summary_path else out_dir / "summary.csv", summary)
    return summary


def _adapter(cfg: dict, role: str = "clip_train"):
    from ..device import resolve_device
    from ..models import registry
    from . import ContrastiveAdapter

    spec = registry.model_spec(cfg, role)
    # head="itc": cross-encoders with contrastive heads (BridgeTower) load as their ITC class
    return ContrastiveAdapter(registry.load(cfg, role, head="itc"), spec.library,
                              spec.local_path if spec.is_local else None, device=resolve_device(cfg.get("device", "auto")))


def _settings(cfg: dict, seed: int, data_seed: int):
    from . import TrainSettings

    return TrainSettings.from_section(cfg["training"], seed, data_seed, precision=cfg.get("precision", "fp32"))


def retrieval_specs(ev: dict) -> list[dict]:
    """The retrieval evaluations of ``training.eval.retrieval``: one mapping or a list of them (each with a
    unique ``name``), in table order (the first is Table 3's Flickr30k, a second e.g. Table 12's MS-COCO)."""
    value = ev.get("retrieval")
    specs = [] if not value else [value] if isinstance(value, dict) else list(value)
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"training.eval.retrieval: names must be unique, got {names}. Fix: rename one")
    return specs


def _recall_metrics(name: str, sim: np.ndarray, text_image: np.ndarray, ks) -> dict[str, float]:
    from ..metrics import recall_at_k

    recall = recall_at_k(sim, text_image, ks=tuple(ks))
    out = {f"{name}/{k}": v for k, v in recall.items()}
    out[f"{name}/mean"] = float(np.mean(list(recall.values())))
    return out


def evaluate_retrieval(cfg: dict, role: str, spec: dict, progress: bool = False) -> dict[str, float]:
    """Image-text retrieval Recall@K on a Karpathy-format split (Flickr30k 1K test in Table 3, the MS-COCO
    test set in Table 12)."""
    from ..data.karpathy import load_karpathy
    from ..scorers import scorer_from_config

    table = load_karpathy(spec["karpathy_json"], split=spec["split"])
    images = list(dict.fromkeys(table["filename"]))
    index = {name: i for i, name in enumerate(images)}
    scorer = scorer_from_config(cfg, role, head="itc", progress=progress)
    root = Path(spec["image_root"])
    img = scorer.encode_images([str(root / name) for name in images])
    txt = scorer.encode_texts(table["caption"].tolist())
    return _recall_metrics(spec["name"], img @ txt.T, np.array([index[f] for f in table["filename"]]), spec["ks"])


def evaluate_pairs(cfg: dict, role: str, pairs_path: str | Path, name: str, ks=(1, 5, 10),
                   progress: bool = False) -> dict[str, float]:
    """Recall@K on counterfactual pairs (appendix A.1, the withheld COCO-CFs test set): the retrieval space is
    both images and both captions of every pair; caption_i describes image_i."""
    from ..evaluation import read_pairs
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
            train: bool = True) -> pd.DataFrame:
    """Train one (mixture, seed) run of the model of ``role``, keep the best checkpoint and evaluate it: the
    evaluations of ``training.eval`` (unless ``default_eval`` is false) and, with ``eval_pairs``, retrieval on
    those counterfactual pairs (the in-domain test set of appendix A.1). ``experiment`` names the runs'
    experiment (default ``training.experiment``; the A.1 runs use the model role, one experiment per model).
    ``train=False`` evaluates the model as loaded (the pre-trained row of Table 5); the manifest is not read."""
    from ..evaluation import run_classification
    from . import read_manifest, settings_dict
    from . import train as train_model

    section = cfg["training"]
    out_dir = Path(out_dir)
    settings = _settings(cfg, seed, data_seed)
    if train:
        frame = read_manifest(manifest)
        train_frame = frame[frame["split"] == "train"]
        val_frame = frame[frame["split"] == "val"]
        if len(val_frame) < 2:
            val_frame = train_frame  # tiny demo mixtures: validate on the training split (logged)
            log.warning("%s: fewer than 2 validation rows; validating on the training split", manifest)
        adapter = _adapter(cfg, role)
        result = train_model(adapter, train_frame, val_frame, settings, image_root=".",
                             out_dir=out_dir / "checkpoint", progress=progress)
        history, best_step, best_val = result.history, result.best_step, result.best_val_loss
        # evaluate the best checkpoint through the ordinary loaders (the role -> the checkpoint)
        eval_cfg = copy.deepcopy(cfg)
        eval_cfg["models"][role] = {**eval_cfg["models"][role], "source": str(out_dir / "checkpoint")}
    else:  # the pre-trained row of a table: the same evaluations of the untouched model
        history, best_step, best_val, eval_cfg = [], 0, float("nan"), cfg
    write_csv(out_dir / "history.csv", pd.DataFrame(history, columns=HISTORY_COLUMNS))
    metrics = {"val_loss": best_val} if train else {}
    ev = section["eval"] if default_eval else {}
    for spec in retrieval_specs(ev):
        metrics.update(evaluate_retrieval(eval_cfg, role, spec, progress))
    for dataset in ev.get("classification") or []:
        res = run_classification(eval_cfg, role, dataset, progress=progress)
        metrics[f"{dataset}/top1"] = res["top1"]
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


def collect(paths: list[str | Path], out: str | Path) -> pd.DataFrame:
    frames = []
    for p in paths:
        if not Path(p).exists():
            raise input_error(p, None, "run metrics missing", "rerun that training job")
        frames.append(pd.read_csv(p))
    if not frames:
        raise ConfigError("no runs to collect. Fix: training.seeds.count must be at least 1")
    table = pd.concat(frames, ignore_index=True)[RUN_COLUMNS]
    write_csv(out, table)
    return table


def plot_curves(histories: list[str | Path], out: str | Path) -> Path:
    """Training loss (lines) and validation loss (dots) of every run, one panel per mixture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import save_figure

    runs = {}
    for path in histories:
        path = Path(path)
        runs.setdefault(path.parent.parent.name, []).append((path.parent.name, pd.read_csv(path)))
    fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 3.2), sharey=True, squeeze=False)
    for ax, (mixture, items) in zip(axes[0], sorted(runs.items())):
        for seed, h in items:
            line, = ax.plot(h["step"], h["train_loss"], lw=1, label=seed)
            val = h.dropna(subset=["val_loss"])
            ax.plot(val["step"], val["val_loss"], "o", ms=3, color=line.get_color())
        ax.set_title(mixture)
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("contrastive loss (lines: train, dots: validation)")
    return save_figure(out, fig)
