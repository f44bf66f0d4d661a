"""Reader for CelebA (Liu et al. 2015) in its official layout, for the CVLD classification study (§5.2, Table 1).

Layout under ``root`` (reference notes B7)
------------------------------------------
* ``list_attr_celeba.txt``: line 1 = number of images; line 2 = the 40 attribute names separated by spaces; then one
  line per image, ``000001.jpg -1  1 ...``, values ±1 separated by a variable number of spaces;
* ``list_eval_partition.txt``: ``000001.jpg 0`` per line, no header; 0 = train, 1 = valid, 2 = test;
* ``img_align_celeba/<image_id>``: the aligned and cropped images.

:func:`load_celeba` returns one row per image of a split with ``image_id, image_path, split`` and the 40 attributes
as 0/1 (``(x + 1) // 2``). CVLD (appendix A, following Ramaswamy et al. 2021) classifies the 14 gender-independent
attributes of :data:`GENDER_INDEPENDENT` with gender (:data:`PROTECTED` = ``Male``) as the protected attribute.
A malformed file is an :class:`~counterfactory.errors.InputError` naming the file, the line and the fix.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import input_error
from .paths import join_under

#: CelebA's 40 attributes in the order of ``list_attr_celeba.txt`` (``Male`` is index 20)
ATTRIBUTES: tuple[str, ...] = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes", "Bald", "Bangs", "Big_Lips", "Big_Nose",
    "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair", "Bushy_Eyebrows", "Chubby", "Double_Chin", "Eyeglasses",
    "Goatee", "Gray_Hair", "Heavy_Makeup", "High_Cheekbones", "Male", "Mouth_Slightly_Open", "Mustache",
    "Narrow_Eyes", "No_Beard", "Oval_Face", "Pale_Skin", "Pointy_Nose", "Receding_Hairline", "Rosy_Cheeks",
    "Sideburns", "Smiling", "Straight_Hair", "Wavy_Hair", "Wearing_Earrings", "Wearing_Hat", "Wearing_Lipstick",
    "Wearing_Necklace", "Wearing_Necktie", "Young",
)
#: the 14 gender-independent target attributes of CVLD appendix A (Ramaswamy et al. 2021), CelebA spelling
GENDER_INDEPENDENT: tuple[str, ...] = (
    "Bags_Under_Eyes", "Bangs", "Black_Hair", "Blond_Hair", "Brown_Hair", "Chubby", "Eyeglasses", "Gray_Hair",
    "High_Cheekbones", "Mouth_Slightly_Open", "Narrow_Eyes", "Smiling", "Wearing_Earrings", "Wearing_Hat",
)
#: the protected attribute (1 = male, 0 = female)
PROTECTED = "Male"
ATTR_FILE = "list_attr_celeba.txt"
PARTITION_FILE = "list_eval_partition.txt"
IMAGE_DIR = "img_align_celeba"
#: partition code -> split name
PARTITIONS = {"0": "train", "1": "valid", "2": "test"}
SPLIT_ALIASES = {"train": "train", "valid": "valid", "val": "valid", "validation": "valid", "test": "test"}
FIX_ATTR = (f"use the official {ATTR_FILE}: a count line, a line with the 40 attribute names, then "
            "'<image> ±1 ...' with one value per attribute")
FIX_PART = f"use the official {PARTITION_FILE}: '<image> <0|1|2>' per line (0 train, 1 valid, 2 test)"


def _lines(path: Path, what: str, fix: str) -> list[str]:
    if not path.is_file():
        raise input_error(path, None, f"CelebA {what} not found", f"download CelebA and keep its layout; {fix}")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise input_error(path, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})", fix) from exc


def read_attributes(path: str | Path) -> pd.DataFrame:
    """``list_attr_celeba.txt`` as ``image_id`` + the 40 attributes (0/1 int8), in file order."""
    path = Path(path)
    lines = _lines(path, "attribute file", FIX_ATTR)
    if len(lines) < 2:
        raise input_error(path, None, "needs a count line and a header line", FIX_ATTR)
    try:
        count = int(lines[0].strip())
    except ValueError:
        raise input_error(path, "line 1", f"expected the number of images, got {lines[0].strip()[:40]!r}",
                          FIX_ATTR) from None
    names = lines[1].split()
    missing = [a for a in ATTRIBUTES if a not in names]
    unknown = [a for a in names if a not in ATTRIBUTES]
    if missing or unknown or len(names) != len(set(names)):
        problem = (f"missing attribute column(s) {missing}" if missing else
                   f"unknown attribute column(s) {unknown}" if unknown else "an attribute column is repeated")
        raise input_error(path, "line 2", problem, FIX_ATTR)
    ids, rows, seen = [], [], set()
    for lineno, raw in enumerate(lines[2:], start=3):
        fields = raw.split()
        if not fields:
            continue
        if len(fields) != len(names) + 1:
            raise input_error(path, f"line {lineno}", f"{len(fields) - 1} values for {len(names)} attributes",
                              FIX_ATTR)
        image = fields[0]
        if image in seen:
            raise input_error(path, f"line {lineno}", f"image {image} is listed twice", FIX_ATTR)
        seen.add(image)
        values = []
        for name, v in zip(names, fields[1:]):
            if v not in ("1", "-1"):
                raise input_error(path, f"line {lineno}", f"{name} of {image} is {v!r}, not 1 or -1", FIX_ATTR)
            values.append((int(v) + 1) // 2)
        ids.append(image)
        rows.append(values)
    if len(ids) != count:
        raise input_error(path, "line 1", f"announces {count} images but {len(ids)} rows follow", FIX_ATTR)
    frame = pd.DataFrame(rows, columns=names, dtype="int8")[list(ATTRIBUTES)]
    frame.insert(0, "image_id", ids)
    return frame


def read_partition(path: str | Path) -> dict[str, str]:
    """``list_eval_partition.txt`` as ``{image_id: "train" | "valid" | "test"}``."""
    path = Path(path)
    out: dict[str, str] = {}
    for lineno, raw in enumerate(_lines(path, "partition file", FIX_PART), start=1):
        fields = raw.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise input_error(path, f"line {lineno}", f"expected '<image> <partition>', got {raw.strip()[:60]!r}",
                              FIX_PART)
        image, code = fields
        if code not in PARTITIONS:
            raise input_error(path, f"line {lineno}", f"unknown partition {code!r} for {image} (allowed: 0, 1, 2)",
                              FIX_PART)
        if image in out:
            raise input_error(path, f"line {lineno}", f"image {image} is listed twice", FIX_PART)
        out[image] = PARTITIONS[code]
    return out


def load_celeba(root: str | Path, split: str | None = "test", *, check_images: bool = True) -> pd.DataFrame:
    """The images of one split (``train``, ``valid``/``val``, ``test``; None = all) with columns
    ``image_id, image_path, split`` and the 40 attributes as 0/1, in file order.

    Every image of the attribute file must have a partition (else an error naming the image). With
    ``check_images`` a missing image file of the selected split is an error naming it.
    """
    root = Path(root)
    if split is not None and split not in SPLIT_ALIASES:
        raise input_error(root, None, f"unknown CelebA split {split!r}", "use train, valid (or val), test or None")
    attrs = read_attributes(root / ATTR_FILE)
    parts = read_partition(root / PARTITION_FILE)
    unassigned = [i for i in attrs["image_id"] if i not in parts]
    if unassigned:
        raise input_error(root / PARTITION_FILE, None,
                          f"{len(unassigned)} image(s) of {ATTR_FILE} have no partition, e.g. {unassigned[0]}",
                          FIX_PART)
    attrs.insert(1, "split", attrs["image_id"].map(parts))
    if split is not None:
        attrs = attrs[attrs["split"] == SPLIT_ALIASES[split]].reset_index(drop=True)
    image_dir = root / IMAGE_DIR
    paths = [str(join_under(image_dir, i, source=root / ATTR_FILE, record=f"image {i!r}",
                            key="the CelebA img_align_celeba folder").resolve()) for i in attrs["image_id"]]
    if check_images:
        absent = [p for p in paths if not Path(p).is_file()]
        if absent:
            raise input_error(absent[0], None, f"CelebA image not found ({len(absent)} of {len(paths)} missing)",
                              f"unpack img_align_celeba.zip into {image_dir}")
    attrs.insert(1, "image_path", paths)
    return attrs
