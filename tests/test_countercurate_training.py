"""CounterCurate CLIP fine-tuning (§3.5 Grouping, §4.1 settings, Table 4 / Table 8 ablations) on tiny models."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from counterfactory.errors import ConfigError, InputError
from counterfactory.studies.countercurate import training as tr
from counterfactory.studies.countercurate import manifests as mf


def _png(path: Path, seed: int) -> str:
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((24, 24, 3)) * 255).astype(np.uint8)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> Path:
    """A tiny positions (4 train + 2 test items), counting (5 items) and attributes (4 accepted + 1 rejected;
    two negatives of one caption; no image_path column) table under datasets/, images under images/."""
    root = tmp_path_factory.mktemp("cc")
    img, out = root / "images", root / "datasets"
    img.mkdir()
    out.mkdir()
    k = iter(range(1000))
    pos = []
    for i, (sub, split) in enumerate([("LR", "train"), ("AB", "train"), ("LR", "train"), ("AB", "train"),
                                      ("LR", "test"), ("AB", "test")]):
        rel = ("left", "right") if sub == "LR" else ("above", "below")
        pos.append({"item_id": f"p{i}", "image_id": str(100 + i), "image_path": _png(img / f"{100 + i}.jpg", next(k)),
                    "caption": f"a dog {i} is {rel[0]} a cat", "negative_caption": f"a dog {i} is {rel[1]} a cat",
                    "negative_image": _png(img / f"p{i}_neg.png", next(k)), "subset": sub, "split": split})
    pd.DataFrame(pos).to_parquet(out / "positions.parquet")
    cnt = [{"item_id": f"c{i}", "image_id": str(200 + i), "image_path": _png(img / f"{200 + i}.jpg", next(k)),
            "caption": f"there are {i + 1} cups", "negative_caption": f"there are {i + 2} cups",
            "negative_image": _png(img / f"c{i}_neg.png", next(k))} for i in range(5)]
    pd.DataFrame(cnt).to_parquet(out / "counting.parquet")
    att = []
    for i, (image, kind, status) in enumerate([(300, "noun", "accepted"), (300, "adjective", "accepted"),
                                               (301, "swap", "accepted"), (302, "noun", "accepted"),
                                               (303, "noun", "rejected")]):
        _png(img / f"{image}.jpg", 500 + image)
        att.append({"item_id": f"a{i}", "image_id": str(image), "caption": f"a red car {image}",
                    "negative": f"a blue {kind} {image}", "kind": kind, "status": status,
                    "negative_image": _png(img / f"a{i}_neg.png", next(k)) if status == "accepted" else None})
    pd.DataFrame(att).to_parquet(out / "attributes.parquet")
    return root


def cfg_for(root: Path, **training) -> dict:
    """Our options on: a 4:1 split of Counting / Attributes and a validation split (paper config: neither)."""
    return {"data": {"images": str(root / "images")},
            "training": {"val_fraction": 0.25, "train_fraction": 0.8, "checkpoint": "best_val", **training}}


# ------------------------------------------------------------------------------------------------------------------
# settings
# ------------------------------------------------------------------------------------------------------------------
def test_training_section_has_the_papers_values():
    from counterfactory.training import TrainSettings

    g = tr.training_section({}, "positions", "grouping")
    p = tr.training_section({}, "positions", "no_grouping")
    n = tr.training_section({}, "positions", "no_negatives")
    assert (g["lr"], g["epochs"], g["recipe"], g["batch_size"]) == (2.56e-5, 15, "grouping", 2048)  # 1024 pairs
    assert (p["lr"], p["epochs"], p["recipe"], p["batch_size"]) == (2.56e-5, 50, "plain", 1024)
    assert (n["epochs"], n["recipe"], n["batch_size"]) == (50, "plain", 1024)
    a = tr.training_section({}, "attributes", "grouping")
    assert (a["lr"], a["epochs"], a["batch_size"]) == (1e-5, 5, 512)
    assert tr.training_section({}, "attributes", "no_grouping")["epochs"] == 5
    assert tr.training_section({}, "counting", "grouping")["lr"] == 5e-5
    for section in (g, p, n, a):
        assert (section["adam_beta1"], section["adam_beta2"], section["weight_decay"]) == (0.9, 0.98, 0.2)
        assert set(TrainSettings.SECTION_KEYS) <= set(section)
        assert TrainSettings.from_section(section, 1, 2).optimizer == "adamw_torch"
    # eval_every: epoch -> steps of one epoch; per-dataset overrides; unknown keys fail clearly
    assert tr.training_section({}, "positions", "grouping", train_rows=4097)["eval_every"] == 3
    cfg = {"training": {"positions": {"lr": 1e-3, "warmup_steps": 7}, "common": {"eval_every": 5}}}
    over = tr.training_section(cfg, "positions", "no_grouping")
    assert (over["lr"], over["warmup_steps"], over["eval_every"], over["batch_size"]) == (1e-3, 7, 5, 1024)
    with pytest.raises(ConfigError, match="unknown key"):
        tr.training_section({"training": {"positions": {"learning_rate": 1}}}, "positions", "grouping")
    with pytest.raises(ConfigError, match="unknown training variant"):
        tr.training_section({}, "positions", "cvld")
    for variant in ("no_negative_images", "no_negative_captions"):
        single = tr.training_section({}, "positions", variant)
        assert (single["recipe"], single["epochs"], single["batch_size"]) == ("plain", 50, 1024)


def test_variants_per_dataset_baseline_and_table_rows():
    s = tr.settings({})
    assert s["variants"]["positions"] == ["grouping", "no_grouping", "no_negative_captions", "no_negative_images",
                                          "no_negatives"]  # Table 4's five rows
    assert s["variants"]["counting"] == ["grouping", "no_grouping", "no_negatives"]  # Table 8
    assert tr.stats_baseline({}) == "no_grouping"
    one = {"training": {"variants": ["grouping", "no_negatives"]}}
    assert tr.settings(one)["variants"] == {d: ["grouping", "no_negatives"] for d in tr.DATASETS}
    assert tr.stats_baseline(one) == "grouping"  # no no_grouping anywhere: the first shared variant
    some = {"training": {"variants": {"counting": ["grouping"]}}}
    assert tr.settings(some)["variants"]["positions"] == s["variants"]["positions"]      # the schema's default
    assert tr.stats_baseline(some) == "grouping"
    disjoint = {"training": {"datasets": ["positions", "counting"],
                             "variants": {"positions": ["no_grouping"], "counting": ["grouping"]}}}
    with pytest.raises(ConfigError, match="share no variant"):
        tr.stats_baseline(disjoint)
    with pytest.raises(ConfigError, match=r"variants\.counting\.0: 'neg' is not one of"):
        tr.settings({"training": {"variants": {"counting": ["neg"]}}})
    with pytest.raises(ConfigError, match=r"training\.variants: unknown key\(s\) flowers"):
        tr.settings({"training": {"variants": {"flowers": ["grouping"]}}})
    # rows in Table 4's order, whatever the config's order
    assert tr.table_order({}, "positions") == ["pretrained", "no_negatives", "no_negative_images",
                                               "no_negative_captions", "no_grouping", "grouping"]
    info = tr.variants_info().set_index("mixture")
    assert tuple(info.loc["no_negative_images", ["negative_images", "negative_captions", "grouping"]]) == \
        ("no", "yes", "no")
    assert tr.seed_pairs({"training": {"seeds": {"first": 5, "count": 2, "data_seed_offset": 10}}}) == [(5, 15),
                                                                                                       (6, 16)]


# ------------------------------------------------------------------------------------------------------------------
# manifests
# ------------------------------------------------------------------------------------------------------------------
def test_manifests_per_variant(datasets, tmp_path):
    out = tmp_path / "m"
    summary = mf.write_manifests(datasets / "datasets", out, cfg_for(datasets, variants=list(tr.VARIANTS)))
    assert set(summary["variant"]) == {*tr.VARIANTS, tr.VLM_MIXTURE} and set(summary["dataset"]) == set(tr.DATASETS)
    for dataset in tr.DATASETS:
        g = pd.read_parquet(out / f"{dataset}_grouping.parquet")
        p = pd.read_parquet(out / f"{dataset}_no_grouping.parquet")
        n = pd.read_parquet(out / f"{dataset}_no_negatives.parquet")
        pd.testing.assert_frame_equal(g, p)  # same rows; only the batching differs
        sizes = g.groupby("pair_id")["is_counterfactual"].agg(["size", "sum"])
        assert (sizes["sum"] == sizes["size"] - 1).all()  # one positive per group, then its negatives
        assert (sizes["size"] == 2).all() or dataset == "attributes"
        assert not n["is_counterfactual"].any() and set(n["split"]) <= {"train", "val"}
        assert all(Path(x).is_absolute() and Path(x).is_file() for x in g["image_path"])
        assert (g.groupby("image_id")["split"].nunique() == 1).all()  # no image on both sides
        # Table 4's single-negative rows: the positives, each with its pair's negative caption / image alone
        negative = g[g["is_counterfactual"]].set_index("item_id")
        for variant, column, source in (("no_negative_images", "hard_negative_caption", "caption"),
                                        ("no_negative_captions", "hard_negative_image", "image_path")):
            single = pd.read_parquet(out / f"{dataset}_{variant}.parquet")
            assert not single["is_counterfactual"].any() and len(single) == len(negative)  # one row per pair
            other = ({"hard_negative_caption", "hard_negative_image"} - {column}).pop()
            assert other not in single.columns
            assert (single.set_index("item_id")[column] == negative.loc[single["item_id"], source].to_numpy()).all()
        # the generative family's conversations: the same train / val pairs, in the vlm reader's format
        from counterfactory.studies.countercurate import vlm

        files = [out / f"{dataset}_conversation_{split}.parquet" for split in ("train", "val")]
        conv = pd.concat([vlm.read_pairs(f) for f in files if len(pd.read_parquet(f))])  # an empty val side is allowed
        assert len(conv) == len(negative) and conv["negative_image_path"].map(lambda p: Path(p).is_file()).all()
    pos = pd.read_parquet(out / "positions_grouping.parquet")
    assert set(pos["image_id"]) == {"100", "101", "102", "103"}  # the test split never enters training
    att = pd.read_parquet(out / "attributes_no_negatives.parquet")
    assert "a4" not in set(pd.read_parquet(out / "attributes_grouping.parquet")["item_id"])  # rejected item
    assert len(att) == att[["image_path", "caption"]].drop_duplicates().shape[0]  # one row per positive
    # counting / attributes: a reproducible 4:1 split by image, recorded with the validation images
    split = pd.read_csv(out / "counting_images.csv", dtype=str)
    assert (split["split"] == "test").sum() == 1 and set(split["split"]) <= {"train", "val", "test"}
    again = tmp_path / "again"
    mf.write_manifests(datasets / "datasets", again, cfg_for(datasets))
    for name in ("counting_images.csv", "attributes_images.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(out / name), pd.read_csv(again / name))
    pd.testing.assert_frame_equal(pd.read_parquet(out / "counting_grouping.parquet"),
                                  pd.read_parquet(again / "counting_grouping.parquet"))
    assert (out / "summary.csv").is_file()


def test_missing_negative_image_names_the_file_and_row(datasets, tmp_path):
    table = pd.read_parquet(datasets / "datasets" / "counting.parquet")
    table.loc[2, "negative_image"] = str(tmp_path / "gone.png")
    src = tmp_path / "ds"
    src.mkdir()
    table.to_parquet(src / "counting.parquet")
    cfg = cfg_for(datasets, datasets=["counting"], train_fraction=1.0)
    with pytest.raises(InputError, match=r"counting\.parquet, record row 2 \(item_id 'c2'\): negative image file "
                       r"not found: .*gone\.png"):
        mf.write_manifests(src, tmp_path / "m", cfg)
    # positives only (and no generative family, which trains on the negatives too) do not need the negatives
    mf.write_manifests(src, tmp_path / "m", {**cfg, "training": {**cfg["training"], "variants": ["no_negatives"],
                                                                 "vlm": {"datasets": []}}})


# ------------------------------------------------------------------------------------------------------------------
# runs
# ------------------------------------------------------------------------------------------------------------------
def test_train_run_end_to_end_on_tiny_open_clip(datasets, tmp_path, monkeypatch):
    from counterfactory import stats
    from counterfactory.models import tiny
    from counterfactory.studies.countercurate import benchmarks as bm

    sources = []
    evaluate = bm.evaluate

    def spy(cfg, role, benchmark, **kw):
        sources.append(cfg["models"][role]["source"])
        return evaluate(cfg, role, benchmark, **kw)

    monkeypatch.setattr(bm, "evaluate", spy)

    tiny.build("clip_open_clip", tmp_path / "models")
    cfg = cfg_for(datasets, datasets=["positions"], variants=["grouping", "no_grouping"],
                  common={"max_steps": 2, "eval_every": 1, "dataloader_workers": 0},
                  positions={"batch_size": 2, "lr": 1e-3})
    cfg.update(models={"clip_open_clip": {"source": str(tmp_path / "models" / "clip_open_clip"),
                                          "library": "open_clip"}},
               benchmarks={"positions": {"table": str(datasets / "datasets" / "positions.parquet")}}, device="cpu")
    mf.write_manifests(datasets / "datasets", tmp_path / "m", cfg)
    runs = []
    for variant, seed in (("grouping", 1), ("grouping", 2), ("no_grouping", 1)):
        out = tmp_path / "runs" / variant / str(seed)
        rows = tr.train_run(cfg, "positions", variant, tmp_path / "m" / f"positions_{variant}.parquet", seed,
                            seed + 1, out)
        assert (out / "checkpoint").is_dir() and (out / "metrics.csv").is_file() and (out / "benchmarks.csv").is_file()
        assert len(pd.read_csv(out / "history.csv")) == 2
        runs.append(rows)
    pre = tr.train_run(cfg, "positions", None, None, 0, 1, tmp_path / "runs" / "pretrained", train=False)
    runs.append(pre)
    table = pd.concat(runs, ignore_index=True)
    assert set(table["mixture"]) == {"grouping", "no_grouping", "pretrained"} and set(table["experiment"]) == {
        "positions"}
    acc = table[table["metric"].isin(["positions/LR/accuracy", "positions/AB/accuracy", "positions/both/accuracy"])]
    assert len(acc) == 3 * 4 and acc["value"].between(0, 100).all()
    assert set(pre["metric"]) == set(runs[0]["metric"])  # every metric has its pre-trained baseline row
    summary = stats.summarize(table, baseline="pretrained")
    g = summary[(summary["mixture"] == "grouping") & (summary["metric"] == "positions/both/accuracy")].iloc[0]
    assert g["n"] == 2 and math.isfinite(g["mean"])
    # the trained model is scored from its checkpoint, not from the pre-trained weights
    assert sources[0] == str(tmp_path / "runs" / "grouping" / "1" / "checkpoint")
    assert sources[-1] == str(tmp_path / "models" / "clip_open_clip")
    a = pd.read_csv(tmp_path / "runs" / "grouping" / "1" / "benchmarks.csv")
    assert set(a["model"]) == {"grouping"} and set(a["subset"]) == {"LR", "AB", "both"}


def test_cli_registers_the_steps(tmp_path):
    from counterfactory.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["countercurate", "train-run", "--config", "c.yaml", "--dataset", "positions",
                              "--no-train", "--seed", "1", "--data-seed", "2", "--out-dir", str(tmp_path),
                              "--data", "positions=x.parquet"])
    assert args.no_train and args.variant is None and args.data == ["positions=x.parquet"]
    args = parser.parse_args(["countercurate", "train-manifests", "--config", "c.yaml", "--datasets", "d",
                              "--out-dir", "o"])
    assert args.func.__name__ == "_cmd_train_manifests"
    from counterfactory.commands.countercurate import _pairs_option

    with pytest.raises(ConfigError, match="BENCHMARK=PATH"):
        _pairs_option(["positions"], "--data")
