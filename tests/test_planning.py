"""The paper-scale plan (counterfactory.planning, `counterfactory plan`): UNet-evaluation formulas against hand counts
from config/demo.yaml's numbers, GPU-hours and disk arithmetic, throughput choice, Job-stats parsing, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from counterfactory import planning
from counterfactory.cli import main
from counterfactory.config import load_full_config

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "config" / "demo.yaml"
#: demo items that only earlier outputs know (the demo run had 47 caption pairs, 7 GLIGEN generations, 4 inpaintings,
#: 4 COCO and 8 CelebA edit requests, 8 COCO inpainting requests)
DEMO_ITEMS = {"coco_counterfactuals.p2p_pairs": 47, "countercurate.gligen_generate": 7,
              "countercurate.gligen_inpaint": 4, "countercurate.t2i": 0, "spurious_retrieval.coco": 8,
              "cvld.ip2p_coco": 4, "cvld.null_text_coco": 4, "cvld.ip2p_celeba": 8, "cvld.null_text_celeba": 8}
TP = {"path": "test.json", "device": "Test GPU", "placeholder": False,
      "rows": [{"stage": "p2p_pairs", "device": "Test GPU", "precision": "fp32", "batch_size": 8, "unet_evals_per_s": 160},
               {"stage": "p2p-pairs", "device": "Test GPU", "precision": "fp32", "batch_size": 1,
                "unet_evals_per_s": 999, "mode": "one-item loop"},
               {"stage": "P2P sets", "precision": "fp32", "unet_evals_per_s": 52},
               {"stage": "lama_inpaint", "precision": "fp32", "images_per_s": 4}]}


@pytest.fixture(scope="module")
def demo_plan(tmp_path_factory):
    cfg = load_full_config([DEMO])
    import os

    cwd = os.getcwd()
    os.chdir(REPO)   # the demo config's data paths are relative to the checkout
    try:
        return planning.plan(cfg, TP, items=DEMO_ITEMS, results_root=tmp_path_factory.mktemp("empty")).set_index(
            ["study", "stage"])
    finally:
        os.chdir(cwd)


def test_unet_evals_match_hand_counts_from_demo_config(demo_plan):
    p = demo_plan
    # COCO-CF: 2 CFG rows x 2 prompts x 8 candidates x 5 steps = 160 per pair; 47 pairs (the demo summary: 7,520)
    coco = p.loc[("coco_counterfactuals", "p2p_pairs")]
    assert coco["unet_evals_per_item"] == 160 and coco["unet_evals"] == 7520
    assert coco["images"] == 94 and coco["jobs"] == 2      # top-1 pair kept; 2 image jobs of 30 captions
    # Social: 2 prefixes x 2 subjects x 3 segments = 12 sets; 2 x 2 x (12 + 10 + 30) = 208 captions;
    # 2 CFG x 208 captions x 2 candidates x 3 steps = 2,496 (the demo summary's unet_evals); 416 images; 12 / 6 = 2 jobs
    social = p.loc[("social_counterfactuals", "p2p_sets")]
    assert (social["items"], social["unet_evals"], social["images"], social["jobs"]) == (12, 2496, 416, 2)
    # CounterCurate: 3 steps x 2 (guidance 7.5 > 1) per request
    assert p.loc[("countercurate", "gligen_generate"), "unet_evals"] == 7 * 6
    assert p.loc[("countercurate", "gligen_inpaint"), "unet_evals"] == 4 * 6
    # CVLD: ip2p 3 rows x m 3 x 2 steps = 18; null-text 3 inversion steps x (1 + 2 + 2 inner + 4 x 3) = 51; k = 2 kept
    assert p.loc[("cvld", "ip2p_coco"), "unet_evals_per_item"] == 18
    assert p.loc[("cvld", "null_text_celeba"), "unet_evals"] == 8 * 51
    assert p.loc[("cvld", "ip2p_celeba"), "images"] == 16
    # spurious: LaMa has no UNet; one image per item per method, the padding on the CPU
    lama = p.loc[("spurious_retrieval", "lama_coco")]
    assert pd.isna(lama["unet_evals"]) and lama["images"] == 8
    assert p.loc[("spurious_retrieval", "padding_coco"), "gpu_hours"] == 0.0


def test_gpu_hours_and_throughput_choice(demo_plan):
    coco = demo_plan.loc[("coco_counterfactuals", "p2p_pairs")]
    # the batched fp32 row (160/s), not the faster one-item loop row
    assert coco["rate"] == 160 and coco["gpu_hours"] == pytest.approx(7520 / 160 / 3600)
    assert demo_plan.loc[("social_counterfactuals", "p2p_sets"), "rate"] == 52   # "P2P sets" matches p2p_sets
    assert demo_plan.loc[("spurious_retrieval", "lama_coco"), "gpu_hours"] == pytest.approx(8 / 4 / 3600)
    assert pd.isna(demo_plan.loc[("cvld", "ip2p_coco"), "gpu_hours"])    # no rate for it: unknown, not zero
    assert planning.gpu_hours(720_000, 100) == 2.0 and planning.gpu_hours(None, 100) is None
    rows = [{"stage": "x", "precision": "fp16", "unet_evals_per_s": 300}, {"stage": "x", "precision": "fp32",
                                                                          "unet_evals_per_s": 100}]
    assert planning.pick_rate(rows, "x", "unet_evals_per_s", "fp32")[0] == 100
    assert planning.pick_rate(rows, "x", "unet_evals_per_s", "auto")[0] == 300
    # a measured row wins over a (faster) estimated one; an estimate alone is used and says so
    est = {"stage": "x", "precision": "fp32", "unet_evals_per_s": 900, "estimate": "derived from y"}
    assert planning.pick_rate(rows + [est], "x", "unet_evals_per_s", "fp32")[0] == 100
    assert planning.pick_rate([est], "x", "unet_evals_per_s", "fp32") == (900, est)


def test_estimated_rates_are_marked_and_counted_apart(tmp_path):
    """The packaged H100 file's t2i and null-text rows are estimates: the plan uses them, marks rate and
    GPU-hours with ≈, prints how each was derived and totals them apart; measured rows carry no mark."""
    tp = planning.load_throughput(None)
    assert {r["stage"] for r in tp["rows"] if r.get("estimate") and not r.get("compile")} == {"t2i", "null_text_edit"}
    cfg = load_full_config([REPO / "config" / "config.yaml"])
    frame = planning.plan(cfg, tp, items={"countercurate.t2i": 360}, results_root=tmp_path)
    p = frame.set_index(["study", "stage"])
    t2i = p.loc[("countercurate", "t2i")]
    assert t2i["rate_estimate"] and t2i["gpu_hours"] == pytest.approx(360 * 100 / t2i["rate"] / 3600)
    assert p.loc[("cvld", "null_text_coco"), "rate_estimate"] and not p.loc[("cvld", "ip2p_coco"), "rate_estimate"]
    text = planning.to_markdown(frame, tp)
    assert "| t2i | 360 | 100 | 36,000 |" in text and "≈ t2i: estimated rate, not measured on the H100: " in text
    assert "≈ 35.6 evals/s" in text and "at estimated rates)" in text
    assert "| p2p_pairs |" in text and "≈ 299.4" not in text


def test_disk_arithmetic(demo_plan):
    assert planning.disk_bytes(10, 512, 512) == round(10 * 512 * 512 * 1.45) == 3_801_088
    assert demo_plan.loc[("coco_counterfactuals", "p2p_pairs"), "disk_bytes"] == round(94 * 64 * 64 * 1.45)


def test_paper_config_counts_and_items_from_earlier_outputs(tmp_path):
    cfg = load_full_config([REPO / "config" / "config.yaml"])
    p = planning.plan(cfg, TP, results_root=tmp_path).set_index(["study", "stage"])
    coco = p.loc[("coco_counterfactuals", "p2p_pairs")]
    # §3.3: 24,508 pairs x (2 x 2 x 100 candidates x 100 steps); 25,014 captions in jobs of 50 -> 501
    assert coco["unet_evals"] == 24508 * 40000 and coco["jobs"] == 501
    # §3.2, §8.4: the released pre-filter list as published (261 entries, repeats included) x 4 prefixes x 4
    # segments (Table 1's 12 + 10 + 30 captions a set and §10.2's 60) = 4,176 sets
    social = p.loc[("social_counterfactuals", "p2p_sets")]
    assert social["unet_evals"] == 2 * 261 * 4 * (52 + 60) * 100 * 100 and social["jobs"] == 418
    # CounterCurate t2i before the LLM ran: 3 kinds x the first caption of 31,783 Flickr30k Entities images
    assert p.loc[("countercurate", "t2i"), "items"] == 3 * 31783
    assert p.loc[("countercurate", "t2i"), "items_source"].startswith("upper bound")
    assert pd.isna(p.loc[("countercurate", "gligen_generate"), "items"])
    # an earlier run's input table gives the exact count
    table = tmp_path / "results" / "paper" / "coco_counterfactuals" / "captions" / "counterfactual_captions.parquet"
    table.parent.mkdir(parents=True)
    pd.DataFrame({"caption_id": ["a", "b", "c"]}).to_parquet(table)
    p = planning.plan(cfg, TP, results_root=tmp_path).set_index(["study", "stage"])
    assert p.loc[("coco_counterfactuals", "p2p_pairs"), "items"] == 3
    assert p.loc[("coco_counterfactuals", "p2p_pairs"), "items_source"] == str(table)


def test_a_small_configured_dataset_caps_the_paper_counts(tmp_path, monkeypatch):
    """Before any step ran, a stage whose data are in place is planned at what those data can give at most, not at
    the paper's size (the true-size smoke run's preflight asked for 43 GB for the demo fixtures): a pair per COCO
    caption, a spurious / CVLD image per Karpathy training image (train + restval). Without the files: the paper."""
    monkeypatch.chdir(REPO)
    cfg = load_full_config([DEMO])

    def train_images(path):
        return sum(img["split"] in ("train", "restval") for img in json.loads((REPO / path).read_text())["images"])

    captions = len(json.loads((REPO / "resources/demo/coco2017/annotations/captions_val2017.json").read_text())["annotations"])
    p = planning.plan(cfg, TP, results_root=tmp_path).set_index(["study", "stage"])
    coco = p.loc[("coco_counterfactuals", "p2p_pairs")]
    assert coco["items"] == captions < 24508 and coco["items_source"].startswith("upper bound")
    assert coco["unet_evals"] == captions * coco["unet_evals_per_item"]
    odmap = train_images(cfg["spurious_retrieval"]["data"]["coco"]["karpathy_json"])
    assert p.loc[("spurious_retrieval", "lama_coco"), "items"] == odmap < 45467
    karpathy = REPO / cfg["spurious_retrieval"]["data"]["coco"]["karpathy_json"]
    assert planning._karpathy_images(karpathy, ("restval", "train")) == odmap      # any order of the split names
    assert planning._karpathy_images(karpathy, ("test",)) == sum(
        img["split"] == "test" for img in json.loads(karpathy.read_text())["images"])
    assert p.loc[("spurious_retrieval", "lama_coco"), "disk_bytes"] == planning.disk_bytes(odmap, 480, 640)
    cvld = train_images(cfg["cvld"]["data"]["coco"]["karpathy_json"])
    subset = max(cfg["cvld"]["data"]["subsets"])
    assert p.loc[("cvld", "ip2p_coco"), "items"] == round(subset * cvld)
    # the same config with its files moved away: the paper's counts
    cfg["spurious_retrieval"]["data"]["coco"]["karpathy_json"] = str(tmp_path / "absent.json")
    cfg["cvld"]["data"]["coco"]["karpathy_json"] = str(tmp_path / "absent.json")
    p = planning.plan(cfg, TP, results_root=tmp_path).set_index(["study", "stage"])
    assert p.loc[("spurious_retrieval", "lama_coco"), "items"] == 45467
    assert p.loc[("cvld", "ip2p_coco"), "items"] == round(subset * planning.KARPATHY_COCO_TRAIN)


def test_job_stats_parsing():
    out = "Building DAG of jobs...\nJob stats:\njob              count\n-------------  -------\nall  1\n" \
          "images_generate  501\ncountercurate_generate  12\nsocial_generate  188\nmodels_build_tiny  1\n" \
          "total  705\n\nThis was a dry-run."
    counts = planning.job_counts(out)
    assert counts["images_generate"] == 501 and counts["total"] == 705
    assert planning.jobs_by_study(counts) == {"shared": 2, "coco_counterfactuals": 501, "countercurate": 12,
                                              "social_counterfactuals": 188}


def test_rule_study_reads_the_study_short_name():
    """Own rules start with the study's short name; a shared stage's rule run for one study ends with it."""
    assert planning.rule_study("spurious_run") == planning.rule_study("train_collect_spurious") == "spurious_retrieval"
    assert planning.rule_study("stats_table_countercurate_vlm") == planning.rule_study("data_flickr30k_captions") \
        == "countercurate"
    assert planning.rule_study("images_adaptive_curve_social") == "social_counterfactuals"
    assert planning.rule_study("train_collect_cvld") == planning.rule_study("cvld_run") == "cvld"
    assert planning.rule_study("train_run_in_domain") == planning.rule_study("images_generate") \
        == "coco_counterfactuals"
    assert planning.rule_study("nltk_prepare") == "shared"


def test_cli_prints_tables_and_writes_csv(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    tp = tmp_path / "tp.json"
    tp.write_text(json.dumps(TP["rows"]))
    out_csv, out_md = tmp_path / "plan.csv", tmp_path / "plan.md"
    args = ["plan", "--config", str(DEMO), "--throughput", str(tp), "--results-root", str(tmp_path),
            "--out-csv", str(out_csv), "--out-md", str(out_md)]
    for key, n in DEMO_ITEMS.items():
        args += ["--items", f"{key}={n}"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert f"Throughput: {tp} — device Test GPU" in text and "PLACEHOLDER" not in text
    for study in ("coco_counterfactuals", "social_counterfactuals", "countercurate", "spurious_retrieval", "cvld"):
        assert f"### {study}" in text
    assert "| p2p_pairs | 47 | 160 | 7,520 | 94 |" in text and "**Total**" in text
    assert out_md.read_text() == text
    assert len(pd.read_csv(out_csv)) == 12   # demo: spurious_retrieval on MS-COCO only (lama, zero, captioner)
    # the packaged default is the H100 measurement; its rate for the P2P pairs is the measured one
    assert main(["plan", "--config", str(DEMO), "--results-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3 (measured)" in out and "PLACEHOLDER" not in out and "299.4 evals/s" in out
    # a stage that does not exist is refused with the list of stages
    assert main(["plan", "--config", str(DEMO), "--items", "cvld.nope=3"]) == 2
    assert "cvld.ip2p_coco" in capsys.readouterr().err


def test_compiled_rates_only_when_the_config_compiles(tmp_path):
    """``compile: true`` rows (the measured torch.compile speed-up) are the rates of a config with
    ``performance.compile: true`` and never of one without; a stage with no compiled row keeps its eager rate."""
    rows = [{"stage": "x", "precision": "bf16", "unet_evals_per_s": 300},
            {"stage": "x", "precision": "bf16", "unet_evals_per_s": 420, "compile": True, "estimate": "300 x 1.4"},
            {"stage": "y", "precision": "bf16", "unet_evals_per_s": 100}]
    assert planning.pick_rate(rows, "x", "unet_evals_per_s", "bf16")[0] == 300
    assert planning.pick_rate(rows, "x", "unet_evals_per_s", "bf16", compiled=True)[0] == 420
    assert planning.pick_rate(rows, "y", "unet_evals_per_s", "bf16", compiled=True)[0] == 100
    cfg = load_full_config([REPO / "config" / "config.yaml"])
    tp = planning.load_throughput(None)
    eager = planning.plan(cfg, tp, results_root=tmp_path).set_index(["study", "stage"])
    cfg["performance"] = {**cfg.get("performance", {}), "compile": True}
    fast = planning.plan(cfg, tp, results_root=tmp_path).set_index(["study", "stage"])
    pairs, edit = ("coco_counterfactuals", "p2p_pairs"), ("cvld", "ip2p_coco")
    for key in (pairs, edit):
        assert fast.loc[key, "rate"] > 1.25 * eager.loc[key, "rate"] and fast.loc[key, "rate_estimate"]
        assert fast.loc[key, "throughput_row"].endswith("compiled")
        assert not eager.loc[key, "rate_estimate"] and not eager.loc[key, "throughput_row"].endswith("compiled")
    sets = ("social_counterfactuals", "p2p_sets")          # not measured compiled: its eager rate in both
    assert fast.loc[sets, "rate"] == eager.loc[sets, "rate"]
