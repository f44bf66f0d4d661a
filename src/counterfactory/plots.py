"""Figures for the report: counterfactual image pairs with their captions and CLIP scores, and the
headless matplotlib entry point shared by every figure (:func:`pyplot`)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd

from .errors import input_error
from .evaluation.readers import read_pairs
from .io import save_figure, write_csv
from .render import pyplot
from .rgb import to_rgb


def pair_grid(pairs_path: str | Path, out: str | Path, n: int = 8, wrap: int = 38) -> Path:
    """Original vs counterfactual image of the first ``n`` selected pairs, captions (changed word marked)
    and CLIP scores (image-caption sims, image-image sim, directional sim) underneath."""
    from PIL import Image

    plt = pyplot()
    rows = read_pairs(pairs_path).head(n)  # image paths resolved against the table's folder
    # constrained layout reserves the suptitle's height (tight_layout let it overprint the first row's captions)
    fig, axes = plt.subplots(len(rows), 2, figsize=(6.4, 3.1 * len(rows)), squeeze=False, layout="constrained")
    for ax_row, (_, r) in zip(axes, rows.iterrows()):
        for k, ax in enumerate(ax_row):
            with Image.open(r[f"image_{k}"]) as im:
                ax.imshow(to_rgb(im, r[f"image_{k}"]))
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
    out = save_figure(out, fig)
    plt.close(fig)
    return out


def text_overlaps(fig) -> list[str]:
    """Where rendered text collides in ``fig`` (empty: none): the suptitle against each visible axes' full
    extent (image, title, tick and axis labels), each axes' title against the other axes, and the text
    artists inside one axes (annotations) against each other. Boxes come from the Agg renderer after a draw
    (``artist.get_window_extent``), i.e. what the saved image shows."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    found = []

    def hit(a, b) -> bool:
        return a.width > 0 and a.height > 0 and b.width > 0 and b.height > 0 and a.overlaps(b) \
            and min(a.x1, b.x1) - max(a.x0, b.x0) > 0.5 and min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5

    sup = fig._suptitle
    if sup is not None and sup.get_text():
        box = sup.get_window_extent(renderer)
        found += [f"suptitle {sup.get_text()!r} overlaps axes {i}" for i, ax in enumerate(axes)
                  if hit(box, ax.get_tightbbox(renderer))]
    for i, ax in enumerate(axes):
        title = ax.title
        if title.get_text():
            box = title.get_window_extent(renderer)
            found += [f"title of axes {i} overlaps axes {j}" for j, other in enumerate(axes)
                      if j != i and hit(box, other.get_window_extent(renderer))]
        texts = [t for t in ax.texts if t.get_visible() and t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in texts]
        found += [f"axes {i}: {texts[a].get_text()!r} overlaps {texts[b].get_text()!r}"
                  for a in range(len(texts)) for b in range(a + 1, len(texts)) if hit(boxes[a], boxes[b])]
    return found


def caption_examples(captions_path: str | Path, out: str | Path, n: int = 20) -> Path:
    """A table (CSV) of original vs counterfactual captions with similarity and perplexity."""
    frame = pd.read_parquet(captions_path)
    cols = ["caption_id", "original", "counterfactual", "original_word", "new_word", "similarity", "perplexity"]
    return write_csv(out, frame[cols].head(n).round({"similarity": 3, "perplexity": 1}))


#: text shown under an image that has no caption of its own: the first of these fields present
_GRID_TEXT = ("caption", "target_prompt", "edit_prompt", "category")


def _export_rows(folder: Path) -> pd.DataFrame:
    jsonl, parquet = folder / "metadata.jsonl", folder / "metadata.parquet"
    if jsonl.is_file():
        return pd.read_json(jsonl, lines=True, dtype=False)
    return pd.read_parquet(parquet)


def _grid_groups(rows: pd.DataFrame, images: list[str], n: int) -> list[list[tuple[str, str]]]:
    """Up to ``n`` examples, each a list of (image file, text) panels: a set's members side by side (rows sharing a
    ``set_id``), or one row's image columns (original | counterfactual, image | negative image, ...)."""
    cols = {c: ("file_name" if c == images[0] and "file_name" in rows.columns else f"{c}_file_name") for c in images}
    groups = []
    if "set_id" in rows.columns and len(images) == 1:
        # one counterfactual set = one set_id and candidate (SocialCF keeps several candidates of a set): its
        # members in member order, so a row is exactly one set
        keys = ["set_id"] + [k for k in ("candidate_index",) if k in rows.columns]
        for _, members in list(rows.groupby(keys, sort=False))[:n]:
            if "member_index" in members.columns:
                members = members.sort_values("member_index", kind="stable")
            groups.append([(m[cols[images[0]]], str(m.get("caption", ""))) for _, m in members.iterrows()])
        return groups
    for _, r in rows.head(n).iterrows():
        panels = []
        for k, c in enumerate(images):
            if f"caption_{k}" in r.index:
                text = r[f"caption_{k}"]
            elif c.startswith("negative") and "negative_caption" in r.index:
                text = r["negative_caption"]
            elif c.startswith("original"):
                text = "original"
            else:
                text = next((r[f] for f in _GRID_TEXT if f in r.index and isinstance(r[f], str)), "")
            panels.append((r[cols[c]], f"[{c}] {text}"))
        groups.append(panels)
    return groups


def _manifest(root: Path, manifest: str | Path | None) -> dict:
    """The export's manifest: ``manifest`` (kept outside the dataset folder, so it is not uploaded with it) or the
    folder's own ``manifest.json``."""
    path = Path(manifest) if manifest is not None else root / "manifest.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))

    raise input_error(path, None, "export manifest not found", "write the export with `counterfactory export "
                      "imagefolder` (and pass its --manifest-imagefolder file)")


def export_grid(imagefolder: str | Path, out: str | Path, n: int = 3, wrap: int = 30, max_panels: int = 20,
                title: str | None = None, manifest: str | Path | None = None) -> Path:
    """A study's examples from its exported imagefolder (``counterfactory export imagefolder``): for each dataset
    config, the first ``n`` examples of its first split — pairs, sets, original vs edited or inpainted images — with
    their captions or prompts. One grid serves every study because every study exports the same layout: one row
    per example (a set's members side by side, as many columns as the largest set shown, at most
    ``max_panels``), labelled with its config's name where the export has several. ``title``: the figure's title
    (default: "Exported examples"); ``manifest``: the export's manifest when it is kept outside the folder."""
    from PIL import Image

    root = Path(imagefolder)
    manifest = _manifest(root, manifest)
    title = title or "Exported examples"
    blocks = []
    for name, conf in manifest["configs"].items():
        split = next(iter(conf["splits"].values()), None)
        if not split or not split.get("rows") or name.endswith("_verified"):   # the VQA check's subset: shown already
            continue
        folder = root / split["path"]
        groups = _grid_groups(_export_rows(folder), list(conf["images"]), n)
        blocks.append((name, folder, [g[:max_panels] for g in groups]))
    lines = [(name, folder, g) for name, folder, gs in blocks for g in gs]
    plt = pyplot()
    if not lines:   # a run that kept nothing (e.g. own data whose images no selection rule accepts): say so
        import logging

        msg = (f"no exported examples: every config's first split is empty ({', '.join(manifest['configs'])}); "
               "the study kept no item (see its filter / selection summaries)")
        logging.getLogger(__name__).warning("%s: %s", root, msg)
        fig, ax = plt.subplots(figsize=(6, 1.2), layout="constrained")
        ax.axis("off")
        ax.text(0.5, 0.5, "\n".join(textwrap.wrap(msg, 80)), ha="center", va="center", fontsize=8)
        fig.suptitle(title, fontsize=9)
        out = save_figure(out, fig)
        plt.close(fig)
        return out
    width = max(len(g) for _, _, g in lines)
    named = len(blocks) > 1      # a lone config (often "default") needs no row label
    fig, axes = plt.subplots(len(lines), width, figsize=(2.3 * width, 2.6 * len(lines)), squeeze=False,
                             layout="constrained")
    for ax_row, (name, folder, panels) in zip(axes, lines):
        for ax in ax_row:
            ax.axis("off")
        for ax, (path, text) in zip(ax_row, panels):
            with Image.open(folder / path) as im:
                ax.imshow(to_rgb(im, folder / path))
            ax.set_title("\n".join(textwrap.wrap(text, wrap)[:4]), fontsize=6)
        if named:
            ax_row[0].text(-0.08, 0.5, name, transform=ax_row[0].transAxes, rotation=90, ha="right",
                           va="center", fontsize=7)
    fig.suptitle(title, fontsize=9)
    out = save_figure(out, fig)
    plt.close(fig)
    return out
