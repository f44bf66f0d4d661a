"""The one rule for a path that a data file names: it is relative to the root the config gives and stays inside it.

Every reader that joins a root (``image_root``, a dataset folder) with a path read from a data file (a Karpathy
``filepath`` / ``filename``, a CSV's ``file`` column, a JSON record's ``filename``) goes through :func:`join_under`:
an absolute path, a ``..`` component or a drive / home prefix is refused with an :class:`InputError` naming the file,
the record and the fix, before anything outside the root is opened (the workflow declares only the root as input,
and a crafted file must not make a step read elsewhere). Own data has the same rule (:mod:`.own`).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

from ..errors import input_error


def escapes(part) -> bool:
    """Whether the data-file path ``part`` would leave the root it is joined to: absolute (POSIX or Windows),
    ``~``-prefixed, or holding a ``..`` component."""
    text = str(part)
    if not text:
        return False
    posix, windows = PurePosixPath(text), PureWindowsPath(text)
    return (posix.is_absolute() or bool(windows.drive) or windows.root != "" or text.startswith("~")
            or ".." in posix.parts or ".." in windows.parts)


def join_under(root: str | os.PathLike, *parts, source: str | os.PathLike = "data file", record: str | None = None,
               key: str = "root") -> Path:
    """``root / parts...``, each part a path read from the data file ``source`` (``record``: which record there);
    a part that :func:`escapes` is an :class:`InputError` (nothing is opened). ``key``: the config key of ``root``,
    named in the fix."""
    for part in parts:
        if part is not None and escapes(part):
            raise input_error(Path(source), record, f"the path {str(part)!r} leaves {key} ({root}): it is absolute or "
                              "holds '..'", f"write the paths in {Path(source).name} relative to {key}, without '..' "
                              f"or a leading '/' (move the files under {root} if they live elsewhere)")
    return Path(root).joinpath(*[str(p) for p in parts if p not in (None, "")])


__all__ = ["escapes", "join_under"]
