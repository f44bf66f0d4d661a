"""Provenance tied to outputs: sizes and sha256 of files, fingerprints of folders, model roles by
content, the NLTK data in use; --verify finds every changed, new or missing output."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from counterfactory import provenance
from counterfactory.cli import main
from counterfactory.commands import provenance as provenance_cmd
from counterfactory.models import registry
from counterfactory.data import nltk_data as nd


@pytest.fixture(autouse=True)
def _hash_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COUNTERFACTORY_CACHE_DIR", str(tmp_path / "hash-cache"))
    monkeypatch.setattr(registry, "_LOADED", {})  # as in a fresh `counterfactory provenance` process


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A finished 'run': a results file, a shard folder, a local model and an NLTK data folder."""
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    (results / "shards" / "sub").mkdir(parents=True)
    (results / "table.csv").write_text("id,score\n1,0.5\n")
    (results / "shards" / "a.png").write_bytes(os.urandom(300))
    (results / "shards" / "sub" / "b.png").write_bytes(os.urandom(200))
    (results / "shards" / "job.log").write_text("logs are not outputs")
    model = tmp_path / "models" / "lm"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "toy"}')
    (model / "model.safetensors").write_bytes(os.urandom(512))
    nltk_dir = tmp_path / "nltk_data"
    for res, names in ((nd.PUNKT_RESOURCE, nd.PUNKT_FILES), (nd.TAGGER_RESOURCE, ("t.weights.json",))):
        (nltk_dir / res).mkdir(parents=True)
        for name in names:
            (nltk_dir / res / name).write_text(name)
    cfg = {"models": {"lm": {"source": str(model)}},
           "nltk": {"data_dir": str(nltk_dir), "source": "real"}}
    monkeypatch.setattr(provenance_cmd, "load_full_config", lambda paths: cfg)
    return tmp_path


def _write(*outputs: str) -> int:
    return main(["provenance", "--config", "unused.yaml", "--out", "results/provenance.json",
                 "--outputs", *outputs])


def test_outputs_models_and_nltk_are_recorded(run):
    assert _write("results/table.csv", "results/shards") == 0
    record = json.loads((run / "results/provenance.json").read_text())
    table, shards = record["outputs"]
    data = (run / "results/table.csv").read_bytes()
    assert table == {"path": "results/table.csv", "type": "file", "size": len(data),
                     "sha256": hashlib.sha256(data).hexdigest()}
    assert shards["type"] == "folder" and shards["files"] == 2 and shards["size"] == 500
    assert sorted(shards["file_sha256"]) == ["a.png", "sub/b.png"]  # the log is not an output
    assert shards["fingerprint"] == registry.fingerprint(run / "results/shards")
    lm = record["models"]["lm"]
    assert lm["fingerprint"] == registry.fingerprint(run / "models/lm") and len(lm["fingerprint"]) == 64
    assert record["nltk_data"]["mode"] == "external" and record["nltk_data"]["source"] == "real"
    assert record["nltk_data"]["resources"][nd.TAGGER_RESOURCE.rstrip("/")]["files"] == {
        "t.weights.json": hashlib.sha256(b"t.weights.json").hexdigest()}
    assert {"git", "packages", "config"} <= set(record)


def test_verify_round_trip(run, capsys):
    assert _write("results/table.csv", "results/shards", "results") == 0  # the record itself is never hashed
    assert main(["provenance", "--verify", "results/provenance.json"]) == 0
    assert "every recorded output matches" in capsys.readouterr().out
    assert provenance.verify(run / "results/provenance.json") == []

    (run / "results/shards/job.log").write_text("more logs")  # not an output: still fine
    assert provenance.verify(run / "results/provenance.json") == []

    (run / "results/shards/sub/b.png").write_bytes(os.urandom(200))
    (run / "results/shards/new.png").write_bytes(b"x")
    (run / "results/table.csv").unlink()
    assert main(["provenance", "--verify", "results/provenance.json"]) == 2
    captured = capsys.readouterr()
    assert "MISMATCH results/table.csv: missing" in captured.out
    assert "MISMATCH results/shards/sub/b.png: sha256" in captured.out
    assert "MISMATCH results/shards/new.png: not in the provenance record" in captured.out
    assert "differ from the provenance record" in captured.err
    problems = {p["path"] for p in provenance.verify(run / "results/provenance.json")}
    assert problems == {"results/table.csv", "results/shards/sub/b.png", "results/shards/new.png"}


def test_verify_from_another_folder(run, tmp_path, monkeypatch):
    assert _write("results/table.csv") == 0
    monkeypatch.chdir(tmp_path / "models")
    assert provenance.verify(run / "results/provenance.json") == [{"path": "results/table.csv", "problem": "missing"}]
    assert provenance.verify(run / "results/provenance.json", base=run) == []


def test_missing_output_is_an_error(run, capsys):
    assert _write("results/absent.csv") == 2
    assert "results/absent.csv does not exist" in capsys.readouterr().err


def test_model_that_cannot_be_identified_stops_provenance(run, capsys):
    (run / "models/lm/model.safetensors").unlink()
    (run / "models/lm/config.json").unlink()
    assert _write("results/table.csv") == 2
    err = capsys.readouterr().err
    assert "role 'lm'" in err and "Fix:" in err


def test_verify_needs_a_provenance_file(tmp_path):
    (tmp_path / "p.json").write_text("{broken")
    with pytest.raises(Exception, match="not a readable provenance JSON"):
        provenance.verify(tmp_path / "p.json")
    assert Path(tmp_path / "p.json").exists()


def test_thread_count_is_recorded(run, monkeypatch):
    """issue 31, #15: the thread count changes pixels by kernel rounding and was recorded nowhere."""
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert _write("results/table.csv") == 0
    finally:
        torch.set_num_threads(before)
    threads = json.loads((run / "results/provenance.json").read_text())["threads"]
    assert threads["torch"] == 2 and threads["environment"]["OMP_NUM_THREADS"] == "3"
    assert threads["cpu_count"] == os.cpu_count()


def test_folders_are_recorded_whole_less_the_skipped_paths(run, capsys):
    """Issue 45 item 18: the workflow records each study folder whole (--folders), less what is made from the record
    or changes run to run (--skip: a file, or a folder ending /); verify skips the same paths, and only those."""
    (run / "results/shards/timings").mkdir()
    (run / "results/shards/timings/a.tsv").write_text("s\n1.0\n")
    (run / "results/shards/README.md").write_text("card")
    assert main(["provenance", "--config", "unused.yaml", "--out", "results/provenance.json",
                 "--folders", "results/shards", "--skip", "timings/", "README.md"]) == 0
    entry = json.loads((run / "results/provenance.json").read_text())["outputs"][0]
    assert set(entry["file_sha256"]) == {"a.png", "sub/b.png"} and entry["skipped"] == ["README.md", "timings/"]
    (run / "results/shards/timings/a.tsv").write_text("s\n2.0\n")   # a skipped file may change ...
    (run / "results/shards/README.md").write_text("a new card")
    (run / "results/shards/timings/b.tsv").write_text("s\n")        # ... or appear
    assert provenance.verify(run / "results/provenance.json") == []
    (run / "results/shards/README.md.bak").write_text("x")          # a prefix of a skipped file is not skipped
    (run / "results/shards/timingsX.tsv").write_text("x")
    problems = {p["path"] for p in provenance.verify(run / "results/provenance.json")}
    assert problems == {"results/shards/README.md.bak", "results/shards/timingsX.tsv"}
