"""counterfactory.device: the one place that decides the device (auto | cuda | hpu | cpu) and precision."""

from __future__ import annotations

import importlib.machinery
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from counterfactory import device as dev
from counterfactory.errors import ConfigError

SRC = Path(dev.__file__).resolve().parent


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def fake_gaudi(monkeypatch):
    """A stand-in for Intel's bridge: importable habana_frameworks.torch.core and torch.hpu."""
    names = ["habana_frameworks", "habana_frameworks.torch", "habana_frameworks.torch.core"]
    for name in names:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(torch, "hpu", types.SimpleNamespace(is_available=lambda: True), raising=False)


def test_auto_prefers_cuda(monkeypatch, fake_gaudi):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dev.resolve_device("auto") == torch.device("cuda")


def test_auto_takes_gaudi_without_cuda(no_cuda, fake_gaudi):
    assert dev.resolve_device("auto") == torch.device("hpu")
    assert dev.resolve_device("hpu") == torch.device("hpu")


def test_auto_falls_back_to_cpu(no_cuda, monkeypatch):
    monkeypatch.setattr(dev, "_hpu_available", lambda: False)
    assert dev.resolve_device("auto") == torch.device("cpu")
    assert dev.resolve_device() == torch.device("cpu")  # auto is the default


def test_hpu_is_unavailable_without_habana_frameworks(monkeypatch):
    for name in ("habana_frameworks", "habana_frameworks.torch", "habana_frameworks.torch.core"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(dev.importlib.util, "find_spec", lambda name: None)
    assert dev._hpu_available() is False


def test_hpu_requested_without_bridge_says_so(monkeypatch):
    monkeypatch.setattr(dev, "_hpu_available", lambda: False)
    with pytest.raises(ConfigError) as err:
        dev.resolve_device("hpu")
    message = str(err.value)
    assert "habana_frameworks" in message and "Gaudi" in message and "Fix:" in message


def test_cuda_requested_without_gpu_says_so(no_cuda):
    with pytest.raises(ConfigError, match="no CUDA GPU is visible.*Fix"):
        dev.resolve_device("cuda")


@pytest.mark.parametrize("name", ["gpu", "tpu", "CUDA", ""])
def test_unknown_device_is_refused(name):
    with pytest.raises(ConfigError, match="unknown value"):
        dev.resolve_device(name)


def test_cpu_is_always_available():
    assert dev.resolve_device("cpu") == torch.device("cpu")


def test_precision():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert dev.resolve_dtype("fp32") == torch.float32
    assert dev.resolve_dtype("fp16", cuda) == torch.float16
    assert dev.resolve_dtype("fp16", cpu) == torch.float32  # CPU kernels: fp16 falls back to fp32
    assert dev.resolve_dtype("bf16", cpu) == torch.bfloat16
    assert dev.resolve_dtype("bf16", torch.device("hpu")) == torch.bfloat16
    with pytest.raises(ConfigError, match="precision: unknown value"):
        dev.resolve_dtype("int8")


def test_from_config(no_cuda, monkeypatch):
    monkeypatch.setattr(dev, "_hpu_available", lambda: False)
    assert dev.from_config({}) == (torch.device("cpu"), torch.float32)
    assert dev.from_config({"device": "cpu", "precision": "fp16"}) == (torch.device("cpu"), torch.float32)
    assert dev.from_config({"device": "auto", "precision": "bf16"}) == (torch.device("cpu"), torch.bfloat16)


def test_device_is_decided_in_one_place():
    """No other module probes CUDA or Gaudi or builds an accelerator device by name."""
    pattern = re.compile(r"cuda\.is_available|habana_frameworks|hpu\.is_available|torch\.device\(\s*[\"'](cuda|hpu)")
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if p.name != "device.py" and pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_schema_offers_the_same_devices():
    import yaml

    schema = yaml.safe_load((SRC / "resources" / "config_schema.yaml").read_text())
    assert set(schema["properties"]["device"]["enum"]) == {"auto", "cpu", "cuda", "hpu"}
