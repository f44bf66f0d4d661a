"""CVLD text intervention: flip the gender of a caption, write the image-edit prompt, vote per image.

CVLD (§3.2-3.3, app. B, §5.1 "Intervention") makes counterfactual image-text pairs in three steps: *text
intervention* (the caption with the protected attribute, gender, flipped), *prompt generation* (an
instruction for InstructPix2Pix such as "turn the boy into a girl", written from the caption before and
after) and image editing. GPT-3.5 did the first two on COCO; an image is kept only when a majority of its
captions agree on the edit prompt (3 of 5, app. B).

Two ways are offered here:

* **Rules** (:func:`swap_gender`, :func:`edit_prompt`, :func:`swap_table`): every gendered word of the list
  ``resources/cvld/gender_words.yaml`` is replaced by its counterpart, one word at a time, so "a boy and a
  girl" becomes "a girl and a boy" -- the "a boy and a boy" failure §3.2 names for naive rules cannot happen.
  Capitalisation, punctuation and spacing are kept exactly. "her" becomes "his" as a possessive determiner
  (PRP$) and "him" as an object pronoun (PRP), told apart by ``nltk.pos_tag`` (NLTK data must be in place,
  see :mod:`counterfactory.data.nltk_data`; the tagger is only called for captions holding such a word).
* **The ``llm`` role** (:func:`llm_requests`, :func:`parse_llm_answers`, :func:`run_llm`): the two tasks
  ``cvld_intervene`` and ``cvld_edit_prompt`` with app. B's instructions in our words
  (``resources/prompts/cvld_*.txt``), answered by :func:`counterfactory.text.llm.run_requests`. App. B's
  intervention template only names the female -> male direction; like §3.2 and the edit-prompt examples
  (which go both ways), ours asks for both.

:func:`majority_vote` then keeps one edit prompt per image.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable, Sequence

import pandas as pd
import yaml

from ..errors import ConfigError, input_error
from ..io import write_parquet
from . import llm

log = logging.getLogger(__name__)

NO_CHANGE = "no change"
#: app. B's edit prompts for a caption that names only pronouns / adjectives
FALLBACK = {"male": "turn the man into a woman", "female": "turn the woman into a man"}
INTERVENE_TASK, EDIT_TASK = "cvld_intervene", "cvld_edit_prompt"
#: answer length bounds of the llm tasks: the intervened caption may grow by this many characters (each
#: swap adds at most 5, "grandson" -> "granddaughter"); an edit prompt is at most this long
EXTRA_CHARS, MAX_PROMPT_CHARS = 40, 120
#: tags after "her"/"his" that cannot begin the possessed noun phrase: the word is then the object pronoun
NOT_NP_START = frozenset({"DT", "PDT", "IN", "TO", "CC", "PRP", "PRP$", "WDT", "WP", "WP$", "WRB", "RP", "MD",
                          "EX", "POS"})
_LETTERS = r"[^\W\d_]"
#: a clitic after a word ("'s", "'re", ...), a word (letters joined by hyphens) or any other non-space character
_TOKEN = re.compile(rf"(?<={_LETTERS})['’](?:s|re|ll|ve|d|m|t)(?!{_LETTERS})|{_LETTERS}+(?:-{_LETTERS}+)*|\S",
                    re.IGNORECASE)

Tagger = Callable[[list[str]], Sequence[tuple[str, str]]]


# --------------------------------------------------------------------------- the word list


@dataclass(frozen=True)
class GenderWords:
    """The loaded word list: counterparts, part-of-speech choices, genders, person nouns and plurals."""

    swap: dict[str, str]                  # word -> counterpart (whatever its POS)
    by_pos: dict[str, dict[str, str]]     # word -> {tag or "default": counterpart}
    gender: dict[str, str]                # word -> "male" | "female"
    nouns: frozenset[str]                 # person nouns (named in edit prompts)
    plurals: frozenset[str] = field(default_factory=frozenset)
    object_followers: frozenset[str] = field(default_factory=frozenset)  # words that end a "her" object


def _pairs(rows, where: str, sizes: tuple[int, ...]) -> list[list[str]]:
    out = []
    for row in rows or []:
        if not isinstance(row, list) or len(row) not in sizes or not all(isinstance(w, str) and w for w in row):
            raise ConfigError(f"{where}: entry {row!r} must be a list of {' or '.join(map(str, sizes))} words. "
                              "Fix: see the layout described at the top of the file")
        out.append([w.lower() for w in row])
    return out


@functools.lru_cache(maxsize=8)
def _load(path: str) -> GenderWords:
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: gender word list cannot be read ({exc}). Fix: check the file") from exc
    swap, gender, by_pos, nouns, plurals = {}, {}, {}, set(), set()

    def add(word: str, target: str, sex: str) -> None:
        if word in swap or word in by_pos:
            raise ConfigError(f"{path}: {word!r} is listed twice. Fix: keep one entry per word")
        swap[word], gender[word] = target, sex

    for group in doc.get("groups") or []:
        kind = group.get("kind")
        for row in _pairs(group.get("pairs"), f"{path}: group {kind}", (4,) if kind == "noun" else (2,)):
            for male, female in zip(row[0::2], row[1::2]):
                add(male, female, "male")
                add(female, male, "female")
            if kind == "noun":
                nouns.update(row)
                plurals.update(row[2:])
    for row in _pairs(doc.get("one_way"), f"{path}: one_way", (2, 4)):
        for source, target in zip(row[0::2], row[1::2]):
            if target not in gender:
                raise ConfigError(f"{path}: one_way target {target!r} is not in any group. Fix: list it in groups")
            add(source, target, "female" if gender[target] == "male" else "male")
        if len(row) == 4:
            nouns.update(row)
            plurals.update(row[2:])
    for word, spec in (doc.get("by_pos") or {}).items():
        if not isinstance(spec, dict) or spec.get("gender") not in ("male", "female") or "default" not in spec:
            raise ConfigError(f"{path}: by_pos.{word} needs gender (male/female) and default. Fix: e.g. "
                              "her: {gender: female, PRP$: his, PRP: him, default: his}")
        word = str(word).lower()
        if word in swap:
            raise ConfigError(f"{path}: {word!r} is listed twice. Fix: keep one entry per word")
        gender[word] = spec["gender"]
        by_pos[word] = {str(k): str(v).lower() for k, v in spec.items() if k != "gender"}
    followers = frozenset(str(w).lower() for w in doc.get("object_followers") or [])
    return GenderWords(swap, by_pos, gender, frozenset(nouns), frozenset(plurals), followers)


def default_words_path() -> Path:
    """The package's curated list ``resources/cvld/gender_words.yaml``."""
    return Path(str(resources.files("counterfactory").joinpath("resources", "cvld", "gender_words.yaml")))


def load_words(words: GenderWords | str | Path | None = None) -> GenderWords:
    """The word list: ``None`` -> the package list; a path -> that YAML (both cached); a loaded list as is."""
    if isinstance(words, GenderWords):
        return words
    return _load(str(Path(words or default_words_path()).absolute()))


# --------------------------------------------------------------------------- swapping


@dataclass
class Swap:
    """One caption's intervention: the new text, whether it changed and the (source, target) words in order."""

    intervened: str
    changed: bool
    edits: list[tuple[str, str]]


def nltk_tagger(tokens: list[str]) -> list[tuple[str, str]]:
    """``nltk.pos_tag`` on the caption's tokens (lower-cased by the caller)."""
    import nltk

    return nltk.pos_tag(tokens)


def _match_case(source: str, target: str) -> str:
    if len(source) > 1 and source.isupper():
        return target.upper()
    if source[:1].isupper():
        return target[:1].upper() + target[1:]
    return target


def _pos_target(lex: GenderWords, word: str, i: int, tokens: list[str], tags: list[str] | None) -> str:
    """The counterpart of a ``by_pos`` word: PRP when the tagger says so or when nothing follows that the
    word could own (see :func:`_owns_nothing`), else PRP$."""
    choices = lex.by_pos[word]
    if tags is None:
        return choices["default"]
    tag = "PRP" if tags[i] == "PRP" or _owns_nothing(lex, i + 1, tokens, tags) else "PRP$"
    return choices.get(tag, choices["default"])


def _owns_nothing(lex: GenderWords, j: int, tokens: list[str], tags: list[str]) -> bool:
    """Whether token ``j`` cannot begin the noun phrase of a possessive determiner before it: the caption ends,
    punctuation, a word of ``object_followers`` ("up", "away"), a tag of :data:`NOT_NP_START`, or an adverb /
    particle not followed by an adjective, noun or number ("her very long hair" keeps "very")."""
    if j >= len(tokens) or not tokens[j][:1].isalnum() or tokens[j] in lex.object_followers:
        return True
    if tags[j] in NOT_NP_START:
        return True
    if tags[j] in ("RB", "RBR", "RP"):
        return j + 1 >= len(tokens) or not tags[j + 1].startswith(("JJ", "NN", "CD", "VBN"))
    return False


def swap_gender(caption: str, words: GenderWords | str | Path | None = None, tagger: Tagger | None = None,
                only: str | None = None) -> Swap:
    """Flip the gender of every listed word of ``caption`` (both directions, §3.2-3.3, app. B rules).

    Words are whole words (letters joined by hyphens); a trailing "'s" stays (a plural possessive follows
    the new plural: "ladies'" -> "gentlemen's"), capitals follow the source word (Man -> Woman, MAN -> WOMAN)
    and every other character is kept. Words of ``by_pos`` ("her", "his")
    are resolved with ``tagger`` (default ``nltk.pos_tag`` on the lower-cased tokens), called only when such
    a word occurs. ``only`` (``male`` / ``female``): flip only the words of that gender (one direction)."""
    lex = load_words(words)
    spans = [(m.start(), m.end(), m.group()) for m in _TOKEN.finditer(caption)]
    tokens = [t.lower() for _, _, t in spans]
    tags = None
    if any(t in lex.by_pos and len(set(lex.by_pos[t].values())) > 1 for t in tokens):
        tags = [str(tag) for _, tag in (tagger or nltk_tagger)(tokens)]
        if len(tags) != len(tokens):
            raise ValueError(f"the tagger returned {len(tags)} tags for {len(tokens)} tokens of {caption!r}")
    pieces, edits, last = [], [], 0
    for i, (start, end, text) in enumerate(spans):
        word = tokens[i]
        if start < last:
            continue  # the possessive mark of the previous word, already written
        if only is not None and lex.gender.get(word) != only:
            continue
        if word in lex.swap:
            target = lex.swap[word]
        elif word in lex.by_pos:
            target = _pos_target(lex, word, i, tokens, tags)
        else:
            continue
        new = _match_case(text, target)
        mark = spans[i + 1] if i + 1 < len(spans) and spans[i + 1][0] == end else None
        if word in lex.plurals and mark and mark[2][:1] in "'’" and len(mark[2]) <= 2:
            # plural possessive: "men's" <-> "ladies'", "women's" <-> "gentlemen's"
            apostrophe = mark[2][0]
            if mark[2][1:].lower() == "s" and target.endswith("s"):
                new, end = new + apostrophe, mark[1]
            elif len(mark[2]) == 1 and not target.endswith("s"):
                new, end = new + apostrophe + ("S" if new.isupper() and len(new) > 1 else "s"), mark[1]
        pieces += [caption[last:start], new]
        edits.append((word, target))
        last = end
    pieces.append(caption[last:])
    return Swap("".join(pieces), bool(edits), edits)


def _article(noun: str) -> str:
    return "an" if noun[:1] in "aeiou" else "a"


def edit_prompt(edits: Iterable[Sequence[str]], words: GenderWords | str | Path | None = None) -> str:
    """The InstructPix2Pix instruction of one caption's edits, in the shape of app. B's examples.

    Distinct person nouns in caption order: "turn the man into a woman", "turn the woman into a man and the
    girl into a boy", plurals without article ("turn the men into women"). Edits of pronouns, titles or
    adjectives only give "turn the man into a woman" / "turn the woman into a man" by the first word's gender
    (as the manual prompts of §3.3, "Image-only intervention"); no edits give "no change"."""
    lex = load_words(words)
    edits = [(str(s).lower(), str(t).lower()) for s, t in edits]
    nouns = list(dict.fromkeys(e for e in edits if e[0] in lex.nouns))
    if not nouns:
        sexes = [lex.gender[s] for s, _ in edits if s in lex.gender]
        return FALLBACK[sexes[0]] if sexes else NO_CHANGE
    parts = [f"the {s} into {t}" if s in lex.plurals else f"the {s} into {_article(t)} {t}" for s, t in nouns]
    return "turn " + (parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1])


def normalize_prompt(prompt) -> str:
    """An edit prompt as votes compare it: lower case, single spaces, no final full stop; missing -> ""."""
    if prompt is None or (isinstance(prompt, float) and pd.isna(prompt)):
        return ""
    return re.sub(r"\s+", " ", str(prompt)).strip().rstrip(".!").strip().lower()


# --------------------------------------------------------------------------- tables


def _check_frame(frame: pd.DataFrame, caption_col: str, id_col: str, source: str) -> None:
    missing = [c for c in (id_col, caption_col) if c not in frame.columns]
    if missing:
        has = ", ".join(map(str, frame.columns))
        raise input_error(source, None, f"missing column(s) {', '.join(missing)} (has: {has})",
                          f"give every caption an {id_col} and a {caption_col}")
    seen: dict = {}
    for row, (ident, caption) in enumerate(zip(frame[id_col], frame[caption_col])):
        if ident is None or (isinstance(ident, float) and pd.isna(ident)) or str(ident).strip() == "":
            raise input_error(source, f"row {row}", f"empty {id_col}", f"give every caption a unique {id_col}")
        if ident in seen:
            raise input_error(source, f"{id_col} {ident!r} (rows {seen[ident]} and {row})", f"duplicate {id_col}",
                              f"make {id_col} unique (one row per caption)")
        seen[ident] = row
        if not isinstance(caption, str) or not caption.strip():
            raise input_error(source, f"{id_col} {ident!r} (row {row})", f"empty {caption_col}",
                              "drop the row or fill in its caption")


def swap_table(frame: pd.DataFrame, caption_col: str = "caption", id_col: str = "caption_id",
               source: str = "captions", words: GenderWords | str | Path | None = None,
               tagger: Tagger | None = None) -> pd.DataFrame:
    """A copy of ``frame`` with the rule-based intervention of every caption: ``intervened``, ``changed``,
    ``edits`` (JSON list of [source, target]) and ``edit_prompt``. Missing columns, empty captions or ids
    and duplicate ids are :class:`~counterfactory.errors.InputError` naming ``source`` and the row."""
    _check_frame(frame, caption_col, id_col, source)
    lex = load_words(words)
    swaps = [swap_gender(c, lex, tagger) for c in frame[caption_col]]
    out = frame.copy()
    out["intervened"] = [s.intervened for s in swaps]
    out["changed"] = [s.changed for s in swaps]
    out["edits"] = [json.dumps([list(e) for e in s.edits]) for s in swaps]
    out["edit_prompt"] = [edit_prompt(s.edits, lex) for s in swaps]
    unchanged = sum(not s.changed for s in swaps)
    if unchanged:
        log.warning("%s: %d of %d caption(s) have no gendered word to swap; they stay unchanged (changed=False)",
                    source, unchanged, len(swaps))
    return out


def majority_vote(frame: pd.DataFrame, image_col: str = "image_id", prompt_col: str = "edit_prompt",
                  min_agree: int | None = None) -> pd.DataFrame:
    """One row per image (sorted by ``image_col``): ``image_id, edit_prompt, votes, n_captions, accepted``.

    Prompts are compared after :func:`normalize_prompt`. The candidate is the most common prompt other than
    "no change" (and empty); it is accepted when it is the only most common one and has more than half of
    the image's captions' votes (3 of 5, app. B) -- or at least ``min_agree`` when given. A tie leaves
    ``edit_prompt`` empty; ``votes`` is then the tied count. Rows are counted, so row order does not matter."""
    missing = [c for c in (image_col, prompt_col) if c not in frame.columns]
    if missing:
        raise input_error("edit prompts", None, f"missing column(s) {', '.join(missing)}",
                          f"give every caption an {image_col} and an {prompt_col}")
    if min_agree is not None and (not isinstance(min_agree, int) or isinstance(min_agree, bool) or min_agree < 1):
        raise ConfigError(f"min_agree must be a positive integer or None, got {min_agree!r}. Fix: e.g. 3")
    rows = []
    prompts = frame[prompt_col].map(normalize_prompt)
    for image, group in prompts.groupby(frame[image_col], sort=True):
        n = len(group)
        counts = group[~group.isin(["", NO_CHANGE])].value_counts()
        top = int(counts.max()) if len(counts) else 0
        leaders = sorted(counts.index[counts == top]) if top else []
        winner = leaders[0] if len(leaders) == 1 else ""
        need = min_agree if min_agree is not None else n // 2 + 1
        rows.append({image_col: image, prompt_col: winner, "votes": top, "n_captions": n,
                     "accepted": bool(winner) and top >= need})
    return pd.DataFrame(rows, columns=[image_col, prompt_col, "votes", "n_captions", "accepted"])


# --------------------------------------------------------------------------- the llm path


def intervene_schema(fields: dict) -> dict:
    """Answer of ``cvld_intervene``: the intervened caption (at most :data:`EXTRA_CHARS` longer)."""
    return {"type": "object", "additionalProperties": False, "required": ["intervened"],
            "properties": {"intervened": {"type": "string", "minLength": 1,
                                          "maxLength": len(str(fields["caption"])) + EXTRA_CHARS}}}


def edit_prompt_schema(fields: dict) -> dict:
    """Answer of ``cvld_edit_prompt``: one instruction (or "no change")."""
    return {"type": "object", "additionalProperties": False, "required": ["edit_prompt"],
            "properties": {"edit_prompt": {"type": "string", "minLength": 1, "maxLength": MAX_PROMPT_CHARS}}}


#: source gender of an intervention direction (``fields["direction"]`` of a per-direction request)
DIRECTION_SOURCE = {"to_male": "female", "to_female": "male"}


def _words_of(text: str) -> list[str]:
    tokens = [m.group().lower() for m in _TOKEN.finditer(str(text))]
    while tokens and not re.match(_LETTERS, tokens[-1]):     # a final full stop or quote is not content
        tokens.pop()
    return tokens


def intervention_problem(caption: str, intervened: str, direction: str | None = None,
                         words: GenderWords | str | Path | None = None) -> str | None:
    """Why ``intervened`` is not a gender intervention of ``caption`` (None: it is): it must be the caption with its
    gendered words swapped (:func:`swap_gender`; ``direction`` ``to_male`` / ``to_female``: only the words of the
    other gender), word for word, case and a final full stop aside. "her" / "his" may take any of their
    part-of-speech counterparts (no tagger needed), so the check is the rule-based swapper's meaning, not its
    tagging."""
    lex = load_words(words)
    only = DIRECTION_SOURCE.get(direction) if direction else None
    expected = swap_gender(caption, lex, tagger=lambda tokens: [(t, "NN") for t in tokens], only=only).intervened
    want, got, orig = _words_of(expected), _words_of(intervened), _words_of(caption)
    ok = len(want) == len(got)
    if ok:
        for i, (w, g) in enumerate(zip(want, got)):
            if w == g:
                continue
            source = orig[i] if len(orig) == len(want) else None
            if source in lex.by_pos and (only is None or lex.gender.get(source) == only) \
                    and g in set(lex.by_pos[source].values()):
                continue
            ok = False
            break
    if ok:
        return None
    return (f"the intervened caption is not the caption with its gendered words swapped (the rule-based swap "
            f"gives {expected!r})")


def _intervene_check(fields: dict, answer) -> str | None:
    """The meaning check of a ``cvld_intervene`` answer (:func:`intervention_problem`), run by the ``llm`` role on
    every schema-valid answer: noise or an unrelated rewrite is an invalid answer with its reason, never an
    editing request."""
    if "caption" not in fields or not isinstance(answer, dict):
        return "the request has no caption to check the answer against"
    return intervention_problem(str(fields["caption"]), str(answer.get("intervened", "")), fields.get("direction"))


llm.register_task(llm.Task(INTERVENE_TASK, f"{INTERVENE_TASK}.txt", intervene_schema, check=_intervene_check))
llm.register_task(llm.Task(EDIT_TASK, f"{EDIT_TASK}.txt", edit_prompt_schema))


def llm_requests(frame: pd.DataFrame, caption_col: str = "caption", id_col: str = "caption_id",
                 source: str = "captions", tasks: Sequence[str] = (INTERVENE_TASK, EDIT_TASK)) -> pd.DataFrame:
    """``llm`` request rows ``item_id, task, fields`` (item_id = the caption id; fields JSON) for ``tasks``.

    ``cvld_edit_prompt`` compares the caption with ``frame``'s ``intervened`` column (the rule-based swap,
    or the answers of a first ``cvld_intervene`` round as :func:`run_llm` does)."""
    _check_frame(frame, caption_col, id_col, source)
    unknown = [t for t in tasks if t not in (INTERVENE_TASK, EDIT_TASK)]
    if unknown:
        raise ConfigError(f"unknown CVLD llm task(s) {unknown}. Fix: use {INTERVENE_TASK} and/or {EDIT_TASK}")
    if EDIT_TASK in tasks and "intervened" not in frame.columns:
        raise input_error(source, None, f"the {EDIT_TASK} task needs an intervened column",
                          f"run {INTERVENE_TASK} first (run_llm does both rounds) or swap_table the captions")
    rows = []
    for task in tasks:
        for rec in frame.to_dict("records"):
            fields = {"caption": rec[caption_col]}
            if task == EDIT_TASK:
                fields["intervened"] = rec["intervened"]
            rows.append({"item_id": str(rec[id_col]), "task": task, "fields": json.dumps(fields, ensure_ascii=False)})
    return pd.DataFrame(rows, columns=["item_id", "task", "fields"])


def parse_llm_answers(answers: pd.DataFrame, frame: pd.DataFrame | None = None, caption_col: str = "caption",
                      id_col: str = "caption_id") -> pd.DataFrame:
    """The llm answers (``run_requests``' table) as ``swap_table``'s columns, one row per caption.

    Columns ``item_id`` (or ``frame`` with these merged on ``id_col``), ``intervened`` (None when that answer
    is missing or invalid; from ``frame``'s own ``intervened`` when only edit prompts were asked),
    ``changed``, ``edit_prompt`` (normalised; "" when invalid, so it never wins a vote), ``llm_valid`` and
    ``llm_error``. ``changed`` compares the intervened caption with the caption when ``frame`` is given,
    else says whether the edit prompt asks for a change."""
    missing = {"item_id", "task", "answer", "valid"} - set(answers.columns)
    if missing:
        raise input_error("llm answers", None, f"missing column(s) {', '.join(sorted(missing))}",
                          "pass the table llm.run_requests returns")
    per_item: dict[str, dict] = {}
    keys = {INTERVENE_TASK: "intervened", EDIT_TASK: "edit_prompt"}
    for rec in answers.to_dict("records"):
        item, task = str(rec["item_id"]), rec["task"]
        if task not in keys:
            continue
        entry = per_item.setdefault(item, {"item_id": item, "errors": []})
        if keys[task] in entry:
            raise input_error("llm answers", item, f"two answers for task {task}", "keep one answer per request")
        value, error = None, rec.get("error") or "invalid answer"
        if bool(rec["valid"]):
            try:
                value = str(json.loads(rec["answer"])[keys[task]]).strip() or None
                error = None if value else "empty answer"
            except (ValueError, TypeError, KeyError) as exc:
                error = f"unreadable answer ({exc})"
        entry[keys[task]] = value
        if error:
            entry["errors"].append(f"{task}: {error}")
    recs = [{"item_id": e["item_id"], "intervened": e.get("intervened"),
             "edit_prompt": normalize_prompt(e.get("edit_prompt")), "asked_intervene": "intervened" in e,
             "llm_valid": not e["errors"], "llm_error": "; ".join(e["errors"]) or None} for e in per_item.values()]
    if frame is None:
        columns = ["item_id", "intervened", "changed", "edit_prompt", "llm_valid", "llm_error"]
        return pd.DataFrame([{**r, "changed": r["edit_prompt"] not in ("", NO_CHANGE)} for r in recs],
                            columns=columns, dtype=object).astype({"changed": bool, "llm_valid": bool})
    out = frame.copy()
    by_id = {r["item_id"]: r for r in recs}
    found = [by_id.get(str(i)) for i in out[id_col]]
    own = out["intervened"].tolist() if "intervened" in out.columns else [None] * len(out)
    out["intervened"] = pd.Series([r["intervened"] if r is not None and r["asked_intervene"] else
                                   (o if isinstance(o, str) else None) for r, o in zip(found, own)],
                                  index=out.index, dtype=object)
    out["changed"] = [isinstance(t, str) and t.strip() != c.strip()
                      for t, c in zip(out["intervened"], out[caption_col])]
    out["edit_prompt"] = [r["edit_prompt"] if r is not None else "" for r in found]
    out["llm_valid"] = [r is not None and r["llm_valid"] for r in found]
    out["llm_error"] = pd.Series([r["llm_error"] if r is not None else "no llm answer" for r in found],
                                 index=out.index, dtype=object)
    return out


def run_llm(cfg: dict, frame: pd.DataFrame, caption_col: str = "caption", id_col: str = "caption_id",
            source: str = "captions", out: str | Path | None = None, answers_out: str | Path | None = None,
            cache_path: str | Path | None = None) -> pd.DataFrame:
    """Both llm rounds (app. B): intervene every caption, then ask for the edit prompt of each caption whose
    intervention is valid; returns (and writes to ``out``) :func:`parse_llm_answers` of all answers."""
    first = llm.run_requests(cfg, llm_requests(frame, caption_col, id_col, source, (INTERVENE_TASK,)),
                             cache_path=cache_path)
    parsed = parse_llm_answers(first, frame.drop(columns=["intervened"], errors="ignore"), caption_col, id_col)
    ok = parsed[parsed["intervened"].notna()]
    second = llm.run_requests(cfg, llm_requests(ok, caption_col, id_col, source, (EDIT_TASK,)),
                              cache_path=cache_path) if len(ok) else pd.DataFrame(columns=llm.RESULT_COLUMNS)
    answers = pd.concat([first, second], ignore_index=True)
    result = parse_llm_answers(answers, frame.drop(columns=["intervened"], errors="ignore"), caption_col, id_col)
    if answers_out:
        write_parquet(answers_out, answers)
    if out:
        write_parquet(out, result)
    return result


__all__ = ["Swap", "GenderWords", "swap_gender", "edit_prompt", "normalize_prompt", "swap_table", "majority_vote",
           "load_words", "default_words_path", "llm_requests", "parse_llm_answers", "run_llm", "intervene_schema",
           "edit_prompt_schema", "INTERVENE_TASK", "EDIT_TASK", "NO_CHANGE"]
