"""``counterfactory spurious``: the spurious-correlation retrieval study's steps (Kim et al. 2023); ``spurious`` is
the study's short name (rules ``spurious_*``; package :mod:`counterfactory.studies.spurious_retrieval`); the old
group name ``odmap`` is kept as an alias. ``spurious select`` (§3.1): which (image, class) pairs to remove for the
synthetic ODmAP@k images, from COCO instances or Flickr30k Entities boxes
(:mod:`counterfactory.studies.spurious_retrieval.regions`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from . import fraction

log = logging.getLogger(__name__)



def _csv_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of class names")
    return items


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "spurious",
        aliases=["odmap"],
        help="spurious-correlation retrieval study (ODmAP@k): region selection for object-removed images",
        description="The spurious-correlation retrieval study (Kim et al. 2023, 'Exposing and Mitigating Spurious "
                    "Correlations for Cross-Modal Retrieval'): select objects to remove, inpaint them away, caption "
                    "the results, fine-tune retrieval models on the mixtures and measure ODmAP@k and R@K. The old "
                    "group name odmap is an alias.",
    )
    from . import add_renamed

    sub = parser.add_subparsers(dest="spurious_command", metavar="<spurious command>")
    sub.required = True
    p = sub.add_parser(
        "select",
        help="select the classes to remove per image (§3.1 Eq. 1-3, thresholds alpha1/alpha2/alpha3)",
        description="Reads COCO instances or Flickr30k Entities boxes (or the study's dataset from the config); "
                    "writes a selection table with one row per (image, class): removed alone (every other class "
                    "overlaps < alpha1), together with the classes it covers by > alpha2, or skipped (removed area "
                    "vs alpha3, or overlaps in between); with --dataset also the removal requests, and optionally a "
                    "CSV summary. Settings: spurious_retrieval.selection of the --config files, then the options "
                    "given here.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", choices=("coco", "flickr30k"),
                     help="the study's dataset from spurious_retrieval.data of --config (Karpathy splits); also "
                          "writes --out-requests")
    src.add_argument("--instances", metavar="FILE.json", help="COCO instances_<split>.json")
    src.add_argument("--entities-root", metavar="DIR",
                     help="Flickr30k Entities folder holding Sentences/ and Annotations/")
    p.add_argument("--out", required=True, metavar="OUT.parquet", help="selection table to write (atomic)")
    add_renamed(p, "--out-requests", "--requests-out", metavar="FILE.parquet",
                help="with --dataset: one removal request per selected row (boxes, classes left, split, shard)")
    add_renamed(p, "--out-summary", "--summary-out", metavar="FILE.csv",
                help="counts: candidates, selected (single / multi), skipped per reason")
    p.add_argument("--config", nargs="+", default=[], metavar="FILE",
                   help="YAML files (later win) whose spurious_retrieval.selection section sets the defaults")
    p.add_argument("--alpha1", type=fraction, help="single-class removal: every other overlap < alpha1 (0.4)")
    p.add_argument("--alpha2", type=fraction, help="multi-class removal: classes with overlap > alpha2 (0.8)")
    p.add_argument("--alpha3", type=fraction, help="largest removed share of the image (0.7)")
    p.add_argument("--rule", choices=("pseudocode", "text"),
                   help="pseudocode: appendix listing (default); text: Eq. 1-3 as written (see the module docs)")
    p.add_argument("--mask-mode", choices=("box", "segmentation"),
                   help="box (default, the paper: union of boxes) or segmentation (COCO masks, via pycocotools)")
    p.add_argument("--classes", type=_csv_list, metavar="A,B,...",
                   help="only these classes (default: every COCO class; Flickr30k: people, animals, vehicles, "
                        "instruments)")
    p.set_defaults(func=_select)
    _register_steps(sub)


def _load(paths):
    from ..config import load_config

    return load_config(paths, study="spurious_retrieval")


def _params(args) -> dict:
    from ..config import deep_merge, read_yaml
    from ..studies.spurious_retrieval import regions

    cfg: dict = {}
    if args.dataset:
        cfg = _load(args.config)
    else:
        for path in args.config:
            cfg = deep_merge(cfg, read_yaml(Path(path)))
    section = dict(regions.config_section(cfg))
    for key in ("alpha1", "alpha2", "alpha3", "rule", "mask_mode", "classes"):
        value = getattr(args, key)
        if value is not None:
            section[key] = value
    return regions.settings({regions.SECTION[0]: {regions.SECTION[1]: section}})


def _write_summary(path, counts: dict) -> None:
    """The selection funnel as a two-column CSV (count, value)."""
    if not path:
        return
    import pandas as pd

    from ..io import write_csv

    rows = [(k, counts[k]) for k in ("images", "candidates", "selected", "single", "multi")]
    rows += [(f"skipped: {reason}", n) for reason, n in counts["skipped"].items()]
    write_csv(path, pd.DataFrame(rows, columns=["count", "value"]))


def _select(args) -> int:
    from ..io import write_parquet
    from ..studies.spurious_retrieval import regions

    params = _params(args)
    if args.dataset:
        from ..studies.spurious_retrieval import data, settings

        if not args.out_requests:
            raise SystemExit("spurious select --dataset needs --out-requests")
        table, requests = data.select(settings.settings(_load(args.config)), params, args.dataset)
        write_parquet(args.out, table)
        write_parquet(args.out_requests, requests)
        _write_summary(args.out_summary, regions.summary(table))
        print(f"{regions.format_summary(regions.summary(table))}; {len(requests)} requests -> {args.out_requests}")
        return 0
    if args.instances:
        images, objects, known = regions.coco_objects(args.instances)
        source = args.instances
    else:
        images, objects, known = regions.flickr_objects(args.entities_root, params["classes"])
        source = args.entities_root
    table = regions.select_regions(images, objects, params, source=source, known_classes=known)
    write_parquet(args.out, table)
    _write_summary(args.out_summary, regions.summary(table))
    print(f"{regions.format_summary(regions.summary(table))} -> {args.out}")
    return 0


# --------------------------------------------------------------------------------------------------------------
# the study's other steps (rules/study_spurious_retrieval.smk)
# --------------------------------------------------------------------------------------------------------------
def _register_steps(sub) -> None:
    from . import add_config_option as config
    from . import add_label_option, add_progress_option, add_shard_job_options

    c = sub.add_parser("captions", help="§3.2-3.3: the ODmAP gallery (train+val+test captions with the classes they "
                       "mention) and the synthetic captions (noun-phrase removal, prompts)",
                       description="Reads the dataset's captions (Karpathy splits) and the removal requests; writes "
                                   "the ODmAP gallery (every caption with the classes it mentions) and the synthetic "
                                   "captions of the object-removed images (noun-phrase removal, prompts).")
    config(c)
    c.add_argument("--dataset", required=True, choices=("coco", "flickr30k"), help="the study's dataset")
    c.add_argument("--requests", required=True, metavar="FILE.parquet", help="from `spurious select --out-requests`")
    c.add_argument("--out-gallery", required=True, metavar="FILE.parquet", help="the gallery captions")
    c.add_argument("--out-synthetic", required=True, metavar="FILE.parquet", help="the synthetic captions")
    c.set_defaults(func=_captions)

    i = sub.add_parser("inpaint", help="§3.1, Table 3: remove the requested classes of one shard of images "
                       "(lama, opencv, zero, mean, blur); resumable",
                       description="Reads one shard of removal requests and its images (and the inpaint role for "
                                   "lama); writes the object-removed images and the shard's manifest to --out-dir.")
    add_shard_job_options(i, "--requests", "FILE.parquet", "removal requests (spurious select --out-requests)")
    i.add_argument("--method", required=True, choices=("lama", "opencv", "zero", "mean", "blur"),
                   help="how the objects are removed: LaMa inpainting, OpenCV inpainting, or filling with zeros, the "
                        "mean colour or a blur")
    i.set_defaults(func=_inpaint)

    k = sub.add_parser("captioner", help="Table 3 'capt. model': caption the inpainted train images with the "
                       "captioner role",
                       description="Reads the removal requests, the inpainting shard folders and the captioner "
                                   "role; writes a caption for every inpainted training image (parquet).")
    config(k)
    k.add_argument("--requests", required=True, metavar="FILE.parquet", help="from `spurious select --out-requests`")
    k.add_argument("--inpainted", nargs="+", required=True, metavar="DIR", help="inpainting shard folders")
    k.add_argument("--out", required=True, metavar="FILE.parquet", help="the synthetic captions of the captioner")
    add_progress_option(k)
    k.set_defaults(func=_captioner)

    m = sub.add_parser("manifests", help="§4.1, Table 3, Figure 4: training sets D, D + D' per variant and ratio, and "
                       "the ODmAP queries",
                       description="Reads the removal requests, the gallery, the synthetic captions and the "
                                   "inpainting shard folders; writes the training sets D and D + D' per variant and "
                                   "ratio and the ODmAP queries to --out-dir.")
    config(m)
    m.add_argument("--dataset", required=True, choices=("coco", "flickr30k"), help="the study's dataset")
    m.add_argument("--requests", required=True, metavar="FILE.parquet", help="from `spurious select --out-requests`")
    m.add_argument("--gallery", required=True, metavar="FILE.parquet", help="from `spurious captions`")
    m.add_argument("--synthetic", required=True, nargs="+", metavar="FILE.parquet",
                   help="synthetic captions (spurious captions, spurious captioner)")
    m.add_argument("--inpainted", action="append", default=[], metavar="METHOD=DIR",
                   help="an inpainting shard folder of METHOD (repeatable)")
    m.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the manifests and the queries")
    m.set_defaults(func=_manifests)

    r = sub.add_parser("run", help="§4: fine-tune one model role on one mixture (one seed), or score it zero-shot; "
                       "ODmAP@k and R@K",
                       description="Reads the manifests and the gallery and the model role; fine-tunes it on one "
                                   "mixture for one seed (or scores it zero-shot) and writes metrics.csv (ODmAP@k "
                                   "and R@K, a runs table) to --out-dir.")
    config(r)
    r.add_argument("--dataset", required=True, choices=("coco", "flickr30k"), help="the study's dataset")
    r.add_argument("--role", required=True, help="model role (models.<role>)")
    r.add_argument("--mixture", required=True, help="zeroshot, finetune, ours, a Table 3 variant or ratio_<r>")
    r.add_argument("--seed", type=int, required=True, help="training seed")
    r.add_argument("--data-seed", type=int, required=True, help="seed of the data order")
    r.add_argument("--manifests", required=True, metavar="DIR", help="from `spurious manifests`")
    r.add_argument("--gallery", required=True, metavar="FILE.parquet", help="from `spurious captions --out-gallery`")
    r.add_argument("--out-dir", required=True, metavar="DIR", help="the run's folder (metrics.csv)")
    add_progress_option(r)
    r.set_defaults(func=_run)

    t = sub.add_parser("tables", help="Tables 1-3 and Figure 4 from the summary of every run",
                       description="Reads the stats summary of every run; writes Tables 1-3 as Markdown, LaTeX and "
                                   "CSV and Figure 4.")
    config(t)
    t.add_argument("--summary", required=True, metavar="FILE.csv", help="from `counterfactory stats summarize`")
    t.add_argument("--out-md", required=True, metavar="FILE.md", help="the tables as Markdown")
    t.add_argument("--out-tex", required=True, metavar="FILE.tex", help="the tables as LaTeX")
    t.add_argument("--out-csv", required=True, metavar="FILE.csv", help="the tables as CSV")
    t.add_argument("--out-html", metavar="FILE.html", help="the tables as an HTML page (what the report shows)")
    t.add_argument("--out-figure", required=True, metavar="FILE", help="Figure 4 (image file)")
    add_label_option(t, "display name of a model role (repeatable; default: the paper's CLIP / BLIP / VSE++)")
    t.set_defaults(func=_tables)


def _nltk(cfg) -> None:
    from ..data.nltk_data import ensure_nltk_data
    from ..settings import config_value

    section = cfg.get("nltk") or {}
    ensure_nltk_data(config_value(section, "nltk.data_dir"), section.get("source"))


def _classes(requests) -> list[str]:
    return sorted({c for col in ("removed_categories", "present_categories") for v in requests[col] for c in v})


def _captions(args) -> int:
    from ..io import write_parquet
    from ..studies.spurious_retrieval import captions, data, settings

    cfg = _load(args.config)
    s = settings.settings(cfg)
    requests = data.read_requests(args.requests)
    if args.dataset == "coco":
        _nltk(cfg)
    table = data.load_captions(s, args.dataset)
    classes = _classes(requests)
    gallery = captions.gallery(s, args.dataset, table, classes)
    syn = captions.synthetic(s, args.dataset, requests, table, ("np_removal", "prompt"), classes)
    write_parquet(args.out_gallery, gallery)
    write_parquet(args.out_synthetic, syn)
    counts = syn.groupby("method").size().to_dict()
    print(f"gallery: {len(gallery)} captions ({sum(bool(len(m)) for m in gallery['mentions'])} mention a class); "
          f"synthetic captions: {counts}")
    return 0


def _inpaint(args) -> int:
    import torch

    from ..generation.inpaint import inpaint_shard
    from ..studies.spurious_retrieval import data, settings

    if args.threads:
        torch.set_num_threads(args.threads)
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
    from ..studies.spurious_retrieval import captions, data, settings
    from ..studies.spurious_retrieval.manifests import inpainted_files

    cfg = _load(args.config)
    s = settings.settings(cfg)
    requests = data.read_requests(args.requests)
    files = inpainted_files(args.inpainted)
    train = requests[requests["split"] == "train"]
    rows = captions.captioner(cfg, s, train, files, progress=not args.no_progress)
    write_parquet(args.out, rows)
    print(f"captioner: {len(rows)} captions of {len(train)} train images -> {args.out}")
    return 0


def _manifests(args) -> int:
    import pandas as pd

    from ..studies.spurious_retrieval import data, manifests, settings

    s = settings.settings(_load(args.config))
    from . import key_values

    dirs: dict[str, list[str]] = {}
    for method, folder in key_values(args.inpainted, "--inpainted", "METHOD=DIR"):
        dirs.setdefault(method, []).append(folder)
    files = {method: manifests.inpainted_files(folders) for method, folders in dirs.items()}
    synthetic = pd.concat([pd.read_parquet(p) for p in args.synthetic], ignore_index=True)
    summary = manifests.write_manifests(s, args.dataset, data.read_requests(args.requests),
                                        pd.read_parquet(args.gallery), synthetic, files, args.out_dir)
    print(summary.to_string(index=False))
    return 0


def _run(args) -> int:
    from ..studies.spurious_retrieval import runs

    rows = runs.run(_load(args.config), args.dataset, args.role, args.mixture, args.seed, args.data_seed,
                    args.manifests, args.gallery, args.out_dir, progress=not args.no_progress)
    for r in rows.itertuples():
        log.info("%s %s seed %d: %s = %.2f", r.experiment, r.mixture, r.seed, r.metric, r.value)
    return 0


def _tables(args) -> int:
    from ..studies.spurious_retrieval import runs

    from . import role_labels

    runs.write_tables(args.summary, _load(args.config), args.out_md, args.out_tex, args.out_csv, args.out_figure,
                      out_html=args.out_html,
                      labels=role_labels(args.label))
    print(f"tables -> {args.out_md}, figure -> {args.out_figure}")
    return 0
