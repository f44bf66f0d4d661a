"""Reader for PointQA LookTwice (Mani et al. 2022; repository ``princetonvisualai/pointingqa``), reformatted into the
counting benchmark of CounterCurate §4.3 (Tables 2 and 8).

Files (reference notes B5)
--------------------------
* ``Datasets/LookTwiceQA/looktwiceqa_dataset.json``: an object ``{img_id: [QA, ...]}``; each QA has the lowercase
  keys ``id`` (the Visual Genome image id), ``obj_type`` (a plural noun, e.g. ``"dogs"``), ``obj_question``,
  ``super_question``, ``general_question``, ``ans`` (the count, a string), ``bbox``, ``point``, ``supercategory``.
  Only ``obj_type`` and ``ans`` are required here; ``id`` defaults to the enclosing key.
* ``looktwiceqa_{train,val,test}_imgs.json``: JSON lists of image-id strings. The released CounterCurate code
  (``benchmark/prep_count_benchmark.py``) uses **every** image of the dataset file, so ``imgs_list`` is optional.

The CounterCurate reformatting (§4.3; ``prep_count_benchmark.py``, ``CLIP_test_counting.py``)
--------------------------------------------------------------------------------------------------------
* QAs are grouped by image (``id``); an image with the **same** ``obj_type`` asked twice (exact string match) is
  dropped entirely, as the counts of the two questions would be ambiguous (:func:`drop_repeated_names`).
* Each remaining (image, object type, count n) becomes a positive caption with n and a negative one with n + 1,
  from ``template`` (default :data:`TEMPLATE`, the code's ``"there are {n} {name} in the image."``; the paper's
  text writes it "There are n_J J's").

Output
------
:func:`read_looktwice` returns one row per kept question with the columns :data:`COLUMNS`; ``image_path`` is the
absolute path of ``image_name`` (default ``"{id}.jpg"``, a glob such as ``"VG_100K*/{id}.jpg"`` is allowed and must
match one file) under the images root.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from ..errors import describe_path, input_error
from ..settings import schema_default
from .coco import read_json
from .pata import resolve_image

log = logging.getLogger(__name__)

#: the schema's countercurate.benchmarks.looktwice defaults (the code's caption template; ``{id}.jpg`` files)
TEMPLATE = schema_default("countercurate.benchmarks.looktwice.template")
DEFAULT_IMAGE_NAME = schema_default("countercurate.benchmarks.looktwice.image_name")
COLUMNS = ["image_id", "obj_type", "count", "question", "caption", "negative_caption", "image_path"]
REQUIRED = ("obj_type", "ans")
FIX = ("use the official Datasets/LookTwiceQA/looktwiceqa_dataset.json of github.com/princetonvisualai/pointingqa "
       "(an object {img_id: [{id, obj_type, obj_question, ans, ...}, ...]})")


def _count(value, path: Path, where: str) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise input_error(path, where, f"'ans' is {value!r}, not a whole number", FIX) from None
    if n < 0:
        raise input_error(path, where, f"'ans' is {value!r}, a negative count", FIX)
    return n


def read_questions(path: str | Path) -> pd.DataFrame:
    """Every QA of ``looktwiceqa_dataset.json`` in file order: ``image_id, obj_type, count, question`` (no filter)."""
    path = Path(path)
    if not path.is_file():
        raise input_error(describe_path(path), None, "LookTwiceQA dataset file not found",
                          "point benchmarks.looktwice.dataset at Datasets/LookTwiceQA/looktwiceqa_dataset.json")
    doc = read_json(path, "LookTwiceQA dataset file")
    if not isinstance(doc, dict):
        raise input_error(path, None, f"top level is a JSON {type(doc).__name__}, not an object", FIX)
    rows = []
    for key, items in doc.items():
        if not isinstance(items, list):
            raise input_error(path, f"image {key!r}", f"is a JSON {type(items).__name__}, not a list of QAs", FIX)
        for i, qa in enumerate(items):
            where = f"image {key!r}, QA {i}"
            if not isinstance(qa, dict):
                raise input_error(path, where, f"is a JSON {type(qa).__name__}, not an object", FIX)
            missing = [k for k in REQUIRED if k not in qa]
            if missing:
                found = ", ".join(map(repr, qa)) or "none"
                raise input_error(path, where, f"missing key {', '.join(map(repr, missing))} (found: {found})", FIX)
            name = qa["obj_type"]
            if not isinstance(name, str) or not name.strip():
                raise input_error(path, where, f"'obj_type' is {name!r}, not a non-empty string", FIX)
            rows.append({"image_id": str(qa.get("id", key)), "obj_type": name, "count": _count(qa["ans"], path, where),
                         "question": str(qa.get("obj_question") or "")})
    if not rows:
        raise input_error(path, None, "has no questions", FIX)
    return pd.DataFrame(rows, columns=["image_id", "obj_type", "count", "question"])


def drop_repeated_names(questions: pd.DataFrame) -> pd.DataFrame:
    """Drop every image whose questions name the same ``obj_type`` more than once (CounterCurate §4.3 /
    ``prep_count_benchmark.py``: the whole image goes, not only the repeated questions)."""
    repeated = questions.duplicated(["image_id", "obj_type"], keep=False)
    bad = set(questions.loc[repeated, "image_id"])
    if bad:
        log.info("LookTwice: dropping %d image(s) with a repeated object name", len(bad))
    return questions[~questions["image_id"].isin(bad)].reset_index(drop=True)


def read_image_list(path: str | Path) -> list[str]:
    """``looktwiceqa_<split>_imgs.json``: a JSON list of image ids (returned as strings)."""
    path = Path(path)
    if not path.is_file():
        raise input_error(describe_path(path), None, "LookTwiceQA image list not found",
                          "point benchmarks.looktwice.imgs_list at looktwiceqa_<split>_imgs.json, or leave it unset "
                          "to use every image (as the released CounterCurate code does)")
    doc = read_json(path, "LookTwiceQA image list")
    if not isinstance(doc, list):
        raise input_error(path, None, f"top level is a JSON {type(doc).__name__}, not a list of image ids",
                          "use the official looktwiceqa_<split>_imgs.json")
    return [str(x) for x in doc]


def read_looktwice(dataset: str | Path, images_root: str | Path | None = None, *, imgs_list: str | Path | None = None,
                   template: str = TEMPLATE, image_name: str = DEFAULT_IMAGE_NAME,
                   check_images: bool = True) -> pd.DataFrame:
    """The counting benchmark of CounterCurate §4.3: questions of ``dataset`` (restricted to the ids of
    ``imgs_list`` when given), images with a repeated object name dropped, captions for n and n + 1.

    ``template`` is formatted with ``n`` and ``name``. With ``images_root`` and ``check_images`` an image that cannot
    be found is an error naming the image id and the pattern."""
    questions = read_questions(dataset)
    if imgs_list is not None:
        keep = set(read_image_list(imgs_list))
        questions = questions[questions["image_id"].isin(keep)].reset_index(drop=True)
    frame = drop_repeated_names(questions)
    if frame.empty:
        raise input_error(dataset, None, "no question is left after dropping images with a repeated object name"
                          + (f" and keeping the images of {imgs_list}" if imgs_list is not None else ""), FIX)
    try:
        pairs = list(zip(frame["count"], frame["obj_type"]))
        frame["caption"] = [template.format(n=n, name=t) for n, t in pairs]
        frame["negative_caption"] = [template.format(n=n + 1, name=t) for n, t in pairs]
    except (KeyError, IndexError, ValueError) as exc:
        raise input_error(template, None, f"caption template cannot be formatted ({exc!r})",
                          "use only the fields {n} and {name}") from exc
    paths: dict[str, str | None] = {}
    if images_root is not None:
        for image_id in dict.fromkeys(frame["image_id"]):
            paths[image_id] = resolve_image(images_root, image_name, {"id": image_id})
            if paths[image_id] is None and check_images:
                where = Path(images_root).resolve()
                raise input_error(dataset, f"image {image_id!r}",
                                  f"image {image_name.format(id=image_id)!r} not found under {where}",
                                  "point benchmarks.looktwice.images at the Visual Genome images (set image_name, e.g. "
                                  "'VG_100K*/{id}.jpg', when they are in subfolders)")
    frame["image_path"] = frame["image_id"].map(paths) if paths else None
    return frame[COLUMNS]
