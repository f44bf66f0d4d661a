"""CVLD as one unit (:class:`counterfactory.workflow.StudySpec`): its plan rows and dataset files.

Its rules are ``rules/study_cvld.smk``, its CLI group ``counterfactory cvld``, its settings the config section
``cvld``, its page ``docs/studies/cvld.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ...workflow import Need, Stage, StudySpec, karpathy_images, karpathy_needs, plan_items
from .export import EXPORT

#: CelebA training images (official split) and Karpathy COCO training images (train + restval)
CELEBA_TRAIN, KARPATHY_COCO_TRAIN = 162770, 113287


def plan(view, res: Path, items: Mapping[str, int]) -> list[Stage]:
    from ...generation.editing import EditSettings
    from . import settings as cv

    s = cv.settings(view)
    ed = s["editing"]
    knobs = EditSettings.from_config({**ed["settings"], "m": ed["m"], "k": ed["k"]})
    subset = max(s["data"]["subsets"])
    cl = s["classification"]
    shots = set(cl["shots"]) | ({cl["figure4_shots"]} if cl["lambdas"] else set())
    episodes = len(cl["attributes"]) * 2 * sum(shots) * int(cl["episodes"])
    coco_json = (s["data"].get("coco") or {}).get("karpathy_json")
    coco_train = karpathy_images(coco_json)
    fallback = {"coco": (round(subset * (KARPATHY_COCO_TRAIN if coco_train is None else coco_train)),
                         f"upper bound: every image of the {subset:.0%} COCO subset accepted (§3.3, app. B)"
                         + ("" if coco_train is None else f"; {coco_train:,} training images in {coco_json}")),
                "celeba": (min(episodes, CELEBA_TRAIN),
                           "upper bound: attributes x 2K shots x episodes, no image shared (app. A)")}
    per = {"ip2p": 3 * knobs.m * knobs.steps,
           "null_text": knobs.inversion_steps * (1 + 2 + knobs.inner_steps + 4 * knobs.m)}
    out = []
    for ds in ("coco", "celeba"):
        for method in ed["methods"]:
            n, src = plan_items(("cvld", f"{method}_{ds}"), items, res / ds / "edits" / "requests.parquet",
                                fallback=fallback[ds])
            out.append(Stage("cvld", f"{method}_{ds}", n, src, per[method], knobs.k, knobs.size, knobs.size,
                             f"{method}_edit", int(ed["shards"])))
    return out


def needs(study: str, v) -> list[Need]:
    from . import settings as cv

    data = cv.settings(v)["data"]
    out = [Need(f"{study}.data.celeba.root", data["celeba"].get("root"), "celeba",
                ("list_attr_celeba.txt", "list_eval_partition.txt", "img_align_celeba/")),
           *karpathy_needs(f"{study}.data.coco", data["coco"],
                           [n for names in (data.get("splits") or {}).values() for n in names], "coco2014")]
    if data["fairface"].get("root"):
        split = data["fairface"].get("split") or "val"
        out.append(Need(f"{study}.data.fairface.root", data["fairface"]["root"], "fairface",
                        (f"fairface_label_{split}.csv", f"{split}/")))
    if data["flickr30k"].get("karpathy_json"):
        out += karpathy_needs(f"{study}.data.flickr30k", data["flickr30k"], "test", "flickr30k")
    if data["nocaps"].get("annotations"):
        out += [Need(f"{study}.data.nocaps.annotations", data["nocaps"]["annotations"], "nocaps"),
                Need(f"{study}.data.nocaps.image_root", data["nocaps"].get("image_root"), "nocaps")]
    return out


SPEC = StudySpec(
    name="cvld", order=50, short="cvld",
    title="CVLD",
    paper="Debias Your VLM with Counterfactuals: A Unified Approach (CVLD)",
    docs="docs/studies/cvld.md",
    # §3 interventions, then Tables 1-4 and the figures
    report_sections=("Interventions", "Examples", "Training", "Tables", "Figures"),
    plan=plan, needs=needs, export=EXPORT,
)
