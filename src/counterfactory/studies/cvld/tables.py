"""CVLD's tables and figures in the paper's layouts, from the runs table (mean ± std over seeds or episodes,
one-tailed Welch t-tests against plain fine-tuning, ``base``; lower is better for the fairness metrics).

* Table 1: CelebA classification, DEO, ΔAcc, AP, mAcc (BLIP^PT, BLIP on the full training split, then per K: BLIP,
  CVLD).
* Table 2: retrieval, FairFace Bias@K / MaxSkew@K (K = 1000, 128), COCO and Flickr30K Rec@1 / mRec, per COCO subset.
* Table 3: retrieval ablations on one subset: MaxSkew@128, COCO mRec.
* Table 4: captioning, Error, BiasAmp, LIC, BLEU-4, CIDEr (SPICE where computed), and nocaps CIDEr / SPICE on the
  public validation split (pycocoevalcap) where ``data.nocaps`` names it.
* Figure 4: DEO and AP against K, one line per λ (classification); Figure 5: MaxSkew@K against K (left) and the share of men among
  the top K for "a photo of a doctor / nurse" (right); Figure 9: per-attribute
  DEO change of CVLD over fine-tuning; Figure 10: the share of men among the top K per FairFace query.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pandas as pd

from ... import render
from ...io import write_csv, write_text
from ...render import html_page, render_html
from .settings import FULL, hires, hires_setting, settings, subset_name

log = logging.getLogger(__name__)

BASELINE = "base"
LABELS = {"pretrained": "BLIP^PT", "base": "BLIP", "balanced": "BLIP^Bal", "cvld": "CVLD", "hard_label": "Hard label",
          "neg_only": "Neg only", "itc": "ITC", "itm": "ITM"}
LOWER_PREFIXES = ("DEO", "ΔAcc", "Bias@", "MaxSkew", "Error", "BiasAmp", "LIC")


_SUBSCRIPT = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def sized(label: str, size: int) -> str:
    """``BLIP^Bal`` at 384 px -> ``BLIP^Bal₃₈₄`` (Table 2's subscripted rows)."""
    return f"{label}{str(int(size)).translate(_SUBSCRIPT)}"


def lower_is_better(metric: str) -> bool:
    return str(metric).startswith(LOWER_PREFIXES)


def summarize(runs: pd.DataFrame, test: str = "welch", alpha: float = 0.05) -> pd.DataFrame:
    """``stats.summarize`` against ``base``: fairness metrics tested with ``alternative='less'``, the rest with
    ``'greater'`` (experiments without a ``base`` run, such as the pre-trained model's, get no test)."""
    from ...stats import summarize as summarize_runs

    parts = []
    for lower, part in runs.groupby(runs["metric"].map(lower_is_better), sort=False):
        with_base = part[part["experiment"].isin(part.loc[part["mixture"] == BASELINE, "experiment"])]
        alone = part[~part.index.isin(with_base.index)]
        alt = "less" if lower else "greater"
        if len(with_base):
            parts.append(summarize_runs(with_base, BASELINE, test=test, alpha=alpha, alternative=alt))
        if len(alone):
            stats = alone.groupby(["experiment", "metric", "mixture"], sort=False)["value"]
            parts.append(pd.DataFrame({"n": stats.size(), "mean": stats.mean(), "std": stats.std(ddof=1)})
                         .reset_index().assign(baseline="", delta=float("nan"), p_value=float("nan"),
                                               significant=False, alternative=alt, test=test, note="no baseline"))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return out


def _rekey(summary: pd.DataFrame, rows: list[tuple[str, str, str]]) -> tuple[pd.DataFrame, list[str], pd.DataFrame]:
    """Rows ``(experiment, mixture, label)`` of the summary as one table: mixture = ``experiment/mixture``."""
    frames, order, info = [], [], []
    for experiment, mixture, label in rows:
        part = summary[(summary["experiment"] == experiment) & (summary["mixture"] == mixture)].copy()
        if part.empty:
            continue
        key = f"{experiment}/{mixture}"
        part["experiment"], part["mixture"] = "all", key
        part["baseline"] = part["baseline"].map(lambda b: f"{experiment}/{b}" if b else "")
        frames.append(part)
        order.append(key)
        info.append({"mixture": key, "label": label})
    frame = pd.concat(frames, ignore_index=True) if frames else summary.iloc[0:0]
    return frame, order, pd.DataFrame(info, columns=["mixture", "label"])


def _header(metric: str, dataset: str) -> tuple[str, str]:
    """The paper's ``(group, label)`` for a metric column: the dataset above the metric's name, as in Tables 1-4
    (``COCO:Rec@1`` -> ``COCO`` / ``Rec@1``; Bias / MaxSkew under ``FairFace``; the rest under ``dataset``)."""
    if ":" in metric:
        group, label = metric.split(":", 1)
        return group, label
    if metric.startswith(("Bias@", "MaxSkew@")):
        return "FairFace", metric
    return dataset, metric


def _table(summary, rows, metrics, row_header="Model", dataset=""):
    from ...tables import build_table

    frame, order, info = _rekey(summary, rows)
    metrics = [m for m in metrics if (frame["metric"] == m).any()]
    if not order or not metrics:
        return None
    return build_table(frame, metrics=metrics, mixture_order=order, mixture_info=info, row_header=row_header,
                       decimals=3 if any(m.startswith(("Bias@", "MaxSkew")) for m in metrics) else 1,
                       headers=[_header(m, dataset) for m in metrics])


def paper_tables(summary: pd.DataFrame, s: dict) -> list[tuple[str, object]]:
    out = []
    cl = s["classification"]
    rows = [("classification", "pretrained", LABELS["pretrained"])]
    if cl["full_data"]:
        rows.append(("classification_full", "base", f"{LABELS.get('base', 'base')} (full data)"))
    for k in sorted(cl["shots"], reverse=True):
        rows += [(f"classification_k{k}", v, f"{k}-shot {LABELS.get(v, v)}") for v in cl["variants"] if v != "pretrained"]
    out.append(("Table 1: image classification on CelebA (14 gender-independent attributes)",
                _table(summary, rows, ["DEO", "ΔAcc", "AP", "mAcc"], dataset="CelebA")))
    ks = [int(k) for k in s["retrieval"]["fairface_ks"]]
    fair = [m for k in ks for m in (f"Bias@{k}", f"MaxSkew@{k}")]
    subsets = [subset_name(f) for f in s["data"]["subsets"]]
    for task, title, metrics in (
            ("retrieval", "Table 2: image-text retrieval (fairness on FairFace, Rec@1 / mRec on COCO and Flickr30K)",
             fair + ["COCO:Rec@1", "COCO:mRec", "Flickr30K:Rec@1", "Flickr30K:mRec"]),
            ("captioning", "Table 4: image captioning on COCO and zero-shot on nocaps (validation split, pycocoevalcap)",
             ["Error", "BiasAmp", "LIC", "BLEU-4", "CIDEr", "SPICE", "nocaps:CIDEr", "nocaps:SPICE"])):
        h = hires(s) if task == "retrieval" else None
        rows = [(task, "pretrained", LABELS["pretrained"])]
        if h and h["full_data_role"]:        # Table 2's BLIP₃₈₄: BLIP fine-tuned on all of COCO
            rows.append((f"{task}_{hires_setting(FULL, h['image_size'])}", "base", sized("BLIP", h["image_size"])))
        for name in subsets:
            group = name.replace("coco", "COCO ") + "%"
            rows += [(f"{task}_{name}", v, f"{group} {LABELS.get(v, v)}")
                     for v in s[task]["variants"] if v != "pretrained"]
            if h:                            # the subset's subscripted rows, after its 224 px ones (as printed)
                rows += [(f"{task}_{hires_setting(name, h['image_size'])}", v,
                          f"{group} {sized(LABELS.get(v, v), h['image_size'])}") for v in h["variants"]]
        out.append((title, _table(summary, rows, metrics, dataset="COCO")))
    rv = s["retrieval"]
    t3 = f"retrieval_{subset_name(rv['table3_subset'])}"
    rows = [(t3, v, LABELS.get(v, v)) for v in ["base"] + list(rv["table3"]) + ["cvld"]]
    out.insert(2, (f"Table 3: CVLD variants for retrieval ({t3.split('_')[1].replace('coco', 'COCO ')}%)",
                   _table(summary, rows, [f"MaxSkew@{min(ks)}", "COCO:mRec"], row_header="Method", dataset="COCO")))
    return [(title, table) for title, table in out if table is not None]


# --------------------------------------------------------------------------------------------------------- figures
def _savefig(fig, path) -> Path:
    from ...io import save_figure  # local: tests patch io.save_figure

    out = save_figure(path, fig)
    render.pyplot().close(fig)
    return out


def plot_label(text: str) -> str:
    """A row name for matplotlib: ``BLIP^PT`` -> ``BLIP$^{\\mathrm{PT}}$`` (a superscript, not a caret)."""
    return re.sub(r"\^([A-Za-z0-9]+)", r"$^{\\mathrm{\1}}$", str(text))


def _k_curves(ax, curves, ylabel: str, title: str, legend: bool, legend_size: int, reference: float | None = None):
    """One panel of curves against K on a log axis: ``curves`` yields ``(label, frame)`` with columns ``k``,
    ``mean`` and ``std`` (error bars over seeds); ``reference``: a dashed horizontal line at that value. The K
    axis is ticked at the Ks measured, written as plain numbers (matplotlib's log ticks wrote 3×10⁰ and 4×10⁰
    on top of each other)."""
    from matplotlib.ticker import NullLocator

    ks: set[int] = set()
    for label, g in curves:
        ax.errorbar(g["k"], g["mean"], yerr=g["std"].fillna(0.0), capsize=2, marker="o", ms=3,
                    label=plot_label(label))
        ks |= {int(k) for k in g["k"]}
    if reference is not None:
        ax.axhline(reference, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    if ks:
        ax.set_xticks(sorted(ks), [str(k) for k in sorted(ks)])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("K")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=legend_size)


def _lam_of(m, s: dict):
    """λ of a classification mixture: 0 for fine-tuning (base), ``train.lam`` for cvld, the sweep's own; else None."""
    if m == "base":
        return 0.0
    if m == "cvld":
        return float(s["classification"]["train"]["lam"])
    if str(m).startswith("cvld_lam"):
        return float(str(m)[len("cvld_lam"):])
    return None


def figure4_points(summary: pd.DataFrame, s: dict) -> pd.DataFrame:
    """Figure 4's points ("K-shot image classification on CelebA", §5.2's λ ablation): DEO and AP against K, one
    line per λ (λ = 0: fine-tuning, λ = 1: CVLD, the sweep's λ at the K it ran at, ``figure4_shots``).
    Columns ``k, lam, metric, mean, std``."""
    part = summary[summary["experiment"].str.fullmatch(r"classification_k\d+") & summary["metric"].isin(["DEO", "AP"])]
    part = part.assign(k=part["experiment"].str[len("classification_k"):].astype(int),
                       lam=part["mixture"].map(lambda m: _lam_of(m, s))).dropna(subset=["lam"])
    return part[["k", "lam", "metric", "mean", "std"]].sort_values(["lam", "metric", "k"]).reset_index(drop=True)


def figure4(summary: pd.DataFrame, s: dict, out) -> Path:
    """Figure 4: DEO (left) and AP (right) against K, one line per λ (:func:`figure4_points`)."""
    points = figure4_points(summary, s)
    fig, axes = render.pyplot().subplots(1, 2, figsize=(7.2, 3.2))
    for ax, metric in zip(axes, ("DEO", "AP")):
        for lam, g in points[points["metric"] == metric].groupby("lam"):
            label = "fine-tuning (λ = 0)" if lam == 0 else f"CVLD λ = {lam:g}"
            ax.errorbar(g["k"], g["mean"], yerr=g["std"].fillna(0.0), fmt="o-", capsize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K (shots per class)")
        ax.set_ylabel(f"{metric} (%)")
        ax.grid(alpha=0.3)
    if len(points):
        axes[0].legend(fontsize=7)
    fig.suptitle("Figure 4: K-shot CelebA classification", fontsize=9)
    fig.tight_layout()
    return _savefig(fig, out)


def figure5(summary: pd.DataFrame, s: dict, out) -> Path:
    """Left: MaxSkew@K averaged over the FairFace queries, against K, fine-tuning vs CVLD per subset; right: the
    share of men among the top K for each occupation query (``MaleShare@K:<occupation>``)."""
    part = summary[summary["metric"].str.startswith("MaxSkewCurve@") & summary["mixture"].isin(["base", "cvld",
                                                                                               "pretrained"])]
    part = part.assign(k=part["metric"].str.split("@").str[1].astype(int)).sort_values("k")
    fig, (ax, right) = render.pyplot().subplots(1, 2, figsize=(8.4, 3.2))
    _k_curves(ax, ((f"{exp.replace('retrieval_', '')} {LABELS.get(mix, mix)}", g)
                   for (exp, mix), g in part.groupby(["experiment", "mixture"], sort=False)),
              "MaxSkew@K", "Figure 5 (left): FairFace", bool(len(part)), 7)
    occ = summary[summary["metric"].str.startswith("MaleShare@") & summary["mixture"].isin(["base", "cvld"])]
    occ = occ.assign(k=occ["metric"].str.split("@").str[1].str.split(":").str[0].astype(int),
                     occupation=occ["metric"].str.split(":").str[1]).sort_values("k")
    _k_curves(right, ((f"{job}: {exp.replace('retrieval_', '')} {LABELS.get(mix, mix)}", g)
                      for (exp, mix, job), g in occ.groupby(["experiment", "mixture", "occupation"], sort=False)),
              "% men in the top K", "Figure 5 (right): 'a photo of a doctor / nurse'", bool(len(occ)), 6,
              reference=50.0)
    fig.tight_layout()
    return _savefig(fig, out)


def figure9_values(summary: pd.DataFrame, s: dict) -> pd.Series:
    """Figure 9 (app. D: "the relative improvement in the classification bias (DEO) of CVLD over baseline
    fine-tuning on 256-shot CelebA"): per attribute ``100 (DEO_BLIP − DEO_CVLD) / DEO_BLIP`` at the largest K
    (positive: CVLD is fairer); ``classification.figure9_change: absolute`` (ours, option) gives
    ``DEO_CVLD − DEO_BLIP``. Indexed by attribute, sorted."""
    exp = f"classification_k{max(s['classification']['shots'])}"
    part = summary[(summary["experiment"] == exp) & summary["metric"].str.startswith("DEO:")]
    wide = part.pivot_table(index="metric", columns="mixture", values="mean")
    if not {"base", "cvld"} <= set(wide.columns):
        return pd.Series(dtype=float)
    if s["classification"]["figure9_change"] == "absolute":
        change = wide["cvld"] - wide["base"]
    else:
        change = 100.0 * (wide["base"] - wide["cvld"]) / wide["base"].where(wide["base"] != 0)
    change.index = [m.split(":", 1)[1].replace("_", " ") for m in change.index]
    return change.sort_values()


def figure9(summary: pd.DataFrame, s: dict, out) -> Path:
    """Per-attribute DEO improvement of CVLD over fine-tuning at the largest K (:func:`figure9_values`)."""
    change = figure9_values(summary, s)
    fig, ax = render.pyplot().subplots(figsize=(5.0, 3.4))
    if len(change):
        ax.barh(list(change.index), change.to_numpy())
    relative = s["classification"]["figure9_change"] != "absolute"
    ax.set_xlabel("relative DEO improvement of CVLD over BLIP (%)" if relative else "DEO (CVLD − BLIP)")
    ax.set_title(f"Figure 9: per-attribute improvement, {max(s['classification']['shots'])}-shot", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return _savefig(fig, out)


def figure10(run_dirs, s: dict, out) -> Path:
    """Share of men among the top K (K = the smaller FairFace K) per query, averaged over seeds, per variant."""
    rows = []
    for d in run_dirs:
        path = Path(d) / "fairface.csv"
        if not path.exists():
            continue
        parts = Path(d).parts
        table = pd.read_csv(path)
        k = min(table["k"])
        for r in table[(table["k"] == k) & (table["query"] != "mean")].itertuples(index=False):
            rows.append({"variant": plot_label(f"{parts[-3]} {LABELS.get(parts[-2], parts[-2])}"), "query": r.query,
                         "male_share": (1 + float(r.bias)) / 2})
    frame = pd.DataFrame(rows, columns=["variant", "query", "male_share"])
    fig, ax = render.pyplot().subplots(figsize=(7.6, 3.4))
    if len(frame):
        wide = frame.groupby(["query", "variant"])["male_share"].mean().unstack()
        wide.index = [q.replace("a photo of a ", "").replace(" person", "") for q in wide.index]
        wide.plot.bar(ax=ax, width=0.8)
        ax.axhline(0.5, color="grey", lw=0.8, ls="--")
        # beside the axes, not over the bars (a share of 1.0 reaches the top of the plot)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.set_ylabel("share of men in the top K")
    ax.set_title("Figure 10: gender ratio per FairFace query", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    return _savefig(fig, out)


def write_tables(runs_path, cfg, run_dirs, out_md, out_tex, out_csv, out_figures, out_html=None) -> None:
    """The summary (``out_figures/summary.csv``), Tables 1-4 (Markdown, LaTeX, CSV and, with ``out_html``, one HTML
    page: what the Snakemake report shows) and Figures 4, 5, 9, 10."""
    from ...stats import read_runs
    from ...tables import describe, render_latex, render_markdown, to_frame

    s = settings(cfg)
    summary = summarize(read_runs(runs_path))
    figures = Path(out_figures)
    write_csv(figures / "summary.csv", summary)
    md = ["# CVLD: debiasing BLIP with counterfactuals", "",
          "Mean ± std over seeds (classification: few-shot episodes); underlined = significantly better than "
          "BLIP (fine-tuned) by a one-tailed Welch t-test, α = 0.05; fairness metrics: lower is better.", ""]
    tex, frames, pages = [], [], []
    for title, table in paper_tables(summary, s):
        md.append(render_markdown(table, title))
        tex.append(render_latex(table, title))
        pages.append(render_html(describe(table, title)))
        frames.append(to_frame(table).assign(table=title))
    for name, make in (("figure4.png", lambda p: figure4(summary, s, p)), ("figure5.png", lambda p: figure5(summary, s, p)),
                       ("figure9.png", lambda p: figure9(summary, s, p)),
                       ("figure10.png", lambda p: figure10(run_dirs, s, p))):
        make(figures / name)
        md.append(f"![{name}]({figures.name}/{name})")
    write_text(out_md, "\n".join(md) + "\n")
    if out_html:
        write_text(out_html, html_page("CVLD: debiasing BLIP with counterfactuals",
                                       [f'<p class="note">{md[2]}</p>', *pages]))
    write_text(out_tex, "\n".join(tex) + "\n")
    write_csv(out_csv, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
