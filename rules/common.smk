# Helpers shared by the rule files.
import shlex
from pathlib import Path

from counterfactory import studies
from counterfactory.data.classification import dataset_input_files
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


def job_config(*keys, study=True):
    """``params`` value: the job's ``--config FILE``. FILE holds exactly the listed sections and is named by
    their digest, so a config edit reruns exactly the jobs whose sections changed. Keys are dotted
    (``models.mlm``); ``{role}``-style wildcards are filled in; a callable key returns a list of keys for the
    job's wildcards. ``study=False`` for shared jobs (tiny models, NLTK data)."""

    def value(wildcards):
        fill = dict(wildcards.items())
        names = []
        for k in keys:
            names += k(wildcards) if callable(k) else [k.format(**fill)]
        return wf.job_config_arg(config, wildcards.study if study else None, names)

    return value


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


def source_data(path, key, fix="see README 'What a paper-scale run needs'"):
    """A user-provided input (dataset file or folder): returned as an input when it exists; otherwise the
    DAG stops with the config key that names it, so a dry run reports missing data up front."""
    if not Path(path).exists():
        raise WorkflowError(f"{path} not found (config key {key}). Fix: put the data there or change {key}; {fix}")
    return str(path)


def coco_captions_json(wildcards):
    return source_data(
        wf.caption_json(view(wildcards.study)), f"{wildcards.study}.data.coco_root", "README 'Getting MS-COCO'"
    )


def coco_images(wildcards):
    spec = view(wildcards.study)["data"].get("source")
    if spec:  # own data: the caption table's file_name is each image's absolute path
        return source_data(
            OwnSource.from_spec(spec).image_root, f"{wildcards.study}.data.source.path", "README 'Your own data'"
        )
    return source_data(
        wf.image_dir(view(wildcards.study)), f"{wildcards.study}.data.coco_root", "README 'Getting MS-COCO'"
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
        return f"own-captions {job_config('data')(wildcards)}"
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


def train_eval_inputs(wildcards):
    """Everything a run evaluates on: the retrieval split and its images, the classification datasets."""
    v = view(wildcards.study)
    ev = v["training"]["eval"]
    out = []
    key = f"{wildcards.study}.training.eval.retrieval"
    for spec in retrieval_specs(v["training"]["eval"]):
        out += [
            source_data(spec["karpathy_json"], f"{key}[{spec['name']}].karpathy_json"),
            source_data(spec["image_root"], f"{key}[{spec['name']}].image_root"),
        ]

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
    args += " --no-default-eval"
    return args + (" --no-train" if wildcards.mixture == "pretrained" else "")


def itr_subsets(wildcards):
    """Extra ITR subsets a study's own steps make (label -> file), e.g. COCO-CF's A.1 in-domain test pairs."""
    return STUDY_ITR_SUBSETS.get(wildcards.study, lambda: {})()


def itr_subset_args(wildcards, input):
    import shlex

    return " ".join(f"--subset {shlex.quote(f'{label}={path}')}" for label, path in itr_subsets(wildcards).items())


# --- SocialCounterfactuals (rules/study_social_counterfactuals.smk) ---------------------------------------
def set_shards(wildcards):
    """Shard ids covering the study's caption sets at images.set_shard_size sets per job."""
    v = view(wildcards.study)
    return wf.shard_ids(social.n_sets(v), v["images"]["set_shard_size"])


def social_adaptive_keys(wildcards):
    """Adaptive set generation: the CLIP stage's settings and model decide which candidates are made."""
    v = view(wildcards.study)
    return ["filter.clip", f"models.{v['filter']['clip']['role']}"] if v["images"]["adaptive"]["enabled"] else []


def social_filter_shard_outputs(wildcards):
    """Every shard's outputs of the three filter stages."""
    names = ("clip", "clip_sets", "nsfw", "nsfw_sets", "kept", "detect_sets")
    return expand(
        f"{S}/filter/shards/{{shard}}/{{name}}.parquet", study=wildcards.study, shard=set_shards(wildcards), name=names
    )


def probe_images(wildcards):
    """The images bias probing ranks: after the CLIP stage (§4.2, 'before' NSFW / detectability) or the final set."""
    return f"{S}/filter/clip.parquet" if wildcards.stage == "before" else f"{S}/filter/kept.parquet"


def external_data(wildcards):
    """PATA / VisoGender files of probing.pata / probing.visogender (§5.3) that the config names."""
    probing_cfg = view(wildcards.study)["probing"]
    out = []
    for dataset, keys in (
        ("pata", ("files_list", "captions_json", "image_dir")),
        ("visogender", ("oo_tsv", "op_tsv", "image_dir")),
    ):
        for key in keys:
            path = probing_cfg[dataset].get(key)
            if path:
                out.append(source_data(path, f"{wildcards.study}.probing.{dataset}.{key}"))
    return out


def probe_roles(wildcards):
    return view(wildcards.study)["probing"]["roles"]


def debias_runs(wildcards):
    """Debiased runs for every seed; the pre-trained model once (first seed): it is not trained and the test split is
    fixed, so every seed would evaluate it identically (debias.summarize lets that one run stand for each seed)."""
    v = view(wildcards.study)
    pattern = f"{S}/debias/runs/{{role}}/{{segment}}/{{mixture}}/seed{{seed}}/metrics.csv"
    seeds = list(social.debias_seeds(v))
    return [
        path
        for mixture, mixture_seeds in (("pretrained", seeds[:1]), ("debiased", seeds))
        for path in expand(
            pattern,
            study=wildcards.study,
            role=v["debias"]["roles"],
            segment=social.debias_segments(v),
            mixture=mixture,
            seed=mixture_seeds,
        )
    ]


# --- CounterCurate (rules/study_countercurate.smk) ------------------------------------------------------------
def cc_entities_root(wildcards):
    root = view(wildcards.study)["data"]["entities_root"]
    return source_data(root or "<unset>", f"{wildcards.study}.data.entities_root", "README 'CounterCurate'")


def cc_generated_shards(wildcards):
    """generated.parquet of every shard; the shard ids come from the cc_request_shards checkpoint."""
    ids = Path(checkpoints.cc_request_shards.get(study=wildcards.study).output[0]).read_text().split()
    return expand(f"{S}/generation/shards/{{shard}}/generated.parquet", study=wildcards.study, shard=ids)


#: benchmark -> (config keys of its data and images under countercurate.benchmarks.<name>)
CC_BENCHMARK_KEYS = {
    "looktwice": ("dataset", "images"),
    "sugarcrepe": ("root", "images"),
    "winoground": ("examples", "images"),
}


def cc_benchmark_files(study, benchmark):
    """The data a benchmark reads: Flickr30k-Positions from this run, the others from the config's paths."""
    if benchmark == "positions":
        return [f"{RESULTS}/{study}/datasets/positions.parquet"]
    section = view(study)["benchmarks"].get(benchmark) or {}
    key = f"{study}.benchmarks.{benchmark}"
    return [source_data(section.get(k) or "<unset>", f"{key}.{k}") for k in CC_BENCHMARK_KEYS[benchmark]]


def cc_benchmark_inputs(wildcards):
    return cc_benchmark_files(wildcards.study, wildcards.benchmark)


def cc_benchmark_data_arg(wildcards, input):
    import shlex

    if wildcards.benchmark == "positions":
        return f"--data {shlex.quote(input.data[0])}"
    data, images = input.data
    return f"--data {shlex.quote(data)} --images {shlex.quote(images)}"


def cc_evaluations(wildcards):
    ev = view(wildcards.study)["evaluation"]
    return expand(
        f"{S}/evaluation/{{benchmark}}/{{role}}.csv",
        study=wildcards.study,
        benchmark=ev["benchmarks"],
        role=ev["roles"],
    )


#: the benchmark each dataset's fine-tuned models are scored on (§4.2-4.4)
def cc_train_benchmarks(wildcards):
    return cc_training.settings(view(wildcards.study))["benchmarks"][wildcards.dataset]


def cc_train_benchmark_inputs(wildcards):
    return [f for benchmark in cc_train_benchmarks(wildcards) for f in cc_benchmark_files(wildcards.study, benchmark)]


def cc_train_model_inputs(wildcards):
    return wf.local_model_inputs(config, cc_training.settings(view(wildcards.study))["role"])


def cc_train_model_key(wildcards):
    return [f"models.{cc_training.settings(view(wildcards.study))['role']}"]


def cc_train_run_args(wildcards, input):
    """--variant/--manifest (or --no-train) and the benchmark data of one CounterCurate fine-tuning run."""
    import shlex

    if wildcards.variant == "pretrained":
        args = ["--no-train"]
    else:
        manifest = f"{input.manifests}/{wildcards.dataset}_{wildcards.variant}.parquet"
        args = [f"--variant {wildcards.variant}", f"--manifest {shlex.quote(manifest)}"]
    return " ".join(args + cc_benchmark_args(wildcards, input))


def cc_vlm_run_args(wildcards, input):
    """--manifests (or --no-train) and the benchmark data of one fine-tuning run of the generative family."""
    import shlex

    args = ["--no-train"] if wildcards.mixture == "pretrained" else [f"--manifests {shlex.quote(input.manifests[0])}"]
    return " ".join(args + cc_benchmark_args(wildcards, input))


def cc_vlm_model_inputs(wildcards):
    return wf.local_model_inputs(config, cc_training.settings(view(wildcards.study))["vlm"]["role"])


def cc_vlm_model_key(wildcards):
    return [f"models.{cc_training.settings(view(wildcards.study))['vlm']['role']}"]


def cc_vlm_runs(wildcards):
    """metrics.csv of every generative-family run (dataset x seed) and its pre-trained evaluation (first seed)."""
    s = cc_training.settings(view(wildcards.study))
    seeds = [seed for seed, _ in cc_training.seed_pairs(view(wildcards.study))]
    pattern = f"{S}/finetune/vlm/{{dataset}}/{{mixture}}/seed{{seed}}/metrics.csv"
    datasets = s["vlm"]["datasets"]
    out = expand(pattern, study=wildcards.study, dataset=datasets, mixture=cc_training.VLM_MIXTURE, seed=seeds)
    return out + expand(pattern, study=wildcards.study, dataset=datasets, mixture="pretrained", seed=seeds[0])


def cc_benchmark_args(wildcards, input):
    """--data / --images of the benchmarks a fine-tuned dataset is scored on."""
    import shlex

    args = []
    for benchmark in cc_train_benchmarks(wildcards):
        if benchmark == "positions":
            args.append(f"--data positions={shlex.quote(input.positions)}")
            continue
        section = view(wildcards.study)["benchmarks"].get(benchmark) or {}
        data, images = (section.get(k) for k in CC_BENCHMARK_KEYS[benchmark])
        args += [f"--data {benchmark}={shlex.quote(data)}", f"--images {benchmark}={shlex.quote(images)}"]
    return args


def cc_train_runs(wildcards):
    """metrics.csv of every fine-tuning run (dataset x variant x seed) and every pre-trained evaluation (first seed)."""
    s = cc_training.settings(view(wildcards.study))
    seeds = [seed for seed, _ in cc_training.seed_pairs(view(wildcards.study))]
    pattern = f"{S}/finetune/runs/{{dataset}}/{{variant}}/seed{{seed}}/metrics.csv"
    out = [
        f
        for dataset in s["datasets"]
        for f in expand(pattern, study=wildcards.study, dataset=dataset, variant=s["variants"][dataset], seed=seeds)
    ]
    return out + expand(pattern, study=wildcards.study, dataset=s["datasets"], variant="pretrained", seed=seeds[0])


def cc_stats_baseline(wildcards):
    """Tests compare each variant with fine-tuning without grouping (§4.5) where every dataset has it."""
    return cc_training.stats_baseline(view(wildcards.study))


# --- Spurious-correlation retrieval (rules/study_spurious_retrieval.smk) ---------------------------------------
def sr(wildcards):
    return sr_settings.settings(view(wildcards.study))


def sr_source_inputs(wildcards):
    """The dataset's official files: Karpathy split and COCO instances (or Flickr30k Entities)."""
    src = sr(wildcards)["data"][wildcards.dataset]
    key = f"{wildcards.study}.data.{wildcards.dataset}"
    files = [source_data(src.get("karpathy_json") or "<unset>", f"{key}.karpathy_json")]
    if wildcards.dataset == "coco":
        files += [source_data(p, f"{key}.instances") for p in src.get("instances") or ["<unset>"]]
    else:
        files.append(source_data(src.get("entities_root") or "<unset>", f"{key}.entities_root"))
    return files


def sr_shard_ids(wildcards):
    return [f"{i:05d}" for i in range(sr(wildcards)["inpaint"]["shards"])]


def sr_image_shards(wildcards, method):
    return expand(
        f"{S}/{{dataset}}/images/{method}/{{shard}}/shard.parquet",
        study=wildcards.study,
        dataset=wildcards.dataset,
        shard=sr_shard_ids(wildcards),
    )


def sr_inpaint_models(wildcards):
    return wf.local_model_inputs(config, "inpaint") if wildcards.method == "lama" else []


def sr_inpaint_keys(wildcards):
    return ["inpaint"] + (["models.inpaint", *DEVICE_KEYS] if wildcards.method == "lama" else [])


def sr_variant_methods(wildcards):
    s = sr(wildcards)
    return sr_settings.image_methods(s, wildcards.dataset), sr_settings.text_methods(s, wildcards.dataset)


def sr_captioner_images(wildcards):
    return sr_image_shards(wildcards, sr(wildcards)["mixtures"]["variants"]["ours"]["image"])


def sr_synthetic_inputs(wildcards):
    out = [f"{RESULTS}/{wildcards.study}/{wildcards.dataset}/captions/synthetic.parquet"]
    if "captioner" in sr_variant_methods(wildcards)[1]:
        out.append(f"{RESULTS}/{wildcards.study}/{wildcards.dataset}/captions/captioner.parquet")
    return out


def sr_manifest_images(wildcards):
    return [f for method in sr_variant_methods(wildcards)[0] for f in sr_image_shards(wildcards, method)]


def sr_inpainted_args(wildcards, input):
    import shlex

    return " ".join(f"--inpainted {Path(p).parts[-3]}={shlex.quote(str(Path(p).parent))}" for p in input.images)


def sr_run_keys(wildcards):
    keys = ["evaluation", f"models.{wildcards.role}", *DEVICE_KEYS]
    return keys + ([] if wildcards.mixture == sr_settings.ZEROSHOT else ["training"])


def sr_data_seed(wildcards):
    return dict(sr_settings.seed_pairs(sr(wildcards)))[int(wildcards.seed)]


def sr_runs(wildcards):
    """metrics.csv of every run of the configuration (zero-shot once per model)."""
    from counterfactory.studies.spurious_retrieval.runs import runs

    return [
        f"{RESULTS}/{wildcards.study}/{d}/runs/{role}/{m}/seed{seed}/metrics.csv"
        for d, role, m, seed in runs(sr(wildcards))
    ]


# --- CVLD (rules/study_cvld.smk) ------------------------------------------------------------------------------
def cvld(wildcards):
    return cvld_settings.settings(view(wildcards.study))


def cvld_coco_inputs(wildcards):
    src = cvld(wildcards)["data"]["coco"]
    return [source_data(src.get("karpathy_json") or "<unset>", f"{wildcards.study}.data.coco.karpathy_json")]


def cvld_celeba_inputs(wildcards):
    root = cvld(wildcards)["data"]["celeba"]["root"] or "<unset>"
    return [source_data(root, f"{wildcards.study}.data.celeba.root")]


def cvld_text_llm(wildcards):
    return cvld(wildcards)["intervention"]["text_method"] == "llm"


def cvld_text_models(wildcards):
    return wf.local_model_inputs(config, "llm") if cvld_text_llm(wildcards) else []


def cvld_intervene_keys(wildcards):
    keys = ["data", "intervention", "editing.shards", "nltk"]
    return keys + (["llm", "models.llm", *DEVICE_KEYS] if cvld_text_llm(wildcards) else [])


def cvld_editor_role(method):
    return "editor" if method == "ip2p" else "sd"


def cvld_edit_models(wildcards):
    return wf.local_model_inputs(config, cvld_editor_role(wildcards.method), "image_encoder")


def cvld_edit_keys(wildcards):
    return ["editing", f"models.{cvld_editor_role(wildcards.method)}", "models.image_encoder", *DEVICE_KEYS]


def cvld_role(wildcards):
    from counterfactory.studies.cvld.runs import ROLES

    return ROLES[wildcards.task]


def cvld_needs_edits(wildcards):
    return wildcards.variant not in ("pretrained", "base", "balanced")


def cvld_edit_shards(wildcards, dataset):
    s = cvld(wildcards)
    return [
        f"{RESULTS}/{wildcards.study}/{dataset}/edits/{s['editing']['train_method']}/{i:05d}/shard.parquet"
        for i in range(s["editing"]["shards"])
    ]


def cvld_run_inputs(wildcards):
    """Model, training edits (variants with counterfactuals), COCO interventions and the evaluation data."""
    s = cvld(wildcards)
    out = {"models": wf.local_model_inputs(config, cvld_role(wildcards))}
    dataset = "celeba" if wildcards.task == "classification" else "coco"
    if cvld_needs_edits(wildcards):
        out["edits"] = cvld_edit_shards(wildcards, dataset)
    if dataset == "coco":
        out["interventions"] = f"{RESULTS}/{wildcards.study}/coco/text/captions.parquet"
    data = []
    if wildcards.task == "classification":
        data = cvld_celeba_inputs(wildcards)
    elif wildcards.task == "retrieval":
        if s["data"]["fairface"]["root"]:
            data.append(source_data(s["data"]["fairface"]["root"], f"{wildcards.study}.data.fairface.root"))
        if s["data"]["flickr30k"]["karpathy_json"]:
            data.append(
                source_data(s["data"]["flickr30k"]["karpathy_json"], f"{wildcards.study}.data.flickr30k.karpathy_json")
            )
    out["data"] = data
    return out


def cvld_interventions_arg(wildcards, input):
    return f"--interventions {shlex.quote(input.interventions)}" if "interventions" in input.keys() else ""


def cvld_run_keys(wildcards):
    return ["data", wildcards.task, f"models.{cvld_role(wildcards)}", *DEVICE_KEYS]


def cvld_runs(wildcards):
    """metrics.csv of every run of the configuration."""
    return [
        f"{RESULTS}/{wildcards.study}/runs/{r['task']}/{r['setting']}/{r['variant']}/seed{r['seed']}/metrics.csv"
        for r in cvld_settings.runs(cvld(wildcards))
    ]


# ---- exports (rules/export.smk)
EXPORT_RELEASE_STUDIES = [s for s in STUDIES if export_studies.STUDIES[s].release]


def export_targets(study):
    """The study's export outputs (for `all`): the card, and through it every layout."""
    return [f"{RESULTS}/{study}/export/README.md", f"{RESULTS}/{study}/report/examples.png"]


def study_finished(wildcards):
    """The study's final files: an export is made from a finished study (its image shards included)."""
    return STUDY_TARGETS[wildcards.study]()


def export_card_inputs(wildcards):
    """provenance.json and the export layouts; the funnel summaries the card reads are made before the study's
    final files (its layouts' inputs), and are not listed: which exist is only known after the run."""
    out = {
        "imagefolder": f"{RESULTS}/{wildcards.study}/export/imagefolder",
        "parquet": f"{RESULTS}/{wildcards.study}/export/parquet",
        "provenance": f"{RESULTS}/provenance.json",
    }
    if wildcards.study in EXPORT_RELEASE_STUDIES:
        out["release"] = f"{RESULTS}/{wildcards.study}/export/release"
    return out
