# Helpers shared by the rule files.
import shlex
import sys
from pathlib import Path

from counterfactory import studies
from counterfactory.data.classification import dataset_input_files as _dataset_input_files
from counterfactory.data.karpathy import layout_problem as karpathy_layout_problem
from counterfactory.data.own import OwnSource
from counterfactory.export import studies as export_studies
from counterfactory.studies import social_counterfactuals as social
from counterfactory.studies.countercurate import training as cc_training
from counterfactory.studies.spurious_retrieval import settings as sr_settings
from counterfactory.studies.cvld import settings as cvld_settings
from counterfactory.training.runs import retrieval_specs

# every rule runs in the project's one environment (`--software-deployment-method conda`)
CONDA_ENV = "../envs/counterfactory.yaml"
# a study's results folder; {study} is a wildcard, so a stage's rules serve every study
S = f"{RESULTS}/{{study}}"


wildcard_constraints:
    study="|".join(STUDIES),
    shard=r"\d+",
    seed=r"\d+",
    role=r"[A-Za-z0-9_]+",
    dataset=r"[A-Za-z0-9_.-]+",


def view(study):
    """The study's view of the config: shared sections + the study's own sections at top level."""
    return wf.view(config, study)


def study_title(wildcards):
    """Report category of a result: its study's title (the combined report groups results by study)."""
    return studies.title(wildcards.study)


def result_label(relpath):
    """``report(labels=...)``: the result's short name in the report (study folder path ``relpath``, with the
    rule's wildcards; counterfactory.report_labels names it from the paper's table / figure numbers)."""
    from counterfactory import report_labels

    def value(wildcards):
        fill = dict(wildcards.items())
        try:
            path = relpath.format(**fill)
        except (KeyError, IndexError):  # a wildcard the report did not pass: name the pattern
            path = relpath
        return report_labels.labels(path, fill.get("study"))

    return value


def report_section(name):
    """The ``subcategory`` of a ``report`` item: the sub-group ``name`` numbered in its study's paper order
    (counterfactory.report_labels.section, the study spec's report_sections; Snakemake's panel sorts sub-groups
    alphabetically)."""
    from counterfactory import report_labels, studies

    report_labels.section(name)  # an unknown name fails when the rules load

    def value(wildcards):
        study = dict(wildcards.items()).get("study")
        order = studies.spec(study).report_sections if study in studies.names() else ()
        return report_labels.section(name, order)

    return value


# Job configurations: path -> YAML text, filled while the DAG is planned; the local rule config_write_job writes them.
JOB_CONFIG_TEXT = {}


def job_config(*keys, study=True):
    """Input function: the job's configuration file (pass it as ``--config {input.config:q}``). The file holds
    exactly the listed sections and is named by their digest, so a config edit reruns exactly the jobs whose
    sections changed (a changed input). Keys are dotted (``models.mlm``); ``{role}``-style wildcards are filled
    in; a callable key returns a list of keys for the job's wildcards. ``study=False`` for shared jobs (tiny
    models, NLTK data); a study name: that study's view for a job without a {study} wildcard (the leaderboard). Parsing writes nothing: the file is the output of the local rule ``config_write_job``.
    """

    def value(wildcards):
        fill = dict(wildcards.items())
        names = []
        for k in keys:
            names += k(wildcards) if callable(k) else [k.format(**fill)]
        name = wildcards.study if study is True else (study or None)  # a str: that study's view
        path, text = wf.job_config_file(config, name, names)
        JOB_CONFIG_TEXT[path] = text
        return ancient(path)

    return value


def run_config():
    """Input function: the whole resolved configuration as one content-addressed file (provenance)."""

    def value(wildcards):
        path, text = wf.run_config_file(config)
        JOB_CONFIG_TEXT[path] = text
        return ancient(path)

    return value


def job_config_text(wildcards, output):
    path = str(output[0])
    if path not in JOB_CONFIG_TEXT:
        raise WorkflowError(
            f"{path}: no job needs this configuration in this run. Fix: target the result files, not the job "
            "configurations under .snakemake/counterfactory/"
        )
    return JOB_CONFIG_TEXT[path]


def display_labels(wildcards):
    """``--label ROLE=NAME`` for every configured model role: tables name models as the config's
    ``models.<role>.display_name`` (default: the source's last part), as issue 32 asks."""
    from counterfactory.render import model_display_names

    from counterfactory.report_labels import name_flags

    # shell: {params.labels.flags}; the report's "Job parameters" read "mlm, lm, clip_eval: tiny CLIP, ..."
    return name_flags("--label", model_display_names(config["models"], list(config["models"])))


def model_inputs(*roles):
    """Input function: local model folders of the roles (wildcards such as ``{role}`` filled in)."""

    def value(wildcards):
        fill = dict(wildcards.items())
        return wf.local_model_inputs(config, *[r.format(**fill) for r in roles])

    return value


def n_captions(study):
    return wf.caption_count(view(study))


def shards(study, stage):
    """Zero-padded shard ids covering the study's input captions at ``<stage>.shard_size`` per job."""
    return wf.shard_ids(n_captions(study), view(study)[stage]["shard_size"])


def per_shard(pattern, stage):
    """Input function: ``pattern`` (with {study} and {shard}) for every shard of ``stage``."""

    def value(wildcards):
        return expand(pattern, study=wildcards.study, shard=shards(wildcards.study, stage))

    return value


# Settings that change what a model computes on a device.
DEVICE_KEYS = ("device", "precision", "performance")


def source_data(path, key, fix="see the study's page in docs/studies/"):
    """A user-provided input (dataset file or folder): returned as an input when it exists; otherwise the
    DAG stops with the config key that names it, so a dry run reports missing data up front."""
    if not Path(path).exists():
        raise WorkflowError(f"{path} not found (config key {key}). Fix: put the data there or change {key}; {fix}")
    try:
        preflight.check_source_read(config, key, str(path))
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None
    return str(path)


def check_karpathy_layout(spec, key, splits):
    """Stop the DAG when a sample of a Karpathy file's images is not at image_root/filepath/filename."""
    problem = karpathy_layout_problem(spec["karpathy_json"], spec["image_root"] or "<unset>", splits)
    if problem:
        raise WorkflowError(f"{key}: {problem}. Fix: point {key}.image_root (or the catalogue's dataset root) there")


def dataset_input_files(spec, name):
    """The files a classification dataset's reader opens (its official layout), each checked as a source read."""
    files = _dataset_input_files(spec, name)
    for path in files:
        try:
            preflight.check_source_read(config, f"classification dataset {name}", str(path))
        except ConfigError as exc:
            raise WorkflowError(str(exc)) from None
    return files


def startup_check(wildcards):
    """Input function of `all`: the start-up check (STARTUP, Snakefile). A failure ends the run with the grouped
    table above and exit status 1, not with Snakemake's traceback of this function."""
    try:
        return STARTUP.check(config, workflow.dryrun, logger.warning)
    except preflight.PreflightError as exc:
        logger.error(str(exc))
        sys.exit(1)


def retrieval_set_files(spec, key, splits=None):
    """A Karpathy split file and its image folder, as inputs; a sample of the images the job will open
    (image_root/filepath/filename) must be there, so a wrong image_root stops the DAG, not the job after training."""
    files = [
        source_data(spec["karpathy_json"], f"{key}.karpathy_json"),
        source_data(spec["image_root"], f"{key}.image_root"),
    ]
    check_karpathy_layout(spec, key, splits or [spec.get("split", "test")])
    return files


def coco_captions_json(wildcards):
    return source_data(
        wf.caption_json(view(wildcards.study)),
        f"{wildcards.study}.data.coco_root",
        "see docs/studies/coco_counterfactuals.md",
    )


def coco_images(wildcards):
    spec = view(wildcards.study)["data"].get("source")
    if spec:  # own data: the caption table's file_name is each image's absolute path
        return source_data(
            OwnSource.from_spec(spec).image_root, f"{wildcards.study}.data.source.path", "README 'Your own data'"
        )
    return source_data(
        wf.image_dir(view(wildcards.study)),
        f"{wildcards.study}.data.coco_root",
        "see docs/studies/coco_counterfactuals.md",
    )


def own_source(wildcards):
    """The study's own-data source (absolute paths), or None for MS-COCO."""
    spec = view(wildcards.study)["data"].get("source")
    return OwnSource.from_spec(spec) if spec else None


def source_inputs(wildcards):
    """MS-COCO: the captions JSON and the image folder. Own data: the table or folder, the image root and
    the boxes JSON; a missing one stops the dry run naming its config key."""
    src = own_source(wildcards)
    if src is None:
        return {"captions": coco_captions_json(wildcards), "images": coco_images(wildcards)}
    key = f"{wildcards.study}.data.source"
    return {k: source_data(path, f"{key}.{k}", "README 'Your own data'") for k, path in src.input_files().items()}


def check_args(wildcards):
    """The check step and its options: check-coco of the COCO root, or own-check of data.source."""
    if own_source(wildcards):
        return "own-check"
    data = view(wildcards.study)["data"]
    return f"check-coco --root {shlex.quote(data['coco_root'])} --split {shlex.quote(data['split'])}"


def caption_table_args(wildcards, input):
    """The table step and its input: captions of the COCO captions JSON, or own-captions of data.source."""
    if own_source(wildcards):
        return f"own-captions --config {shlex.quote(input.config)}"
    return f"captions --captions-json {shlex.quote(input.captions)}"


def eval_section(wildcards, part):
    return view(wildcards.study)["evaluation"][part]


def shortlist_roles(wildcards):
    role = (eval_section(wildcards, "itr").get("shortlist") or {}).get("role")
    return [role] if role else []


def eval_roles(part):
    """Input helper: the model roles evaluated by ``part`` (itr, itm, classification)."""
    return lambda wildcards: eval_section(wildcards, part)["models"]


def classification_dataset_files(wildcards):
    datasets = eval_section(wildcards, "classification")["datasets"]
    if wildcards.dataset not in datasets:
        raise WorkflowError(f"{wildcards.study}.evaluation.classification.datasets has no '{wildcards.dataset}'")
    return dataset_input_files(datasets[wildcards.dataset], wildcards.dataset)


def training(wildcards):
    return view(wildcards.study)["training"]


def mixtures(wildcards):
    return list(training(wildcards)["mixtures"])


def seeds(wildcards):
    return dict(wf.seed_pairs(training(wildcards)))


def runs_of(name):
    """Input function: ``name`` (metrics.csv / history.csv) of every (mixture, seed) run of the study."""

    def value(wildcards):
        return expand(
            f"{S}/training/runs/{{mixture}}/seed{{seed}}/{name}",
            study=wildcards.study,
            mixture=mixtures(wildcards),
            seed=list(seeds(wildcards)),
        )

    return value


def mixtures_as_listed(wildcards):
    """training.mixtures in the order the config files list them (the cached view's keys are sorted): the order
    of the paper's table rows."""
    return list(((config.get(wildcards.study) or {}).get("training") or {}).get("mixtures") or {})


def pretrained_run(wildcards):
    """Input function: the pre-trained row's run (metrics.csv) when training.pretrained_row is set."""
    if not training(wildcards).get("pretrained_row"):
        return []
    return [f"{RESULTS}/{wildcards.study}/training/pretrained/metrics.csv"]


def pretrained_row_args(wildcards):
    """`stats table` options of the pre-trained row (Tables 3, 4 and 12), or nothing."""
    import shlex

    from counterfactory.report_labels import CliFlags

    label = training(wildcards).get("pretrained_row")
    if not label:
        return CliFlags("", "no pre-trained row")
    return CliFlags(f"--pretrained-row pretrained --pretrained-label {shlex.quote(label)}", f"row {label!r}")


def mixture_label_args(wildcards):
    """`stats table --mixture-label KEY=NAME` of every mixture: the paper's row names of Tables 3, 4 and 12
    (`training.mixture_names`, default: the key)."""
    import shlex

    from counterfactory.report_labels import name_flags

    return name_flags("--mixture-label", coco_cf.mixture_display_names(training(wildcards)))


def train_eval_inputs(wildcards):
    """Everything a run evaluates on: the retrieval split and its images, the classification datasets."""
    v = view(wildcards.study)
    ev = v["training"]["eval"]
    out = []
    key = f"{wildcards.study}.training.eval.retrieval"
    for spec in retrieval_specs(v["training"]["eval"]):
        out += retrieval_set_files(spec, f"{key}[{spec['name']}]")

    out += classification_inputs(wildcards)
    return out


def classification_inputs(wildcards):
    """Files of the classification datasets the fine-tuned models are evaluated on (training.eval)."""
    v = view(wildcards.study)
    datasets = v["evaluation"]["classification"]["datasets"]
    out = []
    for name in v["training"]["eval"].get("classification") or []:
        if name not in datasets:
            raise WorkflowError(
                f"{wildcards.study}.training.eval.classification names '{name}', which is not in "
                f"{wildcards.study}.evaluation.classification.datasets. Fix: add it there or remove it"
            )
        out += dataset_input_files(datasets[name], name)
    return out


def in_domain_runs(wildcards):
    """metrics.csv of every A.1 in-domain run: per model of in_domain.models its pre-trained evaluation
    (one run) and in_domain.mixtures x training seeds."""
    section = view(wildcards.study)["in_domain"]
    pattern = f"{S}/in_domain/runs/{{model}}/{{mixture}}/seed{{seed}}/metrics.csv"
    first = list(seeds(wildcards))[0]
    out = []
    for model in section["models"]:
        out += expand(pattern, study=wildcards.study, model=model, mixture="pretrained", seed=first)
        out += expand(
            pattern, study=wildcards.study, model=model, mixture=section["mixtures"], seed=list(seeds(wildcards))
        )
    return out


def in_domain_run_args(wildcards, input):
    """Options of an in-domain run: the model role (also its experiment), the test pairs, no default evaluations,
    and no training for the pre-trained row."""
    import shlex

    args = f"--role {wildcards.model} --experiment {wildcards.model} --eval-pairs {shlex.quote(input.test)}"
    args += " --no-default-eval --in-domain-recipe"
    return args + (" --no-train" if wildcards.mixture == "pretrained" else "")


def itr_subsets(wildcards):
    """Extra ITR subsets a study's own steps make (label -> file), e.g. COCO-CF's A.1 in-domain test pairs."""
    return STUDY_ITR_SUBSETS.get(wildcards.study, lambda: {})()


def itr_subset_args(wildcards, input):
    import shlex

    return " ".join(f"--subset {shlex.quote(f'{label}={path}')}" for label, path in itr_subsets(wildcards).items())


# ---- exports (rules/export.smk)
#: studies that declare an export (SPEC.export); a study without one has no export targets
EXPORTS = {s: studies.exports()[s] for s in STUDIES if s in studies.exports()}
EXPORT_STUDIES = list(EXPORTS)
EXPORT_RELEASE_STUDIES = [s for s, e in EXPORTS.items() if e.release]
#: studies with an image-caption retrieval set: exported in CLIP_benchmark's webdataset layout too
EXPORT_CLIP_BENCHMARK_STUDIES = [s for s, e in EXPORTS.items() if e.retrieval]


def export_targets(study):
    """The study's export outputs (for `all`): the card, and through it every layout, and the examples grid
    (none for a study that declares no export)."""
    if study not in EXPORT_STUDIES:
        return []
    return [f"{RESULTS}/{study}/export/README.md", examples_grid(study)]


def study_finished(wildcards):
    """The study's final files: an export is made from a finished study (its image shards included)."""
    return STUDY_TARGETS[wildcards.study]()


def export_imagefolder_inputs(wildcards):
    """The study's final files and, with verify.enabled for a covered study, its verified variant (exported as
    ``<config>_verified``; nothing changes with verify off)."""
    out = {"finished": study_finished(wildcards)}
    verified = [t for t in verify_targets(wildcards.study) if Path(t).name == "verified.parquet"]
    if verified and studies.spec(wildcards.study).export.verified is not None:
        out["verified"] = verified[0]
    return out


def export_verified_arg(wildcards, input):
    return f"--verified {shlex.quote(input.verified)}" if "verified" in input.keys() else ""


def export_manifests(study):
    """The manifests of the study's export layouts (kept outside the uploaded folders): layout -> path."""
    out = {
        "imagefolder": f"{RESULTS}/{study}/manifests/export_imagefolder.json",
        "parquet": f"{RESULTS}/{study}/manifests/export_parquet.json",
    }
    if study in EXPORT_RELEASE_STUDIES:
        out["release"] = f"{RESULTS}/{study}/manifests/export_release.json"
    if study in EXPORT_CLIP_BENCHMARK_STUDIES:
        out["clip_benchmark"] = f"{RESULTS}/{study}/manifests/export_clip_benchmark.json"
    return out


#: paths under each study folder that provenance.json does not record: the files made from it (the dataset card
#: and the filter cards copied beside it) and what changes run to run (logs, timings)
PROVENANCE_SKIP = ["logs/", "benchmarks/", "export/README.md", "export/filter_cards/"]


def examples_grid(study):
    """The study's examples grid (made from its imagefolder export; provenance records it, so it waits for it)."""
    return f"{RESULTS}/{study}/report/examples.png"


def export_card_inputs(wildcards):
    """provenance.json, the export layouts' manifests and the card.json of each audited filter (``filter_card_<name>``;
    none in the paper config); the funnel summaries the card reads are made before the study's final files (its
    layouts' inputs), and are not listed: which exist is only known after the run."""
    cards = {f"filter_card_{Path(d).name}": f"{d}/card.json" for d in filter_card_dirs(wildcards.study)}
    return {**export_manifests(wildcards.study), "provenance": f"{RESULTS}/provenance.json", **cards}


def export_card_filter_args(wildcards, input):
    """``--filter-card DIR`` of each audited filter's card folder (copied beside the dataset card)."""
    import shlex

    return " ".join(
        f"--filter-card {shlex.quote(str(Path(path).parent))}"
        for name, path in input.items()
        if name.startswith("filter_card_")
    )
