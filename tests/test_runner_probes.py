"""Probes of issue 31 on the runner, the CLI and the workflow's start-up that have no stage-specific home: a YAML
syntax error in a config file (#19), standalone steps that need NLTK data (#25). The shard contract (merges,
resume, threads, the shard lock: #12, #13, #15, #22) is in tests/test_shard_contract.py; output paths and a full
disk (#11, #21) in tests/test_cli_errors.py; overlays (#16) in tests/test_config.py; role paths (#20) in
tests/test_registry.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from counterfactory import cli
from counterfactory.errors import ConfigError

BROKEN = "run_name: x\nstudies: [a\n  b: 1\n"      # an unclosed flow sequence: the error is on line 3


def test_yaml_syntax_error_names_file_line_and_column(repo, tmp_path, capsys, monkeypatch):
    from counterfactory.config import check_yaml_syntax, read_yaml

    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    for check in (lambda: read_yaml(bad), lambda: check_yaml_syntax([bad])):
        with pytest.raises(ConfigError, match=rf"{bad}, line 3, column 4: not valid YAML") as err:
            check()
        assert "\n" not in str(err.value)
    monkeypatch.chdir(repo)                  # `config check` layers the files over ./config/config.yaml
    good = tmp_path / "good.yaml"
    good.write_text("run_name: fine\n")
    assert cli.main(["config", "check", str(good)]) == 0
    assert cli.main(["config", "check", str(good), str(bad)]) == 2
    assert f"{bad}, line 3" in capsys.readouterr().err


def test_snakefile_names_the_line_of_a_broken_config_yaml(repo, tmp_path):
    """#19: Snakemake's own message ("Config file is not valid JSON or YAML") names neither file nor line."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(BROKEN)
    run = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-s", str(repo / "Snakefile"), "-d", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "config/config.yaml, line 3, column 4: not valid YAML" in run.stderr + run.stdout


@pytest.fixture
def no_nltk_data(tmp_path, monkeypatch):
    """NLTK finds no data at all (a fresh checkout without `counterfactory nltk prepare`)."""
    import nltk

    from counterfactory.data import nltk_data as nd

    saved = list(nltk.data.path)
    nltk.data.path[:] = [str(tmp_path / "empty")]
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "empty"))
    nd._clear_nltk_caches()
    yield
    nltk.data.path[:] = saved
    nd._clear_nltk_caches()


def test_standalone_step_without_nltk_data_says_how_to_prepare_it(tmp_path, no_nltk_data, nltk_dir, capsys):
    """#25: `cvld swap-gender` on a fresh checkout ended in NLTK's multi-line LookupError."""
    caps = tmp_path / "caps.csv"
    caps.write_text("caption_id,caption\n1,A woman holding her dog.\n")     # 'her' needs the POS tagger
    argv = ["cvld", "swap-gender", "--captions", str(caps), "--out", str(tmp_path / "out.parquet")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "*****" not in err
    assert "averaged_perceptron_tagger" in err and "counterfactory nltk prepare --out" in err and "--nltk-data" in err
    assert not (tmp_path / "out.parquet").exists()
    assert cli.main([*argv, "--nltk-data", str(nltk_dir)]) == 0          # the option points the step at the data
    assert (tmp_path / "out.parquet").exists()
