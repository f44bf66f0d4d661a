# Input functions and parameters of the SocialCounterfactuals rules (rules/study_social_counterfactuals.smk).
# Kept in their own file: Snakemake's linter wants functions apart from rules.
import shlex


def set_shards(wildcards):
    """Shard ids covering the study's caption sets at images.set_shard_size sets per job."""
    v = view(wildcards.study)
    return wf.shard_ids(social.n_sets(v), v["images"]["set_shard_size"])


def social_adaptive_keys(wildcards):
    """Adaptive set generation: the CLIP stage's settings and model decide which candidates are made."""
    v = view(wildcards.study)
    return ["filter.clip", f"models.{v['filter']['clip']['role']}"] if v["images"]["adaptive"]["enabled"] else []


def social_filter_shard_outputs(wildcards):
    """Every shard's outputs of the three filter stages."""
    names = ("clip", "clip_sets", "nsfw", "nsfw_sets", "kept", "detect_sets")
    return expand(
        f"{S}/filter/shards/{{shard}}/{{name}}.parquet", study=wildcards.study, shard=set_shards(wildcards), name=names
    )


def probe_images(wildcards):
    """The images bias probing ranks: after the CLIP stage (§4.2, 'before' NSFW / detectability) or the final set."""
    return f"{S}/filter/clip.parquet" if wildcards.stage == "before" else f"{S}/filter/kept.parquet"


#: the files of probing.pata / probing.visogender (§5.3)
EXTERNAL_KEYS = {"pata": ("files_list", "captions_json", "image_dir"), "visogender": ("oo_tsv", "op_tsv", "image_dir")}


def external_files(wildcards, dataset):
    """key -> file of ``probing.<dataset>`` that the config names (each checked as a source read)."""
    section = view(wildcards.study)["probing"][dataset]
    return {
        k: source_data(section[k], f"{wildcards.study}.probing.{dataset}.{k}")
        for k in EXTERNAL_KEYS[dataset]
        if section.get(k)
    }


def external_data(wildcards):
    """PATA / VisoGender files of probing.pata / probing.visogender (§5.3) that the config names."""
    return [path for dataset in EXTERNAL_KEYS for path in external_files(wildcards, dataset).values()]


def probe_roles(wildcards):
    return view(wildcards.study)["probing"]["roles"]


def debias_runs(wildcards):
    """Debiased runs for every seed; the pre-trained model once (first seed): it is not trained and the test split is
    fixed, so every seed would evaluate it identically (debias.summarize lets that one run stand for each seed)."""
    v = view(wildcards.study)
    pattern = f"{S}/debias/runs/{{role}}/{{segment}}/{{mixture}}/seed{{seed}}/metrics.csv"
    seeds = list(social.debias_seeds(v))
    return [
        path
        for mixture, mixture_seeds in (("pretrained", seeds[:1]), ("debiased", seeds))
        for path in expand(
            pattern,
            study=wildcards.study,
            role=v["debias"]["roles"],
            segment=social.debias_segments(v),
            mixture=mixture,
            seed=mixture_seeds,
        )
    ]


def social_task_data(wildcards):
    """§5.3, Tables 4 and 5: the retrieval split, its images and the classification datasets of debias.task_eval
    (only for the roles it evaluates)."""
    task = view(wildcards.study)["debias"].get("task_eval") or {}
    if wildcards.role not in (task.get("roles") or []):
        return []
    key = f"{wildcards.study}.debias.task_eval"
    out = []
    if task.get("retrieval"):
        out += retrieval_set_files(task["retrieval"], f"{key}.retrieval")
    for name, spec in ((task.get("classification") or {}).get("datasets") or {}).items():
        out += dataset_input_files(spec, name)
    return out


def social_task_model_keys(wildcards):
    """The evaluated roles' model entries (their display names label Tables 4 and 5)."""
    task = view(wildcards.study)["debias"].get("task_eval") or {}
    return [f"models.{role}" for role in task.get("roles") or []]


def iq_set_inputs(wildcards):
    """§10.3: what one image set's features are read from (the kept images, PATA / VisoGender files, a reference)."""
    from counterfactory.studies.social_counterfactuals import image_quality

    name, v = wildcards.iq_set, view(wildcards.study)
    if name == "social_counterfactuals":
        return {"kept": f"{S}/filter/kept.parquet".format(study=wildcards.study)}
    if name in EXTERNAL_KEYS:
        return external_files(wildcards, name)
    refs = list(image_quality.references(v).items())
    ref, path = refs[int(name.removeprefix("ref_"))]
    return {"reference": source_data(path, f"{wildcards.study}.image_quality.references.{ref}")}


def iq_set_keys(wildcards):
    """The config sections one set's features depend on."""
    name = wildcards.iq_set
    return [f"probing.{name}"] if name in EXTERNAL_KEYS else []


def iq_features(wildcards):
    """name -> features file of every set §10.3's table reads."""
    from counterfactory.studies.social_counterfactuals import image_quality

    return {
        name: f"{S}/image_quality/features/{name}.npz".format(study=wildcards.study)
        for name in image_quality.set_names(view(wildcards.study))
    }


def iq_features_flags(wildcards, input):
    return " ".join(shlex.quote(f"{name}={path}") for name, path in input.items() if name != "config")
