"""Settings and names shared by the evaluation modules (no heavy imports)."""

from __future__ import annotations

from typing import Any

BASELINE = "MS-COCO"
COCO_CFS = "COCO-CFs"
ITM_METRICS = ("IR_r", "IR_c", "TR_r", "TR_c")
#: the six per-pair ITM scores, named as the keyword arguments of metrics.itm_differences
ITM_SCORES = ("random_pair", "random_caption_original_image", "original_caption_random_image",
              "counterfactual_pair", "counterfactual_caption_original_image",
              "original_caption_counterfactual_image")

DEFAULTS: dict[str, Any] = {
    "batch_size": 32,
    "scorers": {},
    "itr": {"models": [], "ks": [1, 5, 10], "head": "itc", "coco_captions": "matched",
            "shortlist": {"role": None, "k": 128}, "subsets": {}},
    "itm": {"models": [], "head": "itm", "random_pool": "all", "seed": 0, "bins": 40},
    "classification": {"models": [], "templates": ["a photo of a {c}."], "topk": [1, 5], "max_per_class": None,
                       "datasets": {}},
}


def settings(cfg: dict) -> dict:
    """``cfg['evaluation']`` merged over :data:`DEFAULTS` (the schema fills the same defaults)."""
    from ..config import deep_merge

    return deep_merge(DEFAULTS, cfg.get("evaluation") or {})


def model_label(cfg: dict, role: str) -> str:
    """Display name of a role: the last component of its source (``clip-vit-base-patch32``)."""
    from ..models.registry import model_spec

    source = model_spec(cfg, role).source.rstrip("/")
    return source.removeprefix("local-dir:").split("/")[-1] or role


def model_columns(cfg: dict, role: str) -> dict[str, str]:
    """``role, model, source`` of a role, the leading columns of every per-model result."""
    from ..models.registry import model_spec

    return {"role": role, "model": model_label(cfg, role), "source": model_spec(cfg, role).source}
