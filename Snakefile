# CounterFactory: counterfactual image-text data, from source datasets to statistics.
#
#   snakemake --profile profiles/local all                         # paper config (needs COCO + GPUs)
#   snakemake --profile profiles/local --configfile config/demo.yaml all   # offline demo
#
# Rules are thin: each calls one `counterfactory` CLI subcommand; the logic lives in the package.
from snakemake.utils import min_version, validate

from counterfactory import workflow as wf
from counterfactory.config import validate_config

min_version("9.0")


configfile: "config/config.yaml"


# Snakemake's validator checks the schema; the package's validator fills in the schema defaults
# (it also handles optional sub-objects that are null, which Snakemake's default-filling does not).
validate(config, "config/schema.yaml", set_default=False)
validate_config(config, source="Snakemake config")

RUN = config["run_name"]
RESULTS = f"results/{RUN}"
CONFIG_ARGS = wf.config_args(config)
N_CAPTIONS = wf.caption_count(config)


include: "rules/common.smk"
include: "rules/resources.smk"
include: "rules/setup.smk"
include: "rules/data.smk"
include: "rules/captions.smk"
include: "rules/images.smk"
include: "rules/evaluate.smk"
include: "rules/training.smk"
include: "rules/analysis.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        CAPTION_TARGETS,
        IMAGES_TARGETS,
        EVAL_TARGETS,
        TRAINING_TARGETS,
        ANALYSIS_TARGETS,
        REPORT_TARGETS,
        f"{RESULTS}/provenance.json",
