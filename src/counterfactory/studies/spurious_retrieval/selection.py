"""``counterfactory spurious select`` on files (§3.1): the selection settings (the ``spurious_retrieval.selection``
section of the configuration with the command line's overrides), the selection table of COCO instances, of
Flickr30k Entities boxes or of the study's dataset (then with its removal requests), and the selection funnel as a
CSV. The selection itself is :mod:`.regions`; the study's dataset and its requests are :mod:`.data`."""

from __future__ import annotations

from pathlib import Path

from ...config import deep_merge, read_yaml
from ...io import write_csv, write_parquet
from . import data, regions, settings

#: the selection settings a command-line option overrides (None: not given)
OVERRIDES = ("alpha1", "alpha2", "alpha3", "rule", "mask_mode", "classes")


def yaml_config(paths) -> dict:
    """The YAML files ``paths`` merged (later files win), not validated: the selection section is validated by
    :func:`params` (a selection from boxes needs no full configuration)."""
    cfg: dict = {}
    for path in paths:
        cfg = deep_merge(cfg, read_yaml(Path(path)))
    return cfg


def params(cfg, overrides: dict) -> dict:
    """Validated selection settings: the selection section of ``cfg``, then every override that is not None."""
    section = dict(regions.config_section(cfg))
    for key in OVERRIDES:
        value = overrides.get(key)
        if value is not None:
            section[key] = value
    return regions.settings({regions.SECTION[0]: {regions.SECTION[1]: section}})


def write_summary(path, counts: dict) -> None:
    """The selection funnel (:func:`.regions.summary`) as a two-column CSV (count, value); nothing without a path."""
    if not path:
        return
    import pandas as pd

    rows = [(k, counts[k]) for k in ("images", "candidates", "selected", "single", "multi")]
    rows += [(f"skipped: {reason}", n) for reason, n in counts["skipped"].items()]
    write_csv(path, pd.DataFrame(rows, columns=["count", "value"]))


def select_dataset_files(cfg, params: dict, dataset: str, out, out_requests, out_summary=None):
    """Select on the study's ``dataset`` (its Karpathy splits, from the configuration ``cfg``); write the selection
    table to ``out``, the removal requests to ``out_requests`` and the funnel to ``out_summary`` (when given).
    Returns ``(selection, requests)``."""
    table, requests = data.select(settings.settings(cfg), params, dataset)
    write_parquet(out, table)
    write_parquet(out_requests, requests)
    write_summary(out_summary, regions.summary(table))
    return table, requests


def select_boxes_files(params: dict, out, out_summary=None, instances=None, entities_root=None):
    """Select on COCO ``instances`` (an instances_<split>.json), else on the Flickr30k Entities boxes under
    ``entities_root``; write the selection table to ``out`` and the funnel to ``out_summary`` (when given).
    Returns the selection table."""
    if instances:
        images, objects, known = regions.coco_objects(instances)
        source = instances
    else:
        images, objects, known = regions.flickr_objects(entities_root, params["classes"])
        source = entities_root
    table = regions.select_regions(images, objects, params, source=source, known_classes=known)
    write_parquet(out, table)
    write_summary(out_summary, regions.summary(table))
    return table
