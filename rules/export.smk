# Exports (issue 15 parts 2-3), written once for every study: the published release layout (where the original
# dataset has one), the generic Hugging Face imagefolder + parquet layouts, CLIP_benchmark's retrieval webdataset
# (studies with an image-caption retrieval set, issue 46.4), and the dataset card made from the run's provenance.
# Outputs: results/<run>/<study>/export/{release,imagefolder,parquet,clip_benchmark}/ and export/README.md: the
# folder a user uploads. The rules declare each layout's manifest (results/<run>/<study>/manifests/export_*.json)
# as their output, not the layout folder: Snakemake marks a directory() output with a .snakemake_timestamp file
# inside it, which would travel with the upload. The writers replace each folder as a whole.
# What each study exports is declared in its package: EXPORT in src/counterfactory/studies/<study>/export.py, set as
# its SPEC.export (a counterfactory.export.studies.StudyExport).
rule export_release:
    """The published layout: COCO-Counterfactuals examples.jsonl + images + caption JSONL (B11),
    SocialCounterfactuals parquet (B12), CounterCurate TSVs (A8)."""
    input:
        files=lambda wildcards: export_studies.release_inputs(
            studies.spec(wildcards.study).export, f"{RESULTS}/{wildcards.study}"
        ),
        finished=study_finished,
    output:
        f"{S}/manifests/export_release.json",
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
        out_dir=lambda wildcards: f"{RESULTS}/{wildcards.study}/export/release",
    shell:
        "counterfactory export release --study {wildcards.study} --study-dir {params.study_dir:q}"
        " --out-dir {params.out_dir:q} --manifest {output:q} > {log:q} 2>&1"


rule export_imagefolder:
    """Generic layouts of every study: imagefolder (metadata.jsonl + images) and parquet (images embedded); with
    verify.enabled each covered study's configs also as <config>_verified (the rows the VQA check kept)."""
    input:
        unpack(export_imagefolder_inputs),
    output:
        imagefolder=f"{S}/manifests/export_imagefolder.json",
        parquet=f"{S}/manifests/export_parquet.json",
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
        imagefolder=lambda wildcards: f"{RESULTS}/{wildcards.study}/export/imagefolder",
        parquet=lambda wildcards: f"{RESULTS}/{wildcards.study}/export/parquet",
        verified=export_verified_arg,
    shell:
        "counterfactory export imagefolder --study {wildcards.study} --study-dir {params.study_dir:q}"
        " --out-dir {params.imagefolder:q} --parquet-dir {params.parquet:q} {params.verified}"
        " --manifest-imagefolder {output.imagefolder:q} --manifest-parquet {output.parquet:q} > {log:q} 2>&1"


rule export_clip_benchmark:
    """CLIP_benchmark's webdataset layout of the study's image-caption retrieval set(s): <config>/dataset_type.txt,
    test/nshards.txt, test/<k>.tar (`clip_benchmark eval --dataset wds/<config> --task zeroshot_retrieval`); with
    verify.enabled also <config>_verified (the rows the VQA check kept)."""
    input:
        unpack(export_imagefolder_inputs),
    output:
        f"{S}/manifests/export_clip_benchmark.json",
    log:
        f"{S}/logs/export/clip_benchmark.log",
    benchmark:
        f"{S}/benchmarks/export/clip_benchmark.tsv"
    wildcard_constraints:
        study="|".join(EXPORT_CLIP_BENCHMARK_STUDIES) or "^$",
    conda:
        CONDA_ENV
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        study_dir=lambda wildcards: f"{RESULTS}/{wildcards.study}",
        out_dir=lambda wildcards: f"{RESULTS}/{wildcards.study}/export/clip_benchmark",
        verified=export_verified_arg,
    shell:
        "counterfactory export clip-benchmark --study {wildcards.study} --study-dir {params.study_dir:q}"
        " --out-dir {params.out_dir:q} {params.verified} --manifest {output:q} > {log:q} 2>&1"


rule export_card:
    """Dataset card (Hugging Face layout) from provenance.json, the export manifests and the study's summaries, with
    the audited filters' cards copied beside it (export/filter_cards/<filter>/; only with filters.audit.<study>)."""
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
        manifests=lambda wildcards, input: " ".join(
            f"--manifest {layout}={shlex.quote(str(path))}"
            for layout, path in input.items()
            if layout in ("release", "imagefolder", "parquet", "clip_benchmark")
        ),
        filter_cards=export_card_filter_args,
    shell:
        "counterfactory export card --study {wildcards.study} --study-dir {params.study_dir:q}"
        " --provenance {input.provenance:q} --export-dir {params.export_dir:q} {params.manifests}"
        " {params.filter_cards} > {log:q} 2>&1"
