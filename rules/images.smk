# COCO-Counterfactuals §3.2 / B.1.2: Prompt-to-Prompt image pairs, over-generated and CLIP-filtered.
# One job per shard of caption pairs (source_index in [j*S, (j+1)*S), S = images.shard_size), so the
# job count is known before the captions exist; each job resumes from its work cache if killed.

IMAGES_DIR = f"{RESULTS}/images"
IMAGES_SHARDS = shards(config["images"]["shard_size"])


rule images_shard:
    """Over-generate candidate pairs, CLIP-filter them and keep the best by CLIP_dir, for one shard."""
    input:
        pairs=f"{RESULTS}/captions/counterfactual_captions.parquet",
        models=wf.tiny_model_inputs(config, "sd", "clip_filter"),
    output:
        selected=f"{IMAGES_DIR}/shards/{{shard}}/selected_pairs.parquet",
        scores=f"{IMAGES_DIR}/shards/{{shard}}/candidate_scores.parquet",
        summary=f"{IMAGES_DIR}/shards/{{shard}}/summary.json",
        images=directory(f"{IMAGES_DIR}/shards/{{shard}}/images"),
    params:
        config=CONFIG_ARGS,
        out_dir=lambda wildcards, output: Path(output.selected).parent,
    wildcard_constraints:
        shard=r"\d+",
    threads: accel_threads("sd", "clip_filter")
    resources:
        mem_mb=model_mem(16000, "sd", "clip_filter", tiny_mb=3000),
        runtime=minutes(15 + IMAGES_MINUTES),
        gpu=GPU,
        hpu=HPU,
    log:
        f"{RESULTS}/logs/images/{{shard}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/images/{{shard}}.tsv"
    conda:
        CONDA_ENV
    shell:
        "counterfactory images generate {params.config} --pairs {input.pairs} --shard {wildcards.shard}"
        " --out-dir {params.out_dir} --threads {threads} > {log} 2>&1"


rule images_merge:
    """All selected pairs (release index: id, caption_0, caption_1, image_0, image_1) and every score."""
    input:
        expand(f"{IMAGES_DIR}/shards/{{shard}}/summary.json", shard=IMAGES_SHARDS),
        expand(f"{IMAGES_DIR}/shards/{{shard}}/selected_pairs.parquet", shard=IMAGES_SHARDS),
        expand(f"{IMAGES_DIR}/shards/{{shard}}/candidate_scores.parquet", shard=IMAGES_SHARDS),
    output:
        selected=f"{IMAGES_DIR}/selected_pairs.parquet",
        scores=f"{IMAGES_DIR}/candidate_scores.parquet",
        summary=f"{IMAGES_DIR}/summary.json",
    params:
        shard_dirs=lambda wildcards, input: sorted({str(Path(f).parent) for f in input}),
        out_dir=lambda wildcards, output: Path(output.selected).parent,
    log:
        f"{RESULTS}/logs/images/merge.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory images merge --shard-dirs {params.shard_dirs} --out-dir {params.out_dir} > {log} 2>&1"


IMAGES_TARGETS = rules.images_merge.output
