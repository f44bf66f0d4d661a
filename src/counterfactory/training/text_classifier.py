"""Fine-tuned text classifier: a ``transformers`` sequence classifier (2 labels) trained on captions.

The leakage score LIC of Hirota, Nakashima & Garcia (CVPR 2022, §4) trains a gender classifier on gender-masked
captions and scores it on held-out ones; their BERT variant fine-tunes ``bert-base-uncased`` end to end. This module
is that training step, independent of any study: :func:`counterfactory.models.loaders_text.load_classifier` reads an
``AutoModelForSequenceClassification`` with two labels and its tokenizer with ``from_pretrained(path_or_id)``,
:func:`fine_tune` trains it with cross-entropy, :func:`predict_proba` returns ``P(label 1)`` of texts and
:func:`train_and_predict` does the three in a row.

Defaults are those of Hirota et al.'s public code (``rebnej/lick-caption-bias``, ``bert_leakage.py`` and the
``run_gender_bert_*.sh`` scripts): 5 epochs, learning rate 1e-5, batch size 64, sequences truncated at 64 tokens,
AdamW with betas (0.9, 0.98), eps 1e-6 and weight decay 0.1 (none on biases and LayerNorm weights), a constant
learning rate, cross-entropy over two logits. One difference (ours): the head is the library's own
sequence-classification head (pooler + linear) instead of their BatchNorm MLP on the [CLS] state, so the pooler is
trained too (their optimizer leaves it out, as their head does not use it).

Determinism: everything random -- the new head's initialisation, dropout, the order of the training examples --
depends only on ``seed``. The head is initialised and the model trained inside ``torch.random.fork_rng`` after
``torch.manual_seed(seed)`` (the caller's global RNG state is left as it was), and each epoch's order is a
``torch.randperm`` drawn from a ``torch.Generator`` seeded with ``seed``. On CPU the same seed gives the same
probabilities; GPUs may add kernel-level nondeterminism.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, Union

import numpy as np

from ..models.loaders_text import load_classifier

#: defaults of Hirota et al.'s bert_leakage.py (and run_gender_bert_*.sh: --num_epochs 5 --learning_rate 1e-5)
EPOCHS = 5
LR = 1e-5
BATCH_SIZE = 64
MAX_LENGTH = 64
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.98)
EPS = 1e-6
#: parameter-name parts without weight decay (Hirota et al.: ``no_decay = ['bias', 'LayerNorm.weight']``)
NO_DECAY = ("bias", "LayerNorm.weight")

#: a model source: a hub id or folder (``from_pretrained``), or a callable returning ``(model, tokenizer)``
Source = Union[str, Path, Callable[[], tuple]]


@dataclass(frozen=True)
class FineTuneSettings:
    """Hyper-parameters of :func:`fine_tune` (defaults: Hirota et al.'s BERT leakage classifier)."""

    epochs: int = EPOCHS
    lr: float = LR
    batch_size: int = BATCH_SIZE
    max_length: int = MAX_LENGTH
    weight_decay: float = WEIGHT_DECAY
    betas: tuple[float, float] = BETAS
    eps: float = EPS

    def __post_init__(self):
        if int(self.epochs) < 1 or int(self.batch_size) < 1 or int(self.max_length) < 2:
            raise ValueError(f"text classifier: epochs and batch_size must be >= 1 and max_length >= 2, got "
                             f"{self.epochs}, {self.batch_size}, {self.max_length}")
        if not float(self.lr) > 0:
            raise ValueError(f"text classifier: lr must be positive, got {self.lr}")


def _device(device) -> Any:
    import torch

    return torch.device(device) if device is not None else torch.device("cpu")


@contextlib.contextmanager
def _seeded(seed: int, device):
    """Torch's RNG (CPU, and the CUDA device in use) seeded with ``seed``, restored afterwards."""
    import torch

    dev = _device(device)
    devices = [dev.index or 0] if dev.type == "cuda" else []   # the device in use (counterfactory.device chose it)
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        yield


def _encode(tokenizer, texts: Sequence[str], max_length: int, device):
    enc = tokenizer([str(t) for t in texts], padding=True, truncation=True, max_length=int(max_length),
                    return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items()}


def _labels(labels, n: int) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"text classifier: {n} texts but labels of shape {y.shape}")
    if n == 0:
        raise ValueError("text classifier: no training texts")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("text classifier: labels must be 0 or 1")
    return y.astype(np.int64)


def fine_tune(model, tokenizer, texts: Sequence[str], labels, *, seed: int = 0,
              settings: FineTuneSettings | None = None, device=None):
    """Fine-tune ``model`` (every parameter) on ``texts`` / 0-1 ``labels`` with cross-entropy; returns it in eval
    mode. Batches of ``settings.batch_size`` in an order drawn per epoch from a ``torch.Generator`` seeded with
    ``seed``; dropout draws from torch's RNG, which the caller seeds (:func:`train_and_predict`)."""
    import torch

    settings = settings or FineTuneSettings()
    y = torch.as_tensor(_labels(labels, len(texts)))
    dev = _device(device)
    model.to(dev)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not any(nd in n for nd in NO_DECAY)]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and any(nd in n for nd in NO_DECAY)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": float(settings.weight_decay)},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=float(settings.lr), betas=tuple(settings.betas), eps=float(settings.eps))
    generator = torch.Generator().manual_seed(int(seed))
    texts = [str(t) for t in texts]
    bs = int(settings.batch_size)
    model.train()
    for _ in range(int(settings.epochs)):
        order = torch.randperm(len(texts), generator=generator).tolist()
        for start in range(0, len(order), bs):
            rows = order[start:start + bs]
            enc = _encode(tokenizer, [texts[r] for r in rows], settings.max_length, dev)
            logits = model(**enc).logits
            loss = torch.nn.functional.cross_entropy(logits, y[rows].to(dev))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    model.eval()
    return model


def predict_proba(model, tokenizer, texts: Sequence[str], *, batch_size: int = BATCH_SIZE,
                  max_length: int = MAX_LENGTH, device=None) -> np.ndarray:
    """``P(label 1)`` (softmax over the two logits, float64) of every text, in batches, in eval mode."""
    import torch

    dev = _device(device)
    model.to(dev).eval()
    texts = [str(t) for t in texts]
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), int(batch_size)):
            enc = _encode(tokenizer, texts[start:start + int(batch_size)], max_length, dev)
            logits = model(**enc).logits.float()
            out.append(torch.softmax(logits, dim=-1)[:, 1].double().cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float64)


def train_and_predict(source: Source, train_texts: Sequence[str], train_labels, test_texts: Sequence[str], *,
                      seed: int = 0, settings: FineTuneSettings | None = None, revision: str | None = None,
                      device=None) -> np.ndarray:
    """Load a fresh classifier from ``source`` (:func:`load_classifier`, or a callable returning ``(model,
    tokenizer)``), fine-tune it on the training texts and return ``P(label 1)`` of ``test_texts``. The head's
    initialisation, dropout and the batch order depend only on ``seed``."""
    settings = settings or FineTuneSettings()
    with _seeded(seed, device):
        model, tokenizer = source() if callable(source) else load_classifier(source, revision=revision)
        fine_tune(model, tokenizer, train_texts, train_labels, seed=seed, settings=settings, device=device)
        return predict_proba(model, tokenizer, test_texts, batch_size=settings.batch_size,
                             max_length=settings.max_length, device=device)
