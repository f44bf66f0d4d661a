"""Atomic writers: nothing half-written survives a failure."""

from __future__ import annotations

import pytest

from counterfactory.io import atomic_dir, write_json


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
