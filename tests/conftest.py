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


@pytest.fixture(scope="session")
def nltk_dir(tmp_path_factory) -> Path:
    """One offline NLTK_DATA folder per test session (about 2 s), NLTK pointed at it meanwhile."""
    import nltk

    from counterfactory.data import nltk_data as nd

    saved_path, saved_env = list(nltk.data.path), os.environ.get("NLTK_DATA")
    out = nd.prepare_nltk_data(tmp_path_factory.mktemp("nltk") / "nltk_data")
    nd.ensure_nltk_data(out)
    yield out
    nltk.data.path[:] = saved_path
    if saved_env is None:
        os.environ.pop("NLTK_DATA", None)
    else:
        os.environ["NLTK_DATA"] = saved_env
    nd._clear_nltk_caches()


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory) -> Path:
    """The tiny CLIPModel (role clip_eval) built once per session; tests load it, never write into it."""
    from counterfactory.models import tiny

    out = tmp_path_factory.mktemp("clip")
    tiny.build("clip_eval", out)
    return out / "clip_eval"


@pytest.fixture(scope="session")
def tiny_blip(tmp_path_factory) -> Path:
    """The tiny BlipForImageTextRetrieval (role itm_blip, seed 0) built once per session; tests load it, never write
    into it."""
    from counterfactory.models.tiny_eval import build_blip

    out = tmp_path_factory.mktemp("blip") / "itm_blip"
    build_blip(out, seed=0)
    return out


@pytest.fixture
def one_thread():
    """Tiny models on a shared 2-core machine: one torch thread avoids OpenMP contention
    (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
