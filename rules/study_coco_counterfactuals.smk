# COCO-Counterfactuals (Le et al., 2023): the steps only this study has, and its targets.
# Its shared stages (data, images, evaluate, training, report) are the stage rules with
# study=coco_counterfactuals; its settings are the `coco_counterfactuals:` config section.
from counterfactory.studies import coco_counterfactuals as coco_cf

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
    conda:
        CONDA_ENV
    threads: accel_threads("mlm", "lm", "sentence")
    resources:
        mem_mb=model_mem(8000, "mlm", "lm", "sentence"),
        runtime=per_study(lambda study: 10 + 0.05 * CPU_SLOWDOWN * shard_items(study, "captions")),
        gpu=GPU,
        hpu=HPU,
    params:
        config=job_config("captions", "nltk", "models.mlm", "models.lm", "models.sentence", *DEVICE_KEYS),
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


rule label_frequency:
    """Appendix A.2: Table 6 (long form) and the correlation of label frequency and accuracy change."""
    input:
        pairs=f"{S}/images/selected_pairs.parquet",
        captions=f"{S}/captions/counterfactual_captions.parquet",
        runs=f"{S}/training/runs.csv",
        pretrained=f"{S}/evaluation/classification.csv",
        datasets=classification_inputs,
    output:
        table=report(f"{S}/training/label_frequency.csv", category="Training", caption="../report/label_frequency.rst"),
        correlation=f"{S}/training/label_frequency_correlation.json",
    log:
        f"{S}/logs/training/label_frequency.log",
    wildcard_constraints:
        study=CCF,
    conda:
        CONDA_ENV
    params:
        config=job_config("training.eval", "training.baseline", "evaluation.classification.datasets"),
        role=lambda wildcards: view(wildcards.study)["evaluation"]["classification"]["models"][0],
    shell:
        "counterfactory analysis label-frequency {params.config} --pairs {input.pairs:q} --captions {input.captions:q}"
        " --runs {input.runs:q}"
        " --pretrained {input.pretrained:q} --pretrained-role {params.role} --out {output.table:q}"
        " --correlation {output.correlation:q} > {log:q} 2>&1"


STUDY_TARGETS[CCF] = lambda: coco_cf.targets(view(CCF), CCF_DIR)
