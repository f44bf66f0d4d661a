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
from pathlib import Path

from .config import ConfigView, digest, study_view
from .config import job_config_file as _job_config_file


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
    from .data.check import count_captions

    return int(count_captions(path, limit_images=limit))


@functools.lru_cache(maxsize=16)
def _own_count(source: str, limit: int | None, cwd: str) -> int:
    from .data.own import count_own_captions

    return count_own_captions(json.loads(source), cwd, limit)


def caption_count(study_cfg: dict) -> int:
    """Number of input captions (after ``data.limit_images``): of ``data.source`` when set (own data), else of
    the COCO captions file. The shard layout follows from it, so missing or unreadable data stops the planning
    with the config key that names it (never a DAG planned for data that is not there)."""
    from .errors import ConfigError, CounterFactoryError

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
