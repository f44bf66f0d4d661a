"""Fine-tuning on ``transformers.Trainer``: one trainer for every study and recipe.

The Trainer (and ``accelerate`` under it) does the optimiser (AdamW), the learning-rate schedule,
gradient clipping, mixed precision, device placement, evaluation/saving every ``eval_every`` steps and
keeping the checkpoint with the best validation loss. We own the loss (:func:`.model.recipe_loss`),
the batch plan (:func:`.data.step_plan`), which parameters are exempt from weight decay, and the
per-step history. On Intel Gaudi the Trainer runs on Habana's PyTorch bridge (found by
:mod:`counterfactory.device`); optimum-habana's ``GaudiTrainer`` is used instead when it is importable.

Defaults (:class:`TrainSettings`) are COCO-Counterfactuals appendix B.3.2 / the Hugging Face CLIP
example script the authors fine-tuned with. One schedule is ours rather than the Trainer's:
``lr_scheduler: step`` (step decay by ``lr_step_gamma`` every ``lr_step_epochs`` epochs of the batch plan,
Kim et al. 2023 §4.1), a ``LambdaLR`` made in ``create_scheduler``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import importlib.util
import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
import torch
from torch import nn
from transformers import Trainer

from ..device import resolve_dtype
from ..errors import ConfigError
from ..settings import schema_default, schema_defaults
from .data import Collator, RowDataset, anchors_and_partners, eval_batches, image_id_map, step_plan
from .model import BLIP_OBJECTIVES, ContrastiveAdapter, aliases, recipe_loss

log = logging.getLogger(__name__)

@dataclass(frozen=True)
@schema_defaults("coco_counterfactuals.training")
class TrainSettings:
    """Defaults: COCO-Counterfactuals appendix B.3.2 (and the HF CLIP example's Trainer defaults), as the schema
    writes them (``coco_counterfactuals.training``); ``seed`` / ``data_seed``: the first run of config/config.yaml's
    ``training.seeds`` (B.3.2: 107, 108; the schema gives the seeds no default, and every run passes its own)."""

    lr: float
    weight_decay: float
    batch_size: int
    eval_batch_size: int
    epochs: int
    eval_every: int  # the authors' code: evaluate/save every 109 steps
    recipe: str  # plain | grouping | cvld
    cvld_lambda: float
    seed: int = 107
    data_seed: int = 108
    max_steps: int | None
    optimizer: str
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    no_decay: tuple[str, ...]
    lr_scheduler: str  # a transformers scheduler name, or "step" (see lr_step_epochs)
    warmup_steps: int
    max_grad_norm: float
    max_length: int | None
    dataloader_workers: int
    deterministic: bool
    cpu_threads: int | None
    precision: str
    #: ``lr_scheduler: step``: the rate is ``lr * lr_step_gamma ** floor(step / step_size)`` with
    #: ``step_size = max(1, round(lr_step_epochs * steps_per_epoch))`` (Kim et al. 2023 §4.1: CLIP halved
    #: every 2 epochs, BLIP every half epoch); see :func:`step_size_of`
    lr_step_epochs: float | None = None
    lr_step_gamma: float = schema_default("spurious_retrieval.training.clip.lr_step_gamma")
    #: BLIP only (:meth:`.model.ContrastiveModule.configure_blip`): ``official`` = BLIP's own retrieval
    #: objective (momentum distillation with ``momentum``, queues of ``queue_size``, ``alpha`` ramped over the
    #: first epoch, same-image masks; the spurious study's BLIP recipe, the only one that trains BLIP through this
    #: trainer), ``plain`` = in-batch ITC + ITM; other model kinds ignore these keys
    objective: str = schema_default("spurious_retrieval.training.blip.objective")
    momentum: float = schema_default("spurious_retrieval.training.blip.momentum")
    queue_size: int = schema_default("spurious_retrieval.training.blip.queue_size")
    alpha: float = schema_default("spurious_retrieval.training.blip.alpha")

    # the config keys of the training section that map onto fields (seeds come from the run)
    SECTION_KEYS = ("lr", "weight_decay", "batch_size", "eval_batch_size", "epochs", "eval_every", "recipe",
                    "cvld_lambda", "max_steps", "optimizer", "adam_beta1", "adam_beta2", "adam_epsilon",
                    "no_decay", "lr_scheduler", "warmup_steps", "max_grad_norm", "max_length",
                    "dataloader_workers", "deterministic", "cpu_threads")
    # keys read when the section has them (configs and job views written before they existed lack them)
    OPTIONAL_KEYS = ("lr_step_epochs", "lr_step_gamma", "objective", "momentum", "queue_size", "alpha")

    def __post_init__(self):
        if self.objective not in BLIP_OBJECTIVES:
            raise ConfigError(f"training: objective must be one of {list(BLIP_OBJECTIVES)}, got {self.objective!r}. "
                              "Fix: official (BLIP's own fine-tuning) or plain")
        if not (_is_number(self.momentum) and 0 <= self.momentum <= 1 and _is_number(self.alpha)
                and 0 <= self.alpha <= 1) or isinstance(self.queue_size, bool) \
                or not isinstance(self.queue_size, int) or self.queue_size < 1:
            raise ConfigError(f"training: BLIP needs momentum and alpha in [0, 1] and queue_size >= 1, got "
                              f"{self.momentum!r}, {self.alpha!r}, {self.queue_size!r}. Fix: BLIP's 0.995, 0.4, 57600")
        if self.lr_scheduler != "step":
            return

        epochs, gamma = self.lr_step_epochs, self.lr_step_gamma
        if epochs is None or not _is_number(epochs) or not epochs > 0:
            raise ConfigError(f"training: lr_scheduler 'step' needs lr_step_epochs > 0, got {epochs!r}. Fix: set "
                              "training.lr_step_epochs to the epochs between decays (e.g. 2, or 0.5 for every "
                              "half epoch)")
        if not _is_number(gamma) or not 0 < gamma <= 1:
            raise ConfigError(f"training: lr_step_gamma must be in (0, 1], got {gamma!r}. Fix: set "
                              "training.lr_step_gamma to the factor applied at each decay (0.5 halves the rate)")

    @classmethod
    def from_section(cls, section: dict, seed: int, data_seed: int, precision: str = "fp32") -> "TrainSettings":
        """Settings from a config's ``training`` section; every key of :attr:`SECTION_KEYS` must be there
        (the schema fills defaults; a job view holds exactly the keys its rule declares); the keys of
        :attr:`OPTIONAL_KEYS` are used when present and otherwise keep their defaults."""
        missing = [k for k in cls.SECTION_KEYS if k not in section]
        if missing:
            raise ConfigError(f"training: missing keys {missing}. Fix: add them to the config (the schema has "
                              "defaults) or to the keys the train_run rule passes (rules/training.smk)")
        values = {k: section[k] for k in cls.SECTION_KEYS}
        values.update({k: section[k] for k in cls.OPTIONAL_KEYS if k in section and section[k] is not None})
        values["no_decay"] = tuple(values["no_decay"] or ())
        batch = values["eval_batch_size"]
        values["eval_batch_size"] = values["batch_size"] if batch is None else batch
        return cls(**values, seed=seed, data_seed=data_seed, precision=precision)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def steps_per_epoch(train_frame: pd.DataFrame, settings: TrainSettings) -> float:
    """Optimisation steps in one epoch of the batch plan: the whole plan's length (every epoch, no
    ``max_steps`` cut) over the epochs (plain and CVLD epochs all have the same count; grouping's may
    differ by a batch, hence the mean)."""
    plan = step_plan(train_frame, settings.batch_size, settings.epochs, settings.data_seed, settings.recipe)
    return len(plan) / max(1, settings.epochs)


def step_size_of(settings: TrainSettings, per_epoch: float) -> int:
    """Steps between two decays of ``lr_scheduler: step``: ``max(1, round(lr_step_epochs * per_epoch))``."""
    return max(1, int(round(float(settings.lr_step_epochs) * per_epoch)))


def step_lr_factor(step: int, step_size: int, gamma: float, warmup_steps: int = 0) -> float:
    """The multiplier of ``lr`` at optimiser step ``step`` (0-based) under ``lr_scheduler: step``:
    ``gamma ** (step // step_size)``, times the Trainer's linear warm-up ``step / warmup_steps`` while
    ``step < warmup_steps`` (none by default; the decays count from step 0 either way)."""
    factor = float(gamma) ** (step // step_size)
    if step < warmup_steps:
        factor *= step / max(1, warmup_steps)
    return factor


@dataclass
class TrainResult:
    history: list[dict]
    best_step: int
    best_val_loss: float


# --------------------------------------------------------------------------- weight decay

def no_decay_parameter_names(model: nn.Module, patterns: Iterable[str]) -> set[str]:
    """Parameters exempt from weight decay. A pattern matches a parameter when it is a glob matching the
    parameter's own name (``bias``) or its full dotted name (``text_model.*.bias``), or the class name of
    the module that owns it or of one of that class's bases (``LayerNorm`` covers ``torch.nn.LayerNorm``
    and open_clip's subclass of it)."""
    patterns = list(patterns)
    out = set()
    for module_name, module in model.named_modules():
        classes = {c.__name__ for c in type(module).__mro__}
        for name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if any(p in classes or fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(full, p) for p in patterns):
                out.add(full)
    return out


# --------------------------------------------------------------------------- trainer

class _ContrastiveMixin:
    """What we add to a ``transformers.Trainer`` (or optimum-habana's ``GaudiTrainer``): our batch plan
    as the data loaders, the recipe loss, the weight-decay exemptions and a per-step history."""

    def setup_contrastive(self, plan, train_collator, eval_plan, eval_collator, settings: TrainSettings):
        self.plan = plan
        self.train_collator = train_collator
        self.eval_plan = eval_plan
        self.eval_collator = eval_collator
        self.settings = settings
        self.history: list[dict] = []
        self.lr_step_size: int | None = None  # lr_scheduler "step": steps between decays (build_trainer sets it)

    def _loader(self, batches: Sequence[Sequence[int]], collator) -> torch.utils.data.DataLoader:
        n = 1 + max((r for b in batches for r in b), default=0)
        loader = torch.utils.data.DataLoader(
            RowDataset(n), batch_sampler=[list(b) for b in batches], collate_fn=collator,
            num_workers=self.args.dataloader_num_workers, pin_memory=self.args.dataloader_pin_memory)
        return self.accelerator.prepare(loader)

    def get_train_dataloader(self):
        return self._loader([b.rows for b in self.plan], self.train_collator)

    def get_eval_dataloader(self, eval_dataset=None):
        return self._loader(self.eval_plan, self.eval_collator)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """``lr_scheduler: step`` (see :func:`step_lr_factor`) as a ``LambdaLR``; other names: the Trainer's."""
        if self.settings.lr_scheduler != "step":
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            optimizer = self.optimizer if optimizer is None else optimizer
            size, gamma, warmup = self.lr_step_size, self.settings.lr_step_gamma, self.settings.warmup_steps
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: step_lr_factor(step, size, gamma, warmup))
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        exempt = no_decay_parameter_names(model, self.settings.no_decay)
        return [n for n, _ in model.named_parameters() if n not in exempt]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = recipe_loss(model, inputs, self.settings.cvld_lambda)
        return (loss, None) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Validation: the plain contrastive loss of a validation batch (every recipe, comparably)."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = recipe_loss(model, inputs, 0.0)
        return loss.detach(), None, None

    def training_step(self, model, inputs, num_items_in_batch=None):
        lr = float(self.optimizer.param_groups[0]["lr"])  # the rate this step's update uses
        module = getattr(model, "module", model)  # a data-parallel wrapper's
        if getattr(module, "blip_momentum", None) is not None:
            module.blip_step = self.state.global_step  # BLIP's alpha ramp follows the optimiser steps
        loss = super().training_step(model, inputs, num_items_in_batch)
        step = self.state.global_step + 1
        self.history.append({"step": step, "epoch": self.plan[step - 1].epoch, "train_loss": float(loss),
                             "val_loss": math.nan, "lr": lr})
        return loss

    def _save(self, output_dir=None, state_dict=None):
        """Intermediate checkpoints of our wrapper module: tied weights (FLAVA's heads share their decoder
        biases) saved once; safetensors refuses aliases, and loading restores them through the tie."""
        if state_dict is None:
            state_dict = self.model.state_dict()
            state_dict = {k: v for k, v in state_dict.items() if k not in set(aliases(state_dict))}
        return super()._save(output_dir, state_dict)

    def evaluate(self, *args, **kwargs):
        metrics = super().evaluate(*args, **kwargs)
        if self.history and self.history[-1]["step"] == self.state.global_step:
            self.history[-1]["val_loss"] = float(metrics["eval_loss"])
        return metrics


def _trainer_classes(device: torch.device):
    """(Trainer class, TrainingArguments class, extra arguments, extra trainer keywords) for ``device``."""
    from transformers import TrainingArguments

    if device.type == "hpu" and importlib.util.find_spec("optimum") is not None \
            and importlib.util.find_spec("optimum.habana") is not None:
        try:
            from optimum.habana import GaudiConfig, GaudiTrainer, GaudiTrainingArguments

            cls = type("GaudiContrastiveTrainer", (_ContrastiveMixin, GaudiTrainer), {})
            log.info("training on HPU with optimum-habana's GaudiTrainer")
            return cls, GaudiTrainingArguments, {"use_habana": True, "use_lazy_mode": True}, \
                {"gaudi_config": GaudiConfig()}
        except Exception as exc:  # pins that do not fit our transformers: use the Trainer on the bridge
            log.warning("optimum-habana is installed but unusable (%s); using transformers.Trainer on HPU", exc)
    return ContrastiveTrainer, TrainingArguments, {}, {}


class ContrastiveTrainer(_ContrastiveMixin, Trainer):
    """``transformers.Trainer`` with our batch plan, recipe loss, weight-decay exemptions and history."""


@contextlib.contextmanager
def cpu_threads(n: int | None, device: torch.device):
    """Train on CPU with exactly ``n`` intra-op threads (restored afterwards): float reductions are
    ordered by the thread split, so without a fixed count the results depend on the machine's cores
    and the job's ``threads``. ``None`` keeps torch's setting."""
    if device.type != "cpu" or not n:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool):
    """``torch.use_deterministic_algorithms`` for the duration of a run (restored afterwards), with the
    cuBLAS workspace setting deterministic CUDA matmuls need; ops without a deterministic kernel warn."""
    if not enabled:
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]


def _precision_flags(precision: str, device: torch.device) -> dict:
    dtype = resolve_dtype(precision, device)
    return {"fp16": dtype == torch.float16, "bf16": dtype == torch.bfloat16}


def build_trainer(adapter: ContrastiveAdapter, train_frame: pd.DataFrame, val_frame: pd.DataFrame,
                  settings: TrainSettings, image_root: str | Path, output_dir: str | Path, progress: bool = False,
                  callbacks: Sequence | None = None):
    """The configured Trainer (not yet trained); ``output_dir`` holds its intermediate checkpoints."""
    train_frame = train_frame.reset_index(drop=True)
    val_frame = val_frame.reset_index(drop=True)
    plan = step_plan(train_frame, settings.batch_size, settings.epochs, settings.data_seed, settings.recipe,
                     settings.max_steps)
    if not plan:
        raise ConfigError("training: no training rows. Fix: check the mixture manifest's train split")
    partners = anchors_and_partners(train_frame)[1] if settings.recipe == "cvld" else None
    adapter.max_length = adapter._text_length(settings.max_length)
    train_ids = val_ids = None
    if adapter.kind == "blip":  # before the Trainer moves the module: the momentum copies go with it
        # BLIP's alpha ramp: linear over the first epoch (train_retrieval.py: alpha * min(1, i / len(loader)))
        ramp = max(1, int(round(steps_per_epoch(train_frame, settings))))
        adapter.module.configure_blip(settings.objective, settings.momentum, settings.queue_size, settings.alpha,
                                      ramp_steps=ramp)
        if settings.objective == "official":
            train_ids, val_ids = image_id_map(train_frame), image_id_map(val_frame)
            log.info("BLIP official objective: momentum %g, queue %d, alpha %g (ramped over %d steps)",
                     settings.momentum, settings.queue_size, settings.alpha, ramp)
    device = adapter.device
    trainer_cls, args_cls, extra_args, extra_kwargs = _trainer_classes(device)
    args = args_cls(
        output_dir=str(output_dir),
        per_device_train_batch_size=settings.batch_size,  # informational: the batch plan decides
        per_device_eval_batch_size=settings.eval_batch_size,
        learning_rate=settings.lr,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.adam_beta1,
        adam_beta2=settings.adam_beta2,
        adam_epsilon=settings.adam_epsilon,
        optim=settings.optimizer,
        # "step" is ours (create_scheduler); the Trainer only validates the name it is given
        lr_scheduler_type="constant" if settings.lr_scheduler == "step" else settings.lr_scheduler,
        warmup_steps=settings.warmup_steps,
        max_grad_norm=settings.max_grad_norm,
        max_steps=len(plan),  # the plan already holds every epoch (and max_steps)
        eval_strategy="steps",
        eval_steps=settings.eval_every,
        save_strategy="steps",
        save_steps=settings.eval_every,
        save_only_model=True,
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
        greater_is_better=False,
        prediction_loss_only=True,
        logging_strategy="steps",
        logging_steps=settings.eval_every,
        report_to="none",
        disable_tqdm=not progress,
        seed=settings.seed,
        data_seed=settings.data_seed,
        use_cpu=device.type == "cpu",
        dataloader_num_workers=settings.dataloader_workers,
        dataloader_pin_memory=device.type == "cuda",
        remove_unused_columns=False,
        **_precision_flags(settings.precision, device),
        **extra_args,
    )
    if adapter.kind == "blip" and settings.objective == "official" and getattr(args, "n_gpu", 1) > 1:
        raise ConfigError(f"training: BLIP's official objective keeps its momentum encoder and queues in one process; "
                          f"{args.n_gpu} GPUs would train data-parallel replicas that drop their updates. Fix: expose "
                          "one GPU (CUDA_VISIBLE_DEVICES=0) or set the BLIP recipe's objective: plain")
    trainer = trainer_cls(model=adapter.module, args=args, train_dataset=RowDataset(len(train_frame)),
                          eval_dataset=RowDataset(len(val_frame)), callbacks=list(callbacks or []), **extra_kwargs)
    trainer.setup_contrastive(plan, Collator(train_frame, adapter, image_root, partners, image_ids=train_ids),
                              eval_batches(len(val_frame), settings.eval_batch_size),
                              Collator(val_frame, adapter, image_root, hard_negatives=False, image_ids=val_ids),
                              settings)
    if settings.lr_scheduler == "step":
        trainer.lr_step_size = step_size_of(settings, steps_per_epoch(train_frame, settings))
        log.info("lr_scheduler step: lr x %g every %d steps (%g epochs)", settings.lr_step_gamma,
                 trainer.lr_step_size, settings.lr_step_epochs)
    if not progress:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    return trainer


def train(
    adapter: ContrastiveAdapter,
    train_frame: pd.DataFrame,
    val_frame: pd.DataFrame,
    settings: TrainSettings,
    image_root: str | Path = ".",
    out_dir: str | Path | None = None,
    progress: bool = False,
    callbacks: Sequence | None = None,
) -> TrainResult:
    """Fine-tune ``adapter`` in place; its weights end as the best checkpoint (lowest validation loss),
    which is also saved to ``out_dir`` in the registry's format when given."""
    scratch_parent = Path(out_dir).parent if out_dir is not None else None
    if scratch_parent is not None:
        scratch_parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".trainer-", dir=scratch_parent))
    try:
        with deterministic_algorithms(settings.deterministic), cpu_threads(settings.cpu_threads, adapter.device):
            trainer = build_trainer(adapter, train_frame, val_frame, settings, image_root, scratch, progress,
                                    callbacks)
            trainer.train()
        state = trainer.state
        best_step = state.best_global_step if state.best_global_step is not None else state.global_step
        best_val = float(state.best_metric) if state.best_metric is not None else math.nan
        adapter.model.to("cpu")
        if out_dir is not None:
            adapter.save(out_dir)
        log.info("trained %d steps; best validation loss %.6g at step %d", state.global_step, best_val, best_step)
        return TrainResult(trainer.history, int(best_step), best_val)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def settings_dict(settings: TrainSettings) -> dict:
    """The settings as plain data (for run.json)."""
    out = dataclasses.asdict(settings)
    out["no_decay"] = list(settings.no_decay)
    return out
