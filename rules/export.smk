# Exports (issue 15 parts 2-3), written once for every study: the published release layout (where the original
# dataset has one), the generic Hugging Face imagefolder + parquet layouts, and the dataset card made from the
# run's provenance. Outputs: results/<run>/<study>/export/{release,imagefolder,parquet}/ and export/README.md.
# What each study exports is declared in counterfactory.export.studies.
rule export_release:
    """The published layout: COCO-Counterfactuals examples.jsonl + images + caption JSONL (B11),
    SocialCounterfactuals parquet (B12), CounterCurate TSVs (A8)."""
    input:
        files=lambda wildcards: export_studies.release_inputs(wildcards.study, f"{RESULTS}/{wildcards.study}"),
        finished=study_finished,
    output:
        directory(f"{S}/export/release"),
    log:
        f"{S}/logs/export/release.log",
    benchmark:
        f"{S}/benchmarks/export/release.tsv"
    wildcard_constraints:
        study="|".join(EXPORT_RELEASE_STUDIES) or "^$",
    conda:
        CONDA_ENV
    resources:
        mem_mb=8000,
        runtime=120,
    params:
        study_dir=lambda wildcards: f"{RESULTS}/{wildcards.study}",
    shell:
        "counterfactory export release --study {wildcards.study} --study-dir {params.study_dir:q}"
        " --out-dir {output:q} > {log:q} 2>&1"


rule export_imagefolder:
    """Generic layouts of every study: imagefolder (metadata.jsonl + images) and parquet (images embedded)."""
    input:
        study_finished,
    output:
        imagefolder=directory(f"{S}/export/imagefolder"),
        parquet=directory(f"{S}/export/parquet"),
    log:
        f"{S}/logs/export/imagefolder.log",
    benchmark:
        f"{S}/benchmarks/export/imagefolder.tsv"
    conda:
        CONDA_ENV
    resources:
        mem_mb=8000,
        runtime=120,
    params:
        study_dir=lambda wildcards: f"{RESULTS}/{wildcards.study}",
    shell:
        "counterfactory export imagefolder --study {wildcards.study} --study-dir {params.study_dir:q}"
        " --out-dir {output.imagefolder:q} --parquet-dir {output.parquet:q} > {log:q} 2>&1"


rule export_card:
    """Dataset card (Hugging Face layout) from provenance.json, the export manifests and the study's summaries."""
    input:
        unpack(export_card_inputs),
    output:
        f"{S}/export/README.md",
    log:
        f"{S}/logs/export/card.log",
    conda:
        CONDA_ENV
    params:
        study_dir=lambda wildcards: f"{RESULTS}/{wildcards.study}",
        export_dir=lambda wildcards, output: Path(output[0]).parent,
    shell:
        "counterfactory export card --study {wildcards.study} --study-dir {params.study_dir:q}"
        " --provenance {input.provenance:q} --export-dir {params.export_dir:q} > {log:q} 2>&1"
