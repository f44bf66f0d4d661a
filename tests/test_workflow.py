"""Workflow tests: Snakemake runs the demo caption stage offline; the paper config dry-runs against a
fake COCO root of the right shape; the rule graph renders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.workflow

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def snakemake(repo: Path, workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    cmd = [SNAKEMAKE, "--snakefile", str(repo / "Snakefile"), "--directory", str(workdir), "--cores", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def demo_override(repo: Path, workdir: Path, **extra) -> Path:
    """demo.yaml with the demo data read from the checkout and everything else built in ``workdir``."""
    cfg = yaml.safe_load((repo / "config" / "demo.yaml").read_text())
    cfg["data"]["coco_root"] = str(repo / "resources" / "demo")
    cfg["data"]["karpathy_json"] = str(repo / "resources" / "demo" / "karpathy" / "dataset_coco.json")
    for key, value in extra.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path = workdir / "demo-test.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def demo_captions(repo, tmp_path_factory):
    work = tmp_path_factory.mktemp("wf")
    cfgfile = demo_override(repo, work)
    target = "results/demo/captions/counterfactual_captions.parquet"
    proc = snakemake(repo, work, target, "--configfile", str(cfgfile))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work


def test_demo_caption_stage_end_to_end(demo_captions):
    import nltk

    from counterfactory.text.nltk_data import ensure_nltk_data

    work = demo_captions
    merged = pd.read_parquet(work / "results/demo/captions/counterfactual_captions.parquet")
    table = pd.read_parquet(work / "results/demo/data/captions.parquet")
    assert len(merged) > 0
    assert set(merged["caption_id"]) <= set(table["caption_id"])
    assert merged["caption_id"].is_unique  # one counterfactual per original caption
    ensure_nltk_data(work / "resources/nltk_data")
    for row in merged.itertuples():
        a, b = nltk.word_tokenize(row.original), nltk.word_tokenize(row.counterfactual)
        assert len(a) == len(b)
        diffs = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        assert diffs == [row.position], (row.original, row.counterfactual)
        assert b[row.position] == row.new_word and a[row.position] == row.original_word
        assert nltk.pos_tag(b)[row.position][1] in ("NN", "NNS", "NNP")
        assert 0.8 < row.similarity <= 0.91
    jsonl = (work / "results/demo/captions/coco_counterfactuals_captions.jsonl").read_text().splitlines()
    assert len(jsonl) == len(merged)
    assert set(json.loads(jsonl[0])) == {"coco-counterfactual-index", "original_caption", "counterfactual_caption"}


def test_demo_shards_are_complete_and_summarised(demo_captions):
    import math

    work = demo_captions
    n = len(pd.read_parquet(work / "results/demo/data/captions.parquet"))
    shards = sorted((work / "results/demo/captions/shards").glob("*.parquet"))
    assert len(shards) == math.ceil(n / 20)  # demo shard_size
    total = 0
    for shard in shards:
        summary = json.loads((work / "results/demo/captions/summary" / f"{shard.stem}.json").read_text())
        total += summary["counts"]["captions"]
        assert summary["provenance"]["models"]["mlm"]["source"].endswith("mlm")
        rejected = pd.read_parquet(work / "results/demo/captions/rejected" / shard.name)
        assert set(rejected["reason"]) <= set(summary["counts"]["rejected_by_reason"])
    assert total == n
    logs = list((work / "results/demo/logs/captions").glob("*.log"))
    assert len(logs) == len(shards)


def test_paper_config_dry_run_against_fake_coco_root(repo, tmp_path):
    """`snakemake -n all` under config/config.yaml builds the DAG for a COCO root of the right shape."""
    root = tmp_path / "coco"
    (root / "annotations").mkdir(parents=True)
    (root / "val2017").mkdir()
    images, anns = [], []
    for i in range(1, 31):
        images.append({"id": i, "file_name": f"{i:012d}.jpg", "width": 64, "height": 64, "license": 1,
                       "coco_url": "", "flickr_url": "", "date_captured": ""})
        (root / "val2017" / f"{i:012d}.jpg").write_bytes(b"")
        for k in range(5 + (i % 2)):
            anns.append({"id": 100 * i + k, "image_id": i, "caption": f"A dog number {k} on a table."})
    doc = {"info": {}, "licenses": [], "images": images, "annotations": anns}
    (root / "annotations" / "captions_val2017.json").write_text(json.dumps(doc))
    (root / "annotations" / "instances_val2017.json").write_text(
        json.dumps({**doc, "annotations": [], "categories": [{"id": 18, "name": "dog", "supercategory": "animal"}]}))
    override = tmp_path / "paper-test.yaml"
    override.write_text(yaml.safe_dump({"data": {"coco_root": str(root)}, "captions": {"shard_size": 40}}))
    proc = snakemake(repo, tmp_path, "-n", "all", "--configfile", str(repo / "config" / "config.yaml"),
                     str(override), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    # one caption job per shard of 40 captions (165 captions -> 5 jobs), never one per caption
    assert out.count("rule caption_shard:") == 5
    assert "rule caption_merge:" in out
    assert out.count("rule train_run:") == 25 * 4  # B.3.2: 25 seeds x 4 mixtures


def test_rulegraph_renders(repo, tmp_path):
    proc = snakemake(repo, tmp_path, "--rulegraph", "--configfile", str(demo_override(repo, tmp_path)), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.lstrip().startswith("digraph")
    for rule in ("caption_shard", "caption_merge", "caption_table", "coco_check", "nltk_data", "tiny_model"):
        assert rule in proc.stdout


def test_lint_is_clean(repo, tmp_path):
    proc = snakemake(repo, tmp_path, "--lint", "--configfile", str(demo_override(repo, tmp_path)), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
