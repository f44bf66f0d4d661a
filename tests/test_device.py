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


# --------------------------------------------------------------------------------------------
# COCO-Counterfactuals: per-stage precision as the authors ran it (issue 28, item 12)
# --------------------------------------------------------------------------------------------
@pytest.fixture
def on_cuda(monkeypatch):
    """A bf16-capable CUDA GPU (what `precision: auto` turned into bf16 for every stage)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    return torch.device("cuda")


def _stage_dtypes(cfg, cuda):
    from counterfactory.evaluation.settings import stage_config as evaluation_stage
    from counterfactory.generation.shards import stage_config as images_stage
    from counterfactory.training.runs import stage_config as training_stage

    return {name: dev.resolve_dtype(stage(cfg).get("precision", "auto"), cuda)
            for name, stage in (("images", images_stage), ("evaluation", evaluation_stage),
                                ("training", training_stage))}


def test_paper_config_runs_each_coco_cf_stage_in_the_authors_precision(repo, on_cuda):
    """B.1.2: generation and the CLIP filter in fp16 (the InstructPix2Pix generator's autocast); the evaluation
    and fine-tuning scripts in fp32; the config-wide `precision: auto` (bf16 on this GPU) stays the fallback."""
    from counterfactory.config import load_config

    paper = load_config([repo / "config" / "config.yaml"])
    assert paper["precision"] == "auto" and dev.resolve_dtype("auto", on_cuda) == torch.bfloat16
    assert _stage_dtypes(paper, on_cuda) == {"images": torch.float16, "evaluation": torch.float32,
                                             "training": torch.float32}
    # the fast path is an overlay: every stage back on the config-wide precision (bf16)
    fast = load_config([repo / "config" / "config.yaml", repo / "config" / "fast_path.yaml"])
    assert _stage_dtypes(fast, on_cuda) == dict.fromkeys(("images", "evaluation", "training"), torch.bfloat16)
    # the demo keeps its config-wide fp32 everywhere
    demo = load_config([repo / "config" / "demo.yaml"])
    assert _stage_dtypes(demo, on_cuda) == dict.fromkeys(("images", "evaluation", "training"), torch.float32)


def test_stage_precision_reaches_the_stages(repo, tmp_path, monkeypatch):
    """The image shard, the evaluate commands and a training run each load their models under their stage's
    precision (the cfg they hand to the model loaders), not the config-wide one."""
    from counterfactory.cli import main
    from counterfactory.config import load_config
    from counterfactory import evaluation
    from counterfactory.evaluation import classify, runs as eval_runs
    from counterfactory.generation import shards

    paper = load_config([repo / "config" / "config.yaml"])
    seen = {}

    class Stop(Exception):
        pass

    def capture(name):
        def fn(cfg, *args, **kwargs):
            seen[name] = cfg["precision"]
            raise Stop
        return fn

    monkeypatch.setattr(shards, "_shard_context", capture("images"))
    with pytest.raises(Stop):
        shards.run_shard(paper, tmp_path / "pairs.parquet", 0, tmp_path / "out")
    monkeypatch.setattr(evaluation, "run_classification", capture("evaluation"))
    with pytest.raises(Stop):
        main(["evaluate", "classify", "--config", str(repo / "config" / "config.yaml"), "--role", "clip_eval",
              "--dataset", "CIFAR10", "--out", str(tmp_path / "c.json")])
    monkeypatch.setattr(classify, "run_classification", lambda cfg, *a, **k: {"top1": 1.0 if cfg["precision"] == "fp32"
                                                                              else 0.0})
    paper["training"]["eval"] = {"retrieval": [], "classification": ["CIFAR10"]}
    rows = eval_runs.run_one(paper, None, "pretrained", 107, 108, tmp_path / "run", progress=False, train=False)
    seen["training"] = "fp32" if rows.set_index("metric").loc["CIFAR10/top1", "value"] == 1.0 else "other"
    assert seen == {"images": "fp16", "evaluation": "fp32", "training": "fp32"}
    assert '"precision": "fp32"' in (tmp_path / "run" / "run.json").read_text()   # TrainSettings too
