"""Fine-tuning the generative VLM of CounterCurate (LLaVA-1.5 class, the ``vlm`` role) in conversation format
(§3.5, appendix "Training details"); the prompts, the encoding and the scoring are :mod:`.vlm`.

Fine-tuning (§3.5 "we reformat our data into conversations and follow their exact training paradigm ...
The training loss is the original next-token prediction loss"; Figure 3 (b)). Each row ``image_path,
caption, negative_caption[, negative_image_path]`` becomes one conversation on the positive image, the
two-option question of :mod:`.vlm` with both captions in a seeded random order and the answer the positive
caption's letter, and -- when the row has a negative image -- a second conversation on the negative image with
the *same* question, answered with the negative caption's letter (the authors' ``prep_training_data_llava.py``).
As in LLaVA-1.5 the loss is next-token cross-entropy on the assistant's answer and its ``</s>`` only: every
prompt token (system text, question, the image's placeholder tokens) is masked with -100. Training runs
on ``transformers.Trainer`` (AdamW, warm-up + cosine schedule, LLaVA-1.5's ``finetune.sh``), the vision
tower frozen (LLaVA-1.5 trains projector + language model), deterministic with a fixed CPU thread count
(:mod:`counterfactory.training.trainer`). ``vlm.lora`` switches to parameter-efficient fine-tuning with
``peft`` LoRA on the language model's linear layers (projector fully trained, LLaVA's
``finetune_lora.sh``); **the adapter is merged into the weights before saving**, so every checkpoint is a
plain ``LlavaForConditionalGeneration`` folder that the ``vlm`` loader reads by path
(``models: {vlm: {source: <out-dir>/model}}``). With validation data the checkpoint with the lowest
validation loss is kept; otherwise the final weights (the paper trains one epoch without selection).

The settings are :class:`.vlm.VlmSettings` (study section ``vlm``). Every name here is also importable from
:mod:`.vlm`.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ...device import resolve_dtype
from ...errors import input_error
from ...io import atomic_dir, write_csv, write_json
from ...models import registry
from ...settings import config_value
from .vlm import (LETTERS, NEGATIVE_IMAGE, ROLE, Encoded, Encoder, VlmSettings, choice_question, collate, read_pairs,
                  render_prompt)
from ...rgb import to_rgb

log = logging.getLogger(__name__)

#: language-model linear layers LoRA adapts (every Llama projection, not the vision tower)
LORA_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


# --------------------------------------------------------------------------------------------
# conversations
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Conversation:
    """One training conversation: image, user question (both captions as options A/B), assistant answer."""

    image_path: str
    question: str
    answer: str
    row: int
    source: str = "<data>"


def conversations(frame: pd.DataFrame, settings: VlmSettings, seed: int,
                  source: str | os.PathLike = "<data>") -> list[Conversation]:
    """§3.5 / Figure 3 (b): per row, the positive image asked to choose between caption and negative in a
    seeded random order, answered with the caption's letter; with a negative image, the same question on it
    answered with the negative's letter (the authors' ``prep_training_data_llava.py``)."""
    coins = np.random.default_rng(seed).integers(0, 2, size=len(frame))
    out = []
    for i, row in enumerate(frame.itertuples(index=False)):
        caption_first = bool(coins[i] == 0)
        first, second = (row.caption, row.negative_caption) if caption_first else (row.negative_caption, row.caption)
        question = choice_question(settings, first, second)
        pos, neg = (LETTERS[0], LETTERS[1]) if caption_first else (LETTERS[1], LETTERS[0])
        out.append(Conversation(row.image_path, question, pos, i, str(source)))
        neg_image = getattr(row, NEGATIVE_IMAGE, None)
        if isinstance(neg_image, str) and neg_image:
            out.append(Conversation(neg_image, question, neg, i, str(source)))
    return out


class ConversationCollator:
    """Conversations -> a right-padded training batch with the prompt masked (labels -100)."""

    def __init__(self, processor, settings: VlmSettings):
        self.encoder = Encoder(processor, settings.max_length)
        self.processor = processor
        self.settings = settings

    def encode(self, conv: Conversation) -> Encoded:
        from PIL import Image

        try:
            with Image.open(conv.image_path) as im:
                image = to_rgb(im, conv.image_path)
        except (OSError, ValueError) as exc:
            raise input_error(conv.source, f"row {conv.row}", f"cannot read image {conv.image_path} ({exc})",
                              "replace the file or drop the row") from exc
        prompt = render_prompt(self.processor, conv.question, self.settings.system)
        return self.encoder.encode(image, prompt, conv.answer, eos=True, where=(conv.source, f"row {conv.row}"))

    def __call__(self, convs: Sequence[Conversation]) -> dict[str, torch.Tensor]:
        return collate([self.encode(c) for c in convs], self.encoder.pad_id)


# --------------------------------------------------------------------------------------------
# fine-tuning
# --------------------------------------------------------------------------------------------
class _ListDataset(torch.utils.data.Dataset):
    def __init__(self, items: list):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def _prepare_model(model, settings: VlmSettings, seed: int):
    """Freeze the vision tower (LLaVA-1.5); wrap in LoRA when configured (projector fully trained)."""
    from transformers import set_seed

    set_seed(seed)
    vision = getattr(model, "vision_tower", None) or model.model.vision_tower
    if settings.freeze_vision:
        for p in vision.parameters():
            p.requires_grad_(False)
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if settings.lora is None:
        return model
    from peft import LoraConfig, get_peft_model

    lora = settings.lora
    config = LoraConfig(r=int(lora["r"]), lora_alpha=float(lora["alpha"]), lora_dropout=float(lora["dropout"]),
                        target_modules=LORA_TARGETS, modules_to_save=["multi_modal_projector"], bias="none")
    model = get_peft_model(model, config)
    if settings.gradient_checkpointing:
        model.enable_input_require_grads()
    return model


@dataclass
class VlmTrainResult:
    history: list[dict]
    steps: int
    best_step: int | None
    best_val_loss: float | None
    examples: int


def finetune(model, processor, train: pd.DataFrame, settings: VlmSettings, seed: int, *,
             val: pd.DataFrame | None = None, device: torch.device | str = "cpu", precision: str = "fp32",
             source: str | os.PathLike = "<data>", val_source: str | os.PathLike = "<validation data>",
             progress: bool = False, scratch_dir: str | os.PathLike | None = None):
    """Fine-tune ``model`` on conversations from ``train`` (rows of :func:`read_pairs`); returns
    ``(model, result)`` where ``model`` is a plain ``LlavaForConditionalGeneration`` on CPU (LoRA merged) holding
    the final weights, or the best validation checkpoint's when ``val`` is given."""
    from transformers import Trainer, TrainingArguments

    from ...training.trainer import cpu_threads, deterministic_algorithms

    device = torch.device(device)
    train_convs = conversations(train, settings, seed, source)
    val_convs = conversations(val, settings, seed + 1, val_source) if val is not None and len(val) else None
    collator = ConversationCollator(processor, settings)
    for conv in train_convs[:1]:  # fail early on an over-long first conversation / unreadable image
        collator.encode(conv)
    dtype = resolve_dtype(precision, device)
    scratch = Path(tempfile.mkdtemp(prefix=".vlm-trainer-", dir=scratch_dir))
    steps_per_epoch = math.ceil(len(train_convs) / (settings.batch_size * settings.grad_accum_steps))
    eval_every = min(settings.eval_every or steps_per_epoch, settings.max_steps or steps_per_epoch * 10**6)
    try:
        with deterministic_algorithms(settings.deterministic), cpu_threads(settings.cpu_threads, device):
            model = _prepare_model(model.train(), settings, seed)
            selecting = val_convs is not None
            args = TrainingArguments(
                output_dir=str(scratch), learning_rate=settings.lr, weight_decay=settings.weight_decay,
                per_device_train_batch_size=settings.batch_size, per_device_eval_batch_size=settings.eval_batch_size,
                gradient_accumulation_steps=settings.grad_accum_steps, num_train_epochs=float(settings.epochs),
                max_steps=settings.max_steps or -1, lr_scheduler_type=settings.lr_scheduler,
                warmup_steps=float(settings.warmup_ratio),  # a float < 1 is a ratio of the steps
                max_grad_norm=settings.max_grad_norm,
                optim="adamw_torch", seed=seed, data_seed=seed, logging_strategy="steps", logging_steps=1,
                eval_strategy="steps" if selecting else "no", eval_steps=eval_every if selecting else None,
                save_strategy="steps" if selecting else "no", save_steps=eval_every, save_total_limit=1,
                save_only_model=True, load_best_model_at_end=selecting, metric_for_best_model="loss",
                greater_is_better=False, prediction_loss_only=True, report_to="none", disable_tqdm=not progress,
                use_cpu=device.type == "cpu", dataloader_num_workers=0, remove_unused_columns=False,
                fp16=dtype == torch.float16, bf16=dtype == torch.bfloat16,
            )
            trainer = Trainer(model=model, args=args, train_dataset=_ListDataset(train_convs),
                              eval_dataset=_ListDataset(val_convs) if selecting else None, data_collator=collator)
            if not progress:
                from transformers.trainer_callback import PrinterCallback

                trainer.remove_callback(PrinterCallback)
            trainer.train()
        state = trainer.state
        model = trainer.model
        if settings.lora is not None:
            model = model.merge_and_unload()
        model = model.to("cpu").eval()
        for p in model.parameters():
            p.requires_grad_(True)
        by_step: dict[int, dict] = {}  # the Trainer logs training and validation loss of a step separately
        for h in state.log_history:
            if "loss" in h or "eval_loss" in h:
                row = by_step.setdefault(int(h.get("step", 0)), _history_row(h))
                row.update({k: v for k, v in _history_row(h).items() if not math.isnan(v)})
        history = list(by_step.values())
        best_step = state.best_global_step if selecting else None
        best = float(state.best_metric) if selecting and state.best_metric is not None else None
        return model, VlmTrainResult(history, int(state.global_step), best_step, best, len(train_convs))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _history_row(h: dict) -> dict:
    return {"step": int(h.get("step", 0)), "epoch": float(h.get("epoch", math.nan)),
            "train_loss": float(h.get("loss", math.nan)), "val_loss": float(h.get("eval_loss", math.nan)),
            "lr": float(h.get("learning_rate", math.nan))}


def train_run(cfg: dict, data: str | os.PathLike, out_dir: str | os.PathLike, seed: int, *, role: str = ROLE,
              val_data: str | os.PathLike | None = None, progress: bool = False) -> VlmTrainResult:
    """``vlm-train``: load ``role``, fine-tune on ``data``, write ``out_dir/model`` (model + processor, loadable by
    the ``vlm`` loader), ``out_dir/history.csv`` and ``out_dir/run.json``; ``out_dir`` is replaced atomically."""
    from ...device import resolve_device  # local: tests patch device.resolve_device

    settings = VlmSettings.from_config(cfg)
    Path(out_dir).resolve().parent.mkdir(parents=True, exist_ok=True)
    train = read_pairs(data)
    val = read_pairs(val_data) if val_data else None
    model, processor = registry.load(cfg, role)
    device = resolve_device(config_value(cfg, "device"))
    model, result = finetune(model, processor, train, settings, seed, val=val, device=device,
                             precision=config_value(cfg, "precision"), source=data, val_source=val_data or "",
                             progress=progress, scratch_dir=Path(out_dir).resolve().parent)
    spec = registry.model_spec(cfg, role)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp / "model", safe_serialization=True)
        processor.save_pretrained(tmp / "model")
        write_csv(tmp / "history.csv", pd.DataFrame(result.history, columns=["step", "epoch", "train_loss",
                                                                             "val_loss", "lr"]))
        write_json(tmp / "run.json", {
            "role": role, "base_model": spec.source, "base_revision": spec.revision, "data": str(data),
            "val_data": str(val_data) if val_data else None, "seed": seed, "rows": len(train),
            "conversations": result.examples, "steps": result.steps, "best_step": result.best_step,
            "best_val_loss": result.best_val_loss, "lora_merged": settings.lora is not None,
            "settings": settings.as_dict(), "device": str(device), "precision": config_value(cfg, "precision")})
    log.info("vlm-train: %d conversations, %d steps; checkpoint %s", result.examples, result.steps,
             Path(out_dir) / "model")
    return result
