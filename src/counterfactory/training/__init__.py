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

import importlib

#: public name -> submodule; imported on first use, so light modules of this package (``mixtures``, the
#: ``seed_pairs`` helper in ``runs``) load without torch and transformers (the Snakefile imports them at parse)
_EXPORTS = {
    "cvld": ("CVLDSettings", "balanced_subset", "sample_episode", "train_captioning", "train_classification",
             "train_retrieval"),
    "cvld_losses": ("CELEBA_PROMPTS", "VARIANTS", "cvld_itc_loss", "cvld_itm_loss"),
    "vsepp_loss": ("hardest_negatives", "hinge_triplet_loss"),
    "prompt_tuning": ("add_prompts", "load_prompts", "prompt_parameters", "remove_prompts", "save_prompts"),
    "data": ("MANIFEST_COLUMNS", "anchors_and_partners", "counterfactual_partners", "eval_batches", "make_batches",
             "read_manifest", "step_plan"),
    "model": ("ContrastiveAdapter", "ContrastiveModule", "clip_loss", "contrastive_loss", "model_kind", "recipe_loss"),
    "trainer": ("ContrastiveTrainer", "TrainResult", "TrainSettings", "build_trainer", "deterministic_algorithms",
                "no_decay_parameter_names", "settings_dict", "train"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
