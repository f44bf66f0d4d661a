"""``counterfactory export {release,imagefolder,clip-benchmark,card}``: a study's data in the published release
layout, in the generic Hugging Face imagefolder + parquet layouts, as CLIP_benchmark's retrieval webdataset, and its
dataset card (``README.md``) from provenance."""

from __future__ import annotations

from pathlib import Path

from ..export.formats import MAX_SHARD_BYTES
from ..export.studies import STUDIES


def _release(args) -> int:
    from ..errors import ConfigError
    from ..export import formats, studies

    spec = studies.study_export(args.study)
    d = Path(args.study_dir)
    if spec.release is None:
        raise ConfigError(f"study {args.study!r} has no published release format. Fix: export it with "
                          "`counterfactory export imagefolder`")
    if spec.release == "coco_counterfactuals":
        m = formats.write_coco_counterfactuals(d / spec.release_inputs[0], d / spec.release_inputs[1], args.out_dir,
                                               manifest_path=args.manifest)
    elif spec.release == "countercurate":
        m = formats.write_countercurate(d / "datasets", args.out_dir, manifest_path=args.manifest)
    else:
        m = formats.write_social_counterfactuals(d / spec.release_inputs[0], args.out_dir, manifest_path=args.manifest)
    _print(m, args.out_dir)
    return 0


def _imagefolder(args) -> int:
    from ..export import formats, studies

    tables = studies.study_export(args.study).tables(Path(args.study_dir))
    if args.verified:
        tables += studies.verified_tables(args.study, tables, args.verified)
    m = formats.write_imagefolder(tables, args.out_dir, source=str(args.study_dir),
                                  manifest_path=args.manifest_imagefolder)
    _print(m, args.out_dir)
    if args.parquet_dir:
        _print(formats.write_parquet(tables, args.parquet_dir, source=str(args.study_dir),
                                     manifest_path=args.manifest_parquet, max_shard_bytes=args.max_shard_bytes),
               args.parquet_dir)
    return 0


def _clip_benchmark(args) -> int:
    from ..export import studies, webdataset

    sets = studies.retrieval_sets(args.study, args.study_dir, args.verified)
    m = webdataset.write_clip_benchmark(sets, args.out_dir, source=str(args.study_dir), manifest_path=args.manifest,
                                        max_shard_bytes=args.max_shard_bytes)
    for config, c in m["configs"].items():
        split = c["splits"][webdataset.SPLIT]
        print(f"clip_benchmark {config} ({split['rows']} images, {split['captions']} captions, "
              f"{len(split['files'])} shard(s)) -> {Path(args.out_dir) / config}")
    return 0


def _card(args) -> int:
    from ..export.cards import write_card

    from ..errors import InputError

    paths = {}
    for item in args.manifest:
        layout, sep, path = item.partition("=")
        if not sep or not layout or not path:
            raise InputError(f"--manifest {item!r}: expected LAYOUT=FILE (e.g. parquet=results/demo/cvld/manifests/"
                             "export_parquet.json). Fix: name the layout and its manifest file")
        paths[layout] = path
    out = write_card(args.study, args.study_dir, args.provenance, args.export_dir, out=args.out, manifest_paths=paths,
                     filter_cards=args.filter_card)
    print(f"dataset card -> {out}")
    return 0


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of bytes")
    return value


def _print(manifest: dict, out) -> None:
    for config, c in manifest["configs"].items():
        counts = ", ".join(f"{s}: {v['rows']}" for s, v in c["splits"].items())
        print(f"{manifest['format']} {config} ({counts}) -> {out}")


def register(sub) -> None:
    p = sub.add_parser("export", help="export a study's data (release / imagefolder / parquet / CLIP_benchmark) and "
                                      "its dataset card",
                       description="Export a study's results: the published release layout, the generic Hugging "
                                   "Face imagefolder and parquet layouts, CLIP_benchmark's retrieval webdataset, and "
                                   "a dataset card (README.md) built from the run's provenance.")
    ps = p.add_subparsers(dest="export_command", metavar="<step>")
    ps.required = True
    studies = sorted(STUDIES)

    def common(q, out=True):
        q.add_argument("--study", required=True, choices=studies, help="study whose results are exported")
        q.add_argument("--study-dir", required=True, metavar="DIR", help="the study's results (results/<run>/<study>)")
        if out:
            q.add_argument("--out-dir", required=True, metavar="DIR", help="output folder (replaced as a whole)")

    r = ps.add_parser("release", help="the published layout (COCO-Counterfactuals, SocialCounterfactuals, "
                                      "CounterCurate TSVs)",
                      description="Reads a study's results folder; writes its data in the layout of the study's "
                                  "published release to --out-dir.")
    common(r)
    r.add_argument("--manifest", metavar="FILE.json", help="write the manifest here, outside the folder (default: "
                                                           "<out-dir>/manifest.json)")
    r.set_defaults(func=_release)
    i = ps.add_parser("imagefolder", help="generic datasets imagefolder layout (metadata.jsonl + images)",
                      description="Reads a study's results folder; writes the Hugging Face datasets imagefolder "
                                  "layout (metadata.jsonl next to the images) to --out-dir and, with --parquet-dir, "
                                  "the parquet layout with embedded images.")
    common(i)
    i.add_argument("--parquet-dir", metavar="DIR", help="also write the parquet layout (images embedded) here")
    i.add_argument("--manifest-imagefolder", metavar="FILE.json",
                   help="write the imagefolder manifest here, outside the folder (default: inside it)")
    i.add_argument("--manifest-parquet", metavar="FILE.json",
                   help="write the parquet manifest here, outside the folder (default: inside it)")
    i.add_argument("--verified", metavar="FILE.parquet",
                   help="the VQA check's verified variant (results/<run>/<study>/verify/verified.parquet): each "
                        "config's rows it keeps are exported too, as config <config>_verified")
    i.add_argument("--max-shard-bytes", type=_positive_int, default=MAX_SHARD_BYTES, metavar="N",
                   help="bound on the image bytes of one parquet shard; each split is streamed into "
                        "<split>-0000K-of-0000N.parquet files of at most this size (default: 500 MiB, the size "
                        "`datasets` shards to when it pushes to the Hub)")
    i.set_defaults(func=_imagefolder)
    w = ps.add_parser("clip-benchmark", help="CLIP_benchmark's webdataset layout for zero-shot retrieval",
                      description="Reads a study's results folder; writes its image-caption retrieval set(s) in "
                                  "the webdataset layout CLIP_benchmark reads (<out-dir>/<config>/dataset_type.txt, "
                                  "test/nshards.txt, test/<k>.tar with <key>.png + <key>.txt): evaluate with "
                                  "`clip_benchmark eval --dataset wds/<config> --dataset_root <out-dir>/<config> "
                                  "--task zeroshot_retrieval`.")
    common(w)
    w.add_argument("--manifest", metavar="FILE.json", help="write the manifest here, outside the folder (default: "
                                                           "<out-dir>/manifest.json)")
    w.add_argument("--verified", metavar="FILE.parquet",
                   help="the VQA check's verified variant (results/<run>/<study>/verify/verified.parquet): each "
                        "config's rows it keeps are exported too, as config <config>_verified (none if it keeps "
                        "no row)")
    w.add_argument("--max-shard-bytes", type=_positive_int, default=MAX_SHARD_BYTES, metavar="N",
                   help="bound on the image bytes of one tar shard (default: 500 MiB)")
    w.set_defaults(func=_clip_benchmark)
    c = ps.add_parser("card", help="dataset card README.md from provenance, manifests and the study's summaries",
                      description="Reads the run's provenance JSON, the exported folders' manifests and the "
                                  "study's summaries; writes the dataset card (README.md).")
    common(c, out=False)
    c.add_argument("--provenance", required=True, metavar="FILE.json", help="the run's provenance.json")
    c.add_argument("--export-dir", required=True, metavar="DIR", help="folder holding release/ imagefolder/ parquet/")
    c.add_argument("--out", metavar="FILE.md", help="card path (default: <export-dir>/README.md)")
    c.add_argument("--manifest", action="append", default=[], metavar="LAYOUT=FILE.json",
                   help="a layout's manifest kept outside its folder (repeatable; default: the folder's own)")
    c.add_argument("--filter-card", action="append", default=[], metavar="DIR",
                   help="an audited filter's card folder (`filters study-card --out-dir`; repeatable): copied to "
                        "filter_cards/<name>/ beside the card and listed in its Filter cards section")
    c.set_defaults(func=_card)
