#!/usr/bin/env python3
"""Write the tiny zero-shot classification fixtures under resources/demo/classification/.

Each dataset is written in the on-disk layout of its official release, as torchvision's dataset
classes read it (see ``counterfactory.data.classification``), with a few small synthetic images per
class (a coloured shape on a coloured background, seeded per image, so reruns are byte-identical):

* ``cifar-10-batches-py/``   ``batches.meta`` + ``test_batch`` pickles (10 classes x 3 images)
* ``cifar-100-python/``      ``meta`` + ``test`` pickles (all 100 fine / 20 coarse names; 2 images for
                             each of the first 10 classes)
* ``food-101/``              ``images/<class>/<id>.jpg``, ``meta/{classes,labels,test,train}.txt`` and
                             ``meta/{test,train}.json`` (3 classes; 2 test + 1 train image each)
* ``caltech101/101_ObjectCategories/``  4 folders incl. ``BACKGROUND_Google`` (2 images each)
* ``caltech256/256_ObjectCategories/``  4 folders incl. ``257.clutter`` (2 images each)
* ``imagenet/val/<wnid>/``   3 classes x 2 images, with ``LOC_synset_mapping.txt`` and
                             ``imagenet_class_index.json`` for those classes

Usage: ``python scripts/make_demo_classification.py [--out resources/demo/classification]``.
The pickles have str keys and str class names: that is how the official Python-2 pickles load under
Python 3 with ``encoding="latin1"``, the way torchvision reads them. Only the CIFAR test split is
written (the readers do not open the training batches), so the md5 sums differ from the release. The
images mean nothing; they only exercise the readers and the pipeline.
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import shutil
import zlib
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CIFAR10 = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR100_FINE = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can "
    "castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin "
    "elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck "
    "pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk "
    "skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger "
    "tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()
CIFAR100_COARSE = (
    "aquatic_mammals fish flowers food_containers fruit_and_vegetables household_electrical_devices "
    "household_furniture insects large_carnivores large_man-made_outdoor_things large_natural_outdoor_scenes "
    "large_omnivores_and_herbivores medium_mammals non-insect_invertebrates people reptiles small_mammals trees "
    "vehicles_1 vehicles_2"
).split()
FOOD101 = {"apple_pie": ["1005649", "1011328", "101251"], "pizza": ["1001116", "1032754", "1008104"],
           "sushi": ["1005352", "1011226", "1015410"]}  # last id of each class goes to train.txt
CALTECH101 = ["BACKGROUND_Google", "Faces_easy", "accordion", "car_side"]
CALTECH256 = ["001.ak47", "002.american-flag", "251.airplanes-101", "257.clutter"]
IMAGENET = {"n01440764": "tench, Tinca tinca", "n01443537": "goldfish, Carassius auratus",
            "n01484850": "great white shark, white shark, man-eater, man-eating shark, Carcharodon carcharias"}
IMAGENET_INDEX = {"n01440764": 0, "n01443537": 1, "n01484850": 2}


def synthetic_image(key: str, size: int = 32) -> Image.Image:
    """A small RGB image determined by ``key``: background colour, a shape, its colour and position."""
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    cls_rng = np.random.default_rng(zlib.crc32(key.rsplit("#", 1)[0].encode()))  # shared by a class
    bg = tuple(int(v) for v in cls_rng.integers(0, 256, 3))
    fg = tuple(int(v) for v in cls_rng.integers(0, 256, 3))
    shape = int(cls_rng.integers(0, 3))
    im = Image.new("RGB", (size, size), bg)
    draw = ImageDraw.Draw(im)
    x, y = (int(v) for v in rng.integers(4, size // 2, 2))
    s = int(rng.integers(size // 4, size // 2))
    if shape == 0:
        draw.ellipse([x, y, x + s, y + s], fill=fg)
    elif shape == 1:
        draw.rectangle([x, y, x + s, y + s], fill=fg)
    else:
        draw.polygon([(x, y + s), (x + s // 2, y), (x + s, y + s)], fill=fg)
    noise = rng.integers(-12, 13, (size, size, 3))
    return Image.fromarray(np.clip(np.asarray(im, dtype=np.int16) + noise, 0, 255).astype(np.uint8))


def save_jpeg(im: Image.Image, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=85)
    path.write_bytes(buf.getvalue())


def cifar_rows(keys: list[str]) -> np.ndarray:
    """(N, 3072) uint8: each row the R, G and B planes (1024 bytes each) of a 32x32 image."""
    arrays = [np.asarray(synthetic_image(k, 32), dtype=np.uint8) for k in keys]
    return np.stack([a.transpose(2, 0, 1).reshape(-1) for a in arrays])


def dump(obj: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=2))


def make_cifar10(out: Path) -> None:
    root = out / "cifar-10-batches-py"
    labels = [c for c in range(10) for _ in range(3)]
    keys = [f"cifar10/{CIFAR10[c]}#{i}" for i, c in enumerate(labels)]
    dump({"num_cases_per_batch": 10000, "label_names": list(CIFAR10), "num_vis": 3072}, root / "batches.meta")
    dump({"batch_label": "testing batch 1 of 1", "labels": labels, "data": cifar_rows(keys),
          "filenames": [f"demo_{i:05d}.png" for i in range(len(labels))]}, root / "test_batch")


def make_cifar100(out: Path) -> None:
    root = out / "cifar-100-python"
    assert len(CIFAR100_FINE) == 100 and len(CIFAR100_COARSE) == 20
    fine = [c for c in range(10) for _ in range(2)]
    keys = [f"cifar100/{CIFAR100_FINE[c]}#{i}" for i, c in enumerate(fine)]
    dump({"fine_label_names": list(CIFAR100_FINE), "coarse_label_names": list(CIFAR100_COARSE)}, root / "meta")
    dump({"filenames": [f"demo_{i:05d}.png" for i in range(len(fine))], "batch_label": "testing batch 1 of 1",
          "fine_labels": fine, "coarse_labels": [0] * len(fine), "data": cifar_rows(keys)}, root / "test")


def make_food101(out: Path) -> None:
    root = out / "food-101"
    test, train = [], []
    for cls, ids in FOOD101.items():
        for i, image_id in enumerate(ids):
            save_jpeg(synthetic_image(f"food101/{cls}#{i}"), root / "images" / cls / f"{image_id}.jpg")
            (train if i == len(ids) - 1 else test).append(f"{cls}/{image_id}")
    meta = root / "meta"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "classes.txt").write_text("\n".join(FOOD101) + "\n")
    (meta / "labels.txt").write_text("\n".join(c.replace("_", " ").capitalize() for c in FOOD101) + "\n")
    (meta / "test.txt").write_text("\n".join(test) + "\n")
    (meta / "train.txt").write_text("\n".join(train) + "\n")
    for split, entries in (("test", test), ("train", train)):  # {class: ["class/id", ...]}, as released
        grouped = {cls: [e for e in entries if e.split("/")[0] == cls] for cls in FOOD101}
        (meta / f"{split}.json").write_text(json.dumps(grouped))


def make_caltech(out: Path) -> None:
    for cls in CALTECH101:
        for i in range(2):
            save_jpeg(synthetic_image(f"caltech101/{cls}#{i}"),
                      out / "caltech101" / "101_ObjectCategories" / cls / f"image_{i + 1:04d}.jpg")
    for cls in CALTECH256:
        prefix = cls.split(".")[0]
        for i in range(2):
            save_jpeg(synthetic_image(f"caltech256/{cls}#{i}"),
                      out / "caltech256" / "256_ObjectCategories" / cls / f"{prefix}_{i + 1:04d}.jpg")


def make_imagenet(out: Path) -> None:
    root = out / "imagenet"
    n = 0
    for wnid in IMAGENET:
        for i in range(2):
            n += 1
            save_jpeg(synthetic_image(f"imagenet/{wnid}#{i}"), root / "val" / wnid / f"ILSVRC2012_val_{n:08d}.JPEG")
    (root / "LOC_synset_mapping.txt").write_text("".join(f"{w} {name}\n" for w, name in IMAGENET.items()))
    index = {str(IMAGENET_INDEX[w]): [w, name.split(",")[0].replace(" ", "_")] for w, name in IMAGENET.items()}
    (root / "imagenet_class_index.json").write_text(json.dumps(index, indent=1) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="resources/demo/classification", help="output folder (replaced)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    make_cifar10(out)
    make_cifar100(out)
    make_food101(out)
    make_caltech(out)
    make_imagenet(out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out}: {sum(1 for p in out.rglob('*') if p.is_file())} files, {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
