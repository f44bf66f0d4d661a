"""``counterfactory social``: the SocialCounterfactuals steps (caption sets, filters, bias probing,
debiasing, release). This module is the command line only, declared as data (``commands.Step``); the work is done
by the step modules of :mod:`counterfactory.studies.social_counterfactuals`, :mod:`counterfactory.generation.sets`
and :mod:`counterfactory.export.social_release`."""

from __future__ import annotations

from ..errors import InputError
from ..studies.social_counterfactuals import STUDY
from . import (CONFIG, DECIMALS, LABEL, NO_PROGRESS, OUT, OUT_CSV, OUT_DIR, OUT_HTML, OUT_MD, OUT_TEX, SEED, SHARD_DIRS,
               OneOf, Param, Step, flag, lazy_module, registrar, role_labels, shard_job_params, use_threads)

# the step modules, each imported when its subcommand runs (the filters and probing import torch; tables do not)
_PKG = "counterfactory.studies.social_counterfactuals"
captions, debias, external, filtering, image_quality, probe_report, probing = (
    lazy_module(f"{_PKG}.{name}") for name in ("captions", "debias", "external", "filtering", "image_quality",
                                               "probe_report", "probing"))
release = lazy_module("counterfactory.export.social_release")


def _load_config(paths):
    from ..config import load_config

    return load_config(paths, study=STUDY)


# ------------------------------------------------------------------------------------------- handlers


def _cmd_captions(args) -> int:
    counts = captions.run(args.config, args.out)
    for r in counts.itertuples(index=False):
        print(f"{r.segment}: {r.sets} sets x {r.captions_per_set} = {r.captions} captions")
    print(f"total: {int(counts['sets'].sum())} sets, {int(counts['captions'].sum())} captions -> {args.out}")
    return 0


def _cmd_generate(args) -> int:
    from ..generation.sets import run_set_shard

    cfg = _load_config(args.config)
    use_threads(args)
    s = run_set_shard(cfg, args.sets, args.shard, args.out_dir, progress=not args.no_progress)
    print(f"set shard {args.shard:05d}: {s['sets']} caption sets, {s['candidates_generated']} candidate sets, "
          f"{s['images']} images ({s['unet_evals']} UNet evaluations) -> {args.out_dir}")
    return 0


def _cmd_generate_merge(args) -> int:
    from ..generation.sets import merge_set_shards

    s = merge_set_shards(args.shard_dirs, args.out_dir, copy_images=args.copy_images)
    print(f"merged {s['shards']} set shards: {s['sets']} caption sets, {s['images']} images -> {args.out_dir}")
    return 0


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


def _cmd_probe(args) -> int:
    from ..io import write_csv

    cfg = _load_config(args.config)
    df = probing.probe(cfg, args.role or [], args.images, segments=args.segment, subjects=args.subject)
    write_csv(args.out, df)
    probing.log.info("wrote %s (%d rows)", args.out, len(df))
    return 0


def _cmd_probe_tables(args) -> int:
    probe_report.write_tables(args.probe, out_md=args.out_md, out_tex=args.out_tex, out_csv=args.out_csv,
                              out_html=args.out_html, decimals=args.decimals, labels=role_labels(args.label))
    return 0


def _cmd_probe_plots(args) -> int:
    probe_report.write_figures(args.probe, args.out_dir, subjects=args.subject, marginal=args.marginal,
                               fmt=args.format, labels=role_labels(args.label))
    return 0


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
    table = external.external_table_files(args.results, args.out_md, args.out_csv)
    if not (args.out_md or args.out_csv):
        print(table.round(3).to_markdown(floatfmt=".3f"))
    return 0


def _cmd_image_quality_features(args) -> int:
    n = image_quality.features_files(_load_config(args.config), args.image_set, args.kept, args.out,
                                     progress=not args.no_progress)
    print(f"{args.image_set}: {n['images']} images, features {n['features']}, classes {n['classes']} -> {args.out}")
    return 0


def _cmd_image_quality_table(args) -> int:
    print(image_quality.table_files(_load_config(args.config), args.features, args.out_csv, args.out_md,
                                    args.out_html))
    return 0


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
    debias.write_debias_tables(summary_path=args.summary, runs_path=args.runs, alpha=args.alpha, roles=args.role,
                               labels=role_labels(args.label), out_md=args.out_md, out_tex=args.out_tex,
                               out_csv=args.out_csv, out_html=args.out_html, decimals=args.decimals,
                               paper_segment=args.paper_segment, withheld_fraction=args.withheld_fraction)
    return 0


def _cmd_debias_task_table(args) -> int:
    debias.write_task_tables(_load_config(args.config), args.runs, labels=role_labels(args.label),
                             out_md=args.out_md, out_tex=args.out_tex, out_csv=args.out_csv, out_html=args.out_html,
                             out_seeds_csv=args.out_seeds_csv, decimals=args.decimals)
    return 0


def _cmd_release(args) -> int:
    from ..studies import spec

    summary = release.export_release(args.images, args.out_dir, shard_size=args.shard_size,
                                     citation=spec("social_counterfactuals").export.citation)
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


# ------------------------------------------------------------------------------------------- declarations

ROLES = Param("--role", action="append", metavar="ROLE", help="model role (repeatable; default probing.roles)")
KEPT_IMAGES = Param("--images", required=True, metavar="FILE.parquet", help="kept-images table")
PROBE_CSVS = Param("--probe", nargs="+", action="extend", required=True, metavar="CSV", help="probe table(s)")
PROBE_OUT = OUT.but(metavar="FILE.csv", help="long probe table to write")
IMAGE_DIR = Param("--image-dir", metavar="DIR", help="folder of the downloaded images")
OUT_TABLES = (OUT_MD.but(help="the tables as Markdown"), OUT_TEX.but(help="the tables as LaTeX"))

CAPTIONS = Step(
    "captions", help="caption sets from prefix, attribute and occupation lists (§3.2)",
    description="Reads the prefix, attribute and occupation lists of the config; writes the caption table (one row "
                "per caption of every caption set).",
    params=(CONFIG.but(help=f"a full config with a '{STUDY}:' section, or a YAML file with the keys "
                            f"{', '.join(captions.SECTION_KEYS)} at top level (repeat to merge; later files win)"),
            OUT.but(metavar="FILE.parquet", help="caption table (one row per caption)")),
    run=_cmd_captions)

GENERATE = (
    Step("generate", help="over-generate Prompt-to-Prompt image sets for one shard of caption sets (§3.3)",
         description="SocialCounterfactuals §3.3: for every caption set of the shard (sets ranked "
                     "shard*S .. (shard+1)*S-1 in sorted set_id order, S = images.set_shard_size), generate "
                     "images.candidates_per_set candidate sets (paper: 100), each with p ~ U(0.1, 0.9) and "
                     "guidance ~ U(7.5, 15), all members of a candidate in one batched UNet call sharing the base "
                     "caption's attention. Writes OUT_DIR/images/<set_id>/c<candidate>_m<member>.png, "
                     "OUT_DIR/candidates.parquet (one row per image) and OUT_DIR/summary.json. Finished sets are "
                     "cached in OUT_DIR/work/, so rerunning a killed job resumes and gives identical files. "
                     "No filtering here: the §3.4 filters are later steps.",
         params=shard_job_params("--sets", "SETS.parquet",
                                 "caption-set table (set_id, member_index, caption, segment, prefix, subject, a1_type, "
                                 "a1, a2_type, a2)"),
         run=_cmd_generate),
    Step("generate-merge", help="concatenate the set-generation shards into one candidates table",
         description="Read candidates.parquet and summary.json of every shard folder and write OUT_DIR/"
                     "candidates.parquet (sorted by set_id, candidate, member) and OUT_DIR/summary.json. Image "
                     "paths become relative to OUT_DIR (or, with --copy-images, images are hard-linked/copied to "
                     "OUT_DIR/images/). Refused: a missing shard output or shard number, shards made with "
                     "different settings (config_digest) or from different caption-set tables (sets_digest).",
         params=(SHARD_DIRS, OUT_DIR.but(help="folder for the merged table"),
                 flag("--copy-images", "hard-link (else copy) the images into OUT_DIR/images")),
         run=_cmd_generate_merge),
)

#: the parameters of a filter stage: candidate images in, the survivors and one row per set out
STAGE = (CONFIG,
         Param("--images", required=True, metavar="IMAGES.parquet",
               help="candidate-image table (one row per image; image_path relative to its folder)"),
         OUT.but(metavar="KEPT.parquet", help="surviving image rows"),
         Param("--sets", required=True, metavar="SETS.parquet",
               help="per-candidate-set scores, passed and reason (every set that entered the stage)"),
         NO_PROGRESS)

FILTERING = (
    Step("filter-clip", help="stage (a): CLIP image-caption >= 0.2 and image-image > 0.2 (§3.4)",
         description="Reads the candidate-image table and the CLIP filter role; writes the surviving image rows and "
                     "one row of scores per candidate set.",
         params=STAGE, run=_cmd_filter_clip),
    Step("filter-nsfw", help="stage (b): drop sets with an NSFW-flagged image (§3.4, §8.3)",
         description="Reads the image rows that passed stage (a) and the nsfw role; writes the surviving image rows "
                     "and one row per candidate set.",
         params=STAGE, run=_cmd_filter_nsfw),
    Step("filter-detect", help="stage (c): CLIP attribute detectability (§3.4, §8.3, Table 10)",
         description="Reads the image rows that passed stage (b) (and the caption-set table); writes the surviving "
                     "image rows and one row of detectability scores per candidate set.",
         params=(*STAGE, Param("--captions", metavar="SETS.parquet",
                               help="caption-set table (segment and attribute columns; needed when the image table "
                                    "lacks them)")),
         run=_cmd_filter_detect),
    Step("calibrate", help="learn the detectability thresholds from hand labels (§8.3)",
         description="Reads filter-detect's set table and your hand labels; writes the learned thresholds (JSON) "
                     "and an agreement report (CSV). With --write-template it instead writes a label template for a "
                     "random sample of sets.",
         params=(CONFIG,
                 Param("--sets", required=True, metavar="DETECT_SETS.parquet", help="filter-detect's --sets output"),
                 Param("--labels", metavar="LABELS.csv",
                       help="set_id,candidate_index,attribute_type,label (1 keep, 0 not)"),
                 Param("--out", metavar="THRESHOLDS.json", help="learned thresholds and agreement"),
                 Param("--report", metavar="REPORT.csv", help="agreement per segment and type (CSV)"),
                 Param("--write-template", metavar="LABELS.csv",
                       help="instead: write a label template for a random sample of sets (phase 1)"),
                 Param("--sample-size", type=int, default=100, help="sets per segment in the template (paper: 100)"),
                 SEED.but(help="sampling seed for the template")),
         run=_cmd_calibrate),
    Step("filter-merge", help="concatenate the filter stages' outputs of every generation shard",
         description="Reads the per-shard filter folders; writes the concatenated clip / nsfw / kept tables and "
                     "their set tables to --out-dir.",
         params=(SHARD_DIRS.but(help="per-shard filter folders (clip / nsfw / kept tables and their set tables)"),
                 OUT_DIR.but(help="folder for the merged tables")),
         run=_cmd_filter_merge),
    Step("filter-table", help="Table 11: candidate sets remaining after each stage",
         description="Reads every generated image and the set tables of the three filter stages; writes Table 11 "
                     "(candidate sets remaining after each stage) as CSV and Markdown.",
         params=(CONFIG,
                 Param("--candidates", required=True, metavar="IMAGES.parquet", help="every generated image"),
                 Param("--clip", required=True, metavar="SETS.parquet", help="filter-clip --sets output"),
                 Param("--nsfw", required=True, metavar="SETS.parquet", help="filter-nsfw --sets output"),
                 Param("--detect", required=True, metavar="SETS.parquet", help="filter-detect --sets output"),
                 Param("--captions", metavar="SETS.parquet", help="caption-set table (for segments)"),
                 OUT_CSV.but(former=("--out",), required=True, metavar="TABLE.csv"),
                 OUT_MD.but(former=("--markdown",), metavar="TABLE.md"),
                 OUT_HTML.but(metavar="TABLE.html"),
                 Param("--out-table18-csv", metavar="FILE.csv",
                       help="Table 18: the occupations left after the filters (subject, sets kept, segments); needs "
                            "--captions"),
                 Param("--out-table18-md", metavar="FILE.md", help="Table 18 as the paper prints it (Markdown grid)")),
         run=_cmd_filter_table),
)

PROBING = (
    Step("probe", help="MaxSkew@K, NDKL, Bias@K of neutral occupation queries (§4, §10.1)",
         description="Reads the kept-images table and the model roles; writes a long CSV of MaxSkew@K, NDKL and "
                     "Bias@K of neutral occupation queries per role, segment and subject.",
         params=(CONFIG, KEPT_IMAGES, ROLES,
                 Param("--segment", action="append", metavar="NAME", help="only these segments (repeatable)"),
                 Param("--subject", action="append", metavar="NAME", help="only these subjects (repeatable)"),
                 PROBE_OUT),
         run=_cmd_probe),
    Step("probe-tables", help="Tables 2, 12–17 layouts from probe CSVs",
         description="Reads probe CSVs; writes Tables 2 and 12-17 as Markdown, LaTeX and a long CSV.",
         params=(PROBE_CSVS, *OUT_TABLES,
                 OUT_CSV.but(help="every table in long form (table, row, column, value)"),
                 OUT_HTML.but(help="the tables as an HTML page (what the report shows)"), DECIMALS, LABEL),
         run=_cmd_probe_tables),
    Step("probe-plots", help="Figures 3–5 (and 6–13) from probe CSVs",
         description="Reads probe CSVs; writes Figures 3-5 (and 6-13) as image files to --out-dir.",
         params=(PROBE_CSVS, OUT_DIR.but(help="folder for the figures"),
                 Param("--subject", action="append", metavar="NAME",
                       help="occupation(s) for the retrieval-proportion figure (default: doctor)"),
                 Param("--marginal", default="gender:race", metavar="ATTR:GIVEN",
                       help="Figure 4: marginal attribute and the attribute it is split by (default gender:race)"),
                 Param("--format", default="png", choices=("png", "pdf", "svg"), help="image format (default: png)"),
                 LABEL.but(help="display name of a model role in titles and legends (repeatable; default: the "
                                "role)")),
         run=_cmd_probe_plots),
)

EXTERNAL = (
    Step("probe-pata", help="MaxSkew@K / NDKL / Bias@K on PATA (§5.3, Table 3)",
         description="Reads the PATA file list, its captions JSON and the downloaded images, and the model roles; "
                     "writes a long CSV of MaxSkew@K, NDKL and Bias@K per role.",
         params=(CONFIG, ROLES,
                 Param("--files-list", metavar="pata_fairness.files.lst",
                       help="PATA's list of image files (default: from the config)"),
                 Param("--captions-json", metavar="pata_fairness.captions.json",
                       help="PATA's captions JSON (default: from the config)"),
                 IMAGE_DIR,
                 Param("--image-name", metavar="PATTERN", help="file of a record, e.g. '{index}.*' (default)"),
                 PROBE_OUT),
         run=_cmd_probe_pata),
    Step("probe-visogender", help="MaxSkew@K / NDKL / Bias@K on VisoGender (§5.3, Table 3)",
         description="Reads VisoGender's occupation-object and occupation-participant TSVs, the downloaded images "
                     "and the model roles; writes a long CSV of MaxSkew@K, NDKL and Bias@K per role.",
         params=(CONFIG, ROLES,
                 Param("--oo-tsv", metavar="OO.tsv",
                       help="VisoGender's occupation-object TSV (default: from the config)"),
                 Param("--op-tsv", metavar="OP.tsv",
                       help="VisoGender's occupation-participant TSV (default: from the config)"),
                 IMAGE_DIR,
                 Param("--image-name", metavar="PATTERN", help="file of a row, e.g. '{idx}.*' (default)"),
                 PROBE_OUT),
         run=_cmd_probe_visogender),
    Step("probe-external-table", help="Table 3: mean MaxSkew@K per model on PATA / VisoGender",
         description="Reads the probe CSVs of probe-pata and probe-visogender; writes Table 3 (mean MaxSkew@K per "
                     "model) as Markdown and CSV.",
         params=(Param("--results", nargs="+", action="extend", required=True, metavar="CSV",
                       help="probe CSVs of probe-pata / probe-visogender"),
                 OUT_MD, OUT_CSV),
         run=_cmd_probe_external_table),
)

IMAGE_QUALITY = (
    Step("image-quality-features", help="Inception features of one image set (§10.3's FID / IS)",
         description="Reads one image set (the kept images, VisoGender's or PATA's images, or a reference folder of "
                     "image_quality.references) and the inception role; writes its pool features and logits (npz).",
         params=(CONFIG,
                 Param("--set", required=True, metavar="NAME", dest="image_set",
                       help="social_counterfactuals, visogender, pata, or ref_<i> (the i-th configured reference)"),
                 Param("--kept", metavar="kept.parquet", help="the filtered images (filter/kept.parquet)"),
                 OUT.but(metavar="FILE.npz", help="features file to write"),
                 NO_PROGRESS),
         run=_cmd_image_quality_features),
    Step("image-quality-table", help="§10.3: FID against each reference and IS of every set",
         description="Reads the features files of image-quality-features; writes §10.3's table with the paper's "
                     "numbers beside ours (Markdown, CSV, HTML).",
         params=(CONFIG,
                 Param("--features", nargs="+", required=True, metavar="NAME=FILE.npz",
                       help="features file of every set (image-quality-features' --set and --out)"),
                 OUT_MD.but(required=True), OUT_CSV.but(required=True, help="the table as CSV (our values)"),
                 OUT_HTML.but(help="the table as an HTML page (the report's entry)")),
         run=_cmd_image_quality_table),
)

DEBIAS = (
    Step("debias-split", help="withhold 20%% of the occupations; training manifests per segment (§5.1)",
         description="Reads the kept-images table; withholds 20%% of the occupations for testing and writes one "
                     "training manifest per segment, subjects.csv and summary.csv to --out-dir.",
         params=(CONFIG, KEPT_IMAGES,
                 Param("--segment", action="append", metavar="NAME", help="only these segments (default "
                                                                         "debias.segments)"),
                 OUT_DIR.but(help="writes <segment>.parquet manifests, subjects.csv and summary.csv")),
         run=_cmd_debias_split),
    Step("debias-run", help="fine-tune one model on one segment (§8.2) and probe the withheld subjects",
         description="Reads a segment's training manifest, the withheld test subjects and the kept-images table; "
                     "fine-tunes the model role (unless --no-train), probes the withheld subjects and writes "
                     "metrics.csv (a runs table) to --out-dir.",
         params=(CONFIG,
                 Param("--role", required=True, metavar="ROLE", help="model role to fine-tune / evaluate"),
                 Param("--segment", required=True, metavar="NAME", help="segment (race_gender, physical_gender, ...)"),
                 Param("--manifest", metavar="FILE.parquet", help="the segment's training manifest (debias-split)"),
                 Param("--test-subjects", required=True, metavar="FILE",
                       help="subjects.csv of debias-split (its test rows) or a .txt list, one subject per line"),
                 KEPT_IMAGES,
                 Param("--seed", type=int, required=True, help="training seed"),
                 Param("--data-seed", type=int, required=True, help="seed of the data order"),
                 OUT_DIR.but(help="the run's folder (metrics.csv and checkpoint)"),
                 flag("--no-train", "evaluate the pre-trained model (the 'Pre-trained' rows)"),
                 NO_PROGRESS),
         run=_cmd_debias_run),
    Step("debias-table", help="Tables 2, 16, 17 (mean ± std over seeds, pre-trained vs debiased)",
         description="Reads a stats summary (or a runs table, summarized here) of the debiasing runs; writes Tables "
                     "2, 16 and 17 (mean ± std over seeds, pre-trained vs debiased) as Markdown, LaTeX and CSV.",
         params=(OneOf((Param("--summary", metavar="CSV",
                              help="summary of 'stats summarize --baseline pretrained --alternative less'"),
                        Param("--runs", metavar="CSV", help="runs table (collected metrics.csv); summarized here")),
                       required=True),
                 Param("--alpha", type=float, default=0.05, help="with --runs: significance level"),
                 Param("--role", action="append", metavar="ROLE", help="column order (default: as in the summary)"),
                 LABEL.but(help="display name of a role"),
                 *OUT_TABLES, OUT_CSV.but(help="the tables as CSV"),
                 OUT_HTML.but(help="the tables as an HTML page (what the report shows)"), DECIMALS,
                 Param("--paper-segment", metavar="SEGMENT",
                       help="also lay out Table 3 as the paper (Pre-trained / Debiased rows, VisoGender / PATA "
                            "columns), 'Debiased' being this segment's model (debias.paper_segment: race_gender, "
                            "§5.3)"),
                 Param("--withheld-fraction", type=float, default=0.2, metavar="F",
                       help="share of occupations the runs withheld, as the captions state it (the config's "
                            "debias.withheld_fraction; default: the paper's 0.2)")),
         run=_cmd_debias_table),
    Step("debias-task-table", help="Tables 4, 5: retrieval and zero-shot accuracy of the debiased models (§5.3)",
         description="Reads the runs table of the debiasing runs (metrics.csv of each run collected) and the config "
                     "(debias.task_eval); writes Table 4 (image & text retrieval R@K) and Table 5 (zero-shot top-1 "
                     "accuracy) per evaluated role: the pre-trained and the debiased model (debias.paper_segment, "
                     "§5.3's Race-Gender 'Debiased CLIP'), then the other segments' debiased models, as Markdown, "
                     "LaTeX, CSV and HTML.",
         params=(CONFIG,
                 Param("--runs", required=True, metavar="CSV", help="runs table (collected metrics.csv)"),
                 *OUT_TABLES, OUT_CSV.but(help="the tables as CSV"),
                 OUT_HTML.but(help="the tables as an HTML page (what the report shows)"),
                 Param("--out-seeds-csv", metavar="FILE.csv",
                       help="every seed's value behind each cell (table, row, column, seed, value)"),
                 DECIMALS,
                 LABEL.but(help="display name of a role (the workflow passes models.<role>.display_name)")),
         run=_cmd_debias_task_table),
)

RELEASE = (
    Step("release", help="write kept images in the Intel/SocialCounterfactuals parquet layout",
         description="Reads the kept-images table and its images; writes them in the Intel/SocialCounterfactuals "
                     "parquet layout (data/train-NNNNN-of-MMMMM.parquet) to --out-dir.",
         params=(Param("--images", required=True, metavar="FILE.parquet",
                       help="kept images: set_id, member_index, caption, a1_type, a1, a2_type, a2, image_path "
                            "(relative to the parquet's folder or absolute); optional a3_type, a3, segment, subject"),
                 OUT_DIR.but(help="release folder (replaced as a whole)"),
                 Param("--shard-size", type=int, default=release.DEFAULT_SHARD_SIZE, metavar="N",
                       help=f"rows per parquet shard (default {release.DEFAULT_SHARD_SIZE}, about the release's)")),
         run=_cmd_release),
    Step("release-check", help="load a release back (datasets, else pyarrow) and count it",
         description="Reads a release folder back with the datasets library (else pyarrow); prints its counts and, "
                     "with --json, writes them as JSON.",
         params=(Param("--dir", required=True, metavar="DIR", help="release folder (holding data/)"),
                 flag("--require-datasets", "fail when the datasets library is missing instead of reading with "
                                            "pyarrow"),
                 Param("--json", metavar="FILE.json", help="also write the counts as JSON")),
         run=_cmd_release_check),
)

SOCIAL = Step(
    "social", help="SocialCounterfactuals: caption sets, filters, bias probing, debiasing",
    description="The SocialCounterfactuals study: caption sets, Prompt-to-Prompt image sets, the three filter "
                "stages, bias probing (also on PATA and VisoGender), debiasing by fine-tuning, and the release in "
                "the published layout.",
    steps=(CAPTIONS, *GENERATE, *FILTERING, *PROBING, *EXTERNAL, *IMAGE_QUALITY, *DEBIAS, *RELEASE))

register = registrar(SOCIAL)
#: a part of the group alone (for tests that parse one part)
add_generate = registrar(*GENERATE)
add_filtering = registrar(*FILTERING)
