"""CounterCurate (Zhang et al., 2024): what only this paper needs.

Modules (each adds its own ``counterfactory countercurate <step>`` subcommands through ``add_cli``):

* :mod:`.positions` — Flickr30k-Positions: object pairs, the left/right/above/below rule, flipped and
  centre-swapped negatives, the 4:1 split and the LR / AB subsets (§3.2, appendices B, D);
* :mod:`.counting` — Flickr30k-Counting: count changes by grounded inpainting, count captions (§3.3, app. C);
* :mod:`.attributes` — Flickr30k-Attributes: noun / adjective / swap negatives from the ``llm`` role (§3.4, app. A);
* :mod:`.generate` — grounded generation and inpainting jobs (GLIGEN through diffusers) and the ``t2i`` role;
* :mod:`.benchmarks` — Flickr30k-Positions test score, PointQA-LookTwice counting, SugarCrepe, Winoground;
* :mod:`.vlm` — the generative VLM (LLaVA class): choosing between two captions, conversation fine-tuning.
"""

from __future__ import annotations

STUDY = "countercurate"
#: the study's modules that contribute ``counterfactory countercurate`` subcommands, in help order
CLI_MODULES = ("positions", "counting", "attributes", "generate", "assemble", "training", "benchmarks", "vlm")
