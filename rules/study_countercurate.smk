# CounterCurate (Zhang et al., 2024): Flickr30k-Positions, -Counting and -Attributes from Flickr30k Entities with open
# models in the closed models' roles, and the compositional benchmarks. Settings: the `countercurate:` config
# section; results under results/<run>/countercurate/.
import shlex

from counterfactory.studies import countercurate as cc
from counterfactory.studies.countercurate import benchmark_tables as cc_tables

CC = "countercurate"
CC_DIR = f"{RESULTS}/{CC}"


include: "study_countercurate_inputs.smk"


rule data_flickr30k_captions:
    """Flickr30k Entities captions with their phrase markup (the input of Flickr30k-Attributes, §3.4)."""
    input:
        entities=cc_entities_root,
        images=cc_images,
    output:
        f"{S}/data/flickr30k_captions.parquet",
    log:
        f"{S}/logs/data/flickr30k_captions.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    shell:
        "counterfactory data flickr30k-captions --entities-root {input.entities:q} --images {input.images:q}"
        " --out {output:q} > {log:q} 2>&1"


rule countercurate_positions:
    """§3.2, app. B, D: object pairs, left/right/above/below captions, flipped LR negatives, 4:1 split, requests."""
    input:
        entities=cc_entities_root,
        images=cc_images,
        config=job_config("positions", "positions_rewrite", "data"),
    output:
        table=f"{S}/positions/items.parquet",
        llm=f"{S}/positions/requests/positions_llm_requests.parquet",
        generation=f"{S}/positions/requests/positions_generation_requests.parquet",
        flipped=directory(f"{S}/positions/flipped"),
    log:
        f"{S}/logs/positions.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    params:
        requests=lambda wildcards, output: Path(output.llm).parent,
    shell:
        "counterfactory countercurate positions --config {input.config:q} --entities-root {input.entities:q}"
        " --images {input.images:q} --out {output.table:q} --out-requests {params.requests:q} --flipped-dir {output.flipped:q} > {log:q} 2>&1"


rule countercurate_counting:
    """§3.3, app. C: category pairs with 2-8 boxes, count captions, GLIGEN inpainting requests."""
    input:
        entities=cc_entities_root,
        images=cc_images,
        config=job_config("counting", "data"),
    output:
        table=f"{S}/counting/items.parquet",
        requests=f"{S}/counting/requests/counting_inpaint_requests.parquet",
    log:
        f"{S}/logs/counting.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    params:
        requests=lambda wildcards, output: Path(output.requests).parent,
    shell:
        "counterfactory countercurate counting --config {input.config:q} --entities-root {input.entities:q}"
        " --images {input.images:q} --out {output.table:q} --out-requests {params.requests:q} > {log:q} 2>&1"


rule countercurate_positions_rewrite:
    """App. B: the llm role rewrites each above/below negative into a natural caption (JSON-constrained, greedy)."""
    input:
        requests=rules.countercurate_positions.output.llm,
        models=model_inputs("llm"),
        config=job_config("llm", "positions_rewrite", "models.llm", *DEVICE_KEYS),
    output:
        answers=f"{S}/positions/rewrites.parquet",
        rejected=f"{S}/positions/rewrites_rejected.parquet",
    log:
        f"{S}/logs/positions_rewrite.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    threads: accel_threads("llm")
    resources:
        mem_mb=model_mem(32000, "llm"),
        runtime=60,
        gpu=GPU,
        hpu=HPU,
    shell:
        "counterfactory countercurate positions-rewrite --config {input.config:q} --requests {input.requests:q}"
        " --out {output.answers:q} --rejected {output.rejected:q} > {log:q} 2>&1"


rule countercurate_attributes:
    """§3.4, app. A: noun / adjective / swap negatives from attributes.role (image + boxed copy), checked; t2i requests."""
    input:
        captions=rules.data_flickr30k_captions.output,
        entities=cc_entities_root,
        models=cc_attributes_model_inputs,
        config=job_config("llm", "attributes", cc_attributes_model_key, *DEVICE_KEYS),
    output:
        negatives=f"{S}/attributes/negatives.parquet",
        requests=f"{S}/attributes/t2i_requests.parquet",
    log:
        f"{S}/logs/attributes.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    threads: accel_threads("llm", "vlm")
    resources:
        mem_mb=model_mem(32000, "llm", "vlm"),
        runtime=120,
        gpu=GPU,
        hpu=HPU,
    shell:
        "counterfactory countercurate attributes --config {input.config:q} --captions {input.captions:q}"
        " --entities-root {input.entities:q} --out {output.negatives:q} --out-requests {output.requests:q}"
        " > {log:q} 2>&1"


rule countercurate_requests:
    """One grounded-generation requests table: positions (rewritten), counting inpainting, attributes t2i."""
    input:
        positions=rules.countercurate_positions.output.generation,
        rewrites=rules.countercurate_positions_rewrite.output.answers,
        counting=rules.countercurate_counting.output.requests,
        attributes=rules.countercurate_attributes.output.requests,
    output:
        f"{S}/generation/requests.parquet",
    log:
        f"{S}/logs/generation/requests.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    shell:
        "counterfactory countercurate requests --positions {input.positions:q} --rewrites {input.rewrites:q}"
        " --counting {input.counting:q} --attributes {input.attributes:q} --out {output:q} > {log:q} 2>&1"


checkpoint countercurate_request_shards:
    """Shard ids of the requests (their number is known once the requests exist)."""
    input:
        requests=rules.countercurate_requests.output,
        config=job_config("grounded"),
    output:
        f"{S}/generation/shards.txt",
    log:
        f"{S}/logs/generation/shards.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    shell:
        "counterfactory countercurate request-shards --config {input.config:q} --requests {input.requests:q} --out {output:q}"
        " > {log:q} 2>&1"


rule countercurate_generate:
    """§3.2-3.4: GLIGEN generation / inpainting and t2i for one shard of requests (batched, resumable)."""
    input:
        requests=rules.countercurate_requests.output,
        models=model_inputs("gligen", "gligen_inpaint", "t2i"),
        config=job_config("grounded", "seed", "models.gligen", "models.gligen_inpaint", "models.t2i", *DEVICE_KEYS),
    output:
        table=f"{S}/generation/shards/{{shard}}/generated.parquet",
        summary=f"{S}/generation/shards/{{shard}}/summary.json",
    log:
        f"{S}/logs/generation/{{shard}}.log",
    benchmark:
        f"{S}/benchmarks/generation/{{shard}}.tsv"
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    threads: accel_threads("gligen")
    resources:
        mem_mb=model_mem(16000, "gligen", "gligen_inpaint", "t2i", tiny_mb=3000),
        runtime=240,
        gpu=GPU,
        hpu=HPU,
    params:
        out_dir=lambda wildcards, output: Path(output.table).parent,
    shell:
        "counterfactory countercurate generate --config {input.config:q} --requests {input.requests:q} --shard {wildcards.shard}"
        " --out-dir {params.out_dir:q} --threads {threads} --no-progress > {log:q} 2>&1"


rule countercurate_generate_merge:
    """Every generated negative image (shards made under one config)."""
    input:
        cc_generated_shards,
    output:
        table=f"{S}/generation/generated.parquet",
        summary=f"{S}/generation/summary.json",
    log:
        f"{S}/logs/generation/merge.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    params:
        shards=lambda wildcards, input: " ".join(shlex.quote(str(Path(p).parent)) for p in input),
        out_dir=lambda wildcards, output: Path(output.table).parent,
    shell:
        "counterfactory countercurate generate-merge --shard-dirs {params.shards} --out-dir {params.out_dir:q}"
        " > {log:q} 2>&1"


rule countercurate_datasets:
    """Flickr30k-Positions, -Counting and -Attributes with their negative images; counts per subset and split."""
    input:
        positions=rules.countercurate_positions.output.table,
        counting=rules.countercurate_counting.output.table,
        attributes=rules.countercurate_attributes.output.negatives,
        generated=rules.countercurate_generate_merge.output.table,
    output:
        positions=f"{S}/datasets/positions.parquet",
        counting=f"{S}/datasets/counting.parquet",
        attributes=f"{S}/datasets/attributes.parquet",
        summary=report(
            f"{S}/datasets/summary.csv",
            labels=result_label("datasets/summary.csv"),
            category=study_title,
            subcategory=report_section("Datasets"),
            caption="../report/cc_datasets.rst",
        ),
    log:
        f"{S}/logs/datasets.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    params:
        out_dir=lambda wildcards, output: Path(output.summary).parent,
    shell:
        "counterfactory countercurate datasets --positions {input.positions:q} --counting {input.counting:q}"
        " --attributes {input.attributes:q} --generated {input.generated:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule countercurate_evaluate:
    """§4: one model role on one benchmark (Flickr30k-Positions test, PointQA-LookTwice, SugarCrepe, Winoground)."""
    input:
        data=cc_benchmark_inputs,
        models=model_inputs("{role}"),
        config=job_config("benchmarks", "vlm", "models.{role}", "evaluation.batch_size", *DEVICE_KEYS),
    output:
        f"{S}/evaluation/{{benchmark}}/{{role}}.csv",
    log:
        f"{S}/logs/evaluation/{{benchmark}}_{{role}}.log",
    benchmark:
        f"{S}/benchmarks/evaluation/{{benchmark}}_{{role}}.tsv"
    wildcard_constraints:
        study=CC,
        benchmark="positions|looktwice|sugarcrepe|winoground",
    conda:
        CONDA_ENV
    threads: lambda wildcards: accel_threads(wildcards.role)
    resources:
        mem_mb=model_mem_of_role(16000, tiny_mb=3000),
        runtime=120,
        gpu=GPU,
        hpu=HPU,
    params:
        data=cc_benchmark_data_arg,
    shell:
        "counterfactory countercurate evaluate --config {input.config:q} --role {wildcards.role} --benchmark {wildcards.benchmark}"
        " {params.data} --out {output:q} --no-progress > {log:q} 2>&1"


rule countercurate_tables:
    """Tables 1-4, 6, 8 layouts from every evaluation (Markdown, LaTeX, CSV)."""
    input:
        cc_evaluations,
    output:
        md=f"{S}/evaluation/tables.md",
        html=report(
            f"{S}/evaluation/tables.html",
            labels=result_label("evaluation/tables.html"),
            category=study_title,
            subcategory=report_section("Evaluation"),
            caption="../report/cc_tables.rst",
        ),
        tex=f"{S}/evaluation/tables.tex",
        csv=f"{S}/evaluation/tables.csv",
    log:
        f"{S}/logs/evaluation/tables.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    params:
        labels=display_labels,
    shell:
        "counterfactory countercurate tables --results {input:q} {params.labels.flags} --out-md {output.md:q}"
        " --out-tex {output.tex:q} --out-csv {output.csv:q} --out-html {output.html:q} > {log:q} 2>&1"


rule countercurate_train_manifests:
    """§3.5, §4.1: per dataset and variant the fine-tuning manifest (positive + negative pairs, train split)."""
    input:
        positions=rules.countercurate_datasets.output.positions,
        counting=rules.countercurate_datasets.output.counting,
        attributes=rules.countercurate_datasets.output.attributes,
        config=job_config("training", "data"),
    output:
        directory(f"{S}/finetune/manifests"),
    log:
        f"{S}/logs/finetune/manifests.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    params:
        datasets=lambda wildcards, input: Path(input.positions).parent,
    shell:
        "counterfactory countercurate train-manifests --config {input.config:q} --datasets {params.datasets:q}"
        " --out-dir {output:q} > {log:q} 2>&1"


rule countercurate_train_run:
    """One fine-tuning run of the training role on one dataset and variant (or its pre-trained evaluation), scored on
    the dataset's benchmark."""
    input:
        manifests=rules.countercurate_train_manifests.output,
        positions=rules.countercurate_datasets.output.positions,
        data=cc_train_benchmark_inputs,
        models=cc_train_model_inputs,
        config=job_config("training", "benchmarks", cc_train_model_key, "evaluation.batch_size", *DEVICE_KEYS),
    output:
        f"{S}/finetune/runs/{{dataset}}/{{variant}}/seed{{seed}}/metrics.csv",
    log:
        f"{S}/logs/finetune/{{dataset}}_{{variant}}_seed{{seed}}.log",
    benchmark:
        f"{S}/benchmarks/finetune/{{dataset}}_{{variant}}_seed{{seed}}.tsv"
    wildcard_constraints:
        study=CC,
        dataset="positions|counting|attributes",
        variant="pretrained|grouping|no_grouping|no_negative_captions|no_negative_images|no_negatives",
    conda:
        CONDA_ENV
    threads: cc_train_threads
    resources:
        mem_mb=16000,
        runtime=600,
        gpu=GPU,
        hpu=HPU,
    params:
        data_seed=lambda wildcards: dict(cc_training.seed_pairs(view(wildcards.study)))[int(wildcards.seed)],
        out_dir=lambda wildcards, output: Path(output[0]).parent,
        run=cc_train_run_args,
    shell:
        "counterfactory countercurate train-run --config {input.config:q} --dataset {wildcards.dataset} {params.run}"
        " --seed {wildcards.seed} --data-seed {params.data_seed} --out-dir {params.out_dir:q}"
        " --no-progress > {log:q} 2>&1"


use rule train_collect as train_collect_countercurate with:
    input:
        cc_train_runs,
    output:
        f"{S}/finetune/runs.csv",
    log:
        f"{S}/logs/finetune/runs_table.log",
    wildcard_constraints:
        study=CC,


use rule stats_summarize as stats_summarize_countercurate with:
    input:
        rules.train_collect_countercurate.output,
    output:
        f"{S}/finetune/summary.csv",
    log:
        f"{S}/logs/finetune/stats.log",
    wildcard_constraints:
        study=CC,
    params:
        baseline=cc_stats_baseline,
        test="welch",  # ours: the paper reports one run per setting
        alpha=0.05,


rule stats_table_countercurate:
    """Tables 1-4 / 8 style: pre-trained vs fine-tuned variants per dataset (mean ± std over seeds, t-test vs no
    grouping)."""
    input:
        summary=rules.stats_summarize_countercurate.output[0],
        manifests=rules.countercurate_train_manifests.output[0],
    output:
        md=f"{S}/finetune/tables/{{dataset}}.md",
        html=report(
            f"{S}/finetune/tables/{{dataset}}.html",
            labels=result_label("finetune/tables/{dataset}.html"),
            category=study_title,
            subcategory=report_section("Fine-tuning"),
            caption="../report/cc_training.rst",
        ),
        tex=f"{S}/finetune/tables/{{dataset}}.tex",
        csv=f"{S}/finetune/tables/{{dataset}}.csv",
    log:
        f"{S}/logs/finetune/table_{{dataset}}.log",
    wildcard_constraints:
        study=CC,
        dataset="positions|counting|attributes",
    conda:
        CONDA_ENV
    params:
        order=lambda wildcards: ",".join(cc_training.table_order(view(wildcards.study), wildcards.dataset)),
        info=lambda wildcards, input: Path(input.manifests) / "variants.csv",
        metrics=lambda wildcards: shlex.quote(cc_tables.finetune_metrics(wildcards.dataset)),
    shell:
        "counterfactory stats table --summary {input.summary:q} --experiment {wildcards.dataset}"
        " --mixture-order {params.order} --mixture-info {params.info:q} --metrics {params.metrics}"
        " --row-header Training --out-md {output.md:q} --out-tex {output.tex:q} --out-csv {output.csv:q}"
        " --out-html {output.html:q} > {log:q} 2>&1"


rule countercurate_vlm_run:
    """The generative family (§3.5 Figure 3b): the vlm role fine-tuned on one dataset's pairs as conversations (one
    seed), or its pre-trained evaluation, scored on the dataset's benchmark by two-option choice."""
    input:
        manifests=rules.countercurate_train_manifests.output,
        positions=rules.countercurate_datasets.output.positions,
        data=cc_train_benchmark_inputs,
        models=cc_vlm_model_inputs,
        config=job_config("training", "benchmarks", "vlm", cc_vlm_model_key, "evaluation.batch_size", *DEVICE_KEYS),
    output:
        f"{S}/finetune/vlm/{{dataset}}/{{mixture}}/seed{{seed}}/metrics.csv",
    log:
        f"{S}/logs/finetune/vlm_{{dataset}}_{{mixture}}_seed{{seed}}.log",
    benchmark:
        f"{S}/benchmarks/finetune/vlm_{{dataset}}_{{mixture}}_seed{{seed}}.tsv"
    wildcard_constraints:
        study=CC,
        dataset="positions|counting|attributes",
        mixture="pretrained|conversation",
    conda:
        CONDA_ENV
    threads: cc_vlm_threads
    resources:
        mem_mb=cc_vlm_mem,
        runtime=600,
        gpu=GPU,
        hpu=HPU,
    params:
        out_dir=lambda wildcards, output: Path(output[0]).parent,
        run=cc_vlm_run_args,
    shell:
        "counterfactory countercurate vlm-run --config {input.config:q} --dataset {wildcards.dataset} {params.run}"
        " --seed {wildcards.seed} --out-dir {params.out_dir:q} --no-progress > {log:q} 2>&1"


use rule train_collect as train_collect_countercurate_vlm with:
    input:
        cc_vlm_runs,
    output:
        f"{S}/finetune/vlm_runs.csv",
    log:
        f"{S}/logs/finetune/vlm_runs_table.log",
    wildcard_constraints:
        study=CC,


use rule stats_summarize as stats_summarize_countercurate_vlm with:
    input:
        rules.train_collect_countercurate_vlm.output,
    output:
        f"{S}/finetune/vlm_summary.csv",
    log:
        f"{S}/logs/finetune/vlm_stats.log",
    wildcard_constraints:
        study=CC,
    params:
        baseline="pretrained",  # one deterministic evaluation: fine-tuned mean ± std beside it, no test
        test="welch",
        alpha=0.05,


use rule stats_table_countercurate as stats_table_countercurate_vlm with:
    input:
        summary=rules.stats_summarize_countercurate_vlm.output[0],
        manifests=rules.countercurate_train_manifests.output[0],
    output:
        md=f"{S}/finetune/tables/{{dataset}}_vlm.md",
        html=report(
            f"{S}/finetune/tables/{{dataset}}_vlm.html",
            labels=result_label("finetune/tables/{dataset}_vlm.html"),
            category=study_title,
            subcategory=report_section("Fine-tuning"),
            caption="../report/cc_training.rst",
        ),
        tex=f"{S}/finetune/tables/{{dataset}}_vlm.tex",
        csv=f"{S}/finetune/tables/{{dataset}}_vlm.csv",
    log:
        f"{S}/logs/finetune/table_{{dataset}}_vlm.log",
    params:
        order=f"pretrained,{cc_training.VLM_MIXTURE}",
        info=lambda wildcards, input: Path(input.manifests) / "variants.csv",
        metrics=lambda wildcards: shlex.quote(cc_tables.finetune_metrics(wildcards.dataset)),


rule countercurate_paper_tables:
    """Tables 1, 2, 3, 5 and 6 as printed: pre-trained and fine-tuned CLIP / LLaVA side by side (Table 1 with its
    Random row; Table 3 with NegCLIP and the open role in GPT-4V's place; Table 5's Average @1 / @5)."""
    input:
        unpack(cc_paper_table_inputs),
    output:
        md=f"{S}/finetune/tables/paper.md",
        html=report(
            f"{S}/finetune/tables/paper.html",
            labels=result_label("finetune/tables/paper.html"),
            category=study_title,
            subcategory=report_section("Fine-tuning"),
            caption="../report/cc_training.rst",
        ),
        csv=f"{S}/finetune/tables/paper.csv",
    log:
        f"{S}/logs/finetune/paper_tables.log",
    wildcard_constraints:
        study=CC,
    conda:
        CONDA_ENV
    params:
        args=cc_paper_table_args,
        labels=display_labels,
    shell:
        "counterfactory countercurate paper-tables {params.args} {params.labels.flags} --out-md {output.md:q}"
        " --out-csv {output.csv:q} --out-html {output.html:q} > {log:q} 2>&1"


STUDY_TARGETS[CC] = (
    lambda: [f"{CC_DIR}/datasets/summary.csv", f"{CC_DIR}/evaluation/tables.md", f"{CC_DIR}/finetune/tables/paper.md"]
    + [f"{CC_DIR}/finetune/tables/{dataset}.md" for dataset in cc_training.settings(view(CC))["datasets"]]
    + [f"{CC_DIR}/finetune/tables/{dataset}_vlm.md" for dataset in cc_training.settings(view(CC))["vlm"]["datasets"]]
)
