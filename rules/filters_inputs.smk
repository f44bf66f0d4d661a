# Input functions and parameters of the filter cards (rules/filters.smk, docs/verify.md "Filter cards").
# Kept in their own file: Snakemake's linter wants functions apart from rules.
import shlex

# each study's filters with a card and the files each one reads (NAME -> path under the study folder); the score
# tables are made from them by counterfactory.studies.<study>.filter_cards (its FILTERS name the same inputs)
_COCO_SCORES = {"scores": "images/candidate_scores.parquet"}
_SCF_SETS = {
    "clip": "filter/clip_sets.parquet",
    "nsfw": "filter/nsfw_sets.parquet",
    "detect": "filter/detect_sets.parquet",
}
FILTER_CARD_INPUTS = {
    "coco_counterfactuals": {
        "clip_image_caption": _COCO_SCORES,
        "clip_image_image": _COCO_SCORES,
        "clip_direction": _COCO_SCORES,
        "clip": _COCO_SCORES,
        "selection": _COCO_SCORES,
        "vqa": {"selected": "images/selected_pairs.parquet", "vqa": "verify/vqa.parquet"},
    },
    "social_counterfactuals": {
        "clip_image_caption": {"clip": _SCF_SETS["clip"]},
        "clip_image_image": {"clip": _SCF_SETS["clip"]},
        "clip": {"clip": _SCF_SETS["clip"]},
        "nsfw": {"nsfw": _SCF_SETS["nsfw"]},
        "detectability": {"detect": _SCF_SETS["detect"]},
        "vqa": {"vqa": "verify/vqa.parquet"},
    },
    "countercurate": {"vqa": {"vqa": "verify/vqa.parquet"}},
    "spurious_retrieval": {"vqa": {"vqa": "verify/vqa.parquet"}},
    "cvld": {
        "vote": {"votes": "coco/text/votes.parquet"},
        "edit_selection": {"edits": f"coco/edits/{config['cvld']['editing']['train_method']}/edits.parquet"},
        "vqa": {"vqa": "verify/vqa.parquet"},
    },
}
FILTER_CARD_STUDY_RE = "|".join(FILTER_CARD_INPUTS)
FILTER_CARD_NAME_RE = "|".join(sorted({f for fs in FILTER_CARD_INPUTS.values() for f in fs}))
# the study sections whose thresholds a card reads
FILTER_CARD_KEYS = {
    "coco_counterfactuals": ["images.filter"],
    "social_counterfactuals": ["filter"],
    "countercurate": [],
    "spurious_retrieval": [],
    "cvld": ["editing.k"],
}


def filters_audit(study, name):
    """The audit CSV ``filters.audit.<study>.<filter>`` names (None: no card)."""
    return ((config.get("filters") or {}).get("audit") or {}).get(study, {}).get(name)


def filter_card_inputs(wildcards):
    """The files the filter reads (NAME -> path) and its audit sample."""
    files = FILTER_CARD_INPUTS[wildcards.study].get(wildcards.filter)
    audit = filters_audit(wildcards.study, wildcards.filter)
    if files is None or audit is None:
        raise WorkflowError(
            f"no filter card {wildcards.study}/{wildcards.filter}: filters.audit.{wildcards.study}.{wildcards.filter}"
            " names no audit CSV. Fix: add it to the config (docs/verify.md 'Filter cards')"
        )
    return {**{k: f"{RESULTS}/{wildcards.study}/{v}" for k, v in files.items()}, "audit": audit}


def filter_card_args(wildcards, input):
    return " ".join(f"--input {shlex.quote(f'{k}={v}')}" for k, v in input.items() if k not in ("audit", "config"))


def filter_card_config_keys(wildcards):
    return ["filters", "verify", *FILTER_CARD_KEYS[wildcards.study]]


def filter_card_names(study):
    """The study's filters with a card: those ``filters.audit`` names an audit for (the vqa filter only when
    ``verify.enabled``, as the VQA check's scores)."""
    audits = ((config.get("filters") or {}).get("audit") or {}).get(study) or {}
    names = [f for f in FILTER_CARD_INPUTS.get(study, {}) if f in audits]
    return [f for f in names if f != "vqa" or (config["verify"]["enabled"] and study in VERIFY_CANDIDATES)]


def filter_card_targets(study):
    """``filters/cards/<filter>/card.{md,html}`` of every audited filter of the study (none in the paper config)."""
    if study not in STUDIES:
        return []
    base = f"{RESULTS}/{study}/filters/cards"
    return [f"{base}/{f}/{n}" for f in filter_card_names(study) for n in ("card.md", "card.html")]


def filter_card_dirs(study):
    """The card folders the study's dataset card copies (``export card --filter-card DIR``)."""
    return [f"{RESULTS}/{study}/filters/cards/{f}" for f in filter_card_names(study)]
