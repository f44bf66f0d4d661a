# SocialCounterfactuals (Howard et al., CVPR 2024): caption sets, batched Prompt-to-Prompt sets, the three-stage
# filter, bias probing before and after the NSFW / detectability stages, and the release. Settings: the
# `social_counterfactuals:` config section; results under results/<run>/social_counterfactuals/.
import shlex

SCF = "social_counterfactuals"
SCF_DIR = f"{RESULTS}/{SCF}"


include: "study_social_counterfactuals_inputs.smk"


rule social_captions:
    """§3.2, 8.4: one caption set per (segment, prefix, subject) from the configured lists (a/an agreement)."""
    input:
        config=job_config("captions"),
    output:
        f"{S}/captions/caption_sets.parquet",
    log:
        f"{S}/logs/captions.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    shell:
        "counterfactory social captions --config {input.config:q} --out {output:q} > {log:q} 2>&1"


rule social_generate:
    """§3.3: over-generate candidate sets for one shard of caption sets (a set per batch, shared base attention)."""
    input:
        sets=rules.social_captions.output,
        # adaptive mode (ours) scores each batch with the filter.clip model: then it is an input too
        models=lambda wildcards: model_inputs(
            "sd",
            "vae",
            *(
                [view(wildcards.study)["filter"]["clip"]["role"]]
                if view(wildcards.study)["images"]["adaptive"]["enabled"]
                else []
            ),
        )(wildcards),
        config=job_config(
            "images",
            "seed",
            "models.sd",
            "models.vae",
            # adaptive mode: the CLIP stage's settings and model decide which candidates are made
            social_adaptive_keys,
            *DEVICE_KEYS,
        ),
    output:
        table=f"{S}/generation/shards/{{shard}}/candidates.parquet",
        summary=f"{S}/generation/shards/{{shard}}/summary.json",
    log:
        f"{S}/logs/generation/{{shard}}.log",
    benchmark:
        f"{S}/benchmarks/generation/{{shard}}.tsv"
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    threads: accel_threads("sd")
    resources:
        mem_mb=model_mem(16000, "sd", tiny_mb=3000),
        runtime=per_study(lambda study: 15 + social_images_minutes(study)),
        gpu=GPU,
        hpu=HPU,
    params:
        out_dir=lambda wildcards, output: Path(output.table).parent,
    shell:
        "counterfactory social generate --config {input.config:q} --sets {input.sets:q} --shard {wildcards.shard}"
        " --out-dir {params.out_dir:q} --threads {threads} --no-progress > {log:q} 2>&1"


rule social_generate_merge:
    """Every generated image of every candidate set (shards made under one config)."""
    input:
        lambda wildcards: expand(
            f"{S}/generation/shards/{{shard}}/summary.json", study=wildcards.study, shard=set_shards(wildcards)
        ),
    output:
        table=f"{S}/generation/candidates.parquet",
        summary=f"{S}/generation/summary.json",
    log:
        f"{S}/logs/generation/merge.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    params:
        shards=lambda wildcards, input: " ".join(shlex.quote(str(Path(p).parent)) for p in input),
        out_dir=lambda wildcards, output: Path(output.table).parent,
    shell:
        "counterfactory social generate-merge --shard-dirs {params.shards} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule social_filter_clip:
    """§3.4 (a), per generation shard: every image-caption cosine >= 0.2 and every image pair > 0.2 in a set."""
    input:
        images=f"{S}/generation/shards/{{shard}}/candidates.parquet",
        models=model_inputs("clip_filter"),
        config=job_config("filter.clip", "filter.batch_size", "filter.chunk_images", "models.clip_filter", *DEVICE_KEYS),
    output:
        kept=f"{S}/filter/shards/{{shard}}/clip.parquet",
        sets=f"{S}/filter/shards/{{shard}}/clip_sets.parquet",
    log:
        f"{S}/logs/filter/{{shard}}_clip.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    threads: accel_threads("clip_filter")
    resources:
        mem_mb=model_mem(8000, "clip_filter"),
        runtime=per_study(social_filter_minutes),
        gpu=GPU,
        hpu=HPU,
    shell:
        "counterfactory social filter-clip --config {input.config:q} --images {input.images:q} --out {output.kept:q}"
        " --sets {output.sets:q} --no-progress > {log:q} 2>&1"


rule social_filter_nsfw:
    """§3.4 (b), 8.3, per shard: drop every candidate set with an image the NSFW classifier flags."""
    input:
        images=rules.social_filter_clip.output.kept,
        models=model_inputs("nsfw"),
        config=job_config("filter.nsfw", "filter.batch_size", "filter.chunk_images", "models.nsfw", *DEVICE_KEYS),
    output:
        kept=f"{S}/filter/shards/{{shard}}/nsfw.parquet",
        sets=f"{S}/filter/shards/{{shard}}/nsfw_sets.parquet",
    log:
        f"{S}/logs/filter/{{shard}}_nsfw.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    threads: accel_threads("nsfw")
    resources:
        mem_mb=model_mem(8000, "nsfw"),
        runtime=per_study(social_filter_minutes),
        gpu=GPU,
        hpu=HPU,
    shell:
        "counterfactory social filter-nsfw --config {input.config:q} --images {input.images:q} --out {output.kept:q}"
        " --sets {output.sets:q} --no-progress > {log:q} 2>&1"


rule social_filter_detect:
    """§3.4 (c), 8.3, Table 10, per shard: keep sets whose targeted attributes are discernible in enough images."""
    input:
        images=rules.social_filter_nsfw.output.kept,
        captions=rules.social_captions.output,
        models=model_inputs("clip_filter"),
        config=job_config(
            "filter.detectability",
            "filter.batch_size",
            "filter.chunk_images",
            "captions",
            "models.clip_filter",
            *DEVICE_KEYS,
        ),
    output:
        kept=f"{S}/filter/shards/{{shard}}/kept.parquet",
        sets=f"{S}/filter/shards/{{shard}}/detect_sets.parquet",
    log:
        f"{S}/logs/filter/{{shard}}_detect.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    threads: accel_threads("clip_filter")
    resources:
        mem_mb=model_mem(8000, "clip_filter"),
        runtime=per_study(social_filter_minutes),
        gpu=GPU,
        hpu=HPU,
    shell:
        "counterfactory social filter-detect --config {input.config:q} --images {input.images:q} --captions {input.captions:q}"
        " --out {output.kept:q} --sets {output.sets:q} --no-progress > {log:q} 2>&1"


rule social_filter_merge:
    """The three stages' surviving images and set tables of every shard, concatenated."""
    input:
        social_filter_shard_outputs,
    output:
        clip=f"{S}/filter/clip.parquet",
        clip_sets=f"{S}/filter/clip_sets.parquet",
        nsfw=f"{S}/filter/nsfw.parquet",
        nsfw_sets=f"{S}/filter/nsfw_sets.parquet",
        kept=f"{S}/filter/kept.parquet",
        detect_sets=f"{S}/filter/detect_sets.parquet",
    log:
        f"{S}/logs/filter/merge.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    params:
        shards=lambda wildcards, input: " ".join(sorted({shlex.quote(str(Path(p).parent)) for p in input})),
        out_dir=lambda wildcards, output: Path(output.kept).parent,
    shell:
        "counterfactory social filter-merge --shard-dirs {params.shards} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule social_filter_table:
    """Table 11: candidate sets remaining after each filter stage, per segment."""
    input:
        candidates=rules.social_generate_merge.output.table,
        clip=rules.social_filter_merge.output.clip_sets,
        nsfw=rules.social_filter_merge.output.nsfw_sets,
        detect=rules.social_filter_merge.output.detect_sets,
        captions=rules.social_captions.output,
        config=job_config("filter"),
    output:
        csv=f"{S}/filter/table11.csv",
        md=f"{S}/filter/table11.md",
        table18_csv=f"{S}/filter/table18.csv",
        table18_md=f"{S}/filter/table18.md",
        html=report(
            f"{S}/filter/table11.html",
            labels=result_label("filter/table11.html"),
            category=study_title,
            subcategory=report_section("Filtering"),
            caption="../report/social_filter.rst",
        ),
    log:
        f"{S}/logs/filter/table11.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    shell:
        "counterfactory social filter-table --config {input.config:q} --candidates {input.candidates:q} --clip {input.clip:q}"
        " --nsfw {input.nsfw:q} --detect {input.detect:q} --captions {input.captions:q} --out-csv {output.csv:q}"
        " --out-md {output.md:q} --out-html {output.html:q} --out-table18-csv {output.table18_csv:q}"
        " --out-table18-md {output.table18_md:q} > {log:q} 2>&1"


rule social_image_quality_features:
    """§10.3: Inception pool features and logits of one image set (kept images, VisoGender, PATA or a reference)."""
    input:
        unpack(iq_set_inputs),
        models=model_inputs("inception"),
        config=job_config("image_quality", iq_set_keys, "models.inception", *DEVICE_KEYS),
    output:
        f"{S}/image_quality/features/{{iq_set}}.npz",
    log:
        f"{S}/logs/image_quality/{{iq_set}}.log",
    wildcard_constraints:
        study=SCF,
        iq_set="social_counterfactuals|pata|visogender|ref_[0-9]+",
    conda:
        CONDA_ENV
    threads: accel_threads("inception")
    resources:
        mem_mb=model_mem(8000, "inception"),
        runtime=120,
        gpu=GPU,
        hpu=HPU,
    params:
        kept=lambda wildcards, input: f"--kept {shlex.quote(input.kept)}" if "kept" in input.keys() else "",
    shell:
        "counterfactory social image-quality-features --config {input.config:q} --set {wildcards.iq_set}"
        " {params.kept} --out {output:q} --no-progress > {log:q} 2>&1"


rule social_image_quality_table:
    """§10.3's table: FID against each reference and the Inception Score of every set, the paper's beside ours."""
    input:
        unpack(iq_features),
        config=job_config("image_quality", "probing.pata", "probing.visogender"),
    output:
        md=f"{S}/image_quality/table.md",
        csv=f"{S}/image_quality/table.csv",
        html=report(
            f"{S}/image_quality/table.html",
            labels=result_label("image_quality/table.html"),
            category=study_title,
            subcategory=report_section("Image quality"),
            caption="../report/social_image_quality.rst",
        ),
    log:
        f"{S}/logs/image_quality/table.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    params:
        features=iq_features_flags,
    shell:
        "counterfactory social image-quality-table --config {input.config:q} --features {params.features}"
        " --out-md {output.md:q} --out-csv {output.csv:q} --out-html {output.html:q} > {log:q} 2>&1"


rule social_probe:
    """§4, §10.1: MaxSkew@K, NDKL, Bias@K of neutral subject queries for one model on one stage's images."""
    input:
        images=probe_images,
        models=model_inputs("{role}"),
        config=job_config("probing", "captions", "models.{role}", "evaluation.batch_size", *DEVICE_KEYS),
    output:
        f"{S}/probing/{{stage}}/{{role}}.csv",
    log:
        f"{S}/logs/probing/{{stage}}_{{role}}.log",
    benchmark:
        f"{S}/benchmarks/probing/{{stage}}_{{role}}.tsv"
    wildcard_constraints:
        study=SCF,
        stage="before|after",
    conda:
        CONDA_ENV
    threads: lambda wildcards: accel_threads(wildcards.role)
    resources:
        mem_mb=model_mem_of_role(8000),
        runtime=per_study(social_scoring_minutes),
        gpu=GPU,
        hpu=HPU,
    shell:
        "counterfactory social probe --config {input.config:q} --images {input.images:q} --role {wildcards.role}"
        " --out {output:q} > {log:q} 2>&1"


rule social_probe_tables:
    """Tables 2 and 12-15 layouts (MaxSkew, NDKL, Bias@K per model and segment)."""
    input:
        lambda wildcards: expand(
            f"{S}/probing/{{stage}}/{{role}}.csv",
            study=wildcards.study,
            stage=wildcards.stage,
            role=probe_roles(wildcards),
        ),
    output:
        md=f"{S}/probing/{{stage}}/tables.md",
        html=report(
            f"{S}/probing/{{stage}}/tables.html",
            labels=result_label("probing/{stage}/tables.html"),
            category=study_title,
            subcategory=report_section("Bias probing"),
            caption="../report/social_probe.rst",
        ),
        tex=f"{S}/probing/{{stage}}/tables.tex",
        csv=f"{S}/probing/{{stage}}/tables.csv",
    log:
        f"{S}/logs/probing/{{stage}}_tables.log",
    wildcard_constraints:
        study=SCF,
        stage="before|after",
    conda:
        CONDA_ENV
    params:
        labels=display_labels,
    shell:
        "counterfactory social probe-tables --probe {input:q} {params.labels.flags} --out-md {output.md:q}"
        " --out-tex {output.tex:q} --out-csv {output.csv:q} --out-html {output.html:q} > {log:q} 2>&1"


rule social_probe_plots:
    """Figures 3-5 (before) and 6-13 (after): MaxSkew box plots, marginal bars, retrieval proportions."""
    input:
        rules.social_probe_tables.input,
    output:
        report(
            directory(f"{S}/probing/{{stage}}/figures"),
            patterns=["{name}.png"],
            labels=result_label("probing/{stage}/figures/{name}.png"),
            category=study_title,
            subcategory=report_section("Bias probing"),
            caption="../report/social_probe.rst",
        ),
    log:
        f"{S}/logs/probing/{{stage}}_figures.log",
    wildcard_constraints:
        study=SCF,
        stage="before|after",
    conda:
        CONDA_ENV
    params:
        subjects=lambda wildcards: " ".join(
            f"--subject {shlex.quote(s)}" for s in view(wildcards.study)["probing"]["figure_subjects"]
        ),
        labels=display_labels,
    shell:
        "counterfactory social probe-plots --probe {input:q} --out-dir {output:q} {params.subjects} {params.labels.flags}"
        " > {log:q} 2>&1"


STUDY_TARGETS[SCF] = lambda: social.targets(view(SCF), SCF_DIR)


# §5, §8.2: debiasing. One split of the occupations (20 % withheld); per (model, segment, seed) a fine-tuning
# run and the pre-trained model's evaluation, both probed on the withheld occupations; t-tests over seeds.
rule social_debias_split:
    """§5.1: withhold 20 % of the occupations (reproducible); a training manifest per segment of the rest."""
    input:
        images=rules.social_filter_merge.output.kept,
        config=job_config("debias", "captions"),
    output:
        manifests=directory(f"{S}/debias/manifests"),
    log:
        f"{S}/logs/debias/split.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    shell:
        "counterfactory social debias-split --config {input.config:q} --images {input.images:q} --out-dir {output.manifests:q}"
        " > {log:q} 2>&1"


rule social_debias_run:
    """§5.2, 8.2: fine-tune one model on one segment (or evaluate it pre-trained) and probe the withheld occupations."""
    input:
        manifests=rules.social_debias_split.output.manifests,
        images=rules.social_filter_merge.output.kept,
        external=external_data,
        task_data=social_task_data,
        models=model_inputs("{role}"),
        config=job_config("debias", "probing", "captions", "models.{role}", "evaluation.batch_size", *DEVICE_KEYS),
    output:
        f"{S}/debias/runs/{{role}}/{{segment}}/{{mixture}}/seed{{seed}}/metrics.csv",
    log:
        f"{S}/logs/debias/{{role}}_{{segment}}_{{mixture}}_seed{{seed}}.log",
    benchmark:
        f"{S}/benchmarks/debias/{{role}}_{{segment}}_{{mixture}}_seed{{seed}}.tsv"
    wildcard_constraints:
        study=SCF,
        mixture="pretrained|debiased",
    conda:
        CONDA_ENV
    threads: lambda wildcards: accel_threads(wildcards.role)
    resources:
        mem_mb=model_mem_of_role(16000, tiny_mb=3000),
        runtime=per_study(lambda study: 60 + social_scoring_minutes(study)),
        gpu=GPU,
        hpu=HPU,
    params:
        data_seed=lambda wildcards: social.debias_seeds(view(wildcards.study))[int(wildcards.seed)],
        out_dir=lambda wildcards, output: Path(output[0]).parent,
        train=lambda wildcards: "--no-train" if wildcards.mixture == "pretrained" else "",
    shell:
        "counterfactory social debias-run --config {input.config:q} --role {wildcards.role} --segment {wildcards.segment}"
        " --manifest {input.manifests:q}/{wildcards.segment}.parquet --test-subjects {input.manifests:q}/subjects.csv"
        " --images {input.images:q} --seed {wildcards.seed} --data-seed {params.data_seed} {params.train}"
        " --out-dir {params.out_dir:q} --no-progress > {log:q} 2>&1"


use rule train_collect as train_collect_social with:
    input:
        debias_runs,
    output:
        f"{S}/debias/runs.csv",
    log:
        f"{S}/logs/debias/runs_table.log",
    wildcard_constraints:
        study=SCF,


rule social_debias_table:
    """Tables 2, 16, 17 layouts: MaxSkew, NDKL, Bias@K before / after debiasing (mean ± std, one-tailed t-test)."""
    input:
        rules.train_collect_social.output,
    output:
        md=f"{S}/debias/tables.md",
        html=report(
            f"{S}/debias/tables.html",
            labels=result_label("debias/tables.html"),
            category=study_title,
            subcategory=report_section("Debiasing"),
            caption="../report/social_debias.rst",
        ),
        tex=f"{S}/debias/tables.tex",
        csv=f"{S}/debias/tables.csv",
    log:
        f"{S}/logs/debias/tables.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    params:
        labels=display_labels,
        withheld=lambda wildcards: view(wildcards.study)["debias"]["withheld_fraction"],
        paper_segment=lambda wildcards: view(wildcards.study)["debias"]["paper_segment"],  # §5.3: "Debiased CLIP"
    shell:
        "counterfactory social debias-table --runs {input:q} {params.labels.flags} --withheld-fraction {params.withheld}"
        " --paper-segment {params.paper_segment}"
        " --out-md {output.md:q}"
        " --out-tex {output.tex:q} --out-csv {output.csv:q} --out-html {output.html:q} > {log:q} 2>&1"


rule social_debias_task_table:
    """§5.3, Tables 4 and 5: retrieval R@K and zero-shot accuracy of the pre-trained and debiased models."""
    input:
        runs=rules.train_collect_social.output,
        config=job_config("debias", "captions", social_task_model_keys),
    output:
        md=f"{S}/debias/task_tables.md",
        html=report(
            f"{S}/debias/task_tables.html",
            labels=result_label("debias/task_tables.html"),
            category=study_title,
            subcategory=report_section("Debiasing"),
            caption="../report/social_debias.rst",
        ),
        tex=f"{S}/debias/task_tables.tex",
        csv=f"{S}/debias/task_tables.csv",
        seeds=f"{S}/debias/task_tables_seeds.csv",
    log:
        f"{S}/logs/debias/task_tables.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    params:
        labels=display_labels,  # display names are table-only (left out of job configurations)
    shell:
        "counterfactory social debias-task-table --config {input.config:q} --runs {input.runs:q} --out-md {output.md:q}"
        " --out-tex {output.tex:q} --out-csv {output.csv:q} --out-html {output.html:q}"
        " --out-seeds-csv {output.seeds:q} {params.labels.flags} > {log:q} 2>&1"
