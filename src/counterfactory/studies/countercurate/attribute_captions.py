"""Flickr30k-Attributes' input: the captions and their marked phrases (CounterCurate §3.4, appendix A).

A caption comes as its Flickr30k Entities markup (``[/EN#18/people A man] rides ...``; :func:`parse_markup`) or
as plain text with phrase records (:func:`locate_phrases`), with its entities' boxes; :func:`read_captions` turns
a captions table into :class:`CaptionItem` s (columns in :mod:`.attributes`' docstring) and
:func:`select_captions` keeps the ones §3.4 uses. :func:`words` is the tokenisation negatives are compared by.
The llm requests built from the items and the checks of the answers are :mod:`.attributes`, which re-exports
every name here.
"""

from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass
from typing import Iterable

import pandas as pd

from ...errors import ConfigError, input_error

ARTICLES = {"an": "a"}
_MARK = re.compile(r"\[/EN#(?P<id>[^/\s\]]*)(?P<types>(?:/[^/\s\]]*)*)\s+(?P<text>[^\[\]]*?)\s*\]")
_WORD = re.compile(r"[\w'-]+")


# --------------------------------------------------------------------------- captions and phrases


@dataclass(frozen=True)
class Phrase:
    """A marked phrase: its text, entity (chain) id, types and its word span ``[start, end)`` in the caption's
    word tokens (:func:`words`)."""

    text: str
    entity_id: str
    types: tuple[str, ...]
    start: int
    end: int


def words(text: str) -> list[str]:
    """Lower-cased word tokens (punctuation dropped; ``an`` written ``a``) -- what negatives are compared by."""
    return [ARTICLES.get(w, w) for w in _WORD.findall(str(text).lower())]


def parse_markup(markup: str) -> tuple[str, list[Phrase]]:
    """``(plain caption, phrases)`` of a Flickr30k Entities sentence (``[/EN#18/people A man] rides ...``)."""
    pieces, phrases, n_words, pos = [], [], 0, 0
    for m in _MARK.finditer(markup):
        before = markup[pos:m.start()]
        pieces.append(before)
        n_words += len(words(before))
        text = m.group("text")
        n = len(words(text))
        phrases.append(Phrase(text, m.group("id"), tuple(t for t in m.group("types").split("/") if t),
                              n_words, n_words + n))
        pieces.append(text)
        n_words += n
        pos = m.end()
    pieces.append(markup[pos:])
    if "[/EN#" in markup[pos:] or "[/EN#" in "".join(pieces):
        raise ValueError("unbalanced or nested entity markup")
    caption = re.sub(r"\s+", " ", "".join(pieces)).strip()
    caption = re.sub(r"\s+([.,;:!?])", r"\1", caption)
    return caption, phrases


def _listish(value) -> list:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return []
    if isinstance(value, str):
        return json.loads(value) if value.strip() else []
    if isinstance(value, dict):
        return [value]
    return list(value)


def locate_phrases(caption: str, phrases: Iterable[dict]) -> list[Phrase]:
    """Phrases of a plain caption from ``{text | phrase, entity_id, types, first_word_index?}`` records: each is
    found at its ``first_word_index`` (whitespace-split words of the caption) when given, else at its next
    occurrence after the previous phrase. A phrase that is not in the caption raises :class:`ValueError`."""
    toks = words(caption)
    raw = caption.split()
    out, cursor = [], 0
    for rec in phrases:
        text = str(rec.get("text", rec.get("phrase", "")))
        ptoks = words(text)
        types = rec.get("types", rec.get("phrase_type", ()))
        types = (types,) if isinstance(types, str) else tuple(str(t) for t in _listish(types))
        start = None
        fwi = rec.get("first_word_index")
        if fwi is not None and not (isinstance(fwi, float) and pd.isna(fwi)):
            guess = len(words(" ".join(raw[:int(fwi)])))
            if toks[guess:guess + len(ptoks)] == ptoks:
                start = guess
        if start is None:
            for s in list(range(cursor, len(toks))) + list(range(0, cursor)):
                if toks[s:s + len(ptoks)] == ptoks:
                    start = s
                    break
        if start is None or not ptoks:
            raise ValueError(f"phrase {text!r} is not in the caption")
        out.append(Phrase(text, str(rec.get("entity_id", rec.get("phrase_id"))), types, start, start + len(ptoks)))
        cursor = start + len(ptoks)
    return out


def markup_of(caption: str, phrases: list[Phrase]) -> str:
    """The caption with its phrases marked as in Flickr30k Entities (for the prompt)."""
    raw = caption.split()
    # map word-token index -> whitespace-word index
    idx, owner = 0, []
    for i, w in enumerate(raw):
        n = len(words(w))
        owner.extend([i] * n)
        idx += n
    opens: dict[int, list[str]] = collections.defaultdict(list)
    closes: dict[int, int] = collections.Counter()
    for p in phrases:
        if p.start >= len(owner) or p.end - 1 >= len(owner):
            continue
        opens[owner[p.start]].append(f"[/EN#{p.entity_id}/{'/'.join(p.types) or 'other'} ")
        closes[owner[p.end - 1]] += 1
    out = []
    for i, w in enumerate(raw):
        core, tail = re.match(r"^(.*?)([.,;:!?]*)$", w).groups() if closes.get(i) else (w, "")
        out.append("".join(opens.get(i, [])) + core + "]" * closes.get(i, 0) + tail)
    return " ".join(out)


def _boxes(value) -> dict[str, list[list[float]]]:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return {}
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if isinstance(value, dict):
        return {str(k): [list(map(float, b)) for b in _listish(v)] for k, v in value.items() if v is not None}
    out: dict[str, list[list[float]]] = {}
    for rec in _listish(value):
        boxes = rec.get("boxes", [rec["box"]] if "box" in rec else [])
        out.setdefault(str(rec["entity_id"]), []).extend(list(map(float, b)) for b in _listish(boxes))
    return out


@dataclass
class CaptionItem:
    """One caption to make negatives of."""

    image_id: str
    sentence_index: int
    caption: str
    phrases: list[Phrase]
    boxes: dict[str, list[list[float]]]
    image_path: str | None = None
    width: int | None = None
    height: int | None = None

    @property
    def markup(self) -> str:
        return markup_of(self.caption, self.phrases)

    def visual_phrases(self) -> list[Phrase]:
        """Phrases that name something visible (the ``notvisual`` chain ``0`` is left out)."""
        return [p for p in self.phrases if p.entity_id != "0" and "notvisual" not in p.types]


def read_captions(frame: pd.DataFrame, source: str = "captions") -> list[CaptionItem]:
    """Caption items from a captions table (see the module docstring); malformed rows raise :class:`InputError`."""
    need = {"image_id", "sentence_index"}
    if not need <= set(frame.columns) or not ({"markup"} <= set(frame.columns)
                                              or {"caption", "phrases"} <= set(frame.columns)):
        raise input_error(source, None, f"columns {sorted(frame.columns)} lack image_id, sentence_index and either "
                          "markup or caption + phrases", "write the table with the Flickr30k Entities reader "
                          "(counterfactory.data.flickr30k_entities) or give those columns")
    dup = frame.duplicated(["image_id", "sentence_index"], keep=False)
    if dup.any():
        first = frame[dup].iloc[0]
        raise input_error(source, int(dup.values.argmax()), f"image {first['image_id']} sentence "
                          f"{first['sentence_index']} appears more than once", "keep one row per caption")
    items = []
    for i, row in enumerate(frame.to_dict("records")):
        record = f"{i} (image {row['image_id']}, sentence {row['sentence_index']})"
        try:
            markup = row.get("markup")
            if isinstance(markup, str) and markup.strip():
                caption, phrases = parse_markup(markup)
            else:
                caption = str(row["caption"])
                phrases = locate_phrases(caption, _listish(row.get("phrases")))
            boxes = _boxes(row.get("boxes"))
        except (ValueError, KeyError, TypeError) as exc:
            raise input_error(source, record, f"cannot read the caption's phrases ({exc})",
                              "give the Flickr30k Entities markup, or phrases that occur in the caption") from exc
        path = row.get("image_path")
        items.append(CaptionItem(str(row["image_id"]), int(row["sentence_index"]), caption, phrases, boxes,
                                 path if isinstance(path, str) and path else None,
                                 _int_or_none(row.get("width")), _int_or_none(row.get("height"))))
    return items


def _int_or_none(v):
    return None if v is None or (isinstance(v, float) and pd.isna(v)) else int(v)


def select_captions(items: list[CaptionItem], section: dict) -> list[CaptionItem]:
    """The captions §3.4 uses: per image the first one (``caption: first``), or the longest, or all; then
    ``limit_images`` images (sorted ids)."""
    how = section["caption"]
    if how not in ("first", "longest", "all"):
        raise ConfigError(f"attributes.caption must be first, longest or all, got {how!r}. Fix: use first (§3.4)")
    by_image: dict[str, list[CaptionItem]] = collections.defaultdict(list)
    for it in items:
        by_image[it.image_id].append(it)
    ids = sorted(by_image)
    if section.get("limit_images"):
        ids = ids[:section["limit_images"]]
    out = []
    for image_id in ids:
        group = sorted(by_image[image_id], key=lambda it: it.sentence_index)
        if how == "first":
            out.append(group[0])
        elif how == "longest":
            out.append(max(group, key=lambda it: (len(words(it.caption)), -it.sentence_index)))
        else:
            out.extend(group)
    return out
