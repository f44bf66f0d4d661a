"""The glue between CounterCurate's steps: one table of grounded-generation requests for the three datasets,
and the finished datasets with their negative images attached.

* :func:`collect_requests`: Flickr30k-Positions' above/below generation requests (§3.2, prompts rewritten by
  the ``llm`` role where its answer is valid; app. B), Flickr30k-Counting's inpainting requests (§3.3) and
  Flickr30k-Attributes' text-to-image requests (§3.4) -> one requests table for
  :mod:`counterfactory.generation.grounded` (item ids must be unique across the three);
* :func:`attach`: the positions, counting and attributes tables with ``negative_image`` set from the merged
  generation output (left/right positions items keep their flipped image); rows whose negative image is
  missing (a rejected llm answer, an edit that was skipped) are dropped and counted.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from ...errors import input_error
from ...io import write_csv, write_parquet

log = logging.getLogger(__name__)

REQUEST_COLUMNS = ["item_id", "kind", "prompt", "phrases", "boxes", "image_path", "mask_box", "dataset"]


def _read(path: str | Path, what: str) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, f"{what} not found", "run the step that writes it first")
    return pd.read_parquet(path)


def collect_requests(positions_requests: str | Path, positions_answers: str | Path, counting_requests: str | Path,
                     attributes_requests: str | Path) -> pd.DataFrame:
    """One grounded-generation requests table (``item_id`` unique, ``dataset`` = positions / counting /
    attributes)."""
    from . import positions

    pos = positions.apply_rewrites(_read(positions_requests, "positions generation requests"),
                                   _read(positions_answers, "positions rewrite answers"))
    parts = [pos.assign(dataset="positions"),
             _read(counting_requests, "counting inpainting requests").assign(dataset="counting"),
             _read(attributes_requests, "attributes t2i requests").assign(dataset="attributes")]
    frame = pd.concat([p for p in parts if len(p)], ignore_index=True)
    dup = frame["item_id"].astype(str).duplicated(keep=False)
    if dup.any():
        first = frame[dup].iloc[0]
        raise input_error(positions_requests, f"item_id {first['item_id']!r}", "the same item id in two datasets' "
                          "requests", "give every dataset's items distinct ids")
    return frame


def attach(table: pd.DataFrame, generated: pd.DataFrame, dataset: str) -> tuple[pd.DataFrame, int]:
    """``table`` with ``negative_image`` from ``generated`` (``item_id, image_path``); rows without one dropped."""
    paths = dict(zip(generated["item_id"].astype(str), generated["image_path"]))
    out = table.copy()
    if dataset == "positions":
        ab = out["subset"] == "AB"
        out.loc[ab, "negative_image"] = out.loc[ab, "item_id"].astype(str).map(paths)
    else:
        out["negative_image"] = out["item_id"].astype(str).map(paths)
    missing = out["negative_image"].isna()
    if missing.any():
        log.info("%s: %d of %d items have no negative image (rejected or skipped); dropped", dataset,
                 int(missing.sum()), len(out))
    return out[~missing].reset_index(drop=True), int(missing.sum())


def _absolute_images(generated: pd.DataFrame, folder: Path) -> pd.DataFrame:
    return generated.assign(image_path=[p if Path(p).is_absolute() else str((folder / p).resolve())
                                        for p in generated["image_path"]])


def write_datasets(positions_table, counting_table, attributes_table, generated_table, out_dir) -> pd.DataFrame:
    """Write ``positions.parquet``, ``counting.parquet``, ``attributes.parquet`` and ``summary.csv`` (items per
    dataset, subset and split) under ``out_dir``; return the summary."""
    generated = _absolute_images(_read(generated_table, "merged generation output"), Path(generated_table).parent)
    out_dir = Path(out_dir)
    rows = []
    for name, path in (("positions", positions_table), ("counting", counting_table),
                       ("attributes", attributes_table)):
        table = _read(path, f"{name} table")
        if name == "attributes" and "status" in table.columns:
            table = table[table["status"] == "accepted"]
        done, dropped = attach(table, generated, name)
        write_parquet(out_dir / f"{name}.parquet", done)
        groups = [c for c in ("subset", "split") if c in done.columns]
        counts = done.groupby(groups).size().reset_index(name="items") if groups and len(done) else \
            pd.DataFrame({"items": [len(done)]})
        rows.append(counts.assign(dataset=name, dropped=dropped))
    summary = pd.concat(rows, ignore_index=True)
    summary = summary[["dataset", *[c for c in ("subset", "split") if c in summary.columns], "items", "dropped"]]
    write_csv(out_dir / "summary.csv", summary)
    return summary
