"""Reader for Flickr30k Entities (Plummer et al., 2015/2017; repository ``BryanPlummer/flickr30k_entities``), the
grounded captions CounterCurate builds Flickr30k-Positions and Flickr30k-Counting from (CounterCurate §3.1–§3.3).

Layout (reference notes B3)
---------------------------
``<root>/Sentences/<id>.txt``: five captions, one per line. An annotated phrase is written
``[/EN#<chain id>/<type 1>[/<type 2>...] <word 1> ... <word n>]``, e.g. ``[/EN#18/people A man] rides
[/EN#19/vehicles a bike]``. Phrases of one coreference chain share the chain id (the *entity*); ``notvisual``
phrases carry the null chain id ``0`` and are never grounded. Blank lines are skipped; sentence indices count the
non-blank lines from 0 (as the official ``get_sentence_data``).

``<root>/Annotations/<id>.xml``: PASCAL-VOC-like ``<annotation>`` with ``<size><width/><height/><depth/></size>`` and
``<object>`` elements. Each object holds one or more ``<name>`` tags (chain ids) and either a ``<bndbox>`` with
``xmin, ymin, xmax, ymax`` or the flags ``<scene>0|1</scene>`` / ``<nobndbox>0|1</nobndbox>``. An object with
several names is one box shared by all those chains: here it is added to **every** named entity (the official
Python parser keeps only the first name; its README says the box refers to all of them).

Images are ``<root>/flickr30k-images/<id>.jpg`` unless another folder is given.

Coordinate convention
---------------------
Boxes are ``[x1, y1, x2, y2]`` in **0-based pixel indices**: the XML values minus 1, exactly as the official
``get_annotations`` does (the XML follows PASCAL VOC's 1-based indices). ``x2`` / ``y2`` are **inclusive**: they
are the last pixel column / row the box covers (VOC convention), so a box spans ``x2 - x1 + 1`` pixels and a valid box
satisfies ``0 <= x1 <= x2 <= width - 1`` and ``0 <= y1 <= y2 <= height - 1``. Normalised boxes for GLIGEN
(``x1 / width, y1 / height, (x2 + 1) / width, (y2 + 1) / height``) are made by the study modules.

Malformed input (bad phrase markup, a chain id in the sentences that the annotation file lacks, a box outside the
image or with ``x1 > x2``, a missing ``<size>``) is an :class:`~counterfactory.errors.InputError` naming the file,
the record and the fix. With ``strict=False`` an unknown chain id is treated as an entity without boxes and a box
outside the image is clipped to it, each logged as a warning (for the full dataset, if it has such records).
"""

from __future__ import annotations

import logging
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import pandas as pd

from ..errors import input_error
from ..io import read_utf8

log = logging.getLogger(__name__)

SENTENCES = "Sentences"
ANNOTATIONS = "Annotations"
IMAGES = "flickr30k-images"
#: the chain id of ``notvisual`` phrases (never in the annotation files)
NULL_CHAIN = "0"
#: the coarse phrase types of the dataset (reference notes B3); others are accepted but logged once
TYPES = ("people", "clothing", "bodyparts", "animals", "vehicles", "instruments", "scene", "other", "notvisual")
FIX_SENTENCES = ("write each phrase as [/EN#<chain id>/<type>[/<type>...] <words>] with no nested or stray "
                 "brackets, as in the official Sentences/<id>.txt")
FIX_UTF8 = ("save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 old > new`) or re-extract Sentences/ from the "
            "official Flickr30k Entities annotations")
FIX_IMAGE = ("re-extract the image from the Flickr30k image archive (flickr30k-images; an interrupted download or "
             "unzip leaves empty files), or delete the file to leave the image out")
FIX_XML = ("use the official Annotations/<id>.xml: <annotation> with <size><width/><height/></size> and <object>s "
           "holding <name> tags and a <bndbox> (xmin, ymin, xmax, ymax, 1-based pixels) or <scene>/<nobndbox> flags")

_PHRASE = re.compile(r"\[/EN#(?P<chain>[^/\s\]]*)(?P<types>(?:/[^/\s\]]*)*)\s+(?P<words>[^\[\]]*?)\s*\]")
_unknown_types_logged: set[str] = set()


@dataclass(frozen=True)
class Phrase:
    """One annotated phrase of one caption."""

    sentence_index: int
    text: str
    entity_id: str
    types: tuple[str, ...]
    first_word_index: int


@dataclass(frozen=True)
class Entity:
    """One coreference chain of an image: its types (from the phrases naming it) and its boxes."""

    entity_id: str
    types: tuple[str, ...]
    boxes: tuple[tuple[int, int, int, int], ...]
    scene: bool = False
    nobox: bool = False


@dataclass(frozen=True)
class ImageEntities:
    """Everything the reader knows about one image."""

    image_id: str
    width: int
    height: int
    sentences: tuple[str, ...]
    phrases: tuple[Phrase, ...]
    entities: dict = field(default_factory=dict)  # entity_id -> Entity

    def phrases_of(self, entity_id: str) -> list[Phrase]:
        return [p for p in self.phrases if p.entity_id == entity_id]


@dataclass
class Annotation:
    """The parsed XML of one image: size and, per chain id, its boxes and flags."""

    width: int
    height: int
    boxes: dict[str, list[tuple[int, int, int, int]]]
    scene: set[str]
    nobox: set[str]

    def ids(self) -> set[str]:
        return set(self.boxes) | self.scene | self.nobox


def parse_sentence(line: str, path, record) -> tuple[str, list[tuple[str, tuple[str, ...], str, int]]]:
    """``(plain sentence, [(entity_id, types, phrase text, first word index), ...])`` of one marked-up caption."""
    words: list[str] = []
    phrases = []
    pos = 0
    for match in _PHRASE.finditer(line):
        gap = line[pos:match.start()]
        if "[" in gap or "]" in gap:
            raise input_error(path, record, f"unbalanced or malformed bracket before {line[match.start():][:40]!r}",
                              FIX_SENTENCES)
        words.extend(gap.split())
        chain, types, text = match.group("chain"), match.group("types"), match.group("words")
        type_list = tuple(t for t in types.split("/") if t)
        if not chain.isdigit():
            raise input_error(path, record, f"chain id {chain!r} in {match.group(0)[:60]!r} is not a number",
                              FIX_SENTENCES)
        if not type_list or any(not t.isalpha() for t in type_list):
            raise input_error(path, record, f"phrase {match.group(0)[:60]!r} has no or a malformed type",
                              FIX_SENTENCES)
        if not text.split():
            raise input_error(path, record, f"phrase {match.group(0)[:60]!r} has no words", FIX_SENTENCES)
        for t in type_list:
            if t not in TYPES and t not in _unknown_types_logged:
                _unknown_types_logged.add(t)
                log.warning("%s, %s: phrase type %r is not one of the dataset's types (%s)", path, record, t,
                            ", ".join(TYPES))
        phrases.append((chain, type_list, " ".join(text.split()), len(words)))
        words.extend(text.split())
        pos = match.end()
    tail = line[pos:]
    if "[" in tail or "]" in tail:
        raise input_error(path, record, f"unbalanced or malformed bracket in {tail.strip()[:60]!r}", FIX_SENTENCES)
    words.extend(tail.split())
    return " ".join(words), phrases


def read_sentences(path: str | Path) -> list[tuple[str, list[Phrase]]]:
    """``[(sentence, phrases), ...]`` for the non-blank lines of a ``Sentences/<id>.txt`` file."""
    path = Path(path)
    text = read_utf8(path, FIX_UTF8)
    out = []
    index = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        sentence, found = parse_sentence(raw, path, f"line {lineno}")
        out.append((sentence, [Phrase(index, t, c, ty, w) for c, ty, t, w in found]))
        index += 1
    return out


def _int(element, tag: str, path, record) -> int:
    child = element.find(tag)
    if child is None or child.text is None:
        raise input_error(path, record, f"missing <{tag}>", FIX_XML)
    try:
        return int(float(child.text.strip()))
    except ValueError as exc:
        raise input_error(path, record, f"<{tag}> is {child.text.strip()!r}, not a number", FIX_XML) from exc


def read_annotation(path: str | Path, strict: bool = True) -> Annotation:
    """Parse an ``Annotations/<id>.xml`` file into 0-based inclusive pixel boxes per chain id (module docstring)."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise input_error(path, None, f"not well-formed XML ({exc})", FIX_XML) from exc
    size = root.find("size")
    if size is None:
        raise input_error(path, "<size>", "missing", FIX_XML)
    width, height = _int(size, "width", path, "<size>"), _int(size, "height", path, "<size>")
    if width <= 0 or height <= 0:
        raise input_error(path, "<size>", f"width x height is {width} x {height}", FIX_XML)
    ann = Annotation(width, height, {}, set(), set())
    for k, obj in enumerate(root.findall("object"), start=1):
        names = [(n.text or "").strip() for n in obj.findall("name")]
        record = f"<object> #{k} (name {', '.join(names) or '?'})"
        if not names or not all(names):
            raise input_error(path, record, "has no or an empty <name>", FIX_XML)
        bnd = obj.find("bndbox")
        if bnd is not None:
            x1, y1, x2, y2 = (_int(bnd, t, path, record) - 1 for t in ("xmin", "ymin", "xmax", "ymax"))
            if x1 > x2 or y1 > y2:
                raise input_error(path, record, f"box [{x1}, {y1}, {x2}, {y2}] (0-based) has xmin > xmax or "
                                  "ymin > ymax", FIX_XML)
            if x1 < 0 or y1 < 0 or x2 > width - 1 or y2 > height - 1:
                problem = (f"box xmin,ymin,xmax,ymax = {x1 + 1},{y1 + 1},{x2 + 1},{y2 + 1} (1-based) lies outside "
                           f"the {width} x {height} image")
                if strict:
                    raise input_error(path, record, problem, "correct the box or the <size> (1 <= xmin <= xmax <= "
                                      "width, 1 <= ymin <= ymax <= height)")
                log.warning("%s, %s: %s; clipped", path, record, problem)
                x1, y1 = max(0, x1), max(0, y1)
                x2, y2 = min(width - 1, x2), min(height - 1, y2)
                if x1 > x2 or y1 > y2:
                    continue
            for name in names:
                ann.boxes.setdefault(name, []).append((x1, y1, x2, y2))
            continue
        if obj.find("nobndbox") is None and obj.find("scene") is None:
            raise input_error(path, record, "has neither <bndbox> nor <scene>/<nobndbox>", FIX_XML)
        nobox = obj.find("nobndbox") is not None and _int(obj, "nobndbox", path, record) > 0
        scene = obj.find("scene") is not None and _int(obj, "scene", path, record) > 0
        for name in names:
            if nobox:
                ann.nobox.add(name)
            if scene:
                ann.scene.add(name)
            if not (nobox or scene):  # both flags 0: an entity known to the file, without a box
                ann.nobox.add(name)
    return ann


def read_image(root: str | Path, image_id: str, strict: bool = True) -> ImageEntities:
    """Entities (types, boxes) and phrases of one image of a Flickr30k Entities folder ``root``."""
    root = Path(root)
    image_id = str(image_id)
    spath = root / SENTENCES / f"{image_id}.txt"
    apath = root / ANNOTATIONS / f"{image_id}.xml"
    for p, what in ((spath, "sentence file"), (apath, "annotation file")):
        if not p.is_file():
            raise input_error(p, None, f"{what} of image {image_id} not found",
                              f"unpack annotations.zip of BryanPlummer/flickr30k_entities into {root}")
    sentences = read_sentences(spath)
    ann = read_annotation(apath, strict=strict)
    known = ann.ids()
    types: dict[str, list[str]] = {}
    phrases: list[Phrase] = []
    for sentence_index, (_, found) in enumerate(sentences):
        for phrase in found:
            phrases.append(phrase)
            if phrase.entity_id == NULL_CHAIN:
                continue
            if phrase.entity_id not in known and phrase.entity_id not in types:
                problem = (f"phrase {phrase.text!r} names entity /EN#{phrase.entity_id}, which {apath.name} does not "
                           "annotate (no <object> with that <name>)")
                if strict:
                    raise input_error(spath, f"sentence {sentence_index} (0-based, blank lines skipped)", problem,
                                      f"add an <object> with <name>{phrase.entity_id}</name> to {apath} or correct "
                                      "the chain id")
                log.warning("%s: %s; treated as an entity without boxes", spath, problem)
            bucket = types.setdefault(phrase.entity_id, [])
            bucket.extend(t for t in phrase.types if t not in bucket)
    entities = {}
    for eid in sorted(known | set(types), key=lambda s: (len(s), s)):
        entities[eid] = Entity(eid, tuple(types.get(eid, ())), tuple(ann.boxes.get(eid, ())), eid in ann.scene,
                               eid in ann.nobox)
    return ImageEntities(image_id, ann.width, ann.height, tuple(s for s, _ in sentences), tuple(phrases), entities)


def list_image_ids(root: str | Path) -> list[str]:
    """Image ids that have both a sentence and an annotation file, sorted numerically where possible."""
    root = Path(root)
    for sub in (SENTENCES, ANNOTATIONS):
        if not (root / sub).is_dir():
            raise input_error(root / sub, None, "folder not found",
                              f"pass the folder holding {SENTENCES}/ and {ANNOTATIONS}/ (unpacked annotations.zip)")
    sent = {p.stem for p in (root / SENTENCES).glob("*.txt")}
    ann = {p.stem for p in (root / ANNOTATIONS).glob("*.xml")}
    missing = sorted(sent ^ ann)
    if missing:
        log.warning("%s: %d image id(s) have only one of the sentence / annotation files (e.g. %s); skipped", root,
                    len(missing), missing[:3])
    return sorted(sent & ann, key=lambda s: (0, int(s), s) if s.isdigit() else (1, 0, s))


def iter_images(root: str | Path, image_ids: Iterable[str] | None = None, strict: bool = True
                ) -> Iterator[ImageEntities]:
    """:func:`read_image` for ``image_ids`` (default: every image of :func:`list_image_ids`)."""
    for image_id in (list_image_ids(root) if image_ids is None else image_ids):
        yield read_image(root, image_id, strict=strict)


def image_path(images_dir: str | Path | None, image_id: str) -> str | None:
    """The absolute path of ``<images_dir>/<id>.jpg`` when it exists, else None; an empty (0-byte) file is an
    :class:`InputError` naming it (an interrupted unzip), not an image to pass on."""
    if images_dir is None:
        return None
    p = Path(images_dir) / f"{image_id}.jpg"
    try:
        st = p.stat()
    except OSError:
        return None
    if not os.path.isdir(p) and st.st_size == 0:    # the stat is made anyway: an empty file fails here, named
        raise input_error(p, f"image {image_id}", "empty image file (0 bytes)", FIX_IMAGE)
    return os.fspath(p.resolve()) if p.is_file() else None


def entities_frame(images: Iterable[ImageEntities]) -> pd.DataFrame:
    """One row per entity: ``image_id, entity_id, types, n_boxes, boxes, scene, nobox``."""
    rows = [{"image_id": im.image_id, "entity_id": e.entity_id, "types": list(e.types), "n_boxes": len(e.boxes),
             "boxes": [list(b) for b in e.boxes], "scene": e.scene, "nobox": e.nobox}
            for im in images for e in im.entities.values()]
    return pd.DataFrame(rows, columns=["image_id", "entity_id", "types", "n_boxes", "boxes", "scene", "nobox"])


def phrases_frame(images: Iterable[ImageEntities]) -> pd.DataFrame:
    """One row per phrase: ``image_id, sentence_index, phrase, entity_id, types, first_word_index``."""
    rows = [{"image_id": im.image_id, "sentence_index": p.sentence_index, "phrase": p.text,
             "entity_id": p.entity_id, "types": list(p.types), "first_word_index": p.first_word_index}
            for im in images for p in im.phrases]
    return pd.DataFrame(rows, columns=["image_id", "sentence_index", "phrase", "entity_id", "types",
                                       "first_word_index"])


def captions_frame(root: str | Path, images_dir: str | Path | None = None,
                   image_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per caption: ``image_id, sentence_index, markup`` (the Sentences line as written), ``caption``
    (plain text) and ``image_path`` (absolute, None when the image is not in ``images_dir``); every line is
    parsed, so malformed markup stops here naming the file and line."""
    root = Path(root)
    rows = []
    for image_id in (list_image_ids(root) if image_ids is None else image_ids):
        path = root / SENTENCES / f"{image_id}.txt"
        index = 0
        for lineno, raw in enumerate(read_utf8(path, FIX_UTF8).splitlines(), start=1):
            if not raw.strip():
                continue
            caption, _ = parse_sentence(raw, path, f"line {lineno}")
            rows.append({"image_id": image_id, "sentence_index": index, "markup": raw.strip(), "caption": caption,
                         "image_path": image_path(images_dir, image_id)})
            index += 1
    return pd.DataFrame(rows, columns=["image_id", "sentence_index", "markup", "caption", "image_path"])
