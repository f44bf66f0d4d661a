"""Contrastive fine-tuning of CLIP-style models on real + counterfactual data, on ``transformers.Trainer``.

One trainer serves every study and three recipes:

* **plain** CLIP fine-tuning (COCO-Counterfactuals §5, appendix B.3.2: AdamW (0.9, 0.999, 1e-8), lr 5e-7
  decayed linearly to zero without warm-up, weight decay 0.001 except biases and LayerNorm weights,
  gradients clipped at norm 1.0, batch 128, 30 epochs, text padded to 77 tokens, evaluated and saved
  every 109 steps, the checkpoint with the best validation loss kept);
* **grouping** (CounterCurate §3.5): each positive and its counterfactual share a batch; the loss is the
  ordinary contrastive loss over the enlarged batch;
* **CVLD augmented loss** (CVLD eq. 3): ``L = l(B) + lambda * l(B~)`` where ``B`` holds one anchor per
  pair group and ``B~`` their counterfactual partners; ``lambda = 0`` is plain training on the anchors.

What the Trainer does and what we own: see :mod:`.trainer`. Manifests (CSV or parquet) have the columns
``image_path, caption, is_counterfactual, pair_id`` and optionally ``split`` (``train``/``val``).
Training is deterministic given ``seed`` (model-side randomness) and ``data_seed`` (batch order).
"""

from .data import (MANIFEST_COLUMNS, anchors_and_partners, counterfactual_partners, eval_batches, make_batches,
                   read_manifest, step_plan)
from .model import ContrastiveAdapter, ContrastiveModule, clip_loss, recipe_loss
from .trainer import (ContrastiveTrainer, TrainResult, TrainSettings, build_trainer, deterministic_algorithms,
                      no_decay_parameter_names, settings_dict, train)

__all__ = [
    "MANIFEST_COLUMNS", "ContrastiveAdapter", "ContrastiveModule", "ContrastiveTrainer", "TrainResult",
    "TrainSettings", "anchors_and_partners", "build_trainer", "clip_loss", "counterfactual_partners",
    "deterministic_algorithms", "eval_batches", "make_batches", "no_decay_parameter_names", "read_manifest",
    "recipe_loss", "settings_dict", "step_plan", "train",
]
