"""Evaluation figures: Figure 3 style ITM difference histograms and Table 4 bar charts."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..render import pyplot
from .settings import ITM_METRICS

_ITM_COLORS = {"IR_r": "#1f77b4", "TR_r": "#2ca02c", "IR_c": "#d62728", "TR_c": "#ff7f0e"}


def plot_itm(per_pair: pd.DataFrame, bins: int = 40):
    """Figure 3 style: one panel per model, the distributions of IR_r, TR_r, IR_c, TR_c."""
    plt = pyplot()
    groups = list(per_pair.groupby(["role", "model"], sort=False))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False)
    for ax, ((_, model), g) in zip(axes[0], groups):
        values = g[list(ITM_METRICS)].to_numpy(dtype=float)
        lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
        if not hi > lo:
            lo, hi = lo - 0.5, hi + 0.5
        edges = np.linspace(lo, hi, bins + 1)
        for m in ("IR_r", "TR_r", "IR_c", "TR_c"):
            ax.hist(g[m].to_numpy(dtype=float), bins=edges, histtype="step", linewidth=1.5, density=True,
                    color=_ITM_COLORS[m], label=m.replace("_", "$_") + "$")
        ax.axvline(0.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"{model} (n={len(g)})", fontsize=10)
        ax.set_xlabel("ITM score difference")
        ax.set_ylabel("density")
        ax.legend(fontsize=8, frameon=False)
    fig.suptitle("ITM score differences on COCO-Counterfactuals", fontsize=11)
    fig.tight_layout()
    return fig


def plot_classification(table: pd.DataFrame, metric: str = "top1"):
    """Grouped bars: datasets on the x axis, one bar per model."""
    plt = pyplot()
    cols = [c for c in table.columns if c not in ("model", "role")]
    n_models = len(table)
    width = 0.8 / max(1, n_models)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(cols) + 1), 3.4))
    x = np.arange(len(cols))
    for i, (_, r) in enumerate(table.iterrows()):
        ax.bar(x + (i - (n_models - 1) / 2) * width, [r[c] for c in cols], width, label=r["model"])
    ax.set_xticks(x, cols, rotation=20)
    ax.set_ylabel(f"{metric.replace('top', 'top-')} accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title("Zero-shot classification")
    fig.tight_layout()
    return fig
