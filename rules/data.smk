# Source data, shared by every study: check the study's MS-COCO root, or its own image-caption collection
# (`<study>.data.source`, README 'Your own data'), and normalise its captions into one table.
rule data_check:
    """Check the COCO root (files, image folder, optional checksums; explains how to get COCO), or the own
    data source (every missing image, empty caption, duplicate id ... listed at once)."""
    input:
        unpack(source_inputs),
        config=job_config("data"),
    output:
        f"{S}/data/coco_check.json",
    log:
        f"{S}/logs/coco_check.log",
    conda:
        CONDA_ENV
    params:
        step=check_args,
    shell:
        "counterfactory data {params.step} --config {input.config:q} --out {output:q} > {log:q} 2>&1"


rule data_captions:
    """Every caption of the split (or of the own source) as one table (caption_id = {image_id}_{caption_index})."""
    input:
        unpack(source_inputs),
        check=rules.data_check.output,
        config=lambda wildcards: job_config("data")(wildcards) if own_source(wildcards) else [],
    output:
        f"{S}/data/captions.parquet",
    log:
        f"{S}/logs/caption_table.log",
    conda:
        CONDA_ENV
    params:
        source=caption_table_args,
        limit=lambda wildcards: (
            f"--limit-images {view(wildcards.study)['data']['limit_images']}"
            if view(wildcards.study)["data"].get("limit_images")
            else ""
        ),
    shell:
        "counterfactory data {params.source} --out {output:q} {params.limit} > {log:q} 2>&1"
