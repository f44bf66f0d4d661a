"""Spurious correlations in cross-modal retrieval as one unit (:class:`counterfactory.workflow.StudySpec`): its plan
rows and dataset files.

Its rules are ``rules/study_spurious_retrieval.smk``, its CLI group ``counterfactory spurious``, its settings the
config section ``spurious_retrieval``, its page ``docs/studies/spurious_retrieval.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ...workflow import PAPER_ITEMS, Need, Stage, StudySpec, capped, karpathy_images, karpathy_needs, plan_items
from . import settings as sr
from .export import EXPORT

#: typical source sizes of inpainted images (the images keep their size): COCO 640x480, Flickr30k 500x375
_SOURCE_SIZE = {"coco": (480, 640), "flickr30k": (375, 500)}


def plan(view, res: Path, items: Mapping[str, int]) -> list[Stage]:
    s = sr.settings(view)
    out = []
    for ds in s["data"]["datasets"]:
        karpathy = (s["data"].get(ds) or {}).get("karpathy_json")
        train = s["data"]["splits"]["train"]
        most = karpathy_images(karpathy, tuple([train] if isinstance(train, str) else train))
        n, src = plan_items(("spurious_retrieval", ds), items, res / ds / "selection" / "requests.parquet",
                            fallback=capped(PAPER_ITEMS[("spurious_retrieval", ds)], most,
                                            f"training images in {karpathy}"))
        h, w = _SOURCE_SIZE.get(ds, (512, 512))
        methods = sr.image_methods(s, ds)
        shards = int(s["inpaint"]["shards"])
        if "lama" in methods:
            out.append(Stage("spurious_retrieval", f"lama_{ds}", n, src, None, 1, h, w, "lama_inpaint", shards,
                             f"spurious_retrieval.{ds}"))
        pads = [m for m in methods if m != "lama"]
        if pads:   # paddings run on the CPU: images and disk, no GPU time
            out.append(Stage("spurious_retrieval", f"padding_{ds}", n, src + f"; {len(pads)} paddings (CPU)", None,
                             len(pads), h, w, "", shards * len(pads), f"spurious_retrieval.{ds}"))
        if "captioner" in sr.text_methods(s, ds):
            out.append(Stage("spurious_retrieval", f"captioner_{ds}", n, src, None, 0, h, w, "captioner", 1,
                             f"spurious_retrieval.{ds}"))
    return out


def needs(study: str, v) -> list[Need]:
    s = sr.settings(v)
    out = []
    for ds in s["data"]["datasets"]:
        src = s["data"].get(ds) or {}
        key = f"{study}.data.{ds}"
        splits = [name for names in (s["data"].get("splits") or {}).values() for name in names] or None
        out += karpathy_needs(key, src, splits, "coco2014" if ds == "coco" else "flickr30k")
        if ds == "coco":
            out += [Need(f"{key}.instances[{i}]", p, "coco2014") for i, p in enumerate(src.get("instances") or [None])]
        else:
            out.append(Need(f"{key}.entities_root", src.get("entities_root"), "flickr30k_entities",
                            ("Annotations/", "Sentences/")))
    return out


SPEC = StudySpec(
    name="spurious_retrieval", order=40, short="spurious",
    title="Spurious correlations in cross-modal retrieval",
    paper="Exposing and Mitigating Spurious Correlations for Cross-Modal Retrieval (Kim et al.)",
    docs="docs/studies/spurious_retrieval.md",
    # §3 object removal, then Tables 1-3
    report_sections=("Object removal", "Examples", "Training", "Tables"),
    plan=plan, needs=needs, export=EXPORT,
)
