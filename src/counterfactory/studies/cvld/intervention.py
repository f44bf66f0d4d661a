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
"""

from __future__ import annotations

import json

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
        fields = {"caption": rec[caption_col]}
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
