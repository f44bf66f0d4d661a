# Spurious correlations in cross-modal retrieval (Kim, Koepke, Schmid & Akata 2023): object removal by inpainting,
# noun-phrase captions, ODmAP@k, fine-tuning on D + D'. Settings: the `spurious_retrieval:` config section (defaults
# in counterfactory.studies.spurious_retrieval.settings); results under results/<run>/spurious_retrieval/<dataset>/.
# The study's short name is `spurious`: rules spurious_<step> run `counterfactory spurious <step>`.
import shlex

SR = "spurious_retrieval"
SR_DIR = f"{RESULTS}/{SR}"
SD = f"{S}/{{dataset}}"


include: "study_spurious_retrieval_inputs.smk"


rule spurious_select:
    """§3.1 Eq. 1-3 / appendix C: one row per (image, class): removed alone, with the classes it covers, or skipped;
    one removal request per selected row."""
    input:
        sr_source_inputs,
        config=job_config("data", "selection", "inpaint.shards"),
    output:
        selection=f"{SD}/selection/selection.parquet",
        requests=f"{SD}/selection/requests.parquet",
        summary=report(
            f"{SD}/selection/summary.csv",
            labels=result_label("{dataset}/selection/summary.csv"),
            category=study_title,
            subcategory=report_section("Object removal"),
            caption="../report/sr_select.rst",
        ),
    log:
        f"{S}/logs/{{dataset}}/select.log",
    wildcard_constraints:
        study=SR,
        dataset="coco|flickr30k",
    conda:
        CONDA_ENV
    resources:
        mem_mb=scaled(8000),
        runtime=minutes(60),
    shell:
        "counterfactory spurious select --config {input.config:q} --dataset {wildcards.dataset} --out {output.selection:q}"
        " --out-requests {output.requests:q} --out-summary {output.summary:q} > {log:q} 2>&1"


rule spurious_captions:
    """§3.2-3.3: the ODmAP gallery (train + val + test captions and the classes they mention) and the synthetic
    captions (noun-phrase removal, prompts)."""
    input:
        requests=rules.spurious_select.output.requests,
        data=sr_source_inputs,
        nltk=config["nltk"]["data_dir"],
        config=job_config("data", "captions", "nltk"),
    output:
        gallery=f"{SD}/captions/gallery.parquet",
        synthetic=f"{SD}/captions/synthetic.parquet",
    log:
        f"{S}/logs/{{dataset}}/captions.log",
    wildcard_constraints:
        study=SR,
        dataset="coco|flickr30k",
    conda:
        CONDA_ENV
    resources:
        mem_mb=scaled(8000),
        runtime=minutes(240),
    shell:
        "counterfactory spurious captions --config {input.config:q} --dataset {wildcards.dataset} --requests {input.requests:q}"
        " --out-gallery {output.gallery:q} --out-synthetic {output.synthetic:q} > {log:q} 2>&1"


rule spurious_inpaint:
    """§3.1, Table 3: one shard of images with the requested classes removed by one method (batched, resumable)."""
    input:
        requests=rules.spurious_select.output.requests,
        models=sr_inpaint_models,
        config=job_config(sr_inpaint_keys),
    output:
        f"{SD}/images/{{method}}/{{shard}}/shard.parquet",
    log:
        f"{S}/logs/{{dataset}}/inpaint_{{method}}_{{shard}}.log",
    benchmark:
        f"{S}/benchmarks/{{dataset}}/inpaint_{{method}}_{{shard}}.tsv"
    wildcard_constraints:
        study=SR,
        dataset="coco|flickr30k",
        method="lama|opencv|zero|mean|blur",
    conda:
        CONDA_ENV
    threads: sr_inpaint_threads
    resources:
        mem_mb=model_mem(16000, "inpaint", tiny_mb=3000),
        runtime=240,
        gpu=GPU,
        hpu=HPU,
    params:
        out_dir=lambda wildcards, output: Path(output[0]).parent,
    shell:
        "counterfactory spurious inpaint --config {input.config:q} --requests {input.requests:q} --method {wildcards.method}"
        " --shard {wildcards.shard} --out-dir {params.out_dir:q} --threads {threads} --no-progress > {log:q} 2>&1"


rule spurious_captioner:
    """Table 3 "capt. model": the captioner role's caption of every inpainted train image."""
    input:
        requests=rules.spurious_select.output.requests,
        images=sr_captioner_images,
        models=model_inputs("captioner"),
        config=job_config("captions", "models.captioner", *DEVICE_KEYS),
    output:
        f"{SD}/captions/captioner.parquet",
    log:
        f"{S}/logs/{{dataset}}/captioner.log",
    wildcard_constraints:
        study=SR,
        dataset="coco|flickr30k",
    conda:
        CONDA_ENV
    threads: accel_threads("captioner")
    resources:
        mem_mb=model_mem(16000, "captioner"),
        runtime=240,
        gpu=GPU,
        hpu=HPU,
    params:
        dirs=lambda wildcards, input: " ".join(shlex.quote(str(Path(p).parent)) for p in input.images),
    shell:
        "counterfactory spurious captioner --config {input.config:q} --requests {input.requests:q} --inpainted {params.dirs}"
        " --out {output:q} --no-progress > {log:q} 2>&1"


rule spurious_manifests:
    """§4.1, Table 3, Figure 4: D, D + D' per variant and ratio (train split, val for checkpoints), ODmAP queries."""
    input:
        requests=rules.spurious_select.output.requests,
        gallery=rules.spurious_captions.output.gallery,
        synthetic=sr_synthetic_inputs,
        images=sr_manifest_images,
        config=job_config("captions", "mixtures", "training"),
    output:
        directory(f"{SD}/manifests"),
    log:
        f"{S}/logs/{{dataset}}/manifests.log",
    wildcard_constraints:
        study=SR,
        dataset="coco|flickr30k",
    conda:
        CONDA_ENV
    params:
        inpainted=sr_inpainted_args,
    shell:
        "counterfactory spurious manifests --config {input.config:q} --dataset {wildcards.dataset} --requests {input.requests:q}"
        " --gallery {input.gallery:q} --synthetic {input.synthetic:q} {params.inpainted} --out-dir {output:q}"
        " > {log:q} 2>&1"


rule spurious_run:
    """§4: one model role fine-tuned on one mixture (one seed) with its §4.1 recipe, or zero-shot; ODmAP@k, R@K."""
    input:
        manifests=rules.spurious_manifests.output,
        gallery=rules.spurious_captions.output.gallery,
        models=sr_run_models,
        config=job_config(sr_run_keys),
    output:
        f"{SD}/runs/{{role}}/{{mixture}}/seed{{seed}}/metrics.csv",
    log:
        f"{S}/logs/{{dataset}}/run_{{role}}_{{mixture}}_seed{{seed}}.log",
    benchmark:
        f"{S}/benchmarks/{{dataset}}/run_{{role}}_{{mixture}}_seed{{seed}}.tsv"
    wildcard_constraints:
        study=SR,
        dataset="coco|flickr30k",
        mixture=r"[A-Za-z0-9_.]+",
    conda:
        CONDA_ENV
    threads: lambda wildcards: accel_threads(wildcards.role)
    resources:
        mem_mb=model_mem_of_role(32000, tiny_mb=3000),
        runtime=1440,
        gpu=GPU,
        hpu=HPU,
    params:
        data_seed=sr_data_seed,
        out_dir=lambda wildcards, output: Path(output[0]).parent,
    shell:
        "counterfactory spurious run --config {input.config:q} --dataset {wildcards.dataset} --role {wildcards.role}"
        " --mixture {wildcards.mixture} --seed {wildcards.seed} --data-seed {params.data_seed}"
        " --manifests {input.manifests:q} --gallery {input.gallery:q} --out-dir {params.out_dir:q}"
        " --no-progress > {log:q} 2>&1"


use rule train_collect as train_collect_spurious with:
    input:
        sr_runs,
    output:
        f"{S}/runs.csv",
    log:
        f"{S}/logs/runs_table.log",
    wildcard_constraints:
        study=SR,


use rule stats_summarize as stats_summarize_spurious with:
    input:
        rules.train_collect_spurious.output,
    output:
        f"{S}/summary.csv",
    log:
        f"{S}/logs/stats.log",
    wildcard_constraints:
        study=SR,
    params:
        baseline=sr_settings.FINETUNE,  # CLIP / BLIP (finetune): D only
        test="welch",  # ours: the paper reports one run per setting
        alpha=0.05,


rule spurious_tables:
    """Tables 1-3 and Figure 4 in the paper's layouts (mean ± std over seeds, t-tests against finetune)."""
    input:
        summary=rules.stats_summarize_spurious.output,
        config=job_config("data", "training", "mixtures", "evaluation"),
    output:
        md=f"{S}/tables.md",
        html=report(
            f"{S}/tables.html",
            labels=result_label("tables.html"),
            category=study_title,
            subcategory=report_section("Tables"),
            caption="../report/sr_tables.rst",
        ),
        tex=f"{S}/tables.tex",
        csv=f"{S}/tables.csv",
        figure=report(
            f"{S}/figure4.png",
            labels=result_label("figure4.png"),
            category=study_title,
            subcategory=report_section("Tables"),
            caption="../report/sr_tables.rst",
        ),
    log:
        f"{S}/logs/tables.log",
    wildcard_constraints:
        study=SR,
    conda:
        CONDA_ENV
    params:
        labels=display_labels,
    shell:
        "counterfactory spurious tables --config {input.config:q} --summary {input.summary:q} --out-md {output.md:q} --out-tex {output.tex:q}"
        " --out-csv {output.csv:q} --out-figure {output.figure:q} --out-html {output.html:q} {params.labels.flags} > {log:q} 2>&1"


STUDY_TARGETS[SR] = lambda: [f"{SR_DIR}/tables.md"] + [
    f"{SR_DIR}/{dataset}/selection/summary.csv" for dataset in sr_settings.settings(view(SR))["data"]["datasets"]
]
