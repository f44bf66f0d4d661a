"""CVLD's export (:class:`counterfactory.export.studies.StudyExport`, ``SPEC.export``): no published release; the rows
of the generic layouts (the kept edits, one config per dataset and editing method), its filter funnel, the model
roles and sources of the dataset card, its CLIP_benchmark retrieval set and its VQA-verified rows.

Paths are relative to the study's results folder (``results/<run>/cvld``).
"""

from __future__ import annotations

from pathlib import Path

from ...errors import input_error
from ...export.formats import ExportTable
from ...export.studies import StudyExport, image_file_verified, method_rows, read_table
from ...export.webdataset import RetrievalItem, sample_key


def cvld_tables(d: Path) -> list[ExportTable]:
    """§3.3 / §5.1: the kept edits (top-k by similarity) with their original image and edit prompt."""
    out = []
    for requests in sorted(d.glob("*/edits/requests.parquet")):
        dataset = requests.parent.parent.name
        req = read_table(requests, "edit requests").set_index("item_id")
        for method_dir in sorted(p for p in requests.parent.glob("*") if p.is_dir() and p.name != "inversions"):
            if not any(method_dir.glob("*/shard.parquet")):
                continue
            rows = method_rows(method_dir, "path", kept_only=True)
            rows.insert(0, "edit_id", [f"{i}_{int(c)}" for i, c in zip(rows["item_id"], rows["candidate"])])
            extra = req.reindex(rows["item_id"])
            for col in ("image_id", "edit_prompt", "source_prompt", "target_prompt"):
                rows[col] = extra[col].astype(str).to_numpy()
            rows["original_image"] = extra["image_path"].to_numpy()   # relative paths: to the working directory
            out.append(ExportTable(f"{dataset}_{method_dir.name}", rows, ("image", "original_image"), "edit_id",
                                   description={"image": "edited image (kept: among the k most similar)",
                                                "original_image": "source image", "edit_prompt": "instruction"}))
    if not out:
        raise input_error(d, None, "no edits (<dataset>/edits/<method>/<shard>/shard.parquet)",
                          "run the CVLD editing steps first")
    return out


_cvld_verified = image_file_verified("path")


def cvld_retrieval(table: ExportTable) -> list[RetrievalItem]:
    """Each original image once with its caption (``source_prompt``) and, per item, its best kept edit (lowest
    ``rank``, then candidate) with the gender-swapped caption (``target_prompt``, §3.3): the k kept edits of one
    item share that caption."""
    rows = table.rows.sort_values([c for c in ("item_id", "rank", "candidate") if c in table.rows.columns],
                                  kind="stable")
    items, originals = [], {}
    for r in rows.drop_duplicates("item_id", keep="first").to_dict("records"):
        items.append(RetrievalItem(sample_key(r["edit_id"]), table.image_file(r["image"]), (str(r["target_prompt"]),),
                                   {"item_id": str(r["item_id"]), "edit_id": str(r["edit_id"]), "image": "image"}))
        original = table.image_file(r["original_image"])
        entry = originals.setdefault(original, {"captions": [], "ids": []})
        if str(r["source_prompt"]) not in entry["captions"]:
            entry["captions"].append(str(r["source_prompt"]))
        entry["ids"].append(str(r["item_id"]))
    for path, entry in originals.items():
        items.append(RetrievalItem(sample_key("original", path.parent.name, path.stem), path,
                                   tuple(entry["captions"]), {"item_ids": entry["ids"], "image": "original_image"}))
    return items


#: the paper's BibTeX entry (the dataset card's Citation section)
CITATION = """@misc{cvld,
  title = {Debias Your {VLM} with Counterfactuals: A Unified Approach},
  note  = {Anonymous authors, under review; cite the final version once published}
}"""
#: what a user should know about bias and risk in the study's data (the card, after the common note)
BIAS_NOTES = ["Gender interventions are binary (male / female) as in the paper, which does not cover non-binary "
              "identities; edited faces can change more than the intended attribute."]
#: the card's known limitations of the study's data (after the run's own: demo, uncommitted changes)
LIMITATIONS = ["The paper's code is not public; interventions and editing follow the paper's text."]


EXPORT = StudyExport(
    None, (), cvld_tables, ("*/text/summary.csv",), ("llm", "editor", "sd", "image_encoder"),
    ("coco", "celeba", "stable_diffusion"), "CVLD counterfactual edits (reproduction)",
    "Gender-counterfactual captions and images edited with InstructPix2Pix / null-text inversion, the k "
    "edits most similar to the original kept (CVLD).", retrieval=cvld_retrieval, verified=_cvld_verified,
    citation=CITATION, bias_notes=BIAS_NOTES, limitations=LIMITATIONS)
