"""Helpers the Snakefile uses at parse time (kept here so the Snakefile stays declarative)."""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path


def caption_json(cfg: dict) -> Path:
    data = cfg["data"]
    return Path(data["coco_root"]) / "annotations" / f"captions_{data['split']}.json"


def caption_count(cfg: dict) -> int:
    """Number of input captions (after ``data.limit_images``); 0 with a warning if COCO is missing,
    so the DAG still builds and the ``coco_check`` rule can explain how to get the data."""
    path = caption_json(cfg)
    if not path.exists():
        print(
            f"CounterFactory: {path} not found; the data rules will fail until MS-COCO is in place "
            f"(see README, 'Getting MS-COCO', or run `snakemake --configfile config/demo.yaml ...`).",
            file=sys.stderr,
        )
        return 0
    from .data.check import count_captions

    return int(count_captions(path, limit_images=cfg["data"].get("limit_images")))


def shard_ids(n_items: int, shard_size: int) -> list[str]:
    """Zero-padded shard ids covering ``n_items`` (at least one shard)."""
    return [f"{i:05d}" for i in range(max(1, math.ceil(n_items / shard_size)))]


def resolved_config_file(cfg: dict, folder: str | Path = ".snakemake/counterfactory") -> Path:
    """Write the configuration exactly as Snakemake resolved it (config files in Snakemake's order,
    ``--config key=value`` overrides, schema defaults) to ``<folder>/<run_name>.yaml`` so every CLI
    stage sees the same values. The path is stable per run, so editing the config does not by itself
    rerun every job (rules that depend on a value declare it in ``params``); the file is rewritten
    atomically only when its content changes."""
    import yaml

    from .io import write_text

    text = yaml.safe_dump(dict(cfg), sort_keys=True)
    path = Path(folder) / f"{cfg['run_name']}.yaml"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        write_text(path, text)
    return path


def config_args(cfg: dict) -> str:
    """``--config <file>`` flag that hands the resolved configuration to every CLI stage."""
    return f"--config {shlex.quote(str(resolved_config_file(cfg)))}"


def tiny_model_inputs(cfg: dict, *roles: str) -> list[str]:
    """Local tiny-model folders among ``roles``' sources, so Snakemake builds them before use."""
    tiny_dir = cfg.get("tiny_models", {}).get("out_dir")
    if not tiny_dir:
        return []
    out = []
    for role in roles:
        entry = cfg["models"].get(role)
        source = entry["source"] if isinstance(entry, dict) else entry
        if source and Path(source).parent == Path(tiny_dir):
            out.append(source)
    return out


def seed_pairs(training: dict) -> list[tuple[int, int]]:
    from .runs import seed_pairs as _pairs

    return _pairs(training)


def training_tables(training: dict) -> list[str]:
    """Table names: ``retrieval`` (Table 3 layout) if retrieval is evaluated, ``classification`` (Table 4)."""
    ev = training.get("eval", {})
    return [name for name, on in (("retrieval", ev.get("retrieval")), ("classification", ev.get("classification"))) if on]


def table_metrics(training: dict, table: str) -> str:
    """Comma-separated metric names of one table, in the paper's column order."""
    ev = training["eval"]
    if table == "retrieval":
        r = ev["retrieval"]
        names = [f"{r['name']}/{d}@{k}" for d in ("image_to_text", "text_to_image") for k in r["ks"]]
        return ",".join(names + [f"{r['name']}/mean"])
    return ",".join(f"{d}/top1" for d in ev["classification"])
