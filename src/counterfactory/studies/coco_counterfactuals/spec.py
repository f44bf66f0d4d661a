"""COCO-Counterfactuals as one unit (:class:`counterfactory.workflow.StudySpec`): its plan rows and dataset files.

Its rules are ``rules/study_coco_counterfactuals.smk`` (with the shared stage rules, which it runs under their own
names), its settings the config section ``coco_counterfactuals``, its page ``docs/studies/coco_counterfactuals.md``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from ... import workflow
from ...data.own import OwnSource
from ...training.runs import retrieval_specs
from ...workflow import (PAPER_ITEMS, Need, Stage, StudySpec, capped, classification_needs, plan_items,
                         retrieval_needs)
from .export import EXPORT

#: COCO val2017 captions (COCO-CF §3.3), the input of the COCO-CF image jobs' sharding
COCO_VAL2017_CAPTIONS = 25014


def plan(view, res: Path, items: Mapping[str, int]) -> list[Stage]:
    img = view["images"]
    path = workflow.caption_json(view)
    configured = workflow._count(str(path), view["data"].get("limit_images")) if path.exists() else None
    n, src = plan_items(("coco_counterfactuals", "p2p_pairs"), items,
                        res / "captions" / "counterfactual_captions.parquet",
                        fallback=capped(PAPER_ITEMS[("coco_counterfactuals", "p2p_pairs")], configured,
                                        f"caption pairs, one per caption of {path}"))
    per = 2 * 2 * int(img["candidates_per_pair"]) * int(img["steps"])
    kept = 2 * int(img["filter"]["top_k"]) + (2 * int(img["candidates_per_pair"]) if img.get("save_all_candidates") else 0)
    captions = COCO_VAL2017_CAPTIONS if configured is None else configured
    jobs = max(1, math.ceil(captions / int(img["shard_size"])))   # image jobs shard the input captions
    return [Stage("coco_counterfactuals", "p2p_pairs", n, src, per, kept, int(img["height"]), int(img["width"]),
                  "p2p_pairs", jobs)]


def needs(study: str, v) -> list[Need]:
    out: list[Need] = []
    data = v["data"]
    release = (v.get("release") or {})
    if release.get("root"):
        out.append(Need(f"{study}.release.root", release["root"], "release"))
    if release.get("captions"):
        out.append(Need(f"{study}.release.captions", release["captions"], "release"))
    if data.get("source"):
        try:
            files = OwnSource.from_spec(data["source"]).input_files()
        except Exception as exc:
            out.append(Need(f"{study}.data.source", None, "own", problem=str(exc).splitlines()[0]))
        else:
            out += [Need(f"{study}.data.source.{k}", str(p), "own") for k, p in files.items()]
    else:
        root = Path(data["coco_root"])
        out.append(Need(f"{study}.data.coco_root", str(root), "coco2017",
                        (f"annotations/captions_{data['split']}.json", f"{data['split']}/")))
    if data.get("karpathy_json"):
        out.append(Need(f"{study}.data.karpathy_json", data["karpathy_json"], "karpathy"))
    ev = v.get("evaluation") or {}
    classification = ev.get("classification") or {}
    datasets = classification.get("datasets") or {}
    used = set(datasets) if classification.get("models") else set()
    used |= set((v.get("training") or {}).get("eval", {}).get("classification") or []) & set(datasets)
    out += classification_needs(f"{study}.evaluation.classification.datasets", datasets, used)
    for i, spec in enumerate(retrieval_specs((v.get("training") or {}).get("eval") or {})):
        name = spec.get("name", i)
        base = f"{study}.training.eval.retrieval[{name}]"   # the entry by its name, as the workflow names it
        out += retrieval_needs(base, spec)
    return out


SPEC = StudySpec(
    name="coco_counterfactuals", order=10, short=None,
    title="COCO-Counterfactuals",
    paper="COCO-Counterfactuals: Automatically Constructed Counterfactual Examples for Image-Text Pairs (Le et al.)",
    docs="docs/studies/coco_counterfactuals.md",
    roles=("clip_train", "clip_eval", "vae"),
    # §3 data, Table 2 / Figure 3 / Table 4 zero-shot, Tables 3-6 after fine-tuning
    report_sections=("Counterfactuals", "Over-generation", "Examples", "Zero-shot image-text retrieval",
                     "ITM score differences", "Zero-shot classification", "Training"),
    plan=plan, needs=needs, export=EXPORT,
)
