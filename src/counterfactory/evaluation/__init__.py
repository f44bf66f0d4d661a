"""Evaluation stage: COCO-Counterfactuals as a test set (§4.2, appendix A.6) and zero-shot image
classification (§5.2, Table 4).

Three analyses, each split into a per-model step (one job per model role, so they parallelise) and a
step that merges the per-model results into paper-style tables and plots:

1. **Zero-shot image-text retrieval** (§4.2.1, Tables 2 and 13). For each model, Recall@K (TR = image→
   text, IR = text→image, in percent, :func:`counterfactory.metrics.recall_at_k`) on

   * ``MS-COCO``: the matched real subset: the original MS-COCO image of every selected pair with the
     pair's original caption (``itr.coco_captions: matched``; ``all`` uses every caption of those
     images). This is the baseline of the relative change;
   * ``COCO-CFs``: every image of the selected pairs (``image_0``, ``image_1``) with its own caption
     (``caption_0``, ``caption_1``): 2N images, 2N texts, the counterfactual partner being the
     hardest distractor;
   * optional subsets of COCO-CFs (``itr.subsets``: label -> CSV/parquet with an ``id`` column, e.g.
     the human-evaluated pairs of §4.1).

   The table shows each value with its relative change versus MS-COCO, ``100 · (R − R_MS-COCO) /
   R_MS-COCO`` (rounded to whole percent, the largest drop of each row in bold, as in Table 2).

   Scores: dual encoders (CLIP, open_clip, and the contrastive heads of FLAVA, BridgeTower and BLIP:
   ``itr.head: itc``, the default) score all pairs from embeddings. Cross-encoders without a
   contrastive head (ViLT), or with ``itr.head: itm``, score pairs with their ITM head: every pair
   (exhaustive, up to ``scorers.<role>.max_exhaustive_pairs``), or, with ``itr.shortlist: {role, k}``,
   the BLIP protocol: a dual-encoder role ranks all candidates, the top k per query are re-scored by
   the ITM head and everything else ranks below them (text→image and image→text use separate
   shortlists). Which heads the paper used for ITR is not stated; ViLT (ITM head only) appears in its
   ITM analysis but not in its ITR tables, which suggests contrastive heads for ITR.

2. **ITM score differences** (§4.2.2, Figure 3): ``IR_r, IR_c, TR_r, TR_c`` from
   :func:`counterfactory.metrics.itm_differences` with ``G`` = the model's ITM score
   (:mod:`counterfactory.scorers`: ITM match logit; CLIP's ``logit_scale · cos``). Per pair,
   ``(C_o, I_o)`` is the original caption (``caption_0``) and its real MS-COCO image, ``I_o^s`` / ``I_c^s``
   the synthetic images ``image_0`` / ``image_1``, ``C_c`` = ``caption_1``, and ``(C_r, I_r)`` a random
   MS-COCO caption and its image with ``I_r != I_o`` (seeded, ``itm.seed``; drawn from every caption
   of the caption table, or only from the matched images with ``itm.random_pool: matched``).
   Outputs: per-pair scores, a summary table (mean, std, median, share below zero) and one histogram
   panel per model.

3. **Zero-shot classification** (§5.2, Table 4): class text embeddings from prompt templates
   (``"a photo of a {c}."`` by default; several templates are averaged, CLIP's prompt ensembling),
   prediction = argmax over classes of the image-class cosine; top-1 and top-5 accuracy in percent.
   Ties are broken towards the lower class index. Datasets are read by
   :mod:`counterfactory.data.classification`.

Modules
-------
============================  ==============================================================================
:mod:`.settings`              defaults, shared names (``BASELINE``, ``ITM_METRICS``), model labels
:mod:`.readers`               one reader per table: selected pairs, caption table, subset ids, per-model
                              ITR / ITM / classification results; pair -> MS-COCO image mapping
:mod:`.itr`                   retrieval sets, Recall@K with optional ITM re-ranking, ``run_itr``
:mod:`.itm`                   random alternatives, the six ITM scores and four differences, ``run_itm``
:mod:`.classify`              prompt embeddings, top-k accuracy (sklearn), ``run_classification``
:mod:`.tables`                Table 2 / ITM summary / Table 4 frames and their Markdown
:mod:`.plots`                 Figure 3 histograms, classification bar chart
:mod:`.merge`                 the merge steps on files: per-model results -> tables and plots
============================  ==============================================================================

Every public name is re-exported here (``from counterfactory import evaluation; evaluation.run_itr``).
"""

from __future__ import annotations

from .classify import check_templates, class_text_embeddings, run_classification, topk_accuracy
from .itm import itm_inputs, itm_scores, run_itm
from .itr import RetrievalSet, cf_retrieval_set, coco_retrieval_set, retrieval_recall, run_itr
from .merge import relabel, write_classification_table, write_itm_summary, write_itr_table
from .plots import plot_classification, plot_itm
from .readers import (PAIR_COLUMNS, check_files, coco_image_dir, image_files, pair_image_ids, read_captions,
                      read_classification_results, read_itm_results, read_itr_results, read_pairs, read_subset_ids)
from .settings import BASELINE, COCO_CFS, ITM_METRICS, ITM_SCORES, model_label, settings
from .tables import (classification_table, itm_summary, itr_table, relative_change, render_classification_html,
                     render_classification_markdown, render_itm_html, render_itm_markdown, render_itr_html,
                     render_itr_markdown)

__all__ = [
    "BASELINE", "COCO_CFS", "ITM_METRICS", "ITM_SCORES", "PAIR_COLUMNS",
    "settings", "model_label",
    "read_pairs", "read_captions", "read_subset_ids", "read_itr_results", "read_itm_results",
    "read_classification_results", "coco_image_dir", "image_files", "pair_image_ids", "check_files",
    "RetrievalSet", "cf_retrieval_set", "coco_retrieval_set", "retrieval_recall", "run_itr",
    "itm_inputs", "itm_scores", "run_itm",
    "check_templates", "class_text_embeddings", "topk_accuracy", "run_classification",
    "relative_change", "itr_table", "render_itr_markdown", "itm_summary", "render_itm_markdown",
    "render_itm_html", "render_itr_html", "render_classification_html",
    "classification_table", "render_classification_markdown",
    "plot_itm", "plot_classification",
    "relabel", "write_itr_table", "write_itm_summary", "write_classification_table",
]
