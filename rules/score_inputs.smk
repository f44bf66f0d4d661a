# Input functions and parameters of the leaderboard rules (rules/score.smk).
# Kept in their own file: Snakemake's linter wants functions apart from rules.
import shlex

from counterfactory import leaderboard as score_lb

SCORE_KEYS = ("score", "benchmarks", *DEVICE_KEYS)  # `benchmarks`: the countercurate view's data paths


def score_skipped():
    """``{benchmark: why}`` for the ``score.benchmarks`` this run cannot read: a study output whose study (or
    dataset) does not run, or data the configuration does not name (docs/score.md)."""
    out = {}
    for name in config["score"]["benchmarks"]:
        if name in score_lb.STUDY_OUTPUTS:
            study = score_lb.STUDY_OUTPUTS[name][0]
            if study not in STUDIES:
                out[name] = f"reads the {study} study's outputs; that study is not in `studies`"
            elif name.startswith("odmap_") and name.split("_", 1)[1] not in view(study)["data"]["datasets"]:
                out[name] = f"{study}.data.datasets does not list {name.split('_', 1)[1]}"
            continue
        try:
            score_lb.data_inputs(config, name)
        except score_lb.NotConfigured as exc:
            out[name] = str(exc)
    return out


def score_benchmarks():
    """``score.benchmarks`` this run can read (the others are skipped with a note on the leaderboard)."""
    skipped = score_skipped()
    return [n for n in config["score"]["benchmarks"] if n not in skipped]


def score_source(benchmark):
    """The path a benchmark's job gets as ``--data`` (a study output, SocialCF's release), else None."""
    if benchmark in score_lb.STUDY_OUTPUTS:
        return f"{RESULTS}/{score_lb.STUDY_OUTPUTS[benchmark][1]}"
    return score_lb.default_source(config, benchmark)


def score_data(wildcards):
    """The files a benchmark's job reads: a study's output, or the configured data (files and folders)."""
    b = wildcards.benchmark
    if b.startswith("odmap_"):
        folder = score_source(b)
        return [f"{folder}/captions/gallery.parquet", f"{folder}/manifests"]
    if b in score_lb.STUDY_OUTPUTS:
        return [score_source(b)]
    return score_lb.data_inputs(config, b)


def score_data_arg(wildcards, input):
    source = score_source(wildcards.benchmark)
    return f"--data {shlex.quote(source)}" if source else ""


def score_item_config(wildcards):
    """The job configuration of one score_item job: the view of the benchmark's study, with the sections its
    reader needs, the score section, the device keys and the model role."""
    study = score_lb.BENCHMARKS[wildcards.benchmark].study
    keys = ["score", *score_lb.STUDY_KEYS[study], *DEVICE_KEYS, f"models.{wildcards.role}"]
    path, text = wf.job_config_file(config, study, keys)
    JOB_CONFIG_TEXT[path] = text
    return ancient(path)


def score_items(wildcards):
    return [
        f"{RESULTS}/scores/items/{b}/{role}.parquet" for b in score_benchmarks() for role in config["score"]["models"]
    ]


def _score_shortcut_sources():
    """The study outputs the shortcut rows read (caption pairs of coco_cf and the CounterCurate quads)."""
    return {
        b: score_source(b)
        for b in score_benchmarks()
        if b in score_lb.STUDY_OUTPUTS and score_lb.BENCHMARKS[b].kind != score_lb.SET
    }


def score_leaderboard_data(wildcards):
    return list(_score_shortcut_sources().values())


def score_leaderboard_args(wildcards, input):
    flags = [f"--data {b}={shlex.quote(p)}" for b, p in _score_shortcut_sources().items()]
    flags += [f"--note {shlex.quote(f'{b}: skipped, {why}')}" for b, why in score_skipped().items()]
    return " ".join(flags)


def score_lm_roles(wildcards):
    """The lm role of the text-only shortcut rows (pair benchmarks, with baselines on)."""
    return ["lm"] if config["score"]["baselines"] and "lm" in config["models"] else []


def score_targets():
    return [f"{RESULTS}/scores/leaderboard.md"] if config["score"]["models"] and score_benchmarks() else []
