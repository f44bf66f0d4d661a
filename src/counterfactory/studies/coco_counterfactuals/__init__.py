"""COCO-Counterfactuals (Le et al., 2023): what only this paper needs.

Table layouts of §5 (Table 3: Flickr30k retrieval R@K of the fine-tuned CLIP models; Table 4: zero-shot
top-1 accuracy per classification dataset), in the paper's column order.
"""

from __future__ import annotations

STUDY = "coco_counterfactuals"


def training_tables(training: dict) -> list[str]:
    """Table names: ``retrieval`` (Table 3 layout) if retrieval is evaluated, ``classification`` (Table 4)."""
    ev = training.get("eval", {})
    return [name for name, on in (("retrieval", ev.get("retrieval")), ("classification", ev.get("classification"))) if on]


def table_metrics(training: dict, table: str) -> str:
    """Comma-separated metric names of one table, in the paper's column order."""
    ev = training["eval"]
    if table == "retrieval":
        r = ev["retrieval"]
        names = [f"{r['name']}/{d}@{k}" for d in ("image_to_text", "text_to_image") for k in r["ks"]]
        return ",".join(names + [f"{r['name']}/mean"])
    return ",".join(f"{d}/top1" for d in ev["classification"])


def targets(view: dict, results: str) -> list[str]:
    """Every final file of the study under ``results`` (``results/<run>/coco_counterfactuals``): captions,
    image pairs, the evaluations the config enables, training tables and curves, A.2, report figures."""
    ev, tr = view["evaluation"], view["training"]
    out = [f"{results}/captions/counterfactual_captions.parquet", f"{results}/images/selected_pairs.parquet",
           f"{results}/report/pair_grid.png", f"{results}/report/caption_examples.csv"]
    if ev["itr"]["models"]:
        out.append(f"{results}/evaluation/itr_table.md")
    if ev["itm"]["models"]:
        out.append(f"{results}/evaluation/itm_differences.md")
    if ev["classification"]["models"] and ev["classification"]["datasets"]:
        out.append(f"{results}/evaluation/classification.md")
    out += [f"{results}/training/summary.csv", f"{results}/training/curves.png"]
    out += [f"{results}/training/tables/{t}.md" for t in training_tables(tr)]
    if tr["eval"].get("classification"):
        out.append(f"{results}/training/label_frequency.csv")
    return out
