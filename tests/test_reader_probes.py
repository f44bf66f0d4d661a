"""Issue 31 (reliability round 2), the reader cases: each test builds the bad input the probe used and checks the
one clear error (file, record, fix) that replaced a silent pass, a late failure or a traceback.

Items: 1 (declared image sizes vs the files), 6 (a tab or control character in a caption that becomes a prompt),
7 (duplicate Karpathy cocoid), 8 (Karpathy filename that does not exist), 9 (own-data image outside the image
root), 10 (non-positive COCO image size), 17 (non-UTF-8 bytes in three readers), 18 (zero-byte Flickr30k image,
a JSON number as caption, a CSV as caption table)."""

from __future__ import annotations

import copy
import json
import shutil

import pandas as pd
import pytest
from PIL import Image

from counterfactory.data import flickr30k_entities as f30k
from counterfactory.data.check import check_coco_root, check_image_sizes
from counterfactory.data.coco import load_coco_captions, load_coco_instances
from counterfactory.data.fairface import load_fairface
from counterfactory.data.karpathy import load_karpathy
from counterfactory.data.own import load_own_data
from counterfactory.data.releases import read_coco_counterfactuals
from counterfactory.errors import InputError
from counterfactory.text.caption_stage import read_shard
from counterfactory.text.captions import prompt_text_problem
from counterfactory.text.llm import check_answer


@pytest.fixture
def fx(repo):
    return repo / "tests" / "fixtures"


def _coco_root(tmp_path, fx, scale: float = 1.0):
    """The fixture COCO files under ``root/annotations`` and an image per entry at ``scale`` x its declared size."""
    root = tmp_path / "coco"
    (root / "annotations").mkdir(parents=True)
    (root / "val2017").mkdir()
    for name in ("captions_val2017.json", "instances_val2017.json"):
        shutil.copy(fx / "coco" / name, root / "annotations")
    for im in json.loads((fx / "coco" / "instances_val2017.json").read_text())["images"]:
        size = (round(im["width"] * scale), round(im["height"] * scale))
        Image.new("RGB", size, (90, 120, 150)).save(root / "val2017" / im["file_name"])
    return root


# ----------------------------------------------------------------------------------------------- item 1
def test_check_coco_root_compares_declared_sizes_with_the_image_files(tmp_path, fx):
    """Probe: a resized copy of the images (annotations declare 2x their size) passed check-coco."""
    assert check_coco_root(_coco_root(tmp_path / "ok", fx))["image_files"] == 2
    root = _coco_root(tmp_path / "half", fx, scale=0.5)
    with pytest.raises(InputError) as err:
        check_coco_root(root)
    msg = str(err.value)
    assert "instances_val2017.json, record images[0] (id 397133)" in msg
    assert "declared 640x427" in msg and "000000397133.jpg is 320x214" in msg and "(1 more images like this)" in msg
    assert "Fix:" in msg


def test_region_selection_checks_declared_sizes_of_the_images_it_requests(tmp_path):
    """The check the spurious select step makes on the images of its removal requests (header only)."""
    Image.new("RGB", (32, 16)).save(tmp_path / "a.jpg")
    Image.new("RGB", (20, 10)).save(tmp_path / "b.jpg")
    images = pd.DataFrame({"image_id": [1, 2, 3], "width": [32, 40, 5], "height": [16, 20, 5],
                           "source": "inst.json", "record": ["images[0] (id 1)", "images[1] (id 2)", "images[2] (id 3)"]})
    check_image_sizes(images.iloc[:1], {1: tmp_path / "a.jpg"})                    # matching: fine
    with pytest.raises(InputError, match=r"inst\.json, record images\[1\] \(id 2\): image 2 is declared 40x20 "
                                         r"\(width x height\) but the file .*b\.jpg is 20x10"):
        check_image_sizes(images, [(1, tmp_path / "a.jpg"), (2, tmp_path / "b.jpg")])


def test_spurious_select_refuses_instances_declared_at_twice_the_image_size(tmp_path, repo, monkeypatch):
    """Probe: every image and box declared at 2x (a resized COCO copy): 5 of 8 masks empty, 3 wrong, exit 0."""
    from counterfactory.config import load_config
    from counterfactory.studies.spurious_retrieval import data as dt
    from counterfactory.studies.spurious_retrieval import regions as rg
    from counterfactory.studies.spurious_retrieval import settings as st

    monkeypatch.chdir(repo)
    doc = json.loads((repo / "resources/demo/coco2017/annotations/instances_val2017.json").read_text())
    for im in doc["images"]:
        im["width"], im["height"] = 2 * im["width"], 2 * im["height"]
    for a in doc["annotations"]:
        a["bbox"] = [2 * v for v in a["bbox"]]
        a["segmentation"] = [[2 * v for v in poly] for poly in a["segmentation"]] \
            if isinstance(a.get("segmentation"), list) else a.get("segmentation")
    (tmp_path / "instances.json").write_text(json.dumps(doc))
    s = copy.deepcopy(st.settings(load_config([repo / "config" / "demo.yaml"], study="spurious_retrieval")))
    s["data"]["coco"]["instances"] = [str(tmp_path / "instances.json")]
    with pytest.raises(InputError, match=r"instances\.json, record images\[\d+\] \(id \d+\): image \d+ is declared "
                                         r"512x512 .* is 256x256 \(\d+ more images like this\)"):
        dt.select(s, rg.settings(None), "coco")


# ----------------------------------------------------------------------------------------------- item 10
@pytest.mark.parametrize("key, value", [("width", 0), ("height", -5)])
def test_coco_image_size_must_be_positive(tmp_path, fx, key, value):
    for name, reader in (("captions_val2017.json", load_coco_captions), ("instances_val2017.json",
                                                                          load_coco_instances)):
        doc = json.loads((fx / "coco" / name).read_text())
        doc["images"][1][key] = value
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        with pytest.raises(InputError) as err:
            reader(path)
        msg = str(err.value)
        assert f"{name}, record images[1] (id 37777)" in msg and "both must be positive" in msg and "Fix:" in msg
        assert ("0 x 230" if value == 0 else "352 x -5") in msg


# ----------------------------------------------------------------------------------------------- items 7, 8
def test_karpathy_duplicate_cocoid_is_an_error(tmp_path, repo):
    """Probe: a duplicate cocoid silently dropped an image (2 of 13 spurious-retrieval candidates lost)."""
    doc = json.loads((repo / "resources/demo/coco2014/dataset_coco.json").read_text())
    doc["images"][3]["cocoid"] = doc["images"][1]["cocoid"]
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        load_karpathy(path)
    msg = str(err.value)
    assert f"dataset_coco.json, record images[3] ({doc['images'][3]['filename']})" in msg
    assert f"duplicate cocoid {doc['images'][1]['cocoid']} (also images[1]" in msg and "Fix:" in msg


def test_karpathy_filename_that_does_not_exist_fails_at_selection(tmp_path, repo, monkeypatch):
    """Probe: a missing Karpathy filename passed selection and failed in inpainting, naming the request table."""
    from counterfactory.config import load_config
    from counterfactory.studies.spurious_retrieval import data as dt
    from counterfactory.studies.spurious_retrieval import settings as st

    monkeypatch.chdir(repo)
    doc = json.loads((repo / "resources/demo/coco2014/dataset_coco.json").read_text())
    assert len(load_karpathy(repo / "resources/demo/coco2014/dataset_coco.json", image_root="resources/demo/coco2014"))
    doc["images"][2]["filename"] = "000000999999.jpg"
    path = tmp_path / "odmap.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        load_karpathy(path, image_root=repo / "resources/demo/coco2014")
    msg = str(err.value)
    assert "odmap.json, record images[2] (000000999999.jpg)" in msg and "val2014/000000999999.jpg not found" in msg
    assert "(1 of 12 images missing)" in msg and "image_root" in msg
    load_karpathy(path)                                   # without image_root the files are not looked at
    s = copy.deepcopy(st.settings(load_config([repo / "config" / "demo.yaml"], study="spurious_retrieval")))
    s["data"]["coco"]["karpathy_json"] = str(path)
    with pytest.raises(InputError, match=r"odmap\.json, record images\[2\] \(000000999999\.jpg\)"):
        dt.load_captions(s, "coco")                       # the selection step's reader


# ----------------------------------------------------------------------------------------------- item 9
def test_own_data_image_outside_the_image_root_is_an_error(tmp_path, repo):
    """Probe: a ``../`` path was accepted without a note, and the image was not a declared workflow input."""
    shutil.copy(repo / "resources/demo/coco2017/val2017/000000000101.jpg", tmp_path / "outside.jpg")
    (tmp_path / "table").mkdir()
    shutil.copy(repo / "resources/demo/coco2017/val2017/000000000101.jpg", tmp_path / "table" / "inside.jpg")
    (tmp_path / "table" / "captions.csv").write_text("image,caption\ninside.jpg,a photo\n../outside.jpg,a photo\n")
    with pytest.raises(InputError) as err:
        load_own_data({"kind": "table", "path": str(tmp_path / "table" / "captions.csv")})
    msg = str(err.value)
    assert "1 image outside the image root" in msg and "record row 2" in msg
    assert f"'../outside.jpg' is {tmp_path / 'outside.jpg'}, outside the image root {tmp_path / 'table'}" in msg
    assert "image_root" in msg.split("Fix:")[1]
    (tmp_path / "table" / "rooted.csv").write_text("image,caption\ntable/inside.jpg,a photo\noutside.jpg,a photo\n")
    data = load_own_data({"kind": "table", "path": str(tmp_path / "table" / "rooted.csv"),
                          "image_root": str(tmp_path)})            # a root holding both: fine
    assert len(data.captions) == 2


# ----------------------------------------------------------------------------------------------- item 17
def test_non_utf8_bytes_name_file_line_and_byte_offset(tmp_path, repo):
    """Probe: Flickr30k Entities Sentences, a FairFace CSV and the release's examples.jsonl ended in
    UnicodeDecodeError tracebacks."""
    ents = tmp_path / "entities"
    shutil.copytree(repo / "resources/demo/flickr30k_entities/Sentences", ents / "Sentences")
    sentence = ents / "Sentences" / "1000000001.txt"
    good = sentence.read_bytes()
    sentence.write_bytes(good.rstrip(b"\n") + b"\nA caf\xe9 table .\n")
    with pytest.raises(InputError) as err:
        f30k.captions_frame(ents, image_ids=["1000000001"])
    lines = good.rstrip(b"\n").count(b"\n") + 2
    offset = len(good.rstrip(b"\n")) + 1 + len(b"A caf")
    assert f"1000000001.txt, record line {lines}: not UTF-8 text" in str(err.value)
    assert f"at byte {offset})" in str(err.value) and "Fix:" in str(err.value)

    ff = tmp_path / "fairface"
    ff.mkdir()
    (ff / "fairface_label_val.csv").write_bytes(b"file,age,gender,race,service_test\n"
                                                b"val/1.jpg,20-29,Male,White,True\nval/2\xff.jpg,3-9,Male,White,True\n")
    with pytest.raises(InputError, match=r"fairface_label_val\.csv, record line 3: not UTF-8 text \(invalid start "
                                         r"byte at byte 71\)"):
        load_fairface(ff, check_images=False)

    rel = tmp_path / "release"
    (rel / "data").mkdir(parents=True)
    first = json.dumps({"id": "1", "caption_0": "a", "caption_1": "b", "image_0": "1_0", "image_1": "1_1"}) + "\n"
    (rel / "data" / "examples.jsonl").write_bytes(first.encode() + b'{"id": "2", "caption_0": "\x93x\x94"}\n')
    with pytest.raises(InputError) as err:
        read_coco_counterfactuals(rel)
    assert f"examples.jsonl, record line 2: not UTF-8 text (invalid start byte at byte {len(first) + 26})" in \
        str(err.value)


# ----------------------------------------------------------------------------------------------- item 18
def test_zero_byte_flickr30k_image_is_named(tmp_path, repo):
    """Probe: ``countercurate positions`` failed with "cannot identify image file" and a generic fix."""
    images = tmp_path / "flickr30k-images"
    images.mkdir()
    shutil.copy(repo / "resources/demo/flickr30k/flickr30k-images/1000000002.jpg", images)
    (images / "1000000001.jpg").write_bytes(b"")
    assert f30k.image_path(images, "1000000002").endswith("1000000002.jpg")
    assert f30k.image_path(images, "1000000003") is None                 # absent: no image, as before
    with pytest.raises(InputError, match=r"1000000001\.jpg, record image 1000000001: empty image file \(0 bytes\)\. "
                                         r"Fix: re-extract the image"):
        f30k.image_path(images, "1000000001")


def test_own_data_caption_that_is_a_number_says_so(tmp_path, repo):
    """Probe: a JSON Lines caption 5 was reported as "empty caption '5'"."""
    shutil.copy(repo / "resources/demo/coco2017/val2017/000000000101.jpg", tmp_path / "a.jpg")
    (tmp_path / "c.jsonl").write_text('{"image": "a.jpg", "caption": "a photo"}\n{"image": "a.jpg", "caption": 5}\n')
    with pytest.raises(InputError) as err:
        load_own_data({"kind": "table", "path": str(tmp_path / "c.jsonl")})
    msg = str(err.value)
    assert "c.jsonl, record line 2: caption 5 in 'caption' is a number, not a string" in msg
    assert "empty caption" not in msg and '"caption": "5"' in msg


def test_csv_caption_table_says_it_must_be_parquet(tmp_path):
    """Probe: ``captions edit --captions x.csv`` ended in a pyarrow traceback."""
    (tmp_path / "caps.csv").write_text("caption_id,image_id,caption\n1_0,1,a dog\n")
    with pytest.raises(InputError) as err:
        read_shard(tmp_path / "caps.csv", 0, 10)
    msg = str(err.value)
    assert "caps.csv: a CSV file, but the caption table must be parquet" in msg
    assert "pd.read_csv('caps.csv', dtype={'caption_id': str}).to_parquet('caps.parquet', index=False)" in msg
    (tmp_path / "fake.parquet").write_text("caption_id,image_id,caption\n")   # a CSV under a parquet name
    with pytest.raises(InputError, match=r"fake\.parquet: not a readable parquet file"):
        read_shard(tmp_path / "fake.parquet", 0, 10)


# ----------------------------------------------------------------------------------------------- item 6
@pytest.mark.parametrize("text, needle", [("a red\tcar on a street", "a tab (U+0009) at character 5"),
                                          ("a red car\x1b[31m", "a control character (U+001B) at character 9"),
                                          ("two dogs\non grass", "a line break (U+000A) at character 8")])
def test_negative_caption_with_a_control_character_is_rejected(text, needle):
    """Probe: a negative with a tab was accepted and became the text-to-image prompt."""
    assert needle in prompt_text_problem(text)
    assert prompt_text_problem("a red car, on a street (café)") is None
    assert "is a number, not a string" in prompt_text_problem(5)
    schema = {"type": "object", "properties": {"negative": {"type": "string", "minLength": 1}},
              "required": ["negative"]}
    value, error = check_answer(json.dumps({"negative": text}), schema)
    assert value == {"negative": text} and error.startswith("negative: ") and needle in error
    assert check_answer(json.dumps({"negative": "a blue car on a street"}), schema) == (
        {"negative": "a blue car on a street"}, None)


# ----------------------------------------------------------------------------------------------- the CLI's view
def test_cli_check_coco_refuses_a_resized_copy_in_one_line(tmp_path, fx, capsys):
    from counterfactory import cli

    root = _coco_root(tmp_path, fx, scale=0.5)
    out = tmp_path / "report.json"
    assert cli.main(["data", "check-coco", "--root", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and not out.exists()
    assert "record images[0] (id 397133): image 397133 is declared 640x427" in err


def test_cli_captions_edit_with_a_csv_says_parquet_before_loading_models(tmp_path, repo, monkeypatch, capsys):
    from counterfactory import cli

    monkeypatch.chdir(repo)
    (tmp_path / "caps.csv").write_text("caption_id,image_id,caption\n1_0,1,a dog\n")
    outs = [tmp_path / "a.parquet", tmp_path / "r.parquet", tmp_path / "s.json"]
    assert cli.main(["captions", "edit", "--config", "config/demo.yaml", "--captions", str(tmp_path / "caps.csv"),
                     "--shard", "0", "--out", str(outs[0]), "--out-rejected", str(outs[1]),
                     "--out-summary", str(outs[2]), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "a CSV file, but the caption table must be parquet" in err and "to_parquet" in err
    assert "Traceback" not in err and not any(p.exists() for p in outs)


def test_a_request_table_with_a_tab_in_a_prompt_is_refused_where_it_is_read(tmp_path):
    """A hand-edited GLIGEN / t2i request table: a control character in a prompt names the file and the record."""
    from counterfactory.generation.grounded_requests import read_requests

    path = tmp_path / "requests.parquet"
    pd.DataFrame([{"item_id": "a1", "kind": "t2i", "prompt": "a red\tcar on a street", "phrases": [], "boxes": []},
                  ]).to_parquet(path, index=False)
    with pytest.raises(InputError, match=r"requests\.parquet.*a1.*control|tab") as err:
        read_requests(path)
    assert "one line of plain text" in str(err.value)
    pd.DataFrame([{"item_id": "a1", "kind": "t2i", "prompt": "a red car on a street", "phrases": [], "boxes": []},
                  ]).to_parquet(path, index=False)
    assert read_requests(path)[0].prompt == "a red car on a street"
