"""The fast path (issue 16): precision auto, channels_last, optional torch.compile, automatic batch
sizes, SDPA attention -- and results that agree with fp32 within the documented tolerance."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from counterfactory import device as dev
from counterfactory.config import load_full_config
from counterfactory.errors import ConfigError
from counterfactory.filters import ClipScorer, FilterThresholds, apply_thresholds

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The tiny sd and clip_filter roles, built for this module (a fresh clone has no resources/models)."""
    from counterfactory.models import tiny as builders

    out = tmp_path_factory.mktemp("tiny_fast_path")
    for role in ("sd", "clip_filter"):
        builders.build(role, out)
    return out
GIB = 2**30
CPU, CUDA, HPU = torch.device("cpu"), torch.device("cuda"), torch.device("hpu")


# --------------------------------------------------------------------------- precision and config

def test_precision_auto(monkeypatch):
    assert dev.resolve_dtype("auto", CPU) == torch.float32
    assert dev.resolve_dtype("auto") == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert dev.resolve_dtype("auto", CUDA) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert dev.resolve_dtype("auto", CUDA) == torch.float16     # pre-Ampere GPUs
    assert dev.resolve_dtype("auto", HPU) == torch.bfloat16
    # explicit values keep working
    assert dev.resolve_dtype("fp16", CUDA) == torch.float16 and dev.resolve_dtype("fp16", CPU) == torch.float32
    assert dev.from_config({"device": "cpu"}) == (CPU, torch.float32)   # auto is the default
    assert dev.from_config({"device": "cpu", "precision": "bf16"}) == (CPU, torch.bfloat16)
    with pytest.raises(ConfigError, match="auto, fp32, fp16 or bf16"):
        dev.resolve_dtype("half", CPU)


def test_schema_defaults_match_the_code_and_configs():
    schema = yaml.safe_load((Path(dev.__file__).parent / "resources" / "config_schema.yaml").read_text())
    props = schema["properties"]
    assert props["precision"]["default"] == "auto" and "auto" in props["precision"]["enum"]
    defaults = {k: v["default"] for k, v in props["performance"]["properties"].items()}
    assert defaults == vars(dev.Performance())
    paper = load_full_config([ROOT / "config" / "config.yaml"])
    assert paper["precision"] == "auto" and paper["performance"] == defaults
    demo = load_full_config([ROOT / "config" / "demo.yaml"])
    assert (demo["device"], demo["precision"]) == ("cpu", "fp32")
    assert demo["performance"] == defaults   # filled from the schema


def test_performance_section_is_validated(tmp_path):
    assert dev.Performance.from_config({"performance": {"compile": True}}).compile is True   # accepted
    with pytest.raises(ConfigError, match="unknown keys.*Fix"):
        dev.Performance.from_config({"performance": {"channel_last": True}})
    with pytest.raises(ConfigError, match="batch_size.*Fix"):
        dev.Performance.from_config({"performance": {"batch_size": 0}})
    bad = tmp_path / "bad.yaml"
    paper = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    paper.setdefault("performance", {})["batch_size"] = "big"
    bad.write_text(yaml.safe_dump(paper))
    with pytest.raises(ConfigError, match="performance"):
        load_full_config([bad])


# --------------------------------------------------------------------------- automatic batch size

def test_auto_batch_size_with_a_fake_memory_reading():
    perf = dev.Performance()   # fraction 0.8, cap 64, CPU 2
    per_item = 2048.0          # MiB
    # 10 GiB free: 8 GiB usable / 2 GiB per item = 4
    assert dev.auto_batch_size(per_item, CUDA, perf, free_bytes=10 * GIB) == 4
    # 70 GiB: 56 / 2 = 28 fit -> largest power of two 16; fp32 items count double: 14 -> 8
    assert dev.auto_batch_size(per_item, CUDA, perf, free_bytes=70 * GIB) == 16
    assert dev.auto_batch_size(per_item, CUDA, perf, free_bytes=70 * GIB, dtype=torch.float32) == 8
    # capped at max_batch_size; never below 1
    assert dev.auto_batch_size(per_item, CUDA, perf, free_bytes=1000 * GIB) == 64
    assert dev.auto_batch_size(per_item, CUDA, dev.Performance(max_batch_size=48), free_bytes=1000 * GIB) == 32
    assert dev.auto_batch_size(per_item, CUDA, perf, free_bytes=GIB) == 1
    assert dev.auto_batch_size(per_item, HPU, dev.Performance(memory_fraction=0.5), free_bytes=16 * GIB) == 4
    # CPU: the fixed small value, whatever memory says
    assert dev.auto_batch_size(per_item, CPU, perf, free_bytes=1000 * GIB) == 2
    assert dev.auto_batch_size(per_item, CPU, dev.Performance(cpu_batch_size=3)) == 3


def test_resolve_batch_size_reads_the_device(monkeypatch):
    assert dev.resolve_batch_size(8, {"device": "cpu"}, "sd_candidate") == 8              # integers stay
    assert dev.resolve_batch_size("auto", {"device": "cpu"}, "sd_candidate") == 2
    assert dev.resolve_batch_size("auto", {"device": "cpu", "performance": {"batch_size": 5}}, "clip_image") == 5
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (10 * GIB, 80 * GIB))
    assert dev.FOOTPRINT_MIB == {"sd_candidate": 512.0, "clip_image": 16.0}
    # bf16: 8 GiB usable / 0.5 GiB per candidate = 16; fp32 counts double: 8; CLIP: 8 GiB / 16 MiB -> cap 64
    assert dev.resolve_batch_size("auto", {"device": "cuda"}, "sd_candidate") == 16
    assert dev.resolve_batch_size("auto", {"device": "cuda", "precision": "fp32"}, "sd_candidate") == 8
    assert dev.resolve_batch_size("auto", {"device": "cuda"}, "clip_image") == 64


def test_generation_settings_accept_auto():
    from counterfactory.generation.sampler import GenerationSettings

    assert GenerationSettings.from_config({"batch_size": "auto"}, {"device": "cpu"}).batch_size == 2
    assert GenerationSettings.from_config({"batch_size": 6}).batch_size == 6


# --------------------------------------------------------------------------- fp32 vs bf16 on the CLIP filter

@pytest.fixture(scope="module")
def clip_pair(tiny):
    cfg = {"device": "cpu", "models": {"clip_filter": {"source": str(tiny / "clip_filter")}}}
    return (ClipScorer.from_config({**cfg, "precision": "fp32"}),
            ClipScorer.from_config({**cfg, "precision": "bf16"}))


def _candidates(seed: int, n: int, noise: int):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, size=(n, 32, 32, 3))
    b = np.clip(a + rng.integers(-noise, noise + 1, size=a.shape), 0, 255)
    return a.astype(np.uint8), b.astype(np.uint8)


def test_bf16_scores_agree_with_fp32_within_the_documented_tolerance(clip_pair):
    fp32, bf16 = clip_pair
    assert fp32.model.dtype == torch.float32 and bf16.model.dtype == torch.bfloat16
    a, b = _candidates(0, 48, 256)
    c, d = _candidates(1, 48, 32)          # near-identical pairs: the direction is most sensitive
    a, b = np.concatenate([a, c]), np.concatenate([b, d])
    s32 = fp32.score_pairs("a cat on a bed", "a dog on a bed", a, b)
    s16 = bf16.score_pairs("a cat on a bed", "a dog on a bed", a, b)
    for key in ("sim_0", "sim_1", "sim_image"):
        assert np.max(np.abs(s32[key] - s16[key])) <= dev.PRECISION_ATOL, key
    diff = np.abs(s32["sim_direction"] - s16["sim_direction"])
    assert np.all(diff <= dev.direction_tolerance(s32["sim_image"]))
    assert diff.max() > 1e-4   # bf16 really ran (the comparison is not fp32 against itself)

    # decisions: one test at a time, its threshold at a quartile of the fp32 scores (the others accept
    # everything); outside the tolerance band around the threshold bf16 decides exactly as fp32
    open_ = dict(image_caption_min=-1.0, image_image_min=-1.0, direction_min=-1.0)
    decided = 0
    for key, field in (("sim_0", "image_caption_min"), ("sim_image", "image_image_min"),
                       ("sim_direction", "direction_min")):
        tol = dev.direction_tolerance(s32["sim_image"]) if key == "sim_direction" else dev.PRECISION_ATOL
        for q in (25, 50, 75):
            low = float(np.percentile(s32[key], q))
            t = FilterThresholds(**{**open_, field: low})
            p32, p16 = apply_thresholds(s32, t)[0], apply_thresholds(s16, t)[0]
            if key == "sim_0":   # the image-caption threshold also applies to sim_1
                near = (np.abs(s32["sim_0"] - low) <= tol) | (np.abs(s32["sim_1"] - low) <= tol)
            else:
                near = np.abs(s32[key] - low) <= tol
            assert 0 < p32.sum() < len(p32)
            np.testing.assert_array_equal(p32[~near], p16[~near], err_msg=f"{key} >= {low}")
            decided += int((~near).sum())
    assert decided >= 100   # the comparison covers many candidates outside the band


def test_direction_tolerance_formula():
    # sim_image 0.875: difference of relative size sqrt(0.25) = 0.5 -> 0.01 / 0.5 = 0.02
    np.testing.assert_allclose(dev.direction_tolerance([0.875, 0.98]), [0.02, 0.01 / 0.2])
    assert dev.direction_tolerance(1.0) == 2.0   # identical images: no bound (the direction is undefined)


# --------------------------------------------------------------------------- layout, placement, compile

def test_channels_last_gives_the_same_outputs(clip_pair):
    vision = copy.deepcopy(clip_pair[0].model.vision_model)
    px = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = vision(pixel_values=px).pooler_output
        fast = dev.to_channels_last(vision)
        conv = vision.embeddings.patch_embedding.weight
        assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
        out = fast(pixel_values=px.contiguous(memory_format=torch.channels_last)).pooler_output
    torch.testing.assert_close(out, ref, rtol=dev.LAYOUT_ATOL, atol=dev.LAYOUT_ATOL)


def test_channels_last_vae_matches_contiguous(tiny):
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(tiny / "sd" / "vae").eval()
    z = torch.randn(2, vae.config.latent_channels, 4, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = vae.decode(z).sample
        out = dev.to_channels_last(vae).decode(z).sample
    torch.testing.assert_close(out, ref, rtol=dev.LAYOUT_ATOL, atol=dev.LAYOUT_ATOL)


def test_place_applies_channels_last_on_accelerators_only():
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    cpu = dev.place(copy.deepcopy(conv), CPU, torch.float32, dev.Performance(channels_last=True))
    assert cpu[0].weight.is_contiguous() and not cpu.training
    meta = torch.device("meta")   # stands in for an accelerator: not the CPU, no hardware needed
    fast = dev.place(copy.deepcopy(conv), meta, torch.bfloat16, dev.Performance(channels_last=True))
    assert fast[0].weight.dtype == torch.bfloat16 and fast[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not fast[0].weight.is_contiguous()
    plain = dev.place(copy.deepcopy(conv), meta, torch.float32, dev.Performance())   # default: off
    assert plain[0].weight.is_contiguous()
    assert dev.place(copy.deepcopy(conv), meta, torch.float32, None)[0].weight.is_contiguous()


def test_compile_is_optional_and_falls_back_with_a_log_line(monkeypatch, caplog):
    net = torch.nn.Linear(2, 2)
    calls = []
    monkeypatch.setattr(net, "compile", lambda **kw: calls.append(kw))   # never compile for real (slow)
    perf = dev.Performance(compile=True, compile_mode="max-autotune")
    dev.place(net, CPU, torch.float32, perf)                 # not the UNet: not compiled
    assert calls == []
    dev.place(net, CPU, torch.float32, perf, compile=True)
    assert calls == [{"mode": "max-autotune"}]
    dev.compile_module(net, "default", HPU)
    assert calls[-1] == {"backend": "hpu_backend"}

    monkeypatch.setattr(torch, "compile", None)
    x = torch.ones(1, 2)
    with caplog.at_level(logging.WARNING, logger="counterfactory.device"):
        out = dev.place(net, CPU, torch.float32, perf, compile=True)
    assert out is net and len(calls) == 2
    assert "torch.compile" in caplog.text and "uncompiled" in caplog.text
    torch.testing.assert_close(out(x), net(x))

    monkeypatch.undo()
    import torch._dynamo as dynamo

    monkeypatch.setattr(dynamo, "is_dynamo_supported", lambda: False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="counterfactory.device"):
        dev.compile_module(net)
    assert "does not support" in caplog.text


# --------------------------------------------------------------------------- attention stays SDPA

def _count_sdpa(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    return calls


def test_every_attention_processor_uses_sdpa(monkeypatch, tiny):
    from diffusers.models.attention_processor import AttnProcessor2_0

    from counterfactory.generation.p2p import P2PAttnProcessor
    from counterfactory.generation.sampler import GenerationSettings, P2PEngine
    from counterfactory.models import registry

    cfg = {"device": "cpu", "precision": "fp32", "models": {"sd": {"source": str(tiny / "sd")}}}
    pipe = registry.load(cfg, "sd")
    engine = P2PEngine(pipe, GenerationSettings(steps=1, height=32, width=32, batch_size=1), CPU, torch.float32,
                       performance=dev.Performance.from_config(cfg))
    unet = engine.unet
    procs = unet.attn_processors
    assert procs and all(isinstance(p, P2PAttnProcessor) for p in procs.values())
    engine.controller.configure(1, 2, [0.5], None)
    engine.controller.set_step(0, 1)
    x = torch.randn(4, unet.config.in_channels, 4, 4, generator=torch.Generator().manual_seed(0))
    text = torch.randn(4, 5, unet.config.cross_attention_dim, generator=torch.Generator().manual_seed(1))
    calls = _count_sdpa(monkeypatch)
    with torch.no_grad():
        unet(x, 10, encoder_hidden_states=text)
    assert len(calls) == len(procs)           # every attention layer went through the fused kernel
    engine.controller.reset()
    engine.close()
    assert all(isinstance(p, AttnProcessor2_0) for p in unet.attn_processors.values())
    calls.clear()
    with torch.no_grad():
        unet(x, 10, encoder_hidden_states=text)
    assert len(calls) == len(procs)


def test_place_pipeline_moves_every_component(tiny):
    from counterfactory.models import registry

    cfg = {"device": "cpu", "precision": "bf16", "models": {"sd": {"source": str(tiny / "sd")}}}
    pipe = dev.place_pipeline(registry.load(cfg, "sd"), cfg)
    for name in ("unet", "vae", "text_encoder"):
        module = getattr(pipe, name)
        assert module.dtype == torch.bfloat16 and not module.training, name
    assert pipe.unet.conv_in.weight.is_contiguous()   # CPU keeps the contiguous layout
