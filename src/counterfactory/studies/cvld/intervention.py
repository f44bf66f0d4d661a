"""Per-direction text intervention with the ``llm`` role (appendix B; ``intervention.llm_prompt: per_direction``).

Appendix B's instruction turns the people of *one* gender into the other ("turn all female people into male"), so an
example of group D_a is rewritten towards -a (§4.1: each subgroup's examples are flipped). The paper does not say
how an example's direction is chosen; ours: by the image, from its captions -- the gender named by more of its
captions (:func:`counterfactory.metrics.captioning.gender_of_caption`; a caption naming both or neither counts for
none) is turned into the other, and every caption of the image gets that instruction, so its captions can agree on
one edit in the majority vote. An image whose captions name both genders equally often, or none, is flipped
towards female (the choice has no effect on captions that name nobody: the instruction leaves them as they are).

The edit-prompt round is :mod:`counterfactory.text.gender`'s ``cvld_edit_prompt`` task (appendix B's second
template, which already covers both directions). ``llm_prompt: both_directions`` is the one-pass instruction of
:func:`counterfactory.text.gender.run_llm` (ours: every gendered word flips, whatever the image's group).

Answers are checked for meaning, not only form: an intervened caption must be the caption with its gendered words
swapped in the request's direction, as the rule-based swapper does it
(:func:`counterfactory.text.gender.intervention_problem`, the ``cvld_intervene`` task's check; otherwise the answer is
invalid and no edit prompt is asked for it), a vote is accepted only for an image some caption of which names a
gendered person (:func:`vet_votes`), and every unusable answer and turned-down vote is a row of the rejected table
with its reason (:func:`rejected_rows`; a failed swap check: ``failed_check``).
"""

from __future__ import annotations

import json
import re

import pandas as pd

from ...errors import input_error

TO_MALE, TO_FEMALE = "to_male", "to_female"

#: the instruction of one direction (our wording of appendix B's template: copy the caption; check for people;
#: none -> unchanged; else flip every person of one gender; keep ages; keep everything unrelated to gender)
_TEMPLATE = """Rewrite the caption below, following these steps:
"{caption}"

- Copy the caption, then check whether it mentions any person.
  - If it mentions nobody, leave it exactly as it is.
  - If it mentions people, make every {source} person {target}. For instance, "{w1}" becomes "{w2}" and "{g1}" becomes "{g2}".
  - Keep each person's age. For instance, never make "{young}" into "{adult}" or "{adult}" into "{young}".
  - Leave everything that has nothing to do with gender as it is, such as ethnicity or colours.

Field of your answer:
- "intervened": the rewritten caption."""

_WORDS = {TO_MALE: dict(source="female", target="male", w1="woman", w2="man", g1="girl", g2="boy",
                        young="boy", adult="man"),
          TO_FEMALE: dict(source="male", target="female", w1="man", w2="woman", g1="boy", g2="girl",
                          young="girl", adult="woman")}


def instruction(caption: str, direction: str) -> str:
    """The user prompt that rewrites ``caption`` in ``direction`` (``to_male`` or ``to_female``)."""
    if direction not in _WORDS:
        raise ValueError(f"direction: expected {TO_MALE} or {TO_FEMALE}, got {direction!r}")
    return _TEMPLATE.format(caption=caption, **_WORDS[direction])


def directions(frame: pd.DataFrame, caption_col: str = "caption", image_col: str = "image_id") -> pd.Series:
    """The direction of every caption of ``frame``: that of its image (module docstring)."""
    from ...metrics.captioning import gender_of_caption

    genders = frame[caption_col].astype(str).map(gender_of_caption)
    male = (genders == "male").groupby(frame[image_col]).transform("sum")
    female = (genders == "female").groupby(frame[image_col]).transform("sum")
    return pd.Series([TO_MALE if f > m else TO_FEMALE for m, f in zip(male, female)], index=frame.index,
                     name="direction")


def requests(frame: pd.DataFrame, caption_col: str = "caption", id_col: str = "caption_id",
             image_col: str = "image_id", source: str = "captions") -> pd.DataFrame:
    """``llm`` request rows of the intervention round (task ``cvld_intervene`` with each row's own prompt and
    answer schema) and the ``direction`` of each."""
    from ...text import gender

    missing = [c for c in (id_col, caption_col, image_col) if c not in frame.columns]
    if missing:
        raise input_error(source, None, f"missing column(s) {', '.join(missing)}",
                          f"give every caption an {id_col}, an {image_col} and a {caption_col}")
    dirs = directions(frame, caption_col, image_col)
    rows = []
    for rec, direction in zip(frame.to_dict("records"), dirs):
        fields = {"caption": rec[caption_col], "direction": direction}   # the answer is checked in this direction
        rows.append({"item_id": str(rec[id_col]), "task": gender.INTERVENE_TASK,
                     "fields": json.dumps(fields, ensure_ascii=False),
                     "prompt": instruction(str(rec[caption_col]), direction),
                     "schema": json.dumps(gender.intervene_schema(fields)), "direction": direction})
    return pd.DataFrame(rows, columns=["item_id", "task", "fields", "prompt", "schema", "direction"])


def run_llm(cfg: dict, frame: pd.DataFrame, caption_col: str = "caption", id_col: str = "caption_id",
            image_col: str = "image_id", source: str = "captions", cache_path=None) -> pd.DataFrame:
    """Both ``llm`` rounds with the per-direction instruction; the columns of
    :func:`counterfactory.text.gender.run_llm`, plus ``direction``."""
    from ...text import gender, llm

    req = requests(frame, caption_col, id_col, image_col, source)
    first = llm.run_requests(cfg, req.drop(columns=["direction"]), cache_path=cache_path)
    base = frame.drop(columns=["intervened"], errors="ignore")
    parsed = gender.parse_llm_answers(first, base, caption_col, id_col)
    ok = parsed[parsed["intervened"].notna()]
    second = llm.run_requests(cfg, gender.llm_requests(ok, caption_col, id_col, source, (gender.EDIT_TASK,)),
                              cache_path=cache_path) if len(ok) else pd.DataFrame(columns=llm.RESULT_COLUMNS)
    result = gender.parse_llm_answers(pd.concat([first, second], ignore_index=True), base, caption_col, id_col)
    result["direction"] = req["direction"].to_numpy()
    return result


# --------------------------------------------------------------------------- rejected interventions, with reasons

#: columns of :func:`rejected_rows`: one row per rejected caption answer or image vote
REJECTED_COLUMNS = ["stage", "item_id", "image_id", "task", "reason", "detail"]
#: reason of an image whose captions name no gendered person (its vote cannot be a gender intervention)
NO_GENDERED_PERSON = "no_gendered_person"
_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")


def names_gendered_person(caption, words=None) -> bool:
    """Whether ``caption`` holds a word of the gender word list (:func:`counterfactory.text.gender.load_words`: a
    gendered person noun, title or pronoun, e.g. "woman", "boy", "her")."""
    from ...text import gender

    lex = gender.load_words(words)
    return isinstance(caption, str) and any(w in lex.gender for w in _WORD.findall(caption.lower()))


def vet_votes(votes: pd.DataFrame, frame: pd.DataFrame, caption_col: str = "caption", image_col: str = "image_id",
              words=None) -> pd.DataFrame:
    """``votes`` with a ``reason`` column: an accepted vote of an image none of whose captions names a gendered
    person is turned down (``accepted=False``, reason :data:`NO_GENDERED_PERSON`): an instruction such as "turn the
    woman into a man" for a photo of coins is the ``llm``'s invention, not an intervention of the image. The
    reason of every other vote that is not accepted: ``tie``, ``no_change`` or ``too_few_votes``."""
    gendered = set(frame.loc[frame[caption_col].map(lambda c: names_gendered_person(c, words)), image_col])
    out = votes.copy()
    reasons = []
    for rec in out.to_dict("records"):
        if rec["accepted"] and rec[image_col] not in gendered:
            reasons.append(NO_GENDERED_PERSON)
        elif rec["accepted"]:
            reasons.append(None)
        elif rec["edit_prompt"]:
            reasons.append("too_few_votes")
        else:
            reasons.append("tie" if rec["votes"] else "no_change")
    out["reason"] = pd.Series(reasons, index=out.index, dtype=object)
    out["accepted"] = out["accepted"].astype(bool) & (out["reason"] != NO_GENDERED_PERSON)
    return out


def rejected_rows(swapped: pd.DataFrame, votes: pd.DataFrame, id_col: str = "caption_id",
                  image_col: str = "image_id") -> pd.DataFrame:
    """Every rejected or unusable ``llm`` answer of the intervention (``stage`` ``caption``: its caption id, the task
    and reason code of :func:`counterfactory.text.llm.reason_code`, the message in ``detail``) and every vote turned
    down for naming no gendered person (``stage`` ``image``: ``reason`` :data:`NO_GENDERED_PERSON`, the prompt in
    ``detail``)."""
    from ...text import llm

    rows = []
    if "llm_valid" in swapped.columns:
        for rec in swapped[~swapped["llm_valid"].astype(bool)].to_dict("records"):
            detail = str(rec.get("llm_error") or "invalid answer")
            task, _, message = detail.partition(": ")
            if not message:      # "no llm answer": the round was never asked
                task, message = "", detail
            code = "no_answer" if detail == "no llm answer" else llm.reason_code(message)
            rows.append({"stage": "caption", "item_id": str(rec[id_col]), "image_id": rec[image_col], "task": task,
                         "reason": code, "detail": detail})
    if "reason" in votes.columns:
        for rec in votes[votes["reason"] == NO_GENDERED_PERSON].to_dict("records"):
            rows.append({"stage": "image", "item_id": str(rec[image_col]), "image_id": rec[image_col], "task": "vote",
                         "reason": NO_GENDERED_PERSON,
                         "detail": f"{rec['votes']} of {rec['n_captions']} captions voted {rec['edit_prompt']!r}, but "
                                   "none of the image's captions names a gendered person"})
    return pd.DataFrame(rows, columns=REJECTED_COLUMNS).astype({"image_id": object})
