"""``counterfactory odmap select``: the spurious-correlation retrieval study's region selection (Kim et al. 2023,
§3.1): which (image, class) pairs to remove for the synthetic ODmAP@k images, from COCO instances or Flickr30k
Entities boxes (:mod:`counterfactory.studies.spurious_retrieval.regions`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _csv_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of class names")
    return items


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "odmap",
        help="spurious-correlation retrieval study (ODmAP@k): region selection for object-removed images",
        description="Kim et al. 2023, 'Exposing and Mitigating Spurious Correlations for Cross-Modal Retrieval'.",
    )
    sub = parser.add_subparsers(dest="odmap_command", metavar="<odmap command>")
    sub.required = True
    p = sub.add_parser(
        "select",
        help="select the classes to remove per image (§3.1 Eq. 1-3, thresholds alpha1/alpha2/alpha3)",
        description="One row per (image, class): removed alone (every other class overlaps < alpha1), together with "
                    "the classes it covers by > alpha2, or skipped (removed area vs alpha3, or overlaps in between). "
                    "Settings: spurious_retrieval.selection of the --config files, then the options given here.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--instances", metavar="FILE.json", help="COCO instances_<split>.json")
    src.add_argument("--entities-root", metavar="DIR",
                     help="Flickr30k Entities folder holding Sentences/ and Annotations/")
    p.add_argument("--out", required=True, metavar="OUT.parquet", help="selection table to write (atomic)")
    p.add_argument("--config", nargs="+", default=[], metavar="FILE",
                   help="YAML files (later win) whose spurious_retrieval.selection section sets the defaults")
    p.add_argument("--alpha1", type=_fraction, help="single-class removal: every other overlap < alpha1 (0.4)")
    p.add_argument("--alpha2", type=_fraction, help="multi-class removal: classes with overlap > alpha2 (0.8)")
    p.add_argument("--alpha3", type=_fraction, help="largest removed share of the image (0.7)")
    p.add_argument("--rule", choices=("pseudocode", "text"),
                   help="pseudocode: appendix listing (default); text: Eq. 1-3 as written (see the module docs)")
    p.add_argument("--mask-mode", choices=("box", "segmentation"),
                   help="box (default); segmentation needs pycocotools")
    p.add_argument("--classes", type=_csv_list, metavar="A,B,...",
                   help="only these classes (default: every COCO class; Flickr30k: people, animals, vehicles, "
                        "instruments)")
    p.set_defaults(func=_select)


def _params(args) -> dict:
    from ..config import deep_merge, read_yaml
    from ..studies.spurious_retrieval import regions

    cfg: dict = {}
    for path in args.config:
        cfg = deep_merge(cfg, read_yaml(Path(path)))
    section = dict(regions.config_section(cfg))
    for key in ("alpha1", "alpha2", "alpha3", "rule", "mask_mode", "classes"):
        value = getattr(args, key)
        if value is not None:
            section[key] = value
    return regions.settings({regions.SECTION[0]: {regions.SECTION[1]: section}})


def _select(args) -> int:
    from ..io import write_parquet
    from ..studies.spurious_retrieval import regions

    params = _params(args)
    if args.instances:
        images, objects, known = regions.coco_objects(args.instances)
        source = args.instances
    else:
        images, objects, known = regions.flickr_objects(args.entities_root, params["classes"])
        source = args.entities_root
    table = regions.select_regions(images, objects, params, source=source, known_classes=known)
    write_parquet(args.out, table)
    print(f"{regions.format_summary(regions.summary(table))} -> {args.out}")
    return 0
