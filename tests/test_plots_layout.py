"""Image-regression checks of the report's figures (issue 32, item 6): rendered text boxes must not collide.

Each figure is drawn from tiny synthetic inputs through its real function; the figure is intercepted at save time and
:func:`counterfactory.plots.text_overlaps` compares the rendered bounding boxes (Agg renderer,
``artist.get_window_extent``) of the suptitle, the axes and their texts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from counterfactory import io, plots
from counterfactory.export import formats


@pytest.fixture
def drawn(monkeypatch):
    """Figures saved during the test, each with its text overlaps (checked before saving)."""
    seen = []
    save = io.save_figure

    def capture(target, fig, *a, **kw):
        seen.append((fig, plots.text_overlaps(fig)))
        return save(target, fig, *a, **kw)

    monkeypatch.setattr(io, "save_figure", capture)
    monkeypatch.setattr(plots, "save_figure", capture)
    return seen


def _png(path, color, size=(48, 48)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def test_text_overlaps_finds_a_suptitle_over_the_first_row():
    """The check itself: tight_layout without room for the suptitle (the old pair grid) is caught."""
    plt = plots.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(3, 3))
    for ax in axes.flat:
        ax.imshow(np.zeros((4, 4)))
        ax.set_title("a caption\nof two lines", fontsize=8)
    fig.tight_layout()
    fig.suptitle("A suptitle placed without room for it", fontsize=9, y=0.97)
    assert any("suptitle" in o for o in plots.text_overlaps(fig))
    plt.close(fig)


def test_pair_grid_title_clears_the_first_row(tmp_path, drawn):
    rows = []
    for i in range(8):                   # the report's eight pairs: a tall figure, where tight_layout failed
        rows.append({"id": f"p{i}", "caption_0": "a man riding a horse on a beach near the sea at sunset today "
                                                 "with his friends",
                     "caption_1": "a man riding a camel on a beach near the sea at sunset today",
                     "image_0": str(_png(tmp_path / f"a{i}.png", (200, 0, 0))),
                     "image_1": str(_png(tmp_path / f"b{i}.png", (0, 200, 0))),
                     "original_word": "horse", "new_word": "camel", "sim_0": 0.3, "sim_1": 0.31,
                     "sim_direction": 0.25, "sim_image": 0.8})
    pd.DataFrame(rows).to_parquet(tmp_path / "pairs.parquet")
    plots.pair_grid(tmp_path / "pairs.parquet", tmp_path / "grid.png", n=8)
    (_, overlaps), = drawn
    assert overlaps == []


def _social_export(tmp_path, members=10, candidates=2):
    rows = []
    for s in range(2):
        for c in range(candidates):
            for m in range(members):
                rows.append({"item_id": f"s{s}-c{c}-m{m}", "set_id": f"s{s}", "candidate_index": c,
                             "member_index": m, "caption": f"a photo of person {m}",
                             "image": str(_png(tmp_path / "src" / f"{s}{c}{m}.png", (10 * m, 20 * c, 0)))})
    table = formats.ExportTable("default", pd.DataFrame(rows), ("image",), "item_id", base=tmp_path / "src")
    return formats.write_imagefolder([table], tmp_path / "social" / "export" / "imagefolder")


def test_social_examples_grid_has_one_set_per_row(tmp_path, drawn):
    """SocialCF: a row is one counterfactual set (10 members), not 12 panels spilling into the next candidate;
    no "default" row label; the title is the caller's, not a results path."""
    _social_export(tmp_path)
    plots.export_grid(tmp_path / "social" / "export" / "imagefolder", tmp_path / "ex.png", n=2,
                      title="SocialCounterfactuals: exported examples")
    (fig, overlaps), = drawn
    assert overlaps == []
    rows = {round(ax.get_position().y0, 3) for ax in fig.axes}
    assert len(fig.axes) == 2 * 10 and len(rows) == 2              # 2 sets x 10 members, one row each
    titles = [ax.get_title() for ax in fig.axes[:10]]
    assert titles == [f"a photo of person {m}" for m in range(10)]
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "default" not in texts
    assert fig._suptitle.get_text() == "SocialCounterfactuals: exported examples"
    assert "/" not in fig._suptitle.get_text()


def test_pair_examples_grid_title_clears_the_first_row(tmp_path, drawn):
    """CVLD-style examples: original vs edited images with long prompts (four-line titles) under the suptitle."""
    rows = pd.DataFrame({"item_id": ["e0", "e1"], "edit_prompt": ["make the person a woman with long hair " * 3] * 2,
                         "original": [str(_png(tmp_path / "src" / f"o{k}.png", (0, 0, 99))) for k in range(2)],
                         "edited": [str(_png(tmp_path / "src" / f"e{k}.png", (99, 0, 0))) for k in range(2)]})
    formats.write_imagefolder([formats.ExportTable("celeba", rows, ("original", "edited"), "item_id",
                                                   base=tmp_path / "src")], tmp_path / "if")
    plots.export_grid(tmp_path / "if", tmp_path / "ex.png")
    (fig, overlaps), = drawn
    assert overlaps == []
    assert fig._suptitle.get_text() == "Exported examples"


def test_training_curves_have_a_seed_legend_and_integer_steps(tmp_path, drawn):
    from counterfactory.training.runs import plot_curves

    paths = []
    for mixture in ("mscoco", "base"):                     # configured order, not alphabetical
        for seed in (107, 108):
            p = tmp_path / mixture / f"seed{seed}" / "history.csv"
            p.parent.mkdir(parents=True)
            pd.DataFrame({"step": [1, 2, 3], "train_loss": [1.0, 0.8, 0.7],
                          "val_loss": [np.nan, 0.9, np.nan]}).to_csv(p, index=False)
            paths.append(p)
    plot_curves(paths, tmp_path / "curves.png")
    (fig, overlaps), = drawn
    assert overlaps == []
    assert [ax.get_title() for ax in fig.axes] == ["mscoco", "base"]
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["seed 107", "seed 108"]
        fig.canvas.draw()
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)


def test_adaptive_curve_labels_do_not_overprint(tmp_path, drawn):
    """Rules of equal cost and score (the usual case in a small run) once had their labels printed on top of each
    other; each rule is now named in a legend."""
    from counterfactory.generation.adaptive import CURVE_COLUMNS, plot_curve

    rows = [{c: 0 for c in CURVE_COLUMNS} | {"rule": f"rule_{k}", "in_stage": k == 0, "unet_evals_per_accepted": 10.0,
                                              "selected_median": 0.3, "selected_q25": 0.25, "selected_q75": 0.35,
                                              "selection_changed": 0.0} for k in range(4)]
    plot_curve(pd.DataFrame(rows), tmp_path / "curve.png")
    (fig, overlaps), = drawn
    assert overlaps == []
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert len(labels) == 4 and len(set(labels)) == 4
