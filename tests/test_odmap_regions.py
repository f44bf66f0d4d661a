"""Region selection of the spurious-correlation retrieval study (Kim et al. 2023, §3.1 Eq. 1-3, appendix C)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from counterfactory import cli
from counterfactory.errors import ConfigError, InputError
from counterfactory.studies.spurious_retrieval import regions as rg

NAMES = {1: "person", 2: "dog", 3: "frisbee", 4: "car"}


def frames(boxes, width=10, height=10):
    """``(images, objects)`` for one image (id 7) from ``[(category_id, x, y, w, h), ...]``."""
    images = pd.DataFrame({"image_id": [7], "width": [width], "height": [height]})
    objects = pd.DataFrame([{"image_id": 7, "category_id": c, "category": NAMES[c], "x": x, "y": y, "w": w, "h": h}
                            for c, x, y, w, h in boxes])
    return images, objects


def rows(boxes, width=10, height=10, **params):
    table = rg.select_regions(*frames(boxes, width, height), dict(rg.defaults(), **params))
    return {r.category: r for r in table.itertuples(index=False)}


# ------------------------------------------------------------------ thresholds exactly at their edges
@pytest.mark.parametrize("covered, single", [(3, True), (4, False)])
def test_alpha1_is_strict(covered, single):
    # the dog's region is 10 px (one row); the person covers `covered` of them: 0.3 -> single, exactly 0.4 -> not
    out = rows([(1, 0, 0, covered, 1), (2, 0, 0, 10, 1)])
    person = out["person"]
    assert json.loads(person.overlaps) == {"dog": covered / 10}
    assert person.selected is single
    assert (person.mode, person.reason) == (("single", "") if single else ("", "overlap"))
    assert list(person.removed_categories) == ["person"]


@pytest.mark.parametrize("covered, multi", [(8, False), (9, True)])
def test_alpha2_is_strict(covered, multi):
    # overlap exactly 0.8 does not join the removal set (Eq. 2 and the listing both use '>')
    person = rows([(1, 0, 0, covered, 1), (2, 0, 0, 10, 1)])["person"]
    assert person.max_overlap == covered / 10
    if multi:
        assert (person.selected, person.mode) == (True, "multi")
        assert list(person.removed_categories) == ["person", "dog"] and list(person.removed_category_ids) == [1, 2]
        assert person.removed_area_ratio == pytest.approx(0.1)
    else:
        assert (person.selected, person.reason) == (False, "overlap")
        assert list(person.removed_category_ids) == [1]


@pytest.mark.parametrize("rule, extra, selected", [
    ("pseudocode", False, True),   # exactly 0.7: the listing skips only '> alpha3'
    ("pseudocode", True, False),   # 0.71
    ("text", False, False),        # exactly 0.7: Eq. 3 keeps only '< alpha3'
    ("text", True, False),
])
def test_alpha3_edge(rule, extra, selected):
    boxes = [(1, 0, 0, 7, 10), (2, 8, 0, 2, 2)] + ([(1, 7, 9, 1, 1)] if extra else [])
    person = rows(boxes, rule=rule)["person"]
    assert person.candidate_area_ratio == (0.71 if extra else 0.7)
    assert person.selected is selected
    assert person.reason == ("" if selected else "area")
    # the dog (4 px, untouched) is removed alone in every case
    assert rows(boxes, rule=rule)["dog"].mode == "single"


def test_alpha3_just_below_edge_selected_by_both_rules():
    boxes = [(1, 0, 0, 7, 10), (2, 8, 0, 2, 2)]
    assert rows(boxes, rule="text", alpha3=0.71)["person"].selected
    assert not rows(boxes, rule="pseudocode", alpha3=0.69)["person"].selected


# ------------------------------------------------------------------ masks: union, not sum
def test_union_mask_counts_overlapping_boxes_once():
    mask = rg.union_mask([[0, 0, 5, 5], [2, 2, 5, 5]], 10, 10)
    assert mask.dtype == bool and mask.shape == (10, 10)
    assert mask.sum() == 25 + 25 - 9
    assert mask[0, 0] and mask[6, 6] and not mask[0, 6] and not mask[6, 0]


def test_union_mask_many_boxes_equals_painted_boxes():
    rng = np.random.default_rng(3)
    boxes = np.c_[rng.uniform(0, 20, 6), rng.uniform(0, 10, 6), rng.uniform(0, 12, 6), rng.uniform(0, 9, 6)]
    painted = np.zeros((19, 32), dtype=bool)
    for n, (x, y, w, h) in enumerate(boxes, start=1):     # pixel-centre rule, box by box
        painted[math.ceil(y - 0.5):math.ceil(y + h - 0.5), math.ceil(x - 0.5):math.ceil(x + w - 0.5)] = True
        np.testing.assert_array_equal(rg.union_mask(boxes[:n], 19, 32), painted)   # outer product and matmul paths


def test_union_mask_pixel_centre_rule():
    assert rg.union_mask([[0, 0, 3, 2]], 4, 5).sum() == 6                 # integer box: w * h pixels
    assert rg.union_mask([[0.5, 0, 1, 1]], 1, 3).nonzero()[1].tolist() == [0]   # centre 0.5 inside [0.5, 1.5)
    assert rg.union_mask([[0.2, 0.2, 0.2, 0.2]], 3, 3).sum() == 0          # covers no pixel centre
    assert rg.union_mask(np.zeros((0, 4)), 3, 3).sum() == 0


def test_class_region_is_union_in_overlaps_and_area():
    # the person's two boxes overlap (41 px together, not 50); the dog lies in the shared part
    person = rows([(1, 0, 0, 5, 5), (1, 2, 2, 5, 5), (2, 3, 3, 2, 2)])["person"]
    assert person.candidate_area_ratio == pytest.approx(0.41)
    assert json.loads(person.overlaps) == {"dog": 1.0}                      # not 2.0
    assert person.mode == "multi" and person.removed_area_ratio == pytest.approx(0.41)


# ------------------------------------------------------------------ branches
def test_single_multi_area_branches():
    # person 4x10 on the left, dog inside the person, frisbee far right, car covering most of the image
    boxes = [(1, 0, 0, 4, 10), (2, 1, 1, 2, 2), (3, 8, 0, 2, 2)]
    out = rows(boxes)
    assert (out["person"].mode, list(out["person"].removed_categories)) == ("multi", ["person", "dog"])
    assert out["dog"].mode == "single"                 # removing the dog erases only 4/40 of the person
    assert out["frisbee"].mode == "single"
    big = rows([(4, 0, 0, 10, 8), (3, 0, 8, 2, 2)])
    assert (big["car"].selected, big["car"].reason) == (False, "area")
    assert big["frisbee"].mode == "single"


def test_dog_inside_person_is_removed_alone():
    # the dog covers 4 of the person's 40 px (0.1 < alpha1): single removal of the dog
    out = rows([(1, 0, 0, 4, 10), (2, 1, 1, 2, 2), (3, 8, 0, 2, 2)])
    assert json.loads(out["dog"].overlaps) == {"person": 0.1, "frisbee": 0.0}


def test_single_class_image_and_empty_region():
    only = rows([(1, 0, 0, 2, 2), (1, 5, 5, 2, 2)])
    assert list(only) == ["person"] and only["person"].reason == "single_class_image"
    assert math.isnan(only["person"].max_overlap) and json.loads(only["person"].overlaps) == {}
    empty = rows([(1, 0, 0, 0.2, 0.2), (2, 5, 5, 2, 2)])
    assert empty["person"].reason == "empty_region"
    assert json.loads(empty["dog"].overlaps) == {"person": 0.0} and empty["dog"].mode == "single"


# ------------------------------------------------------------------ text versus pseudo-code
def test_rule_any_versus_all():
    # the person covers the dog fully (> alpha2) and half the frisbee (between alpha1 and alpha2)
    boxes = [(1, 0, 0, 5, 5), (2, 1, 1, 2, 2), (3, 3, 0, 4, 2)]
    pseudo = rows(boxes)["person"]
    assert json.loads(pseudo.overlaps) == {"dog": 1.0, "frisbee": 0.5}
    assert (pseudo.selected, pseudo.mode, list(pseudo.removed_categories)) == (True, "multi", ["person", "dog"])
    text = rows(boxes, rule="text")["person"]
    assert (text.selected, text.reason) == (False, "overlap")


def test_rule_area_before_versus_after_union():
    # person 60 px; the dog (60 px) lies 50/60 inside it; removing both erases 70 px = 0.7 of the image
    boxes = [(1, 0, 0, 6, 10), (2, 1, 0, 6, 10)]
    pseudo = rows(boxes, alpha3=0.65)["person"]     # the listing tests the person's 0.6 alone
    assert pseudo.candidate_area_ratio == pytest.approx(0.6) and pseudo.removed_area_ratio == pytest.approx(0.7)
    assert (pseudo.selected, pseudo.mode) == (True, "multi")
    text = rows(boxes, rule="text", alpha3=0.65)["person"]
    assert (text.selected, text.reason) == (False, "area")
    assert rows(boxes, rule="text", alpha3=0.75)["person"].mode == "multi"


# ------------------------------------------------------------------ settings
def test_settings_defaults_and_section():
    assert rg.settings(None) == rg.defaults()
    assert rg.defaults()["alpha1"] == 0.4 and rg.defaults()["alpha2"] == 0.8 and rg.defaults()["alpha3"] == 0.7
    got = rg.settings({"spurious_retrieval": {"selection": {"alpha3": 0.5, "rule": "text", "classes": ["dog"]}}})
    assert got["alpha3"] == 0.5 and got["rule"] == "text" and got["classes"] == ["dog"] and got["alpha1"] == 0.4


@pytest.mark.parametrize("section, words", [
    ({"alpha1": 1.5}, "alpha1"), ({"alpha2": 0}, "alpha2"), ({"alpha3": "high"}, "alpha3"),
    ({"alpha1": 0.9, "alpha2": 0.8}, "above alpha2"), ({"rule": "paper"}, "rule"), ({"colour": 1}, "colour"),
    ({"classes": "dog"}, "classes"), ({"classes": ["dog", "dog"]}, r"selection\.classes: .*non-unique"),
    ({"mask_mode": "polygon"}, "mask_mode"),
])
def test_settings_errors(section, words):
    with pytest.raises(ConfigError, match=words):
        rg.settings({"spurious_retrieval": {"selection": section}})


def test_classes_restrict_objects_and_unknown_names_fail():
    boxes = [(1, 0, 0, 5, 5), (2, 1, 1, 2, 2), (3, 8, 8, 2, 2)]
    out = rows(boxes, classes=["person", "frisbee"])
    assert set(out) == {"person", "frisbee"} and out["person"].mode == "single"
    with pytest.raises(ConfigError, match="'cat' is not a class"):
        rows(boxes, classes=["person", "cat"])


# ------------------------------------------------------------------ bad input
def coco_doc(annotations, images=None):
    return {
        "info": {}, "licenses": [],
        "images": images or [{"id": 7, "width": 10, "height": 10, "file_name": "000000000007.jpg"},
                             {"id": 3, "width": 20, "height": 10, "file_name": "000000000003.jpg"}],
        "annotations": [{"id": 10 + i, "image_id": im, "category_id": c, "bbox": bbox, "area": bbox[2] * bbox[3],
                         "iscrowd": 0, "segmentation": []} for i, (im, c, bbox) in enumerate(annotations)],
        "categories": [{"id": i, "name": n, "supercategory": "thing"} for i, n in NAMES.items()],
    }


ANNOTATIONS = [(7, 1, [0, 0, 4, 10]), (7, 2, [1, 1, 2, 2]), (7, 3, [8, 0, 2, 2]), (3, 4, [0, 0, 15, 10]),
               (3, 3, [16, 0, 4, 4]), (3, 1, [10, 0, 10, 10])]


def write(tmp_path, doc, name="instances.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_box_outside_image_names_file_and_record(tmp_path):
    path = write(tmp_path, coco_doc(ANNOTATIONS[:1] + [(7, 2, [6, 0, 9, 2])]))
    with pytest.raises(InputError) as err:
        rg.coco_objects(path)
    msg = str(err.value)
    assert str(path) in msg and "annotations[1] (id 11)" in msg and "outside" in msg and "Fix:" in msg


def test_box_outside_image_in_frames_names_record():
    images, objects = frames([(1, 0, 0, 4, 10), (2, 8, 0, 3, 2)])
    objects["source"], objects["record"] = "boxes.json", ["annotations[0] (id 1)", "annotations[1] (id 2)"]
    with pytest.raises(InputError, match=r"boxes\.json, record annotations\[1\] \(id 2\): box .* outside .*Fix:"):
        rg.select_regions(images, objects)


def test_zero_size_image_names_file_and_record(tmp_path):
    images = [{"id": 7, "width": 10, "height": 10, "file_name": "a.jpg"},
              {"id": 8, "width": 0, "height": 10, "file_name": "b.jpg"}]
    path = write(tmp_path, coco_doc(ANNOTATIONS[:2], images))
    with pytest.raises(InputError) as err:
        rg.coco_objects(path)
    assert str(path) in str(err.value) and "images[1] (id 8)" in str(err.value) and "0 x 10" in str(err.value)


# ------------------------------------------------------------------ CLI
def test_cli_round_trip(tmp_path, capsys):
    path = write(tmp_path, coco_doc(ANNOTATIONS))
    out = tmp_path / "sel" / "selection.parquet"
    assert cli.main(["spurious", "select", "--instances", str(path), "--out", str(out)]) == 0
    table = pd.read_parquet(out)
    assert list(table.columns) == rg.COLUMNS
    assert list(zip(table["image_id"], table["category_id"])) == [(3, 1), (3, 3), (3, 4), (7, 1), (7, 2), (7, 3)]
    images, objects, _ = rg.coco_objects(path)
    expected = rg.select_regions(images, objects)
    pd.testing.assert_frame_equal(table.drop(columns=["removed_category_ids", "removed_categories"]),
                                  expected.drop(columns=["removed_category_ids", "removed_categories"]),
                                  check_dtype=False)
    assert [list(v) for v in table["removed_category_ids"]] == list(expected["removed_category_ids"])
    assert set(table["image_width"][table["image_id"] == 3]) == {20}
    printed = capsys.readouterr().out
    n = int(table["selected"].sum())
    assert f"{n} of 6 candidates of 2 images selected" in printed and str(out) in printed
    # the car (15x10 of a 20x10 image = 0.75) is skipped for its area
    car = table[(table["image_id"] == 3) & (table["category_id"] == 4)].iloc[0]
    assert (bool(car["selected"]), car["reason"], car["candidate_area_ratio"]) == (False, "area", 0.75)


def test_cli_options_and_config(tmp_path, capsys):
    path = write(tmp_path, coco_doc(ANNOTATIONS))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("spurious_retrieval:\n  selection:\n    alpha3: 0.8\n    classes: [car, frisbee]\n")
    out = tmp_path / "o.parquet"
    assert cli.main(["spurious", "select", "--instances", str(path), "--out", str(out), "--config", str(cfg)]) == 0
    table = pd.read_parquet(out)
    assert set(table["category"]) == {"car", "frisbee"}
    assert table.set_index(["image_id", "category"]).loc[(3, "car"), "selected"]       # 0.75 <= 0.8
    assert cli.main(["spurious", "select", "--instances", str(path), "--out", str(out), "--config", str(cfg),
                     "--alpha3", "0.7", "--rule", "text"]) == 0
    assert not pd.read_parquet(out).set_index(["image_id", "category"]).loc[(3, "car"), "selected"]
    capsys.readouterr()
    assert cli.main(["spurious", "select", "--instances", str(path), "--out", str(out), "--classes", "cat"]) == 2
    assert "'cat' is not a class" in capsys.readouterr().err
    bad = write(tmp_path, coco_doc([(7, 2, [6, 0, 9, 2])]), "bad.json")
    assert cli.main(["spurious", "select", "--instances", str(bad), "--out", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "annotations[0] (id 10)" in err and not (tmp_path / "x.parquet").exists()


def flickr_root(tmp_path):
    root = tmp_path / "f30k"
    (root / "Sentences").mkdir(parents=True)
    (root / "Annotations").mkdir()
    (root / "Sentences" / "1001.txt").write_text(
        "[/EN#1/people A man] walks [/EN#2/animals a dog] past [/EN#3/vehicles a car] in [/EN#4/clothing a hat] .\n")
    objects = [("1", (1, 1, 40, 100)), ("2", (11, 11, 20, 20)), ("3", (61, 1, 100, 30)), ("4", (1, 1, 40, 20))]
    xml = "".join(f"<object><name>{n}</name><bndbox><xmin>{a}</xmin><ymin>{b}</ymin><xmax>{c}</xmax><ymax>{d}</ymax>"
                  "</bndbox></object>" for n, (a, b, c, d) in objects)
    (root / "Annotations" / "1001.xml").write_text(
        f"<annotation><size><width>100</width><height>100</height><depth>3</depth></size>{xml}</annotation>")
    return root


def test_flickr_entities(tmp_path):
    root = flickr_root(tmp_path)
    images, objects, known = rg.flickr_objects(root)
    assert known == list(rg.FLICKR_CLASSES) and set(objects["category"]) == {"people", "animals", "vehicles"}
    person = objects[objects["category"] == "people"].iloc[0]
    assert (person["x"], person["y"], person["w"], person["h"]) == (0.0, 0.0, 40.0, 100.0)
    out = tmp_path / "f.parquet"
    assert cli.main(["spurious", "select", "--entities-root", str(root), "--out", str(out)]) == 0
    table = pd.read_parquet(out)
    assert list(table["category"]) == ["people", "animals", "vehicles"] and set(table["image_id"]) == {"1001"}
    got = table.set_index("category")
    assert got.loc["people", "mode"] == "multi" and list(got.loc["people", "removed_categories"]) == ["people",
                                                                                                       "animals"]
    assert got.loc["animals", "mode"] == "single" and got.loc["vehicles", "mode"] == "single"
    with pytest.raises(ConfigError, match="unknown Flickr30k Entities type"):
        rg.flickr_objects(root, ["people", "cats"])


# ------------------------------------------------------------------ property test against a set-based reference
def reference(boxes):
    """Per class: the set of covered pixels (integer boxes), computed without NumPy masks."""
    pixels = {}
    for c, x, y, w, h in boxes:
        pixels.setdefault(c, set()).update((i, j) for i in range(y, y + h) for j in range(x, x + w))
    return pixels


def check_row(row, pixels, total, params):
    """The row's numbers match the reference and its decision follows the rule it was made under."""
    a1, a2, a3 = params["alpha1"], params["alpha2"], params["alpha3"]
    mine = pixels[row.category_id]
    others = {c: len(mine & p) / len(p) for c, p in pixels.items() if c != row.category_id}
    assert json.loads(row.overlaps) == pytest.approx({NAMES[c]: v for c, v in others.items()})
    plus = sorted(c for c, v in others.items() if v > a2)
    assert list(row.removed_category_ids) == [row.category_id] + plus
    removed = set().union(mine, *(pixels[c] for c in plus))
    assert row.removed_area_ratio == pytest.approx(len(removed) / total)
    assert row.candidate_area_ratio == pytest.approx(len(mine) / total)
    values = list(others.values())
    area = row.candidate_area_ratio if params["rule"] == "pseudocode" else row.removed_area_ratio
    area_ok = area <= a3 if params["rule"] == "pseudocode" else area < a3
    if not values:
        assert row.reason == "single_class_image" and not row.selected
    elif row.mode == "single":
        assert row.selected and row.reason == "" and all(v < a1 for v in values) and area_ok
        assert list(row.removed_category_ids) == [row.category_id]
    elif row.mode == "multi":
        assert row.selected and row.reason == "" and plus and not all(v < a1 for v in values) and area_ok
        if params["rule"] == "text":
            assert all(v < a1 or v > a2 for v in values)
    elif row.reason == "area":
        assert not area_ok
    else:
        assert row.reason == "overlap" and not all(v < a1 for v in values)
        assert not plus or (params["rule"] == "text" and any(a1 <= v <= a2 for v in values))


@pytest.mark.parametrize("rule", ["pseudocode", "text"])
def test_property_random_boxes(rule):
    rng = np.random.default_rng(13)
    params = dict(rg.defaults(), rule=rule)
    image_rows, object_rows, truth = [], [], {}
    for image_id in range(50):
        width, height = int(rng.integers(4, 17)), int(rng.integers(4, 17))
        boxes = []
        for c in rng.choice(list(NAMES), size=int(rng.integers(1, 5)), replace=False):
            for _ in range(int(rng.integers(1, 4))):
                w, h = int(rng.integers(1, width + 1)), int(rng.integers(1, height + 1))
                x, y = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
                boxes.append((int(c), x, y, w, h))
        image_rows.append({"image_id": image_id, "width": width, "height": height})
        object_rows += [{"image_id": image_id, "category_id": c, "category": NAMES[c], "x": x, "y": y, "w": w,
                         "h": h} for c, x, y, w, h in boxes]
        truth[image_id] = (reference(boxes), width * height)
    images, objects = pd.DataFrame(image_rows[::-1]), pd.DataFrame(object_rows[::-1])   # input order irrelevant
    table = rg.select_regions(images, objects, params)
    expected = sorted({(o["image_id"], o["category_id"]) for o in object_rows})
    assert list(zip(table["image_id"], table["category_id"])) == expected       # one row per candidate, sorted
    for row in table.itertuples(index=False):
        pixels, total = truth[row.image_id]
        check_row(row, pixels, total, params)
    assert table["selected"].any() and (~table["selected"]).any()
    assert set(table["reason"]) <= {"", "area", "overlap", "single_class_image"}


def test_summary_counts():
    table = rg.select_regions(*frames([(1, 0, 0, 4, 10), (2, 1, 1, 2, 2), (3, 8, 0, 2, 2)]))
    counts = rg.summary(table)
    assert counts == {"candidates": 3, "images": 1, "selected": 3, "single": 2, "multi": 1, "skipped": {}}
    assert "3 of 3 candidates of 1 images selected (single 2, multi 1); skipped: none" == rg.format_summary(counts)


# ------------------------------------------------------------------ segmentation masks (mask_mode: segmentation)
from counterfactory.data.coco import segmentation_mask  # noqa: E402


@pytest.mark.parametrize("box", [(0, 0, 10, 10), (2, 3, 5, 4), (7, 1, 3, 9), (0, 9, 10, 1)])
def test_polygon_of_an_integer_box_is_the_box_mask(box):
    x, y, w, h = box
    polygon = [[x, y, x + w, y, x + w, y + h, x, y + h]]
    np.testing.assert_array_equal(segmentation_mask(polygon, 10, 10), rg.union_mask([box], 10, 10))


def test_polygon_triangle_and_union_of_parts_by_hand():
    # a right triangle with legs of 6 px: the pixels whose centre (c + 0.5, r + 0.5) lies inside, c + r < 5
    tri = segmentation_mask([[0, 0, 6, 0, 0, 6]], 8, 8)
    rows_, cols_ = np.indices((8, 8))
    np.testing.assert_array_equal(tri, rows_ + cols_ < 5)
    assert tri.sum() == 5 + 4 + 3 + 2 + 1
    # two polygons of one annotation are one mask (their union)
    two = segmentation_mask([[0, 0, 2, 0, 2, 2, 0, 2], [5, 5, 8, 5, 8, 8, 5, 8]], 8, 8)
    assert two.sum() == 4 + 9 and two[1, 1] and two[7, 7] and not two[3, 3]


def test_uncompressed_and_compressed_rle_by_hand():
    # 3 x 4 (h x w), column-major runs starting with background: 1 off, 2 on, 5 off, 4 on
    rle = {"size": [3, 4], "counts": [1, 2, 5, 4]}
    expected = np.zeros((3, 4), dtype=bool)
    flat = expected.reshape(-1, order="F")
    flat[1:3] = True
    flat[8:12] = True
    expected = flat.reshape(3, 4, order="F")
    got = segmentation_mask(rle, 3, 4)
    np.testing.assert_array_equal(got, expected)
    # column 0: rows 1-2; column 1: none; column 2: row 2; column 3: every row
    assert got[1:, 0].all() and not got[:, 1].any() and got[2, 2] and got[:, 3].all() and got.sum() == 6
    from pycocotools import mask as mask_utils

    compressed = mask_utils.encode(np.asfortranarray(expected.astype(np.uint8)))
    np.testing.assert_array_equal(segmentation_mask({"size": [3, 4], "counts": compressed["counts"].decode()}, 3, 4),
                                  expected)


@pytest.mark.parametrize("segmentation, words", [
    ({"size": [4, 4], "counts": [16]}, "4x4 .* but its image is 10x10"),   # a mask of the wrong size
    ({"size": [10, 10], "counts": [3, 4]}, "sum to 7"),
    ([[0, 0, 5, 0]], "at least three"),
    ([[0, 0, 15, 0, 15, 5]], "outside"),
    ("person", "list of polygons or an RLE"),
])
def test_bad_segmentations_raise(segmentation, words):
    with pytest.raises(ValueError, match=words):
        segmentation_mask(segmentation, 10, 10)


def seg_doc():
    """One 10 x 20 (h x w) image: an L-shaped person whose bounding box covers a dog that its mask does not touch,
    and a frisbee inside the L."""
    doc = coco_doc([(7, 1, [0, 0, 10, 10]), (7, 2, [6, 0, 4, 4]), (7, 3, [0, 8, 2, 2])],
                   images=[{"id": 7, "width": 20, "height": 10, "file_name": "000000000007.jpg"}])
    person, dog, frisbee = doc["annotations"]
    person["segmentation"] = [[0, 0, 5, 0, 5, 5, 10, 5, 10, 10, 0, 10]]         # L: the top-right quarter is empty
    # rows 0-3 of columns 6-9 as an uncompressed RLE (column-major: 60 off, then 4 on / 6 off per column)
    dog["segmentation"] = {"size": [10, 20], "counts": [60, 4, 6, 4, 6, 4, 6, 4, 106]}
    frisbee["segmentation"] = [[0, 8, 2, 8, 2, 10, 0, 10]]
    return doc


def test_segmentation_mode_uses_masks_not_boxes(tmp_path):
    images, objects, _ = rg.coco_objects(write(tmp_path, seg_doc()))
    boxes = {r.category: r for r in rg.select_regions(images, objects).itertuples(index=False)}
    masks = {r.category: r for r in rg.select_regions(images, objects, dict(rg.defaults(), mask_mode="segmentation"))
             .itertuples(index=False)}
    # boxes: the person's box (half the image) covers the dog and the frisbee, so all three go
    assert json.loads(boxes["person"].overlaps) == {"dog": 1.0, "frisbee": 1.0}
    assert (boxes["person"].mode, list(boxes["person"].removed_categories)) == ("multi", ["person", "dog", "frisbee"])
    assert boxes["person"].removed_area_ratio == pytest.approx(0.5)
    # masks: the L (75 px) contains the frisbee but not the dog, which stays in the image
    assert json.loads(masks["person"].overlaps) == {"dog": 0.0, "frisbee": 1.0}
    assert (masks["person"].mode, list(masks["person"].removed_categories)) == ("multi", ["person", "frisbee"])
    assert masks["person"].candidate_area_ratio == pytest.approx(75 / 200)
    assert json.loads(masks["frisbee"].overlaps) == {"person": pytest.approx(4 / 75), "dog": 0.0}
    assert (masks["dog"].mode, masks["dog"].candidate_area_ratio) == ("single", pytest.approx(16 / 200))


def test_segmentation_requests_erase_the_mask_pixels(tmp_path):
    """The inpainting step rasterises a request's segmentation: zero filling blackens exactly the L's pixels."""
    from PIL import Image

    from counterfactory.generation.inpaint import inpaint_shard

    doc = seg_doc()
    image = np.full((10, 20, 3), 200, dtype=np.uint8)
    Image.fromarray(image).save(tmp_path / "im.png")
    spec = {"size": [10, 20], "objects": [doc["annotations"][0]["segmentation"], doc["annotations"][2]["segmentation"]]}
    items = pd.DataFrame({"item_id": ["coco_7_1"], "image_path": [str(tmp_path / "im.png")],
                          "boxes": [[[0, 0, 10, 10]]], "segmentation": [json.dumps(spec)]})
    inpaint_shard(items, "zero", tmp_path / "out", progress=False)
    out = np.asarray(Image.open(tmp_path / "out" / "coco_7_1.png"))
    erased = (out == 0).all(axis=2)
    expected = segmentation_mask(spec["objects"][0], 10, 20) | segmentation_mask(spec["objects"][1], 10, 20)
    np.testing.assert_array_equal(erased, expected)
    assert erased.sum() == 75 and not erased[0, 7]                  # not the box: the dog's pixels are kept
    spec["size"] = [10, 10]
    items["segmentation"] = json.dumps(spec)
    items["item_id"] = "coco_7_9"
    with pytest.raises(InputError, match=r"coco_7_9.*mask is 10x10 \(HxW\) but its image is 10x20"):
        inpaint_shard(items, "zero", tmp_path / "out", progress=False)


def test_segmentation_mode_errors_name_the_record(tmp_path):
    doc = seg_doc()
    doc["annotations"][1]["segmentation"] = {"size": [4, 4], "counts": [16]}
    images, objects, _ = rg.coco_objects(write(tmp_path, doc))
    with pytest.raises(InputError) as err:
        rg.select_regions(images, objects, dict(rg.defaults(), mask_mode="segmentation"))
    assert "annotations[1] (id 11)" in str(err.value) and "4x4" in str(err.value) and "Fix:" in str(err.value)
    doc["annotations"][1]["segmentation"] = []
    images, objects, _ = rg.coco_objects(write(tmp_path, doc, "b.json"))
    with pytest.raises(InputError, match=r"annotations\[1\] \(id 11\).*no segmentation"):
        rg.select_regions(images, objects, dict(rg.defaults(), mask_mode="segmentation"))
    rg.select_regions(images, objects)                               # box mode does not need the masks
    with pytest.raises(ConfigError, match="boxes only"):
        rg.select_regions(*frames([(1, 0, 0, 4, 10), (2, 5, 5, 2, 2)]), dict(rg.defaults(), mask_mode="segmentation"))


def test_cli_select_with_segmentation_masks(tmp_path, capsys):
    path = write(tmp_path, seg_doc())
    out = tmp_path / "seg.parquet"
    assert cli.main(["spurious", "select", "--instances", str(path), "--out", str(out), "--mask-mode",
                     "segmentation"]) == 0
    table = pd.read_parquet(out).set_index("category")
    assert table.loc["dog", "selected"] and table.loc["person", "candidate_area_ratio"] == pytest.approx(0.375)
    assert list(table.loc["person", "removed_categories"]) == ["person", "frisbee"]
