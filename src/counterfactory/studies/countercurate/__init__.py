"""CounterCurate (Zhang et al., 2024): what only this paper needs.

Modules (library code only; the ``counterfactory countercurate <step>`` subcommands that call them live in
:mod:`counterfactory.commands.countercurate`):

* :mod:`.positions` — Flickr30k-Positions: object pairs, the left/right/above/below rule, flipped and
  centre-swapped negatives, the 4:1 split and the LR / AB subsets (§3.2, appendices B, D);
* :mod:`.counting` — Flickr30k-Counting: count changes by grounded inpainting, count captions (§3.3, app. C);
* :mod:`.attributes` — Flickr30k-Attributes: noun / adjective / swap negatives from the ``llm`` role (§3.4, app. A),
  on the captions and marked phrases of :mod:`.attribute_captions`;
* :mod:`.assemble` — one grounded-generation requests table for the three datasets, and the finished datasets
  with their negative images (the jobs themselves: :mod:`counterfactory.generation.grounded`);
* :mod:`.training` — CLIP fine-tuning settings and runs per dataset and variant, the VLM runs (§3.5, §4.1), with
  :mod:`.manifests` (the trainer manifests and conversation tables);
* :mod:`.benchmarks` — Flickr30k-Positions test score, PointQA-LookTwice counting, SugarCrepe, Winoground, with
  :mod:`.benchmark_tables` (the paper's result tables);
* :mod:`.vlm` — the generative VLM (LLaVA class): choosing between two captions; :mod:`.vlm_finetune` — its
  conversation fine-tuning.
"""

from __future__ import annotations

STUDY = "countercurate"
#: the generative VLM's model role (LLaVA-1.5 in the paper)
VLM_ROLE = "vlm"
