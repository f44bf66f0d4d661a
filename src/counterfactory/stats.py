"""Statistics over repeated training runs (COCO-Counterfactuals §5, appendix A.2 and B.3).

The paper trains CLIP on several data mixtures, repeats each run over 25 seeds, reports the
mean and the sample standard deviation per metric, and marks a mixture as a significant
improvement over the baseline mixture (real MS-COCO only) when a one-tailed t-test gives
``p <= 0.05``. Appendix A.2 correlates label frequency with accuracy change (Pearson r and its
two-sided p). This module implements both on a tidy *runs table*.

Runs table (CSV, one row per run per metric)::

    experiment,mixture,seed,data_seed,metric,value
    flickr30k,mscoco,107,108,i2t_R@1,77.9

``seed`` is an integer; ``data_seed`` is an integer or empty; ``value`` is a finite number.
``(experiment, mixture, seed, metric)`` must be unique.

Edge-case conventions of :func:`summarize` (each is written to the ``note`` column; a p-value is
never NaN without a note saying why):

* baseline mixture absent from the table, or from one (experiment, metric) group: error.
* a group with n = 1 (or a baseline with n = 1): ``std`` is empty (the sample std needs two
  runs), ``p_value`` is empty, ``significant`` is False, note ``"n=1: ..."``. Every test needs at
  least two runs in both groups; a single run says nothing about seed-to-seed variation.
* zero variance in both groups (Welch/Student) or in the paired differences (paired): the t
  statistic is 0/0 or x/0, so ``p_value`` is empty, ``significant`` is False, note
  ``"zero variance ..."`` (with whether the means differ). Values count as constant when their
  spread is within 1e-10 of their magnitude, so float round-off does not yield p = 1e-30.
* unpaired tests with a seed set that differs from the baseline's (fewer runs, missing or extra
  seeds): the test still runs; the note starts with ``"warning: ..."`` and names the seeds, and a
  log warning is emitted.
* paired test with seed sets that differ: error naming the missing seeds on each side. (The n = 1
  rule is checked first, so a single-run row such as pre-trained CLIP never triggers this error
  or the seed warning.)
* baseline rows: ``p_value`` empty, ``delta`` 0, ``significant`` False, note ``"baseline"``.
* ``significant`` is ``p_value <= alpha`` and False whenever ``p_value`` is empty.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from .errors import InputError, input_error

log = logging.getLogger(__name__)

RUNS_COLUMNS = ("experiment", "mixture", "seed", "data_seed", "metric", "value")
RUN_KEY = ("experiment", "mixture", "seed", "metric")
TESTS = ("welch", "student", "paired")
ALTERNATIVES = ("greater", "less")
SUMMARY_COLUMNS = (
    "experiment", "metric", "mixture", "baseline", "n", "mean", "std", "delta", "test",
    "alternative", "statistic", "df", "p_value", "alpha", "significant", "note",
)
CONSTANT_RTOL = 1e-10

_RUNS_FIX_SCHEMA = (
    "write a tidy CSV with header 'experiment,mixture,seed,data_seed,metric,value' "
    "and one row per run per metric"
)


# --------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------

def read_csv_as_text(path: Path, what: str, fix: str) -> pd.DataFrame:
    """``path`` as a CSV of text cells (no NA parsing, header names stripped); a missing, empty or unreadable
    file is an :class:`~.errors.InputError` naming ``what`` with ``fix``."""
    if not path.is_file():
        raise input_error(path, None, f"{what} not found", fix)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise input_error(path, None, f"{what} is empty (no header)", fix) from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        problem = f"{what} is not a readable CSV ({str(exc).strip().splitlines()[0]})"
        raise input_error(path, None, problem, fix) from None
    frame.columns = [str(c).strip() for c in frame.columns]
    return frame


def row_line(index: int) -> str:
    """File line of a data row (header is line 1)."""
    return f"line {int(index) + 2}"


def _describe(row: pd.Series, keys: Iterable[str]) -> str:
    return ", ".join(f"{k}={row[k]}" for k in keys)


def require_columns(frame: pd.DataFrame, columns: Sequence[str], path, fix: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        found = ", ".join(map(str, frame.columns)) or "none"
        raise input_error(
            path, "header", f"missing column(s) {', '.join(missing)} (found: {found})", fix
        )


def parse_numeric(frame: pd.DataFrame, column: str, path, *, allow_empty: bool = False,
                  integer: bool = False, context: Sequence[str] = (), fix: str = "") -> pd.Series:
    """Parse a text column as numbers; raise an :class:`InputError` naming the first bad line."""
    text = frame[column].astype(str).str.strip()
    values = pd.to_numeric(text, errors="coerce").astype(float)
    empty = text == ""
    bad = values.isna() & ~(empty & allow_empty)
    bad |= ~np.isfinite(values.fillna(0.0))
    if integer:
        bad |= values.notna() & (values != np.round(values))
    if bad.any():
        first = bad.idxmax()
        kind = "an integer" if integer else "a finite number"
        record = row_line(first)
        if context:
            record += f" ({_describe(frame.loc[first], context)})"
        count = int(bad.sum())
        more = f"; {count - 1} more bad row(s) in this column" if count > 1 else ""
        raise input_error(
            path, record, f"{column} {text[first]!r} is not {kind}{more}",
            fix or f"write {kind} in the {column} column",
        )
    return values


def read_runs(path: str | Path) -> pd.DataFrame:
    """Read and validate a runs table; returns columns of :data:`RUNS_COLUMNS` with typed values.

    ``seed`` becomes int64, ``data_seed`` nullable Int64, ``value`` float64. Extra columns are kept.
    """
    path = Path(path)
    frame = read_csv_as_text(path, "runs table", _RUNS_FIX_SCHEMA)
    require_columns(frame, RUNS_COLUMNS, path, _RUNS_FIX_SCHEMA)
    if frame.empty:
        raise input_error(path, None, "runs table has a header but no rows", "add one row per run per metric")
    for col in ("experiment", "mixture", "metric"):
        frame[col] = frame[col].astype(str).str.strip()
        empty = frame[col] == ""
        if empty.any():
            first = empty.idxmax()
            raise input_error(path, row_line(first), f"{col} is empty", f"give every row a {col} name")
    ctx = ("experiment", "mixture", "metric")
    seed = parse_numeric(frame, "seed", path, integer=True, context=ctx,
                         fix="write the training seed as an integer, e.g. 107")
    data_seed = parse_numeric(frame, "data_seed", path, integer=True, allow_empty=True, context=ctx,
                              fix="write the data seed as an integer, or leave it empty")
    value = parse_numeric(frame, "value", path, context=ctx + ("seed",),
                          fix="write the metric value as a plain number (no %, no NaN/inf); drop failed runs")
    frame["seed"] = seed.astype("int64")
    frame["data_seed"] = data_seed.round().astype("Int64")
    frame["value"] = value.astype("float64")

    dup = frame.duplicated(list(RUN_KEY), keep=False)
    if dup.any():
        first = dup.idxmax()
        row = frame.loc[first]
        same = frame.index[dup & (frame[list(RUN_KEY)] == row[list(RUN_KEY)]).all(axis=1)]
        lines = ", ".join(row_line(i).removeprefix("line ") for i in same)
        raise input_error(
            path, f"lines {lines}",
            f"duplicate run ({_describe(row, RUN_KEY)}) appears {len(same)} times",
            "keep one row per (experiment, mixture, seed, metric); if these are different runs give them different seeds",
        )
    return frame


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def is_constant(values, scale: float | None = None) -> bool:
    """True when all values are equal up to float round-off (relative to ``scale``)."""
    arr = np.asarray(values, dtype=float)
    if arr.size <= 1:
        return True
    if scale is None:
        scale = float(np.max(np.abs(arr)))
    return float(np.ptp(arr)) <= CONSTANT_RTOL * max(1.0, scale)


def _fmt_seeds(seeds: Iterable[int], limit: int = 10) -> str:
    seeds = sorted(int(s) for s in seeds)
    shown = ", ".join(map(str, seeds[:limit]))
    return shown + (f", ... ({len(seeds)} in all)" if len(seeds) > limit else "")


def add_mean_metric(runs: pd.DataFrame, name: str, source: str | Path = "runs table") -> pd.DataFrame:
    """Append, per (experiment, mixture, seed), the mean over that experiment's metrics as metric ``name``.

    This is the paper's "Mean" column, computed per run so it can be tested like any metric.
    Every run of an experiment must report the same metrics, otherwise the means would not compare.
    """
    if (runs["metric"] == name).any():
        raise input_error(source, f"metric={name}", "the mean metric name is already used in the runs table",
                          "pick another --mean-metric name")
    parts = []
    for experiment, exp_rows in runs.groupby("experiment", sort=False):
        expected = set(exp_rows["metric"])
        for (mixture, seed), run in exp_rows.groupby(["mixture", "seed"], sort=False):
            have = set(run["metric"])
            if have != expected:
                raise input_error(
                    source, f"experiment={experiment}, mixture={mixture}, seed={seed}",
                    f"run lacks metric(s) {', '.join(sorted(expected - have))} needed for the mean metric",
                    "add the missing rows, drop this run, or leave out --mean-metric",
                )
            first = run.iloc[0]
            parts.append({"experiment": experiment, "mixture": mixture, "seed": seed,
                          "data_seed": first["data_seed"], "metric": name, "value": float(run["value"].mean())})
    extra = pd.DataFrame(parts, columns=list(RUNS_COLUMNS))
    extra["data_seed"] = extra["data_seed"].astype("Int64")
    return pd.concat([runs[list(RUNS_COLUMNS)], extra], ignore_index=True)


@dataclass
class TestOutcome:
    statistic: float = math.nan
    df: float = math.nan
    p_value: float = math.nan
    note: str = ""


def one_tailed_test(sample: np.ndarray, base: np.ndarray, test: str, alternative: str) -> TestOutcome:
    """Test ``mean(sample) > mean(base)`` (or ``<`` for ``alternative='less'``) with SciPy.

    ``sample`` and ``base`` must be aligned by seed for ``test='paired'``. Returns an outcome whose
    p-value is NaN only together with a note explaining why.
    """
    if test not in TESTS:
        raise ValueError(f"unknown test {test!r}; choose from {TESTS}")
    if alternative not in ALTERNATIVES:
        raise ValueError(f"unknown alternative {alternative!r}; choose from {ALTERNATIVES}")
    sample = np.asarray(sample, dtype=float)
    base = np.asarray(base, dtype=float)
    if len(sample) < 2 or len(base) < 2:
        which = "this mixture" if len(sample) < 2 else "the baseline"
        return TestOutcome(note=f"n=1 in {which}: no t-test (needs at least 2 runs per group)")
    scale = float(max(np.max(np.abs(sample)), np.max(np.abs(base))))
    diff_means = "means equal" if math.isclose(sample.mean(), base.mean(), rel_tol=1e-12, abs_tol=1e-12) \
        else "means differ"
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        if test == "paired":
            if is_constant(sample - base, scale):
                return TestOutcome(note=f"zero variance of paired differences ({diff_means}): t-test undefined")
            res = sps.ttest_rel(sample, base, alternative=alternative)
        else:
            if is_constant(sample, scale) and is_constant(base, scale):
                return TestOutcome(note=f"zero variance in both groups ({diff_means}): t-test undefined")
            res = sps.ttest_ind(sample, base, equal_var=(test == "student"), alternative=alternative)
    out = TestOutcome(float(res.statistic), float(getattr(res, "df", math.nan)), float(res.pvalue))
    if not math.isfinite(out.p_value):
        out.p_value = math.nan
        out.note = "t-test undefined (SciPy returned NaN)"
    return out


# --------------------------------------------------------------------------------------------
# summarize
# --------------------------------------------------------------------------------------------

def summarize(runs: pd.DataFrame, baseline: str, *, test: str = "welch", alpha: float = 0.05,
              alternative: str = "greater", source: str | Path = "runs table") -> pd.DataFrame:
    """Per (experiment, metric, mixture): n, mean, sample std, delta vs baseline and a one-tailed p.

    See the module docstring for the edge-case conventions. Groups keep their order of first
    appearance; within a group the baseline row comes first.
    """
    if test not in TESTS:
        raise InputError(f"unknown test {test!r}. Fix: choose one of {', '.join(TESTS)}")
    if alternative not in ALTERNATIVES:
        raise InputError(f"unknown alternative {alternative!r}. Fix: choose one of {', '.join(ALTERNATIVES)}")
    if not (0.0 < alpha < 1.0):
        raise InputError(f"alpha {alpha} is outside (0, 1). Fix: pass e.g. --alpha 0.05")
    mixtures = list(dict.fromkeys(runs["mixture"]))
    if baseline not in mixtures:
        raise input_error(
            source, None, f"baseline mixture {baseline!r} has no runs (mixtures present: {', '.join(mixtures)})",
            "pass one of the mixtures present to --baseline, or add the baseline's runs",
        )

    rows: list[dict] = []
    for (experiment, metric), group in runs.groupby(["experiment", "metric"], sort=False):
        base_rows = group[group["mixture"] == baseline]
        if base_rows.empty:
            raise input_error(
                source, f"experiment={experiment}, metric={metric}",
                f"baseline mixture {baseline!r} has no runs for this experiment and metric",
                "add the baseline's runs for it, or drop this experiment/metric from the runs table",
            )
        base_by_seed = base_rows.set_index("seed")["value"].sort_index()
        base_mean = float(base_by_seed.mean())
        order = [baseline] + [m for m in dict.fromkeys(group["mixture"]) if m != baseline]
        for mixture in order:
            mix_by_seed = group[group["mixture"] == mixture].set_index("seed")["value"].sort_index()
            n = int(len(mix_by_seed))
            mean = float(mix_by_seed.mean())
            std = float(mix_by_seed.std(ddof=1)) if n >= 2 else math.nan
            row = {
                "experiment": experiment, "metric": metric, "mixture": mixture, "baseline": baseline,
                "n": n, "mean": mean, "std": std, "delta": mean - base_mean, "test": test,
                "alternative": alternative, "statistic": math.nan, "df": math.nan, "p_value": math.nan,
                "alpha": alpha, "significant": False, "note": "",
            }
            notes: list[str] = []
            if mixture == baseline:
                notes.append("baseline")
                if n < 2:
                    notes.append("n=1: std undefined; no mixture can be tested against this baseline")
                row["note"] = "; ".join(notes)
                rows.append(row)
                continue

            if n < 2 or len(base_by_seed) < 2:
                # No test is possible; seed bookkeeping would only add noise (e.g. a pre-trained model).
                row["note"] = one_tailed_test(mix_by_seed.to_numpy(), base_by_seed.to_numpy(), test, alternative).note
                rows.append(row)
                continue

            missing = set(base_by_seed.index) - set(mix_by_seed.index)
            extra = set(mix_by_seed.index) - set(base_by_seed.index)
            if test == "paired":
                if missing or extra:
                    parts = []
                    if missing:
                        parts.append(f"seeds missing in {mixture!r}: {_fmt_seeds(missing)}")
                    if extra:
                        parts.append(f"seeds missing in baseline {baseline!r}: {_fmt_seeds(extra)}")
                    raise input_error(
                        source, f"experiment={experiment}, metric={metric}, mixture={mixture}",
                        "paired t-test needs the same seeds in both mixtures; " + "; ".join(parts),
                        "rerun or drop the unmatched seeds, or use --test welch",
                    )
                sample = mix_by_seed.to_numpy()
                base = base_by_seed.loc[mix_by_seed.index].to_numpy()
            else:
                sample = mix_by_seed.to_numpy()
                base = base_by_seed.to_numpy()
                if missing or extra:
                    msg = f"warning: {n} runs vs {len(base_by_seed)} for baseline"
                    if missing:
                        msg += f"; seeds missing vs baseline: {_fmt_seeds(missing)}"
                    if extra:
                        msg += f"; seeds not in baseline: {_fmt_seeds(extra)}"
                    notes.append(msg)
                    log.warning("%s: experiment=%s metric=%s mixture=%s: %s", source, experiment, metric,
                                mixture, msg.removeprefix("warning: "))

            outcome = one_tailed_test(sample, base, test, alternative)
            row.update(statistic=outcome.statistic, df=outcome.df, p_value=outcome.p_value)
            row["significant"] = bool(math.isfinite(outcome.p_value) and outcome.p_value <= alpha)
            if outcome.note:
                notes.append(outcome.note)
            row["note"] = "; ".join(notes)
            rows.append(row)
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


# --------------------------------------------------------------------------------------------
# correlate
# --------------------------------------------------------------------------------------------

def correlate(table: pd.DataFrame, x: str, y: str, source: str | Path = "table") -> dict:
    """Pearson r (two-sided p) and Spearman rho between two numeric columns of ``table``.

    ``table`` holds text cells (as read by :func:`read_table`). Rows where x or y is empty are
    dropped and listed in ``dropped_lines``; any other non-number is an error. Needs n >= 3 and
    neither column constant.
    """
    fix_cols = "pass column names that exist in the table header to --x and --y"
    require_columns(table, [x, y], source, fix_cols)
    if x == y:
        raise InputError(f"--x and --y are both {x!r}. Fix: correlate two different columns")
    empty = (table[x].astype(str).str.strip() == "") | (table[y].astype(str).str.strip() == "")
    kept = table[~empty]
    dropped = [int(i) + 2 for i in table.index[empty]]
    xs = parse_numeric(kept, x, source).to_numpy()
    ys = parse_numeric(kept, y, source).to_numpy()
    n = len(xs)
    if n < 3:
        raise input_error(source, None, f"only {n} row(s) with both {x} and {y} present; correlation needs at least 3",
                          "add rows, or fill the empty cells")
    for col, vals in ((x, xs), (y, ys)):
        if is_constant(vals):
            raise input_error(source, f"column {col}", f"all {n} values are equal ({vals[0]:g}); correlation is undefined",
                              "correlate a column that varies")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pr = sps.pearsonr(xs, ys)
        sr = sps.spearmanr(xs, ys)
    return {
        "x": x, "y": y, "n": n,
        "pearson_r": float(pr.statistic), "pearson_p": float(pr.pvalue),
        "spearman_rho": float(sr.statistic), "spearman_p": float(sr.pvalue),
        "alternative": "two-sided", "dropped_lines": dropped, "table": str(source),
    }


def read_table(path: str | Path) -> pd.DataFrame:
    """Read any CSV as text cells (validation is up to the caller)."""
    path = Path(path)
    frame = read_csv_as_text(path, "table", "pass a CSV file with a header row")
    return frame
