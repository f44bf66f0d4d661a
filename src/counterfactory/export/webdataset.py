"""CLIP_benchmark's webdataset layout for zero-shot image-text retrieval (``clip_benchmark eval --dataset wds/<name>
--dataset_root <dir> --task zeroshot_retrieval``), written for any study that declares retrieval items
(:attr:`counterfactory.export.studies.StudyExport.retrieval`).

The layout is the one ``clip_benchmark.datasets.builder.build_wds_dataset`` reads (CLIP_benchmark 1.6)::

    <out_dir>/<config>/dataset_type.txt        "retrieval"
    <out_dir>/<config>/test/nshards.txt         N
    <out_dir>/<config>/test/0.tar ... N-1.tar   per sample: <key>.<png|jpg|webp> + <key>.txt (+ <key>.json)

One sample per distinct image; its ``.txt`` holds every caption of that image, one per line (CLIP_benchmark splits
it with ``str.splitlines``, so a line break inside a caption becomes a space). The retrieval space CLIP_benchmark
scores is every image of the split against every caption of the split. ``<key>.json`` (ignored by CLIP_benchmark)
maps the sample back to the study's item ids. Keys are file-name-safe without dots (webdataset splits a member name
at its first dot) and unique; samples are written in key order, each tar member with mtime 0, uid/gid 0 and no
owner names, so the same items give byte-identical shards. Images keep their bytes (PNG, JPEG, WebP); any other
format is re-encoded as PNG. Shards hold at most ``max_shard_bytes`` of image bytes (a larger image gets a shard of
its own), named ``0.tar`` ... as CLIP_benchmark's brace pattern ``{0..N-1}.tar`` expects.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..errors import input_error
from ..io import atomic_dir, write_json
from .formats import MANIFEST, MAX_SHARD_BYTES, safe_name, shard_bounds

SPLIT = "test"
DATASET_TYPE = "retrieval"
#: image extensions CLIP_benchmark's decoder reads (``wds.autodecode.ImageHandler(..., extensions=...)``)
KEPT_EXTENSIONS = {".png": "png", ".jpg": "jpg", ".jpeg": "jpg", ".webp": "webp"}
_DOTS = re.compile(r"[.]+")


@dataclass(frozen=True)
class RetrievalItem:
    """One image of a retrieval set with its captions; ``meta`` (JSON-ready) says which study items it comes from."""

    key: str
    image: Path
    captions: tuple[str, ...]
    meta: Mapping = field(default_factory=dict)


def sample_key(*parts: object) -> str:
    """A webdataset key from id parts: file-name-safe, no dots (webdataset cuts a member name at its first dot)."""
    return "_".join(_DOTS.sub("_", safe_name(str(p))) for p in parts)


def one_line(caption: object) -> str:
    """The caption as one line of a ``.txt`` member (line breaks of any kind become spaces)."""
    return " ".join(part.strip() for part in str(caption).splitlines() if part.strip())


def _image_member(path: Path) -> tuple[str, bytes]:
    ext = KEPT_EXTENSIONS.get(path.suffix.lower())
    if ext is not None:
        return ext, path.read_bytes()
    from PIL import Image

    with Image.open(path) as im:
        buf = io.BytesIO()
        im.save(buf, format="PNG")
    return "png", buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def check_items(config: str, items: Sequence[RetrievalItem], where: str | Path) -> list[RetrievalItem]:
    """``items`` in key order with one-line captions; refuses duplicate or unsafe keys, missing images and images
    without a caption (CLIP_benchmark would count such an image as a miss it cannot score)."""
    seen: set[str] = set()
    out = []
    for item in sorted(items, key=lambda it: it.key):
        if item.key in seen:
            raise input_error(where, f"config {config!r}", f"sample key {item.key!r} occurs twice",
                              "give every exported image a unique id")
        if item.key != sample_key(item.key):
            raise input_error(where, f"config {config!r}", f"sample key {item.key!r} is not file-name-safe or "
                              "has a dot", "make keys with counterfactory.export.webdataset.sample_key")
        seen.add(item.key)
        if not Path(item.image).is_file():
            raise input_error(where, f"key {item.key!r}", f"image {item.image} not found",
                              "rerun the step that writes the images")
        captions = tuple(c for c in (one_line(c) for c in item.captions) if c)
        if not captions:
            raise input_error(where, f"key {item.key!r}", "the image has no caption",
                              "drop images without captions before exporting")
        out.append(RetrievalItem(item.key, Path(item.image), captions, dict(item.meta)))
    return out


def write_clip_benchmark(configs: Mapping[str, Sequence[RetrievalItem]], out_dir: str | Path, *, source: str = "",
                         manifest_path: str | Path | None = None, max_shard_bytes: int = MAX_SHARD_BYTES) -> dict:
    """``<out_dir>/<config>/{dataset_type.txt, test/nshards.txt, test/<k>.tar}`` for every config; returns the
    manifest (images and captions per config, the shard files, the CLIP_benchmark command that reads it)."""
    where = source or out_dir
    manifest = {"format": "clip_benchmark", "source": source, "configs": {}}
    with atomic_dir(out_dir) as tmp:
        for config, raw in configs.items():
            items = check_items(config, raw, where)
            folder = tmp / config / SPLIT
            folder.mkdir(parents=True)
            (tmp / config / "dataset_type.txt").write_text(DATASET_TYPE + "\n", encoding="utf-8")
            bounds = shard_bounds([it.image.stat().st_size for it in items], max_shard_bytes)
            files = []
            for k, (start, stop) in enumerate(bounds):
                with tarfile.open(folder / f"{k}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
                    for it in items[start:stop]:
                        ext, data = _image_member(it.image)
                        _add(tar, f"{it.key}.{ext}", data)
                        _add(tar, f"{it.key}.txt", "\n".join(it.captions).encode("utf-8"))
                        _add(tar, f"{it.key}.json", json.dumps(dict(it.meta), sort_keys=True,
                                                               ensure_ascii=False).encode("utf-8"))
                files.append(f"{config}/{SPLIT}/{k}.tar")
            (folder / "nshards.txt").write_text(f"{len(bounds)}\n", encoding="utf-8")
            manifest["configs"][config] = {
                "splits": {SPLIT: {"rows": len(items), "captions": sum(len(it.captions) for it in items),
                                   "path": f"{config}/{SPLIT}/{{0..{len(bounds) - 1}}}.tar", "files": files}},
                "images": ["image"], "fields": ["txt", "json"], "dataset_type": DATASET_TYPE,
                "load": f"clip_benchmark eval --dataset wds/{config} --dataset_root <dir>/{config} "
                        "--task zeroshot_retrieval"}
        write_json(Path(manifest_path) if manifest_path is not None else tmp / MANIFEST, manifest)
    return manifest


def read_clip_benchmark(folder: str | Path, config: str) -> list[tuple[str, str, list[str]]]:
    """``(key, image extension, captions)`` per sample of ``<folder>/<config>/test/*.tar``, in shard order (checks)."""
    base = Path(folder) / config / SPLIT
    n = int((base / "nshards.txt").read_text(encoding="utf-8"))
    out: list[tuple[str, str, list[str]]] = []
    for k in range(n):
        with tarfile.open(base / f"{k}.tar") as tar:
            samples: dict[str, dict] = {}
            for m in tar.getmembers():
                key, _, ext = m.name.partition(".")
                samples.setdefault(key, {})[ext] = tar.extractfile(m).read()
        for key, parts in samples.items():
            ext = next(e for e in parts if e in KEPT_EXTENSIONS.values())
            out.append((key, ext, parts["txt"].decode("utf-8").splitlines()))
    return out


def items_from_pairs(rows: Iterable[tuple[str, Path, Path, str, str]]) -> list[RetrievalItem]:
    """Two samples per counterfactual pair ``(id, image_0, image_1, caption_0, caption_1)``: ``<id>_0`` (image 0
    with caption 0) and ``<id>_1`` (image 1 with caption 1) -- COCO-Counterfactuals' retrieval set (2N images, each
    with its own caption)."""
    out = []
    for pair_id, im0, im1, c0, c1 in rows:
        for side, (image, caption) in enumerate(((im0, c0), (im1, c1))):
            out.append(RetrievalItem(sample_key(pair_id, side), Path(image), (str(caption),),
                                     {"id": str(pair_id), "image": f"image_{side}"}))
    return out


__all__ = ["DATASET_TYPE", "KEPT_EXTENSIONS", "RetrievalItem", "SPLIT", "check_items", "items_from_pairs",
           "one_line", "read_clip_benchmark", "sample_key", "write_clip_benchmark"]
