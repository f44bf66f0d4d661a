"""Stand-in data of the right shape for dry runs of the paper configuration (tests, DAG benchmarks,
sizing an allocation before the data is downloaded). Nothing here is read as real data: images are
empty files, datasets empty folders at their configured paths."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def fake_coco_root(root: Path, n_captions: int, n_images: int, width: int = 640, height: int = 480) -> Path:
    """COCO 2017 layout: annotations/captions_val2017.json, instances_val2017.json, val2017/*.jpg (empty).
    Captions go round-robin, so every image gets n_captions // n_images and the first few one more."""
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "val2017").mkdir(exist_ok=True)
    images, anns = [], []
    for i in range(1, n_images + 1):
        name = f"{i:012d}.jpg"
        images.append({"id": i, "file_name": name, "width": width, "height": height, "license": 1,
                       "coco_url": "", "flickr_url": "", "date_captured": ""})
        (root / "val2017" / name).write_bytes(b"")
    for k in range(n_captions):
        anns.append({"id": k + 1, "image_id": k % n_images + 1, "caption": f"A dog number {k} sits on a wooden table."})
    doc = {"info": {}, "licenses": [], "images": images, "annotations": anns}
    (root / "annotations" / "captions_val2017.json").write_text(json.dumps(doc))
    (root / "annotations" / "instances_val2017.json").write_text(json.dumps(
        {**doc, "annotations": [], "categories": [{"id": 18, "name": "dog", "supercategory": "animal"}]}))
    return root


def _karpathy_doc(dataset: str, images: list[tuple[str, str, str, int]]) -> dict:
    """A Karpathy split file: (filepath, filename, split, id) per image, one sentence each."""
    out = []
    for k, (fp, fn, split, image_id) in enumerate(images):
        record = {"filename": fn, "imgid": k, "split": split, "sentids": [k],
                  "sentences": [{"raw": f"A dog number {k} sits on a table.", "tokens": ["a", "dog"], "imgid": k,
                                 "sentid": k}]}
        if fp:
            record["filepath"] = fp
        if dataset == "coco":
            record["cocoid"] = image_id
        out.append(record)
    return {"images": out, "dataset": dataset}


def official_tree(data_root: Path, coco_captions: int = 50, coco_images: int = 120, per_split: int = 3) -> Path:
    """Every dataset of the data catalogue (:mod:`counterfactory.catalogue`) under ``data_root`` in its official
    layout, with the official file names and a handful of items: empty image files, small but well-formed
    annotation files (the demo's fixtures where a reader needs real rows). For dry runs of the unchanged paper
    config (``data_root: data`` below the working directory) and the DAG benchmark; nothing here is real data."""
    import shutil

    root = Path(data_root)
    demo = Path(__file__).resolve().parents[2] / "resources" / "demo"
    fake_coco_root(root / "coco2017", n_captions=coco_captions, n_images=coco_images)
    # COCO 2014: train2014/ val2014/ and the Karpathy file whose filepath names them
    c14 = root / "coco2014"
    images, instances = [], {"train2014": [], "val2014": []}
    splits = ["train", "restval", "val", "test"]
    for i, split in enumerate(s for s in splits for _ in range(per_split)):
        folder = "train2014" if split == "train" else "val2014"
        image_id = 100 + i
        name = f"COCO_{folder}_{image_id:012d}.jpg"
        (c14 / folder).mkdir(parents=True, exist_ok=True)
        (c14 / folder / name).write_bytes(b"")
        images.append((folder, name, split, image_id))
        instances[folder].append({"id": image_id, "file_name": name, "width": 640, "height": 480})
    (c14 / "annotations").mkdir(exist_ok=True)
    for folder, imgs in instances.items():
        (c14 / "annotations" / f"instances_{folder}.json").write_text(json.dumps(
            {"info": {}, "licenses": [], "images": imgs, "annotations": [],
             "categories": [{"id": 18, "name": "dog", "supercategory": "animal"}]}))
    (c14 / "dataset_coco.json").write_text(json.dumps(_karpathy_doc("coco", images)))
    # Flickr30k (images named as Flickr30k Entities names them) and Flickr30k Entities
    ids = sorted(p.stem for p in (demo / "flickr30k_entities" / "Sentences").glob("*.txt"))
    f30 = root / "flickr30k"
    (f30 / "flickr30k-images").mkdir(parents=True, exist_ok=True)
    for image_id in ids:
        (f30 / "flickr30k-images" / f"{image_id}.jpg").write_bytes(b"")
    kinds = ["train", "val", "test"]
    f_images = [("", f"{image_id}.jpg", kinds[k % 3], k) for k, image_id in enumerate(ids)]
    (f30 / "dataset_flickr30k.json").write_text(json.dumps(_karpathy_doc("flickr30k", f_images)))
    entities = root / "flickr30k_entities"
    for part in ("Sentences", "Annotations"):
        shutil.copytree(demo / "flickr30k_entities" / part, entities / part, dirs_exist_ok=True)
    # nocaps validation (CVLD Table 4): the COCO-caption-format annotation file and its images (empty files)
    nc = root / "nocaps"
    (nc / "images").mkdir(parents=True, exist_ok=True)
    nc_images = [{"id": i, "file_name": f"{i:016x}.jpg", "width": 640, "height": 480} for i in range(3)]
    for img in nc_images:
        (nc / "images" / img["file_name"]).write_bytes(b"")
    (nc / "nocaps_val_4500_captions.json").write_text(json.dumps(
        {"info": {}, "licenses": [], "images": nc_images,
         "annotations": [{"id": 10 * i + j, "image_id": i, "caption": f"caption {j} of image {i}"}
                         for i in range(3) for j in range(2)]}))
    # the rest: the demo's fixtures are already in the official layouts
    for name in ("celeba", "fairface", "looktwice", "winoground", "pata", "visogender", "sugarcrepe",
                 "classification"):
        shutil.copytree(demo / name, root / name, dirs_exist_ok=True)
    (root / "models").mkdir(exist_ok=True)
    return root


def demo_config(repo: Path, workdir: Path, edit=None, name: str | None = None, overlays=(), **top) -> Path:
    """``config/demo.yaml`` of the checkout ``repo`` (merged with the ``overlays``, file names under ``config/``
    such as ``demo_own_data.yaml``) with every data path made absolute (the demo data is reached through
    ``workdir/demo data``, a link with a space in its name, so shell commands must quote paths), so Snakemake
    can run it with ``--directory workdir``. ``edit(section)`` changes the coco_counterfactuals section, ``top``
    shared keys; the file goes to ``workdir/<name>``."""
    from .config import deep_merge

    repo, workdir = Path(repo), Path(workdir)
    cfg = yaml.safe_load((repo / "config" / "demo.yaml").read_text())
    for overlay in overlays:
        cfg = deep_merge(cfg, yaml.safe_load((repo / "config" / overlay).read_text()))
    demo = workdir / "demo data"
    if not demo.exists():
        demo.symlink_to(repo / "resources" / "demo", target_is_directory=True)
    # every dataset of the catalogue through the link (the demo config names no dataset path of its own) ...
    cfg["data_root"] = str(demo)

    def moved(value):   # ... and the few paths it does name (own data, the demo's cuts) too
        if isinstance(value, str) and value.startswith("resources/demo/"):
            return str(demo / Path(value).relative_to("resources/demo"))
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        if isinstance(value, list):
            return [moved(v) for v in value]
        return value

    cfg = moved(cfg)
    study = cfg["coco_counterfactuals"]
    if edit:
        edit(study)
    cfg.update(top)
    path = workdir / (name or "demo-test.yaml")
    # keep the files' key order: table rows follow the order a config lists its mixtures in (Tables 3, 4, 12)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def pair_images(root: Path, words, step: int = 30):
    """Two small noisy 32x32 images per word under ``root`` (original ``<i>_0.png`` and counterfactual ``<i>_1.png``,
    distinct colours) as a trainer manifest frame: captions ``a <word> dog`` / ``a <word> cat``, pair ids ``p<i>``."""
    import numpy as np
    import pandas as pd
    from PIL import Image

    rng = np.random.default_rng(0)
    rows = []
    for i, word in enumerate(words):
        for cf in (0, 1):
            arr = (rng.random((32, 32, 3)) * 60 + (i * step + cf * 100) % 255).astype(np.uint8)
            name = f"{i}_{cf}.png"
            Image.fromarray(arr).save(Path(root) / name)
            rows.append({"image_path": name, "caption": f"a {word} {'dog' if cf == 0 else 'cat'}",
                         "is_counterfactual": bool(cf), "pair_id": f"p{i}"})
    return pd.DataFrame(rows)
