# Reporting stage, shared by every study: figures and tables for `snakemake --report` (results marked
# with report() elsewhere join them).


rule report_pair_grid:
    """Original vs counterfactual images with captions and CLIP scores."""
    input:
        f"{S}/images/selected_pairs.parquet",
    output:
        report(
            f"{S}/report/pair_grid.png",
            labels=result_label("report/pair_grid.png"),
            category=study_title,
            subcategory=report_section("Counterfactuals"),
            caption="../report/pair_grid.rst",
        ),
    log:
        f"{S}/logs/report/pair_grid.log",
    conda:
        CONDA_ENV
    params:
        n=8,
    shell:
        "counterfactory report pair-grid --pairs {input:q} --out {output:q} --n {params.n} > {log:q} 2>&1"


rule report_caption_examples:
    """Original vs counterfactual captions with similarity and perplexity."""
    input:
        f"{S}/captions/counterfactual_captions.parquet",
    output:
        report(
            f"{S}/report/caption_examples.csv",
            labels=result_label("report/caption_examples.csv"),
            category=study_title,
            subcategory=report_section("Counterfactuals"),
            caption="../report/caption_examples.rst",
        ),
    log:
        f"{S}/logs/report/caption_examples.log",
    conda:
        CONDA_ENV
    params:
        n=20,
    shell:
        "counterfactory report caption-examples --captions {input:q} --out {output:q} --n {params.n} > {log:q} 2>&1"


rule report_overview:
    """The report's front page: which studies ran, on which data (config keys) and with which models."""
    input:
        rules.provenance.output,
    output:
        report(
            f"{RESULTS}/report/overview.html",
            category="Run overview",
            labels={"result": "which data and models this run used"},
            caption="../report/overview.rst",
        ),
    log:
        f"{RESULTS}/logs/report/overview.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory report overview --provenance {input:q} --out {output:q} > {log:q} 2>&1"


rule report_examples:
    """Examples of every study from its exported imagefolder: pairs, sets, original vs edited / inpainted images."""
    input:
        f"{S}/manifests/export_imagefolder.json",
    output:
        report(
            f"{S}/report/examples.png",
            labels=result_label("report/examples.png"),
            category=study_title,
            subcategory=report_section("Examples"),
            caption="../report/examples.rst",
        ),
    log:
        f"{S}/logs/report/examples.log",
    conda:
        CONDA_ENV
    params:
        n=3,
        imagefolder=lambda wildcards: f"{RESULTS}/{wildcards.study}/export/imagefolder",
    shell:
        "counterfactory report examples --imagefolder {params.imagefolder:q} --manifest {input:q} --out {output:q}"
        " --n {params.n} > {log:q} 2>&1"
