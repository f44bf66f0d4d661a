# Source data: check the user's MS-COCO root, normalise captions into a table.

COCO_ROOT = config["data"]["coco_root"]
SPLIT = config["data"]["split"]


rule coco_check:
    """Check the COCO root (files, image folder, optional checksums); explains how to get COCO."""
    input:
        captions=f"{COCO_ROOT}/annotations/captions_{SPLIT}.json",
    output:
        f"{RESULTS}/data/coco_check.json",
    log:
        f"{RESULTS}/logs/coco_check.log",
    params:
        config=CONFIG_ARGS,
        root=lambda wildcards, input: Path(input.captions).parents[1],
        split=SPLIT,
    conda:
        CONDA_ENV
    shell:
        "counterfactory data check-coco {params.config} --root {params.root} --split {params.split} --out {output}"
        " > {log} 2>&1"


rule caption_table:
    """Every caption of the split as one table (caption_id = {image_id}_{caption_index})."""
    input:
        check=rules.coco_check.output,
        captions=f"{COCO_ROOT}/annotations/captions_{SPLIT}.json",
    output:
        f"{RESULTS}/data/captions.parquet",
    log:
        f"{RESULTS}/logs/caption_table.log",
    params:
        limit=f"--limit-images {config['data']['limit_images']}" if config["data"].get("limit_images") else "",
    conda:
        CONDA_ENV
    shell:
        "counterfactory data captions --captions-json {input.captions} --out {output} {params.limit} > {log} 2>&1"
