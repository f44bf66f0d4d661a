"""Figures for the report: counterfactual image pairs with their captions and CLIP scores, and the
headless matplotlib entry point shared by every figure (:func:`pyplot`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd

from .io import save_figure


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (figures are only saved to files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pair_grid(pairs_path: str | Path, out: str | Path, n: int = 8, wrap: int = 38) -> Path:
    """Original vs counterfactual image of the first ``n`` selected pairs, captions (changed word marked)
    and CLIP scores (image-caption sims, image-image sim, directional sim) underneath."""
    from PIL import Image

    from .evaluation.readers import read_pairs

    plt = pyplot()
    rows = read_pairs(pairs_path).head(n)  # image paths resolved against the table's folder
    fig, axes = plt.subplots(len(rows), 2, figsize=(6.4, 3.1 * len(rows)), squeeze=False)
    for ax_row, (_, r) in zip(axes, rows.iterrows()):
        for k, ax in enumerate(ax_row):
            with Image.open(r[f"image_{k}"]) as im:
                ax.imshow(im.convert("RGB"))
            ax.set_xticks([])
            ax.set_yticks([])
            caption = r[f"caption_{k}"]
            word = r.get("original_word" if k == 0 else "new_word")
            if isinstance(word, str):
                caption = caption.replace(word, word.upper(), 1)
            score = r.get(f"sim_{k}")
            ax.set_title("\n".join(textwrap.wrap(caption, wrap)), fontsize=8)
            if score is not None:
                extra = f"CLIP(img, cap) {score:.3f}"
                if k == 1 and "sim_direction" in r:
                    extra += f"\nCLIP_dir {r['sim_direction']:.3f}, img-img {r['sim_image']:.3f}"
                ax.set_xlabel(extra, fontsize=7)
        ax_row[0].set_ylabel(str(r["id"]), fontsize=8)
    fig.suptitle("COCO-Counterfactuals pairs: original (left) vs counterfactual (right)", fontsize=9)
    fig.tight_layout()
    return save_figure(out, fig)


def caption_examples(captions_path: str | Path, out: str | Path, n: int = 20) -> Path:
    """A table (CSV) of original vs counterfactual captions with similarity and perplexity."""
    from .io import write_csv

    frame = pd.read_parquet(captions_path)
    cols = ["caption_id", "original", "counterfactual", "original_word", "new_word", "similarity", "perplexity"]
    return write_csv(out, frame[cols].head(n).round({"similarity": 3, "perplexity": 1}))
