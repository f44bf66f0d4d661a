"""``counterfactory countercurate``: the CounterCurate steps (Flickr30k-Positions, -Counting, -Attributes,
grounded generation, benchmarks, the generative VLM). This module is the command line only, declared as data
(``commands.Step``); the work is done by the step modules of :mod:`counterfactory.studies.countercurate` (and
:mod:`counterfactory.generation.grounded`)."""

from __future__ import annotations

from pathlib import Path

from ..studies.countercurate import STUDY, VLM_ROLE
from . import (CONFIG, DECIMALS, LABEL, NO_PROGRESS, OUT, OUT_CSV, OUT_DIR, OUT_HTML, OUT_MD, OUT_TEX, SHARD_DIRS,
               Param, Step, flag, key_values, lazy_module, registrar, shard_job_params, use_threads)

# the step modules, each imported when its subcommand runs (the VLM and training steps import torch; tables do not)
_PKG = "counterfactory.studies.countercurate"
(assemble, attributes, benchmark_tables, benchmarks, counting, manifests, positions, training, vlm,
 vlm_finetune) = (lazy_module(f"{_PKG}.{name}") for name in (
    "assemble", "attributes", "benchmark_tables", "benchmarks", "counting", "manifests", "positions", "training", "vlm",
    "vlm_finetune"))
llm = lazy_module("counterfactory.text.llm")


def _load_config(paths):
    from ..config import load_config

    return load_config(paths, study=STUDY)


def _pairs_option(items, option: str) -> dict[str, str]:
    return dict(key_values(items, option, "BENCHMARK=PATH (e.g. positions=datasets/positions.parquet)"))


def _pairs(items, option: str) -> dict[str, str]:
    return dict(key_values(items, option, "NAME=VALUE (e.g. clip_cc=+ CounterCurate)"))


# ------------------------------------------------------------------------------------------- handlers


def _cmd_positions(args) -> int:
    frame = positions.positions_files(positions.load_cfg(args.config), args.entities_root, args.out,
                                      images=args.images, out_requests=args.out_requests,
                                      flipped_dir=args.flipped_dir, strict=not args.lenient)
    counts = frame.groupby(["subset", "split"]).size().to_dict()
    print(f"Flickr30k-Positions: {len(frame)} items from {frame['image_id'].nunique()} images "
          f"({', '.join(f'{k[0]}/{k[1]}: {v}' for k, v in sorted(counts.items()))}) -> {args.out}")
    return 0


def _cmd_counting(args) -> int:
    frame = counting.counting_files(positions.load_cfg(args.config), args.entities_root, args.out,
                                    images=args.images, out_requests=args.out_requests, strict=not args.lenient)
    n_overlap = int(frame["overlap"].sum()) if len(frame) else 0
    print(f"Flickr30k-Counting: {len(frame)} items from {frame['image_id'].nunique()} images ({n_overlap} with "
          f"overlap -> remove, {len(frame) - n_overlap} without -> add) -> {args.out}")
    return 0


def _cmd_attributes(args) -> int:
    cfg = attributes.load_cfg(args.config)
    negatives = attributes.run(cfg, attributes.read_captions_table(args.captions), args.out, args.out_requests,
                               args.out_llm_requests, args.out_answers, args.cache, source=args.captions,
                               entities_root=args.entities_root)
    counts = negatives.groupby(["kind", "status"]).size()
    for (kind, status), n in counts.items():
        print(f"{kind}: {n} {status}")
    print(f"-> {args.out}" + (f"; t2i requests -> {args.out_requests}" if args.out_requests else ""))
    return 0


def _cmd_llm(args) -> int:
    cfg = attributes.load_cfg(args.config)
    from ..io import write_parquet

    answers = llm.run_requests(cfg, llm.read_requests(args.requests), args.out, cache_path=args.cache)
    rejected = llm.rejected_rows(answers)
    if args.rejected:
        write_parquet(args.rejected, rejected)
    reasons = ", ".join(f"{n} {r}" for r, n in llm.reason_counts(rejected).items())
    print(f"{int(answers['valid'].sum())}/{len(answers)} valid answers ({int(answers['cached'].sum())} from the "
          f"cache) -> {args.out}" + (f"; rejected: {reasons}" if reasons else "")
          + (f"; rejected rows -> {args.rejected}" if args.rejected else ""))
    return 0


def _cmd_generate(args) -> int:
    from ..generation.grounded import run_grounded_shard

    cfg = _load_config(args.config)
    use_threads(args)
    s = run_grounded_shard(cfg, args.requests, args.shard, args.out_dir, progress=not args.no_progress)
    kinds = ", ".join(f"{n} {k}" for k, n in s["items_by_kind"].items() if n)
    print(f"grounded shard {args.shard:05d}: {s['items']} images ({kinds or 'none'}; {s['items_generated_this_run']} "
          f"generated now in {s['pipeline_calls_this_run']} pipeline calls) -> {args.out_dir}")
    return 0


def _cmd_generate_merge(args) -> int:
    from ..generation.grounded import merge_grounded_shards

    s = merge_grounded_shards(args.shard_dirs, args.out_dir)
    print(f"merged {s['shards']} grounded shards: {s['items']} images -> {args.out_dir}")
    return 0


def _cmd_generate_shards(args) -> int:
    """Shard ids ``00000`` .. covering the requests at ``grounded.shard_size`` items per shard (at least one)."""
    from ..generation.grounded import GroundedSettings, read_requests
    from ..io import write_text
    from ..workflow import shard_ids

    settings = GroundedSettings.from_config(_load_config(args.config).get("grounded"))
    ids = shard_ids(len(read_requests(args.requests)), settings.shard_size)
    write_text(args.out, "\n".join(ids) + "\n")
    print(f"{len(ids)} shard(s) -> {args.out}")
    return 0


def _cmd_requests(args) -> int:
    from ..io import write_parquet

    frame = assemble.collect_requests(args.positions, args.rewrites, args.counting, args.attributes)
    write_parquet(args.out, frame)
    print(frame.groupby(["dataset", "kind"]).size().to_string())
    return 0


def _cmd_datasets(args) -> int:
    summary = assemble.write_datasets(args.positions, args.counting, args.attributes, args.generated, args.out_dir)
    print(summary.to_string(index=False))
    return 0


def _cmd_train_manifests(args) -> int:
    summary = manifests.write_manifests(args.datasets, args.out_dir, _load_config(args.config), images_dir=args.images)
    print(summary.to_string(index=False))
    return 0


def _cmd_train_run(args) -> int:
    rows = training.train_run(_load_config(args.config), args.dataset, args.variant, args.manifest, args.seed,
                              args.data_seed, args.out_dir, train=not args.no_train,
                              data=_pairs_option(args.data, "--data"), images=_pairs_option(args.images, "--images"),
                              progress=not args.no_progress)
    for r in rows.itertuples():
        training.log.info("%s %s seed %d: %s = %.2f", r.experiment, r.mixture, r.seed, r.metric, r.value)
    return 0


def _cmd_vlm_run(args) -> int:
    rows = training.vlm_train_run(_load_config(args.config), args.dataset, args.manifests, args.seed, args.out_dir,
                                  train=not args.no_train, data=_pairs_option(args.data, "--data"),
                                  images=_pairs_option(args.images, "--images"), progress=not args.no_progress)
    for r in rows.itertuples():
        training.log.info("%s %s seed %d: %s = %.2f", r.experiment, r.mixture, r.seed, r.metric, r.value)
    return 0


def _cmd_evaluate(args) -> int:
    from ..io import write_csv, write_parquet

    cfg = _load_config(args.config)
    results, scored = benchmarks.evaluate(cfg, args.role, args.benchmark, data=args.data, images=args.images,
                                          model=args.model, head=args.head, progress=not args.no_progress)
    write_csv(args.out, results)
    if args.out_items:
        (write_parquet if str(args.out_items).endswith(".parquet") else write_csv)(args.out_items, scored)
    for r in results.itertuples():
        benchmarks.log.info("%s %s %s %s = %.4f (n=%d)", r.model, r.benchmark, r.subset, r.metric, r.value, r.n)
    return 0


def _cmd_tables(args) -> int:
    md = benchmark_tables.write_tables(args.results, args.benchmark, models=args.model,
                                       labels=_pairs(args.label, "--label"), deltas=_pairs(args.delta, "--delta"),
                                       decimals=args.decimals, out_md=args.out_md, out_tex=args.out_tex,
                                       out_csv=args.out_csv, out_html=args.out_html)
    if not (args.out_md or args.out_tex or args.out_csv or args.out_html):
        print(md)
    return 0


def _cmd_paper_tables(args) -> int:
    benchmark_tables.write_paper_tables(args.clip_summary, args.vlm_summary, args.results,
                                        labels=_pairs(args.label, "--label"), clip_role=args.clip_role,
                                        vlm_role=args.vlm_role, negclip=args.negclip, gpt4v=args.gpt4v,
                                        out_md=args.out_md, out_csv=args.out_csv, out_html=args.out_html)
    return 0


def _cmd_vlm_train(args) -> int:
    cfg = _load_config(args.config)
    result = vlm_finetune.train_run(cfg, args.data, args.out_dir, args.seed, role=args.role, val_data=args.val_data,
                                    progress=not args.no_progress)
    print(f"trained {result.steps} steps on {result.examples} conversations; checkpoint {Path(args.out_dir) / 'model'}")
    return 0


def _cmd_vlm_score(args) -> int:
    from ..io import write_csv

    cfg = _load_config(args.config)
    if args.batch_size is not None:
        cfg = {**cfg, vlm.SECTION: {**(cfg.get(vlm.SECTION) or {}), "eval_batch_size": args.batch_size}}
    table = vlm.score_table(cfg, args.role, args.data, progress=not args.no_progress)
    write_csv(args.out, table)
    print(f"{len(table)} rows: chose the caption {table['chose_caption'].mean():.4f}, caption more likely than "
          f"negative {(table['logp_caption'] > table['logp_negative']).mean():.4f}")
    return 0


# ------------------------------------------------------------------------------------------- declarations

ENTITIES_ROOT = Param("--entities-root", required=True, metavar="DIR",
                      help="Flickr30k Entities folder holding Sentences/ and Annotations/")
F30K_IMAGES = Param("--images", metavar="DIR",
                    help="Flickr30k images (<id>.jpg); default <entities-root>/flickr30k-images when it exists")
LENIENT = flag("--lenient", "clip boxes outside the image and ignore unknown chain ids (logged) instead of failing")
LLM_CACHE = Param("--cache", metavar="FILE.jsonl", help="llm answer cache (default: llm.cache)")
TRAIN_SEED = Param("--seed", type=int, required=True, help="training seed")
RUN_DIR = OUT_DIR.but(help="the run's folder (checkpoint and scores)")
NO_TRAIN = flag("--no-train", "evaluate the pre-trained model (mixture 'pretrained')")
DATASET = Param("--dataset", required=True, choices=training.DATASETS, help="which CounterCurate dataset")
#: --data / --images per benchmark and --no-progress (train-run, vlm-run)
BENCHMARK_DATA = (
    Param("--data", action="append", default=[], metavar="BENCHMARK=PATH",
          help="benchmark data (e.g. positions=.../positions.parquet; default countercurate.benchmarks)"),
    Param("--images", action="append", default=[], metavar="BENCHMARK=DIR", help="benchmark images root"),
    NO_PROGRESS)
MODEL_LABEL = LABEL.but(metavar="NAME=LABEL", help="display name of a model")

# Flickr30k-Positions and -Counting

POSITIONS = Step(
    "positions", help="Flickr30k-Positions: object pairs, left/right/above/below captions, flipped negatives and "
                      "generation requests (§3.2)",
    description="Reads Flickr30k Entities (Sentences/, Annotations/ and the images); writes the positions table (one "
                "row per object pair and axis, with left/right/above/below captions and flipped negatives) and, "
                "with --out-requests, the llm rewrite requests and the grounded-generation requests.",
    params=(ENTITIES_ROOT, F30K_IMAGES,
            CONFIG.but(required=False, help="configuration file (repeatable; section countercurate.positions; "
                                            "default: module defaults)"),
            OUT.but(metavar="FILE.parquet", help="one row per item (pair, axis)"),
            Param("--out-requests", former=("--requests-out",), metavar="DIR",
                  help=f"write {positions.LLM_FILE} (llm role, appendix B) and {positions.GENERATION_FILE} (grounded "
                       f"generation, §3.2) here"),
            Param("--flipped-dir", metavar="DIR", help="write the mirrored images of the left/right items here"),
            LENIENT),
    run=_cmd_positions)

COUNTING = Step(
    "counting", help="Flickr30k-Counting: category pairs, count captions and inpainting requests (§3.3)",
    description="Reads Flickr30k Entities (Sentences/, Annotations/ and the images); writes the counting table (one "
                "row per category pair) and, with --out-requests, the grounded-inpainting requests.",
    params=(ENTITIES_ROOT, F30K_IMAGES,
            CONFIG.but(required=False, help="configuration file (repeatable; section countercurate.counting; "
                                            "default: module defaults)"),
            OUT.but(metavar="FILE.parquet", help="one row per category pair"),
            Param("--out-requests", former=("--requests-out",), metavar="DIR",
                  help=f"write {counting.REQUESTS_FILE} (grounded inpainting, §3.3) here"),
            LENIENT),
    run=_cmd_counting)

# Flickr30k-Attributes and the llm requests (alias llm: it answers llm requests of any task; the workflow runs it on
# the positions requests)

ATTRIBUTES = (
    Step("attributes", help="Flickr30k-Attributes negatives from the role in GPT-4V's place (§3.4, app. A)",
         description="Reads captions with entity markup and the role named by countercurate.attributes.role (vlm: "
                     "the photograph and its box-annotated copy, one answer per caption); writes the attribute "
                     "negatives (accepted and rejected) and, on request, the text-to-image requests of the accepted "
                     "ones, the requests and the raw answers.",
         params=(CONFIG.but(help="configuration file with the answering role (models.vlm or models.llm) and the "
                                 "countercurate section (repeatable; later files win)"),
                 Param("--captions", required=True, metavar="FILE.parquet",
                       help="captions with entity markup (image_id, sentence_index, markup | caption + phrases)"),
                 Param("--entities-root", metavar="DIR",
                       help="Flickr30k Entities folder: the boxes and image sizes are read from its Annotations/ "
                            "(for captions tables without a boxes column)"),
                 OUT.but(metavar="FILE.parquet", help="negatives, accepted and rejected"),
                 Param("--out-requests", former=("--requests-out",), metavar="FILE.parquet",
                       help="t2i requests for the accepted negatives"),
                 Param("--out-llm-requests", former=("--llm-requests-out",), metavar="FILE.parquet",
                       help="also write the llm requests"),
                 Param("--out-answers", former=("--answers-out",), metavar="FILE.parquet",
                       help="also write the raw llm answers"),
                 LLM_CACHE),
         run=_cmd_attributes),
    Step("positions-rewrite", aliases=("llm",),
         help="app. B: rewrite the above/below negatives with the llm role (answers llm requests of any task with "
              "JSON-schema constrained decoding)",
         description="Reads a table of llm requests (any task) and the llm role; writes the answers (parquet) with "
                     "their validity and errors, decoding each answer constrained to the request's JSON schema; "
                     "answers are cached.",
         params=(CONFIG.but(help="configuration file with models.llm (repeatable; later files win)"),
                 Param("--requests", required=True, metavar="FILE.parquet",
                       help="item_id, task, fields (JSON) [, prompt, schema, image_path, boxes, images]"),
                 OUT.but(metavar="FILE.parquet", help="answers with validity and errors"),
                 Param("--rejected", metavar="FILE.parquet",
                       help="also write every rejected or unusable answer with its reason (item_id, task, answer, "
                            "reason, detail): empty, not JSON, off-schema, or failing the task's check (an "
                            "off-topic rewrite)"),
                 LLM_CACHE),
         run=_cmd_llm),
)

# grounded generation (GLIGEN text-box generation §3.2, GLIGEN inpainting §3.3 / appendix C, text-to-image in
# DALLE-3's role §3.4) for one shard of requests, its merge and the shard ids of a requests table (the work:
# :mod:`counterfactory.generation.grounded`)

GENERATE = (
    Step("generate", help="grounded generation / inpainting / text-to-image for one shard of requests (§3.2-3.4)",
         description="CounterCurate §3.2-3.4: for every request of the shard (items ranked shard*S .. (shard+1)*S-1 "
                     "in sorted item_id order, S = grounded.shard_size) generate one image: kind generate = GLIGEN "
                     "text-box generation (models.gligen), inpaint = GLIGEN text-box inpainting of image_path "
                     "(models.gligen_inpaint), t2i = plain text-to-image (models.t2i, DALLE-3's role). Items of one "
                     "kind run grounded.batch_size at a time; each item's randomness comes from its item_id. "
                     "Writes OUT_DIR/images/<item_id>.png, OUT_DIR/generated.parquet and OUT_DIR/summary.json; "
                     "finished items are cached in OUT_DIR/work/, so a killed job resumes with identical files.",
         params=shard_job_params("--requests", "FILE.parquet",
                                 "requests table (item_id, kind, prompt, phrases, boxes, image_path, mask_box)"),
         run=_cmd_generate),
    Step("generate-merge", help="concatenate the grounded-generation shards into one table",
         description="Read generated.parquet and summary.json of every shard folder and write "
                     "OUT_DIR/generated.parquet (sorted by item_id; image paths relative to OUT_DIR) and "
                     "OUT_DIR/summary.json. Refused: a missing shard output or shard, shards made with different "
                     "settings (config_digest) or from different requests tables.",
         params=(SHARD_DIRS, OUT_DIR.but(help="folder for the merged table")),
         run=_cmd_generate_merge),
    Step("request-shards", aliases=("generate-shards",), help="the shard ids of a requests table, one per line",
         description="Reads a requests table and grounded.shard_size from the config; writes a text file with the "
                     "shard ids covering it, one per line.",
         params=(CONFIG.but(help="configuration file: grounded.shard_size (repeatable; later files win)"),
                 Param("--requests", required=True, metavar="FILE.parquet", help="requests table"),
                 OUT.but(metavar="FILE.txt", help="the shard ids, one per line")),
         run=_cmd_generate_shards),
)

# requests and datasets: the glue between the steps (:mod:`.assemble` of the study)

ASSEMBLE = (
    Step("requests", help="one grounded-generation requests table for positions (rewritten), counting and attributes",
         description="Reads the positions generation requests, the llm rewrites of the positions captions, the "
                     "counting inpainting requests and the attributes t2i requests; writes one grounded-generation "
                     "requests table.",
         params=(Param("--positions", required=True, metavar="FILE.parquet", help="positions generation requests"),
                 Param("--rewrites", required=True, metavar="FILE.parquet",
                       help="llm answers of the positions rewrite"),
                 Param("--counting", required=True, metavar="FILE.parquet", help="counting inpainting requests"),
                 Param("--attributes", required=True, metavar="FILE.parquet", help="attributes t2i requests"),
                 OUT.but(metavar="FILE.parquet", help="the combined requests table")),
         run=_cmd_requests),
    Step("datasets", help="Flickr30k-Positions / -Counting / -Attributes with negative images",
         description="Reads the positions, counting and attributes tables and the merged generation output; writes "
                     "positions/counting/attributes.parquet, each item with its negative image, to --out-dir.",
         params=(Param("--positions", required=True, metavar="FILE.parquet", help="the positions table"),
                 Param("--counting", required=True, metavar="FILE.parquet", help="the counting table"),
                 Param("--attributes", required=True, metavar="FILE.parquet", help="the attributes negatives"),
                 Param("--generated", required=True, metavar="FILE.parquet", help="merged generation output"),
                 OUT_DIR.but(help="folder for the three dataset tables")),
         run=_cmd_datasets),
)

# fine-tuning runs

TRAINING = (
    Step("train-manifests", help="CLIP fine-tuning manifests per dataset and variant (§3.5, §4.1, Tables 4 and 8)",
         description="Reads the three dataset tables (and the Flickr30k images); writes one CLIP fine-tuning "
                     "manifest per dataset and variant to --out-dir.",
         params=(CONFIG,
                 Param("--datasets", required=True, metavar="DIR",
                       help="folder of positions/counting/attributes.parquet"),
                 OUT_DIR.but(help="folder for the manifests"),
                 Param("--images", metavar="DIR", help="Flickr30k images (Attributes' positives; default from data)")),
         run=_cmd_train_manifests),
    Step("train-run", help="fine-tune CLIP on one manifest (one seed) and score it on the dataset's benchmarks; "
                           "--no-train scores the pre-trained model",
         description="Reads a fine-tuning manifest (from train-manifests) and the dataset's benchmark data; "
                     "fine-tunes the CLIP role for one seed (unless --no-train) and writes the checkpoint and the "
                     "benchmark scores (a runs table) to --out-dir.",
         params=(CONFIG, DATASET,
                 Param("--variant", choices=training.VARIANTS, help="required unless --no-train"),
                 Param("--manifest", metavar="FILE.parquet", help="from train-manifests; required unless --no-train"),
                 TRAIN_SEED,
                 Param("--data-seed", type=int, required=True, help="seed of the data order"),
                 RUN_DIR, NO_TRAIN, *BENCHMARK_DATA),
         run=_cmd_train_run),
    Step("vlm-run", help="fine-tune the vlm role (LLaVA-1.5 class) on one dataset's conversations (one seed) and "
                         "score it on the dataset's benchmarks; --no-train scores the pre-trained model",
         description="Reads the dataset's conversation manifests (from train-manifests) and its benchmark data; "
                     "fine-tunes the vlm role for one seed (unless --no-train) and writes the checkpoint and the "
                     "benchmark scores (a runs table) to --out-dir.",
         params=(CONFIG, DATASET,
                 Param("--manifests", metavar="DIR", help="from train-manifests; required unless --no-train"),
                 TRAIN_SEED, RUN_DIR, NO_TRAIN, *BENCHMARK_DATA),
         run=_cmd_vlm_run),
)

# benchmarks and tables

EVALUATION = (
    Step("evaluate", help="score one model role on a benchmark (Flickr30k-Positions, PointQA-LookTwice, SugarCrepe, "
                          "Winoground; §4.2-4.4, app. E)",
         description="Reads one benchmark's data and images and the model role; writes the long results (CSV) and, "
                     "with --out-items, the per-item scores.",
         params=(CONFIG,
                 Param("--role", required=True, metavar="ROLE", help="model role to evaluate"),
                 Param("--benchmark", required=True, choices=benchmarks.BENCHMARKS, help="the benchmark to score"),
                 Param("--data", metavar="PATH",
                       help="positions table / looktwiceqa_dataset.json / SugarCrepe data folder / Winoground "
                            "examples.jsonl (default: benchmarks.<benchmark> in the config)"),
                 Param("--images", metavar="DIR", help="images root (default: from the config)"),
                 Param("--model", metavar="NAME", help="name of the model in the results (default: the role)"),
                 Param("--head", choices=("itm", "itc"), help="cross-encoder head (default benchmarks.head or itm)"),
                 OUT.but(metavar="FILE.csv", help="long results: " + ", ".join(benchmarks.RESULT_COLUMNS)),
                 Param("--out-items", metavar="FILE.parquet", help="per-item scores (.parquet or .csv)"),
                 NO_PROGRESS),
         run=_cmd_evaluate),
    Step("tables", help="Tables 1-4, 6, 7, 8 of CounterCurate from evaluate results",
         description="Reads the results CSVs of `countercurate evaluate` (and the runs' scores); writes Tables 1-4, "
                     "6, 7 and 8 as Markdown, LaTeX and CSV (printed when no --out-* is given).",
         params=(Param("--results", nargs="+", action="extend", required=True, metavar="CSV",
                       help="results CSVs (repeatable)"),
                 Param("--benchmark", action="append", choices=benchmarks.BENCHMARKS,
                       help="only these (default: all present)"),
                 Param("--model", action="append", metavar="NAME", help="models in this order (default: as found)"),
                 MODEL_LABEL,
                 Param("--delta", action="append", default=[], metavar="NAME=BASELINE",
                       help="show NAME's difference to BASELINE in parentheses (Table 3)"),
                 DECIMALS,
                 OUT_MD.but(help="the tables as Markdown"), OUT_TEX.but(help="the tables as LaTeX"),
                 OUT_CSV.but(help="the tables as CSV"),
                 OUT_HTML.but(help="the tables as an HTML page (what the report shows)")),
         run=_cmd_tables),
    Step("paper-tables", help="Tables 1, 2, 3, 5 and 6 of CounterCurate in the paper's layout",
         description="Reads the fine-tuning summaries (CLIP runs, vlm family) and the evaluate results (the NegCLIP "
                     "and GPT-4V columns of Tables 3 and 6); writes Tables 1, 2, 3, 5 and 6 as printed (pre-trained "
                     "and fine-tuned models side by side).",
         params=(Param("--clip-summary", metavar="CSV", help="stats summarize output of the CLIP fine-tuning runs"),
                 Param("--vlm-summary", metavar="CSV", help="stats summarize output of the vlm family's runs"),
                 Param("--results", nargs="*", action="extend", default=[], metavar="CSV",
                       help="results CSVs of `countercurate evaluate` (NegCLIP, the GPT-4V stand-in)"),
                 Param("--negclip", default="negclip", metavar="NAME", help="model of Table 3's NegCLIP column"),
                 Param("--gpt4v", metavar="NAME",
                       help="model in GPT-4V's place (Table 3's column, named by --label)"),
                 MODEL_LABEL,
                 Param("--clip-role", default="clip_open_clip", metavar="ROLE",
                       help="the fine-tuned CLIP's role (its label)"),
                 Param("--vlm-role", default="vlm", metavar="ROLE", help="the fine-tuned VLM's role (its label)"),
                 OUT_MD.but(required=True, help="the tables as Markdown"), OUT_CSV.but(help="the tables as CSV"),
                 OUT_HTML.but(help="the tables as an HTML page")),
         run=_cmd_paper_tables),
)

# the generative VLM

VLM = (
    Step("vlm-train", help="fine-tune the vlm role (LLaVA-1.5 class) on caption pairs as conversations (§3.5)",
         description="Reads a table of images with a caption and a negative caption (and a validation table); "
                     "fine-tunes the vlm role on them as conversations and writes the model (loadable as "
                     "models.vlm.source), history.csv and run.json to --out-dir.",
         params=(CONFIG,
                 Param("--data", required=True, metavar="FILE.parquet",
                       help="rows image_path, caption, negative_caption[, negative_image_path] (paths relative to "
                            "the table's folder or absolute)"),
                 Param("--val-data", metavar="FILE.parquet",
                       help="validation rows: keep the lowest-loss checkpoint"),
                 OUT_DIR.but(help="writes DIR/model (loadable as models.vlm.source), history.csv, run.json"),
                 TRAIN_SEED,
                 Param("--role", default=VLM_ROLE, metavar="ROLE",
                       help=f"model role to fine-tune (default {VLM_ROLE})"),
                 NO_PROGRESS),
         run=_cmd_vlm_train),
    Step("vlm-score", help="score caption pairs with the vlm role: caption log-likelihoods and the two-option choice "
                           "(§4)",
         description="Reads a table of images with a caption and a negative caption and the vlm role; writes one "
                     "CSV row per input row with both captions' log-likelihoods and the model's two-option choice.",
         params=(CONFIG,
                 Param("--role", default=VLM_ROLE, metavar="ROLE", help=f"model role (default {VLM_ROLE})"),
                 Param("--data", required=True, metavar="FILE.parquet",
                       help="rows image_path, caption, negative_caption (paths relative to the table's folder)"),
                 OUT.but(metavar="FILE.csv", help="one row per input row"),
                 Param("--batch-size", type=int, metavar="N", help="override vlm.eval_batch_size"),
                 NO_PROGRESS),
         run=_cmd_vlm_score),
)

COUNTERCURATE = Step(
    "countercurate", help="CounterCurate: positions, counting, attributes, grounded generation, benchmarks",
    description="The CounterCurate study: Flickr30k-Positions, -Counting and -Attributes with their negatives, "
                "grounded generation of the negative images, CLIP and VLM fine-tuning, and the benchmarks and "
                "tables.",
    steps=(POSITIONS, COUNTING, *ATTRIBUTES, *GENERATE, *ASSEMBLE, *TRAINING, *EVALUATION, *VLM))

register = registrar(COUNTERCURATE)
#: a part of the group alone (for tests that parse one part)
add_attributes = registrar(*ATTRIBUTES)
add_vlm = registrar(*VLM)
