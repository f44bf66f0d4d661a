"""Error types. Every user-facing error names the file, the record and the fix."""

from __future__ import annotations


class CounterFactoryError(Exception):
    """Base class: the CLI prints these as one clear line and exits with status 2."""


class InputError(CounterFactoryError):
    """Bad input data. Build with :func:`input_error` so the message names file, record and fix."""


class ConfigError(CounterFactoryError):
    """The configuration does not match the schema or is inconsistent."""


class ModelLoadError(CounterFactoryError):
    """A model role could not be loaded from its configured id or path."""


def input_error(path, record, problem: str, fix: str) -> InputError:
    """An :class:`InputError` whose message names the file, the record and how to fix it."""
    where = f"{path}" if record is None else f"{path}, record {record}"
    return InputError(f"{where}: {problem}. Fix: {fix}")
