# Training stage, shared by every study: mixtures, fine-tuning over seeds, t-tests, paper tables
# (COCO-Counterfactuals §5 / B.3). One job per (mixture, seed).


# what a run depends on: the recipe and evaluation, not the t-test settings or the other mixtures
TRAIN_RUN_KEYS = (
    *(
        f"training.{key}"
        for key in (
            "experiment precision recipe cvld_lambda optimizer adam_beta1 adam_beta2 adam_epsilon lr lr_scheduler "
            "warmup_steps weight_decay no_decay max_grad_norm batch_size eval_batch_size epochs eval_every "
            "max_steps max_length dataloader_workers deterministic cpu_threads eval"
        ).split()
    ),
    "evaluation.classification",
    "evaluation.batch_size",
    "evaluation.scorers",
    "models.clip_train",
    *DEVICE_KEYS,
)


rule train_mixtures:
    """B.3.1 mixture manifests (real samples, counterfactual pairs or samples; reproducible 80/20 split)."""
    input:
        pairs=f"{S}/images/selected_pairs.parquet",
        captions=f"{S}/data/captions.parquet",
        images=coco_images,
        config=job_config(
            "training.random_state", "training.val_fraction", "training.split_by", "training.mixtures", "data"
        ),
    output:
        summary=f"{S}/training/mixtures/summary.csv",
        manifests=directory(f"{S}/training/mixtures/manifests"),
    log:
        f"{S}/logs/training/mixtures.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory train mixtures --config {input.config:q} --pairs {input.pairs:q} --captions {input.captions:q}"
        " --out-dir {output.manifests:q} --out-summary {output.summary:q} > {log:q} 2>&1"


rule train_run:
    """One fine-tuning run: (mixture, seed); best checkpoint by validation loss; retrieval + classification."""
    input:
        manifests=rules.train_mixtures.output.manifests,
        eval_data=train_eval_inputs,
        models=model_inputs("clip_train"),
        config=job_config(*TRAIN_RUN_KEYS),
    output:
        metrics=f"{S}/training/runs/{{mixture}}/seed{{seed}}/metrics.csv",
        history=f"{S}/training/runs/{{mixture}}/seed{{seed}}/history.csv",
    log:
        f"{S}/logs/training/{{mixture}}_seed{{seed}}.log",
    benchmark:
        f"{S}/benchmarks/training/{{mixture}}_seed{{seed}}.tsv"
    conda:
        CONDA_ENV
    threads: accel_threads("clip_train")
    resources:
        mem_mb=model_mem(16000, "clip_train", tiny_mb=3000),
        runtime=per_study(lambda study: 80 + train_minutes(study)),
        gpu=GPU,
        hpu=HPU,
    params:
        data_seed=lambda wildcards: seeds(wildcards)[int(wildcards.seed)],
        out_dir=lambda wildcards, output: Path(output.metrics).parent,
        extra="",  # variants (`use rule train_run as ...`) add options: --role, --eval-pairs, --no-train
    shell:
        "counterfactory train run --config {input.config:q} --manifest {input.manifests:q}/{wildcards.mixture}.parquet"
        " --mixture {wildcards.mixture} --seed {wildcards.seed} --data-seed {params.data_seed}"
        " {params.extra} --out-dir {params.out_dir:q} --no-progress > {log:q} 2>&1"


rule train_run_pretrained:
    """Tables 3, 4 and 12's pre-trained row: the untouched model, evaluated once with training.eval (no training)."""
    input:
        eval_data=train_eval_inputs,
        models=model_inputs("clip_train"),
        config=job_config(*TRAIN_RUN_KEYS),
    output:
        metrics=f"{S}/training/pretrained/metrics.csv",
        history=f"{S}/training/pretrained/history.csv",
    log:
        f"{S}/logs/training/pretrained.log",
    benchmark:
        f"{S}/benchmarks/training/pretrained.tsv"
    conda:
        CONDA_ENV
    threads: accel_threads("clip_train")
    resources:
        mem_mb=model_mem(16000, "clip_train", tiny_mb=3000),
        runtime=80,
        gpu=GPU,
        hpu=HPU,
    params:
        seed=lambda wildcards: list(seeds(wildcards))[0],
        data_seed=lambda wildcards: list(seeds(wildcards).values())[0],
        out_dir=lambda wildcards, output: Path(output.metrics).parent,
    shell:
        "counterfactory train run --config {input.config:q} --no-train --mixture pretrained --seed {params.seed}"
        " --data-seed {params.data_seed} --out-dir {params.out_dir:q} --no-progress > {log:q} 2>&1"


rule train_collect:
    """Tidy runs table: experiment, mixture, seed, data_seed, metric, value (with the pre-trained row's run)."""
    input:
        runs_of("metrics.csv"),
        pretrained_run,
    output:
        report(
            f"{S}/training/runs.csv",
            labels=result_label("training/runs.csv"),
            category=study_title,
            subcategory=report_section("Training"),
            caption="../report/runs.rst",
        ),
    log:
        f"{S}/logs/training/runs_table.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory train collect {input:q} --out {output:q} > {log:q} 2>&1"


rule stats_summarize:
    """Mean, std, n and the one-tailed p-value of every mixture against the baseline, per metric."""
    input:
        rules.train_collect.output,
    output:
        f"{S}/training/summary.csv",
    log:
        f"{S}/logs/training/stats.log",
    conda:
        CONDA_ENV
    params:
        baseline=lambda wildcards: training(wildcards)["baseline"],
        test=lambda wildcards: training(wildcards)["stats"]["test"],
        alpha=lambda wildcards: training(wildcards)["stats"]["alpha"],
    shell:
        "counterfactory stats summarize --runs {input:q} --baseline {params.baseline} --test {params.test}"
        " --alpha {params.alpha} --out {output:q} > {log:q} 2>&1"


rule stats_table:
    """Paper table layouts (COCO-CF Table 3 retrieval, Table 4 classification with its Mean, Table 12), the
    pre-trained row first: Markdown, LaTeX, CSV."""
    input:
        summary=rules.stats_summarize.output,
        info=rules.train_mixtures.output.summary,
    output:
        md=f"{S}/training/tables/{{table}}.md",
        html=report(
            f"{S}/training/tables/{{table}}.html",
            labels=result_label("training/tables/{table}.html"),
            category=study_title,
            subcategory=report_section("Training"),
            caption="../report/tables.rst",
        ),
        tex=f"{S}/training/tables/{{table}}.tex",
        csv=f"{S}/training/tables/{{table}}.csv",
    log:
        f"{S}/logs/training/table_{{table}}.log",
    conda:
        CONDA_ENV
    params:
        metrics=lambda wildcards: coco_cf.table_metrics(training(wildcards), wildcards.table),
        order=lambda wildcards: ",".join(coco_cf.table_mixtures(training(wildcards), mixtures_as_listed(wildcards))),
        pretrained=lambda wildcards: pretrained_row_args(wildcards),
        labels=mixture_label_args,
        title=lambda wildcards: coco_cf.table_title(training(wildcards), wildcards.table),
    shell:
        "counterfactory stats table --summary {input.summary:q} --mixture-info {input.info:q}"
        " --metrics {params.metrics} --mixture-order {params.order} {params.pretrained.flags} {params.labels.flags}"
        " --title {params.title:q}"
        " --out-md {output.md:q} --out-tex {output.tex:q} --out-csv {output.csv:q} --out-html {output.html:q}"
        " > {log:q} 2>&1"


rule train_plot_curves:
    """Training and validation loss of every run."""
    input:
        runs_of("history.csv"),
    output:
        report(
            f"{S}/training/curves.png",
            labels=result_label("training/curves.png"),
            category=study_title,
            subcategory=report_section("Training"),
            caption="../report/curves.rst",
        ),
    log:
        f"{S}/logs/training/curves.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory train plot-curves {input:q} --out {output:q} > {log:q} 2>&1"
