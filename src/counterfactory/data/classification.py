"""Readers for the image-classification test sets of COCO-Counterfactuals §5.2 / Table 4, in the layouts
the datasets are distributed in (no torchvision download helpers, nothing fetched).

=============  ==========================================================================================
format         ``root`` and what is read
=============  ==========================================================================================
``cifar10``    ``cifar-10-batches-py/`` (or its parent): ``test_batch`` (pickle: ``data`` uint8 (N, 3072)
               rows of R, G, B planes of a 32x32 image, ``labels``) and ``batches.meta`` (``label_names``).
``cifar100``   ``cifar-100-python/`` (or its parent): ``test`` (``data``, ``fine_labels``) and ``meta``
               (``fine_label_names``): the 100 fine classes.
``food101``    ``food-101/`` (or its parent): ``meta/classes.txt`` (one class id per line, label order),
               ``meta/test.txt`` (``<class>/<image id>`` per line, no extension) and
               ``images/<class>/<image id>.jpg``: the official 25,250-image test split.
``caltech101`` ``101_ObjectCategories/`` (or its parent): ``<class>/image_NNNN.jpg``; the
               ``BACKGROUND_Google`` folder is not a class and is skipped. Every image is used (there is
               no official test split).
``caltech256`` ``256_ObjectCategories/`` (or its parent): ``NNN.<name>/NNN_NNNN.jpg``; the numeric prefix
               is stripped from the class name and ``257.clutter`` is skipped. Every image is used.
``imagenet``   an ImageFolder of the ILSVRC-2012 validation set, ``<root>/<wnid>/*.JPEG`` (as made by the
               common ``valprep.sh``), plus ``class_index``: either ``LOC_synset_mapping.txt``
               (ILSVRC-2012 / Kaggle: ``n01440764 tench, Tinca tinca`` per line; the name before the first
               comma is used) or ``imagenet_class_index.json`` (Keras:
               ``{"0": ["n01440764", "tench"], ...}``). Classes are the wnid folders present, sorted
               (ImageFolder order), so label ``i`` is the i-th sorted wnid.
=============  ==========================================================================================

Class names for the prompts are made readable from the on-disk names: ``_`` and ``-`` become spaces,
Caltech-256's ``-101`` suffix (classes shared with Caltech-101) is removed. The prompts of CLIP's paper
use hand-edited names; pass ``class_names`` (a text file, one name per line in label order) to use
such a list. ``max_per_class`` keeps the first N images of each class (file order for CIFAR, sorted
paths otherwise) for quick runs.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ConfigError, input_error

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")


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
# helpers
# --------------------------------------------------------------------------------------------
def readable(name: str) -> str:
    """``"car_side"`` -> ``"car side"``, ``"american-flag"`` -> ``"american flag"``."""
    return re.sub(r"\s+", " ", name.replace("_", " ").replace("-", " ")).strip()


def _resolve(root: str | os.PathLike, folder: str, marker: str, fmt: str) -> Path:
    """``root`` itself if it holds ``marker``, else ``root/folder`` if that does."""
    root = Path(root)
    for cand in (root, root / folder):
        if (cand / marker).exists():
            return cand
    raise input_error(root, None, f"not a {fmt} folder: neither {root / marker} nor {root / folder / marker} exists",
                      f"point evaluation.classification.datasets.<name>.root at the extracted '{folder}' folder "
                      f"(see counterfactory.data.classification for the expected layout)")


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            obj = pickle.load(fh, encoding="bytes")
    except FileNotFoundError:
        raise input_error(path, None, "file not found", "re-extract the official CIFAR python archive") from None
    except Exception as exc:  # corrupt pickle
        raise input_error(path, None, f"not a readable CIFAR pickle ({exc})",
                          "re-extract the official CIFAR python archive") from exc
    if not isinstance(obj, dict):
        raise input_error(path, None, f"expected a dict, got {type(obj).__name__}", "use the official CIFAR python version")
    # Python-2 pickles load with bytes keys; accept str keys too
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _names(values, path: Path) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


def _cifar_images(data, path: Path) -> np.ndarray:
    arr = np.asarray(data, dtype=np.uint8)
    if arr.ndim != 2 or arr.shape[1] != 3072:
        raise input_error(path, "data", f"expected shape (N, 3072), got {arr.shape}",
                          "use the official CIFAR python version (rows of 1024 R, 1024 G, 1024 B bytes)")
    return np.ascontiguousarray(arr.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


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


def _list_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _folder_dataset(name, fmt, root, class_dirs: list[tuple[str, str, Path]], max_per_class) -> ClassificationDataset:
    """class_dirs: (class id, readable name, folder) in label order."""
    paths, labels = [], []
    for label, (_, _, folder) in enumerate(class_dirs):
        files = _list_images(folder)
        if max_per_class:
            files = files[:max_per_class]
        paths += files
        labels += [label] * len(files)
    if not paths:
        raise input_error(root, None, "no images found in the class folders",
                          "check that the archive was extracted completely")
    return ClassificationDataset(name=name, format=fmt, root=root, classes=[c[1] for c in class_dirs],
                                 images=ImageList(paths=paths), labels=np.asarray(labels, dtype=np.int64),
                                 class_ids=[c[0] for c in class_dirs])


# --------------------------------------------------------------------------------------------
# readers
# --------------------------------------------------------------------------------------------
def _read_cifar(root, name, fmt, title, folder, meta_file, test_file, names_key, labels_key,
                max_per_class) -> ClassificationDataset:
    """Both CIFAR python versions: the same pickles, different file and key names."""
    root = _resolve(root, folder, meta_file, title)
    meta_path, test_path = root / meta_file, root / test_file
    meta, test = _unpickle(meta_path), _unpickle(test_path)
    for key, obj, path in ((names_key, meta, meta_path), ("data", test, test_path), (labels_key, test, test_path)):
        if key not in obj:
            raise input_error(path, None, f"missing key {key!r}", f"use the official {title} python version")
    classes = _names(meta[names_key], meta_path)
    return _cifar(name, fmt, root, classes, test["data"], test[labels_key], test_path, max_per_class)


def read_cifar10(root, name: str = "CIFAR10", max_per_class: int | None = None, **_) -> ClassificationDataset:
    return _read_cifar(root, name, "cifar10", "CIFAR-10", "cifar-10-batches-py", "batches.meta", "test_batch",
                       "label_names", "labels", max_per_class)


def read_cifar100(root, name: str = "CIFAR100", max_per_class: int | None = None, **_) -> ClassificationDataset:
    return _read_cifar(root, name, "cifar100", "CIFAR-100", "cifar-100-python", "meta", "test",
                       "fine_label_names", "fine_labels", max_per_class)


def _cifar(name, fmt, root, class_ids, data, labels, path, max_per_class) -> ClassificationDataset:
    images = _cifar_images(data, path)
    labels = np.asarray(labels, dtype=np.int64)
    if labels.shape[0] != images.shape[0]:
        raise input_error(path, None, f"{images.shape[0]} images but {labels.shape[0]} labels",
                          "re-extract the official archive")
    if labels.size and (labels.min() < 0 or labels.max() >= len(class_ids)):
        raise input_error(path, None, f"label {int(labels.max())} outside the {len(class_ids)} class names",
                          "re-extract the official archive")
    keep = _take_per_class(labels, max_per_class)
    return ClassificationDataset(name=name, format=fmt, root=root, classes=[readable(c) for c in class_ids],
                                 images=ImageList(array=images[keep]), labels=labels[keep], class_ids=class_ids)


def read_food101(root, name: str = "Food101", max_per_class: int | None = None, **_) -> ClassificationDataset:
    root = _resolve(root, "food-101", "meta/classes.txt", "Food-101")
    classes_path, test_path = root / "meta" / "classes.txt", root / "meta" / "test.txt"
    class_ids = [ln.strip() for ln in classes_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    index = {c: i for i, c in enumerate(class_ids)}
    if not test_path.exists():
        raise input_error(test_path, None, "file not found", "re-extract food-101.tar.gz (meta/test.txt lists the test split)")
    paths, labels = [], []
    for lineno, line in enumerate(test_path.read_text(encoding="utf-8").splitlines(), start=1):
        entry = line.strip()
        if not entry:
            continue
        cls = entry.split("/", 1)[0]
        if cls not in index or "/" not in entry:
            raise input_error(test_path, f"line {lineno}", f"{entry!r} is not '<class>/<image id>' of a class in classes.txt",
                              "use the official meta/test.txt")
        image = root / "images" / f"{entry}.jpg"
        if not image.exists():
            raise input_error(image, None, f"listed in {test_path} (line {lineno}) but missing",
                              "re-extract food-101.tar.gz")
        paths.append(image)
        labels.append(index[cls])
    labels_arr = np.asarray(labels, dtype=np.int64)
    keep = _take_per_class(labels_arr, max_per_class)
    return ClassificationDataset(name=name, format="food101", root=root, classes=[readable(c) for c in class_ids],
                                 images=ImageList(paths=[paths[i] for i in keep]), labels=labels_arr[keep],
                                 class_ids=class_ids)


def read_caltech101(root, name: str = "Caltech101", max_per_class: int | None = None, **_) -> ClassificationDataset:
    root = Path(root)
    if not root.name == "101_ObjectCategories" and (root / "101_ObjectCategories").is_dir():
        root = root / "101_ObjectCategories"
    if not root.is_dir():
        raise input_error(root, None, "folder not found", "extract 101_ObjectCategories.tar.gz and point root at it")
    dirs = sorted(d for d in root.iterdir() if d.is_dir() and d.name != "BACKGROUND_Google")
    return _folder_dataset(name, "caltech101", root, [(d.name, readable(d.name), d) for d in dirs], max_per_class)


_CALTECH256_DIR = re.compile(r"^(\d{3})\.(.+)$")


def read_caltech256(root, name: str = "Caltech256", max_per_class: int | None = None, **_) -> ClassificationDataset:
    root = Path(root)
    if not root.name == "256_ObjectCategories" and (root / "256_ObjectCategories").is_dir():
        root = root / "256_ObjectCategories"
    if not root.is_dir():
        raise input_error(root, None, "folder not found", "extract 256_ObjectCategories.tar and point root at it")
    class_dirs = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        m = _CALTECH256_DIR.match(d.name)
        if not m:
            raise input_error(d, None, "class folder name is not 'NNN.name'", "use the official 256_ObjectCategories layout")
        if d.name == "257.clutter":
            continue
        raw = m.group(2)
        class_dirs.append((raw, readable(re.sub(r"-101$", "", raw)), d))
    return _folder_dataset(name, "caltech256", root, class_dirs, max_per_class)


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
    root = Path(root)
    if not root.is_dir():
        raise input_error(root, None, "ImageNet validation folder not found",
                          "arrange ILSVRC2012_img_val as an ImageFolder (<root>/<wnid>/*.JPEG, e.g. with valprep.sh)")
    if not class_index:
        raise ConfigError(f"dataset {name}: format imagenet needs class_index (LOC_synset_mapping.txt or "
                          f"imagenet_class_index.json). Fix: set evaluation.classification.datasets.{name}.class_index")
    mapping = read_imagenet_class_index(class_index)
    dirs = sorted(d for d in root.iterdir() if d.is_dir())
    missing = [d.name for d in dirs if d.name not in mapping]
    if missing:
        raise input_error(root, missing[0], f"{len(missing)} class folder(s) have no entry in {class_index}",
                          "use the class index file of the same ILSVRC-2012 release")
    return _folder_dataset(name, "imagenet", root, [(d.name, readable(mapping[d.name]), d) for d in dirs],
                           max_per_class)


READERS: dict[str, Callable[..., ClassificationDataset]] = {
    "cifar10": read_cifar10,
    "cifar100": read_cifar100,
    "food101": read_food101,
    "caltech101": read_caltech101,
    "caltech256": read_caltech256,
    "imagenet": read_imagenet,
}


def read_class_names(path: str | os.PathLike, n_classes: int) -> list[str]:
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "class-name file not found", "write one class name per line, in label order")
    names = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if len(names) != n_classes:
        raise input_error(path, None, f"{len(names)} names for {n_classes} classes",
                          "write exactly one class name per line, in label order")
    return names


def load_dataset(name: str, spec: dict[str, Any]) -> ClassificationDataset:
    """Read the dataset ``name`` described by ``spec`` (``format``, ``root``, optional ``class_index``,
    ``class_names``, ``max_per_class``), as in ``evaluation.classification.datasets.<name>``."""
    fmt = spec.get("format")
    if fmt not in READERS:
        raise ConfigError(f"evaluation.classification.datasets.{name}.format: {fmt!r} is not one of "
                          f"{sorted(READERS)}. Fix: set the dataset's on-disk format")
    if not spec.get("root"):
        raise ConfigError(f"evaluation.classification.datasets.{name}.root is not set. Fix: point it at the dataset")
    ds = READERS[fmt](spec["root"], name=name, max_per_class=spec.get("max_per_class"),
                      class_index=spec.get("class_index"))
    if spec.get("class_names"):
        ds.classes = read_class_names(spec["class_names"], len(ds.classes))
    return ds


def dataset_input_files(spec: dict[str, Any], name: str = "") -> list[str]:
    """The configured files of a dataset (``root``, ``class_index``, ``class_names``) that exist, for
    Snakemake inputs. Datasets are user-provided, like MS-COCO: missing ones are reported on stderr and
    left out, so the DAG still builds and the evaluation job fails with the expected layout."""
    import sys

    paths = [str(spec[k]) for k in ("root", "class_index", "class_names") if spec.get(k)]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        print(f"CounterFactory: classification dataset {name}: {', '.join(missing)} not found; its evaluation "
              f"job will fail until the dataset is in place (layouts: counterfactory.data.classification).",
              file=sys.stderr)
    return [p for p in paths if p not in missing]
