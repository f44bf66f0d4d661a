# Input functions and parameters of the spurious-correlation retrieval rules (rules/study_spurious_retrieval.smk).
# Kept in their own file: Snakemake's linter wants functions apart from rules.
import shlex


def sr(wildcards):
    return sr_settings.settings(view(wildcards.study))


def sr_source_inputs(wildcards):
    """The dataset's official files: Karpathy split and COCO instances (or Flickr30k Entities)."""
    src = sr(wildcards)["data"][wildcards.dataset]
    key = f"{wildcards.study}.data.{wildcards.dataset}"
    files = [source_data(src.get("karpathy_json") or "<unset>", f"{key}.karpathy_json")]
    check_karpathy_layout(src, key, [n for names in sr(wildcards)["data"]["splits"].values() for n in names])
    if wildcards.dataset == "coco":
        files += [source_data(p, f"{key}.instances") for p in src.get("instances") or ["<unset>"]]
    else:
        files.append(source_data(src.get("entities_root") or "<unset>", f"{key}.entities_root"))
    return files


def sr_shard_ids(wildcards):
    return [f"{i:05d}" for i in range(sr(wildcards)["inpaint"]["shards"])]


def sr_image_shards(wildcards, method):
    return expand(
        f"{S}/{{dataset}}/images/{method}/{{shard}}/shard.parquet",
        study=wildcards.study,
        dataset=wildcards.dataset,
        shard=sr_shard_ids(wildcards),
    )


def sr_inpaint_models(wildcards):
    return wf.local_model_inputs(config, "inpaint") if wildcards.method == "lama" else []


def sr_inpaint_keys(wildcards):
    return ["inpaint"] + (["models.inpaint", *DEVICE_KEYS] if wildcards.method == "lama" else [])


def sr_variant_methods(wildcards):
    s = sr(wildcards)
    return sr_settings.image_methods(s, wildcards.dataset), sr_settings.text_methods(s, wildcards.dataset)


def sr_captioner_images(wildcards):
    return sr_image_shards(wildcards, sr(wildcards)["mixtures"]["variants"]["ours"]["image"])


def sr_synthetic_inputs(wildcards):
    out = [f"{RESULTS}/{wildcards.study}/{wildcards.dataset}/captions/synthetic.parquet"]
    if "captioner" in sr_variant_methods(wildcards)[1]:
        out.append(f"{RESULTS}/{wildcards.study}/{wildcards.dataset}/captions/captioner.parquet")
    return out


def sr_manifest_images(wildcards):
    return [f for method in sr_variant_methods(wildcards)[0] for f in sr_image_shards(wildcards, method)]


def sr_inpainted_args(wildcards, input):
    import shlex

    return " ".join(f"--inpainted {Path(p).parts[-3]}={shlex.quote(str(Path(p).parent))}" for p in input.images)


def sr_start_role(wildcards):
    return sr_settings.start_role(sr(wildcards), wildcards.dataset, wildcards.role)


def sr_run_models(wildcards):
    """The local model folder the run starts from (training.start_roles, else the role's own)."""
    return wf.local_model_inputs(config, sr_start_role(wildcards))


def sr_run_keys(wildcards):
    # every run reads training.models (a zeroshot run too: settings.has_zeroshot checks the role's recipe)
    starts = dict.fromkeys((wildcards.role, sr_start_role(wildcards)))
    return ["evaluation", "training", *[f"models.{r}" for r in starts], *DEVICE_KEYS]


def sr_data_seed(wildcards):
    return dict(sr_settings.seed_pairs(sr(wildcards)))[int(wildcards.seed)]


def sr_runs(wildcards):
    """metrics.csv of every run of the configuration (zero-shot once per model)."""
    from counterfactory.studies.spurious_retrieval.runs import runs

    return [
        f"{RESULTS}/{wildcards.study}/{d}/runs/{role}/{m}/seed{seed}/metrics.csv"
        for d, role, m, seed in runs(sr(wildcards))
    ]
