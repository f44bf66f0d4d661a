"""Helpers the Snakefile uses at parse time (kept here so the rule files stay declarative).

Every job gets its settings through one input, ``--config FILE``: FILE holds exactly the config sections
the rule declares (:func:`job_config_file`) and is named by their digest. FILE is the output of the local
``config_write_job`` rule (rules/setup.smk), so parsing the Snakefile writes nothing and executors that stage
files see it. Snakemake reruns a job whose set of inputs changed, so an edit reruns exactly the jobs whose
sections changed (and, through their outputs, everything downstream); FILE is an ``ancient`` input, never
rewritten once made, so a later parse with another config cannot change a running job's settings.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .config import ConfigView, digest, load_schema, study_view
from .config import job_config_file as _job_config_file
from .data.check import count_captions
from .errors import ConfigError, CounterFactoryError

if TYPE_CHECKING:
    from .export.studies import StudyExport


@functools.lru_cache(maxsize=64)
def _view_cached(text: str, study: str) -> ConfigView:
    return study_view(json.loads(text), study)


_TEXT: dict[int, tuple[dict, str]] = {}


def _text(cfg: dict) -> str:
    """The configuration's JSON text, made once per config object: the Snakefile's ``config`` is not changed after
    it is validated, and input functions ask for a view once per job."""
    hit = _TEXT.get(id(cfg))
    if hit is None or hit[0] is not cfg:
        hit = _TEXT[id(cfg)] = (cfg, json.dumps(cfg, default=str))
    return hit[1]


def view(cfg: dict, study: str) -> ConfigView:
    """The study's view of the configuration (shared sections + the study's own at top level); cached by
    content, so input functions may call it for every job. Treat it (and ``cfg``) as read-only.

    Mappings keep the order the config files give them (JSON objects keep insertion order): the order of
    ``training.mixtures`` or ``evaluation.classification.datasets`` is the order of the paper's table rows and
    columns, so the cache key is order-sensitive too (never ``sort_keys``)."""
    return _view_cached(_text(cfg), study)


def caption_json(study_cfg: dict) -> Path:
    data = study_cfg["data"]
    return Path(data["coco_root"]) / "annotations" / f"captions_{data['split']}.json"


def image_dir(study_cfg: dict) -> Path:
    data = study_cfg["data"]
    return Path(data["coco_root"]) / data["split"]


@functools.lru_cache(maxsize=16)
def _count(path: str, limit: int | None) -> int:
    return int(count_captions(path, limit_images=limit))


@functools.lru_cache(maxsize=16)
def _own_count(source: str, limit: int | None, cwd: str) -> int:
    from .data.own import count_own_captions

    return count_own_captions(json.loads(source), cwd, limit)


def caption_count(study_cfg: dict) -> int:
    """Number of input captions (after ``data.limit_images``): of ``data.source`` when set (own data), else of
    the COCO captions file. The shard layout follows from it, so missing or unreadable data stops the planning
    with the config key that names it (never a DAG planned for data that is not there)."""
    study = study_cfg.get("study", "?")
    source = study_cfg["data"].get("source")
    if source:
        try:
            return _own_count(json.dumps(dict(source), sort_keys=True), study_cfg["data"].get("limit_images"),
                              str(Path.cwd()))
        except CounterFactoryError as exc:
            raise ConfigError(
                f"{study}.data.source cannot be read, so its shards cannot be planned: {str(exc).splitlines()[0]}. "
                f"Fix: `counterfactory data own-check --config <your config>` lists every problem of the source"
            ) from None
    path = caption_json(study_cfg)
    if not path.exists():
        raise ConfigError(
            f"{path} not found (config key {study}.data.coco_root): the MS-COCO captions decide how the caption "
            f"and image stages are sharded. Fix: put MS-COCO 2017 there (docs/studies/coco_counterfactuals.md) or point "
            f"{study}.data.coco_root at it; the offline demo runs with `--configfile config/demo.yaml`"
        )
    return _count(str(path), study_cfg["data"].get("limit_images"))


def shard_ids(n_items: int, shard_size: int) -> list[str]:
    """Zero-padded shard ids covering ``n_items`` (at least one shard)."""
    return [f"{i:05d}" for i in range(max(1, math.ceil(n_items / shard_size)))]


def job_config_file(cfg: dict, study: str | None, keys) -> tuple[str, str]:
    """``(path, text)`` of one job's configuration: the listed (dotted) sections of ``study``'s view, in a
    file named by their digest. Nothing is written: the Snakefile's ``config_write_job`` rule writes it."""
    return _job_config_file(cfg, study, keys, view=view(cfg, study) if study else None)


def run_config_file(cfg: dict, folder: str | Path = ".snakemake/counterfactory/runs") -> tuple[str, str]:
    """``(path, text)`` of the whole resolved configuration (provenance), content-addressed; not written."""
    import yaml

    return str(Path(folder) / f"{digest(dict(cfg))[:20]}.yaml"), yaml.safe_dump(dict(cfg), sort_keys=True)


def _sources(cfg: dict, roles) -> list[str]:
    """Configured sources of ``roles`` (roles that are not configured are skipped)."""
    out = []
    for role in roles:
        entry = cfg["models"].get(role)
        if entry is not None:
            out.append(entry["source"] if isinstance(entry, dict) else entry)
    return out


def _is_tiny(cfg: dict, source: str) -> bool:
    tiny_dir = (cfg.get("tiny_models") or {}).get("out_dir")
    return bool(tiny_dir) and Path(source).parent == Path(tiny_dir)


def tiny_model_inputs(cfg: dict, *roles: str) -> list[str]:
    """Local tiny-model folders among ``roles``' sources, so Snakemake builds them before use."""
    return [s for s in _sources(cfg, roles) if _is_tiny(cfg, s)]


def local_model_inputs(cfg: dict, *roles: str) -> list[str]:
    """Every role among ``roles`` whose source is a local folder (tiny or not): declared as inputs so a
    swapped or rebuilt model folder reruns the jobs that use it."""
    return [s for s in _sources(cfg, roles) if _is_tiny(cfg, s) or Path(s).exists()]


def seed_pairs(training: dict) -> list[tuple[int, int]]:
    from .training.runs import seed_pairs as _pairs

    return _pairs(training)


# --------------------------------------------------------------------------- a study as one unit (issue 41 §2)
#
# Each study declares one :class:`StudySpec` in ``counterfactory/studies/<study>/spec.py`` (``SPEC``);
# ``counterfactory.studies.specs()`` finds them. What a spec's functions build (:class:`Stage` rows of the plan,
# :class:`Need` dataset files of the preflight) and the helpers they share are defined here, below the studies, so
# a study module builds them without importing the layers above it (planning, preflight re-export them).


@dataclass
class Stage:
    """One image stage of one study, before throughput is applied (:mod:`counterfactory.planning`)."""

    study: str
    stage: str
    items: int | None
    items_source: str
    unet_per_item: int | None        # None: the stage has no UNet (work = images)
    images_per_item: float
    height: int
    width: int
    throughput_stage: str
    jobs: int | None
    item_key: str = ""               # the --items key (default study.stage; spurious_retrieval: per dataset)

    def key(self) -> str:
        return self.item_key or f"{self.study}.{self.stage}"


@dataclass(frozen=True)
class Need:
    """One dataset file or folder a study reads: config key, path, what must be inside, where to get it
    (:mod:`counterfactory.preflight`)."""

    key: str
    path: str | None
    source: str
    inside: tuple[str, ...] = ()   # entries a folder must hold (its official layout)
    problem: str = ""              # set when the layout is known to be wrong without looking (a reader's error)
    image_root: str | None = None  # a Karpathy file: the folder its <filepath>/<filename> paths start from
    splits: tuple[str, ...] = ()   # ... and the splits the enabled rules read (a sample of each is looked up)


#: ``plan(view, results_dir, items) -> [Stage]``: the study's image stages (``results_dir``: :meth:`StudySpec.results`)
PlanFn = Callable[[Mapping, Path, Mapping[str, int]], "list[Stage]"]
#: ``needs(study, view) -> [Need]``: every user-provided dataset file or folder the study's rules read
NeedsFn = Callable[[str, Mapping], "list[Need]"]


def _no_stages(view, results: Path, items: Mapping[str, int]) -> list[Stage]:
    return []


def _no_needs(study: str, view) -> list[Need]:
    return []


@dataclass(frozen=True)
class StudySpec:
    """Everything the package's shared machinery knows about one study, in one place.

    ``name``: the config section, ``studies:`` entry and package name; ``order``: its place in every listing (the
    report, the plan, ``counterfactory.studies.specs()``); ``short``: its own CLI group and rule prefix
    (``counterfactory <short> <step>``, rule ``<short>_<step>``; None for COCO-Counterfactuals, whose steps are the
    shared groups' own and whose rules therefore carry no study word); ``title`` / ``paper``: as the report and the
    dataset cards name them; ``docs``: its page; ``roles``: model roles it uses without naming them in its section
    (on top of the ``x-required-roles`` of its schema section, ``config.study_roles``, and the roles its settings
    name); ``own_rules``: its rules that run a shared group's step without a study word (``planning.rule_study``);
    ``report_sections``: its report sub-groups in the order its paper presents them (``report_labels.section``;
    unlisted ones follow); ``plan`` / ``needs``: its plan rows and its dataset
    files (:data:`PlanFn`, :data:`NeedsFn`); ``export``: its export formats and dataset card, a
    :class:`counterfactory.export.studies.StudyExport` declared in its package's ``export`` module (None: it exports
    nothing)."""

    name: str
    order: int
    title: str
    paper: str
    short: str | None = None
    docs: str = ""
    roles: tuple[str, ...] = ()
    own_rules: tuple[str, ...] = ()
    report_sections: tuple[str, ...] = ()
    plan: PlanFn = _no_stages
    needs: NeedsFn = _no_needs
    export: "StudyExport | None" = None

    @property
    def rules_file(self) -> str:
        """Its Snakemake rules (relative to the Snakefile): its own steps and its targets."""
        return f"rules/study_{self.name}.smk"

    @property
    def docs_page(self) -> str:
        return self.docs or f"docs/studies/{self.name}.md"

    def results(self, results: str | Path) -> Path:
        """Its results folder under a run's ``results/<run_name>`` (the rules' ``{RESULTS}/{study}``); the plan reads
        earlier runs' input tables below it."""
        return Path(results) / self.name


# --------------------------------------------------------------------------- helpers the study specs share

#: paper counts used when no input table exists (each with its source)
PAPER_ITEMS = {
    ("coco_counterfactuals", "p2p_pairs"): (24508, "COCO-CF §3.3: 24,508 caption pairs from 25,014 captions"),
    ("spurious_retrieval", "coco"): (45467, "Kim et al. §4.1: 45,467 synthetic MS-COCO training images"),
    ("spurious_retrieval", "flickr30k"): (4650, "Kim et al. §4.1: 4,650 synthetic Flickr30k training images"),
}


def table_rows(path: Path) -> int | None:
    import pandas as pd

    return len(pd.read_parquet(path)) if path.exists() else None


def plan_items(key: tuple[str, str], overrides: Mapping[str, int], table: Path | None = None, count=None,
               fallback: tuple[int | None, str] | None = None) -> tuple[int | None, str]:
    """(items, where the number comes from): override, then the input table, then ``fallback``."""
    name = ".".join(key)
    if name in overrides:
        return int(overrides[name]), "--items"
    if table is not None and table.exists():
        return (count(table) if count else table_rows(table)), str(table)
    return fallback or PAPER_ITEMS.get(key, (None, "unknown: run the step that writes the input table, or --items"))


def karpathy_images(path, splits=("train", "restval")) -> int | None:
    """Images of ``splits`` (default: the training images, train + restval, §4.1 of Kim et al.; CVLD app. B) in a
    configured Karpathy file; None when the file is not in place or not readable (the paper count is used then).
    The file is read once per version (:func:`counterfactory.data.karpathy.summary`)."""
    from .data.karpathy import summary

    info = summary(path) if path else None
    return None if info is None else sum(info["counts"].get(name, 0) for name in set(splits))


def capped(paper: tuple[int, str], most: int | None, what: str) -> tuple[int, str]:
    """The paper's count, or what the configured data can give at most (``what``) when that is fewer."""
    if most is None or most >= paper[0]:
        return paper
    return most, f"upper bound: {most:,} {what} (paper: {paper[1]})"


def karpathy_needs(key: str, spec: dict, splits, source: str) -> list[Need]:
    """A Karpathy split file and its image folder: the file, the folder, and a sample of the images the rules will
    open (``image_root/filepath/filename``) of each split read."""
    splits = (splits,) if isinstance(splits, str) else tuple(splits or ())
    return [Need(f"{key}.karpathy_json", spec.get("karpathy_json"), "karpathy",
                 image_root=spec.get("image_root"), splits=splits),
            Need(f"{key}.image_root", spec.get("image_root"), source)]


def retrieval_needs(key: str, spec: dict) -> list[Need]:
    """The files a retrieval set (schema definition ``retrieval_set``) reads: :func:`karpathy_needs` of its split
    (the schema's default split when the set does not name one) in the dataset :func:`images_source` names."""
    split = spec.get("split") or load_schema()["definitions"]["retrieval_set"]["properties"]["split"]["default"]
    return karpathy_needs(key, spec, split, images_source(spec))


def images_source(spec: dict) -> str:
    """The catalogue dataset whose images a retrieval set's Karpathy file points into."""
    name = spec.get("dataset") or ("coco2014" if "coco" in str(spec.get("name", "")) else "flickr30k")
    return "coco2014" if name == "coco2014" else "flickr30k"


def classification_needs(key: str, datasets: dict, names) -> list[Need]:
    """The files a classification dataset's reader opens (its official layout), as the rules declare them."""
    from .data.classification import dataset_input_files

    out = []
    for name in [n for n in datasets if n in set(names)]:
        spec = datasets[name]
        root_key = f"{key}.{name}.root"
        if not spec.get("root") or not Path(spec["root"]).exists():
            out.append(Need(root_key, spec.get("root"), spec.get("format", "")))
            continue
        try:
            paths = dataset_input_files(spec, name)
        except Exception as exc:   # the reader's own check of the layout, a missing class-index file
            why = str(exc).splitlines()[0].split(" Fix: ")[0].rstrip(".")
            field = next((f for f in ("class_index", "class_names") if f"{name}.{f}" in why), "root")
            out.append(Need(f"{key}.{name}.{field}", spec.get(field), spec.get("format", ""), problem=why))
            continue
        out += [Need(root_key, p, spec.get("format", "")) for p in paths]
    return out
