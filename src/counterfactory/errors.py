"""Error types. Every user-facing error names the file, the record and the fix.

:func:`os_error_message` turns an :class:`OSError` (disk full, read-only file system, permission
denied, a folder where a file was expected, a missing input) into one line naming the absolute path
(and, for a relative one, the working directory it was resolved against) and the fix; the CLI prints
it instead of a traceback.
"""

from __future__ import annotations

import errno
import os


class CounterFactoryError(Exception):
    """Base class: the CLI prints these as one clear line and exits with status 2."""


class InputError(CounterFactoryError):
    """Bad input data. Build with :func:`input_error` so the message names file, record and fix."""


class ConfigError(CounterFactoryError):
    """The configuration does not match the schema or is inconsistent."""


class OutputPathError(CounterFactoryError):
    """An output path that cannot be written (checked before a step starts its work)."""


class ModelLoadError(CounterFactoryError):
    """A model role could not be loaded from its configured id or path."""


def input_error(path, record, problem: str, fix: str) -> InputError:
    """An :class:`InputError` whose message names the file, the record and how to fix it."""
    where = f"{path}" if record is None else f"{path}, record {record}"
    return InputError(f"{where}: {problem}. Fix: {fix}")


def describe_path(path) -> str:
    """``path`` as an absolute path; a relative one also names the working directory it is relative to."""
    text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    if os.path.isabs(text):
        return text
    return f"{os.path.abspath(text)} (given as {text!r}, relative to the working directory {os.getcwd()})"


def missing_input(path, what: str, fix: str) -> InputError:
    """An :class:`InputError` for an input that does not exist: absolute path, working directory, fix."""
    return InputError(f"{describe_path(path)}: {what} not found. Fix: {fix}")


_OS_FIXES = {
    errno.ENOSPC: ("no space left on device",
                   "free space on the file system holding {folder} (df -h {folder}) or write the outputs to "
                   "another disk, then rerun; finished shards are kept"),
    errno.EDQUOT: ("disk quota exceeded",
                   "free space within your quota or write the outputs to another disk, then rerun"),
    errno.EROFS: ("read-only file system",
                  "write the outputs to a writable folder (another --out / --out-dir / results folder)"),
    errno.EACCES: ("permission denied",
                   "check the permissions of the path and its folder (ls -ld {folder}), or choose a folder "
                   "you can write to"),
    errno.EPERM: ("operation not permitted",
                  "check the permissions and ownership of the path (ls -ld {folder})"),
    errno.EISDIR: ("is a folder, but a file is needed here",
                   "pass a file path, or remove or rename that folder"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder",
                    "check the path; a file stands where a folder is expected"),
    errno.ENOENT: ("not found",
                   "check the path (and that the step producing it has run); relative paths are resolved "
                   "against the working directory"),
    errno.EEXIST: ("already exists", "remove it or choose another path"),
}


def _existing_folder(path: str) -> str:
    """The nearest existing folder at or above ``path`` (absolute): where its file system is mounted from."""
    folder = os.path.abspath(path)
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return folder


def os_error_message(exc: OSError, outputs=()) -> str:
    """One line for an :class:`OSError`: the absolute path, the problem and the fix. ``outputs``: the step's
    output paths, named (with their folders' file systems) when the OS gives no file name -- a full disk
    usually stops a write without one, and the output's file system is the one to free, not the working
    directory's."""
    if exc.errno not in _OS_FIXES and exc.filename is None:
        return f"{exc}. Fix: check the paths and settings involved and rerun (-v shows where it happened)"
    problem, fix = _OS_FIXES.get(exc.errno, (exc.strerror or str(exc), "check the path and rerun"))
    if exc.filename is None:
        outputs = [os.fsdecode(o) for o in outputs if o]
        if outputs:
            folders = list(dict.fromkeys(_existing_folder(os.path.dirname(os.path.abspath(o)) or ".")
                                         for o in outputs))
            where = (f"while writing this step's outputs ({', '.join(os.path.abspath(o) for o in outputs)}; "
                     f"no file name given by the OS; working directory {os.getcwd()})")
            return f"{problem} {where}. Fix: {fix.format(folder=' '.join(folders))}"
        where = f"(no file name given by the OS; working directory {os.getcwd()})"
        folder = os.getcwd()
        return f"{problem} {where}. Fix: {fix.format(folder=folder)}"
    name = os.fsdecode(exc.filename) if isinstance(exc.filename, (str, bytes, os.PathLike)) else str(exc.filename)
    other = f" (and {describe_path(exc.filename2)})" if exc.filename2 else ""
    if exc.filename2 and ".tmp-" in os.path.basename(name):   # os.replace(temporary, output): name the output
        name, other = os.fsdecode(exc.filename2), ""
    folder = os.path.dirname(os.path.abspath(name)) or os.getcwd()
    return f"{describe_path(name)}{other}: {problem}. Fix: {fix.format(folder=folder)}"
