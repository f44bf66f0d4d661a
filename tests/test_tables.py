"""Tests for counterfactory.tables and `counterfactory stats table`."""

from __future__ import annotations

import math
import re
from io import StringIO

import numpy as np
import pandas as pd
import pytest

from counterfactory import stats, tables
from counterfactory.cli import main
from counterfactory.errors import InputError

# A Table-3-like summary: pre-trained CLIP (one run), the MS-COCO baseline and three mixtures.
SUMMARY_CSV = """experiment,metric,mixture,baseline,n,mean,std,alternative,significant
flickr30k,R@1,mscoco,mscoco,25,77.90,0.41,greater,False
flickr30k,R@1,pretrained,mscoco,1,67.1,,greater,False
flickr30k,R@1,cf50,mscoco,25,76.66,0.52,greater,False
flickr30k,R@1,cf60,mscoco,25,78.28,0.46,greater,True
flickr30k,R@1,cf67,mscoco,25,77.75,0.50,greater,False
flickr30k,R@5,mscoco,mscoco,25,93.79,0.2,greater,True
flickr30k,R@5,pretrained,mscoco,1,89.0,,greater,False
flickr30k,R@5,cf50,mscoco,25,94.53,0.3,greater,True
flickr30k,R@5,cf60,mscoco,25,94.72,0.3,greater,True
flickr30k,R@5,cf67,mscoco,25,94.7201,0.31,greater,False
"""

INFO_CSV = """mixture,label,n_train,pct_cf
pretrained,None (pre-trained CLIP),0,0
mscoco,MS-COCO,13928,0
cf50,MS-COCO + COCO-CFs,13928,50
cf60,MS-COCO + COCO-CFs,34820,60
cf67,MS-COCO + COCO-CFs,41784,66.7
"""

ORDER = ["pretrained", "mscoco", "cf50", "cf60", "cf67"]
FOOTNOTE = ("Mean over runs with the sample standard deviation as subscript; best mean per column in bold; "
            "underlined: one-tailed t-test shows a significant improvement over the baseline.")


def parse_pipe_table(text: str) -> tuple[list[str], list[str], list[list[str]]]:
    """(header, alignment, rows) of the first GitHub pipe table in ``text``, cells stripped; a cell may
    hold an escaped ``\\|``. Alignment from the rule row: ``:--`` left, ``--:`` right, ``:-:`` center."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]

    def cells(line):
        return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]

    def kind(rule):
        return {(True, False): "left", (False, True): "right", (True, True): "center"}[
            (rule.startswith(":"), rule.endswith(":"))]

    return cells(lines[0]), [kind(r) for r in cells(lines[1])], [cells(ln) for ln in lines[2:]]


def table_summary():
    frame = pd.read_csv(StringIO(SUMMARY_CSV), dtype=str, keep_default_na=False)
    frame["mean"] = frame["mean"].astype(float)
    frame["std"] = pd.to_numeric(frame["std"])
    frame["n"] = frame["n"].astype(int)
    frame["significant"] = frame["significant"] == "True"
    return frame


@pytest.fixture
def summary_path(tmp_path):
    path = tmp_path / "summary.csv"
    path.write_text(SUMMARY_CSV)
    return path


@pytest.fixture
def info_path(tmp_path):
    path = tmp_path / "info.csv"
    path.write_text(INFO_CSV)
    return path


@pytest.fixture
def table(summary_path, info_path):
    return tables.build_table(tables.read_summary(summary_path), mixture_order=ORDER,
                              mixture_info=tables.read_mixture_info(info_path))


def test_markdown_cells(table):
    text = tables.render_markdown(table, "Table 3")
    assert text.startswith("**Table 3**\n\n|") and text.endswith("\n\n" + FOOTNOTE + "\n")
    header, align, rows = parse_pipe_table(text)
    assert header == ["Training dataset", "\\|D<sub>train</sub>\\|", "% CFs", "R@1", "R@5"]
    assert align == ["left", "right", "right", "center", "center"]
    assert rows == [
        ["None (pre-trained CLIP)", "0", "0%", "67.10", "89.00"],
        ["MS-COCO", "13,928", "0%", "77.90<sub>0.4</sub>", "93.79<sub>0.2</sub>"],
        ["MS-COCO + COCO-CFs", "13,928", "50%", "76.66<sub>0.5</sub>", "<u>94.53</u><sub>0.3</sub>"],
        ["MS-COCO + COCO-CFs", "34,820", "60%", "**<u>78.28</u>**<sub>0.5</sub>", "**<u>94.72</u>**<sub>0.3</sub>"],
        ["MS-COCO + COCO-CFs", "41,784", "66.7%", "77.75<sub>0.5</sub>", "**94.72**<sub>0.3</sub>"],
    ]


def test_latex_exact(table):
    expected = "\n".join([
        "% requires \\usepackage{booktabs}",
        "\\begin{table}[t]",
        "\\centering",
        "\\caption{Flickr30k 1K, R@K \\& 50\\% CFs}",
        "\\label{tab:flickr}",
        "\\begin{tabular}{lrrcc}",
        "\\toprule",
        "Training dataset & $|D_{\\text{train}}|$ & \\% CFs & R@1 & R@5 \\\\",
        "\\midrule",
        "None (pre-trained CLIP) & 0 & 0\\% & $67.10$ & $89.00$ \\\\",
        "MS-COCO & 13,928 & 0\\% & $77.90_{0.4}$ & $93.79_{0.2}$ \\\\",
        "MS-COCO + COCO-CFs & 13,928 & 50\\% & $76.66_{0.5}$ & $\\underline{94.53}_{0.3}$ \\\\",
        "MS-COCO + COCO-CFs & 34,820 & 60\\% & $\\underline{\\textbf{78.28}}_{0.5}$ & $\\underline{\\textbf{94.72}}_{0.3}$ \\\\",
        "MS-COCO + COCO-CFs & 41,784 & 66.7\\% & $77.75_{0.5}$ & $\\textbf{94.72}_{0.3}$ \\\\",
        "\\bottomrule",
        "\\end{tabular}",
        "\\end{table}",
    ]) + "\n"
    assert tables.render_latex(table, "Flickr30k 1K, R@K & 50% CFs", "tab:flickr") == expected


def test_baseline_is_never_underlined_even_if_flagged(table):
    # the summary says significant=True for the baseline's R@5 row; a baseline cannot beat itself
    assert not table.cells[("mscoco", ("flickr30k", "R@5"))].significant
    assert tables.cell_markdown(table.cells[("mscoco", ("flickr30k", "R@5"))]) == "93.79<sub>0.2</sub>"


def test_best_uses_displayed_precision_ties_all_bold(table):
    best = {m for (m, k), c in table.cells.items() if k[1] == "R@5" and c.best}
    assert best == {"cf60", "cf67"}  # 94.72 vs 94.7201
    fine = tables.build_table(table_summary(), decimals=4)
    best4 = {m for (m, k), c in fine.cells.items() if k[1] == "R@5" and c.best}
    assert best4 == {"cf67"}


def test_lower_is_better_bolds_minimum():
    frame = table_summary()
    frame["alternative"] = "less"
    t = tables.build_table(frame)
    best = sorted(k[1] + ":" + m for (m, k), c in t.cells.items() if c.best)
    assert best == ["R@1:pretrained", "R@5:pretrained"]


def test_selection_order_and_missing_cells():
    frame = table_summary()
    frame = frame[~((frame["mixture"] == "cf50") & (frame["metric"] == "R@1"))]
    t = tables.build_table(frame, metrics=["R@5", "R@1"], mixture_order=["cf50", "mscoco"])
    assert t.row_keys == ["cf50", "mscoco"] and t.col_labels == ["R@5", "R@1"]
    _, _, rows = parse_pipe_table(tables.render_markdown(t))
    assert rows == [["cf50", "**<u>94.53</u>**<sub>0.3</sub>", "–"],
                    ["mscoco", "93.79<sub>0.2</sub>", "**77.90**<sub>0.4</sub>"]]
    assert "cf50 & $\\underline{\\textbf{94.53}}_{0.3}$ & -- \\\\" in tables.render_latex(t)
    with pytest.raises(InputError, match=r"--metrics: unknown metric 'R@10' \(available: R@1, R@5\)"):
        tables.build_table(frame, metrics=["R@10"])
    with pytest.raises(InputError, match="--mixture-order: unknown mixture 'coco'"):
        tables.build_table(frame, mixture_order=["coco"])


def test_multiple_experiments_label_columns():
    a = table_summary()
    b = a.assign(experiment="mscoco5k")
    t = tables.build_table(pd.concat([a, b]), metrics=["mscoco5k:R@1", "R@5"])
    assert t.col_labels == ["mscoco5k:R@1", "flickr30k:R@5", "mscoco5k:R@5"]
    t1 = tables.build_table(pd.concat([a, b]), experiment="mscoco5k")
    assert t1.col_labels == ["R@1", "R@5"]
    with pytest.raises(InputError, match="unknown experiment 'x'"):
        tables.build_table(a, experiment="x")


def test_decimals_and_escaping():
    frame = table_summary().replace({"mixture": {"cf50": "cf_50&more"}})
    t = tables.build_table(frame, decimals=1, std_decimals=2, metrics=["R@1"])
    tex = tables.render_latex(t)
    assert "cf\\_50\\&more & $76.7_{0.52}$ \\\\" in tex
    _, _, rows = parse_pipe_table(tables.render_markdown(t))
    assert ["cf_50&more", "76.7<sub>0.52</sub>"] in rows
    piped = tables.build_table(table_summary().replace({"mixture": {"cf50": "a|b"}}), metrics=["R@1"])
    _, _, rows = parse_pipe_table(tables.render_markdown(piped))
    assert rows[2][0] == "a\\|b" and all(len(r) == 2 for r in rows)


def test_csv_frame(table):
    frame = tables.to_frame(table)
    assert list(frame.columns) == ["mixture", "label", "n_train", "pct_cf", "R@1", "R@1 best", "R@1 significant",
                                   "R@5", "R@5 best", "R@5 significant"]
    cf60 = frame.set_index("mixture").loc["cf60"]
    assert cf60["R@1"] == "78.28_{0.5}" and cf60["R@1 best"] and cf60["R@1 significant"]
    assert frame.set_index("mixture").loc["pretrained", "R@1"] == "67.10"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("experiment,metric,mixture,n,mean\n", "missing column(s) std, significant, baseline"),
        ("experiment,metric,mixture,baseline,n,mean,std,significant\ne,m,a,a,2,x,1,True\n",
         "record line 2 (experiment=e, metric=m, mixture=a): mean 'x' is not a finite number"),
        ("experiment,metric,mixture,baseline,n,mean,std,significant\ne,m,a,a,2,1,1,maybe\n",
         "record line 2: significant 'maybe' is not True/False"),
        ("experiment,metric,mixture,baseline,n,mean,std,significant\ne,m,a,a,2,1,1,True\ne,m,a,a,2,1,1,True\n",
         "appears twice"),
    ],
)
def test_read_summary_errors(tmp_path, text, expected):
    path = tmp_path / "s.csv"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        tables.read_summary(path)
    assert str(path) in str(info.value) and expected in str(info.value) and "Fix:" in str(info.value)


def test_cli_runs_to_table_end_to_end(tmp_path, info_path):
    rng = np.random.default_rng(1)
    rows = []
    for mixture, mu in [("mscoco", 77.9), ("cf60", 79.0), ("cf50", 77.0)]:
        for seed in range(107, 117):
            for metric, offset in [("R@1", 0.0), ("R@5", 16.0)]:
                rows.append({"experiment": "flickr30k", "mixture": mixture, "seed": seed, "data_seed": seed + 1,
                             "metric": metric, "value": mu + offset + rng.normal(0, 0.3)})
    runs = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(runs, index=False)
    summary = tmp_path / "summary.csv"
    assert main(["stats", "summarize", "--runs", str(runs), "--baseline", "mscoco", "--out", str(summary),
                 "--mean-metric", "Mean"]) == 0
    md, tex, csv = tmp_path / "t.md", tmp_path / "t.tex", tmp_path / "t.csv"
    assert main(["stats", "table", "--summary", str(summary), "--out-md", str(md), "--out-tex", str(tex),
                 "--out-csv", str(csv), "--metrics", "R@1,Mean", "--mixture-order", "mscoco,cf50,cf60",
                 "--mixture-info", str(info_path), "--title", "Flickr30k", "--decimals", "1"]) == 0
    s = stats.summarize(stats.add_mean_metric(stats.read_runs(runs), "Mean"), "mscoco")
    cf60 = s[(s["mixture"] == "cf60") & (s["metric"] == "R@1")].iloc[0]
    assert cf60["significant"] and cf60["p_value"] < 1e-6
    cell = f"**<u>{cf60['mean']:.1f}</u>**<sub>{cf60['std']:.1f}</sub>"
    text = md.read_text()
    assert text.startswith("**Flickr30k**\n\n")
    header, _, rows = parse_pipe_table(text)
    assert header == ["Training dataset", "\\|D<sub>train</sub>\\|", "% CFs", "R@1", "Mean"]
    assert rows[2][:4] == ["MS-COCO + COCO-CFs", "34,820", "60%", cell]
    assert "\\underline{\\textbf{" in tex.read_text()
    wide = pd.read_csv(csv)
    assert wide["mixture"].tolist() == ["mscoco", "cf50", "cf60"]
    assert wide["R@1 significant"].tolist() == [False, False, True]


def test_cli_table_errors(tmp_path, summary_path, capsys):
    assert main(["stats", "table", "--summary", str(summary_path)]) == 2
    assert "no output requested" in capsys.readouterr().err
    out = tmp_path / "t.md"
    assert main(["stats", "table", "--summary", str(summary_path), "--out-md", str(out), "--metrics", "R@9"]) == 2
    assert "unknown metric 'R@9'" in capsys.readouterr().err and not out.exists()
    assert main(["stats", "table", "--summary", str(tmp_path / "none.csv"), "--out-md", str(out)]) == 2
    assert "summary table not found" in capsys.readouterr().err


def test_n1_rows_have_no_std_subscript(table):
    c = table.cells[("pretrained", ("flickr30k", "R@1"))]
    assert c.n == 1 and math.isnan(c.std)
    assert tables.cell_latex(c) == "$67.10$" and tables.cell_plain(c) == "67.10"


def test_flag_columns_render_as_marks_in_table4_layout(tmp_path):
    """CounterCurate Table 4: yes / no info columns become check marks and crosses, in info order."""
    summary = pd.DataFrame([
        {"experiment": "positions", "metric": m, "mixture": mix, "baseline": "no_grouping", "n": 2, "mean": v,
         "std": 0.5, "significant": False, "alternative": "greater"}
        for mix, v in (("no_grouping", 70.0), ("grouping", 75.9)) for m in ("LR", "AB")])
    info = tmp_path / "info.csv"
    info.write_text("mixture,label,negative_images,negative_captions,grouping\n"
                    "no_grouping,+ CC (No Group),yes,yes,no\ngrouping,+ CC,YES,true,1\n")
    table = tables.build_table(summary, mixture_order=["no_grouping", "grouping"],
                               mixture_info=tables.read_mixture_info(info))
    md = tables.render_markdown(table).splitlines()
    head = next(line for line in md if line.startswith("| Training"))
    assert [c.strip() for c in head.strip("|").split("|")][:4] == ["Training dataset", "Negative images",
                                                                   "Negative captions", "Grouping"]
    rows = [line for line in md if line.startswith("| +")]
    assert [c.strip() for c in rows[0].strip("|").split("|")][1:4] == ["✓", "✓", "×"]
    assert [c.strip() for c in rows[1].strip("|").split("|")][1:4] == ["✓", "✓", "✓"]
    tex = tables.render_latex(table)
    assert "$\\checkmark$ & $\\checkmark$ & $\\times$" in tex
    info.write_text("mixture,grouping\ngrouping,maybe\n")
    with pytest.raises(InputError, match=r"info\.csv, record line 2: grouping = 'maybe' is not yes / no"):
        tables.read_mixture_info(info)


# --------------------------------------------------------------------------------------------
# COCO-CF Tables 3, 4 and 12: the pre-trained row first and Table 4's Mean column (issue 28, item 10)
# --------------------------------------------------------------------------------------------
def _paper_runs(datasets, mixtures, seeds=(107, 108)):
    """A runs table as `train collect` writes it: the pre-trained run once, every mixture over ``seeds``."""
    from counterfactory.training.runs import CLASSIFICATION_MEAN

    rows = []
    runs = [("pretrained", 107)] + [(m, s) for m in mixtures for s in seeds]
    for k, (mixture, seed) in enumerate(runs):
        top1 = {d: 50.0 + 10 * j + 0.5 * k for j, d in enumerate(datasets)}
        top1[CLASSIFICATION_MEAN] = float(np.mean(list(top1.values())))
        rows += [{"experiment": "coco_cf", "mixture": mixture, "seed": seed, "data_seed": seed + 1,
                  "metric": f"{d}/top1" if d in datasets else d, "value": v} for d, v in top1.items()]
    return pd.DataFrame(rows)


def test_paper_config_tables_have_the_pretrained_row_and_table4_mean(repo):
    """§5, Tables 3, 4 and 12 start with "None (pre-trained CLIP)" (|D_train| 0, % CFs 0 %, one run, no std);
    Table 4 ends with the Mean over its six datasets."""
    from counterfactory.config import load_config
    from counterfactory.studies.coco_counterfactuals import table_metrics, table_mixtures

    training = load_config([repo / "config" / "config.yaml"])["training"]
    datasets = list(training["eval"]["classification"])
    assert datasets == ["CIFAR10", "CIFAR100", "Food101", "Caltech101", "Caltech256", "ImageNet"]
    metrics = table_metrics(training, "classification").split(",")
    assert metrics == [f"{d}/top1" for d in datasets] + ["classification/mean"]       # Table 4: ... Mean
    assert table_metrics(training, "retrieval").split(",")[-1] == "flickr30k/mean"    # Table 3 had its Mean
    order = table_mixtures(training)
    assert order == ["pretrained", "mscoco", "base", "medium", "all"]
    # the workflow's cached view sorts keys; the rows keep the order the config file lists
    shuffled = {**training, "mixtures": dict.fromkeys(sorted(training["mixtures"]))}
    assert table_mixtures(shuffled, ["mscoco", "base", "medium", "all"]) == order

    runs = _paper_runs(datasets, order[1:])
    summary = stats.summarize(runs, training["baseline"])
    info = pd.DataFrame({"mixture": order[1:], "n_train": ["13928", "13928", "34820", "41784"],
                         "n_cf": ["0", "6939", "20894", "27853"], "pct_cf": ["0", "49.8", "60.0", "66.7"]})
    table = tables.build_table(summary, metrics=metrics, mixture_order=order, mixture_info=info,
                               pretrained="pretrained", pretrained_label=training["pretrained_row"])
    header, _, rows = parse_pipe_table(tables.render_markdown(table))
    assert header[:4] == ["Training dataset", "\\|D<sub>train</sub>\\|", "\\|D<sup>CF</sup><sub>train</sub>\\|",
                          "% CFs"]
    assert header[4:] == datasets + ["Mean"]       # Table 4's headers, not the metric keys
    assert [r[0] for r in rows] == ["None (pre-trained CLIP)", "mscoco", "base", "medium", "all"]
    first = rows[0]
    assert first[1:4] == ["0", "0", "0%"]
    assert first[4] == "50.00" and "<sub>" not in "".join(first[4:])   # one run: mean without a std
    # the Mean column is the per-run mean over the datasets, summarised over seeds like any metric
    mean = summary[(summary["metric"] == "classification/mean") & (summary["mixture"] == "all")].iloc[0]
    per_run = runs[(runs["metric"] != "classification/mean") & (runs["mixture"] == "all")]
    assert mean["mean"] == pytest.approx(per_run["value"].mean())
    assert mean["n"] == 2 and f"{mean['mean']:.2f}" in rows[4][-1]


def test_stats_table_cli_puts_the_pretrained_row_first(tmp_path, info_path):
    runs = _paper_runs(["CIFAR10", "Food101"], ["mscoco", "cf50"])
    summary = tmp_path / "summary.csv"
    stats.summarize(runs, "mscoco").to_csv(summary, index=False)
    out = tmp_path / "t.md"
    assert main(["stats", "table", "--summary", str(summary), "--mixture-info", str(info_path),
                 "--mixture-order", "mscoco,cf50", "--pretrained-row", "pretrained",
                 "--pretrained-label", "None (pre-trained CLIP)", "--out-md", str(out)]) == 0
    header, _, rows = parse_pipe_table(out.read_text())
    assert header[-1] == "Mean"                  # Table 4 heads the mean over datasets "Mean"
    assert [r[0] for r in rows] == ["None (pre-trained CLIP)", "MS-COCO", "MS-COCO + COCO-CFs"]
    assert rows[0][1:3] == ["0", "0%"]
    assert main(["stats", "table", "--summary", str(summary), "--pretrained-row", "zero_shot",
                 "--out-md", str(out)]) == 2   # no such mixture in the summary


def test_run_one_reports_the_classification_mean(repo, tmp_path, monkeypatch):
    """Table 4's Mean: every run (the pre-trained one included) writes its mean top-1 over the datasets."""
    from counterfactory.config import load_config
    from counterfactory.evaluation import classify
    from counterfactory.evaluation.runs import run_one

    cfg = load_config([repo / "config" / "demo.yaml"])
    cfg["training"]["eval"] = {"retrieval": [], "classification": ["A", "B", "C"]}
    scores = {"A": 90.0, "B": 60.0, "C": 75.0}
    monkeypatch.setattr(classify, "run_classification", lambda cfg, role, dataset, progress=True: {"top1": scores[dataset]})
    rows = run_one(cfg, None, "pretrained", 107, 108, tmp_path / "run", progress=False, train=False)
    values = dict(zip(rows["metric"], rows["value"]))
    assert values == {"A/top1": 90.0, "B/top1": 60.0, "C/top1": 75.0, "classification/mean": 75.0}
    assert set(rows["mixture"]) == {"pretrained"}


def test_stats_table_writes_html_registered_in_the_report(tmp_path, repo):
    """Issue 32 item 3: the paper tables of `stats table` (COCO-CF Tables 3 / 4 / 12, CounterCurate's fine-tuning
    tables) are also written as HTML, and the report registers the HTML (its viewer does not show Markdown)."""
    runs = _paper_runs(["CIFAR10", "Food101"], ["mscoco", "cf50"])
    summary = tmp_path / "summary.csv"
    stats.summarize(runs, "mscoco").to_csv(summary, index=False)
    out = tmp_path / "t.html"
    assert main(["stats", "table", "--summary", str(summary), "--mixture-order", "mscoco,cf50",
                 "--out-html", str(out), "--title", "Table 4"]) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<caption>Table 4</caption>" in page
    assert page.index(">mscoco<") < page.index(">cf50<") and ">Mean</th>" in page
    for rules_file, rule in (("training.smk", "rule stats_table:"),
                             ("study_countercurate.smk", "rule stats_table_countercurate:"),
                             ("study_countercurate.smk", "use rule stats_table_countercurate as"),
                             ("evaluate.smk", "rule evaluate_itr_table:"),
                             ("evaluate.smk", "rule evaluate_itm_summary:"),
                             ("evaluate.smk", "rule evaluate_classify_table:"),
                             ("study_coco_counterfactuals.smk", "rule train_in_domain_table:")):
        text = (repo / "rules" / rules_file).read_text()
        block = text[text.index(rule):].split("\n\n\n")[0]
        outputs = block[block.index("output:"):block.index("log:")]
        assert re.search(r"html=report\(\s*f\"[^\"]+\.html\"", outputs), (rules_file, rule)
        assert "md=report(" not in outputs


def test_evaluation_and_table5_html_pages():
    """Issue 32 item 3: Tables 2 / 13 (retrieval), Figure 3's summary, zero-shot Table 4 and Table 5 as HTML pages
    from the same descriptions as their Markdown (bold marks become <strong>, not literal asterisks)."""
    from counterfactory import evaluation
    from counterfactory.studies.coco_counterfactuals import in_domain

    long = pd.DataFrame([{"role": "clip_eval", "model": "CLIP", "dataset": d, "metric": m, "value": v}
                         for d, base in (("MS-COCO", 50.0), ("COCO-CFs", 40.0))
                         for m, v in (("TR@1", base), ("IR@1", base - 5))])
    page = evaluation.render_itr_html(evaluation.itr_table(long), "Table 2")
    assert page.startswith("<!DOCTYPE html>") and "<caption>Table 2</caption>" in page
    assert "<strong>" in page and "**" not in page and ">TR R@1</th>" in page
    results = [{"model": "CLIP", "role": "clip_eval", "dataset": d, "top1": 50.0} for d in ("CIFAR10", "Food101")]
    page = evaluation.render_classification_html({"top1": evaluation.classification_table(results)}, "Table 4")
    assert page.index(">CIFAR10</th>") < page.index(">Food101</th>") < page.index(">Mean</th>")
    summary = stats.summarize(pd.DataFrame([{"experiment": "clip_train", "mixture": mix, "seed": s, "data_seed": s,
                                             "metric": m, "value": 40.0 + s + i}
                                            for i, mix in enumerate(("pretrained", "mscoco", "coco_cfs"))
                                            for s in ((1,) if mix == "pretrained" else (1, 2))
                                            for m, _ in in_domain.TABLE5_COLUMNS]), "mscoco")
    page = in_domain.table5_html(in_domain.table5(summary, ["clip_train"]))
    assert "None (pre-trained" in page and "<sub>" in page and page.count("<tr>") == 1 + 3   # header + 3 rows


def test_the_report_registers_tables_as_html_not_markdown(repo):
    """Issue 32 item 3: Snakemake's report viewer shows images, HTML and PDF only, so every paper table is registered
    as its HTML page; the Markdown stays an ordinary output."""
    registered_md, registered_html = [], []
    for path in sorted((repo / "rules").glob("*.smk")):
        for match in re.finditer(r"report\(\s*f?\"([^\"]+)\"", path.read_text()):
            target = match.group(1)
            (registered_md if target.endswith(".md") else registered_html).append((path.name, target))
    assert registered_md == []
    tables = [t for _, t in registered_html if t.endswith(".html")]
    for table in ("training/tables/{{table}}.html", "evaluation/itr_table.html", "evaluation/classification.html",
                  "in_domain/table.html", "finetune/tables/{{dataset}}.html", "evaluation/tables.html",
                  "filter/table11.html", "probing/{{stage}}/tables.html", "debias/tables.html", "{S}/tables.html"):
        assert any(t.endswith(table) for t in tables), table
    assert ("study_spurious_retrieval.smk", "{S}/tables.html") in registered_html


def test_coco_cf_tables_carry_the_papers_titles(repo):
    """The HTML page, Markdown and LaTeX of Tables 3, 4 and 12 are headed by the paper's table number and content,
    not a generic "Table" (the rule passes --title)."""
    from counterfactory.config import load_config
    from counterfactory.studies import coco_counterfactuals as coco_cf

    training = load_config([repo / "config" / "config.yaml"])["training"]   # the COCO-CF view
    assert coco_cf.table_title(training, "retrieval").startswith("COCO-Counterfactuals Table 3: image-text retrieval")
    assert coco_cf.table_title(training, "classification").startswith("COCO-Counterfactuals Table 4: zero-shot")
    assert "title=lambda wildcards: coco_cf.table_title" in (repo / "rules" / "training.smk").read_text()
