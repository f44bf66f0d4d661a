"""``counterfactory data``: check and read source datasets (MS-COCO 2017, Karpathy splits, your own
image-caption collection: ``own-check``, ``own-captions``, ``own-to-coco``). This module is the command line only,
declared as data (``commands.Step``); the readers are :mod:`counterfactory.data.coco`,
:mod:`~counterfactory.data.check`, :mod:`~counterfactory.data.karpathy`,
:mod:`~counterfactory.data.flickr30k_entities` and :mod:`~counterfactory.data.own`."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import OUT, Param, Step, lazy_module, registrar

# the readers, each imported when its subcommand runs (pandas); building the parser does not
check, coco, own = (lazy_module(f"counterfactory.data.{name}") for name in ("check", "coco", "own"))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


# ------------------------------------------------------------------------------------------- handlers


def _check(args) -> int:
    from ..config import load_config
    from ..io import write_json

    checksums = None
    check_images = True
    if args.config:
        cfg = load_config(args.config)
        checksums = cfg["data"].get("checksums")
        check_images = cfg["data"].get("check_images", True)
    if args.checksums:
        checksums = check.read_checksums(args.checksums)
    report = check.check_coco_root(args.root, args.split, expect_images=check_images, checksums=checksums)
    write_json(args.out, report)
    checked = f", {report['image_files']} image files readable" if 'image_files' in report else ""
    print(f"COCO root OK: {report['images']} images, {report['captions']} captions{checked}")
    return 0


def _captions(args) -> int:
    from ..io import write_parquet

    table = coco.load_coco_captions(args.captions_json)
    if args.limit_images:
        keep = sorted(table["image_id"].unique())[: args.limit_images]
        table = table[table["image_id"].isin(keep)].reset_index(drop=True)
    write_parquet(args.out, table)
    print(f"{len(table)} captions of {table['image_id'].nunique()} images -> {args.out}")
    return 0


def _instances(args) -> int:
    from ..io import write_parquet

    table = coco.instance_boxes(args.instances_json)
    write_parquet(args.out, table)
    print(f"{len(table)} boxes of {table['image_id'].nunique()} images -> {args.out}")
    return 0


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
    source = None
    if args.config:
        from ..config import load_config

        source = load_config(args.config)["data"].get("source")
    return own.load_own_source(source, {key: getattr(args, key) for key in own.SOURCE_OPTIONS})


def _own_check(args) -> int:
    from ..io import write_json

    report = own.check_report(_own_data(args))
    if args.out:
        write_json(args.out, report)
    print(f"own data OK: {report['images']} images, {report['captions']} captions, {report['boxes']} boxes")
    return 0


def _own_captions(args) -> int:
    from ..io import write_parquet

    table = own.limit_images(_own_data(args).captions, args.limit_images)
    write_parquet(args.out, table)
    print(f"{len(table)} captions of {table['image_id'].nunique()} images -> {args.out}")
    return 0


def _own_to_coco(args) -> int:
    report = own.write_coco_view(_own_data(args), args.out_root, split=args.split, test_fraction=args.test_fraction,
                                 val_fraction=args.val_fraction)
    splits = ", ".join(f"{k} {v}" for k, v in report["karpathy_splits"].items())
    print(f"COCO view of {report['images']} images, {report['captions']} captions, {report['boxes']} boxes -> "
          f"{args.out_root} (set <study>.data.coco_root / the study's COCO paths to it); Karpathy split file "
          f"{report['karpathy_json']} ({splits}) with image_root {args.out_root} for the retrieval and CVLD studies")
    return 0


# ------------------------------------------------------------------------------------------- declarations

#: ``--out`` of a parquet table
OUT_PARQUET = OUT.but(metavar=None, help="output parquet")

#: the options of an own-data source (``own-check``, ``own-captions``, ``own-to-coco``)
OWN_SOURCE = (
    Param("--config", action="append", help="config YAML: takes data.source (repeatable; later files win)"),
    Param("--path", help="caption table (.csv, .tsv, .jsonl, .parquet) or folder of images with <stem>.txt "
                         "captions (overrides data.source.path)"),
    Param("--kind", choices=("table", "folder"), help="default: folder if --path is a folder, else table"),
    Param("--image-column", help="table column with the image path (default: image)"),
    Param("--caption-column", help="table column with the caption (default: caption)"),
    Param("--id-column", help="table column with your unique caption id (optional)"),
    Param("--image-root", help="folder relative image paths start from (default: the table's folder)"),
    Param("--boxes-json", help="COCO instances-style JSON of boxes; images matched by file_name"),
)

CHECK_COCO = Step(
    "check-coco", help="verify a COCO root (annotation files, every referenced image present and readable, "
                       "checksums)",
    description="Reads a COCO root (annotations/ and <split>/ images) and optional checksums; writes a JSON report "
                "of what was checked, or fails naming every problem.",
    params=(Param("--root", required=True, help="folder with annotations/ and <split>/"),
            Param("--split", default="val2017", help="COCO split to check (default: val2017)"),
            Param("--config", action="append", help="config YAML: takes data.checksums and data.check_images"),
            Param("--checksums", help="JSON object: annotation file name -> md5/sha1/sha256 hex digest, optionally "
                                      "prefixed like 'md5:' (overrides the config)"),
            OUT.but(metavar=None, help="report JSON")),
    run=_check)

CAPTIONS = Step(
    "captions", help="every caption as a table (caption_id = {image_id}_{caption_index})",
    description="Reads a COCO captions_<split>.json; writes a parquet table with one row per caption (image_id, "
                "caption_id, caption).",
    params=(Param("--captions-json", required=True, help="captions_<split>.json"),
            OUT_PARQUET,
            Param("--limit-images", type=_positive,
                  help="keep the captions of the first N image ids in sorted order")),
    run=_captions)

INSTANCES = Step(
    "instances", help="the boxes of an instances_<split>.json as a table (x, y, w, h, category)",
    description="Reads a COCO instances_<split>.json; writes a parquet table with one row per box (image, "
                "category, x, y, w, h, area, iscrowd).",
    params=(Param("--instances-json", required=True, help="instances_<split>.json"), OUT_PARQUET),
    run=_instances)

KARPATHY = Step(
    "karpathy", help="a Karpathy split file as a table, one row per sentence",
    description="Reads a Karpathy split file (dataset_coco.json or dataset_flickr30k.json); writes a parquet table "
                "with one row per sentence and its split.",
    params=(Param("--json", required=True, help="dataset_coco.json or dataset_flickr30k.json"),
            Param("--split", help="train, val, test or restval (default: all)"),
            OUT_PARQUET),
    run=_karpathy)

FLICKR30K_CAPTIONS = Step(
    "flickr30k-captions", help="Flickr30k Entities captions with their phrase markup, one row each",
    description="Reads the Flickr30k Entities Sentences/ (and the image folder); writes a parquet table with one row "
                "per caption and its phrase markup.",
    params=(Param("--entities-root", required=True, help="folder with Sentences/ and Annotations/"),
            Param("--images", help="Flickr30k images (<id>.jpg); default <entities-root>/flickr30k-images"),
            OUT.but(metavar=None, help="output parquet: image_id, sentence_index, markup, caption, image_path")),
    run=_flickr30k_captions)

OWN_CHECK = Step(
    "own-check", help="validate your own image-caption source; lists every problem at once",
    description="Reads your own image-caption source (a caption table or a folder of images with <stem>.txt "
                "captions, given by --path or the config's data.source); writes an optional JSON report, or fails "
                "listing every problem at once.",
    params=(*OWN_SOURCE, Param("--out", help="report JSON (counts and resolved paths)")),
    run=_own_check)

OWN_CAPTIONS = Step(
    "own-captions", help="your own source as the caption table (same columns as `data captions`, plus own_id and "
                         "source_image)",
    description="Reads your own image-caption source; writes the caption table (parquet) the caption stage reads, "
                "like `data captions` does for COCO.",
    params=(*OWN_SOURCE, OUT_PARQUET,
            Param("--limit-images", type=_positive, help="keep the captions of the first N image ids")),
    run=_own_captions)

OWN_TO_COCO = Step(
    "own-to-coco", help="a COCO-layout view of your own source (annotation JSONs, image links) for the steps that "
                        "read a COCO root",
    description="Reads your own image-caption source; writes a folder in the COCO layout (annotation JSON files, "
                "links to the images) and a Karpathy-style split file, for the steps that read a COCO root.",
    params=(*OWN_SOURCE,
            Param("--out-root", required=True, help="folder to write (replaced only if an earlier view)"),
            Param("--split", default="val2017", help="split name of the view's files (default: val2017)"),
            Param("--test-fraction", type=float, default=0.2,
                  help="images in the Karpathy split file's test split (default: 0.2, ours)"),
            Param("--val-fraction", type=float, default=0.1,
                  help="images in its val split (default: 0.1, ours); the rest is train")),
    run=_own_to_coco)

DATA = Step(
    "data", help="check and read source datasets (COCO, Karpathy splits, Flickr30k Entities, your own images and "
                 "captions)",
    description="Check source datasets and read them into the tables the studies start from: MS-COCO (captions, "
                "instance boxes), Karpathy split files, Flickr30k Entities captions, and your own image-caption "
                "collection (own-check, own-captions, own-to-coco).",
    steps=(CHECK_COCO, CAPTIONS, INSTANCES, KARPATHY, FLICKR30K_CAPTIONS, OWN_CHECK, OWN_CAPTIONS, OWN_TO_COCO))

register = registrar(DATA)
