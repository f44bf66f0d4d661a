"""Issue 44 item 5: CVLD's figure flaws seen in the demo report: Figure 5's log-axis tick labels overlapped
("3×10⁰4×10⁰"), Figure 10's legend covered the bars, Figure 4 had no y-label, BLIP^PT showed its caret."""

from __future__ import annotations

import pandas as pd

from counterfactory.render import pyplot
from counterfactory.studies.cvld import tables as T


def test_k_axis_is_ticked_at_the_ks_as_plain_numbers_and_labels_have_superscripts():
    plt = pyplot()
    fig, ax = plt.subplots()
    g = pd.DataFrame({"k": [2, 4, 8, 16], "mean": [0.7, 0.7, 0.4, 0.2], "std": [0.0, 0.0, float("nan"), 0.1]})
    T._k_curves(ax, [("coco100 BLIP^PT", g)], "MaxSkew@K", "Figure 5 (left)", True, 7)
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4", "8", "16"]
    assert ax.xaxis.get_minorticklocs().size == 0                     # no 3×10⁰, 4×10⁰ minor labels
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["coco100 BLIP$^{\\mathrm{PT}}$"]
    plt.close(fig)


def test_figure4_has_a_y_label_and_figure10_keeps_its_legend_off_the_bars(tmp_path):
    summary = pd.DataFrame({"experiment": ["classification_k2"] * 4, "metric": ["DEO", "AP", "DEO", "AP"],
                            "mixture": ["base", "base", "cvld", "cvld"], "mean": [12.5, 49.0, 0.0, 50.7],
                            "std": [17.7, 1.5, 0.0, 1.1]})
    s = {"classification": {"figure4_shots": 2, "train": {"lam": 1.0}}}
    closed = []
    real = pyplot()

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def close(self, fig):
            closed.append(fig)

    import counterfactory.render as render

    orig = render.pyplot
    render.pyplot = lambda: Recording()
    try:
        T.figure4(summary, s, tmp_path / "figure4.png")
        runs = tmp_path / "runs" / "coco100" / "cvld" / "seed0"
        runs.mkdir(parents=True)
        pd.DataFrame({"k": [4, 4, 8], "query": ["a photo of a good person", "mean", "a photo of a good person"],
                      "bias": [1.0, 0.0, 0.5]}).to_csv(runs / "fairface.csv", index=False)
        T.figure10([runs], s, tmp_path / "figure10.png")
    finally:
        render.pyplot = orig
    fig4, fig10 = closed
    assert [a.get_ylabel() for a in fig4.axes] == ["DEO (%)", "AP (%)"]     # against K (issue 43 item 13)
    ax = fig10.axes[0]
    fig10.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1                       # beside the axes, not over the bars
    for fig in closed:
        real.close(fig)
