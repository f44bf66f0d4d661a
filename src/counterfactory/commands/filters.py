"""``counterfactory filters {card,calibrate}``: filter cards, a filter of generated candidates measured against a
hand-labelled audit sample (issue 47). The command line only; the work is :mod:`counterfactory.filters.cards`."""

from __future__ import annotations

import argparse
import logging

from . import lazy_module, positive_int

log = logging.getLogger(__name__)

# imported when a subcommand runs (the filters package imports torch); building the parser must not import it
cards = lazy_module("counterfactory.filters.cards")


def _level(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return value


def _precision(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scores", required=True, metavar="FILE.parquet|csv",
                   help="the filter's score table: one row per scored item, an id column and the score column")
    p.add_argument("--score-column", required=True, metavar="NAME",
                   help="column of the score table holding the filter score (or true/false kept flags of a rule "
                        "filter such as a vote)")
    p.add_argument("--id-column", default="item_id", metavar="NAME",
                   help="column of the score table holding the item ids of the audit (default item_id)")
    p.add_argument("--audit", required=True, metavar="FILE.csv",
                   help="hand-labelled audit sample: item_id,verdict[,annotator] (verdict 1/0, yes/no, true/false, "
                        "keep/drop or good/bad)")
    p.add_argument("--ties", choices=("error", "good", "bad", "drop"), default="error",
                   help="an item whose annotators split evenly: error (default), count it good or bad, or drop it")
    p.add_argument("--keep", choices=("above", "below"), default="above",
                   help="above: the filter keeps scores >= the threshold (default); below: scores <= it")
    p.add_argument("--resamples", type=positive_int, default=1000,
                   help="bootstrap resamples of the audited items for the intervals (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    p.add_argument("--level", type=_level, default=0.95, help="level of the bootstrap intervals (default 0.95)")
    p.add_argument("--title", default=None, help="title of the card (default: names the score column)")
    p.add_argument("--out-dir", required=True, metavar="DIR",
                   help="folder to write card.md, card.json, curve.csv and curve.png into")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "filters", help="filter cards: measure a keep/drop filter against a hand-labelled audit sample",
        description="Filter cards: how often a filter of generated candidates (a CLIP threshold, an NSFW or "
                    "detectability filter, a vote) agrees with people's verdicts on an audit sample: precision of "
                    "the kept items, recall of the good items, the removal share, with bootstrap intervals "
                    "(docs/verify.md).")
    sub = parser.add_subparsers(dest="filters_command", metavar="<step>")
    sub.required = True

    p = sub.add_parser(
        "card", help="the filter card of one threshold (or of a kept column)",
        description="The filter card of one threshold (or of a kept column) against a hand-labelled audit "
                    "sample. Joins the score table with the audit sample and writes the card of keeping the items at "
                    "or above (or below) the threshold: precision, recall, removed-set precision and recall, the share "
                    "of good items, with bootstrap percentile intervals over the audited items, and the removal "
                    "share over all scored items; audited items the score table lacks are counted and listed. "
                    "Writes card.md, card.json, curve.csv (precision, recall and removal share at every audited "
                    "score) and curve.png.")
    _common(p)
    p.add_argument("--threshold", type=float, default=None, metavar="X",
                   help="the filter's threshold (required for a score column; none for a kept column)")
    p.set_defaults(func=_card)

    c = sub.add_parser(
        "calibrate", help="the most lenient threshold whose kept audited items reach a precision",
        description="Calibrate a filter's threshold to a target precision on a hand-labelled audit sample. Of "
                    "the audited scores, pick the threshold that keeps the most scored items while the "
                    "precision of the kept audited items is at least the target (ties: the smallest threshold with "
                    "--keep above, the largest with below); print it and write its card like `counterfactory "
                    "filters card`. The threshold is chosen on the audit that measures it: confirm it on a fresh "
                    "sample.")
    _common(c)
    c.add_argument("--target-precision", required=True, type=_precision, metavar="P",
                   help="the precision the kept audited items must reach, in (0, 1]")
    c.set_defaults(func=_calibrate)


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
