# Source data, shared by every study: check the study's MS-COCO root, or its own image-caption collection
# (`<study>.data.source`, README 'Your own data'), and normalise its captions into one table.
from counterfactory.data.own import OwnSource


def own_source(wildcards):
    """The study's own-data source (absolute paths), or None for MS-COCO."""
    spec = view(wildcards.study)["data"].get("source")
    return OwnSource.from_spec(spec) if spec else None


def source_inputs(wildcards):
    """MS-COCO: the captions JSON and the image folder. Own data: the table or folder, the image root and
    the boxes JSON; a missing one stops the dry run naming its config key."""
    src = own_source(wildcards)
    if src is None:
        return {"captions": coco_captions_json(wildcards), "images": coco_images(wildcards)}
    key = f"{wildcards.study}.data.source"
    return {k: source_data(path, f"{key}.{k}", "README 'Your own data'") for k, path in src.input_files().items()}


def check_args(wildcards):
    """The check step and its options: check-coco of the COCO root, or own-check of data.source."""
    if own_source(wildcards):
        return "own-check"
    data = view(wildcards.study)["data"]
    return f"check-coco --root {shlex.quote(data['coco_root'])} --split {shlex.quote(data['split'])}"


def caption_table_args(wildcards, input):
    """The table step and its input: captions of the COCO captions JSON, or own-captions of data.source."""
    if own_source(wildcards):
        return f"own-captions {job_config('data')(wildcards)}"
    return f"captions --captions-json {shlex.quote(input.captions)}"


rule coco_check:
    """Check the COCO root (files, image folder, optional checksums; explains how to get COCO), or the own
    data source (every missing image, empty caption, duplicate id ... listed at once)."""
    input:
        unpack(source_inputs),
    output:
        f"{S}/data/coco_check.json",
    log:
        f"{S}/logs/coco_check.log",
    conda:
        CONDA_ENV
    params:
        config=job_config("data"),
        step=check_args,
    shell:
        "counterfactory data {params.step} {params.config} --out {output:q} > {log:q} 2>&1"


rule caption_table:
    """Every caption of the split (or of the own source) as one table (caption_id = {image_id}_{caption_index})."""
    input:
        unpack(source_inputs),
        check=rules.coco_check.output,
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
