"""SocialCounterfactuals' export (:class:`counterfactory.export.studies.StudyExport`, ``SPEC.export``): its published
release (Intel/SocialCounterfactuals parquet, B12), the rows of the generic layouts, its filter funnel, the model
roles and sources of the dataset card, its CLIP_benchmark retrieval set and its VQA-verified rows.

Paths are relative to the study's results folder (``results/<run>/social_counterfactuals``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...export.formats import ExportTable
from ...export.studies import StudyExport, read_table
from ...export.webdataset import RetrievalItem, sample_key


def social_tables(d: Path) -> list[ExportTable]:
    """§3.4: the images kept by the three filters, one row per set member."""
    path = d / "filter" / "kept.parquet"
    rows = read_table(path, "kept images").copy()
    rows.insert(0, "item_id", [f"{s}-c{int(c):03d}-m{int(m):02d}" for s, c, m in
                               zip(rows["set_id"], rows["candidate_index"], rows["member_index"])])
    return [ExportTable("default", rows.rename(columns={"image_path": "image"}), ("image",), "item_id",
                        base=path.parent, description={"set_id": "counterfactual caption set",
                                                       "member_index": "0 = base member of the set"})]


def _social_verified(table: ExportTable, verified: pd.DataFrame, _dir: Path):
    """The set members (set, candidate, member) the verified variant holds."""
    cols = ("set_id", "candidate_index", "member_index")
    keys = {(str(a), int(b), int(c)) for a, b, c in zip(*(verified[k] for k in cols))} if len(verified) else set()
    return [(str(a), int(b), int(c)) in keys for a, b, c in zip(*(table.rows[k] for k in cols))]


def social_retrieval(table: ExportTable) -> list[RetrievalItem]:
    """Every member image of a set with its own caption (§3: the members differ only in the attribute words), one
    generated candidate per set (the first kept): a set's other candidates repeat its captions word for word."""
    rows = table.rows.sort_values(["set_id", "candidate_index", "member_index"], kind="stable")
    first = rows.groupby("set_id", sort=False)["candidate_index"].transform("min")
    items, seen = [], set()
    for r in rows[rows["candidate_index"] == first].to_dict("records"):
        caption = str(r["caption"])
        if caption in seen:
            continue
        seen.add(caption)
        items.append(RetrievalItem(sample_key(r["item_id"]), table.image_file(r["image"]), (caption,),
                                   {"item_id": str(r["item_id"]), "set_id": str(r["set_id"]),
                                    "segment": str(r.get("segment", ""))}))
    return items


#: the paper's BibTeX entry (the dataset card's Citation section)
CITATION = """@inproceedings{howard2024socialcounterfactuals,
  title     = {{SocialCounterfactuals}: Probing and Mitigating Intersectional Social Biases in Vision-Language
               Models with Counterfactual Examples},
  author    = {Howard, Phillip and Madasu, Avinash and Le, Tiep and Lujan Moreno, Gustavo and
               Bhiwandiwalla, Anahita and Lal, Vasudev},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  year      = {2024},
  eprint    = {2312.00825},
  archivePrefix = {arXiv}
}"""
#: what a user should know about bias and risk in the study's data (the card, after the common note)
BIAS_NOTES = ["The data deliberately varies race, gender and physical characteristics; use it to "
              "measure and reduce social bias, not to train models to infer these attributes "
              "from images of people.", "Attribute groups are the paper's fixed categories "
              "and do not describe how real people identify."]
#: the card's known limitations of the study's data (after the run's own: demo, uncommitted changes)
LIMITATIONS = ["Race, gender and physical attributes are prompt conditions, not labels of real "
               "people; generated images can show stereotypes of the generator."]


EXPORT = StudyExport(
    "social_counterfactuals", ("filter/kept.parquet",), social_tables,
    ("generation/summary.json", "filter/table11.csv"), ("sd", "clip_filter", "nsfw"), ("stable_diffusion",),
    "SocialCounterfactuals (reproduction)",
    "Sets of synthetic images of people that differ only in race, gender or physical characteristics "
    "(Howard et al., 2024), generated with Prompt-to-Prompt and filtered by CLIP similarity, NSFW and "
    "attribute detectability.", retrieval=social_retrieval, verified=_social_verified,
    citation=CITATION, bias_notes=BIAS_NOTES, limitations=LIMITATIONS)
