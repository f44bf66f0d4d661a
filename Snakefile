# CounterFactory: counterfactual image-text data, from source datasets to statistics.
#
#   snakemake --profile profiles/local all                                 # paper config (needs data + GPUs)
#   snakemake all --profile profiles/local --configfile config/demo.yaml   # offline demo
#
# Rules are thin: each calls one `counterfactory` CLI subcommand; the logic lives in the package.
# One name per step: rule `<group>_<step>` runs `counterfactory <group> <step>` (dashes as underscores), defined in
# src/counterfactory/commands/<group>.py; a second rule running the same subcommand for one study or experiment adds
# `_<study>` (e.g. train_collect_spurious). A study's own group is its short name: social, countercurate, spurious
# (spurious_retrieval), cvld. tests/test_names.py keeps it so.
# Stage rules (rules/<stage>.smk) are written once for every study: their paths carry a {study}
# wildcard and their settings come from that study's config section. A study's own steps and its
# targets are in rules/study_<study>.smk. Results: results/<run_name>/<study>/...
from snakemake.utils import min_version

from counterfactory import workflow as wf
from counterfactory.config import validate_config, ConfigError

min_version("9.0")


configfile: "config/config.yaml"


# front page of `snakemake --report`: which studies ran; every result listed with the rule that made it
report: "report/workflow.rst"


# The package's validator checks the schema, fills in its defaults and checks what a schema cannot
# (bound orders); a mistake stops the run with one message naming each key at fault.
try:
    validate_config(config, source="Snakemake config (--configfile / --config)")
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None


RUN = config["run_name"]
RESULTS = f"results/{RUN}"
STUDIES = list(config["studies"])
STUDY_TARGETS = {}  # study -> function returning that study's final files (filled by rules/study_*.smk)
STUDY_ITR_SUBSETS = {}  # study -> function returning extra ITR subsets its own steps make (label -> file)


include: "rules/common.smk"
include: "rules/resources.smk"
include: "rules/setup.smk"
include: "rules/data.smk"
include: "rules/images.smk"
include: "rules/evaluate.smk"
include: "rules/training.smk"
include: "rules/report.smk"
include: "rules/study_coco_counterfactuals.smk"
include: "rules/study_social_counterfactuals.smk"
include: "rules/adaptive.smk"
include: "rules/study_countercurate.smk"
include: "rules/study_spurious_retrieval.smk"
include: "rules/study_cvld.smk"
include: "rules/release.smk"
include: "rules/export.smk"


rule all:
    default_target: True
    input:
        [target for study in STUDIES for target in STUDY_TARGETS[study]()],
        f"{RESULTS}/provenance.json",
        f"{RESULTS}/report/overview.html",
        [target for study in STUDIES for target in export_targets(study)],
