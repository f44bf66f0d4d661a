"""Filter cards: how well a keep/drop filter of generated candidates agrees with people (issue 47, item 2).

Every study keeps or drops its over-generated candidates with a rule nobody measured: CLIP thresholds
(COCO-Counterfactuals, SocialCounterfactuals), NSFW and detectability (SocialCounterfactuals), CLIP-score selection
(CounterCurate), a majority vote (CVLD). A *filter card* measures such a filter against a small hand-labelled *audit
sample*: people look at some candidates and say good or bad; the card reports how often the filter's keep/drop
agrees, with bootstrap intervals. Study-independent: a filter is a table ``item_id -> score`` (or ``-> kept`` for a
rule filter) and a threshold.

* :func:`read_audit` -- the audit CSV (``item_id,verdict[,annotator]``), one verdict per item (majority of its
  annotators);
* :func:`filter_card` -- the card of one threshold (:class:`FilterCard`, every definition there);
* :func:`threshold_curve` -- precision, recall and removal share at every audited score;
* :func:`calibrate` -- the most lenient threshold whose kept audited items reach a target precision;
* :func:`render_card`, :func:`plot_curve` -- the Markdown card and the precision-vs-threshold figure;
* :func:`card_files`, :func:`calibrate_files` -- the two commands on files (:func:`read_scores`, :func:`write_card`).

``counterfactory filters card`` and ``counterfactory filters calibrate`` run these on files (docs/verify.md).
"""

from __future__ import annotations

import csv
import io as _io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from ..errors import CounterFactoryError, InputError, input_error, missing_input
from ..io import read_table, read_utf8, save_figure, write_csv, write_json, write_parquet, write_text
from ..render import pyplot

#: verdict spellings (case-insensitive, surrounding spaces ignored) -> good
VERDICTS = {"1": True, "yes": True, "true": True, "keep": True, "good": True,
            "0": False, "no": False, "false": False, "drop": False, "bad": False}
#: what :func:`read_audit` does with an item whose annotators are split evenly
TIE_POLICIES = ("error", "good", "bad", "drop")
KEEP = ("above", "below")
#: the card's metrics with an interval, in the order the card shows them
METRICS = ("precision", "recall", "removed_precision", "removed_recall", "good_share")
#: rows of the curve a Markdown card shows at most (evenly spaced; the CSV holds all)
CARD_CURVE_ROWS = 25

AUDIT_FIX = ("write one row per verdict: item_id,verdict[,annotator] with verdict one of "
             "1/0, yes/no, true/false, keep/drop, good/bad")


class NoThresholdError(CounterFactoryError):
    """No threshold reaches the precision :func:`calibrate` was asked for."""


# ---------------------------------------------------------------------------------------------- audit sample


def read_audit(path, *, ties: str = "error") -> pd.DataFrame:
    """The audit sample at ``path``: a CSV with a header and columns ``item_id`` and ``verdict`` (people's judgement
    of the candidate: ``1``/``yes``/``true``/``keep``/``good`` is good, ``0``/``no``/``false``/``drop``/``bad`` is
    bad, any case) and, optionally, ``annotator``; other columns (notes) are ignored. UTF-8, a byte-order mark
    allowed, blank lines skipped.

    An item may have several rows, one per annotator (the ``annotator`` column is then required, and one annotator
    judges an item once); its verdict is the majority. An even split is an error naming the item, unless ``ties``
    says otherwise: ``"good"`` or ``"bad"`` settles it that way, ``"drop"`` leaves the item out of the audit.

    Returns one row per item, in the order of first appearance: ``item_id`` (text), ``good`` (bool),
    ``n_votes``, ``n_good``. A bad file is an :class:`~counterfactory.errors.InputError` naming the file, the line
    (the header is line 1) and the fix."""
    if ties not in TIE_POLICIES:
        raise ValueError(f"ties must be one of {TIE_POLICIES}, got {ties!r}")
    path = Path(path)
    if not path.is_file():
        raise missing_input(path, "audit sample", AUDIT_FIX)
    reader = csv.reader(_io.StringIO(read_utf8(path), newline=""))
    header, rows = None, []
    for record in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in record):
            continue
        if header is None:
            header = [cell.strip().lower() for cell in record]
            missing = [c for c in ("item_id", "verdict") if c not in header]
            if missing:
                raise input_error(path, "line 1", f"the header {record} lacks column(s) {missing}", AUDIT_FIX)
            continue
        if len(record) != len(header):
            raise input_error(path, f"line {line}", f"{len(record)} fields where the header has {len(header)}",
                              AUDIT_FIX + " (quote a field that holds a comma)")
        row = dict(zip(header, (cell.strip() for cell in record)))
        if not row["item_id"]:
            raise input_error(path, f"line {line}", "empty item_id", "give every row the id of the item judged")
        verdict = VERDICTS.get(row["verdict"].lower())
        if verdict is None:
            raise input_error(path, f"line {line}", f"verdict {row['verdict']!r} of item {row['item_id']!r} is "
                              "not a verdict", "write one of 1/0, yes/no, true/false, keep/drop, good/bad")
        annotator = row.get("annotator")
        if "annotator" in header and not annotator:
            raise input_error(path, f"line {line}", f"item {row['item_id']!r} has no annotator",
                              "name who gave each verdict, or drop the annotator column")
        rows.append((line, row["item_id"], annotator, verdict))
    if not rows:
        raise input_error(path, None, "no verdicts (the file has no data rows)", AUDIT_FIX)

    seen: dict[tuple[str, str | None], int] = {}
    votes: dict[str, list[bool]] = {}
    for line, item, annotator, verdict in rows:
        key = (item, annotator)
        if key in seen:
            who = (f"annotator {annotator!r} judges item {item!r} twice" if annotator else
                   f"item {item!r} is judged twice")
            fix = ("keep one verdict per annotator and item" if annotator else
                   "add an annotator column naming who gave each verdict (several annotators: majority), or "
                   "remove the duplicate row")
            raise input_error(path, f"line {line}", f"{who} (first on line {seen[key]})", fix)
        seen[key] = line
        votes.setdefault(item, []).append(verdict)

    out = []
    for item, vs in votes.items():
        n_good = sum(vs)
        if 2 * n_good == len(vs):
            if ties == "error":
                lines = [line for line, i, _, _ in rows if i == item]
                raise input_error(path, f"lines {', '.join(map(str, lines))}",
                                  f"item {item!r} has a tie ({n_good} good, {n_good} bad)",
                                  "add a deciding verdict, or choose a tie policy (good, bad or drop)")
            if ties == "drop":
                continue
            good = ties == "good"
        else:
            good = 2 * n_good > len(vs)
        out.append((item, good, len(vs), n_good))
    return pd.DataFrame(out, columns=["item_id", "good", "n_votes", "n_good"]).astype(
        {"item_id": str, "good": bool, "n_votes": int, "n_good": int})


# ------------------------------------------------------------------------------------------------- the card


@dataclass(frozen=True)
class Estimate:
    """A share with its bootstrap percentile interval (``low``, ``high``); NaN where it is undefined (an empty
    denominator)."""

    value: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float | None]:
        return {k: (None if math.isnan(v) else v) for k, v in
                (("value", self.value), ("low", self.low), ("high", self.high))}


@dataclass(frozen=True)
class FilterCard:
    """How a filter's keep/drop agrees with an audit sample. *Kept* (by the filter) is the positive prediction and
    *good* (people's verdict) the positive label. Over the **audited items** (scored and audited), with
    ``tp`` = kept and good, ``fp`` = kept and bad, ``fn`` = removed and good, ``tn`` = removed and bad:

    * ``precision`` = tp / (tp + fp): the share of kept audited items people judge good;
    * ``recall`` = tp / (tp + fn): the share of good audited items the filter keeps;
    * ``removed_precision`` = tn / (tn + fn): the share of removed audited items people judge bad;
    * ``removed_recall`` = tn / (tn + fp): the share of bad audited items the filter removes;
    * ``good_share`` = (tp + fn) / n_audited: the share of audited items people judge good (the precision of
      keeping everything: the baseline ``precision`` has to beat).

    Each is an :class:`Estimate` with a bootstrap percentile interval at ``level``: ``resamples`` resamples of the
    audited items with replacement (numpy ``default_rng(seed)``; the four counts of a resample are multinomial,
    which is the same as drawing items), the interval the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of
    the resamples where the share is defined. A share with an empty denominator is NaN.

    Over **all scored items** (audited or not): ``n_scored``, ``n_kept``, ``n_removed`` and ``removal_share`` =
    n_removed / n_scored (a count of the whole table, not a sample: no interval).

    Coverage: ``n_audited`` (scored and audited), ``n_audited_kept``, ``n_scored_unaudited`` (scored, not in the
    audit: the usual case) and ``audit_unscored`` (the ids of audited items the score table lacks: not counted
    anywhere else, but reported). ``threshold`` is None for a rule filter (a kept column)."""

    threshold: float | None
    keep: str
    n_scored: int
    n_kept: int
    n_removed: int
    removal_share: float
    n_audited: int
    n_audited_kept: int
    n_scored_unaudited: int
    audit_unscored: tuple[str, ...]
    counts: dict[str, int]
    metrics: dict[str, Estimate]
    resamples: int
    seed: int
    level: float
    notes: tuple[str, ...] = field(default=())

    @property
    def n_audit_unscored(self) -> int:
        return len(self.audit_unscored)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN as null)."""
        return {"threshold": self.threshold, "keep": self.keep, "n_scored": self.n_scored, "n_kept": self.n_kept,
                "n_removed": self.n_removed,
                "removal_share": None if math.isnan(self.removal_share) else self.removal_share,
                "n_audited": self.n_audited, "n_audited_kept": self.n_audited_kept,
                "n_scored_unaudited": self.n_scored_unaudited, "n_audit_unscored": self.n_audit_unscored,
                "audit_unscored": list(self.audit_unscored), "counts": dict(self.counts),
                "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
                "bootstrap": {"resamples": self.resamples, "seed": self.seed, "level": self.level},
                "notes": list(self.notes)}


def _scores(scores, score_column: str | None = None) -> pd.Series:
    """``scores`` as a Series indexed by item id (text): a Series (indexed by item id), or a DataFrame with an
    ``item_id`` column (else its index) and ``score_column`` (default: its one other column). Numbers (finite) or
    booleans (a rule filter's kept column); every id once."""
    if isinstance(scores, pd.DataFrame):
        frame = scores.set_index("item_id") if "item_id" in scores.columns else scores
        if score_column is None:
            if frame.shape[1] != 1:
                raise ValueError(f"scores has columns {list(frame.columns)}: name the score column (score_column=)")
            score_column = frame.columns[0]
        if score_column not in frame.columns:
            raise ValueError(f"scores has no column {score_column!r} (columns {list(frame.columns)})")
        series = frame[score_column]
    elif isinstance(scores, pd.Series):
        series = scores
    else:
        raise TypeError(f"scores must be a pandas Series or DataFrame, got {type(scores).__name__}")
    series = series.copy()
    series.index = series.index.astype(str)
    dup = series.index[series.index.duplicated()].unique()
    if len(dup):
        raise InputError(f"the score table lists item(s) {list(dup[:5])} more than once. Fix: one row per item")
    if pd.api.types.is_bool_dtype(series.dtype) or (
            series.dtype == object and len(series) and series.map(lambda v: isinstance(v, (bool, np.bool_))).all()):
        if series.isna().any():
            raise InputError(f"{int(series.isna().sum())} item(s) have no kept value "
                             f"({list(series.index[series.isna()][:5])}). Fix: say true or false for every item")
        return series.astype(bool)
    values = pd.to_numeric(series, errors="coerce").astype(float)
    bad = values.index[~np.isfinite(values.to_numpy())]
    if len(bad):
        raise InputError(f"{len(bad)} item(s) have no finite score ({list(bad[:5])}). Fix: give every scored item a "
                         "number, or leave unscored items out of the score table")
    return values


def _audit(audit) -> pd.Series:
    """The audit as a bool Series item id -> good: a :func:`read_audit` frame, a Series, or a path."""
    if isinstance(audit, (str, Path)):
        audit = read_audit(audit)
    if isinstance(audit, pd.DataFrame):
        audit = audit.set_index("item_id")["good"]
    good = audit.astype(bool)
    good.index = good.index.astype(str)
    if good.index.duplicated().any():
        raise ValueError("the audit lists an item more than once: read it with read_audit (majority per item)")
    return good


def _kept(values: pd.Series, threshold: float | None, keep: str) -> np.ndarray:
    """Whether the filter keeps each item: a kept column as is; a score kept when ``>= threshold`` (``keep="above"``)
    or ``<= threshold`` (``keep="below"``)."""
    if keep not in KEEP:
        raise ValueError(f"keep must be 'above' or 'below', got {keep!r}")
    if values.dtype == bool:
        if threshold is not None:
            raise ValueError("a kept column (booleans) is a rule filter: it takes no threshold")
        return values.to_numpy()
    if threshold is None or not math.isfinite(float(threshold)):
        raise ValueError("a score filter needs a finite threshold")
    v = values.to_numpy()
    return v >= threshold if keep == "above" else v <= threshold


def _shares(tp, fp, fn, tn) -> dict[str, Any]:
    """The card's shares from the counts (scalars or arrays); NaN where a denominator is 0."""
    tp, fp, fn, tn = (np.asarray(x, dtype=float) for x in (tp, fp, fn, tn))

    def share(num, den):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)

    return {"precision": share(tp, tp + fp), "recall": share(tp, tp + fn),
            "removed_precision": share(tn, tn + fn), "removed_recall": share(tn, tn + fp),
            "good_share": share(tp + fn, tp + fp + fn + tn)}


def _check_bootstrap(resamples: int, level: float) -> None:
    if int(resamples) != resamples or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be between 0 and 1, got {level!r}")


def filter_card(scores, audit, *, threshold: float | None = None, keep: str = "above", resamples: int = 1000,
                seed: int = 0, level: float = 0.95, score_column: str | None = None) -> FilterCard:
    """The :class:`FilterCard` of keeping the items of ``scores`` whose score is ``>= threshold`` (``keep="above"``)
    or ``<= threshold`` (``keep="below"``), measured against ``audit``.

    ``scores``: item id -> score, as a Series indexed by item id or a DataFrame with an ``item_id`` column and the
    ``score_column`` (default: its only other column); a boolean column is a rule filter's kept column (a vote),
    then ``threshold`` is None. Ids are compared as text. ``audit``: :func:`read_audit`'s frame (or its path, or a
    bool Series item id -> good). Every definition, and how items missing on either side are counted: see
    :class:`FilterCard`. Bootstrap: ``resamples`` resamples, ``seed``, interval ``level``."""
    _check_bootstrap(resamples, level)
    values, good = _scores(scores, score_column), _audit(audit)
    kept_all = _kept(values, threshold, keep)
    audited = values.index.intersection(good.index, sort=False)
    in_scores = good.index.isin(values.index)
    audit_unscored = tuple(good.index[~in_scores])
    position = values.index.get_indexer(audited)
    kept, is_good = kept_all[position], good.loc[audited].to_numpy()
    counts = {"tp": int((kept & is_good).sum()), "fp": int((kept & ~is_good).sum()),
              "fn": int((~kept & is_good).sum()), "tn": int((~kept & ~is_good).sum())}
    point = _shares(**counts)
    n = len(audited)
    notes = []
    if n:
        rng = np.random.default_rng(seed)
        cells = np.array([counts["tp"], counts["fp"], counts["fn"], counts["tn"]], dtype=float)
        draws = rng.multinomial(n, cells / n, size=int(resamples))
        boot = _shares(*draws.T)
        q = [(1 - level) / 2, (1 + level) / 2]
        metrics = {}
        for name in METRICS:
            sample = boot[name][~np.isnan(boot[name])]
            low, high = np.quantile(sample, q) if len(sample) else (np.nan, np.nan)
            metrics[name] = Estimate(float(point[name]), float(low), float(high))
            if 0 < len(sample) < resamples:
                notes.append(f"{name}: undefined in {resamples - len(sample)} of {resamples} resamples "
                             "(an empty denominator), left out of its interval")
    else:
        metrics = {name: Estimate(math.nan, math.nan, math.nan) for name in METRICS}
        notes.append("no scored item is in the audit: nothing to measure")
    if audit_unscored:
        notes.append(f"{len(audit_unscored)} audited item(s) are not in the score table and are left out of the "
                     f"card: {', '.join(audit_unscored[:10])}{' ...' if len(audit_unscored) > 10 else ''}")
    n_scored, n_kept = len(values), int(kept_all.sum())
    return FilterCard(
        threshold=None if threshold is None else float(threshold), keep=keep, n_scored=n_scored, n_kept=n_kept,
        n_removed=n_scored - n_kept, removal_share=(n_scored - n_kept) / n_scored if n_scored else math.nan,
        n_audited=n, n_audited_kept=int(kept.sum()), n_scored_unaudited=n_scored - n,
        audit_unscored=audit_unscored, counts=counts, metrics=metrics, resamples=int(resamples), seed=int(seed),
        level=float(level), notes=tuple(notes))


# --------------------------------------------------------------------------------------- curve and calibration

CURVE_COLUMNS = ["threshold", "precision", "recall", "removal_share", "n_kept", "n_audited_kept"]


def threshold_curve(scores, audit, thresholds=None, keep: str = "above", *,
                    score_column: str | None = None) -> pd.DataFrame:
    """The filter at each threshold: ``threshold``, ``precision`` and ``recall`` over the audited items,
    ``removal_share`` and ``n_kept`` over all scored items, ``n_audited_kept`` (definitions: :class:`FilterCard`),
    one row per threshold in increasing order. ``thresholds`` default: the distinct scores of the audited items
    (between two of them precision and recall do not change). A rule filter (a kept column) has one operating
    point: one row with an empty threshold."""
    values, good = _scores(scores, score_column), _audit(audit)
    audited = values.index.intersection(good.index, sort=False)
    is_good = good.loc[audited].to_numpy()
    position = values.index.get_indexer(audited)
    if values.dtype == bool:
        grid = [None]
    elif thresholds is None:
        grid = sorted(set(values.to_numpy()[position].tolist()))
    else:
        grid = sorted(float(t) for t in thresholds)
    rows = []
    for t in grid:
        kept_all = _kept(values, t, keep)
        kept = kept_all[position]
        tp, fp, fn = (kept & is_good).sum(), (kept & ~is_good).sum(), (~kept & is_good).sum()
        s = _shares(tp, fp, fn, (~kept & ~is_good).sum())
        n_kept = int(kept_all.sum())
        rows.append((math.nan if t is None else t, float(s["precision"]), float(s["recall"]),
                     (len(values) - n_kept) / len(values) if len(values) else math.nan, n_kept, int(kept.sum())))
    return pd.DataFrame(rows, columns=CURVE_COLUMNS).astype({"threshold": float, "n_kept": int,
                                                              "n_audited_kept": int})


def calibrate(scores, audit, target_precision: float, keep: str = "above", *, resamples: int = 1000,
              seed: int = 0, level: float = 0.95, score_column: str | None = None) -> tuple[float, FilterCard]:
    """``(threshold, card)``: of the distinct audited scores (:func:`threshold_curve`), the threshold that keeps
    the most scored items while the precision of the kept audited items is ``>= target_precision``; among
    thresholds keeping as many items, the smallest for ``keep="above"`` and the largest for ``keep="below"``.
    Precision need not rise with the threshold, so this is the most lenient threshold that reaches the target,
    not one above which every threshold does. The card is :func:`filter_card` at that threshold.

    The threshold is chosen on the same audit sample that measures it, so the card's precision is optimistic:
    confirm it on a fresh sample. No threshold reaching the target is a :class:`NoThresholdError` naming the best
    precision reached."""
    if not 0.0 < target_precision <= 1.0:
        raise ValueError(f"target_precision must be in (0, 1], got {target_precision!r}")
    if _scores(scores, score_column).dtype == bool:
        raise ValueError("a kept column (booleans) is a rule filter: it has no threshold to calibrate")
    curve = threshold_curve(scores, audit, keep=keep, score_column=score_column)
    if curve.empty:
        raise NoThresholdError("no scored item is in the audit, so no threshold can be calibrated. Fix: audit items "
                               "of the score table (ids are compared as text)")
    ok = curve[curve["precision"] >= target_precision - 1e-12]
    if ok.empty:
        best = curve.loc[curve["precision"].idxmax()]
        raise NoThresholdError(
            f"no threshold keeps audited items with precision >= {target_precision:g} (best {best['precision']:.3f} "
            f"at threshold {best['threshold']:g}, keeping {int(best['n_audited_kept'])} audited items). Fix: lower "
            "the target precision, audit more items, or use a score that separates good from bad items")
    ok = ok.sort_values(["n_kept", "threshold"], ascending=[False, keep == "above"], kind="mergesort")
    threshold = float(ok.iloc[0]["threshold"])
    return threshold, filter_card(scores, audit, threshold=threshold, keep=keep, resamples=resamples, seed=seed,
                                  level=level, score_column=score_column)


# ------------------------------------------------------------------------------------------------ rendering


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


METRIC_TEXT = {
    "precision": "kept audited items people judge good",
    "recall": "good audited items the filter keeps",
    "removed_precision": "removed audited items people judge bad",
    "removed_recall": "bad audited items the filter removes",
    "good_share": "audited items people judge good (keeping everything)",
}


def render_card(card: FilterCard, curve: pd.DataFrame | None, title: str) -> str:
    """The card as Markdown: the filter, the metrics with their intervals, the coverage of the audit and the
    curve (at most :data:`CARD_CURVE_ROWS` rows, evenly spaced)."""
    rule = ("a rule filter (kept column)" if card.threshold is None else
            f"keep score {'>=' if card.keep == 'above' else '<='} {card.threshold:g}")
    pct = f"{card.level * 100:g}%"
    lines = [f"# {title}", "", f"Filter: {rule}. Audited items: {card.n_audited} "
             f"({card.n_audited_kept} kept by the filter). Scored items: {card.n_scored}, of which the filter keeps "
             f"{card.n_kept} and removes {card.n_removed} (removal share {_fmt(card.removal_share)}).", "",
             f"| metric | value | {pct} interval | share of |", "| --- | --- | --- | --- |"]
    for name in METRICS:
        e = card.metrics[name]
        interval = "—" if math.isnan(e.low) else f"[{_fmt(e.low)}, {_fmt(e.high)}]"
        lines.append(f"| {name.replace('_', ' ')} | {_fmt(e.value)} | {interval} | {METRIC_TEXT[name]} |")
    lines.append(f"| removal share | {_fmt(card.removal_share)} | — | all scored items the filter removes |")
    c = card.counts
    lines += ["", f"Counts over audited items: kept and good {c['tp']}, kept and bad {c['fp']}, removed and good "
              f"{c['fn']}, removed and bad {c['tn']}. Scored but not audited: {card.n_scored_unaudited}; audited "
              f"but not scored: {card.n_audit_unscored}.",
              "", f"Intervals: bootstrap percentile intervals over the audited items ({card.resamples} resamples, "
              f"seed {card.seed})."]
    if card.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in card.notes]
    if curve is not None and len(curve):
        shown = curve
        if len(curve) > CARD_CURVE_ROWS:
            pick = np.unique(np.linspace(0, len(curve) - 1, CARD_CURVE_ROWS).round().astype(int))
            shown = curve.iloc[pick]
        lines += ["", "## Threshold curve", ""]
        if len(shown) < len(curve):
            lines += [f"{len(shown)} of {len(curve)} thresholds, evenly spaced.", ""]
        lines += ["| threshold | precision | recall | removal share | kept | audited kept |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in shown.itertuples(index=False):
            lines.append(f"| {_fmt(float(r.threshold), 4)} | {_fmt(float(r.precision))} | {_fmt(float(r.recall))} | "
                         f"{_fmt(float(r.removal_share))} | {r.n_kept} | {r.n_audited_kept} |")
    return "\n".join(lines) + "\n"


def plot_curve(curve: pd.DataFrame, path, title: str | None = None) -> Path:
    """Save precision (and recall, and removal share) against the threshold as a PNG at ``path``; a curve without
    thresholds (a rule filter) gets a figure that says so."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    try:
        finite = curve[np.isfinite(curve["threshold"].to_numpy(dtype=float))] if len(curve) else curve
        if len(finite):
            ax.plot(finite["threshold"], finite["precision"], marker="o", ms=3, label="precision (kept audited)")
            ax.plot(finite["threshold"], finite["recall"], marker=".", ms=3, ls="--", label="recall (good audited)")
            ax.plot(finite["threshold"], finite["removal_share"], ls=":", label="removal share (all scored)")
            ax.set_xlabel("threshold")
            ax.legend(fontsize=8, loc="best")
        else:
            ax.text(0.5, 0.5, "rule filter: no threshold", ha="center", va="center", transform=ax.transAxes)
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("share")
        if title:
            ax.set_title(title, fontsize=10)
        return save_figure(path, fig)
    finally:
        plt.close(fig)


# ------------------------------------------------------------------------------------------------ the files

#: what :func:`card_files` and :func:`calibrate_files` write in their output folder
CARD_FILES = ("card.md", "card.json", "curve.csv", "curve.png")
SCORES_FIX = "pass the filter's score table (parquet or CSV) with an id column and the score column"


def read_scores(path, score_column: str, id_column: str = "item_id") -> pd.Series:
    """The score table at ``path`` (parquet, or CSV by its suffix) as a Series item id (text) -> score (or kept
    flag), with the file named in every error."""
    frame = read_table(path, "filter score table", SCORES_FIX, columns=(id_column, score_column),
                       csv_dtype={id_column: str})
    series = pd.Series(frame[score_column].to_numpy(), index=frame[id_column].astype(str), name=score_column)
    try:
        return _scores(series)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def write_card(out_dir, card: FilterCard, curve: pd.DataFrame, title: str, extra: dict | None = None) -> list[Path]:
    """Write :data:`CARD_FILES` into ``out_dir`` (made if missing): the Markdown card, the card as JSON (with
    ``extra``, e.g. the inputs), the curve as CSV and its figure."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "card.md", render_card(card, curve, title))
    write_json(out / "card.json", {"title": title, **(extra or {}), **card.to_dict()})
    write_csv(out / "curve.csv", curve)
    plot_curve(curve, out / "curve.png", title)
    return [out / name for name in CARD_FILES]


def card_files(scores_path, score_column: str, audit_path, out_dir, *, threshold: float | None,
               keep: str = "above", resamples: int = 1000, seed: int = 0, level: float = 0.95,
               id_column: str = "item_id", ties: str = "error", title: str | None = None) -> FilterCard:
    """``counterfactory filters card``: read the score table and the audit, write the card of ``threshold`` (None
    for a kept column) into ``out_dir`` (:func:`write_card`) and return it."""
    scores, audit = read_scores(scores_path, score_column, id_column), read_audit(audit_path, ties=ties)
    if scores.dtype != bool and threshold is None:
        raise InputError(f"{scores_path}: column {score_column!r} holds scores, so the card needs a threshold. Fix: "
                         "pass --threshold (or a true/false kept column for a rule filter)")
    if scores.dtype == bool and threshold is not None:
        raise InputError(f"{scores_path}: column {score_column!r} is a kept column (true/false), which takes no "
                         "threshold. Fix: drop --threshold, or name a score column")
    card = filter_card(scores, audit, threshold=threshold, keep=keep, resamples=resamples, seed=seed, level=level)
    curve = threshold_curve(scores, audit, keep=keep)
    write_card(out_dir, card, curve, title or f"Filter card: {score_column}",
               {"scores": str(scores_path), "score_column": score_column, "audit": str(audit_path)})
    return card


def calibrate_files(scores_path, score_column: str, audit_path, out_dir, *, target_precision: float,
                    keep: str = "above", resamples: int = 1000, seed: int = 0, level: float = 0.95,
                    id_column: str = "item_id", ties: str = "error",
                    title: str | None = None) -> tuple[float, FilterCard]:
    """``counterfactory filters calibrate``: :func:`calibrate` on the files; writes the card of the chosen threshold
    into ``out_dir`` (:func:`write_card`) and returns ``(threshold, card)``."""
    scores, audit = read_scores(scores_path, score_column, id_column), read_audit(audit_path, ties=ties)
    if scores.dtype == bool:
        raise InputError(f"{scores_path}: column {score_column!r} is a kept column (true/false): a rule filter has "
                         "no threshold to calibrate. Fix: name a score column, or use `counterfactory filters card`")
    threshold, card = calibrate(scores, audit, target_precision, keep=keep, resamples=resamples, seed=seed,
                                level=level)
    curve = threshold_curve(scores, audit, keep=keep)
    write_card(out_dir, card, curve, title or f"Filter card: {score_column}, calibrated to precision "
               f">= {target_precision:g}",
               {"scores": str(scores_path), "score_column": score_column, "audit": str(audit_path),
                "target_precision": target_precision})
    return threshold, card


# ------------------------------------------------------------------------------------ a study's filters

@dataclass(frozen=True)
class StudyFilter:
    """One keep/drop filter of a study, as a filter card sees it (declared in ``studies/<study>/filter_cards.py``).

    ``inputs``: the names of the files it reads (``--input NAME=PATH``); ``unit``: what one item is and how its id is
    made (the audit sample's ``item_id``); ``table(inputs, cfg)``: the score table, ``item_id`` (text, unique) +
    ``score`` (a number, or true/false for a rule filter) and optionally more columns; ``threshold(cfg)``: the
    study's threshold from the validated configuration (``None``: ``score`` is a kept column); ``keep``: which side
    of the threshold is kept."""

    title: str
    inputs: tuple[str, ...]
    unit: str
    table: Callable[[dict, dict], pd.DataFrame]
    threshold: Callable[[dict], float | None] | None = None
    keep: str = "above"
    note: str = ""


def score_frame(item_ids, scores, **extra) -> pd.DataFrame:
    """A score table (``item_id`` as text, ``score``, then ``extra`` columns), checked: every id once."""
    frame = pd.DataFrame({"item_id": [str(i) for i in item_ids], "score": list(scores), **extra})
    dup = frame["item_id"][frame["item_id"].duplicated()].unique()
    if len(dup):
        raise InputError(f"the score table lists item(s) {list(dup[:5])} more than once. Fix: one row per item")
    return frame


def study_card_files(spec: StudyFilter, inputs: dict, cfg: dict, audit_path, out_dir, *, resamples: int = 1000,
                     seed: int = 0, level: float = 0.95, ties: str = "error", title: str | None = None) -> FilterCard:
    """One study filter's card: its score table (``out_dir/scores.parquet``), the card of the study's threshold
    (:func:`write_card`) and ``card.html`` (the report entry)."""
    missing = [n for n in spec.inputs if n not in inputs]
    if missing:
        raise InputError(f"the filter {spec.title!r} reads --input {', '.join(f'{n}=PATH' for n in missing)}. "
                         "Fix: pass every file it reads")
    table = spec.table(inputs, cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(out / "scores.parquet", table)
    scores = _scores(table[["item_id", "score"]], "score")
    audit = read_audit(audit_path, ties=ties)
    threshold = spec.threshold(cfg) if spec.threshold is not None and scores.dtype != bool else None
    card = filter_card(scores, audit, threshold=threshold, keep=spec.keep, resamples=resamples, seed=seed,
                       level=level)
    curve = threshold_curve(scores, audit, keep=spec.keep)
    name = title or spec.title
    write_card(out, card, curve, name, {"unit": spec.unit, "note": spec.note, "audit": str(audit_path),
                                        "inputs": {k: str(v) for k, v in inputs.items()}})
    md = render_card(card, curve, name)
    if spec.unit or spec.note:   # what an item is, under the title
        head, _, rest = md.partition("\n\n")
        md = f"{head}\n\nItem: {' '.join(x for x in (spec.unit, spec.note) if x)}\n\n{rest}"
        write_text(out / "card.md", md)
    write_text(out / "card.html", markdown_html(md, name))
    return card


def markdown_html(text: str, title: str) -> str:
    """The card's Markdown (headings, paragraphs, lists, pipe tables, `code`) as a standalone HTML page, the curve
    figure (``curve.png`` beside it) embedded by name."""
    import html
    import re

    def inline(s: str) -> str:
        s = html.escape(s)
        s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
        return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", s)

    body, para, table, items = [], [], [], []

    def flush():
        if para:
            body.append(f"<p>{inline(' '.join(para))}</p>")
            para.clear()
        if items:
            body.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()
        if table:
            rows = [[c.strip() for c in r.strip().strip("|").split("|")] for r in table
                    if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", r.strip())]
            head, *rest = rows
            body.append("<table><thead><tr>" + "".join(f"<th>{inline(c)}</th>" for c in head) + "</tr></thead><tbody>"
                        + "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in rest)
                        + "</tbody></table>")
            table.clear()

    for line in text.splitlines():
        if line.startswith("#"):
            flush()
            level = min(len(line) - len(line.lstrip("#")), 6)
            body.append(f"<h{level}>{inline(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("|"):
            if para or items:
                flush()
            table.append(line)
        elif line.startswith("- "):
            items.append(line[2:])
        elif not line.strip():
            flush()
        else:
            para.append(line)
    flush()
    style = ("body{font-family:sans-serif;max-width:60em;margin:1em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head>\n<body>\n" + "\n".join(body)
            + '\n<p><img src="curve.png" alt="precision, recall and removal share against the threshold"></p>'
            "\n</body>\n</html>\n")
