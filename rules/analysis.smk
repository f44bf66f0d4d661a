# COCO-Counterfactuals appendix A.2: label frequency of class names among altered subjects vs accuracy change.


rule label_frequency:
    """Table 6 (long form) and the Pearson / Spearman correlation of label frequency and accuracy change."""
    input:
        captions=f"{RESULTS}/captions/counterfactual_captions.parquet",
        runs=f"{RESULTS}/training/runs.csv",
        pretrained=f"{RESULTS}/evaluation/classification.csv",
    output:
        table=report(f"{RESULTS}/training/label_frequency.csv", category="Training",
                     caption="../report/label_frequency.rst"),
        correlation=f"{RESULTS}/training/label_frequency_correlation.json",
    params:
        config=CONFIG_ARGS,
        role=config["evaluation"]["classification"]["models"][0],
    log:
        f"{RESULTS}/logs/training/label_frequency.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory analysis label-frequency {params.config} --captions {input.captions} --runs {input.runs}"
        " --pretrained {input.pretrained} --pretrained-role {params.role} --out {output.table}"
        " --correlation {output.correlation} > {log} 2>&1"


ANALYSIS_TARGETS = rules.label_frequency.output if TRAINING["eval"].get("classification") else []
