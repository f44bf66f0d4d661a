"""CounterCurate data: the Flickr30k Entities reader, Flickr30k-Positions (§3.2) and Flickr30k-Counting (§3.3)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from counterfactory.cli import main
from counterfactory.data import flickr30k_entities as f30k
from counterfactory.errors import InputError
from counterfactory.studies.countercurate import counting as C
from counterfactory.studies.countercurate import positions as P

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "flickr30k_entities"
#: the demo's Flickr30k images, where the catalogue puts them (flickr30k/flickr30k-images)
IMAGES = DEMO.parent / "flickr30k" / f30k.IMAGES


@pytest.fixture(scope="module")
def demo_images():
    return list(f30k.iter_images(DEMO))


def _copy_demo(tmp_path: Path) -> Path:
    root = tmp_path / "f30k"
    shutil.copytree(DEMO / f30k.SENTENCES, root / f30k.SENTENCES)
    shutil.copytree(DEMO / f30k.ANNOTATIONS, root / f30k.ANNOTATIONS)
    return root


# --- reader ---------------------------------------------------------------------------------------------------------

def test_reader_on_fixture(demo_images):
    ids = [im.image_id for im in demo_images]
    assert len(ids) == 8 and ids == sorted(ids)
    cats = {im.image_id: im for im in demo_images}["1000000003"]
    assert (cats.width, cats.height) == (224, 149)
    # one <object> with two <name>s: its box belongs to both chains (the official parser keeps only the first)
    assert cats.entities["1"].boxes == ((10, 30, 100, 140),)  # XML 11,31,101,141 minus 1
    assert cats.entities["4"].boxes == ((10, 30, 100, 140), (100, 40, 200, 140))
    assert cats.entities["3"].nobox and not cats.entities["3"].boxes
    assert cats.entities["4"].types == ("animals",)
    first = cats.phrases[0]
    assert (first.sentence_index, first.text, first.entity_id, first.types, first.first_word_index) == \
        (0, "A cat", "1", ("animals",), 0)
    assert cats.phrases[1].first_word_index == 3 and cats.sentences[0].startswith("A cat and a kitten rest")
    astro = demo_images[0]
    assert astro.entities["3"].scene and not astro.entities["3"].nobox
    assert any(p.entity_id == "0" and p.types == ("notvisual",) for p in astro.phrases)
    assert "0" not in astro.entities
    ent = f30k.entities_frame(demo_images)
    assert {"image_id", "entity_id", "types", "n_boxes", "boxes"} <= set(ent.columns)
    assert len(f30k.phrases_frame(demo_images)) == sum(len(im.phrases) for im in demo_images)


def test_images_match_fixture_sizes(demo_images):
    for im in demo_images:
        with Image.open(IMAGES / f"{im.image_id}.jpg") as pic:
            assert pic.size == (im.width, im.height)


def test_box_outside_image_is_an_error(tmp_path):
    root = _copy_demo(tmp_path)
    xml = root / f30k.ANNOTATIONS / "1000000001.xml"
    xml.write_text(xml.read_text().replace("<xmax>216</xmax>", "<xmax>225</xmax>"))
    with pytest.raises(InputError) as err:
        f30k.read_image(root, "1000000001")
    msg = str(err.value)
    assert "1000000001.xml" in msg and "<object> #2 (name 2)" in msg and "outside" in msg and "Fix:" in msg
    clipped = f30k.read_image(root, "1000000001", strict=False)
    assert clipped.entities["2"].boxes == ((150, 10, 223, 90),)


def test_unknown_entity_and_bad_markup_are_errors(tmp_path):
    root = _copy_demo(tmp_path)
    txt = root / f30k.SENTENCES / "1000000002.txt"
    txt.write_text(txt.read_text() + "[/EN#9/people A stranger] waves .\n")
    with pytest.raises(InputError) as err:
        f30k.read_image(root, "1000000002")
    msg = str(err.value)
    assert "1000000002.txt" in msg and "sentence 3" in msg and "/EN#9" in msg and "<name>9</name>" in msg
    lenient = f30k.read_image(root, "1000000002", strict=False)
    assert lenient.entities["9"].boxes == () and lenient.entities["9"].types == ("people",)
    txt.write_text("[/EN#1/people A man rides [/EN#2/other a bike] .\n")
    with pytest.raises(InputError, match=r"1000000002.txt, record line 1: unbalanced"):
        f30k.read_image(root, "1000000002")
    txt.write_text("[/EN#x/people A man] rides .\n")
    with pytest.raises(InputError, match="not a number"):
        f30k.read_image(root, "1000000002")


# --- positions (§3.2) -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("box_a, box_b, expected", [
    ((0, 0, 10, 10), (20, 0, 30, 10), ["left"]),
    ((20, 0, 30, 10), (0, 0, 10, 10), ["right"]),
    ((0, 0, 10, 10), (0, 20, 10, 30), ["above"]),
    ((0, 20, 10, 30), (0, 0, 10, 10), ["below"]),
    ((0, 0, 10, 10), (10, 0, 20, 10), ["left"]),          # touching edge: the paper's x_a2 <= x_b1
    ((0, 0, 11, 10), (10, 0, 20, 10), []),                # overlap by two columns: no relation
    ((0, 0, 10, 10), (5, 5, 15, 15), []),                 # overlap: the pair is skipped
    ((0, 0, 10, 10), (20, 20, 30, 30), ["left", "above"]),  # diagonal: one LR and one AB item
    ((5, 0, 5, 10), (5, 20, 5, 30), ["above"]),           # 1-px columns on one x: both x cases hold -> none
])
def test_position_rule(box_a, box_b, expected):
    assert P.position_relations(box_a, box_b) == expected


def test_position_rule_strict_touching():
    assert P.position_relations((0, 0, 10, 10), (10, 0, 20, 10), touching=False) == []
    assert P.position_relations((0, 0, 10, 10), (11, 0, 20, 10), touching=False) == ["left"]


def test_flip_swaps_only_the_relation_words():
    a, b = "a man on the left side of the road", "a car to the right"
    assert P.position_caption(a, "left", b) == "a man on the left side of the road is to the left of a car to the right"
    assert P.negative_caption(a, "left", b) == \
        "a man on the left side of the road is to the right of a car to the right"
    assert P.negative_caption("a table", "above", "a towel") == "a table is below a towel"
    assert P.negative_caption("a bike", "right", "a woman") == "a bike is to the left of a woman"


def test_one_box_entities_only_and_pair_filters(demo_images):
    by_id = {im.image_id: im for im in demo_images}
    coins = P.object_pairs(by_id["1000000004"])  # every chain has several boxes
    assert coins == []
    rocket = P.object_pairs(by_id["1000000006"])
    pairs = {(r["entity_a"], r["entity_b"]) for r in rocket}
    assert ("1", "4") not in pairs  # "The rocket" / "another rocket": same name
    assert all("5" not in p for p in pairs)  # "Someone"
    assert ("2", "3") not in pairs  # overlapping boxes
    cats = P.object_pairs(by_id["1000000003"])
    assert [(r["relation"], r["caption"]) for r in cats] == [("left", "a cat is to the left of a kitten")]


def test_swap_centres_keeps_sizes_and_clips():
    a, b = (10, 10, 30, 20), (60, 70, 100, 90)  # a above b, inside a 200 x 200 image
    new_a, new_b = P.swap_centres(a, b, 200, 200)
    assert new_a == [70.0, 75.0, 90.0, 85.0] and new_b == [0.0, 5.0, 40.0, 25.0]
    assert (new_a[2] - new_a[0], new_a[3] - new_a[1]) == (a[2] - a[0], a[3] - a[1])
    assert (new_b[2] - new_b[0], new_b[3] - new_b[1]) == (b[2] - b[0], b[3] - b[1])
    assert P.position_relations(a, b) == ["left", "above"]
    assert P.position_relations(new_a, new_b) == ["right", "below"]  # both centre coordinates are swapped
    # a tall box moved to a centre near the bottom is clipped, not shifted; the relation still flips
    tall, small = (50, 0, 70, 99), (50, 150, 70, 190)
    t2, s2 = P.swap_centres(tall, small, 100, 200)
    assert t2 == [50.0, 120.5, 70.0, 199.0] and s2 == [50.0, 29.5, 70.0, 69.5]
    assert P.position_relations(t2, s2) == ["below"]
    assert P.normalise_box([0, 0, 99, 199], 100, 200) == [0.0, 0.0, 1.0, 1.0]


def test_split_by_image_is_reproducible():
    ids = [str(i) for i in range(100)]
    s1, s2 = P.split_images(ids, 0.8, 3), P.split_images(list(reversed(ids)), 0.8, 3)
    assert s1 == s2 and sum(v == "train" for v in s1.values()) == 80
    assert P.split_images(ids, 0.8, 4) != s1


def test_build_positions_fixture(demo_images):
    frame = P.build_positions(demo_images, {"positions": {"random_state": 0}})
    assert (P.subset(frame, "LR")["relation"].isin(["left", "right"])).all()
    assert len(P.subset(frame, "LR")) == 6 and len(P.subset(frame, "AB")) == 7 and len(P.subset(frame, "both")) == 13
    assert frame.groupby("image_id")["split"].nunique().max() == 1
    assert set(frame["split"]) == {"train", "test"}
    llm = P.llm_requests(frame)
    gen = P.generation_requests(frame)
    assert len(llm) == len(gen) == 7 and (llm["task"] == "positions_rewrite").all()
    fields = json.loads(llm.set_index("item_id").loc["1000000008_4_5_ab", "fields"])
    assert fields == {"statement": "a clock is below a long bench", "subject": "a clock", "relation": "below",
                      "object": "a long bench", "max_chars": 200,   # the llm task's own request (app. B)
                      "require_relation_word": True}                 # (its meaning check's setting)
    assert (gen["kind"] == "generate").all()
    row = gen.set_index("item_id").loc["1000000008_4_5_ab"]
    assert row["phrases"] == ["a clock", "a long bench"] and row["prompt"] == "a clock is below a long bench"
    assert all(0.0 <= v <= 1.0 for box in row["boxes"] for v in box)
    done = P.apply_rewrites(gen, {"1000000008_4_5_ab": "a long bench rests high above a clock on the wall"})
    got = done.set_index("item_id")
    assert got.loc["1000000008_4_5_ab", "prompt_source"] == "llm"
    assert got.loc["1000000002_1_2_ab", "prompt_source"] == "template"
    results = pd.DataFrame({"item_id": ["1000000002_1_2_ab", "1000000008_4_5_ab"],
                            "answer": ['{"rewrite": "the grass lies high above a photographer"}', "{}"],
                            "valid": [True, False]})
    got = P.apply_rewrites(gen, results).set_index("item_id")
    assert got.loc["1000000002_1_2_ab", "prompt"] == "the grass lies high above a photographer"
    assert got.loc["1000000008_4_5_ab", "prompt_source"] == "template"


def test_write_flipped_images(tmp_path):
    out = P.write_flipped_images(["1000000001", "1000000001", "1000000003"], IMAGES, tmp_path / "flip")
    assert sorted(out) == ["1000000001", "1000000003"]
    with Image.open(IMAGES / "1000000001.jpg") as src, Image.open(out["1000000001"]) as dst:
        src = src.convert("RGB")
        assert dst.size == src.size
        assert dst.getpixel((0, 5)) == src.getpixel((src.width - 1, 5))


# --- counting (§3.3) ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("singular, plural", [
    ("person", "people"), ("man", "men"), ("child", "children"), ("woman", "women"), ("fireman", "firemen"),
    ("dog", "dogs"), ("bus", "buses"), ("dress", "dresses"), ("baby", "babies"), ("toy", "toys"), ("box", "boxes"),
    ("knife", "knives"), ("sheep", "sheep"), ("young man", "young men"), ("human", "humans"), ("coach", "coaches"),
])
def test_pluralizer(singular, plural):
    assert C.plural_noun(singular) == plural
    assert C.singular_noun(plural) == singular


def test_count_caption_grammar():
    assert C.count_caption(3, "cat", 4, "dog") == "there are three cats and four dogs"
    assert C.count_caption(1, "child", 2, "man") == "there is one child and two men"
    assert C.count_caption(2, "person", 1, "horse") == "there are two people and one horse"
    assert C.count_caption(9, "cup", 10, "box") == "there are nine cups and ten boxes"
    assert C.number_word(11) == "11"


def test_category_names():
    assert C.category_name("Two young men") == "young man"
    assert C.category_name("a group of people") == "person"
    assert C.category_name("Cups of coffee") == "cup"
    assert C.category_name("three dogs") == "dog"
    assert C.category_name("others") == "" and C.category_name("a crowd") == ""


def test_count_change_rules():
    p = [(0, 0, 10, 10), (20, 0, 30, 10)]
    q = [(0, 20, 10, 30), (20, 20, 30, 30), (40, 20, 50, 30)]
    add = C.count_change(p, q, random.Random(0))
    assert (add["overlap"], add["edit"], add["new_n_p"], add["new_n_q"]) == (False, "add", 3, 2)
    assert tuple(add["mask_boxes"][0]) in q
    # touching boxes do not overlap
    assert C.count_change([(0, 0, 10, 10), (0, 20, 10, 30)], [(10, 0, 20, 10), (10, 20, 20, 30)])["edit"] == "add"
    # the first Q box overlapping P is removed with the P box it covers
    q2 = [(5, 5, 15, 15), (40, 20, 50, 30), (60, 20, 70, 30)]
    rem = C.count_change(p, q2)
    assert (rem["overlap"], rem["edit"], rem["new_n_p"], rem["new_n_q"]) == (True, "remove", 1, 2)
    assert rem["mask_boxes"] == [[5, 5, 15, 15], [0, 0, 10, 10]] and rem["mask_of"] == ["Q", "P"]
    # a removal that would leave no object of a category is not made
    assert C.count_change([(0, 0, 50, 50), (0, 0, 50, 50)], [(10, 10, 20, 20), (30, 30, 40, 40)]) is None


def test_build_counting_fixture(demo_images):
    frame = C.build_counting(demo_images)
    assert len(frame) == 4 and frame["overlap"].sum() == 2
    row = frame.set_index("image_id").loc["1000000008"]
    assert (row["category_p"], row["n_p"], row["category_q"], row["n_q"]) == ("child", 2, "man", 3)
    assert row["caption"] == "there are two children and three men"
    assert row["negative_caption"] == "there is one child and two men"
    coins = frame.set_index("image_id").loc["1000000004"]
    assert coins["negative_caption"] == "there are four gold coins and three silver coins"
    assert "hand" not in set(frame["category_p"]) | set(frame["category_q"])  # bodyparts excluded
    req = C.inpaint_requests(frame).set_index("image_id")
    assert (req["kind"] == "inpaint").all()
    assert req.loc["1000000005", "purpose"] == "counting_remove" and req.loc["1000000005", "phrases"] == ["plant"] * 2
    assert req.loc["1000000004", "purpose"] == "counting_add" and req.loc["1000000004", "phrases"] == ["gold coin"]
    custom = C.build_counting(demo_images, {"counting": {"generic_category": "bush"}})
    assert "bush" in custom.set_index("image_id").loc["1000000005", "mask_phrases"]


# --- CLI ------------------------------------------------------------------------------------------------------------

def test_cli_writes_documented_columns(tmp_path, capsys):
    out = tmp_path / "positions.parquet"
    rc = main(["countercurate", "positions", "--entities-root", str(DEMO), "--images", str(IMAGES), "--out", str(out),
               "--out-requests", str(tmp_path / "req"), "--flipped-dir", str(tmp_path / "flip")])
    assert rc == 0
    frame = pd.read_parquet(out)
    assert {"image_id", "phrase_a", "phrase_b", "box_a", "box_b", "relation", "caption", "negative_caption",
            "split"} <= set(frame.columns)
    assert len(frame) == 13 and list(frame["box_a"].iloc[0]) == [20, 30, 120, 223]
    lr = frame[frame["subset"] == "LR"]
    assert lr["negative_image"].map(lambda p: Path(p).is_file()).all()
    assert frame.loc[frame["subset"] == "AB", "negative_image"].isna().all()
    gen = pd.read_parquet(tmp_path / "req" / P.GENERATION_FILE)
    made = pd.DataFrame({"item_id": gen["item_id"], "image_path": [f"/gen/{i}.png" for i in gen["item_id"]]})
    both = P.attach_negative_images(frame, made)
    assert both["negative_image"].notna().all()
    assert both.set_index("item_id").loc["1000000008_4_5_ab", "negative_image"] == "/gen/1000000008_4_5_ab.png"
    assert {"item_id", "image_id", "prompt", "phrases", "boxes", "kind"} <= set(gen.columns)
    assert (pd.read_parquet(tmp_path / "req" / P.LLM_FILE)["task"] == "positions_rewrite").all()

    out = tmp_path / "counting.parquet"
    rc = main(["countercurate", "counting", "--entities-root", str(DEMO), "--out", str(out),
               "--out-requests", str(tmp_path / "req")])
    assert rc == 0
    frame = pd.read_parquet(out)
    assert {"image_id", "category_p", "n_p", "category_q", "n_q", "overlap", "caption",
            "negative_caption"} <= set(frame.columns)
    assert len(pd.read_parquet(tmp_path / "req" / C.REQUESTS_FILE)) == len(frame) == 4


def test_cli_reports_bad_input(tmp_path, capsys):
    root = _copy_demo(tmp_path)
    xml = root / f30k.ANNOTATIONS / "1000000005.xml"
    xml.write_text(xml.read_text().replace("<width>224</width>", "<width>100</width>"))
    rc = main(["countercurate", "counting", "--entities-root", str(root), "--out", str(tmp_path / "c.parquet")])
    assert rc == 2
    assert "1000000005.xml" in capsys.readouterr().err
