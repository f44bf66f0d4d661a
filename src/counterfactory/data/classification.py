"""Readers for the image-classification test sets of COCO-Counterfactuals §5.2 / Table 4, in the layouts
the datasets are distributed in. Reading is done by ``torchvision.datasets`` (``download=False``: nothing
is fetched); this module finds the data folder, adds checks and errors that name the file, the config key
and the fix, and returns image paths (or CIFAR's decoded array) with labels.

=============  ==========================================================================================
format         ``root`` (the data folder or a parent of it) and what is read
=============  ==========================================================================================
``cifar10``    ``cifar-10-batches-py/`` (``torchvision.datasets.CIFAR10``'s layout, test split): ``test_batch``
               and ``batches.meta`` (``label_names``). The training batches need not be present. The files are
               pickles, and unpickling can run code: a file whose md5 is not the official release's is refused
               unless ``trust_unofficial_pickle: true`` is set for the dataset (then a warning: results are not
               comparable), and every CIFAR file is read by a restricted unpickler that builds only dicts, lists,
               strings, numbers and numpy arrays (:func:`safe_unpickle`).
``cifar100``   ``cifar-100-python/`` (``CIFAR100``, test split): ``test`` (``fine_labels``) and ``meta``
               (``fine_label_names``): the 100 fine classes.
``food101``    ``food-101/`` (``Food101``, split test): ``meta/test.json`` (``{class: ["class/id", ...]}``;
               classes sorted) and ``images/<class>/<id>.jpg``: the official 25,250-image test split. The
               folder must be named ``food-101``.
``caltech101`` ``caltech101/101_ObjectCategories/`` (``Caltech101``, target ``category``):
               ``<class>/image_NNNN.jpg``; ``BACKGROUND_Google`` is a class (102 classes, as in CLIP's
               evaluation) unless ``background_class: false`` (torchvision's 101). Every image is used (no
               official test split). The parent must be named ``caltech101`` (torchvision's layout).
``caltech256`` ``caltech256/256_ObjectCategories/`` (``Caltech256``): ``NNN.<name>/NNN_NNNN.jpg``; the
               numeric prefix is stripped from the class name; ``257.clutter`` is a class (257 classes)
               unless ``background_class: false``. Every image is used. The parent must be named
               ``caltech256``.
``imagenet``   an ImageFolder of the ILSVRC-2012 validation set (``torchvision.datasets.ImageFolder``),
               ``<root>/<wnid>/*.JPEG`` (as made by the common ``valprep.sh``), plus ``class_index``: either
               ``LOC_synset_mapping.txt`` (ILSVRC-2012 / Kaggle: ``n01440764 tench, Tinca tinca`` per
               line; the name before the first comma is used) or ``imagenet_class_index.json`` (Keras:
               ``{"0": ["n01440764", "tench"], ...}``); optional when ``class_names`` maps the wnids
               (``builtin:imagenet``). Classes are the wnid folders present, sorted, so label ``i`` is the
               i-th sorted wnid. (``torchvision.datasets.ImageNet`` would need the
               devkit archive or its ``meta.bin``.)
=============  ==========================================================================================

Class names for the prompts are made readable from the on-disk names: ``_`` and ``-`` become spaces,
Caltech-256's ``-101`` suffix (classes shared with Caltech-101) is removed. The prompts of CLIP's paper
use hand-edited names; ``class_names: torchvision`` gives the COCO-CF reference evaluation's names
(:func:`torchvision_class_names`); otherwise ``class_names`` selects such a list (:func:`resolve_class_names`):
``builtin:<map>`` (``resources/zeroshot/classnames/<map>.yaml``: CLIP's names for ``cifar10``,
``cifar100``, ``food101``, ``caltech101`` and ``imagenet``, keyed by on-disk class id), a ``.yaml`` /
``.json`` file mapping class id -> name, or a text file with one name per line in label order. Named
prompt-template lists (``templates: builtin:<name>``) live in ``resources/zeroshot/templates.yaml``
(:func:`builtin_templates`). ``max_per_class`` keeps the first N images of each class (file order for CIFAR, the
reader's order otherwise) for quick runs. :func:`dataset_input_files` lists what a reader opens (for
Snakemake) and fails, naming ``evaluation.classification.datasets.<name>.root``, when it is missing.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ConfigError, input_error

log = logging.getLogger(__name__)


class ImageList(Sequence):
    """Images of a dataset: file paths or an in-memory uint8 array (N, H, W, 3); ``[i]`` is a PIL image
    (arrays) or a path (files), ``[a:b]`` a list of them. Scorers accept both."""

    def __init__(self, paths: Sequence[Path] | None = None, array: np.ndarray | None = None):
        if (paths is None) == (array is None):
            raise ValueError("ImageList: give exactly one of paths or array")
        self.paths = list(paths) if paths is not None else None
        self.array = array

    def __len__(self) -> int:
        return len(self.paths) if self.paths is not None else int(self.array.shape[0])

    def _item(self, i: int):
        if self.paths is not None:
            return self.paths[i]
        from PIL import Image

        return Image.fromarray(self.array[i])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        if isinstance(index, (int, np.integer)):
            n = len(self)
            if not -n <= index < n:
                raise IndexError(index)
            return self._item(int(index) % n)
        raise TypeError(f"ImageList indices must be int or slice, not {type(index).__name__}")


@dataclass
class ClassificationDataset:
    name: str
    format: str
    root: Path
    classes: list[str]            # prompt-ready class names, label order
    images: ImageList
    labels: np.ndarray            # int64 (N,)
    class_ids: list[str] = field(default_factory=list)  # on-disk class identifiers, label order

    def __len__(self) -> int:
        return len(self.labels)

    def summary(self) -> dict:
        counts = np.bincount(self.labels, minlength=len(self.classes))
        return {"name": self.name, "format": self.format, "root": str(self.root), "n_images": int(len(self)),
                "n_classes": len(self.classes), "classes_with_images": int((counts > 0).sum())}


# --------------------------------------------------------------------------------------------
# where each format lives
# --------------------------------------------------------------------------------------------
def readable(name: str) -> str:
    """``"car_side"`` -> ``"car side"``, ``"american-flag"`` -> ``"american flag"``."""
    return re.sub(r"\s+", " ", name.replace("_", " ").replace("-", " ")).strip()


@dataclass(frozen=True)
class Layout:
    """An official on-disk layout: the data folder ``folder`` (found at ``root`` or ``root/<parents>/folder``),
    the entries it must hold, and the parent folder names torchvision insists on (``caltech101`` for
    ``<tv root>/caltech101/101_ObjectCategories``)."""
    title: str
    folder: str
    needs: tuple[str, ...]
    parents: tuple[str, ...] = ()
    archive: str = ""


LAYOUTS: dict[str, Layout] = {
    "cifar10": Layout("CIFAR-10", "cifar-10-batches-py", ("batches.meta", "test_batch"),
                      archive="cifar-10-python.tar.gz"),
    "cifar100": Layout("CIFAR-100", "cifar-100-python", ("meta", "test"), archive="cifar-100-python.tar.gz"),
    "food101": Layout("Food-101", "food-101", ("meta/test.json", "images"), archive="food-101.tar.gz"),
    "caltech101": Layout("Caltech-101", "101_ObjectCategories", (), ("caltech101",),
                         archive="caltech-101.zip (its 101_ObjectCategories.tar.gz)"),
    "caltech256": Layout("Caltech-256", "256_ObjectCategories", (), ("caltech256",),
                         archive="256_ObjectCategories.tar"),
}


def _key(name: str, field: str = "root") -> str:
    return f"evaluation.classification.datasets.{name}.{field}"


def locate(fmt: str, root: str | os.PathLike, name: str) -> Path:
    """The data folder of a dataset in format ``fmt`` configured at ``root`` (the folder itself or one of
    its parents); an InputError naming the config key, the layout and the fix when it is not there."""
    root = Path(root)
    if fmt == "imagenet":
        if not root.is_dir():
            raise input_error(root, None, f"ImageNet validation folder not found ({_key(name)})",
                              f"arrange ILSVRC2012_img_val as an ImageFolder (<root>/<wnid>/*.JPEG, e.g. with "
                              f"valprep.sh) and set {_key(name)} to it")
        return root
    lay = LAYOUTS[fmt]
    nest = [*lay.parents, lay.folder]
    candidates = [root / Path(*nest[i:]) for i in range(len(nest), -1, -1)]   # root, root/folder, ...
    for cand in candidates:
        if cand.name == lay.folder and cand.is_dir() and all((cand / n).exists() for n in lay.needs):
            if lay.parents and cand.parent.name != lay.parents[-1]:
                raise input_error(cand, None, f"{lay.title} must sit in a folder named {lay.parents[-1]!r} "
                                  f"(torchvision reads <root>/{'/'.join(nest)})",
                                  f"move it to .../{'/'.join(nest)} and set {_key(name)} to that path")
            return cand
    expected = " or ".join(str(c) for c in candidates[1:] if c != root) or str(root / lay.folder)
    missing = ", ".join(lay.needs) if lay.needs else "its class folders"
    raise input_error(root, None, f"not a {lay.title} folder ({_key(name)}): expected {expected} holding {missing}",
                      f"extract the official {lay.archive} and set {_key(name)} to its '{lay.folder}' folder "
                      f"(layouts: counterfactory.data.classification)")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _take_per_class(labels: np.ndarray, max_per_class: int | None) -> np.ndarray:
    """Indices of the first ``max_per_class`` items of each class, in their original order."""
    if not max_per_class:
        return np.arange(len(labels))
    keep = np.zeros(len(labels), dtype=bool)
    seen: dict[int, int] = {}
    for i, lab in enumerate(labels.tolist()):
        if seen.get(lab, 0) < max_per_class:
            keep[i] = True
            seen[lab] = seen.get(lab, 0) + 1
    return np.flatnonzero(keep)


def _file_dataset(name, fmt, root, class_ids: list[str], classes: list[str], paths: list[Path], labels,
                  max_per_class, listed_in: str) -> ClassificationDataset:
    """A dataset of image files (label order = ``class_ids``), every file checked to exist."""
    for p in paths:
        if not Path(p).is_file():
            raise input_error(p, None, f"listed by {listed_in} but missing",
                              "re-extract the official archive (file names must be as released)")
    labels = np.asarray(labels, dtype=np.int64)
    if not len(labels):
        raise input_error(root, None, "no images found in the class folders",
                          "check that the archive was extracted completely")
    keep = _take_per_class(labels, max_per_class)
    return ClassificationDataset(name=name, format=fmt, root=root, classes=classes,
                                 images=ImageList(paths=[Path(paths[i]) for i in keep]), labels=labels[keep],
                                 class_ids=class_ids)


# --------------------------------------------------------------------------------------------
# readers (torchvision.datasets, download=False; our checks and messages on top)
# --------------------------------------------------------------------------------------------
#: the only globals a CIFAR pickle may name (numpy's array reconstruction)
_PICKLE_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                   ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
                   ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _PICKLE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a dataset pickle (only numpy "
                                     "arrays, dicts, lists, strings and numbers); unpickling it could run code")


def safe_unpickle(path: str | os.PathLike):
    """``pickle.load`` of ``path`` (latin-1, as torchvision reads the Python-2 CIFAR pickles) that builds only
    plain containers and numpy arrays: any other global (``os.system`` in a ``__reduce__``) is an
    ``UnpicklingError``, so a tampered file cannot run code."""
    with open(path, "rb") as fh:
        return _RestrictedUnpickler(fh, encoding="latin1").load()


class _CifarTestSplit:
    """torchvision's CIFAR10/CIFAR100 test-split reading (``data`` (N, 32, 32, 3), ``targets``, ``classes``) with
    :func:`safe_unpickle` instead of ``pickle.load``; only the test split and ``meta`` are read (the training
    batches need not be present)."""

    def __init__(self, folder: Path, base):
        entry = safe_unpickle(folder / base.test_list[0][0])
        self.data = np.vstack([entry["data"]]).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
        self.targets = entry["labels"] if "labels" in entry else entry["fine_labels"]
        meta = safe_unpickle(folder / base.meta["filename"])
        self.classes = meta[base.meta["key"]]


def _read_cifar(fmt: str, root, name: str, max_per_class: int | None,
                trust_unofficial_pickle: bool = False) -> ClassificationDataset:
    from torchvision.datasets import CIFAR10, CIFAR100
    from torchvision.datasets.utils import check_integrity

    folder = locate(fmt, root, name)
    title = LAYOUTS[fmt].title
    base = CIFAR10 if fmt == "cifar10" else CIFAR100
    test_file, meta_file = base.test_list[0][0], base.meta["filename"]
    fix = f"re-extract the official {LAYOUTS[fmt].archive} (the python version)"
    for file, md5 in ((test_file, base.test_list[0][1]), (meta_file, base.meta["md5"])):
        if not (folder / file).is_file() or check_integrity(str(folder / file), md5):
            continue
        if not trust_unofficial_pickle:
            raise input_error(folder / file, None, f"md5 differs from the official {title} release; the file is a "
                              "pickle, and loading a pickle can run code, so an unverified copy is not read",
                              f"{fix}, or, if you made or trust this copy, set {_key(name, 'trust_unofficial_pickle')}"
                              ": true (it is then read by a restricted unpickler that builds only arrays, and "
                              "results are not comparable with published numbers)")
        log.warning("%s: md5 differs from the official %s release (%s is set); results are not comparable "
                    "with published numbers", folder / file, title, _key(name, "trust_unofficial_pickle"))
    try:
        ds = _CifarTestSplit(folder, base)
    except FileNotFoundError as exc:
        raise input_error(Path(exc.filename or folder), None, "missing", fix) from exc
    except (pickle.UnpicklingError, EOFError, UnicodeDecodeError, AttributeError, ImportError, TypeError) as exc:
        raise input_error(folder / test_file, None, f"{test_file} or {meta_file} is not a readable CIFAR pickle "
                          f"({type(exc).__name__}: {exc})", fix) from exc
    except KeyError as exc:
        raise input_error(folder, None, f"{test_file} / {meta_file} lack the key {exc} of the official {title} "
                          f"pickles", fix) from exc
    except ValueError as exc:  # torchvision reshapes data to (N, 3, 32, 32)
        raise input_error(folder / test_file, "data", f"expected shape (N, 3072) (rows of 1024 R, 1024 G, 1024 B "
                          f"bytes), could not reshape ({exc})", fix) from exc
    class_ids = [str(c) for c in ds.classes]
    labels = np.asarray(ds.targets, dtype=np.int64)
    if labels.shape[0] != ds.data.shape[0]:
        raise input_error(folder / test_file, None, f"{ds.data.shape[0]} images but {labels.shape[0]} labels", fix)
    if labels.size and (labels.min() < 0 or labels.max() >= len(class_ids)):
        raise input_error(folder / test_file, None, f"label {int(labels.max())} outside the {len(class_ids)} class "
                          f"names of {meta_file}", fix)
    keep = _take_per_class(labels, max_per_class)
    return ClassificationDataset(name=name, format=fmt, root=folder, classes=[readable(c) for c in class_ids],
                                 images=ImageList(array=np.ascontiguousarray(ds.data[keep])), labels=labels[keep],
                                 class_ids=class_ids)


def read_cifar10(root, name: str = "CIFAR10", max_per_class: int | None = None, trust_unofficial_pickle: bool = False,
                 **_) -> ClassificationDataset:
    """CIFAR-10 test split (``torchvision.datasets.CIFAR10``'s files; unofficial copies need
    ``trust_unofficial_pickle``)."""
    return _read_cifar("cifar10", root, name, max_per_class, trust_unofficial_pickle)


def read_cifar100(root, name: str = "CIFAR100", max_per_class: int | None = None, trust_unofficial_pickle: bool = False,
                  **_) -> ClassificationDataset:
    """CIFAR-100 test split, the 100 fine classes (``torchvision.datasets.CIFAR100``'s files; unofficial copies
    need ``trust_unofficial_pickle``)."""
    return _read_cifar("cifar100", root, name, max_per_class, trust_unofficial_pickle)


def read_food101(root, name: str = "Food101", max_per_class: int | None = None, **_) -> ClassificationDataset:
    """Food-101 test split from ``meta/test.json`` (``torchvision.datasets.Food101``)."""
    from torchvision.datasets import Food101

    folder = locate("food101", root, name)
    test_json = folder / "meta" / "test.json"
    try:
        ds = Food101(str(folder.parent), split="test", download=False)
    except (json.JSONDecodeError, AttributeError, TypeError) as exc:
        raise input_error(test_json, None, f"not the official {{class: ['class/id', ...]}} JSON ({exc})",
                          "re-extract food-101.tar.gz") from exc
    class_ids = list(ds.classes)
    return _file_dataset(name, "food101", folder, class_ids, [readable(c) for c in class_ids],
                         list(ds._image_files), ds._labels, max_per_class, str(test_json))


CALTECH101_BACKGROUND = "BACKGROUND_Google"


def read_caltech101(root, name: str = "Caltech101", max_per_class: int | None = None, background_class: bool = True,
                    **_) -> ClassificationDataset:
    """Caltech-101, every image (``torchvision.datasets.Caltech101``), with ``BACKGROUND_Google`` as a class
    (the 102 classes of CLIP's evaluation; torchvision drops it: ``background_class=False``). Classes in
    sorted folder order."""
    from torchvision.datasets import Caltech101

    folder = locate("caltech101", root, name)
    ds = Caltech101(str(folder.parent.parent), target_type="category", download=False)
    # torchvision opens <folder>/<category>/image_<index:04d>.jpg (index 1..n per category)
    samples = [(folder / ds.categories[y] / f"image_{i:04d}.jpg", ds.categories[y]) for y, i in zip(ds.y, ds.index)]
    class_ids = list(ds.categories)
    background = folder / CALTECH101_BACKGROUND
    if background_class and background.is_dir():
        class_ids = sorted(class_ids + [CALTECH101_BACKGROUND])
        samples += [(p, CALTECH101_BACKGROUND) for p in sorted(background.glob("image_*.jpg"))]
    label = {c: k for k, c in enumerate(class_ids)}
    samples.sort(key=lambda s: label[s[1]])  # stable: file order within a class
    return _file_dataset(name, "caltech101", folder, class_ids, [readable(c) for c in class_ids],
                         [p for p, _ in samples], [label[c] for _, c in samples], max_per_class,
                         f"torchvision's Caltech101 listing of {folder}")


_CALTECH256_DIR = re.compile(r"^(\d{3})\.(.+)$")
CALTECH256_CLUTTER = "257.clutter"


def read_caltech256(root, name: str = "Caltech256", max_per_class: int | None = None, background_class: bool = True,
                    **_) -> ClassificationDataset:
    """Caltech-256, every image (``torchvision.datasets.Caltech256``), ``257.clutter`` a class (``clutter``)
    unless ``background_class=False``; the numeric prefix and a ``-101`` suffix are dropped from the class
    names."""
    from torchvision.datasets import Caltech256

    folder = locate("caltech256", root, name)
    ds = Caltech256(str(folder.parent.parent), download=False)
    for c in ds.categories:
        if not _CALTECH256_DIR.match(c):
            raise input_error(folder / c, None, "class folder name is not 'NNN.name'",
                              "use the official 256_ObjectCategories layout")
    kept = [c for c in ds.categories if background_class or c != CALTECH256_CLUTTER]
    new_label = {ds.categories.index(c): k for k, c in enumerate(kept)}
    # torchvision opens <category>/<y+1:03d>_<index:04d>.jpg, the folder's own prefix when all 257 folders
    # are there; the prefix is taken from the folder name so a partial copy reads correctly as well
    samples = [(folder / ds.categories[y] / f"{ds.categories[y][:3]}_{i:04d}.jpg", new_label[y])
               for y, i in zip(ds.y, ds.index) if y in new_label]
    raw = [_CALTECH256_DIR.match(c).group(2) for c in kept]
    return _file_dataset(name, "caltech256", folder, raw, [readable(re.sub(r"-101$", "", r)) for r in raw],
                         [p for p, _ in samples], [y for _, y in samples], max_per_class,
                         f"torchvision's Caltech256 listing of {folder}")


def read_imagenet_class_index(path: str | os.PathLike) -> dict[str, str]:
    """wnid -> class name from ``LOC_synset_mapping.txt`` or Keras' ``imagenet_class_index.json``."""
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "ImageNet class index file not found",
                          "set class_index to LOC_synset_mapping.txt (ILSVRC-2012 devkit / Kaggle) or "
                          "imagenet_class_index.json (Keras)")
    if path.suffix.lower() == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        out = {}
        for key, value in data.items():
            if not (isinstance(value, list) and len(value) == 2):
                raise input_error(path, key, "expected [wnid, name]", "use Keras' imagenet_class_index.json format")
            out[str(value[0])] = str(value[1])
        return out
    out = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.strip().split(maxsplit=1)
        if len(parts) != 2 or not re.fullmatch(r"n\d{8}", parts[0]):
            raise input_error(path, f"line {lineno}", f"{line.strip()!r} is not 'nXXXXXXXX name, synonyms'",
                              "use LOC_synset_mapping.txt from the ILSVRC-2012 release")
        out[parts[0]] = parts[1].split(",")[0].strip()
    return out


def read_imagenet(root, name: str = "ImageNet", max_per_class: int | None = None, class_index=None,
                  **_) -> ClassificationDataset:
    """ILSVRC-2012 validation images as an ImageFolder (``torchvision.datasets.ImageFolder``: classes are the
    sorted wnid folders) with names from ``class_index`` (``class_index=False``: the wnids themselves, for
    a ``class_names`` map keyed by wnid)."""
    from torchvision.datasets import ImageFolder

    folder = locate("imagenet", root, name)
    if class_index is None or class_index == "":
        raise ConfigError(f"dataset {name}: format imagenet needs class_index (LOC_synset_mapping.txt or "
                          f"imagenet_class_index.json) or class_names (e.g. builtin:imagenet). "
                          f"Fix: set {_key(name, 'class_index')} or {_key(name, 'class_names')}")
    mapping = read_imagenet_class_index(class_index) if class_index is not False else None
    try:
        ds = ImageFolder(str(folder))
    except FileNotFoundError as exc:
        raise input_error(folder, None, f"not an ImageFolder ({exc})",
                          "arrange the validation images as <root>/<wnid>/*.JPEG (e.g. with valprep.sh)") from exc
    if mapping is None:
        mapping = {c: c for c in ds.classes}
    missing = [c for c in ds.classes if c not in mapping]
    if missing:
        raise input_error(folder, missing[0], f"{len(missing)} class folder(s) have no entry in {class_index}",
                          "use the class index file of the same ILSVRC-2012 release")
    return _file_dataset(name, "imagenet", folder, list(ds.classes), [readable(mapping[c]) for c in ds.classes],
                         [p for p, _ in ds.samples], ds.targets, max_per_class, f"ImageFolder({folder})")


READERS: dict[str, Callable[..., ClassificationDataset]] = {
    "cifar10": read_cifar10,
    "cifar100": read_cifar100,
    "food101": read_food101,
    "caltech101": read_caltech101,
    "caltech256": read_caltech256,
    "imagenet": read_imagenet,
}


ZEROSHOT = Path(__file__).resolve().parents[1] / "resources" / "zeroshot"
BUILTIN = "builtin:"


def builtin_class_maps() -> list[str]:
    """Names of the built-in class-name maps (``class_names: builtin:<name>``)."""
    return sorted(p.stem for p in (ZEROSHOT / "classnames").glob("*.yaml"))


def builtin_templates(name: str | None = None) -> dict[str, list[str]] | list[str]:
    """The named template lists of ``resources/zeroshot/templates.yaml`` (all, or the one ``name``)."""
    import yaml

    lists = yaml.safe_load((ZEROSHOT / "templates.yaml").read_text(encoding="utf-8"))
    if name is None:
        return lists
    if name not in lists:
        raise ConfigError(f"templates: builtin:{name} is not a built-in template list (known: {sorted(lists)}). "
                          f"Fix: use one of those or write the templates as a list")
    return list(lists[name])


def _class_map(path: Path, where: str) -> dict[str, str]:
    import yaml

    data = (yaml.safe_load if path.suffix.lower() in (".yaml", ".yml") else json.loads)(
        path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise input_error(path, None, f"not a class id -> name mapping ({where})",
                          "write one 'class_id: prompt name' entry per class")
    return {str(k): v for k, v in data.items()}


def read_class_names(path: str | os.PathLike, n_classes: int) -> list[str]:
    """One name per line, in label order (a text file)."""
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "class-name file not found", "write one class name per line, in label order")
    names = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if len(names) != n_classes:
        raise input_error(path, None, f"{len(names)} names for {n_classes} classes",
                          "write exactly one class name per line, in label order")
    return names


def resolve_class_names(value: str | None, class_ids: Sequence[str], default: Sequence[str],
                        name: str = "") -> list[str]:
    """Prompt class names in label order from a ``class_names`` setting: absent -> ``default`` (the
    dataset's cleaned names); ``builtin:<map>`` or a ``.yaml``/``.json`` file -> a class id -> name map
    (every class id must be in it; names are used verbatim); another file -> one name per line."""
    if not value:
        return list(default)
    key = _key(name, "class_names")
    value = str(value)
    if value.startswith(BUILTIN):
        path = ZEROSHOT / "classnames" / f"{value[len(BUILTIN):]}.yaml"
        if not path.is_file():
            raise ConfigError(f"{key}: {value} is not a built-in class-name map (known: "
                              f"{', '.join(BUILTIN + m for m in builtin_class_maps())}). Fix: use one of those, "
                              f"a file, or leave it unset for the dataset's own names")
    else:
        path = Path(value)
        if path.suffix.lower() not in (".yaml", ".yml", ".json"):
            return read_class_names(path, len(class_ids))
        if not path.is_file():
            raise input_error(path, None, f"class-name map not found ({key})", f"create it or fix {key}")
    mapping = _class_map(path, key)
    missing = [c for c in class_ids if c not in mapping]
    if missing:
        raise input_error(path, missing[0], f"{len(missing)} of {len(class_ids)} class ids of dataset {name!r} have "
                          f"no name in {value} ({key})", "use the map made for this dataset, or add the ids")
    return [mapping[c] for c in class_ids]


#: ``class_names: torchvision``: the names of the COCO-Counterfactuals reference evaluation scripts, which label
#: with the torchvision dataset's classes, lower-cased, ``_`` as a space; Caltech-101's two face folders become
#: "face" and its plural folder names singular; ImageNet's name is the first WordNet lemma of each class
TORCHVISION_NAMES = "torchvision"
_CALTECH101_REFERENCE = {"Faces": "face", "Faces_easy": "face", "Leopards": "leopard", "Motorbikes": "motorbike",
                         "airplanes": "airplane"}
#: Caltech-256 as the reference evaluation writes its names: singular, and hyphenated only where the word itself
#: is. Its hand-written list was not released, so this follows the stated rule over the official folder names
#: (``-101`` dropped): the plural folders below become singular; "t-shirt" and "yo-yo" keep their hyphen; every
#: other hyphen is a space.
_CALTECH256_SINGULAR = {"airplanes": "airplane", "binoculars": "binocular", "chopsticks": "chopstick",
                        "eyeglasses": "eyeglass", "faces-easy": "face", "fireworks": "firework", "grapes": "grape",
                        "head-phones": "headphone", "leopards": "leopard", "motorbikes": "motorbike",
                        "mussels": "mussel", "socks": "sock", "stirrups": "stirrup", "tennis-shoes": "tennis shoe"}
_HYPHENATED_WORDS = ("t-shirt", "yo-yo")


def caltech256_reference_name(class_id: str) -> str:
    """A Caltech-256 folder name (prefix already stripped, e.g. ``binoculars``, ``faces-easy-101``) as the
    reference evaluation names the class: see :data:`_CALTECH256_SINGULAR`."""
    name = re.sub(r"-101$", "", class_id).lower()
    name = _CALTECH256_SINGULAR.get(name, name)
    return name if name in _HYPHENATED_WORDS else name.replace("-", " ").replace("_", " ")


def torchvision_class_names(fmt: str, class_ids: Sequence[str], class_index=None, name: str = "") -> list[str]:
    """Prompt names as the reference evaluation made them (``class_names: torchvision``, see
    :data:`TORCHVISION_NAMES`): ImageNet needs ``class_index`` as ``LOC_synset_mapping.txt`` (its first name
    is torchvision's first lemma). Caltech-256's names follow the reference's stated rule (singular, hyphenated
    as the words are; :func:`caltech256_reference_name`), its hand-written list not being released."""
    key = _key(name, "class_names")
    if fmt == "caltech256":
        return [caltech256_reference_name(c) for c in class_ids]
    if fmt == "imagenet":
        if not class_index or str(class_index).lower().endswith(".json"):
            raise ConfigError(f"{key}: torchvision names of ImageNet are the first WordNet lemma of each class. "
                              f"Fix: set {_key(name, 'class_index')} to LOC_synset_mapping.txt")
        mapping = read_imagenet_class_index(class_index)
        return [mapping[c].lower() for c in class_ids]
    if fmt == "caltech101" and CALTECH101_BACKGROUND in class_ids:
        raise ConfigError(f"{key}: torchvision's Caltech101 has no {CALTECH101_BACKGROUND} class. "
                          f"Fix: set {_key(name, 'background_class')}: false")
    return [_CALTECH101_REFERENCE.get(c, c.lower().replace("_", " ")) if fmt == "caltech101"
            else c.lower().replace("_", " ") for c in class_ids]


def _check_spec(name: str, spec: dict[str, Any]) -> str:
    fmt = spec.get("format")
    if fmt not in READERS:
        raise ConfigError(f"{_key(name, 'format')}: {fmt!r} is not one of {sorted(READERS)}. "
                          f"Fix: set the dataset's on-disk format")
    if not spec.get("root"):
        raise ConfigError(f"{_key(name)} is not set. Fix: point it at the dataset")
    return fmt


def load_dataset(name: str, spec: dict[str, Any]) -> ClassificationDataset:
    """Read the dataset ``name`` described by ``spec`` (``format``, ``root``, optional ``class_index``,
    ``class_names``, ``background_class``, ``max_per_class``), as in
    ``evaluation.classification.datasets.<name>``; ``classes`` are the prompt names."""
    fmt = _check_spec(name, spec)
    class_index = spec.get("class_index")
    reference = spec.get("class_names") == TORCHVISION_NAMES
    if fmt == "imagenet" and not class_index and spec.get("class_names") and not reference:
        class_index = False  # names come from the class_names map (keyed by wnid)
    if reference and fmt in ("imagenet", "caltech256"):
        torchvision_class_names(fmt, [], class_index, name)   # fails early, naming the fix
    ds = READERS[fmt](spec["root"], name=name, max_per_class=spec.get("max_per_class"), class_index=class_index,
                      background_class=spec.get("background_class", True),
                      trust_unofficial_pickle=bool(spec.get("trust_unofficial_pickle", False)))
    if reference:
        ds.classes = torchvision_class_names(fmt, ds.class_ids, class_index, name)
    else:
        ds.classes = resolve_class_names(spec.get("class_names"), ds.class_ids, ds.classes, name)
    return ds


def dataset_input_files(spec: dict[str, Any], name: str = "") -> list[str]:
    """Every file and folder the reader of a configured dataset opens (Snakemake inputs of its evaluation
    job): CIFAR's ``meta``/``test`` pickles, Food-101's ``meta/test.json`` and ``images/``, the Caltech
    category folder, the ImageNet folder; plus ``class_index`` and ``class_names``.

    A dataset that is not in place is an error naming the config key and the fix (the datasets are
    user-provided, like MS-COCO); existence only, nothing is read or checksummed here."""
    fmt = _check_spec(name, spec)
    folder = locate(fmt, spec["root"], name)
    needs = LAYOUTS[fmt].needs if fmt in LAYOUTS else ()
    paths = [folder / n for n in needs] if needs else [folder]
    for field in ("class_index", "class_names"):
        if spec.get(field) and not str(spec[field]).startswith(BUILTIN) and spec[field] != TORCHVISION_NAMES:
            path = Path(spec[field])
            if not path.is_file():
                raise input_error(path, None, f"file not found ({_key(name, field)})",
                                  f"create it or set {_key(name, field)} to an existing file")
            paths.append(path)
    if fmt == "imagenet" and not spec.get("class_index") and not spec.get("class_names"):
        raise ConfigError(f"dataset {name}: format imagenet needs class_index or class_names. "
                          f"Fix: set {_key(name, 'class_index')} or {_key(name, 'class_names')} (builtin:imagenet)")
    return [str(p) for p in paths]
