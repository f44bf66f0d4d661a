"""SocialCounterfactuals debiasing (§5, §8.2; Tables 2, 16, 17): the withheld-occupation split, the training
manifests, one tiny fine-tune + probe run on a tiny CLIP, and the table layouts."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from counterfactory.errors import ConfigError, InputError
from counterfactory.studies.social_counterfactuals import debias as db
from counterfactory.studies.social_counterfactuals import debias_tables as dt
from counterfactory.training.mixtures import round_half_up

SUBJECTS = ["chef", "doctor", "nurse", "pilot", "teacher"]
SEGMENTS = {"race_gender": (("race", ["White", "Black"]), ("gender", ["male", "female"])),
            "physical_race": (("physical", ["young", "old"]), ("race", ["White", "Black"]))}


# ------------------------------------------------------------------ subject split (§5.1)
@settings(max_examples=80, deadline=None)
@given(st.lists(st.text(alphabet="abcdefgh ", min_size=1, max_size=6), min_size=1, max_size=40),
       st.sampled_from([0.1, 0.2, 0.25, 0.5, 0.9]), st.integers(0, 2**31 - 1), st.randoms(use_true_random=False))
def test_split_never_leaks_and_is_reproducible(subjects, fraction, state, rnd):
    split = db.split_subjects(subjects, fraction, state)
    unique = sorted(set(subjects))
    assert split["subject"].tolist() == unique                      # every subject exactly once
    assert not split["subject"].duplicated().any()
    train = set(split.loc[split["split"] == "train", "subject"])
    test = set(split.loc[split["split"] == "test", "subject"])
    assert not train & test and train | test == set(unique)
    assert len(test) == round_half_up(fraction * len(unique))
    shuffled = list(subjects)
    rnd.shuffle(shuffled)
    pd.testing.assert_frame_equal(db.split_subjects(shuffled + subjects[:3], fraction, state), split)


def test_split_sizes_and_state():
    subjects = [f"s{i:03d}" for i in range(121)]
    split = db.split_subjects(subjects, 0.2, 7)
    assert (split["split"] == "test").sum() == 24                  # round_half_up(24.2)
    assert (db.split_subjects(subjects, 0.2, 8)["split"] != split["split"]).any()
    assert (db.split_subjects(["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"], 0.25, 0)["split"]
            == "test").sum() == 3                                   # 2.5 rounds half up
    with pytest.raises(ValueError):
        db.split_subjects([], 0.2)


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def images_table(tmp_path_factory):
    """Two segments × 5 subjects × 2 prefixes, one counterfactual set each (4 images), noisy-colour PNGs."""
    root = tmp_path_factory.mktemp("social_debias")
    (root / "img").mkdir()
    rng = np.random.default_rng(0)
    rows = []
    for seg, ((t1, v1), (t2, v2)) in SEGMENTS.items():
        for s_i, subject in enumerate(SUBJECTS):
            for p_i, prefix in enumerate(["A photo of", "An image of"]):
                set_id = f"{seg}-p{p_i}-{subject}"
                member = 0
                for a in v1:
                    for b in v2:
                        arr = (rng.random((24, 24, 3)) * 80 + 20 * member + 15 * s_i).astype(np.uint8)
                        name = f"img/{set_id}-{member}.png"
                        Image.fromarray(arr).save(root / name)
                        rows.append({"set_id": set_id, "candidate_index": 0, "member_index": member, "segment": seg,
                                     "prefix": prefix, "subject": subject,
                                     "caption": f"{prefix} a {a} {b} {subject}", "a1_type": t1, "a1": a,
                                     "a2_type": t2, "a2": b, "image_path": name})
                        member += 1
    path = root / "kept.parquet"
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


@pytest.fixture(scope="module")
def split():
    return db.split_subjects(SUBJECTS, 0.2, 3)


@pytest.fixture(scope="module")
def manifests(images_table, split, tmp_path_factory):
    out = tmp_path_factory.mktemp("manifests")
    summary = db.write_manifests(images_table, split, None, out, val_fraction=0.25, random_state=0)
    return out, summary


# ------------------------------------------------------------------ manifests
def test_manifests_hold_only_training_subjects(manifests, split, images_table):
    out, summary = manifests
    train = set(split.loc[split["split"] == "train", "subject"])
    test = set(split.loc[split["split"] == "test", "subject"])
    assert len(test) == 1
    for seg in SEGMENTS:
        m = pd.read_parquet(out / f"{seg}.parquet")
        assert list(m.columns[:5]) == ["image_path", "caption", "is_counterfactual", "pair_id", "split"]
        assert set(m["subject"]) == train and not set(m["subject"]) & test
        assert (m["segment"] == seg).all() and m["is_counterfactual"].all()
        assert len(m) == 4 * 2 * len(train)                          # every image of the training subjects
        assert m.groupby("pair_id")["split"].nunique().max() == 1   # a set is never split
        assert m.groupby("pair_id").size().eq(4).all()
        assert (m["split"] == "val").sum() == 4 * round_half_up(0.25 * 2 * len(train))
        assert all(c.endswith(s) for c, s in zip(m["caption"], m["subject"]))
        assert all(p.startswith("/") and p.endswith(".png") for p in m["image_path"])
    back = db.read_subjects(out / "subjects.csv")
    pd.testing.assert_frame_equal(back, split.reset_index(drop=True))
    assert db.withheld_subjects(out / "subjects.csv") == sorted(test)
    row = summary[(summary["segment"] == "race_gender") & (summary["part"] == "test")].iloc[0]
    assert (row["subjects"], row["sets"], row["images"]) == (1, 2, 8)


def test_manifests_are_reproducible_and_reject_a_leaky_split(images_table, split, manifests, tmp_path):
    out, _ = manifests
    db.write_manifests(images_table, split, ["race_gender"], tmp_path, val_fraction=0.25, random_state=0)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "race_gender.parquet"),
                                  pd.read_parquet(out / "race_gender.parquet"))
    leaky = pd.concat([split, pd.DataFrame({"subject": ["doctor"], "split": ["test" if (
        split.set_index("subject").loc["doctor", "split"] == "train") else "train"]})])
    with pytest.raises(ConfigError, match="both sides"):
        db.write_manifests(images_table, leaky, None, tmp_path / "x")
    with pytest.raises(InputError, match="neither side"):
        db.write_manifests(images_table, split[split["subject"] != "nurse"], None, tmp_path / "y")


def test_settings_defaults_and_learning_rates():
    opts = db.settings({})
    assert (opts["withheld_fraction"], opts["epochs"], opts["batch_size"]) == (0.2, 1, 32)   # §5.1, §8.2
    assert [db.segment_lr(opts, s) for s in ("race_gender", "physical_gender", "physical_race")] == [7e-6, 5e-6, 9e-6]
    with pytest.raises(ConfigError, match="physical_race_gender"):
        db.segment_lr(opts, "physical_race_gender")
    with pytest.raises(ConfigError, match="unknown"):
        db.settings({"debias": {"learning_rate": 1e-5}})
    sec = db.training_section({"training": {"lr": 1.0, "weight_decay": 0.1, "epochs": 30}}, "physical_gender")
    assert (sec["lr"], sec["epochs"], sec["batch_size"], sec["weight_decay"], sec["eval"]) == (5e-6, 1, 32, 0.1, {})


def test_paper_config_trains_on_every_training_set(repo, images_table, split, tmp_path):
    """Issue 42 item 4: §5.1 trains on all the remainder after withholding 20 % of the occupations (§8.2 names no
    validation set): no set is held out of training in the paper config; a validation share stays an option."""
    from counterfactory.config import load_config

    view = load_config([repo / "config" / "config.yaml"], study="social_counterfactuals")
    opts = db.settings(view)
    assert opts["val_fraction"] == 0.0 == db.settings({})["val_fraction"]
    db.write_manifests(images_table, split, ["race_gender"], tmp_path, val_fraction=opts["val_fraction"],
                       random_state=opts["random_state"])
    m = pd.read_parquet(tmp_path / "race_gender.parquet")
    train = set(split.loc[split["split"] == "train", "subject"])
    assert (m["split"] == "train").all() and len(m) == 4 * 2 * len(train)
    summary = db.write_manifests(images_table, split, ["race_gender"], tmp_path / "opt", val_fraction=0.25,
                                 random_state=0)
    assert summary.set_index("part").loc["val", "sets"] > 0


def test_debias_fine_tuning_runs_in_its_own_precision(repo):
    """Issue 42 item 2: debias fine-tuning has its precision key (debias.precision), fp32 in the paper config as the
    authors' recipe trains; run_one's stage_config puts it in place of the config-wide precision (auto)."""
    from counterfactory.config import load_config
    from counterfactory.training.runs import stage_config

    view = load_config([repo / "config" / "config.yaml"], study="social_counterfactuals")
    assert db.settings(view)["precision"] == "fp32" and view["precision"] == "auto"
    section = db.training_section(view, "race_gender")
    assert section["precision"] == "fp32"
    assert stage_config({**dict(view), "training": section})["precision"] == "fp32"
    off = db.training_section({"precision": "auto", "debias": {"precision": None}}, "race_gender")
    assert stage_config({"precision": "auto", "training": off})["precision"] == "auto"


# ------------------------------------------------------------------ one run on a tiny CLIP
def test_debias_run_end_to_end(tiny_clip, images_table, manifests, split, tmp_path):
    out, _ = manifests
    cfg = {"device": "cpu", "models": {"clip_train": {"source": str(tiny_clip)}},
           "debias": {"batch_size": 4, "lr": {"race_gender": 1e-3}, "trainer": {"max_steps": 3, "cpu_threads": 1}}}
    sources = []

    def factory(c, role):
        from counterfactory.scorers import scorer_from_config

        sources.append(c["models"][role]["source"])
        return scorer_from_config(c, role, head="itc", progress=False)

    rows = db.debias_run(cfg, "clip_train", "race_gender", out / "race_gender.parquet", out / "subjects.csv",
                         images_table, 1, 2, tmp_path / "debiased", scorer_factory=factory)
    assert list(rows.columns) == ["experiment", "mixture", "seed", "data_seed", "metric", "value"]
    assert set(rows["experiment"]) == {"clip_train:race_gender"} and set(rows["mixture"]) == {"debiased"}
    assert set(rows["metric"]) == set(db.RUN_METRICS)                # race_gender has gender: Bias@K too
    assert rows["value"].map(math.isfinite).all()
    assert (tmp_path / "debiased" / "checkpoint").is_dir()
    info = json.loads((tmp_path / "debiased" / "debias.json").read_text())
    test = sorted(split.loc[split["split"] == "test", "subject"])
    assert info["probed_subjects"] == test and info["training"]["lr"] == 1e-3 and info["training"]["epochs"] == 1
    assert info["training"]["eval_every"] == 3                       # checkpoint: final (one evaluation, at the end)
    assert info["val_loss"] is not None
    assert len(pd.read_csv(tmp_path / "debiased" / "history.csv")) == 3
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "debiased" / "metrics.csv"), rows, check_dtype=False)

    before = db.debias_run(cfg, "clip_train", "race_gender", None, test, images_table, 1, 2, tmp_path / "pre",
                           train=False, scorer_factory=factory)
    assert set(before["mixture"]) == {"pretrained"} and set(before["metric"]) == set(rows["metric"])
    assert not (tmp_path / "pre" / "checkpoint").exists()
    probe_pre = pd.read_csv(tmp_path / "pre" / "probe.csv")
    probe_post = pd.read_csv(tmp_path / "debiased" / "probe.csv")
    assert set(probe_pre["subject"]) == set(test) and set(probe_pre["segment"]) == {"race_gender"}
    assert sources == [str(tmp_path / "debiased" / "checkpoint"), str(tiny_clip)]   # probe loads the checkpoint
    assert len(probe_pre) == len(probe_post)

    runs = pd.concat([before, rows], ignore_index=True)
    summary = db.summarize(runs)
    assert set(summary["mixture"]) == {"pretrained", "debiased"}
    tables = dt.build_tables(summary)
    assert set(tables) == {"table2", "table16", "table17"}


def test_one_pretrained_evaluation_stands_for_every_seed():
    """The workflow evaluates the (deterministic) pre-trained model once; the test against it is then scipy's
    one-sample t-test of the debiased seeds against that value, the same as evaluating it for every seed."""
    from scipy import stats as sps

    debiased = [0.61, 0.55, 0.58]
    rows = [{"experiment": e, "mixture": "pretrained", "seed": 0, "data_seed": 1, "metric": "maxskew_mean",
             "value": 0.69} for e in ("clip:race_gender", "flava:race_gender")]
    rows += [{"experiment": e, "mixture": "debiased", "seed": s, "data_seed": s + 1, "metric": "maxskew_mean",
              "value": v + (0.01 if e.startswith("flava") else 0.0)}
             for e in ("clip:race_gender", "flava:race_gender") for s, v in enumerate(debiased)]
    once = pd.DataFrame(rows)
    every_seed = pd.concat([once[once.mixture == "debiased"]] + [
        once[once.mixture == "pretrained"].assign(seed=s) for s in range(3)], ignore_index=True)
    summary = db.summarize(once)
    pd.testing.assert_frame_equal(summary, db.summarize(every_seed))
    clip = summary[(summary.experiment == "clip:race_gender") & (summary.mixture == "debiased")].iloc[0]
    expected = sps.ttest_1samp(debiased, 0.69, alternative="less")
    assert clip["p_value"] == pytest.approx(expected.pvalue) and clip["df"] == pytest.approx(2)
    base = summary[(summary.experiment == "clip:race_gender") & (summary.mixture == "pretrained")].iloc[0]
    assert base["n"] == 3 and base["mean"] == pytest.approx(0.69) and base["std"] == 0.0


def test_debias_run_evaluates_pata_and_visogender_when_configured(tiny_clip, images_table, repo, tmp_path):
    """§5.3, Table 3: with probing.pata / probing.visogender set, every run also reports the mean MaxSkew@K on
    them, through the same model (the checkpoint for a trained run); Table 3's layouts follow."""
    from counterfactory.studies.social_counterfactuals import external

    demo = repo / "resources" / "demo"
    probing = {"pata": {"files_list": str(demo / "pata/pata_fairness.files.lst"),
                        "captions_json": str(demo / "pata/pata_fairness.captions.json"),
                        "image_dir": str(demo / "pata/images")},
               "visogender": {"oo_tsv": str(demo / "visogender/OO_Visogender_10052025.tsv"),
                              "op_tsv": str(demo / "visogender/OP_Visogender_11012024.tsv"),
                              "image_dir": str(demo / "visogender/images")}}
    cfg = {"device": "cpu", "models": {"clip_train": {"source": str(tiny_clip)}}, "probing": probing}
    assert external.configured(cfg, "pata") and external.configured(cfg, "visogender")
    assert not external.configured({"probing": {"pata": {"files_list": "x"}}}, "pata")
    test = sorted(pd.read_parquet(images_table)["subject"].unique())[:1]
    rows = db.debias_run(cfg, "clip_train", "race_gender", None, test, images_table, 1, 2, tmp_path, train=False)
    by_metric = dict(zip(rows["metric"], rows["value"]))
    detail = pd.read_csv(tmp_path / "external.csv")
    for dataset in ("pata", "visogender"):
        sel = detail[(detail["dataset"] == dataset) & (detail["metric"] == "maxskew") & detail["label"].isna()]
        assert by_metric[f"{dataset}_maxskew"] == pytest.approx(sel["value"].mean())
    runs = pd.concat([rows, rows.assign(mixture="debiased", value=rows["value"] - 0.01)], ignore_index=True)
    tables = dt.build_tables(db.summarize(runs))
    assert {"table3_pata", "table3_visogender"} <= set(tables)


def test_debias_run_rejects_a_withheld_subject_in_training(tiny_clip, images_table, manifests, split, tmp_path):
    out, _ = manifests
    train_subject = split.loc[split["split"] == "train", "subject"].iloc[0]
    cfg = {"models": {"clip_train": {"source": str(tiny_clip)}}}
    with pytest.raises(InputError, match="withheld"):
        db.debias_run(cfg, "clip_train", "race_gender", out / "race_gender.parquet", [train_subject], images_table,
                      1, 2, tmp_path / "leak")


# ------------------------------------------------------------------ tables
def hand_summary():
    """Two models × two segments; pre-trained n=3 (constant), debiased n=3; the second gender-free."""
    rows = []

    def add(exp, metric, mixture, mean, std, sig, alt="less"):
        rows.append({"experiment": exp, "metric": metric, "mixture": mixture, "baseline": "pretrained", "n": 3,
                     "mean": mean, "std": std, "significant": sig, "alternative": alt})

    for role, shift in (("clip_train", 0.0), ("flava", 0.1)):
        e = f"{role}:race_gender"
        add(e, "maxskew_mean", "pretrained", 1.02 + shift, 0.0, False)
        add(e, "maxskew_mean", "debiased", 0.77 + shift, 0.03, True)
        add(e, "ndkl_mean", "pretrained", 0.37, 0.0, False)
        add(e, "ndkl_mean", "debiased", 0.40, 0.02, False)
        add(e, "bias_mean", "pretrained", -0.19, 0.0, False)
        add(e, "bias_mean", "debiased", 0.13, 0.05, False)
        add(e, "absbias_mean", "pretrained", 0.30, 0.0, False)
        add(e, "absbias_mean", "debiased", 0.20, 0.05, True)
        e = f"{role}:physical_race"
        add(e, "maxskew_mean", "pretrained", 1.19, 0.0, False)
        add(e, "maxskew_mean", "debiased", 0.87, 0.04, True)
        add(e, "ndkl_mean", "pretrained", 0.20, 0.0, False)
        add(e, "ndkl_mean", "debiased", 0.17, 0.01, True)
    return pd.DataFrame(rows)


def test_table3_in_the_papers_layout_with_the_race_gender_model_as_debiased_clip():
    """Issue 42 item 3 (Table 3): rows "Pre-trained CLIP" / "Debiased CLIP" (the Race-Gender model, §5.3), the other
    segments' models as extra rows; columns VisoGender and PATA (mean ± std over seeds)."""
    from counterfactory.render import render_markdown

    rows = []
    for seg, (pre, deb) in (("physical_race", (0.26, 0.25)), ("race_gender", (0.26, 0.219))):
        for metric, shift in (("visogender_maxskew", 0.0), ("pata_maxskew", 0.06)):
            for mixture, mean in (("pretrained", pre + shift), ("debiased", deb + shift)):
                rows.append({"experiment": f"clip_train:{seg}", "metric": metric, "mixture": mixture, "n": 3,
                             "mean": mean, "std": 0.01, "significant": False, "baseline": "pretrained"})
    from counterfactory.studies.social_counterfactuals import debias_tables as dt

    t = dt.table3_paper(pd.DataFrame(rows), "race_gender", role_labels={"clip_train": "CLIP"})
    assert [c.label for c in t.columns] == ["Model", "VisoGender", "PATA"]
    assert [r[0] for r in t.rows] == ["Pre-trained CLIP", "Debiased CLIP", "Debiased CLIP (Physical Char., Race)"]
    assert t.rows[1][1].mean == pytest.approx(0.219) and t.rows[1][2].mean == pytest.approx(0.279)
    assert "| Debiased CLIP " in render_markdown(t)
    assert dt.table3_paper(hand_summary(), "race_gender") is None          # no PATA / VisoGender rows


def test_table_layouts():
    tables = dt.build_tables(hand_summary(), role_labels={"clip_train": "CLIP", "flava": "FLAVA"})
    assert list(tables) == ["table2", "table16", "table17"]
    t2, t17 = tables["table2"], tables["table17"]
    assert t2.segments == ["race_gender", "physical_race"] and t2.roles == ["clip_train", "flava"]
    assert t17.segments == ["race_gender"]                           # Bias@K only where the segment has gender
    c = t2.cells[("race_gender", "clip_train", "debiased")]
    assert (c.mean, c.best, c.significant) == (0.77, True, True)
    assert not t2.cells[("race_gender", "clip_train", "pretrained")].best
    assert tables["table16"].cells[("race_gender", "flava", "pretrained")].best   # lower NDKL before debiasing
    b = t17.cells[("race_gender", "clip_train", "debiased")]
    assert b.best and b.significant                                  # |0.13| < |-0.19|; tested on |Bias@K|

    md = dt.render_markdown(t2)
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("|"))
    assert [h.strip() for h in header.strip("|").split("|")] == [
        "Intersectional Bias", "CLIP Pre-trained", "CLIP Debiased", "FLAVA Pre-trained", "FLAVA Debiased"]
    assert "| (Race, Gender)" in md and "(Physical Char., Race)" in md
    assert "**<u>0.77</u>**<sub>0.03</sub>" in md and "| 1.02<sub>0.00</sub>" in md

    tex = dt.render_latex(t2)
    assert "\\multicolumn{2}{c}{CLIP}" in tex and "\\toprule" in tex
    assert "$\\underline{\\textbf{0.77}}_{0.03}$" in tex and "(Race, Gender)" in tex

    frame = dt.tables_frame(tables)
    assert len(frame) == 2 * 4 + 2 * 4 + 1 * 4
    row = frame[(frame["table"] == "table17") & (frame["model"] == "flava") & (frame["mixture"] == "pretrained")]
    assert row["mean"].iloc[0] == -0.19 and not row["best"].iloc[0]


def test_table_captions_state_the_configured_withheld_share(tmp_path):
    """The captions say how many occupations were withheld: the paper's 20 % by default, the config's
    ``debias.withheld_fraction`` when the rule passes it (the smoke overlay withholds half)."""
    assert "withholding counterfactual sets for 20% of the occupations" in dt.build_tables(hand_summary())["table2"].caption
    half = dt.build_tables(hand_summary(), withheld_fraction=0.5)
    assert all("for 50% of the occupations" in t.caption for t in half.values())
    with pytest.raises(ConfigError, match="withheld_fraction"):
        dt.build_tables(hand_summary(), withheld_fraction=20)
    from counterfactory.cli import main

    summary = tmp_path / "summary.csv"
    hand_summary().to_csv(summary, index=False)
    assert main(["social", "debias-table", "--summary", str(summary), "--withheld-fraction", "0.25",
                 "--out-md", str(tmp_path / "t.md")]) == 0
    assert "for 25% of the occupations" in (tmp_path / "t.md").read_text()


def test_table_ignores_significance_of_the_wrong_direction(caplog):
    s = hand_summary()
    s.loc[s["metric"] == "maxskew_mean", "alternative"] = "greater"
    t2 = dt.build_tables(s)["table2"]
    assert not t2.cells[("race_gender", "clip_train", "debiased")].significant
    with pytest.raises(ConfigError):
        dt.build_tables(s.assign(experiment="no-colon"))


def test_cli_table(tmp_path):
    from counterfactory.cli import main

    path = tmp_path / "summary.csv"
    hand_summary().to_csv(path, index=False)
    rc = main(["social", "debias-table", "--summary", str(path), "--label", "clip_train=CLIP",
               "--out-md", str(tmp_path / "t.md"), "--out-tex", str(tmp_path / "t.tex"),
               "--out-csv", str(tmp_path / "t.csv")])
    assert rc == 0
    assert "CLIP Debiased" in (tmp_path / "t.md").read_text()
    assert len(pd.read_csv(tmp_path / "t.csv")) == 20


def test_cli_split_and_pretrained_run(tiny_clip, images_table, repo, tmp_path):
    import yaml

    from counterfactory.cli import main

    own = tmp_path / "social.yaml"
    own.write_text(yaml.safe_dump({"run_name": "t", "studies": ["social_counterfactuals"],
                                   # the paper config's Tables 4 / 5 evaluation needs Flickr30K, ImageNet, ...: off here
                                   # and §5.3's PATA / VisoGender probes of the debiased model likewise
                                   "social_counterfactuals": {"debias": {"task_eval": {"roles": []}},
                                                              "probing": {"pata": {"files_list": None},
                                                                          "visogender": {"image_dir": None}}},
                                   "models": {"clip_train": {"source": str(tiny_clip)}}}))
    config = ["--config", str(repo / "config" / "config.yaml"), "--config", str(own)]
    assert main(["social", "debias-split", *config, "--images", str(images_table), "--out-dir",
                 str(tmp_path / "split")]) == 0
    split = db.read_subjects(tmp_path / "split" / "subjects.csv")
    pd.testing.assert_frame_equal(split, db.split_subjects(SUBJECTS, 0.2, 0))       # the defaults of §5.1 / ours
    assert sorted(p.name for p in (tmp_path / "split").glob("*.parquet")) == ["physical_race.parquet",
                                                                              "race_gender.parquet"]
    assert main(["social", "debias-run", *config, "--role", "clip_train", "--segment", "physical_race",
                 "--test-subjects", str(tmp_path / "split" / "subjects.csv"), "--images", str(images_table),
                 "--seed", "1", "--data-seed", "2", "--out-dir", str(tmp_path / "pre"), "--no-train",
                 "--no-progress"]) == 0
    rows = pd.read_csv(tmp_path / "pre" / "metrics.csv")
    assert set(rows["metric"]) == {"maxskew_mean", "maxskew_median", "ndkl_mean", "ndkl_median"}   # no gender type
    assert set(rows["experiment"]) == {"clip_train:physical_race"} and set(rows["mixture"]) == {"pretrained"}


# ------------------------------------------------------------------ §5.3, Tables 4 and 5: task performance
def _task_eval(repo):
    demo = repo / "resources" / "demo"
    return {"roles": ["clip_train"],
            "retrieval": {"name": "flickr30k", "karpathy_json": str(demo / "cuts" / "dataset_coco_test.json"),
                          "image_root": str(demo / "coco2014"), "split": "test", "ks": [1, 5, 10]},
            "classification": {"templates": ["a photo of a {c}"], "topk": [1],
                               "datasets": {"CIFAR10": {"format": "cifar10",
                                                        "root": str(demo / "classification" / "cifar-10-batches-py"),
                                                        "trust_unofficial_pickle": True}}}}


def test_debias_run_adds_the_shared_task_evaluation_for_task_eval_roles(tiny_clip, images_table, repo, tmp_path):
    """§5.3: a run of a debias.task_eval role also reports the shared evaluation's retrieval R@K and zero-shot
    top-1 (the same numbers evaluate_retrieval / run_classification give); other roles do not."""
    from counterfactory.evaluation.classify import run_classification
    from counterfactory.evaluation.runs import evaluate_retrieval

    task = _task_eval(repo)
    cfg = {"device": "cpu", "models": {"clip_train": {"source": str(tiny_clip)}}, "debias": {"task_eval": task}}
    test = sorted(pd.read_parquet(images_table)["subject"].unique())[:1]
    rows = db.debias_run(cfg, "clip_train", "race_gender", None, test, images_table, 1, 2, tmp_path / "a", train=False)
    got = dict(zip(rows["metric"], rows["value"]))
    direct = evaluate_retrieval(cfg, "clip_train", task["retrieval"])
    for k in (1, 5, 10):
        for direction in ("image_to_text", "text_to_image"):
            assert got[f"flickr30k/{direction}@{k}"] == pytest.approx(direct[f"flickr30k/{direction}@{k}"])
    ccfg = {**cfg, "evaluation": {"classification": task["classification"]}}
    assert got["CIFAR10/top1"] == pytest.approx(run_classification(ccfg, "clip_train", "CIFAR10")["top1"])
    assert set(db.RUN_METRICS) <= set(got)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / "metrics.csv"), rows, check_dtype=False)

    cfg["debias"]["task_eval"] = {**task, "roles": ["alip"]}          # not an evaluated role: probe metrics only
    rows = db.debias_run(cfg, "clip_train", "race_gender", None, test, images_table, 1, 2, tmp_path / "b", train=False)
    assert set(rows["metric"]) == set(db.RUN_METRICS)


def _task_runs():
    rows = []

    def add(segment, mixture, seed, metric, value):
        rows.append({"experiment": f"clip_train:{segment}", "mixture": mixture, "seed": seed, "data_seed": seed + 1,
                     "metric": metric, "value": value})

    for segment in ("race_gender", "physical_gender", "physical_race"):   # the pre-trained model, once per segment
        add(segment, "pretrained", 0, "flickr30k/image_to_text@1", 67.1)
        add(segment, "pretrained", 0, "flickr30k/text_to_image@1", 69.4)
        add(segment, "pretrained", 0, "ImageNet/top1", 59.25)
        add(segment, "pretrained", 0, "maxskew_mean", 0.7)
    for seed, (tr, ir, top1) in enumerate([(69.0, 67.0, 55.0), (69.4, 67.6, 55.76)]):
        add("race_gender", "debiased", seed, "flickr30k/image_to_text@1", tr)
        add("race_gender", "debiased", seed, "flickr30k/text_to_image@1", ir)
        add("race_gender", "debiased", seed, "ImageNet/top1", top1)
    return pd.DataFrame(rows)


def test_task_tables_in_the_papers_layout():
    from counterfactory.render import Cell, render_latex, render_markdown
    from counterfactory.studies.social_counterfactuals import task_eval

    tables = task_eval.build_tables(_task_runs(), ["clip_train"], "flickr30k", ["ImageNet"], ks=[1],
                                    segments=["race_gender", "physical_gender", "physical_race"],
                                    labels={"clip_train": "CLIP"}, paper_segment="race_gender")
    assert list(tables) == ["table4:clip_train", "table5:clip_train"]
    t4, t5 = tables["table4:clip_train"], tables["table5:clip_train"]
    assert [(c.group, c.label) for c in t4.columns] == [("", "CLIP Model"), ("Text Retrieval", "R@1"),
                                                        ("Image Retrieval", "R@1")]
    assert [r[0] for r in t4.rows] == ["Pre-trained CLIP", "Debiased CLIP"]   # §5.3; segments without runs: no row
    pre, deb = t4.rows
    # the three segments' evaluations of the pre-trained model at seed 0 are one value, not three replicates
    assert (pre[1].mean, pre[2].mean, pre[1].n) == (pytest.approx(67.1), pytest.approx(69.4), 1)
    assert math.isnan(pre[1].std)
    more = pd.concat([_task_runs(), pd.DataFrame([
        {"experiment": f"clip_train:{seg}", "mixture": "pretrained", "seed": 1, "data_seed": 2,
         "metric": "flickr30k/image_to_text@1", "value": 67.5} for seg in ("race_gender", "physical_race")])])
    pre2 = task_eval.build_tables(more, ["clip_train"], "flickr30k", [], ks=[1])["table4:clip_train"].rows[0][1]
    assert (pre2.n, pre2.mean, pre2.std) == (2, pytest.approx(67.3), pytest.approx(0.2828, 1e-3))
    assert isinstance(deb[1], Cell) and deb[1].mean == pytest.approx(69.2) and deb[1].std == pytest.approx(0.2828, 1e-3)
    assert [c.label for c in t5.columns] == ["CLIP Model", "ImageNet"] and t5.rows[1][1].mean == pytest.approx(55.38)
    md = render_markdown(t4)
    assert "Text Retrieval R@1" in md and "| Debiased CLIP " in md and "69.20<sub>0.28</sub>" in md
    assert "Text Retrieval" in render_latex(t4) and "$69.20_{0.28}$" in render_latex(t4)
    frame = task_eval.tables_frame(tables)
    assert len(frame) == 2 * 2 + 2 * 1
    with pytest.raises(ConfigError, match="no 'CIFAR10/top1' rows"):
        task_eval.build_tables(_task_runs(), ["clip_train"], None, ["CIFAR10"])
    with pytest.raises(ConfigError, match="no runs of role 'alip'"):
        task_eval.build_tables(_task_runs(), ["alip"], "flickr30k", [])


def test_debiased_clip_is_the_race_gender_model_with_other_segments_as_extra_rows(repo):
    """Issue 42 item 3: §5.3 ("we conduct analyses of CLIP after debiasing for Race-Gender intersectional bias ... we
    hereafter refer to this model as Debiased CLIP"): Tables 4 and 5 show that model as "Debiased CLIP" (mean and std
    over seeds, each seed's value in the seeds frame); the other segments' models follow as extra rows."""
    from counterfactory.config import load_config
    from counterfactory.studies.social_counterfactuals import task_eval

    view = load_config([repo / "config" / "config.yaml"], study="social_counterfactuals")
    assert db.settings(view)["paper_segment"] == "race_gender"
    runs = pd.concat([_task_runs(), pd.DataFrame([
        {"experiment": "clip_train:physical_gender", "mixture": "debiased", "seed": s, "data_seed": s + 1,
         "metric": "flickr30k/image_to_text@1", "value": v} for s, v in ((0, 60.0), (1, 61.0))])])
    segments = ["physical_gender", "race_gender", "physical_race"]        # config order: the paper's row still first
    kw = dict(ks=[1], segments=segments, labels={"clip_train": "CLIP"}, paper_segment="race_gender")
    t4 = task_eval.build_tables(runs, ["clip_train"], "flickr30k", [], **kw)["table4:clip_train"]
    assert [r[0] for r in t4.rows] == ["Pre-trained CLIP", "Debiased CLIP", "Debiased CLIP (Physical Char., Gender)"]
    seeds = task_eval.seed_frame(runs, ["clip_train"], "flickr30k", [], **kw)
    deb = seeds[(seeds["row"] == "Debiased CLIP") & (seeds["column"] == "Text Retrieval R@1")]
    assert deb["seed"].tolist() == [0, 1] and deb["value"].mean() == pytest.approx(t4.rows[1][1].mean)
    assert set(seeds["row"]) == {r[0] for r in t4.rows}


def test_cli_task_table(repo, tmp_path):
    from counterfactory.cli import main

    runs = tmp_path / "runs.csv"
    _task_runs().to_csv(runs, index=False)
    rc = main(["social", "debias-task-table", "--config", str(repo / "config" / "config.yaml"), "--runs", str(runs),
               "--out-md", str(tmp_path / "t.md"), "--out-csv", str(tmp_path / "t.csv")])
    assert rc == 2          # a ConfigError: the paper config wants Flickr30K and four datasets; here only ImageNet
    own = tmp_path / "own.yaml"
    import yaml

    own.write_text(yaml.safe_dump({"models": {"clip_train": {"source": "x", "display_name": "CLIP"}},
                                   "social_counterfactuals": {"debias": {"task_eval": {
                                       "roles": ["clip_train"], "retrieval": None, "classification": {"datasets": {
                                           "ImageNet": {"format": "imagenet", "root": "x",
                                                        "class_names": "torchvision"}}}}}}}))
    rc = main(["social", "debias-task-table", "--config", str(repo / "config" / "demo.yaml"), "--config", str(own),
               "--runs", str(runs),
               "--out-md", str(tmp_path / "t.md"), "--out-csv", str(tmp_path / "t.csv")])
    assert rc == 0
    md = (tmp_path / "t.md").read_text()
    assert "Table 5." in md and "CLIP Model" in md and "Table 4." not in md   # CLIP: the role's display_name
    assert len(pd.read_csv(tmp_path / "t.csv")) == 2
