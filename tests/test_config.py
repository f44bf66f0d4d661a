"""Config schema: both shipped configs validate; mistakes fail at start-up naming the key."""

from __future__ import annotations

import pytest
import yaml

from counterfactory.config import load_config
from counterfactory.errors import ConfigError


@pytest.mark.parametrize("name", ["config.yaml", "demo.yaml"])
def test_shipped_configs_validate(repo, name):
    cfg = load_config([repo / "config" / name])
    assert cfg["captions"]["mlm_top_k"] == 10  # §3.1
    assert cfg["captions"]["similarity_low"] == 0.8 and cfg["captions"]["similarity_high"] == 0.91


def test_paper_config_cites_paper_models(repo):
    cfg = load_config([repo / "config" / "config.yaml"])
    assert cfg["models"]["mlm"]["source"] == "roberta-base"
    assert cfg["models"]["lm"]["source"] == "gpt2-large"
    assert cfg["models"]["sentence"]["source"].endswith("all-MiniLM-L6-v2")


def _write(tmp_path, data):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda c: c["captions"].update(mlm_top_k="ten"), "captions.mlm_top_k"),
        (lambda c: c["captions"].update(shard_size=0), "captions.shard_size"),
        (lambda c: c.update(devcie="cpu"), "devcie"),  # typo of a top-level key
        (lambda c: c["models"].pop("mlm"), "mlm"),
        (lambda c: c["models"]["lm"].update(sorce="x"), "sorce"),
        (lambda c: c.update(device="gpu"), "device"),
    ],
)
def test_schema_failures_name_the_key(repo, tmp_path, mutate, needle):
    cfg = yaml.safe_load((repo / "config" / "demo.yaml").read_text())
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        load_config([_write(tmp_path, cfg)])
    assert needle in str(err.value)
    assert "Fix:" in str(err.value)


def test_later_files_override_earlier(repo, tmp_path):
    override = _write(tmp_path, {"captions": {"shard_size": 7}})
    cfg = load_config([repo / "config" / "demo.yaml", override])
    assert cfg["captions"]["shard_size"] == 7
    assert cfg["captions"]["mlm_top_k"] == 10  # merged, not replaced


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config([tmp_path / "nope.yaml"])
