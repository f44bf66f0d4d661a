"""Load precision (issue 33): ``registry.load(cfg, role, dtype=...)`` reads a diffusers role's weights in that dtype
(``torch_dtype``, and the half-precision ``fp16`` weight files when the folder has them) instead of fp32 then a cast;
the image stages pass their precision (``grounded.precision``, CounterCurate §3.2-3.4; the Prompt-to-Prompt engine)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from counterfactory.models import registry

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from counterfactory.models import tiny

    out = tmp_path_factory.mktemp("tiny_dtype")
    for role in ("sd", "t2i"):
        tiny.build(role, out)
    return out


@pytest.fixture()
def pipeline_calls(monkeypatch) -> list[dict]:
    """The keyword arguments of every ``DiffusionPipeline.from_pretrained`` call (AutoPipeline included)."""
    from diffusers import DiffusionPipeline

    calls: list[dict] = []
    real = DiffusionPipeline.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        calls.append(kwargs)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(DiffusionPipeline, "from_pretrained", classmethod(spy))
    return calls


def _cfg(**models) -> dict:
    return {"models": {role: {"source": str(path)} for role, path in models.items()}}


def _dtypes(pipe) -> set:
    return {m.dtype for m in pipe.components.values() if isinstance(m, torch.nn.Module)}


@pytest.mark.parametrize("role", ["sd", "t2i"])
def test_pipelines_load_in_the_asked_dtype(tiny_dir, pipeline_calls, role):
    pipe = registry.load(_cfg(**{role: tiny_dir / role}), role, dtype=torch.bfloat16)
    assert _dtypes(pipe) == {torch.bfloat16}     # unet, vae and text encoder(s) read in bf16, not cast afterwards
    assert pipeline_calls[-1][registry.diffusers_dtype_key()] is torch.bfloat16   # torch_dtype (older diffusers)
    assert "variant" not in pipeline_calls[-1]   # the folder has no fp16 weight files: its default files are read


def test_no_dtype_reads_fp32(tiny_dir, pipeline_calls):
    pipe = registry.load(_cfg(sd=tiny_dir / "sd"), "sd")
    assert _dtypes(pipe) == {torch.float32} and pipeline_calls[-1][registry.diffusers_dtype_key()] is torch.float32


def test_vae_role_loads_in_the_asked_dtype(tiny_dir):
    vae = registry.load(_cfg(vae=tiny_dir / "sd" / "vae"), "vae", dtype=torch.float16)
    assert vae.dtype == torch.float16


def test_half_dtype_reads_the_fp16_variant_when_the_folder_has_one(tiny_dir, tmp_path, pipeline_calls):
    """A folder laid out as the hub's SDXL / SD repositories (fp32 default files beside ``*.fp16.safetensors``): a
    half-precision load reads the fp16 files, an fp32 load the default ones."""
    folder = tmp_path / "sd"
    shutil.copytree(tiny_dir / "sd", folder)
    pipe = registry.load(_cfg(sd=folder), "sd")
    with torch.no_grad():
        pipe.unet.conv_in.bias.fill_(0.25)        # marks the fp16 files apart from the default ones
    pipe.to(dtype=torch.float16).save_pretrained(folder, variant="fp16", safe_serialization=True)
    assert (folder / "unet" / "diffusion_pytorch_model.fp16.safetensors").is_file()
    cfg = _cfg(sd=folder)

    half = registry.load(cfg, "sd", dtype=torch.float16)
    assert pipeline_calls[-1]["variant"] == "fp16" and half.unet.dtype == torch.float16
    assert torch.all(half.unet.conv_in.bias == 0.25)
    bf16 = registry.load(cfg, "sd", dtype=torch.bfloat16)   # no bf16 files: the fp16 ones, cast once
    assert pipeline_calls[-1]["variant"] == "fp16" and bf16.unet.dtype == torch.bfloat16
    full = registry.load(cfg, "sd", dtype=torch.float32)
    assert "variant" not in pipeline_calls[-1] and full.unet.dtype == torch.float32
    assert not torch.all(full.unet.conv_in.bias == 0.25)


@pytest.mark.parametrize("name, variant, hit", [
    ("diffusion_pytorch_model.fp16.safetensors", "fp16", True),
    ("diffusion_pytorch_model-00001-of-00002.fp16.safetensors", "fp16", True),
    ("diffusion_pytorch_model.safetensors.index.fp16.json", "fp16", True),
    ("pytorch_model.fp16-00001-of-00002.bin", "fp16", True),
    ("diffusion_pytorch_model.safetensors", "fp16", False),
    ("config.fp16.json", "fp16", False),
    ("model.fp16.safetensors", "bf16", False),
])
def test_variant_file_names(name, variant, hit):
    assert registry._names_variant(name, variant) is hit


def test_engine_loads_sd_and_vae_in_the_stage_precision(tiny_dir, monkeypatch):
    """The Prompt-to-Prompt engine (COCO images stage, SocialCounterfactuals sets) passes its precision to the load."""
    from counterfactory.generation.sampler import build_engine

    seen, real = [], registry.load
    monkeypatch.setattr(registry, "load", lambda cfg, role, **kw: seen.append((role, kw.get("dtype")))
                        or real(cfg, role, **kw))
    cfg = {**_cfg(sd=tiny_dir / "sd", vae=tiny_dir / "sd" / "vae"), "device": "cpu", "precision": "bf16",
           "images": {"height": 32, "width": 32, "steps": 2}}
    engine = build_engine(cfg)
    assert seen == [("sd", torch.bfloat16), ("vae", torch.bfloat16)] and engine.unet.dtype == torch.bfloat16
    seen.clear()
    build_engine({**cfg, "precision": "auto"})     # auto on CPU: fp32
    assert seen == [("sd", torch.float32), ("vae", torch.float32)]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("stage, overall, expected", [
    ("bf16", "fp32", torch.bfloat16),   # grounded.precision replaces the config-wide precision
    (None, "bf16", torch.bfloat16),     # null: the config's precision
    (None, "auto", torch.float32),      # auto on CPU: fp32
    ("fp16", "fp32", torch.float32),    # fp16 on CPU falls back to fp32
])
def test_grounded_precision_reaches_the_loader(tmp_path, monkeypatch, stage, overall, expected):
    from counterfactory.generation import grounded as G

    folder = tmp_path / "gligen"
    folder.mkdir()
    (folder / "model_index.json").write_text("{}", encoding="utf-8")   # identified by content, never loaded here
    requests = tmp_path / "requests.parquet"
    pd.DataFrame([{"item_id": "g1", "kind": "generate", "prompt": "a ball above a dog", "phrases": ["a ball"],
                   "boxes": [[0.1, 0.1, 0.5, 0.5]], "image_path": None, "mask_box": None}]).to_parquet(requests)
    seen = []

    def spy(cfg, role, **kw):
        seen.append((role, kw.get("dtype")))
        raise _Stop

    monkeypatch.setattr(registry, "load", spy)
    cfg = {"seed": 0, "device": "cpu", "precision": overall, "models": {"gligen": {"source": str(folder)}},
           "grounded": {"precision": stage, "steps": 2, "height": 32, "width": 32}}
    with pytest.raises(_Stop):
        G.run_grounded_shard(cfg, requests, 0, tmp_path / "out", progress=False)
    assert seen == [("gligen", expected)]


def test_grounded_precision_is_a_schema_key_defaulting_to_the_config_precision():
    from counterfactory.config import fill_section
    from counterfactory.generation.grounded import GroundedSettings

    assert fill_section("countercurate.grounded")["precision"] is None
    GroundedSettings.from_config({"precision": "bf16"})     # accepted, not an unknown key


def test_editing_loads_its_pipeline_in_fp32(monkeypatch, tmp_path):
    """The editing stage has no precision setting and runs in the dtype it loads: it asks for fp32 explicitly."""
    from counterfactory.generation.editing import edit_shard

    seen = []

    def spy(cfg, role, **kw):
        seen.append((role, kw.get("dtype")))
        raise _Stop

    monkeypatch.setattr(registry, "load", spy)
    items = pd.DataFrame([{"item_id": "a", "image_path": str(tmp_path / "a.png"), "edit_prompt": "make it red"}])
    with pytest.raises(_Stop):
        edit_shard(items, "ip2p", tmp_path / "out", cfg={"models": {"editor": {"source": "x"}}}, device="cpu",
                   progress=False)
    assert seen == [("editor", torch.float32)]


def test_a_half_precision_folder_loads_as_one_dtype(tiny_dir, tmp_path):
    """Found by the true-architecture run (`make paper-smoke`): with weights saved in fp16, as the paper's hub
    folders ship them, a load without a dtype gave a pipeline of two dtypes -- transformers read the text encoder
    in its saved fp16, diffusers the UNet in fp32 -- and CVLD's editing failed on its first step ("Half != float").
    With the stage's dtype every component is read in that one dtype."""
    half = tmp_path / "sd_fp16"
    registry.load(_cfg(sd=tiny_dir / "sd"), "sd").to(torch.float16).save_pretrained(half)
    for asked in (torch.float32, None):   # the stage's dtype, and a caller that names none
        pipe = registry.load(_cfg(sd=half), "sd", **({"dtype": asked} if asked else {}))
        assert _dtypes(pipe) == {torch.float32}


@pytest.mark.parametrize("role", ["vlm", "llm", "nsfw", "itm_bridgetower", "captioner"])
def test_transformers_roles_read_a_half_precision_checkpoint_in_fp32_unless_asked(role, tmp_path):
    """transformers 5 reads a checkpoint in its saved dtype by default. The true-size run's vlm (saved in fp16, as
    llava-hf/llava-1.5-7b-hf is) was fine-tuned with fp16 master weights on the CPU's reference GEMM, 20+ min for
    two steps. Every transformers role now reads fp32 unless the caller asks for a dtype, as the registry says."""
    from counterfactory.models import tiny

    folder = tiny.build(role, tmp_path)
    model = registry.load(_cfg(**{role: folder}), role)
    model = model[0] if isinstance(model, tuple) else model
    model.to(dtype=torch.float16).save_pretrained(folder, safe_serialization=True)   # as the hub stores it
    loaded = registry.load(_cfg(**{role: folder}), role)
    loaded = loaded[0] if isinstance(loaded, tuple) else loaded
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    if role in ("vlm", "llm"):      # the roles whose callers read in their precision
        asked = registry.load(_cfg(**{role: folder}), role, dtype=torch.bfloat16)[0]
        assert {p.dtype for p in asked.parameters()} == {torch.bfloat16}


def test_the_vlm_scorer_reads_the_checkpoint_in_the_scoring_precision(tmp_path, monkeypatch):
    from counterfactory.models import tiny
    from counterfactory.studies.countercurate import vlm

    folder = tiny.build("vlm", tmp_path)
    seen, real = [], registry.load
    monkeypatch.setattr(registry, "load", lambda cfg, role, **kw: seen.append(kw.get("dtype")) or real(cfg, role, **kw))
    scorer = vlm.scorer_from_config({**_cfg(vlm=folder), "device": "cpu", "precision": "bf16"}, "vlm")
    assert seen == [torch.bfloat16] and scorer is not None
