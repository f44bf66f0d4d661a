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
    limit = cfg["data"].get("limit_images")
    if limit:
        from .data.coco import load_coco_captions

        table = load_coco_captions(path)
        keep = sorted(table["image_id"].unique())[:limit]
        return int(table["image_id"].isin(keep).sum())
    from .data.check import count_captions

    return int(count_captions(path))


def shard_ids(n_items: int, shard_size: int) -> list[str]:
    """Zero-padded shard ids covering ``n_items`` (at least one shard)."""
    return [f"{i:05d}" for i in range(max(1, math.ceil(n_items / shard_size)))]


def config_args(configfiles) -> str:
    """``--config <file>`` flags that hand the same configuration to every CLI stage."""
    return " ".join(f"--config {shlex.quote(str(f))}" for f in configfiles)


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
