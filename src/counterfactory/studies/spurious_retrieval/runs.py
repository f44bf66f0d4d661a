"""Fine-tuning runs and the paper's tables (§4.1-4.4, Tables 1-3, Figure 4).

:func:`run` trains one model role on one mixture of one dataset with its §4.1 recipe
(:func:`.settings.training_section`, on :func:`counterfactory.evaluation.runs.run_one`) — or, for ``zeroshot``,
takes the pre-trained model — and scores it (:func:`.evaluation.evaluate`). Its ``metrics.csv`` is a runs table:
``experiment`` = ``<dataset>_<role>``, ``mixture``, ``seed``, ``data_seed``, ``metric``, ``value``, which
``counterfactory stats summarize`` turns into mean ± std over seeds with one-tailed Welch t-tests against
``finetune`` (the paper reports single runs).

:func:`write_tables` lays the summary out as the paper does: Table 1 (ODmAP@1/5/10, MS-COCO left, Flickr30k right,
rows per model: zeroshot, finetune, + Ours; VSE++ has no zero-shot row), Table 2 (image→text and text→image R@1/5/10), Table 3 (D' synthesis
variants on CLIP / MS-COCO), Figure 4 (R@1 and ODmAP@1 against |D'_sub| / |D|) and appendix B's table (zero-shot,
D_s, D' and D + D': ODmAP@1 and image→text R@1).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from ... import render
from ...errors import ConfigError
from ...evaluation import runs as ev_runs
from ...io import write_csv, write_text
from ...render import describe_frame, html_page, markdown_body, render_html
from . import evaluation
from .settings import (D_PRIME, D_S, FINETUNE, OURS, RECIPES, ZEROSHOT, has_zeroshot, mixtures, ratio_of, seed_pairs,
                       settings, start_role, training_section)

log = logging.getLogger(__name__)

RUN_COLUMNS = ["experiment", "mixture", "seed", "data_seed", "metric", "value"]
DATASET_LABELS = {"coco": "MS-COCO", "flickr30k": "Flickr30k"}
#: display names of the roles when the caller gives none (the paper's model names); the workflow passes the
#: config's ``models.<role>.display_name`` (``--label ROLE=NAME``), which wins; other roles keep their own name
MODEL_LABELS = {"clip_train": "CLIP", "itm_blip": "BLIP", "vsepp": "VSE++"}
TEXT_LABELS = {"np_removal": "NP removal", "prompt": "prompts", "captioner": "capt. model"}
IMAGE_LABELS = {"lama": "inpaint", "opencv": "inpaint (OpenCV)", "zero": "zero pad.", "mean": "avg pad.",
                "blur": "blur pad."}


def experiment(dataset: str, role: str) -> str:
    return f"{dataset}_{role}"


def run(cfg, dataset: str, role: str, mixture: str, seed: int, data_seed: int, manifests, gallery, out_dir,
        progress: bool = False) -> pd.DataFrame:
    """One run (see the module docstring); writes ``out_dir/metrics.csv`` and returns its rows."""
    from ...training import read_manifest

    s = settings(cfg)
    if mixture != ZEROSHOT and role not in s["training"]["models"]:
        raise ConfigError(f"spurious_retrieval.training.models has no role {role!r}. Fix: add it "
                          f"(role: {'|'.join(RECIPES)})")
    if mixture == ZEROSHOT and not has_zeroshot(s, role):
        raise ConfigError(f"spurious_retrieval: role {role!r} (recipe {s['training']['models'][role]}) has no zero-shot run: Tables 1-2 "
                          "have no VSE++ (zeroshot) row, VSE++ is only reported fine-tuned. Fix: run its finetune or ours "
                          "mixture")
    start = start_role(s, dataset, role)
    for name in dict.fromkeys((role, start)):
        if name not in (cfg.get("models") or {}):
            raise ConfigError(f"models.{name}: not configured. Fix: add the role under models")
    out_dir = Path(out_dir)
    manifests = Path(manifests)
    if start != role:   # training.start_roles: this dataset's runs of `role` start from another role's model
        cfg = copy.deepcopy(dict(cfg))
        cfg["models"][role] = {**cfg["models"][start], **{k: v for k, v in cfg["models"][role].items()
                                                          if k == "display_name"}}
    eval_cfg = copy.deepcopy(dict(cfg))
    if mixture != ZEROSHOT:
        manifest = manifests / f"{mixture}.parquet"
        frame = read_manifest(manifest)
        run_cfg = copy.deepcopy(dict(cfg))
        run_cfg["training"] = training_section(s, role, int((frame["split"] == "train").sum()))
        ev_runs.run_one(run_cfg, manifest, mixture, seed, data_seed, out_dir, progress=progress, default_eval=False,
                        role=role, experiment=experiment(dataset, role), train=True)
        eval_cfg["models"][role] = {**eval_cfg["models"][role], "source": str(out_dir / "checkpoint")}
    depth = s["evaluation"]["blip_rerank_k"]          # BLIP roles: ITC top k re-ranked by ITM (null: ITC only)
    if isinstance(depth, Mapping):
        depth = depth[dataset]
    metrics = evaluation.evaluate(eval_cfg, role, gallery, manifests / "queries.parquet", s["evaluation"]["ks"],
                                  progress=progress, normaliser=s["evaluation"]["odmap_normaliser"], rerank_k=depth)
    rows = pd.DataFrame([{"experiment": experiment(dataset, role), "mixture": mixture, "seed": int(seed),
                          "data_seed": int(data_seed), "metric": k, "value": float(v)} for k, v in metrics.items()],
                        columns=RUN_COLUMNS)
    write_csv(out_dir / "metrics.csv", rows)
    return rows


def runs(s: dict) -> list[tuple[str, str, str, int]]:
    """Every (dataset, role, mixture, seed) of the configuration (zero-shot once, at the first seed, for roles
    with a pre-trained model: not VSE++, :func:`.settings.has_zeroshot`)."""
    out = []
    pairs = seed_pairs(s)
    for dataset in s["data"]["datasets"]:
        for role in s["training"]["models"]:
            if s["training"]["zeroshot"] and has_zeroshot(s, role):
                out.append((dataset, role, ZEROSHOT, pairs[0][0]))
            for mixture in mixtures(s, dataset, role):
                out += [(dataset, role, mixture, seed) for seed, _ in pairs]
    return out


# --------------------------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------------------------
def _model(role: str, labels: Mapping[str, str] | None = None) -> str:
    return (labels or {}).get(role) or MODEL_LABELS.get(role, role)


def _row_label(role: str, mixture: str, s: dict, labels: Mapping[str, str] | None = None) -> str:
    name = _model(role, labels)
    if mixture == ZEROSHOT:
        return f"{name} (zeroshot)"
    if mixture == FINETUNE:   # the paper's rows: "CLIP (finetune)", but plain "VSE++" (it has no zero-shot row)
        return f"{name} (finetune)" if has_zeroshot(s, role) else name
    if mixture == OURS:
        return f"{name} + Ours"
    if mixture == D_S:
        return f"{name}: D_s (|D_s| = |D'|)"
    if mixture == D_PRIME:
        return f"{name}: D' only"
    spec = s["mixtures"]["variants"].get(mixture)
    if spec:
        return f"{name}: D + D' ({TEXT_LABELS[spec['text']]}, {IMAGE_LABELS[spec['image']]})"
    r = ratio_of(mixture)
    return f"{name}: D + D'sub (|D'sub|/|D| = {r:g})" if r is not None else mixture


def _by_dataset(summary: pd.DataFrame, s: dict, roles, mixtures,
                labels: Mapping[str, str] | None = None) -> tuple[pd.DataFrame, list[str], pd.DataFrame]:
    """Summary rows re-keyed as experiment = dataset label, mixture = ``role:mixture`` (one block per model)."""
    frames, order, info = [], [], []
    for role in roles:
        for dataset in s["data"]["datasets"]:
            part = summary[summary["experiment"] == experiment(dataset, role)].copy()
            part["experiment"] = DATASET_LABELS.get(dataset, dataset)
            part["mixture"] = role + ":" + part["mixture"].astype(str)
            part["baseline"] = role + ":" + part["baseline"].astype(str)
            frames.append(part)
        for m in mixtures:
            key = f"{role}:{m}"
            if any((f["mixture"] == key).any() for f in frames):
                order.append(key)
                info.append({"mixture": key, "label": _row_label(role, m, s, labels)})
    frame = pd.concat(frames, ignore_index=True) if frames else summary.iloc[0:0]
    return frame, order, pd.DataFrame(info, columns=["mixture", "label"])


def _metric_columns(frame: pd.DataFrame, names) -> list[str]:
    present = set(zip(frame["experiment"], frame["metric"]))
    return [f"{e}:{m}" for e in dict.fromkeys(frame["experiment"]) for m in names if (e, m) in present]


#: Tables 1-2's model blocks in the paper's order (by recipe): VSE++, CLIP, BLIP
PAPER_RECIPE_ORDER = ("vsepp", "clip", "blip")


def paper_row_order(s: dict) -> list[str]:
    """The roles of ``training.models`` in the paper's row order (VSE++, CLIP, BLIP by recipe; roles of one recipe
    in the configuration's order)."""
    models = s["training"]["models"]
    return sorted(models, key=lambda r: PAPER_RECIPE_ORDER.index(models[r]) if models[r] in PAPER_RECIPE_ORDER
                  else len(PAPER_RECIPE_ORDER))


def paper_tables(summary: pd.DataFrame, s: dict,
                 labels: Mapping[str, str] | None = None) -> list[tuple[str, object]]:
    """``[(title, PaperTable)]`` of Tables 1-3 and Figure 4's numbers; ``labels``: role -> display name."""
    from ...tables import build_table

    ks = [int(k) for k in s["evaluation"]["ks"]]
    roles = paper_row_order(s)
    out = []
    main = [ZEROSHOT, FINETUNE, OURS]
    frame, order, info = _by_dataset(summary, s, roles, main, labels)
    if order:
        for title, names in (
                ("Table 1: object decorrelation (ODmAP@k)", [f"ODmAP@{k}" for k in ks]),
                ("Table 2: standard retrieval, image→text (TR) and text→image (IR)",
                 [f"TR@{k}" for k in ks] + [f"IR@{k}" for k in ks])):
            cols = _metric_columns(frame, names)
            if cols:
                out.append((title, build_table(frame, metrics=cols, mixture_order=order, mixture_info=info,
                                               row_header="Model")))
    mx = s["mixtures"]
    t3 = [FINETUNE] + [m for m in mx["table3"] if m != OURS] + [OURS]   # Table 3: D first, NP removal + inpaint last
    frame, order, info = _by_dataset(summary[summary["experiment"].isin(
        [experiment(d, r) for d in mx["table3_datasets"] for r in mx["table3_models"]])],
        {**s, "data": {**s["data"], "datasets": [d for d in s["data"]["datasets"] if d in mx["table3_datasets"]]}},
        [r for r in roles if r in mx["table3_models"]], t3, labels)
    cols = _metric_columns(frame, [f"ODmAP@{k}" for k in ks])
    if len(order) > 2 and cols:
        out.append(("Table 3: synthesis of D' (text, image)", build_table(
            frame, metrics=cols, mixture_order=order, mixture_info=info, row_header="Training data")))
    datasets = [d for d in s["data"]["datasets"] if d in mx["appendix_b_datasets"]]
    b_roles = [r for r in roles if r in mx["appendix_b_models"]]
    frame, order, info = _by_dataset(summary[summary["experiment"].isin(
        [experiment(d, r) for d in datasets for r in b_roles])], {**s, "data": {**s["data"], "datasets": datasets}},
        b_roles, [ZEROSHOT, D_S, D_PRIME, OURS], labels)
    cols = _metric_columns(frame, ["ODmAP@1", "TR@1"])
    if any(m.endswith(":" + D_S) or m.endswith(":" + D_PRIME) for m in order) and cols:
        out.append(("Appendix B: D_s (|D_s| = |D'|) vs D' vs D + D' (ODmAP@1, image→text R@1)", build_table(
            frame, metrics=cols, mixture_order=order, mixture_info=info, row_header="Training data")))
    return out


def ratio_points(summary: pd.DataFrame, s: dict) -> pd.DataFrame:
    """Figure 4's points: per (dataset, role) of the sweep, ratio (0 = finetune), metric, mean, std, n."""
    mx = s["mixtures"]
    rows = []
    for dataset in mx["ratio_datasets"]:
        for role in mx["ratio_models"]:
            part = summary[summary["experiment"] == experiment(dataset, role)]
            for rec in part.itertuples(index=False):
                r = 0.0 if rec.mixture == FINETUNE else ratio_of(str(rec.mixture))
                if r is None or rec.metric not in ("TR@1", "ODmAP@1"):
                    continue
                rows.append({"dataset": dataset, "role": role, "ratio": r, "metric": rec.metric,
                             "mean": float(rec.mean), "std": float(rec.std), "n": int(rec.n)})
    return pd.DataFrame(rows, columns=["dataset", "role", "ratio", "metric", "mean", "std", "n"]) \
        .sort_values(["dataset", "role", "metric", "ratio"], kind="stable")


def points_shown(points: pd.DataFrame, labels: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Figure 4's points as the tables show them: datasets and models by the paper's names (MS-COCO, CLIP),
    metrics as Figure 4 labels them (R@1), headed in words instead of the CSV's column keys."""
    names = {"TR@1": "R@1", "ODmAP@1": "ODmAP@1"}
    shown = points.assign(dataset=points["dataset"].map(lambda d: DATASET_LABELS.get(d, d)),
                          role=points["role"].map(lambda r: _model(r, labels)), metric=points["metric"].map(lambda m: names.get(m, m)))
    return shown.rename(columns={"dataset": "Dataset", "role": "Model", "ratio": "Ratio", "metric": "Metric",
                                 "mean": "Mean", "std": "Std", "n": "Runs"})


def plot_ratios(points: pd.DataFrame, out, labels: Mapping[str, str] | None = None) -> Path:
    """Figure 4: R@1 (image→text) and ODmAP@1 against |D'_sub| / |D|, mean ± std over seeds."""
    plt = render.pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    styles = {"TR@1": ("R@1", "o-"), "ODmAP@1": ("ODmAP@1", "s--")}
    for (dataset, role, metric), g in points.groupby(["dataset", "role", "metric"], sort=False):
        label, style = styles[metric]
        ax.errorbar(g["ratio"], g["mean"], yerr=g["std"].fillna(0.0), fmt=style, capsize=3,
                    label=f"{label} ({_model(role, labels)}, {DATASET_LABELS.get(dataset, dataset)})")
    ax.set_xlabel("|D'sub| / |D|")
    ax.set_ylabel("%")
    ax.grid(alpha=0.3)
    if len(points):
        ax.legend(fontsize=7)
    fig.tight_layout()
    from ...io import save_figure  # local: tests patch io.save_figure

    out = save_figure(out, fig)
    plt.close(fig)
    return out


NORMALISER_NOTES = {"hits_in_top_k": "correct captions inside the top k (the paper's reference [52])",
                    "min_k_relevant": "min(k, correct captions in the gallery) (ours)",
                    "relevant": "correct captions in the gallery"}


def normaliser_note(summary: pd.DataFrame) -> str:
    """One line naming the AP@k normaliser(s) the summarised ODmAP@k results were computed with."""
    prefix = evaluation.normaliser_metric("")
    names = sorted({str(m)[len(prefix):] for m in summary["metric"].astype(str) if str(m).startswith(prefix)})
    if not names:
        return "ODmAP@k AP@k normaliser: not recorded"
    return "ODmAP@k AP@k normaliser: " + "; ".join(f"{n} ({NORMALISER_NOTES.get(n, n)})" for n in names)


def write_tables(summary_path, cfg, out_md, out_tex, out_csv, out_figure, out_html=None, labels=None) -> None:
    """Tables 1-3 (Markdown, LaTeX, CSV of every cell and, with ``out_html``, one HTML page: what the Snakemake
    report shows) and Figure 4 (PNG) from a summary CSV; ``labels``: role -> display name (the config's)."""
    import dataclasses
    import html

    from ...tables import describe, read_summary, render_latex, render_markdown, to_frame

    s = settings(cfg)
    summary = read_summary(summary_path)
    tables = paper_tables(summary, s, labels)
    points = ratio_points(summary, s)
    title = "Spurious correlations in cross-modal retrieval (Kim et al. 2023)"
    md = [f"# {title}", "", normaliser_note(summary), ""]
    tex, frames, pages = [], [], [f'<p class="note">{html.escape(md[2])}</p>']
    for name, table in tables:
        md.append(render_markdown(table, name))
        tex.append(render_latex(table, name))
        pages.append(render_html(describe(table, name)))
        frames.append(to_frame(table).assign(table=name))
    if len(points):
        figure4 = "Figure 4: R@1 (image→text) and ODmAP@1 against |D'sub| / |D| (ratio 0 = finetune)"
        shown = describe_frame(points_shown(points, labels), ".2f")
        md += [f"**{figure4}**", "", markdown_body(shown), ""]
        pages.append(render_html(dataclasses.replace(shown, title=figure4)))
    write_text(out_md, "\n".join(md) + "\n")
    if out_html:
        write_text(out_html, html_page(title, pages))
    write_text(out_tex, "\n".join(tex) + "\n")
    write_csv(out_csv, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
    plot_ratios(points, out_figure, labels)
