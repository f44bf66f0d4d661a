"""Tests for counterfactory.stats and `counterfactory stats summarize|correlate`."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from counterfactory import stats
from counterfactory.cli import main
from counterfactory.errors import InputError

# the SciPy reference calls (not ours) warn on near-constant samples
pytestmark = pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")

SEEDS = list(range(107, 132))  # the paper's 25 training seeds


def make_runs(groups: dict[str, list[float]], *, experiment="flickr30k", metric="R@1", seeds=None) -> pd.DataFrame:
    rows = []
    for mixture, values in groups.items():
        use = seeds[mixture] if isinstance(seeds, dict) else (seeds or SEEDS)
        for seed, value in zip(use, values):
            rows.append({"experiment": experiment, "mixture": mixture, "seed": seed, "data_seed": seed + 1,
                         "metric": metric, "value": float(value)})
    return pd.DataFrame(rows, columns=list(stats.RUNS_COLUMNS))


def write_runs(tmp_path, frame: pd.DataFrame, name="runs.csv"):
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def row(summary: pd.DataFrame, mixture: str, metric: str | None = None) -> pd.Series:
    sel = summary["mixture"] == mixture
    if metric is not None:
        sel &= summary["metric"] == metric
    assert sel.sum() == 1
    return summary[sel].iloc[0]


@pytest.fixture
def samples():
    rng = np.random.default_rng(7)
    return {
        "mscoco": 77.9 + rng.normal(0, 0.4, 25),
        "cf50": 78.2 + rng.normal(0, 0.5, 25),
        "cf60": 77.8 + rng.normal(0, 0.3, 25),
    }


# ------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------

def test_read_runs_types_and_optional_data_seed(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("experiment,mixture,seed,data_seed,metric,value\n"
                    "e,base,107,108,R@1,77.5\n"
                    "e,base,108,,R@1,78\n")
    runs = stats.read_runs(path)
    assert runs["seed"].tolist() == [107, 108]
    assert runs["data_seed"].isna().tolist() == [False, True]
    assert runs["value"].tolist() == [77.5, 78.0]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("experiment,mixture,seed,metric\ne,base,1,R@1\n", ["missing column(s) data_seed, value", "record header"]),
        ("experiment,mixture,seed,data_seed,metric,value\ne,base,1,2,R@1,77\ne,base,2,3,R@1,abc\n",
         ["record line 3", "value 'abc' is not a finite number", "seed=2"]),
        ("experiment,mixture,seed,data_seed,metric,value\ne,base,1,2,R@1,nan\n", ["line 2", "'nan'"]),
        ("experiment,mixture,seed,data_seed,metric,value\ne,base,1.5,2,R@1,77\n", ["line 2", "seed '1.5' is not an integer"]),
        ("experiment,mixture,seed,data_seed,metric,value\ne,base,1,x,R@1,77\n", ["data_seed 'x' is not an integer"]),
        ("experiment,mixture,seed,data_seed,metric,value\ne,,1,2,R@1,77\n", ["line 2", "mixture is empty"]),
        ("experiment,mixture,seed,data_seed,metric,value\n"
         "e,base,1,2,R@1,77\ne,base,2,3,R@1,78\ne,base,1,2,R@1,79\n",
         ["lines 2, 4", "duplicate run (experiment=e, mixture=base, seed=1, metric=R@1)", "different seeds"]),
        ("experiment,mixture,seed,data_seed,metric,value\n", ["no rows"]),
        ("", ["empty"]),
    ],
)
def test_read_runs_errors_name_file_record_and_fix(tmp_path, text, expected):
    path = tmp_path / "runs.csv"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        stats.read_runs(path)
    msg = str(info.value)
    assert str(path) in msg and "Fix:" in msg
    for part in expected:
        assert part in msg


def test_read_runs_missing_file(tmp_path):
    with pytest.raises(InputError, match="runs table not found"):
        stats.read_runs(tmp_path / "nope.csv")


# ------------------------------------------------------------------------------------------
# summarize equals SciPy
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("test, alternative", [("welch", "greater"), ("student", "greater"),
                                               ("welch", "less"), ("student", "less")])
def test_unpaired_tests_equal_scipy(samples, test, alternative):
    summary = stats.summarize(make_runs(samples), "mscoco", test=test, alternative=alternative)
    base = samples["mscoco"]
    for mixture in ("cf50", "cf60"):
        r = row(summary, mixture)
        ref = sps.ttest_ind(samples[mixture], base, equal_var=(test == "student"), alternative=alternative)
        assert r["p_value"] == pytest.approx(ref.pvalue, rel=1e-12)
        assert r["statistic"] == pytest.approx(ref.statistic, rel=1e-12)
        assert r["n"] == 25
        assert r["mean"] == pytest.approx(samples[mixture].mean())
        assert r["std"] == pytest.approx(samples[mixture].std(ddof=1))
        assert r["delta"] == pytest.approx(samples[mixture].mean() - base.mean())
        assert r["significant"] == (ref.pvalue <= 0.05)
        assert r["note"] == ""
    b = row(summary, "mscoco")
    assert math.isnan(b["p_value"]) and b["delta"] == 0 and not b["significant"] and b["note"] == "baseline"
    assert b["std"] == pytest.approx(base.std(ddof=1))


def test_paired_test_matches_by_seed_not_row_order(samples):
    runs = make_runs(samples).sample(frac=1.0, random_state=3)  # shuffle rows
    summary = stats.summarize(runs, "mscoco", test="paired")
    for mixture in ("cf50", "cf60"):
        ref = sps.ttest_rel(samples[mixture], samples["mscoco"], alternative="greater")
        r = row(summary, mixture)
        assert r["p_value"] == pytest.approx(ref.pvalue, rel=1e-12)
        assert r["df"] == 24


def test_significance_respects_alpha(samples):
    p = row(stats.summarize(make_runs(samples), "mscoco"), "cf50")["p_value"]
    assert 0 < p < 0.5
    assert row(stats.summarize(make_runs(samples), "mscoco", alpha=p), "cf50")["significant"]
    assert not row(stats.summarize(make_runs(samples), "mscoco", alpha=p * 0.999), "cf50")["significant"]


finite = st.floats(min_value=-100, max_value=100, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=st.lists(finite, min_size=2, max_size=12), b=st.lists(finite, min_size=2, max_size=12),
       test=st.sampled_from(["welch", "student"]), alternative=st.sampled_from(["greater", "less"]))
def test_property_unpaired_equals_scipy_or_explains(a, b, test, alternative):
    seeds = {"base": list(range(len(b))), "mix": list(range(len(a)))}
    summary = stats.summarize(make_runs({"base": b, "mix": a}, seeds=seeds), "base", test=test,
                              alternative=alternative)
    r = row(summary, "mix")
    assert r["delta"] == pytest.approx(np.mean(a) - np.mean(b), abs=1e-9)
    scale = max(abs(v) for v in a + b)
    if stats.is_constant(a, scale) and stats.is_constant(b, scale):
        assert math.isnan(r["p_value"]) and "zero variance" in r["note"] and not r["significant"]
        return
    ref = sps.ttest_ind(a, b, equal_var=(test == "student"), alternative=alternative)
    if math.isnan(ref.pvalue):
        assert math.isnan(r["p_value"]) and r["note"]
    else:
        assert r["p_value"] == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)


@settings(max_examples=30, deadline=None)
@given(pairs=st.lists(st.tuples(finite, finite), min_size=2, max_size=12))
def test_property_paired_equals_scipy_or_explains(pairs):
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    summary = stats.summarize(make_runs({"base": b, "mix": a}), "base", test="paired")
    r = row(summary, "mix")
    scale = max(abs(v) for v in a + b)
    if stats.is_constant(np.subtract(a, b), scale):
        assert math.isnan(r["p_value"]) and "zero variance of paired differences" in r["note"]
    else:
        ref = sps.ttest_rel(a, b, alternative="greater")
        assert r["p_value"] == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)


# ------------------------------------------------------------------------------------------
# edge cases
# ------------------------------------------------------------------------------------------

def test_n1_mixture_gets_empty_p_and_note_not_nan_table(samples):
    runs = pd.concat([make_runs(samples), make_runs({"pretrained": [67.1]}, seeds=[0])])
    summary = stats.summarize(runs, "mscoco", test="paired")  # n=1 is exempt from the paired seed check
    r = row(summary, "pretrained")
    assert r["n"] == 1 and math.isnan(r["std"]) and math.isnan(r["p_value"]) and not r["significant"]
    assert r["note"] == "n=1 in this mixture: no t-test (needs at least 2 runs per group)"
    assert r["delta"] == pytest.approx(67.1 - samples["mscoco"].mean())


def test_n1_baseline_notes(samples):
    runs = make_runs({"base": [1.0], "mix": samples["cf50"]})
    summary = stats.summarize(runs, "base")
    assert row(summary, "base")["note"] == "baseline; n=1: std undefined; no mixture can be tested against this baseline"
    assert row(summary, "mix")["note"] == "n=1 in the baseline: no t-test (needs at least 2 runs per group)"


@pytest.mark.parametrize("test", ["welch", "student"])
@pytest.mark.parametrize("mix_value, expected", [(0.5, "zero variance in both groups (means equal): t-test undefined"),
                                                 (0.7, "zero variance in both groups (means differ): t-test undefined")])
def test_zero_variance_both_groups(test, mix_value, expected):
    # 0.1 + 0.2 style round-off must still count as constant
    base = [0.5] * 5
    mix = [mix_value] * 4 + [(mix_value - 0.2) + 0.2]
    r = row(stats.summarize(make_runs({"base": base, "mix": mix}), "base", test=test), "mix")
    assert math.isnan(r["p_value"]) and not r["significant"] and r["note"] == expected


def test_zero_variance_one_group_is_still_tested():
    base = [0.5] * 5
    mix = [0.6, 0.7, 0.65, 0.62, 0.71]
    r = row(stats.summarize(make_runs({"base": base, "mix": mix}), "base"), "mix")
    ref = sps.ttest_ind(mix, base, equal_var=False, alternative="greater")
    assert r["p_value"] == pytest.approx(ref.pvalue) and r["note"] == ""


def test_paired_constant_shift_is_zero_variance_not_p_1e_minus_30():
    base = [1.2, 2.2, 3.2, 4.2]
    mix = [1.3, 2.3, 3.3, 4.3]
    r = row(stats.summarize(make_runs({"base": base, "mix": mix}), "base", test="paired"), "mix")
    assert math.isnan(r["p_value"])
    assert r["note"] == "zero variance of paired differences (means differ): t-test undefined"


def test_missing_runs_warn_in_note_for_unpaired(samples, caplog):
    seeds = {"mscoco": SEEDS, "cf50": [s for s in SEEDS if s not in (110, 115)]}
    runs = make_runs({"mscoco": samples["mscoco"], "cf50": samples["cf50"][:23]}, seeds=seeds)
    with caplog.at_level("WARNING"):
        summary = stats.summarize(runs, "mscoco")
    r = row(summary, "cf50")
    assert r["note"] == "warning: 23 runs vs 25 for baseline; seeds missing vs baseline: 110, 115"
    ref = sps.ttest_ind(samples["cf50"][:23], samples["mscoco"], equal_var=False, alternative="greater")
    assert r["p_value"] == pytest.approx(ref.pvalue)
    assert "seeds missing vs baseline: 110, 115" in caplog.text


def test_missing_runs_paired_error_names_seeds(samples):
    seeds = {"mscoco": SEEDS[:24] + [999], "cf50": SEEDS}
    runs = make_runs({"mscoco": samples["mscoco"], "cf50": samples["cf50"]}, seeds=seeds)
    with pytest.raises(InputError) as info:
        stats.summarize(runs, "mscoco", test="paired", source="runs.csv")
    msg = str(info.value)
    assert msg.startswith("runs.csv, record experiment=flickr30k, metric=R@1, mixture=cf50: paired t-test needs")
    assert "seeds missing in baseline 'mscoco': 131" in msg
    assert "seeds missing in 'cf50': 999" in msg
    assert "Fix:" in msg and "--test welch" in msg


def test_missing_baseline_errors(samples):
    with pytest.raises(InputError, match=r"baseline mixture 'coco' has no runs \(mixtures present: mscoco, cf50, cf60\)"):
        stats.summarize(make_runs(samples), "coco", source="runs.csv")
    runs = pd.concat([make_runs(samples), make_runs({"cf50": samples["cf50"]}, metric="R@5")])
    with pytest.raises(InputError, match="record experiment=flickr30k, metric=R@5: baseline mixture 'mscoco' has no runs"):
        stats.summarize(runs, "mscoco", source="runs.csv")


def test_bad_options():
    runs = make_runs({"a": [1, 2], "b": [2, 3]})
    with pytest.raises(InputError, match="alpha"):
        stats.summarize(runs, "a", alpha=1.5)
    with pytest.raises(InputError, match="unknown test"):
        stats.summarize(runs, "a", test="mann-whitney")


def test_groups_by_experiment_and_metric(samples):
    runs = pd.concat([make_runs(samples, experiment="flickr30k"),
                      make_runs({k: v + 1 for k, v in samples.items()}, experiment="coco", metric="R@5")])
    summary = stats.summarize(runs, "mscoco")
    assert list(summary[["experiment", "metric"]].drop_duplicates().itertuples(index=False, name=None)) == \
        [("flickr30k", "R@1"), ("coco", "R@5")]
    assert summary["p_value"].notna().sum() == 4
    assert list(summary.columns) == list(stats.SUMMARY_COLUMNS)


def test_add_mean_metric(samples):
    runs = pd.concat([make_runs(samples, metric="R@1"), make_runs({k: v + 10 for k, v in samples.items()}, metric="R@5")])
    runs = stats.add_mean_metric(runs.reset_index(drop=True), "Mean")
    summary = stats.summarize(runs, "mscoco")
    r = row(summary, "cf50", "Mean")
    assert r["mean"] == pytest.approx(samples["cf50"].mean() + 5)
    ref = sps.ttest_ind(samples["cf50"] + 5, samples["mscoco"] + 5, equal_var=False, alternative="greater")
    assert r["p_value"] == pytest.approx(ref.pvalue)
    incomplete = runs[~((runs["mixture"] == "cf60") & (runs["seed"] == 110) & (runs["metric"] == "R@5"))]
    incomplete = incomplete[incomplete["metric"] != "Mean"]
    with pytest.raises(InputError, match="mixture=cf60, seed=110: run lacks metric.s. R@5"):
        stats.add_mean_metric(incomplete, "Mean")
    with pytest.raises(InputError, match="already used"):
        stats.add_mean_metric(runs, "R@1")


# ------------------------------------------------------------------------------------------
# correlate
# ------------------------------------------------------------------------------------------

def test_correlate_reproduces_coco_cf_appendix_a2():
    # Table 6: label frequency vs the 18 accuracy changes -> r = 0.522, p = 0.026 in the paper.
    freq = [3446, 354, 744, 398, 887, 28]
    deltas = [[2.50, 2.63, 1.80], [2.31, 2.55, 2.45], [1.78, 1.52, 1.16],
              [0.65, 0.36, -0.29], [0.41, -0.03, -0.37], [-1.04, -2.05, -2.11]]
    table = pd.DataFrame({"label_freq": [str(f) for f, d in zip(freq, deltas) for _ in d],
                          "delta": [str(v) for d in deltas for v in d]})
    res = stats.correlate(table, "label_freq", "delta")
    assert res["n"] == 18
    assert round(res["pearson_r"], 3) == 0.522 and round(res["pearson_p"], 3) == 0.026


@settings(max_examples=40, deadline=None)
@given(data=st.lists(st.tuples(finite, finite), min_size=3, max_size=20))
def test_property_correlate_equals_scipy(data):
    xs = [d[0] for d in data]
    ys = [d[1] for d in data]
    table = pd.DataFrame({"x": [repr(v) for v in xs], "y": [repr(v) for v in ys]})
    if stats.is_constant(xs) or stats.is_constant(ys):
        with pytest.raises(InputError, match="correlation is undefined"):
            stats.correlate(table, "x", "y")
        return
    res = stats.correlate(table, "x", "y")
    pr, sr = sps.pearsonr(xs, ys), sps.spearmanr(xs, ys)
    assert res["pearson_r"] == pytest.approx(pr.statistic, abs=1e-12)
    assert res["pearson_p"] == pytest.approx(pr.pvalue, abs=1e-12)
    assert res["spearman_rho"] == pytest.approx(sr.statistic, abs=1e-12, nan_ok=True)
    assert res["spearman_p"] == pytest.approx(sr.pvalue, abs=1e-12, nan_ok=True)


def test_correlate_errors_and_blank_rows():
    table = pd.DataFrame({"x": ["1", "2", "", "4", "5"], "y": ["2", "1", "3", "5", "4"], "c": ["1"] * 5})
    res = stats.correlate(table, "x", "y", source="t.csv")
    assert res["n"] == 4 and res["dropped_lines"] == [4]
    with pytest.raises(InputError, match=r"t.csv, record header: missing column\(s\) z"):
        stats.correlate(table, "x", "z", source="t.csv")
    with pytest.raises(InputError, match="record column c: all 5 values are equal"):
        stats.correlate(table, "c", "y", source="t.csv")
    with pytest.raises(InputError, match="only 2 row.s. with both x and y present; correlation needs at least 3"):
        stats.correlate(table.iloc[:3], "x", "y", source="t.csv")
    bad = table.assign(y=["2", "1", "3", "five", "4"])
    with pytest.raises(InputError, match="record line 5: y 'five' is not a finite number"):
        stats.correlate(bad, "x", "y", source="t.csv")


# ------------------------------------------------------------------------------------------
# CLI end to end
# ------------------------------------------------------------------------------------------

def test_cli_summarize_end_to_end(tmp_path, samples):
    runs = write_runs(tmp_path, make_runs(samples))
    out = tmp_path / "out" / "summary.csv"
    assert main(["stats", "summarize", "--runs", str(runs), "--baseline", "mscoco", "--out", str(out),
                 "--test", "student", "--alpha", "0.01"]) == 0
    summary = pd.read_csv(out)
    r = row(summary, "cf50")
    ref = sps.ttest_ind(samples["cf50"], samples["mscoco"], equal_var=True, alternative="greater")
    assert r["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert r["alpha"] == 0.01 and r["test"] == "student"
    assert list(summary.columns) == list(stats.SUMMARY_COLUMNS)


def test_cli_summarize_errors_exit_2(tmp_path, samples, capsys):
    runs = write_runs(tmp_path, make_runs(samples))
    out = tmp_path / "summary.csv"
    assert main(["stats", "summarize", "--runs", str(runs), "--baseline", "coco", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("counterfactory stats: error: ") and "baseline mixture 'coco' has no runs" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_cli_correlate_end_to_end(tmp_path):
    table = tmp_path / "t.csv"
    pd.DataFrame({"freq": [3446, 354, 744, 398, 887, 28], "delta": [2.5, 2.31, 1.78, 0.65, 0.41, -1.04]}).to_csv(table, index=False)
    out = tmp_path / "corr.json"
    assert main(["stats", "correlate", "--table", str(table), "--x", "freq", "--y", "delta", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    ref = sps.pearsonr([3446, 354, 744, 398, 887, 28], [2.5, 2.31, 1.78, 0.65, 0.41, -1.04])
    assert res["pearson_r"] == pytest.approx(ref.statistic) and res["pearson_p"] == pytest.approx(ref.pvalue)
    assert res["n"] == 6 and res["alternative"] == "two-sided"
    assert main(["stats", "correlate", "--table", str(table), "--x", "freq", "--y", "nope", "--out", str(out)]) == 2
