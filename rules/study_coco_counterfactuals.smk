# COCO-Counterfactuals (Le et al., 2023): the steps only this study has, and its targets.
# Its shared stages (data, images, evaluate, training, report) are the stage rules with
# study=coco_counterfactuals; its settings are the `coco_counterfactuals:` config section.
from counterfactory.studies import coco_counterfactuals as coco_cf
from counterfactory.data.classification import dataset_input_files

CCF = "coco_counterfactuals"
CCF_DIR = f"{RESULTS}/{CCF}"


rule caption_shard:
    """§3.1 / B.1.1: mask nouns, MLM fills, POS / similarity-band / perplexity filters for one shard."""
    input:
        table=f"{S}/data/captions.parquet",
        nltk=config["nltk"]["data_dir"],
        models=model_inputs("mlm", "lm", "sentence"),
    output:
        accepted=f"{S}/captions/shards/{{shard}}.parquet",
        rejected=f"{S}/captions/rejected/{{shard}}.parquet",
        summary=f"{S}/captions/summary/{{shard}}.json",
    log:
        f"{S}/logs/captions/{{shard}}.log",
    benchmark:
        f"{S}/benchmarks/captions/{{shard}}.tsv"
    threads: accel_threads("mlm", "lm", "sentence")
    resources:
        mem_mb=model_mem(8000, "mlm", "lm", "sentence"),
        runtime=per_study(lambda study: 10 + 0.05 * CPU_SLOWDOWN * shard_items(study, "captions")),
        gpu=GPU,
        hpu=HPU,
    params:
        config=job_config("captions", "nltk", "models.mlm", "models.lm", "models.sentence", *DEVICE_KEYS),
    conda:
        CONDA_ENV
    shell:
        "counterfactory captions edit {params.config} --captions {input.table:q} --shard {wildcards.shard}"
        " --out {output.accepted:q} --rejected {output.rejected:q} --summary {output.summary:q} > {log:q} 2>&1"


rule caption_merge:
    """All accepted counterfactual captions (shards made under one config), plus the release JSONL."""
    input:
        shards=per_shard(f"{S}/captions/shards/{{shard}}.parquet", "captions"),
        summaries=per_shard(f"{S}/captions/summary/{{shard}}.json", "captions"),
    output:
        parquet=f"{S}/captions/counterfactual_captions.parquet",
        jsonl=f"{S}/captions/coco_counterfactuals_captions.jsonl",
    log:
        f"{S}/logs/caption_merge.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory captions merge {input.shards:q} --summaries {input.summaries:q} --out {output.parquet:q}"
        " --jsonl {output.jsonl:q} > {log:q} 2>&1"


def classification_inputs(wildcards):
    """Files of the classification datasets the fine-tuned models are evaluated on (training.eval)."""
    v = view(wildcards.study)
    datasets = v["evaluation"]["classification"]["datasets"]
    out = []
    for name in v["training"]["eval"].get("classification") or []:
        if name not in datasets:
            raise WorkflowError(f"{wildcards.study}.training.eval.classification names '{name}', which is not in "
                                f"{wildcards.study}.evaluation.classification.datasets. Fix: add it there or remove it")
        out += dataset_input_files(datasets[name], name)
    return out


rule label_frequency:
    """Appendix A.2: Table 6 (long form) and the correlation of label frequency and accuracy change."""
    input:
        captions=f"{S}/captions/counterfactual_captions.parquet",
        runs=f"{S}/training/runs.csv",
        pretrained=f"{S}/evaluation/classification.csv",
        datasets=classification_inputs,
    output:
        table=report(f"{S}/training/label_frequency.csv", category="Training",
                     caption="../report/label_frequency.rst"),
        correlation=f"{S}/training/label_frequency_correlation.json",
    params:
        config=job_config("training.eval", "training.baseline", "evaluation.classification.datasets"),
        role=lambda wildcards: view(wildcards.study)["evaluation"]["classification"]["models"][0],
    wildcard_constraints:
        study=CCF,
    log:
        f"{S}/logs/training/label_frequency.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory analysis label-frequency {params.config} --captions {input.captions:q} --runs {input.runs:q}"
        " --pretrained {input.pretrained:q} --pretrained-role {params.role} --out {output.table:q}"
        " --correlation {output.correlation:q} > {log:q} 2>&1"


def coco_cf_targets():
    """Every final file of the study: captions, image pairs, evaluations, training tables, A.2, report."""
    v = view(CCF)
    ev, tr = v["evaluation"], v["training"]
    out = [
        f"{CCF_DIR}/captions/counterfactual_captions.parquet",
        f"{CCF_DIR}/images/selected_pairs.parquet",
        f"{CCF_DIR}/report/pair_grid.png",
        f"{CCF_DIR}/report/caption_examples.csv",
    ]
    if ev["itr"]["models"]:
        out += [f"{CCF_DIR}/evaluation/itr_table.md"]
    if ev["itm"]["models"]:
        out += [f"{CCF_DIR}/evaluation/itm_differences.md"]
    if ev["classification"]["models"] and ev["classification"]["datasets"]:
        out += [f"{CCF_DIR}/evaluation/classification.md"]
    out += [f"{CCF_DIR}/training/summary.csv", f"{CCF_DIR}/training/curves.png"]
    out += [f"{CCF_DIR}/training/tables/{t}.md" for t in coco_cf.training_tables(tr)]
    if tr["eval"].get("classification"):
        out += [f"{CCF_DIR}/training/label_frequency.csv"]
    return out


STUDY_TARGETS[CCF] = coco_cf_targets
