"""Dataset cards (``README.md`` in the Hugging Face dataset-card layout) built from what the run recorded.

The card is made only of recorded facts: the export manifests (rows per config and split, fields), the
run's ``provenance.json`` (model roles with ids, revisions and content fingerprints; the study's config; the
git commit) and the study's own summary files (the filter funnel: counts per stage, as the steps wrote them).
What each study exports and which summaries form its funnel is declared in :mod:`.studies`.

Layout: YAML front matter (``pretty_name``, ``license``, ``task_categories``, ``size_categories``,
``configs`` with ``data_files`` pointing at the parquet layout), then Dataset Summary, Dataset Structure
(layouts, configs and splits with counts, data fields), Dataset Creation (source data, models, config,
filter funnel), Licensing Information and Considerations / Known Limitations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import yaml

from ..errors import input_error
from ..render import Column, Table, markdown_body
from .formats import read_manifest
from .studies import SOURCE_LICENCES, is_demo, load_json, study_export

#: keys of summary JSON files that are bookkeeping, not counts
SKIP_KEYS = {"provenance", "config_digest", "requests_digest", "sets_digest", "seconds", "shard", "shards",
             "warnings", "rejected_captions", "created_unix"}
SIZE_BOUNDS = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
               (10_000_000, "1M<n<10M"))


def size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket of ``n`` rows."""
    return next((label for bound, label in SIZE_BOUNDS if n < bound), "n>10M")


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


def funnel(study: str, study_dir: str | Path) -> list[dict]:
    """Per funnel pattern: ``{"stage", "files", "kind": "counts", "counts": {key: value}}`` (JSON summaries,
    numeric leaves summed over the pattern's files, e.g. caption shards) or ``{..., "kind": "table",
    "table": DataFrame}`` (CSV summaries, concatenated)."""
    d = Path(study_dir)
    out = []
    for pattern in study_export(study).funnel:
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


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A compact pipe table (:class:`counterfactory.render.Table`); ``|`` escaped, newlines made spaces."""
    text = lambda v: str(v).replace("\n", " ")  # noqa: E731
    return markdown_body(Table([Column(text(h)) for h in header], [[text(v) for v in r] for r in rows], compact=True))


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
        rows.append([role, f"`{m.get('source')}`", m.get("library") or "", str(m.get("revision") or m.get("commit")
                     or "-"), f"`{(m.get('fingerprint') or '-')[:16]}`"])
    return rows, missing


def _layout_rows(name: str, manifest: dict) -> list[list[str]]:
    return [[name, config, split, str(v["rows"]), f"`{v['path']}`" if v.get("path") else "-"]
            for config, c in manifest["configs"].items() for split, v in c["splits"].items()]


def build_card(study: str, study_dir: str | Path, provenance: dict, manifests: dict[str, dict]) -> str:
    """The card's Markdown. ``manifests``: layout folder name (relative to the card) -> its manifest."""
    spec = study_export(study)
    demo = is_demo(provenance)
    generic = manifests.get("parquet") or manifests.get("imagefolder") or {"configs": {}}
    total = sum(v["rows"] for c in generic["configs"].values() for v in c["splits"].values())
    configs = []
    if "parquet" in manifests:
        for config, c in manifests["parquet"]["configs"].items():
            configs.append({"config_name": config, "data_files": [
                {"split": split, "path": f"parquet/{v['path']}"} for split, v in c["splits"].items()]})
    front = {"pretty_name": spec.pretty_name + (" - offline demo" if demo else ""), "license": "other",
             "license_name": "mixed source terms (see Licensing Information)",
             "task_categories": list(spec.task_categories), "language": ["en"], "size_categories": [size_category(total)],
             "tags": ["counterfactual", "synthetic", "counterfactory"]}
    if configs:
        front["configs"] = configs
    lines = ["---", yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
             f"# Dataset Card for {front['pretty_name']}", "", "## Dataset Summary", "", spec.summary, "",
             f"Written by CounterFactory {provenance.get('counterfactory', '?')} from run results "
             f"(git commit `{(provenance.get('git') or {}).get('commit')}`"
             f"{', uncommitted changes' if (provenance.get('git') or {}).get('dirty') else ''}). "
             f"{total} items in the generic layout.", "",
             "## Dataset Structure", "", "### Layouts and counts", ""]
    table = [row for name, m in manifests.items() for row in _layout_rows(name, m)]
    lines += [markdown_table(["layout", "config", "split", "rows", "files"], table), ""]
    lines += ["Loading: `release/` is the published layout of the original dataset (where one exists); "
              "`imagefolder/<config>` loads with `datasets.load_dataset(\"imagefolder\", data_dir=...)`; "
              "`parquet/<config>/<split>-*.parquet` with `load_dataset(\"parquet\", data_files=...)` "
              "(images embedded).", "", "### Data Fields", ""]
    for config, c in generic["configs"].items():
        desc = c.get("description") or {}
        lines += [f"Config `{config}`:", ""]
        lines += [f"- `{f}` (image){': ' + desc[f] if f in desc else ''}" for f in c.get("images", [])]
        lines += [f"- `{f}`{': ' + desc[f] if f in desc else ''}" for f in c.get("fields", [])]
        lines.append("")
    lines += ["## Dataset Creation", "", "### Source Data", ""]
    lines += [f"- {SOURCE_LICENCES[k].split(':')[0]}" for k in spec.sources] + [""]
    rows, missing = _models(spec, provenance)
    lines += ["### Models", "", "Roles that made or filtered the data, as recorded in `provenance.json` "
              "(fingerprint: sha256 over the weights and configuration files, first 16 hex digits).", ""]
    lines += [markdown_table(["role", "id / path", "library", "revision", "fingerprint"], rows) if rows
              else "No model role of this study is recorded in the provenance.", ""]
    if missing:
        lines += [f"Not recorded in this run's provenance (not used by it): {', '.join(missing)}.", ""]
    lines += ["### Filter funnel", "", "Counts per stage, as the steps recorded them.", ""]
    stages = funnel(study, study_dir)
    for st in stages:
        lines += [f"**{st['stage']}** ({', '.join(f'`{f}`' for f in st['files'])})", ""]
        if st["kind"] == "counts":
            lines += [markdown_table(["count", "value"], [[k, _number(v)] for k, v in st["counts"].items()]), ""]
        else:
            t = st["table"].astype(str)
            lines += [markdown_table(list(t.columns), t.values.tolist()), ""]
    if not stages:
        lines += ["No summary file of this study was found.", ""]
    cfg = (provenance.get("config") or {}).get(study)
    lines += ["### Configuration", "", f"The `{study}` section of the run's configuration:", "", "```yaml",
              yaml.safe_dump(cfg, sort_keys=True).rstrip() if cfg else "# not recorded in provenance.json", "```", ""]
    lines += ["## Licensing Information", "", "The exported data inherit the terms of their sources; no single "
              "licence covers them (front matter: `license: other`).", ""]
    lines += [f"- {SOURCE_LICENCES[k]}" for k in spec.sources]
    if demo:
        lines.append(f"- {SOURCE_LICENCES['demo']}")
    lines += ["", "## Considerations for Using the Data", "", "### Known Limitations", ""]
    lines += [f"- {x}" for x in limitations(study, provenance)]
    return "\n".join(lines) + "\n"


def limitations(study: str, provenance: dict) -> list[str]:
    out = []
    if is_demo(provenance):
        out.append("Offline demo: every model is a tiny randomly initialised stand-in (resources/models/tiny), so "
                   "images and edited captions are noise-like and carry no meaning; use it to check layouts and "
                   "counts only.")
    if (provenance.get("git") or {}).get("dirty"):
        out.append("The run was made from a working tree with uncommitted changes.")
    out += {
        "coco_counterfactuals": ["Images keep the generator's PNG encoding; the published zip holds `.jpg` files "
                                 "(the loader joins `<stem>.jpg`).", "Counterfactual captions come from one "
                                 "masked-noun substitution and automatic filters; they can be ungrammatical."],
        "social_counterfactuals": ["Race, gender and physical attributes are prompt conditions, not labels of real "
                                   "people; generated images can show stereotypes of the generator."],
        "countercurate": ["Flickr30k-Attributes rows are exported only when the run produced them; the TSVs need "
                          "an `image_path` column in `datasets/attributes.parquet`.",
                          "An open LLM (role llm) and an open text-to-image model (role t2i) stand in for GPT-4V and "
                          "DALLE-3 (docs/studies/countercurate.md)."],
        "spurious_retrieval": ["The paper's code is not public; selection and inpainting follow the paper's text."],
        "cvld": ["The paper's code is not public; interventions and editing follow the paper's text."],
    }.get(study, [])
    return out


def write_card(study: str, study_dir: str | Path, provenance: str | Path, export_dir: str | Path,
               layouts: Iterable[str] = ("release", "imagefolder", "parquet"), out: str | Path | None = None) -> Path:
    """Build the card from ``provenance`` and the manifests of ``export_dir/<layout>`` (layouts without a folder
    are skipped) and write it to ``out`` (default ``export_dir/README.md``)."""
    from ..io import write_text

    export_dir = Path(export_dir)
    manifests = {name: read_manifest(export_dir / name) for name in layouts if (export_dir / name).is_dir()}
    if not manifests:
        raise input_error(export_dir, None, "no export layout folder (release/, imagefolder/, parquet/)",
                          "run `counterfactory export release/imagefolder` first")
    text = build_card(study, study_dir, load_json(provenance), manifests)
    return write_text(out or export_dir / "README.md", text)


def card_numbers(text: str) -> dict:
    """The YAML front matter of a card (for checks)."""
    if not text.startswith("---\n"):
        raise ValueError("card has no YAML front matter")
    return yaml.safe_load(text.split("---\n", 2)[1])


__all__ = ["build_card", "card_numbers", "funnel", "limitations", "size_category", "write_card"]
