"""Check a user-provided MS-COCO root before anything reads it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import input_error

HOW_TO_GET = (
    "download MS-COCO 2017 from the COCO website's download page (annotations_trainval2017.zip and "
    "{split}.zip) and unzip both into {root} so that {root}/annotations/captions_{split}.json and "
    "{root}/{split}/ exist; or set data.coco_root in your config"
)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_coco_root(root: str | Path, split: str = "val2017", expect_images: bool = True,
                    checksums: dict | None = None) -> dict:
    """Verify annotation files, the image folder and optional sha256 checksums; return a report."""
    root = Path(root)
    fix = HOW_TO_GET.format(root=root, split=split)
    files = {kind: root / "annotations" / f"{kind}_{split}.json" for kind in ("captions", "instances")}
    for kind, path in files.items():
        if not path.exists():
            raise input_error(path, None, f"COCO {kind} file missing", fix)
    for name, expected in (checksums or {}).items():
        path = root / "annotations" / name
        if not path.exists():
            raise input_error(path, None, "file listed in data.checksums is missing", fix)
        got = sha256(path)
        if got != expected:
            raise input_error(path, None, f"sha256 {got} does not match the expected {expected}",
                              "re-download the file (it is corrupt or a different version)")
    from .coco import load_coco_captions

    captions = load_coco_captions(files["captions"])
    report = {"root": str(root), "split": split, "captions": int(len(captions)),
              "images": int(captions["image_id"].nunique()), "checksums_verified": sorted(checksums or {})}
    if expect_images:
        folder = root / split
        if not folder.is_dir():
            raise input_error(folder, None, "image folder missing", fix)
        present = {p.name for p in folder.iterdir()}
        missing = sorted(set(captions["file_name"]) - present)
        if missing:
            raise input_error(folder, None, f"{len(missing)} referenced images missing (first: {', '.join(missing[:3])})", fix)
        report["image_files"] = int(len(set(captions["file_name"])))
    return report


def count_captions(captions_json: str | Path) -> int:
    """Number of captions in a ``captions_*.json`` (fast: parses the JSON once, no tables)."""
    path = Path(captions_json)
    with open(path, "rb") as fh:
        try:
            doc = json.load(fh)
        except json.JSONDecodeError as exc:
            raise input_error(path, f"line {exc.lineno} column {exc.colno}", "invalid or truncated JSON",
                              "re-download the file") from exc
    return len(doc.get("annotations", []))
