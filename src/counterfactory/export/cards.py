"""Dataset cards (``README.md`` in the Hugging Face dataset-card layout) built from what the run recorded.

The card is made only of recorded facts: the export manifests (rows per config and split, fields), the
run's ``provenance.json`` (model roles with ids, revisions and content fingerprints; the study's config; the
git commit) and the study's own summary files (the filter funnel: counts per stage, as the steps wrote them).
What each study exports and which summaries form its funnel is its :class:`.studies.StudyExport` (declared in
``counterfactory.studies.<study>.export``, ``SPEC.export``), which the caller passes in.

Layout, as the Hub's dataset cards expect (``huggingface_hub.DatasetCard``): YAML metadata made with
``DatasetCardData`` (``pretty_name``, ``license``, ``task_categories``, ``size_categories``, ``configs`` with
``data_files`` pointing at the parquet layout), then Dataset Summary, Dataset Structure (layouts, configs and splits
with counts; a table of every data field with its type and meaning), Dataset Creation (source data, models, how the
data was made as a readable funnel of the steps' counts, where the full configuration is recorded), Bias, Risks, and
Limitations, Licensing Information and Citation (the paper's BibTeX).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import yaml

from ..errors import input_error
from ..io import write_text
from ..render import Column, Table, Text, code_span, escape_md, markdown_body
from ..report_labels import tiny_warning
from .citations import size_category
from .formats import read_manifest
from .studies import SOURCE_LICENCES, VERIFIED_SUFFIX, StudyExport, is_demo, load_json

#: keys of summary JSON files that are bookkeeping, not counts
SKIP_KEYS = {"provenance", "config_digest", "requests_digest", "sets_digest", "seconds", "shard", "shards",
             "warnings", "rejected_captions", "created_unix"}


#: meaning of the exported fields (every study); ``sim_*`` are CLIP cosine similarities of the image-filter role
FIELD_DOCS = {
    "id": "pair id (the MS-COCO caption id it was made from)",
    "item_id": "item id (unique within the export)",
    "caption": "caption of the image",
    "caption_0": "original caption", "caption_1": "counterfactual caption (one noun replaced)",
    "image_0": "image generated for caption_0", "image_1": "image generated for caption_1 (same seed and noise)",
    "sim_0": "CLIP cosine similarity of image_0 and caption_0", "sim_1": "CLIP cosine similarity of image_1 and "
    "caption_1", "sim_image": "CLIP cosine similarity of image_0 and image_1",
    "sim_direction": "directional CLIP similarity: cosine between the image change and the caption change",
    "seed": "random seed of the generation (reproduces the images)",
    "p": "share of the denoising steps that copy the first prompt's self-attention (Prompt-to-Prompt; sampled)",
    "guidance": "classifier-free guidance scale of the generation (sampled)",
    "rank": "rank of the candidate among those that passed the filter (0 = best by sim_direction; -1 = not kept)",
    "candidate_index": "which over-generated candidate of the set this is",
    "set_id": "counterfactual set (all members share subject and seed, differ in the social attributes)",
    "member_index": "member of the set (0 = base member)",
    "segment": "attribute combination of the set (e.g. race-gender)", "subject": "occupation / subject of the set",
    "prefix": "caption prefix shared by the set", "split": "train / validation / test split",
    "negative_caption": "hard negative caption", "negative_image": "negative image",
    "similarity": "cosine similarity of the edited and the original image (image-encoder features)",
    "kept": "whether the edit was kept", "path": "file of the image in the run's results",
}


def _flatten(obj: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in SKIP_KEYS:
                continue
            out.update(_flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix[:-1]] = obj
    return out


def funnel(export: StudyExport, study_dir: str | Path) -> list[dict]:
    """Per funnel pattern of a study's ``export``: ``{"stage", "files", "kind": "counts", "counts": {key: value}}``
    (JSON summaries, numeric leaves summed over the pattern's files, e.g. caption shards) or ``{..., "kind":
    "table", "table": DataFrame}`` (CSV summaries, concatenated)."""
    d = Path(study_dir)
    out = []
    for pattern in export.funnel:
        files = sorted(d.glob(pattern))
        if not files:
            continue
        stage = pattern.replace("/summary", "").replace(".json", "").replace(".csv", "").replace("/*", "")
        rel = [str(f.relative_to(d)) for f in files]
        if pattern.endswith(".json"):
            counts: dict[str, float] = {}
            for f in files:
                for k, v in _flatten(load_json(f)).items():
                    counts[k] = counts.get(k, 0) + v
            out.append({"stage": stage, "files": rel, "kind": "counts", "counts": dict(sorted(counts.items()))})
        else:
            parts = []
            for f in files:
                t = pd.read_csv(f, keep_default_na=False)
                if len(files) > 1:
                    t.insert(0, "file", str(f.relative_to(d)))
                parts.append(t)
            out.append({"stage": stage, "files": rel, "kind": "table", "table": pd.concat(parts, ignore_index=True)})
    return out


def funnel_label(key: str) -> str:
    """A summary key as words: ``counts.rejected_by_reason.not_whole_word`` -> ``rejected: not whole word``,
    ``candidates_generated`` -> ``candidates generated``."""
    parts = [p for p in str(key).split(".") if p not in ("counts", "totals")]
    if not parts:
        return str(key)
    words = [p.replace("_by_reason", "").replace("_", " ") for p in parts]
    head, rest = words[0], words[1:]
    return f"{head}: {', '.join(rest)}" if rest else head


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A compact pipe table (:class:`counterfactory.render.Table`); text escaped (``|``, markup), newlines made
    spaces; a :class:`~counterfactory.render.Text` (a :func:`code` span) is written as given."""
    text = lambda v: v if isinstance(v, Text) else str(v).replace("\n", " ")  # noqa: E731
    return markdown_body(Table([Column(text(h)) for h in header], [[text(v) for v in r] for r in rows], compact=True))


def code(value) -> Text:
    """A table cell of ``value`` as one code span (a backtick or markup in it stays inside; ``|`` escaped)."""
    return Text(code_span(value).replace("|", "\\|"))


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.4g}"


def _models(spec, provenance: dict) -> tuple[list[list[str]], list[str]]:
    models = provenance.get("models") or {}
    rows, missing = [], []
    for role in spec.roles:
        m = models.get(role)
        if m is None:
            missing.append(role)
            continue
        rows.append([role, code(m.get('source')), m.get("library") or "", str(m.get("revision") or m.get("commit")
                     or "-"), code((m.get('fingerprint') or '-')[:16])])
    return rows, missing


def _layout_rows(name: str, manifest: dict) -> list[list[str]]:
    return [[name, config, split, str(v["rows"]), code(v['path']) if v.get("path") else "-"]
            for config, c in manifest["configs"].items() for split, v in c["splits"].items()]


def _tiny_banner(provenance: dict) -> list[str]:
    """Issue 44: a card of data made with random tiny stand-in models says so first, in one quoted line."""
    warning = tiny_warning(provenance.get("models"), provenance.get("config"))
    return [f"> **{warning}**", ""] if warning else []


#: the files of a filter card copied beside the dataset card (``filters study-card``'s folder)
FILTER_CARD_FILES = ("card.md", "card.html", "card.json", "curve.csv", "curve.png")
#: the folder (relative to the dataset card) the filter cards are copied to
FILTER_CARDS_DIR = "filter_cards"


def _interval(metric: dict | None) -> str:
    if not metric or metric.get("value") is None:
        return "n/a"
    value = f"{metric['value']:.3f}"
    if metric.get("low") is None or metric.get("high") is None:
        return value
    return f"{value} [{metric['low']:.3f}, {metric['high']:.3f}]"


def filter_card_section(filter_cards: dict[str, dict]) -> list[str]:
    """The "Filter cards" lines: one row per audited filter (``name -> card.json``, the folder
    ``filter_cards/<name>/`` beside the card) with precision and recall (bootstrap intervals), the removal share
    (a count of every scored item: no interval) and the audit's size; [] without a card."""
    if not filter_cards:
        return []
    level = next((c.get("bootstrap", {}).get("level") for c in filter_cards.values()), 0.95) or 0.95
    rows = []
    for name, c in filter_cards.items():
        m = c.get("metrics") or {}
        share = c.get("removal_share")
        threshold = c.get("threshold")
        rows.append([code(name), escape_md(c.get("title") or name), "rule" if threshold is None else str(threshold),
                     _interval(m.get("precision")), _interval(m.get("recall")),
                     "n/a" if share is None else f"{share:.3f}", str(c.get("n_audited")),
                     code(f"{FILTER_CARDS_DIR}/{name}/card.md")])
    return ["### Filter cards", "",
            "How each filter's keep/drop agrees with a hand-labelled audit sample (`filters study-card`): precision "
            "= share of kept audited items people judge good, recall = share of good audited items kept, removal "
            f"share = share of all scored items removed; precision and recall with {level:.0%} bootstrap intervals "
            f"[low, high]. The full cards (curve, counts, notes) are in `{FILTER_CARDS_DIR}/<filter>/`.", "",
            markdown_table(["filter", "card", "threshold", "precision", "recall", "removal share", "audited",
                            "file"], rows), ""]


def build_card(study: str, export: StudyExport, study_dir: str | Path, provenance: dict,
               manifests: dict[str, dict], filter_cards: dict[str, dict] | None = None) -> str:
    """The card's Markdown of ``study`` (its declaration ``export``). ``manifests``: layout folder name (relative to
    the card) -> its manifest; ``filter_cards``: audited filter -> its ``card.json`` (copied to
    ``filter_cards/<filter>/``; none: no section)."""
    demo = is_demo(provenance)
    generic = manifests.get("parquet") or manifests.get("imagefolder") or {"configs": {}}
    total = sum(v["rows"] for c in generic["configs"].values() for v in c["splits"].values())
    configs = []
    if "parquet" in manifests:
        for config, c in manifests["parquet"]["configs"].items():
            configs.append({"config_name": config, "data_files": [
                {"split": split, "path": f"parquet/{v['path']}"} for split, v in c["splits"].items()]})
    from huggingface_hub import DatasetCardData

    pretty = export.pretty_name + (" - offline demo" if demo else "")
    data = DatasetCardData(pretty_name=pretty, license="other",
                           license_name="mixed source terms (see Licensing Information)",
                           task_categories=list(export.task_categories), language=["en"],
                           size_categories=[size_category(total)], tags=["counterfactual", "synthetic",
                                                                        "counterfactory"],
                           configs=configs or None)
    lines = ["---", data.to_yaml().rstrip(), "---", "",
             f"# Dataset Card for {pretty}", "", *_tiny_banner(provenance), "## Dataset Summary", "", export.summary,
             "",
             f"Written by CounterFactory {escape_md(provenance.get('counterfactory', '?'))} from run results "
             f"(git commit {code_span((provenance.get('git') or {}).get('commit'))}"
             f"{', uncommitted changes' if (provenance.get('git') or {}).get('dirty') else ''}). "
             f"{total} items in the generic layout.", "",
             "## Dataset Structure", "", "### Layouts and counts", ""]
    table = [row for name, m in manifests.items() for row in _layout_rows(name, m)]
    lines += [markdown_table(["layout", "config", "split", "rows", "files"], table), ""]
    lines += ["Loading: `release/` is the published layout of the original dataset (where one exists); "
              "`imagefolder/<config>` loads with `datasets.load_dataset(\"imagefolder\", data_dir=...)`; "
              "`parquet/<config>/<split>-*.parquet` with `load_dataset(\"parquet\", data_files=...)` "
              "(images embedded)." + (" `clip_benchmark/<config>` is CLIP_benchmark's webdataset layout for "
                                      "zero-shot retrieval (`clip_benchmark eval --dataset wds/<config> "
                                      "--dataset_root clip_benchmark/<config> --task zeroshot_retrieval`)."
                                      if "clip_benchmark" in manifests else ""), ""]
    verified = [c for c in generic["configs"] if c.endswith(VERIFIED_SUFFIX)]
    if verified:
        lines += ["Verified variant: " + ", ".join(code_span(c) for c in verified) + f" hold the rows of the config "
                  f"without {code_span(VERIFIED_SUFFIX)} that the VQA check (a vision-language model asked whether "
                  "each image shows its caption, `verify.*` in provenance.json) kept, from the run's "
                  "`verify/verified.parquet`; the full configs are unfiltered by it.", ""]
    lines += ["### Data Fields", ""]
    for config, c in generic["configs"].items():
        desc = {**FIELD_DOCS, **(c.get("description") or {})}
        rows = [[code(f), "image", desc.get(f, "")] for f in c.get("images", [])]
        rows += [[code(f), (c.get("dtypes") or {}).get(f, ""), desc.get(f, "")] for f in c.get("fields", [])]
        lines += [f"Config {code_span(config)}:", "", markdown_table(["field", "type", "meaning"], rows), ""]
    lines += ["## Dataset Creation", "", "### Source Data", ""]
    lines += [f"- {SOURCE_LICENCES[k].split(':')[0]}" for k in export.sources] + [""]
    rows, missing = _models(export, provenance)
    lines += ["### Models", "", "Roles that made or filtered the data, as recorded in `provenance.json` "
              "(fingerprint: sha256 over the weights and configuration files, first 16 hex digits).", ""]
    lines += [markdown_table(["role", "id / path", "library", "revision", "fingerprint"], rows) if rows
              else "No model role of this study is recorded in the provenance.", ""]
    if missing:
        lines += [f"Not recorded in this run's provenance (not used by it): {', '.join(missing)}.", ""]
    lines += ["### How the data was made", "", "Each step of the pipeline in order, with the counts it recorded "
              "(summed over shards; the source file in parentheses).", ""]
    stages = funnel(export, study_dir)
    for i, st in enumerate(stages, 1):
        lines += [f"{i}. **{escape_md(st['stage'].replace('/', ' / ').replace('_', ' '))}** "
                  f"({', '.join(code_span(f) for f in st['files'])})", ""]
        if st["kind"] == "counts":
            lines += [f"   - {escape_md(funnel_label(k))}: {_number(v)}" for k, v in st["counts"].items()] + [""]
        else:
            t = st["table"].astype(str)
            lines += [markdown_table([c.replace("_", " ") for c in t.columns], t.values.tolist()), ""]
    if not stages:
        lines += ["No summary file of this study was found.", ""]
    lines += filter_card_section(filter_cards or {})
    cfg = (provenance.get("config") or {}).get(study)
    lines += ["### Configuration", "",
              (f"Every setting of the `{study}` section is recorded in the run's `provenance.json` (`config.{study}`;"
               f" {len(_leaves(cfg))} values); the defaults and the paper sections they follow are documented in the "
               "project's configuration reference.") if cfg else "The configuration is not recorded in "
              "provenance.json.", ""]
    lines += ["## Licensing Information", "", "The exported data inherit the terms of their sources; no single "
              "licence covers them (front matter: `license: other`).", ""]
    lines += [f"- {SOURCE_LICENCES[k]}" for k in export.sources]
    if demo:
        lines.append(f"- {SOURCE_LICENCES['demo']}")
    lines += ["", "## Bias, Risks, and Limitations", ""]
    lines += [f"- {x}" for x in bias_notes(export)]
    lines += ["", "### Known Limitations", ""]
    lines += [f"- {x}" for x in limitations(export, provenance)]
    lines += ["", "## Citation", "", "If you use this data, cite the paper whose method made it:", "", "```bibtex",
              export.citation or "% no citation recorded for this study", "```", "",
              "and the software that produced it (CounterFactory, see its `CITATION.cff`)."]
    return "\n".join(lines) + "\n"


def _leaves(node) -> list:
    if isinstance(node, dict):
        return [x for v in node.values() for x in _leaves(v)]
    return [node]


def bias_notes(export: StudyExport) -> list[str]:
    """What a user should know about bias and risk in the study's generated data: the note every study shares,
    then the study's own (``export.bias_notes``)."""
    common = ("Images are synthetic (a text-to-image or editing model generated them) and inherit that model's "
              "training-data biases; captions come from automatic models and filters, not from human annotators.")
    return [common, *export.bias_notes]


def limitations(export: StudyExport, provenance: dict) -> list[str]:
    """The run's own limitations (a demo's stand-in models, a dirty working tree), then the study's
    (``export.limitations``)."""
    out = []
    if is_demo(provenance):
        out.append("Offline demo: every model is a tiny randomly initialised stand-in (resources/models/tiny), so "
                   "images and edited captions are noise-like and carry no meaning; use it to check layouts and "
                   "counts only.")
    if (provenance.get("git") or {}).get("dirty"):
        out.append("The run was made from a working tree with uncommitted changes.")
    return out + list(export.limitations)


def write_card(study: str, export: StudyExport, study_dir: str | Path, provenance: str | Path,
               export_dir: str | Path,
               layouts: Iterable[str] = ("release", "imagefolder", "parquet", "clip_benchmark"), out: str | Path | None = None,
               manifest_paths: dict[str, str | Path] | None = None,
               filter_cards: Iterable[str | Path] = ()) -> Path:
    """Build the card of ``study`` (its declaration ``export``) from ``provenance`` and the manifests of
    ``export_dir/<layout>`` (layouts without a folder are skipped; ``manifest_paths``: layout -> its manifest kept
    outside the folder, else the folder's own) and write it to ``out`` (default ``export_dir/README.md``).
    ``filter_cards``: folders of ``filters study-card`` (``.../filters/cards/<filter>``), each copied to
    ``filter_cards/<filter>/`` beside the card (that folder is replaced as a whole, and removed when none is given)
    and listed in its "Filter cards" section."""
    export_dir = Path(export_dir)
    where = dict(manifest_paths or {})
    manifests = {name: read_manifest(export_dir / name, where.get(name)) for name in layouts
                 if (export_dir / name).is_dir()}
    if not manifests:
        raise input_error(export_dir, None, "no export layout folder (release/, imagefolder/, parquet/)",
                          "run `counterfactory export release/imagefolder` first")
    out = Path(out or export_dir / "README.md")
    cards = copy_filter_cards(filter_cards, out.parent / FILTER_CARDS_DIR)
    text = build_card(study, export, study_dir, load_json(provenance), manifests, filter_cards=cards)
    return write_text(out, text)


def copy_filter_cards(folders: Iterable[str | Path], dest: Path) -> dict[str, dict]:
    """Copy each filter card folder's :data:`FILTER_CARD_FILES` to ``dest/<folder name>/`` (``dest`` replaced as a
    whole; removed when there is none) and return name -> its ``card.json``."""
    import shutil

    folders = [Path(f) for f in folders]
    cards = {}
    for f in folders:
        if not (f / "card.json").is_file():
            raise input_error(f / "card.json", None, "filter card not found",
                              "run `counterfactory filters study-card` (rule filters_study_card) first")
        if f.name in cards:
            raise input_error(f, None, f"two filter cards named {f.name!r}", "pass each filter's card once")
        cards[f.name] = load_json(f / "card.json")
    if dest.exists():
        shutil.rmtree(dest)
    for f in folders:
        (dest / f.name).mkdir(parents=True, exist_ok=True)
        for name in FILTER_CARD_FILES:
            if (f / name).is_file():
                shutil.copy2(f / name, dest / f.name / name)
    return cards


def card_numbers(text: str) -> dict:
    """The YAML front matter of a card (for checks)."""
    if not text.startswith("---\n"):
        raise ValueError("card has no YAML front matter")
    return yaml.safe_load(text.split("---\n", 2)[1])


__all__ = ["FIELD_DOCS", "FILTER_CARDS_DIR", "FILTER_CARD_FILES", "bias_notes", "build_card",
           "card_numbers", "copy_filter_cards", "filter_card_section", "funnel", "funnel_label", "limitations",
           "size_category", "write_card"]
