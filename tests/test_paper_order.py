"""Paper tables keep the paper's row and column order and headers (issue 32, items 1 and 2).

Each table is built from small synthetic results through the real table functions, with its order taken from the
workflow's view of a configuration that lists mappings in the paper's order (``workflow.view``, what the rules use).
"""

from __future__ import annotations

import copy
import re

import pandas as pd
import pytest

from counterfactory import stats, tables
from counterfactory import workflow as wf
from counterfactory.config import load_full_config
from counterfactory.render import model_display_name

PAPER_DATASETS = ["CIFAR10", "CIFAR100", "Food101", "Caltech101", "Caltech256", "ImageNet"]
PAPER_MIXTURES = ["mscoco", "base", "medium", "all"]
PAPER_MIXTURE_NAMES = ["MS-COCO", "MS-COCO + COCO-CFs (base)", "MS-COCO + COCO-CFs (medium)",
                       "MS-COCO + COCO-CFs (all)"]


@pytest.fixture(scope="module")
def paper_cfg(repo):
    return load_full_config([repo / "config" / "config.yaml"])


def _header(markdown: str) -> list[str]:
    line = next(ln for ln in markdown.splitlines() if ln.startswith("|"))
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _rows(markdown: str) -> list[str]:
    lines = [ln for ln in markdown.splitlines() if ln.startswith("|")][2:]
    return [re.split(r"(?<!\\)\|", ln.strip())[1].strip() for ln in lines]


def _summary(metrics, mixtures, baseline="mscoco"):
    """A summary (``stats summarize``) of two seeds per mixture, its rows in reverse (not the paper's) order."""
    rows = []
    for i, mixture in enumerate(reversed(mixtures)):
        for seed in (1, 2):
            for j, metric in enumerate(reversed(metrics)):
                rows.append({"experiment": "coco_cf", "mixture": mixture, "seed": seed, "data_seed": seed + 1,
                             "metric": metric, "value": 40.0 + i + j + seed / 10})
    return stats.summarize(pd.DataFrame(rows), baseline)


def test_view_keeps_the_configured_order_of_mappings(paper_cfg):
    view = wf.view(paper_cfg, "coco_counterfactuals")
    assert list(view["training"]["mixtures"]) == PAPER_MIXTURES
    assert list(view["evaluation"]["classification"]["datasets"]) == PAPER_DATASETS
    # the cache is keyed by the order too: a config listing the mixtures the other way round gets its own order
    flipped = copy.deepcopy(paper_cfg)
    mixtures = flipped["coco_counterfactuals"]["training"]["mixtures"]
    flipped["coco_counterfactuals"]["training"]["mixtures"] = dict(reversed(list(mixtures.items())))
    assert list(wf.view(flipped, "coco_counterfactuals")["training"]["mixtures"]) == PAPER_MIXTURES[::-1]
    assert list(wf.view(paper_cfg, "coco_counterfactuals")["training"]["mixtures"]) == PAPER_MIXTURES


@pytest.mark.parametrize("table", ["retrieval", "retrieval_mscoco", "classification"])
def test_coco_cf_tables_3_4_12_rows_and_columns_in_paper_order(paper_cfg, table):
    """Tables 3 (Flickr30k), 12 (MS-COCO) and 4 (zero-shot): rows pre-trained CLIP, MS-COCO, base, medium, all;
    columns R@1, R@5, R@10 per direction then Mean, or the six datasets in the paper's order then Mean."""
    from counterfactory.studies.coco_counterfactuals import (
        mixture_display_names,
        table_metrics,
        table_mixtures,
        training_tables,
    )

    training = wf.view(paper_cfg, "coco_counterfactuals")["training"]
    assert table in training_tables(training)
    metrics = table_metrics(training, table).split(",")
    order = table_mixtures(training)
    assert order == ["pretrained", *PAPER_MIXTURES]
    summary = _summary(metrics, order)
    built = tables.build_table(summary, metrics=metrics, mixture_order=order, pretrained="pretrained",
                               pretrained_label=training["pretrained_row"],
                               mixture_labels=mixture_display_names(training))
    md = tables.render_markdown(built)
    # the rows as the paper names them (B.3.1's subscripts in parentheses), never the config's keys
    assert _rows(md) == ["None (pre-trained CLIP)", *PAPER_MIXTURE_NAMES]
    assert [r["label"] for r in tables.to_frame(built).to_dict("records")] == _rows(md)
    if table == "classification":
        assert _header(md)[1:] == [*PAPER_DATASETS, "Mean"]
    else:
        name = "Flickr30k" if table == "retrieval" else "MS-COCO"
        assert _header(md)[1:] == ([f"{name} I→T R@{k}" for k in (1, 5, 10)]
                                   + [f"{name} T→I R@{k}" for k in (1, 5, 10)] + [f"{name} Mean"])
        tex = tables.render_latex(built)
        assert "R@1" in tex and "image_to_text" not in tex and "I→T" in tex


def test_zero_shot_classification_table_columns_in_paper_order(paper_cfg):
    """Table 4's pre-trained row (``evaluate classify-table``): datasets in the order the config lists them (the
    rule passes the view's datasets as --dataset-order), not alphabetical."""
    from counterfactory.evaluation.tables import classification_table

    order = list(wf.view(paper_cfg, "coco_counterfactuals")["evaluation"]["classification"]["datasets"])
    results = [{"model": "clip", "role": "clip_eval", "dataset": d, "top1": 50.0 + i}
               for i, d in enumerate(sorted(PAPER_DATASETS))]
    table = classification_table(results, dataset_order=order)
    assert [c for c in table.columns if c not in ("model", "role")] == [*PAPER_DATASETS, "Mean"]


def test_countercurate_finetune_table_has_table4_columns(repo):
    """CounterCurate Table 4 (and Table 1): rows pre-trained then the variants in the paper's order, with the
    Negative images / Negative captions / Grouping marks; columns LR / AB / Both, not every raw metric key."""
    from counterfactory.config import load_config
    from counterfactory.studies.countercurate import benchmark_tables, training

    cfg = load_config([repo / "config" / "config.yaml"], study="countercurate")
    order = training.table_order(cfg, "positions")
    keys = [f"positions/{s}/{m}" for s in ("LR", "AB", "both")
            for m in ("accuracy", "text_score", "image_score", "group_score")] + ["positions/both/extra"]
    rows = []
    for mixture in reversed(order):
        for seed in (1, 2):
            rows += [{"experiment": "positions", "mixture": mixture, "seed": seed, "data_seed": seed, "metric": k,
                      "value": 50.0 + seed + len(k)} for k in keys]
    summary = stats.summarize(pd.DataFrame(rows), "no_grouping")
    metrics = benchmark_tables.finetune_metrics("positions").split(",")
    built = tables.build_table(summary, metrics=metrics, mixture_order=order, experiment="positions",
                               mixture_info=training.variants_info(), row_header="Training")
    md = tables.render_markdown(built)
    assert _header(md) == ["Training", "Negative images", "Negative captions", "Grouping", "LR", "AB", "Both"]
    labels = _rows(md)
    assert labels[0] == "Pre-trained (no fine-tuning)" and labels[-1] == "+ CounterCurate"
    assert len(labels) == len(order)
    # a subset the run has no items of is left out, not an error
    part = summary[~summary["metric"].str.startswith("positions/AB/")]
    assert _header(tables.render_markdown(tables.build_table(part, metrics=metrics, mixture_order=order,
                                                             experiment="positions")))[1:] == ["LR", "Both"]


def test_role_display_names_default_to_the_model_name(paper_cfg):
    models = paper_cfg["models"]
    assert model_display_name(models, "itm_bridgetower") == "BridgeTower"        # config: the paper's name
    assert model_display_name({"clip_eval": {"source": "openai/clip-vit-base-patch32"}},
                              "clip_eval") == "clip-vit-base-patch32"              # default: from the source
    assert model_display_name({"m": {"source": "resources/models/tiny/clip/"}}, "m") == "clip"
    assert model_display_name({}, "itm_vilt") == "itm_vilt"


def test_stats_table_names_mixture_rows_as_the_paper(tmp_path, paper_cfg, capsys):
    """``stats table --mixture-label KEY=NAME`` (what the stats_table rule passes from
    ``training.mixture_names``, default in the schema): the rendered rows of every format carry the paper's names; a mixture
    without a display name keeps its key; a malformed option is a clear error."""
    from counterfactory.cli import main
    from counterfactory.studies.coco_counterfactuals import mixture_display_names

    training = wf.view(paper_cfg, "coco_counterfactuals")["training"]
    names = mixture_display_names(training)
    assert list(names.values()) == PAPER_MIXTURE_NAMES
    assert mixture_display_names({"mixtures": {"mine": {"real_fraction": 1.0, "cf_fraction": 0.0}}}) == {"mine": "mine"}
    summary_path = tmp_path / "summary.csv"
    _summary(["flickr30k/mean"], PAPER_MIXTURES).to_csv(summary_path, index=False)
    out = {ext: tmp_path / f"t.{ext}" for ext in ("md", "html", "tex", "csv")}
    labels = [a for m, n in list(names.items())[:3] for a in ("--mixture-label", f"{m}={n}")]
    assert main(["stats", "table", "--summary", str(summary_path), "--mixture-order", ",".join(PAPER_MIXTURES),
                 *labels, "--out-md", str(out["md"]), "--out-html", str(out["html"]), "--out-tex", str(out["tex"]),
                 "--out-csv", str(out["csv"])]) == 0
    assert _rows(out["md"].read_text()) == [*PAPER_MIXTURE_NAMES[:3], "all"]
    assert "MS-COCO + COCO-CFs (base)" in out["html"].read_text() and ">base<" not in out["html"].read_text()
    assert "MS-COCO + COCO-CFs (medium)" in out["tex"].read_text()
    assert list(pd.read_csv(out["csv"])["label"]) == [*PAPER_MIXTURE_NAMES[:3], "all"]
    assert main(["stats", "table", "--summary", str(summary_path), "--mixture-label", "base",
                 "--out-md", str(out["md"])]) == 2
    assert "expected MIXTURE=NAME" in capsys.readouterr().err
