"""SocialCounterfactuals as one unit (:class:`counterfactory.workflow.StudySpec`): its plan rows and dataset files.

Its rules are ``rules/study_social_counterfactuals.smk``, its CLI group ``counterfactory social``, its settings the
config section ``social_counterfactuals``, its page ``docs/studies/social_counterfactuals.md``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from ...workflow import Need, Stage, StudySpec, classification_needs, retrieval_needs
from .captions import build_caption_sets
from .export import EXPORT
def plan(view, res: Path, items: Mapping[str, int]) -> list[Stage]:
    from ...generation.sampler import GenerationSettings
    from ...generation.sets import SetGenerationSettings

    img = view.get("images") or {}
    gen, sets = GenerationSettings.from_config(img), SetGenerationSettings.from_config(img)
    table = build_caption_sets(view.get("captions"))
    n_sets, n_captions = table["set_id"].nunique(), len(table)
    if "social_counterfactuals.p2p_sets" in items:
        n_sets = int(items["social_counterfactuals.p2p_sets"])
        n_captions = round(n_captions / max(table["set_id"].nunique(), 1) * n_sets)
        src = "--items (captions per set as configured)"
    else:
        src = f"config: {n_sets:,} sets, {n_captions:,} captions (§3.2)"
    members = n_captions / n_sets if n_sets else 0
    per = 2 * members * sets.candidates_per_set * gen.steps
    return [Stage("social_counterfactuals", "p2p_sets", n_sets, src, round(per) if per == int(per) else per,
                  members * sets.candidates_per_set, gen.height, gen.width, "p2p_sets",
                  math.ceil(n_sets / sets.set_shard_size) if n_sets else None)]


def needs(study: str, v) -> list[Need]:
    out = []
    probing = v.get("probing") or {}
    for dataset, keys in (("pata", ("files_list", "captions_json", "image_dir")),
                          ("visogender", ("oo_tsv", "op_tsv", "image_dir"))):
        for k in keys:
            path = (probing.get(dataset) or {}).get(k)
            if path:
                out.append(Need(f"{study}.probing.{dataset}.{k}", path, dataset))
    release = v.get("release") or {}
    if release.get("root"):
        out.append(Need(f"{study}.release.root", release["root"], "release"))
    from . import image_quality

    if image_quality.settings(v)["enabled"] and not release.get("root"):   # §10.3: the reference image folders
        for name, path in image_quality.references(v).items():
            out.append(Need(f"{study}.image_quality.references.{name}", path, "image_quality"))
    task = (v.get("debias") or {}).get("task_eval") or {}
    if task.get("roles") and (v.get("debias") or {}).get("roles"):   # §5.3, Tables 4 and 5
        key = f"{study}.debias.task_eval"
        if task.get("retrieval"):
            spec = task["retrieval"]
            out += retrieval_needs(f"{key}.retrieval", spec)
        datasets = (task.get("classification") or {}).get("datasets") or {}
        out += classification_needs(f"{key}.classification.datasets", datasets, datasets)
    return out


SPEC = StudySpec(
    name="social_counterfactuals", order=20, short="social",
    title="SocialCounterfactuals",
    paper="SocialCounterfactuals: Probing and Mitigating Intersectional Social Biases in Vision-Language Models with "
          "Counterfactual Examples (Howard et al.)",
    docs="docs/studies/social_counterfactuals.md",
    roles=("vae",),
    # §3 generation and filtering, §4 probing, §5 debiasing, §10.3 image quality
    report_sections=("Counterfactuals", "Over-generation", "Filtering", "Examples", "Bias probing", "Debiasing",
                     "Image quality"),
    plan=plan, needs=needs, export=EXPORT,
)
