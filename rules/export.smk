# Exports (issue 15 parts 2-3), written once for every study: the published release layout (where the original
# dataset has one), the generic Hugging Face imagefolder + parquet layouts, and the dataset card made from the
# run's provenance. Outputs: results/<run>/<study>/export/{release,imagefolder,parquet}/ and export/README.md.
# What each study exports is declared in counterfactory.export.studies.
from counterfactory.export import studies as export_studies

EXPORT_RELEASE_STUDIES = [s for s in STUDIES if export_studies.STUDIES[s].release]


def export_targets(study):
    """The study's export outputs (for `all`): the card, and through it every layout."""
    return [f"{RESULTS}/{study}/export/README.md"]


def study_finished(wildcards):
    """The study's final files: an export is made from a finished study (its image shards included)."""
    return STUDY_TARGETS[wildcards.study]()


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
    params:
        study_dir=lambda wildcards: f"{RESULTS}/{wildcards.study}",
    shell:
        "counterfactory export imagefolder --study {wildcards.study} --study-dir {params.study_dir:q}"
        " --out-dir {output.imagefolder:q} --parquet-dir {output.parquet:q} > {log:q} 2>&1"


def export_card_inputs(wildcards):
    out = {
        "imagefolder": f"{RESULTS}/{wildcards.study}/export/imagefolder",
        "parquet": f"{RESULTS}/{wildcards.study}/export/parquet",
        "provenance": f"{RESULTS}/provenance.json",
        "funnel": [str(f) for f in export_studies.funnel_files(wildcards.study, f"{RESULTS}/{wildcards.study}")],
    }
    if wildcards.study in EXPORT_RELEASE_STUDIES:
        out["release"] = f"{RESULTS}/{wildcards.study}/export/release"
    return out


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
