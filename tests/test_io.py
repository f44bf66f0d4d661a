"""Atomic writers: nothing half-written survives a failure."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from counterfactory.io import (atomic_dir, atomic_path, current_umask, follow_umask, remove_stale_temporaries,
                               write_json)


def test_atomic_dir_replaces_only_on_success(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("1")
    assert (target / "a.txt").read_text() == "1"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "b.txt").write_text("half")
            raise RuntimeError("killed")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]  # the old folder is untouched
    with atomic_dir(target) as tmp:
        (tmp / "c.txt").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["c.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folders left behind


def test_atomic_file_write_leaves_target_on_error(tmp_path):
    target = tmp_path / "x.json"
    write_json(target, {"a": 1})
    with pytest.raises(TypeError):
        write_json(target, {"a": object()})
    assert target.read_text().strip() == '{\n  "a": 1\n}'
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


@pytest.fixture(params=[0o002, 0o022, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_permissions_follow_the_umask(tmp_path, umask):
    plain_file, plain_dir = tmp_path / "plain.txt", tmp_path / "plain"
    plain_file.write_text("x")
    plain_dir.mkdir()
    write_json(tmp_path / "a.json", {"a": 1})
    with atomic_path(tmp_path / "b.bin") as tmp:
        tmp.write_bytes(b"1")
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "f.txt").write_text("1")
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(tmp_path / "a.json") == mode(tmp_path / "b.bin") == mode(plain_file) == 0o666 & ~umask
    assert mode(tmp_path / "d") == mode(plain_dir) == 0o777 & ~umask
    assert current_umask() == umask


def test_library_written_weights_follow_the_umask(tmp_path, umask):
    """safetensors (hence every ``save_pretrained``) writes through its own 0600 temporary file: the atomic
    writers and :func:`follow_umask` (fine-tuning checkpoints) give the weights the umask's mode."""
    import numpy as np
    from safetensors.numpy import save_file

    weights = {"w": np.zeros(4, dtype=np.float32)}
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    save_file(weights, str(tmp_path / "raw.safetensors"))
    raw = mode(tmp_path / "raw.safetensors")  # what the library itself leaves (0600 with safetensors 0.8)
    with atomic_dir(tmp_path / "model") as tmp:
        save_file(weights, str(tmp / "model.safetensors"))
        (tmp / "run.sh").write_text("#!/bin/sh\n")
        (tmp / "run.sh").chmod(0o700)
    with atomic_path(tmp_path / "prompts.safetensors") as tmp:
        save_file(weights, str(tmp))
    (tmp_path / "ckpt").mkdir()
    save_file(weights, str(tmp_path / "ckpt" / "model.safetensors"))
    follow_umask(tmp_path / "ckpt")
    assert mode(tmp_path / "model" / "model.safetensors") == 0o666 & ~umask
    assert mode(tmp_path / "prompts.safetensors") == mode(tmp_path / "ckpt" / "model.safetensors") == 0o666 & ~umask
    assert mode(tmp_path / "model" / "run.sh") == 0o777 & ~umask  # an executable stays executable
    if umask == 0o022:
        assert raw == 0o600  # the cause: without the fix the weights above would be 0600 too


def test_stale_temporaries_of_a_killed_run_are_removed(tmp_path, caplog):
    out = tmp_path / "shard"
    out.mkdir()
    # what SIGKILL leaves behind: a half-built folder, a moved-aside old folder and a temporary file
    (tmp_path / ".images.build-ab_cd123").mkdir()
    (tmp_path / ".images.build-ab_cd123" / "x.png").write_bytes(b"half")
    (tmp_path / ".images.old-zz99yy88").mkdir()
    (tmp_path / ".summary.json.tmp-k2j3h4g5.json").write_text("{")
    # things that are not ours and must survive
    keep = [tmp_path / ".images.build-notours", tmp_path / ".other.build-ab_cd123", tmp_path / "images.build-ab_cd123",
            tmp_path / ".summary.json.tmp-k2j3h4g5.json.bak.old", tmp_path / ".images2.build-ab_cd123",
            tmp_path / ".summary.jsonl.tmp-k2j3h4g5.jsonl"]
    for k in keep:
        k.write_text("keep")
    with caplog.at_level(logging.WARNING, logger="counterfactory.io"):
        with atomic_dir(tmp_path / "images") as tmp:
            (tmp / "a.png").write_bytes(b"1")
        write_json(tmp_path / "summary.json", {"ok": True})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["images", "shard", "summary.json", *(k.name for k in keep)])
    assert ".images.build-ab_cd123" in caplog.text and "interrupted" in caplog.text
    assert remove_stale_temporaries(tmp_path / "missing-folder" / "x") == []


def test_killed_write_leftover_is_removed_by_the_next_write(tmp_path):
    target = tmp_path / "t.parquet"
    leftover = None
    try:
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            leftover = tmp
            os.link(tmp, tmp_path / "snapshot")          # simulate SIGKILL: the temp file survives
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    os.link(tmp_path / "snapshot", leftover)
    assert leftover.exists() and leftover.name.startswith(".t.parquet.tmp-")
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"full")
    assert not leftover.exists() and target.read_bytes() == b"full"


def test_read_table_is_the_one_checked_reader(tmp_path):
    import pandas as pd

    from counterfactory.errors import InputError
    from counterfactory.io import read_table, write_parquet

    write_parquet(tmp_path / "t.parquet", pd.DataFrame({"id": ["007"], "x": [1.5]}))
    (tmp_path / "t.csv").write_text("id,x\n007,\n", encoding="utf-8")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    assert read_table(tmp_path / "t.parquet", "pairs table", "rerun it", ("id", "x"))["x"].tolist() == [1.5]
    as_text = read_table(tmp_path / "t.csv", "pairs table", "rerun it", ("id",), csv_dtype=str)
    assert as_text.to_dict("records") == [{"id": "007", "x": ""}]  # as written: no number parsing, no NaN
    with pytest.raises(InputError, match=r"t\.parquet: missing column\(s\) \['y'\]\. Fix: the pairs table needs"):
        read_table(tmp_path / "t.parquet", "pairs table", "rerun it", ("id", "y"))
    with pytest.raises(InputError, match=r"nope\.parquet.*pairs table not found\. Fix: rerun it"):
        read_table(tmp_path / "nope.parquet", "pairs table", "rerun it")
    with pytest.raises(InputError, match=r"bad\.parquet: not a readable parquet file .*Fix: rerun it"):
        read_table(tmp_path / "bad.parquet", "pairs table", "rerun it")
    with pytest.raises(InputError, match=r"a csv file where the pairs table must be parquet"):
        read_table(tmp_path / "t.csv", "pairs table", "rerun it", formats=("parquet",))
