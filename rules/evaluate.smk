# Evaluation stage, shared by every study: zero-shot retrieval and ITM score differences on a study's
# counterfactual pairs (COCO-Counterfactuals §4.2, A.6) and zero-shot classification (§5.2, Table 4).
# One job per model role (per model and dataset for classification), then one job per table/plot.
# Settings: `<study>.evaluation:` in the config; models: roles under `models:`.


EVAL_COMMON_KEYS = ("evaluation.batch_size", "evaluation.scorers", "evaluation.precision", *DEVICE_KEYS)


rule evaluate_itr:
    """Zero-shot retrieval R@1/5/10 of one model on the matched MS-COCO subset, COCO-CFs and subsets."""
    input:
        pairs=f"{S}/images/selected_pairs.parquet",
        captions=f"{S}/data/captions.parquet",
        images=coco_images,
        subsets=lambda wildcards: list(eval_section(wildcards, "itr").get("subsets", {}).values()),
        study_subsets=lambda wildcards: list(itr_subsets(wildcards).values()),
        models=lambda wildcards: wf.local_model_inputs(config, wildcards.role, *shortlist_roles(wildcards)),
        config=job_config(
            "evaluation.itr",
            "data",
            "models.{role}",
            *EVAL_COMMON_KEYS,
            lambda wildcards: [f"models.{r}" for r in shortlist_roles(wildcards)],
        ),
    output:
        f"{S}/evaluation/itr/{{role}}.csv",
    log:
        f"{S}/logs/evaluation/itr_{{role}}.log",
    benchmark:
        f"{S}/benchmarks/evaluation/itr_{{role}}.tsv"
    conda:
        CONDA_ENV
    threads: accel_threads("clip_eval")
    resources:
        mem_mb=lambda wildcards, attempt: model_mem(16000, wildcards.role)(wildcards, attempt),
        runtime=per_study(lambda study: 30 + 0.004 * CPU_SLOWDOWN * n_captions(study)),
        gpu=GPU,
        hpu=HPU,
    params:
        subsets=itr_subset_args,
    shell:
        "counterfactory evaluate itr --config {input.config:q} --role {wildcards.role} --pairs {input.pairs:q}"
        " --captions {input.captions:q} {params.subsets} --out {output:q} > {log:q} 2>&1"


rule evaluate_itr_table:
    """Table 2 / 13 layout: R@K per model and dataset with the relative change vs MS-COCO."""
    input:
        lambda wildcards: expand(
            f"{S}/evaluation/itr/{{role}}.csv", study=wildcards.study, role=eval_roles("itr")(wildcards)
        ),
    output:
        csv=report(
            f"{S}/evaluation/itr_table.csv",
            labels=result_label("evaluation/itr_table.csv"),
            caption="../report/evaluation_itr.rst",
            category=study_title,
            subcategory=report_section("Zero-shot image-text retrieval"),
        ),
        md=f"{S}/evaluation/itr_table.md",
        html=report(
            f"{S}/evaluation/itr_table.html",
            labels=result_label("evaluation/itr_table.html"),
            caption="../report/evaluation_itr.rst",
            category=study_title,
            subcategory=report_section("Zero-shot image-text retrieval"),
        ),
    log:
        f"{S}/logs/evaluation/itr_table.log",
    conda:
        CONDA_ENV
    params:
        labels=display_labels,  # display names are table-only: a rename reruns the tables, not the evaluations
    shell:
        "counterfactory evaluate itr-table --inputs {input:q} --out-csv {output.csv:q} --out-md {output.md:q}"
        " --out-html {output.html:q} {params.labels.flags} > {log:q} 2>&1"


rule evaluate_itm:
    """Per-pair ITM score differences IR_r, IR_c, TR_r, TR_c of one model."""
    input:
        pairs=f"{S}/images/selected_pairs.parquet",
        captions=f"{S}/data/captions.parquet",
        images=coco_images,
        models=model_inputs("{role}"),
        config=job_config(
            "evaluation.itm.head",
            "evaluation.itm.random_pool",
            "evaluation.itm.seed",
            "data",
            "models.{role}",
            *EVAL_COMMON_KEYS,
        ),
    output:
        f"{S}/evaluation/itm/{{role}}.parquet",
    log:
        f"{S}/logs/evaluation/itm_{{role}}.log",
    benchmark:
        f"{S}/benchmarks/evaluation/itm_{{role}}.tsv"
    conda:
        CONDA_ENV
    threads: accel_threads("clip_eval")
    resources:
        mem_mb=lambda wildcards, attempt: model_mem(12000, wildcards.role)(wildcards, attempt),
        runtime=per_study(lambda study: 30 + 0.004 * CPU_SLOWDOWN * n_captions(study)),
        gpu=GPU,
        hpu=HPU,
    shell:
        "counterfactory evaluate itm --config {input.config:q} --role {wildcards.role} --pairs {input.pairs:q}"
        " --captions {input.captions:q} --out {output:q} > {log:q} 2>&1"


rule evaluate_itm_summary:
    """Figure 3: distributions of the ITM score differences, one panel per model, plus a summary table."""
    input:
        lambda wildcards: expand(
            f"{S}/evaluation/itm/{{role}}.parquet", study=wildcards.study, role=eval_roles("itm")(wildcards)
        ),
    output:
        csv=report(
            f"{S}/evaluation/itm_differences.csv",
            labels=result_label("evaluation/itm_differences.csv"),
            caption="../report/evaluation_itm.rst",
            category=study_title,
            subcategory=report_section("ITM score differences"),
        ),
        md=f"{S}/evaluation/itm_differences.md",
        html=report(
            f"{S}/evaluation/itm_differences.html",
            labels=result_label("evaluation/itm_differences.html"),
            caption="../report/evaluation_itm.rst",
            category=study_title,
            subcategory=report_section("ITM score differences"),
        ),
        png=report(
            f"{S}/evaluation/itm_differences.png",
            labels=result_label("evaluation/itm_differences.png"),
            caption="../report/evaluation_itm.rst",
            category=study_title,
            subcategory=report_section("ITM score differences"),
        ),
    log:
        f"{S}/logs/evaluation/itm_summary.log",
    conda:
        CONDA_ENV
    params:
        bins=lambda wildcards: eval_section(wildcards, "itm")["bins"],
        labels=display_labels,
    shell:
        "counterfactory evaluate itm-summary --inputs {input:q} --bins {params.bins} --out-csv {output.csv:q}"
        " --out-md {output.md:q} --out-html {output.html:q} --out-png {output.png:q} {params.labels.flags}"
        " > {log:q} 2>&1"


rule evaluate_classify:
    """Zero-shot top-1/top-5 accuracy of one model on one classification dataset."""
    input:
        data=classification_dataset_files,
        models=model_inputs("{role}"),
        config=job_config(
            "evaluation.classification.templates",
            "evaluation.classification.topk",
            "evaluation.classification.max_per_class",
            "evaluation.classification.datasets.{dataset}",
            "models.{role}",
            *EVAL_COMMON_KEYS,
        ),
    output:
        f"{S}/evaluation/classification/{{role}}/{{dataset}}.json",
    log:
        f"{S}/logs/evaluation/classify_{{role}}_{{dataset}}.log",
    benchmark:
        f"{S}/benchmarks/evaluation/classify_{{role}}_{{dataset}}.tsv"
    conda:
        CONDA_ENV
    threads: accel_threads("clip_eval")
    resources:
        mem_mb=lambda wildcards, attempt: model_mem(8000, wildcards.role)(wildcards, attempt),
        runtime=minutes(20, 2 * CPU_SLOWDOWN, 1),
        gpu=GPU,
        hpu=HPU,
    shell:
        "counterfactory evaluate classify --config {input.config:q} --role {wildcards.role} --dataset {wildcards.dataset}"
        " --out {output:q} > {log:q} 2>&1"


rule evaluate_classify_table:
    """Table 4 layout: zero-shot accuracy per model and dataset, with the mean over datasets."""
    input:
        lambda wildcards: expand(
            f"{S}/evaluation/classification/{{role}}/{{dataset}}.json",
            study=wildcards.study,
            role=eval_roles("classification")(wildcards),
            dataset=list(eval_section(wildcards, "classification")["datasets"]),
        ),
    output:
        csv=report(
            f"{S}/evaluation/classification.csv",
            labels=result_label("evaluation/classification.csv"),
            caption="../report/evaluation_classification.rst",
            category=study_title,
            subcategory=report_section("Zero-shot classification"),
        ),
        md=f"{S}/evaluation/classification.md",
        html=report(
            f"{S}/evaluation/classification.html",
            labels=result_label("evaluation/classification.html"),
            caption="../report/evaluation_classification.rst",
            category=study_title,
            subcategory=report_section("Zero-shot classification"),
        ),
        png=report(
            f"{S}/evaluation/classification.png",
            labels=result_label("evaluation/classification.png"),
            caption="../report/evaluation_classification.rst",
            category=study_title,
            subcategory=report_section("Zero-shot classification"),
        ),
    log:
        f"{S}/logs/evaluation/classification_table.log",
    conda:
        CONDA_ENV
    params:
        order=lambda wildcards: ",".join(eval_section(wildcards, "classification")["datasets"]),
        labels=display_labels,
    shell:
        "counterfactory evaluate classify-table --inputs {input:q} --dataset-order {params.order}"
        " --out-csv {output.csv:q} --out-md {output.md:q} --out-html {output.html:q} --out-png {output.png:q}"
        " {params.labels.flags} > {log:q} 2>&1"
