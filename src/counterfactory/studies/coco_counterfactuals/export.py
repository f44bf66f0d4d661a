"""COCO-Counterfactuals' export (:class:`counterfactory.export.studies.StudyExport`, ``SPEC.export``): its published
release (examples.jsonl + images + caption JSONL, B11), the rows of the generic layouts, its filter funnel, the
model roles and sources of the dataset card, its CLIP_benchmark retrieval set and its VQA-verified rows.

Paths are relative to the study's results folder (``results/<run>/coco_counterfactuals``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...export.formats import ExportTable
from ...export.studies import StudyExport, read_table
from ...export.webdataset import RetrievalItem, items_from_pairs


def coco_tables(d: Path) -> list[ExportTable]:
    """§3.2 / B11: one row per selected pair (P2P image pair, original and counterfactual caption)."""
    path = d / "images" / "selected_pairs.parquet"
    rows = read_table(path, "selected pairs")
    return [ExportTable("default", rows, ("image_0", "image_1"), "id", base=path.parent, default_split="test",
                        description={"caption_0": "original MS-COCO caption", "caption_1": "counterfactual caption "
                                     "(one noun replaced, §3.1)", "image_0": "image generated for caption_0",
                                     "image_1": "image generated for caption_1 (Prompt-to-Prompt, same seed)"})]


def _coco_verified(table: ExportTable, verified: pd.DataFrame, _dir: Path):
    """The pairs whose ``id`` the verified variant holds."""
    return table.rows["id"].astype(str).isin(set(verified["id"].astype(str)) if len(verified) else set())


def coco_retrieval(table: ExportTable) -> list[RetrievalItem]:
    """COCO-CFs as the study's zero-shot retrieval evaluates it (§4.2.1, ``evaluation.cf_retrieval_set``): both
    images of every selected pair, each with its own caption (``<id>_0``: original, ``<id>_1``: counterfactual)."""
    rows = table.rows.sort_values("id", kind="stable")
    return items_from_pairs(
        (str(r.id), table.image_file(r.image_0), table.image_file(r.image_1), r.caption_0, r.caption_1)
        for r in rows.itertuples(index=False))


#: the paper's BibTeX entry (the dataset card's Citation section)
CITATION = """@inproceedings{le2023cococounterfactuals,
  title     = {{COCO}-Counterfactuals: Automatically Constructed Counterfactual Examples for Image-Text Pairs},
  author    = {Le, Tiep and Lal, Vasudev and Howard, Phillip},
  booktitle = {Advances in Neural Information Processing Systems (Datasets and Benchmarks Track)},
  year      = {2023},
  eprint    = {2309.14356},
  archivePrefix = {arXiv}
}"""
#: what a user should know about bias and risk in the study's data (the card, after the common note)
BIAS_NOTES = ["The noun substitutions follow the masked language model's preferences, so frequent "
              "MS-COCO objects are over-represented among the counterfactual changes."]
#: the card's known limitations of the study's data (after the run's own: demo, uncommitted changes)
LIMITATIONS = ["Images keep the generator's PNG encoding; the published zip holds `.jpg` files "
               "(the loader joins `<stem>.jpg`).", "Counterfactual captions come from one "
               "masked-noun substitution and automatic filters; they can be ungrammatical."]


EXPORT = StudyExport(
    "coco_counterfactuals", ("images/selected_pairs.parquet", "captions/coco_counterfactuals_captions.jsonl"),
    coco_tables, ("captions/summary/*.json", "images/summary.json"),
    ("mlm", "lm", "sentence", "sd", "vae", "clip_filter"), ("coco", "stable_diffusion"),
    "COCO-Counterfactuals (reproduction)",
    "Pairs of synthetic images and captions that differ in one noun (Le et al., 2023): MS-COCO captions "
    "edited by a masked language model, image pairs generated with Prompt-to-Prompt and filtered by CLIP.",
    retrieval=coco_retrieval, verified=_coco_verified,
    citation=CITATION, bias_notes=BIAS_NOTES, limitations=LIMITATIONS)
