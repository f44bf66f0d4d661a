"""Config: both shipped configs validate; mistakes fail at start-up naming the key; study views; job
configurations are content-addressed and hold only the sections a job declared."""

from __future__ import annotations

import pytest
import yaml

from counterfactory.config import (ConfigError, load_config, load_full_config, study_view, write_job_config)
from counterfactory.errors import ConfigError as _ConfigError

STUDY = "coco_counterfactuals"


@pytest.mark.parametrize("name", ["config.yaml", "demo.yaml"])
def test_shipped_configs_validate(repo, name):
    cfg = load_config([repo / "config" / name])
    assert cfg["study"] == STUDY
    assert cfg["captions"]["mlm_top_k"] == 10  # §3.1
    assert cfg["captions"]["similarity_low"] == 0.8 and cfg["captions"]["similarity_high"] == 0.91


def test_paper_config_cites_paper_models(repo):
    cfg = load_config([repo / "config" / "config.yaml"])
    assert cfg["models"]["mlm"]["source"] == "roberta-base"
    assert cfg["models"]["lm"]["source"] == "gpt2-large"
    assert cfg["models"]["sentence"]["source"].endswith("all-MiniLM-L6-v2")


def _write(tmp_path, data, name="c.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda c: c[STUDY]["captions"].update(mlm_top_k="ten"), f"{STUDY}.captions.mlm_top_k"),
        (lambda c: c[STUDY]["captions"].update(shard_size=0), f"{STUDY}.captions.shard_size"),
        (lambda c: c.update(devcie="cpu"), "devcie"),  # typo of a top-level key
        (lambda c: c["models"].pop("mlm"), "mlm"),
        (lambda c: c["models"]["lm"].update(sorce="x"), "sorce"),
        (lambda c: c.update(device="gpu"), "device"),
        (lambda c: c[STUDY]["captions"].update(similarity_high=1.5), "similarity_high"),
        (lambda c: c[STUDY]["captions"].update(similarity_low=0.95), "similarity_low (0.95) must be below"),
        (lambda c: c[STUDY]["images"].update(p_range=[0.9, 0.1]), "p_range"),
        (lambda c: c.update(studies=["no_such_study"]), "studies"),
        (lambda c: c[STUDY].update(captoins={}), "captoins"),
    ],
)
def test_config_failures_name_the_key(repo, tmp_path, mutate, needle):
    cfg = yaml.safe_load((repo / "config" / "demo.yaml").read_text())
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        load_config([_write(tmp_path, cfg)])
    assert needle in str(err.value)
    assert "Fix:" in str(err.value)
    assert len(str(err.value).splitlines()) < 15  # one short message, not a dump


def test_later_files_override_earlier(repo, tmp_path):
    override = _write(tmp_path, {STUDY: {"captions": {"shard_size": 7}}})
    cfg = load_config([repo / "config" / "demo.yaml", override])
    assert cfg["captions"]["shard_size"] == 7
    assert cfg["captions"]["mlm_top_k"] == 10  # merged, not replaced


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config([tmp_path / "nope.yaml"])
    assert ConfigError is _ConfigError


def test_view_has_shared_and_study_sections(repo):
    full = load_full_config([repo / "config" / "demo.yaml"])
    view = study_view(full, STUDY)
    assert view["models"] == full["models"] and view["images"] == full[STUDY]["images"]
    assert "studies" not in view and STUDY not in view


def test_job_config_is_content_addressed_and_partial(repo, tmp_path):
    full = load_full_config([repo / "config" / "demo.yaml"])
    keys = ["captions", "nltk", "models.mlm"]
    path = write_job_config(full, STUDY, keys, folder=tmp_path)
    assert write_job_config(full, STUDY, keys, folder=tmp_path) == path  # same settings, same file
    # an unrelated edit gives the same file; a relevant edit a new one, leaving the first untouched
    full[STUDY]["images"]["steps"] = 99
    assert write_job_config(full, STUDY, keys, folder=tmp_path) == path
    before = open(path).read()
    full[STUDY]["captions"]["similarity_low"] = 0.81
    other = write_job_config(full, STUDY, keys, folder=tmp_path)
    assert other != path and open(path).read() == before
    job = load_config([other])
    assert job["captions"]["similarity_low"] == 0.81
    assert set(job["models"]) == {"mlm"}
    with pytest.raises(ConfigError, match="not given the config section 'images'"):
        job["images"]
    with pytest.raises(ConfigError, match="not given the config section 'seed'"):
        job.get("seed", 0)


def test_job_config_cannot_be_merged(repo, tmp_path):
    full = load_full_config([repo / "config" / "demo.yaml"])
    path = write_job_config(full, STUDY, ["captions"], folder=tmp_path)
    with pytest.raises(ConfigError, match="cannot be merged"):
        load_config([path, repo / "config" / "demo.yaml"])
