"""Flickr30k-Counting (CounterCurate §3.3, appendix C, Table 8).

Categories
----------
§3.3 counts "the number of bounding boxes for each object category" and writes "there are three cats and four dogs":
a category is an object *noun* ("cat"), not one of the dataset's coarse types ("animals"). Here a category is one
Flickr30k Entities chain with ``min_boxes``..``max_boxes`` boxes (2–8, as the released ``generate_counting.py``),
named by its first phrase with leading articles, numbers and quantifiers dropped ("two young men" -> "young man",
"a group of people" -> "person"; :func:`category_name`) and the head noun put in the singular. Chains of the
``exclude_types`` (bodyparts, scene: the released code skips them) and collective or pronoun-like names ("a crowd",
"others") are left out. When two chains of an image get the same name the count of that name is ambiguous
(coreference across chains), so that name is left out of the image (the released code drops the whole image).
Every two categories of an image make an item (with ``require_same_sentence`` only those named in one sentence, as
the released code).

Negatives (§3.3)
----------------
P is the category with fewer boxes (ties: the one mentioned first), Q the other; the positive caption is
``"there are <n_P> <P> and <n_Q> <Q>"`` (:func:`count_caption`: number words one..ten, plural nouns, "there is" when
``n_P`` is one).

* **No overlap** (§3.3: "if both objects do not spatially overlap with other objects" — no box of P or Q overlaps
  the box of any *other* object of the image: another P or Q box, or a box of any other chain that is not of the
  ``exclude_types``; touching edges do not overlap, as in the position rule; ``overlap_with: counted``, an option,
  compares only P's boxes with Q's): Q is decremented and P incremented,
  ``C' = "there are <n_P + 1> <P> and <n_Q - 1> <Q>"``; the negative image inpaints a
  new P into one box of Q (chosen reproducibly with ``random_state``): edit ``add``.
* **Overlap**: a *target* object is removed together with every object it overlaps ("and all objects it overlaps
  with"; other objects' boxes are covered too, ``mask_of`` "other"), by inpainting the ``generic_category``
  ("plant", §3.3 and appendix C) into each of their boxes, and both counts drop by what was removed: edit
  ``remove``. The target is the first Q box (annotation order) that overlaps another object — the paper's
  example removes a dog, the larger category — and then the P boxes, taking the first choice that leaves at least one
  object of each category (an item where none does is skipped: "there are zero ..." is not a caption we write).

:func:`inpaint_requests` writes one request per item for the grounded inpainting role: the image, the mask boxes (pixels
and GLIGEN's normalised xyxy), the phrase per box and a prompt.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Iterable, Mapping

import pandas as pd

from ...config import fill_section
from ...data import flickr30k_entities as f30k
from ...errors import ConfigError
from ...io import write_parquet
from .positions import default_images_dir, normalise_box

log = logging.getLogger(__name__)

#: the ``counting`` section of the ``countercurate`` config (2..8 boxes, a plant covers overlaps, §3.3, ...) has its
#: defaults, with their paper sections, in the schema (config/schema.yaml; docs/config-reference.md)
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
#: request kind of :mod:`counterfactory.generation.grounded` (GLIGEN inpainting) and the purpose of each edit
KIND = "inpaint"
PURPOSE_ADD = "counting_add"
PURPOSE_REMOVE = "counting_remove"
REQUESTS_FILE = "counting_inpaint_requests.parquet"
COLUMNS = ["item_id", "image_id", "image_path", "width", "height", "entity_p", "category_p", "n_p", "entity_q",
           "category_q", "n_q", "boxes_p", "boxes_q", "overlap", "edit", "new_n_p", "new_n_q", "mask_boxes",
           "mask_phrases", "caption", "negative_caption"]
REQUEST_COLUMNS = ["item_id", "image_id", "image_path", "kind", "purpose", "prompt", "phrases", "boxes", "mask_boxes",
                   "width", "height"]

# --- number words and plurals ---------------------------------------------------------------------------------------
# inflect is not installed in the environment, so a small pluralizer covers the nouns of Flickr30k phrases.

_IRREGULAR = {"man": "men", "woman": "women", "person": "people", "child": "children", "foot": "feet",
              "tooth": "teeth", "goose": "geese", "mouse": "mice", "ox": "oxen", "die": "dice", "louse": "lice",
              "knife": "knives", "wife": "wives", "life": "lives", "leaf": "leaves", "loaf": "loaves",
              "shelf": "shelves", "wolf": "wolves", "calf": "calves", "half": "halves", "elf": "elves",
              "thief": "thieves", "scarf": "scarves", "hoof": "hooves", "hero": "heroes", "potato": "potatoes",
              "tomato": "tomatoes", "echo": "echoes", "volcano": "volcanoes", "cactus": "cacti",
              "fungus": "fungi", "bus": "buses", "gas": "gases", "lens": "lenses", "movie": "movies",
              "cookie": "cookies", "pie": "pies", "tie": "ties", "brownie": "brownies", "hippie": "hippies",
              "goalie": "goalies", "rookie": "rookies", "zombie": "zombies", "selfie": "selfies"}
_IRREGULAR_SINGULAR = {v: k for k, v in _IRREGULAR.items()}
#: same form in singular and plural, or plural-only nouns
_INVARIANT = frozenset({"sheep", "deer", "fish", "moose", "bison", "aircraft", "species", "series", "salmon", "trout",
                        "jeans", "pants", "shorts", "trousers", "sunglasses", "glasses", "goggles", "scissors",
                        "clothes", "overalls", "pajamas", "binoculars", "police", "cattle", "swine", "shrimp"})
_MAN_EXCEPTIONS = frozenset({"human", "shaman", "talisman", "caiman", "german", "roman", "ottoman", "walkman"})


def number_word(n: int) -> str:
    """``0..10`` as words ("three"); larger numbers as digits."""
    return NUMBER_WORDS[n] if 0 <= n < len(NUMBER_WORDS) else str(n)


def _case_like(template: str, word: str) -> str:
    return word.capitalize() if template[:1].isupper() else word


def plural_noun(word: str) -> str:
    """The plural of an English noun ("person" -> "people", "bus" -> "buses", "baby" -> "babies"); only the last
    word of a multi-word name is inflected ("young man" -> "young men")."""
    head, sep, last = word.rpartition(" ")
    low = last.lower()
    if low in _INVARIANT:
        plural = low
    elif low in _IRREGULAR:
        plural = _IRREGULAR[low]
    elif low in _IRREGULAR_SINGULAR:  # already plural
        plural = low
    elif (low.endswith("man") and low not in _MAN_EXCEPTIONS) or low.endswith("woman"):
        plural = low[:-3] + "men"
    elif low.endswith(("s", "x", "z", "ch", "sh")):
        plural = low + "es"
    elif low.endswith("y") and len(low) > 1 and low[-2] not in "aeiou":
        plural = low[:-1] + "ies"
    else:
        plural = low + "s"
    return head + sep + _case_like(last, plural)


def singular_noun(word: str) -> str:
    """The singular of an English noun ("people" -> "person", "dresses" -> "dress", "babies" -> "baby"); words
    already singular are returned unchanged. Only the last word is inflected."""
    head, sep, last = word.rpartition(" ")
    low = last.lower()
    if low in _INVARIANT or low in _IRREGULAR:
        single = low
    elif low in _IRREGULAR_SINGULAR:
        single = _IRREGULAR_SINGULAR[low]
    elif low.endswith("men") and low[:-3] + "man" not in _MAN_EXCEPTIONS and len(low) > 3:
        single = low[:-3] + "man"
    elif low.endswith("ies") and len(low) > 4:
        single = low[:-3] + "y"
    elif low.endswith(("sses", "shes", "ches", "xes", "zzes")):
        single = low[:-2]
    elif low.endswith("s") and not low.endswith(("ss", "us", "is")) and len(low) > 2:
        single = low[:-1]
    else:
        single = low
    return head + sep + _case_like(last, single)


def counted(n: int, noun: str) -> str:
    """``"three dogs"``, ``"one dog"``: the number word and the noun in the matching number."""
    return f"{number_word(n)} {noun if n == 1 else plural_noun(noun)}"


def count_caption(n_p: int, category_p: str, n_q: int, category_q: str) -> str:
    """§3.3: ``"there are <n_P> <P> and <n_Q> <Q>"``, e.g. "there are three cats and four dogs"; the verb agrees
    with the first noun ("there is one cat and four dogs")."""
    verb = "is" if n_p == 1 else "are"
    return f"there {verb} {counted(n_p, category_p)} and {counted(n_q, category_q)}"


# --- categories -----------------------------------------------------------------------------------------------------

_LEADING = ("a group of", "group of", "a crowd of", "crowd of", "a couple of", "couple of", "a pair of", "pair of",
            "a bunch of", "bunch of", "a lot of", "lots of", "a team of", "team of", "a number of", "a few", "a",
            "an", "the", "some", "several", "many", "few", "two", "three", "four", "five", "six", "seven", "eight",
            "nine", "ten", "both", "all", "other", "multiple", "various", "numerous", "these", "those", "his",
            "her", "their", "its", "our", "my")
_CUT = frozenset({"in", "on", "at", "with", "of", "wearing", "who", "that", "which", "near", "by", "from", "for",
                  "and", "or", "holding", "under", "behind"})
#: names that do not denote countable objects of one kind
GENERIC_NAMES = frozenset({"", "one", "ones", "other", "others", "group", "crowd", "couple", "pair", "team", "family",
                           "band", "bunch", "lot", "all", "some", "them", "they", "each", "both", "thing", "stuff",
                           "someone", "something", "people group", "audience", "army", "herd", "flock"})


def category_name(phrase: str) -> str:
    """A phrase as a category name: lower-cased, leading articles / numbers / quantifiers dropped, cut before a
    preposition or relative word, head noun in the singular ("Two young men" -> "young man")."""
    words = phrase.lower().replace(",", " ").split()
    changed = True
    while words and changed:
        changed = False
        for lead in _LEADING:
            lw = lead.split()
            if words[:len(lw)] == lw and len(words) > len(lw):
                words = words[len(lw):]
                changed = True
                break
        if words and words[0].isdigit() and len(words) > 1:
            words = words[1:]
            changed = True
    for i, w in enumerate(words):
        if i > 0 and w in _CUT:
            words = words[:i]
            break
    if not words:
        return ""
    name = singular_noun(" ".join(words))
    return "" if name in GENERIC_NAMES or name.split()[-1] in GENERIC_NAMES else name


def categories(image: f30k.ImageEntities, min_boxes: int = 2, max_boxes: int = 8,
               exclude_types: Iterable[str] = ("bodyparts", "scene")) -> list[dict]:
    """Countable categories of one image: ``{entity_id, category, boxes, first}`` (``first`` = (sentence, word) of
    the first mention), in order of first mention; ambiguous names are dropped (module docstring)."""
    exclude = set(exclude_types)
    first: dict[str, f30k.Phrase] = {}
    for p in image.phrases:
        first.setdefault(p.entity_id, p)
    found = []
    for eid, phrase in first.items():
        entity = image.entities.get(eid)
        if entity is None or eid == f30k.NULL_CHAIN or not min_boxes <= len(entity.boxes) <= max_boxes:
            continue
        if exclude & set(entity.types):
            continue
        name = category_name(phrase.text)
        if name:
            found.append({"entity_id": eid, "category": name, "boxes": [tuple(b) for b in entity.boxes],
                          "first": (phrase.sentence_index, phrase.first_word_index),
                          "sentences": {q.sentence_index for q in image.phrases if q.entity_id == eid}})
    names = [c["category"] for c in found]
    ambiguous = {n for n in names if names.count(n) > 1}
    if ambiguous:
        log.debug("%s: category name(s) %s name several chains; left out", image.image_id, sorted(ambiguous))
    found = [c for c in found if c["category"] not in ambiguous]
    return sorted(found, key=lambda c: c["first"])


def boxes_overlap(a, b) -> bool:
    """True when two boxes share area beyond an edge (touching edges, as ``x_a2 == x_b1``, are not an overlap: the
    complement of one of the four §3.2 cases holding)."""
    return not (a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1])


#: ``counting.overlap_with`` values: §3.3's any other object, or the two counted categories only (option)
OVERLAP_RULES = ("any", "counted")


def count_change(boxes_p, boxes_q, rng: random.Random | None = None, others=(), overlap_with: str = "any"
                 ) -> dict | None:
    """The §3.3 edit for categories P (fewer boxes) and Q: ``{overlap, edit, new_n_p, new_n_q, mask_boxes,
    mask_of}`` (``mask_of`` names the category each mask box belongs to, "P", "Q" or "other"), or None when no
    removal leaves one object of each. ``others``: the boxes of the image's other objects; ``overlap_with``:
    ``any`` (§3.3, a P or Q box overlapping any other box, of another P / Q object or of ``others``) or
    ``counted`` (only P boxes against Q boxes; ``others`` ignored)."""
    if overlap_with not in OVERLAP_RULES:
        raise ConfigError(f"countercurate.counting.overlap_with: expected one of {', '.join(OVERLAP_RULES)}, "
                          f"got {overlap_with!r}")
    rng = rng or random.Random(0)
    n_p, n_q = len(boxes_p), len(boxes_q)
    labelled = ([("P", i, tuple(b)) for i, b in enumerate(boxes_p)]
                + [("Q", i, tuple(b)) for i, b in enumerate(boxes_q)]
                + ([("other", i, tuple(b)) for i, b in enumerate(others)] if overlap_with == "any" else []))

    def touching(cat, i, box):   # every other object the box overlaps (all of them go when it is removed)
        return [(c, j, b) for c, j, b in labelled if (c, j) != (cat, i) and boxes_overlap(box, b)]

    def overlapped(cat, i, box):   # the overlaps that make the pair "overlapping": any, or the other category's
        return [x for x in touching(cat, i, box) if overlap_with == "any" or x[0] not in (cat, "other")]

    counted = [x for x in labelled if x[0] != "other"]
    if not any(overlapped(*x) for x in counted):
        target = rng.randrange(n_q)
        return {"overlap": False, "edit": "add", "new_n_p": n_p + 1, "new_n_q": n_q - 1,
                "mask_boxes": [list(boxes_q[target])], "mask_of": ["Q"]}
    candidates = ([x for x in counted if x[0] == "Q" and overlapped(*x)]
                  + [x for x in counted if x[0] == "P" and overlapped(*x)])
    for cat, i, box in candidates:
        removed = [(cat, i, box)] + touching(cat, i, box)
        new_p = n_p - sum(1 for c, _, _ in removed if c == "P")
        new_q = n_q - sum(1 for c, _, _ in removed if c == "Q")
        if new_p >= 1 and new_q >= 1:
            return {"overlap": True, "edit": "remove", "new_n_p": new_p, "new_n_q": new_q,
                    "mask_boxes": [list(b) for _, _, b in removed], "mask_of": [c for c, _, _ in removed]}
    return None


def other_boxes(image: f30k.ImageEntities, skip: Iterable[str], exclude_types: Iterable[str] = ()) -> list[tuple]:
    """Boxes of the image's objects other than the chains in ``skip`` (and the null chain): every chain with boxes
    whose types are not among ``exclude_types`` (bodyparts, scene: not objects the edit could damage)."""
    skip, exclude = set(skip), set(exclude_types)
    return [tuple(b) for eid, entity in image.entities.items()
            if eid not in skip and eid != f30k.NULL_CHAIN and not exclude & set(entity.types) for b in entity.boxes]


def counting_items(image: f30k.ImageEntities, cfg: Mapping | None = None) -> list[dict]:
    """Flickr30k-Counting items of one image (:data:`COLUMNS` less ``image_path``)."""
    opts = settings(cfg)
    cats = categories(image, int(opts["min_boxes"]), int(opts["max_boxes"]), opts["exclude_types"])
    generic = str(opts["generic_category"])
    items = []
    for i, c1 in enumerate(cats):
        for c2 in cats[i + 1:]:
            if opts["require_same_sentence"] and not (c1["sentences"] & c2["sentences"]):
                continue
            p, q = (c2, c1) if len(c2["boxes"]) < len(c1["boxes"]) else (c1, c2)
            rng = random.Random(f"{opts['random_state']}:{image.image_id}:{p['entity_id']}:{q['entity_id']}")
            others = (other_boxes(image, {p["entity_id"], q["entity_id"]}, opts["exclude_types"])
                      if opts["overlap_with"] == "any" else ())
            change = count_change(p["boxes"], q["boxes"], rng, others, opts["overlap_with"])
            if change is None:
                continue
            n_p, n_q = len(p["boxes"]), len(q["boxes"])
            phrases = [p["category"]] if change["edit"] == "add" else [generic] * len(change["mask_boxes"])
            items.append({
                "item_id": f"{image.image_id}_{p['entity_id']}_{q['entity_id']}", "image_id": image.image_id,
                "width": image.width, "height": image.height, "entity_p": p["entity_id"],
                "category_p": p["category"], "n_p": n_p, "entity_q": q["entity_id"], "category_q": q["category"],
                "n_q": n_q, "boxes_p": [list(b) for b in p["boxes"]], "boxes_q": [list(b) for b in q["boxes"]],
                "overlap": change["overlap"], "edit": change["edit"], "new_n_p": change["new_n_p"],
                "new_n_q": change["new_n_q"], "mask_boxes": change["mask_boxes"], "mask_phrases": phrases,
                "caption": count_caption(n_p, p["category"], n_q, q["category"]),
                "negative_caption": count_caption(change["new_n_p"], p["category"], change["new_n_q"],
                                                  q["category"])})
    return items


def settings(cfg: Mapping | None = None) -> dict:
    """The ``counting`` section of a ``countercurate`` config view, validated with the schema's defaults filled;
    ``min_boxes <= max_boxes`` (a cross-key rule) is checked here."""
    out = fill_section("countercurate.counting", (cfg or {}).get("counting"))
    if not 1 <= int(out["min_boxes"]) <= int(out["max_boxes"]):
        raise ConfigError(f"countercurate.counting: min_boxes {out['min_boxes']} / max_boxes {out['max_boxes']} "
                          "must satisfy 1 <= min_boxes <= max_boxes. Fix: use 2 and 8 as the released code (§3.3)")
    return out


def build_counting(images: Iterable[f30k.ImageEntities], cfg: Mapping | None = None,
                   images_dir: str | Path | None = None) -> pd.DataFrame:
    """The Flickr30k-Counting table (:data:`COLUMNS`) of ``images``."""
    rows = []
    for image in images:
        for item in counting_items(image, cfg):
            item["image_path"] = f30k.image_path(images_dir, image.image_id)
            rows.append(item)
    return pd.DataFrame(rows, columns=COLUMNS)


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def inpaint_requests(frame: pd.DataFrame) -> pd.DataFrame:
    """§3.3: one grounded-inpainting request per item: ``mask_boxes`` (pixels) and ``boxes`` (normalised xyxy for
    GLIGEN) with one phrase each — the incremented category P into one Q box (``counting_add``) or the generic
    category into every removed box (``counting_remove``) — and a prompt naming them."""
    rows = []
    for r in frame.itertuples(index=False):
        phrases = list(r.mask_phrases)
        noun = phrases[0]
        prompt = (f"{_article(noun)} {noun}" if len(phrases) == 1
                  else f"{number_word(len(phrases))} {plural_noun(noun)}")
        rows.append({"item_id": r.item_id, "image_id": r.image_id, "image_path": r.image_path,
                     "kind": KIND, "purpose": PURPOSE_ADD if r.edit == "add" else PURPOSE_REMOVE, "prompt": prompt,
                     "phrases": phrases,
                     "boxes": [normalise_box(b, r.width, r.height) for b in r.mask_boxes],
                     "mask_boxes": [list(b) for b in r.mask_boxes], "width": r.width, "height": r.height})
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def counting_files(cfg: Mapping | None, entities_root, out, images=None, out_requests=None,
                   strict: bool = True) -> pd.DataFrame:
    """``counterfactory countercurate counting``: the counting table of the Flickr30k Entities under
    ``entities_root`` (:func:`build_counting`), written to ``out``; with ``out_requests`` the grounded-inpainting
    requests (:data:`REQUESTS_FILE`) written into that folder. ``strict=False``: clip boxes outside the image and
    ignore unknown chain ids. Returns the table."""
    images_dir = default_images_dir(entities_root, images, cfg)
    frame = build_counting(f30k.iter_images(entities_root, strict=strict), cfg, images_dir)
    write_parquet(out, frame)
    if out_requests:
        write_parquet(Path(out_requests) / REQUESTS_FILE, inpaint_requests(frame))
    return frame
