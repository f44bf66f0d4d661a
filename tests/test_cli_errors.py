"""The CLI's last line of defence: Ctrl-C and operating-system errors become one clear line (exit 130 / 2)
naming the path and the fix, with a traceback only under ``-v``."""

from __future__ import annotations

import errno
import subprocess
import sys
import os
from pathlib import Path

import pytest

from counterfactory import cli
from counterfactory.errors import describe_path, os_error_message


def _fail_with(monkeypatch, exc):
    def boom(*args, **kwargs):
        raise exc

    # the step's handler is bound in its declaration: patch the stage function it calls
    monkeypatch.setattr("counterfactory.data.coco.load_coco_captions", boom)


def _run(tmp_path, *extra):
    return cli.main([*extra, "data", "captions", "--captions-json", str(tmp_path / "c.json"),
                     "--out", str(tmp_path / "out.parquet")])


def test_ctrl_c_is_one_line_exit_130(tmp_path, monkeypatch, capsys):
    _fail_with(monkeypatch, KeyboardInterrupt())
    assert _run(tmp_path) == 130
    err = capsys.readouterr().err
    assert err.strip() == "counterfactory data: interrupted" and "Traceback" not in err


@pytest.mark.parametrize("code, needles", [
    (errno.ENOSPC, ["no space left on device", "df -h"]),
    (errno.EROFS, ["read-only file system", "writable folder"]),
    (errno.EACCES, ["permission denied", "ls -ld"]),
    (errno.EISDIR, ["is a folder", "pass a file path"]),
    (errno.ENOENT, ["not found", "working directory"]),
])
def test_os_errors_name_the_path_and_fix(tmp_path, monkeypatch, capsys, code, needles):
    target = tmp_path / "results" / "out.parquet"
    _fail_with(monkeypatch, OSError(code, os.strerror(code), str(target)))
    assert _run(tmp_path) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("counterfactory data: error: ")
    assert str(target) in err and "Fix:" in err and "Traceback" not in err
    for needle in needles:
        assert needle in err


def test_verbose_adds_the_traceback(tmp_path, monkeypatch, capsys):
    _fail_with(monkeypatch, OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x")))
    assert _run(tmp_path, "-v") == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "no space left on device" in err


def test_disk_full_without_a_file_name(tmp_path, monkeypatch, capsys):
    _fail_with(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    assert _run(tmp_path) == 2
    err = capsys.readouterr().err
    assert "no space left on device" in err and os.getcwd() in err and "Traceback" not in err


def test_relative_missing_input_names_absolute_path_and_cwd(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["data", "captions", "--captions-json", "annotations/captions_val2017.json", "--out", "o.parquet"])
    err = capsys.readouterr().err
    assert rc == 2 and str(tmp_path / "annotations" / "captions_val2017.json") in err
    assert f"working directory {tmp_path}" in err and "not found" in err and "Traceback" not in err
    msg = os_error_message(FileNotFoundError(errno.ENOENT, "No such file or directory", "in/x.json"))
    assert str(tmp_path / "in" / "x.json") in msg and str(tmp_path) in msg
    assert describe_path(tmp_path / "a") == str(tmp_path / "a")


def test_real_write_into_a_folder_path(tmp_path, capsys, repo):
    out = tmp_path / "out.parquet"
    out.mkdir()                                   # the output path is a directory
    (out / "keep").write_text("x")
    rc = cli.main(["data", "captions", "--captions-json",
                   str(repo / "resources" / "demo" / "coco2017" / "annotations" / "captions_val2017.json"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and str(out) in err and "Fix:" in err and "Traceback" not in err
    assert (out / "keep").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_real_read_only_folder(tmp_path, capsys, repo):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc = cli.main(["data", "captions", "--captions-json",
                       str(repo / "resources" / "demo" / "coco2017" / "annotations" / "captions_val2017.json"),
                       "--out", str(ro / "out.parquet")])
    finally:
        ro.chmod(0o755)
    err = capsys.readouterr().err
    assert rc == 2 and "permission denied" in err and str(ro) in err


def test_other_errors_are_not_swallowed(tmp_path, monkeypatch):
    _fail_with(monkeypatch, ValueError("a bug"))
    with pytest.raises(ValueError):
        _run(tmp_path)


def test_path_helpers_accept_path_objects():
    assert describe_path(Path("/abs/x")) == "/abs/x"


def test_replace_of_a_temporary_names_the_output(tmp_path):
    exc = IsADirectoryError(errno.EISDIR, "Is a directory", str(tmp_path / ".o.parquet.tmp-abcd1234.parquet"),
                            None, str(tmp_path / "o.parquet"))
    msg = os_error_message(exc)
    assert msg.startswith(str(tmp_path / "o.parquet") + ": is a folder") and ".tmp-" not in msg


def test_a_step_imports_only_its_command_group():
    """A job's CLI registers only its own command group: `stats` does not pay for torch / transformers."""
    code = ("import sys; from counterfactory import cli; p = cli.build_parser('stats'); "
            "assert set(p._subparsers._group_actions[0].choices) == {'stats'}; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "full = cli.build_parser(None); assert {'stats', 'countercurate', 'train'} <= "
            "set(full._subparsers._group_actions[0].choices)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------- outputs checked before the work


def test_output_folder_where_a_file_belongs_fails_before_the_work(tmp_path, monkeypatch, capsys):
    """captions edit --summary DIR: refused before the model run writes --out and --rejected (issue 31, #11)."""

    ran = []
    monkeypatch.setattr("counterfactory.text.caption_stage.run_shard", lambda *a, **k: ran.append(a))
    (tmp_path / "summary_dir").mkdir()
    argv = ["captions", "edit", "--config", "config/demo.yaml", "--captions", str(tmp_path / "c.parquet"),
            "--shard", "0", "--out", str(tmp_path / "acc.parquet"), "--rejected", str(tmp_path / "rej.parquet"),
            "--summary", str(tmp_path / "summary_dir")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert ran == [] and len(err.splitlines()) == 1
    assert "--out-summary" in err and str(tmp_path / "summary_dir") in err and "is a folder" in err
    assert not (tmp_path / "acc.parquet").exists()
    # a file where a folder of the path must be, and a file where an output folder belongs
    (tmp_path / "afile").write_text("x")
    assert cli.main([*argv[:-1], str(tmp_path / "afile" / "s.json")]) == 2
    assert "is a file, but the path needs a folder" in capsys.readouterr().err
    assert cli.main(["images", "merge", "--shard-dirs", str(tmp_path), "--out-dir", str(tmp_path / "afile")]) == 2
    assert "--out-dir" in capsys.readouterr().err
    assert cli.main([*argv[:-1], str(tmp_path / "new" / "s.json")]) == 0 and len(ran) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_output_folder_fails_before_the_work(tmp_path, monkeypatch, capsys):

    ran = []
    monkeypatch.setattr("counterfactory.data.coco.load_coco_captions", lambda path: ran.append(path))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert cli.main(["data", "captions", "--captions-json", str(tmp_path / "c.json"),
                         "--out", str(locked / "sub" / "out.parquet")]) == 2
    finally:
        locked.chmod(0o700)
    assert ran == [] and "cannot write in" in capsys.readouterr().err


def test_disk_full_names_the_outputs_file_system_not_the_working_directory(tmp_path, monkeypatch, capsys):
    """issue 31, #21: ENOSPC without a file name named the working directory's file system."""
    _fail_with(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    assert _run(tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no space left on device" in err
    assert str(tmp_path / "out.parquet") in err and f"df -h {tmp_path}" in err
    assert f"df -h {os.getcwd()}" not in err
