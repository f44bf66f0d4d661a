"""Noun-phrase chunks, class <-> word matching and caption synthesis for the spurious-correlation retrieval study
(Kim et al., "Exposing and Mitigating Spurious Correlations for Cross-Modal Retrieval": §3.2, §3.3, §4.1,
Appendix A / Table 4).

What the paper does
-------------------
A caption is seen as a set of noun phrases (NLTK chunks). A noun phrase *matches* a class when it contains a word
related to that class; for MS-COCO the related words are a hand-made table (Appendix A, Table 4, packaged as
``resources/odmap/coco_class_words.yaml``); for Flickr30k the (phrase, class) pairs are annotated by Flickr30k
Entities. The same relation is used twice:

* **caption synthesis** (§3.3, default text synthesis of Table 3): every noun phrase that matches a removed class is
  deleted from the original caption ("Two dogs fighting over a frisbee" minus *frisbee* -> "Two dogs fighting
  over"). The paper says the result may be ungrammatical, and :func:`remove_phrases` does not repair grammar: it
  only tidies whitespace and punctuation left dangling by the deletion;
* **ODmAP@k relevance** (§3.2): a retrieved caption is correct for a synthetic query when none of its noun phrases
  matches a removed class and at least one matches a class still present (:func:`mention_matrix`,
  :func:`odmap_relevance`).

Table 3's other text-synthesis alternatives are the prompt template (:func:`prompt_caption`) and a captioning model
(ClipCap; not here: it is a model role, not text processing).

Chunk grammar
-------------
Captions are tokenised and POS-tagged by a *tagger* (default: NLTK ``word_tokenize`` + ``pos_tag``, the same
callable the caption stage uses, :func:`counterfactory.text.captions.nltk_tagger`; the project never downloads NLTK
data at run time, see :mod:`counterfactory.data.nltk_data`) and chunked by ``nltk.RegexpParser`` with
:data:`CHUNK_GRAMMAR`, two rules applied in order (the second only to tokens the first left unchunked)::

    NP: {<PDT>?<DT|PRP\\$|WP\\$|POS|CD>+<RB.*|JJ.*|VBN|VBG|CD>*<NN.*>+}
        {<JJ.*|CD>*<NN.*>+}

1. a *determined* phrase: an optional predeterminer (*all*, *both*), one or more determiners, possessives
   (*his*, *'s*) or numbers (*two*), then modifiers -- adverbs, adjectives, participles (*a sleeping cat*, *a parked
   car*), numbers -- then one or more nouns (noun compounds such as *a fire hydrant*, *a traffic light*);
2. a *bare* phrase: adjectives or numbers, then one or more nouns (*hot dogs*, *skis*, *Two dogs*).

Participles are modifiers only after a determiner, so a verb is not swallowed by a bare noun after it (in "a man
holding umbrellas", *holding* stays outside the chunk *umbrellas*); modifiers come before the nouns, so "Three
people eating hot dogs" gives *Three people* and *hot dogs*. A possessive *'s* opens the next phrase ("a man's
hat" -> *a man*, *'s hat*), so removing the owner does not remove what is owned. Coordinations give one phrase per
conjunct ("a man and a horse" -> *a man*, *a horse*), so a caption can match two classes through two phrases, and
one phrase can match two classes when it holds words of both.

Matching rule
-------------
A phrase matches a class when one of the class's words (or multi-word entries such as *traffic light*, *hot dog*,
*cell phone*, *teddy bear*) occurs in it as whole words: the phrase is split into lower-case alphanumeric words
(hyphens and apostrophes separate words, so "hot-dog" is *hot dog* and "category" is never *cat*), and an entry
matches a run of consecutive words. Each entry also matches its plural (:func:`inflections`: rule-based, with the
irregular plurals of :data:`IRREGULAR_PLURALS` such as people/person, men/man, children/child, mice/mouse,
knives/knife, oxen/ox, and unchanged plurals such as sheep); for a multi-word entry the last word is inflected
("hot dogs"). WordNet is not used (its data is not part of the offline NLTK folder).

Two refinements of the paper's "contains a word" rule, both documented choices:

* **longest match wins** (:class:`ClassMatcher`, ``longest_match=True``): where a longer entry covers words of a
  shorter one, only the longer entry counts, so "a hot dog" matches *hot dog* but not *dog*, and "a wine glass"
  matches *wine glass* but not *cup* (whose word "glass" is inside it). With ``longest_match=False`` every entry
  that occurs counts (the paper's literal rule).
* ``head_only=True`` (not the default) keeps only entries that end on the phrase's last word (its head noun), so
  "a baby elephant" matches *elephant* but not *person* (via "baby"). The default follows the paper: any word of
  the phrase counts (Table 4 relies on this: "traffic", "motor", "wine" are modifiers).

The class name itself always matches its class (the paper omits it from Table 4 "for brevity"); the loader adds it.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, CounterFactoryError, input_error

#: the 80 MS-COCO detection categories, in category-id order (names as in the COCO annotation files)
COCO_CATEGORIES: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors", "teddy bear",
    "hair drier", "toothbrush",
)

#: the chunk grammar (module docstring): determined phrases first, then bare adjective/number + noun phrases
CHUNK_GRAMMAR = r"""
NP: {<PDT>?<DT|PRP\$|WP\$|POS|CD>+<RB.*|JJ.*|VBN|VBG|CD>*<NN.*>+}
    {<JJ.*|CD>*<NN.*>+}
"""

#: singular -> irregular plural(s); the regular rules of :func:`plurals` do not apply to these
IRREGULAR_PLURALS: dict[str, tuple[str, ...]] = {
    "person": ("people", "persons"), "man": ("men",), "woman": ("women",), "child": ("children",),
    "mouse": ("mice",), "knife": ("knives",), "wife": ("wives",), "life": ("lives",), "leaf": ("leaves",),
    "calf": ("calves",), "half": ("halves",), "loaf": ("loaves",), "shelf": ("shelves",), "wolf": ("wolves",),
    "scarf": ("scarves", "scarfs"), "thief": ("thieves",), "foot": ("feet",), "tooth": ("teeth",),
    "goose": ("geese",), "ox": ("oxen",), "louse": ("lice",), "cactus": ("cacti", "cactuses"),
}
#: nouns whose plural is the singular (or that are already plural / uncountable)
UNCHANGED_PLURALS = frozenset({"sheep", "deer", "fish", "moose", "bison", "salmon", "aircraft", "police", "cattle",
                               "people", "series", "species", "luggage", "broccoli", "offspring"})
_MAN_EXCEPTIONS = frozenset({"human", "german", "shaman", "caiman", "talisman", "ottoman"})
_SINGULAR_OF = {p: s for s, ps in IRREGULAR_PLURALS.items() for p in ps}

#: class names that take no indefinite article in a prompt (plural-only nouns)
NO_ARTICLE = frozenset({"skis", "scissors"})
#: words that begin with a vowel letter but a consonant sound ("a ..."), or with a silent h ("an ...")
_A_BEFORE = ("one", "once", "uni", "use", "usu", "uten", "euro", "eu", "ukulele", "ufo")
_AN_BEFORE = ("hour", "honest", "honou", "heir")

DEFAULT_TABLE = "coco_class_words.yaml"
TABLE_FIX = ("write the table as `<class>: [word, ...]` with each of the 80 COCO classes once and at least one "
             "word each, as in counterfactory/resources/odmap/coco_class_words.yaml")

_WORD = re.compile(r"[^\W_]+")

Tagger = Callable[[str], list]


# --------------------------------------------------------------------------------------------
# the matching table


def default_table_path() -> Path:
    """The packaged COCO table (appendix Table 4 of the paper)."""
    return Path(str(resources.files("counterfactory").joinpath("resources", "odmap", DEFAULT_TABLE)))


@functools.lru_cache(maxsize=1)
def _unique_key_loader():
    """A ``yaml.SafeLoader`` subclass that refuses repeated mapping keys (PyYAML keeps the last one silently)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1, seen[key])
            seen[key] = key_node.start_mark.line + 1
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return Loader


class _DuplicateKey(Exception):
    def __init__(self, key, line: int, first_line: int):
        super().__init__(key)
        self.key, self.line, self.first_line = key, line, first_line


def _norm(word: str) -> str:
    return " ".join(word.lower().split())


def load_matching_table(path: str | Path | None = None, categories: Sequence[str] | None = None
                        ) -> dict[str, list[str]]:
    """Read a class -> words table (default: the packaged COCO table, Table 4 of the paper).

    Each value is the list of words or phrases that make a noun phrase match the class; the class name itself is
    put first when the file does not list it (the paper leaves it out "for brevity"). Words are kept as written
    (stripped, inner whitespace collapsed); matching is case-insensitive.

    With ``categories`` (e.g. :data:`COCO_CATEGORIES`) every class of the file must be one of them and each of them
    must have an entry. Problems -- a file that is missing or not a YAML mapping, a repeated class, a class with no
    words, a word that is not text, a word listed twice for one class, an unknown or missing class -- raise
    :class:`~counterfactory.errors.InputError` naming the file, the class and the fix.
    """
    import yaml

    path = Path(path) if path is not None else default_table_path()
    if not path.is_file():
        raise input_error(path, None, "class-word matching table not found",
                          "point the config at an existing YAML file or leave it unset for the packaged COCO table")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_unique_key_loader())  # noqa: S506 (safe)
    except _DuplicateKey as exc:
        raise input_error(path, f"class {exc.key!r}", f"listed twice (lines {exc.first_line} and {exc.line})",
                          "merge the two word lists into one entry") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise input_error(path, None, f"not valid YAML ({exc})", TABLE_FIX) from None
    if not isinstance(data, dict) or not data:
        raise input_error(path, None, f"expected a mapping of class -> word list, got {type(data).__name__}",
                          TABLE_FIX)
    known = None if categories is None else {str(c): i for i, c in enumerate(categories)}
    table: dict[str, list[str]] = {}
    for cls, words in data.items():
        record = f"class {cls!r}"
        if not isinstance(cls, str) or not cls.strip():
            raise input_error(path, record, "class names must be non-empty text", TABLE_FIX)
        name = " ".join(cls.split())
        if known is not None and name not in known:
            raise input_error(path, record, "not one of the dataset's categories",
                              f"use a category name exactly as the dataset spells it (e.g. {', '.join(list(known)[:4])}"
                              " ...) or remove the entry")
        if isinstance(words, str):
            words = [words]
        if not isinstance(words, list) or not words:
            raise input_error(path, record, "has no words", f"list at least one word, e.g. `{name}: [{name}]`")
        cleaned: list[str] = []
        seen: set[str] = set()
        for word in words:
            if not isinstance(word, str) or not _WORD.search(word):
                raise input_error(path, record, f"word {word!r} is not text with at least one letter or digit",
                                  "write each word or phrase as plain text")
            key = _norm(word)
            if key in seen:
                raise input_error(path, record, f"word {word!r} is listed twice", "list each word once per class")
            seen.add(key)
            cleaned.append(" ".join(word.split()))
        if _norm(name) not in seen:
            cleaned.insert(0, name)
        table[name] = cleaned
    if known is not None:
        missing = [c for c in known if c not in table]
        if missing:
            noun = "category" if len(missing) == 1 else "categories"
            raise input_error(path, f"class {missing[0]!r}", f"{len(missing)} {noun} without an entry"
                              f" ({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''})",
                              "add an entry for each (at least the class name)")
    return table


# --------------------------------------------------------------------------------------------
# plurals


def plurals(word: str) -> tuple[str, ...]:
    """Plural forms of a lower-case singular noun (rule-based; documented in the module docstring).

    Irregular nouns use :data:`IRREGULAR_PLURALS` (and compounds in *-man* -> *-men*); :data:`UNCHANGED_PLURALS`
    keep their form; otherwise: *-s/-x/-z/-ch/-sh* -> *+es* (and *+ses* after *-s*: busses); consonant + *y* ->
    *-ies*; *-o* -> *+s* and *+es*; else *+s*.
    """
    if word in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[word]
    if word in UNCHANGED_PLURALS:
        return (word,)
    if word.endswith("man") and word not in _MAN_EXCEPTIONS:
        return (word[:-3] + "men",)
    if word.endswith("ss"):
        return (word + "es",)
    if word.endswith("s"):
        return (word + "es", word + "ses")
    if word.endswith(("x", "z", "ch", "sh")):
        return (word + "es",)
    if len(word) > 1 and word.endswith("y") and word[-2] not in "aeiou":
        return (word[:-1] + "ies",)
    if word.endswith("o"):
        return (word + "s", word + "es")
    return (word + "s",)


def inflections(word: str) -> frozenset[str]:
    """The word (lower-cased) and its plurals; for a known irregular plural (men, people, oxen...) the word and its
    singular instead."""
    word = word.lower()
    if word in _SINGULAR_OF:
        return frozenset({word, _SINGULAR_OF[word]})
    return frozenset({word, *plurals(word)})


def words_of(text: str) -> list[str]:
    """Lower-case alphanumeric words of ``text`` (hyphens, apostrophes and punctuation separate words)."""
    return _WORD.findall(text.lower())


# --------------------------------------------------------------------------------------------
# noun phrases


@dataclass(frozen=True)
class Span:
    """One noun phrase of a caption: token indices ``[start, end)``, character offsets ``[char_start, char_end)``
    into the caption, its text as written in the caption, its tokens and their POS tags."""

    start: int
    end: int
    char_start: int
    char_end: int
    text: str
    words: tuple[str, ...]
    tags: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def chunk_parser():
    """The ``nltk.RegexpParser`` built from :data:`CHUNK_GRAMMAR` (built once)."""
    import nltk

    return nltk.RegexpParser(CHUNK_GRAMMAR)


def default_tagger(text: str) -> list[tuple[str, str]]:
    """NLTK ``word_tokenize`` + ``pos_tag`` (the caption stage's tagger); NLTK data must be in place (nltk_data)."""
    from .captions import nltk_tagger

    return nltk_tagger(text)


def _tag(caption: str, tagger: Tagger | None) -> tuple[str, list[tuple[str, str]], list[tuple[int, int]]]:
    """``(text, tagged tokens, character span of each token)``. When the tokens cannot be aligned to the caption
    (a tokenizer that rewrites text), the text becomes the tokens joined by single spaces."""
    from .captions import token_spans

    tagged = [(str(w), str(t)) for w, t in (tagger or default_tagger)(caption)]
    spans = token_spans(caption, [w for w, _ in tagged])
    if spans is None:
        words = ['"' if w in ("``", "''") else w for w, _ in tagged]
        caption = " ".join(words)
        spans, pos = [], 0
        for w in words:
            spans.append((pos, pos + len(w)))
            pos += len(w) + 1
    return caption, tagged, spans


def _chunks(tagged: Sequence[tuple[str, str]]) -> list[tuple[int, int]]:
    """Token ranges ``[start, end)`` of the NP chunks of a tagged sentence."""
    if not tagged:
        return []
    out, i = [], 0
    for node in chunk_parser().parse(list(tagged)):
        if hasattr(node, "label"):
            n = len(node.leaves())
            if node.label() == "NP":
                out.append((i, i + n))
            i += n
        else:
            i += 1
    return out


def _spans(caption: str, tagged, char_spans) -> list[Span]:
    return [Span(s, e, char_spans[s][0], char_spans[e - 1][1], caption[char_spans[s][0]:char_spans[e - 1][1]],
                 tuple(w for w, _ in tagged[s:e]), tuple(t for _, t in tagged[s:e]))
            for s, e in _chunks(tagged)]


def _usable(caption) -> bool:
    return isinstance(caption, str) and bool(caption.strip())


def noun_phrases(caption: str, tagger: Tagger | None = None) -> list[Span]:
    """The noun phrases of ``caption`` (chunked with :data:`CHUNK_GRAMMAR`), in order.

    ``tagger`` maps a text to ``[(token, POS tag), ...]``; default NLTK ``word_tokenize`` + ``pos_tag``.
    A missing, non-text or blank caption has no phrases.
    """
    if not _usable(caption):
        return []
    text, tagged, char_spans = _tag(caption, tagger)
    return _spans(text, tagged, char_spans)


# --------------------------------------------------------------------------------------------
# matching


def _phrase_words(phrase) -> list[str]:
    if isinstance(phrase, Span):
        return [w for tok in phrase.words for w in words_of(tok)]
    if isinstance(phrase, str):
        return words_of(phrase)
    return [w for tok in phrase for w in words_of(str(tok))]


class ClassMatcher:
    """A class -> words table compiled for matching (module docstring: *Matching rule*).

    ``classes`` limits (and orders) the classes considered; default: every class of the table. Every inflection
    of every entry is indexed as a tuple of words, so matching a phrase costs one dictionary look-up per word and
    entry length.
    """

    def __init__(self, table: Mapping[str, Sequence[str]], classes: Sequence[str] | None = None, *,
                 longest_match: bool = True, head_only: bool = False):
        self.table = {str(c): list(ws) for c, ws in table.items()}
        self.classes = tuple(self.table) if classes is None else tuple(classes)
        unknown = [c for c in self.classes if c not in self.table]
        if unknown:
            raise ConfigError(f"class(es) {', '.join(map(repr, unknown))} are not in the matching table "
                              f"({len(self.table)} classes). Fix: use the table's class names or add entries to it")
        self.longest_match, self.head_only = longest_match, head_only
        self.index: dict[tuple[str, ...], frozenset[str]] = {}
        build: dict[tuple[str, ...], set[str]] = {}
        for cls in self.classes:
            for entry in self.table[cls]:
                toks = words_of(entry)
                if not toks:
                    continue
                for form in inflections(toks[-1]):
                    build.setdefault(tuple(toks[:-1]) + (form,), set()).add(cls)
        self.index = {k: frozenset(v) for k, v in build.items()}
        self.max_len = max((len(k) for k in self.index), default=0)
        self.position = {c: i for i, c in enumerate(self.classes)}

    def phrase_classes(self, phrase: Span | str | Sequence[str]) -> set[str]:
        """Classes matched by one noun phrase (a :class:`Span`, a text, or a sequence of tokens)."""
        words = _phrase_words(phrase)
        found: set[str] = set()
        n, i = len(words), 0
        while i < n:
            step = 1
            for length in range(min(self.max_len, n - i), 0, -1):
                hit = self.index.get(tuple(words[i:i + length]))
                if hit is None:
                    continue
                if not self.head_only or i + length == n:
                    found |= hit
                if self.longest_match:
                    step = length
                    break
            i += step
        return found

    def matches(self, phrase: Span | str | Sequence[str], cls: str) -> bool:
        """Whether ``phrase`` matches class ``cls`` under this table (longer entries of other classes shadow)."""
        return cls in self.phrase_classes(phrase)


@functools.lru_cache(maxsize=4096)
def _single_class_matcher(words: tuple[str, ...], head_only: bool) -> ClassMatcher:
    return ClassMatcher({"_": words}, longest_match=True, head_only=head_only)


def matches(phrase: Span | str | Sequence[str], class_words: Sequence[str], *, head_only: bool = False) -> bool:
    """Whether a noun phrase matches a class given the class's words (e.g. ``table["dog"]``).

    Case-insensitive, whole words only, singular or plural (module docstring). Only this class's words are
    considered: "a hot dog" matches ``table["dog"]`` here, whereas :class:`ClassMatcher` (used by
    :func:`mentions` and :func:`remove_phrases`) lets the longer *hot dog* entry shadow it.
    """
    if isinstance(class_words, str):
        class_words = [class_words]
    return bool(_single_class_matcher(tuple(class_words), head_only).phrase_classes(phrase))


_MATCHER_CACHE: dict = {}


def _matcher(table, classes=None) -> ClassMatcher:
    """A :class:`ClassMatcher` for ``table`` (returned as is when it already is one); dict tables are compiled once
    per content and cached, so per-caption calls stay cheap."""
    if isinstance(table, ClassMatcher):
        return table
    key = (tuple((c, tuple(ws)) for c, ws in table.items()), None if classes is None else tuple(classes))
    matcher = _MATCHER_CACHE.get(key)
    if matcher is None:
        if len(_MATCHER_CACHE) > 32:
            _MATCHER_CACHE.clear()
        matcher = _MATCHER_CACHE[key] = ClassMatcher(table, classes)
    return matcher


def _as_list(classes) -> list[str]:
    return [classes] if isinstance(classes, str) else list(classes)


def mentions(caption: str, classes: Sequence[str] | None, table, tagger: Tagger | None = None) -> set[str]:
    """The classes among ``classes`` (default: all of the table's) that some noun phrase of ``caption`` matches.

    ``table`` is a class -> words mapping (:func:`load_matching_table`) or a :class:`ClassMatcher`.
    """
    matcher = _matcher(table)
    wanted = set(matcher.classes if classes is None else _as_list(classes))
    _check_classes(wanted, matcher)
    found: set[str] = set()
    for span in noun_phrases(caption, tagger):
        found |= matcher.phrase_classes(span)
    return found & wanted


def _check_classes(classes: Iterable[str], matcher: ClassMatcher) -> None:
    unknown = sorted(set(classes) - set(matcher.classes))
    if unknown:
        raise ConfigError(f"class(es) {', '.join(map(repr, unknown))} are not in the matching table. Fix: use the "
                          "table's class names (COCO spelling, e.g. 'sports ball', 'tv') or add entries to the table")


def mention_matrix(captions: Sequence[str], classes: Sequence[str] | None, table, tagger: Tagger | None = None
                   ) -> np.ndarray:
    """Boolean matrix ``[n_captions, n_classes]``: entry (i, j) is true when caption i mentions ``classes[j]``
    (default: all of the table's classes, in table order).

    Each distinct caption is tagged and chunked once (repeated captions share the row), and each phrase is matched
    against the compiled table by dictionary look-ups, so a gallery of ~600k captions costs one tagger call per
    distinct caption. Missing or blank captions mention nothing.
    """
    matcher = _matcher(table)
    cols = list(matcher.classes if classes is None else _as_list(classes))
    _check_classes(cols, matcher)
    column = {c: j for j, c in enumerate(cols)}
    out = np.zeros((len(captions), len(cols)), dtype=bool)
    rows: dict[str, list[int]] = {}
    for i, caption in enumerate(captions):
        if _usable(caption):
            rows.setdefault(caption, []).append(i)
    for caption, idx in rows.items():
        found: set[str] = set()
        for span in noun_phrases(caption, tagger):
            found |= matcher.phrase_classes(span)
        hit = [column[c] for c in found if c in column]
        if hit:
            out[np.ix_(idx, hit)] = True
    return out


def odmap_relevance(matrix: np.ndarray, removed: Sequence[int], present: Sequence[int]) -> np.ndarray:
    """ODmAP@k correctness of every gallery caption for one query (§3.2): true where the caption mentions none of
    the ``removed`` class columns and at least one of the ``present`` class columns of ``matrix``
    (:func:`mention_matrix`)."""
    matrix = np.asarray(matrix, dtype=bool)
    removed_hit = matrix[:, list(removed)].any(axis=1) if len(removed) else np.zeros(len(matrix), dtype=bool)
    present_hit = matrix[:, list(present)].any(axis=1) if len(present) else np.zeros(len(matrix), dtype=bool)
    return present_hit & ~removed_hit


# --------------------------------------------------------------------------------------------
# caption synthesis by noun-phrase removal


def tidy(text: str) -> str:
    """Whitespace and punctuation left by deleting words: runs of spaces collapsed, no space before ``, . ; : ! ?``,
    repeated separators merged (``, ,`` -> ``,``), a separator before a full stop dropped (``, .`` -> ``.``),
    empty brackets or quotes dropped, leading separators and a trailing comma/semicolon/colon removed."""
    t = " ".join(text.split())
    for _ in range(2):
        t = re.sub(r"\(\s*\)|\[\s*\]|\"\s*\"", " ", t)
        t = re.sub(r"\s+([,.;:!?])", r"\1", t)
        t = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", t)
        t = re.sub(r"[,;:]\s*([.!?])", r"\1", t)
        t = re.sub(r"^[\s,;:.!?]+", "", t)
        t = re.sub(r"[\s,;:]+$", "", t)
        t = " ".join(t.split())
    return t


_CONJUNCTIONS = frozenset({"and", "or", "but", "nor"})


def _with_separators(words: Sequence[str], tags: Sequence[str] | None, drop: set[int]) -> set[int]:
    """``drop`` plus the comma/semicolon each removed run leaves dangling: the one right after the run, or else
    the one right before it when the run ends the sentence or a list ("a dog, a cat and" -> "a dog and")."""
    drop = set(drop)
    n, i = len(words), 0
    while i < n:
        if i not in drop:
            i += 1
            continue
        j = i
        while j < n and j in drop:
            j += 1
        if j < n and words[j] in (",", ";"):
            drop.add(j)
        elif i > 0 and words[i - 1] in (",", ";") and (
                j == n or words[j] in (".", "!", "?", ":") or words[j].lower() in _CONJUNCTIONS
                or (tags is not None and tags[j] == "CC")):
            drop.add(i - 1)
        i = j
    return drop


def _finish(original: str, text: str) -> str:
    out = tidy(text)
    if out and original[:1].isupper() and out[:1].islower():
        out = out[0].upper() + out[1:]
    return out


def _remove_tokens(text: str, char_spans: Sequence[tuple[int, int]], drop: set[int]) -> str:
    """``text`` with the characters of the dropped tokens (and the text between consecutive dropped tokens)
    replaced by a space, then tidied."""
    pieces, pos, i, n = [], 0, 0, len(char_spans)
    while i < n:
        if i not in drop:
            i += 1
            continue
        j = i
        while j + 1 < n and j + 1 in drop:
            j += 1
        pieces.append(text[pos:char_spans[i][0]])
        pieces.append(" ")
        pos = char_spans[j][1]
        i = j + 1
    pieces.append(text[pos:])
    return _finish(text, "".join(pieces))


def remove_phrases(caption: str, classes: Sequence[str] | str, table, tagger: Tagger | None = None) -> str | None:
    """The caption without every noun phrase that matches one of ``classes`` (§3.3), or None when no phrase matches
    (the caller decides whether to skip the caption).

    A possessive *'s* right after a removed phrase goes with it, and so does the comma the removal would leave
    dangling (the one after the phrase, or else the one before it when the phrase ends the caption or a list:
    "A dog, a cat and a frisbee" minus *cat* -> "A dog and a frisbee"). Whitespace and dangling punctuation are tidied
    (:func:`tidy`) and a caption that began with a capital letter still does; grammar is **not** repaired -- the
    paper notes the synthetic caption may be ungrammatical ("Two dogs fighting over"). When every word is
    removed the result is the empty string.
    """
    classes = _as_list(classes)
    matcher = _matcher(table)
    _check_classes(classes, matcher)
    if not _usable(caption):
        return None
    wanted = set(classes)
    text, tagged, char_spans = _tag(caption, tagger)
    drop: set[int] = set()
    for span in _spans(text, tagged, char_spans):
        if matcher.phrase_classes(span) & wanted:
            drop.update(range(span.start, span.end))
            if span.end < len(tagged) and tagged[span.end][1] == "POS":
                drop.add(span.end)
    if not drop:
        return None
    drop = _with_separators([w for w, _ in tagged], [t for _, t in tagged], drop)
    return _remove_tokens(text, char_spans, drop)


# --------------------------------------------------------------------------------------------
# prompt-template alternative (Table 3, "prompts")


def indefinite_article(noun: str) -> str:
    """``"a"`` or ``"an"`` for ``noun`` by its first letters (vowel letter -> "an", with the usual exceptions:
    "a unicycle", "a one-way sign", "an hour")."""
    w = noun.strip().lower()
    if w.startswith(_AN_BEFORE):
        return "an"
    if w.startswith(_A_BEFORE):
        return "a"
    return "an" if w[:1] in ("a", "e", "i", "o", "u") else "a"


def with_article(name: str) -> str:
    """``"a dog"``, ``"an umbrella"``; plural-only names (:data:`NO_ARTICLE`: skis, scissors) stay bare."""
    name = " ".join(name.replace("_", " ").split())
    if name.lower() in NO_ARTICLE:
        return name
    return f"{indefinite_article(name)} {name}"


def join_objects(names: Sequence[str], article: bool = True) -> str:
    """``"a dog"``, ``"a dog and a frisbee"``, ``"a dog, a cat and a frisbee"`` (no serial comma)."""
    items = [with_article(n) if article else " ".join(n.replace("_", " ").split()) for n in names]
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def prompt_caption(present_classes: Sequence[str], template: str | Sequence[str] = "a photo of {objects}.", *,
                   article: bool = True, rng: random.Random | None = None) -> str:
    """A caption for a synthetic image from a prompt template (the "prompts" text synthesis of §3.3 / Table 3).

    ``{objects}`` in the template is replaced by the present classes, in the given order without repeats, each
    with its indefinite article (``article=False`` gives the paper's bare example "A photo of person and dog") and
    joined as ``"a dog, a cat and a frisbee"``. The paper draws one of 80 templates at random per caption: pass a
    list of templates and a ``random.Random`` (without ``rng`` the first template is used).
    """
    names = list(dict.fromkeys(_as_list(present_classes)))
    if not names:
        raise CounterFactoryError("prompt_caption needs at least one present class. Fix: skip images with no class "
                                  "left after removal")
    templates = [template] if isinstance(template, str) else list(template)
    if not templates or any("{objects}" not in t for t in templates):
        raise ConfigError(f"prompt template(s) {templates!r} must each contain {{objects}}. Fix: write e.g. "
                          "'a photo of {objects}.'")
    chosen = rng.choice(templates) if rng is not None else templates[0]
    return chosen.replace("{objects}", join_objects(names, article=article))


# --------------------------------------------------------------------------------------------
# Flickr30k: annotated phrase types instead of chunking


def _flickr_types() -> tuple[str, ...]:
    from ..data.flickr30k_entities import TYPES

    return tuple(t for t in TYPES if t != "notvisual")


def _phrase_types(phrase: Any) -> tuple[str, ...]:
    if hasattr(phrase, "types"):
        return tuple(phrase.types)
    if isinstance(phrase, Mapping):
        return tuple(phrase.get("types") or ())
    if isinstance(phrase, str):
        return (phrase,)
    return tuple(phrase)


def _check_flickr_classes(classes) -> list[str]:
    classes = _as_list(classes)
    allowed = _flickr_types()
    unknown = [c for c in classes if c not in allowed]
    if unknown:
        raise ConfigError(f"Flickr30k class(es) {', '.join(map(repr, unknown))} are not Flickr30k Entities phrase "
                          f"types. Fix: use some of {', '.join(allowed)}")
    return classes


def flickr_mentions(sentence_phrases: Iterable[Any], classes: Sequence[str] | str) -> set[str]:
    """The classes (Flickr30k Entities phrase types: people, animals, clothing, bodyparts, vehicles, instruments,
    scene, other) named by the annotated phrases of one sentence.

    ``sentence_phrases`` are :class:`~counterfactory.data.flickr30k_entities.Phrase` objects of *one* sentence (or
    mappings with ``types``, or the type tuples themselves). A phrase with several types counts for each.
    """
    wanted = set(_check_flickr_classes(classes))
    found: set[str] = set()
    for phrase in sentence_phrases:
        found.update(_phrase_types(phrase))
    return found & wanted


def flickr_remove_phrases(sentence: str, sentence_phrases: Iterable[Any], classes: Sequence[str] | str
                          ) -> str | None:
    """The Flickr30k caption without its annotated phrases of the removed ``classes`` (phrase types), or None when
    none has such a type.

    ``sentence`` is the plain caption as the reader gives it (words separated by single spaces) and each phrase a
    :class:`~counterfactory.data.flickr30k_entities.Phrase` of that sentence (its ``first_word_index`` and ``text``
    locate the words). Tidied as :func:`remove_phrases`; grammar is not repaired.
    """
    wanted = set(_check_flickr_classes(classes))
    words = sentence.split()
    drop: set[int] = set()
    for phrase in sentence_phrases:
        if not set(_phrase_types(phrase)) & wanted:
            continue
        first, n = int(phrase.first_word_index), len(str(phrase.text).split())
        if words[first:first + n] != str(phrase.text).split():
            raise input_error("Flickr30k sentence", repr(sentence[:60]),
                              f"phrase {phrase.text!r} is not at word {first}",
                              "pass the phrases parsed from this very sentence (flickr30k_entities.read_sentences)")
        drop.update(range(first, first + n))
    if not drop:
        return None
    drop = _with_separators(words, None, drop)
    return _finish(sentence, " ".join(w for i, w in enumerate(words) if i not in drop))


__all__ = [
    "COCO_CATEGORIES", "CHUNK_GRAMMAR", "IRREGULAR_PLURALS", "UNCHANGED_PLURALS", "Span", "ClassMatcher",
    "load_matching_table", "default_table_path", "plurals", "inflections", "words_of", "noun_phrases",
    "chunk_parser", "matches", "mentions", "mention_matrix", "odmap_relevance", "remove_phrases", "tidy",
    "indefinite_article", "with_article", "join_objects", "prompt_caption", "flickr_mentions",
    "flickr_remove_phrases",
]
