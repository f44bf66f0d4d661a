"""Contrastive fine-tuning of CLIP-style models on real + counterfactual data.

One training loop serves three recipes:

* **plain** CLIP fine-tuning (COCO-Counterfactuals §5, appendix B.3.2: AdamW, lr 5e-7, weight decay
  0.001, batch 128, the best checkpoint on the validation split kept);
* **grouping** (CounterCurate §3.5): each positive and its counterfactual share a batch; the loss is the
  ordinary contrastive loss over the enlarged batch;
* **CVLD augmented loss** (CVLD eq. 3): ``L = l(B) + lambda * l(B~)`` where ``B~`` holds the
  counterfactual partners of the originals in ``B``; ``lambda = 0`` is plain training on ``B``.

Manifests (CSV or parquet) have the columns ``image_path, caption, is_counterfactual, pair_id`` and
optionally ``split`` (``train``/``val``). Training is deterministic given ``seed`` (model-side
randomness) and ``data_seed`` (batch order).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from .errors import input_error

log = logging.getLogger(__name__)

MANIFEST_COLUMNS = ("image_path", "caption", "is_counterfactual", "pair_id")


@dataclass(frozen=True)
class TrainSettings:
    """Defaults: COCO-Counterfactuals appendix B.3.2."""

    lr: float = 5e-7
    weight_decay: float = 0.001
    batch_size: int = 128
    epochs: int = 30
    eval_every: int = 109  # reference-code facts: evaluate/save every 109 steps
    recipe: str = "plain"  # plain | grouping | cvld
    cvld_lambda: float = 1.0
    seed: int = 107
    data_seed: int = 108
    max_steps: int | None = None


def read_manifest(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "manifest not found", "build it with the mixture stage first")
    frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    missing = [c for c in MANIFEST_COLUMNS if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing columns {missing}", f"a manifest needs {list(MANIFEST_COLUMNS)}")
    empty = frame["caption"].astype(str).str.strip() == ""
    if empty.any():
        raise input_error(path, f"row {int(np.flatnonzero(empty)[0])}", "empty caption", "drop or fix that row")
    return frame.reset_index(drop=True)


# --------------------------------------------------------------------------- batching

def make_batches(frame: pd.DataFrame, batch_size: int, data_seed: int, grouping: bool) -> list[list[int]]:
    """Row indices per batch for one epoch. With ``grouping`` every ``pair_id`` group stays in one batch
    (a batch may then exceed ``batch_size`` by less than one group); otherwise rows are shuffled freely."""
    rng = np.random.default_rng(data_seed)
    if not grouping:
        order = rng.permutation(len(frame))
        return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    groups = list(frame.groupby("pair_id", sort=True).indices.values())
    batches, current = [], []
    for g in rng.permutation(len(groups)):
        members = sorted(int(i) for i in groups[g])
        if current and len(current) + len(members) > batch_size:
            batches.append(current)
            current = []
        current.extend(members)
    if current:
        batches.append(current)
    return batches


def counterfactual_partners(frame: pd.DataFrame, rows: Sequence[int]) -> list[int | None]:
    """For each original row, the row of its counterfactual partner (same ``pair_id``), or None."""
    cf = frame[frame["is_counterfactual"].astype(bool)]
    by_pair = dict(zip(cf["pair_id"], cf.index))
    return [by_pair.get(frame.at[r, "pair_id"]) for r in rows]


# --------------------------------------------------------------------------- models

class ContrastiveAdapter:
    """A uniform face over HF ``CLIPModel`` (+ processor) and open_clip (model, preprocess, tokenizer)."""

    def __init__(self, loaded, library: str, source_dir: str | Path | None = None, device="cpu"):
        self.library = library
        self.device = torch.device(device)
        self.source_dir = Path(source_dir) if source_dir else None  # open_clip: where open_clip_config.json is
        if library == "open_clip":
            self.model, self.preprocess, self.tokenizer = loaded
        else:
            self.model, self.processor = loaded
        self.model.to(self.device)

    def parameters(self):
        return self.model.parameters()

    def pixels(self, images) -> torch.Tensor:
        if self.library == "open_clip":
            return torch.stack([self.preprocess(im) for im in images]).to(self.device)
        return self.processor(images=list(images), return_tensors="pt")["pixel_values"].to(self.device)

    def tokens(self, texts) -> dict:
        if self.library == "open_clip":
            return {"text": self.tokenizer(list(texts)).to(self.device)}
        enc = self.processor(text=list(texts), return_tensors="pt", padding="max_length", truncation=True)
        return {k: v.to(self.device) for k, v in enc.items()}

    def logits(self, pixels: torch.Tensor, tokens: dict) -> torch.Tensor:
        """Image x text logits (scaled cosine similarity)."""
        if self.library == "open_clip":
            img = F.normalize(self.model.encode_image(pixels), dim=-1)
            txt = F.normalize(self.model.encode_text(tokens["text"]), dim=-1)
            return self.model.logit_scale.exp() * img @ txt.T
        out = self.model(pixel_values=pixels, **tokens)
        return out.logits_per_image

    def save(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        if self.library == "open_clip":
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in self.model.state_dict().items()},
                      str(out_dir / "open_clip_model.safetensors"))
            config = self.source_dir / "open_clip_config.json" if self.source_dir else None
            if config is not None and config.exists():  # makes the checkpoint loadable as `local-dir:`
                (out_dir / config.name).write_bytes(config.read_bytes())
        else:
            self.model.save_pretrained(out_dir, safe_serialization=True)
            self.processor.save_pretrained(out_dir)


def clip_loss(logits_per_image: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE: cross-entropy over rows and columns with the diagonal as targets."""
    targets = torch.arange(logits_per_image.shape[0], device=logits_per_image.device)
    return 0.5 * (F.cross_entropy(logits_per_image, targets) + F.cross_entropy(logits_per_image.T, targets))


# --------------------------------------------------------------------------- loop

@dataclass
class TrainResult:
    history: list[dict]
    best_step: int
    best_val_loss: float


def _load_images(frame: pd.DataFrame, rows: Sequence[int], root: Path):
    from PIL import Image

    out = []
    for r in rows:
        path = root / str(frame.at[r, "image_path"])
        try:
            with Image.open(path) as im:
                out.append(im.convert("RGB"))
        except (OSError, ValueError) as exc:
            raise input_error(path, f"manifest row {r}", f"cannot read image ({exc})", "fix or drop that row") from exc
    return out


def _batch_loss(adapter: ContrastiveAdapter, frame, rows, root) -> torch.Tensor:
    return clip_loss(adapter.logits(adapter.pixels(_load_images(frame, rows, root)),
                                    adapter.tokens(frame.loc[list(rows), "caption"].tolist())))


def train(
    adapter: ContrastiveAdapter,
    train_frame: pd.DataFrame,
    val_frame: pd.DataFrame,
    settings: TrainSettings,
    image_root: str | Path = ".",
    out_dir: str | Path | None = None,
    on_step: Callable[[dict], None] | None = None,
) -> TrainResult:
    """Fine-tune ``adapter`` in place; keep the best checkpoint (lowest validation loss) in ``out_dir``."""
    torch.manual_seed(settings.seed)
    root = Path(image_root)
    train_frame = train_frame.reset_index(drop=True)
    val_frame = val_frame.reset_index(drop=True)
    if settings.recipe == "cvld":
        originals = train_frame[~train_frame["is_counterfactual"].astype(bool)]
        step_frame = originals
    else:
        step_frame = train_frame
    optimizer = torch.optim.AdamW(adapter.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    history, best = [], (math.inf, -1)
    step = 0

    def evaluate() -> float:
        adapter.model.eval()
        losses = []
        with torch.no_grad():
            for rows in make_batches(val_frame, settings.batch_size, 0, grouping=False):
                if len(rows) > 1:
                    losses.append(float(_batch_loss(adapter, val_frame, sorted(rows), root)))
        adapter.model.train()
        return float(np.mean(losses)) if losses else math.nan

    adapter.model.train()
    for epoch in range(settings.epochs):
        batches = make_batches(step_frame.reset_index(drop=True), settings.batch_size,
                               settings.data_seed + epoch, grouping=settings.recipe == "grouping")
        index = step_frame.index.to_numpy()
        for rows_local in batches:
            rows = [int(index[i]) for i in rows_local]
            loss = _batch_loss(adapter, train_frame, rows, root)
            if settings.recipe == "cvld":
                partners = [p for p in counterfactual_partners(train_frame, rows) if p is not None]
                if settings.cvld_lambda and len(partners) > 1:
                    loss = loss + settings.cvld_lambda * _batch_loss(adapter, train_frame, partners, root)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            record = {"step": step, "epoch": epoch, "train_loss": float(loss.detach()), "val_loss": math.nan}
            if step % settings.eval_every == 0:
                record["val_loss"] = evaluate()
                if record["val_loss"] < best[0]:
                    best = (record["val_loss"], step)
                    if out_dir is not None:
                        adapter.save(Path(out_dir))
            history.append(record)
            if on_step:
                on_step(record)
            if settings.max_steps and step >= settings.max_steps:
                break
        if settings.max_steps and step >= settings.max_steps:
            break
    if not history or math.isnan(history[-1]["val_loss"]):
        val = evaluate()
        if history:
            history[-1]["val_loss"] = val
        if val < best[0] or best[1] < 0:
            best = (val, step)
            if out_dir is not None:
                adapter.save(Path(out_dir))
    return TrainResult(history, best[1], best[0])
