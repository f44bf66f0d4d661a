"""Shared fixtures. Tests run offline: the hub is never contacted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_text_models(tmp_path_factory) -> Path:
    """mlm, lm and sentence tiny models built once per test session."""
    from counterfactory.models import tiny

    out = tmp_path_factory.mktemp("tiny")
    for role in ("mlm", "lm", "sentence"):
        tiny.build(role, out)
    return out
