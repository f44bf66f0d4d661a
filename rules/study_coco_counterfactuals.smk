# COCO-Counterfactuals (Le et al., 2023): the steps only this study has, and its targets.
# Its shared stages (data, images, evaluate, training, report) are the stage rules with
# study=coco_counterfactuals; its settings are the `coco_counterfactuals:` config section.
import shlex

from counterfactory.studies import coco_counterfactuals as coco_cf

CCF = "coco_counterfactuals"
CCF_DIR = f"{RESULTS}/{CCF}"


rule captions_edit:
    """§3.1 / B.1.1: mask nouns, MLM fills, POS / similarity-band / perplexity filters for one shard."""
    input:
        table=f"{S}/data/captions.parquet",
        nltk=config["nltk"]["data_dir"],
        models=model_inputs("mlm", "lm", "sentence"),
        config=job_config("captions", "nltk", "models.mlm", "models.lm", "models.sentence", *DEVICE_KEYS),
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
    shell:
        "counterfactory captions edit --config {input.config:q} --captions {input.table:q} --shard {wildcards.shard}"
        " --out {output.accepted:q} --out-rejected {output.rejected:q} --out-summary {output.summary:q} > {log:q} 2>&1"


rule captions_merge:
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


rule analysis_label_frequency:
    """Appendix A.2: Table 6 (long form) and the correlation of label frequency and accuracy change; A.3.2: the
    human-taxonomy count of the released pairs."""
    input:
        pairs=f"{S}/images/selected_pairs.parquet",
        captions=f"{S}/captions/counterfactual_captions.parquet",
        runs=f"{S}/training/runs.csv",
        pretrained=f"{S}/evaluation/classification.csv",
        datasets=classification_inputs,
        config=job_config("training.eval", "training.baseline", "evaluation.classification.datasets"),
    output:
        table=report(
            f"{S}/training/label_frequency.csv",
            labels=result_label("training/label_frequency.csv"),
            category=study_title,
            subcategory=report_section("Training"),
            caption="../report/label_frequency.rst",
        ),
        correlation=f"{S}/training/label_frequency_correlation.json",
        md=f"{S}/training/table6.md",
        html=report(
            f"{S}/training/table6.html",
            labels=result_label("training/table6.html"),
            category=study_title,
            subcategory=report_section("Training"),
            caption="../report/label_frequency.rst",
        ),
        human_taxonomy=report(
            f"{S}/training/human_taxonomy.csv",
            labels=result_label("training/human_taxonomy.csv"),
            category=study_title,
            subcategory=report_section("Training"),
            caption="../report/human_taxonomy.rst",
        ),
    log:
        f"{S}/logs/training/label_frequency.log",
    wildcard_constraints:
        study=CCF,
    conda:
        CONDA_ENV
    params:
        role=lambda wildcards: view(wildcards.study)["evaluation"]["classification"]["models"][0],
    shell:
        "counterfactory analysis label-frequency --config {input.config:q} --pairs {input.pairs:q} --captions {input.captions:q}"
        " --runs {input.runs:q}"
        " --pretrained {input.pretrained:q} --pretrained-role {params.role} --out {output.table:q}"
        " --correlation {output.correlation:q} --out-md {output.md:q} --out-html {output.html:q}"
        " --human-taxonomy {output.human_taxonomy:q} > {log:q} 2>&1"


# Appendix A.1 (Table 5): the withheld in-domain COCO-CFs test set. Every model of in_domain.models (CLIP,
# BridgeTower, FLAVA) is fine-tuned on the 56 % / 14 % split per mixture and seed and evaluated on the 30 % test
# pairs with its contrastive head; its pre-trained row is the same evaluation without training (one run).
IN_DOMAIN_RUN_KEYS = (
    *(k for k in TRAIN_RUN_KEYS if k not in ("training.eval", "evaluation.classification", "models.clip_train")),
    "models.{model}",
    "in_domain.recipes",
)


rule train_in_domain_split:
    """A.1: pairs split 56 / 14 / 30 % train / dev / test by pair; MS-COCO and COCO-CFs manifests of train+dev."""
    input:
        pairs=f"{S}/images/selected_pairs.parquet",
        captions=f"{S}/data/captions.parquet",
        images=coco_images,
        config=job_config("in_domain", "data"),
    output:
        split=f"{S}/in_domain/split.parquet",
        test=f"{S}/in_domain/test_pairs.parquet",
        summary=f"{S}/in_domain/summary.csv",
        manifests=directory(f"{S}/in_domain/manifests"),
    log:
        f"{S}/logs/in_domain/split.log",
    wildcard_constraints:
        study=CCF,
    conda:
        CONDA_ENV
    params:
        out_dir=lambda wildcards, output: Path(output.split).parent,
    shell:
        "counterfactory train in-domain-split --config {input.config:q} --pairs {input.pairs:q} --captions {input.captions:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


use rule train_run as train_run_in_domain with:
    input:
        manifests=rules.train_in_domain_split.output.manifests,
        test=rules.train_in_domain_split.output.test,
        models=model_inputs("{model}"),
        config=job_config(*IN_DOMAIN_RUN_KEYS),
    output:
        metrics=f"{S}/in_domain/runs/{{model}}/{{mixture}}/seed{{seed}}/metrics.csv",
        history=f"{S}/in_domain/runs/{{model}}/{{mixture}}/seed{{seed}}/history.csv",
    log:
        f"{S}/logs/in_domain/{{model}}_{{mixture}}_seed{{seed}}.log",
    benchmark:
        f"{S}/benchmarks/in_domain/{{model}}_{{mixture}}_seed{{seed}}.tsv"
    wildcard_constraints:
        study=CCF,
        mixture="pretrained|mscoco|coco_cfs",
        model=r"[A-Za-z0-9_]+",
    resources:
        mem_mb=model_mem_of(40000, tiny_mb=3000),  # BridgeTower-large with AdamW states at batch 128
        runtime=per_study(lambda study: 80 + train_minutes(study)),
        gpu=GPU,
        hpu=HPU,
    params:
        data_seed=lambda wildcards: seeds(wildcards)[int(wildcards.seed)],
        out_dir=lambda wildcards, output: Path(output.metrics).parent,
        extra=in_domain_run_args,


use rule train_collect as train_collect_in_domain with:
    input:
        in_domain_runs,
    output:
        f"{S}/in_domain/runs.csv",
    log:
        f"{S}/logs/in_domain/runs_table.log",
    wildcard_constraints:
        study=CCF,


use rule stats_summarize as stats_summarize_in_domain with:
    input:
        rules.train_collect_in_domain.output,
    output:
        f"{S}/in_domain/stats.csv",
    log:
        f"{S}/logs/in_domain/stats.log",
    wildcard_constraints:
        study=CCF,
    params:
        baseline=lambda wildcards: view(wildcards.study)["in_domain"]["mixtures"][0],
        test=lambda wildcards: training(wildcards)["stats"]["test"],
        alpha=lambda wildcards: training(wildcards)["stats"]["alpha"],


rule train_in_domain_table:
    """Table 5 layout: per model, the pre-trained row and the MS-COCO / COCO-CFs fine-tuned rows (mean ± std)."""
    input:
        rules.stats_summarize_in_domain.output,
    output:
        md=f"{S}/in_domain/table.md",
        html=report(
            f"{S}/in_domain/table.html",
            labels=result_label("in_domain/table.html"),
            category=study_title,
            subcategory=report_section("Training"),
            caption="../report/in_domain.rst",
        ),
        tex=f"{S}/in_domain/table.tex",
        csv=f"{S}/in_domain/table.csv",
    log:
        f"{S}/logs/in_domain/table.log",
    wildcard_constraints:
        study=CCF,
    conda:
        CONDA_ENV
    params:
        models=lambda wildcards: ",".join(view(wildcards.study)["in_domain"]["models"]),
        mixtures=lambda wildcards: ",".join(view(wildcards.study)["in_domain"]["mixtures"]),
        labels=display_labels,
    shell:
        "counterfactory train in-domain-table --summary {input:q} --models {params.models} {params.labels.flags}"
        " --mixtures {params.mixtures} --out-md {output.md:q} --out-tex {output.tex:q} --out-csv {output.csv:q}"
        " --out-html {output.html:q} > {log:q} 2>&1"


# the A.1 test pairs, named in the zero-shot retrieval table as Table 5 names them
STUDY_ITR_SUBSETS[CCF] = lambda: (
    {"withheld COCO-CFs test": f"{CCF_DIR}/in_domain/test_pairs.parquet"} if view(CCF)["in_domain"]["enabled"] else {}
)
STUDY_TARGETS[CCF] = lambda: coco_cf.targets(view(CCF), CCF_DIR)
