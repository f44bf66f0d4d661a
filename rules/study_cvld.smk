# CVLD (debiasing VLMs with counterfactuals): gender interventions on captions (rule-based or the llm role), image
# edits (InstructPix2Pix, null-text inversion + Prompt-to-Prompt; m edits, top k by the image encoder), debiased
# adaptation of BLIP for classification, retrieval and captioning, fairness metrics. Settings: the `cvld:` config
# section (defaults in counterfactory.studies.cvld.settings); results under results/<run>/cvld/.
import shlex

CV = "cvld"
CV_DIR = f"{RESULTS}/{CV}"


include: "study_cvld_inputs.smk"


rule cvld_intervene:
    """§3.3, appendix B: every training caption of the largest COCO subset intervened (gender flipped), an edit
    prompt per caption, the majority vote per image, one editing request per accepted image."""
    input:
        data=cvld_coco_inputs,
        models=cvld_text_models,
        nltk=config["nltk"]["data_dir"],
        config=job_config(cvld_intervene_keys),
    output:
        captions=f"{S}/coco/text/captions.parquet",
        votes=f"{S}/coco/text/votes.parquet",
        rejected=f"{S}/coco/text/rejected.parquet",
        requests=f"{S}/coco/edits/requests.parquet",
        summary=report(
            f"{S}/coco/text/summary.csv",
            labels=result_label("coco/text/summary.csv"),
            category=study_title,
            subcategory=report_section("Interventions"),
            caption="../report/cvld_intervene.rst",
        ),
    log:
        f"{S}/logs/coco/intervene.log",
    wildcard_constraints:
        study=CV,
    conda:
        CONDA_ENV
    resources:
        mem_mb=model_mem(32000, "llm", tiny_mb=3000),
        runtime=minutes(720),
        gpu=GPU,
        hpu=HPU,
    shell:
        "counterfactory cvld intervene --config {input.config:q} --out-captions {output.captions:q} --out-votes {output.votes:q}"
        " --out-requests {output.requests:q} --out-rejected {output.rejected:q} --out-summary {output.summary:q}"
        " > {log:q} 2>&1"


rule cvld_requests:
    """§3.3 "Image-only intervention": the CelebA training images of every K-shot episode, with the manual prompts."""
    input:
        cvld_celeba_inputs,
        config=job_config("data.celeba", "intervention", "classification", "editing.shards"),
    output:
        f"{S}/celeba/edits/requests.parquet",
    log:
        f"{S}/logs/celeba/requests.log",
    wildcard_constraints:
        study=CV,
    conda:
        CONDA_ENV
    shell:
        "counterfactory cvld requests --config {input.config:q} --out {output:q} > {log:q} 2>&1"


rule cvld_edit:
    """§3.3, §5.1: one shard of examples, m edits each (seeds and parameters from the item id), the k most similar
    to the original kept (batched, resumable; null-text inversions cached)."""
    input:
        requests=f"{S}/{{dataset}}/edits/requests.parquet",
        models=cvld_edit_models,
        config=job_config(cvld_edit_keys),
    output:
        f"{S}/{{dataset}}/edits/{{method}}/{{shard}}/shard.parquet",
    log:
        f"{S}/logs/{{dataset}}/edit_{{method}}_{{shard}}.log",
    benchmark:
        f"{S}/benchmarks/{{dataset}}/edit_{{method}}_{{shard}}.tsv"
    wildcard_constraints:
        study=CV,
        dataset="coco|celeba",
        method="ip2p|null_text",
    conda:
        CONDA_ENV
    threads: accel_threads("editor")
    resources:
        mem_mb=model_mem(24000, "editor", "image_encoder", tiny_mb=3000),
        runtime=minutes(1440),
        gpu=GPU,
        hpu=HPU,
    params:
        out_dir=lambda wildcards, output: Path(output[0]).parent,
    shell:
        "counterfactory cvld edit --config {input.config:q} --requests {input.requests:q} --method {wildcards.method}"
        " --shard {wildcards.shard} --out-dir {params.out_dir:q} --threads {threads} --no-progress > {log:q} 2>&1"


rule cvld_edit_merge:
    """A dataset's edit shard manifests of one method in one manifest: a training run reads one file (one DAG edge
    per run instead of one per run and shard)."""
    input:
        cvld_edit_shard_files,
    output:
        f"{S}/{{dataset}}/edits/{{method}}/edits.parquet",
    log:
        f"{S}/logs/{{dataset}}/edit_merge_{{method}}.log",
    wildcard_constraints:
        study=CV,
        dataset="coco|celeba",
        method="ip2p|null_text",
    conda:
        CONDA_ENV
    shell:
        "counterfactory cvld edit-merge --shards {input:q} --out {output:q} > {log:q} 2>&1"


rule cvld_run:
    """§4-5: one task / setting / variant / seed (classification: episode) trained (unless pretrained) and scored."""
    input:
        unpack(cvld_run_inputs),
        config=job_config(cvld_run_keys),
    output:
        f"{S}/runs/{{task}}/{{setting}}/{{variant}}/seed{{seed}}/metrics.csv",
    log:
        f"{S}/logs/runs/{{task}}_{{setting}}_{{variant}}_seed{{seed}}.log",
    benchmark:
        f"{S}/benchmarks/runs/{{task}}_{{setting}}_{{variant}}_seed{{seed}}.tsv"
    wildcard_constraints:
        study=CV,
        task="classification|retrieval|captioning",
        setting=r"[a-z0-9.-]+",
        variant=r"[A-Za-z0-9_.]+",
    conda:
        CONDA_ENV
    threads: cvld_run_threads
    resources:
        mem_mb=cvld_run_mem,
        runtime=minutes(2880),
        gpu=GPU,
        hpu=HPU,
    params:
        edits=lambda wildcards, input: " ".join(shlex.quote(p) for p in input.get("edits", [])),
        interventions=cvld_interventions_arg,
        out_dir=lambda wildcards, output: Path(output[0]).parent,
    shell:
        "counterfactory cvld run --config {input.config:q} --task {wildcards.task} --setting {wildcards.setting}"
        " --variant {wildcards.variant} --seed {wildcards.seed} --edits {params.edits} {params.interventions}"
        " --out-dir {params.out_dir:q} --no-progress > {log:q} 2>&1"


use rule train_collect as train_collect_cvld with:
    input:
        cvld_runs,
    output:
        f"{S}/runs.csv",
    log:
        f"{S}/logs/runs_table.log",
    wildcard_constraints:
        study=CV,


rule cvld_tables:
    """Tables 1-4 and Figures 4, 5, 9, 10 in the paper's layouts (mean ± std; t-tests against fine-tuning)."""
    input:
        runs=rules.train_collect_cvld.output,
        metrics=cvld_runs,
        config=job_config("data", "classification", "retrieval", "captioning", "seeds"),
    output:
        md=f"{S}/tables.md",
        html=report(
            f"{S}/tables.html",
            labels=result_label("tables.html"),
            category=study_title,
            subcategory=report_section("Tables"),
            caption="../report/cvld_tables.rst",
        ),
        tex=f"{S}/tables.tex",
        csv=f"{S}/tables.csv",
        summary=f"{S}/figures/summary.csv",
        figures=[
            report(
                f"{S}/figures/figure{n}.png",
                labels=result_label(f"figures/figure{n}.png"),
                category=study_title,
                subcategory=report_section("Figures"),
                caption="../report/cvld_tables.rst",
            )
            for n in (4, 5, 9, 10)
        ],
    log:
        f"{S}/logs/tables.log",
    wildcard_constraints:
        study=CV,
    conda:
        CONDA_ENV
    params:
        runs=lambda wildcards, input: " ".join(shlex.quote(str(Path(p).parent)) for p in input.metrics),
        figures=lambda wildcards, output: Path(output.summary).parent,
    shell:
        "counterfactory cvld tables --config {input.config:q} --runs-table {input.runs:q} --runs {params.runs}"
        " --out-md {output.md:q} --out-tex {output.tex:q} --out-csv {output.csv:q} --out-figures {params.figures:q}"
        " --out-html {output.html:q} > {log:q} 2>&1"


STUDY_TARGETS[CV] = lambda: [f"{CV_DIR}/tables.md", f"{CV_DIR}/coco/text/summary.csv"] + [
    f"{CV_DIR}/{dataset}/edits/{method}/edits.parquet"
    for dataset in ("coco", "celeba")
    for method in cvld_settings.settings(view(CV))["editing"]["methods"]
]
