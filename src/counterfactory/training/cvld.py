"""CVLD debiased adaptation of BLIP (CVLD §4, §5.1-5.4, appendix C, Table 3): settings, episodes and training
loops; the losses are in :mod:`.cvld_losses`.

Every task uses the augmented loss of Eq. 3, ``L = l(B) + lambda * l(B~)``, where ``B~`` holds the
intervened (counterfactual) pairs of the batch's examples that have one.

* **Classification** (§4.2): zero-shot classification with BLIP's ITM head over class prompts ``p(c)``
  (:data:`CELEBA_PROMPTS`), few-shot adapted by multimodal prompt tuning (:mod:`.prompt_tuning`), loss
  ``CE(B) + lambda * CE(B~)`` with the counterfactual images keeping their labels (lambda = 1).
* **Retrieval** (§4.3): BLIP's ITC + ITM with counterfactuals, :func:`cvld_itc_loss` (candidate extension
  with soft labels, query extension of Eq. 8) and :func:`cvld_itm_loss` (counterparts never drawn as hard
  negatives), and the ablation variants of Table 3 (:data:`VARIANTS`); full fine-tuning. BLIP's own terms
  follow its official retrieval fine-tuning (appendix C; ``objective: official``, the default of
  ``cvld.retrieval.train``): momentum encoder, queues, momentum distillation and same-image positives / ITM
  masks (:class:`RetrievalModule`), the counterfactual terms added as they are; ``plain`` = in-batch ITC + ITM.
* **Captioning** (§4.4, Eq. 9): BLIP's language-modelling loss on (I, T) plus lambda times the same loss on
  the intervened pairs; full fine-tuning.

Training tables have the columns ``image_path``, ``caption``, ``cf_image_path``, ``cf_caption`` (the last
two empty or null when an example has no counterfactual) and, for classification, ``label`` (0/1); an
optional ``id`` column names rows (otherwise image path + caption). Appendix C's settings are the defaults
of :meth:`CVLDSettings.for_task`; the optimiser is AdamW with weight decay 0.05 on every parameter and the
learning rate follows a cosine decay per epoch to 0, as BLIP's official fine-tuning configs
(``retrieval_coco.yaml`` / ``caption_coco.yaml``: ``weight_decay: 0.05``, ``cosine_lr_schedule``).
Runs are deterministic given the seed: batch order, dropout and ITM negatives are seeded from the seed and
the rows' ids, never from positions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..config import fill_section
from ..errors import ConfigError, input_error
from ..io import atomic_dir
from ..rgb import to_rgb
from ..settings import schema_default
from .cvld_losses import (CELEBA_PROMPTS, VARIANTS, RetrievalModule, captioning_loss,  # noqa: F401 (re-exported)
                          class_prompts, classification_loss, classification_logits, cvld_itc_loss, cvld_itm_loss,
                          prompt_length, retrieval_variant)
from .data import image_id_map
from .model import BLIP_OBJECTIVES
from .prompt_tuning import ATTR, add_prompts, prompt_parameters, save_prompts

log = logging.getLogger(__name__)

TASKS = ("classification", "retrieval", "captioning")
#: CVLD §5.2 / appendix A: results are averaged over 10 few-shot episodes
N_EPISODES = 10

# --------------------------------------------------------------------------- settings

def task_defaults(task: str) -> dict:
    """Appendix C's settings of ``task`` (classification epochs are not in the paper: ours, 20): the schema's
    ``cvld.<task>.train`` defaults (config/schema.yaml), the one place they are written."""
    if task not in TASKS:
        raise ConfigError(f"CVLD: unknown task {task!r}. Fix: use one of {list(TASKS)}")
    return fill_section(f"cvld.{task}.train")


@dataclass(frozen=True)
class CVLDSettings:
    """One CVLD run. Use :meth:`for_task` for appendix C's defaults. ``max_length``: text tokens (BLIP's
    retrieval code truncates at 35, its captioning decoder at 40). ``variant``: retrieval only (Table 3).
    ``n_prompts`` / ``n_prompt_layers``: classification's prompt tuning (§5.1). ``objective``, ``momentum``,
    ``queue_size``, ``alpha``: retrieval's BLIP objective (:class:`RetrievalModule`; defaults: the schema's
    ``cvld.retrieval.train``); classification and captioning ignore them."""

    task: str
    epochs: int
    lr: float
    batch_size: int
    lam: float
    max_length: int = 35
    weight_decay: float = 0.05  # BLIP's fine-tuning configs
    variant: str = "cvld"
    max_steps: int | None = None
    seed: int = 0
    n_prompts: int = 4
    n_prompt_layers: int = 9
    objective: str = schema_default("cvld.retrieval.train.objective")
    momentum: float = schema_default("cvld.retrieval.train.momentum")
    queue_size: int = schema_default("cvld.retrieval.train.queue_size")
    alpha: float = schema_default("cvld.retrieval.train.alpha")
    progress: bool = False

    def __post_init__(self):
        if self.task not in TASKS:
            raise ConfigError(f"CVLD: unknown task {self.task!r}. Fix: use one of {list(TASKS)}")
        retrieval_variant(self.variant)
        if self.epochs < 1 or self.batch_size < 1 or (self.max_steps is not None and self.max_steps < 1):
            raise ConfigError(f"CVLD: epochs, batch_size and max_steps must be >= 1 (got {self.epochs}, "
                              f"{self.batch_size}, {self.max_steps}). Fix: set positive values")
        if self.lam < 0:
            raise ConfigError(f"CVLD: lambda must be >= 0, got {self.lam}. Fix: use 0 (no counterfactual term) or more")

        if self.objective not in BLIP_OBJECTIVES:
            raise ConfigError(f"CVLD: objective must be one of {list(BLIP_OBJECTIVES)}, got {self.objective!r}. Fix: "
                              "official (BLIP's retrieval fine-tuning, appendix C) or plain")
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (self.momentum, self.alpha))
        if not (numbers and 0 <= self.momentum <= 1 and 0 <= self.alpha <= 1) or isinstance(self.queue_size, bool) \
                or not isinstance(self.queue_size, int) or self.queue_size < 1:
            raise ConfigError(f"CVLD: BLIP needs momentum and alpha in [0, 1] and queue_size >= 1, got "
                              f"{self.momentum!r}, {self.alpha!r}, {self.queue_size!r}. Fix: BLIP's 0.995, 0.4, 57600")

    @classmethod
    def for_task(cls, task: str, **overrides) -> "CVLDSettings":
        return cls(task=task, **{**task_defaults(task), **overrides})


@dataclass
class CVLDResult:
    history: list[dict] = field(default_factory=list)
    out_dir: Path | None = None


# --------------------------------------------------------------------------- few-shot episodes, BLIP^Bal

def _rank_key(*parts) -> str:
    return hashlib.sha1(":".join(str(p) for p in parts).encode("utf-8")).hexdigest()


def _seed_of(*parts) -> int:
    return int(_rank_key(*parts)[:15], 16)


def _row_keys(frame: pd.DataFrame, id_col: str | None = None) -> list[str]:
    if id_col is not None:
        return frame[id_col].astype(str).tolist()
    if "id" in frame.columns:
        return frame["id"].astype(str).tolist()
    if "image_path" in frame.columns:
        caption = frame["caption"].astype(str) if "caption" in frame.columns else ""
        return (frame["image_path"].astype(str) + "\n" + caption).tolist()
    return [str(i) for i in frame.index]


def sample_episode(labels_frame: pd.DataFrame, attribute: str, k: int, episode: int, seed: int = 0,
                   id_col: str | None = None) -> pd.DataFrame:
    """A K-shot episode (§5.2): K rows with ``attribute == 1`` then K with ``attribute == 0``. Rows are
    ranked by sha1 of (seed, attribute, k, episode, row id) and the first K of each class are kept, so an
    episode depends on those values and the rows' ids only (not on the table's order). Row ids:
    ``id_col``, else an ``id`` column, else image path + caption, else the index."""
    source = labels_frame.attrs.get("source", "labels table")
    if attribute not in labels_frame.columns:
        raise input_error(source, None, f"no column {attribute!r}", "pass one of the attribute columns "
                          f"{[c for c in labels_frame.columns if c in CELEBA_PROMPTS] or list(labels_frame.columns)}")
    values = labels_frame[attribute]
    bad = ~values.isin([0, 1])
    if bad.any():
        raise input_error(source, f"row {int(np.flatnonzero(bad)[0])}", f"{attribute} is {values[bad].iloc[0]!r}, "
                          "not 0/1", "map CelebA's -1/1 values to 0/1 ((x + 1) // 2)")
    keys = _row_keys(labels_frame, id_col)
    ranks = pd.Series([_rank_key(seed, attribute, k, episode, key) for key in keys], index=labels_frame.index)
    parts = []
    for value in (1, 0):
        pool = ranks[values == value].sort_values(kind="stable")
        if len(pool) < k:
            raise input_error(source, None, f"{len(pool)} rows with {attribute} = {value}, fewer than K = {k}",
                              "use a smaller K or a larger training table")
        parts.append(labels_frame.loc[pool.index[:k]])
    return pd.concat(parts)


def balanced_subset(frame: pd.DataFrame, group_col: str, seed: int = 0, id_col: str | None = None) -> pd.DataFrame:
    """BLIP^Bal's training set (Tables 2 and 4): every group of ``group_col`` (e.g. gender) downsampled to
    the size of the smallest group, keeping the rows of each group that rank first by sha1 of (seed, row
    id). Rows with no group (null or empty: no person) are all kept, as are the table's order and index.
    Downsampling rather than oversampling is our reading of "balanced sampling" (§5.3: resampling
    "effectively reduces the sample count")."""
    if group_col not in frame.columns:
        raise input_error(frame.attrs.get("source", "training table"), None, f"no column {group_col!r}",
                          "pass the column holding the protected group (e.g. gender)")
    groups = frame[group_col]
    grouped = groups.notna() & (groups.astype(str).str.strip() != "")
    if not grouped.any():
        return frame.copy()
    sizes = groups[grouped].value_counts()
    keep = ~grouped
    keys = pd.Series(_row_keys(frame, id_col), index=frame.index)
    for value in sizes.index:
        members = keys[grouped & (groups == value)]
        ranks = members.map(lambda key: _rank_key(seed, "balanced", key)).sort_values(kind="stable")
        keep.loc[ranks.index[: int(sizes.min())]] = True
    return frame[keep].copy()


# --------------------------------------------------------------------------- data

def _blank(values: pd.Series) -> pd.Series:
    return values.isna() | (values.astype(str).str.strip() == "")


def _check_table(table: pd.DataFrame, task: str) -> pd.DataFrame:
    source = table.attrs.get("source", "training table")
    need = {"classification": ["image_path", "cf_image_path", "label"],
            "retrieval": ["image_path", "caption", "cf_image_path", "cf_caption"],
            "captioning": ["image_path", "caption", "cf_image_path", "cf_caption"]}[task]
    missing = [c for c in need if c not in table.columns]
    if missing:
        raise input_error(source, None, f"missing columns {missing}", f"a {task} table needs {need} (cf_* empty "
                          "when an example has no counterfactual)")
    if len(table) == 0:
        raise input_error(source, None, "no rows", "check the training split")
    table = table.reset_index(drop=True)
    if _blank(table["image_path"]).any():
        raise input_error(source, f"row {int(np.flatnonzero(_blank(table['image_path']))[0])}", "empty image_path",
                          "fill it or drop the row")
    if task == "classification":
        bad = ~table["label"].isin([0, 1])
        if bad.any():
            raise input_error(source, f"row {int(np.flatnonzero(bad)[0])}", f"label {table['label'][bad].iloc[0]!r} "
                              "is not 0/1", "map the attribute to 0/1")
    else:
        if _blank(table["caption"]).any():
            raise input_error(source, f"row {int(np.flatnonzero(_blank(table['caption']))[0])}", "empty caption",
                              "fill it or drop the row")
        half = _blank(table["cf_image_path"]) != _blank(table["cf_caption"])
        if half.any():
            raise input_error(source, f"row {int(np.flatnonzero(half)[0])}", "a counterfactual image without a "
                              "caption or a caption without an image", "give both cf_image_path and cf_caption, or neither")
    return table


def _images(paths: Sequence[str], rows: Sequence[int], root: Path, processor, source: str) -> torch.Tensor:
    from PIL import Image

    images = []
    for path, row in zip(paths, rows):
        full = root / str(path)
        try:
            with Image.open(full) as im:
                images.append(to_rgb(im, full))
        except (OSError, ValueError) as exc:
            raise input_error(source, f"row {row}", f"cannot read image {full} ({exc})",
                              "fix the path (relative to the image root) or the file") from exc
    return processor.image_processor(images=images, return_tensors="pt")["pixel_values"]


def _tokens(processor, texts: Sequence[str], max_length: int):
    return processor.tokenizer(list(texts), padding="longest", truncation=True, max_length=max_length,
                               return_tensors="pt")


# --------------------------------------------------------------------------- loops

def _cosine_factor(step: int, steps_per_epoch: int, epochs: int) -> float:
    """BLIP's ``cosine_lr_schedule`` (min_lr 0), set once per epoch: ``0.5 * (1 + cos(pi * epoch / epochs))``."""
    return 0.5 * (1.0 + math.cos(math.pi * (step // steps_per_epoch) / epochs))


def _batches(keys: Sequence[str], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    order = sorted(range(len(keys)), key=lambda i: (_rank_key(seed, "epoch", epoch, keys[i]), i))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def _fit(params: list[nn.Parameter], keys: Sequence[str], settings: CVLDSettings,
         step_loss: Callable[[list[int], torch.Generator], torch.Tensor]) -> list[dict]:
    """AdamW + BLIP's per-epoch cosine schedule over seeded batches. Each step seeds dropout and the ITM
    draw from (seed, the batch's row ids); the global RNG is restored afterwards.

    Why not ``transformers.Trainer`` like the other studies (:mod:`.trainer`): CVLD's steps are not batches of
    tensors but row ids of a table -- the loss fetches each row's counterfactual partner, draws ITM negatives
    that exclude it and seeds its dropout from the rows' ids (so a run does not depend on batch position) --
    and classification trains only the deep prompts of a BLIP that stays in eval mode, which the Trainer's
    ``training_step`` (``model.train()`` every step) would undo. Bending the Trainer's dataset, collator,
    training step, scheduler and RNG handling around that is more code than this loop, which does only
    AdamW steps (torch's) under BLIP's ``cosine_lr_schedule``; the losses are :func:`cvld_itc_loss`,
    :func:`cvld_itm_loss`, :func:`classification_loss` and :func:`captioning_loss`."""
    from tqdm.auto import tqdm

    per_epoch = math.ceil(len(keys) / settings.batch_size)
    total = per_epoch * settings.epochs
    if settings.max_steps is not None:
        total = min(total, settings.max_steps)
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _cosine_factor(s, per_epoch, settings.epochs))
    history, step = [], 0
    with torch.random.fork_rng(devices=[]), tqdm(total=total, disable=not settings.progress,
                                                  desc=f"CVLD {settings.task}") as bar:
        for epoch in range(settings.epochs):
            for rows in _batches(keys, settings.batch_size, settings.seed, epoch):
                if step >= total:
                    return history
                batch_seed = _seed_of(settings.seed, "step", *(keys[r] for r in rows))
                torch.manual_seed(batch_seed)
                generator = torch.Generator().manual_seed(batch_seed)
                lr = optimizer.param_groups[0]["lr"]
                loss = step_loss(rows, generator)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1
                history.append({"step": step, "epoch": epoch, "loss": float(loss.detach()), "lr": lr})
                bar.update(1)
                bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
    return history


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _record(settings: CVLDSettings, history: list[dict], extra: dict | None = None) -> str:
    return json.dumps({"settings": asdict(settings), "history": history, **(extra or {})}, indent=2, sort_keys=True)


def train_classification(model: nn.Module, processor, table: pd.DataFrame, attribute: str,
                         settings: CVLDSettings | None = None, out_dir: str | Path | None = None,
                         image_root: str | Path = ".") -> CVLDResult:
    """Few-shot CVLD classification (§4.2, §5.2) of a ``BlipForImageTextRetrieval``: deep prompts are
    added (unless the model has them; seed ``settings.seed``) and only they are trained on Eq. 3 with
    :func:`classification_loss` (rows with ``cf_image_path`` contribute their counterfactual). The frozen
    model runs in eval mode (no dropout; our choice). Saves ``prompts.safetensors`` and ``cvld.json``."""
    settings = settings or CVLDSettings.for_task("classification")
    if "label" not in table.columns and attribute in table.columns:  # a sample_episode frame
        table = table.assign(label=table[attribute])
    table = _check_table(table, "classification")
    source, root = table.attrs.get("source", "training table"), Path(image_root)
    if getattr(model, ATTR, None) is None:
        add_prompts(model, settings.n_prompts, settings.n_prompt_layers, seed=settings.seed)
    model.eval()
    device = _device(model)
    prompt_tokens = {k: v.to(device) for k, v in _tokens(processor, class_prompts(attribute), settings.max_length).items()}
    has_cf = ~_blank(table["cf_image_path"])

    def step_loss(rows, generator):
        sub = table.iloc[rows]
        pixels = _images(sub["image_path"], rows, root, processor, source).to(device)
        labels = torch.tensor(sub["label"].astype(int).to_numpy())
        cf_rows = [r for r in rows if has_cf[r]]
        cf_pixels = _images(table["cf_image_path"][cf_rows], cf_rows, root, processor, source).to(device) \
            if cf_rows and settings.lam else None
        cf_labels = torch.tensor(table["label"][cf_rows].astype(int).to_numpy())
        return classification_loss(model, prompt_tokens, pixels, labels, cf_pixels, cf_labels, settings.lam)

    history = _fit(prompt_parameters(model), _row_keys(table), settings, step_loss)
    if out_dir is not None:
        with atomic_dir(out_dir) as tmp:
            save_prompts(model, tmp / "prompts.safetensors")
            (tmp / "cvld.json").write_text(_record(settings, history, {"attribute": attribute,
                                                                        "class_prompts": class_prompts(attribute)}))
    return CVLDResult(history, Path(out_dir) if out_dir is not None else None)


def _pool_batch(table, rows, has_cf, root, processor, settings, source, device):
    """Pixels and tokens of the pool: the rows' originals, then the counterfactuals of those that have one."""
    cf_rows = [r for r in rows if has_cf[r]]
    paths = list(table["image_path"][rows]) + list(table["cf_image_path"][cf_rows])
    texts = list(table["caption"][rows]) + list(table["cf_caption"][cf_rows])
    pixels = _images(paths, list(rows) + cf_rows, root, processor, source).to(device)
    tokens = {k: v.to(device) for k, v in _tokens(processor, texts, settings.max_length).items()}
    return pixels, tokens, torch.tensor([bool(has_cf[r]) for r in rows])


def _save_model(model, processor, out_dir, settings, history) -> None:
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        (tmp / "cvld.json").write_text(_record(settings, history))


def pool_image_ids(table: pd.DataFrame, has_cf: pd.Series) -> tuple[list[int], list[int]]:
    """BLIP's image ids (``idx``) of a retrieval table, for the official objective: one integer per distinct
    image file among the originals' ``image_path`` and the counterfactuals' ``cf_image_path``
    (:func:`.data.image_id_map`: sorted paths, so the ids depend on the set of files only). Rows of one source
    image (COCO's five captions) share an id: same-image positives of ITC, never each other's ITM negatives.
    A counterfactual is an edited, separate image (§3.3), so it has an id of its own, not its original's (as
    BLIP: same ``image_id`` => positive; CVLD's soft label, not the id, ties it to its original). Returns the
    id of each row's image and of each row's counterfactual (-1 where it has none)."""
    paths = pd.concat([table["image_path"].astype(str), table["cf_image_path"][has_cf].astype(str)])
    ids = image_id_map(pd.DataFrame({"image_path": paths}))
    image = [ids[str(p)] for p in table["image_path"]]
    cf = [ids[str(p)] if has else -1 for p, has in zip(table["cf_image_path"], has_cf)]
    return image, cf


def train_retrieval(model: nn.Module, processor, table: pd.DataFrame, settings: CVLDSettings | None = None,
                    out_dir: str | Path | None = None, image_root: str | Path = ".") -> CVLDResult:
    """CVLD retrieval fine-tuning (§4.3, §5.3) of the whole ``BlipForImageTextRetrieval`` with
    :class:`RetrievalModule`, ``settings.variant`` (Table 3) and ``settings.objective`` (official: BLIP's
    momentum encoder and queues, made here from the model as it is, with ``alpha`` ramped over the first
    epoch's steps as BLIP's ``train_retrieval.py``; image ids from :func:`pool_image_ids`). Saves the model
    (loadable with ``from_pretrained``; the temperature, momentum encoder and queues are dropped), the
    processor and ``cvld.json``."""
    settings = settings or CVLDSettings.for_task("retrieval")
    table = _check_table(table, "retrieval")
    source, root = table.attrs.get("source", "training table"), Path(image_root)
    ramp = math.ceil(len(table) / settings.batch_size)
    module = RetrievalModule(model, settings.objective, settings.momentum, settings.queue_size, settings.alpha,
                             ramp_steps=ramp).to(_device(model))
    module.train()
    variant = retrieval_variant(settings.variant)
    has_cf = ~_blank(table["cf_image_path"])
    if not (variant.candidates or variant.itm_counterfactuals):
        has_cf[:] = False
    image_ids, cf_ids = pool_image_ids(table, has_cf) if module.objective == "official" else (None, None)

    def step_loss(rows, generator):
        pixels, tokens, cf = _pool_batch(table, rows, has_cf, root, processor, settings, source, _device(model))
        ids = None
        if image_ids is not None:   # the pool's order: the rows, then the counterfactuals of those that have one
            ids = torch.tensor([image_ids[r] for r in rows] + [cf_ids[r] for r in rows if has_cf[r]])
        return module(pixels, tokens["input_ids"], tokens["attention_mask"], cf, variant, settings.lam,
                      generator, ids)["loss"]

    if module.objective == "official":
        log.info("CVLD retrieval: BLIP's official objective (momentum %g, queue %d, alpha %g ramped over %d steps)",
                 settings.momentum, settings.queue_size, settings.alpha, ramp)
    history = _fit([p for p in module.parameters() if p.requires_grad], _row_keys(table), settings, step_loss)
    model.eval()
    if out_dir is not None:
        _save_model(model, processor, out_dir, settings, history)
    return CVLDResult(history, Path(out_dir) if out_dir is not None else None)


def train_captioning(model: nn.Module, processor, table: pd.DataFrame, settings: CVLDSettings | None = None,
                     out_dir: str | Path | None = None, image_root: str | Path = ".", prompt: str = "") -> CVLDResult:
    """CVLD captioning fine-tuning (§4.4, §5.4) of a ``BlipForConditionalGeneration`` on
    :func:`captioning_loss`. ``prompt``: the text every caption (and counterfactual caption) begins with
    (BLIP's "a picture of "); its tokens are context, not targets. Saves the model, the processor and
    ``cvld.json``."""
    settings = settings or CVLDSettings.for_task("captioning")
    table = _check_table(table, "captioning")
    source, root = table.attrs.get("source", "training table"), Path(image_root)
    for column in ("caption", "cf_caption") if prompt else ():
        texts = table[column].astype(str)
        bad = np.flatnonzero(~texts.str.startswith(prompt) & ~_blank(table[column]))
        if len(bad):
            raise input_error(source, f"row {int(bad[0])}", f"{column} {texts.iloc[bad[0]]!r} does not begin with "
                              f"the captioning prompt {prompt!r}", "prepend the prompt to every caption "
                              "(counterfactory.studies.cvld.runs.with_caption_prompt) or train without one")
    n_prompt = prompt_length(processor.tokenizer, prompt)
    model.train()
    has_cf = ~_blank(table["cf_image_path"])

    def step_loss(rows, generator):
        pixels, tokens, cf = _pool_batch(table, rows, has_cf, root, processor, settings, source, _device(model))
        n = len(rows)
        ids, mask = tokens["input_ids"], tokens["attention_mask"]
        return captioning_loss(model, pixels[:n], ids[:n], mask[:n], pixels[n:], ids[n:], mask[n:], settings.lam,
                               n_prompt)

    history = _fit([p for p in model.parameters() if p.requires_grad], _row_keys(table), settings, step_loss)
    model.eval()
    if out_dir is not None:
        _save_model(model, processor, out_dir, settings, history)
    return CVLDResult(history, Path(out_dir) if out_dir is not None else None)


def train(task: str, model: nn.Module, processor, table: pd.DataFrame, settings: CVLDSettings | None = None,
          out_dir: str | Path | None = None, image_root: str | Path = ".", attribute: str | None = None) -> CVLDResult:
    """One entry for the three tasks (``attribute``: classification's target column)."""
    settings = settings or CVLDSettings.for_task(task)
    if settings.task != task:
        raise ConfigError(f"CVLD: settings for {settings.task!r} given to a {task!r} run. Fix: use "
                          f"CVLDSettings.for_task({task!r})")
    if task == "classification":
        if attribute is None:
            raise ConfigError("CVLD: classification needs the target attribute. Fix: pass attribute=<column>")
        return train_classification(model, processor, table, attribute, settings, out_dir, image_root)
    if task == "retrieval":
        return train_retrieval(model, processor, table, settings, out_dir, image_root)
    return train_captioning(model, processor, table, settings, out_dir, image_root)
