# Published releases as inputs (Intel/COCO-Counterfactuals, Intel/SocialCounterfactuals): with `<study>.release.root` set, a downloaded
# Intel/COCO-Counterfactuals or Intel/SocialCounterfactuals is read into the very table the evaluations read
# (images/selected_pairs.parquet; filter/kept.parquet), so evaluate_itr / evaluate_itm / train_mixtures /
# train_in_domain_split / report_pair_grid and social_probe / social_debias_* run on it unchanged;
# `coco_counterfactuals.release.captions` does the same for the caption stage's table. These rules exist only when a
# release is configured, and a ruleorder then prefers them to the generation stages' merge rules; with the keys null
# (the default) the DAG is as before.
# Include after rules/study_*.smk (it uses CCF and SCF).
from counterfactory.data.releases import release_inputs

CCF_RELEASE = view(CCF)["release"]["root"] if CCF in STUDIES else None
CCF_RELEASE_CAPTIONS = view(CCF)["release"]["captions"] if CCF in STUDIES else None
SCF_RELEASE = view(SCF)["release"]["root"] if SCF in STUDIES else None
RELEASE_FIX = "see docs/own-data.md"


if CCF_RELEASE:

    ruleorder: release_coco > images_merge

    rule release_coco:
        """B11: Intel/COCO-Counterfactuals as the image stage's selected pairs (scores it lacks are NaN)."""
        input:
            lambda wildcards: [
                source_data(p, f"{CCF}.release.root", RELEASE_FIX) for p in release_inputs("coco", CCF_RELEASE)
            ],
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

    ruleorder: release_coco_captions > captions_merge

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

    ruleorder: release_social > social_filter_merge

    rule release_social:
        """B12: Intel/SocialCounterfactuals as the filter stage's kept images (what probing and debiasing read)."""
        input:
            lambda wildcards: [
                source_data(p, f"{SCF}.release.root", RELEASE_FIX) for p in release_inputs("social", SCF_RELEASE)
            ],
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
