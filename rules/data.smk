# Source data, shared by every study: check the study's MS-COCO root, normalise its captions into a table.


rule coco_check:
    """Check the COCO root (files, image folder, optional checksums); explains how to get COCO."""
    input:
        captions=coco_captions_json,
        images=coco_images,
    output:
        f"{S}/data/coco_check.json",
    log:
        f"{S}/logs/coco_check.log",
    conda:
        CONDA_ENV
    params:
        config=job_config("data"),
        root=lambda wildcards: view(wildcards.study)["data"]["coco_root"],
        split=lambda wildcards: view(wildcards.study)["data"]["split"],
    shell:
        "counterfactory data check-coco {params.config} --root {params.root:q} --split {params.split}"
        " --out {output:q} > {log:q} 2>&1"


rule caption_table:
    """Every caption of the split as one table (caption_id = {image_id}_{caption_index})."""
    input:
        check=rules.coco_check.output,
        captions=coco_captions_json,
    output:
        f"{S}/data/captions.parquet",
    log:
        f"{S}/logs/caption_table.log",
    conda:
        CONDA_ENV
    params:
        limit=lambda wildcards: (
            f"--limit-images {view(wildcards.study)['data']['limit_images']}"
            if view(wildcards.study)["data"].get("limit_images")
            else ""
        ),
    shell:
        "counterfactory data captions --captions-json {input.captions:q} --out {output:q}"
        " {params.limit} > {log:q} 2>&1"
