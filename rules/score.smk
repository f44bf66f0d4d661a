# Leaderboard stage (`counterfactory score`, docs/score.md): every model role of `score.models` on every benchmark of
# `score.benchmarks`, one score_item job per model and benchmark, then one leaderboard with bootstrap intervals and
# shortcut rows. The benchmarks' data: the countercurate.benchmarks paths, the studies' configured data (SocialCF's
# release, PATA, VisoGender, FairFace, CelebA) and the studies' outputs (coco_cf, cc_*, odmap_*, when those studies
# run); a benchmark whose data is not there is skipped with a note. Results: results/<run_name>/scores/.


include: "score_inputs.smk"


rule score_item:
    """One model role on one benchmark: per-item outcomes (cached by the job's model, data and settings)."""
    input:
        data=score_data,
        models=lambda wildcards: wf.local_model_inputs(config, wildcards.role),
        config=score_item_config,
    output:
        f"{RESULTS}/scores/items/{{benchmark}}/{{role}}.parquet",
    log:
        f"{RESULTS}/logs/scores/{{benchmark}}_{{role}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/scores/{{benchmark}}_{{role}}.tsv"
    wildcard_constraints:
        benchmark="|".join(score_lb.BENCHMARKS),
        role=r"[A-Za-z0-9_]+",
    conda:
        CONDA_ENV
    threads: lambda wildcards: accel_threads(wildcards.role)
    resources:
        mem_mb=model_mem_of_role(16000),
        runtime=120,
        gpu=GPU,
        hpu=HPU,
    params:
        data=score_data_arg,
    shell:
        "counterfactory score item --config {input.config:q} --model {wildcards.role} --benchmark {wildcards.benchmark}"
        " {params.data} --out {output:q} --no-progress > {log:q} 2>&1"


rule score_leaderboard:
    """Model x benchmark metrics with 95 % bootstrap intervals, and the shortcut rows (docs/score.md)."""
    input:
        outcomes=score_items,
        data=score_leaderboard_data,
        models=lambda wildcards: wf.local_model_inputs(config, *score_lm_roles(wildcards)),
        config=job_config(
            *SCORE_KEYS, lambda wildcards: [f"models.{r}" for r in score_lm_roles(wildcards)], study="countercurate"
        ),
    output:
        md=f"{RESULTS}/scores/leaderboard.md",
        csv=f"{RESULTS}/scores/leaderboard.csv",
        json=f"{RESULTS}/scores/leaderboard.json",
        html=report(
            f"{RESULTS}/scores/leaderboard.html",
            category="Leaderboard",
            labels={"result": "every scored model on every benchmark, with intervals and shortcut rows"},
            caption="../report/score_leaderboard.rst",
        ),
    log:
        f"{RESULTS}/logs/scores/leaderboard.log",
    conda:
        CONDA_ENV
    resources:
        mem_mb=model_mem(8000, "lm"),  # the text-only rows' lm
        runtime=60,
    params:
        data=score_leaderboard_args,
        labels=display_labels,
        out_dir=lambda wildcards, output: Path(output.md).parent,
    shell:
        "counterfactory score leaderboard --config {input.config:q} --items {input.outcomes:q} {params.data}"
        " {params.labels.flags} --out-dir {params.out_dir:q} > {log:q} 2>&1"
