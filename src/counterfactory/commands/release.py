"""``counterfactory release {coco,coco-captions,social}``: read a downloaded published release into the tables
our evaluations read (:mod:`counterfactory.data.releases`; the layouts of the Hugging Face datasets
Intel/COCO-Counterfactuals and Intel/SocialCounterfactuals).

* ``coco``: Intel/COCO-Counterfactuals -> ``selected_pairs.parquet`` (what ``evaluate itr`` / ``itm``, ``train
  mixtures``, ``train in-domain-split`` and ``report pair-grid`` read) and its images;
* ``coco-captions``: the caption-only release -> the caption stage's ``counterfactual_captions.parquet`` (what
  ``images generate`` reads);
* ``social``: Intel/SocialCounterfactuals -> the kept-images table (what ``social probe``, ``social debias-split``
  and ``social debias-run`` read) and its images.

The command line only, declared as data (``commands.Step``).
"""

from __future__ import annotations

from . import OUT, Param, Step, flag, registrar


def _coco(args) -> int:
    from ..data.releases import write_coco_release_pairs

    s = write_coco_release_pairs(args.root, args.out, args.images, in_place=args.in_place)
    print(f"{s['pairs']} pairs ({s['with_changed_word']} with one changed word) -> {args.out}; images in "
          f"{s['images_dir']}")
    return 0


def _captions(args) -> int:
    from ..data.releases import read_coco_counterfactual_captions
    from ..io import write_parquet

    frame = read_coco_counterfactual_captions(args.jsonl)
    write_parquet(args.out, frame)
    print(f"{len(frame)} caption pairs -> {args.out}")
    return 0


def _social(args) -> int:
    from ..data.releases import write_social_release_images

    s = write_social_release_images(args.root, args.out, args.images, partial=args.partial)
    print(f"{s['images']} images in {s['sets']} sets ({s['subjects']} subjects) -> {args.out}; images in "
          f"{s['images_dir']}")
    for seg, n in s["segments"].items():
        print(f"  {seg}: {n} sets")
    return 0


# ------------------------------------------------------------------------------------------- declarations

RELEASE_ROOT = Param("--root", required=True, metavar="RELEASE", help="release folder (holding data/)")

COCO = Step(
    "coco", help="Intel/COCO-Counterfactuals -> selected_pairs.parquet and its images",
    description="Read RELEASE/data/examples.jsonl and the images (data/images.zip, either path convention of the "
                "loading script, or an extracted data/images/). Writes OUT (the image stage's selected_pairs.parquet "
                "schema; scores the release does not carry are NaN) and copies the pairs' images to --images "
                "(replaced as a whole).",
    params=(RELEASE_ROOT,
            OUT.but(metavar="selected_pairs.parquet", help="the pair table to write (the image stage's layout)"),
            Param("--images", metavar="DIR", help="image folder (default: OUT's folder/release)"),
            flag("--in-place", "read an extracted data/images/ where it is instead of copying (absolute paths in "
                               "OUT)")),
    run=_coco)

COCO_CAPTIONS = Step(
    "coco-captions", help="caption-only COCO-Counterfactuals release -> counterfactual_captions.parquet",
    description="Read coco_counterfactuals_captions.jsonl (coco-counterfactual-index, original_caption, "
                "counterfactual_caption) into the caption stage's table.",
    params=(Param("--jsonl", required=True, metavar="FILE.jsonl",
                  help="the release's coco_counterfactuals_captions.jsonl"),
            OUT.but(metavar="counterfactual_captions.parquet",
                    help="the caption table to write (the caption stage's layout)")),
    run=_captions)

SOCIAL = Step(
    "social", help="Intel/SocialCounterfactuals -> kept-images table and its images",
    description="Read RELEASE/data/train-NNNNN-of-MMMMM*.parquet (datasets Image feature) shard by shard; writes the "
                "images to --images (replaced as a whole) and OUT (the filter stage's kept-images schema).",
    params=(RELEASE_ROOT,
            OUT.but(metavar="kept.parquet", help="the kept-images table to write (the filter stage's layout)"),
            Param("--images", metavar="DIR", help="image folder (default: OUT's folder/release_images)"),
            flag("--partial", "read the shards present even if some are missing")),
    run=_social)

RELEASE = Step(
    "release", help="read a downloaded published release (COCO-Counterfactuals, SocialCounterfactuals) into the "
                    "tables the evaluations read",
    description="Read a downloaded published release into the tables the evaluations read: coco "
                "(Intel/COCO-Counterfactuals -> selected_pairs.parquet and its images, what evaluate itr / itm, train "
                "mixtures, train in-domain-split and report pair-grid read), coco-captions (the caption-only release "
                "-> counterfactual_captions.parquet, what images generate reads) and social "
                "(Intel/SocialCounterfactuals -> the kept-images table, what the social probe and debias steps read, "
                "and its images).",
    metavar="<release>",
    steps=(COCO, COCO_CAPTIONS, SOCIAL))

register = registrar(RELEASE)
