"""``counterfactory spurious``: the spurious-correlation retrieval study's steps (Kim et al. 2023); ``spurious`` is
the study's short name (rules ``spurious_*``; package :mod:`counterfactory.studies.spurious_retrieval`); the old
group name ``odmap`` is kept as an alias. ``spurious select`` (§3.1): which (image, class) pairs to remove for the
synthetic ODmAP@k images, from COCO instances or Flickr30k Entities boxes
(:mod:`counterfactory.studies.spurious_retrieval.regions`). This module is the command line only, declared as data
(``commands.Step``); the work is done by the study's step modules (``selection``, ``captions``, ``manifests``,
``runs``) and :mod:`counterfactory.generation.inpaint`."""

from __future__ import annotations

import argparse
import logging

from . import (CONFIG, LABEL, NO_PROGRESS, OUT, OUT_CSV, OUT_DIR, OUT_HTML, OUT_MD, OUT_TEX, OneOf, Param, Step,
               fraction, key_values, lazy_module, registrar, role_labels, shard_job_params, use_threads)

log = logging.getLogger(__name__)

# the study's step modules, each imported when its subcommand runs (pandas, torch); building the parser does not
_PKG = "counterfactory.studies.spurious_retrieval"
captions, data, manifests, regions, runs, selection, settings = (
    lazy_module(f"{_PKG}.{name}") for name in ("captions", "data", "manifests", "regions", "runs", "selection",
                                               "settings"))


def _csv_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of class names")
    return items


def _load(paths):
    from ..config import load_config

    return load_config(paths, study="spurious_retrieval")


# ------------------------------------------------------------------------------------------- handlers


def _select(args) -> int:
    overrides = {key: getattr(args, key) for key in selection.OVERRIDES}
    if args.dataset:
        cfg = _load(args.config)
        params = selection.params(cfg, overrides)
        if not args.out_requests:
            raise SystemExit("spurious select --dataset needs --out-requests")
        table, requests = selection.select_dataset_files(cfg, params, args.dataset, args.out, args.out_requests,
                                                         args.out_summary)
        print(f"{regions.format_summary(regions.summary(table))}; {len(requests)} requests -> {args.out_requests}")
        return 0
    params = selection.params(selection.yaml_config(args.config), overrides)
    table = selection.select_boxes_files(params, args.out, args.out_summary, instances=args.instances,
                                         entities_root=args.entities_root)
    print(f"{regions.format_summary(regions.summary(table))} -> {args.out}")
    return 0


def _captions(args) -> int:
    gallery, syn = captions.write_captions(_load(args.config), args.dataset, args.requests, args.out_gallery,
                                           args.out_synthetic)
    counts = syn.groupby("method").size().to_dict()
    print(f"gallery: {len(gallery)} captions ({sum(bool(len(m)) for m in gallery['mentions'])} mention a class); "
          f"synthetic captions: {counts}")
    return 0


def _inpaint(args) -> int:
    from ..generation.inpaint import inpaint_shard

    use_threads(args)
    cfg = _load(args.config)
    s = settings.settings(cfg)
    requests = data.read_requests(args.requests)
    part = requests[requests["shard"] == args.shard]
    result = inpaint_shard(part, args.method, args.out_dir, batch_size=int(s["inpaint"]["batch_size"]),
                           device=cfg["device"] if args.method == "lama" else "cpu",
                           settings=settings.inpaint_settings(s), cfg=cfg,
                           source=args.requests, progress=not args.no_progress)
    print(f"shard {args.shard} ({args.method}): {result}")
    return 0


def _captioner(args) -> int:
    from ..io import write_parquet

    cfg = _load(args.config)
    s = settings.settings(cfg)
    requests = data.read_requests(args.requests)
    files = manifests.inpainted_files(args.inpainted)
    train = requests[requests["split"] == "train"]
    rows = captions.captioner(cfg, s, train, files, progress=not args.no_progress)
    write_parquet(args.out, rows)
    print(f"captioner: {len(rows)} captions of {len(train)} train images -> {args.out}")
    return 0


def _manifests(args) -> int:
    s = settings.settings(_load(args.config))
    dirs: dict[str, list[str]] = {}
    for method, folder in key_values(args.inpainted, "--inpainted", "METHOD=DIR"):
        dirs.setdefault(method, []).append(folder)
    summary = manifests.write_manifests_files(s, args.dataset, args.requests, args.gallery, args.synthetic, dirs,
                                              args.out_dir)
    print(summary.to_string(index=False))
    return 0


def _run(args) -> int:
    rows = runs.run(_load(args.config), args.dataset, args.role, args.mixture, args.seed, args.data_seed,
                    args.manifests, args.gallery, args.out_dir, progress=not args.no_progress)
    for r in rows.itertuples():
        log.info("%s %s seed %d: %s = %.2f", r.experiment, r.mixture, r.seed, r.metric, r.value)
    return 0


def _tables(args) -> int:
    runs.write_tables(args.summary, _load(args.config), args.out_md, args.out_tex, args.out_csv, args.out_figure,
                      out_html=args.out_html,
                      labels=role_labels(args.label))
    print(f"tables -> {args.out_md}, figure -> {args.out_figure}")
    return 0


# ------------------------------------------------------------------------------------------- declarations

DATASET = Param("--dataset", required=True, choices=("coco", "flickr30k"), help="the study's dataset")
REQUESTS = Param("--requests", required=True, metavar="FILE.parquet", help="from `spurious select --out-requests`")

SELECT = Step(
    "select", help="select the classes to remove per image (§3.1 Eq. 1-3, thresholds alpha1/alpha2/alpha3)",
    description="Reads COCO instances or Flickr30k Entities boxes (or the study's dataset from the config); "
                "writes a selection table with one row per (image, class): removed alone (every other class "
                "overlaps < alpha1), together with the classes it covers by > alpha2, or skipped (removed area "
                "vs alpha3, or overlaps in between); with --dataset also the removal requests, and optionally a "
                "CSV summary. Settings: spurious_retrieval.selection of the --config files, then the options "
                "given here.",
    params=(
        OneOf((Param("--dataset", choices=("coco", "flickr30k"),
                     help="the study's dataset from spurious_retrieval.data of --config (Karpathy splits); also "
                          "writes --out-requests"),
               Param("--instances", metavar="FILE.json", help="COCO instances_<split>.json"),
               Param("--entities-root", metavar="DIR",
                     help="Flickr30k Entities folder holding Sentences/ and Annotations/")),
              required=True),
        OUT.but(metavar="OUT.parquet", help="selection table to write (atomic)"),
        Param("--out-requests", former=("--requests-out",), metavar="FILE.parquet",
              help="with --dataset: one removal request per selected row (boxes, classes left, split, shard)"),
        Param("--out-summary", former=("--summary-out",), metavar="FILE.csv",
              help="counts: candidates, selected (single / multi), skipped per reason"),
        Param("--config", nargs="+", default=[], metavar="FILE",
              help="YAML files (later win) whose spurious_retrieval.selection section sets the defaults"),
        Param("--alpha1", type=fraction, help="single-class removal: every other overlap < alpha1 (0.4)"),
        Param("--alpha2", type=fraction, help="multi-class removal: classes with overlap > alpha2 (0.8)"),
        Param("--alpha3", type=fraction, help="largest removed share of the image (0.7)"),
        Param("--rule", choices=("pseudocode", "text"),
              help="pseudocode: appendix listing (default); text: Eq. 1-3 as written (see the module docs)"),
        Param("--mask-mode", choices=("box", "segmentation"),
              help="box (default, the paper: union of boxes) or segmentation (COCO masks, via pycocotools)"),
        Param("--classes", type=_csv_list, metavar="A,B,...",
              help="only these classes (default: every COCO class; Flickr30k: people, animals, vehicles, "
                   "instruments)"),
    ),
    run=_select)

# the study's other steps (rules/study_spurious_retrieval.smk)
CAPTIONS = Step(
    "captions", help="§3.2-3.3: the ODmAP gallery (train+val+test captions with the classes they mention) and the "
                     "synthetic captions (noun-phrase removal, prompts)",
    description="Reads the dataset's captions (Karpathy splits) and the removal requests; writes the ODmAP gallery "
                "(every caption with the classes it mentions) and the synthetic captions of the object-removed "
                "images (noun-phrase removal, prompts).",
    params=(CONFIG, DATASET, REQUESTS,
            Param("--out-gallery", required=True, metavar="FILE.parquet", help="the gallery captions"),
            Param("--out-synthetic", required=True, metavar="FILE.parquet", help="the synthetic captions")),
    run=_captions)

INPAINT = Step(
    "inpaint", help="§3.1, Table 3: remove the requested classes of one shard of images (lama, opencv, zero, mean, "
                    "blur); resumable",
    description="Reads one shard of removal requests and its images (and the inpaint role for lama); writes the "
                "object-removed images and the shard's manifest to --out-dir.",
    params=(*shard_job_params("--requests", "FILE.parquet", "removal requests (spurious select --out-requests)"),
            Param("--method", required=True, choices=("lama", "opencv", "zero", "mean", "blur"),
                  help="how the objects are removed: LaMa inpainting, OpenCV inpainting, or filling with zeros, the "
                       "mean colour or a blur")),
    run=_inpaint)

CAPTIONER = Step(
    "captioner", help="Table 3 'capt. model': caption the inpainted train images with the captioner role",
    description="Reads the removal requests, the inpainting shard folders and the captioner role; writes a caption "
                "for every inpainted training image (parquet).",
    params=(CONFIG, REQUESTS,
            Param("--inpainted", nargs="+", required=True, metavar="DIR", help="inpainting shard folders"),
            OUT.but(metavar="FILE.parquet", help="the synthetic captions of the captioner"),
            NO_PROGRESS),
    run=_captioner)

MANIFESTS = Step(
    "manifests", help="§4.1, Table 3, Figure 4: training sets D, D + D' per variant and ratio, and the ODmAP queries",
    description="Reads the removal requests, the gallery, the synthetic captions and the inpainting shard folders; "
                "writes the training sets D and D + D' per variant and ratio and the ODmAP queries to --out-dir.",
    params=(CONFIG, DATASET, REQUESTS,
            Param("--gallery", required=True, metavar="FILE.parquet", help="from `spurious captions`"),
            Param("--synthetic", required=True, nargs="+", metavar="FILE.parquet",
                  help="synthetic captions (spurious captions, spurious captioner)"),
            Param("--inpainted", action="append", default=[], metavar="METHOD=DIR",
                  help="an inpainting shard folder of METHOD (repeatable)"),
            OUT_DIR.but(help="folder for the manifests and the queries")),
    run=_manifests)

RUN = Step(
    "run", help="§4: fine-tune one model role on one mixture (one seed), or score it zero-shot; ODmAP@k and R@K",
    description="Reads the manifests and the gallery and the model role; fine-tunes it on one mixture for one seed "
                "(or scores it zero-shot) and writes metrics.csv (ODmAP@k and R@K, a runs table) to --out-dir.",
    params=(CONFIG, DATASET,
            Param("--role", required=True, help="model role (models.<role>)"),
            Param("--mixture", required=True, help="zeroshot, finetune, ours, a Table 3 variant or ratio_<r>"),
            Param("--seed", type=int, required=True, help="training seed"),
            Param("--data-seed", type=int, required=True, help="seed of the data order"),
            Param("--manifests", required=True, metavar="DIR", help="from `spurious manifests`"),
            Param("--gallery", required=True, metavar="FILE.parquet", help="from `spurious captions --out-gallery`"),
            OUT_DIR.but(help="the run's folder (metrics.csv)"),
            NO_PROGRESS),
    run=_run)

TABLES = Step(
    "tables", help="Tables 1-3 and Figure 4 from the summary of every run",
    description="Reads the stats summary of every run; writes Tables 1-3 as Markdown, LaTeX and CSV and Figure 4.",
    params=(CONFIG,
            Param("--summary", required=True, metavar="FILE.csv", help="from `counterfactory stats summarize`"),
            OUT_MD.but(required=True, help="the tables as Markdown"),
            OUT_TEX.but(required=True, help="the tables as LaTeX"),
            OUT_CSV.but(required=True, help="the tables as CSV"),
            OUT_HTML.but(help="the tables as an HTML page (what the report shows)"),
            Param("--out-figure", required=True, metavar="FILE", help="Figure 4 (image file)"),
            LABEL.but(help="display name of a model role (repeatable; default: the paper's CLIP / BLIP / VSE++)")),
    run=_tables)

SPURIOUS = Step(
    "spurious", aliases=("odmap",), metavar="<spurious command>",
    help="spurious-correlation retrieval study (ODmAP@k): region selection for object-removed images",
    description="The spurious-correlation retrieval study (Kim et al. 2023, 'Exposing and Mitigating Spurious "
                "Correlations for Cross-Modal Retrieval'): select objects to remove, inpaint them away, caption the "
                "results, fine-tune retrieval models on the mixtures and measure ODmAP@k and R@K. The old group "
                "name odmap is an alias.",
    steps=(SELECT, CAPTIONS, INPAINT, CAPTIONER, MANIFESTS, RUN, TABLES))

register = registrar(SPURIOUS)
