"""CounterCurate as one unit (:class:`counterfactory.workflow.StudySpec`): its plan rows and dataset files.

Its rules are ``rules/study_countercurate.smk``, its CLI group ``counterfactory countercurate``, its settings the
config section ``countercurate``, its page ``docs/studies/countercurate.md``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from ...workflow import Need, Stage, StudySpec, retrieval_needs
from . import training as cc_training
from .attributes import section_of
from .export import EXPORT
#: Flickr30k (Entities) images and captions per image (Young et al. 2014; Plummer et al. 2016)
FLICKR30K_IMAGES, FLICKR30K_CAPTIONS_PER_IMAGE = 31783, 5
#: CounterCurate benchmark -> (config keys of its data and images under countercurate.benchmarks.<name>)
CC_BENCHMARK_KEYS = {"looktwice": ("dataset", "images"), "sugarcrepe": ("root", "images"),
                     "winoground": ("examples", "images")}


def _attributes_upper_bound(view) -> tuple[int, str]:
    """CounterCurate's t2i images before the LLM has answered: every negative kind accepted for the selected caption
    of every Flickr30k Entities image (an upper bound: the paper got only about 2.5k swaps, §4.4)."""
    at = section_of(view)
    n_images = min(int(at["limit_images"] or FLICKR30K_IMAGES), FLICKR30K_IMAGES)
    per_image = len(at["kinds"]) * (FLICKR30K_CAPTIONS_PER_IMAGE if at["caption"] == "all" else 1)
    return n_images * per_image, (f"upper bound: {len(at['kinds'])} negative kinds x {at['caption']} caption(s) of "
                                  f"{n_images:,} Flickr30k Entities images, all accepted (§3.4; the paper's swaps "
                                  "were about 2.5k, §4.4); --items countercurate.t2i=N")


def plan(view, res: Path, items: Mapping[str, int]) -> list[Stage]:
    import pandas as pd

    from ...generation.grounded import GroundedSettings

    s = GroundedSettings.from_config(view.get("grounded"))
    table = res / "generation" / "requests.parquet"
    kinds = pd.read_parquet(table, columns=["kind"])["kind"].value_counts() if table.exists() else None
    out = []
    for kind, stage in (("generate", "gligen_generate"), ("inpaint", "gligen_inpaint"), ("t2i", "t2i")):
        name = f"countercurate.{stage}"
        if name in items:
            n, src = int(items[name]), "--items"
        elif kinds is not None:
            n, src = int(kinds.get(kind, 0)), str(table)
        elif kind == "t2i":     # Flickr30k-Attributes: one image per accepted negative caption (§3.4)
            n, src = _attributes_upper_bound(view)
        else:
            n, src = None, ("unknown before countercurate_requests (Flickr30k Entities); --items countercurate.%s=N"
                            % stage)
        h, w = (s.t2i_height, s.t2i_width) if kind == "t2i" else (s.height, s.width)
        out.append(Stage("countercurate", stage, n, src, s.steps * (2 if s.guidance > 1.0 else 1), 1, h, w, stage,
                         math.ceil(n / s.shard_size) if n else None))
    return out


def needs(study: str, v) -> list[Need]:
    out = [Need(f"{study}.data.entities_root", v["data"].get("entities_root"), "flickr30k_entities",
                ("Annotations/", "Sentences/"))]
    if v["data"].get("images"):   # the Flickr30k images (else <entities_root>/flickr30k-images, inside the above)
        out.append(Need(f"{study}.data.images", v["data"]["images"], "flickr30k"))
    benchmarks = set((v.get("evaluation") or {}).get("benchmarks") or [])
    for names in cc_training.settings(v)["benchmarks"].values():   # the fine-tuned models' benchmarks
        benchmarks |= set(names or [])
    for name in [b for b in CC_BENCHMARK_KEYS if b in benchmarks]:
        section = (v.get("benchmarks") or {}).get(name) or {}
        out += [Need(f"{study}.benchmarks.{name}.{k}", section.get(k), name) for k in CC_BENCHMARK_KEYS[name]]
    spec = cc_training.retrieval_spec(v)
    if spec:   # §4.5 Table 5: MS-COCO retrieval of the CLIP fine-tuned on Flickr30k-Attributes
        out += retrieval_needs(f"{study}.training.retrieval", spec)
    return out


SPEC = StudySpec(
    name="countercurate", order=30, short="countercurate",
    title="CounterCurate",
    paper="CounterCurate: Enhancing Physical and Semantic Visio-Linguistic Compositional Reasoning via "
          "Counterfactual Examples (Zhang et al.)",
    docs="docs/studies/countercurate.md",
    own_rules=("data_flickr30k_captions",),
    # §3 datasets, Tables 1-3 evaluation, Tables 5-6 fine-tuning
    report_sections=("Datasets", "Examples", "Evaluation", "Fine-tuning"),
    plan=plan, needs=needs, export=EXPORT,
)
