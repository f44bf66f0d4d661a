"""The spurious-retrieval study's export (:class:`counterfactory.export.studies.StudyExport`, ``SPEC.export``): no
published release; the rows of the generic layouts (one config per dataset and inpainting method), its filter
funnel, the model roles and sources of the dataset card, its CLIP_benchmark retrieval set and its VQA-verified rows.

Paths are relative to the study's results folder (``results/<run>/spurious_retrieval``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...errors import input_error
from ...export.formats import ExportTable
from ...export.studies import StudyExport, image_file_verified, method_rows, read_table
from ...export.webdataset import RetrievalItem, sample_key

#: text methods of the spurious-retrieval captions (§3.3, Table 3) -> export column; ``caption`` is the first
#: caption of the first method an item has
SR_CAPTION_COLUMNS = {"np_removal": "captions", "prompt": "prompt_caption", "captioner": "captioner_caption"}


def _spurious_captions(dataset_dir: Path) -> dict[str, dict]:
    """item_id -> export caption fields from ``captions/synthetic.parquet`` (+ ``captions/captioner.parquet``
    where the captioner ran): ``caption`` (one text for image-text loaders), ``captions`` (every noun-phrase-removed
    caption of the image, §3.3), ``prompt_caption`` and ``captioner_caption`` (None where the method did not run)."""
    frames = [read_table(dataset_dir / "captions" / "synthetic.parquet", "synthetic captions")]
    if (dataset_dir / "captions" / "captioner.parquet").is_file():
        frames.append(pd.read_parquet(dataset_dir / "captions" / "captioner.parquet"))
    texts = pd.concat(frames, ignore_index=True)
    texts = texts[texts["method"].isin(SR_CAPTION_COLUMNS)].sort_values(["item_id", "caption_index"], kind="stable")
    out: dict[str, dict] = {}
    for item, g in texts.groupby("item_id", sort=False):
        by = {m: [str(t) for t in gm["caption"]] for m, gm in g.groupby("method", sort=False)}
        first = next(by[m][0] for m in SR_CAPTION_COLUMNS if by.get(m))
        out[str(item)] = {"caption": first, "captions": by.get("np_removal", []),
                          "prompt_caption": (by.get("prompt") or [None])[0],
                          "captioner_caption": (by.get("captioner") or [None])[0]}
    return out


def spurious_tables(d: Path) -> list[ExportTable]:
    """§3.1, §3.3: images with the requested classes removed and their captions, one config per dataset and
    method. Items left without any caption (every caption lost all its words) are not exported: every row is an
    image-text pair."""
    out = []
    for requests in sorted(d.glob("*/selection/requests.parquet")):
        dataset = requests.parent.parent.name
        req = read_table(requests, "inpainting requests").set_index("item_id")
        texts = _spurious_captions(requests.parent.parent)
        for method_dir in sorted(p for p in (requests.parent.parent / "images").glob("*") if p.is_dir()):
            rows = method_rows(method_dir, "output_path").drop(columns=["key"], errors="ignore")
            extra = req.reindex(rows["item_id"])
            for col in ("image_id", "split", "category", "removed_categories", "present_categories"):
                if col in extra.columns:
                    rows[col] = extra[col].to_numpy()
            rows["original_image"] = rows.pop("image_path")     # as the requests give it (relative: to the cwd)
            rows = rows[rows["item_id"].astype(str).isin(texts)].reset_index(drop=True)
            fields = [texts[str(i)] for i in rows["item_id"]]
            for col in ("caption", "captions", "prompt_caption", "captioner_caption"):
                rows[col] = [f[col] for f in fields]
            rows = rows.drop(columns=[c for c in ("prompt_caption", "captioner_caption") if rows[c].isna().all()])
            out.append(ExportTable(f"{dataset}_{method_dir.name}", rows, ("image", "original_image"), "item_id",
                                   description={"image": "image with the removed categories inpainted",
                                                "original_image": "source image",
                                                "caption": "a caption of the inpainted image (the first of "
                                                           "captions, else prompt_caption, else captioner_caption)",
                                                "captions": "the image's captions without the noun phrases of the "
                                                            "removed categories (§3.3)",
                                                "prompt_caption": "prompt template naming the categories left (§3.3)",
                                                "captioner_caption": "the captioning model's caption (Table 3)"}))
    if not out:
        raise input_error(d, None, "no inpainted images (<dataset>/images/<method>/<shard>/shard.parquet)",
                          "run the spurious_retrieval inpainting steps first")
    return out


_spurious_verified = image_file_verified("image")


def spurious_retrieval(table: ExportTable) -> list[RetrievalItem]:
    """Each inpainted image with its noun-phrase-removed captions (§3.3; else its one ``caption``)."""
    items = []
    for r in table.rows.to_dict("records"):
        captions = [str(c) for c in (r.get("captions") if r.get("captions") is not None else [])] \
            or [str(r["caption"])]
        items.append(RetrievalItem(sample_key(r["item_id"]), table.image_file(r["image"]), tuple(captions),
                                   {"item_id": str(r["item_id"])}))
    return items


#: the paper's BibTeX entry (the dataset card's Citation section)
CITATION = """@inproceedings{kim2023spurious,
  title     = {Exposing and Mitigating Spurious Correlations for Cross-Modal Retrieval},
  author    = {Kim, Jae Myung and Koepke, A. Sophia and Schmid, Cordelia and Akata, Zeynep},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition Workshops},
  year      = {2023},
  eprint    = {2304.03114},
  archivePrefix = {arXiv}
}"""
#: what a user should know about bias and risk in the study's data (the card, after the common note)
BIAS_NOTES = ["Inpainted regions can leave visible artefacts that a model may learn to detect."]
#: the card's known limitations of the study's data (after the run's own: demo, uncommitted changes)
LIMITATIONS = ["The paper's code is not public; selection and inpainting follow the paper's text."]


EXPORT = StudyExport(
    None, (), spurious_tables, ("*/selection/summary.csv", "*/manifests/summary.csv"),
    ("inpaint", "captioner"), ("coco", "flickr30k"),
    "Object-decorrelated retrieval data (reproduction)",
    "Images with object classes removed by inpainting and their noun-phrase-edited captions (Kim et al., "
    "2023), to decorrelate co-occurring objects in image-text retrieval.", retrieval=spurious_retrieval,
    verified=_spurious_verified,
    citation=CITATION, bias_notes=BIAS_NOTES, limitations=LIMITATIONS)
