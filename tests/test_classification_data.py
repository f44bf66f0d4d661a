"""Classification readers on the committed demo fixtures (official on-disk layouts)."""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from counterfactory.data.classification import (ImageList, dataset_input_files, load_dataset, read_caltech101,
                                                read_caltech256, read_cifar10, read_cifar100, read_food101,
                                                read_imagenet, read_imagenet_class_index, readable,
                                                resolve_class_names)
from counterfactory.data.classification import ZEROSHOT
from counterfactory.errors import ConfigError, InputError

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "resources" / "demo" / "classification"


def _script():
    spec = importlib.util.spec_from_file_location("make_demo_classification",
                                                  REPO / "scripts" / "make_demo_classification.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cifar10_layout_and_pixels():
    ds = read_cifar10(FIX, trust_unofficial_pickle=True)  # parent folder is accepted too
    assert ds.root.name == "cifar-10-batches-py"
    assert len(ds) == 30 and len(ds.classes) == 10
    assert ds.classes[:3] == ["airplane", "automobile", "bird"]
    assert np.bincount(ds.labels).tolist() == [3] * 10
    img = ds.images[0]
    assert img.size == (32, 32) and img.mode == "RGB"
    # rows are R, G, B planes of 1024 bytes: the decoded image is the one the script drew
    expected = np.asarray(_script().synthetic_image("cifar10/airplane#0", 32))
    np.testing.assert_array_equal(np.asarray(img), expected)
    assert len(ds.images[2:5]) == 3


def test_cifar100_fine_labels():
    ds = read_cifar100(FIX / "cifar-100-python", trust_unofficial_pickle=True)
    assert len(ds.classes) == 100 and len(ds) == 20
    assert ds.classes[1] == "aquarium fish" and ds.class_ids[1] == "aquarium_fish"
    assert ds.classes[-1] == "worm"
    assert sorted(set(ds.labels.tolist())) == list(range(10))
    assert ds.summary()["classes_with_images"] == 10


def test_cifar_str_keys_and_bad_shape(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    meta = {"label_names": ["a", "b"]}
    data = np.zeros((2, 3072), dtype=np.uint8)
    (root / "batches.meta").write_bytes(pickle.dumps(meta))
    (root / "test_batch").write_bytes(pickle.dumps({"data": data, "labels": [0, 1]}))
    assert read_cifar10(root, trust_unofficial_pickle=True).classes == ["a", "b"]
    (root / "test_batch").write_bytes(pickle.dumps({"data": data[:, :100], "labels": [0, 1]}))
    with pytest.raises(InputError, match=r"test_batch.*3072"):
        read_cifar10(root, trust_unofficial_pickle=True)
    (root / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(InputError, match="CIFAR pickle"):
        read_cifar10(root, trust_unofficial_pickle=True)


def test_food101_test_split_only():
    ds = read_food101(FIX / "food-101")
    assert ds.classes == ["apple pie", "pizza", "sushi"]
    assert len(ds) == 6 and np.bincount(ds.labels).tolist() == [2, 2, 2]
    train = (FIX / "food-101" / "meta" / "train.txt").read_text().split()
    assert not any(str(p).endswith(f"{t}.jpg") for p in ds.images.paths for t in train)
    assert all(Path(p).exists() for p in ds.images.paths)


def test_food101_missing_image(tmp_path):
    root = tmp_path / "food-101"
    shutil.copytree(FIX / "food-101", root)
    (root / "images" / "pizza" / "1001116.jpg").unlink()
    with pytest.raises(InputError, match=r"1001116\.jpg.*missing"):
        read_food101(root)


def test_caltech101_background_is_a_class_by_default():
    """CLIP's Caltech101 has 102 classes (BACKGROUND_Google included); torchvision's 101 on request."""
    ds = read_caltech101(FIX / "caltech101")
    assert ds.class_ids == ["BACKGROUND_Google", "Faces_easy", "accordion", "car_side"]   # sorted folder order
    assert ds.classes == ["BACKGROUND Google", "Faces easy", "accordion", "car side"]
    assert len(ds) == 8 and ds.labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(Path(ds.images.paths[i]).parent.name == ds.class_ids[y] for i, y in enumerate(ds.labels))
    no_bg = read_caltech101(FIX / "caltech101", background_class=False)
    assert no_bg.class_ids == ["Faces_easy", "accordion", "car_side"] and len(no_bg) == 6
    assert not any("BACKGROUND_Google" in str(p) for p in no_bg.images.paths)
    mapped = load_dataset("C101", {"format": "caltech101", "root": str(FIX / "caltech101"),
                                   "class_names": "builtin:caltech101"})
    assert mapped.classes == ["background", "centered face", "accordion", "side of a car"]


def test_caltech256_strips_prefix_and_keeps_clutter():
    ds = read_caltech256(FIX / "caltech256" / "256_ObjectCategories")
    assert ds.class_ids == ["ak47", "american-flag", "airplanes-101", "clutter"]
    assert ds.classes == ["ak47", "american flag", "airplanes", "clutter"]
    assert len(ds) == 8 and sum("257.clutter" in str(p) for p in ds.images.paths) == 2
    assert ds.labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    no_clutter = read_caltech256(FIX / "caltech256" / "256_ObjectCategories", background_class=False)
    assert no_clutter.class_ids == ["ak47", "american-flag", "airplanes-101"] and len(no_clutter) == 6
    spec = {"format": "caltech256", "root": str(FIX / "caltech256"), "background_class": False}
    assert len(load_dataset("C256", spec).classes) == 3


def test_builtin_caltech101_map_is_clips_list():
    """Face classes, plural folder names and the background folder get CLIP's names (openai/CLIP
    data/prompts.md), in the sorted folder order of 101_ObjectCategories (102 classes)."""
    ids = ["BACKGROUND_Google", "Faces", "Faces_easy", "Leopards", "Motorbikes", "airplanes", "car_side",
           "cougar_face", "snoopy", "yin_yang"]
    assert resolve_class_names("builtin:caltech101", ids, ids) == [
        "background", "off-center face", "centered face", "leopard", "motorbike", "airplane", "side of a car",
        "face of a cougar cat", "snoopy (cartoon beagle)", "yin and yang symbol"]
    full = yaml.safe_load((ZEROSHOT / "classnames" / "caltech101.yaml").read_text())
    assert len(full) == 102 and list(full) == sorted(full)


def test_builtin_maps_cover_the_datasets():
    maps = {p.stem: yaml.safe_load(p.read_text()) for p in (ZEROSHOT / "classnames").glob("*.yaml")}
    assert {k: len(v) for k, v in maps.items()} == {"cifar10": 10, "cifar100": 100, "food101": 101,
                                                    "caltech101": 102, "caltech101_merged": 102, "imagenet": 1000}
    merged = {k: v for k, v in maps["caltech101_merged"].items() if maps["caltech101"][k] != v}
    assert merged == {"Faces": "face", "Faces_easy": "face"}  # the only difference: one "face" class
    # CIFAR and Food-101: CLIP's names are the on-disk names cleaned ('_' -> ' ')
    for name in ("cifar10", "cifar100", "food101"):
        assert all(readable(k) == v for k, v in maps[name].items()), name
    assert maps["food101"]["cup_cakes"] == "cup cakes" and maps["cifar100"]["aquarium_fish"] == "aquarium fish"
    wnids = list(maps["imagenet"])
    assert wnids == sorted(wnids) and all(len(w) == 9 and w[0] == "n" for w in wnids)
    assert maps["imagenet"]["n01440764"] == "tench" and maps["imagenet"]["n01608432"] == "kite (bird of prey)"
    assert list(maps["imagenet"].values())[-1] == "toilet paper"
    # the fixtures' classes (real ids) are all in the maps
    cifar100 = read_cifar100(FIX / "cifar-100-python", trust_unofficial_pickle=True)
    assert resolve_class_names("builtin:cifar100", cifar100.class_ids, []) == cifar100.classes


def test_imagenet_builtin_names_without_class_index():
    spec = {"format": "imagenet", "root": str(FIX / "imagenet" / "val"), "class_names": "builtin:imagenet"}
    ds = load_dataset("IN", spec)
    assert ds.classes == ["tench", "goldfish", "great white shark"] and len(ds) == 6
    assert dataset_input_files(spec, "IN") == [str(FIX / "imagenet" / "val")]   # builtin: nothing to read
    with pytest.raises(ConfigError, match="class_index or class_names"):
        dataset_input_files({"format": "imagenet", "root": str(FIX / "imagenet" / "val")}, "IN")


def test_class_name_maps_and_errors(tmp_path):
    ids = ["n01440764", "n01443537", "n01484850"]
    with pytest.raises(ConfigError, match=r"builtin:nope is not a built-in.*builtin:caltech101"):
        resolve_class_names("builtin:nope", ids, ids, "IN")
    with pytest.raises(InputError, match=r"1 of 3 class ids.*datasets\.C\.class_names"):
        resolve_class_names("builtin:imagenet", [*ids[:2], "n99999999"], ids, "C")
    keyed = tmp_path / "names.yaml"
    keyed.write_text("n01440764: a tench fish\nn01443537: gold fish\nn01484850: shark\nextra: x\n")
    assert resolve_class_names(str(keyed), ids, ids) == ["a tench fish", "gold fish", "shark"]
    (tmp_path / "names.json").write_text('{"a": "A", "b": "B"}')
    assert resolve_class_names(str(tmp_path / "names.json"), ["b", "a"], []) == ["B", "A"]
    assert resolve_class_names(None, ids, ["x", "y", "z"]) == ["x", "y", "z"]


def test_imagenet_both_class_index_formats():
    root = FIX / "imagenet" / "val"
    a = read_imagenet(root, class_index=FIX / "imagenet" / "LOC_synset_mapping.txt")
    b = read_imagenet(root, class_index=FIX / "imagenet" / "imagenet_class_index.json")
    assert a.classes == b.classes == ["tench", "goldfish", "great white shark"]
    assert a.class_ids == ["n01440764", "n01443537", "n01484850"]
    assert len(a) == 6 and a.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert read_imagenet_class_index(FIX / "imagenet" / "LOC_synset_mapping.txt")["n01484850"] == "great white shark"
    with pytest.raises(ConfigError, match="class_index"):
        read_imagenet(root)


def test_imagenet_unknown_wnid(tmp_path):
    (tmp_path / "idx.txt").write_text("n01440764 tench, Tinca tinca\n")
    with pytest.raises(InputError, match="no entry"):
        read_imagenet(FIX / "imagenet" / "val", class_index=tmp_path / "idx.txt")


def test_load_dataset_options(tmp_path):
    ds = load_dataset("C10", {"format": "cifar10", "root": str(FIX / "cifar-10-batches-py"), "max_per_class": 1,
                              "trust_unofficial_pickle": True})
    assert len(ds) == 10 and ds.name == "C10"
    names = tmp_path / "names.txt"
    names.write_text("fish\ngold fish\nshark\n")
    ds = load_dataset("IN", {"format": "imagenet", "root": str(FIX / "imagenet" / "val"),
                             "class_index": str(FIX / "imagenet" / "LOC_synset_mapping.txt"),
                             "class_names": str(names)})
    assert ds.classes == ["fish", "gold fish", "shark"]
    names.write_text("only one\n")
    with pytest.raises(InputError, match="1 names for 3 classes"):
        load_dataset("IN", {"format": "imagenet", "root": str(FIX / "imagenet" / "val"),
                            "class_index": str(FIX / "imagenet" / "LOC_synset_mapping.txt"), "class_names": str(names)})
    with pytest.raises(ConfigError, match="format"):
        load_dataset("X", {"format": "mnist", "root": "x"})
    with pytest.raises(InputError, match="not a CIFAR-10 folder"):
        load_dataset("X", {"format": "cifar10", "root": str(tmp_path)})


def test_image_list_indexing():
    lst = ImageList(paths=[Path("a"), Path("b"), Path("c")])
    assert lst[-1] == Path("c") and lst[0:2] == [Path("a"), Path("b")]
    with pytest.raises(IndexError):
        lst[3]
    assert readable("car_side-101") == "car side 101"


def test_fixtures_read_by_stock_torchvision():
    """The fixtures are in the layouts torchvision's own classes expect (independent of our readers)."""
    from torchvision.datasets import Caltech101, Food101, ImageFolder

    food = Food101(str(FIX), split="test", download=False)
    ours = read_food101(FIX / "food-101")
    assert [Path(p) for p in food._image_files] == ours.images.paths and list(food._labels) == ours.labels.tolist()
    image, label = food[0]
    assert image.size == (32, 32) and label == 0
    caltech = Caltech101(str(FIX), download=False)
    assert caltech.categories == read_caltech101(FIX / "caltech101", background_class=False).class_ids
    assert len(caltech) == 6
    assert caltech[5][0].size == (32, 32) and caltech[5][1] == 2
    folder = ImageFolder(str(FIX / "imagenet" / "val"))
    assert folder.classes == ["n01440764", "n01443537", "n01484850"] and len(folder) == 6


def test_cifar_checksum_differs_from_release_is_refused_unless_trusted(caplog):
    """issue 45 case 3: an unofficial pickle is refused (it could run code), read with a warning when opted in."""
    with pytest.raises(InputError, match="trust_unofficial_pickle"):
        read_cifar100(FIX)
    with caplog.at_level("WARNING", logger="counterfactory.data.classification"):
        read_cifar100(FIX, trust_unofficial_pickle=True)
    assert "md5 differs from the official CIFAR-100 release" in caplog.text


def test_dataset_input_files_lists_what_the_reader_opens():
    specs = {
        "C10": ({"format": "cifar10", "root": str(FIX)},
                ["cifar-10-batches-py/batches.meta", "cifar-10-batches-py/test_batch"]),
        "C100": ({"format": "cifar100", "root": str(FIX / "cifar-100-python")},
                 ["cifar-100-python/meta", "cifar-100-python/test"]),
        "Food": ({"format": "food101", "root": str(FIX / "food-101")}, ["food-101/meta/test.json", "food-101/images"]),
        "C101": ({"format": "caltech101", "root": str(FIX / "caltech101")}, ["caltech101/101_ObjectCategories"]),
        "C256": ({"format": "caltech256", "root": str(FIX / "caltech256" / "256_ObjectCategories")},
                 ["caltech256/256_ObjectCategories"]),
        "IN": ({"format": "imagenet", "root": str(FIX / "imagenet" / "val"),
                "class_index": str(FIX / "imagenet" / "LOC_synset_mapping.txt")},
               ["imagenet/val", "imagenet/LOC_synset_mapping.txt"]),
    }
    for name, (spec, expected) in specs.items():
        assert dataset_input_files(spec, name) == [str(FIX / e) for e in expected], name


def test_dataset_input_files_missing_names_the_config_key(tmp_path):
    key = "evaluation.classification.datasets.Food101.root"
    with pytest.raises(InputError, match=rf"not a Food-101 folder \({key}\).*Fix: .*{key}"):
        dataset_input_files({"format": "food101", "root": str(tmp_path / "food-101")}, "Food101")
    with pytest.raises(InputError, match=r"evaluation\.classification\.datasets\.IN\.class_names"):
        dataset_input_files({"format": "imagenet", "root": str(FIX / "imagenet" / "val"),
                             "class_index": str(FIX / "imagenet" / "LOC_synset_mapping.txt"),
                             "class_names": str(tmp_path / "names.txt")}, "IN")
    with pytest.raises(ConfigError, match=r"datasets\.X\.root is not set"):
        dataset_input_files({"format": "cifar10"}, "X")
    # torchvision's Caltech classes create <root>/caltech101; a missing dataset must fail before that
    with pytest.raises(InputError, match="datasets.C101.root"):
        load_dataset("C101", {"format": "caltech101", "root": str(tmp_path / "nowhere")})
    assert not (tmp_path / "nowhere").exists()


def test_caltech_parent_folder_name_is_required(tmp_path):
    shutil.copytree(FIX / "caltech101" / "101_ObjectCategories", tmp_path / "other" / "101_ObjectCategories")
    with pytest.raises(InputError, match="folder named 'caltech101'.*Fix: move it to .*caltech101/101_ObjectCategories"):
        read_caltech101(tmp_path / "other" / "101_ObjectCategories")


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fixture_script_reproduces_committed_fixtures(tmp_path):
    """The committed fixtures are exactly what scripts/make_demo_classification.py writes (and < 1 MB)."""
    _script().main(["--out", str(tmp_path / "cls")])
    assert _digest(tmp_path / "cls") == _digest(FIX)
    assert sum(p.stat().st_size for p in FIX.rglob("*") if p.is_file()) < 1_000_000


# --------------------------------------------------------------------------------------------
# class_names: torchvision -- the COCO-CF reference evaluation's names (issue 28, item 8)
# --------------------------------------------------------------------------------------------
def test_torchvision_names_of_caltech101_as_the_reference_evaluation(repo):
    """The reference labels with torchvision's Caltech101 classes: no BACKGROUND_Google, folder names
    lower-cased with '_' as a space, the face folders "face" (CLIP's wording, e.g. "side of a car", is not used)."""
    from counterfactory.config import load_config

    paper = load_config([repo / "config" / "config.yaml"])["evaluation"]["classification"]["datasets"]["Caltech101"]
    assert paper["class_names"] == "torchvision" and paper["background_class"] is False
    spec = {"format": "caltech101", "root": str(FIX / "caltech101" / "101_ObjectCategories"),
            "class_names": "torchvision", "background_class": False}
    ds = load_dataset("Caltech101", spec)
    assert ds.class_ids == ["Faces_easy", "accordion", "car_side"] and ds.classes == ["face", "accordion", "car side"]
    assert "BACKGROUND_Google" not in ds.class_ids
    with pytest.raises(ConfigError, match="background_class: false"):
        load_dataset("Caltech101", {**spec, "background_class": True})
    from counterfactory.data.classification import torchvision_class_names

    assert torchvision_class_names("caltech101", ["Faces", "Faces_easy", "Leopards", "Motorbikes", "airplanes",
                                                  "water_lilly"]) == [
        "face", "face", "leopard", "motorbike", "airplane", "water lilly"]
    # Caltech-256 as the reference names it: singular, hyphenated only where the word is, -101 dropped
    assert torchvision_class_names("caltech256", ["binoculars", "faces-easy-101", "t-shirt", "yo-yo", "tennis-shoes",
                                                  "baseball-bat", "motorbikes-101", "clutter", "ak47"]) == [
        "binocular", "face", "t-shirt", "yo-yo", "tennis shoe", "baseball bat", "motorbike", "clutter", "ak47"]
    paper256 = load_config([repo / "config" / "config.yaml"])["evaluation"]["classification"]["datasets"]["Caltech256"]
    assert paper256["class_names"] == "torchvision" and paper256["background_class"] is True
    ds = load_dataset("Caltech256", {"format": "caltech256", "root": str(FIX / "caltech256" / "256_ObjectCategories"),
                                     "class_names": "torchvision"})
    assert ds.classes == ["ak47", "american flag", "airplane", "clutter"]   # the folder names kept "airplanes"


def test_torchvision_names_of_imagenet_are_the_first_lemma_lower_cased(repo, tmp_path):
    from counterfactory.config import load_config

    paper = load_config([repo / "config" / "config.yaml"])["evaluation"]["classification"]["datasets"]["ImageNet"]
    assert paper["class_names"] == "torchvision" and paper["class_index"].endswith("LOC_synset_mapping.txt")
    index = tmp_path / "LOC_synset_mapping.txt"
    index.write_text("n01440764 Three-toed sloth, ai\nn01443537 Granny Smith\nn01484850 great white shark, white shark\n")
    spec = {"format": "imagenet", "root": str(FIX / "imagenet" / "val"), "class_index": str(index),
            "class_names": "torchvision"}
    ds = load_dataset("ImageNet", spec)
    assert ds.classes == ["three-toed sloth", "granny smith", "great white shark"]   # hyphens kept, lower-cased
    assert str(index) in dataset_input_files(spec, "ImageNet")
    with pytest.raises(ConfigError, match="LOC_synset_mapping"):
        load_dataset("ImageNet", {**spec, "class_index": None})
