# Input functions and parameters of the VQA check (rules/verify.smk, docs/verify.md "VQA check").
# Kept in their own file: Snakemake's linter wants functions apart from rules.
import shlex


def _sr_verify_candidates():
    """Spurious retrieval, per dataset: its requests and every inpainting shard of the study's own image method
    (``mixtures.variants.ours.image``); the shard count is a setting (``inpaint.shards``), so all are known here."""
    s = sr_settings.settings(view(SR))
    method = s["mixtures"]["variants"]["ours"]["image"]
    out = {}
    for dataset in s["data"]["datasets"]:
        out[f"{dataset}:requests"] = f"{dataset}/selection/requests.parquet"
        for i in range(s["inpaint"]["shards"]):
            out[f"{dataset}:{method}:{i:05d}"] = f"{dataset}/images/{method}/{i:05d}/shard.parquet"
    return out


# the studies with an adapter wired into the workflow, and each one's candidate files (NAME -> path)
VERIFY_CANDIDATES = {
    "coco_counterfactuals": {"candidates": "images/selected_pairs.parquet"},
    "social_counterfactuals": {"candidates": "filter/kept.parquet"},
    "countercurate": {d: f"datasets/{d}.parquet" for d in ("positions", "counting", "attributes")},
    "cvld": {
        "candidates": f"coco/edits/{config['cvld']['editing']['train_method']}/edits.parquet",
        "requests": "coco/edits/requests.parquet",
    },
    "spurious_retrieval": _sr_verify_candidates(),
}
VERIFY_STUDY_RE = "|".join(VERIFY_CANDIDATES)


def verify_candidates(wildcards):
    """The study's candidate files, by name (``--input NAME=PATH``)."""
    files = VERIFY_CANDIDATES[wildcards.study]
    return {name: f"{RESULTS}/{wildcards.study}/{path}" for name, path in files.items()}


def verify_input_args(wildcards):
    return " ".join(f"--input {shlex.quote(f'{k}={v}')}" for k, v in verify_candidates(wildcards).items())


def verify_role():
    return config["verify"]["role"]


def verify_shard_files(wildcards):
    n = config["verify"]["shards"]
    return [f"{RESULTS}/{wildcards.study}/verify/shards/{i:05d}.parquet" for i in range(n)]


def verify_targets(study):
    """``verify/vqa.parquet`` and ``verified.parquet`` of a study when ``verify.enabled`` (off in the paper config)."""
    if not config["verify"]["enabled"] or study not in VERIFY_CANDIDATES:
        return []
    return [f"{RESULTS}/{study}/verify/vqa.parquet", f"{RESULTS}/{study}/verify/verified.parquet"]
