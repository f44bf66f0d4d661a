"""``counterfactory filters {card,calibrate}``: filter cards, a filter of generated candidates measured against a
hand-labelled audit sample (issue 47). The command line only; the work is :mod:`counterfactory.filters.cards`."""

from __future__ import annotations

import importlib
import logging

from .. import studies
from . import (CONFIG, OUT_DIR, SEED, Param, Step, fraction, key_values, lazy_module, open_fraction, positive_int,
               registrar)

log = logging.getLogger(__name__)

# imported when a subcommand runs (the filters package imports torch); building the parser must not import it
cards = lazy_module("counterfactory.filters.cards")

#: studies whose filters are declared for cards (``counterfactory.studies.<study>.filter_cards.FILTERS``)
STUDIES = studies.with_module("filter_cards")


def study_filters(study: str) -> dict:
    """The study's filters (``counterfactory.studies.<study>.filter_cards.FILTERS``: name -> StudyFilter)."""
    from ..errors import ConfigError

    try:
        module = importlib.import_module(f"counterfactory.studies.{study}.filter_cards")
    except ModuleNotFoundError:
        raise ConfigError(f"study {study!r} declares no filter for cards. Fix: use one of "
                          f"{', '.join(STUDIES)}") from None
    return module.FILTERS


def _card(args) -> int:
    card = cards.card_files(args.scores, args.score_column, args.audit, args.out_dir, threshold=args.threshold,
                            keep=args.keep, resamples=args.resamples, seed=args.seed, level=args.level,
                            id_column=args.id_column, ties=args.ties, title=args.title)
    log.info("filter card of %s: %d audited, %d of %d scored items kept; written to %s", args.score_column,
             card.n_audited, card.n_kept, card.n_scored, args.out_dir)
    return 0


def _calibrate(args) -> int:
    threshold, card = cards.calibrate_files(args.scores, args.score_column, args.audit, args.out_dir,
                                            target_precision=args.target_precision, keep=args.keep,
                                            resamples=args.resamples, seed=args.seed, level=args.level,
                                            id_column=args.id_column, ties=args.ties, title=args.title)
    print(threshold)   # exact (repr), for scripts
    log.info("threshold %g keeps %d of %d scored items; precision %.3f on %d kept audited items; card in %s",
             threshold, card.n_kept, card.n_scored, card.metrics["precision"].value, card.n_audited_kept,
             args.out_dir)
    return 0


def _study_card(args) -> int:
    from ..config import fill_section, load_config
    from ..errors import ConfigError

    filters = study_filters(args.study)
    if args.filter not in filters:
        raise ConfigError(f"study {args.study!r} has no filter {args.filter!r}. Fix: use one of "
                          f"{', '.join(filters)}")
    cfg = load_config(args.config, study=args.study)
    settings = fill_section("filters", cfg.get("filters"))
    card = cards.study_card_files(filters[args.filter], dict(key_values(args.input, "--input", "NAME=PATH")), cfg,
                                  args.audit, args.out_dir, resamples=int(settings["resamples"]),
                                  seed=int(settings["seed"]), level=float(settings["level"]), ties=settings["ties"])
    print(f"{args.out_dir}: {args.study} {args.filter}: {card.n_audited} audited, {card.n_kept} of {card.n_scored} "
          "scored items kept")
    return 0


# ------------------------------------------------------------------------------------------- declarations

#: the parameters of `card` and `calibrate`: a score table against an audit sample
COMMON = (
    Param("--scores", required=True, metavar="FILE.parquet|csv",
          help="the filter's score table: one row per scored item, an id column and the score column"),
    Param("--score-column", required=True, metavar="NAME",
          help="column of the score table holding the filter score (or true/false kept flags of a rule "
               "filter such as a vote)"),
    Param("--id-column", default="item_id", metavar="NAME",
          help="column of the score table holding the item ids of the audit (default item_id)"),
    Param("--audit", required=True, metavar="FILE.csv",
          help="hand-labelled audit sample: item_id,verdict[,annotator] (verdict 1/0, yes/no, true/false, "
               "keep/drop or good/bad)"),
    Param("--ties", choices=("error", "good", "bad", "drop"), default="error",
          help="an item whose annotators split evenly: error (default), count it good or bad, or drop it"),
    Param("--keep", choices=("above", "below"), default="above",
          help="above: the filter keeps scores >= the threshold (default); below: scores <= it"),
    Param("--resamples", type=positive_int, default=1000,
          help="bootstrap resamples of the audited items for the intervals (default 1000)"),
    SEED.but(help="seed of the bootstrap (default 0)"),
    Param("--level", type=open_fraction, default=0.95, help="level of the bootstrap intervals (default 0.95)"),
    Param("--title", default=None, help="title of the card (default: names the score column)"),
    OUT_DIR.but(help="folder to write card.md, card.json, curve.csv and curve.png into"),
)

CARD = Step(
    "card", help="the filter card of one threshold (or of a kept column)",
    description="The filter card of one threshold (or of a kept column) against a hand-labelled audit "
                "sample. Joins the score table with the audit sample and writes the card of keeping the items at "
                "or above (or below) the threshold: precision, recall, removed-set precision and recall, the share "
                "of good items, with bootstrap percentile intervals over the audited items, and the removal "
                "share over all scored items; audited items the score table lacks are counted and listed. "
                "Writes card.md, card.json, curve.csv (precision, recall and removal share at every audited "
                "score) and curve.png.",
    params=(*COMMON, Param("--threshold", type=float, default=None, metavar="X",
                           help="the filter's threshold (required for a score column; none for a kept column)")),
    run=_card)

CALIBRATE = Step(
    "calibrate", help="the most lenient threshold whose kept audited items reach a precision",
    description="Calibrate a filter's threshold to a target precision on a hand-labelled audit sample. Of "
                "the audited scores, pick the threshold that keeps the most scored items while the "
                "precision of the kept audited items is at least the target (ties: the smallest threshold with "
                "--keep above, the largest with below); print it and write its card like `counterfactory "
                "filters card`. The threshold is chosen on the audit that measures it: confirm it on a fresh "
                "sample.",
    params=(*COMMON, Param("--target-precision", required=True, type=fraction, metavar="P",
                           help="the precision the kept audited items must reach, in (0, 1]")),
    run=_calibrate)

STUDY_CARD = Step(
    "study-card", help="the card of one of a study's own filters, its score table made from the study's files",
    description="The filter card of one of a study's filters at the study's own threshold (docs/verify.md "
                "\"Filter cards\" lists every study's filters and item ids): maps the study's filter outputs to a "
                "score table (scores.parquet: item_id, score), then writes the card like `counterfactory filters "
                "card` (card.md, card.json, curve.csv, curve.png) and card.html. The threshold and the bootstrap "
                "settings (filters.resamples, seed, level, ties) come from the configuration.",
    params=(
        CONFIG.but(help="configuration file (repeatable; reads the study's filter thresholds, verify and filters)"),
        Param("--study", required=True, choices=STUDIES, help="whose filter"),
        Param("--filter", required=True, metavar="NAME", help="the study's filter (e.g. clip, nsfw, vqa)"),
        Param("--input", action="append", default=[], required=True, metavar="NAME=PATH",
              help="a file the filter reads (repeatable; docs/verify.md names them)"),
        Param("--audit", required=True, metavar="FILE.csv",
              help="hand-labelled audit sample: item_id,verdict[,annotator], ids as the filter's items"),
        OUT_DIR.but(help="folder to write scores.parquet, card.md, card.json, card.html, curve.csv and curve.png "
                         "into"),
    ),
    run=_study_card)

FILTERS = Step(
    "filters", help="filter cards: measure a keep/drop filter against a hand-labelled audit sample",
    description="Filter cards: how often a filter of generated candidates (a CLIP threshold, an NSFW or "
                "detectability filter, a vote) agrees with people's verdicts on an audit sample: precision of "
                "the kept items, recall of the good items, the removal share, with bootstrap intervals "
                "(docs/verify.md).",
    steps=(CARD, CALIBRATE, STUDY_CARD))

register = registrar(FILTERS)
