# Input functions and parameters of the CVLD rules (rules/study_cvld.smk).
# Kept in their own file: Snakemake's linter wants functions apart from rules.
import shlex


def cvld(wildcards):
    return cvld_settings.settings(view(wildcards.study))


def cvld_coco_inputs(wildcards):
    data = cvld(wildcards)["data"]
    key = f"{wildcards.study}.data.coco"
    files = [source_data(data["coco"].get("karpathy_json") or "<unset>", f"{key}.karpathy_json")]
    check_karpathy_layout(data["coco"], key, [n for names in data["splits"].values() for n in names])
    return files


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
    from counterfactory.studies.cvld.runs import role_of

    return role_of(cvld(wildcards), wildcards.task, wildcards.setting)


def cvld_lic_roles(wildcards):
    """Table 4 LIC's classifier role (lic_bert with captioning.lic_classifier: bert; Hirota et al. 2022 §4)."""
    if wildcards.task != "captioning":
        return []
    from counterfactory.studies.cvld.leakage import classifier_roles

    return list(classifier_roles(cvld(wildcards)["captioning"]))


def cvld_needs_edits(wildcards):
    return wildcards.variant not in ("pretrained", "base", "balanced")


def cvld_edit_shard_files(wildcards):
    """The shard manifests of one dataset and method (``cvld_edit_merge``'s input)."""
    return [
        f"{RESULTS}/{wildcards.study}/{wildcards.dataset}/edits/{wildcards.method}/{i:05d}/shard.parquet"
        for i in range(cvld(wildcards)["editing"]["shards"])
    ]


def cvld_edit_shards(wildcards, dataset):
    """The merged edit manifest of the train method (``cvld_edit_merge``'s output)."""
    s = cvld(wildcards)
    return [f"{RESULTS}/{wildcards.study}/{dataset}/edits/{s['editing']['train_method']}/edits.parquet"]


def cvld_run_inputs(wildcards):
    """Model, training edits (variants with counterfactuals), COCO interventions and the evaluation data."""
    s = cvld(wildcards)
    out = {"models": wf.local_model_inputs(config, cvld_role(wildcards), *cvld_lic_roles(wildcards))}
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
    elif s["data"]["nocaps"]["annotations"]:
        data.append(source_data(s["data"]["nocaps"]["annotations"], f"{wildcards.study}.data.nocaps.annotations"))
        if s["data"]["nocaps"]["image_root"]:
            data.append(source_data(s["data"]["nocaps"]["image_root"], f"{wildcards.study}.data.nocaps.image_root"))
    out["data"] = data
    return out


def cvld_interventions_arg(wildcards, input):
    return f"--interventions {shlex.quote(input.interventions)}" if "interventions" in input.keys() else ""


def cvld_run_keys(wildcards):
    # editing: which kept edits a training example uses (editing.per_example, §5.1)
    lic = [f"models.{r}" for r in cvld_lic_roles(wildcards)]
    return ["data", wildcards.task, "editing", f"models.{cvld_role(wildcards)}", *lic, *DEVICE_KEYS]


def cvld_runs(wildcards):
    """metrics.csv of every run of the configuration."""
    return [
        f"{RESULTS}/{wildcards.study}/runs/{r['task']}/{r['setting']}/{r['variant']}/seed{r['seed']}/metrics.csv"
        for r in cvld_settings.runs(cvld(wildcards))
    ]
