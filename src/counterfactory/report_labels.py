"""Short names of the results in ``snakemake --report`` (issue 44): the ``labels`` of every ``report()`` item.

Without labels Snakemake's navigation panel shows each result as its path, cut to the panel's width, so the eight
entries of COCO-Counterfactuals → Training all read ``results/demo/coco_counterfactuals/trainin…``. Each rule
passes ``labels=result_label("<path under the study folder, with its wildcards>")`` (rules/common.smk), which
names the result from :data:`LABELS`: the paper's table or figure number first, then what it shows.

The panel sorts entries by their label text (``localeCompare``); single-digit numbers are padded with a figure
space (U+2007, as wide as a digit) so that "Table 3" sorts before "Table 12" and numbers line up.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: the one label column of every result (a second column would turn into Snakemake's on/off toggle wherever a
#: subcategory holds two results)
COLUMN = "result"

FIGURE_SPACE = "\u2007"

#: (regex over the path under the study folder, label template over its named groups), first match wins
LABELS: list[tuple[str, str]] = [
    # COCO-Counterfactuals
    (r"captions?/?.*caption_examples\.csv|report/caption_examples\.csv", "§3.1 counterfactual captions (CSV)"),
    (r"report/pair_grid\.png", "§3.2 counterfactual image pairs"),
    (r"evaluation/itr_table\.html", "Table 2 · zero-shot image-text retrieval"),
    (r"evaluation/itr_table\.csv", "Table 2 · zero-shot image-text retrieval (CSV)"),
    (r"evaluation/itm_differences\.html", "Figure 3 · ITM score differences (table)"),
    (r"evaluation/itm_differences\.csv", "Figure 3 · ITM score differences (CSV)"),
    (r"evaluation/itm_differences\.png", "Figure 3 · ITM score differences"),
    (r"evaluation/classification\.html", "Table 4 · zero-shot classification, pre-trained"),
    (r"evaluation/classification\.csv", "Table 4 · zero-shot classification, pre-trained (CSV)"),
    (r"evaluation/classification\.png", "Table 4 · zero-shot classification, pre-trained (plot)"),
    (r"training/tables/retrieval\.html", "Table 3 · retrieval after fine-tuning"),
    (r"training/tables/retrieval_(?P<name>.+)\.html", "Table 12 · retrieval after fine-tuning, {name}"),
    (r"training/tables/classification\.html", "Table 4 · zero-shot classification after fine-tuning"),
    (r"training/tables/(?P<name>.+)\.html", "table {name} after fine-tuning"),
    (r"in_domain/table\.html", "Table 5 · in-domain COCO-CFs test set"),
    (r"image_quality/table\.html", "§10.3 · FID and IS of the generated and real image sets"),
    (r"training/label_frequency\.csv", "Table 6 · label frequency vs accuracy change (CSV)"),
    (r"training/table6\.html", "Table 6 · label frequency vs accuracy change"),
    (r"training/table6\.html", "Table 6 · label frequency vs accuracy change"),
    (r"training/human_taxonomy\.csv", "A.3.2 human-related subjects (CSV)"),
    (r"training/runs\.csv", "every fine-tuning run (CSV)"),
    (r"training/curves\.png", "loss curves of the fine-tuning runs"),
    (r"images/adaptive_curve\.png", "adaptive over-generation (ours)"),
    (r"images/adaptive_curve\.csv", "adaptive over-generation (ours, CSV)"),
    (r"report/examples\.png", "exported examples"),
    # every study: filter cards (issue 47)
    (r"filters/cards/(?P<name>[^/]+)/card\.html", "filter card · {name} (ours)"),
    # SocialCounterfactuals
    (r"filter/table11\.html", "Table 11 · sets left after each filter"),
    (r"probing/(?P<stage>before|after)/tables\.html", "Tables 2, 12-15 · bias probing, {stage} filtering"),
    (r"probing/(?P<stage>before|after)/figures/maxskew_boxplots\.png", "Figure 3 · MaxSkew per model, {stage} filtering"),
    (r"probing/(?P<stage>before|after)/figures/marginal_(?P<attr>[^_]+)_by_(?P<given>.+)\.png",
     "Figure 4 · marginal {attr} by {given}, {stage} filtering"),
    (r"probing/(?P<stage>before|after)/figures/proportions_(?P<name>.+)\.png",
     "Figure 5 · retrieved attribute shares, {name}, {stage} filtering"),
    (r"probing/(?P<stage>before|after)/figures/(?P<name>.+)\.png", "figure {name}, {stage} filtering"),
    (r"debias/tables\.html", "Tables 2, 16, 17 · debiasing (bias after fine-tuning)"),
    (r"debias/task_tables\.html", "debiasing: task accuracy after fine-tuning"),
    (r"generation/adaptive_curve\.png", "adaptive over-generation (ours)"),
    (r"generation/adaptive_curve\.csv", "adaptive over-generation (ours, CSV)"),
    # CounterCurate
    (r"datasets/summary\.csv", "Flickr30k-Positions / -Counting / -Attributes sizes (CSV)"),
    (r"evaluation/tables\.html", "Tables 1-4, 6, 8 · evaluation of every model"),
    (r"finetune/tables/paper\.html", "Tables 1, 2, 3, 5 · as printed (pre-trained and fine-tuned)"),
    (r"finetune/tables/(?P<name>.+)_vlm\.html", "fine-tuning the VLM on {name}"),
    (r"finetune/tables/(?P<name>.+)\.html", "Tables 4, 8 · fine-tuning on {name}"),
    # Spurious-correlation retrieval
    (r"(?P<name>[^/]+)/selection/summary\.csv", "§3.1 region selection on {name} (CSV)"),
    (r"tables\.html", "Tables 1-4 · the paper's tables"),
    (r"figure4\.png", "Figure 4 · R@1 and ODmAP@1 vs share of synthetic data"),
    # CVLD
    (r"coco/text/summary\.csv", "§3.3 caption interventions (CSV)"),
    (r"figures/figure4\.png", "Figure 4 · DEO and AP vs λ"),
    (r"figures/figure5\.png", "Figure 5 · few-shot classification"),
    (r"figures/figure9\.png", "Figure 9 · appendix figure 9"),
    (r"figures/figure10\.png", "Figure 10 · appendix figure 10"),
]

#: study-specific wording where one path means different things in two studies
STUDY_LABELS: dict[str, dict[str, str]] = {
    "spurious_retrieval": {"tables.html": "Tables 1-3 · ODmAP@k, R@K, synthesis of D′"},
    "cvld": {"tables.html": "Tables 1-4 · classification, retrieval, captioning"},
}


def pad_numbers(text: str) -> str:
    """``Table 3`` -> ``Table <figure space>3`` so that labels sort by number (up to 99)."""
    return re.sub(r"\b(Tables?|Figures?) (\d)(?!\d)", lambda m: f"{m.group(1)} {FIGURE_SPACE}{m.group(2)}", text)


def label(relpath: str, study: str | None = None) -> str:
    """The short name of the result at ``relpath`` (its path under the study folder)."""
    rel = relpath.replace("\\", "/").lstrip("./")
    special = (STUDY_LABELS.get(study or "") or {}).get(rel)
    if special:
        return pad_numbers(special)
    for pattern, template in LABELS:
        m = re.fullmatch(pattern, rel)
        if m:
            return pad_numbers(template.format(**{k: v.replace("_", " ") for k, v in m.groupdict().items()}))
    return rel


def labels(relpath: str, study: str | None = None) -> dict[str, str]:
    """``report(..., labels=...)``'s value for one result."""
    return {COLUMN: label(relpath, study)}


# ------------------------------------------------------------------ the sidebar's sub-groups, in the paper's order
#: every report sub-group, in pipeline order (data -> generation -> filtering -> evaluation -> training -> tables)
SECTIONS: tuple[str, ...] = (
    "Object removal", "Counterfactuals", "Interventions", "Over-generation", "Filtering", "Datasets", "Examples",
    "Zero-shot image-text retrieval", "ITM score differences", "Zero-shot classification", "Evaluation",
    "Bias probing", "Training", "Fine-tuning", "Debiasing", "Image quality", "Tables", "Figures",
)

def section(name: str, order: Sequence[str] = ()) -> str:
    """The sub-group title ``name`` numbered by its place in a study's paper ``order`` (its spec's
    ``report_sections``): ``"2 · Over-generation"``.

    Snakemake's panel sorts sub-groups alphabetically (``localeCompare``); the number makes that the paper's order.
    A sub-group the study's list lacks follows the listed ones, in :data:`SECTIONS` order."""
    if name not in SECTIONS:
        raise ValueError(f"report sub-group {name!r} is not in counterfactory.report_labels.SECTIONS. "
                         "Fix: add it there (and to the study spec's report_sections) in pipeline order")
    order = tuple(order)
    rest = [s for s in SECTIONS if s not in order]
    number = (order.index(name) if name in order else len(order) + rest.index(name)) + 1
    return f"{FIGURE_SPACE if number < 10 else ''}{number} · {name}"




# --------------------------------------------------------------------------- random tiny stand-ins (issue 44 item 3)

#: the one sentence every page of a run with tiny stand-ins carries (report/workflow.rst and the captions say it too;
#: tests keep them equal)
TINY_WARNING = "Random tiny models: the numbers show that the pipeline runs, not what the papers found."
DEFAULT_TINY_DIR = "resources/models/tiny"


def tiny_roles(models: dict | None, cfg: dict | None = None) -> list[str]:
    """Roles of ``models`` (role -> spec or source) whose source is a folder directly under the tiny models' folder
    (``tiny_models.out_dir`` of ``cfg``, else ``resources/models/tiny``): randomly initialised stand-ins."""
    tiny = str(((cfg or {}).get("tiny_models") or {}).get("out_dir") or DEFAULT_TINY_DIR).rstrip("/") + "/"
    out = []
    for role, spec in sorted((models or {}).items()):
        source = spec.get("source") if isinstance(spec, dict) else spec
        if isinstance(source, str) and (source.startswith(tiny) or f"/{tiny}" in source):
            out.append(role)
    return out


def tiny_warning(models: dict | None, cfg: dict | None = None) -> str | None:
    """The warning with its count (``3 of 30 model roles ...``), or None when no role is a tiny stand-in."""
    roles = tiny_roles(models, cfg)
    if not roles:
        return None
    return (f"{TINY_WARNING} {len(roles)} of {len(models or {})} model roles are randomly initialised stand-ins; "
            "every table and figure is noise.")


# --------------------------------------------------------------------------- readable job parameters (issue 44 item 3)


class CliFlags(str):
    """A rule parameter that is command-line flags for the shell command (spell it ``{params.x.flags}``) and reads
    as ``readable`` in the report's "Job parameters": Snakemake writes a job's parameters with ``format()``, which
    this class answers with the readable text. Its ``str`` value (what Snakemake records to decide reruns, through
    ``repr``) stays the flags, so a rule switched to it does not rerun."""

    readable: str

    def __new__(cls, flags: str, readable: str) -> "CliFlags":
        obj = super().__new__(cls, flags)
        obj.readable = readable
        return obj

    @property
    def flags(self) -> str:
        return str(str.__str__(self))

    def __format__(self, spec: str) -> str:
        return self.readable if not spec else format(self.flags, spec)

    def __reduce__(self):
        return (CliFlags, (self.flags, self.readable))


def name_flags(option: str, names: dict[str, str]) -> CliFlags:
    """``--option KEY=NAME`` for each entry, shown as ``KEY: NAME, ...`` (``KEY`` alone where the two agree)."""
    import shlex

    flags = " ".join(f"{option} {shlex.quote(f'{k}={v}')}" for k, v in names.items())
    readable = ", ".join(k if str(v) == str(k) else f"{k}: {v}" for k, v in names.items()) or "none"
    return CliFlags(flags, readable)


# --------------------------------------------------------------------------- a readable rule graph (issue 44 item 6)

#: rules that feed almost every other rule (each job's config file, the tiny stand-in models, NLTK data): drawn, they
#: turn `snakemake --rulegraph` into a hairball
BOOKKEEPING_RULES = ("config_write_job", "models_build_tiny", "nltk_prepare")


def drop_rules(dot: str, rules: tuple[str, ...] | list[str] = BOOKKEEPING_RULES) -> tuple[str, list[str]]:
    """``snakemake --rulegraph`` output (Graphviz) without the nodes of ``rules`` and their edges, with a graph
    label naming what was left out; returns the text and the rules that were dropped."""
    node = re.compile(r'^\s*(\d+)\s*\[label\s*=\s*"([^"]+)"')
    edge = re.compile(r"^\s*(\d+)\s*->\s*(\d+)")
    dropped_ids, dropped = set(), []
    for line in dot.splitlines():
        m = node.match(line)
        if m and m.group(2) in rules:
            dropped_ids.add(m.group(1))
            dropped.append(m.group(2))
    out = []
    for line in dot.splitlines():
        m, e = node.match(line), edge.match(line)
        if (m and m.group(1) in dropped_ids) or (e and (e.group(1) in dropped_ids or e.group(2) in dropped_ids)):
            continue
        out.append(line)
        if dropped and line.lstrip().startswith("edge["):
            out.append(f'    graph[label="not drawn: {", ".join(dropped)} (each feeds almost every rule)", '
                       'labelloc=t, fontname=sans, fontsize=10];')
    return "\n".join(out) + "\n", dropped


__all__ = ["BOOKKEEPING_RULES", "CliFlags", "drop_rules", "name_flags", "COLUMN", "LABELS", "STUDY_LABELS", "TINY_WARNING", "label", "labels", "pad_numbers", "tiny_roles",
           "tiny_warning"]
