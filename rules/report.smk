# Figures and tables for `snakemake --report` (results marked with report() elsewhere join them).


rule report_pair_grid:
    """Original vs counterfactual images with captions and CLIP scores."""
    input:
        f"{RESULTS}/images/selected_pairs.parquet",
    output:
        report(f"{RESULTS}/report/pair_grid.png", category="Counterfactuals", caption="../report/pair_grid.rst"),
    params:
        n=8,
    log:
        f"{RESULTS}/logs/report/pair_grid.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory report pair-grid --pairs {input} --out {output} --n {params.n} > {log} 2>&1"


rule report_caption_examples:
    """Original vs counterfactual captions with similarity and perplexity."""
    input:
        f"{RESULTS}/captions/counterfactual_captions.parquet",
    output:
        report(f"{RESULTS}/report/caption_examples.csv", category="Counterfactuals",
               caption="../report/caption_examples.rst"),
    params:
        n=20,
    log:
        f"{RESULTS}/logs/report/caption_examples.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory report caption-examples --captions {input} --out {output} --n {params.n} > {log} 2>&1"


REPORT_TARGETS = [rules.report_pair_grid.output, rules.report_caption_examples.output]
