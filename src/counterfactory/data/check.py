"""Check a user-provided MS-COCO root before anything reads it.

Expected layout (what unzipping the official archives into ``root`` gives)::

    root/annotations/captions_<split>.json     from annotations_trainval2017.zip
    root/annotations/instances_<split>.json    from annotations_trainval2017.zip
    root/<split>/000000000139.jpg ...          from <split>.zip

Every failure raises :class:`InputError` naming the file and explaining how to get COCO.

With images checked, every referenced image must also be readable: a zero-byte file, one PIL cannot
open or ``verify()``, and a JPEG without its end-of-image marker that fails to decode (an interrupted
download or unzip) are reported together, each with its file name and the problem. The width and height that
the annotation files declare for an image are compared with the file's own (read from the header PIL opens anyway):
boxes and masks are in the declared pixels, so a resized copy of the images would put every mask in the wrong place.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from pathlib import Path

from ..errors import describe_path, input_error
from ..io import file_digest, file_sha256
from .paths import join_under

HOW_TO_GET = (
    "download MS-COCO 2017 from the COCO website's download page (https://cocodataset.org/#download): "
    "annotations_trainval2017.zip and {split}.zip, and unzip both into {root} so that "
    "{root}/annotations/captions_{split}.json and {root}/{split}/ exist; or set data.coco_root in your config"
)
ALGORITHMS = {32: "md5", 40: "sha1", 64: "sha256", 128: "sha512"}


def sha256(path: str | Path) -> str:
    return file_sha256(path)


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


def read_checksums(path: str | Path) -> dict:
    """A checksums file: a JSON object, annotation file name -> digest (:func:`parse_checksum`); anything else is an
    :class:`InputError` naming the file and the form expected."""
    from .coco import read_json

    checksums = read_json(path, "checksums file")
    if not isinstance(checksums, dict):
        raise input_error(path, None, "is not a JSON object", 'write {"captions_val2017.json": "<sha256 hex>", ...}')
    return checksums


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
        raise input_error(describe_path(root), None, "COCO root folder does not exist", fix)
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
    instances, boxes, categories = load_coco_instances(files["instances"])
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
        unreadable, sizes = scan_images(folder, sorted(referenced))
        if unreadable:
            listed = "; ".join(f"{name} ({why})" for name, why in unreadable[:10])
            more = f"; and {len(unreadable) - 10} more" if len(unreadable) > 10 else ""
            raise input_error(folder, None, f"{len(unreadable)} unreadable images (of {len(referenced)}): {listed}{more}",
                              f"delete those files and re-extract them from {split}.zip (re-download it if "
                              f"unzip reports errors); " + fix)
        _check_declared_sizes(files["instances"], instances, sizes, folder)
        _check_declared_sizes(files["captions"], captions, sizes, folder)
        report["image_folder"] = str(folder)
        report["image_files"] = int(len(referenced))
    return report


def image_problem(path: str | Path) -> str | None:
    """Why an image file cannot be used (None if it is fine): empty, not an image, corrupt or truncated.

    Cheap for intact files: PIL's ``verify()`` plus, for JPEGs, a look for the end-of-image marker in
    the last bytes; only a JPEG without it is decoded in full (trailing padding is legal)."""
    return inspect_image(path)[0]


def inspect_image(path: str | Path) -> tuple[str | None, tuple[int, int] | None]:
    """``(problem, (width, height))``: :func:`image_problem`'s answer and the size in the file's header (None
    when the file cannot be opened), from one opening of the file."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}", None
    if size == 0:
        return "empty file (0 bytes)", None
    dims = None
    try:
        with Image.open(path) as im:
            fmt = im.format
            dims = (int(im.size[0]), int(im.size[1]))
            im.verify()
        if fmt == "JPEG":
            with open(path, "rb") as fh:
                fh.seek(max(0, size - 4096))
                tail = fh.read()
            if b"\xff\xd9" not in tail:
                with Image.open(path) as im:
                    im.load()
    except UnidentifiedImageError:
        return "not an image PIL can read", None
    except Image.DecompressionBombError as exc:   # a header claiming a huge size: refused, not decoded
        return (f"too large to decode safely ({exc}; PIL's limit is {Image.MAX_IMAGE_PIXELS:,} pixels): resize it or "
                "remove it", dims)
    except (OSError, SyntaxError, ValueError) as exc:
        return f"corrupt or truncated ({exc})", dims
    return None, dims


def unreadable_images(folder: str | Path, names) -> list[tuple[str, str]]:
    """``[(file name, problem)]`` for the images in ``folder`` that :func:`image_problem` rejects."""
    return scan_images(folder, names)[0]


def scan_images(folder: str | Path, names) -> tuple[list[tuple[str, str]], dict[str, tuple[int, int]]]:
    """``(unreadable, sizes)``: :func:`unreadable_images` and ``{file name: (width, height)}`` of the readable
    ones, opening each file once."""
    folder = Path(folder)
    out, sizes = [], {}
    for name in names:
        problem, dims = inspect_image(join_under(folder, name, source=folder, record=f"image {name!r}",
                                                 key="the image folder"))
        if problem:
            out.append((name, problem))
        elif dims is not None:
            sizes[name] = dims
    return out, sizes


def size_mismatch_error(source, record, image_id, declared: tuple[int, int], image: str | Path,
                        actual: tuple[int, int], more: int = 0):
    """The :class:`InputError` for an image whose declared size is not the file's (every checker words it alike)."""
    return input_error(
        source, record,
        f"image {image_id} is declared {declared[0]}x{declared[1]} (width x height) but the file {image} is "
        f"{actual[0]}x{actual[1]}" + (f" ({more} more images like this)" if more else ""),
        "use the images the annotation file was made for (a resized copy puts every box and mask in the wrong "
        "place), or correct width / height in the file and scale its boxes and segmentations to match")


def _check_declared_sizes(path: Path, frame, sizes: dict[str, tuple[int, int]], folder: Path) -> None:
    """Compare ``frame``'s declared ``width``/``height`` per ``file_name`` (one row per image, or per caption) with
    the sizes read from the files; the first mismatch names ``path``, the image and both sizes."""
    first = frame.drop_duplicates("file_name") if "id" not in frame.columns else frame
    bad = []
    for pos, (name, w, h) in enumerate(zip(first["file_name"], first["width"], first["height"])):
        got = sizes.get(name)
        if got is not None and (int(w), int(h)) != got:
            bad.append((pos, name, (int(w), int(h)), got))
    if bad:
        pos, name, declared, got = bad[0]
        if "id" in first.columns:       # an images table in file order: name the record as load_images does
            image_id = int(first["id"].iat[pos])
            record = f"images[{pos}] (id {image_id})"
        else:
            image_id = int(first["image_id"].iat[pos])
            record = f"image id {image_id}"
        raise size_mismatch_error(path, record, image_id, declared, folder / name, got, len(bad) - 1)


def check_image_sizes(images, image_paths) -> None:
    """Compare the declared ``width`` / ``height`` of ``images`` (a frame with ``image_id, width, height, source,
    record``, as the box readers of the region selection give) with the headers of the image files
    ``image_paths`` ({image_id: path}; only those images are opened, header only). The first mismatch is an
    :class:`InputError` naming the annotation file and record; a missing or unreadable file is left to the step
    that reads the pixels."""
    from PIL import Image

    paths = dict(image_paths)
    rows = images[images["image_id"].isin(list(paths))]
    bad = []
    for image_id, w, h, source, record in rows[["image_id", "width", "height", "source", "record"]].itertuples(
            index=False):
        path = paths[image_id]
        try:
            with Image.open(path) as im:
                got = (int(im.size[0]), int(im.size[1]))
        except (OSError, ValueError):
            continue
        if got != (int(w), int(h)):
            bad.append((source, record, image_id, (int(w), int(h)), path, got))
    if bad:
        raise size_mismatch_error(*bad[0], more=len(bad) - 1)


def count_captions(captions_json: str | Path, limit_images: int | None = None) -> int:
    """Number of captions in a ``captions_*.json`` (fast: one JSON parse, no tables). With
    ``limit_images``, the captions of the first N image ids in sorted order — the same rows as
    ``counterfactory data captions --limit-images N`` keeps."""
    from .coco import read_json

    path = Path(captions_json)
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("annotations"), list):
        raise input_error(path, None, "missing top-level list 'annotations'",
                          "use the official captions_<split>.json file (see docs/studies/coco_counterfactuals.md)")
    anns = doc["annotations"]
    if not limit_images:
        return len(anns)
    try:
        per_image = Counter(a["image_id"] for a in anns)
    except (KeyError, TypeError) as exc:
        raise input_error(path, "annotations", "a record has no 'image_id'",
                          "run `counterfactory data captions` on it for the exact record") from exc
    return int(sum(per_image[i] for i in sorted(per_image)[:limit_images]))
