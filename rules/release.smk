# Published releases as inputs (metrics-and-formats B11, B12): with `<study>.release.root` set, a downloaded
# Intel/COCO-Counterfactuals or Intel/SocialCounterfactuals is read into the very table the evaluations read
# (images/selected_pairs.parquet; filter/kept.parquet), so eval_itr / eval_itm / train_mixtures / in_domain_split /
# report_pair_grid and social_probe / social_debias_* run on it unchanged. These rules exist only when a release is
# configured, and a ruleorder then prefers them to the generation stages' merge rules; with the keys null (the
# default) the DAG is exactly as before. Include after rules/study_*.smk (it uses CCF and SCF).


def release_setting(study, key):
    """``<study>.release.<key>`` of a study this run builds, else None."""
    return view(study).get("release", {}).get(key) if study in STUDIES else None


CCF_RELEASE = release_setting(CCF, "root")
CCF_RELEASE_CAPTIONS = release_setting(CCF, "captions")
SCF_RELEASE = release_setting(SCF, "root")
RELEASE_FIX = "README 'Published releases'"


def coco_release_inputs(wildcards):
    """examples.jsonl and the images (data/images.zip, else the extracted data/images/)."""
    data = Path(CCF_RELEASE) / "data"
    key = f"{CCF}.release.root"
    images = data / "images.zip" if (data / "images.zip").exists() else data / "images"
    return [source_data(data / "examples.jsonl", key, RELEASE_FIX), source_data(images, key, RELEASE_FIX)]


def social_release_inputs(wildcards):
    """Every parquet shard of the release (all of them must be there)."""
    from counterfactory.data.releases import social_shards
    from counterfactory.errors import CounterFactoryError

    source_data(Path(SCF_RELEASE) / "data", f"{SCF}.release.root", RELEASE_FIX)
    try:
        return [str(p) for p in social_shards(SCF_RELEASE)]
    except CounterFactoryError as exc:
        raise WorkflowError(f"{exc} (config key {SCF}.release.root)") from None


if CCF_RELEASE:

    ruleorder: release_coco_pairs > images_merge

    rule release_coco_pairs:
        """B11: Intel/COCO-Counterfactuals as the image stage's selected pairs (scores it lacks are NaN)."""
        input:
            coco_release_inputs,
        output:
            selected=f"{S}/images/selected_pairs.parquet",
            images=directory(f"{S}/images/release"),
        log:
            f"{S}/logs/images/release.log",
        wildcard_constraints:
            study=CCF,
        conda:
            CONDA_ENV
        params:
            root=CCF_RELEASE,
        shell:
            "counterfactory release coco --root {params.root:q} --out {output.selected:q} --images {output.images:q}"
            " > {log:q} 2>&1"


if CCF_RELEASE_CAPTIONS:

    ruleorder: release_coco_captions > caption_merge

    rule release_coco_captions:
        """B11: the caption-only release as the caption stage's counterfactual captions (no similarity/perplexity)."""
        input:
            lambda wildcards: source_data(CCF_RELEASE_CAPTIONS, f"{CCF}.release.captions", RELEASE_FIX),
        output:
            f"{S}/captions/counterfactual_captions.parquet",
        log:
            f"{S}/logs/captions/release.log",
        wildcard_constraints:
            study=CCF,
        conda:
            CONDA_ENV
        shell:
            "counterfactory release coco-captions --jsonl {input:q} --out {output:q} > {log:q} 2>&1"


if SCF_RELEASE:

    ruleorder: release_social_images > social_filter_merge

    rule release_social_images:
        """B12: Intel/SocialCounterfactuals as the filter stage's kept images (what probing and debiasing read)."""
        input:
            social_release_inputs,
        output:
            kept=f"{S}/filter/kept.parquet",
            images=directory(f"{S}/filter/release_images"),
        log:
            f"{S}/logs/filter/release.log",
        wildcard_constraints:
            study=SCF,
        conda:
            CONDA_ENV
        params:
            root=SCF_RELEASE,
        shell:
            "counterfactory release social --root {params.root:q} --out {output.kept:q} --images {output.images:q}"
            " > {log:q} 2>&1"
