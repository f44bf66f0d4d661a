"""Own image–caption collections as a source (issue 15 part 1): tables and folders, every problem listed at
once, the COCO-layout view the COCO readers accept, the config key and the CLI steps."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from PIL import Image

from counterfactory import cli
from counterfactory.config import load_full_config, validate_config
from counterfactory.data.check import check_coco_root
from counterfactory.data.coco import CAPTION_COLUMNS, load_coco_captions, load_coco_instances
from counterfactory.data.own import (OWN_COLUMNS, OwnSource, count_own_captions, load_own_captions, load_own_data,
                                     write_coco_view)
from counterfactory.errors import ConfigError, InputError

REPO = Path(__file__).resolve().parents[1]


def _image(path: Path, size=(8, 6), colour=(200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


@pytest.fixture
def photos(tmp_path):
    """Three small images: b.png 8x6, a.png 4x5, sub/c.png 6x6 (rows below name them out of order)."""
    _image(tmp_path / "b.png")
    _image(tmp_path / "a.png", (4, 5))
    _image(tmp_path / "sub" / "c.png", (6, 6))
    return tmp_path


def _csv(folder: Path, text: str, name="captions.csv") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_table_ids_are_stable_and_match_the_coco_table(photos):
    table = _csv(photos, "image,caption\nb.png,A red  dog\nsub/c.png, A cat on a mat. \na.png,A bird\n"
                         "b.png,Another dog\n")
    out = load_own_captions({"kind": "table", "path": str(table)})
    assert list(out.columns) == OWN_COLUMNS and OWN_COLUMNS[: len(CAPTION_COLUMNS)] == CAPTION_COLUMNS
    # images sorted by relative path: a.png -> 1, b.png -> 2, sub/c.png -> 3; captions of b.png in file order
    assert out["caption_id"].tolist() == ["1_0", "2_0", "2_1", "3_0"]
    assert out["caption"].tolist() == ["A bird", "A red dog", "Another dog", "A cat on a mat."]
    assert out["annotation_id"].tolist() == [3, 1, 4, 2]            # the data row of each caption
    assert out["own_id"].tolist() == ["row 3", "row 1", "row 4", "row 2"]
    assert out["source_image"].tolist() == ["a.png", "b.png", "b.png", "sub/c.png"]
    assert out[["width", "height"]].values.tolist() == [[4, 5], [8, 6], [8, 6], [6, 6]]
    assert out["file_name"].iloc[3] == str(photos / "sub" / "c.png")
    assert out["image_id"].dtype == "int64"
    # reordering the rows keeps every image id and caption id
    _csv(photos, "image,caption\na.png,A bird\nsub/c.png,A cat on a mat.\nb.png,A red dog\nb.png,Another dog\n",
         "shuffled.csv")
    again = load_own_captions({"kind": "table", "path": str(photos / "shuffled.csv")})
    assert again["caption_id"].tolist() == out["caption_id"].tolist()
    assert count_own_captions({"kind": "table", "path": str(table)}) == 4
    assert count_own_captions({"kind": "table", "path": str(table)}, limit=2) == 3   # images 1 and 2


def test_jsonl_and_parquet_with_ids_and_an_image_root(tmp_path):
    _image(tmp_path / "imgs" / "x.jpg")
    (tmp_path / "meta").mkdir()
    jsonl = tmp_path / "meta" / "caps.jsonl"
    jsonl.write_text('{"pic": "x.jpg", "text": "A dog", "uid": 7}\n\n{"pic": "x.jpg", "text": "A cat", "uid": "k"}\n')
    spec = {"kind": "table", "path": str(jsonl), "image_column": "pic", "caption_column": "text",
            "id_column": "uid", "image_root": str(tmp_path / "imgs")}
    out = load_own_captions(spec)
    assert out["own_id"].tolist() == ["7", "k"] and out["caption_id"].tolist() == ["1_0", "1_1"]
    parquet = tmp_path / "meta" / "caps.parquet"
    pd.DataFrame({"pic": ["x.jpg"], "text": ["A horse"], "uid": [3]}).to_parquet(parquet)
    assert load_own_captions({**spec, "path": str(parquet)})["own_id"].tolist() == ["3"]
    # relative paths in the spec are resolved against base_dir
    rel = load_own_captions({**spec, "path": "meta/caps.jsonl", "image_root": "imgs"}, base_dir=tmp_path)
    assert rel["file_name"].iloc[0] == str(tmp_path / "imgs" / "x.jpg")


def _problems(spec, **kw) -> str:
    with pytest.raises(InputError) as info:
        load_own_data(spec, **kw)
    return str(info.value)


def test_every_problem_is_listed_with_file_record_fix_and_a_summary(photos):
    (photos / "empty.png").write_bytes(b"")
    table = _csv(photos, "id,image,caption\n1,a.png,A bird\n2,missing.png,A fish\n1,b.png,A dog\n"
                         "3,b.png,   \n4,empty.png,A box\n")
    msg = _problems({"kind": "table", "path": str(table), "id_column": "id"})
    lines = msg.splitlines()
    assert lines[0].startswith(f"own data source {table} (table): 4 problems (")
    for part in ("1 duplicate id", "1 missing image", "1 empty caption", "1 unreadable image", "nothing was written"):
        assert part in lines[0]
    assert len(lines) == 5 and all("Fix:" in line and str(table) in line for line in lines[1:])
    assert "record row 3 (id 1): duplicate id '1' (also row 1)" in msg
    assert f"record row 2 (id 2): image 'missing.png' not found ({photos / 'missing.png'})" in msg
    assert "record row 4 (id 3): empty caption '   '" in msg
    assert "record row 5 (id 4): image 'empty.png' cannot be used: empty file (0 bytes)" in msg


def test_missing_columns_name_the_config_key(photos):
    table = _csv(photos, "path,text\na.png,A bird\n")
    msg = _problems({"kind": "table", "path": str(table), "id_column": "uid"})
    assert "3 problems (3 missing column)" in msg
    assert "missing column 'image' (found: 'path', 'text')" in msg
    assert "set coco_counterfactuals.data.source.caption_column" in msg and "data.source.id_column" in msg


def test_non_utf8_and_broken_records(photos):
    table = photos / "latin1.csv"
    table.write_bytes("image,caption\na.png,A caf\u00e9\n".encode("latin-1"))
    msg = _problems({"kind": "table", "path": str(table)})
    assert "record line 2: not UTF-8 text" in msg and "iconv" in msg
    jsonl = photos / "c.jsonl"
    jsonl.write_text('{"image": "a.png", "caption": "A bird"}\n[1, 2]\n{"image": "a.png",\n')
    msg = _problems({"kind": "table", "path": str(jsonl)})
    assert "2 problems (2 bad record)" in msg and "record line 2: is a JSON list" in msg
    assert "record line 3: invalid JSON" in msg
    assert "unknown table type '.txt'" in _problems({"kind": "table", "path": str(_csv(photos, "x", "t.txt"))})
    assert "caption table not found" in _problems({"kind": "table", "path": str(photos / "nope.csv")})


def test_folder_with_sidecar_captions(tmp_path):
    _image(tmp_path / "dog.png")
    _image(tmp_path / "deep" / "cat.jpg", (3, 3))
    (tmp_path / "dog.txt").write_text("A dog runs.\n\n  A dog sits.  \n")
    (tmp_path / "deep" / "cat.txt").write_text("A cat.\n")
    out = load_own_captions({"kind": "folder", "path": str(tmp_path)})
    assert out["source_image"].tolist() == ["deep/cat.jpg", "dog.png", "dog.png"]
    assert out["caption_id"].tolist() == ["1_0", "2_0", "2_1"] and out["caption"].iloc[2] == "A dog sits."
    assert out["own_id"].tolist() == ["deep/cat.txt:1", "dog.txt:1", "dog.txt:3"]
    _image(tmp_path / "bird.png")                      # no sidecar
    (tmp_path / "orphan.txt").write_text("A fish.\n")  # no image
    (tmp_path / "deep" / "cat.txt").write_bytes(b"A caf\xe9\n")
    msg = _problems({"kind": "folder", "path": str(tmp_path)})
    assert "3 problems" in msg and "no caption file bird.txt" in msg and "orphan.txt: no image" in msg
    assert f"{tmp_path / 'deep' / 'cat.txt'}, record line 1: not UTF-8" in msg
    with pytest.raises(ConfigError, match="kind 'table' only"):
        OwnSource.from_spec({"kind": "folder", "path": str(tmp_path), "id_column": "id"})
    with pytest.raises(ConfigError, match="unknown keys \\['colour'\\]"):
        OwnSource.from_spec({"kind": "table", "path": "x.csv", "colour": 1})


def _boxes(path: Path, images, annotations) -> Path:
    doc = {"images": images, "annotations": annotations,
           "categories": [{"id": 18, "name": "dog", "supercategory": "animal"}]}
    path.write_text(json.dumps(doc))
    return path


def test_coco_view_is_read_by_the_coco_readers(photos, tmp_path):
    table = _csv(photos, "image,caption\nb.png,A dog on grass\na.png,A bird\nsub/c.png,A cat\n")
    boxes = _boxes(photos / "boxes.json", [{"id": 50, "file_name": "b.png", "width": 8, "height": 6},
                                           {"id": 60, "file_name": "c.png", "width": 6, "height": 6}],
                   [{"id": 1, "image_id": 50, "category_id": 18, "bbox": [1, 1, 4, 3], "area": 12, "iscrowd": 0},
                    {"id": 2, "image_id": 60, "category_id": 18, "bbox": [0, 0, 2, 2], "area": 4, "iscrowd": 0}])
    data = load_own_data({"kind": "table", "path": str(table), "boxes_json": str(boxes)})
    root = tmp_path / "view"
    report = write_coco_view(data, root)
    assert report["images"] == 3 and report["boxes"] == 2
    check = check_coco_root(root, "val2017")                       # also opens every image through the links
    assert (check["images"], check["captions"], check["instance_annotations"], check["image_files"]) == (3, 3, 2, 3)
    caps = load_coco_captions(root / "annotations" / "captions_val2017.json")
    assert caps["caption_id"].tolist() == data.captions["caption_id"].tolist()
    assert caps["file_name"].tolist() == ["a.png", "b.png", "c.png"]
    _, anns, _ = load_coco_instances(root / "annotations" / "instances_val2017.json")
    # b.png is own image 2, sub/c.png (matched by its unique file name) own image 3
    assert anns[["id", "image_id", "x", "w"]].values.tolist() == [[1, 2, 1.0, 4.0], [2, 3, 0.0, 2.0]]
    # a second write replaces the view; a folder that is not a view is refused
    write_coco_view(data, root)
    (tmp_path / "other").mkdir()
    with pytest.raises(InputError, match="not a view written by own-to-coco"):
        write_coco_view(data, tmp_path / "other")


def test_coco_view_has_a_karpathy_split_file_the_retrieval_and_cvld_readers_take(photos, tmp_path):
    """own-to-coco also writes annotations/dataset_own.json (Karpathy layout) with the view as image root, so the
    studies that read a Karpathy split file (spurious-correlation retrieval, CVLD) run on your own data too."""
    from counterfactory.data.karpathy import load_karpathy
    from counterfactory.studies.cvld import data as cvld_data
    from counterfactory.studies.cvld import settings as cvld_settings
    from counterfactory.studies.spurious_retrieval import data as sr_data
    from counterfactory.studies.spurious_retrieval import settings as sr_settings

    table = _csv(photos, "image,caption\nb.png,A dog on grass\na.png,A bird\nsub/c.png,A cat\n"
                         "b.png,\"Dog, running\"\n")
    data = load_own_data({"kind": "table", "path": str(table)})
    root = tmp_path / "view"
    report = write_coco_view(data, root, test_fraction=0.34, val_fraction=0.0)
    assert report["karpathy_splits"] == {"test": 1, "train": 2}
    kp = load_karpathy(root / report["karpathy_json"])
    assert sorted(kp["caption"]) == sorted(data.captions["caption"]) and set(kp["split"]) == {"train", "test"}
    assert kp.groupby("image_id")["split"].nunique().eq(1).all()       # a split per image, not per caption
    for row in kp.itertuples():                                         # image_root / filepath / filename
        assert (root / row.filepath / row.filename).resolve() == Path(
            data.captions.loc[data.captions["image_id"] == row.image_id, "file_name"].iloc[0]).resolve()
    coco = {"karpathy_json": str(root / report["karpathy_json"]), "image_root": str(root)}
    instances = [str(root / "annotations" / "instances_val2017.json")]
    sr = sr_settings.settings({"data": {"coco": {**coco, "instances": instances}}})
    sr_caps = sr_data.load_captions(sr, "coco")
    assert len(sr_caps) == 4 and all(Path(p).is_file() for p in sr_caps["image_path"])
    cv_caps = cvld_data.captions(cvld_settings.settings({"data": {"coco": coco}}), "coco")
    assert len(cv_caps) == 4 and set(cv_caps["split"]) == {"train", "test"}
    # the split follows the ids, not the row order; fractions out of range are refused with the fix
    shuffled = _csv(photos, "image,caption\nsub/c.png,A cat\na.png,A bird\nb.png,\"Dog, running\"\n"
                            "b.png,A dog on grass\n")
    again = write_coco_view(load_own_data({"kind": "table", "path": str(shuffled)}), tmp_path / "v2",
                            test_fraction=0.34, val_fraction=0.0)
    again_kp = load_karpathy(tmp_path / "v2" / again["karpathy_json"])
    assert dict(zip(again_kp["filename"], again_kp["split"])) == dict(zip(kp["filename"], kp["split"]))
    with pytest.raises(ConfigError, match="leaves no training images"):
        write_coco_view(data, tmp_path / "v3", test_fraction=0.5, val_fraction=0.5)


def test_box_problems_are_listed_with_the_rest(photos):
    table = _csv(photos, "image,caption\nb.png,A dog\na.png,\n")
    boxes = _boxes(photos / "boxes.json", [{"id": 5, "file_name": "b.png", "width": 80, "height": 60},
                                           {"id": 6, "file_name": "zebra.png", "width": 8, "height": 6}],
                   [{"id": 1, "image_id": 6, "category_id": 18, "bbox": [0, 0, 1, 1]}])
    msg = _problems({"kind": "table", "path": str(table), "boxes_json": str(boxes)})
    assert "3 problems" in msg and "record row 2: empty caption" in msg
    assert "record images[1] (id 6): boxes for image 'zebra.png', which is not in the own data" in msg
    assert "record images[0] (id 5): size 80x60 differs from the image's 8x6 (b.png)" in msg


def test_cli_writes_nothing_on_failure_and_the_table_otherwise(photos, capsys):
    table = _csv(photos, "image,caption\na.png,A bird\nnope.png,A dog\n")
    out = photos / "out" / "captions.parquet"
    assert cli.main(["data", "own-captions", "--path", str(table), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "image 'nope.png' not found" in err and "Traceback" not in err and not out.parent.exists()
    _csv(photos, "image,caption\na.png,A bird\nb.png,A dog\n")
    assert cli.main(["data", "own-captions", "--path", str(table), "--out", str(out), "--limit-images", "1"]) == 0
    assert pd.read_parquet(out)["caption"].tolist() == ["A bird"]
    report = photos / "check.json"
    assert cli.main(["data", "own-check", "--path", str(table), "--out", str(report)]) == 0
    assert json.loads(report.read_text())["captions"] == 2
    assert cli.main(["data", "own-to-coco", "--path", str(table), "--out-root", str(photos / "v")]) == 0
    assert (photos / "v" / "val2017" / "a.png").is_symlink()


def test_config_key_and_the_demo_overlay(tmp_path, monkeypatch):
    cfg = load_full_config([REPO / "config" / "demo.yaml", REPO / "config" / "demo_own_data.yaml"])
    source = cfg["coco_counterfactuals"]["data"]["source"]
    assert cfg["run_name"] == "demo_own_data" and cfg["studies"] == ["coco_counterfactuals"]
    assert source["image_column"] == "image" and source["id_column"] is None
    plain = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    assert validate_config(plain)["coco_counterfactuals"]["data"]["source"] is None
    plain["coco_counterfactuals"]["data"]["source"] = {"kind": "csv", "path": "x.csv"}
    with pytest.raises(ConfigError, match="source"):
        validate_config(plain)
    monkeypatch.chdir(REPO)   # the overlay's paths are relative to the checkout, like every demo path
    demo = load_own_captions(source)
    assert len(demo) == 8 and demo["image_id"].nunique() == 4 and demo.groupby("image_id").size().eq(2).all()
