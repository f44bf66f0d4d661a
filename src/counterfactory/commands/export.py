"""``counterfactory export {release,imagefolder,clip-benchmark,card}``: a study's data in the published release
layout, in the generic Hugging Face imagefolder + parquet layouts, as CLIP_benchmark's retrieval webdataset, and its
dataset card (``README.md``) from provenance. This module is the command line only, declared as data
(``commands.Step``); what a study exports is its spec's ``export`` (declared in
``counterfactory.studies.<study>.export``), looked up here and passed to :mod:`counterfactory.export` (``studies``,
``formats``, ``webdataset``, ``cards``), which does the work."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import studies as _studies
from ..errors import ConfigError
from ..export.formats import MAX_SHARD_BYTES
from . import OUT, OUT_DIR, Param, Step, registrar

if TYPE_CHECKING:
    from ..export.studies import StudyExport


def _study_export(study: str, *needs: str) -> "StudyExport":
    """The export declaration of ``study`` (its ``SPEC.export``); a ConfigError naming the study and the fix when it
    has none, or when it lacks what ``needs`` names (``"retrieval"``: a retrieval set, ``"verified"``: a verified
    variant)."""
    found = _studies.exports()
    if study not in found:
        raise ConfigError(f"no export is declared for study {study!r}. Fix: use one of {', '.join(found)} (a study "
                          "declares its export as EXPORT in src/counterfactory/studies/<study>/export.py, set as "
                          "SPEC.export)")
    export = found[study]
    if "retrieval" in needs and export.retrieval is None:
        raise ConfigError(f"study {study!r} declares no image-caption retrieval set. Fix: export one of "
                          f"{', '.join(s for s, v in found.items() if v.retrieval is not None)}, or use "
                          "`counterfactory export imagefolder`")
    if "verified" in needs and export.verified is None:
        raise ConfigError(f"study {study!r} has no verified variant (no VQA adapter is wired for it). Fix: drop "
                          "--verified, or export one of " + ", ".join(s for s, v in found.items() if v.verified))
    return export


def _release(args) -> int:
    from ..export.studies import write_release

    _print(write_release(args.study, _study_export(args.study), args.study_dir, args.out_dir,
                         manifest_path=args.manifest), args.out_dir)
    return 0


def _imagefolder(args) -> int:
    from ..export import formats, studies

    export = _study_export(args.study, *(["verified"] if args.verified else []))
    tables = export.tables(Path(args.study_dir))
    if args.verified:
        tables += studies.verified_tables(args.study, export, tables, args.verified)
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

    export = _study_export(args.study, "retrieval", *(["verified"] if args.verified is not None else []))
    sets = studies.retrieval_sets(args.study, export, args.study_dir, args.verified)
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
    out = write_card(args.study, _study_export(args.study), args.study_dir, args.provenance, args.export_dir,
                     out=args.out, manifest_paths=paths, filter_cards=args.filter_card)
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


# ------------------------------------------------------------------------------------------- declarations

#: the study and its results folder (every step), and the folder written (all but `card`)
STUDY = (Param("--study", required=True, choices=tuple(sorted(_studies.exports())), help="study whose results are exported"),
         Param("--study-dir", required=True, metavar="DIR", help="the study's results (results/<run>/<study>)"))
EXPORT_DIR = OUT_DIR.but(help="output folder (replaced as a whole)")
MANIFEST = Param("--manifest", metavar="FILE.json",
                 help="write the manifest here, outside the folder (default: <out-dir>/manifest.json)")
_VERIFIED = ("the VQA check's verified variant (results/<run>/<study>/verify/verified.parquet): each config's rows it "
             "keeps are exported too, as config <config>_verified")


def _max_shard_bytes(help: str) -> Param:
    """``--max-shard-bytes N``: the bound on one shard of the layout written (``help`` says which)."""
    return Param("--max-shard-bytes", type=_positive_int, default=MAX_SHARD_BYTES, metavar="N", help=help)


RELEASE = Step(
    "release", help="the published layout (COCO-Counterfactuals, SocialCounterfactuals, CounterCurate TSVs)",
    description="Reads a study's results folder; writes its data in the layout of the study's published release to "
                "--out-dir.",
    params=(*STUDY, EXPORT_DIR, MANIFEST),
    run=_release)

IMAGEFOLDER = Step(
    "imagefolder", help="generic datasets imagefolder layout (metadata.jsonl + images)",
    description="Reads a study's results folder; writes the Hugging Face datasets imagefolder layout (metadata.jsonl "
                "next to the images) to --out-dir and, with --parquet-dir, the parquet layout with embedded images.",
    params=(*STUDY, EXPORT_DIR,
            Param("--parquet-dir", metavar="DIR", help="also write the parquet layout (images embedded) here"),
            Param("--manifest-imagefolder", metavar="FILE.json",
                  help="write the imagefolder manifest here, outside the folder (default: inside it)"),
            Param("--manifest-parquet", metavar="FILE.json",
                  help="write the parquet manifest here, outside the folder (default: inside it)"),
            Param("--verified", metavar="FILE.parquet", help=_VERIFIED),
            _max_shard_bytes("bound on the image bytes of one parquet shard; each split is streamed into "
                             "<split>-0000K-of-0000N.parquet files of at most this size (default: 500 MiB, the size "
                             "`datasets` shards to when it pushes to the Hub)")),
    run=_imagefolder)

CLIP_BENCHMARK = Step(
    "clip-benchmark", help="CLIP_benchmark's webdataset layout for zero-shot retrieval",
    description="Reads a study's results folder; writes its image-caption retrieval set(s) in the webdataset layout "
                "CLIP_benchmark reads (<out-dir>/<config>/dataset_type.txt, test/nshards.txt, test/<k>.tar with "
                "<key>.png + <key>.txt): evaluate with `clip_benchmark eval --dataset wds/<config> --dataset_root "
                "<out-dir>/<config> --task zeroshot_retrieval`.",
    params=(*STUDY, EXPORT_DIR, MANIFEST,
            Param("--verified", metavar="FILE.parquet", help=f"{_VERIFIED} (none if it keeps no row)"),
            _max_shard_bytes("bound on the image bytes of one tar shard (default: 500 MiB)")),
    run=_clip_benchmark)

CARD = Step(
    "card", help="dataset card README.md from provenance, manifests and the study's summaries",
    description="Reads the run's provenance JSON, the exported folders' manifests and the study's summaries; writes "
                "the dataset card (README.md).",
    params=(*STUDY,
            Param("--provenance", required=True, metavar="FILE.json", help="the run's provenance.json"),
            Param("--export-dir", required=True, metavar="DIR", help="folder holding release/ imagefolder/ parquet/"),
            OUT.but(required=False, metavar="FILE.md", help="card path (default: <export-dir>/README.md)"),
            Param("--manifest", action="append", default=[], metavar="LAYOUT=FILE.json",
                  help="a layout's manifest kept outside its folder (repeatable; default: the folder's own)"),
            Param("--filter-card", action="append", default=[], metavar="DIR",
                  help="an audited filter's card folder (`filters study-card --out-dir`; repeatable): copied to "
                       "filter_cards/<name>/ beside the card and listed in its Filter cards section")),
    run=_card)

EXPORT = Step(
    "export", help="export a study's data (release / imagefolder / parquet / CLIP_benchmark) and its dataset card",
    description="Export a study's results: the published release layout, the generic Hugging Face imagefolder and "
                "parquet layouts, CLIP_benchmark's retrieval webdataset, and a dataset card (README.md) built from "
                "the run's provenance.",
    steps=(RELEASE, IMAGEFOLDER, CLIP_BENCHMARK, CARD))

register = registrar(EXPORT)
