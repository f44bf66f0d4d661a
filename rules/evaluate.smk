# COCO-Counterfactuals as a test set (§4.2, appendix A.6) and zero-shot classification (§5.2, Table 4).
# One job per model role (per model and dataset for classification), then one job per table/plot.
# Settings: `evaluation:` in the config; models: roles under `models:`.

from counterfactory.data.classification import dataset_input_files

EVAL = config.get("evaluation", {})
EVAL_DIR = f"{RESULTS}/evaluation"
EVAL_PAIRS = f"{RESULTS}/images/selected_pairs.parquet"
EVAL_CAPTIONS = f"{RESULTS}/data/captions.parquet"
ITR_ROLES = list(EVAL.get("itr", {}).get("models", []))
ITM_ROLES = list(EVAL.get("itm", {}).get("models", []))
CLS_ROLES = list(EVAL.get("classification", {}).get("models", []))
CLS_DATASETS = EVAL.get("classification", {}).get("datasets", {})
_SHORTLIST_ROLE = (EVAL.get("itr", {}).get("shortlist") or {}).get("role")
ITR_SHORTLIST = [_SHORTLIST_ROLE] if _SHORTLIST_ROLE else []


rule eval_itr:
    """Zero-shot retrieval R@1/5/10 of one model on the matched MS-COCO subset, COCO-CFs and subsets."""
    input:
        pairs=EVAL_PAIRS,
        captions=EVAL_CAPTIONS,
        models=lambda wildcards: wf.tiny_model_inputs(config, wildcards.role, *ITR_SHORTLIST),
    wildcard_constraints:
        role=r"[A-Za-z0-9_]+",
    output:
        f"{EVAL_DIR}/itr/{{role}}.csv",
    log:
        f"{RESULTS}/logs/evaluation/itr_{{role}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluation/itr_{{role}}.tsv"
    threads: accel_threads(*ITR_ROLES)
    resources:
        mem_mb=model_mem(16000, *ITR_ROLES),
        runtime=minutes(30, 0.004 * CPU_SLOWDOWN, N_CAPTIONS),
        gpu=GPU,
        hpu=HPU,
    params:
        config=CONFIG_ARGS,
    conda:
        CONDA_ENV
    shell:
        "counterfactory evaluate itr {params.config} --role {wildcards.role} --pairs {input.pairs}"
        " --captions {input.captions} --out {output} > {log} 2>&1"


rule eval_itr_table:
    """Table 2 / 13 layout: R@K per model and dataset with the relative change vs MS-COCO."""
    input:
        expand(f"{EVAL_DIR}/itr/{{role}}.csv", role=ITR_ROLES),
    output:
        csv=report(f"{EVAL_DIR}/itr_table.csv", caption="../report/evaluation_itr.rst",
                   category="Evaluation", subcategory="Zero-shot image-text retrieval"),
        md=report(f"{EVAL_DIR}/itr_table.md", caption="../report/evaluation_itr.rst",
                  category="Evaluation", subcategory="Zero-shot image-text retrieval"),
    log:
        f"{RESULTS}/logs/evaluation/itr_table.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory evaluate itr-table --inputs {input} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule eval_itm:
    """Per-pair ITM score differences IR_r, IR_c, TR_r, TR_c of one model."""
    input:
        pairs=EVAL_PAIRS,
        captions=EVAL_CAPTIONS,
        models=lambda wildcards: wf.tiny_model_inputs(config, wildcards.role),
    wildcard_constraints:
        role=r"[A-Za-z0-9_]+",
    output:
        f"{EVAL_DIR}/itm/{{role}}.parquet",
    log:
        f"{RESULTS}/logs/evaluation/itm_{{role}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluation/itm_{{role}}.tsv"
    threads: accel_threads(*ITM_ROLES)
    resources:
        mem_mb=model_mem(12000, *ITM_ROLES),
        runtime=minutes(30, 0.004 * CPU_SLOWDOWN, N_CAPTIONS),
        gpu=GPU,
        hpu=HPU,
    params:
        config=CONFIG_ARGS,
    conda:
        CONDA_ENV
    shell:
        "counterfactory evaluate itm {params.config} --role {wildcards.role} --pairs {input.pairs}"
        " --captions {input.captions} --out {output} > {log} 2>&1"


rule eval_itm_summary:
    """Figure 3: distributions of the ITM score differences, one panel per model, plus a summary table."""
    input:
        expand(f"{EVAL_DIR}/itm/{{role}}.parquet", role=ITM_ROLES),
    output:
        csv=report(f"{EVAL_DIR}/itm_differences.csv", caption="../report/evaluation_itm.rst",
                   category="Evaluation", subcategory="ITM score differences"),
        md=report(f"{EVAL_DIR}/itm_differences.md", caption="../report/evaluation_itm.rst",
                  category="Evaluation", subcategory="ITM score differences"),
        png=report(f"{EVAL_DIR}/itm_differences.png", caption="../report/evaluation_itm.rst",
                   category="Evaluation", subcategory="ITM score differences"),
    params:
        bins=EVAL.get("itm", {}).get("bins", 40),
    log:
        f"{RESULTS}/logs/evaluation/itm_summary.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory evaluate itm-summary --inputs {input} --bins {params.bins} --out-csv {output.csv}"
        " --out-md {output.md} --out-png {output.png} > {log} 2>&1"


rule eval_classify:
    """Zero-shot top-1/top-5 accuracy of one model on one classification dataset."""
    input:
        data=lambda wildcards: dataset_input_files(CLS_DATASETS[wildcards.dataset], wildcards.dataset),
        models=lambda wildcards: wf.tiny_model_inputs(config, wildcards.role),
    wildcard_constraints:
        role=r"[A-Za-z0-9_]+",
        dataset=r"[A-Za-z0-9_.-]+",
    output:
        f"{EVAL_DIR}/classification/{{role}}/{{dataset}}.json",
    log:
        f"{RESULTS}/logs/evaluation/classify_{{role}}_{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluation/classify_{{role}}_{{dataset}}.tsv"
    threads: accel_threads(*CLS_ROLES)
    resources:
        mem_mb=model_mem(8000, *CLS_ROLES),
        runtime=minutes(20, 2 * CPU_SLOWDOWN, 1),
        gpu=GPU,
        hpu=HPU,
    params:
        config=CONFIG_ARGS,
    conda:
        CONDA_ENV
    shell:
        "counterfactory evaluate classify {params.config} --role {wildcards.role} --dataset {wildcards.dataset}"
        " --out {output} > {log} 2>&1"


rule eval_classify_table:
    """Table 4 layout: zero-shot accuracy per model and dataset, with the mean over datasets."""
    input:
        expand(f"{EVAL_DIR}/classification/{{role}}/{{dataset}}.json", role=CLS_ROLES, dataset=list(CLS_DATASETS)),
    output:
        csv=report(f"{EVAL_DIR}/classification.csv", caption="../report/evaluation_classification.rst",
                   category="Evaluation", subcategory="Zero-shot classification"),
        md=report(f"{EVAL_DIR}/classification.md", caption="../report/evaluation_classification.rst",
                  category="Evaluation", subcategory="Zero-shot classification"),
        png=report(f"{EVAL_DIR}/classification.png", caption="../report/evaluation_classification.rst",
                   category="Evaluation", subcategory="Zero-shot classification"),
    params:
        order=",".join(CLS_DATASETS),
    log:
        f"{RESULTS}/logs/evaluation/classification_table.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory evaluate classify-table --inputs {input} --dataset-order {params.order}"
        " --out-csv {output.csv} --out-md {output.md} --out-png {output.png} > {log} 2>&1"


EVAL_TARGETS = (
    (list(rules.eval_itr_table.output) if ITR_ROLES else [])
    + (list(rules.eval_itm_summary.output) if ITM_ROLES else [])
    + (list(rules.eval_classify_table.output) if CLS_ROLES and CLS_DATASETS else [])
)
