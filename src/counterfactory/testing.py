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


def fake_evaluation_data(workdir: Path, config_path: Path, study: str = "coco_counterfactuals") -> list[Path]:
    """Empty stand-ins, under ``workdir``, for every evaluation dataset ``config_path`` names with a
    relative path (classification roots and class files, the retrieval split and its images)."""
    section = yaml.safe_load(Path(config_path).read_text())[study]
    made = []

    def touch(rel: str, folder: bool) -> None:
        path = workdir / rel
        if Path(rel).is_absolute() or path.exists():
            return
        if folder:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}" if rel.endswith(".json") else "")
        made.append(path)

    from .data.classification import LAYOUTS

    for spec in section.get("evaluation", {}).get("classification", {}).get("datasets", {}).values():
        touch(spec["root"], True)
        layout = LAYOUTS.get(spec.get("format"))
        for need in (layout.needs if layout else ()):
            folder = need == "images"  # the rest are files (CIFAR pickles, Food-101 meta/*.json)
            touch(str(Path(spec["root"]) / need), folder)
        for key in ("class_index", "class_names"):
            if spec.get(key) and not str(spec[key]).startswith("builtin:") and spec[key] != "torchvision":
                touch(spec[key], False)   # a file (builtin maps and torchvision names are no files)
    retrieval = section.get("training", {}).get("eval", {}).get("retrieval") or []
    for spec in [retrieval] if isinstance(retrieval, dict) else retrieval:
        touch(spec["image_root"], True)
        touch(spec["karpathy_json"], False)
    return made + fake_countercurate_data(workdir, config_path) + fake_spurious_data(workdir, config_path) \
        + fake_cvld_data(workdir, config_path)


def fake_spurious_data(workdir: Path, config_path: Path) -> list[Path]:
    """Stand-ins under ``workdir`` for the spurious-correlation study's relative paths: empty Karpathy split and
    instances files, the image roots, and the demo's Flickr30k Entities (official layout) copied there."""
    data = (yaml.safe_load(Path(config_path).read_text()).get("spurious_retrieval") or {}).get("data") or {}
    demo = Path(__file__).resolve().parents[2] / "resources" / "demo"
    made = []
    for name in ("coco", "flickr30k"):
        src = data.get(name) or {}
        for rel, kind in [(src.get("karpathy_json"), "file"), (src.get("image_root"), "dir"),
                          (src.get("entities_root"), "flickr30k_entities"), *[(p, "file") for p in src.get("instances") or []]]:
            made += _stand_in(workdir, rel, kind, demo)
    return made


def fake_cvld_data(workdir: Path, config_path: Path) -> list[Path]:
    """Stand-ins under ``workdir`` for the CVLD data ``config_path`` names with relative paths: empty Karpathy files
    and image roots, and the demo CelebA and FairFace fixtures (official layouts) copied there."""
    data = (yaml.safe_load(Path(config_path).read_text()).get("cvld") or {}).get("data") or {}
    demo = Path(__file__).resolve().parents[2] / "resources" / "demo"
    made = []
    wanted = [((data.get(n) or {}).get("karpathy_json"), "file") for n in ("coco", "flickr30k")]
    wanted += [((data.get(n) or {}).get("image_root"), "dir") for n in ("coco", "flickr30k")]
    wanted += [((data.get(n) or {}).get("root"), n) for n in ("celeba", "fairface")]
    for rel, kind in wanted:
        made += _stand_in(workdir, rel, kind, demo)
    return made


def _stand_in(workdir: Path, rel, kind: str, demo: Path) -> list[Path]:
    """``workdir/rel`` made as an empty folder (``dir``), a ``{}`` file (``file``) or a copy of the demo folder
    ``kind``; nothing for an empty, absolute or existing path."""
    import shutil

    if not rel or Path(rel).is_absolute() or (workdir / rel).exists():
        return []
    target = workdir / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dir":
        target.mkdir()
    elif kind == "file":
        target.write_text("{}")
    else:
        shutil.copytree(demo / kind, target)
    return [target]


def fake_countercurate_data(workdir: Path, config_path: Path) -> list[Path]:
    """Stand-ins under ``workdir`` for the CounterCurate data ``config_path`` names with relative paths: the
    demo's Flickr30k Entities, LookTwice, SugarCrepe and Winoground files (official layouts) copied there."""
    import shutil

    cc = yaml.safe_load(Path(config_path).read_text()).get("countercurate") or {}
    demo = Path(__file__).resolve().parents[2] / "resources" / "demo"
    made = []

    def copy(rel: str | None, source: Path) -> None:
        if not rel or Path(rel).is_absolute() or (workdir / rel).exists():
            return
        target = workdir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, target)
        made.append(target)

    copy((cc.get("data") or {}).get("entities_root"), demo / "flickr30k_entities")
    bench = cc.get("benchmarks") or {}
    sources = {"looktwice": {"dataset": demo / "looktwice/looktwiceqa_dataset.json", "images": demo / "looktwice/images"},
               "sugarcrepe": {"root": demo / "sugarcrepe", "images": demo / "val2017"},
               "winoground": {"examples": demo / "winoground/examples.jsonl", "images": demo / "winoground/images"}}
    for name, keys in sources.items():
        for key, source in keys.items():
            copy((bench.get(name) or {}).get(key), source)
    return made


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
    study = cfg["coco_counterfactuals"]
    demo = workdir / "demo data"
    if not demo.exists():
        demo.symlink_to(repo / "resources" / "demo", target_is_directory=True)
    study["data"]["coco_root"] = str(demo)
    source = study["data"].get("source") or {}
    for key in ("path", "image_root", "boxes_json"):
        if source.get(key) and not Path(source[key]).is_absolute():
            source[key] = str(demo / Path(source[key]).relative_to("resources/demo"))
    study["data"]["karpathy_json"] = str(demo / "karpathy" / "dataset_coco.json")
    retrieval = study["training"]["eval"]["retrieval"] or []
    for spec in [retrieval] if isinstance(retrieval, dict) else retrieval:
        spec.update(karpathy_json=str(demo / "karpathy" / "dataset_coco.json"), image_root=str(demo))
    for spec in study["evaluation"]["classification"]["datasets"].values():
        for key in ("root", "class_index", "class_names"):
            if key in spec and not str(spec[key]).startswith("builtin:"):
                spec[key] = str(repo / spec[key])
    probing = (cfg.get("social_counterfactuals") or {}).get("probing") or {}
    for dataset in ("pata", "visogender"):
        for key, value in (probing.get(dataset) or {}).items():
            if key in ("files_list", "captions_json", "image_dir", "oo_tsv", "op_tsv") and value:
                probing[dataset][key] = str(repo / value)
    cc = cfg.get("countercurate") or {}
    if (cc.get("data") or {}).get("entities_root"):
        cc["data"]["entities_root"] = str(repo / cc["data"]["entities_root"])
    for section in (cc.get("benchmarks") or {}).values():
        if isinstance(section, dict):
            for key in ("dataset", "images", "root", "examples", "imgs_list"):
                if section.get(key):
                    section[key] = str(repo / section[key])
    sr = ((cfg.get("spurious_retrieval") or {}).get("data") or {}).get("coco") or {}
    for key in ("karpathy_json", "image_root"):
        if sr.get(key):
            sr[key] = str(demo / Path(sr[key]).relative_to("resources/demo"))
    if sr.get("instances"):
        sr["instances"] = [str(demo / Path(p).relative_to("resources/demo")) for p in sr["instances"]]
    cv = (cfg.get("cvld") or {}).get("data") or {}
    for spec, keys in [(cv.get("coco") or {}, ("karpathy_json", "image_root")), (cv.get("celeba") or {}, ("root",)),
                       (cv.get("fairface") or {}, ("root",))]:
        for key in keys:
            if spec.get(key):
                spec[key] = str(demo / Path(spec[key]).relative_to("resources/demo"))
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
