# COCO-Counterfactuals §3.1: counterfactual captions by single-noun substitution, sharded.

CAPTION_SHARDS = shards(config["captions"]["shard_size"])


rule caption_shard:
    """Mask nouns, MLM fills, POS / similarity-band / perplexity filters for one shard of captions."""
    input:
        table=rules.caption_table.output,
        nltk=config["nltk"]["data_dir"],
        models=wf.tiny_model_inputs(config, "mlm", "lm", "sentence"),
    output:
        accepted=f"{RESULTS}/captions/shards/{{shard}}.parquet",
        rejected=f"{RESULTS}/captions/rejected/{{shard}}.parquet",
        summary=f"{RESULTS}/captions/summary/{{shard}}.json",
    log:
        f"{RESULTS}/logs/captions/{{shard}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/captions/{{shard}}.tsv"
    threads: accel_threads("mlm", "lm", "sentence")
    resources:
        mem_mb=model_mem(8000, "mlm", "lm", "sentence", per_item=2, items=CAPTION_SHARD_ITEMS),
        runtime=minutes(10, 0.05 * CPU_SLOWDOWN, CAPTION_SHARD_ITEMS),
        gpu=GPU,
        hpu=HPU,
    params:
        config=CONFIG_ARGS,
    conda:
        CONDA_ENV
    shell:
        "counterfactory captions edit {params.config} --captions {input.table} --shard {wildcards.shard}"
        " --out {output.accepted} --rejected {output.rejected} --summary {output.summary} > {log} 2>&1"


rule caption_merge:
    """All accepted counterfactual captions, plus the release-format JSONL."""
    input:
        expand(f"{RESULTS}/captions/shards/{{shard}}.parquet", shard=CAPTION_SHARDS),
    output:
        parquet=f"{RESULTS}/captions/counterfactual_captions.parquet",
        jsonl=f"{RESULTS}/captions/coco_counterfactuals_captions.jsonl",
    log:
        f"{RESULTS}/logs/caption_merge.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory captions merge {input} --out {output.parquet} --jsonl {output.jsonl} > {log} 2>&1"


CAPTION_TARGETS = rules.caption_merge.output
