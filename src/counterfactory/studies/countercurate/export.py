"""CounterCurate's export (:class:`counterfactory.export.studies.StudyExport`, ``SPEC.export``): its published release
(the TSVs, A8), the rows of the generic layouts, its filter funnel, the model roles and sources of the dataset card,
its CLIP_benchmark retrieval set and its VQA-verified rows.

Paths are relative to the study's results folder (``results/<run>/countercurate``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...export.formats import ExportTable
from ...export.studies import StudyExport, read_table
from ...export.webdataset import RetrievalItem, sample_key


def countercurate_tables(d: Path) -> list[ExportTable]:
    """§3.2-3.4: Flickr30k-Positions / -Counting / -Attributes, source image and negative image per item."""
    out = []
    for name in ("positions", "counting", "attributes"):
        path = d / "datasets" / f"{name}.parquet"
        rows = read_table(path, f"CounterCurate {name} table")
        if rows.empty:
            continue
        rows = rows.rename(columns={"image_path": "image"})
        out.append(ExportTable(name, rows, ("image", "negative_image"), "item_id", base=path.parent,
                               split_column="split" if "split" in rows.columns else None,
                               description={"image": "Flickr30k image", "negative_image": "negative image (flip, "
                                            "GLIGEN generation or inpainting)", "negative_caption": "hard negative"}))
    return out


def _countercurate_verified(table: ExportTable, verified: pd.DataFrame, _dir: Path):
    """The items of the table's dataset (its config) the verified variant holds."""
    if not len(verified):
        return [False] * len(table.rows)
    ids = set(verified.loc[verified["dataset"].astype(str) == table.config, "item_id"].astype(str))
    return table.rows["item_id"].astype(str).isin(ids)


def countercurate_retrieval(table: ExportTable) -> list[RetrievalItem]:
    """Each source image once with the captions of every item made from it, and each negative image with its
    negative caption."""
    negative = "negative_caption" if "negative_caption" in table.rows.columns else "negative"
    sources: dict[Path, dict] = {}
    items = []
    for r in table.rows.to_dict("records"):
        src = table.image_file(r["image"])
        entry = sources.setdefault(src, {"captions": [], "ids": []})
        if str(r["caption"]) not in entry["captions"]:
            entry["captions"].append(str(r["caption"]))
        entry["ids"].append(str(r["item_id"]))
        neg = table.image_file(r.get("negative_image"))
        if neg is not None and r.get(negative) is not None:
            items.append(RetrievalItem(sample_key(r["item_id"], "negative"), neg, (str(r[negative]),),
                                       {"item_id": str(r["item_id"]), "image": "negative_image"}))
    for src, entry in sources.items():
        items.append(RetrievalItem(sample_key("source", src.parent.name, src.stem), src, tuple(entry["captions"]),
                                   {"item_ids": entry["ids"], "image": "image"}))
    return items


#: the paper's BibTeX entry (the dataset card's Citation section)
CITATION = """@inproceedings{zhang2024countercurate,
  title     = {{CounterCurate}: Enhancing Physical and Semantic Visio-Linguistic Compositional Reasoning via
               Counterfactual Examples},
  author    = {Zhang, Jianrui and Cai, Mu and Xie, Tengyang and Lee, Yong Jae},
  booktitle = {Findings of the Association for Computational Linguistics: ACL 2024},
  year      = {2024},
  eprint    = {2402.13254},
  archivePrefix = {arXiv}
}"""
#: what a user should know about bias and risk in the study's data (the card, after the common note)
BIAS_NOTES = ["Negative images and captions are generated; a negative can still be plausible for the "
              "image, so accuracy on it has a noise floor."]
#: the card's known limitations of the study's data (after the run's own: demo, uncommitted changes)
LIMITATIONS = ["Flickr30k-Attributes rows are exported only when the run produced them; the TSVs need "
               "an `image_path` column in `datasets/attributes.parquet`.",
               "An open LLM (role llm) and an open text-to-image model (role t2i) stand in for GPT-4V and "
               "DALLE-3 (docs/studies/countercurate.md)."]


EXPORT = StudyExport(
    "countercurate", ("datasets/positions.parquet", "datasets/counting.parquet", "datasets/attributes.parquet"),
    countercurate_tables, ("datasets/summary.csv", "generation/summary.json"),
    ("llm", "gligen", "gligen_inpaint", "t2i"), ("flickr30k", "stable_diffusion"),
    "CounterCurate (reproduction)",
    "Flickr30k-Positions, -Counting and -Attributes (Zhang et al., 2024): captions with hard negatives and "
    "negative images made by flipping, GLIGEN generation or inpainting.", retrieval=countercurate_retrieval,
    verified=_countercurate_verified,
    citation=CITATION, bias_notes=BIAS_NOTES, limitations=LIMITATIONS)
