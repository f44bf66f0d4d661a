"""``counterfactory cvld``: the CVLD study (debiasing VLMs with counterfactuals): gender interventions on captions
(``swap-gender``, ``intervene``), editing requests and image edits (``requests``, ``edit``), debiased adaptation and
evaluation runs (``run``) and the paper's tables (``tables``). This module is the command line only, declared as
data (``commands.Step``); the logic is in :mod:`counterfactory.studies.cvld`, :mod:`counterfactory.text.gender`,
:mod:`counterfactory.generation.editing`, :mod:`counterfactory.training.cvld`."""

from __future__ import annotations

import logging

from . import (CONFIG, NLTK_DATA, NO_PROGRESS, OUT, OUT_CSV, OUT_DIR, OUT_HTML, OUT_MD, OUT_TEX, Param, Step,
               lazy_module, registrar, shard_job_params, use_threads)

log = logging.getLogger(__name__)

# the step modules, each imported when its subcommand runs (edits and runs import torch; tables do not)
pipeline, runs, tables = (lazy_module(f"counterfactory.studies.cvld.{name}") for name in ("pipeline", "runs", "tables"))


def _load(paths):
    from ..config import load_config

    return load_config(paths, study="cvld")


def _read_table(path):
    """A caption table (CSV or parquet): :func:`counterfactory.studies.cvld.pipeline.read_captions`."""
    return pipeline.read_captions(path)


# ------------------------------------------------------------------------------------------- handlers


def _swap_gender(args) -> int:
    from . import use_nltk_data

    use_nltk_data(args)
    out = pipeline.swap_gender(args.captions, args.out, args.caption_column, args.id_column)
    print(f"{int(out['changed'].sum())} of {len(out)} captions changed -> {args.out}")
    return 0


def _intervene(args) -> int:
    counts = pipeline.intervene(_load(args.config), args.out_captions, args.out_votes, args.out_requests,
                                args.out_summary, llm_cache=args.llm_cache, out_rejected=args.out_rejected)
    print(", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def _requests(args) -> int:
    n = pipeline.celeba_requests(_load(args.config), args.out)
    print(f"{n} CelebA editing requests -> {args.out}")
    return 0


def _edit(args) -> int:
    use_threads(args)
    result = pipeline.edit(_load(args.config), args.requests, args.method, args.shard, args.out_dir,
                           cache_dir=args.cache_dir, progress=not args.no_progress)
    print(f"shard {args.shard} ({args.method}): {result}")
    return 0


def _edit_merge(args) -> int:
    rows = pipeline.edit_merge(args.shards, args.out)
    print(f"{len(args.shards)} shard manifests, {rows} rows -> {args.out}")
    return 0


def _run(args) -> int:
    rows = runs.run(_load(args.config), args.task, args.setting, args.variant, args.seed, args.edits, args.out_dir,
                    interventions=args.interventions, progress=not args.no_progress)
    print(rows.to_string(index=False))
    return 0


def _tables(args) -> int:
    tables.write_tables(args.runs_table, _load(args.config), args.runs, args.out_md, args.out_tex, args.out_csv,
                        args.out_figures, out_html=args.out_html)
    print(f"tables -> {args.out_md}")
    return 0


# ------------------------------------------------------------------------------------------- declarations

SWAP_GENDER = Step(
    "swap-gender", help="§3.2: rule-based gender flip of every caption of a CSV/parquet table",
    description="Input: a CSV or parquet file with caption_id and caption columns. Output: the same rows plus "
                "intervened, changed (false when there is nothing to swap), edits and edit_prompt (the "
                "InstructPix2Pix instruction).",
    params=(Param("--captions", required=True, metavar="FILE", help="CSV or parquet with caption_id, caption"),
            OUT.but(metavar="FILE.parquet", help="the captions with their interventions"),
            Param("--caption-column", default="caption", help="column holding the caption (default: caption)"),
            Param("--id-column", default="caption_id", help="column holding the caption id (default: caption_id)"),
            NLTK_DATA),
    run=_swap_gender)

INTERVENE = Step(
    "intervene", help="§3.3, appendix B: intervene the COCO captions (rule or llm), vote per image, one editing "
                      "request per accepted image",
    description="Reads the COCO captions named by the config (and the llm role when text_method is llm); writes the "
                "intervened captions, the per-image votes, one editing request per accepted image (parquet) and a "
                "CSV summary of the counts.",
    params=(CONFIG,
            Param("--out-captions", required=True, metavar="FILE.parquet",
                  help="train (largest subset) and test captions with their interventions"),
            Param("--out-votes", required=True, metavar="FILE.parquet", help="per-image votes of its captions"),
            Param("--out-requests", required=True, metavar="FILE.parquet",
                  help="one image-editing request per accepted image (what `cvld edit` reads)"),
            Param("--out-summary", former=("--summary-out",), required=True, metavar="FILE.csv",
                  help="counts of captions, images and requests"),
            Param("--llm-cache", metavar="FILE", help="answer cache of the llm role (text_method: llm)"),
            Param("--out-rejected", metavar="FILE.parquet",
                  help="every rejected llm answer and turned-down vote with its reason (stage, item_id, image_id, "
                       "task, reason, detail); default: rejected.parquet beside --out-votes")),
    run=_intervene)

REQUESTS = Step(
    "requests", help="§3.3 image-only intervention: editing requests for the CelebA training images of every K-shot "
                     "episode (manual prompts)",
    description="Reads the CelebA training images of every K-shot episode named by the config; writes one "
                "image-editing request per image (manual prompts) as parquet.",
    params=(CONFIG, OUT.but(metavar="FILE.parquet", help="the editing requests (what `cvld edit` reads)")),
    run=_requests)

EDIT = Step(
    "edit", help="§3.3, §5.1: m edits per example, the k most similar kept (one shard; resumable)",
    description="Reads one shard of image-editing requests and the editor / image_encoder roles; writes the edited "
                "images and the shard's edit manifest (parquet) to --out-dir, keeping the k edits most similar to "
                "the original.",
    params=(*shard_job_params("--requests", "FILE.parquet", "editing requests (cvld intervene / requests)"),
            Param("--method", required=True, choices=("ip2p", "null_text"),
                  help="editing method: InstructPix2Pix (ip2p) or null-text inversion with prompt-to-prompt"),
            Param("--cache-dir", metavar="DIR", help="null-text inversion cache (default: OUT_DIR/../inversions)")),
    run=_edit)

EDIT_MERGE = Step(
    "edit-merge", help="the edit shard manifests of one method in one manifest (what runs read)",
    description="Concatenates the shard manifests (<method>/<shard>/shard.parquet, in the order given) into "
                "<method>/edits.parquet, paths kept relative to it.",
    params=(Param("--shards", nargs="+", required=True, metavar="SHARD.parquet", help="the shards' manifests"),
            OUT.but(metavar="FILE.parquet", help="the merged manifest (<method>/edits.parquet)")),
    run=_edit_merge)

RUN = Step(
    "run", help="§4-5: train (unless pretrained) and evaluate one task / setting / variant / seed",
    description="Reads the config, the edit manifests of the train method and the intervened captions; trains BLIP "
                "(unless the variant is pretrained) and evaluates it, writing metrics.csv (a runs table) and the "
                "detail tables to --out-dir.",
    params=(CONFIG,
            Param("--task", required=True, choices=("classification", "retrieval", "captioning"),
                  help="the task to train and evaluate"),
            Param("--setting", required=True, help="k<K> (classification), coco<percent> or pt (pretrained)"),
            Param("--variant", required=True,
                  help="training variant: pretrained, base, balanced, or a counterfactual method / loss variant"),
            Param("--seed", required=True, type=int, help="seed (classification: the episode)"),
            Param("--edits", nargs="*", default=[], metavar="FILE.parquet",
                  help="edit manifests of the train method (its merged edits.parquet, or its shards' "
                       "shard.parquet)"),
            Param("--interventions", metavar="FILE.parquet", help="from `cvld intervene --out-captions`"),
            OUT_DIR.but(help="the run's folder (metrics.csv and details)"),
            NO_PROGRESS),
    run=_run)

TABLES = Step(
    "tables", help="Tables 1-4 and Figures 4, 5, 9, 10 from the runs summary",
    description="Reads the runs table (`train collect`) and the run folders' detail tables; writes Tables 1-4 as "
                "Markdown, LaTeX and CSV and Figures 4, 5, 9 and 10.",
    params=(CONFIG,
            Param("--runs-table", required=True, metavar="FILE.csv", help="the runs table (`train collect`)"),
            Param("--runs", nargs="*", default=[], metavar="DIR", help="run folders (their detail tables)"),
            OUT_MD.but(required=True, help="the tables as Markdown"),
            OUT_TEX.but(required=True, help="the tables as LaTeX"),
            OUT_CSV.but(required=True, help="the tables as CSV"),
            Param("--out-figures", required=True, metavar="DIR", help="folder for the figures"),
            OUT_HTML.but(help="the tables as an HTML page (what the report shows)")),
    run=_tables)

CVLD = Step(
    "cvld", help="CVLD study: gender interventions by image editing, debiased BLIP",
    description="The CVLD study ('Debias your VLM with counterfactuals: a unified approach'): gender interventions "
                "on captions and images (InstructPix2Pix editing), BLIP trained and evaluated on them, and the "
                "paper's tables and figures.",
    steps=(SWAP_GENDER, INTERVENE, REQUESTS, EDIT, EDIT_MERGE, RUN, TABLES),
    metavar="<cvld command>")

register = registrar(CVLD)
