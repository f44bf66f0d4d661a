"""Task performance of the debiased models (SocialCounterfactuals §5.3, "Impact of debiasing on task-specific
performance"; Tables 4 and 5).

Each debiasing run of a role in ``debias.task_eval.roles`` (and its pre-trained evaluation) is also evaluated with
the shared evaluation of :mod:`counterfactory.evaluation`: image-text retrieval Recall@K on a Karpathy-format split
(:func:`counterfactory.evaluation.runs.evaluate_retrieval`; Table 4: Flickr30K's 1K test images) and zero-shot
top-1 accuracy (:func:`counterfactory.evaluation.classify.run_classification`; Table 5: CIFAR10, CIFAR100,
Caltech256, ImageNet). The paper's pre-trained rows equal COCO-Counterfactuals' pre-trained CLIP rows (its Tables
3 and 4), so the paper config evaluates with the same splits, prompts and class names. The metrics join the run's
``metrics.csv`` rows (``<retrieval name>/image_to_text@K``, ``<retrieval name>/text_to_image@K``,
``<dataset>/top1``), and :func:`build_tables` lays them out as the paper does: "Pre-trained CLIP" and "Debiased
CLIP", the model debiased on the Race-Gender segment (§5.3: "we conduct analyses of CLIP after debiasing for
Race-Gender intersectional bias ... we hereafter refer to this model as Debiased CLIP"; ``debias.paper_segment``),
mean over seeds with the sample std as subscript; the other segments' debiased models follow as extra rows
("Debiased CLIP (Physical Char., Gender)", ...). :func:`seed_frame` gives every seed's value of each row.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping, Sequence

import pandas as pd

from ...device import with_stage_precision
from ...errors import ConfigError
from ...evaluation import classify
from ...evaluation import runs as ev_runs
from ...render import Cell, Column, Table
from .experiments import DEBIASED, PRETRAINED, parse_experiment, segment_label

#: Table 4's column groups: the paper's "Text Retrieval" is image -> text, "Image Retrieval" text -> image
RETRIEVAL_GROUPS = (("Text Retrieval", "image_to_text"), ("Image Retrieval", "text_to_image"))
PRETRAINED_LABEL = "Pre-trained"


def task_settings(opts: Mapping) -> dict:
    """``debias.task_eval`` (the debias settings ``opts`` hold it with the schema's defaults)."""
    return dict(opts.get("task_eval") or {})


def evaluates(opts: Mapping, role: str) -> bool:
    """Whether the debiasing runs of ``role`` get the task evaluation."""
    task = task_settings(opts)
    return role in (task.get("roles") or []) and bool(task.get("retrieval") or classification_datasets(task))


def classification_datasets(task: Mapping) -> list[str]:
    return list(((task.get("classification") or {}).get("datasets") or {}))


def evaluate(cfg: Mapping, role: str, task: Mapping, progress: bool = False) -> dict[str, float]:
    """Retrieval Recall@K and zero-shot top-1 of ``role`` as ``cfg`` loads it (the debiased checkpoint, or the
    pre-trained model) with the shared evaluation; ``task``: the ``debias.task_eval`` settings."""
    eval_cfg = copy.deepcopy(dict(cfg))
    eval_cfg["evaluation"] = {**(eval_cfg.get("evaluation") or {}), "classification": task.get("classification") or {}}
    eval_cfg = with_stage_precision(eval_cfg, task.get("precision"))
    metrics: dict[str, float] = {}
    if task.get("retrieval"):
        spec = {"split": "test", "ks": [1, 5, 10], **task["retrieval"]}
        metrics.update({k: v for k, v in ev_runs.evaluate_retrieval(eval_cfg, role, spec, progress).items()
                        if not k.endswith("/mean")})
    for dataset in classification_datasets(task):
        scores = classify.run_classification(eval_cfg, role, dataset, progress=progress)
        metrics[f"{dataset}/top1"] = float(scores["top1"])
    return metrics


# --------------------------------------------------------------------------------------------
# Tables 4 and 5
# --------------------------------------------------------------------------------------------
def _cell(values: pd.Series):
    v = values.dropna().astype(float)
    if v.empty:
        return None
    return Cell(float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else math.nan, n=len(v))


def _rows(runs: pd.DataFrame, role: str, segments: Sequence[str] | None, name: str,
          paper_segment: str | None = None) -> list[tuple[str, pd.DataFrame]]:
    """``(row label, runs)`` of one role: ``Pre-trained <name>``, ``Debiased <name>`` (the ``paper_segment`` model,
    §5.3), then ``Debiased <name> (<segment>)`` for every other segment with runs."""
    parsed = runs["experiment"].map(parse_experiment)
    mine = runs[parsed.map(lambda rs: rs[0]) == role].assign(segment=parsed.map(lambda rs: rs[1]))
    order = list(segments) if segments else list(dict.fromkeys(mine["segment"]))
    if paper_segment in order:
        order = [paper_segment] + [s for s in order if s != paper_segment]
    pretrained = mine[mine["mixture"] == PRETRAINED]
    if "seed" in pretrained.columns and not pretrained.empty:
        # every segment's evaluation of the pre-trained model at one seed is the same model on the same data: one
        # value per seed, so the std is over seeds, not over copies (one seed: no std)
        pretrained = pretrained.groupby(["seed", "metric"], as_index=False)["value"].mean()
    out = [(f"{PRETRAINED_LABEL} {name}", pretrained)]
    for seg in order:
        label = f"Debiased {name}" if seg == paper_segment else f"Debiased {name} {segment_label(seg)}"
        out.append((label, mine[(mine["mixture"] == DEBIASED) & (mine["segment"] == seg)]))
    return [(label, frame) for label, frame in out if not frame.empty]


def _specs(retrieval_name: str | None, datasets: Sequence[str], ks: Sequence[int], name: str) -> list[tuple]:
    """``(table key, [(column group, metric, column label)], title)`` of Tables 4 and 5."""
    specs = []
    if retrieval_name:
        cols = [(group, f"{retrieval_name}/{direction}@{k}", f"R@{k}") for group, direction in RETRIEVAL_GROUPS for k in ks]
        specs.append(("table4", cols, f"Table 4. Image & text retrieval of the debiased and pre-trained {name} on "
                                      f"{retrieval_name} (Recall@K, %)."))
    if datasets:
        cols = [("", f"{d}/top1", d) for d in datasets]
        specs.append(("table5", cols, f"Table 5. Zero-shot top-1 accuracy (%) of the debiased and pre-trained {name}."))
    return specs


def build_tables(runs: pd.DataFrame, roles: Sequence[str], retrieval_name: str | None, datasets: Sequence[str],
                 ks: Sequence[int] = (1, 5, 10), segments: Sequence[str] | None = None,
                 labels: Mapping[str, str] | None = None, decimals: int = 2,
                 paper_segment: str | None = None) -> dict[str, Any]:
    """Tables 4 and 5 of each role from the runs table (columns ``experiment, mixture, seed, data_seed, metric,
    value``; experiments ``<role>:<segment>``): rows ``Pre-trained <name>`` (the pre-trained model; every segment's
    evaluation of it at one seed is the same model, so they count once per seed), ``Debiased <name>`` (the
    ``paper_segment`` model, §5.3's "Debiased CLIP": Race-Gender) and ``Debiased <name> (<segment>)`` for the other
    segments (extra rows; with ``paper_segment`` None every debiased row names its segment), mean over seeds
    with the sample std. Table 4: Text Retrieval (image -> text) and Image Retrieval (text -> image) R@K on
    ``retrieval_name``; Table 5: top-1 accuracy per dataset. Returns ``{"table4:<role>": Table, ...}``."""
    labels = dict(labels or {})
    tables: dict[str, Any] = {}
    for role in roles:
        name = labels.get(role, role)
        rows = _rows(runs, role, segments, name, paper_segment)
        if not rows:
            raise ConfigError(f"debias-task-table: the runs table has no runs of role {role!r}. Fix: list roles of "
                              f"debias.task_eval.roles whose runs were collected")
        specs = _specs(retrieval_name, datasets, ks, name)
        for key, cols, title in specs:
            missing = [metric for _, metric, _ in cols if not runs["metric"].eq(metric).any()]
            if missing:
                raise ConfigError(f"debias-task-table: no {missing[0]!r} rows in the runs table. Fix: run the "
                                  f"debiasing runs with debias.task_eval set (or drop that dataset from the table)")
            columns = [Column(f"{name} Model", "left")] + [Column(label, "center", group) for group, _, label in cols]
            body = [[label, *(_cell(frame.loc[frame["metric"] == metric, "value"]) for _, metric, _ in cols)]
                    for label, frame in rows]
            tables[f"{key}:{role}"] = Table(columns, body, title=title, decimals=decimals, std_decimals=decimals,
                                            note="Mean over seeds, sample standard deviation as subscript.")
    return tables


def seed_frame(runs: pd.DataFrame, roles: Sequence[str], retrieval_name: str | None, datasets: Sequence[str],
               ks: Sequence[int] = (1, 5, 10), segments: Sequence[str] | None = None,
               labels: Mapping[str, str] | None = None, paper_segment: str | None = None) -> pd.DataFrame:
    """Every seed's value behind each cell of :func:`build_tables` (same arguments): ``table, row, column, seed,
    value``, e.g. each seed's "Debiased CLIP" (§5.3 reports one run; the tables show the mean and std over seeds)."""
    labels = dict(labels or {})
    out = []
    for role in roles:
        name = labels.get(role, role)
        for key, cols, _ in _specs(retrieval_name, datasets, ks, name):
            for label, frame in _rows(runs, role, segments, name, paper_segment):
                for group, metric, col in cols:
                    for r in frame[frame["metric"] == metric].itertuples(index=False):
                        out.append({"table": f"{key}:{role}", "row": label, "column": f"{group} {col}".strip(),
                                    "seed": int(r.seed), "value": float(r.value)})
    return pd.DataFrame(out, columns=["table", "row", "column", "seed", "value"])


def tables_frame(tables: Mapping[str, Any]) -> pd.DataFrame:
    """Every cell as a long frame: ``table, row, column, mean, std, n``."""
    rows = []
    for key, table in tables.items():
        for body in table.rows:
            for column, cell in zip(table.columns[1:], body[1:]):
                label = f"{column.group} {column.label}".strip()
                if isinstance(cell, Cell):
                    rows.append({"table": key, "row": body[0], "column": label, "mean": cell.mean, "std": cell.std,
                                 "n": cell.n})
    return pd.DataFrame(rows, columns=["table", "row", "column", "mean", "std", "n"])
