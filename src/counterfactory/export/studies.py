"""What each study exports, declared in one place: its published format (if any) and the files it is made from,
the rows of the generic layout (index table, image columns, fields), the filter-funnel files of the card, the
model roles that made the data and the source datasets whose licences apply.

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
from .webdataset import RetrievalItem, items_from_pairs, sample_key


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


def _read(path: Path, what: str) -> pd.DataFrame:
    if not path.is_file():
        raise input_error(path, None, f"{what} not found", "run the study's steps first (make demo / snakemake)")
    return pd.read_parquet(path)


def _shards(folder: Path, pattern: str, what: str) -> list[Path]:
    files = sorted(folder.glob(pattern))
    if not files:
        raise input_error(folder, None, f"no {what} ({pattern})", "run the study's image steps first")
    return files


def _method_rows(method_dir: Path, path_column: str, kept_only: bool = False) -> pd.DataFrame:
    """Every shard of one image method (``<method>/<shard>/shard.parquet``) in one frame, with ``image`` the
    shard's ``path_column`` resolved against the shard folder (that column dropped); ``kept_only``: the rows whose
    ``kept`` is true (that column dropped too)."""
    frames = []
    for shard in _shards(method_dir, "*/shard.parquet", f"{method_dir.name} image shards"):
        f = pd.read_parquet(shard)
        if kept_only:
            f = f[f.pop("kept").astype(bool)].copy()
        f["image"] = [str(shard.parent / p) for p in f.pop(path_column)]
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


# ------------------------------------------------------------------------------------------------ tables
def coco_tables(d: Path) -> list[ExportTable]:
    """§3.2 / B11: one row per selected pair (P2P image pair, original and counterfactual caption)."""
    path = d / "images" / "selected_pairs.parquet"
    rows = _read(path, "selected pairs")
    return [ExportTable("default", rows, ("image_0", "image_1"), "id", base=path.parent, default_split="test",
                        description={"caption_0": "original MS-COCO caption", "caption_1": "counterfactual caption "
                                     "(one noun replaced, §3.1)", "image_0": "image generated for caption_0",
                                     "image_1": "image generated for caption_1 (Prompt-to-Prompt, same seed)"})]


def social_tables(d: Path) -> list[ExportTable]:
    """§3.4: the images kept by the three filters, one row per set member."""
    path = d / "filter" / "kept.parquet"
    rows = _read(path, "kept images").copy()
    rows.insert(0, "item_id", [f"{s}-c{int(c):03d}-m{int(m):02d}" for s, c, m in
                               zip(rows["set_id"], rows["candidate_index"], rows["member_index"])])
    return [ExportTable("default", rows.rename(columns={"image_path": "image"}), ("image",), "item_id",
                        base=path.parent, description={"set_id": "counterfactual caption set",
                                                       "member_index": "0 = base member of the set"})]


def countercurate_tables(d: Path) -> list[ExportTable]:
    """§3.2-3.4: Flickr30k-Positions / -Counting / -Attributes, source image and negative image per item."""
    out = []
    for name in ("positions", "counting", "attributes"):
        path = d / "datasets" / f"{name}.parquet"
        rows = _read(path, f"CounterCurate {name} table")
        if rows.empty:
            continue
        rows = rows.rename(columns={"image_path": "image"})
        out.append(ExportTable(name, rows, ("image", "negative_image"), "item_id", base=path.parent,
                               split_column="split" if "split" in rows.columns else None,
                               description={"image": "Flickr30k image", "negative_image": "negative image (flip, "
                                            "GLIGEN generation or inpainting)", "negative_caption": "hard negative"}))
    return out


#: text methods of the spurious-retrieval captions (§3.3, Table 3) -> export column; ``caption`` is the first
#: caption of the first method an item has
SR_CAPTION_COLUMNS = {"np_removal": "captions", "prompt": "prompt_caption", "captioner": "captioner_caption"}


def _spurious_captions(dataset_dir: Path) -> dict[str, dict]:
    """item_id -> export caption fields from ``captions/synthetic.parquet`` (+ ``captions/captioner.parquet``
    where the captioner ran): ``caption`` (one text for image-text loaders), ``captions`` (every noun-phrase-removed
    caption of the image, §3.3), ``prompt_caption`` and ``captioner_caption`` (None where the method did not run)."""
    frames = [_read(dataset_dir / "captions" / "synthetic.parquet", "synthetic captions")]
    if (dataset_dir / "captions" / "captioner.parquet").is_file():
        frames.append(pd.read_parquet(dataset_dir / "captions" / "captioner.parquet"))
    texts = pd.concat(frames, ignore_index=True)
    texts = texts[texts["method"].isin(SR_CAPTION_COLUMNS)].sort_values(["item_id", "caption_index"], kind="stable")
    out: dict[str, dict] = {}
    for item, g in texts.groupby("item_id", sort=False):
        by = {m: [str(t) for t in gm["caption"]] for m, gm in g.groupby("method", sort=False)}
        first = next(by[m][0] for m in SR_CAPTION_COLUMNS if by.get(m))
        out[str(item)] = {"caption": first, "captions": by.get("np_removal", []),
                          "prompt_caption": (by.get("prompt") or [None])[0],
                          "captioner_caption": (by.get("captioner") or [None])[0]}
    return out


def spurious_tables(d: Path) -> list[ExportTable]:
    """§3.1, §3.3: images with the requested classes removed and their captions, one config per dataset and
    method. Items left without any caption (every caption lost all its words) are not exported: every row is an
    image-text pair."""
    out = []
    for requests in sorted(d.glob("*/selection/requests.parquet")):
        dataset = requests.parent.parent.name
        req = _read(requests, "inpainting requests").set_index("item_id")
        texts = _spurious_captions(requests.parent.parent)
        for method_dir in sorted(p for p in (requests.parent.parent / "images").glob("*") if p.is_dir()):
            rows = _method_rows(method_dir, "output_path").drop(columns=["key"], errors="ignore")
            extra = req.reindex(rows["item_id"])
            for col in ("image_id", "split", "category", "removed_categories", "present_categories"):
                if col in extra.columns:
                    rows[col] = extra[col].to_numpy()
            rows["original_image"] = rows.pop("image_path")     # as the requests give it (relative: to the cwd)
            rows = rows[rows["item_id"].astype(str).isin(texts)].reset_index(drop=True)
            fields = [texts[str(i)] for i in rows["item_id"]]
            for col in ("caption", "captions", "prompt_caption", "captioner_caption"):
                rows[col] = [f[col] for f in fields]
            rows = rows.drop(columns=[c for c in ("prompt_caption", "captioner_caption") if rows[c].isna().all()])
            out.append(ExportTable(f"{dataset}_{method_dir.name}", rows, ("image", "original_image"), "item_id",
                                   description={"image": "image with the removed categories inpainted",
                                                "original_image": "source image",
                                                "caption": "a caption of the inpainted image (the first of "
                                                           "captions, else prompt_caption, else captioner_caption)",
                                                "captions": "the image's captions without the noun phrases of the "
                                                            "removed categories (§3.3)",
                                                "prompt_caption": "prompt template naming the categories left (§3.3)",
                                                "captioner_caption": "the captioning model's caption (Table 3)"}))
    if not out:
        raise input_error(d, None, "no inpainted images (<dataset>/images/<method>/<shard>/shard.parquet)",
                          "run the spurious_retrieval inpainting steps first")
    return out


def cvld_tables(d: Path) -> list[ExportTable]:
    """§3.3 / §5.1: the kept edits (top-k by similarity) with their original image and edit prompt."""
    out = []
    for requests in sorted(d.glob("*/edits/requests.parquet")):
        dataset = requests.parent.parent.name
        req = _read(requests, "edit requests").set_index("item_id")
        for method_dir in sorted(p for p in requests.parent.glob("*") if p.is_dir() and p.name != "inversions"):
            if not any(method_dir.glob("*/shard.parquet")):
                continue
            rows = _method_rows(method_dir, "path", kept_only=True)
            rows.insert(0, "edit_id", [f"{i}_{int(c)}" for i, c in zip(rows["item_id"], rows["candidate"])])
            extra = req.reindex(rows["item_id"])
            for col in ("image_id", "edit_prompt", "source_prompt", "target_prompt"):
                rows[col] = extra[col].astype(str).to_numpy()
            rows["original_image"] = extra["image_path"].to_numpy()   # relative paths: to the working directory
            out.append(ExportTable(f"{dataset}_{method_dir.name}", rows, ("image", "original_image"), "edit_id",
                                   description={"image": "edited image (kept: among the k most similar)",
                                                "original_image": "source image", "edit_prompt": "instruction"}))
    if not out:
        raise input_error(d, None, "no edits (<dataset>/edits/<method>/<shard>/shard.parquet)",
                          "run the CVLD editing steps first")
    return out


# ------------------------------------------------------------------------------------------------ verified variant
#: suffix of the config that holds a config's rows the VQA check kept
VERIFIED_SUFFIX = "_verified"


def _coco_verified(table: ExportTable, verified: pd.DataFrame, _dir: Path):
    return table.rows["id"].astype(str).isin(set(verified["id"].astype(str)) if len(verified) else set())


def _social_verified(table: ExportTable, verified: pd.DataFrame, _dir: Path):
    cols = ("set_id", "candidate_index", "member_index")
    keys = {(str(a), int(b), int(c)) for a, b, c in zip(*(verified[k] for k in cols))} if len(verified) else set()
    return [(str(a), int(b), int(c)) in keys for a, b, c in zip(*(table.rows[k] for k in cols))]


def _countercurate_verified(table: ExportTable, verified: pd.DataFrame, _dir: Path):
    if not len(verified):
        return [False] * len(table.rows)
    ids = set(verified.loc[verified["dataset"].astype(str) == table.config, "item_id"].astype(str))
    return table.rows["item_id"].astype(str).isin(ids)


def _image_file_verified(column: str):
    """By the made image's file: the verified rows' ``column`` (relative to the verify folder) names the dataset
    and the editing / inpainting method, so only that config's rows match."""
    def mask(table: ExportTable, verified: pd.DataFrame, folder: Path):
        files = {os.path.abspath(folder / str(p)) for p in verified[column]} if len(verified) else set()
        return [os.path.abspath(table.image_file(v)) in files if table.image_file(v) else False
                for v in table.rows["image"]]
    return mask


_cvld_verified = _image_file_verified("path")
_spurious_verified = _image_file_verified("image")


def verified_tables(study: str, tables: list[ExportTable], verified_path: str | Path) -> list[ExportTable]:
    """Beside each export config, ``<config>_verified``: its rows the VQA check kept (those in ``verify merge``'s
    verified variant, ``verified_path``; possibly none), in the same layout and with the same fields."""
    spec = study_export(study)
    if spec.verified is None:
        raise ConfigError(f"study {study!r} has no verified variant (no VQA adapter is wired for it). Fix: drop "
                          "--verified, or export one of " + ", ".join(s for s, v in STUDIES.items() if v.verified))
    path = Path(verified_path)
    frame = _read(path, "verified variant (verify/verified.parquet)")
    out = []
    for table in tables:
        mask = pd.Series(list(spec.verified(table, frame, path.parent)), index=table.rows.index, dtype=bool)
        out.append(replace(table, config=table.config + VERIFIED_SUFFIX, rows=table.rows[mask].reset_index(drop=True)))
    return out


# ------------------------------------------------------------------------------------------------ retrieval
# Each function turns one export table (a config, or its ``_verified`` variant) into CLIP_benchmark retrieval
# samples. No caption text occurs on two images of a set and no image occurs twice: either would be a tie that
# CLIP_benchmark's top-k breaks arbitrarily.
def coco_retrieval(table: ExportTable) -> list[RetrievalItem]:
    """COCO-CFs as the study's zero-shot retrieval evaluates it (§4.2.1, ``evaluation.cf_retrieval_set``): both
    images of every selected pair, each with its own caption (``<id>_0``: original, ``<id>_1``: counterfactual)."""
    rows = table.rows.sort_values("id", kind="stable")
    return items_from_pairs(
        (str(r.id), table.image_file(r.image_0), table.image_file(r.image_1), r.caption_0, r.caption_1)
        for r in rows.itertuples(index=False))


def social_retrieval(table: ExportTable) -> list[RetrievalItem]:
    """Every member image of a set with its own caption (§3: the members differ only in the attribute words), one
    generated candidate per set (the first kept): a set's other candidates repeat its captions word for word."""
    rows = table.rows.sort_values(["set_id", "candidate_index", "member_index"], kind="stable")
    first = rows.groupby("set_id", sort=False)["candidate_index"].transform("min")
    items, seen = [], set()
    for r in rows[rows["candidate_index"] == first].to_dict("records"):
        caption = str(r["caption"])
        if caption in seen:
            continue
        seen.add(caption)
        items.append(RetrievalItem(sample_key(r["item_id"]), table.image_file(r["image"]), (caption,),
                                   {"item_id": str(r["item_id"]), "set_id": str(r["set_id"]),
                                    "segment": str(r.get("segment", ""))}))
    return items


def countercurate_retrieval(table: ExportTable) -> list[RetrievalItem]:
    """Each source image once with the captions of every item made from it, and each negative image with its
    negative caption."""
    negative = "negative_caption" if "negative_caption" in table.rows.columns else "negative"
    sources: dict[Path, dict] = {}
    items = []
    for r in table.rows.to_dict("records"):
        src = table.image_file(r["image"])
        entry = sources.setdefault(src, {"captions": [], "ids": []})
        if str(r["caption"]) not in entry["captions"]:
            entry["captions"].append(str(r["caption"]))
        entry["ids"].append(str(r["item_id"]))
        neg = table.image_file(r.get("negative_image"))
        if neg is not None and r.get(negative) is not None:
            items.append(RetrievalItem(sample_key(r["item_id"], "negative"), neg, (str(r[negative]),),
                                       {"item_id": str(r["item_id"]), "image": "negative_image"}))
    for src, entry in sources.items():
        items.append(RetrievalItem(sample_key("source", src.parent.name, src.stem), src, tuple(entry["captions"]),
                                   {"item_ids": entry["ids"], "image": "image"}))
    return items


def spurious_retrieval(table: ExportTable) -> list[RetrievalItem]:
    """Each inpainted image with its noun-phrase-removed captions (§3.3; else its one ``caption``)."""
    items = []
    for r in table.rows.to_dict("records"):
        captions = [str(c) for c in (r.get("captions") if r.get("captions") is not None else [])] \
            or [str(r["caption"])]
        items.append(RetrievalItem(sample_key(r["item_id"]), table.image_file(r["image"]), tuple(captions),
                                   {"item_id": str(r["item_id"])}))
    return items


def cvld_retrieval(table: ExportTable) -> list[RetrievalItem]:
    """Each original image once with its caption (``source_prompt``) and, per item, its best kept edit (lowest
    ``rank``, then candidate) with the gender-swapped caption (``target_prompt``, §3.3): the k kept edits of one
    item share that caption."""
    rows = table.rows.sort_values([c for c in ("item_id", "rank", "candidate") if c in table.rows.columns],
                                  kind="stable")
    items, originals = [], {}
    for r in rows.drop_duplicates("item_id", keep="first").to_dict("records"):
        items.append(RetrievalItem(sample_key(r["edit_id"]), table.image_file(r["image"]), (str(r["target_prompt"]),),
                                   {"item_id": str(r["item_id"]), "edit_id": str(r["edit_id"]), "image": "image"}))
        original = table.image_file(r["original_image"])
        entry = originals.setdefault(original, {"captions": [], "ids": []})
        if str(r["source_prompt"]) not in entry["captions"]:
            entry["captions"].append(str(r["source_prompt"]))
        entry["ids"].append(str(r["item_id"]))
    for path, entry in originals.items():
        items.append(RetrievalItem(sample_key("original", path.parent.name, path.stem), path,
                                   tuple(entry["captions"]), {"item_ids": entry["ids"], "image": "original_image"}))
    return items


def retrieval_sets(study: str, study_dir: str | Path, verified: str | Path | None = None
                   ) -> dict[str, list[RetrievalItem]]:
    """config -> retrieval samples of each export table of the study (and, with ``verified``, of each
    ``<config>_verified`` table); a table without rows gives no config (CLIP_benchmark cannot read zero shards)."""
    spec = study_export(study)
    if spec.retrieval is None:
        raise ConfigError(f"study {study!r} declares no image-caption retrieval set. Fix: export one of "
                          f"{', '.join(retrieval_studies())}, or use `counterfactory export imagefolder`")
    tables = spec.tables(Path(study_dir))
    if verified is not None:
        tables += verified_tables(study, tables, verified)
    sets = {t.config: spec.retrieval(t) for t in tables if len(t.rows)}
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

STUDIES: dict[str, StudyExport] = {
    "coco_counterfactuals": StudyExport(
        "coco_counterfactuals", ("images/selected_pairs.parquet", "captions/coco_counterfactuals_captions.jsonl"),
        coco_tables, ("captions/summary/*.json", "images/summary.json"),
        ("mlm", "lm", "sentence", "sd", "vae", "clip_filter"), ("coco", "stable_diffusion"),
        "COCO-Counterfactuals (reproduction)",
        "Pairs of synthetic images and captions that differ in one noun (Le et al., 2023): MS-COCO captions "
        "edited by a masked language model, image pairs generated with Prompt-to-Prompt and filtered by CLIP.",
        retrieval=coco_retrieval, verified=_coco_verified),
    "social_counterfactuals": StudyExport(
        "social_counterfactuals", ("filter/kept.parquet",), social_tables,
        ("generation/summary.json", "filter/table11.csv"), ("sd", "clip_filter", "nsfw"), ("stable_diffusion",),
        "SocialCounterfactuals (reproduction)",
        "Sets of synthetic images of people that differ only in race, gender or physical characteristics "
        "(Howard et al., 2024), generated with Prompt-to-Prompt and filtered by CLIP similarity, NSFW and "
        "attribute detectability.", retrieval=social_retrieval, verified=_social_verified),
    "countercurate": StudyExport(
        "countercurate", ("datasets/positions.parquet", "datasets/counting.parquet", "datasets/attributes.parquet"),
        countercurate_tables, ("datasets/summary.csv", "generation/summary.json"),
        ("llm", "gligen", "gligen_inpaint", "t2i"), ("flickr30k", "stable_diffusion"),
        "CounterCurate (reproduction)",
        "Flickr30k-Positions, -Counting and -Attributes (Zhang et al., 2024): captions with hard negatives and "
        "negative images made by flipping, GLIGEN generation or inpainting.", retrieval=countercurate_retrieval,
        verified=_countercurate_verified),
    "spurious_retrieval": StudyExport(
        None, (), spurious_tables, ("*/selection/summary.csv", "*/manifests/summary.csv"),
        ("inpaint", "captioner"), ("coco", "flickr30k"),
        "Object-decorrelated retrieval data (reproduction)",
        "Images with object classes removed by inpainting and their noun-phrase-edited captions (Kim et al., "
        "2023), to decorrelate co-occurring objects in image-text retrieval.", retrieval=spurious_retrieval,
        verified=_spurious_verified),
    "cvld": StudyExport(
        None, (), cvld_tables, ("*/text/summary.csv",), ("llm", "editor", "sd", "image_encoder"),
        ("coco", "celeba", "stable_diffusion"), "CVLD counterfactual edits (reproduction)",
        "Gender-counterfactual captions and images edited with InstructPix2Pix / null-text inversion, the k "
        "edits most similar to the original kept (CVLD).", retrieval=cvld_retrieval, verified=_cvld_verified),
}


def study_export(study: str) -> StudyExport:
    if study not in STUDIES:
        raise ConfigError(f"no export is declared for study {study!r}. Fix: use one of {', '.join(STUDIES)}")
    return STUDIES[study]


def retrieval_studies() -> list[str]:
    """The studies with a CLIP_benchmark retrieval export."""
    return [s for s, spec in STUDIES.items() if spec.retrieval is not None]


def release_inputs(study: str, study_dir: str | Path) -> list[str]:
    return [str(Path(study_dir) / p) for p in study_export(study).release_inputs]


def write_release(study: str, study_dir: str | Path, out_dir: str | Path,
                  manifest_path: str | Path | None = None) -> dict:
    """Write ``study``'s results (``study_dir``) in the layout of its published release (``StudyExport.release``)
    to ``out_dir``; returns the manifest. A study without a published format is a ConfigError naming the generic
    layouts' export."""
    spec = study_export(study)
    d = Path(study_dir)
    if spec.release is None:
        raise ConfigError(f"study {study!r} has no published release format. Fix: export it with "
                          "`counterfactory export imagefolder`")
    if spec.release == "coco_counterfactuals":
        return write_coco_counterfactuals(d / spec.release_inputs[0], d / spec.release_inputs[1], out_dir,
                                          manifest_path=manifest_path)
    if spec.release == "countercurate":
        return write_countercurate(d / "datasets", out_dir, manifest_path=manifest_path)
    return write_social_counterfactuals(d / spec.release_inputs[0], out_dir, manifest_path=manifest_path)


def funnel_files(study: str, study_dir: str | Path) -> list[Path]:
    d = Path(study_dir)
    return [f for pattern in study_export(study).funnel for f in sorted(d.glob(pattern))]


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
