"""What the Snakefile computes while it plans (counterfactory.workflow): nothing written, missing data named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from counterfactory import workflow as wf
from counterfactory.config import ConfigError, load_full_config, write_job_config

STUDY = "coco_counterfactuals"


@pytest.fixture(scope="module")
def demo(repo):
    return load_full_config([repo / "config" / "config.yaml", repo / "config" / "demo.yaml"])


def test_planning_a_job_configuration_writes_nothing(demo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, text = wf.job_config_file(demo, STUDY, ["captions", "models.mlm"])
    run_path, run_text = wf.run_config_file(demo)
    assert list(tmp_path.iterdir()) == []
    assert path.startswith(".snakemake/counterfactory/jobs/") and run_path.startswith(".snakemake/counterfactory/runs/")
    # the planned text is what the job reads: the same file write_job_config writes
    assert Path(write_job_config(demo, STUDY, ["captions", "models.mlm"])).read_text(encoding="utf-8") == text
    assert Path(write_job_config(demo, STUDY, ["captions", "models.mlm"])) == Path(path)
    assert yaml.safe_load(run_text) == yaml.safe_load(yaml.safe_dump(dict(demo), sort_keys=True))


def test_write_job_command_writes_the_planned_text_and_refuses_other_yaml(demo, tmp_path):
    path, text = wf.job_config_file(demo, STUDY, ["captions"])
    cli = Path(sys.executable).with_name("counterfactory")
    out = tmp_path / "jobs" / "x.yaml"
    proc = subprocess.run([str(cli), "config", "write-job", "--text", text, "--out", str(out)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8") == text
    bad = subprocess.run([str(cli), "config", "write-job", "--text", "- a list", "--out", str(tmp_path / "y.yaml")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "must be a mapping" in bad.stderr and not (tmp_path / "y.yaml").exists()


def test_missing_captions_stop_the_planning_naming_the_key(demo, tmp_path):
    """The caption and image stages are sharded by the number of captions: without the captions the plan stops
    naming the file and its config key (it used to plan one shard and warn)."""
    view = wf.view({**dict(demo), STUDY: {**demo[STUDY], "data": {**demo[STUDY]["data"],
                                                                  "coco_root": str(tmp_path / "no-coco")}}}, STUDY)
    with pytest.raises(ConfigError, match=r"not found \(config key coco_counterfactuals\.data\.coco_root\)"):
        wf.caption_count(view)


def test_unreadable_own_source_stops_the_planning_naming_the_key(demo, tmp_path):
    source = {"kind": "table", "path": str(tmp_path / "nope.csv")}
    view = wf.view({**dict(demo), STUDY: {**demo[STUDY], "data": {**demo[STUDY]["data"], "source": source}}}, STUDY)
    with pytest.raises(ConfigError, match=r"coco_counterfactuals\.data\.source cannot be read.*own-check"):
        wf.caption_count(view)


def test_demo_captions_are_counted(repo, demo, monkeypatch):
    monkeypatch.chdir(repo)
    assert wf.caption_count(wf.view(demo, STUDY)) > 0
