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
from snakemake.logging import logger
from snakemake.utils import min_version

from counterfactory import preflight, studies
from counterfactory import workflow as wf
from counterfactory.config import (
    ConfigError,
    check_yaml_syntax,
    drop_replaced_revisions,
    validate_config,
    workflow_layers,
    workflow_role_origins,
)

min_version("9.0")


# A YAML syntax error in the workflow's config file stops the run naming the file, line and column
# (Snakemake's own message names neither). Files given with --configfile are parsed by Snakemake before
# this Snakefile runs: `counterfactory config check FILE...` names the line for those.
try:
    check_yaml_syntax(["config/config.yaml"])
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None


configfile: "config/config.yaml"


# front page of `snakemake --report`: which studies ran; every result listed with the rule that made it
report: "report/workflow.rst"


# A model revision pinned in config/config.yaml belongs to its hub id: an overlay that gives the role another
# source drops it. The package's validator checks the schema, fills in its defaults and checks what a schema cannot
# (bound orders); a mistake stops the run with one message naming each key at fault.
try:
    drop_replaced_revisions(
        config,
        workflow_layers(workflow.config_settings.configfiles, dict(workflow.config_settings.config)),
    )
    validate_config(config, source="Snakemake config (--configfile / --config)")
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None


# Every run (a dry run too) lists each model role's source and the file that set it: a role an overlay leaves out
# is the paper's hub model from config/config.yaml, and says so.
logger.info(
    workflow_role_origins(
        config,
        workflow.config_settings.configfiles,
        dict(workflow.config_settings.config),
    )
)


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


# each study's own steps and targets, rules/study_<study>.smk, for every study package with a spec
# (counterfactory.studies.specs(), in their declared order; docs/architecture.md, "Adding a study")
for _study in studies.specs():

    include: _study.rules_file


include: "rules/adaptive.smk"
include: "rules/release.smk"
include: "rules/export.smk"
include: "rules/score.smk"
include: "rules/verify.smk"
include: "rules/filters.smk"


# Start-up check of `all` (counterfactory.preflight.StartupGate): every dataset and model role the enabled studies
# need, looked up once, offline, before any job is planned. A missing dataset stops the planning with the whole list
# (each with its config key and where to get it): the shards follow from the data. A model role that is missing or of
# the wrong class stops a real run before its first job; a dry run lists it and still plans. `counterfactory
# preflight` adds the disk, NLTK data and GPU memory.
STARTUP = preflight.StartupGate()


rule all:
    default_target: True
    input:
        startup_check,
        [target for study in STUDIES for target in STUDY_TARGETS[study]()],
        f"{RESULTS}/provenance.json",
        f"{RESULTS}/report/overview.html",
        [target for study in STUDIES for target in export_targets(study)],
        score_targets(),
        [target for study in STUDIES for target in verify_targets(study)],
        [target for study in STUDIES for target in filter_card_targets(study)],
