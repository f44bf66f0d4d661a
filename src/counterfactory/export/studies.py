"""The generic part of a study's export: :class:`StudyExport`, what a study declares about its data (its published
format, if any, and the files it is made from, the rows of the generic layout (index table, image columns, fields),
the filter-funnel files of the card, the model roles that made the data and the source datasets whose licences
apply), the helpers its table functions share, and the functions that export a study given its declaration.

Each study declares its own: ``EXPORT``, a :class:`StudyExport`, in ``counterfactory.studies.<study>.export``, set as
its spec's ``export`` (:class:`counterfactory.workflow.StudySpec`); the command line looks it up there and passes it
to the functions here, so this layer names no study.

All paths are relative to the study's results folder (``results/<run>/<study>``) and follow the layouts the
study steps write (see ``results/demo/<study>/``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import pandas as pd

from ..errors import ConfigError, input_error
from .formats import ExportTable, write_coco_counterfactuals, write_countercurate, write_social_counterfactuals
from .webdataset import RetrievalItem


@dataclass(frozen=True)
class StudyExport:
    release: str | None                      # published format written by `export release` (None: none exists)
    release_inputs: tuple[str, ...]          # files it reads
    tables: Callable[[Path], list[ExportTable]]   # rows of the generic imagefolder / parquet layouts
    funnel: tuple[str, ...]                  # summary files (glob patterns) shown as the card's filter funnel
    roles: tuple[str, ...]                   # model roles that made or filtered the data
    sources: tuple[str, ...]                 # keys of :data:`SOURCE_LICENCES`
    pretty_name: str
    summary: str
    task_categories: tuple[str, ...] = ("image-to-text", "text-to-image", "zero-shot-image-classification")
    #: the CLIP_benchmark webdataset export's image-caption retrieval samples of one export table (None: none)
    retrieval: Callable[[ExportTable], list[RetrievalItem]] | None = None
    #: which rows of an export table the VQA check's verified variant (``verify/verified.parquet``, read as a frame;
    #: its folder) keeps: a boolean mask over ``table.rows`` (None: the study has no VQA adapter)
    verified: Callable[[ExportTable, pd.DataFrame, Path], "pd.Series | list[bool]"] | None = None
    #: the paper's BibTeX entry (the card's Citation section; empty: the card says none is recorded)
    citation: str = ""
    #: the card's notes on bias and risk of the study's data (after the note every study shares)
    bias_notes: tuple[str, ...] | list[str] = ()
    #: the card's known limitations of the study's data (after the run's own: demo, uncommitted changes)
    limitations: tuple[str, ...] | list[str] = ()


def read_table(path: Path, what: str) -> pd.DataFrame:
    """The parquet table ``path`` (``what`` names it in the error when it is missing)."""
    if not path.is_file():
        raise input_error(path, None, f"{what} not found", "run the study's steps first (make demo / snakemake)")
    return pd.read_parquet(path)


def shards(folder: Path, pattern: str, what: str) -> list[Path]:
    """The files of ``folder`` matching ``pattern``, sorted (an error naming ``what`` when there is none)."""
    files = sorted(folder.glob(pattern))
    if not files:
        raise input_error(folder, None, f"no {what} ({pattern})", "run the study's image steps first")
    return files


def method_rows(method_dir: Path, path_column: str, kept_only: bool = False) -> pd.DataFrame:
    """Every shard of one image method (``<method>/<shard>/shard.parquet``) in one frame, with ``image`` the
    shard's ``path_column`` resolved against the shard folder (that column dropped); ``kept_only``: the rows whose
    ``kept`` is true (that column dropped too)."""
    frames = []
    for shard in shards(method_dir, "*/shard.parquet", f"{method_dir.name} image shards"):
        f = pd.read_parquet(shard)
        if kept_only:
            f = f[f.pop("kept").astype(bool)].copy()
        f["image"] = [str(shard.parent / p) for p in f.pop(path_column)]
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


# ------------------------------------------------------------------------------------------------ verified variant
#: suffix of the config that holds a config's rows the VQA check kept
VERIFIED_SUFFIX = "_verified"


def image_file_verified(column: str):
    """A :attr:`StudyExport.verified` mask by the made image's file: the verified rows' ``column`` (relative to the
    verify folder) names the dataset and the editing / inpainting method, so only that config's rows match."""
    def mask(table: ExportTable, verified: pd.DataFrame, folder: Path):
        files = {os.path.abspath(folder / str(p)) for p in verified[column]} if len(verified) else set()
        return [os.path.abspath(table.image_file(v)) in files if table.image_file(v) else False
                for v in table.rows["image"]]
    return mask


def verified_tables(study: str, export: StudyExport, tables: list[ExportTable], verified_path: str | Path
                    ) -> list[ExportTable]:
    """Beside each export config of ``study`` (its declaration ``export``), ``<config>_verified``: its rows the VQA
    check kept (those in ``verify merge``'s verified variant, ``verified_path``; possibly none), in the same layout
    and with the same fields."""
    if export.verified is None:
        raise ConfigError(f"study {study!r} has no verified variant (no VQA adapter is wired for it: its "
                          "StudyExport.verified is None). Fix: drop --verified")
    path = Path(verified_path)
    frame = read_table(path, "verified variant (verify/verified.parquet)")
    out = []
    for table in tables:
        mask = pd.Series(list(export.verified(table, frame, path.parent)), index=table.rows.index, dtype=bool)
        out.append(replace(table, config=table.config + VERIFIED_SUFFIX, rows=table.rows[mask].reset_index(drop=True)))
    return out


# ------------------------------------------------------------------------------------------------ retrieval
# A study's :attr:`StudyExport.retrieval` turns one export table (a config, or its ``_verified`` variant) into
# CLIP_benchmark retrieval samples. No caption text occurs on two images of a set and no image occurs twice: either
# would be a tie that CLIP_benchmark's top-k breaks arbitrarily.


def retrieval_sets(study: str, export: StudyExport, study_dir: str | Path, verified: str | Path | None = None
                   ) -> dict[str, list[RetrievalItem]]:
    """config -> retrieval samples of each export table of ``study`` (its declaration ``export``; and, with
    ``verified``, of each ``<config>_verified`` table); a table without rows gives no config (CLIP_benchmark cannot
    read zero shards)."""
    if export.retrieval is None:
        raise ConfigError(f"study {study!r} declares no image-caption retrieval set (its StudyExport.retrieval is "
                          "None). Fix: use `counterfactory export imagefolder`")
    tables = export.tables(Path(study_dir))
    if verified is not None:
        tables += verified_tables(study, export, tables, verified)
    sets = {t.config: export.retrieval(t) for t in tables if len(t.rows)}
    return {config: items for config, items in sets.items() if items}


# ------------------------------------------------------------------------------------------------ licences
SOURCE_LICENCES = {
    "coco": "MS-COCO: annotations (captions, instances) CC BY 4.0; images remain under the Flickr terms of use of "
            "their owners (see cocodataset.org/#termsofuse).",
    "flickr30k": "Flickr30k / Flickr30k Entities: images under the Flickr terms of use, for non-commercial research; "
                 "Flickr30k Entities annotations as distributed by their authors.",
    "celeba": "CelebA: non-commercial research purposes only (CelebA agreement).",
    "stable_diffusion": "Generated images: made with Stable Diffusion-family weights under the CreativeML "
                        "OpenRAIL-M licence, whose use restrictions carry over to the outputs' use.",
    "demo": "Offline demo: the images are scikit-image sample photographs (public domain / CC0) and synthetic "
            "stand-ins; captions, boxes and rows were written for CounterFactory (resources/demo/LICENSES.md).",
}


def release_inputs(export: StudyExport, study_dir: str | Path) -> list[str]:
    """The files a study's published release (its declaration ``export``) is written from."""
    return [str(Path(study_dir) / p) for p in export.release_inputs]


def write_release(study: str, export: StudyExport, study_dir: str | Path, out_dir: str | Path,
                  manifest_path: str | Path | None = None) -> dict:
    """Write ``study``'s results (``study_dir``) in the layout of its published release (``export.release``, its
    declaration ``export``) to ``out_dir``; returns the manifest. A study without a published format is a
    ConfigError naming the generic layouts' export."""
    d = Path(study_dir)
    if export.release is None:
        raise ConfigError(f"study {study!r} has no published release format. Fix: export it with "
                          "`counterfactory export imagefolder`")
    if export.release == "coco_counterfactuals":
        return write_coco_counterfactuals(d / export.release_inputs[0], d / export.release_inputs[1], out_dir,
                                          manifest_path=manifest_path)
    if export.release == "countercurate":
        return write_countercurate(d / "datasets", out_dir, manifest_path=manifest_path)
    return write_social_counterfactuals(d / export.release_inputs[0], out_dir, manifest_path=manifest_path,
                                        citation=export.citation)


def funnel_files(export: StudyExport, study_dir: str | Path) -> list[Path]:
    """The summary files of a study's filter funnel (``export.funnel``) found in ``study_dir``."""
    d = Path(study_dir)
    return [f for pattern in export.funnel for f in sorted(d.glob(pattern))]


def is_demo(provenance: dict) -> bool:
    """True when the models are this package's tiny random stand-ins (``resources/models/tiny``)."""
    models = provenance.get("models") or {}
    return bool(models) and all("models/tiny" in str(m.get("source", "")) for m in models.values())


def load_json(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise input_error(path, None, "not found", "run `counterfactory provenance` (rule provenance) first")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise input_error(path, f"line {exc.lineno}", f"not JSON ({exc.msg})", "rewrite the file") from None
