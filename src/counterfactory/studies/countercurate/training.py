"""CounterCurate fine-tuning of the contrastive model (Zhang et al., 2024, §3.5, §4.1, §4.5 Table 4, app. F Table 8).

The paper fine-tunes OpenCLIP ViT-B/32 (LAION-2B) on each of Flickr30k-Positions, -Counting and -Attributes
(§4.1). A training *pair* is a positive (I, C) and its counterfactual (I', C'); with **Grouping** (§3.5) each batch
holds N positives together with their N negatives, (C, I, C', I'), and the loss is the ordinary CLIP contrastive
loss over the 2N x 2N similarity matrix. The ablations train the same data without grouping (plain batches of the
same rows: Table 4 last-but-one row, Table 8 "No Group") and on the positives only (Table 8 "No Neg").

* :func:`training_section`: the trainer section (:class:`counterfactory.training.TrainSettings`) of one dataset and
  variant — Adam(W) with beta (0.9, 0.98), weight decay 0.2 (§4.1); Attributes lr 1e-5, batch 256, 5 epochs;
  Positions lr 2.56e-5, batch 1024, 50 epochs without grouping / 15 with; Counting lr 5e-5;
* :func:`write_manifests`: per dataset and variant a trainer manifest (``<dataset>_<variant>.parquet``) from the
  train split only, with a validation split by image for checkpoint selection;
* :func:`train_run`: one fine-tuning run on :func:`counterfactory.training.runs.run_one`, then the dataset's
  benchmark(s) of :mod:`.benchmarks` on the kept checkpoint (or on the pre-trained model, ``train=False``), as rows of
  the runs table (``experiment`` = dataset, ``mixture`` = variant or ``pretrained``) that
  :func:`counterfactory.stats.summarize` reads.

Batch size. The paper's batch size counts positive samples: the authors' OpenCLIP loader yields
(I, I', C, C') per sample and concatenates positives and negatives, so a Grouping batch of 1024 holds 2048 rows
(reference code ``train/grouping``). The trainer's ``batch_size`` counts rows, so Grouping gets
``2 * batch_size`` rows and the plain variants ``batch_size`` rows.

Configuration (study section ``countercurate``, key ``training``; every key has the default below)::

    training:
      role: clip_open_clip          # §4: OpenCLIP ViT-B/32 pre-trained on LAION-2B
      datasets: [positions, counting, attributes]
      variants: [grouping, no_grouping, no_negatives]   # §3.5 / Table 4 / Table 8
      seeds: {first: 0, count: 3, data_seed_offset: 1}  # ours: the paper reports single runs
      val_fraction: 0.1             # ours: images held out of the train split for checkpoint selection
      train_fraction: 0.8           # §4.2's 4:1 split by image, applied to counting / attributes (ours)
      random_state: 0               # ours
      precision: null               # null = the config's precision; fp16 / bf16 = mixed precision (§4.1, Attributes)
      benchmarks:                   # what each fine-tuned model is tested on (§4.2-4.4, app. E)
        positions: [positions]      # Flickr30k-Positions test split (LR / AB / both)
        counting: [looktwice]       # PointQA-LookTwice
        attributes: [sugarcrepe]    # add winoground for appendix E
      common:                       # every dataset (per-dataset entries may override any of these)
        optimizer: adamw_torch      # §4.1: Adam (decoupled weight decay, as in OpenCLIP's trainer)
        adam_beta1: 0.9             # §4.1
        adam_beta2: 0.98            # §4.1
        adam_epsilon: 1.0e-6        # ours: OpenCLIP's default for ViT models
        weight_decay: 0.2           # §4.1
        no_decay: [bias, LayerNorm, logit_scale, class_embedding]   # ours: OpenCLIP exempts gains, biases, scale
        lr_scheduler: cosine        # ours: OpenCLIP's default schedule (the paper is silent)
        warmup_steps: 0             # ours (OpenCLIP's default 10k steps exceeds these whole runs)
        max_grad_norm: 0.0          # ours: no clipping (OpenCLIP's default)
        eval_every: epoch           # ours: validate / save once per epoch (or a number of steps)
        eval_batch_size: null       # null = the training batch (rows)
        max_steps: null
        max_length: 77
        dataloader_workers: 4
        deterministic: true
        cpu_threads: 1
      positions:  {lr: 2.56e-5, batch_size: 1024, epochs_grouping: 15, epochs_plain: 50}  # §4.1
      counting:   {lr: 5.0e-5, batch_size: 1024, epochs_grouping: 15, epochs_plain: 50}   # lr §4.1; rest ours
      attributes: {lr: 1.0e-5, batch_size: 256, epochs_grouping: 5, epochs_plain: 5}      # §4.1
"""

from __future__ import annotations

import copy
import logging
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ...errors import ConfigError, input_error

log = logging.getLogger(__name__)

DATASETS = ("positions", "counting", "attributes")
VARIANTS = ("grouping", "no_grouping", "no_negatives")
PRETRAINED = "pretrained"
#: trainer recipe of each variant: Grouping keeps each (positive, negative) pair in one batch (§3.5)
RECIPES = {"grouping": "grouping", "no_grouping": "plain", "no_negatives": "plain"}
#: benchmark each dataset is evaluated on (§4.2 Flickr30k-Positions test, §4.3 PointQA-LookTwice, §4.4 SugarCrepe)
DEFAULT_BENCHMARKS = {"positions": ["positions"], "counting": ["looktwice"], "attributes": ["sugarcrepe"]}
#: per-dataset keys (§4.1; Counting's batch size and epochs are ours)
DATASET_KEYS = ("lr", "batch_size", "epochs_grouping", "epochs_plain")
MANIFEST_COLUMNS = ["image_path", "caption", "is_counterfactual", "pair_id", "split", "item_id", "image_id",
                    "dataset", "subset"]
SUMMARY_COLUMNS = ["dataset", "variant", "split", "rows", "pairs", "images"]
RUN_COLUMNS = ["experiment", "mixture", "seed", "data_seed", "metric", "value"]

DEFAULTS: dict[str, Any] = {
    "role": "clip_open_clip",
    "datasets": list(DATASETS),
    "variants": list(VARIANTS),
    "seeds": {"first": 0, "count": 3, "data_seed_offset": 1},
    "val_fraction": 0.1,
    "train_fraction": 0.8,
    "random_state": 0,
    "precision": None,
    "benchmarks": copy.deepcopy(DEFAULT_BENCHMARKS),
    "common": {
        "optimizer": "adamw_torch", "adam_beta1": 0.9, "adam_beta2": 0.98, "adam_epsilon": 1e-6,
        "weight_decay": 0.2, "no_decay": ["bias", "LayerNorm", "logit_scale", "class_embedding"],
        "lr_scheduler": "cosine", "warmup_steps": 0, "max_grad_norm": 0.0, "eval_every": "epoch",
        "eval_batch_size": None, "max_steps": None, "max_length": 77, "dataloader_workers": 4,
        "deterministic": True, "cpu_threads": 1,
    },
    "positions": {"lr": 2.56e-5, "batch_size": 1024, "epochs_grouping": 15, "epochs_plain": 50},
    "counting": {"lr": 5e-5, "batch_size": 1024, "epochs_grouping": 15, "epochs_plain": 50},
    "attributes": {"lr": 1e-5, "batch_size": 256, "epochs_grouping": 5, "epochs_plain": 5},
}


# ----------------------------------------------------------------------------------------------------------------
# settings
# ----------------------------------------------------------------------------------------------------------------
def settings(cfg: Mapping | None) -> dict:
    """``training`` of the study view over :data:`DEFAULTS` (mappings merged one level deep); unknown keys fail."""
    own = dict((cfg or {}).get("training") or {})
    unknown = sorted(set(own) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"countercurate.training: unknown key(s) {', '.join(unknown)}. "
                          f"Fix: use {', '.join(DEFAULTS)}")
    out = copy.deepcopy(DEFAULTS)
    for key, value in own.items():
        if isinstance(out[key], dict) and key != "benchmarks":
            if not isinstance(value, Mapping):
                raise ConfigError(f"countercurate.training.{key}: expected a mapping, got {type(value).__name__}")
            allowed = set(out[key]) | (set(out["common"]) if key in DATASETS else set())
            bad = sorted(set(value) - allowed)
            if bad:
                raise ConfigError(f"countercurate.training.{key}: unknown key(s) {', '.join(bad)}. "
                                  f"Fix: use {', '.join(sorted(allowed))}")
            out[key].update(copy.deepcopy(dict(value)))
        elif key == "benchmarks" and value is not None:
            out[key].update({k: list(v or []) for k, v in dict(value).items()})
        else:
            out[key] = copy.deepcopy(value)
    for name in out["variants"]:
        if name not in VARIANTS:
            raise ConfigError(f"countercurate.training.variants: unknown variant {name!r}. "
                              f"Fix: use {', '.join(VARIANTS)}")
    for name in out["datasets"]:
        if name not in DATASETS:
            raise ConfigError(f"countercurate.training.datasets: unknown dataset {name!r}. "
                              f"Fix: use {', '.join(DATASETS)}")
    for key in ("val_fraction", "train_fraction"):
        lo_ok = out[key] >= 0 if key == "val_fraction" else out[key] > 0
        if not (lo_ok and out[key] <= (0.5 if key == "val_fraction" else 1.0)):
            raise ConfigError(f"countercurate.training.{key}: {out[key]} is out of range. "
                              "Fix: val_fraction in [0, 0.5], train_fraction in (0, 1]")
    return out


def _check(dataset: str, variant: str) -> None:
    if dataset not in DATASETS:
        raise ConfigError(f"unknown CounterCurate dataset {dataset!r}. Fix: use one of {', '.join(DATASETS)}")
    if variant not in VARIANTS:
        raise ConfigError(f"unknown training variant {variant!r}. Fix: use one of {', '.join(VARIANTS)}")


def training_section(cfg: Mapping | None, dataset: str, variant: str, train_rows: int | None = None) -> dict:
    """The trainer section (every key of ``TrainSettings.SECTION_KEYS``, plus ``experiment`` and an empty
    ``eval``) of ``dataset`` trained as ``variant`` (§4.1 values; see the module docstring).

    ``grouping`` uses the Grouping recipe with ``epochs_grouping`` and a batch of ``2 * batch_size`` rows (N
    positives + their N negatives, §3.5); ``no_grouping`` and ``no_negatives`` plain batches of ``batch_size`` rows
    with ``epochs_plain``. ``eval_every: epoch`` is resolved from ``train_rows`` (the manifest's training rows:
    ``ceil(train_rows / batch rows)`` steps); without them it is 1 (every step)."""
    _check(dataset, variant)
    from ...training import TrainSettings

    s = settings(cfg)
    merged = {**s["common"], **s[dataset]}
    grouping = variant == "grouping"
    rows = int(merged["batch_size"]) * (2 if grouping else 1)
    epochs = int(merged["epochs_grouping"] if grouping else merged["epochs_plain"])
    eval_every = merged["eval_every"]
    if eval_every == "epoch":
        eval_every = max(1, math.ceil(train_rows / rows)) if train_rows else 1
    elif not isinstance(eval_every, int) or isinstance(eval_every, bool) or eval_every < 1:
        raise ConfigError(f"countercurate.training: eval_every {eval_every!r}. Fix: a positive integer or 'epoch'")
    section = {k: copy.deepcopy(merged[k]) for k in TrainSettings.SECTION_KEYS if k in merged}
    section.update(lr=float(merged["lr"]), batch_size=rows, epochs=epochs, eval_every=int(eval_every),
                   recipe=RECIPES[variant], cvld_lambda=0.0)
    if section.get("eval_batch_size") is None:
        section["eval_batch_size"] = rows
    missing = [k for k in TrainSettings.SECTION_KEYS if k not in section]
    if missing:  # a key added to the trainer that this study does not know yet
        raise ConfigError(f"countercurate.training: no value for trainer key(s) {missing}. "
                          "Fix: add them under countercurate.training.common")
    section["experiment"] = dataset
    section["eval"] = {}
    return section


def seed_pairs(cfg: Mapping | None) -> list[tuple[int, int]]:
    """(seed, data_seed) of every run of ``training.seeds``."""
    from ...training.runs import seed_pairs as pairs

    return pairs(settings(cfg))


# ----------------------------------------------------------------------------------------------------------------
# manifests
# ----------------------------------------------------------------------------------------------------------------
def _absolute(value, base: Path) -> str:
    p = Path(str(value))
    return str(p if p.is_absolute() else (base / p).resolve())


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == ""


def _attributes_images(cfg: Mapping | None, images_dir: str | Path | None) -> Path | None:
    """Where Flickr30k-Attributes' positive images are: ``images_dir``, else ``data.images``, else
    ``<data.entities_root>/flickr30k-images`` (the table has ``image_id`` but no ``image_path``)."""
    from ...data import flickr30k_entities as f30k

    if images_dir:
        return Path(images_dir)
    data = (cfg or {}).get("data") or {}
    if data.get("images"):
        return Path(data["images"])
    if data.get("entities_root"):
        return Path(data["entities_root"]) / f30k.IMAGES
    return None


def read_dataset(path: str | Path, dataset: str, cfg: Mapping | None = None,
                 images_dir: str | Path | None = None) -> pd.DataFrame:
    """One dataset table as pairs ``item_id, image_id, image_path, caption, negative_image, negative_caption,
    subset, split`` (``split`` train/test where the table has one, else None); paths absolute (relative ones
    against the table's folder)."""
    path = Path(path)
    if not path.is_file():
        raise input_error(path.resolve(), None, f"{dataset} dataset not found",
                          "run 'counterfactory countercurate datasets' first (or pass --datasets)")
    frame = pd.read_parquet(path).reset_index(drop=True)
    if dataset == "attributes":
        frame = frame.rename(columns={"negative": "negative_caption"})
        if "status" in frame.columns:
            frame = frame[frame["status"] == "accepted"].reset_index(drop=True)
        if "image_path" not in frame.columns:
            root = _attributes_images(cfg, images_dir)
            if root is None and len(frame):
                raise input_error(path, None, "no image_path column and no Flickr30k images folder to find the "
                                  "positive images in", "pass --images DIR or set countercurate.data.images / "
                                  "data.entities_root")
            frame["image_path"] = [str(root / f"{i}.jpg") if root is not None else None for i in frame["image_id"]]
    need = ["item_id", "image_id", "image_path", "caption", "negative_caption", "negative_image"]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {', '.join(missing)}",
                          "use the table written by 'counterfactory countercurate datasets'")
    dup = frame["item_id"].astype(str).duplicated()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise input_error(path, f"row {i} (item_id {frame['item_id'].iloc[i]!r})", "item_id repeated",
                          "item ids identify training pairs; make them unique")
    out = frame[need].copy()
    out["item_id"] = out["item_id"].astype(str)
    out["image_id"] = out["image_id"].astype(str)
    for col in ("subset", "split"):
        out[col] = [None if _missing(v) else str(v) for v in frame[col]] if col in frame.columns else None
    base = path.parent
    for col in ("image_path", "negative_image"):
        out[col] = [None if _missing(v) else _absolute(v, base) for v in out[col]]
    return out


def split_by_image(image_ids, fraction: float, random_state: int, sides=("train", "test")) -> dict[str, str]:
    """``{image_id: side}``: §4.2's 4:1 split by image (``fraction`` of the images on the first side), the same
    rule as :func:`.positions.split_images` (sorted ids shuffled with ``random_state``)."""
    from .positions import split_images

    split = split_images(image_ids, fraction, random_state)
    return {k: (sides[0] if v == "train" else sides[1]) for k, v in split.items()}


def _check_files(pairs: pd.DataFrame, source: Path, variant_needs_negative: bool) -> None:
    for i, row in enumerate(pairs.itertuples(index=False)):
        cols = (("image_path", "positive image"), ("negative_image", "negative image"))
        for col, what in cols if variant_needs_negative else cols[:1]:
            value = getattr(row, col)
            if _missing(value) or not Path(value).is_file():
                raise input_error(source, f"row {row.row} (item_id {row.item_id!r})",
                                  f"{what} {'missing' if _missing(value) else 'file not found: ' + str(value)}",
                                  "rerun the generation / datasets steps for this item or drop it from the table")


def manifest_frame(pairs: pd.DataFrame, variant: str, dataset: str) -> pd.DataFrame:
    """Trainer manifest rows of ``pairs`` (which carry ``split`` train/val): each pair's positive
    (``image_path``, ``caption``) and, except for ``no_negatives``, its negative (``negative_image``,
    ``negative_caption``, ``is_counterfactual``), sharing ``pair_id`` = the item id. ``no_negatives`` keeps one
    row per distinct positive (image, caption) of a side (Flickr30k-Attributes repeats a positive for each kind
    of negative)."""
    base = {"pair_id": pairs["item_id"], "split": pairs["split"], "item_id": pairs["item_id"],
            "image_id": pairs["image_id"], "dataset": dataset, "subset": pairs["subset"]}
    pos = pd.DataFrame({"image_path": pairs["image_path"], "caption": pairs["caption"], "is_counterfactual": False,
                        **base})
    if variant == "no_negatives":
        out = pos.drop_duplicates(subset=["split", "image_path", "caption"], keep="first")
    else:
        neg = pd.DataFrame({"image_path": pairs["negative_image"], "caption": pairs["negative_caption"],
                            "is_counterfactual": True, **base})
        out = pd.concat([pos, neg]).sort_index(kind="stable")  # a pair's two rows next to each other
    return out[MANIFEST_COLUMNS].reset_index(drop=True)


def write_manifests(datasets_dir: str | Path, out_dir: str | Path, cfg: Mapping | None = None, *,
                    images_dir: str | Path | None = None) -> pd.DataFrame:
    """Write ``<dataset>_<variant>.parquet`` for every configured dataset and variant, ``<dataset>_images.csv``
    (``image_id, split``: train / val / test, the record of both splits) and ``summary.csv``; return the summary
    (``dataset, variant, split, rows, pairs, images``).

    Only training images are used: Flickr30k-Positions' own ``split == train`` (§4.2); Counting and Attributes
    have no split, so their images are split 4:1 (``train_fraction``, §4.2's rule, ours for these two). Then
    ``val_fraction`` of the training images go to ``split = val`` (checkpoint selection; ours): whole images, so a
    pair and every pair of the same image stay on one side. A missing positive or negative image file is an error
    naming the table and the row."""
    s = settings(cfg)
    datasets_dir, out_dir = Path(datasets_dir), Path(out_dir)
    from ...io import write_csv, write_parquet

    rows = []
    for dataset in s["datasets"]:
        source = datasets_dir / f"{dataset}.parquet"
        pairs = read_dataset(source, dataset, cfg, images_dir).assign(row=lambda f: np.arange(len(f)))
        ids = sorted(set(pairs["image_id"]))
        if dataset == "positions" and pairs["split"].notna().all():
            side = dict(zip(pairs["image_id"], pairs["split"]))
        else:
            side = split_by_image(ids, float(s["train_fraction"]), int(s["random_state"]))
        train_ids = [i for i in ids if side[i] == "train"]
        val = split_by_image(train_ids, 1.0 - float(s["val_fraction"]), int(s["random_state"]) + 1, ("train", "val")) \
            if s["val_fraction"] > 0 else {i: "train" for i in train_ids}
        side.update(val)
        write_csv(out_dir / f"{dataset}_images.csv",
                  pd.DataFrame({"image_id": ids, "split": [side[i] for i in ids]}, columns=["image_id", "split"]))
        pairs["split"] = pairs["image_id"].map(side)
        pairs = pairs[pairs["split"].isin(["train", "val"])]
        if pairs.empty:
            log.warning("%s: no training pairs; its manifests are empty", source)
        for variant in s["variants"]:
            _check_files(pairs, source, variant != "no_negatives")
            frame = manifest_frame(pairs, variant, dataset)
            write_parquet(out_dir / f"{dataset}_{variant}.parquet", frame)
            for split in ("train", "val"):
                part = frame[frame["split"] == split]
                rows.append({"dataset": dataset, "variant": variant, "split": split, "rows": len(part),
                             "pairs": part["pair_id"].nunique(), "images": part["image_id"].nunique()})
    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    write_csv(out_dir / "summary.csv", summary)
    return summary


# ----------------------------------------------------------------------------------------------------------------
# runs
# ----------------------------------------------------------------------------------------------------------------
def _plain(cfg: Mapping) -> dict:
    return copy.deepcopy(dict(cfg))


def benchmark_rows(results: pd.DataFrame) -> dict[str, float]:
    """``<benchmark>/<subset>/<metric>`` -> value in % from a results table of :func:`.benchmarks.evaluate`."""
    return {f"{r.benchmark}/{r.subset}/{r.metric}": 100.0 * float(r.value) for r in results.itertuples()}


def train_run(cfg: Mapping, dataset: str, variant: str | None, manifest: str | Path | None, seed: int,
              data_seed: int, out_dir: str | Path, train: bool = True, *,
              data: Mapping[str, str | Path] | None = None, images: Mapping[str, str | Path] | None = None,
              progress: bool = False) -> pd.DataFrame:
    """Fine-tune ``training.role`` on ``manifest`` as ``variant`` of ``dataset`` (:func:`training_section`) through
    :func:`counterfactory.training.runs.run_one` (``out_dir/checkpoint``, ``history.csv``, ``run.json``), then score
    the kept checkpoint — or, with ``train=False``, the pre-trained model (mixture ``pretrained``) — on the
    dataset's benchmarks (``training.benchmarks``; data from ``countercurate.benchmarks``, or ``data`` / ``images``
    per benchmark). Writes ``metrics.csv`` (runs table: ``experiment`` = dataset, ``mixture``, ``seed``,
    ``data_seed``, ``metric`` = ``<benchmark>/<subset>/<metric>``, ``value`` in %) and ``benchmarks.csv`` (the
    long results of :mod:`.benchmarks`, model = mixture, for ``countercurate tables``); returns the runs rows.
    The best validation loss stays in ``run.json`` (the pre-trained row has none, and every metric of the runs
    table needs a baseline row)."""
    from ...io import write_csv
    from ...training import read_manifest
    from ...training.runs import run_one
    from . import benchmarks as bm

    s = settings(cfg)
    if train:
        if variant is None or manifest is None:
            raise ConfigError("train_run: training needs a variant and a manifest. Fix: pass --variant and --manifest")
        _check(dataset, variant)
        frame = read_manifest(manifest)
        section = training_section(cfg, dataset, variant, int((frame["split"] == "train").sum()))
    else:
        _check(dataset, variant or "grouping")
        section = training_section(cfg, dataset, variant or "grouping")
    role = s["role"]
    mixture = variant if train else PRETRAINED
    out_dir = Path(out_dir)
    run_cfg = _plain(cfg)
    run_cfg["training"] = section
    if s["precision"]:
        run_cfg["precision"] = s["precision"]
    if "models" not in run_cfg or role not in run_cfg["models"]:
        raise ConfigError(f"countercurate.training.role {role!r} is not a model role of the config. "
                          "Fix: add it under models or choose another role")
    run_one(run_cfg, manifest if train else None, mixture, seed, data_seed, out_dir, progress=progress,
            default_eval=False, role=role, experiment=dataset, train=train)
    eval_cfg = _plain(cfg)
    if train:  # the kept checkpoint through the ordinary loaders, as run_one evaluates it
        eval_cfg["models"][role] = {**eval_cfg["models"][role], "source": str(out_dir / "checkpoint")}
    names = s["benchmarks"].get(dataset) or []
    if not names:
        raise ConfigError(f"countercurate.training.benchmarks.{dataset} is empty. Fix: name at least one of "
                          f"{', '.join(bm.BENCHMARKS)}")
    results = []
    for name in names:
        res, _ = bm.evaluate(eval_cfg, role, name, data=(data or {}).get(name), images=(images or {}).get(name),
                             model=mixture, progress=progress)
        results.append(res)
    results = pd.concat(results, ignore_index=True)
    metrics = benchmark_rows(results)
    rows = pd.DataFrame([{"experiment": dataset, "mixture": mixture, "seed": int(seed), "data_seed": int(data_seed),
                          "metric": k, "value": float(v)} for k, v in metrics.items()], columns=RUN_COLUMNS)
    write_csv(out_dir / "benchmarks.csv", results)
    write_csv(out_dir / "metrics.csv", rows)
    return rows


# ----------------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------------
def _pairs_option(items, option: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"{option} {item!r}: expected BENCHMARK=PATH (e.g. positions=datasets/positions.parquet)")
        out[key] = value
    return out


def add_cli(sub) -> None:
    """``counterfactory countercurate train-manifests | train-run``."""
    p = sub.add_parser("train-manifests", help="CLIP fine-tuning manifests per dataset and variant (§3.5, §4.1, "
                       "Tables 4 and 8)", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", action="append", required=True, metavar="FILE", help="config file (repeatable)")
    p.add_argument("--datasets", required=True, metavar="DIR", help="folder of positions/counting/attributes.parquet")
    p.add_argument("--out-dir", required=True, metavar="DIR")
    p.add_argument("--images", metavar="DIR", help="Flickr30k images (Attributes' positives; default from data)")
    p.set_defaults(func=_cmd_manifests)

    r = sub.add_parser("train-run", help="fine-tune CLIP on one manifest (one seed) and score it on the dataset's "
                       "benchmarks; --no-train scores the pre-trained model", description=__doc__.split("\n\n")[0])
    r.add_argument("--config", action="append", required=True, metavar="FILE", help="config file (repeatable)")
    r.add_argument("--dataset", required=True, choices=DATASETS)
    r.add_argument("--variant", choices=VARIANTS, help="required unless --no-train")
    r.add_argument("--manifest", metavar="FILE.parquet", help="from train-manifests; required unless --no-train")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--data-seed", type=int, required=True)
    r.add_argument("--out-dir", required=True, metavar="DIR")
    r.add_argument("--no-train", action="store_true", help="evaluate the pre-trained model (mixture 'pretrained')")
    r.add_argument("--data", action="append", default=[], metavar="BENCHMARK=PATH",
                   help="benchmark data (e.g. positions=.../positions.parquet; default countercurate.benchmarks)")
    r.add_argument("--images", action="append", default=[], metavar="BENCHMARK=DIR", help="benchmark images root")
    r.add_argument("--progress", action="store_true")
    r.set_defaults(func=_cmd_run)


def _load(paths) -> dict:
    from ...config import load_config

    return load_config(paths, study="countercurate")


def _cmd_manifests(args) -> int:
    summary = write_manifests(args.datasets, args.out_dir, _load(args.config), images_dir=args.images)
    print(summary.to_string(index=False))
    return 0


def _cmd_run(args) -> int:
    rows = train_run(_load(args.config), args.dataset, args.variant, args.manifest, args.seed, args.data_seed,
                     args.out_dir, train=not args.no_train, data=_pairs_option(args.data, "--data"),
                     images=_pairs_option(args.images, "--images"), progress=args.progress)
    for r in rows.itertuples():
        log.info("%s %s seed %d: %s = %.2f", r.experiment, r.mixture, r.seed, r.metric, r.value)
    return 0
