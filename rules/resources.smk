# Resources of every job. Rules declare only PORTABLE requests (threads, mem_mb, runtime in minutes, the
# accelerator count: gpu = CUDA GPUs, hpu = Intel Gaudi cards). Site settings (partition, account,
# GRES names, constraints) live in the cluster profiles (profiles/slurm, profiles/gaudi; README
# "Running on a cluster"). Memory and runtime grow with the shard size and with the retry attempt, so
# a job killed for memory or time asks for more on its next attempt.
#
# Estimates (paper scale, one A100-class GPU; CPU runs are slower by CPU_SLOWDOWN) come from the demo
# benchmarks (results/<run>/benchmarks/) and the work per job: caption candidates, UNet evaluations,
# training steps. Demo runs (every model role of a rule is a tiny stand-in) ask for little memory.
import math

_DEVICE = config.get("device", "auto")
# accelerator that model jobs ask for -- none on `device: cpu`, Gaudi cards on `device: hpu`, CUDA GPUs
# otherwise (`auto` asks for a GPU; on a machine without one it still runs on the CPU)
GPU = 0 if _DEVICE in ("cpu", "hpu") else 1
HPU = 1 if _DEVICE == "hpu" else 0
CPU_SLOWDOWN = 1 if GPU or HPU else 20
# Retries are NOT declared per rule: the profiles set them (`retries:`, Snakemake's --retries). A rule's
# own `retries:` would also apply inside the Slurm job, where the jobstep would rerun a failed job in
# the same allocation (same memory, same time limit) before Snakemake resubmits it with more.
MAX_RUNTIME = 7 * 24 * 60  # minutes; lower site limits: shrink the shard sizes (runtime is linear in them)


def tiny_roles(*roles):
    """True when every role is a tiny stand-in built by the `models_build_tiny` rule (the offline demo)."""
    return len(wf.tiny_model_inputs(config, *roles)) == len(roles)


def scaled(base, per_item=0.0, items=0, cap=None):
    """Resource callable: ``(base + per_item * items) * attempt``, rounded up and capped."""

    def value(wildcards, attempt):
        amount = math.ceil((base + per_item * items) * attempt)
        return min(amount, cap) if cap else amount

    return value


def model_mem(full_mb, *roles, tiny_mb=2500, per_item=0.0, items=0):
    """mem_mb callable for a job that loads ``roles``: small for tiny stand-ins, ``full_mb`` otherwise."""
    return scaled(tiny_mb if tiny_roles(*roles) else full_mb, per_item, items)


def model_mem_of(full_mb, tiny_mb=2500):
    """mem_mb callable for a job loading the model of its ``{model}`` wildcard (e.g. the A.1 in-domain runs)."""
    return lambda wildcards, attempt: model_mem(full_mb, wildcards.model, tiny_mb=tiny_mb)(wildcards, attempt)


def model_mem_of_role(full_mb, tiny_mb=2500):
    """mem_mb callable for a job loading the model of its ``{role}`` wildcard."""
    return lambda wildcards, attempt: model_mem(full_mb, wildcards.role, tiny_mb=tiny_mb)(wildcards, attempt)


def social_images_minutes(study):
    """UNet rows x steps of one set-generation shard: sets x candidates x members x 2 (guidance), ~0.03 s per
    row-step on a GPU (x CPU_SLOWDOWN); members of the largest segment."""
    v = view(study)["images"]
    rows = v["set_shard_size"] * v["candidates_per_set"] * 60 * 2
    return rows * v["steps"] * 0.03 * CPU_SLOWDOWN / 60 / 8


def social_images(study):
    """Generated images of the study: caption sets x candidates x members (members: at most 60 per set)."""
    v = view(study)
    return social.n_sets(v) * v["images"]["candidates_per_set"] * 20


def social_scoring_minutes(study):
    """One pass of a CLIP / ViT over every generated image, ~2 ms an image on a GPU (x CPU_SLOWDOWN)."""
    return 10 + social_images(study) * 0.002 * CPU_SLOWDOWN / 60


def social_filter_minutes(study):
    """One filter stage over one generation shard's images."""
    v = view(study)
    shards = max(1, math.ceil(social.n_sets(v) / v["images"]["set_shard_size"]))
    return 10 + social_images(study) / shards * 0.002 * CPU_SLOWDOWN / 60


def minutes(base, per_item=0.0, items=0):
    """runtime callable (minutes), capped at MAX_RUNTIME."""
    return scaled(base, per_item, items, cap=MAX_RUNTIME)


def accel_threads(*roles):
    """CPU threads next to an accelerator (data loading, tokenising); 1 for tiny demo models, so that two
    demo jobs run side by side on a 2-core machine (tiny models gain nothing from a second thread)."""
    return 1 if tiny_roles(*roles) else 4


def cc_train_threads(wildcards):
    """accel_threads of the role CounterCurate fine-tunes."""
    return accel_threads(cc_training.settings(view(wildcards.study))["role"])


def sr_inpaint_threads(wildcards):
    """LaMa on the accelerator (or the tiny stand-in, 1 thread); the paddings are NumPy/OpenCV on 1 thread."""
    return accel_threads("inpaint") if wildcards.method == "lama" else 1


def cc_vlm_threads(wildcards):
    return accel_threads(cc_training.settings(view(wildcards.study))["vlm"]["role"])


def cc_vlm_mem(wildcards, attempt):
    """Host memory of fine-tuning the vlm role: LLaVA-1.5-7B's weights and fp32 Adam states; tiny stand-ins 2.5 GB."""
    role = cc_training.settings(view(wildcards.study))["vlm"]["role"]
    return model_mem(128000, role)(wildcards, attempt)


# --- work per job (per study: the {study} wildcard picks the config section) -------------------------
def shard_items(study, stage):
    """Items in one shard of ``stage``."""
    return min(view(study)[stage]["shard_size"], max(n_captions(study), 1))


def images_minutes(study):
    """UNet rows x steps of one image shard: candidates x 2 prompts x 2 (classifier-free guidance), in
    units of a 512 x 512 image; ~0.01 s each on an A100-class GPU in batches of 8 candidates."""
    img = view(study)["images"]
    rows = shard_items(study, "images") * img["candidates_per_pair"] * 4 * img["steps"]
    return 1.5 * rows * img["height"] * img["width"] / 512**2 * 0.01 * CPU_SLOWDOWN / 60


def train_minutes(study):
    """Optimiser steps of one training run (a mixture holds at most every caption plus its
    counterfactual), ~0.5 s per step (batch 128, ViT-B/32)."""
    tr = view(study)["training"]
    steps = tr["epochs"] * math.ceil(2 * max(n_captions(study), 1) * (1 - tr["val_fraction"]) / tr["batch_size"])
    return 1.5 * min(steps, tr.get("max_steps") or steps) * 0.5 * CPU_SLOWDOWN / 60


def per_study(fn, attempt_scaled=True, cap=MAX_RUNTIME):
    """Resource callable from a function of the study: ``ceil(fn(study) * attempt)``, capped."""

    def value(wildcards, attempt):
        amount = math.ceil(fn(wildcards.study) * (attempt if attempt_scaled else 1))
        return min(amount, cap) if cap else amount

    return value


# Cheap bookkeeping runs in the Snakemake process itself (on a cluster: the login node), never
# through the scheduler: checks, tables, merges, plots, provenance, downloads/set-up that need network.
localrules:
    data_check,
    data_captions,
    captions_merge,
    images_merge,
    evaluate_itr_table,
    evaluate_itm_summary,
    evaluate_classify_table,
    train_mixtures,
    train_collect,
    stats_summarize,
    stats_table,
    train_plot_curves,
    report_pair_grid,
    report_caption_examples,
    nltk_prepare,
    provenance,
    report_overview,
    export_card,
    report_examples,
    images_adaptive_curve,
    images_adaptive_curve_social,
    analysis_label_frequency,
    train_in_domain_split,
    train_collect_in_domain,
    stats_summarize_in_domain,
    train_in_domain_table,
    social_captions,
    social_generate_merge,
    social_filter_table,
    social_image_quality_table,
    social_filter_merge,
    social_probe_tables,
    social_probe_plots,
    social_debias_split,
    train_collect_social,
    social_debias_table,
    social_debias_task_table,
    data_flickr30k_captions,
    countercurate_positions,
    countercurate_counting,
    countercurate_requests,
    countercurate_request_shards,
    countercurate_generate_merge,
    countercurate_datasets,
    countercurate_tables,
    countercurate_paper_tables,
    countercurate_train_manifests,
    train_collect_countercurate,
    stats_summarize_countercurate,
    stats_table_countercurate,
    train_collect_countercurate_vlm,
    stats_summarize_countercurate_vlm,
    stats_table_countercurate_vlm,
    spurious_manifests,
    train_collect_spurious,
    stats_summarize_spurious,
    spurious_tables,
    cvld_requests,
    cvld_edit_merge,
    train_collect_cvld,
    cvld_tables,


def cvld_run_threads(wildcards):
    """accel_threads of the BLIP role a CVLD run trains."""
    from counterfactory.studies.cvld.runs import ROLES

    return accel_threads(ROLES[wildcards.task])


def cvld_run_mem(wildcards, attempt):
    from counterfactory.studies.cvld.runs import ROLES

    return model_mem(48000, ROLES[wildcards.task], tiny_mb=3000)(wildcards, attempt)
