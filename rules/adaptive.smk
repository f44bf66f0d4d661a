# Adaptive over-generation, honestly reported (ours): the cost (UNet evaluations per accepted candidate) and
# the selected scores of each stopping rule, replayed exactly from a fixed-mode run's per-candidate scores
# (counterfactory.generation.adaptive). Include after rules/images.smk and rules/study_social_counterfactuals.smk.


rule images_adaptive_curve:
    """COCO-CF-style image stage: fixed paper mode vs 'stop once >= t candidates passed' (and optional
    best-score quantile) rules; score = CLIP_dir of the selected pair."""
    input:
        scores=f"{S}/images/candidate_scores.parquet",
        summary=f"{S}/images/summary.json",
        config=job_config("images", "seed", "adaptive_curve"),
    output:
        csv=report(
            f"{S}/images/adaptive_curve.csv",
            labels=result_label("images/adaptive_curve.csv"),
            category=study_title,
            subcategory=report_section("Over-generation"),
            caption="../report/adaptive.rst",
        ),
        png=report(
            f"{S}/images/adaptive_curve.png",
            labels=result_label("images/adaptive_curve.png"),
            category=study_title,
            subcategory=report_section("Over-generation"),
            caption="../report/adaptive.rst",
        ),
    log:
        f"{S}/logs/images/adaptive_curve.log",
    conda:
        CONDA_ENV
    shell:
        "counterfactory images adaptive-curve --config {input.config:q} --scores {input.scores:q} --summary {input.summary:q}"
        " --out-csv {output.csv:q} --out-png {output.png:q} > {log:q} 2>&1"


rule images_adaptive_curve_social:
    """SocialCounterfactuals candidate sets: the same rules on the CLIP stage's per-set verdicts; score = the
    set's min image-caption cosine, every passing set kept (§3.4)."""
    input:
        scores=f"{S}/filter/clip_sets.parquet",
        summary=f"{S}/generation/summary.json",
        config=job_config("images", "seed", "adaptive_curve"),
    output:
        csv=report(
            f"{S}/generation/adaptive_curve.csv",
            labels=result_label("generation/adaptive_curve.csv"),
            category=study_title,
            subcategory=report_section("Over-generation"),
            caption="../report/adaptive.rst",
        ),
        png=report(
            f"{S}/generation/adaptive_curve.png",
            labels=result_label("generation/adaptive_curve.png"),
            category=study_title,
            subcategory=report_section("Over-generation"),
            caption="../report/adaptive.rst",
        ),
    log:
        f"{S}/logs/generation/adaptive_curve.log",
    wildcard_constraints:
        study=SCF,
    conda:
        CONDA_ENV
    shell:
        "counterfactory images adaptive-curve --config {input.config:q} --scores {input.scores:q} --summary {input.summary:q}"
        " --out-csv {output.csv:q} --out-png {output.png:q} > {log:q} 2>&1"
