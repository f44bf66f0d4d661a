"""``counterfactory social``: the SocialCounterfactuals steps (caption sets, filters, bias probing,
debiasing, release). This module is the command line only; the work is done by the step modules of
:mod:`counterfactory.studies.social_counterfactuals`, :mod:`counterfactory.generation.sets` and
:mod:`counterfactory.export.social_release`."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, InputError
from ..studies.social_counterfactuals import STUDY
from ..studies.social_counterfactuals import debias_segments as social_debias_segments
from . import (add_config_option, add_label_option, add_progress_option, add_renamed, add_shard_job_options,
               lazy_module, role_labels)

# the step modules, each imported when its subcommand runs (the filters and probing import torch; tables do not)
_PKG = "counterfactory.studies.social_counterfactuals"
captions, debias, debias_tables, external, filtering, probe_report, probing, task_eval = (
    lazy_module(f"{_PKG}.{name}") for name in ("captions", "debias", "debias_tables", "external", "filtering",
                                               "probe_report", "probing", "task_eval"))
release = lazy_module("counterfactory.export.social_release")


def register(sub) -> None:
    p = sub.add_parser("social", help="SocialCounterfactuals: caption sets, filters, bias probing, debiasing",
                       description="The SocialCounterfactuals study: caption sets, Prompt-to-Prompt image sets, the "
                                   "three filter stages, bias probing (also on PATA and VisoGender), debiasing by "
                                   "fine-tuning, and the release in the published layout.")
    s = p.add_subparsers(dest="social_command", metavar="<step>")
    s.required = True
    add_captions(s)
    add_generate(s)
    add_filtering(s)
    add_probing(s)
    add_external(s)
    add_image_quality(s)
    add_debias(s)
    add_release(s)


def _load_config(paths):
    from ..config import load_config

    return load_config(paths, study=STUDY)


# ------------------------------------------------------------------------------------------- captions


def add_captions(subparsers) -> None:
    """Register ``counterfactory social captions``."""
    p = subparsers.add_parser("captions", help="caption sets from prefix, attribute and occupation lists (§3.2)",
                              description="Reads the prefix, attribute and occupation lists of the config; writes "
                                          "the caption table (one row per caption of every caption set).")
    add_config_option(p, help=f"a full config with a '{STUDY}:' section, or a YAML file with the keys "
                              f"{', '.join(captions.SECTION_KEYS)} at top level (repeat to merge; later files win)")
    p.add_argument("--out", required=True, metavar="FILE.parquet", help="caption table (one row per caption)")
    p.set_defaults(func=_cmd_captions)


def _cmd_captions(args) -> int:
    counts = captions.run(args.config, args.out)
    for r in counts.itertuples(index=False):
        print(f"{r.segment}: {r.sets} sets x {r.captions_per_set} = {r.captions} captions")
    print(f"total: {int(counts['sets'].sum())} sets, {int(counts['captions'].sum())} captions -> {args.out}")
    return 0


# ------------------------------------------------------------------------------------------- set generation


def add_generate(subparsers) -> None:
    """Register ``generate`` and ``generate-merge``: over-generation of counterfactual image sets (§3.3) for one
    shard of caption sets, and the merge of the shards (the work: :mod:`counterfactory.generation.sets`)."""
    g = subparsers.add_parser(
        "generate",
        help="over-generate Prompt-to-Prompt image sets for one shard of caption sets (§3.3)",
        description="SocialCounterfactuals §3.3: for every caption set of the shard (sets ranked "
                    "shard*S .. (shard+1)*S-1 in sorted set_id order, S = images.set_shard_size), generate "
                    "images.candidates_per_set candidate sets (paper: 100), each with p ~ U(0.1, 0.9) and "
                    "guidance ~ U(7.5, 15), all members of a candidate in one batched UNet call sharing the base "
                    "caption's attention. Writes OUT_DIR/images/<set_id>/c<candidate>_m<member>.png, "
                    "OUT_DIR/candidates.parquet (one row per image) and OUT_DIR/summary.json. Finished sets are "
                    "cached in OUT_DIR/work/, so rerunning a killed job resumes and gives identical files. "
                    "No filtering here: the §3.4 filters are later steps.",
    )
    add_shard_job_options(g, "--sets", "SETS.parquet",
                          "caption-set table (set_id, member_index, caption, segment, prefix, subject, a1_type, a1, "
                          "a2_type, a2)")
    g.set_defaults(func=_cmd_generate)

    m = subparsers.add_parser(
        "generate-merge",
        help="concatenate the set-generation shards into one candidates table",
        description="Read candidates.parquet and summary.json of every shard folder and write OUT_DIR/"
                    "candidates.parquet (sorted by set_id, candidate, member) and OUT_DIR/summary.json. Image "
                    "paths become relative to OUT_DIR (or, with --copy-images, images are hard-linked/copied to "
                    "OUT_DIR/images/). Refused: a missing shard output or shard number, shards made with "
                    "different settings (config_digest) or from different caption-set tables (sets_digest).",
    )
    m.add_argument("--shard-dirs", nargs="+", required=True, metavar="DIR", help="shard output folders")
    m.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the merged table")
    m.add_argument("--copy-images", action="store_true", help="hard-link (else copy) the images into OUT_DIR/images")
    m.set_defaults(func=_cmd_generate_merge)


def _cmd_generate(args) -> int:
    import torch

    from ..generation.sets import run_set_shard

    cfg = _load_config(args.config)
    if args.threads:
        torch.set_num_threads(args.threads)
    s = run_set_shard(cfg, args.sets, args.shard, args.out_dir, progress=not args.no_progress)
    print(f"set shard {args.shard:05d}: {s['sets']} caption sets, {s['candidates_generated']} candidate sets, "
          f"{s['images']} images ({s['unet_evals']} UNet evaluations) -> {args.out_dir}")
    return 0


def _cmd_generate_merge(args) -> int:
    from ..generation.sets import merge_set_shards

    s = merge_set_shards(args.shard_dirs, args.out_dir, copy_images=args.copy_images)
    print(f"merged {s['shards']} set shards: {s['sets']} caption sets, {s['images']} images -> {args.out_dir}")
    return 0


# ------------------------------------------------------------------------------------------- filters


def add_filtering(subparsers) -> None:
    """Register ``filter-clip``, ``filter-nsfw``, ``filter-detect``, ``calibrate``, ``filter-merge`` and
    ``filter-table``."""

    def common(p, stage: bool = True):
        add_config_option(p)
        if stage:
            p.add_argument("--images", required=True, metavar="IMAGES.parquet",
                           help="candidate-image table (one row per image; image_path relative to its folder)")
            p.add_argument("--out", required=True, metavar="KEPT.parquet", help="surviving image rows")
            p.add_argument("--sets", required=True, metavar="SETS.parquet",
                           help="per-candidate-set scores, passed and reason (every set that entered the stage)")
            add_progress_option(p)

    p = subparsers.add_parser("filter-clip", help="stage (a): CLIP image-caption >= 0.2 and image-image > 0.2 (§3.4)",
                              description="Reads the candidate-image table and the CLIP filter role; writes the "
                                          "surviving image rows and one row of scores per candidate set.")
    common(p)
    p.set_defaults(func=_cmd_filter_clip)
    p = subparsers.add_parser("filter-nsfw", help="stage (b): drop sets with an NSFW-flagged image (§3.4, §8.3)",
                              description="Reads the image rows that passed stage (a) and the nsfw role; writes the "
                                          "surviving image rows and one row per candidate set.")
    common(p)
    p.set_defaults(func=_cmd_filter_nsfw)
    p = subparsers.add_parser("filter-detect", help="stage (c): CLIP attribute detectability (§3.4, §8.3, Table 10)",
                              description="Reads the image rows that passed stage (b) (and the caption-set table); "
                                          "writes the surviving image rows and one row of detectability scores per "
                                          "candidate set.")
    common(p)
    p.add_argument("--captions", metavar="SETS.parquet",
                   help="caption-set table (segment and attribute columns; needed when the image table lacks them)")
    p.set_defaults(func=_cmd_filter_detect)
    p = subparsers.add_parser("calibrate", help="learn the detectability thresholds from hand labels (§8.3)",
                              description="Reads filter-detect's set table and your hand labels; writes the learned "
                                          "thresholds (JSON) and an agreement report (CSV). With --write-template it "
                                          "instead writes a label template for a random sample of sets.")
    common(p, stage=False)
    p.add_argument("--sets", required=True, metavar="DETECT_SETS.parquet", help="filter-detect's --sets output")
    p.add_argument("--labels", metavar="LABELS.csv", help="set_id,candidate_index,attribute_type,label (1 keep, 0 not)")
    p.add_argument("--out", metavar="THRESHOLDS.json", help="learned thresholds and agreement")
    p.add_argument("--report", metavar="REPORT.csv", help="agreement per segment and type (CSV)")
    p.add_argument("--write-template", metavar="LABELS.csv",
                   help="instead: write a label template for a random sample of sets (phase 1)")
    p.add_argument("--sample-size", type=int, default=100, help="sets per segment in the template (paper: 100)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed for the template")
    p.set_defaults(func=_cmd_calibrate)
    m = subparsers.add_parser("filter-merge", help="concatenate the filter stages' outputs of every generation shard",
                              description="Reads the per-shard filter folders; writes the concatenated clip / nsfw "
                                          "/ kept tables and their set tables to --out-dir.")
    m.add_argument("--shard-dirs", nargs="+", required=True, metavar="DIR",
                   help="per-shard filter folders (clip / nsfw / kept tables and their set tables)")
    m.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the merged tables")
    m.set_defaults(func=_cmd_filter_merge)
    p = subparsers.add_parser("filter-table", help="Table 11: candidate sets remaining after each stage",
                              description="Reads every generated image and the set tables of the three filter "
                                          "stages; writes Table 11 (candidate sets remaining after each stage) as "
                                          "CSV and Markdown.")
    common(p, stage=False)
    p.add_argument("--candidates", required=True, metavar="IMAGES.parquet", help="every generated image")
    p.add_argument("--clip", required=True, metavar="SETS.parquet", help="filter-clip --sets output")
    p.add_argument("--nsfw", required=True, metavar="SETS.parquet", help="filter-nsfw --sets output")
    p.add_argument("--detect", required=True, metavar="SETS.parquet", help="filter-detect --sets output")
    p.add_argument("--captions", metavar="SETS.parquet", help="caption-set table (for segments)")
    add_renamed(p, "--out-csv", "--out", required=True, metavar="TABLE.csv", help="the table as CSV")
    add_renamed(p, "--out-md", "--markdown", metavar="TABLE.md", help="the table as Markdown")
    p.add_argument("--out-html", metavar="TABLE.html", help="the table as an HTML page (what the report shows)")
    p.add_argument("--out-table18-csv", metavar="FILE.csv",
                   help="Table 18: the occupations left after the filters (subject, sets kept, segments); needs --captions")
    p.add_argument("--out-table18-md", metavar="FILE.md", help="Table 18 as the paper prints it (Markdown grid)")
    p.set_defaults(func=_cmd_filter_table)


def _print_stage(summary: dict) -> int:
    print(f"{summary['stage']}: {summary['passed']}/{summary['sets']} candidate sets passed "
          f"({summary['images']} images kept)")
    return 0


def _cmd_filter_clip(args) -> int:
    return _print_stage(filtering.filter_clip_files(_load_config(args.config), args.images, args.out, args.sets,
                                                    progress=not args.no_progress))


def _cmd_filter_nsfw(args) -> int:
    return _print_stage(filtering.filter_nsfw_files(_load_config(args.config), args.images, args.out, args.sets,
                                                    progress=not args.no_progress))


def _cmd_filter_detect(args) -> int:
    return _print_stage(filtering.filter_detect_files(_load_config(args.config), args.images, args.out, args.sets,
                                                      args.captions, progress=not args.no_progress))


def _cmd_calibrate(args) -> int:
    cfg = _load_config(args.config)
    if args.write_template:
        detect_sets = filtering.read_table(args.sets, "detectability set table", (*filtering.SET_KEYS, "segment"))
        from ..io import write_csv

        write_csv(args.write_template, filtering.label_template(detect_sets, args.sample_size, args.seed))
        print(f"label template ({args.sample_size} sets per segment) -> {args.write_template}")
        return 0
    if not args.labels or not args.out:
        raise InputError("calibrate needs --labels and --out (or --write-template). Fix: pass them")
    summary = filtering.calibrate_files(cfg, args.sets, args.labels, args.out, args.report)
    print(f"learned thresholds {summary['thresholds']}; overall accuracy {summary['overall']['accuracy']}")
    return 0


def _cmd_filter_merge(args) -> int:
    counts = filtering.merge_filter_shards(args.shard_dirs, args.out_dir)
    print(counts.to_string(index=False))
    return 0


def _cmd_filter_table(args) -> int:
    _load_config(args.config)
    table = filtering.filter_table_files(args.candidates, args.clip, args.nsfw, args.detect, args.out_csv,
                                         args.out_md, args.captions, out_html=args.out_html,
                                         out_table18_csv=args.out_table18_csv, out_table18_md=args.out_table18_md)
    print(filtering.stage_counts_markdown(table))
    return 0


# ------------------------------------------------------------------------------------------- bias probing


def add_probing(sub) -> None:
    """``counterfactory social probe | probe-tables | probe-plots``."""
    p = sub.add_parser("probe", help="MaxSkew@K, NDKL, Bias@K of neutral occupation queries (§4, §10.1)",
                       description="Reads the kept-images table and the model roles; writes a long CSV of "
                                   "MaxSkew@K, NDKL and Bias@K of neutral occupation queries per role, segment and "
                                   "subject.")
    add_config_option(p)
    p.add_argument("--images", required=True, metavar="FILE.parquet", help="kept-images table")
    p.add_argument("--role", action="append", metavar="ROLE", help="model role (repeatable; default probing.roles)")
    p.add_argument("--segment", action="append", metavar="NAME", help="only these segments (repeatable)")
    p.add_argument("--subject", action="append", metavar="NAME", help="only these subjects (repeatable)")
    p.add_argument("--out", required=True, metavar="FILE.csv", help="long probe table to write")
    p.set_defaults(func=_cmd_probe)

    t = sub.add_parser("probe-tables", help="Tables 2, 12–17 layouts from probe CSVs",
                       description="Reads probe CSVs; writes Tables 2 and 12-17 as Markdown, LaTeX and a long CSV.")
    t.add_argument("--probe", nargs="+", action="extend", required=True, metavar="CSV", help="probe table(s)")
    t.add_argument("--out-md", metavar="FILE.md", help="the tables as Markdown")
    t.add_argument("--out-tex", metavar="FILE.tex", help="the tables as LaTeX")
    t.add_argument("--out-csv", metavar="FILE.csv", help="every table in long form (table, row, column, value)")
    t.add_argument("--out-html", metavar="FILE.html", help="the tables as an HTML page (what the report shows)")
    t.add_argument("--decimals", type=int, default=2, help="decimals shown (default: 2)")
    add_label_option(t)
    t.set_defaults(func=_cmd_probe_tables)

    f = sub.add_parser("probe-plots", help="Figures 3–5 (and 6–13) from probe CSVs",
                       description="Reads probe CSVs; writes Figures 3-5 (and 6-13) as image files to --out-dir.")
    f.add_argument("--probe", nargs="+", action="extend", required=True, metavar="CSV", help="probe table(s)")
    f.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the figures")
    f.add_argument("--subject", action="append", metavar="NAME",
                   help="occupation(s) for the retrieval-proportion figure (default: doctor)")
    f.add_argument("--marginal", default="gender:race", metavar="ATTR:GIVEN",
                   help="Figure 4: marginal attribute and the attribute it is split by (default gender:race)")
    f.add_argument("--format", default="png", choices=("png", "pdf", "svg"), help="image format (default: png)")
    add_label_option(f, "display name of a model role in titles and legends (repeatable; default: the role)")
    f.set_defaults(func=_cmd_probe_plots)


def _cmd_probe(args) -> int:
    from ..io import write_csv

    cfg = _load_config(args.config)
    df = probing.probe(cfg, args.role or [], args.images, segments=args.segment, subjects=args.subject)
    write_csv(args.out, df)
    probing.log.info("wrote %s (%d rows)", args.out, len(df))
    return 0


def _cmd_probe_tables(args) -> int:
    from ..io import write_csv, write_text

    if not (args.out_md or args.out_tex or args.out_csv or args.out_html):
        raise ConfigError("probe-tables: nothing to write. Fix: pass --out-md, --out-tex, --out-csv and/or --out-html")
    tables = probe_report.paper_tables(probing.read_probe(args.probe), labels=role_labels(args.label))
    if args.out_md:
        write_text(args.out_md, probe_report.tables_markdown(tables, args.decimals))
    if args.out_html:
        write_text(args.out_html, probe_report.tables_html(tables, args.decimals))
    if args.out_tex:
        write_text(args.out_tex, probe_report.tables_latex(tables, args.decimals))
    if args.out_csv:
        write_csv(args.out_csv, probe_report.tables_long(tables))
    return 0


def _cmd_probe_plots(args) -> int:
    slug = probe_report.slug
    df = probing.read_probe(args.probe)
    labels = role_labels(args.label)
    df["model"] = df["model"].map(lambda role: labels.get(role, role))    # figures name models as the tables do
    out = Path(args.out_dir)
    probe_report.figure_maxskew_boxplots(df, out / f"maxskew_boxplots.{args.format}")
    attr, _, given = args.marginal.partition(":")
    if given:
        try:
            probe_report.figure_marginal_bars(df, out / f"marginal_{slug(attr)}_by_{slug(given)}.{args.format}", attr,
                                         given)
        except ConfigError as exc:
            probing.log.warning("%s", exc)
    for subj in args.subject or probing.settings(None)["figure_subjects"]:
        for seg in sorted(df[df["subject"] == subj]["segment"].unique()):
            probe_report.figure_retrieval_proportions(df, out / f"proportions_{slug(subj)}_{slug(seg)}.{args.format}",
                                                 subj, seg)
    return 0


# ------------------------------------------------------------------------------------------- PATA / VisoGender


def add_external(sub) -> None:
    """``counterfactory social probe-pata | probe-visogender | probe-external-table`` (§5.3, Table 3)."""
    p = sub.add_parser("probe-pata", help="MaxSkew@K / NDKL / Bias@K on PATA (§5.3, Table 3)",
                       description="Reads the PATA file list, its captions JSON and the downloaded images, and the "
                                   "model roles; writes a long CSV of MaxSkew@K, NDKL and Bias@K per role.")
    add_config_option(p)
    p.add_argument("--role", action="append", metavar="ROLE", help="model role (repeatable; default probing.roles)")
    p.add_argument("--files-list", metavar="pata_fairness.files.lst",
                   help="PATA's list of image files (default: from the config)")
    p.add_argument("--captions-json", metavar="pata_fairness.captions.json",
                   help="PATA's captions JSON (default: from the config)")
    p.add_argument("--image-dir", metavar="DIR", help="folder of the downloaded images")
    p.add_argument("--image-name", metavar="PATTERN", help="file of a record, e.g. '{index}.*' (default)")
    p.add_argument("--out", required=True, metavar="FILE.csv", help="long probe table to write")
    p.set_defaults(func=_cmd_probe_pata)

    v = sub.add_parser("probe-visogender", help="MaxSkew@K / NDKL / Bias@K on VisoGender (§5.3, Table 3)",
                       description="Reads VisoGender's occupation-object and occupation-participant TSVs, the "
                                   "downloaded images and the model roles; writes a long CSV of MaxSkew@K, NDKL and "
                                   "Bias@K per role.")
    add_config_option(v)
    v.add_argument("--role", action="append", metavar="ROLE", help="model role (repeatable; default probing.roles)")
    v.add_argument("--oo-tsv", metavar="OO.tsv", help="VisoGender's occupation-object TSV (default: from the config)")
    v.add_argument("--op-tsv", metavar="OP.tsv",
                   help="VisoGender's occupation-participant TSV (default: from the config)")
    v.add_argument("--image-dir", metavar="DIR", help="folder of the downloaded images")
    v.add_argument("--image-name", metavar="PATTERN", help="file of a row, e.g. '{idx}.*' (default)")
    v.add_argument("--out", required=True, metavar="FILE.csv", help="long probe table to write")
    v.set_defaults(func=_cmd_probe_visogender)

    t = sub.add_parser("probe-external-table", help="Table 3: mean MaxSkew@K per model on PATA / VisoGender",
                       description="Reads the probe CSVs of probe-pata and probe-visogender; writes Table 3 (mean "
                                   "MaxSkew@K per model) as Markdown and CSV.")
    t.add_argument("--results", nargs="+", action="extend", required=True, metavar="CSV",
                   help="probe CSVs of probe-pata / probe-visogender")
    t.add_argument("--out-md", metavar="FILE.md", help="the table as Markdown")
    t.add_argument("--out-csv", metavar="FILE.csv", help="the table as CSV")
    t.set_defaults(func=_cmd_probe_external_table)


def _cmd_probe_pata(args) -> int:
    from ..io import write_csv

    cfg = _load_config(args.config)
    df = external.evaluate_pata(cfg, args.role or [], files_list=args.files_list, captions_json=args.captions_json,
                                image_dir=args.image_dir, image_name=args.image_name)
    write_csv(args.out, df)
    return 0


def _cmd_probe_visogender(args) -> int:
    from ..io import write_csv

    cfg = _load_config(args.config)
    df = external.evaluate_visogender(cfg, args.role or [], oo_tsv=args.oo_tsv, op_tsv=args.op_tsv,
                                      image_dir=args.image_dir, image_name=args.image_name)
    write_csv(args.out, df)
    return 0


def _cmd_probe_external_table(args) -> int:
    import pandas as pd

    from ..errors import input_error
    from ..io import write_csv, write_text

    parts = []
    for p in args.results:
        if not Path(p).is_file():
            raise input_error(p, None, "results table not found", "run probe-pata / probe-visogender first")
        parts.append(pd.read_csv(p, keep_default_na=False, na_values=[""], dtype={"label": str}))
    table = external.external_summary(pd.concat(parts, ignore_index=True))
    if args.out_md:
        write_text(args.out_md, "### Mean MaxSkew@K on real image-text data (Table 3)\n\n"
                   + table.round(3).to_markdown(floatfmt=".3f") + "\n")
    if args.out_csv:
        write_csv(args.out_csv, table.reset_index())
    if not (args.out_md or args.out_csv):
        print(table.round(3).to_markdown(floatfmt=".3f"))
    return 0


# ------------------------------------------------------------------------------------------- image quality


def add_image_quality(sub) -> None:
    """``counterfactory social image-quality-features | image-quality-table`` (§10.3)."""
    p = sub.add_parser("image-quality-features", help="Inception features of one image set (§10.3's FID / IS)",
                       description="Reads one image set (the kept images, VisoGender's or PATA's images, or a "
                                   "reference folder of image_quality.references) and the inception role; writes "
                                   "its pool features and logits (npz).")
    add_config_option(p)
    p.add_argument("--set", required=True, metavar="NAME", dest="image_set",
                   help="social_counterfactuals, visogender, pata, or ref_<i> (the i-th configured reference)")
    p.add_argument("--kept", metavar="kept.parquet", help="the filtered images (filter/kept.parquet)")
    p.add_argument("--out", required=True, metavar="FILE.npz", help="features file to write")
    add_progress_option(p)
    p.set_defaults(func=_cmd_image_quality_features)
    t = sub.add_parser("image-quality-table", help="§10.3: FID against each reference and IS of every set",
                       description="Reads the features files of image-quality-features; writes §10.3's table with "
                                   "the paper's numbers beside ours (Markdown, CSV, HTML).")
    add_config_option(t)
    t.add_argument("--features", nargs="+", required=True, metavar="NAME=FILE.npz",
                   help="features file of every set (image-quality-features' --set and --out)")
    t.add_argument("--out-md", required=True, metavar="FILE.md", help="the table as Markdown")
    t.add_argument("--out-csv", required=True, metavar="FILE.csv", help="the table as CSV (our values)")
    t.add_argument("--out-html", metavar="FILE.html", help="the table as an HTML page (the report's entry)")
    t.set_defaults(func=_cmd_image_quality_table)


def _cmd_image_quality_features(args) -> int:
    from ..device import from_config
    from ..evaluation import image_quality as iq
    from ..models import registry
    from ..studies.social_counterfactuals import image_quality

    cfg = _load_config(args.config)
    paths = image_quality.set_images(cfg, args.image_set, args.kept)
    device, _ = from_config(cfg)
    model = registry.load(cfg, "inception")
    feats, logits = iq.extract(model, paths, batch_size=image_quality.settings(cfg)["batch_size"], device=device,
                               progress=not args.no_progress)
    iq.save_features(args.out, feats, logits, paths)
    print(f"{args.image_set}: {len(paths)} images, features {feats.shape[1]}, classes {logits.shape[1]} -> {args.out}")
    return 0


def _cmd_image_quality_table(args) -> int:
    from ..io import write_csv, write_text
    from ..render import html_page, render_html, render_markdown
    from ..studies.social_counterfactuals import image_quality

    cfg = _load_config(args.config)
    features = {}
    for item in args.features:
        name, sep, path = item.partition("=")
        if not sep or not path:
            raise ConfigError(f"--features {item!r}: expected NAME=FILE.npz. Fix: e.g. --features pata=pata.npz")
        features[name] = path
    missing = [n for n in image_quality.set_names(cfg) if n not in features]
    if missing:
        raise ConfigError(f"--features lacks {', '.join(missing)}. Fix: run image-quality-features for them")
    frame = image_quality.table(cfg, features)
    table = image_quality.paper_table(cfg, frame)
    write_csv(args.out_csv, frame)
    write_text(args.out_md, render_markdown(table))
    if args.out_html:
        write_text(args.out_html, html_page(table.title, [render_html(table)]))
    print(render_markdown(table))
    return 0


# ------------------------------------------------------------------------------------------- debiasing


def add_debias(sub) -> None:
    """``counterfactory social debias-split | debias-run | debias-table | debias-task-table``."""
    p = sub.add_parser("debias-split", help="withhold 20%% of the occupations; training manifests per segment (§5.1)",
                       description="Reads the kept-images table; withholds 20%% of the occupations for testing and "
                                   "writes one training manifest per segment, subjects.csv and summary.csv to "
                                   "--out-dir.")
    add_config_option(p)
    p.add_argument("--images", required=True, metavar="FILE.parquet", help="kept-images table")
    p.add_argument("--segment", action="append", metavar="NAME", help="only these segments (default debias.segments)")
    p.add_argument("--out-dir", required=True, metavar="DIR",
                   help="writes <segment>.parquet manifests, subjects.csv and summary.csv")
    p.set_defaults(func=_cmd_debias_split)

    r = sub.add_parser("debias-run", help="fine-tune one model on one segment (§8.2) and probe the withheld subjects",
                       description="Reads a segment's training manifest, the withheld test subjects and the "
                                   "kept-images table; fine-tunes the model role (unless --no-train), probes the "
                                   "withheld subjects and writes metrics.csv (a runs table) to --out-dir.")
    add_config_option(r)
    r.add_argument("--role", required=True, metavar="ROLE", help="model role to fine-tune / evaluate")
    r.add_argument("--segment", required=True, metavar="NAME", help="segment (race_gender, physical_gender, ...)")
    r.add_argument("--manifest", metavar="FILE.parquet", help="the segment's training manifest (debias-split)")
    r.add_argument("--test-subjects", required=True, metavar="FILE",
                   help="subjects.csv of debias-split (its test rows) or a .txt list, one subject per line")
    r.add_argument("--images", required=True, metavar="FILE.parquet", help="kept-images table")
    r.add_argument("--seed", type=int, required=True, help="training seed")
    r.add_argument("--data-seed", type=int, required=True, help="seed of the data order")
    r.add_argument("--out-dir", required=True, metavar="DIR", help="the run's folder (metrics.csv and checkpoint)")
    r.add_argument("--no-train", action="store_true", help="evaluate the pre-trained model (the 'Pre-trained' rows)")
    add_progress_option(r)
    r.set_defaults(func=_cmd_debias_run)

    t = sub.add_parser("debias-table", help="Tables 2, 16, 17 (mean ± std over seeds, pre-trained vs debiased)",
                       description="Reads a stats summary (or a runs table, summarized here) of the debiasing runs; "
                                   "writes Tables 2, 16 and 17 (mean ± std over seeds, pre-trained vs debiased) as "
                                   "Markdown, LaTeX and CSV.")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--summary", metavar="CSV", help="summary of 'stats summarize --baseline pretrained "
                                                      "--alternative less'")
    src.add_argument("--runs", metavar="CSV", help="runs table (collected metrics.csv); summarized here")
    t.add_argument("--alpha", type=float, default=0.05, help="with --runs: significance level")
    t.add_argument("--role", action="append", metavar="ROLE", help="column order (default: as in the summary)")
    add_label_option(t, "display name of a role")
    t.add_argument("--out-md", metavar="FILE.md", help="the tables as Markdown")
    t.add_argument("--out-tex", metavar="FILE.tex", help="the tables as LaTeX")
    t.add_argument("--out-csv", metavar="FILE.csv", help="the tables as CSV")
    t.add_argument("--out-html", metavar="FILE.html", help="the tables as an HTML page (what the report shows)")
    t.add_argument("--decimals", type=int, default=2, help="decimals shown (default: 2)")
    t.add_argument("--paper-segment", metavar="SEGMENT",
                   help="also lay out Table 3 as the paper (Pre-trained / Debiased rows, VisoGender / PATA columns), "
                        "'Debiased' being this segment's model (debias.paper_segment: race_gender, §5.3)")
    t.add_argument("--withheld-fraction", type=float, default=0.2, metavar="F",
                   help="share of occupations the runs withheld, as the captions state it (the config's "
                        "debias.withheld_fraction; default: the paper's 0.2)")
    t.set_defaults(func=_cmd_debias_table)

    k = sub.add_parser("debias-task-table",
                       help="Tables 4, 5: retrieval and zero-shot accuracy of the debiased models (§5.3)",
                       description="Reads the runs table of the debiasing runs (metrics.csv of each run collected) "
                                   "and the config (debias.task_eval); writes Table 4 (image & text retrieval R@K) "
                                   "and Table 5 (zero-shot top-1 accuracy) per evaluated role: the pre-trained and "
                                   "the debiased model (debias.paper_segment, §5.3's Race-Gender 'Debiased CLIP'), "
                                   "then the other segments' debiased models, as Markdown, LaTeX, CSV and HTML.")
    add_config_option(k)
    k.add_argument("--runs", required=True, metavar="CSV", help="runs table (collected metrics.csv)")
    k.add_argument("--out-md", metavar="FILE.md", help="the tables as Markdown")
    k.add_argument("--out-tex", metavar="FILE.tex", help="the tables as LaTeX")
    k.add_argument("--out-csv", metavar="FILE.csv", help="the tables as CSV")
    k.add_argument("--out-html", metavar="FILE.html", help="the tables as an HTML page (what the report shows)")
    k.add_argument("--out-seeds-csv", metavar="FILE.csv",
                   help="every seed's value behind each cell (table, row, column, seed, value)")
    k.add_argument("--decimals", type=int, default=2, help="decimals shown (default: 2)")
    add_label_option(k, "display name of a role (the workflow passes models.<role>.display_name)")
    k.set_defaults(func=_cmd_debias_task_table)


def _cmd_debias_split(args) -> int:
    cfg = _load_config(args.config)
    opts = debias.settings(cfg)
    frame = probing.read_images_table(args.images)
    split = debias.split_subjects(frame["subject"].astype(str), opts["withheld_fraction"], opts["random_state"])
    summary = debias.write_manifests(args.images, split, args.segment or opts["segments"], args.out_dir,
                                     val_fraction=opts["val_fraction"], random_state=opts["random_state"])
    print(summary.to_string(index=False))
    return 0


def _cmd_debias_run(args) -> int:
    cfg = _load_config(args.config)
    rows = debias.debias_run(cfg, args.role, args.segment, args.manifest, args.test_subjects, args.images, args.seed,
                             args.data_seed, args.out_dir, train=not args.no_train, progress=not args.no_progress)
    print(rows.to_string(index=False))
    return 0


def _cmd_debias_table(args) -> int:
    from ..io import write_csv, write_text

    if not (args.out_md or args.out_tex or args.out_csv or args.out_html):
        raise ConfigError("debias-table: nothing to write. Fix: pass --out-md, --out-tex, --out-csv and/or --out-html")
    if args.runs:
        from ..stats import read_runs

        summary = debias.summarize(read_runs(args.runs), alpha=args.alpha, source=args.runs)
    else:
        from ..tables import read_summary

        summary = read_summary(args.summary)
    tables = debias_tables.build_tables(summary, roles=args.role, role_labels=role_labels(args.label),
                                        decimals=args.decimals, std_decimals=args.decimals,
                                        withheld_fraction=args.withheld_fraction)
    paper3 = None
    if args.paper_segment:   # §5.3: Table 3 with "Debiased CLIP" = the paper segment's model
        from ..render import render_markdown

        paper3 = debias_tables.table3_paper(summary, args.paper_segment, roles=args.role,
                                            role_labels=role_labels(args.label))
    if args.out_md:
        parts = [debias_tables.render_markdown(t) for t in tables.values()]
        write_text(args.out_md, "\n".join(parts + ([render_markdown(paper3)] if paper3 is not None else [])))
    if args.out_html:
        write_text(args.out_html, debias_tables.render_html(tables, extra=[paper3] if paper3 is not None else []))
    if args.out_tex:
        write_text(args.out_tex, "\n".join(debias_tables.render_latex(t) for t in tables.values()))
    if args.out_csv:
        write_csv(args.out_csv, debias_tables.tables_frame(tables))
    return 0


def _cmd_debias_task_table(args) -> int:
    from ..io import write_csv, write_text
    from ..render import html_page, model_display_names, render_html, render_latex, render_markdown
    from ..stats import read_runs

    if not (args.out_md or args.out_tex or args.out_csv or args.out_html or args.out_seeds_csv):
        raise ConfigError("debias-task-table: nothing to write. Fix: pass --out-md, --out-tex, --out-csv, "
                          "--out-seeds-csv and/or --out-html")
    cfg = _load_config(args.config)
    opts = debias.settings(cfg)
    task = task_eval.task_settings(opts)
    roles = list(task.get("roles") or [])
    if not roles:
        raise ConfigError("debias-task-table: debias.task_eval.roles is empty. Fix: list the debiased roles to "
                          "evaluate (Tables 4, 5: the CLIP role)")
    retrieval = task.get("retrieval") or {}
    runs = read_runs(args.runs)
    layout = dict(ks=retrieval.get("ks") or (1, 5, 10), segments=social_debias_segments(cfg),
                  labels={**model_display_names(cfg.get("models"), roles), **role_labels(args.label)},
                  paper_segment=opts["paper_segment"])
    datasets = task_eval.classification_datasets(task)
    tables = task_eval.build_tables(runs, roles, retrieval.get("name"), datasets, decimals=args.decimals, **layout)
    if args.out_seeds_csv:
        write_csv(args.out_seeds_csv, task_eval.seed_frame(runs, roles, retrieval.get("name"), datasets, **layout))
    if args.out_md:
        write_text(args.out_md, "\n".join(render_markdown(t) for t in tables.values()))
    if args.out_html:
        write_text(args.out_html, html_page("SocialCounterfactuals: task performance after debiasing",
                                            [render_html(t) for t in tables.values()]))
    if args.out_tex:
        write_text(args.out_tex, "\n".join(render_latex(t) for t in tables.values()))
    if args.out_csv:
        write_csv(args.out_csv, task_eval.tables_frame(tables))
    return 0


# ------------------------------------------------------------------------------------------- release


def add_release(subparsers) -> None:
    """Register ``counterfactory social release`` and ``counterfactory social release-check``."""
    p = subparsers.add_parser("release", help="write kept images in the Intel/SocialCounterfactuals parquet layout",
                              description="Reads the kept-images table and its images; writes them in the "
                                          "Intel/SocialCounterfactuals parquet layout (data/train-NNNNN-of-MMMMM"
                                          ".parquet) to --out-dir.")
    p.add_argument("--images", required=True, metavar="FILE.parquet",
                   help="kept images: set_id, member_index, caption, a1_type, a1, a2_type, a2, image_path "
                        "(relative to the parquet's folder or absolute); optional a3_type, a3, segment, subject")
    p.add_argument("--out-dir", required=True, metavar="DIR", help="release folder (replaced as a whole)")
    p.add_argument("--shard-size", type=int, default=release.DEFAULT_SHARD_SIZE, metavar="N",
                   help=f"rows per parquet shard (default {release.DEFAULT_SHARD_SIZE}, about the release's)")
    p.set_defaults(func=_cmd_release)
    c = subparsers.add_parser("release-check", help="load a release back (datasets, else pyarrow) and count it",
                              description="Reads a release folder back with the datasets library (else pyarrow); "
                                          "prints its counts and, with --json, writes them as JSON.")
    c.add_argument("--dir", required=True, metavar="DIR", help="release folder (holding data/)")
    c.add_argument("--require-datasets", action="store_true",
                   help="fail when the datasets library is missing instead of reading with pyarrow")
    c.add_argument("--json", metavar="FILE.json", help="also write the counts as JSON")
    c.set_defaults(func=_cmd_release_check)


def _cmd_release(args) -> int:
    summary = release.export_release(args.images, args.out_dir, shard_size=args.shard_size)
    print(f"{summary['rows']} images in {summary['sets']} sets -> {args.out_dir} ({len(summary['shards'])} shards)")
    for s in summary["segments"]:
        print(f"  {s['segment']}: {s['sets']} sets, {s['images']} images")
    return 0


def _cmd_release_check(args) -> int:
    report = release.check_release(args.dir, use_datasets=True if args.require_datasets else None)
    print(f"read with {report['reader']}: {report['rows']} images in {report['sets']} sets, "
          f"{report['shards']} shard(s)")
    for s in report["segments"]:
        print(f"  {s['segment']}: {s['sets']} sets, {s['images']} images "
              f"({s['images_per_set_min']}-{s['images_per_set_max']} per set)")
    if args.json:
        from ..io import write_json

        write_json(args.json, report)
    return 0
