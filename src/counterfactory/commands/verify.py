"""``counterfactory verify {pairs,vqa,merge}``: the VQA check, one shared stage after any study's generation (issue
47 item 1; docs/verify.md "VQA check"). The command line only; the work is :mod:`counterfactory.filters.vqa` and
each study's adapter, ``counterfactory.studies.<study>.verify``."""

from __future__ import annotations

import importlib
import logging

from .. import studies
from . import CONFIG, NO_PROGRESS, OUT, SHARD, Param, Step, key_values, lazy_module, registrar

log = logging.getLogger(__name__)

vqa = lazy_module("counterfactory.filters.vqa")

#: studies with an adapter (``studies/<study>/verify.py``: ``pair_rows(inputs)``, ``verified(inputs, scores, dir)``)
STUDIES = studies.with_module("verify")


def adapter(study: str):
    """The study's adapter module (``counterfactory.studies.<study>.verify``)."""
    from ..errors import ConfigError

    if study not in STUDIES:
        raise ConfigError(f"verify: no adapter for study {study!r}. Fix: use one of {', '.join(STUDIES)}")
    return importlib.import_module(f"counterfactory.studies.{study}.verify")


def _pairs(args) -> int:
    inputs = dict(key_values(args.input, "--input", "NAME=PATH"))
    frame = vqa.write_pairs(adapter(args.study).pair_rows(inputs), args.out)
    print(f"{args.out}: {len(frame)} pairs of {args.study}")
    return 0


def _vqa(args) -> int:
    from ..config import load_config

    cfg = load_config(args.config)
    settings = vqa.VerifySettings.from_config(cfg)
    table = vqa.score_shard(args.pairs, args.out, settings,
                            lambda: vqa.scorer_from_config(cfg, settings, progress=not args.no_progress),
                            vqa.model_identity(cfg, settings.role), shard=args.shard, shards=settings.shards)
    print(f"{args.out}: shard {args.shard} of {settings.shards}, {len(table)} items, {int(table['kept'].sum())} kept")
    return 0


def _merge(args) -> int:
    from pathlib import Path

    from ..config import load_config
    from ..io import write_parquet

    cfg = load_config(args.config)
    settings = vqa.VerifySettings.from_config(cfg)
    inputs = dict(key_values(args.input, "--input", "NAME=PATH"))
    scores = vqa.merge(args.shards, settings)
    write_parquet(Path(args.out), scores)
    verified = adapter(args.study).verified(inputs, scores, Path(args.verified).parent)
    write_parquet(Path(args.verified), verified)
    print(f"{args.out}: {len(scores)} items, {int(scores['kept'].sum())} kept; {args.verified}: {len(verified)} rows")
    return 0


# ------------------------------------------------------------------------------------------- declarations

#: whose candidates, and the study's candidate files (`pairs` and `merge`)
INPUTS = (Param("--study", required=True, choices=STUDIES, help="whose candidates"),
          Param("--input", action="append", default=[], required=True, metavar="NAME=PATH",
                help="the study's candidate files (candidates=..., and requests=... / datasets for some studies; "
                     "docs/verify.md lists them)"))

PAIRS = Step(
    "pairs", help="one study's candidates as a pair table",
    description="Reads one study's candidate files; writes the study-agnostic pair table (item_id, image_path, "
                "caption, partner_image_path, partner_caption; image paths relative to its folder).",
    params=(*INPUTS, OUT.but(metavar="FILE.parquet", help="the pair table")),
    run=_pairs)

VQA = Step(
    "vqa", help="P(Yes) of one shard of a pair table (batched, resumable)",
    description="Reads a pair table and the vlm role; writes one row per item of the shard: the four P(Yes) "
                "terms, present, absent, score and kept (a filter card's score table: item_id, score). Batched "
                "(verify.batch_size), resumable (a rerun skips the chunks of verify.checkpoint_every items a "
                "killed job wrote).",
    params=(
        CONFIG.but(help="configuration file (repeatable; reads verify, models.<verify.role> and the device keys)"),
        Param("--pairs", required=True, metavar="FILE", help="the pair table of `verify pairs`"),
        SHARD.but(required=False, default=0, help="shard number, 0 <= N < verify.shards, e.g. 00000 (default 0)"),
        OUT.but(metavar="FILE.parquet", help="the shard's scores"),
        NO_PROGRESS,
    ),
    run=_vqa)

MERGE = Step(
    "merge", help="the shards' scores in one table, and the study's verified variant",
    description="Reads the shards' scores and the study's candidate files; writes the scores (kept from the "
                "config's thresholds) and the verified variant: the study's kept candidates that the VQA check "
                "keeps too, in the study's layout.",
    params=(
        CONFIG.but(help="configuration file (repeatable; reads the verify thresholds)"),
        *INPUTS,
        Param("--shards", nargs="+", required=True, metavar="FILE", help="the shards' scores, in order"),
        OUT.but(metavar="FILE.parquet", help="the scores of every item"),
        Param("--verified", required=True, metavar="FILE.parquet", help="the verified variant"),
    ),
    run=_merge)

VERIFY = Step(
    "verify", help="the VQA check: P(Yes) of the vlm role on each candidate and on its counterfactual partner",
    description="The VQA check (VQAScore-style, Lin et al. 2024): for each counterfactual pair, the vlm role's "
                "P(\"Yes\") to \"Does this image show <caption>?\" on the image and on its partner, the edit present "
                "in one and absent in the other (docs/verify.md).",
    steps=(PAIRS, VQA, MERGE))

register = registrar(VERIFY)
