"""Counterfactual caption sets for probing intersectional social biases (SocialCounterfactuals §3.2, §8.4).

A caption is the template ⟨p⟩⟨a1⟩⟨a2⟩⟨s⟩ (§3.2): a prefix ``p`` (the four of Table 19, e.g. "A photo of a"),
one value of each attribute type of a *segment* (race × gender, physical characteristic × gender, physical
characteristic × race: Table 1) and a subject ``s`` (an occupation: by default the authors' released
pre-filter list as published, the paper's "260 occupations": 261 entries in release order, 244 distinct as written,
181 ignoring case; ``subjects_dedup`` (none / exact / case) drops repeated entries, off in the paper config; Table
18's 156 survivors as the named list ``table18``). A *counterfactual set* holds
every caption of one (segment, prefix, subject): one member per combination of attribute values, in the
order of ``itertools.product`` over the configured value lists, so a race × gender set has 6 × 2 = 12
members, physical × gender 10 and physical × race 30. With 260 occupations and 4 prefixes this is
4 × 260 × (12 + 10 + 30) = 54,080 captions in 3 × 4 × 260 = 3,120 sets (§3.2, §8.4, Table 11).

Segments are configured as lists of attribute types, so any combination works, including the
three-attribute segment of §10.2 (physical × race × gender, 60 captions per set: MaxSkew@60).

The paper does not name a base caption of a set; the released generation captions put the first
combination first (``caption``, then ``output_1`` …), and batched Prompt-to-Prompt (§3.3) copies the
first member's attention to the others, so ``member_index`` 0 — the first combination in list order —
is the base member.

The article at the end of the prefix ("a") is made to agree with the word that follows once the caption
is filled ("A photo of an Asian male doctor", "an obese ...", "a European ...", "an honest ..."):
:func:`indefinite_article` decides by that word's sound, with a list of exceptions (silent 'h', 'u'/'eu'
read as "you", 'o' read as "w", letter-by-letter initialisms).

Set ids are ``<segment>-p<prefix index>-<subject slug>-<10 hex of sha256>`` of (attribute types of the
segment, prefix index, subject): stable when other subjects are added, removed or reordered. A subject listed again
(``subjects_dedup: none``, as the release lists "doctor" twice) makes its own sets, the n-th repeat's ids carrying
``-<n + 1>`` after the slug and the repeat number in the hash; their captions are those of the first entry.

CLI: ``counterfactory social captions --config FILE [--config FILE2 ...] --out FILE.parquet``.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import yaml

from ... import config
from ...config import JOB_KEY, deep_merge, fill_section, is_config_layer, read_yaml
from ...errors import ConfigError
from ...io import write_parquet

STUDY = "social_counterfactuals"
#: dotted name of the config section this module reads (used in every error message)
SECTION = f"{STUDY}.captions"
#: keys of the section; a key left out or set to null takes its value from :func:`default_lists`
#: (``subjects``: a list, or the name of a packaged list, :data:`SUBJECT_LISTS`; null = :data:`DEFAULT_SUBJECT_LIST`)
SECTION_KEYS = ("prefixes", "attributes", "subjects", "subjects_dedup", "segments", "max_subjects", "article_a",
                "article_an")
#: ``subjects_dedup`` values: keep every entry / drop entries equal to an earlier one as written / ignoring case
SUBJECT_DEDUP = ("none", "exact", "case")
_RESOURCE = Path(__file__).resolve().parents[2] / "resources" / "social" / "attributes.yaml"
_TYPE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_ARTICLE = re.compile(r"\b(an|a)(\s+)([^\s]+)", re.IGNORECASE)

# --------------------------------------------------------------------------------------------- defaults


def default_lists() -> dict:
    """The paper's prefixes, attribute value lists, segments and occupation lists, with ``sources``.

    Read from the packaged ``resources/social/attributes.yaml``; a fresh copy on every call. ``subjects`` is
    Table 18 (the occupations that survived the filters), ``subjects_released`` the authors' pre-filter list
    as released (261 entries, duplicates included); :func:`named_subjects` gives the lists a config names."""
    import copy
    import os

    return copy.deepcopy(_parsed_lists(str(_RESOURCE), os.stat(_RESOURCE).st_mtime_ns))


@functools.lru_cache(maxsize=2)
def _parsed_lists(path: str, mtime_ns: int) -> dict:
    """The packaged lists, parsed once per file version (a paper-scale dry run asks for them once per job)."""
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


#: named subject lists (config ``captions.subjects: <name>``) -> key of ``resources/social/attributes.yaml``
SUBJECT_LISTS = {"released": "subjects_released", "table18": "subjects"}
#: the list a config gets with ``subjects`` left out or null: the paper generates from the pre-filter list (§3.2, §8.4)
DEFAULT_SUBJECT_LIST = "released"


def named_subjects(name: str, source: str | None = None, dedup: str = "none") -> list[str]:
    """The packaged subject list ``name`` (:data:`SUBJECT_LISTS`), spaces normalised, through :func:`dedup_subjects`.

    ``released``: the authors' pre-filter list as published, in release order (261 entries; ``dedup="exact"``: 244,
    ``dedup="case"``: 181 — the CLIP and BERT-uncased tokenizers lower-case, so case repeats are the same prompt);
    ``table18``: Table 18 as printed (156)."""
    if name not in SUBJECT_LISTS:
        raise _fail("subjects", f"unknown subject list {name!r}",
                    f"name one of {', '.join(SUBJECT_LISTS)} or give the occupations as a list", source)
    return dedup_subjects([_norm(str(item)) for item in default_lists()[SUBJECT_LISTS[name]]], dedup, source)


def dedup_subjects(subjects: Iterable[str], dedup: str, source: str | None = None) -> list[str]:
    """``subjects`` with the entries that repeat an earlier one dropped: ``none`` keeps every entry (the release as
    published), ``exact`` drops repeats as written, ``case`` repeats ignoring case (first occurrence kept)."""
    if dedup not in SUBJECT_DEDUP:
        raise _fail("subjects_dedup", f"must be one of {', '.join(SUBJECT_DEDUP)}, got {dedup!r}",
                    "set none (every entry, the paper config), exact or case", source)
    subjects = list(subjects)
    if dedup == "none":
        return subjects
    key = (lambda t: t) if dedup == "exact" else str.casefold
    out, seen = [], set()
    for text in subjects:
        if key(text) not in seen:
            seen.add(key(text))
            out.append(text)
    return out


def subject_occurrences(subjects: Iterable[str]) -> list[int]:
    """For each entry, how many earlier entries read the same (0 = first; spaces normalised, case kept)."""
    counts: dict[str, int] = {}
    out = []
    for s in subjects:
        text = _norm(s)
        out.append(counts.get(text, 0))
        counts[text] = out[-1] + 1
    return out


# ------------------------------------------------------------------------------------ a / an agreement

#: words read with a vowel sound although they start with a consonant letter (silent 'h')
_AN_PREFIXES = ("honest", "honor", "honour", "hour", "heir", "herb")
#: words starting with a vowel letter but read with a consonant sound ('you', 'w')
_A_PREFIXES = ("eu", "ewe", "uni", "use", "usu", "uten", "util", "utop", "uter", "urin", "urolog", "uran",
               "ubiq", "ukul", "ufo")
#: whole words (or first parts of hyphenated words) read with a 'w' sound: "a one-eyed", "a once-famous"
_A_WORDS = frozenset({"one", "once"})
#: whole words that start like a "you" word but are read "un-" (negations)
_AN_WORDS = frozenset({"unidentified", "unimaginative", "unimportant", "unimpressed", "unimpressive",
                       "uninformed", "uninhabited", "uninjured", "uninspired", "uninsured", "unintended",
                       "unintelligent", "uninterested", "uninvited", "unindicted", "unisolated"})
#: letters whose English name starts with a vowel sound (for initialisms read letter by letter)
_VOWEL_LETTER_NAMES = frozenset("aefhilmnorsx")


def _clean_word(word: str) -> str:
    return re.sub(r"^[^\w]+|[^\w]+$", "", word.split("-")[0] if not word[:1].isdigit() else word)


@functools.lru_cache(maxsize=4096)
def _article_for(word: str, extra_a: frozenset, extra_an: frozenset) -> str:
    low = word.lower()
    whole = re.sub(r"^[^\w]+|[^\w]+$", "", word).lower()
    for candidate in (whole, low):
        if candidate in extra_an:
            return "an"
        if candidate in extra_a:
            return "a"
    token = _clean_word(word)
    if not token:
        return "a"
    if token[0].isdigit():
        digits = re.match(r"\d+", token.replace(",", "")).group(0)
        if digits.startswith("8"):
            return "an"                       # eight, eighty, 800
        if digits[:2] in ("11", "18") and len(digits) % 3 == 2:
            return "an"                       # eleven, eighteen, 11,000, 18,000
        return "a"
    if 2 <= len(token) <= 5 and token.isupper() and token.isalpha() and (
            len(token) <= 3 or not set(token.lower()) & set("aeiouy")):
        # read letter by letter ("an MBA", "a CEO", "an HTML"); longer ones with vowels are read as words ("a NASA")
        return "an" if token[0].lower() in _VOWEL_LETTER_NAMES else "a"
    low = token.lower()
    if low in _AN_WORDS:
        return "an"
    if low in _A_WORDS:
        return "a"
    if low.startswith(_AN_PREFIXES):
        return "an"
    if low.startswith(_A_PREFIXES):
        return "a"
    if len(low) == 1:                         # a single letter is read by its name ("an X", "a B")
        return "an" if low in _VOWEL_LETTER_NAMES else "a"
    return "an" if low[0] in "aeiou" else "a"


def indefinite_article(word: str, extra_a: Iterable[str] = (), extra_an: Iterable[str] = ()) -> str:
    """``"a"`` or ``"an"`` for the word following the article, decided by how the word is read.

    ``extra_a`` / ``extra_an``: words (compared case-insensitively, whole word) that always take that
    article, checked first (the config keys ``article_a`` / ``article_an``)."""
    return _article_for(word, frozenset(w.lower() for w in extra_a), frozenset(w.lower() for w in extra_an))


def fix_articles(text: str, extra_a: Iterable[str] = (), extra_an: Iterable[str] = ()) -> str:
    """Make every standalone "a"/"an" in ``text`` agree with the word after it, keeping its capital."""
    ea, ean = frozenset(w.lower() for w in extra_a), frozenset(w.lower() for w in extra_an)

    def repl(m: re.Match) -> str:
        article = _article_for(m.group(3), ea, ean)
        if m.group(1)[0].isupper():
            article = article.capitalize()
        return f"{article}{m.group(2)}{m.group(3)}"

    return _ARTICLE.sub(repl, text)


# ------------------------------------------------------------------------------------------- validation


def _norm(text: str) -> str:
    return " ".join(text.split())


def _fail(key: str, problem: str, fix: str, source: str | None) -> ConfigError:
    where = f"{source}: " if source else ""
    return ConfigError(f"{where}{SECTION}.{key}: {problem}. Fix: {fix}")


def _string_list(value: Any, key: str, source: str | None, *, allow_empty_string: bool = False,
                 allow_repeats: bool = False) -> list[str]:
    if not isinstance(value, list):
        raise _fail(key, f"must be a list of strings, got {type(value).__name__}",
                    f"write it as a YAML list ({key}: [value1, value2, ...])", source)
    if not value:
        raise _fail(key, "is empty", "give at least one value, or remove the key to use the paper's list", source)
    out, seen = [], {}
    for i, item in enumerate(value):
        if not isinstance(item, str) or (not item.strip() and not allow_empty_string):
            raise _fail(f"{key}[{i}]", f"must be a non-empty string, got {item!r}",
                        "quote the value or remove the entry", source)
        text = _norm(item)
        folded = text.casefold()
        if folded in seen and not allow_repeats:
            raise _fail(key, f"duplicate value {item!r} (entries {seen[folded]} and {i}, compared ignoring case "
                             "and extra spaces)", "remove one of them", source)
        seen[folded] = i
        out.append(text)
    return out


def resolve_section(section: dict | None, source: str | None = None) -> dict:
    """The caption section with defaults filled in (:func:`default_lists`), normalised and validated.

    Raises :class:`~counterfactory.errors.ConfigError` naming the key and the fix."""
    section = {} if section is None else section
    if not isinstance(section, dict):
        raise ConfigError(f"{source or '<config>'}: {SECTION} must be a mapping, got {type(section).__name__}. "
                          f"Fix: give the keys {', '.join(SECTION_KEYS)}")
    unknown = sorted(set(section) - set(SECTION_KEYS))
    if unknown:
        raise _fail(unknown[0], f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
                    f"use only {', '.join(SECTION_KEYS)}", source)
    defaults = default_lists()

    def pick(key):
        value = section.get(key)
        return defaults.get(key) if value is None else value

    prefixes = _string_list(pick("prefixes"), "prefixes", source, allow_empty_string=True)

    attributes = pick("attributes")
    if not isinstance(attributes, dict) or not attributes:
        raise _fail("attributes", "must be a non-empty mapping of attribute type to a list of values",
                    "write e.g. attributes: {race: [White, Black], gender: [male, female]}", source)
    attrs: dict[str, list[str]] = {}
    owner: dict[str, str] = {}
    for atype, values in attributes.items():
        if not isinstance(atype, str) or not _TYPE_NAME.match(atype):
            raise _fail(f"attributes.{atype}", "attribute type names must be lower-case identifiers "
                        "(letters, digits, '_', starting with a letter)", "rename the type", source)
        vals = _string_list(values, f"attributes.{atype}", source)
        for v in vals:
            other = owner.get(v.casefold())
            if other is not None:
                raise _fail(f"attributes.{atype}", f"value {v!r} is also a value of attributes.{other}; a caption "
                            "could not be read back to its attributes", "keep each value in one type only", source)
            owner[v.casefold()] = atype
        attrs[atype] = vals

    dedup = section.get("subjects_dedup")
    if dedup is None:   # the schema's default (§3.2, §8.4: the release as published)
        dedup = fill_section(SECTION, {})["subjects_dedup"]
    subjects_raw = section.get("subjects")
    if subjects_raw is None or isinstance(subjects_raw, str):
        subjects_raw = named_subjects(DEFAULT_SUBJECT_LIST if subjects_raw is None else subjects_raw, source)
    subjects = dedup_subjects(_string_list(subjects_raw, "subjects", source, allow_repeats=True), dedup, source)
    max_subjects = section.get("max_subjects")
    if max_subjects is not None:
        if isinstance(max_subjects, bool) or not isinstance(max_subjects, int) or max_subjects < 1:
            raise _fail("max_subjects", f"must be a positive integer or null, got {max_subjects!r}",
                        "set a number of subjects (the first N of the list) or null for all", source)
        subjects = subjects[:max_subjects]

    segments_raw = pick("segments")
    if not isinstance(segments_raw, list) or not segments_raw:
        raise _fail("segments", "must be a non-empty list of attribute-type lists",
                    "write e.g. segments: [[race, gender], [physical, gender]]", source)
    segments: list[tuple[str, ...]] = []
    seen_sets: dict[frozenset, int] = {}
    for i, seg in enumerate(segments_raw):
        key = f"segments[{i}]"
        if not isinstance(seg, list) or not all(isinstance(t, str) for t in seg):
            raise _fail(key, f"must be a list of attribute types, got {seg!r}", "write e.g. [race, gender]", source)
        if len(seg) < 2:
            raise _fail(key, f"has {len(seg)} attribute type(s); a segment intersects at least 2",
                        "add a second attribute type (e.g. [race, gender]) or remove the segment", source)
        missing = [t for t in seg if t not in attrs]
        if missing:
            raise _fail(key, f"unknown attribute type {missing[0]!r}", f"use one of {', '.join(attrs)} or add "
                        f"attributes.{missing[0]} with its values", source)
        if len(set(seg)) != len(seg):
            raise _fail(key, f"repeats an attribute type ({seg})", "list each type once", source)
        fs = frozenset(seg)
        if fs in seen_sets:
            raise _fail(key, f"intersects the same attribute types as segments[{seen_sets[fs]}]",
                        "remove one of the two segments", source)
        seen_sets[fs] = i
        segments.append(tuple(seg))

    extra = {}
    for key in ("article_a", "article_an"):
        value = section.get(key)
        extra[key] = [] if value is None else _string_list(value, key, source)
    both = {w.casefold() for w in extra["article_a"]} & {w.casefold() for w in extra["article_an"]}
    if both:
        raise _fail("article_a", f"{sorted(both)[0]!r} is in both article_a and article_an",
                    "keep the word in one list", source)
    return {"prefixes": prefixes, "attributes": attrs, "subjects": subjects, "subjects_dedup": dedup,
            "segments": segments, "max_subjects": max_subjects, **extra}


# --------------------------------------------------------------------------------------------- building


def segment_name(types: Iterable[str]) -> str:
    """Name of a segment: its attribute types joined by '_' (``race_gender``)."""
    return "_".join(types)


def make_set_id(types: Iterable[str], prefix_index: int, subject: str, occurrence: int = 0) -> str:
    """Stable id of the set of (segment ``types``, prefix number, subject); independent of every other subject.
    ``occurrence``: the repeat number of a subject listed again (0 = its first entry, the id as before)."""
    types = list(types)
    parts = [types, int(prefix_index), _norm(subject)] + ([int(occurrence)] if occurrence else [])
    key = json.dumps(parts, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "-", _norm(subject).lower()).strip("-")[:32].strip("-") or "subject"
    if occurrence:
        slug = f"{slug}-{int(occurrence) + 1}"
    return f"{segment_name(types)}-p{int(prefix_index)}-{slug}-{digest}"


def compose_caption(prefix: str, values: Iterable[str], subject: str,
                    extra_a: Iterable[str] = (), extra_an: Iterable[str] = ()) -> str:
    """⟨prefix⟩ ⟨a1⟩ ⟨a2⟩ … ⟨subject⟩ with the articles made to agree (§3.2)."""
    words = " ".join(w for w in (prefix, *values, subject) if w)
    return fix_articles(words, extra_a, extra_an)


def build_caption_sets(section: dict | None, source: str | None = None) -> pd.DataFrame:
    """Every caption of every counterfactual set, one row per caption.

    ``section``: the ``social_counterfactuals.captions`` config section (keys :data:`SECTION_KEYS`; left
    out or null = the paper's lists). Columns: ``set_id, segment, prefix_index, prefix, subject,
    member_index, n_members, a1_type, a1, a2_type, a2, a3_type, a3[, a4_type, a4 …], a1a2, caption``;
    ``a3_type``/``a3`` are "" for two-attribute segments; ``a1a2`` is the attribute values joined by spaces
    (as they appear in the caption). Rows are ordered by segment, prefix, subject (config order), member."""
    cfg = resolve_section(section, source)
    width = max(3, max(len(s) for s in cfg["segments"]))
    ea, ean = cfg["article_a"], cfg["article_an"]
    rows, repeat = [], []
    occurrences = subject_occurrences(cfg["subjects"])
    for types in cfg["segments"]:
        combos = list(itertools.product(*(cfg["attributes"][t] for t in types)))
        for p_index, prefix in enumerate(cfg["prefixes"]):
            for subject, occurrence in zip(cfg["subjects"], occurrences):
                sid = make_set_id(types, p_index, subject, occurrence)
                repeat.extend([occurrence > 0] * len(combos))
                for member, values in enumerate(combos):
                    row = {"set_id": sid, "segment": segment_name(types), "prefix_index": p_index,
                           "prefix": prefix, "subject": subject, "member_index": member, "n_members": len(combos)}
                    for k in range(width):
                        row[f"a{k + 1}_type"] = types[k] if k < len(types) else ""
                        row[f"a{k + 1}"] = values[k] if k < len(types) else ""
                    row["a1a2"] = " ".join(values)
                    row["caption"] = compose_caption(prefix, values, subject, ea, ean)
                    rows.append(row)
    frame = pd.DataFrame(rows)
    frame["prefix_index"] = frame["prefix_index"].astype("int32")
    frame["member_index"] = frame["member_index"].astype("int32")
    frame["n_members"] = frame["n_members"].astype("int32")
    dup = frame["caption"].duplicated() & ~pd.Series(repeat, index=frame.index)   # a repeated entry repeats its captions
    if dup.any():
        first = frame.loc[dup, "caption"].iloc[0]
        raise ConfigError(f"{source + ': ' if source else ''}{SECTION}: the caption {first!r} is produced twice "
                          "(a prefix, value or subject makes two combinations read the same). Fix: make the "
                          "prefixes, attribute values and subjects distinct words")
    return frame


def counts_by_segment(frame: pd.DataFrame) -> pd.DataFrame:
    """Sets, captions and captions per set for each segment (in the order the segments appear)."""
    g = frame.groupby("segment", sort=False)
    out = pd.DataFrame({"sets": g["set_id"].nunique(), "captions": g.size(), "captions_per_set": g["n_members"].max()})
    return out.reset_index()


# ------------------------------------------------------------------------------------------ config + CLI


def _is_full_config(doc: dict) -> bool:
    return (JOB_KEY in doc or "studies" in doc or STUDY in doc or doc.get("study") == STUDY
            or is_config_layer(doc))   # an overlay of top-level keys (run_name: ...) layers like in every command


def load_section(paths: Iterable[str | Path]) -> tuple[dict, str]:
    """The caption section from ``paths``, and a description of where it came from.

    Either full configurations (with a ``social_counterfactuals:`` section; validated by
    :func:`counterfactory.config.load_config`) or plain YAML files holding the section's keys at top level
    (or under ``captions:``), or both: plain files then override the full configuration's section. Later
    files win."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ConfigError("no configuration file given. Fix: pass --config FILE (a full config with a "
                          f"'{STUDY}:' section, or a YAML file with the keys {', '.join(SECTION_KEYS)})")
    docs = [(p, read_yaml(p)) for p in paths]
    full = [p for p, d in docs if _is_full_config(d)]
    plain: dict = {}
    for p, d in docs:
        if p in full:
            continue
        if set(d) == {"captions"} and isinstance(d["captions"], dict):
            d = d["captions"]
        unknown = sorted(set(d) - set(SECTION_KEYS))
        if unknown:
            raise ConfigError(f"{p}: unknown top-level key(s) {', '.join(unknown)} for a caption-list file. "
                              f"Fix: use only {', '.join(SECTION_KEYS)}, or pass a full config holding a "
                              f"'{STUDY}:' section")
        plain = deep_merge(plain, d)
    source = ", ".join(str(p) for p in paths)
    if not full:
        return plain, source
    try:
        view = config.load_config(full, overrides={"captions": plain} if plain else None, study=STUDY)
    except KeyError as exc:
        raise ConfigError(f"{source}: the configuration schema has no '{STUDY}' section ({exc}). Fix: use a "
                          "version of counterfactory whose schema knows the study, or pass a plain YAML file "
                          f"with the keys {', '.join(SECTION_KEYS)}") from exc
    section = view.get("captions") or {}
    return dict(section), source


def run(config_paths: Iterable[str | Path], out: str | Path) -> pd.DataFrame:
    """Build the caption sets from the config files, write them to ``out`` (parquet), return the counts."""
    section, source = load_section(config_paths)
    frame = build_caption_sets(section, source=source)
    write_parquet(out, frame)
    return counts_by_segment(frame)
