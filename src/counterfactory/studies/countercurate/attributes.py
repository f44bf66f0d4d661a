"""Flickr30k-Attributes: hard negative captions from the ``llm`` role and the requests for their images
(CounterCurate §3.4 and appendix A), plus the above/below rewrite task of appendix B.

§3.4 takes, for each Flickr30k image, its first caption ``C`` together with the Flickr30k Entities markup
(``[/EN#18/people A man] ...``, app. A) and the boxes of its entities, and asks GPT-4V for three negatives
``C'``: (i) change a noun, (ii) change an adjective (a qualifier: adjective or quantifier), (iii) swap two
entities or their qualifiers -- "None" when no sensible swap exists (§4.4). The negatives are then drawn by
DALLE-3 (§3.4 "Generating negative images"; the open ``t2i`` role here).

Here a local chat model answers through :mod:`counterfactory.text.llm` (greedy, constrained to a JSON schema
whose ``entity_id`` fields may only name the caption's own phrases). Which model, what it sees and how it is
asked are the ``attributes:`` settings (defaults: as GPT-4V was asked in §3.4 / app. A):

* ``role: vlm`` -- the vision-language ``vlm`` role (LLaVA-1.5 class) plays GPT-4V; ``llm`` (option) the
  configured text model;
* ``images: both`` -- the photograph and a copy with the entities' boxes drawn (in colours the prompt names),
  two image entries of one request; ``annotated`` (option) only the drawn copy; ``none`` (option) no image, the
  boxes as pixel coordinates in the prompt (the only choice for a text-only role);
* ``one_answer: true`` -- one request per caption whose answer holds the three negatives (``noun``,
  ``adjective``, ``swap``; swap may be null, "None" in §4.4), split by :func:`collect` into the same per-kind
  rows; ``false`` (option) one request per caption and kind (task ``attributes_<kind>``).

Every answer is then checked against what app. A demands, and an answer that breaks a rule is kept as a
``rejected`` row with the reason:

* all kinds: the negative is non-empty and differs from the caption (case, punctuation and a/an aside);
* noun / adjective (rules 2-3 of app. A: one change, same structure): every changed word lies inside one
  phrase of the named entity; ``changed_from`` is (part of) that phrase and ``changed_to`` is (part of) what
  stands there now; more than an article changed. Noun: the phrase's head noun -- its last word, a heuristic
  that suits Flickr30k's English noun phrases -- is replaced by another word (not only made plural).
  Adjective: the head noun stays (up to singular/plural) and a qualifying word changes;
* swap: the two named entities differ; the negative is the caption with only the words of their two phrases
  rearranged between them -- the phrases trade places, or qualifiers move from one to the other (phrase
  lengths may change) -- and both phrases change. All-null answers are ``none`` rows (no swap possible, as
  the paper allows), partly-null answers are rejected.

What cannot be checked without a model is left to the ``llm``: that a changed object keeps the entity's type
(people stays people, app. A), fluency and plausibility (rules 1, 4-6).

Inputs: a table with ``image_id, sentence_index`` and either ``markup`` (the entity-marked sentence) or
``caption`` plus ``phrases`` (a list of ``{text | phrase, entity_id, types, first_word_index?}``, as the
Flickr30k Entities reader writes them); optional ``boxes`` (``{entity_id: [[x1, y1, x2, y2], ...]}``, a JSON
string or a list of ``{entity_id, boxes}``), ``image_path``, ``width``, ``height``. When the ``llm`` is a
vision-language model and ``image_path`` is given, the images go with the request (``images`` above); the prompt
lists the boxes in pixels either way. The workflow's captions table carries no boxes: :func:`add_boxes` reads them
(and the image size) from the Flickr30k Entities annotations (``--entities-root``).

Outputs: the negatives (``item_id, image_id, sentence_index, kind, caption, negative, entity_ids,
changed_from, changed_to, status, reason, ...``) and the ``t2i`` requests for the accepted ones
(``item_id, kind="t2i", prompt, image_id, source_kind, caption``).

Appendix B: :func:`rewrite_requests` / :func:`check_rewrite` are the ``positions_rewrite`` task that turns a
vanilla "A is above/below B" negative into one natural sentence for GLIGEN (§3.2). The task registers
:func:`check_rewrite` as its meaning check, so the ``llm`` role marks an off-topic rewrite invalid with the reason
(:func:`counterfactory.text.llm.check_meaning`) and it is a row of the rejected table, never a GLIGEN prompt.

The captions and their phrases (reading, markup, selection) are :mod:`.attribute_captions`; its names are
importable from here too.
"""

from __future__ import annotations

import collections
import difflib
import json
import logging
import re
from pathlib import Path
from typing import Iterable

import pandas as pd

from ... import config
from ...config import fill_section
from ...data import flickr30k_entities as f30k
from ...errors import ConfigError, input_error, missing_input
from ...io import write_parquet
from ...text import llm
from . import STUDY
from .attribute_captions import ARTICLES as ARTICLES
from .attribute_captions import CaptionItem, words
from .attribute_captions import Phrase as Phrase
from .attribute_captions import locate_phrases as locate_phrases
from .attribute_captions import markup_of as markup_of
from .attribute_captions import parse_markup as parse_markup
from .attribute_captions import read_captions, select_captions

log = logging.getLogger(__name__)

KINDS = ("noun", "adjective", "swap")
TASK_OF_KIND = {"noun": "attributes_noun", "adjective": "attributes_adjective", "swap": "attributes_swap"}
KIND_OF_TASK = {v: k for k, v in TASK_OF_KIND.items()}
#: the one-answer task (app. A: GPT-4V returned the three negatives in one answer) and its request id suffix
ONE_TASK = "attributes_one"
ONE_SUFFIX = "all"
#: ``attributes.images`` -> the pictures of a request (app. A: the photograph, then the copy with boxes drawn)
IMAGE_NOTES = {
    "both": "Two pictures are attached: first the photograph, then the same photograph with the regions of the "
            "marked phrases outlined in the colours listed below.",
    "annotated": "The photograph is attached; the regions of the marked phrases are outlined in the colours below.",
    "none": "You cannot see the photograph; the boxes below tell where each marked phrase is.",
}
REWRITE_TASK = "positions_rewrite"
#: the ``attributes:`` (§3.4, app. A) and ``positions_rewrite:`` (app. B) config sections have their defaults, with
#: their paper sections, in the schema (config/schema.yaml; docs/config-reference.md)
NEGATIVE_COLUMNS = ["item_id", "image_id", "image_path", "sentence_index", "kind", "caption", "markup", "negative",
                    "entity_ids", "changed_from", "changed_to", "status", "reason", "prompt_sha256", "answer"]
T2I_COLUMNS = ["item_id", "kind", "prompt", "image_id", "source_kind", "caption"]
RELATION_WORDS = {
    "above": ("above", "over", "atop", "top", "overhead", "higher", "up", "upon", "raised", "elevated", "hangs",
              "hanging", "hovering", "towering", "overlooking"),
    "below": ("below", "under", "beneath", "underneath", "lower", "down", "bottom", "foot", "base", "underside"),
}


# --------------------------------------------------------------------------- llm tasks


def _string(max_len: int) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": int(max_len)}


def _menu_schema(fields: dict) -> dict | None:
    """With a menu (``attributes.answer_menu``): the answer must be one of the menu's complete answers."""
    menu = fields.get("menu")
    if not menu:
        return None
    return {"anyOf": [{"type": "object", "additionalProperties": False, "required": list(choice),
                       "properties": {k: {"enum": [v]} for k, v in choice.items()}} for choice in menu]}


def edit_schema(fields: dict) -> dict:
    """Answer schema of the noun and adjective kinds: the changed phrase's id (one of the caption's), the phrase
    before and after, and the whole negative caption."""
    menu = _menu_schema(fields)
    if menu:
        return menu
    return _edit_object(fields)


def _edit_object(fields: dict) -> dict:
    ids = [str(i) for i in fields["entity_ids"]]
    return {"type": "object", "additionalProperties": False,
            "properties": {"entity_id": {"type": "string", "enum": ids},
                           "changed_from": _string(fields["max_phrase_chars"]),
                           "changed_to": _string(fields["max_phrase_chars"]),
                           "negative": _string(fields["max_negative_chars"])},
            "required": ["entity_id", "changed_from", "changed_to", "negative"]}


def swap_schema(fields: dict) -> dict:
    """Answer schema of the swap kind: two phrase ids and the negative, each nullable ("None", §4.4)."""
    menu = _menu_schema(fields)
    if menu:
        return menu
    ids = [str(i) for i in fields["entity_ids"]]
    nullable_id = {"anyOf": [{"type": "string", "enum": ids}, {"type": "null"}]}
    return {"type": "object", "additionalProperties": False,
            "properties": {"entity_a": nullable_id, "entity_b": nullable_id,
                           "negative": {"anyOf": [_string(fields["max_negative_chars"]), {"type": "null"}]}},
            "required": ["entity_a", "entity_b", "negative"]}


def one_schema(fields: dict) -> dict:
    """Answer schema of the one-answer task: an object with one field per asked kind (``fields["kinds"]``, in
    :data:`KINDS` order) -- ``noun`` and ``adjective`` an edit answer (:func:`edit_schema`), ``swap`` the two
    phrase ids and the negative, or null when no sensible swap exists (§4.4). With a menu (``fields["menus"]``,
    per kind) a kind's value must be one of its menu's answers."""
    menus = fields.get("menus") or {}
    ids = [str(i) for i in fields["entity_ids"]]
    props = {}
    for kind in fields["kinds"]:
        menu = _menu_schema({"menu": menus.get(kind)})
        if menu:
            props[kind] = menu
        elif kind == "swap":
            props[kind] = {"anyOf": [
                {"type": "object", "additionalProperties": False,
                 "properties": {"entity_a": {"type": "string", "enum": ids},
                                "entity_b": {"type": "string", "enum": ids},
                                "negative": _string(fields["max_negative_chars"])},
                 "required": ["entity_a", "entity_b", "negative"]},
                {"type": "null"}]}
        else:
            props[kind] = _edit_object(fields)
    return {"type": "object", "additionalProperties": False, "properties": props, "required": list(props)}


def _one_sections() -> dict[str, str]:
    """The parts of ``attributes_one.txt``: ``frame`` and one paragraph per kind (``[name]`` header lines)."""
    text = llm.prompt_text(f"{ONE_TASK}.txt")
    parts = re.split(r"^\[(\w+)\]\s*$", text, flags=re.MULTILINE)
    return {name: body.strip("\n") for name, body in zip(parts[1::2], parts[2::2])}


def _render_one(fields: dict) -> str:
    context = llm.fill(llm.prompt_text("attributes_context.txt"), fields, where="attributes_context.txt")
    sections = _one_sections()
    kinds = [k for k in KINDS if k in fields["kinds"]]
    tasks = "\n\n".join(sections[k] for k in kinds)
    names = ", ".join(f'"{k}"' for k in kinds)
    return llm.fill(sections["frame"], {**fields, "context": context, "tasks": tasks, "fields": names},
                    where=f"{ONE_TASK}.txt")


def rewrite_schema(fields: dict) -> dict:
    """Answer schema of the positions rewrite (app. B): one sentence."""
    return {"type": "object", "additionalProperties": False,
            "properties": {"rewrite": _string(fields["max_chars"])}, "required": ["rewrite"]}


def _render_attributes(template: str):
    def render(fields: dict) -> str:
        context = llm.fill(llm.prompt_text("attributes_context.txt"), fields, where="attributes_context.txt")
        return llm.fill(llm.prompt_text(template), {**fields, "context": context}, where=template)

    return render


for _kind, _schema in (("noun", edit_schema), ("adjective", edit_schema), ("swap", swap_schema)):
    _tmpl = f"{TASK_OF_KIND[_kind]}.txt"
    llm.register_task(llm.Task(TASK_OF_KIND[_kind], _tmpl, _schema, render=_render_attributes(_tmpl)))
llm.register_task(llm.Task(ONE_TASK, f"{ONE_TASK}.txt", one_schema, render=_render_one))


def _rewrite_check(fields: dict, answer) -> str | None:
    """The meaning check of a ``positions_rewrite`` answer (:func:`check_rewrite`), run by the ``llm`` role on every
    schema-valid answer, so an off-topic rewrite is an invalid answer with its reason and never a GLIGEN prompt."""
    if not {"statement", "subject", "relation", "object"} <= set(fields):
        return "the request lacks the statement, subject, relation and object fields the rewrite is checked against"
    section = {k: fields[k] for k in ("require_relation_word",) if k in fields}
    return check_rewrite(fields, answer if isinstance(answer, dict) else {}, section)[1]


llm.register_task(llm.Task(REWRITE_TASK, f"{REWRITE_TASK}.txt", rewrite_schema, check=_rewrite_check))


def _fmt(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def regions_text(item: CaptionItem, colours: dict[str, str] | None) -> str:
    """One line per marked entity: its boxes in pixels, and their colour when drawn on the image."""
    lines, seen = [], set()
    for p in item.visual_phrases():
        if p.entity_id in seen:
            continue
        seen.add(p.entity_id)
        boxes = item.boxes.get(p.entity_id, [])
        where = "; ".join("(" + ", ".join(_fmt(v) for v in b) + ")" for b in boxes) or "no box (scene or not boxed)"
        colour = f", outlined in {colours[p.entity_id]}" if boxes and colours and p.entity_id in colours else ""
        lines.append(f"#{p.entity_id} \"{p.text}\": {where}{colour}")
    size = f"Boxes are (x1, y1, x2, y2) in pixels of a {item.width}x{item.height} image." if item.width else \
        "Boxes are (x1, y1, x2, y2) in pixels."
    return "\n".join([size] + lines) if lines else "(no marked phrases)"


#: qualifiers the answer menu puts before a phrase's head noun (adjective kind)
MENU_QUALIFIERS = ("red", "small", "wooden", "striped")


def _replace_span(caption: str, replacements: list[tuple[str, str]]) -> str | None:
    """``caption`` with each ``(old, new)`` phrase text replaced at its first occurrence (None when one is missing
    or two overlap)."""
    spans = []
    for old, new in replacements:
        at = caption.find(old)
        if at < 0:
            return None
        spans.append((at, at + len(old), new))
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
        return None
    out, pos = [], 0
    for start, end, new in spans:
        out += [caption[pos:start], new]
        pos = end
    return "".join(out + [caption[pos:]])


def answer_menu(item: CaptionItem, kind: str, size: int) -> list[dict]:
    """Up to ``size`` complete answers of ``kind`` made from the caption itself and kept only when
    :func:`check_edit` / :func:`check_swap` accept them: noun -- a phrase's head word replaced by another phrase's
    head; adjective -- a qualifier (:data:`MENU_QUALIFIERS`) put before a phrase's head; swap -- two phrases
    exchanged. ``attributes.answer_menu`` offers them to the ``llm`` as the only answers its constrained decoding
    may write: the offline demo's tiny random model then still picks checkable answers, so every later step (t2i,
    the Attributes dataset, its export) runs. Not a paper setting: the paper's GPT-4V writes free text (§3.4)."""
    phrases = list({p.entity_id: p for p in reversed(item.visual_phrases())}.values())[::-1]   # first per entity
    out: list[dict] = []

    def offer(answer: dict) -> None:
        if len(out) < size and answer not in out:
            status = (check_swap(item, answer) if kind == "swap" else check_edit(kind, item, answer))[0]
            if status == "accepted":
                out.append(answer)

    for p in phrases:
        head = p.text.split()[-1] if p.text.split() else ""
        if not head:
            continue
        lead = p.text[: len(p.text) - len(head)]
        if kind == "noun":
            for q in phrases:
                other = q.text.split()[-1] if q.text.split() else ""
                if other and _singular(other.lower()) != _singular(head.lower()):
                    neg = _replace_span(item.caption, [(p.text, lead + other.lower())])
                    if neg:
                        offer({"entity_id": p.entity_id, "changed_from": head, "changed_to": other.lower(),
                               "negative": neg})
        elif kind == "adjective":
            for q in MENU_QUALIFIERS:
                if q not in words(p.text):
                    neg = _replace_span(item.caption, [(p.text, f"{lead}{q} {head}")])
                    if neg:
                        offer({"entity_id": p.entity_id, "changed_from": head, "changed_to": f"{q} {head}",
                               "negative": neg})
        else:
            for q in phrases:
                if q.entity_id != p.entity_id:
                    neg = _replace_span(item.caption, [(p.text, q.text), (q.text, p.text)])
                    if neg:
                        offer({"entity_a": p.entity_id, "entity_b": q.entity_id, "negative": neg})
    return out


def item_id_of(item: CaptionItem, kind: str) -> str:
    """``<image_id>_<sentence_index>_<kind>``, made of ``[A-Za-z0-9_.-]`` only: the id also names the negative
    image the ``t2i`` role draws for it (grounded generation's request ids)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{item.image_id}_{item.sentence_index}_{kind}")


#: columns of :func:`requests_for`' table (``images``: JSON list of ``{"path", "boxes"}``, :mod:`..text.llm`)
REQUEST_COLUMNS = ["item_id", "task", "fields", "image_path", "boxes", "images"]


def requests_for(items: list[CaptionItem], section: dict, with_images: bool | str = False
                 ) -> tuple[pd.DataFrame, list]:
    """``(llm requests, skipped)``: one request per caption and kind, or per caption with
    ``section["one_answer"]`` (task :data:`ONE_TASK`, its ``fields["kinds"]`` the kinds asked); ``skipped`` lists
    ``(item_id, kind, reason)`` of captions a kind cannot apply to (no marked phrase; fewer than two entities for a
    swap). ``with_images``: ``"both"`` (the photograph, then the copy with boxes drawn), ``"annotated"`` or True
    (the drawn copy only), ``"none"`` or False (no image; a caption without ``image_path`` is always text-only)."""
    mode = ("annotated" if with_images else "none") if isinstance(with_images, bool) else str(with_images)
    if mode not in IMAGE_NOTES:
        raise ConfigError(f"attributes.images must be one of {', '.join(IMAGE_NOTES)}, got {mode!r}. Fix: use both "
                          "(§3.4, app. A)")
    one = bool(section.get("one_answer"))
    rows, skipped = [], []
    for it in items:
        ids = list(dict.fromkeys(p.entity_id for p in it.visual_phrases()))
        shown = mode if it.image_path else "none"
        colours = None
        boxes = []
        if shown != "none":
            colours = {eid: llm.BOX_COLORS[i % len(llm.BOX_COLORS)] for i, eid in enumerate(ids)}
            boxes = [{"label": f"#{eid}", "box": b, "color": colours[eid]}
                     for eid in ids for b in it.boxes.get(eid, [])]
        image_cols = {"image_path": None, "boxes": "[]", "images": None}
        if shown == "annotated":    # one picture: the key of earlier versions (their answer caches stay valid)
            image_cols.update(image_path=it.image_path, boxes=json.dumps(boxes))
        elif shown == "both":
            image_cols["images"] = json.dumps([{"path": it.image_path, "boxes": []},
                                               {"path": it.image_path, "boxes": boxes}])
        fields = {"caption": it.caption, "markup": it.markup, "regions": regions_text(it, colours),
                  "image_note": IMAGE_NOTES[shown], "entity_ids": ids, "max_phrase_chars": section["max_phrase_chars"],
                  "max_negative_chars": len(it.caption) + section["extra_negative_chars"]}
        asked, menus = [], {}
        for kind in [k for k in KINDS if k in section["kinds"]]:
            item_id = item_id_of(it, kind)
            if len(ids) < (2 if kind == "swap" else 1):
                skipped.append((item_id, kind, "fewer than two marked entities" if kind == "swap"
                                else "no marked phrase"))
                continue
            menu = answer_menu(it, kind, int(section["answer_menu"])) if section.get("answer_menu") else []
            if one:
                asked.append(kind)
                if menu:
                    menus[kind] = menu
                continue
            rows.append({"item_id": item_id, "task": TASK_OF_KIND[kind],
                         "fields": json.dumps({**fields, "menu": menu} if menu else fields), **image_cols})
        if one and asked:
            extra = {"kinds": asked, **({"menus": menus} if menus else {})}
            rows.append({"item_id": item_id_of(it, ONE_SUFFIX), "task": ONE_TASK,
                         "fields": json.dumps({**fields, **extra}), **image_cols})
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS), skipped


# --------------------------------------------------------------------------- checking answers


def _singular(w: str) -> str:
    for suffix, repl in (("ies", "y"), ("ches", "ch"), ("shes", "sh"), ("sses", "ss"), ("xes", "x"), ("s", "")):
        if w.endswith(suffix) and len(w) > len(suffix) + 1 and not w.endswith("ss"):
            return w[: -len(suffix)] + repl
    return w


def _contains(seq: list[str], sub: list[str]) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1)) if sub else False


def _changes(c: list[str], n: list[str]) -> list[tuple[int, int, int, int]]:
    ops = difflib.SequenceMatcher(None, c, n, autojunk=False).get_opcodes()
    return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def _inside(change: tuple[int, int, int, int], start: int, end: int) -> bool:
    i1, i2 = change[:2]
    return start <= i1 and i2 <= end if i2 > i1 else start <= i1 <= end


def check_edit(kind: str, item: CaptionItem, answer: dict) -> tuple[str, str | None, dict]:
    """``(status, reason, record)`` of a noun or adjective answer (rules in the module docstring)."""
    eid = str(answer.get("entity_id"))
    neg = str(answer.get("negative") or "").strip()
    rec = {"negative": neg, "entity_ids": [eid], "changed_from": answer.get("changed_from"),
           "changed_to": answer.get("changed_to")}
    candidates = [p for p in item.visual_phrases() if p.entity_id == eid]
    if not candidates:
        return "rejected", f"entity #{eid} is not a marked phrase of the caption", rec
    c, n = words(item.caption), words(neg)
    if not n:
        return "rejected", "the negative is empty", rec
    if n == c:
        return "rejected", "the negative is the caption itself", rec
    changes = _changes(c, n)
    phrase = next((p for p in candidates if all(_inside(ch, p.start, p.end) for ch in changes)), None)
    if phrase is None:
        outside = sorted({w for ch in changes for w in c[ch[0]:ch[1]] or n[ch[2]:ch[3]]})
        return "rejected", (f"the negative changes words outside phrase #{eid} ({', '.join(outside)}); "
                            "only one phrase may change"), rec
    old = c[phrase.start:phrase.end]
    new = n[phrase.start:len(n) - (len(c) - phrase.end)]
    if not new:
        return "rejected", f"phrase #{eid} was deleted, not changed", rec
    if [w for w in old if w not in ("a", "the")] == [w for w in new if w not in ("a", "the")]:
        return "rejected", "only an article changed", rec
    if not _contains(old, words(answer.get("changed_from") or "")):
        return "rejected", (f"changed_from {answer.get('changed_from')!r} is not part of phrase #{eid} "
                            f"({phrase.text!r})"), rec
    if not _contains(new, words(answer.get("changed_to") or "")):
        return "rejected", f"changed_to {answer.get('changed_to')!r} is not what the negative has in place of " \
                           f"phrase #{eid}", rec
    same_head = _singular(old[-1]) == _singular(new[-1])
    if kind == "noun" and same_head:
        what = "only made plural or singular" if old[-1] != new[-1] else "unchanged"
        return "rejected", (f"the noun {old[-1]!r} is {what}: a noun change must name a different thing"), rec
    if kind == "adjective" and not same_head:
        return "rejected", (f"the noun changed ({old[-1]!r} -> {new[-1]!r}): an adjective change keeps the thing "
                            "and changes a word qualifying it"), rec
    return "accepted", None, rec


def check_swap(item: CaptionItem, answer: dict) -> tuple[str, str | None, dict]:
    """``(status, reason, record)`` of a swap answer; all-null is ``none`` (no swap possible)."""
    a, b, neg = answer.get("entity_a"), answer.get("entity_b"), answer.get("negative")
    rec = {"negative": (neg or "").strip() or None, "entity_ids": [x for x in (a, b) if x is not None],
           "changed_from": None, "changed_to": None}
    if a is None and b is None and neg is None:
        return "none", "the llm found no sensible swap", rec
    if a is None or b is None or neg is None:
        return "rejected", "incomplete swap answer (some fields null, some not)", rec
    a, b = str(a), str(b)
    if a == b:
        return "rejected", "a swap needs two different entities", rec
    phrases = item.visual_phrases()
    spans = {e: [(p.start, p.end) for p in phrases if p.entity_id == e] for e in (a, b)}
    for e, s in spans.items():
        if not s:
            return "rejected", f"entity #{e} is not a marked phrase of the caption", rec
    c, n = words(item.caption), words(neg)
    if not n:
        return "rejected", "the negative is empty", rec
    if n == c:
        return "rejected", "the negative is the caption itself", rec
    if collections.Counter(c) != collections.Counter(n):
        extra = sorted((collections.Counter(n) - collections.Counter(c)).elements())
        missing = sorted((collections.Counter(c) - collections.Counter(n)).elements())
        return "rejected", (f"a swap must reuse exactly the caption's words (added: {', '.join(extra) or '-'}; "
                            f"missing: {', '.join(missing) or '-'})"), rec
    for x, y in sorted(((a, *sa), (b, *sb)) for sa in spans[a] for sb in spans[b]):
        (e_1, s1, e1), (e_2, s2, e2) = sorted((x, y), key=lambda t: t[1:])
        if e1 > s2:
            continue  # overlapping phrases cannot be exchanged
        split = _swap_split(c, n, s1, e1, s2, e2)
        if split is None:
            continue
        first, second = split
        if first == c[s1:e1] or second == c[s2:e2]:
            changed = e_1 if first != c[s1:e1] else e_2
            return "rejected", f"only phrase #{changed} changed: a swap exchanges between two phrases", rec
        return "accepted", None, rec
    return "rejected", f"the negative changes words outside phrases #{a} and #{b}", rec


def _swap_split(c: list[str], n: list[str], s1: int, e1: int, s2: int, e2: int):
    """``(new first phrase, new second phrase)`` when ``n`` is ``c`` with only the words of the phrases
    ``c[s1:e1]`` and ``c[s2:e2]`` rearranged between them (their lengths may change), else None."""
    head, middle, tail = c[:s1], c[e1:s2], c[e2:]
    if len(n) != len(c) or n[:s1] != head or (tail and n[-len(tail):] != tail):
        return None
    body = n[s1:len(n) - len(tail)]
    total = (e1 - s1) + (e2 - s2)
    for k in range(total + 1):
        if body[k:k + len(middle)] == middle and len(body) == total + len(middle):
            first, second = body[:k], body[k + len(middle):]
            if collections.Counter(first + second) == collections.Counter(c[s1:e1] + c[s2:e2]):
                return first, second
    return None


def _parts(req: dict, a, it: CaptionItem) -> list[tuple[str, str, str | None, object]]:
    """``(kind, item_id, answer text, parsed part or None)`` of one request's answer: the request's own kind, or
    each kind of a one-answer request (its part of the answer; a null swap is the all-null swap answer)."""
    if req["task"] != ONE_TASK:
        kind = KIND_OF_TASK[req["task"]]
        return [(kind, req["item_id"], a["answer"], json.loads(a["answer"]) if a["valid"] else None)]
    fields = req["fields"] if isinstance(req["fields"], dict) else json.loads(req["fields"])
    whole = json.loads(a["answer"]) if a["valid"] else None
    out = []
    for kind in fields["kinds"]:
        if whole is None:
            out.append((kind, item_id_of(it, kind), a["answer"], None))
            continue
        part = whole.get(kind)
        if kind == "swap" and part is None:
            part = {"entity_a": None, "entity_b": None, "negative": None}
        out.append((kind, item_id_of(it, kind), json.dumps(whole.get(kind), ensure_ascii=False), part))
    return out


def collect(items: list[CaptionItem], requests: pd.DataFrame, answers: pd.DataFrame,
            skipped: Iterable[tuple[str, str, str]] = ()) -> pd.DataFrame:
    """The negatives table: one row per caption and kind (a one-answer request is split into its kinds, each
    row's ``answer`` its part of the answer) and per skipped caption/kind, with status and reason."""
    by_id = {item_id_of(it, kind): it for it in items for kind in (*KINDS, ONE_SUFFIX)}
    ans = answers.set_index("item_id")
    rows = []
    for req in requests.to_dict("records"):
        it = by_id[req["item_id"]]
        a = ans.loc[req["item_id"]]
        for kind, item_id, answer, value in _parts(req, a, it):
            base = {"item_id": item_id, "image_id": it.image_id, "image_path": it.image_path,
                    "sentence_index": it.sentence_index, "kind": kind, "caption": it.caption, "markup": it.markup,
                    "prompt_sha256": a["prompt_sha256"], "answer": answer}
            if not a["valid"]:
                rows.append({**base, "negative": None, "entity_ids": [], "changed_from": None, "changed_to": None,
                             "status": "rejected", "reason": f"invalid llm answer: {a['error']}"})
                continue
            status, reason, rec = check_swap(it, value) if kind == "swap" else check_edit(kind, it, value)
            rows.append({**base, **rec, "status": status, "reason": reason})
    for item_id, kind, reason in skipped:
        it = by_id[item_id]
        rows.append({"item_id": item_id, "image_id": it.image_id, "image_path": it.image_path,
                     "sentence_index": it.sentence_index, "kind": kind,
                     "caption": it.caption, "markup": it.markup, "negative": None, "entity_ids": [],
                     "changed_from": None, "changed_to": None, "status": "none", "reason": reason,
                     "prompt_sha256": None, "answer": None})
    frame = pd.DataFrame(rows, columns=NEGATIVE_COLUMNS)
    order = {k: i for i, k in enumerate(KINDS)}
    frame["_k"] = frame["kind"].map(order)
    return frame.sort_values(["image_id", "sentence_index", "_k"], kind="stable").drop(columns="_k") \
        .reset_index(drop=True)


def t2i_requests(negatives: pd.DataFrame) -> pd.DataFrame:
    """Requests for the ``t2i`` role (DALLE-3's, §3.4): one image per accepted negative, prompted by it."""
    ok = negatives[negatives["status"] == "accepted"]
    return pd.DataFrame({"item_id": ok["item_id"].values, "kind": "t2i", "prompt": ok["negative"].values,
                         "image_id": ok["image_id"].values, "source_kind": ok["kind"].values,
                         "caption": ok["caption"].values}, columns=T2I_COLUMNS)


# --------------------------------------------------------------------------- appendix B: above/below rewrite


def rewrite_requests(pairs: pd.DataFrame, section: dict | None = None) -> pd.DataFrame:
    """``positions_rewrite`` llm requests from ``item_id, subject, relation (above|below), object[, statement]``
    (the vanilla negative "A is above B" of §3.2; the rewrite guides GLIGEN, app. B). ``section``: the
    ``positions_rewrite`` section (schema defaults filled for the keys it lacks)."""
    section = fill_section("countercurate.positions_rewrite", section)
    rows = []
    for i, r in enumerate(pairs.to_dict("records")):
        rel = str(r["relation"])
        if rel not in RELATION_WORDS:
            raise input_error("positions pairs", i, f"relation {rel!r} is not above or below",
                              "rewrite only the above/below negatives (app. B)")
        statement = r.get("statement") or f"{r['subject']} is {rel} {r['object']}"
        fields = {"statement": statement, "subject": r["subject"], "relation": rel, "object": r["object"],
                  "max_chars": section["max_chars"], "require_relation_word": bool(section["require_relation_word"])}
        rows.append({"item_id": str(r["item_id"]), "task": REWRITE_TASK, "fields": json.dumps(fields)})
    return pd.DataFrame(rows, columns=["item_id", "task", "fields"])


def check_rewrite(fields: dict, answer: dict, section: dict | None = None) -> tuple[str, str | None]:
    """``(status, reason)`` of a rewrite: one sentence, naming both objects (their head words), differing from
    the statement and -- with ``require_relation_word`` -- using a word of the asked vertical relation."""
    section = fill_section("countercurate.positions_rewrite", section)
    text = str(answer.get("rewrite") or "").strip()
    toks = words(text)
    if not toks:
        return "rejected", "the rewrite is empty"
    if toks == words(fields["statement"]):
        return "rejected", "the rewrite repeats the statement"
    if re.search(r"[.!?]\s+\S", text.rstrip(".!? ")):
        return "rejected", "the rewrite has more than one sentence"
    singular = {_singular(w) for w in toks}
    for role in ("subject", "object"):
        head = words(fields[role])[-1:] or [""]
        if _singular(head[0]) not in singular:
            return "rejected", f"the rewrite does not mention the {role} {fields[role]!r}"
    if section["require_relation_word"] and not set(toks) & set(RELATION_WORDS[fields["relation"]]):
        return "rejected", (f"the rewrite does not say that {fields['subject']} is {fields['relation']} "
                            f"{fields['object']}")
    return "accepted", None


# --------------------------------------------------------------------------- stage and CLI


def section_of(cfg: dict) -> dict:
    """The ``attributes:`` section with the schema's defaults; bad values are a :class:`ConfigError` naming the key."""
    return fill_section("countercurate.attributes", cfg.get("attributes"))


def add_boxes(items: list[CaptionItem], entities_root: str | Path) -> list[CaptionItem]:
    """The items with the boxes and image size of their image from the Flickr30k Entities annotations
    (``<entities_root>/Annotations/<image_id>.xml``), for items whose table gave no boxes: the box-annotated
    picture and the prompt's regions of app. A. Each image's file is read once."""
    cache: dict[str, object] = {}
    for it in items:
        if it.boxes:
            continue
        if it.image_id not in cache:
            cache[it.image_id] = f30k.read_image(entities_root, it.image_id, strict=False)
        im = cache[it.image_id]
        it.boxes = {eid: [[float(v) for v in b] for b in e.boxes] for eid, e in im.entities.items() if e.boxes}
        it.width, it.height = it.width or im.width, it.height or im.height
    return items


def attribute_role(cfg: dict, section: dict | None = None) -> str:
    """The model role that answers (``attributes.role``); with images asked (``attributes.images`` not none) it must
    be a vision-language checkpoint, else a :class:`ConfigError` naming the keys and the fix."""
    section = section or section_of(cfg)
    role = section["role"]
    if section["images"] != "none" and not llm.is_multimodal(cfg, role):
        raise ConfigError(
            f"countercurate.attributes.images is {section['images']!r}, but models.{role} is not a vision-language "
            "checkpoint (its config.json has no vision_config), so it cannot see the pictures GPT-4V saw (§3.4, "
            f"app. A). Fix: set countercurate.attributes.role to a vision-language role (vlm), point models.{role} "
            "at one, or set countercurate.attributes.images: none (text only, boxes as coordinates)")
    return role


def run(cfg: dict, captions: pd.DataFrame, out: str | Path | None = None, requests_out: str | Path | None = None,
        llm_requests_out: str | Path | None = None, answers_out: str | Path | None = None,
        cache_path: str | Path | None = None, source: str = "captions",
        entities_root: str | Path | None = None) -> pd.DataFrame:
    """Build the requests of §3.4 for ``captions``, have ``attributes.role`` answer them, check the answers and
    write the negatives (``out``), the t2i requests (``requests_out``), and optionally the requests and raw
    answers. ``entities_root``: read the boxes from the Flickr30k Entities annotations (:func:`add_boxes`)."""
    section = section_of(cfg)
    role = attribute_role(cfg, section)
    items = select_captions(read_captions(captions, source), section)
    if entities_root:
        add_boxes(items, entities_root)
    requests, skipped = requests_for(items, section, with_images=section["images"])
    if llm_requests_out:
        write_parquet(llm_requests_out, requests)
    answers = llm.run_requests(cfg, requests, answers_out, cache_path=cache_path, role=role) if len(requests) \
        else pd.DataFrame(columns=llm.RESULT_COLUMNS)
    negatives = collect(items, requests, answers, skipped)
    if out:
        write_parquet(out, negatives)
    if requests_out:
        write_parquet(requests_out, t2i_requests(negatives))
    return negatives


def load_cfg(paths: Iterable[str]) -> dict:
    """The countercurate view of the config files (``load_config(paths, study="countercurate")``)."""
    try:
        return config.load_config(list(paths), study=STUDY)
    except KeyError as exc:
        raise ConfigError(f"{', '.join(map(str, paths))}: the configuration schema has no '{STUDY}' section yet "
                          f"({exc}). Fix: use a version of counterfactory whose schema knows the study") from exc


def read_captions_table(path: str | Path) -> pd.DataFrame:
    """The captions table of ``counterfactory countercurate attributes`` (``.jsonl``: JSON lines, else parquet); a
    missing file is an error naming the fix."""
    p = Path(path)
    if not p.exists():
        raise missing_input(p, "table", "check the path (and that the step producing it has run)")
    return pd.read_json(p, lines=True, dtype=False) if p.suffix == ".jsonl" else pd.read_parquet(p)
