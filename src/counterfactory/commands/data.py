"""``counterfactory data``: check and read source datasets (MS-COCO 2017, Karpathy splits, your own
image-caption collection: ``own-check``, ``own-captions``, ``own-to-coco``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _check(args) -> int:
    from ..config import load_config
    from ..data.check import check_coco_root
    from ..io import write_json

    checksums = None
    check_images = True
    if args.config:
        cfg = load_config(args.config)
        checksums = cfg["data"].get("checksums")
        check_images = cfg["data"].get("check_images", True)
    if args.checksums:
        from ..data.coco import read_json
        from ..errors import input_error

        checksums = read_json(args.checksums, "checksums file")
        if not isinstance(checksums, dict):
            raise input_error(args.checksums, None, "is not a JSON object",
                              'write {"captions_val2017.json": "<sha256 hex>", ...}')
    report = check_coco_root(args.root, args.split, expect_images=check_images, checksums=checksums)
    write_json(args.out, report)
    checked = f", {report['image_files']} image files readable" if 'image_files' in report else ""
    print(f"COCO root OK: {report['images']} images, {report['captions']} captions{checked}")
    return 0


def _captions(args) -> int:
    from ..data.coco import load_coco_captions
    from ..io import write_parquet

    table = load_coco_captions(args.captions_json)
    if args.limit_images:
        keep = sorted(table["image_id"].unique())[: args.limit_images]
        table = table[table["image_id"].isin(keep)].reset_index(drop=True)
    write_parquet(args.out, table)
    print(f"{len(table)} captions of {table['image_id'].nunique()} images -> {args.out}")
    return 0


def _instances(args) -> int:
    from ..data.coco import load_coco_instances
    from ..io import write_parquet

    _, boxes, _ = load_coco_instances(args.instances_json)
    cols = ["id", "image_id", "category_id", "name", "supercategory", "x", "y", "w", "h", "area", "iscrowd"]
    table = boxes[cols].rename(columns={"id": "annotation_id", "name": "category_name"})
    table = table.sort_values(["image_id", "annotation_id"], kind="stable").reset_index(drop=True)
    write_parquet(args.out, table)
    print(f"{len(table)} boxes of {table['image_id'].nunique()} images -> {args.out}")
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _karpathy(args) -> int:
    from ..data.karpathy import load_karpathy
    from ..io import write_parquet

    table = load_karpathy(args.json, split=args.split)
    write_parquet(args.out, table)
    print(f"{len(table)} sentences -> {args.out}")
    return 0


def _flickr30k_captions(args) -> int:
    from ..data.flickr30k_entities import captions_frame
    from ..io import write_parquet

    images = args.images or str(Path(args.entities_root) / "flickr30k-images")
    table = captions_frame(args.entities_root, images)
    write_parquet(args.out, table)
    print(f"{len(table)} captions of {table['image_id'].nunique()} images -> {args.out}")
    return 0


def _own_data(args):
    """The own-data source of ``--path`` and the other source options, else of the config's
    ``data.source`` (options given on the command line override its keys); validated and loaded."""
    from ..data.own import CONFIG_KEY, load_own_data
    from ..errors import ConfigError

    spec = {}
    if args.config:
        from ..config import load_config

        spec = dict(load_config(args.config)["data"].get("source") or {})
    given = {key: getattr(args, key) for key in ("kind", "path", "image_column", "caption_column", "id_column",
                                                  "image_root", "boxes_json") if getattr(args, key) is not None}
    spec.update(given)
    if not spec.get("path"):
        raise ConfigError(f"no own-data source. Fix: pass --path (a caption table or an image folder) or "
                          f"--config with {CONFIG_KEY} set")
    spec.setdefault("kind", "folder" if Path(spec["path"]).is_dir() else "table")
    return load_own_data(spec)


def _own_check(args) -> int:
    from ..data.own import check_report
    from ..io import write_json

    report = check_report(_own_data(args))
    if args.out:
        write_json(args.out, report)
    print(f"own data OK: {report['images']} images, {report['captions']} captions, {report['boxes']} boxes")
    return 0


def _own_captions(args) -> int:
    from ..data.own import limit_images
    from ..io import write_parquet

    table = limit_images(_own_data(args).captions, args.limit_images)
    write_parquet(args.out, table)
    print(f"{len(table)} captions of {table['image_id'].nunique()} images -> {args.out}")
    return 0


def _own_to_coco(args) -> int:
    from ..data.own import write_coco_view

    report = write_coco_view(_own_data(args), args.out_root, split=args.split, test_fraction=args.test_fraction,
                             val_fraction=args.val_fraction)
    splits = ", ".join(f"{k} {v}" for k, v in report["karpathy_splits"].items())
    print(f"COCO view of {report['images']} images, {report['captions']} captions, {report['boxes']} boxes -> "
          f"{args.out_root} (set <study>.data.coco_root / the study's COCO paths to it); Karpathy split file "
          f"{report['karpathy_json']} ({splits}) with image_root {args.out_root} for the retrieval and CVLD studies")
    return 0


def _own_source_options(p) -> None:
    p.add_argument("--config", action="append", help="config YAML: takes data.source (repeatable; later files win)")
    p.add_argument("--path", help="caption table (.csv, .tsv, .jsonl, .parquet) or folder of images with <stem>.txt "
                                  "captions (overrides data.source.path)")
    p.add_argument("--kind", choices=["table", "folder"], help="default: folder if --path is a folder, else table")
    p.add_argument("--image-column", help="table column with the image path (default: image)")
    p.add_argument("--caption-column", help="table column with the caption (default: caption)")
    p.add_argument("--id-column", help="table column with your unique caption id (optional)")
    p.add_argument("--image-root", help="folder relative image paths start from (default: the table's folder)")
    p.add_argument("--boxes-json", help="COCO instances-style JSON of boxes; images matched by file_name")


def register(sub) -> None:
    p = sub.add_parser("data", help="check and read source datasets (COCO, Karpathy splits, Flickr30k Entities, "
                       "your own images and captions)",
                       description="Check source datasets and read them into the tables the studies start from: "
                                   "MS-COCO (captions, instance boxes), Karpathy split files, Flickr30k Entities "
                                   "captions, and your own image-caption collection (own-check, own-captions, "
                                   "own-to-coco).")
    s = p.add_subparsers(dest="data_command", metavar="<step>")
    s.required = True
    c = s.add_parser("check-coco", help="verify a COCO root (annotation files, every referenced image present "
                     "and readable, checksums)",
                     description="Reads a COCO root (annotations/ and <split>/ images) and optional checksums; "
                                 "writes a JSON report of what was checked, or fails naming every problem.")
    c.add_argument("--root", required=True, help="folder with annotations/ and <split>/")
    c.add_argument("--split", default="val2017", help="COCO split to check (default: val2017)")
    c.add_argument("--config", action="append", help="config YAML: takes data.checksums and data.check_images")
    c.add_argument("--checksums", help="JSON object: annotation file name -> md5/sha1/sha256 hex digest, "
                                       "optionally prefixed like 'md5:' (overrides the config)")
    c.add_argument("--out", required=True, help="report JSON")
    c.set_defaults(func=_check)
    t = s.add_parser("captions", help="every caption as a table (caption_id = {image_id}_{caption_index})",
                     description="Reads a COCO captions_<split>.json; writes a parquet table with one row per "
                                 "caption (image_id, caption_id, caption).")
    t.add_argument("--captions-json", required=True, help="captions_<split>.json")
    t.add_argument("--out", required=True, help="output parquet")
    t.add_argument("--limit-images", type=_positive, help="keep the captions of the first N image ids in sorted order")
    t.set_defaults(func=_captions)
    b = s.add_parser("instances", help="the boxes of an instances_<split>.json as a table (x, y, w, h, category)",
                     description="Reads a COCO instances_<split>.json; writes a parquet table with one row per "
                                 "box (image, category, x, y, w, h, area, iscrowd).")
    b.add_argument("--instances-json", required=True, help="instances_<split>.json")
    b.add_argument("--out", required=True, help="output parquet")
    b.set_defaults(func=_instances)
    k = s.add_parser("karpathy", help="a Karpathy split file as a table, one row per sentence",
                     description="Reads a Karpathy split file (dataset_coco.json or dataset_flickr30k.json); "
                                 "writes a parquet table with one row per sentence and its split.")
    k.add_argument("--json", required=True, help="dataset_coco.json or dataset_flickr30k.json")
    k.add_argument("--split", help="train, val, test or restval (default: all)")
    k.add_argument("--out", required=True, help="output parquet")
    k.set_defaults(func=_karpathy)
    f = s.add_parser("flickr30k-captions", help="Flickr30k Entities captions with their phrase markup, one row each",
                     description="Reads the Flickr30k Entities Sentences/ (and the image folder); writes a parquet "
                                 "table with one row per caption and its phrase markup.")
    f.add_argument("--entities-root", required=True, help="folder with Sentences/ and Annotations/")
    f.add_argument("--images", help="Flickr30k images (<id>.jpg); default <entities-root>/flickr30k-images")
    f.add_argument("--out", required=True, help="output parquet: image_id, sentence_index, markup, caption, image_path")
    f.set_defaults(func=_flickr30k_captions)
    o = s.add_parser("own-check", help="validate your own image-caption source; lists every problem at once",
                     description="Reads your own image-caption source (a caption table or a folder of images "
                                 "with <stem>.txt captions, given by --path or the config's data.source); writes "
                                 "an optional JSON report, or fails listing every problem at once.")
    _own_source_options(o)
    o.add_argument("--out", help="report JSON (counts and resolved paths)")
    o.set_defaults(func=_own_check)
    o = s.add_parser("own-captions", help="your own source as the caption table (same columns as `data captions`, "
                                          "plus own_id and source_image)",
                     description="Reads your own image-caption source; writes the caption table (parquet) the "
                                 "caption stage reads, like `data captions` does for COCO.")
    _own_source_options(o)
    o.add_argument("--out", required=True, help="output parquet")
    o.add_argument("--limit-images", type=_positive, help="keep the captions of the first N image ids")
    o.set_defaults(func=_own_captions)
    o = s.add_parser("own-to-coco", help="a COCO-layout view of your own source (annotation JSONs, image links) "
                                         "for the steps that read a COCO root",
                     description="Reads your own image-caption source; writes a folder in the COCO layout "
                                 "(annotation JSON files, links to the images) and a Karpathy-style split file, for "
                                 "the steps that read a COCO root.")
    _own_source_options(o)
    o.add_argument("--out-root", required=True, help="folder to write (replaced only if an earlier view)")
    o.add_argument("--split", default="val2017", help="split name of the view's files (default: val2017)")
    o.add_argument("--test-fraction", type=float, default=0.2,
                   help="images in the Karpathy split file's test split (default: 0.2, ours)")
    o.add_argument("--val-fraction", type=float, default=0.1,
                   help="images in its val split (default: 0.1, ours); the rest is train")
    o.set_defaults(func=_own_to_coco)
