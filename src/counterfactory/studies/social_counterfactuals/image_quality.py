"""§10.3's image-quality table: FID against ImageNet and LAION-2B, and the Inception Score, of SocialCounterfactuals
(the images that pass the three filters), VisoGender and PATA (the real-image bias benchmarks of §5.3).

The sets and references come from ``image_quality`` (``datasets``: the table's rows; ``references``: name ->
image folder, e.g. ``ImageNet: {classification}/imagenet/val``; a reference set to null is left out, with the
reason in the table's note); the features from the shared stage :mod:`counterfactory.evaluation.image_quality`.
The paper does not say how many reference images, which Inception weights or how many IS splits it used: those
are ours (``limit_images``, the ``inception`` role, ``splits``), and the page says so.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from ...config import fill_section
from ...device import from_config
from ...errors import ConfigError
from ...evaluation import image_quality as iq
from ...io import write_csv, write_text
from ...models import registry
from ...render import describe_frame, html_page, render_html, render_markdown
from . import STUDY
from .external import configured, image_paths
from .filter_io import read_images

#: the table's rows (§10.3): the study's filtered images and the two real-image datasets of §5.3
DATASETS = {"social_counterfactuals": "SocialCounterfactuals", "visogender": "VisoGender", "pata": "PATA"}
#: §10.3's printed table (FID vs ImageNet, FID vs LAION-2B, IS), for the page's side-by-side
PAPER = {"VisoGender": (130.44, 113.45, 6.2), "PATA": (116.29, 98.34, 11.3),
         "SocialCounterfactuals": (106.83, 89.91, 12.07)}


def settings(view: Mapping | None) -> dict:
    s = fill_section(f"{STUDY}.image_quality", (view or {}).get("image_quality"))
    bad = [d for d in s["datasets"] if d not in DATASETS]
    if bad:
        raise ConfigError(f"{STUDY}.image_quality.datasets: unknown {bad}. Fix: use {', '.join(DATASETS)}")
    return s


def references(view: Mapping | None) -> dict[str, str]:
    """Reference name -> image folder, the configured ones (null = left out)."""
    return {name: path for name, path in (settings(view)["references"] or {}).items() if path}


def datasets(view: Mapping | None) -> list[str]:
    """The table's rows: ``datasets``, less PATA / VisoGender where ``probing`` does not name their files."""
    return [d for d in settings(view)["datasets"] if d == "social_counterfactuals" or configured(view, d)]


def set_names(view: Mapping | None) -> list[str]:
    """Every image set whose features the table needs: its rows, then the references (``ref_<i>``)."""
    return datasets(view) + [f"ref_{i}" for i, _ in enumerate(references(view))]


def set_images(view: Mapping, name: str, kept: str | None = None) -> list[str]:
    """The image files of set ``name`` (:func:`set_names`): the kept images (``kept``: filter/kept.parquet), the
    PATA / VisoGender images of ``probing``, or a reference folder; the first ``limit_images`` when set."""
    limit = settings(view)["limit_images"]
    if name.startswith("ref_"):
        refs = list(references(view).values())
        return iq.folder_images(refs[int(name[4:])], limit)
    if name == "social_counterfactuals":
        if not kept:
            raise ConfigError("image quality of SocialCounterfactuals needs the kept images (--kept "
                              "filter/kept.parquet). Fix: pass it")
        paths = list(dict.fromkeys(read_images(kept)["image_path"]))
    elif name in ("pata", "visogender"):
        paths = image_paths(view, name)
    else:
        raise ConfigError(f"unknown image-quality set {name!r}. Fix: use one of {', '.join(set_names(view))}")
    return paths[:limit] if limit else paths


def table(view: Mapping, features: Mapping[str, str]) -> pd.DataFrame:
    """One row per dataset: ``n_images``, ``FID (<reference>)`` per configured reference, ``IS`` and ``IS std``;
    ``features``: set name -> its features file."""
    s = settings(view)
    refs = {ref: iq.load_features(features[f"ref_{i}"])[0] for i, ref in enumerate(references(view))}
    rows = []
    for name in datasets(view):
        feats, logits, paths = iq.load_features(features[name])
        row = {"dataset": DATASETS[name], "n_images": len(paths)}
        for ref, ref_feats in refs.items():
            row[f"FID ({ref})"] = iq.fid(feats, ref_feats)
        row["IS"], row["IS std"] = iq.inception_score(logits, splits=s["splits"], seed=s["seed"])
        rows.append(row)
    return pd.DataFrame(rows)


def paper_table(view: Mapping, frame: pd.DataFrame):
    """The table as §10.3 prints it, the paper's numbers beside ours (a :class:`~counterfactory.render.Table`)."""
    s = settings(view)
    left_out = [n for n, p in (s["references"] or {}).items() if not p]
    paper = pd.DataFrame([{"dataset": d, "paper FID (ImageNet)": v[0], "paper FID (LAION-2B)": v[1],
                           "paper IS": v[2]} for d, v in PAPER.items()])
    t = describe_frame(frame.merge(paper, on="dataset", how="left"), floatfmt=".2f")
    t.title = "Image quality of SocialCounterfactuals, VisoGender and PATA (§10.3)"
    note = (f"FID: lower is better; IS: higher is better (mean and std over {s['splits']} splits). Features: the "
            "inception role. Ours, not stated in the paper: the Inception weights, the reference sample"
            + (f" (the first {s['limit_images']} images of each set)" if s["limit_images"] else "")
            + " and the number of IS splits; absolute values are comparable only under the same weights.")
    if left_out:
        note += (f" Not computed: FID against {', '.join(left_out)} (image_quality.references is null there: point "
                 "it at a folder of its images).")
    t.note = note
    return t


# ------------------------------------------------------------------------------------------- the steps' files


def features_files(view: Mapping, name: str, kept: str | None, out, *, progress: bool = True) -> dict:
    """``social image-quality-features``: the inception role's pool features and logits of image set ``name``,
    written to ``out`` (npz); returns the counts (images, features, classes)."""
    paths = set_images(view, name, kept)
    device, _ = from_config(view)
    model = registry.load(view, "inception")
    feats, logits = iq.extract(model, paths, batch_size=settings(view)["batch_size"], device=device,
                               progress=progress)
    iq.save_features(out, feats, logits, paths)
    return {"images": len(paths), "features": feats.shape[1], "classes": logits.shape[1]}


def table_files(view: Mapping, items, out_csv, out_md, out_html=None) -> str:
    """``social image-quality-table``: §10.3's table of the features files ``items`` (``NAME=FILE.npz``, one per
    set), written as CSV (our values), Markdown and optionally HTML; returns the Markdown."""
    features = {}
    for item in items:
        set_name, sep, path = item.partition("=")
        if not sep or not path:
            raise ConfigError(f"--features {item!r}: expected NAME=FILE.npz. Fix: e.g. --features pata=pata.npz")
        features[set_name] = path
    missing = [n for n in set_names(view) if n not in features]
    if missing:
        raise ConfigError(f"--features lacks {', '.join(missing)}. Fix: run image-quality-features for them")
    frame = table(view, features)
    paper = paper_table(view, frame)
    write_csv(out_csv, frame)
    text = render_markdown(paper)
    write_text(out_md, text)
    if out_html:
        write_text(out_html, html_page(paper.title, [render_html(paper)]))
    return text
