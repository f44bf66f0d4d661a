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
    if with_images:      # each image at the size the annotation files declare (check_coco_root compares them)
        for name, size in (("000000397133.jpg", (640, 427)), ("000000037777.jpg", (352, 230))):
            Image.new("RGB", size).save(root / "val2017" / name)
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
    demo = repo / "resources" / "demo" / "coco2017" / "annotations" / "captions_val2017.json"
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
    root = repo / "resources" / "demo" / "coco2017"
    table = load_coco_captions(root / "annotations" / "captions_val2017.json")
    assert table["image_id"].nunique() >= 10
    sizes = table.groupby("image_id").size()
    assert sizes.min() == 3 and sizes.max() == 6
    doc = json.loads((root / "annotations" / "captions_val2017.json").read_text())
    for img in doc["images"]:
        with Image.open(root / "val2017" / img["file_name"]) as im:
            assert im.size == (img["width"], img["height"])
    assert check_coco_root(root)["image_files"] == len(doc["images"])
    karpathy = root.parent / "cuts" / "dataset_coco_test.json"
    assert len(load_karpathy(karpathy, split="test", image_root=root.parent / "coco2014")) == len(table)
    # COCO 2014: the same photos under their val2014 names, byte for byte
    for img in doc["images"]:
        assert (root.parent / "coco2014" / "val2014" / f"COCO_val2014_{img['file_name']}").read_bytes() == \
            (root / "val2017" / img["file_name"]).read_bytes()


# --- wrong types, instances and Karpathy errors, checksums, limits, the other CLI steps -------------------------


def _edited(tmp_path, src, name, edit):
    doc = json.loads(src.read_text())
    edit(doc)
    out = tmp_path / name
    out.write_text(json.dumps(doc, indent=1))
    return out


@pytest.mark.parametrize(
    "edit, needles",
    [
        (lambda d: d["images"][1].update(id="37777"), ["images[1] (id 37777)", "'id' must be an integer"]),
        (lambda d: d["images"][0].update(width=640.5), ["images[0] (id 397133)", "'width' must be an integer"]),
        (lambda d: d["annotations"][2].update(caption=7), ["annotations[2] (id 370584)", "'caption' must be a string"]),
        (lambda d: d["annotations"][1].update(image_id=None),
         ["annotations[1] (id 1)", "'image_id' must be an integer"]),
        (lambda d: d["images"].append(dict(d["images"][0])), ["images[2] (id 397133)", "duplicate id",
                                                              "also used by images[0]"]),
        (lambda d: d["annotations"].__setitem__(0, "oops"), ["annotations[0]", "not an object"]),
        (lambda d: d.update(images={}), ["images", "not a list"]),
    ],
)
def test_wrong_types_name_the_record(tmp_path, fx, edit, needles):
    bad = _edited(tmp_path, fx / "coco" / "captions_val2017.json", "captions_bad_types.json", edit)
    with pytest.raises(InputError) as err:
        load_coco_captions(bad)
    for needle in ["captions_bad_types.json", *needles]:
        assert needle in str(err.value)


def test_instances_file_passed_as_captions_is_named(fx):
    with pytest.raises(InputError, match="instances file"):
        load_coco_captions(fx / "coco" / "instances_val2017.json")


@pytest.mark.parametrize(
    "edit, needles",
    [
        (lambda d: d["annotations"][0].update(category_id=91), ["annotations[0] (id 82445)", "unknown category id 91"]),
        (lambda d: d["annotations"][1].update(image_id=5), ["annotations[1] (id 900100)", "unknown image id 5"]),
        (lambda d: d["annotations"][1].update(bbox=[1, 2, 3]), ["annotations[1] (id 900100)", "[x, y, width, height]"]),
        (lambda d: d["annotations"][0].update(bbox=[1, 2, -3, 4]), ["annotations[0] (id 82445)", "negative"]),
        (lambda d: d["annotations"][1].update(bbox=[float("nan"), 2, 3, 4]), ["annotations[1] (id 900100)", "NaN"]),
        (lambda d: d["annotations"][0].update(bbox=[1, 2, float("inf"), 4]), ["annotations[0] (id 82445)", "infinite"]),
        (lambda d: d["annotations"][0].update(bbox=[630.0, 10.0, 20.0, 5.0]),
         ["annotations[0] (id 82445)", "outside its 640x427 image", "by 10.00 px", "x + width <= image width"]),
        (lambda d: d["annotations"][1].update(bbox=[-1.0, 2.0, 3.0, 4.0]), ["annotations[1] (id 900100)", "outside"]),
        (lambda d: d["annotations"][0].pop("bbox"), ["annotations[0] (id 82445)", "missing key 'bbox'"]),
        (lambda d: d.pop("categories"), ["missing top-level key 'categories'"]),
    ],
)
def test_malformed_instances(tmp_path, fx, edit, needles):
    bad = _edited(tmp_path, fx / "coco" / "instances_val2017.json", "instances_bad.json", edit)
    with pytest.raises(InputError) as err:
        load_coco_instances(bad)
    for needle in ["instances_bad.json", *needles]:
        assert needle in str(err.value)


def test_instances_columns_and_empty_annotations(tmp_path, fx):
    _, anns, cats = load_coco_instances(fx / "coco" / "instances_val2017.json")
    assert {"x", "y", "w", "h", "name", "supercategory", "area", "iscrowd", "category_id", "image_id"} <= set(anns)
    assert anns["x"].dtype == "float64" and anns["iscrowd"].dtype == "int64"
    assert list(cats.columns[:2]) == ["id", "name"]
    empty = _edited(tmp_path, fx / "coco" / "instances_val2017.json", "i.json", lambda d: d.update(annotations=[]))
    images, anns, _ = load_coco_instances(empty)
    assert len(images) == 2 and len(anns) == 0 and {"x", "name"} <= set(anns)


@pytest.mark.parametrize(
    "edit, needles",
    [
        (lambda d: d["images"][1]["sentences"][2].pop("raw"), ["images[1] (COCO_train2014_000000000009.jpg)"
                                                               ".sentences[2]", "missing key 'raw'"]),
        (lambda d: d["images"][1]["sentences"][0].update(raw="  "), ["images[1]", "sentences[0]", "empty sentence"]),
        (lambda d: d["images"][0].pop("split"), ["images[0]", "missing key 'split'"]),
        (lambda d: d["images"][1].update(split="dev"), ["images[1]", "unknown split 'dev'"]),
        (lambda d: d["images"][1].update(cocoid="9"), ["images[1]", "image id '9' is not an integer"]),
        (lambda d: d["images"][0]["sentences"][1].update(sentid=1.5), ["images[0]", "sentences[1]", "'sentid' 1.5"]),
    ],
)
def test_malformed_karpathy(tmp_path, fx, edit, needles):
    bad = _edited(tmp_path, fx / "karpathy" / "dataset_coco.json", "dataset_bad.json", edit)
    with pytest.raises(InputError) as err:
        load_karpathy(bad)
    for needle in ["dataset_bad.json", *needles]:
        assert needle in str(err.value)


def test_karpathy_split_filter_keeps_file_indices_and_checks_names(tmp_path, fx):
    def edit(d):
        d["images"][1]["sentences"][1].pop("sentid")
    bad = _edited(tmp_path, fx / "karpathy" / "dataset_coco.json", "k.json", edit)
    assert len(load_karpathy(bad, split="test")) == 2  # the broken record is not in the test split
    with pytest.raises(InputError, match=r"images\[1\] .*sentences\[1\]: missing key 'sentid'"):
        load_karpathy(bad, split=["restval"])
    with pytest.raises(InputError, match="no such split 'tset'"):
        load_karpathy(fx / "karpathy" / "dataset_coco.json", split="tset")
    k = load_karpathy(fx / "karpathy" / "dataset_coco.json", split=("test", "restval"))
    assert list(k.columns) == ["image_id", "filename", "filepath", "split", "sentid", "caption"]
    assert k["sentid"].tolist() == [770337, 771687, 1, 2, 3]
    assert k.iloc[0]["caption"] == "A man with a red helmet on a small moped on a dirt road."
    assert load_karpathy(fx / "karpathy" / "dataset_flickr30k.json").iloc[0]["filepath"] == ""


def test_count_captions_limit_matches_cli(tmp_path, repo, fx):
    demo = repo / "resources" / "demo" / "coco2017" / "annotations" / "captions_val2017.json"
    for n in (1, 3, 100):
        out = tmp_path / f"c{n}.parquet"
        assert main(["data", "captions", "--captions-json", str(demo), "--out", str(out),
                     "--limit-images", str(n)]) == 0
        table = pd.read_parquet(out)
        assert count_captions(demo, limit_images=n) == len(table)
        assert table["image_id"].tolist() == sorted(table["image_id"])  # sorted, deterministic
    assert count_captions(fx / "coco" / "captions_val2017.json", limit_images=1) == 3  # image 37777 first
    with pytest.raises(InputError, match="captions_truncated.json, record line 1 column"):
        count_captions(fx / "coco" / "captions_truncated.json")


def test_checksums_md5_sha1_prefixed_and_paths(tmp_path, fx):
    import hashlib

    root = _fake_root(tmp_path, fx)
    data = (root / "annotations" / "instances_val2017.json").read_bytes()
    sums = {"instances_val2017.json": hashlib.md5(data).hexdigest(),
            "annotations/instances_val2017.json": "sha1:" + hashlib.sha1(data).hexdigest()}
    report = check_coco_root(root, checksums=sums)
    assert report["checksums"]["instances_val2017.json"]["algorithm"] == "md5"
    assert report["checksums"]["annotations/instances_val2017.json"]["algorithm"] == "sha1"
    assert report["instance_annotations"] == 2 and report["categories"] == 2
    with pytest.raises(InputError, match="md5 .* does not match"):
        check_coco_root(root, checksums={"captions_val2017.json": "0" * 32})
    with pytest.raises(InputError, match="cannot tell the algorithm"):
        check_coco_root(root, checksums={"captions_val2017.json": "abc"})


def test_check_coco_root_missing_root_and_folder(tmp_path, fx):
    with pytest.raises(InputError) as err:
        check_coco_root(tmp_path / "nowhere")
    assert "COCO root folder does not exist" in str(err.value) and "cocodataset.org" in str(err.value)
    assert "val2017.zip" in str(err.value)
    root = _fake_root(tmp_path, fx)
    shutil.rmtree(root / "val2017")
    with pytest.raises(InputError, match=r"val2017: image folder missing"):
        check_coco_root(root)
    assert "image_files" not in check_coco_root(root, expect_images=False)
    (root / "annotations" / "captions_val2017.json").write_text('{"images": [')
    with pytest.raises(InputError, match=r"captions_val2017.json, record line 1 column 13: invalid or truncated JSON"):
        check_coco_root(root, expect_images=False)


def test_cli_check_coco_karpathy_instances(tmp_path, repo, fx):
    root = _fake_root(tmp_path, fx)
    sums = tmp_path / "sums.json"
    digest = __import__("hashlib").sha256((root / "annotations" / "captions_val2017.json").read_bytes()).hexdigest()
    sums.write_text(json.dumps({"captions_val2017.json": digest}))
    report = tmp_path / "report.json"
    assert main(["data", "check-coco", "--root", str(root), "--out", str(report), "--checksums", str(sums)]) == 0
    assert json.loads(report.read_text())["checksums_verified"] == ["captions_val2017.json"]
    sums.write_text(json.dumps({"captions_val2017.json": "f" * 64}))
    assert main(["data", "check-coco", "--root", str(root), "--out", str(tmp_path / "r2.json"),
                 "--checksums", str(sums)]) == 2
    out = tmp_path / "k.parquet"
    assert main(["data", "karpathy", "--json", str(repo / "resources/demo/coco2014/dataset_coco.json"),
                 "--split", "test", "--out", str(out)]) == 0
    assert pd.read_parquet(out)["split"].eq("test").all()
    boxes = tmp_path / "b.parquet"
    assert main(["data", "instances", "--instances-json", str(fx / "coco" / "instances_val2017.json"),
                 "--out", str(boxes)]) == 0
    assert pd.read_parquet(boxes)["category_name"].tolist() == ["person", "bottle"]  # sorted by image id


def test_demo_rows_match_json_and_boxes_fit(repo):
    root = repo / "resources" / "demo" / "coco2017"
    doc = json.loads((root / "annotations" / "captions_val2017.json").read_text())
    table = load_coco_captions(root / "annotations" / "captions_val2017.json")
    by_id = {a["id"]: a for a in doc["annotations"]}
    for row in table.itertuples():
        ann = by_id[row.annotation_id]
        assert ann["image_id"] == row.image_id and ann["caption"] == row.caption
        assert row.caption_id == f"{row.image_id}_{row.caption_index}"
    images, anns, _ = load_coco_instances(root / "annotations" / "instances_val2017.json")
    size = images.set_index("id")
    for box in anns.itertuples():
        assert 0 <= box.x and box.x + box.w <= size.at[box.image_id, "width"] + 0.01
        assert 0 <= box.y and box.y + box.h <= size.at[box.image_id, "height"] + 0.01
    assert (root.parent / "LICENSES.md").exists()
    total = sum(p.stat().st_size for p in root.parent.rglob("*") if p.is_file() and "classification" not in p.parts)
    assert total < 1_500_000


def test_boxes_sticking_out_by_rounding_are_clipped(tmp_path, fx):
    def edit(d):
        d["annotations"][0]["bbox"] = [-0.4, 400.0, 20.0, 27.5]          # image 640x427: y + h = 427.5
    bad = _edited(tmp_path, fx / "coco" / "instances_val2017.json", "instances_round.json", edit)
    _, anns, _ = load_coco_instances(bad)
    row = anns.set_index("id").loc[82445]
    assert (row["x"], row["y"], row["w"], row["h"]) == (0.0, 400.0, 19.6, 27.0)
    assert list(row["bbox"]) == [-0.4, 400.0, 20.0, 27.5]               # the file's values are kept
    assert anns.set_index("id").loc[900100, "w"] == 7.9                  # inside boxes keep exact values


def test_cli_instances_rejects_outside_boxes(tmp_path, fx, capsys):
    bad = _edited(tmp_path, fx / "coco" / "instances_val2017.json", "instances_out.json",
                  lambda d: d["annotations"][0].update(bbox=[600.0, 10.0, 100.0, 5.0]))
    assert main(["data", "instances", "--instances-json", str(bad), "--out", str(tmp_path / "b.parquet")]) == 2
    err = capsys.readouterr().err
    assert "instances_out.json" in err and "id 82445" in err and "Fix:" in err and "Traceback" not in err


def test_check_coco_root_reports_unreadable_images(tmp_path, fx, capsys):
    root = _fake_root(tmp_path, fx)
    good = (root / "val2017" / "000000397133.jpg").read_bytes()
    (root / "val2017" / "000000397133.jpg").write_bytes(b"")                        # zero bytes
    big = tmp_path / "big.jpg"
    import numpy as np

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (230, 352, 3), dtype=np.uint8)).save(big)   # 000000037777's declared size
    data = big.read_bytes()
    (root / "val2017" / "000000037777.jpg").write_bytes(data[: len(data) // 2])     # truncated download
    with pytest.raises(InputError) as err:
        check_coco_root(root)
    msg = str(err.value)
    assert "2 unreadable images" in msg and "000000397133.jpg (empty file (0 bytes))" in msg
    assert "000000037777.jpg (corrupt or truncated" in msg and "re-extract them from val2017.zip" in msg
    assert main(["data", "check-coco", "--root", str(root), "--out", str(tmp_path / "r.json")]) == 2
    assert "unreadable" in capsys.readouterr().err
    (root / "val2017" / "000000397133.jpg").write_bytes(good)
    (root / "val2017" / "000000037777.jpg").write_bytes(b"not a jpeg at all")
    with pytest.raises(InputError, match=r"1 unreadable images .*000000037777.jpg \(not an image PIL can read\)"):
        check_coco_root(root)
    (root / "val2017" / "000000037777.jpg").write_bytes(data + b"\0" * 16)        # trailing padding is fine
    assert check_coco_root(root)["image_files"] == 2
