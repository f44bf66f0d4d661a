# COCO-Counterfactuals §5 / B.3: mixtures, CLIP fine-tuning over seeds, t-tests, paper tables.

TRAIN_DIR = f"{RESULTS}/training"
TRAINING = config["training"]
MIXTURES = list(TRAINING["mixtures"])
SEEDS = {s: d for s, d in wf.seed_pairs(TRAINING)}


rule train_mixtures:
    """B.3.1 mixture manifests (pairs kept together, reproducible 80/20 split)."""
    input:
        pairs=f"{RESULTS}/images/selected_pairs.parquet",
        captions=f"{RESULTS}/data/captions.parquet",
    output:
        manifests=expand(f"{TRAIN_DIR}/mixtures/{{mixture}}.parquet", mixture=MIXTURES),
        summary=f"{TRAIN_DIR}/mixtures/summary.csv",
    params:
        config=CONFIG_ARGS,
        out_dir=lambda wildcards, output: Path(output.summary).parent,
    log:
        f"{RESULTS}/logs/training/mixtures.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory train mixtures {params.config} --pairs {input.pairs} --captions {input.captions}"
        " --out-dir {params.out_dir} > {log} 2>&1"


rule train_run:
    """One fine-tuning run: (mixture, seed); best checkpoint by validation loss; retrieval + classification."""
    input:
        manifest=f"{TRAIN_DIR}/mixtures/{{mixture}}.parquet",
        models=wf.tiny_model_inputs(config, "clip_train"),
    output:
        metrics=f"{TRAIN_DIR}/runs/{{mixture}}/seed{{seed}}/metrics.csv",
        history=f"{TRAIN_DIR}/runs/{{mixture}}/seed{{seed}}/history.csv",
    params:
        config=CONFIG_ARGS,
        data_seed=lambda wildcards: SEEDS[int(wildcards.seed)],
        out_dir=lambda wildcards, output: Path(output.metrics).parent,
    wildcard_constraints:
        seed=r"\d+",
    threads: accel_threads("clip_train")
    resources:
        mem_mb=model_mem(16000, "clip_train", tiny_mb=3000),
        runtime=minutes(80 + TRAIN_MINUTES),
        gpu=GPU,
        hpu=HPU,
    log:
        f"{RESULTS}/logs/training/{{mixture}}_seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/training/{{mixture}}_seed{{seed}}.tsv"
    conda:
        CONDA_ENV
    shell:
        "counterfactory train run {params.config} --manifest {input.manifest} --mixture {wildcards.mixture}"
        " --seed {wildcards.seed} --data-seed {params.data_seed} --out-dir {params.out_dir} --no-progress > {log} 2>&1"


rule runs_table:
    """Tidy runs table: experiment, mixture, seed, data_seed, metric, value."""
    input:
        expand(f"{TRAIN_DIR}/runs/{{mixture}}/seed{{seed}}/metrics.csv", mixture=MIXTURES, seed=list(SEEDS)),
    output:
        report(f"{TRAIN_DIR}/runs.csv", category="Training", caption="../report/runs.rst"),
    log:
        f"{RESULTS}/logs/training/runs_table.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory train collect {input} --out {output} > {log} 2>&1"


rule train_stats:
    """Mean, std, n and the one-tailed p-value of every mixture against the baseline, per metric."""
    input:
        rules.runs_table.output,
    output:
        f"{TRAIN_DIR}/summary.csv",
    params:
        baseline=TRAINING["baseline"],
        test=TRAINING["stats"]["test"],
        alpha=TRAINING["stats"]["alpha"],
    log:
        f"{RESULTS}/logs/training/stats.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory stats summarize --runs {input} --baseline {params.baseline} --test {params.test}"
        " --alpha {params.alpha} --out {output} > {log} 2>&1"


rule train_tables:
    """COCO-CF Table 3 (retrieval) and Table 4 (classification) layouts: Markdown, LaTeX, CSV."""
    input:
        summary=rules.train_stats.output,
        info=rules.train_mixtures.output.summary,
    output:
        md=report(f"{TRAIN_DIR}/tables/{{table}}.md", category="Training", caption="../report/tables.rst"),
        tex=f"{TRAIN_DIR}/tables/{{table}}.tex",
        csv=f"{TRAIN_DIR}/tables/{{table}}.csv",
    params:
        metrics=lambda wildcards: wf.table_metrics(TRAINING, wildcards.table),
        order=",".join(MIXTURES),
    log:
        f"{RESULTS}/logs/training/table_{{table}}.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory stats table --summary {input.summary} --mixture-info {input.info} --metrics {params.metrics}"
        " --mixture-order {params.order} --out-md {output.md} --out-tex {output.tex} --out-csv {output.csv}"
        " > {log} 2>&1"


rule train_curves:
    """Training and validation loss of every run."""
    input:
        expand(f"{TRAIN_DIR}/runs/{{mixture}}/seed{{seed}}/history.csv", mixture=MIXTURES, seed=list(SEEDS)),
    output:
        report(f"{TRAIN_DIR}/curves.png", category="Training", caption="../report/curves.rst"),
    log:
        f"{RESULTS}/logs/training/curves.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory train plot-curves {input} --out {output} > {log} 2>&1"


TRAINING_TARGETS = [
    f"{TRAIN_DIR}/summary.csv",
    f"{TRAIN_DIR}/curves.png",
    *expand(f"{TRAIN_DIR}/tables/{{table}}.md", table=wf.training_tables(TRAINING)),
]
