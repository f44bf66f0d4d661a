# Input functions and parameters of the CounterCurate rules (rules/study_countercurate.smk).
# Kept in their own file: Snakemake's linter wants functions apart from rules.
import shlex


def cc_entities_root(wildcards):
    root = view(wildcards.study)["data"]["entities_root"]
    return source_data(root or "<unset>", f"{wildcards.study}.data.entities_root", "see docs/studies/countercurate.md")


def cc_images(wildcards):
    """The Flickr30k images the CounterCurate steps read: data.images, else <entities_root>/flickr30k-images."""
    data = view(wildcards.study)["data"]
    images = data.get("images") or str(Path(data["entities_root"] or "<unset>") / "flickr30k-images")
    key = f"{wildcards.study}.data.images" if data.get("images") else f"{wildcards.study}.data.entities_root"
    return source_data(images, key, "see docs/studies/countercurate.md")


def cc_generated_shards(wildcards):
    """generated.parquet of every shard; the shard ids come from the countercurate_request_shards checkpoint."""
    ids = Path(checkpoints.countercurate_request_shards.get(study=wildcards.study).output[0]).read_text().split()
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
    """The benchmarks' data and, for Table 5's runs (§4.5), the MS-COCO retrieval split and its images."""
    files = [f for benchmark in cc_train_benchmarks(wildcards) for f in cc_benchmark_files(wildcards.study, benchmark)]
    s = cc_training.settings(view(wildcards.study))
    spec = cc_training.retrieval_spec(view(wildcards.study))
    if spec and wildcards.dataset in s["retrieval_datasets"]:
        files += retrieval_set_files(spec, f"{wildcards.study}.training.retrieval")
    return files


def cc_attributes_role(wildcards):
    """The role in GPT-4V's place for Flickr30k-Attributes (countercurate.attributes.role, §3.4, app. A)."""
    return view(wildcards.study)["attributes"]["role"]


def cc_attributes_model_inputs(wildcards):
    return wf.local_model_inputs(config, cc_attributes_role(wildcards))


def cc_attributes_model_key(wildcards):
    return [f"models.{cc_attributes_role(wildcards)}"]


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


def cc_paper_table_inputs(wildcards):
    """The fine-tuning summaries the enabled families write, and every evaluation (Table 3's NegCLIP column)."""
    s = cc_training.settings(view(wildcards.study))
    out = {"evaluations": cc_evaluations(wildcards)}
    if s["datasets"]:
        out["clip"] = f"{S}/finetune/summary.csv".format(study=wildcards.study)
    if s["vlm"]["datasets"]:
        out["vlm"] = f"{S}/finetune/vlm_summary.csv".format(study=wildcards.study)
    return out


def cc_paper_table_args(wildcards, input):
    """Flags of ``countercurate paper-tables``: the summaries, the roles, and the role in GPT-4V's place (the
    attributes role, when it is evaluated: Table 3's GPT-4V column)."""
    v = view(wildcards.study)
    s = cc_training.settings(v)
    flags = [f"--clip-role {s['role']}", f"--vlm-role {s['vlm']['role']}"]
    if "clip" in input.keys():
        flags.append(f"--clip-summary {shlex.quote(input.clip)}")
    if "vlm" in input.keys():
        flags.append(f"--vlm-summary {shlex.quote(input.vlm)}")
    if input.evaluations:
        flags.append("--results " + " ".join(shlex.quote(f) for f in input.evaluations))
    stand_in = cc_attributes_role(wildcards)
    if stand_in in v["evaluation"]["roles"]:
        flags.append(f"--gpt4v {stand_in}")
    return " ".join(flags)
