"""CounterCurate fine-tuning of the contrastive model (Zhang et al., 2024, §3.5, §4.1, §4.5 Table 4, app. F Table 8).

The paper fine-tunes OpenCLIP ViT-B/32 (LAION-2B) on each of Flickr30k-Positions, -Counting and -Attributes
(§4.1). A training *pair* is a positive (I, C) and its counterfactual (I', C'); with **Grouping** (§3.5) each batch
holds N positives together with their N negatives, (C, I, C', I'), and the loss is the ordinary CLIP contrastive
loss over the 2N x 2N similarity matrix. The ablations (variants) train the same data without grouping (plain batches
of the same rows: Table 4 last-but-one row, Table 8 "No Group"), on the positives only (Table 4 first row, Table 8
"No Neg"), and with one kind of negative only (Table 4 rows 2-3): ``no_negative_images`` keeps each negative caption
C' and ``no_negative_captions`` each negative image I'. A lone C' or I' has no partner to form a pair, so it rides
with its positive as a hard negative (trainer manifest columns ``hard_negative_caption`` / ``hard_negative_image``):
an extra column (caption) or row (image) of its batch's similarity matrix that the pairs must score below their
own match (:func:`counterfactory.training.model.clip_loss` with ``n_pairs``). That is the only way the paper's
"negative captions only" can enter a contrastive batch; no (I', C') pair is formed, hence "no grouping" in Table 4.

* :func:`training_section`: the trainer section (:class:`counterfactory.training.TrainSettings`) of one dataset and
  variant — Adam(W) with beta (0.9, 0.98), weight decay 0.2 (§4.1); Attributes lr 1e-5, batch 256, 5 epochs;
  Positions lr 2.56e-5, batch 1024, 50 epochs without grouping / 15 with; Counting lr 5e-5;
* :func:`write_manifests` (:mod:`.manifests`, importable from here too): per dataset and variant a trainer manifest
  (``<dataset>_<variant>.parquet``): Positions' train split (§4.2's 4:1), all of Counting and Attributes (§4.1),
  a validation split by image only as an option; the run keeps its final weights (``checkpoint: final``, §4.1)
  or, as an option, the lowest validation loss;
* :func:`vlm_train_run`: the generative family (§3.5 Figure 3b, §4.1): the ``vlm`` role (LLaVA-1.5 class) fine-tuned
  on a dataset's train pairs as conversations with next-token loss (:func:`.vlm_finetune.finetune`; lr per dataset from
  §4.1: Positions / Counting 2.56e-5, Attributes 2e-6; batch 16, 1 epoch from the ``vlm`` section), then scored
  on the same benchmarks by choosing between the two captions; mixture ``conversation`` (or ``pretrained``);
* :func:`train_run`: one fine-tuning run on :func:`counterfactory.evaluation.runs.run_one`, then the dataset's
  benchmark(s) of :mod:`.benchmarks` on the kept checkpoint (or on the pre-trained model, ``train=False``), as rows of
  the runs table (``experiment`` = dataset, ``mixture`` = variant or ``pretrained``) that
  :func:`counterfactory.stats.summarize` reads.

Batch size. The paper's batch size counts positive samples: the authors' OpenCLIP loader yields
(I, I', C, C') per sample and concatenates positives and negatives, so a Grouping batch of 1024 holds 2048 rows
(reference code ``train/grouping``). The trainer's ``batch_size`` counts rows, so Grouping gets
``2 * batch_size`` rows (Attributes: a positive with its up to three negatives is one group, so up to
``4 * batch_size``; :func:`.manifests.manifest_frame`) and the plain variants ``batch_size`` rows.

Configuration (study section ``countercurate``, key ``training``; every key has the default below, written in the
schema, config/schema.yaml, and listed in docs/config-reference.md)::

    training:
      role: clip_open_clip          # §4: OpenCLIP ViT-B/32 pre-trained on LAION-2B
      datasets: [positions, counting, attributes]
      variants:                     # per dataset (or one list for all): §3.5; Table 4 (positions); Table 8 (counting)
        positions: [grouping, no_grouping, no_negative_captions, no_negative_images, no_negatives]
        counting: [grouping, no_grouping, no_negatives]
        attributes: [grouping, no_grouping]
      seeds: {first: 0, count: 3, data_seed_offset: 1}  # ours: the paper reports single runs
      val_fraction: 0.0             # §4.1: no validation split (ours, option: images held out of the train split)
      train_fraction: 1.0           # §4.1: all of Counting / Attributes (ours, option: 0.8 = §4.2's 4:1 rule)
      checkpoint: final             # §4.1: fixed epochs, final weights (ours, option: best_val)
      random_state: 0               # ours
      precision: {positions: fp32, counting: fp32, attributes: auto}   # §4.1: mixed precision for Attributes only
                                    # (one string or null = every dataset and the vlm family; null = the config's)
      vlm:                          # the generative family (§4.1, Tables 1-3, 7): LLaVA-1.5 fine-tuned per dataset
        role: vlm
        datasets: null              # null: the datasets above; [] turns the generative family off
        lr: {positions: 2.56e-5, counting: 2.56e-5, attributes: 2.0e-6}   # §4.1 (other keys: section vlm)
      retrieval: null               # §4.5 Table 5: MS-COCO retrieval set (Karpathy format) of the CLIP runs
      retrieval_datasets: [attributes]   # Table 5: the CLIP fine-tuned on Flickr30k-Attributes
      benchmarks:                   # what each fine-tuned model is tested on (§4.2-4.4, app. E)
        positions: [positions]      # Flickr30k-Positions test split (LR / AB / both)
        counting: [looktwice]       # PointQA-LookTwice
        attributes: [sugarcrepe, winoground]   # Tables 3 / 6; app. E Table 7 (the fine-tuned LLaVA's text score)
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
from typing import Mapping

import pandas as pd

from ...config import fill_section
from ...errors import ConfigError
from ...evaluation import runs as ev_runs
from ...io import write_csv
from ...training.runs import seed_pairs as _seed_pairs
from . import benchmarks as bm

log = logging.getLogger(__name__)

DATASETS = ("positions", "counting", "attributes")
VARIANTS = ("grouping", "no_grouping", "no_negative_captions", "no_negative_images", "no_negatives")
PRETRAINED = "pretrained"
#: mixture name of the generative family's fine-tuned runs (next-token loss on conversations, Figure 3b)
VLM_MIXTURE = "conversation"
#: trainer recipe of each variant: Grouping keeps each (positive, negative) pair in one batch (§3.5)
RECIPES = {"grouping": "grouping", "no_grouping": "plain", "no_negative_captions": "plain",
           "no_negative_images": "plain", "no_negatives": "plain"}
#: Table 4's columns per variant (negative images, negative captions, grouping) and the row labels of the tables
VARIANT_INFO = {
    PRETRAINED: ("Pre-trained (no fine-tuning)", None),
    VLM_MIXTURE: ("+ CounterCurate", ("yes", "yes", "no")),
    "no_negatives": ("+ CounterCurate (No Neg)", ("no", "no", "no")),
    "no_negative_images": ("+ CounterCurate (negative captions only)", ("no", "yes", "no")),
    "no_negative_captions": ("+ CounterCurate (negative images only)", ("yes", "no", "no")),
    "no_grouping": ("+ CounterCurate (No Group)", ("yes", "yes", "no")),
    "grouping": ("+ CounterCurate", ("yes", "yes", "yes")),
}
#: what each variant needs of a pair: (negative image, negative caption)
NEEDS = {"grouping": (True, True), "no_grouping": (True, True), "no_negative_captions": (True, False),
         "no_negative_images": (False, True), "no_negatives": (False, False)}
#: per-dataset keys (§4.1; Counting's batch size and epochs are ours)
DATASET_KEYS = ("lr", "batch_size", "epochs_grouping", "epochs_plain")
MANIFEST_COLUMNS = ["image_path", "caption", "is_counterfactual", "pair_id", "split", "item_id", "image_id",
                    "dataset", "subset"]
SUMMARY_COLUMNS = ["dataset", "variant", "split", "rows", "pairs", "images"]
RUN_COLUMNS = ["experiment", "mixture", "seed", "data_seed", "metric", "value"]


# ----------------------------------------------------------------------------------------------------------------
# settings
# ----------------------------------------------------------------------------------------------------------------
def settings(cfg: Mapping | None) -> dict:
    """``training`` of the study view, validated with the schema's defaults filled (unknown keys fail, naming them).
    ``variants`` given as one list applies to every dataset; ``vlm.datasets: null`` means ``datasets``."""
    out = fill_section("countercurate.training", (cfg or {}).get("training"))
    if isinstance(out["variants"], list):
        out["variants"] = {d: list(out["variants"]) for d in DATASETS}
    if out["vlm"]["datasets"] is None:
        out["vlm"]["datasets"] = list(out["datasets"])
    return out


def retrieval_spec(cfg: Mapping | None) -> dict | None:
    """Table 5's MS-COCO retrieval set when a run of the enabled training reads it (a dataset of
    ``retrieval_datasets`` is trained); else None. The rules declare its files and preflight checks them from here."""
    s = settings(cfg)
    if s["retrieval"] and set(s["retrieval_datasets"]) & set(s["datasets"]):
        return s["retrieval"]
    return None


def variants_info() -> pd.DataFrame:
    """Mixture info for :func:`counterfactory.tables.build_table`: each variant's label and Table 4 columns."""
    rows = []
    for name, (label, flags) in VARIANT_INFO.items():
        images, captions, grouping = flags or ("", "", "")
        rows.append({"mixture": name, "label": label, "negative_images": images, "negative_captions": captions,
                     "grouping": grouping})
    return pd.DataFrame(rows)


def table_order(cfg: Mapping | None, dataset: str) -> list[str]:
    """Rows of a dataset's fine-tuning table: pre-trained, then its variants in Table 4's order."""
    wanted = set(settings(cfg)["variants"][dataset])
    return [PRETRAINED] + [name for name in VARIANT_INFO if name in wanted]


def stats_baseline(cfg: Mapping | None) -> str:
    """The variant every other is t-tested against: fine-tuning without grouping (§4.5) when every trained
    dataset has it, else the first variant all trained datasets share."""
    s = settings(cfg)
    lists = [s["variants"][d] for d in s["datasets"]]
    shared = [v for v in lists[0] if all(v in other for other in lists)] if lists else []
    if not shared:
        raise ConfigError("countercurate.training.variants: the trained datasets share no variant, so there is no "
                          "baseline for the t-tests. Fix: give every dataset no_grouping (the paper's comparator)")
    return "no_grouping" if "no_grouping" in shared else shared[0]


def _check(dataset: str, variant: str) -> None:
    if dataset not in DATASETS:
        raise ConfigError(f"unknown CounterCurate dataset {dataset!r}. Fix: use one of {', '.join(DATASETS)}")
    if variant not in VARIANTS:
        raise ConfigError(f"unknown training variant {variant!r}. Fix: use one of {', '.join(VARIANTS)}")


def training_section(cfg: Mapping | None, dataset: str, variant: str, train_rows: int | None = None,
                     group_rows: int = 2) -> dict:
    """The trainer section (every key of ``TrainSettings.SECTION_KEYS``, plus ``experiment`` and an empty
    ``eval``) of ``dataset`` trained as ``variant`` (§4.1 values; see the module docstring).

    ``grouping`` uses the Grouping recipe with ``epochs_grouping`` and a batch of ``group_rows * batch_size`` rows
    (N positives, each with its negatives, §3.5: 2 rows per group on Positions / Counting, up to 4 on Attributes);
    ``no_grouping`` and ``no_negatives`` plain batches of ``batch_size`` rows with ``epochs_plain``.
    ``eval_every: epoch`` is resolved from ``train_rows`` (the manifest's training rows: ``ceil(train_rows /
    batch rows)`` steps); without them it is 1 (every step). With ``checkpoint: final`` (§4.1) :func:`train_run`
    replaces it by the run's step count (:func:`final_eval_every`)."""
    _check(dataset, variant)
    from ...training import TrainSettings

    s = settings(cfg)
    merged = {**s["common"], **s[dataset]}
    grouping = variant == "grouping"
    rows = int(merged["batch_size"]) * (max(2, int(group_rows)) if grouping else 1)
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
    return _seed_pairs(settings(cfg))



# ----------------------------------------------------------------------------------------------------------------
# runs
# ----------------------------------------------------------------------------------------------------------------
def _plain(cfg: Mapping) -> dict:
    return copy.deepcopy(dict(cfg))


def training_precision(s: Mapping, dataset: str, family: str = "clip") -> str | None:
    """The precision ``dataset`` fine-tunes in (None = the config's): ``training.precision`` as one value for every
    dataset and family, or per dataset for the CLIP family (§4.1: mixed precision for Attributes only; Positions and
    Counting in fp32); with a per-dataset mapping the vlm family trains in the config's precision."""
    value = s["precision"]
    if isinstance(value, Mapping):
        return value.get(dataset) if family == "clip" else None
    return value


def benchmark_rows(results: pd.DataFrame) -> dict[str, float]:
    """``<benchmark>/<subset>/<metric>`` -> value in % from a results table of :func:`.benchmarks.evaluate`."""
    return {f"{r.benchmark}/{r.subset}/{r.metric}": 100.0 * float(r.value) for r in results.itertuples()}


def train_run(cfg: Mapping, dataset: str, variant: str | None, manifest: str | Path | None, seed: int,
              data_seed: int, out_dir: str | Path, train: bool = True, *,
              data: Mapping[str, str | Path] | None = None, images: Mapping[str, str | Path] | None = None,
              progress: bool = False) -> pd.DataFrame:
    """Fine-tune ``training.role`` on ``manifest`` as ``variant`` of ``dataset`` (:func:`training_section`) through
    :func:`counterfactory.evaluation.runs.run_one` (``out_dir/checkpoint``, ``history.csv``, ``run.json``), then score
    the kept checkpoint — or, with ``train=False``, the pre-trained model (mixture ``pretrained``) — on the
    dataset's benchmarks (``training.benchmarks``; data from ``countercurate.benchmarks``, or ``data`` / ``images``
    per benchmark). Writes ``metrics.csv`` (runs table: ``experiment`` = dataset, ``mixture``, ``seed``,
    ``data_seed``, ``metric`` = ``<benchmark>/<subset>/<metric>``, ``value`` in %) and ``benchmarks.csv`` (the
    long results of :mod:`.benchmarks`, model = mixture, for ``countercurate tables``); returns the runs rows.
    The best validation loss stays in ``run.json`` (the pre-trained row has none, and every metric of the runs
    table needs a baseline row)."""
    from ...training import read_manifest

    s = settings(cfg)
    if train:
        if variant is None or manifest is None:
            raise ConfigError("train_run: training needs a variant and a manifest. Fix: pass --variant and --manifest")
        _check(dataset, variant)
        frame = read_manifest(manifest)
        train_frame = frame[frame["split"] == "train"].reset_index(drop=True)
        group_rows = int(train_frame.groupby("pair_id").size().max()) if len(train_frame) else 2
        section = training_section(cfg, dataset, variant, len(train_frame), group_rows)
        if s["checkpoint"] == "final":
            section["eval_every"] = final_eval_every(train_frame, section, data_seed)
    else:
        _check(dataset, variant or "grouping")
        section = training_section(cfg, dataset, variant or "grouping")
    role = s["role"]
    mixture = variant if train else PRETRAINED
    out_dir = Path(out_dir)
    run_cfg = _plain(cfg)
    run_cfg["training"] = section
    precision = training_precision(s, dataset)
    if precision:
        run_cfg["precision"] = precision
    if "models" not in run_cfg or role not in run_cfg["models"]:
        raise ConfigError(f"countercurate.training.role {role!r} is not a model role of the config. "
                          "Fix: add it under models or choose another role")
    ev_runs.run_one(run_cfg, manifest if train else None, mixture, seed, data_seed, out_dir, progress=progress,
                    default_eval=False, role=role, experiment=dataset, train=train)
    checkpoint = out_dir / "checkpoint" if train else None  # scored through the ordinary loaders
    return score_run(cfg, role, checkpoint, dataset, mixture, seed, data_seed, out_dir, data=data, images=images,
                     progress=progress)


def final_eval_every(train_frame: pd.DataFrame, section: Mapping, data_seed: int) -> int:
    """``eval_every`` that keeps the final weights (``checkpoint: final``, §4.1: a fixed number of epochs, no
    selection): the run's number of steps, so the trainer validates and saves once, after the last step, and that
    checkpoint is the one kept."""
    from ...training.data import step_plan

    plan = step_plan(train_frame, int(section["batch_size"]), int(section["epochs"]), int(data_seed),
                     str(section["recipe"]), section.get("max_steps"))
    return max(1, len(plan))


def score_run(cfg: Mapping, role: str, checkpoint: str | Path | None, dataset: str, mixture: str, seed: int,
              data_seed: int, out_dir: str | Path, *, data: Mapping[str, str | Path] | None = None,
              images: Mapping[str, str | Path] | None = None, progress: bool = False) -> pd.DataFrame:
    """Score ``role`` (its ``checkpoint`` when given) on ``dataset``'s benchmarks; write ``metrics.csv`` and
    ``benchmarks.csv`` into ``out_dir`` (see :func:`train_run`) and return the runs rows."""
    s = settings(cfg)
    out_dir = Path(out_dir)
    eval_cfg = _plain(bm.scoring_cfg(cfg))   # benchmarks.precision (paper config: fp32)
    if checkpoint is not None:
        eval_cfg["models"][role] = {**eval_cfg["models"][role], "source": str(checkpoint)}
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
    spec = s["retrieval"]
    if spec and dataset in s["retrieval_datasets"] and role == s["role"]:  # §4.5 Table 5 (the CLIP family)
        metrics.update(ev_runs.evaluate_retrieval(eval_cfg, role, spec, progress))  # Recall@K in %
    rows = pd.DataFrame([{"experiment": dataset, "mixture": mixture, "seed": int(seed), "data_seed": int(data_seed),
                          "metric": k, "value": float(v)} for k, v in metrics.items()], columns=RUN_COLUMNS)
    write_csv(out_dir / "benchmarks.csv", results)
    write_csv(out_dir / "metrics.csv", rows)
    return rows


def vlm_train_run(cfg: Mapping, dataset: str, manifests: str | Path | None, seed: int, out_dir: str | Path,
                  train: bool = True, *, data: Mapping[str, str | Path] | None = None,
                  images: Mapping[str, str | Path] | None = None, progress: bool = False) -> pd.DataFrame:
    """The generative family on ``dataset``: fine-tune ``training.vlm.role`` on ``<dataset>_conversation_train``
    of ``manifests`` (validation on ``..._val`` when it has rows) with the dataset's §4.1 learning rate into
    ``out_dir/vlm`` (:func:`.vlm_finetune.train_run`), then score it — or the pre-trained model, ``train=False`` — on the
    dataset's benchmarks by two-option choice (:func:`score_run`; mixture ``conversation`` / ``pretrained``)."""
    from . import vlm, vlm_finetune

    s = settings(cfg)
    if dataset not in DATASETS:
        raise ConfigError(f"unknown CounterCurate dataset {dataset!r}. Fix: use one of {', '.join(DATASETS)}")
    role = s["vlm"]["role"]
    if "models" not in cfg or role not in cfg["models"]:
        raise ConfigError(f"countercurate.training.vlm.role {role!r} is not a model role of the config. "
                          "Fix: add it under models or choose another role")
    out_dir = Path(out_dir)
    checkpoint = None
    if train:
        if manifests is None:
            raise ConfigError("vlm_train_run: training needs the manifests folder. Fix: pass --manifests")
        manifests = Path(manifests)
        train_file = manifests / f"{dataset}_{VLM_MIXTURE}_train.parquet"
        val_file = manifests / f"{dataset}_{VLM_MIXTURE}_val.parquet"
        # §4.1: the final weights after the fixed epochs; best_val (ours) selects on the validation pairs
        has_val = s["checkpoint"] == "best_val" and val_file.is_file() and len(pd.read_parquet(val_file)) > 0
        run_cfg = _plain(cfg)
        run_cfg[vlm.SECTION] = {**(run_cfg.get(vlm.SECTION) or {}), "lr": float(s["vlm"]["lr"][dataset])}
        precision = training_precision(s, dataset, family="vlm")
        if precision:
            run_cfg["precision"] = precision
        vlm_finetune.train_run(run_cfg, train_file, out_dir / "vlm", seed, role=role,
                               val_data=val_file if has_val else None, progress=progress)
        checkpoint = out_dir / "vlm" / "model"
    return score_run(cfg, role, checkpoint, dataset, VLM_MIXTURE if train else PRETRAINED, seed, seed, out_dir,
                     data=data, images=images, progress=progress)
