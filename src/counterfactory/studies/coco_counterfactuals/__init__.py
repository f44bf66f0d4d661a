"""COCO-Counterfactuals (Le et al., 2023): what only this paper needs.

Table layouts of §5 (Table 3: Flickr30k retrieval R@K of the fine-tuned CLIP models; Table 4: zero-shot
top-1 accuracy per classification dataset), in the paper's column order.
"""

from __future__ import annotations

STUDY = "coco_counterfactuals"


def retrieval_sets(training: dict) -> list[dict]:
    from ...training.runs import retrieval_specs

    return retrieval_specs(training.get("eval", {}))


def training_tables(training: dict) -> list[str]:
    """Table names: ``retrieval`` (Table 3 layout: the first retrieval set, Flickr30k), ``retrieval_<name>``
    for every further set (Table 12: the MS-COCO test set), ``classification`` (Table 4)."""
    sets = retrieval_sets(training)
    names = (["retrieval"] if sets else []) + [f"retrieval_{s['name']}" for s in sets[1:]]
    return names + (["classification"] if training.get("eval", {}).get("classification") else [])


def table_metrics(training: dict, table: str) -> str:
    """Comma-separated metric names of one table, in the paper's column order (Table 3 / 12: R@K then Mean;
    Table 4: the datasets then Mean, each run's mean top-1 over them)."""
    ev = training["eval"]
    if table.startswith("retrieval"):
        sets = retrieval_sets(training)
        r = sets[0] if table == "retrieval" else next(s for s in sets if f"retrieval_{s['name']}" == table)
        names = [f"{r['name']}/{d}@{k}" for d in ("image_to_text", "text_to_image") for k in r["ks"]]
        return ",".join(names + [f"{r['name']}/mean"])
    from ...training.runs import CLASSIFICATION_MEAN

    return ",".join([f"{d}/top1" for d in ev["classification"]] + [CLASSIFICATION_MEAN])   # Table 4: ... Mean


def table_title(training: dict, table: str) -> str:
    """The paper's title line of one table (its number, what it holds; the first retrieval set is Table 3's)."""
    if table.startswith("retrieval"):
        sets = retrieval_sets(training)
        r = sets[0] if table == "retrieval" else next(s for s in sets if f"retrieval_{s['name']}" == table)
        number = "Table 3" if table == "retrieval" else "Table 12"
        name = {"flickr30k": "Flickr30k", "mscoco": "MS-COCO", "coco": "MS-COCO"}.get(r["name"], r["name"])
        return f"COCO-Counterfactuals {number}: image-text retrieval on {name} after fine-tuning (Recall@K, %)"
    return "COCO-Counterfactuals Table 4: zero-shot image classification after fine-tuning (top-1 accuracy, %)"


def table_mixtures(training: dict, listed=None) -> list[str]:
    """Rows of Tables 3, 4 and 12: the pre-trained row (``training.pretrained_row``), then the mixtures in the
    order ``listed`` (the config file's order: MS-COCO, base, medium, all) where given."""
    from ...training.runs import PRETRAINED

    names = list(training["mixtures"])
    order = [m for m in listed or () if m in names] + [m for m in names if m not in (listed or ())]
    return ([PRETRAINED] if training.get("pretrained_row") else []) + order


def mixture_display_names(training: dict) -> dict[str, str]:
    """Row name of each mixture in Tables 3, 4 and 12, in the config's order: ``training.mixture_names[<key>]``
    (the paper's name, e.g. ``MS-COCO + COCO-CFs (base)``), else the key."""
    names = training.get("mixture_names") or {}
    return {m: str(names.get(m) or m) for m in training["mixtures"]}


def targets(view: dict, results: str) -> list[str]:
    """Every final file of the study under ``results`` (``results/<run>/coco_counterfactuals``): captions,
    image pairs, the evaluations the config enables, training tables and curves, A.2, report figures."""
    ev, tr = view["evaluation"], view["training"]
    # a downloaded release (`release.root`) replaces the image stage; its captions come with `release.captions`
    release = view.get("release") or {}
    has_captions = not release.get("root") or release.get("captions")
    out = [f"{results}/images/selected_pairs.parquet", f"{results}/report/pair_grid.png"]
    if has_captions:
        out += [f"{results}/captions/counterfactual_captions.parquet", f"{results}/report/caption_examples.csv"]
    if not release.get("root"):
        out.append(f"{results}/images/adaptive_curve.csv")   # the over-generation trade-off (ours, issue 16)
    if ev["itr"]["models"]:
        out.append(f"{results}/evaluation/itr_table.md")
    if ev["itm"]["models"]:
        out.append(f"{results}/evaluation/itm_differences.md")
    if ev["classification"]["models"] and ev["classification"]["datasets"]:
        out.append(f"{results}/evaluation/classification.md")
    out += [f"{results}/training/summary.csv", f"{results}/training/curves.png"]
    out += [f"{results}/training/tables/{t}.md" for t in training_tables(tr)]
    if tr["eval"].get("classification") and has_captions:
        out.append(f"{results}/training/label_frequency.csv")
    if view.get("in_domain", {}).get("enabled"):
        out.append(f"{results}/in_domain/table.md")  # A.1, Table 5 (pre-trained rows: the ITR table's subset)
    return out
