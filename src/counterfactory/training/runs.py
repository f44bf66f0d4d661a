"""Fine-tuning runs over seeds (COCO-Counterfactuals §5, appendix B.3) as files.

* :func:`write_mixtures`: one manifest per mixture (``training/mixtures/<name>.parquet``) plus a summary
  with |D_train|, |D_train^CF| and % CFs;
* :func:`train_one`: train a model role (``clip_train``; A.1 also BridgeTower and FLAVA) on one mixture
  with one (seed, data_seed) on ``transformers.Trainer`` (:mod:`counterfactory.training`) and keep the best
  checkpoint; :func:`counterfactory.evaluation.runs.run_one` trains through it, evaluates and writes the
  run's tidy rows ``experiment, mixture, seed, data_seed, metric, value`` and its training curve;
* :func:`collect`: concatenate the per-run rows into the runs table the statistics read.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from ..device import resolve_device, with_stage_precision
from ..errors import ConfigError, input_error
from ..io import write_csv, write_parquet
from ..models import registry
from ..settings import config_value
from ..settings import seed_pairs as expand_seed_pairs
from . import mixtures as mx

log = logging.getLogger(__name__)

RUN_COLUMNS = ["experiment", "mixture", "seed", "data_seed", "metric", "value"]
HISTORY_COLUMNS = ["step", "epoch", "train_loss", "val_loss", "lr"]
#: a run's mean top-1 over its zero-shot classification datasets (COCO-CF Table 4's "Mean" column)
CLASSIFICATION_MEAN = "classification/mean"
#: mixture name of a table's pre-trained row (the untouched model, evaluated once: COCO-CF Tables 3, 4, 12)
PRETRAINED = "pretrained"


def seed_pairs(section: dict) -> list[tuple[int, int]]:
    """(seed, data_seed) of every run: B.3.2 uses seeds 107..131 with data seeds 108..132."""
    return expand_seed_pairs(section["seeds"])


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
                                          config_value(section, "coco_counterfactuals.training.split_by"))
              for spec in mx.mixture_specs(section)}
    out_dir = Path(out_dir)
    for name, frame in frames.items():
        write_parquet(out_dir / f"{name}.parquet", frame)
    summary = mx.summary(frames)
    write_csv(Path(summary_path) if summary_path else out_dir / "summary.csv", summary)
    return summary


def _adapter(cfg: dict, role: str = "clip_train"):
    from . import ContrastiveAdapter

    spec = registry.model_spec(cfg, role)
    # head="itc": cross-encoders with contrastive heads (BridgeTower) load as their ITC class
    return ContrastiveAdapter(registry.load(cfg, role, head="itc"), spec.library,
                              spec.local_path if spec.is_local else None,
                              device=resolve_device(config_value(cfg, "device")))


def stage_config(cfg: dict) -> dict:
    """``cfg`` as a fine-tuning run (and its evaluations) runs it: ``training.precision`` (when set) replaces the
    config-wide ``precision``. The paper config sets fp32, as the authors fine-tuned (HF Trainer defaults); null
    keeps the config's precision (the fast path: bf16 mixed precision on CUDA)."""
    return with_stage_precision(cfg, (cfg.get("training") or {}).get("precision"))


def _settings(cfg: dict, seed: int, data_seed: int):
    from . import TrainSettings

    return TrainSettings.from_section(cfg["training"], seed, data_seed, precision=config_value(cfg, "precision"))


def retrieval_specs(ev: dict) -> list[dict]:
    """The retrieval evaluations of ``training.eval.retrieval``: one mapping or a list of them (each with a
    unique ``name``), in table order (the first is Table 3's Flickr30k, a second e.g. Table 12's MS-COCO)."""
    value = ev.get("retrieval")
    specs = [] if not value else [value] if isinstance(value, dict) else list(value)
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"training.eval.retrieval: names must be unique, got {names}. Fix: rename one")
    return specs


def train_one(cfg: dict, manifest: str | Path, seed: int, data_seed: int, out_dir: str | Path,
              progress: bool = True, role: str = "clip_train"):
    """Train the model of ``role`` on one manifest with one (seed, data_seed) and keep the best checkpoint in
    ``out_dir/checkpoint``. Returns ``(settings, history, best_step, best_val_loss)``; evaluating the run is
    :func:`counterfactory.evaluation.runs.run_one`'s part."""
    from . import read_manifest
    from . import train as train_model

    out_dir = Path(out_dir)
    settings = _settings(cfg, seed, data_seed)
    frame = read_manifest(manifest)
    train_frame = frame[frame["split"] == "train"]
    val_frame = frame[frame["split"] == "val"]
    if len(val_frame) < 2:
        val_frame = train_frame  # tiny demo mixtures: validate on the training split (logged)
        log.warning("%s: fewer than 2 validation rows; validating on the training split", manifest)
    adapter = _adapter(cfg, role)
    result = train_model(adapter, train_frame, val_frame, settings, image_root=".",
                         out_dir=out_dir / "checkpoint", progress=progress)
    return settings, result.history, result.best_step, result.best_val_loss


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
    from matplotlib.ticker import MaxNLocator

    from ..io import save_figure  # local: tests patch io.save_figure

    runs = {}
    for path in histories:       # panels in the order given (the rule lists the configured mixture order)
        path = Path(path)
        runs.setdefault(path.parent.parent.name, []).append((path.parent.name, pd.read_csv(path)))
    fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 3.4), sharey=True, squeeze=False,
                             layout="constrained")
    for ax, (mixture, items) in zip(axes[0], runs.items()):
        for seed, h in items:
            line, = ax.plot(h["step"], h["train_loss"], lw=1, label=seed.replace("seed", "seed "))
            val = h.dropna(subset=["val_loss"])
            ax.plot(val["step"], val["val_loss"], "o", ms=3, color=line.get_color())
        ax.set_title(mixture)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))      # optimizer steps are whole numbers
        ax.legend(title="run", fontsize=7, title_fontsize=7, frameon=False)
    axes[0][0].set_ylabel("contrastive loss (lines: train, dots: validation)")
    out = save_figure(out, fig)
    plt.close(fig)
    return out
