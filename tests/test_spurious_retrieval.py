"""The spurious-correlation retrieval study (Kim et al. 2023, "Exposing and Mitigating Spurious Correlations for
Cross-Modal Retrieval"): settings (§4.1), data and removal requests (§3.1), synthetic captions (§3.2-3.3), training
manifests (§4.1, Table 3, Figure 4), ODmAP@k (§3.2), runs and Tables 1-3 / Figure 4, and ``spurious select --dataset``.
Region selection itself is tested in tests/test_odmap_regions.py. No model is trained or loaded here."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random

import numpy as np
import pandas as pd
import pytest

from counterfactory import cli
from counterfactory.config import ConfigView, fill_section, load_config
from counterfactory.errors import ConfigError
from counterfactory.studies.spurious_retrieval import captions as cp
from counterfactory.studies.spurious_retrieval import data as dt
from counterfactory.studies.spurious_retrieval import evaluation as ev
from counterfactory.studies.spurious_retrieval import manifests as mf
from counterfactory.studies.spurious_retrieval import regions as rg
from counterfactory.studies.spurious_retrieval import runs as rn
from counterfactory.studies.spurious_retrieval import settings as st

STUDY = "spurious_retrieval"


@pytest.fixture(scope="module")
def demo_view(repo):
    """The demo configuration's study view (its data paths are relative to the repository root)."""
    return load_config([repo / "config" / "demo.yaml"], study=STUDY)


@pytest.fixture(scope="module")
def paper_view(repo):
    return load_config([repo / "config" / "config.yaml"], study=STUDY)


# ===================================================================================================== settings
def test_defaults_follow_section_4_1():
    s = st.settings(None)
    clip, blip = s["training"]["clip"], s["training"]["blip"]
    assert (clip["lr"], clip["batch_size"], clip["epochs"]) == (2e-6, 256, 10)
    assert (clip["lr_scheduler"], clip["lr_step_epochs"], clip["lr_step_gamma"]) == ("step", 2.0, 0.5)
    assert (blip["lr"], blip["batch_size"], blip["epochs"]) == (1e-5, 16, 2)
    assert (blip["lr_scheduler"], blip["lr_step_epochs"], blip["lr_step_gamma"]) == ("step", 0.5, 0.5)
    assert clip["weight_decay"] == 0.0                               # "Adam" = AdamW without weight decay
    vse = s["training"]["vsepp"]                                     # VSE++: as CLIP, at lr 1e-4
    assert (vse["lr"], vse["batch_size"], vse["epochs"], vse["optimizer"], vse["weight_decay"]) == \
        (1e-4, 256, 10, "adamw_torch", 0.0)
    assert (vse["lr_scheduler"], vse["lr_step_epochs"], vse["lr_step_gamma"]) == ("step", 2.0, 0.5)
    assert s["training"]["models"] == {"clip_train": "clip", "itm_blip": "blip", "vsepp": "vsepp"}
    assert st.training_section(s, "vsepp", 512)["max_grad_norm"] == 0.0   # §4.1 is silent: common's
    assert s["data"]["datasets"] == ["coco", "flickr30k"]
    assert s["data"]["splits"]["train"] == ["train", "restval"]       # 113,287 training images
    assert s["evaluation"]["ks"] == [1, 5, 10]
    assert s["captions"]["per_image"] == 1
    assert s["mixtures"]["variants"]["ours"] == {"text": "np_removal", "image": "lama"}
    # a full configuration and a study view give the same settings; a merge does not touch the defaults
    over = {"training": {"clip": {"lr": 1e-4}}}
    assert st.settings({STUDY: over}) == st.settings(over)
    assert st.settings(over)["training"]["clip"]["lr"] == 1e-4
    assert st.settings(over)["training"]["clip"]["batch_size"] == 256
    # training.seeds merges key by key like the recipes (a config giving only the count keeps first and offset)
    assert st.seed_pairs(st.settings({"training": {"seeds": {"count": 2}}})) == [(0, 1), (1, 2)]
    assert st.seed_pairs(st.settings({"training": {"seeds": {"first": 5, "data_seed_offset": 10}}})) == \
        [(5, 15), (6, 16), (7, 17)]
    assert fill_section(f"{STUDY}.training")["clip"]["lr"] == 2e-6       # the schema holds the defaults


@pytest.mark.parametrize("own, where", [
    ({"mixtures": {"bogus": 1}}, "spurious_retrieval.mixtures: unknown key(s) bogus"),
    ({"inpaint": {"methodz": ["lama"]}}, "spurious_retrieval.inpaint.methodz"),
    ({"training": {"clip": {"bogus": 1}}}, "spurious_retrieval.training.clip: unknown key(s) bogus"),
    ({"training": {"seeds": {"cout": 5}}}, "spurious_retrieval.training.seeds: unknown key(s) cout"),
    ({"data": {"coco": {"karpathy": "x"}}}, "spurious_retrieval.data.coco: unknown key(s) karpathy"),
    ({"data": {"splits": {"dev": ["val"]}}}, "spurious_retrieval.data.splits: unknown key(s) dev"),
    ({"captions": {"captioner": {"beams": 2}}}, "spurious_retrieval.captions.captioner: unknown key(s) beams"),
    ({"mixtures": {"ratios": [0.0]}}, "spurious_retrieval.mixtures.ratios.0: 0.0 is less than or equal to"),
    ({"mixtures": {"ratios": [1.5]}}, "spurious_retrieval.mixtures.ratios.0: 1.5 is greater than"),
    ({"mixtures": {"ratios": [True]}}, "spurious_retrieval.mixtures.ratios.0: True is not of type 'number'"),
    ({"data": {"datasets": ["imagenet"]}}, "spurious_retrieval.data.datasets.0: 'imagenet' is not one of"),
    ({"mixtures": {"ratio_datasets": ["coco", "vg"]}}, "spurious_retrieval.mixtures.ratio_datasets.1: 'vg'"),
    ({"inpaint": {"methods": ["lama", "zero"]}},                 # np_blur / np_mean of Table 3 need blur / mean
     "spurious_retrieval.mixtures.variants.np_blur.image: 'blur' is not in inpaint.methods"),
    ({"inpaint": {"methods": ["zero"]}}, "spurious_retrieval.mixtures.variants.ours.image: 'lama'"),
    ({"mixtures": {"table3": ["np_nothing"]}}, "spurious_retrieval.mixtures.table3: 'np_nothing' is not a variant"),
    ({"mixtures": {"variants": {"np_zero": {"text": "np_removal", "image": "zero"}}, "table3": []}},
     "no 'ours' variant"),
    ({"training": {"models": {"clip_train": "vse"}}}, "training.models.clip_train: 'vse' is not one of"),
    ({"mixtures": {"ratio_models": ["vse"]}}, "mixtures.ratio_models: vse not in training.models"),
    ({"inpaint": {"shards": 0}}, "inpaint.shards: 0 is less than the minimum of 1"),
    ({"evaluation": {"ks": [0, 5]}}, "spurious_retrieval.evaluation.ks"),
])
def test_bad_settings_raise_config_error_naming_the_key(own, where):
    with pytest.raises(ConfigError) as err:
        st.settings(own)
    assert where in str(err.value) and "Fix:" in str(err.value)


def test_mean_padding_fills_the_removed_region_with_its_own_mean():
    # §4.4: mean padding fills B^r with the average pixel values of B^r (the image's other pixels are ignored)
    from counterfactory.generation.inpaint import fill

    image = np.zeros((4, 4, 3), dtype=np.uint8)
    image[:2, :2] = [200, 100, 50]                     # the removed object
    mask = np.zeros((4, 4), dtype=bool)
    mask[:2, :3] = True                                # B^r: the object and two black pixels
    out = fill(image, mask, "mean", settings=st.inpaint_settings(st.settings({})))
    assert out[mask].tolist() == [[133, 67, 33]] * 6     # round(200 * 4 / 6), round(100 * 4 / 6), round(50 * 4 / 6)
    assert (out[~mask] == 0).all()
    ours = st.inpaint_settings(st.settings({"inpaint": {"mean_of": "unmasked"}}))
    assert (fill(image, mask, "mean", settings=ours)[mask] == 0).all()   # mean of the 10 black pixels left


def test_a_variant_no_run_uses_may_name_an_image_method_left_out_of_inpaint():
    # the demo's choice: Table 3 only with np_zero; np_blur (blur) and np_mean (mean) are defined but never trained
    s = st.settings({"inpaint": {"methods": ["lama", "zero"]}, "mixtures": {"table3": ["np_zero"]}})
    assert st.needed_variants(s) == ["ours", "np_zero"]
    assert st.image_methods(s) == ["lama", "zero"]
    assert st.text_methods(s) == ["np_removal"]


def test_partial_view_refuses_a_section_its_job_was_not_given():
    view = ConfigView({"study": STUDY, "data": {"datasets": ["coco"]}, "training": {"seeds": {"count": 2}}},
                      partial=True, source="job.yaml")
    s = st.settings(view)
    assert s["data"]["datasets"] == ["coco"] and st.seed_pairs(s) == [(0, 1), (1, 2)]
    assert "mixtures" not in s and "inpaint" not in s
    for section in ("mixtures", "inpaint", "captions", "evaluation"):
        with pytest.raises(ConfigError, match=rf"config section spurious_retrieval\.{section}\b"):
            s[section]
    with pytest.raises(ConfigError, match=r"spurious_retrieval\.mixtures"):
        st.mixtures(s, "coco", "clip_train")
    with pytest.raises(KeyError):                    # an unknown name is an ordinary KeyError, not a config error
        s["no_such_section"]
    # the full (non-partial) view fills every section from the defaults
    full = st.settings(ConfigView({"study": STUDY, "data": {"datasets": ["coco"]}}))
    assert full["mixtures"]["ratios"] == [0.05, 0.1, 0.2, 0.3, 0.4]


def test_mixtures_list_table3_and_ratios_only_where_configured():
    s = st.settings(None)
    ratios = ["ratio_0.05", "ratio_0.1", "ratio_0.2", "ratio_0.3", "ratio_0.4"]
    table3 = ["np_blur", "np_zero", "np_mean", "captioner", "prompts"]
    assert st.mixtures(s, "coco", "clip_train") == ["finetune", "ours", *table3, *ratios, "d_s", "d_prime"]
    assert st.mixtures(s, "flickr30k", "clip_train") == ["finetune", "ours"]
    assert st.mixtures(s, "coco", "itm_blip") == ["finetune", "ours"]
    s = st.settings({"mixtures": {"table3": ["np_zero"], "table3_models": ["itm_blip"], "ratios": [0.25],
                                  "ratio_models": ["clip_train"], "ratio_datasets": ["flickr30k"]}})
    assert st.mixtures(s, "coco", "itm_blip") == ["finetune", "ours", "np_zero"]
    assert st.mixtures(s, "coco", "clip_train") == ["finetune", "ours", "d_s", "d_prime"]
    assert st.mixtures(s, "flickr30k", "clip_train") == ["finetune", "ours", "ratio_0.25"]
    assert st.mixtures(s, "flickr30k", "itm_blip") == ["finetune", "ours"]
    assert st.ratio_name(0.1) == "ratio_0.1" and st.ratio_name(1) == "ratio_1"
    assert st.ratio_of("ratio_0.05") == 0.05 and st.ratio_of("ours") is None


def test_training_section_resolves_epoch_evaluation_and_keeps_the_step_decay():
    from counterfactory.training import TrainSettings

    s = st.settings(None)
    clip = st.training_section(s, "clip_train", 1000)
    assert clip["eval_every"] == math.ceil(1000 / 256) == 4
    assert (clip["lr"], clip["batch_size"], clip["epochs"], clip["eval_batch_size"]) == (2e-6, 256, 10, 256)
    assert (clip["lr_scheduler"], clip["lr_step_epochs"], clip["lr_step_gamma"]) == ("step", 2.0, 0.5)
    assert clip["experiment"] == "clip_train" and clip["eval"] == {}
    blip = st.training_section(s, "itm_blip", 1000)
    assert blip["eval_every"] == 63 and blip["lr_step_epochs"] == 0.5 and blip["weight_decay"] == 0.05
    assert st.training_section(s, "clip_train", 256)["eval_every"] == 1
    assert st.training_section(s, "clip_train", 257)["eval_every"] == 2
    assert st.training_section(s, "clip_train", 0)["eval_every"] == 1
    # the section is what the trainer reads
    ts = TrainSettings.from_section(blip, seed=0, data_seed=1)
    assert (ts.lr, ts.lr_scheduler, ts.lr_step_epochs, ts.eval_every) == (1e-5, "step", 0.5, 63)
    fixed = st.settings({"training": {"common": {"eval_every": 7}}})
    assert st.training_section(fixed, "clip_train", 10_000)["eval_every"] == 7
    with pytest.raises(ConfigError, match="eval_every"):
        st.training_section(st.settings({"training": {"common": {"eval_every": 0}}}), "clip_train", 10)


# ========================================================================================================= data
def test_pixel_boxes_cover_exactly_the_union_mask_pixels():
    from counterfactory.generation.inpaint import boxes_to_mask

    rng = np.random.default_rng(0)
    for _ in range(300):
        width, height = int(rng.integers(1, 24)), int(rng.integers(1, 24))
        n = int(rng.integers(1, 5))
        x, y = rng.uniform(-2, width + 1, n), rng.uniform(-2, height + 1, n)
        w, h = rng.uniform(0, width, n), rng.uniform(0, height, n)
        # edges on and next to pixel centres and borders, and thin or empty boxes, occur often
        x = np.where(rng.random(n) < 0.3, np.round(x * 2) / 2, x)
        y = np.where(rng.random(n) < 0.3, np.round(y), y)
        w = np.where(rng.random(n) < 0.2, rng.choice([0.0, 0.3, 0.5, 1.0, 2.5], n), w)
        objects = pd.DataFrame({"x": x, "y": y, "w": w, "h": h})
        boxes = dt.pixel_boxes(objects, width, height)
        expected = rg.union_mask(objects[["x", "y", "w", "h"]].to_numpy(), height, width)
        assert np.array_equal(boxes_to_mask(boxes, height, width), expected), (objects, boxes)
        for x1, y1, x2, y2 in boxes:
            assert all(isinstance(v, int) for v in (x1, y1, x2, y2))
            assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height


def test_pixel_boxes_pixel_centre_rule_by_hand():
    objects = pd.DataFrame({"x": [0.4, 3.6, 9.0], "y": [0.5, 0.0, 0.0], "w": [1.2, 0.8, 5.0], "h": [2.0, 0.4, 5.0]})
    # box 1: columns whose centre j+0.5 lies in [0.4, 1.6) -> 0, 1; rows [0.5, 2.5) -> 0, 1
    # box 2: [3.6, 4.4) holds centre 3.5? no, 4.5? no -> no column: dropped; box 3 is off the 8x8 image
    assert dt.pixel_boxes(objects, 8, 8) == [[0, 0, 2, 2]]


def test_shard_of_is_stable_and_in_range():
    ids = [f"coco_{i}_{i % 7}" for i in range(2000)]
    shards = [dt.shard_of(i, 16) for i in ids]
    assert all(0 <= s < 16 for s in shards)
    assert set(shards) == set(range(16))                              # every shard gets items
    assert shards == [dt.shard_of(i, 16) for i in reversed(ids)][::-1]   # no dependence on order
    # sha1, not Python's salted hash(): the same in every process
    assert dt.shard_of("coco_101_1", 64) == int(hashlib.sha1(b"coco_101_1").hexdigest()[:16], 16) % 64
    assert dt.shard_of("coco_101_1", 1) == 0


@pytest.fixture(scope="module")
def demo_selection(repo, demo_view):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(repo)
        s = st.settings(demo_view)
        return s, *dt.select(s, rg.settings(None), "coco")


def test_select_on_the_demo(repo, demo_selection):
    s, table, requests = demo_selection
    counts = rg.summary(table)
    assert (counts["candidates"], counts["selected"], counts["single"], counts["multi"]) == (13, 8, 7, 1)
    assert counts["skipped"] == {"area": 2, "overlap": 2, "single_class_image": 1}
    assert list(requests.columns) == dt.REQUEST_COLUMNS
    selected = table[table["selected"]]
    assert len(requests) == len(selected) == 8
    assert list(zip(requests["image_id"], requests["category"])) == list(zip(selected["image_id"],
                                                                             selected["category"]))
    assert requests["item_id"].is_unique
    assert all(i == f"coco_{im}_{c}" for i, im, c in zip(requests["item_id"], requests["image_id"],
                                                         selected["category_id"]))
    for r in requests.itertuples(index=False):
        assert r.category in r.removed_categories
        assert not set(r.present_categories) & set(r.removed_categories)
        assert r.boxes and all(0 <= x1 < x2 and 0 <= y1 < y2 for x1, y1, x2, y2 in r.boxes)
        assert r.shard == 0                                           # demo: inpaint.shards 1
        assert r.image_path.startswith("resources/demo/")
    multi = requests[requests["mode"] == "multi"].iloc[0]
    assert (multi["category"], multi["removed_categories"], multi["present_categories"]) == \
        ("person", ["person", "backpack"], [])
    assert len(multi["boxes"]) == 2
    # splits are the Karpathy file's (the demo re-split), on the table and on the requests
    karpathy = json.loads((repo / "resources/demo/coco2014/dataset_coco.json").read_text())
    split_of = {im["cocoid"]: im["split"] for im in karpathy["images"]}
    assert sorted(collections_count(split_of.values()).items()) == [("test", 3), ("train", 7), ("val", 2)]
    assert all(split_of[i] == sp for i, sp in zip(table["image_id"], table["split"]))
    assert all(split_of[i] == sp for i, sp in zip(requests["image_id"], requests["split"]))
    assert set(requests["split"]) == {"train", "test"}


def collections_count(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def test_demo_request_boxes_are_the_pixels_of_the_removed_objects(repo, demo_selection):
    from counterfactory.generation.inpaint import boxes_to_mask

    s, table, requests = demo_selection
    images, objects, _ = rg.coco_objects(repo / "resources/demo/coco2014/annotations/instances_val2014.json")
    size = images.set_index("image_id")
    for r in requests.itertuples(index=False):
        w, h = int(size.at[r.image_id, "width"]), int(size.at[r.image_id, "height"])
        objs = objects[(objects["image_id"] == r.image_id) & objects["category"].isin(r.removed_categories)]
        mask = rg.union_mask(objs[["x", "y", "w", "h"]].to_numpy(), h, w)
        assert np.array_equal(boxes_to_mask(r.boxes, h, w), mask)
        assert r.removed_area_ratio == pytest.approx(mask.mean())


def test_load_captions_maps_karpathy_splits(repo, demo_view, monkeypatch):
    monkeypatch.chdir(repo)
    caps = dt.load_captions(st.settings(demo_view), "coco")
    assert list(caps.columns) == dt.CAPTION_COLUMNS
    per_split = caps.drop_duplicates("image_id")["split"].value_counts().to_dict()
    assert per_split == {"train": 7, "val": 2, "test": 3}
    assert (caps.groupby("image_id")["caption_index"].apply(lambda s: list(s) == list(range(len(s))))).all()
    # restval is not part of the demo split file; map val into train and it trains
    s = st.settings({**{k: v for k, v in demo_view.items()}, "data": {
        **demo_view["data"], "splits": {"train": ["train", "val"], "val": [], "test": ["test"]}}})
    moved = dt.load_captions(s, "coco").drop_duplicates("image_id")["split"].value_counts().to_dict()
    assert moved == {"train": 9, "test": 3}


# ===================================================================================================== captions
def caption_frame(rows) -> pd.DataFrame:
    """``[(image_id, split, caption), ...]`` -> a captions table (caption_index per image)."""
    frame = pd.DataFrame(rows, columns=["image_id", "split", "caption"])
    frame["caption_index"] = frame.groupby("image_id").cumcount()
    frame["image_path"] = [f"img/{i}.jpg" for i in frame["image_id"]]
    return frame[dt.CAPTION_COLUMNS]


def request_frame(rows) -> pd.DataFrame:
    """``[(item_id, image_id, split, removed, present), ...]`` -> removal requests."""
    return pd.DataFrame([{"item_id": i, "dataset": "coco", "image_id": im, "split": sp, "image_path": f"img/{im}.jpg",
                          "category": rem[0], "mode": "single" if len(rem) == 1 else "multi",
                          "removed_categories": rem, "present_categories": pre, "boxes": [[0, 0, 1, 1]],
                          "removed_area_ratio": 0.1, "shard": 0} for i, im, sp, rem, pre in rows],
                        columns=dt.REQUEST_COLUMNS)


CAPTIONS = caption_frame([
    (1, "train", "A man riding a horse on a beach."),
    (1, "train", "A horse in a field."),
    (1, "train", "A man."),
    (2, "test", "Two dogs play with a frisbee."),
    (2, "test", "A man and a woman walk a dog."),
])
REQUESTS = request_frame([
    ("coco_1_1", 1, "train", ["person"], ["horse"]),
    ("coco_2_18", 2, "test", ["dog"], ["person", "frisbee"]),
    ("coco_2_1", 2, "test", ["person", "dog"], []),
])
CLASSES = ["dog", "frisbee", "horse", "person"]


def _np_rows(syn, item):
    part = syn[(syn["method"] == "np_removal") & (syn["item_id"] == item)]
    return {int(k): (c, bool(m)) for k, c, m in zip(part["caption_index"], part["caption"], part["matched"])}


def test_np_removal_drops_the_removed_phrases(nltk_dir):
    from counterfactory.data.nltk_data import ensure_nltk_data

    ensure_nltk_data(nltk_dir)
    syn = cp.synthetic(st.settings(None), "coco", REQUESTS, CAPTIONS, ("np_removal",), CLASSES)
    assert list(syn.columns) == cp.SYNTHETIC_COLUMNS and set(syn["method"]) == {"np_removal"}
    # "A man." loses every word: dropped; "A horse in a field." names no person: kept unchanged, unmatched
    assert _np_rows(syn, "coco_1_1") == {0: ("Riding a horse on a beach.", True), 1: ("A horse in a field.", False)}
    dog = _np_rows(syn, "coco_2_18")
    assert dog[0][1] and "dog" not in dog[0][0].lower() and "frisbee" in dog[0][0]
    assert dog[1][1] and "dog" not in dog[1][0] and "man" in dog[1][0]
    both = _np_rows(syn, "coco_2_1")
    assert all(m for _, m in both.values()) and not any("man" in c or "dog" in c for c, _ in both.values())
    assert set(syn["split"][syn["item_id"] == "coco_2_18"]) == {"test"}
    strict = cp.synthetic(st.settings({"captions": {"keep_unmatched": False}}), "coco", REQUESTS, CAPTIONS,
                          ("np_removal",), CLASSES)
    assert _np_rows(strict, "coco_1_1") == {0: ("Riding a horse on a beach.", True)}
    assert strict["matched"].all()


def test_prompt_captions_are_drawn_per_item_and_name_the_present_classes():
    pool = cp.templates("openai_imagenet")
    assert len(pool) == 80 and all("{objects}" in t for t in pool)
    s = st.settings(None)
    many = request_frame([(f"coco_{i}_1", i, "train", ["person"], ["dog", "horse"] if i % 2 else ["cat"])
                          for i in range(40)])
    caps = caption_frame([(i, "train", "x") for i in range(40)])
    syn = cp.synthetic(s, "coco", many, caps, ("prompt",), ["cat", "dog", "horse", "person"])
    shuffled = many.sample(frac=1.0, random_state=3)
    again = cp.synthetic(s, "coco", shuffled, caps, ("prompt",), ["cat", "dog", "horse", "person"])
    assert len(syn) == 40 and set(syn["caption_index"]) == {0} and syn["matched"].all()
    assert dict(zip(syn["item_id"], syn["caption"])) == dict(zip(again["item_id"], again["caption"]))
    used = set()
    for r, text in zip(many.itertuples(index=False), syn["caption"]):
        objects = " and ".join(r.present_categories)          # the paper's bare "person and dog"
        rng = random.Random(cp.item_seed(r.item_id))
        chosen = rng.choice(pool)
        expected = chosen.replace("{objects}", objects)
        assert text == expected[:1].upper() + expected[1:]
        assert "person" not in text
        used.add(chosen)
    assert len(used) > 10                                    # templates vary over items
    # an item with no class left gets no prompt caption
    assert cp.synthetic(s, "coco", REQUESTS, CAPTIONS, ("prompt",), CLASSES)["item_id"].tolist() == \
        ["coco_1_1", "coco_2_18"]
    assert cp.item_seed("a") == cp.item_seed("a") != cp.item_seed("a", salt=1)
    with pytest.raises(ConfigError, match="prompt_templates"):
        cp.templates("not_a_pool")
    assert cp.templates(["a {objects}"]) == ["a {objects}"]


def test_gallery_mentions(nltk_dir):
    from counterfactory.data.nltk_data import ensure_nltk_data

    ensure_nltk_data(nltk_dir)
    caps = caption_frame([(1, "train", "Two dogs play with a frisbee."), (1, "train", "A man and a woman walk."),
                          (2, "val", "A horse in a field."), (3, "test", "An empty room."),
                          (3, "test", "People sitting around a table with a dog.")])
    gal = cp.gallery(st.settings(None), "coco", caps, CLASSES)
    assert list(gal.columns) == cp.GALLERY_COLUMNS
    assert [list(m) for m in gal["mentions"]] == [["dog", "frisbee"], ["person"], ["horse"], [], ["dog", "person"]]
    assert gal["split"].tolist() == ["train", "train", "val", "test", "test"]
    assert gal["caption"].tolist() == caps["caption"].tolist()


def test_word_matching_follows_appendix_a_with_longest_match_as_an_option(nltk_dir):
    # appendix A: a phrase matches a class when it contains one of the class's words, so "a wine glass" is also a
    # cup ("glass") and "hot dogs" also dogs; longest_match (ours) keeps only the longer entries
    from counterfactory.data.nltk_data import ensure_nltk_data

    ensure_nltk_data(nltk_dir)
    caps = caption_frame([(1, "train", "A wine glass on a table."), (2, "train", "A boy eating hot dogs.")])
    classes = ["cup", "dining table", "dog", "hot dog", "person", "wine glass"]
    paper = cp.gallery(st.settings(None), "coco", caps, classes)
    assert [list(m) for m in paper["mentions"]] == [["cup", "dining table", "wine glass"],
                                                     ["dog", "hot dog", "person"]]
    ours = cp.gallery(st.settings({"captions": {"word_matching": "longest_match"}}), "coco", caps, classes)
    assert [list(m) for m in ours["mentions"]] == [["dining table", "wine glass"], ["hot dog", "person"]]
    # noun-phrase removal uses the same rule: removing dog also removes "hot dogs" under the paper's rule
    req = request_frame([("coco_2_16", 2, "train", ["dog"], ["person"])])
    syn = cp.synthetic(st.settings(None), "coco", req, caps, ("np_removal",), classes)
    assert syn["caption"].tolist() == ["A boy eating."] and syn["matched"].tolist() == [True]
    syn = cp.synthetic(st.settings({"captions": {"word_matching": "longest_match"}}), "coco", req, caps,
                       ("np_removal",), classes)
    assert syn["caption"].tolist() == ["A boy eating hot dogs."] and syn["matched"].tolist() == [False]


# ==================================================================================================== manifests
MANIFEST_SETTINGS = {"data": {"datasets": ["coco"]}, "inpaint": {"methods": ["lama", "zero"]},
                     "mixtures": {"table3": ["np_zero"], "ratios": [0.25, 0.9], "appendix_b_models": []}}


def manifest_inputs():
    """D: 2 train images x 5 captions = 10 rows; val: 1 image x 2 captions; test: 1 image."""
    caps = caption_frame([(im, sp, f"caption {k} of {im}") for im, sp, n in
                          ((10, "train", 5), (11, "train", 5), (20, "val", 2), (30, "test", 2))
                          for k in range(n)])
    req = request_frame([("coco_10_1", 10, "train", ["person"], ["dog"]),
                         ("coco_10_18", 10, "train", ["dog"], ["person"]),
                         ("coco_11_1", 11, "train", ["person"], ["horse"]),      # no inpainted file
                         ("coco_30_1", 30, "test", ["person"], ["dog"]),
                         ("coco_30_18", 30, "test", ["dog"], ["person"])])    # no lama file
    syn = pd.DataFrame([(item, im, sp, "np_removal", k, f"np {item} {k}", True)
                        for item, im, sp, ks in (("coco_10_1", 10, "train", (0, 1, 2)),
                                                 ("coco_10_18", 10, "train", (1, 4)),
                                                 ("coco_11_1", 11, "train", (0, 1)),
                                                 ("coco_30_1", 30, "test", (0, 1)))
                        for k in ks]
                       + [("coco_10_1", 10, "train", "prompt", 0, "A photo of dog.", True)],
                       columns=cp.SYNTHETIC_COLUMNS)
    files = {"lama": {"coco_10_1": "lama/coco_10_1.png", "coco_10_18": "lama/coco_10_18.png",
                      "coco_30_1": "lama/coco_30_1.png"},
             "zero": {"coco_10_1": "zero/coco_10_1.png", "coco_30_1": "zero/coco_30_1.png",
                      "coco_30_18": "zero/coco_30_18.png"}}
    return caps, req, syn, files


def items_reordered(syn: pd.DataFrame) -> pd.DataFrame:
    """The same rows with the items in reverse order, each item's rows kept in their order."""
    order = {item: i for i, item in enumerate(reversed(list(dict.fromkeys(syn["item_id"]))))}
    return syn.sort_values("item_id", key=lambda c: c.map(order), kind="stable")


def test_write_manifests(tmp_path, caplog):
    s = st.settings(MANIFEST_SETTINGS)
    caps, req, syn, files = manifest_inputs()
    with caplog.at_level(logging.WARNING):
        summary = mf.write_manifests(s, "coco", req, caps, syn, files, tmp_path)
    names = ["finetune", "ours", "np_zero", "ratio_0.25", "ratio_0.9"]
    assert sorted(p.stem for p in tmp_path.glob("*.parquet")) == sorted(names + ["queries"])
    assert summary["mixture"].tolist() == names + ["queries"]
    read = {n: pd.read_parquet(tmp_path / f"{n}.parquet") for n in names}
    real_train = caps[caps["split"] == "train"]
    for name, frame in read.items():
        val = frame[frame["split"] == "val"]
        assert len(val) == 2 and not val["is_counterfactual"].any(), name
        assert val["caption"].tolist() == ["caption 0 of 20", "caption 1 of 20"]
        train = frame[frame["split"] == "train"]
        real = train[~train["is_counterfactual"]]
        assert real["caption"].tolist() == real_train["caption"].tolist(), name
        assert (real["source"] == "real").all() and frame["pair_id"].is_unique
    assert not read["finetune"]["is_counterfactual"].any()                       # finetune = D only
    # ours: D + one np_removal caption per train item with a lama file (coco_11_1 has none)
    ours = read["ours"][read["ours"]["is_counterfactual"]]
    assert sorted(ours["item_id"]) == ["coco_10_1", "coco_10_18"]
    assert (ours["split"] == "train").all() and (ours["source"] == "ours").all()
    for item, path, caption in zip(ours["item_id"], ours["image_path"], ours["caption"]):
        assert path == files["lama"][item]
        assert caption in set(syn["caption"][(syn["item_id"] == item) & (syn["method"] == "np_removal")])
    # np_zero: the zero-padded file of the only train item that has one
    zero = read["np_zero"][read["np_zero"]["is_counterfactual"]]
    assert zero["item_id"].tolist() == ["coco_10_1"] and zero["image_path"].tolist() == ["zero/coco_10_1.png"]
    # Figure 4: round(r * |D|) half up from the full D' of ours (5 rows: 3 + 2 captions with a lama file)
    pool = {f"np {i} {k}" for i, ks in (("coco_10_1", (0, 1, 2)), ("coco_10_18", (1, 4))) for k in ks}
    r25 = read["ratio_0.25"][read["ratio_0.25"]["is_counterfactual"]]
    assert len(r25) == 3                                            # 0.25 * 10 = 2.5 -> 3 (not banker's 2)
    assert set(r25["caption"]) <= pool and r25["caption"].is_unique
    r90 = read["ratio_0.9"][read["ratio_0.9"]["is_counterfactual"]]
    assert set(r90["caption"]) == pool                              # 9 wanted, capped at the pool of 5
    assert any("ratio 0.9: 9 synthetic rows wanted, the full D' has 5" in r.getMessage() for r in caplog.records)
    rows = summary.set_index("mixture")
    assert rows.loc["finetune", "synthetic_rows"] == 0 and rows.loc["ours", "synthetic_rows"] == 2
    assert rows.loc["ratio_0.25", "synthetic_rows"] == 3 and rows.loc["ratio_0.25", "ratio"] == pytest.approx(0.3)
    assert (rows.loc[names, "real_rows"] == 10).all() and (rows.loc[names, "val_rows"] == 2).all()
    assert (tmp_path / "summary.csv").is_file()
    # queries: test items with a file of ours' image method, with that file
    q = pd.read_parquet(tmp_path / "queries.parquet")
    assert list(q.columns) == mf.QUERY_COLUMNS
    assert q["item_id"].tolist() == ["coco_30_1"] and q["image_path"].tolist() == ["lama/coco_30_1.png"]
    assert list(q["removed_categories"][0]) == ["person"] and list(q["present_categories"][0]) == ["dog"]
    # the same inputs give the same files, whatever the order of the items (each item's captions in their order)
    again = tmp_path / "again"
    mf.write_manifests(s, "coco", req.sample(frac=1.0, random_state=1), caps, items_reordered(syn), files, again)
    for name in names:
        assert pd.read_parquet(again / f"{name}.parquet").equals(read[name]), name


def test_appendix_b_trains_on_d_s_as_large_as_d_prime_and_on_d_prime_alone(tmp_path):
    # appendix B: CLIP fine-tuned on D_s (a random part of D with |D_s| = |D'|) and on D' alone, beside D + D'
    s = st.settings({**MANIFEST_SETTINGS, "mixtures": {**MANIFEST_SETTINGS["mixtures"],
                                                        "appendix_b_models": ["clip_train"]}})
    assert st.settings(None)["mixtures"]["appendix_b_models"] == ["clip_train"]
    assert st.mixtures(s, "coco", "clip_train")[-2:] == ["d_s", "d_prime"]
    assert "d_s" not in st.mixtures(s, "coco", "itm_blip") and "d_s" not in st.mixtures(s, "flickr30k", "clip_train")
    caps, req, syn, files = manifest_inputs()
    out = mf.write_manifests(s, "coco", req, caps, syn, files, tmp_path).set_index("mixture")
    ours = pd.read_parquet(tmp_path / "ours.parquet")
    d_prime = pd.read_parquet(tmp_path / "d_prime.parquet")
    d_s = pd.read_parquet(tmp_path / "d_s.parquet")
    train = {n: f[f["split"] == "train"] for n, f in (("ours", ours), ("d_prime", d_prime), ("d_s", d_s))}
    assert train["d_prime"].equals(train["ours"][train["ours"]["is_counterfactual"]].reset_index(drop=True))
    assert len(train["d_s"]) == len(train["d_prime"]) == 2 and not train["d_s"]["is_counterfactual"].any()
    assert set(train["d_s"]["caption"]) <= set(caps["caption"][caps["split"] == "train"])
    assert (d_s["split"] == "val").sum() == (d_prime["split"] == "val").sum() == 2    # checkpoint selection
    assert (out.loc["d_s", "real_rows"], out.loc["d_s", "synthetic_rows"]) == (2, 0)
    assert (out.loc["d_prime", "real_rows"], out.loc["d_prime", "synthetic_rows"]) == (0, 2)
    # the appendix's table: zero-shot, D_s, D', D + D' with ODmAP@1 and image->text R@1
    extra = runs_table()
    rows = extra[(extra["experiment"] == "coco_clip_train") & (extra["mixture"] == "ours")]
    extra = pd.concat([extra, rows.assign(mixture="d_s"), rows.assign(mixture="d_prime")], ignore_index=True)
    from counterfactory.stats import summarize

    tables = dict(rn.paper_tables(summarize(extra, "finetune"), s))
    title = next(t for t in tables if t.startswith("Appendix B"))
    assert tables[title].row_labels == ["CLIP (zeroshot)", "CLIP: D_s (|D_s| = |D'|)", "CLIP: D' only", "CLIP + Ours"]
    assert [m for _, m in tables[title].col_keys] == ["ODmAP@1", "TR@1"]
    with pytest.raises(ConfigError, match="reserved"):
        st.settings({"mixtures": {"variants": {"ours": {"text": "np_removal", "image": "lama"},
                                               "d_s": {"text": "prompt", "image": "lama"}}, "table3": []}})


def test_variant_rows_per_image():
    s = st.settings(MANIFEST_SETTINGS)
    _, _, syn, files = manifest_inputs()
    assert len(mf.variant_rows(s, "ours", syn, files, per_image="all")) == 5
    two = mf.variant_rows(s, "ours", syn, files, per_image=2)
    assert two["item_id"].value_counts().to_dict() == {"coco_10_1": 2, "coco_10_18": 2}
    one = mf.variant_rows(s, "ours", syn, files)
    assert one["item_id"].tolist() == ["coco_10_1", "coco_10_18"]
    assert one.equals(mf.variant_rows(s, "ours", items_reordered(syn), files))
    # an item's draw depends on its id only, not on the other items
    alone = mf.variant_rows(s, "ours", syn[syn["item_id"] != "coco_10_1"], files)
    assert alone["caption"].tolist() == one["caption"].tolist()[1:]
    assert mf.variant_rows(s, "prompts", syn, files)["caption"].tolist() == ["A photo of dog."]


def test_inpainted_files(tmp_path):
    from counterfactory.errors import InputError

    shard = tmp_path / "shard_000"
    shard.mkdir()
    pd.DataFrame({"item_id": ["coco_1_1"], "output_path": ["coco_1_1.png"]}).to_parquet(shard / "shard.parquet")
    assert mf.inpainted_files([shard]) == {"coco_1_1": str(shard / "coco_1_1.png")}
    with pytest.raises(InputError, match="inpainting shard manifest not found"):
        mf.inpainted_files([tmp_path / "shard_001"])


# =================================================================================================== evaluation
def test_relevance_by_hand():
    classes = ["person", "dog", "cat"]
    removed = ev.class_matrix([["person"], ["dog", "cat"]], classes)
    present = ev.class_matrix([["dog"], ["person"]], classes)
    mentions = ev.class_matrix([["dog"], ["person", "dog"], [], ["person"]], classes)
    expected = np.array([[True, False, False, False],      # q0: a dog and no person: only caption 0
                         [False, False, False, True]])     # q1: a person and no dog/cat: caption 3
    assert np.array_equal(ev.relevance(removed, present, mentions), expected)
    assert ev.class_matrix([[], ["cat", "cat"]], classes).tolist() == [[False] * 3, [False, False, True]]


def odmap_example():
    classes = ["person", "dog", "cat"]
    removed = ev.class_matrix([["person"], ["dog"], ["cat"]], classes)
    present = ev.class_matrix([["dog"], ["cat"], []], classes)
    mentions = ev.class_matrix([["dog"], ["person", "dog"], ["cat"], ["dog", "cat"], []], classes)
    gallery = np.eye(5, dtype=np.float32)                       # similarity = the query's row
    queries = np.array([[0.1, 0.9, 0.2, 0.5, 0.0],
                        [0.3, 0.1, 0.9, 0.8, 0.0],
                        [0.5, 0.4, 0.3, 0.2, 0.1]], dtype=np.float32)
    return queries, gallery, removed, present, mentions


def test_odmap_by_hand():
    out = ev.odmap(*odmap_example(), ks=[1, 2], normaliser="min_k_relevant")
    # q0: relevant = captions 0 and 3 (R = 2); ranking 1, 3, 2, 0 -> rel 0, 1, 0, 1
    #     AP@1 = (1/1) * 0 = 0;  AP@2 = (1/2) * (P@2 * 1) = (1/2) * (1/2) = 0.25
    # q1: relevant = caption 2 only (3 mentions the removed dog) (R = 1); ranking 2, 3, ... -> rel 1, 0
    #     AP@1 = 1;  AP@2 = (1/1) * (P@1 * 1) = 1
    # q2: nothing left in the image -> R = 0 -> skipped
    assert out == {"ODmAP@1": pytest.approx(100 * (0 + 1) / 2), "ODmAP@2": pytest.approx(100 * (0.25 + 1) / 2),
                   "ODmAP/queries_skipped": 1.0, "ODmAP/normaliser=min_k_relevant": 1.0}
    assert out["ODmAP@2"] == pytest.approx(62.5)
    # k beyond the gallery is cut to the gallery's size (still reported under its own name)
    assert ev.odmap(*odmap_example(), ks=[9], normaliser="min_k_relevant")["ODmAP@9"] == \
        pytest.approx(100 * (0.5 * (1 / 2 + 2 / 4) + 1) / 2)


def test_odmap_default_is_the_cited_library_normaliser_and_is_recorded():
    # §3.2 "mAP@k [52]": AP@k divides by the correct captions inside the top k (q0 at k = 2: one hit at
    # rank 2 -> P@2 / 1 = 0.5, where min(k, R) = 2 gives 0.25); q1 is unchanged; q2 is still skipped
    out = ev.odmap(*odmap_example(), ks=[1, 2])
    assert out == {"ODmAP@1": pytest.approx(50.0), "ODmAP@2": pytest.approx(100 * (0.5 + 1) / 2),
                   "ODmAP/queries_skipped": 1.0, "ODmAP/normaliser=hits_in_top_k": 1.0}
    assert st.settings({})["evaluation"]["odmap_normaliser"] == "hits_in_top_k"


def test_tables_name_the_normaliser_the_results_were_computed_with():
    frame = pd.DataFrame({"metric": ["ODmAP@1", "ODmAP/normaliser=hits_in_top_k"]})
    assert rn.normaliser_note(frame).startswith("ODmAP@k AP@k normaliser: hits_in_top_k")
    assert rn.normaliser_note(frame.iloc[:1]).endswith("not recorded")


def test_odmap_with_no_answerable_query_is_nan_not_an_error():
    q, g, removed, present, mentions = odmap_example()
    out = ev.odmap(q[2:], g, removed[2:], present[2:], mentions, ks=[1, 5])
    assert math.isnan(out["ODmAP@1"]) and math.isnan(out["ODmAP@5"]) and out["ODmAP/queries_skipped"] == 1.0


def test_odmap_chunking_does_not_change_results(monkeypatch):
    rng = np.random.default_rng(1)
    n_q, n_g, n_c = 23, 40, 5
    queries = rng.normal(size=(n_q, 8)).astype(np.float32)
    gallery = rng.normal(size=(n_g, 8)).astype(np.float32)
    removed = rng.random((n_q, n_c)) < 0.3
    present = (rng.random((n_q, n_c)) < 0.4) & ~removed
    present[:3] = False                                        # some queries with nothing left: skipped
    mentions = rng.random((n_g, n_c)) < 0.3
    whole = ev.odmap(queries, gallery, removed, present, mentions, ks=[1, 5, 10], normaliser="min_k_relevant")
    assert whole["ODmAP/queries_skipped"] >= 3
    for chunk in (1, 41, 7 * n_g + 3):
        monkeypatch.setattr(ev, "CHUNK_ELEMENTS", chunk)
        part = ev.odmap(queries, gallery, removed, present, mentions, ks=[1, 5, 10], normaliser="min_k_relevant")
        assert part == pytest.approx(whole), chunk
    # and the value is the metric's own on the full matrices
    from counterfactory.metrics import odmap_at_k

    rel = ev.relevance(removed, present, mentions)
    assert whole["ODmAP@5"] == pytest.approx(odmap_at_k(queries @ gallery.T, rel, 5, normaliser="min_k_relevant"))


# ========================================================================================================= runs
METRICS = ["ODmAP@1", "ODmAP@5", "ODmAP@10", "TR@1", "TR@5", "TR@10", "IR@1", "IR@5", "IR@10"]


def runs_table() -> pd.DataFrame:
    rows = []
    plan = {"coco_clip_train": ["zeroshot", "finetune", "ours", "np_zero", "ratio_0.2"],
            "coco_itm_blip": ["zeroshot", "finetune", "ours"]}
    for e, (experiment, mixtures) in enumerate(plan.items()):
        for m, mixture in enumerate(mixtures):
            for seed in ([0] if mixture == "zeroshot" else [0, 1]):
                for j, metric in enumerate(METRICS):
                    rows.append({"experiment": experiment, "mixture": mixture, "seed": seed, "data_seed": seed + 1,
                                 "metric": metric, "value": 10.0 * e + 5.0 * m + j + 0.5 * seed})
    return pd.DataFrame(rows, columns=rn.RUN_COLUMNS)


@pytest.fixture(scope="module")
def summary():
    from counterfactory.stats import summarize

    return summarize(runs_table(), "finetune")


def test_paper_tables(summary, demo_view):
    s = st.settings(demo_view)
    tables = dict(rn.paper_tables(summary, s))
    t1, t2, t3 = (tables[next(t for t in tables if t.startswith(f"Table {i}"))] for i in (1, 2, 3))
    assert len(tables) == 3
    assert t1.row_labels == ["CLIP (zeroshot)", "CLIP (finetune)", "CLIP + Ours",
                             "BLIP (zeroshot)", "BLIP (finetune)", "BLIP + Ours"]
    assert t1.col_keys == [("MS-COCO", "ODmAP@1"), ("MS-COCO", "ODmAP@5"), ("MS-COCO", "ODmAP@10")]
    assert t2.row_labels == t1.row_labels
    assert [m for _, m in t2.col_keys] == ["TR@1", "TR@5", "TR@10", "IR@1", "IR@5", "IR@10"]
    # cells: CLIP + Ours ODmAP@1 = mean(10*0 + 5*2 + 0 + {0, 0.5}); BLIP (zeroshot) TR@5 = 10 + 0 + 4
    assert t1.cells[("clip_train:ours", ("MS-COCO", "ODmAP@1"))].mean == pytest.approx(10.25)
    assert t1.cells[("clip_train:ours", ("MS-COCO", "ODmAP@1"))].n == 2
    assert t2.cells[("itm_blip:zeroshot", ("MS-COCO", "TR@5"))].mean == pytest.approx(14.0)
    assert t3.row_labels == ["CLIP (finetune)", "CLIP: D + D' (NP removal, zero pad.)", "CLIP + Ours"]  # issue 43.8
    assert [m for _, m in t3.col_keys] == ["ODmAP@1", "ODmAP@5", "ODmAP@10"]
    assert t3.cells[("clip_train:np_zero", ("MS-COCO", "ODmAP@10"))].mean == pytest.approx(15 + 2 + 0.25)


def test_vsepp_rows_carry_the_papers_labels():
    # Tables 1-2 list VSE++ as "VSE++" (trained on D; it has no zero-shot row) and "VSE++ + Ours"
    from counterfactory.stats import summarize

    s = st.settings({"data": {"datasets": ["coco"]}, "training": {"models": {"vsepp": "vsepp", "clip_train": "clip"}},
                     "mixtures": {"table3_models": [], "ratio_models": [], "appendix_b_models": []}})
    rows = [{"experiment": f"coco_{role}", "mixture": m, "seed": seed, "data_seed": seed + 1, "metric": "ODmAP@1",
             "value": float(seed)} for role in ("vsepp", "clip_train") for m in ("finetune", "ours") for seed in (0, 1)]
    tables = dict(rn.paper_tables(summarize(pd.DataFrame(rows, columns=rn.RUN_COLUMNS), "finetune"), s))
    t1 = next(v for k, v in tables.items() if k.startswith("Table 1"))
    assert t1.row_labels == ["VSE++", "VSE++ + Ours", "CLIP (finetune)", "CLIP + Ours"]
    assert rn.MODEL_LABELS["vsepp"] == "VSE++"


def test_ratio_points(summary, demo_view):
    points = rn.ratio_points(summary, st.settings(demo_view))
    assert set(points["metric"]) == {"TR@1", "ODmAP@1"}
    got = {(r.metric, r.ratio): (r.mean, r.n) for r in points.itertuples(index=False)}
    assert got == {("ODmAP@1", 0.0): (5.25, 2), ("ODmAP@1", 0.2): (20.25, 2),
                   ("TR@1", 0.0): (8.25, 2), ("TR@1", 0.2): (23.25, 2)}
    assert (points["dataset"] == "coco").all() and (points["role"] == "clip_train").all()
    assert points[points["metric"] == "ODmAP@1"]["ratio"].tolist() == [0.0, 0.2]


def test_write_tables(tmp_path, summary, demo_view):
    from counterfactory.io import write_csv

    path = tmp_path / "summary.csv"
    write_csv(path, summary)
    out = {ext: tmp_path / f"tables.{ext}" for ext in ("md", "tex", "csv", "png", "html")}
    rn.write_tables(path, demo_view, out["md"], out["tex"], out["csv"], out["png"], out_html=out["html"])
    page = out["html"].read_text()   # the report's copy: every table and Figure 4's points, as HTML tables
    assert page.startswith("<!DOCTYPE html>") and page.count("<table") == 4 and "<caption>Table 1" in page
    assert "CLIP + Ours" in page and "Figure 4" in page and "normaliser" in page
    md = out["md"].read_text()
    assert "Table 1" in md and "Table 2" in md and "Table 3" in md and "Figure 4" in md
    assert md.index("CLIP (zeroshot)") < md.index("CLIP (finetune)") < md.index("CLIP + Ours") \
        < md.index("BLIP (zeroshot)")
    assert "tabular" in out["tex"].read_text()
    cells = pd.read_csv(out["csv"])
    assert "CLIP + Ours" in set(cells["label"]) and cells["table"].nunique() == 3
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Figure 4's points name dataset, model and metric as the paper does, never the config keys (issue 32 item 2)
    figure4 = md[md.index("Figure 4"):]
    assert "| Dataset   | Model   |   Ratio | Metric" in figure4 and "| MS-COCO" in figure4 and "| CLIP" in figure4
    assert not any(key in figure4 for key in ("coco ", "clip_train", "TR@1", "| dataset", "| role"))
    assert "clip_train" not in page[page.index("Figure 4"):]


def test_runs_of_the_paper_config(paper_view):
    s = st.settings(paper_view)
    plan = rn.runs(s)
    assert len(plan) == len(set(plan))
    seeds = len(st.seed_pairs(s))
    assert seeds == 3
    per = {}
    for dataset, role, mixture, seed in plan:
        per.setdefault((dataset, role), []).append((mixture, seed))
    # zero-shot once + (finetune, ours, 5 Table 3 variants, 5 ratios, appendix B's D_s and D') x 3 seeds for CLIP on
    # MS-COCO
    assert len(per["coco", "clip_train"]) == 1 + (2 + 5 + 5 + 2) * 3 == 43
    assert ("d_s", 0) in per["coco", "clip_train"] and ("d_prime", 2) in per["coco", "clip_train"]
    for key in (("coco", "itm_blip"), ("flickr30k", "clip_train"), ("flickr30k", "itm_blip")):
        assert len(per[key]) == 1 + 2 * 3 == 7, key
    # VSE++ (Tables 1-2): finetune and ours, no zero-shot row
    for key in (("coco", "vsepp"), ("flickr30k", "vsepp")):
        assert sorted({m for m, _ in per[key]}) == ["finetune", "ours"] and len(per[key]) == 2 * 3, key
    assert len(plan) == 43 + 3 * 7 + 2 * 6 == 76
    assert per["coco", "itm_blip"][0] == ("zeroshot", 0)
    assert [m for m, _ in per["coco", "itm_blip"] if m == "zeroshot"] == ["zeroshot"]
    no_zero = st.settings({**dict(paper_view), "training": {**paper_view["training"], "zeroshot": False}})
    assert len(rn.runs(no_zero)) == 76 - 4


# ========================================================================================================== CLI
def test_cli_select_writes_selection_requests_and_summary(repo, tmp_path, monkeypatch):
    monkeypatch.chdir(repo)
    out, req, summ = tmp_path / "sel.parquet", tmp_path / "req.parquet", tmp_path / "summary.csv"
    rc = cli.main(["odmap", "select", "--dataset", "coco", "--config", "config/demo.yaml", "--out", str(out),
                   "--out-requests", str(req), "--out-summary", str(summ)])
    assert rc == 0
    assert out.is_file() and req.is_file() and summ.is_file()
    lines = summ.read_text().splitlines()
    assert "selected,8" in lines and "candidates,13" in lines and "multi,1" in lines
    assert "skipped: area,2" in lines
    requests = dt.read_requests(req)
    assert len(requests) == 8 and len(pd.read_parquet(out)) == 13
    assert all(isinstance(b, list) and len(b) == 4 for boxes in requests["boxes"] for b in boxes)


def test_flickr30k_path_on_the_demo_entities(tmp_path, monkeypatch, repo):
    """Flickr30k: captions and boxes from Flickr30k Entities (the demo's 8 images in the official layout), splits
    from a Karpathy file; the people type is removed by its annotated phrases, prompts name singular nouns."""
    import json

    from counterfactory.studies.spurious_retrieval import captions, data, regions
    from counterfactory.studies.spurious_retrieval import settings as S

    monkeypatch.chdir(repo)
    root = repo / "resources/demo/flickr30k_entities"
    ids = sorted(p.stem for p in (root / "Annotations").glob("*.xml"))
    splits = ["train"] * (len(ids) - 3) + ["val", "test", "test"]
    doc = {"dataset": "flickr30k", "images": [
        {"filename": f"{i}.jpg", "imgid": k, "split": s, "sentids": [k],
         "sentences": [{"raw": "x", "tokens": ["x"], "imgid": k, "sentid": k}]}
        for k, (i, s) in enumerate(zip(ids, splits))]}
    (tmp_path / "flickr.json").write_text(json.dumps(doc))
    s = S.settings({"data": {"datasets": ["flickr30k"], "flickr30k": {
        "karpathy_json": str(tmp_path / "flickr.json"), "image_root": str(repo / "resources/demo/flickr30k/flickr30k-images"),
        "entities_root": str(root)}}})
    caps = data.load_captions(s, "flickr30k")
    assert caps.groupby("split")["image_id"].nunique().to_dict() == {"train": 5, "val": 1, "test": 2}
    assert (caps.groupby("image_id").size() >= 2).all()          # the Entities sentences, not the Karpathy stubs
    table, requests = data.select(s, regions.settings(None), "flickr30k")
    assert set(table["category"]) <= set(regions.FLICKR_CLASSES)
    assert len(requests) == int(table["selected"].sum()) >= 1
    row = requests.iloc[0]
    assert row["removed_categories"] == ["people"] and row["present_categories"] == ["animals"]
    classes = list(regions.FLICKR_CLASSES)
    gallery = captions.gallery(s, "flickr30k", caps, classes)
    woman = gallery[gallery["caption"].str.startswith("A woman")]
    assert woman["mentions"].map(list).tolist() == [["people"]]
    syn = captions.synthetic(s, "flickr30k", requests, caps, ("np_removal", "prompt"), classes)
    mine = syn[syn["item_id"] == row["item_id"]]
    removed = mine[(mine["method"] == "np_removal") & mine["matched"]]
    assert len(removed) >= 1 and not removed["caption"].str.contains("people|men|women", case=False).any()
    prompt = mine.loc[mine["method"] == "prompt", "caption"].item()
    assert "animal" in prompt and "animals" not in prompt and "people" not in prompt


def test_select_with_segmentation_masks_on_the_demo(repo, demo_view, demo_selection):
    """``mask_mode: segmentation``: the demo's polygons trace its boxes, so the decisions are the box mode's and each
    request's segmentation rasterises to the pixels of its boxes, up to the one-pixel edge where a half-pixel
    coordinate falls on a pixel centre (pycocotools includes that pixel, the box rule is half-open)."""
    from counterfactory.generation.inpaint import _segmentation_mask, boxes_to_mask

    _, boxes_table, _ = demo_selection
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(repo)
        s = st.settings(demo_view)
        table, requests = dt.select(s, rg.settings({"selection": {"mask_mode": "segmentation"}}), "coco")
    decisions = ["image_id", "category_id", "selected", "reason", "mode"]
    pd.testing.assert_frame_equal(table[decisions], boxes_table[decisions])
    assert [list(v) for v in table["removed_categories"]] == [list(v) for v in boxes_table["removed_categories"]]
    np.testing.assert_allclose(table["removed_area_ratio"], boxes_table["removed_area_ratio"], atol=0.005)
    assert (requests["segmentation"] != "").all()
    for r in requests.itertuples(index=False):
        h, w = json.loads(r.segmentation)["size"]
        mask = _segmentation_mask(r.segmentation, "<requests>", r.item_id)
        box = boxes_to_mask(r.boxes, h, w)
        differ = np.argwhere(mask ^ box)
        assert len(differ) < 0.01 * h * w
        # every differing pixel is next to a pixel where the two agree on the mask (an edge, not an area)
        assert all(box[max(y - 1, 0):y + 2, max(x - 1, 0):x + 2].any() for y, x in differ)


def test_variants_keep_table3_order_whatever_the_mapping_order(repo):
    """The workflow's config view sorts mapping keys; Table 3's rows (and the manifests summary) must still come
    in the paper's order: ours, then the configured table3 list."""
    from counterfactory import workflow as wf
    from counterfactory.config import load_full_config
    from counterfactory.studies.spurious_retrieval import settings as st

    cfg = load_full_config([repo / "config" / "config.yaml"])
    s = st.settings(wf.view(cfg, "spurious_retrieval"))
    assert st.needed_variants(s) == ["ours", "np_blur", "np_zero", "np_mean", "captioner", "prompts"]


def test_tables_name_models_by_the_configs_display_names(tmp_path, summary, repo, capsys):
    """`spurious tables --label ROLE=NAME` (the workflow passes every role's ``display_name``) names the rows, Figure
    4's points and its legend; without labels the rows keep the paper's names."""
    from counterfactory.io import write_csv

    path = tmp_path / "summary.csv"
    write_csv(path, summary)
    out = {ext: tmp_path / f"tables.{ext}" for ext in ("md", "tex", "csv", "png")}
    args = ["spurious", "tables", "--config", str(repo / "config" / "demo.yaml"), "--summary", str(path),
            "--out-md", str(out["md"]), "--out-tex", str(out["tex"]), "--out-csv", str(out["csv"]),
            "--out-figure", str(out["png"]), "--label", "clip_train=CLIP ViT-B/32", "--label", "itm_blip=BLIP-base"]
    assert cli.main(args) == 0
    md = out["md"].read_text()
    assert "CLIP ViT-B/32 (zeroshot)" in md and "CLIP ViT-B/32 + Ours" in md and "BLIP-base (finetune)" in md
    assert "| CLIP ViT-B/32" in md[md.index("Figure 4"):]
    assert cli.main(args[:-4] + ["--label", "clip_train"]) != 0
    assert "ROLE=NAME" in capsys.readouterr().err
    labels = dict(rn.paper_tables(summary, st.settings(load_config([repo / "config" / "demo.yaml"],
                                                                       study=STUDY))))
    assert next(iter(labels.values())).row_labels[0] == "CLIP (zeroshot)"
