# Filter cards (`counterfactory filters study-card`, docs/verify.md "Filter cards"; issue 47 item 2): one job per study
# filter that filters.audit names a hand-labelled audit sample for, measuring the study's own threshold against it.
# In `all` only for the audited filters (the paper config names none). Results: results/<run_name>/<study>/filters/
# cards/<filter>/ (a report entry; copied beside the study's dataset card by export_card).


include: "filters_inputs.smk"


rule filters_study_card:
    """A study filter's score table and its card at the study's threshold against the audit sample."""
    input:
        unpack(filter_card_inputs),
        config=job_config(filter_card_config_keys),
    output:
        md=f"{RESULTS}/{{study}}/filters/cards/{{filter}}/card.md",
        json=f"{RESULTS}/{{study}}/filters/cards/{{filter}}/card.json",
        png=f"{RESULTS}/{{study}}/filters/cards/{{filter}}/curve.png",
        csv=f"{RESULTS}/{{study}}/filters/cards/{{filter}}/curve.csv",
        scores=f"{RESULTS}/{{study}}/filters/cards/{{filter}}/scores.parquet",
        html=report(
            f"{RESULTS}/{{study}}/filters/cards/{{filter}}/card.html",
            labels=result_label("filters/cards/{filter}/card.html"),
            category=study_title,
            subcategory=report_section("Filtering"),
            caption="../report/filter_card.rst",
        ),
    log:
        f"{RESULTS}/{{study}}/logs/filters/card_{{filter}}.log",
    wildcard_constraints:
        study=FILTER_CARD_STUDY_RE,
        filter=FILTER_CARD_NAME_RE,
    conda:
        CONDA_ENV
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        inputs=filter_card_args,
        out_dir=lambda wildcards, output: Path(output.md).parent,
    shell:
        "counterfactory filters study-card --config {input.config:q} --study {wildcards.study}"
        " --filter {wildcards.filter} {params.inputs} --audit {input.audit:q} --out-dir {params.out_dir:q}"
        " > {log:q} 2>&1"
