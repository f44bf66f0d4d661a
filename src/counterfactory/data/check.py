"""Check a user-provided MS-COCO root before anything reads it.

Expected layout (what unzipping the official archives into ``root`` gives)::

    root/annotations/captions_<split>.json     from annotations_trainval2017.zip
    root/annotations/instances_<split>.json    from annotations_trainval2017.zip
    root/<split>/000000000139.jpg ...          from <split>.zip

Every failure raises :class:`InputError` naming the file and explaining how to get COCO.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from pathlib import Path

from ..errors import input_error

HOW_TO_GET = (
    "download MS-COCO 2017 from the COCO website's download page (https://cocodataset.org/#download): "
    "annotations_trainval2017.zip and {split}.zip, and unzip both into {root} so that "
    "{root}/annotations/captions_{split}.json and {root}/{split}/ exist; or set data.coco_root in your config"
)
ALGORITHMS = {32: "md5", 40: "sha1", 64: "sha256", 128: "sha512"}


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256(path: str | Path) -> str:
    return file_digest(path, "sha256")


def parse_checksum(name: str, spec: str) -> tuple[str, str]:
    """``(algorithm, hex)`` from ``"<hex>"`` (md5 / sha1 / sha256 / sha512 by length) or ``"<algo>:<hex>"``."""
    text = str(spec).strip().lower()
    algo, _, digest = text.rpartition(":")
    if not re.fullmatch(r"[0-9a-f]+", digest or "-"):
        raise input_error("checksums", name, f"checksum {spec!r} is not a hex digest",
                          "give the hex digest, optionally prefixed with md5: / sha1: / sha256:")
    algo = algo or ALGORITHMS.get(len(digest), "")
    if algo not in hashlib.algorithms_available or len(hashlib.new(algo).hexdigest()) != len(digest):
        raise input_error("checksums", name,
                          f"cannot tell the algorithm of checksum {spec!r} ({len(digest)} hex digits)",
                          "use a 32-digit md5, 40-digit sha1 or 64-digit sha256, or prefix it like sha256:<hex>")
    return algo, digest


def _checksum_target(root: Path, name: str) -> Path:
    """Checksum keys are file names under ``annotations/`` or paths relative to the root."""
    rel = Path(name)
    if rel.is_absolute():
        return rel
    return root / rel if len(rel.parts) > 1 else root / "annotations" / rel


def check_coco_root(root: str | Path, split: str = "val2017", expect_images: bool = True,
                    checksums: dict | None = None) -> dict:
    """Verify the annotation files (present, parseable, optional md5/sha checksums), and, when
    ``expect_images``, that ``root/<split>/`` holds every ``file_name`` the captions reference.

    Returns a report: ``root``, ``split``, ``captions`` (count), ``images`` (images with captions),
    ``instance_annotations``, ``categories``, ``checksums`` ({name: {algorithm, expected, actual}}),
    ``checksums_verified`` (names), and with images checked ``image_folder`` and ``image_files``."""
    root = Path(root)
    fix = HOW_TO_GET.format(root=root, split=split)
    if not root.is_dir():
        raise input_error(root, None, "COCO root folder does not exist", fix)
    files = {kind: root / "annotations" / f"{kind}_{split}.json" for kind in ("captions", "instances")}
    for kind, path in files.items():
        if not path.is_file():
            raise input_error(path, None, f"COCO {kind} file missing", fix)
    verified = {}
    for name, expected in (checksums or {}).items():
        algo, digest = parse_checksum(name, expected)
        path = _checksum_target(root, name)
        if not path.is_file():
            raise input_error(path, None, "file listed in data.checksums is missing", fix)
        got = file_digest(path, algo)
        if got != digest:
            raise input_error(path, None, f"{algo} {got} does not match the expected {digest}",
                              "re-download the file (it is corrupt, truncated or a different version); " + fix)
        verified[name] = {"algorithm": algo, "expected": digest, "actual": got}
    from .coco import load_coco_captions, load_coco_instances

    captions = load_coco_captions(files["captions"])
    _, boxes, categories = load_coco_instances(files["instances"])
    report = {"root": str(root), "split": split, "captions": int(len(captions)),
              "images": int(captions["image_id"].nunique()), "instance_annotations": int(len(boxes)),
              "categories": int(len(categories)), "checksums": verified, "checksums_verified": sorted(verified)}
    if expect_images:
        folder = root / split
        if not folder.is_dir():
            raise input_error(folder, None, f"image folder missing (expected {split}/ next to annotations/)", fix)
        referenced = set(captions["file_name"])
        with os.scandir(folder) as entries:
            present = {entry.name for entry in entries}
        missing = sorted(referenced - present)
        if missing:
            raise input_error(folder, None, f"{len(missing)} referenced images missing (of {len(referenced)}; "
                              f"first: {', '.join(missing[:5])})", fix)
        report["image_folder"] = str(folder)
        report["image_files"] = int(len(referenced))
    return report


def count_captions(captions_json: str | Path, limit_images: int | None = None) -> int:
    """Number of captions in a ``captions_*.json`` (fast: one JSON parse, no tables). With
    ``limit_images``, the captions of the first N image ids in sorted order — the same rows as
    ``counterfactory data captions --limit-images N`` keeps."""
    from .coco import read_json

    path = Path(captions_json)
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("annotations"), list):
        raise input_error(path, None, "missing top-level list 'annotations'",
                          "use the official captions_<split>.json file (see README, 'Getting MS-COCO')")
    anns = doc["annotations"]
    if not limit_images:
        return len(anns)
    try:
        per_image = Counter(a["image_id"] for a in anns)
    except (KeyError, TypeError) as exc:
        raise input_error(path, "annotations", "a record has no 'image_id'",
                          "run `counterfactory data captions` on it for the exact record") from exc
    return int(sum(per_image[i] for i in sorted(per_image)[:limit_images]))
