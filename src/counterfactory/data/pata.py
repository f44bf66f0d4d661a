"""Reader for PATA, the Protected-Attribute Tag Association dataset (Seth et al., CVPR 2023; repository
``pata-fairness/pata_dataset``), used by SocialCounterfactuals §5.3 (Table 3).

Files (reference notes B10)
---------------------------
* ``pata_fairness.files.lst``: one image per line, ``<scene>_<race>_<gender>_<age>|<url>``, e.g.
  ``forest_indian_male_young|https://...``. A scene name may itself contain ``_`` (``fashion_show``), so the label
  is split with ``rsplit("_", 3)``. race ∈ {black, caucasian, eastasian, hispanic, indian}, gender ∈ {male, female},
  age ∈ {young, old}; 24 scenes, 4,934 lines. Blank lines are skipped.
* ``pata_fairness.captions.json``: a list of 24 scenes ``{long, short, pos: {races, gender, age}, neg: {races,
  gender, age}}``; ``short`` is the scene name used in the file list, the lists hold caption strings (possibly
  empty).

Images
------
The repository holds URLs only; the user downloads the images into one folder. How a line maps to its file is set
by ``image_name``, a :meth:`str.format` pattern relative to that folder with the fields

* ``{index}`` — the 0-based position of the record among the non-blank lines (default ``"{index}.*"``: the file
  ``17.jpg`` / ``17.png`` ... is record 17, the usual output of a downloader enumerating the list),
* ``{line}`` — the 1-based line number in the file,
* ``{scene}``, ``{race}``, ``{gender}``, ``{age}``, ``{label}`` (``<scene>_<race>_<gender>_<age>``),
* ``{basename}`` / ``{stem}`` — the URL's last path component without query string, and that without extension
  (URL basenames are **not unique** in PATA, e.g. ``photo.jpg``; prefer ``index``).

A pattern containing ``*``, ``?`` or ``[`` is a glob that must match exactly one file. Records whose file does not
exist get ``image_path`` = None (many URLs are dead); evaluations use the records with an image.
"""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import pandas as pd

from ..errors import input_error
from ..settings import schema_default
from .paths import join_under
from .coco import read_json

log = logging.getLogger(__name__)

RACES = ("black", "caucasian", "eastasian", "hispanic", "indian")
GENDERS = ("male", "female")
AGES = ("young", "old")
#: PATA's attribute keys in the captions file -> the attribute names used in results
ATTRIBUTES = {"races": "race", "gender": "gender", "age": "age"}
POLARITIES = ("pos", "neg")
FILE_COLUMNS = ["index", "line", "scene", "race", "gender", "age", "url", "image_path"]
CAPTION_COLUMNS = ["scene", "long", "polarity", "attribute", "caption_index", "caption"]
FIX_LIST = "each line must read <scene>_<race>_<gender>_<age>|<url>, as in the official pata_fairness.files.lst"
FIX_JSON = "use the official pata_fairness.captions.json (a list of {long, short, pos, neg} objects)"
DEFAULT_IMAGE_NAME = schema_default("social_counterfactuals.probing.pata.image_name")


def _url_basename(url: str) -> str:
    return unquote(os.path.basename(urlparse(url).path))


def resolve_image(image_dir: str | Path | None, pattern: str, fields: dict) -> str | None:
    """The file for one record: ``pattern`` formatted with ``fields`` under ``image_dir``; a glob must match one
    file (several matches are an error naming them); None when nothing exists or there is no folder."""
    if image_dir is None:
        return None
    try:
        name = pattern.format(**fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise input_error(pattern, None, f"image name pattern cannot be formatted ({exc!r})",
                          f"use only the fields {', '.join(sorted(fields))}") from exc
    path = join_under(image_dir, name, source=pattern, record=f"fields {fields}", key="the PATA image folder")
    if any(c in name for c in "*?["):
        hits = sorted(glob.glob(glob.escape(str(Path(image_dir))) + os.sep + name))
        hits = [h for h in hits if os.path.isfile(h)]
        if len(hits) > 1:
            raise input_error(image_dir, name, f"the image pattern matches {len(hits)} files ({', '.join(hits[:3])})",
                              "keep one file per record or use a more specific image_name pattern")
        return str(Path(hits[0]).resolve()) if hits else None
    return str(path.resolve()) if path.is_file() else None


def read_pata_files(path: str | Path, image_dir: str | Path | None = None,
                    image_name: str = DEFAULT_IMAGE_NAME) -> pd.DataFrame:
    """One row per record of ``pata_fairness.files.lst`` with columns :data:`FILE_COLUMNS` (``image_path`` is None
    when the image is missing or ``image_dir`` is None). A malformed line is an :class:`InputError` naming the file,
    the line and the fix."""
    path = Path(path)
    if not path.is_file():
        raise input_error(path, None, "PATA file list not found",
                          "download pata_fairness.files.lst from github.com/pata-fairness/pata_dataset")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise input_error(path, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})", FIX_LIST) from exc
    rows = []
    index = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        where = f"line {lineno}"
        label, sep, url = line.partition("|")
        if not sep:
            raise input_error(path, where, f"no '|' between label and URL in {line[:80]!r}", FIX_LIST)
        url = url.strip()
        if not url:
            raise input_error(path, where, f"empty URL after '|' in {line[:80]!r}", FIX_LIST)
        parts = label.strip().rsplit("_", 3)
        if len(parts) != 4 or not all(parts):
            raise input_error(path, where, f"label {label!r} is not <scene>_<race>_<gender>_<age>", FIX_LIST)
        scene, race, gender, age = parts
        race, gender, age = race.lower(), gender.lower(), age.lower()
        for name, value, allowed in (("race", race, RACES), ("gender", gender, GENDERS), ("age", age, AGES)):
            if value not in allowed:
                raise input_error(path, where,
                                  f"{name} {value!r} in label {label!r} is not one of {', '.join(allowed)}", FIX_LIST)
        base = _url_basename(url)
        fields = {"index": index, "line": lineno, "scene": scene, "race": race, "gender": gender, "age": age,
                  "label": label.strip(), "basename": base, "stem": os.path.splitext(base)[0]}
        rows.append({"index": index, "line": lineno, "scene": scene, "race": race, "gender": gender, "age": age,
                     "url": url, "image_path": resolve_image(image_dir, image_name, fields)})
        index += 1
    if not rows:
        raise input_error(path, None, "has no records", FIX_LIST)
    frame = pd.DataFrame(rows, columns=FILE_COLUMNS)
    if image_dir is not None:
        found = int(frame["image_path"].notna().sum())
        log.info("PATA: %d of %d images found in %s (pattern %r)", found, len(frame), image_dir, image_name)
    return frame


def read_pata_captions(path: str | Path) -> pd.DataFrame:
    """One row per caption of ``pata_fairness.captions.json``: columns :data:`CAPTION_COLUMNS` (``attribute`` is
    race / gender / age, ``polarity`` pos / neg, ``long`` the scene's attribute template)."""
    path = Path(path)
    doc = read_json(path, "PATA captions file")
    if not isinstance(doc, list):
        raise input_error(path, None, f"top level is a JSON {type(doc).__name__}, not a list", FIX_JSON)
    rows = []
    seen = set()
    for i, entry in enumerate(doc):
        where = f"entry [{i}]"
        if not isinstance(entry, dict):
            raise input_error(path, where, f"is a JSON {type(entry).__name__}, not an object", FIX_JSON)
        for key in ("short", "pos", "neg"):
            if key not in entry:
                raise input_error(path, where, f"missing key {key!r}", FIX_JSON)
        scene = entry["short"]
        if not isinstance(scene, str) or not scene.strip():
            raise input_error(path, where, f"'short' (the scene name) must be a non-empty string, got {scene!r}",
                              FIX_JSON)
        where = f"entry [{i}] ({scene})"
        if scene in seen:
            raise input_error(path, where, "scene listed twice", FIX_JSON)
        seen.add(scene)
        for pol in POLARITIES:
            block = entry[pol]
            if not isinstance(block, dict):
                raise input_error(path, f"{where}.{pol}", "is not an object", FIX_JSON)
            unknown = sorted(set(block) - set(ATTRIBUTES))
            if unknown:
                raise input_error(path, f"{where}.{pol}", f"unknown attribute key(s) {unknown}",
                                  f"use {', '.join(ATTRIBUTES)}")
            for key, attribute in ATTRIBUTES.items():
                captions = block.get(key, [])
                if not isinstance(captions, list):
                    raise input_error(path, f"{where}.{pol}.{key}", "is not a list of captions", FIX_JSON)
                for j, cap in enumerate(captions):
                    if not isinstance(cap, str) or not cap.strip():
                        raise input_error(path, f"{where}.{pol}.{key}[{j}]", f"is not a non-empty string: {cap!r}",
                                          FIX_JSON)
                    rows.append({"scene": scene.strip(), "long": str(entry.get("long", "")), "polarity": pol,
                                 "attribute": attribute, "caption_index": j, "caption": " ".join(cap.split())})
    return pd.DataFrame(rows, columns=CAPTION_COLUMNS)


def load_pata(files_list: str | Path, captions_json: str | Path, image_dir: str | Path | None = None,
              image_name: str = DEFAULT_IMAGE_NAME) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(images, captions)`` of :func:`read_pata_files` and :func:`read_pata_captions`; scenes of the file list
    without captions are logged (they cannot be queried)."""
    images = read_pata_files(files_list, image_dir, image_name)
    captions = read_pata_captions(captions_json)
    orphan = sorted(set(images["scene"]) - set(captions["scene"]))
    if orphan:
        log.warning("PATA: scene(s) %s of %s have no captions in %s and are not evaluated", orphan, files_list,
                    captions_json)
    return images, captions
