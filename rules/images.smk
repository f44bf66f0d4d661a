# Image generation stage (COCO-Counterfactuals §3.2 / B.1.2: Prompt-to-Prompt pairs, over-generated and
# CLIP-filtered). One job per shard of caption pairs (source_index in [j*S, (j+1)*S), S =
# images.shard_size), so the job count is known before the captions exist; each job resumes from its
# work cache if killed.


rule images_generate:
    """Over-generate candidate pairs, CLIP-filter them and keep the best by CLIP_dir, for one shard."""
    input:
        pairs=f"{S}/captions/counterfactual_captions.parquet",
        models=model_inputs("sd", "clip_filter", "vae"),
        config=job_config("images", "seed", "models.sd", "models.clip_filter", "models.vae", *DEVICE_KEYS),
    output:
        selected=f"{S}/images/shards/{{shard}}/selected_pairs.parquet",
        scores=f"{S}/images/shards/{{shard}}/candidate_scores.parquet",
        summary=f"{S}/images/shards/{{shard}}/summary.json",
        images=directory(f"{S}/images/shards/{{shard}}/images"),
    log:
        f"{S}/logs/images/{{shard}}.log",
    benchmark:
        f"{S}/benchmarks/images/{{shard}}.tsv"
    conda:
        CONDA_ENV
    threads: accel_threads("sd", "clip_filter")
    resources:
        mem_mb=model_mem(16000, "sd", "clip_filter", tiny_mb=3000),
        runtime=per_study(lambda study: 15 + images_minutes(study)),
        gpu=GPU,
        hpu=HPU,
    params:
        out_dir=lambda wildcards, output: Path(output.selected).parent,
    shell:
        "counterfactory images generate --config {input.config:q} --pairs {input.pairs:q} --shard {wildcards.shard}"
        " --out-dir {params.out_dir:q} --threads {threads} > {log:q} 2>&1"


rule images_merge:
    """All selected pairs (release index: id, caption_0, caption_1, image_0, image_1) and every score;
    refuses shards made under different settings."""
    input:
        summaries=per_shard(f"{S}/images/shards/{{shard}}/summary.json", "images"),
        selected=per_shard(f"{S}/images/shards/{{shard}}/selected_pairs.parquet", "images"),
        scores=per_shard(f"{S}/images/shards/{{shard}}/candidate_scores.parquet", "images"),
    output:
        selected=f"{S}/images/selected_pairs.parquet",
        scores=f"{S}/images/candidate_scores.parquet",
        summary=f"{S}/images/summary.json",
    log:
        f"{S}/logs/images/merge.log",
    conda:
        CONDA_ENV
    params:
        shard_dirs=lambda wildcards, input: sorted({str(Path(f).parent) for f in input}),
        out_dir=lambda wildcards, output: Path(output.selected).parent,
    shell:
        "counterfactory images merge --shard-dirs {params.shard_dirs:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
