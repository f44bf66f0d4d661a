"""Readers for the official COCO 2017 / Karpathy formats, on fixtures in those formats (good and
malformed), the COCO-root check, the `data` CLI, and the demo dataset."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from PIL import Image

from counterfactory.cli import main
from counterfactory.data.check import check_coco_root, count_captions
from counterfactory.data.coco import CAPTION_COLUMNS, load_coco_captions, load_coco_instances
from counterfactory.data.karpathy import load_karpathy
from counterfactory.errors import InputError


@pytest.fixture
def fx(repo):
    return repo / "tests" / "fixtures"


def test_captions_keep_every_caption_in_file_order(fx):
    t = load_coco_captions(fx / "coco" / "captions_val2017.json")
    assert list(t.columns) == CAPTION_COLUMNS
    assert t.groupby("image_id").size().to_dict() == {37777: 3, 397133: 6}  # not "five per image"
    first = t[t["image_id"] == 397133]
    assert first["caption_id"].tolist() == [f"397133_{i}" for i in range(6)]
    assert first.iloc[0]["caption"] == "A man is in a kitchen making pizzas."  # file order, not id order
    assert first.iloc[1]["caption"] == "Man in apron standing on front of oven with pans and bakeware"  # stripped
    assert first.iloc[0]["file_name"] == "000000397133.jpg" and first.iloc[0]["width"] == 640
    assert count_captions(fx / "coco" / "captions_val2017.json") == 9


@pytest.mark.parametrize(
    "name, needles",
    [
        ("captions_truncated.json", ["captions_truncated.json", "line", "truncated JSON", "Fix:"]),
        ("captions_missing_key.json", ["captions_missing_key.json", "annotations[3]", "id 370883", "'caption'"]),
        ("captions_unknown_image.json", ["captions_unknown_image.json", "annotations[4]", "unknown image id 999"]),
        ("captions_empty_caption.json", ["captions_empty_caption.json", "annotations[5]", "id 372276", "empty"]),
        ("captions_duplicate_id.json", ["captions_duplicate_id.json", "annotations[6]", "duplicate id"]),
        ("captions_no_images.json", ["captions_no_images.json", "missing top-level key 'images'"]),
    ],
)
def test_malformed_caption_files_name_file_and_record(fx, name, needles):
    with pytest.raises(InputError) as err:
        load_coco_captions(fx / "coco" / name)
    for needle in needles:
        assert needle in str(err.value)


def test_instances(fx):
    images, anns, cats = load_coco_instances(fx / "coco" / "instances_val2017.json")
    assert len(images) == 2 and len(cats) == 2
    row = anns.set_index("id").loc[82445]
    assert row["name"] == "bottle" and (row["x"], row["y"], row["w"], row["h"]) == (217.62, 240.54, 38.99, 57.75)
    assert anns.set_index("id").loc[900100, "iscrowd"] == 1


def test_karpathy(fx):
    k = load_karpathy(fx / "karpathy" / "dataset_coco.json")
    assert len(k) == 5 and set(k["split"]) == {"test", "restval"}
    test = load_karpathy(fx / "karpathy" / "dataset_coco.json", split="test")
    assert test["image_id"].tolist() == [391895, 391895] and test.iloc[0]["filepath"] == "val2014"
    f = load_karpathy(fx / "karpathy" / "dataset_flickr30k.json")
    assert f.iloc[0]["filename"] == "1000092795.jpg" and f.iloc[0]["image_id"] == 0
    with pytest.raises(InputError, match="no images in split 'val'"):
        load_karpathy(fx / "karpathy" / "dataset_coco.json", split="val")


def _fake_root(tmp_path, fx, with_images=True):
    root = tmp_path / "coco"
    (root / "annotations").mkdir(parents=True)
    shutil.copy(fx / "coco" / "captions_val2017.json", root / "annotations")
    shutil.copy(fx / "coco" / "instances_val2017.json", root / "annotations")
    (root / "val2017").mkdir()
    if with_images:
        for name in ("000000397133.jpg", "000000037777.jpg"):
            Image.new("RGB", (8, 8)).save(root / "val2017" / name)
    return root


def test_check_coco_root(tmp_path, fx):
    root = _fake_root(tmp_path, fx)
    report = check_coco_root(root)
    assert report["images"] == 2 and report["captions"] == 9
    digest = __import__("hashlib").sha256((root / "annotations" / "captions_val2017.json").read_bytes()).hexdigest()
    assert check_coco_root(root, checksums={"captions_val2017.json": digest})["checksums_verified"]
    with pytest.raises(InputError, match="does not match"):
        check_coco_root(root, checksums={"captions_val2017.json": "0" * 64})


def test_check_coco_root_failures_explain_download(tmp_path, fx):
    root = _fake_root(tmp_path, fx, with_images=False)
    with pytest.raises(InputError) as err:
        check_coco_root(root)
    assert "2 referenced images missing" in str(err.value) and "annotations_trainval2017.zip" in str(err.value)
    (root / "annotations" / "instances_val2017.json").unlink()
    with pytest.raises(InputError, match="instances_val2017.json: COCO instances file missing"):
        check_coco_root(root)


def test_cli_captions_and_limit(tmp_path, repo):
    out = tmp_path / "c.parquet"
    demo = repo / "resources" / "demo" / "annotations" / "captions_val2017.json"
    assert main(["data", "captions", "--captions-json", str(demo), "--out", str(out)]) == 0
    table = pd.read_parquet(out)
    doc = json.loads(demo.read_text())
    assert len(table) == len(doc["annotations"])
    assert set(table["caption"]) == {a["caption"].strip() for a in doc["annotations"]}
    assert main(["data", "captions", "--captions-json", str(demo), "--out", str(out), "--limit-images", "2"]) == 0
    assert pd.read_parquet(out)["image_id"].nunique() == 2


def test_cli_reports_bad_input_clearly(tmp_path, fx, capsys):
    rc = main(["data", "captions", "--captions-json", str(fx / "coco" / "captions_truncated.json"),
               "--out", str(tmp_path / "x.parquet")])
    assert rc == 2
    assert "captions_truncated.json" in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()  # nothing half-written


def test_demo_dataset_is_consistent(repo):
    root = repo / "resources" / "demo"
    table = load_coco_captions(root / "annotations" / "captions_val2017.json")
    assert table["image_id"].nunique() >= 10
    sizes = table.groupby("image_id").size()
    assert sizes.min() == 3 and sizes.max() == 6
    doc = json.loads((root / "annotations" / "captions_val2017.json").read_text())
    for img in doc["images"]:
        with Image.open(root / "val2017" / img["file_name"]) as im:
            assert im.size == (img["width"], img["height"])
    assert check_coco_root(root)["image_files"] == len(doc["images"])
    assert len(load_karpathy(root / "karpathy" / "dataset_coco.json", split="test")) == len(table)
