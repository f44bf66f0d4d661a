"""Settings and names shared by the evaluation modules (no heavy imports)."""

from __future__ import annotations

from ..models.registry import model_spec
from ..render import model_display_name

BASELINE = "MS-COCO"
COCO_CFS = "COCO-CFs"
ITM_METRICS = ("IR_r", "IR_c", "TR_r", "TR_c")
#: the six per-pair ITM scores, named as the keyword arguments of metrics.itm_differences
ITM_SCORES = ("random_pair", "random_caption_original_image", "original_caption_random_image",
              "counterfactual_pair", "counterfactual_caption_original_image",
              "original_caption_counterfactual_image")

#: the COCO-Counterfactuals study whose ``evaluation`` section these modules read (§4.2, §5.2, A.6)
STUDY = "coco_counterfactuals"


def settings(cfg: dict) -> dict:
    """``cfg['evaluation']`` (a COCO-Counterfactuals view) validated with the schema's defaults filled; the schema
    (``coco_counterfactuals.evaluation``) is the one place they are written."""
    from ..config import fill_section

    return fill_section(f"{STUDY}.evaluation", cfg.get("evaluation"))


def stage_config(cfg: dict) -> dict:
    """``cfg`` as the evaluation jobs run it: ``evaluation.precision`` (when set) replaces the config-wide
    ``precision`` for the scorers they load. The paper config sets fp32, as the authors' evaluation scripts
    ran; null keeps the config's precision (the fast path)."""
    from ..device import with_stage_precision

    return with_stage_precision(cfg, settings(cfg).get("precision"))


def with_itr_subsets(cfg: dict, subsets: dict) -> dict:
    """``cfg`` with ``subsets`` (label -> table with an id column, e.g. the A.1 in-domain test pairs) added to
    ``evaluation.itr.subsets`` (a label given here replaces the config's); ``cfg`` itself when there are none."""
    if subsets:
        itr = dict(cfg["evaluation"].get("itr") or {})
        itr["subsets"] = {**(itr.get("subsets") or {}), **subsets}
        cfg["evaluation"] = {**cfg["evaluation"], "itr": itr}
    return cfg


def model_label(cfg: dict, role: str) -> str:
    """Display name of a role in tables and figures: ``models.<role>.display_name`` (the paper's name), else the
    last component of its source (``clip-vit-base-patch32``); see :func:`counterfactory.render.model_display_name`."""
    spec = model_spec(cfg, role)
    entry = dict((cfg.get("models") or {}).get(role) or {}) if not isinstance((cfg.get("models") or {}).get(role),
                                                                              str) else {}
    entry["source"] = spec.source.removeprefix("local-dir:")
    return model_display_name({role: entry}, role)


def model_columns(cfg: dict, role: str) -> dict[str, str]:
    """``role, model, source`` of a role, the leading columns of every per-model result."""
    return {"role": role, "model": model_label(cfg, role), "source": model_spec(cfg, role).source}
