# The VQA check (`counterfactory verify`, docs/verify.md "VQA check"; issue 47 item 1): one shared stage after any
# study's generation. verify_pairs maps the study's candidates to the pair table, verify_vqa scores P("Yes") of the
# vlm role on each shard of it (batched, resumable), verify_merge joins the shards and writes the verified variant.
# In `all` only when verify.enabled (off in the paper config). Results: results/<run_name>/<study>/verify/.


include: "verify_inputs.smk"


rule verify_pairs:
    """The study's candidates as a pair table (item, image, caption, partner image, partner caption)."""
    input:
        unpack(verify_candidates),
    output:
        f"{RESULTS}/{{study}}/verify/pairs.parquet",
    log:
        f"{RESULTS}/{{study}}/logs/verify/pairs.log",
    wildcard_constraints:
        study=VERIFY_STUDY_RE,
    conda:
        CONDA_ENV
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        inputs=verify_input_args,
    shell:
        "counterfactory verify pairs --study {wildcards.study} {params.inputs} --out {output:q} > {log:q} 2>&1"


rule verify_vqa:
    """P("Yes") of the vlm role on one shard of the pair table, both images against both captions (VQAScore-style)."""
    input:
        pairs=f"{RESULTS}/{{study}}/verify/pairs.parquet",
        models=lambda wildcards: wf.local_model_inputs(config, verify_role()),
        config=job_config("verify", lambda wildcards: [f"models.{verify_role()}"], *DEVICE_KEYS),
    output:
        f"{RESULTS}/{{study}}/verify/shards/{{shard}}.parquet",
    log:
        f"{RESULTS}/{{study}}/logs/verify/vqa_{{shard}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{study}}/verify_vqa_{{shard}}.tsv"
    wildcard_constraints:
        study=VERIFY_STUDY_RE,
        shard=r"\d{5}",
    conda:
        CONDA_ENV
    threads: lambda wildcards: accel_threads(verify_role())
    resources:
        mem_mb=lambda wildcards, attempt: model_mem(32000, verify_role())(wildcards, attempt),
        runtime=240,
        gpu=GPU,
        hpu=HPU,
    shell:
        "counterfactory verify vqa --config {input.config:q} --pairs {input.pairs:q} --shard {wildcards.shard}"
        " --out {output:q} --no-progress > {log:q} 2>&1"


rule verify_merge:
    """Every shard's scores with kept from the thresholds, and the verified variant of the study's candidates."""
    input:
        unpack(verify_candidates),
        shards=verify_shard_files,
        config=job_config("verify"),
    output:
        scores=f"{RESULTS}/{{study}}/verify/vqa.parquet",
        verified=f"{RESULTS}/{{study}}/verify/verified.parquet",
    log:
        f"{RESULTS}/{{study}}/logs/verify/merge.log",
    wildcard_constraints:
        study=VERIFY_STUDY_RE,
    conda:
        CONDA_ENV
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        inputs=verify_input_args,
    shell:
        "counterfactory verify merge --config {input.config:q} --study {wildcards.study} {params.inputs}"
        " --shards {input.shards:q} --out {output.scores:q} --verified {output.verified:q} > {log:q} 2>&1"
