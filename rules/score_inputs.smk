# Input functions and parameters of the leaderboard rules (rules/score.smk).
# Kept in their own file: Snakemake's linter wants functions apart from rules.
import shlex

SCORE_KEYS = ("score", "benchmarks", *DEVICE_KEYS)  # `benchmarks`: the countercurate view's data paths


def score_benchmarks():
    """``score.benchmarks`` this run can read: coco_cf only when the coco_counterfactuals study runs."""
    names = list(config["score"]["benchmarks"])
    return [n for n in names if n != "coco_cf" or "coco_counterfactuals" in STUDIES]


def score_data(wildcards):
    """The workflow file a benchmark reads (coco_cf: the selected pairs), else nothing (the config's paths)."""
    if wildcards.benchmark == "coco_cf":
        return [f"{RESULTS}/coco_counterfactuals/images/selected_pairs.parquet"]
    return []


def score_data_arg(wildcards, input):
    return f"--data {shlex.quote(input.data[0])}" if input.get("data") else ""


def score_items(wildcards):
    return [
        f"{RESULTS}/scores/items/{b}/{role}.parquet" for b in score_benchmarks() for role in config["score"]["models"]
    ]


def score_leaderboard_data(wildcards):
    return [f"{RESULTS}/coco_counterfactuals/images/selected_pairs.parquet"] if "coco_cf" in score_benchmarks() else []


def score_leaderboard_args(wildcards, input):
    return " ".join(f"--data coco_cf={shlex.quote(p)}" for p in input.get("data", []))


def score_lm_roles(wildcards):
    """The lm role of the text-only shortcut rows (pair benchmarks, with baselines on)."""
    return ["lm"] if config["score"]["baselines"] and "lm" in config["models"] else []


def score_targets():
    return [f"{RESULTS}/scores/leaderboard.md"] if config["score"]["models"] and score_benchmarks() else []
