"""Shared input checks for :mod:`counterfactory.metrics`.

Every public metric validates its inputs with these helpers so that a bad call fails with a
``ValueError`` whose message names the argument, what was wrong and what was expected.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np


def as_array(x: Any, name: str, *, ndim: int | None = None, dtype: Any = None,
             allow_empty: bool = False) -> np.ndarray:
    """``np.asarray(x)`` with a shape / emptiness check that names the argument."""
    try:
        arr = np.asarray(x) if dtype is None else np.asarray(x, dtype=dtype)
    except (TypeError, ValueError) as exc:  # ragged lists, non-numeric strings, ...
        raise ValueError(f"{name}: could not be converted to an array ({exc})") from exc
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {arr.shape}")
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name}: is empty; at least one element is required")
    return arr


def as_float_array(x: Any, name: str, *, ndim: int | None = None, allow_empty: bool = False,
                   allow_nan: bool = False) -> np.ndarray:
    """A floating array (float32 kept as float32, everything else as float64) without NaN."""
    arr = as_array(x, name, ndim=ndim, allow_empty=allow_empty)
    if arr.dtype.kind != "f":
        if arr.dtype.kind not in "biuO":
            raise ValueError(f"{name}: expected numbers, got dtype {arr.dtype}")
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: expected numbers ({exc})") from exc
    if not allow_nan and arr.size and np.isnan(arr).any():
        raise ValueError(f"{name}: contains NaN; remove or impute those entries first")
    return arr


def as_binary_array(x: Any, name: str, *, ndim: int | None = 1, allow_empty: bool = False) -> np.ndarray:
    """A boolean array from 0/1 or True/False values; any other value is a ``ValueError``."""
    arr = as_array(x, name, ndim=ndim, allow_empty=allow_empty)
    if arr.dtype == np.bool_:
        return arr
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name}: expected 0/1 or boolean values, got dtype {arr.dtype}")
    ok = (arr == 0) | (arr == 1)
    if not ok.all():
        bad = arr[~ok].ravel()[0]
        raise ValueError(f"{name}: expected only 0/1 or boolean values, found {bad!r}")
    return arr.astype(bool)


def check_same_length(**arrays: Any) -> int:
    """All arguments have the same first dimension; return it."""
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{n}={v}" for n, v in lengths.items())
        raise ValueError(f"inputs must have the same length, got {desc}")
    return next(iter(lengths.values()))


def check_k(k: Any, name: str = "k") -> int:
    """``k`` is a positive integer (bools are rejected)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"{name}: expected a positive integer, got {k!r}")
    if k < 1:
        raise ValueError(f"{name}: expected a positive integer, got {k}")
    return int(k)


def check_k_within(k: int, n: int, what: str) -> None:
    """Our convention for k larger than the ranking: a clear error rather than silent truncation."""
    if k > n:
        raise ValueError(
            f"k={k} is larger than the number of {what} ({n}); pass k <= {n} "
            f"(for example k=min(k, len(ranking))) so that the result is not silently computed on fewer items"
        )


def as_label_list(x: Any, name: str) -> list:
    """A ranked list of hashable labels (strings, ints, ...) as a Python list; empty is an error."""
    if isinstance(x, (str, bytes)):
        raise ValueError(f"{name}: expected a sequence of labels, got a single string {x!r}")
    if isinstance(x, np.ndarray):
        if x.ndim != 1:
            raise ValueError(f"{name}: expected a 1-D sequence of labels, got shape {x.shape}")
        items = x.tolist()
    else:
        try:
            items = list(x)
        except TypeError as exc:
            raise ValueError(f"{name}: expected a sequence of labels, got {type(x).__name__}") from exc
    if not items:
        raise ValueError(f"{name}: is empty; a ranking with at least one item is required")
    for item in items:
        try:
            hash(item)
        except TypeError as exc:
            raise ValueError(f"{name}: labels must be hashable (str, int, ...), got {item!r}") from exc
    return items


def unique_in_order(items: Sequence) -> list:
    """Distinct items in first-seen order (deterministic, works for mixed label types)."""
    return list(dict.fromkeys(items))
