# Offline set-up shared by every study: tiny stand-in models, NLTK data; the run's provenance.

from counterfactory.models.tiny import tiny_sources

TINY_DIR = config.get("tiny_models", {}).get("out_dir", "resources/models/tiny")
# the tiny stand-ins the configured roles point at (none in the paper config); a folder name that is no tiny
# builder (a typo) stops the parse naming the models.<role> key, before the one build job could fail and
# have Snakemake delete every tiny model it declares
try:
    TINY_MODELS = tiny_sources(config)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None


rule models_build_tiny:
    """Build every small randomly initialised model (of the role's real class) the config points at, for the
    offline demo: one job, since each model builds in about a second and starting a process costs more."""
    input:
        config=job_config("tiny_models", study=False),
    output:
        [directory(path) for path in TINY_MODELS],
    log:
        f"{TINY_DIR}/logs/tiny_models.log",
    conda:
        CONDA_ENV
    resources:
        mem_mb=scaled(2000),
        runtime=minutes(30),
    params:
        out_dir=lambda wildcards, output: Path(output[0]).parent,
    # the roles come from the output folders, not a parameter: a role that leaves the tiny folder (an edit or a
    # typo elsewhere) changes no parameter, so the other stand-ins are not rebuilt; builds are byte-reproducible
    shell:
        "counterfactory models build-tiny --config {input.config:q}"
        ' $(for d in {output:q}; do printf -- \'--role %s \' "$(basename "$d")"; done)'
        " --out-dir {params.out_dir:q} --force > {log:q} 2>&1"


rule nltk_prepare:
    """NLTK_DATA folder (punkt + POS tagger) that works offline; see docs/models.md."""
    input:
        config=job_config("nltk", study=False),
    output:
        directory(config["nltk"]["data_dir"]),
    log:
        "resources/logs/nltk_data.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory nltk prepare --config {input.config:q} --out {output:q} > {log:q} 2>&1"


rule provenance:
    """Git commit, resolved config, package versions, model roles (content fingerprints), NLTK data and
    the sha256 of every output of the run: made last, from the files it describes."""
    input:
        outputs=lambda wildcards: [target for study in STUDIES for target in STUDY_TARGETS[study]()],
        exports=lambda wildcards: [m for study in STUDIES for m in export_manifests(study).values()],
        examples=[examples_grid(study) for study in STUDIES],
        models=wf.local_model_inputs(config, *config["models"]),
        config=run_config(),
    output:
        f"{RESULTS}/provenance.json",
    log:
        f"{RESULTS}/logs/provenance.log",
    conda:
        CONDA_ENV
    params:
        folders=[f"{RESULTS}/{study}" for study in STUDIES],
        skip=PROVENANCE_SKIP,
    shell:
        "counterfactory provenance --config {input.config:q} --outputs {input.outputs:q} --folders {params.folders:q}"
        " --skip {params.skip:q} --out {output:q} > {log:q} 2>&1"


localrules:
    config_write_job,


rule config_write_job:
    """One job's configuration (the sections its rule declares), written when a job first needs it."""
    output:
        ".snakemake/counterfactory/{kind}/{digest}.yaml",
    log:
        ".snakemake/counterfactory/logs/{kind}/{digest}.log",
    wildcard_constraints:
        kind="jobs|runs",
        digest="[0-9a-f]{20}",
    conda:
        CONDA_ENV
    params:
        text=job_config_text,
    shell:
        "counterfactory config write-job --text {params.text:q} --out {output:q} > {log:q} 2>&1"
