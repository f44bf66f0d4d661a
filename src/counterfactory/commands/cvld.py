"""``counterfactory cvld``: the CVLD study (debiasing VLMs with counterfactuals): gender interventions on captions
(``swap-gender``, ``intervene``), editing requests and image edits (``requests``, ``edit``), debiased adaptation and
evaluation runs (``run``) and the paper's tables (``tables``). Logic in :mod:`counterfactory.studies.cvld`,
:mod:`counterfactory.text.gender`, :mod:`counterfactory.generation.editing`, :mod:`counterfactory.training.cvld`."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def _load(paths):
    from ..config import load_config

    return load_config(paths, study="cvld")


def register(subparsers) -> None:
    from . import add_config_option as _config
    from . import add_nltk_option, add_progress_option, add_renamed, add_shard_job_options

    parser = subparsers.add_parser("cvld", help="CVLD study: gender interventions by image editing, debiased BLIP",
                                   description="The CVLD study ('Debias your VLM with counterfactuals: a unified "
                                               "approach'): gender interventions on captions and images "
                                               "(InstructPix2Pix editing), BLIP trained and evaluated on them, and "
                                               "the paper's tables and figures.")
    sub = parser.add_subparsers(dest="cvld_command", metavar="<cvld command>")
    sub.required = True

    p = sub.add_parser("swap-gender", help="§3.2: rule-based gender flip of every caption of a CSV/parquet table",
                       description="Input: a CSV or parquet file with caption_id and caption columns. Output: the "
                                   "same rows plus intervened, changed (false when there is nothing to swap), edits "
                                   "and edit_prompt (the InstructPix2Pix instruction).")
    p.add_argument("--captions", required=True, metavar="FILE", help="CSV or parquet with caption_id, caption")
    p.add_argument("--out", required=True, metavar="FILE.parquet", help="the captions with their interventions")
    p.add_argument("--caption-column", default="caption", help="column holding the caption (default: caption)")
    p.add_argument("--id-column", default="caption_id", help="column holding the caption id (default: caption_id)")
    add_nltk_option(p)
    p.set_defaults(func=_swap_gender)

    p = sub.add_parser("intervene", help="§3.3, appendix B: intervene the COCO captions (rule or llm), vote per image, "
                       "one editing request per accepted image",
                       description="Reads the COCO captions named by the config (and the llm role when "
                                   "text_method is llm); writes the intervened captions, the per-image votes, one "
                                   "editing request per accepted image (parquet) and a CSV summary of the counts.")
    _config(p)
    p.add_argument("--out-captions", required=True, metavar="FILE.parquet",
                   help="train (largest subset) and test captions with their interventions")
    p.add_argument("--out-votes", required=True, metavar="FILE.parquet", help="per-image votes of its captions")
    p.add_argument("--out-requests", required=True, metavar="FILE.parquet",
                   help="one image-editing request per accepted image (what `cvld edit` reads)")
    add_renamed(p, "--out-summary", "--summary-out", required=True, metavar="FILE.csv",
                help="counts of captions, images and requests")
    p.add_argument("--llm-cache", metavar="FILE", help="answer cache of the llm role (text_method: llm)")
    p.add_argument("--out-rejected", metavar="FILE.parquet",
                   help="every rejected llm answer and turned-down vote with its reason (stage, item_id, image_id, "
                        "task, reason, detail); default: rejected.parquet beside --out-votes")
    p.set_defaults(func=_intervene)

    p = sub.add_parser("requests", help="§3.3 image-only intervention: editing requests for the CelebA training images "
                       "of every K-shot episode (manual prompts)",
                       description="Reads the CelebA training images of every K-shot episode named by the config; "
                                   "writes one image-editing request per image (manual prompts) as parquet.")
    _config(p)
    p.add_argument("--out", required=True, metavar="FILE.parquet", help="the editing requests (what `cvld edit` reads)")
    p.set_defaults(func=_requests)

    p = sub.add_parser("edit", help="§3.3, §5.1: m edits per example, the k most similar kept (one shard; resumable)",
                       description="Reads one shard of image-editing requests and the editor / image_encoder roles; "
                                   "writes the edited images and the shard's edit manifest (parquet) to --out-dir, "
                                   "keeping the k edits most similar to the original.")
    add_shard_job_options(p, "--requests", "FILE.parquet", "editing requests (cvld intervene / requests)")
    p.add_argument("--method", required=True, choices=("ip2p", "null_text"),
                   help="editing method: InstructPix2Pix (ip2p) or null-text inversion with prompt-to-prompt")
    p.add_argument("--cache-dir", metavar="DIR", help="null-text inversion cache (default: OUT_DIR/../inversions)")
    p.set_defaults(func=_edit)

    p = sub.add_parser("edit-merge", help="the edit shard manifests of one method in one manifest (what runs read)",
                       description="Concatenates the shard manifests (<method>/<shard>/shard.parquet, in the order "
                                   "given) into <method>/edits.parquet, paths kept relative to it.")
    p.add_argument("--shards", nargs="+", required=True, metavar="SHARD.parquet", help="the shards' manifests")
    p.add_argument("--out", required=True, metavar="FILE.parquet", help="the merged manifest (<method>/edits.parquet)")
    p.set_defaults(func=_edit_merge)

    p = sub.add_parser("run", help="§4-5: train (unless pretrained) and evaluate one task / setting / variant / seed",
                       description="Reads the config, the edit manifests of the train method and the intervened "
                                   "captions; trains BLIP (unless the variant is pretrained) and evaluates it, "
                                   "writing metrics.csv (a runs table) and the detail tables to --out-dir.")
    _config(p)
    p.add_argument("--task", required=True, choices=("classification", "retrieval", "captioning"),
                   help="the task to train and evaluate")
    p.add_argument("--setting", required=True, help="k<K> (classification), coco<percent> or pt (pretrained)")
    p.add_argument("--variant", required=True,
                   help="training variant: pretrained, base, balanced, or a counterfactual method / loss variant")
    p.add_argument("--seed", required=True, type=int, help="seed (classification: the episode)")
    p.add_argument("--edits", nargs="*", default=[], metavar="FILE.parquet",
                   help="edit manifests of the train method (its merged edits.parquet, or its shards' shard.parquet)")
    p.add_argument("--interventions", metavar="FILE.parquet", help="from `cvld intervene --out-captions`")
    p.add_argument("--out-dir", required=True, metavar="DIR", help="the run's folder (metrics.csv and details)")
    add_progress_option(p)
    p.set_defaults(func=_run)

    p = sub.add_parser("tables", help="Tables 1-4 and Figures 4, 5, 9, 10 from the runs summary",
                       description="Reads the runs table (`train collect`) and the run folders' detail tables; writes "
                                   "Tables 1-4 as Markdown, LaTeX and CSV and Figures 4, 5, 9 and 10.")
    _config(p)
    p.add_argument("--runs-table", required=True, metavar="FILE.csv", help="the runs table (`train collect`)")
    p.add_argument("--runs", nargs="*", default=[], metavar="DIR", help="run folders (their detail tables)")
    p.add_argument("--out-md", required=True, metavar="FILE.md", help="the tables as Markdown")
    p.add_argument("--out-tex", required=True, metavar="FILE.tex", help="the tables as LaTeX")
    p.add_argument("--out-csv", required=True, metavar="FILE.csv", help="the tables as CSV")
    p.add_argument("--out-figures", required=True, metavar="DIR", help="folder for the figures")
    p.add_argument("--out-html", metavar="FILE.html", help="the tables as an HTML page (what the report shows)")
    p.set_defaults(func=_tables)


def _read_table(path):
    import pandas as pd

    from ..errors import input_error

    text = str(path)
    try:
        if text.endswith(".parquet"):
            return pd.read_parquet(path)
        return pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
    except FileNotFoundError:
        raise input_error(path, None, "no such file", "check the path") from None
    except (UnicodeDecodeError, ValueError, OSError) as exc:
        raise input_error(path, None, f"not a readable CSV/parquet table ({exc})",
                          "give a UTF-8 CSV with a header, or a parquet file") from None


def _swap_gender(args) -> int:
    from ..io import write_parquet
    from ..text.gender import swap_table
    from . import use_nltk_data

    use_nltk_data(args)
    frame = _read_table(args.captions)
    out = swap_table(frame, args.caption_column, args.id_column, source=str(args.captions))
    write_parquet(args.out, out)
    print(f"{int(out['changed'].sum())} of {len(out)} captions changed -> {args.out}")
    return 0


def _intervene(args) -> int:
    from ..studies.cvld import pipeline

    counts = pipeline.intervene(_load(args.config), args.out_captions, args.out_votes, args.out_requests,
                                args.out_summary, llm_cache=args.llm_cache, out_rejected=args.out_rejected)
    print(", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def _requests(args) -> int:
    from ..studies.cvld import pipeline

    n = pipeline.celeba_requests(_load(args.config), args.out)
    print(f"{n} CelebA editing requests -> {args.out}")
    return 0


def _edit(args) -> int:
    import torch

    from ..studies.cvld import pipeline

    if args.threads:
        torch.set_num_threads(args.threads)
    result = pipeline.edit(_load(args.config), args.requests, args.method, args.shard, args.out_dir,
                           cache_dir=args.cache_dir, progress=not args.no_progress)
    print(f"shard {args.shard} ({args.method}): {result}")
    return 0


def _edit_merge(args) -> int:
    from ..studies.cvld import pipeline

    rows = pipeline.edit_merge(args.shards, args.out)
    print(f"{len(args.shards)} shard manifests, {rows} rows -> {args.out}")
    return 0


def _run(args) -> int:
    from ..studies.cvld import runs

    rows = runs.run(_load(args.config), args.task, args.setting, args.variant, args.seed, args.edits, args.out_dir,
                    interventions=args.interventions, progress=not args.no_progress)
    print(rows.to_string(index=False))
    return 0


def _tables(args) -> int:
    from ..studies.cvld import tables

    tables.write_tables(args.runs_table, _load(args.config), args.runs, args.out_md, args.out_tex, args.out_csv,
                        args.out_figures, out_html=args.out_html)
    print(f"tables -> {args.out_md}")
    return 0
