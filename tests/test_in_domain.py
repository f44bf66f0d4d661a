"""COCO-CF appendix A.1: the withheld in-domain test set (56 / 14 / 30 % by pair) and its manifests."""

from __future__ import annotations

import pandas as pd
import pytest

from counterfactory.errors import ConfigError
from counterfactory.studies.coco_counterfactuals.in_domain import split_pairs, write_in_domain


def test_paper_scale_split_is_56_14_30_by_pair():
    split = split_pairs([f"{i}_0" for i in range(17410)], 0.3, 0.2, random_state=42)
    counts = split["split"].value_counts().to_dict()
    assert counts == {"test": 5223, "dev": 2437, "train": 9750}   # 30.0 % / 14.0 % / 56.0 % of 17,410
    assert split["id"].is_unique and len(split) == 17410


def test_split_is_reproducible_and_depends_on_the_state():
    ids = [str(i) for i in range(200)]
    a, b = split_pairs(ids, random_state=1), split_pairs(list(reversed(ids)), random_state=1)
    assert a.equals(b)  # input order does not matter
    assert not a.equals(split_pairs(ids, random_state=2))


@pytest.mark.parametrize("test, dev", [(0.0, 0.2), (1.0, 0.2), (0.3, 1.0)])
def test_bad_fractions_are_refused(test, dev):
    with pytest.raises(ConfigError, match="in_domain"):
        split_pairs(["a", "b"], test, dev)


def test_manifests_hold_train_and_dev_pairs_only(tmp_path):
    n = 20
    ids = [f"{i}_0" for i in range(n)]
    (tmp_path / "img").mkdir()
    pairs = pd.DataFrame({"id": ids, "caption_id": ids, "caption_0": [f"a dog {i}" for i in range(n)],
                          "caption_1": [f"a cat {i}" for i in range(n)],
                          "image_0": [f"img/{i}_0.png" for i in range(n)], "image_1": [f"img/{i}_1.png" for i in range(n)]})
    pairs.to_parquet(tmp_path / "pairs.parquet")
    captions = pd.DataFrame({"caption_id": ids, "caption": pairs["caption_0"],
                             "file_name": [f"{i:012d}.jpg" for i in range(n)]})
    captions.to_parquet(tmp_path / "captions.parquet")
    cfg = {"in_domain": {"test_fraction": 0.3, "dev_fraction": 0.2, "random_state": 0, "real_per_pair": 1,
                         "mixtures": ["mscoco", "coco_cfs"]},
           "data": {"coco_root": str(tmp_path / "coco"), "split": "val2017"}}
    summary = write_in_domain(cfg, tmp_path / "pairs.parquet", tmp_path / "captions.parquet", tmp_path / "out")
    split = pd.read_parquet(tmp_path / "out/split.parquet").set_index("id")["split"]
    test_ids = set(split[split == "test"].index)
    assert len(test_ids) == 6  # 30 % of 20
    test_pairs = pd.read_parquet(tmp_path / "out/test_pairs.parquet")
    assert set(test_pairs["id"]) == test_ids
    cf = pd.read_parquet(tmp_path / "out/manifests/coco_cfs.parquet")
    real = pd.read_parquet(tmp_path / "out/manifests/mscoco.parquet")
    assert not {p.split(":")[1] for p in cf["pair_id"]} & test_ids
    assert len(cf) == 2 * 14 and len(real) == 14 and cf["is_counterfactual"].all() and not real["is_counterfactual"].any()
    # dev pairs validate, train pairs train; both samples of a pair on one side
    assert set(cf.groupby("pair_id")["split"].nunique()) == {1}
    dev = {f"cf:{i}" for i in split[split == "dev"].index}
    assert set(cf.loc[cf["split"] == "val", "pair_id"]) == dev
    assert real["image_path"].str.endswith(".jpg").all() and "val2017" in real["image_path"].iloc[0]
    assert summary.set_index("mixture").loc["coco_cfs", "n_train"] == 2 * (14 - len(dev))


def test_retrieval_sets_give_one_table_each():
    from counterfactory.studies.coco_counterfactuals import table_metrics, training_tables
    from counterfactory.training.runs import retrieval_specs

    flickr = {"name": "flickr30k", "karpathy_json": "f.json", "image_root": "f", "split": "test", "ks": [1, 5, 10]}
    coco = {**flickr, "name": "mscoco", "ks": [1, 5]}
    training = {"eval": {"retrieval": [flickr, coco], "classification": ["CIFAR10"]}}
    assert training_tables(training) == ["retrieval", "retrieval_mscoco", "classification"]  # Tables 3, 12, 4
    assert table_metrics(training, "retrieval_mscoco").split(",") == [
        "mscoco/image_to_text@1", "mscoco/image_to_text@5", "mscoco/text_to_image@1", "mscoco/text_to_image@5",
        "mscoco/mean"]
    assert retrieval_specs({"retrieval": flickr}) == [flickr]   # one mapping still works
    assert retrieval_specs({"retrieval": None}) == []
    with pytest.raises(ConfigError, match="unique"):
        retrieval_specs({"retrieval": [flickr, flickr]})


def test_itr_subset_option_is_checked(repo, tmp_path, capsys):
    from counterfactory.cli import main

    assert main(["evaluate", "itr", "--config", str(repo / "config" / "demo.yaml"), "--role", "clip_eval",
                 "--pairs", "p", "--captions", "c", "--out", str(tmp_path / "o.csv"), "--subset", "no-equals"]) == 2
    assert "expected LABEL=FILE" in capsys.readouterr().err


def _runs(values: dict) -> pd.DataFrame:
    """Runs table rows: {(model, mixture): [per-seed value]} -> every Table 5 metric = value + column offset."""
    from counterfactory.studies.coco_counterfactuals.in_domain import TABLE5_COLUMNS

    rows = []
    for (model, mixture), per_seed in values.items():
        for i, v in enumerate(per_seed):
            for j, (metric, _) in enumerate(TABLE5_COLUMNS):
                rows.append({"experiment": model, "mixture": mixture, "seed": 107 + i, "data_seed": 108 + i,
                             "metric": metric, "value": v + j})
    return pd.DataFrame(rows)


def test_table5_layout_from_pretrained_and_fine_tuned_runs(tmp_path):
    """Table 5: one block per model (pre-trained row, MS-COCO, COCO-CFs), mean and std over seeds, the
    significance of COCO-CFs against MS-COCO within the block, and the best mean per block in bold."""
    from counterfactory import stats
    from counterfactory.studies.coco_counterfactuals import in_domain as ind

    runs = _runs({("clip_train", "pretrained"): [50.0], ("clip_train", "mscoco"): [57.0, 57.4, 56.9],
                  ("clip_train", "coco_cfs"): [65.0, 64.8, 65.3],
                  ("itm_flava", "pretrained"): [60.0], ("itm_flava", "mscoco"): [50.0, 52.0, 54.0],
                  ("itm_flava", "coco_cfs"): [51.0, 53.0, 52.0]})
    summary = stats.summarize(runs, "mscoco", test="welch", alpha=0.05)
    rows = ind.table5(summary, ["clip_train", "itm_flava"])
    assert [(m, lab) for m, lab, _ in rows] == [
        ("CLIP", "None (pre-trained CLIP)"), ("CLIP", "MS-COCO"), ("CLIP", "COCO-CFs"),
        ("Flava", "None (pre-trained Flava)"), ("Flava", "MS-COCO"), ("Flava", "COCO-CFs")]
    clip_cf, flava_cf, flava_pre = rows[2][2][0], rows[5][2][0], rows[3][2][0]
    assert clip_cf.mean == pytest.approx(65.033333) and clip_cf.n == 3 and clip_cf.significant and clip_cf.best
    assert not flava_cf.significant and flava_pre.best and flava_pre.n == 1  # the pre-trained FLAVA row is best
    md = ind.table5_markdown(rows)
    import re

    header = next(line for line in md.splitlines() if line.startswith("| Pre-trained model"))
    assert re.split(r"\s*\|\s*", header.strip("| ")) == ["Pre-trained model", "Training dataset", "TR R@1", "TR R@5",
                                                          "TR R@10", "IR R@1", "IR R@5", "IR R@10", "Mean"]
    assert md.count("| CLIP ") == 1  # the model's name opens its block only
    assert "**<u>65.03</u>**<sub>0.3</sub>" in md and "**60.00**" in md
    tex = ind.table5_latex(rows)
    assert "\\underline{\\textbf{65.03}}" in tex and "None (pre-trained Flava)" in tex
    csv = ind.table5_csv(rows)
    assert len(csv) == 6 * 7 and csv["significant"].sum() == 7  # every CLIP COCO-CFs column


def test_table5_names_models_by_the_configs_display_names(tmp_path):
    """`train in-domain-table --label ROLE=NAME` (the rule passes every role's display_name) names each block."""
    from counterfactory import cli, stats
    from counterfactory.io import write_csv

    runs = _runs({("clip_train", "pretrained"): [50.0], ("clip_train", "mscoco"): [57.0, 58.0],
                  ("clip_train", "coco_cfs"): [60.0, 61.0]})
    write_csv(tmp_path / "summary.csv", stats.summarize(runs, "mscoco"))
    out = {ext: tmp_path / f"t.{ext}" for ext in ("md", "tex", "csv")}
    assert cli.main(["train", "in-domain-table", "--summary", str(tmp_path / "summary.csv"), "--models", "clip_train",
                     "--out-md", str(out["md"]), "--out-tex", str(out["tex"]), "--out-csv", str(out["csv"]),
                     "--label", "clip_train=CLIP ViT-B/32", "--label", "itm_flava=FLAVA"]) == 0
    md = out["md"].read_text()
    import re

    assert "| CLIP ViT-B/32 " in md and "None (pre-trained CLIP ViT-B/32)" in md
    assert not re.search(r"\| CLIP\s+\|", md)     # the paper's name only where no label is given


def test_table5_names_a_model_without_runs():
    from counterfactory import stats
    from counterfactory.studies.coco_counterfactuals import in_domain as ind

    runs = _runs({("clip_train", "pretrained"): [50.0], ("clip_train", "mscoco"): [57.0, 58.0],
                  ("clip_train", "coco_cfs"): [60.0, 61.0]})
    with pytest.raises(ConfigError, match="'itm_bridgetower' has no runs"):
        ind.table5(stats.summarize(runs, "mscoco"), ["clip_train", "itm_bridgetower"])


def test_mscoco_side_holds_an_equivalent_amount_of_real_samples(repo, tmp_path):
    """A.1 compares training on COCO-CFs with training on "an equivalent amount of real examples": per train / dev
    pair two MS-COCO samples (its original caption and a further caption of the same image, never a pair's
    original caption), as many as the counterfactual side."""
    from counterfactory.config import load_config

    assert load_config([repo / "config" / "config.yaml"])["in_domain"]["real_per_pair"] == 2
    n = 20
    ids = [f"{i}_0" for i in range(n)]
    pairs = pd.DataFrame({"id": ids, "caption_id": ids, "caption_0": [f"a dog {i}" for i in range(n)],
                          "caption_1": [f"a cat {i}" for i in range(n)],
                          "image_0": [f"img/{i}_0.png" for i in range(n)], "image_1": [f"img/{i}_1.png" for i in range(n)]})
    pairs.to_parquet(tmp_path / "pairs.parquet")
    # five captions per image (caption 0 is the pair's original)
    rows = [{"caption_id": f"{i}_{c}", "caption": f"caption {c} of image {i}", "file_name": f"{i:012d}.jpg"}
            for i in range(n) for c in range(5)]
    pd.DataFrame(rows).to_parquet(tmp_path / "captions.parquet")
    cfg = {"in_domain": {"test_fraction": 0.3, "dev_fraction": 0.2, "random_state": 0, "real_per_pair": 2,
                         "mixtures": ["mscoco", "coco_cfs"]},
           "data": {"coco_root": str(tmp_path / "coco"), "split": "val2017"}}
    summary = write_in_domain(cfg, tmp_path / "pairs.parquet", tmp_path / "captions.parquet", tmp_path / "out")
    real = pd.read_parquet(tmp_path / "out/manifests/mscoco.parquet")
    cf = pd.read_parquet(tmp_path / "out/manifests/coco_cfs.parquet")
    assert len(real) == len(cf) == 2 * 14
    by = summary.set_index("mixture")
    assert by.loc["mscoco", "n_train"] == by.loc["coco_cfs", "n_train"] and by.loc["mscoco", "n_val"] == by.loc[
        "coco_cfs", "n_val"]
    assert set(real.groupby("pair_id")["image_path"].nunique()) == {1}        # both samples show the pair's image
    assert set(real.groupby("pair_id")["caption"].nunique()) == {2}           # two different captions
    assert set(real.groupby("pair_id")["split"].nunique()) == {1}
    test_ids = set(pd.read_parquet(tmp_path / "out/test_pairs.parquet")["id"])
    assert not {p.split(":")[1] for p in real["pair_id"]} & test_ids
    originals = real["caption"].str.startswith("caption 0 of")     # the pairs' own captions (ids i_0)
    assert originals.sum() == 14 and (~originals).sum() == 14
    # a caption that is some pair's original (here the test pairs' i_0 too) is never a further real sample
    cfg["in_domain"]["real_per_pair"] = 5
    write_in_domain(cfg, tmp_path / "pairs.parquet", tmp_path / "captions.parquet", tmp_path / "out5")
    real5 = pd.read_parquet(tmp_path / "out5/manifests/mscoco.parquet")
    assert len(real5) == 5 * 14 and real5["caption"].str.startswith("caption 0 of").sum() == 14


@pytest.mark.parametrize("role, batch, epochs", [("itm_bridgetower", 14, 15), ("itm_flava", 32, 15),
                                                 ("clip_train", 128, 30)])
def test_a1_runs_use_each_models_recipe(repo, tmp_path, role, batch, epochs):
    """A.1, the authors' scripts: BridgeTower batch 14 and FLAVA batch 32 for 15 epochs; CLIP keeps B.3.2's 128 / 30.
    (The run's settings are recorded in run.json; --no-train loads no model.)"""
    import json

    from counterfactory.cli import main

    out = tmp_path / role
    assert main(["train", "run", "--config", str(repo / "config" / "config.yaml"), "--mixture", "mscoco",
                 "--seed", "107", "--data-seed", "108", "--role", role, "--no-train", "--no-default-eval",
                 "--in-domain-recipe", "--out-dir", str(out), "--no-progress"]) == 0
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert (settings["batch_size"], settings["epochs"]) == (batch, epochs)
    assert settings["lr"] == 5e-7 and settings["weight_decay"] == 0.001 and settings["warmup_steps"] == 0
