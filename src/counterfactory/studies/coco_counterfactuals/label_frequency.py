"""Label-frequency analysis of COCO-Counterfactuals appendix A.2 (Table 6).

*COCO-CFs label frequency* of an image-recognition dataset: the number of counterfactual pairs in which
at least one of the dataset's class labels equals one of the two altered subjects (the original and the
substituted noun). It is set against each mixture's change in zero-shot top-1 accuracy relative to the
pre-trained model, and the two are correlated (Pearson and Spearman, :func:`counterfactory.stats.correlate`).

Matching is ours (the paper does not spell it out): case-insensitive, a word matches a label equal to it
or to it without a plural ``s``/``es``; multi-word labels match no single word.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...errors import CounterFactoryError, input_error


def _forms(word: str) -> set[str]:
    w = word.lower()
    out = {w}
    if w.endswith("es"):
        out.add(w[:-2])
    if w.endswith("s"):
        out.add(w[:-1])
    return out


def label_frequency(subjects: pd.DataFrame, classes: list[str]) -> int:
    """Pairs (rows with ``original_word``, ``new_word``) whose altered subjects match a class label."""
    labels = {c.lower() for c in classes}
    hits = [bool((_forms(a) | _forms(b)) & labels) for a, b in zip(subjects["original_word"], subjects["new_word"])]
    return int(sum(hits))


def label_frequency_table(cfg: dict, captions_path: str | Path, runs_path: str | Path,
                          pretrained_path: str | Path, pretrained_role: str) -> pd.DataFrame:
    """Table 6 layout, long form: ``dataset, label_frequency, mixture, delta`` (non-baseline mixtures)."""
    from ...data.classification import load_dataset
    from ...stats import read_runs

    subjects = pd.read_parquet(captions_path)
    runs = read_runs(runs_path)
    pre = pd.read_csv(pretrained_path)
    pre = pre[(pre["metric"] == "top1") & (pre["role"] == pretrained_role)]
    if pre.empty:
        raise input_error(pretrained_path, None, f"no top1 row for role {pretrained_role!r}",
                          "list that role under evaluation.classification.models")
    training = cfg["training"]
    rows = []
    for dataset in training["eval"].get("classification") or []:
        spec = cfg["evaluation"]["classification"]["datasets"][dataset]
        freq = label_frequency(subjects, load_dataset(dataset, dict(spec)).classes)
        metric = runs[runs["metric"] == f"{dataset}/top1"]
        base = float(pre.iloc[0][dataset])
        for mixture, group in metric.groupby("mixture", sort=False):
            if mixture == training["baseline"]:
                continue
            rows.append({"dataset": dataset, "label_frequency": freq, "mixture": mixture,
                         "delta": float(group["value"].mean()) - base})
    return pd.DataFrame(rows, columns=["dataset", "label_frequency", "mixture", "delta"])


def correlate_or_explain(table: pd.DataFrame, x: str, y: str, source: str) -> dict:
    """Pearson/Spearman of ``x`` vs ``y``; when undefined (n < 3, a constant column) a record saying why."""
    from ...stats import correlate

    try:
        return correlate(table, x, y, source=source)
    except CounterFactoryError as exc:
        return {"x": x, "y": y, "n": int(len(table)), "pearson_r": None, "pearson_p": None, "spearman_rho": None,
                "spearman_p": None, "note": f"undefined: {exc}"}
