"""Grounded generation (CounterCurate §3.2-3.4) on tiny randomly initialised GLIGEN / SD pipelines:
loading by path, equality with diffusers' own GLIGEN pipeline, determinism across shard and batch
sizes, resumption after a kill, inpainting's known region, bad requests, merge."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from counterfactory.errors import ConfigError, InputError
from counterfactory.generation import grounded as G

SIZE = 32   # image side (4x4 latents with the tiny VAE)
STEPS = 3


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    from counterfactory.models import tiny

    out = tmp_path_factory.mktemp("tiny_grounded")
    for role in ("gligen", "gligen_inpaint", "t2i"):
        tiny.build(role, out)
    return out


def _cfg(models_dir: Path, **grounded) -> dict:
    section = {"steps": STEPS, "guidance": 7.5, "height": SIZE, "width": SIZE, "scheduled_sampling_beta": 1.0,
               "t2i_height": SIZE, "t2i_width": SIZE, "batch_size": 4, "shard_size": 10, **grounded}
    return {"seed": 0, "device": "cpu", "precision": "fp32", "grounded": section,
            "models": {r: {"source": str(models_dir / r)} for r in ("gligen", "gligen_inpaint", "t2i")}}


@pytest.fixture(scope="module")
def pipes(models_dir):
    from counterfactory.models import registry

    cfg = _cfg(models_dir)
    return {r: registry.load(cfg, r) for r in ("gligen", "gligen_inpaint", "t2i")}


def _source_image(path: Path) -> Path:
    from PIL import Image

    yy, xx = np.mgrid[0:40, 0:48]   # not square: resized without cropping
    Image.fromarray(np.stack([xx * 5, yy * 6, (xx + yy) * 3], -1).astype(np.uint8)).save(path)
    return path


def _requests(folder: Path, rows: list[dict] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    _source_image(folder / "src.png")
    if rows is None:
        rows = [
            {"item_id": "g1", "kind": "generate", "prompt": "a ball above a sports outfit",
             "phrases": ["a ball", "a sports outfit"], "boxes": [[0.1, 0.05, 0.5, 0.4], [0.3, 0.5, 0.9, 0.95]]},
            {"item_id": "g2", "kind": "generate", "prompt": "a street above a child",
             "phrases": ["a street"], "boxes": [[0.0, 0.0, 1.0, 0.5]]},
            {"item_id": "i1", "kind": "inpaint", "prompt": "a plant", "phrases": ["a plant"],
             "boxes": [[0.25, 0.25, 0.75, 0.75]], "image_path": "src.png", "mask_box": [0.25, 0.25, 0.75, 0.75]},
            {"item_id": "i2", "kind": "inpaint", "prompt": "a cat", "phrases": ["a cat"],
             "boxes": [[0.5, 0.0, 1.0, 0.5]], "image_path": "src.png"},
            {"item_id": "t1", "kind": "t2i", "prompt": "a man wearing a black jacket and blue jeans"},
        ]
    full = [{"phrases": [], "boxes": [], "image_path": None, "mask_box": None, **r} for r in rows]
    path = folder / "requests.parquet"
    pd.DataFrame(full).to_parquet(path)
    return path


def _images(out: Path) -> dict[str, np.ndarray]:
    from PIL import Image

    df = pd.read_parquet(out / "generated.parquet")
    return {r.item_id: np.asarray(Image.open(out / r.image_path)) for r in df.itertuples()}


def test_tiny_models_load_through_the_registry_by_path(models_dir, pipes):
    from diffusers import StableDiffusionGLIGENPipeline, StableDiffusionXLPipeline
    from diffusers.models.attention import GatedSelfAttentionDense

    from counterfactory.models import registry

    assert type(pipes["gligen"]) is StableDiffusionGLIGENPipeline
    assert type(pipes["gligen_inpaint"]) is StableDiffusionGLIGENPipeline
    assert type(pipes["t2i"]) is StableDiffusionXLPipeline    # the paper config's SDXL base (§3.4)
    assert pipes["gligen"].unet.config.attention_type == "gated" and hasattr(pipes["gligen"].unet, "position_net")
    assert pipes["gligen"].unet.config.in_channels == 4
    assert pipes["gligen_inpaint"].unet.config.in_channels == 9     # latents + masked source latents + mask
    fusers = [m for m in pipes["gligen"].unet.modules() if isinstance(m, GatedSelfAttentionDense)]
    assert fusers and all(float(m.alpha_attn.detach()) == 1.0 for m in fusers)
    loaded = registry.loaded_models()
    for role in ("gligen", "gligen_inpaint", "t2i"):
        assert loaded[role]["local"] and len(loaded[role]["fingerprint"]) == 64
    assert loaded["gligen"]["fingerprint"] != loaded["gligen_inpaint"]["fingerprint"]


def test_one_item_equals_diffusers_gligen_pipeline(pipes):
    """The batched sampler reproduces StableDiffusionGLIGENPipeline.__call__ exactly for one text-box item."""
    import torch

    s = G.GroundedSettings(steps=STEPS, height=SIZE, width=SIZE, scheduled_sampling_beta=0.5)
    q = G.GroundedRequest("x", "generate", "a dog and an apple", ("a dog", "an apple"),
                          ((0.1, 0.2, 0.4, 0.7), (0.5, 0.4, 0.85, 0.7)))
    mine = G.gligen_batch(pipes["gligen"], s, [q], [1234])
    ref = pipes["gligen"](prompt=q.prompt, gligen_phrases=list(q.phrases), gligen_boxes=[list(b) for b in q.boxes],
                          gligen_scheduled_sampling_beta=0.5, num_inference_steps=STEPS, height=SIZE, width=SIZE,
                          guidance_scale=7.5, negative_prompt=s.negative_prompt,
                          generator=torch.Generator().manual_seed(1234), output_type="np").images
    np.testing.assert_array_equal(mine, (ref * 255).round().astype(np.uint8))


def test_grounding_and_scheduled_sampling_change_the_image(pipes):
    q = G.GroundedRequest("x", "generate", "a dog", ("a dog",), ((0.1, 0.1, 0.5, 0.5),))
    moved = G.GroundedRequest("x", "generate", "a dog", ("a dog",), ((0.5, 0.5, 0.9, 0.9),))
    s1 = G.GroundedSettings(steps=STEPS, height=SIZE, width=SIZE, scheduled_sampling_beta=1.0)
    s0 = G.GroundedSettings(steps=STEPS, height=SIZE, width=SIZE, scheduled_sampling_beta=0.0)
    a = G.gligen_batch(pipes["gligen"], s1, [q], [7])
    assert not np.array_equal(a, G.gligen_batch(pipes["gligen"], s1, [moved], [7]))
    assert not np.array_equal(a, G.gligen_batch(pipes["gligen"], s0, [q], [7]))
    np.testing.assert_array_equal(a, G.gligen_batch(pipes["gligen"], s1, [q], [7]))   # rerun: bit-identical


def _assert_close_images(a: dict, b: dict):
    """Batched CPU kernels may round differently for different batch shapes (tests/test_p2p.py): 8-bit
    images agree to at most 2 levels on a handful of pixels."""
    assert a.keys() == b.keys()
    for k in a:
        diff = np.abs(a[k].astype(int) - b[k].astype(int))
        assert diff.max() <= 2 and (diff > 0).mean() < 0.02, (k, diff.max(), (diff > 0).mean())


def test_shards_and_batches_do_not_change_the_images(models_dir, pipes, tmp_path):
    req = _requests(tmp_path / "req")
    one = G.run_grounded_shard(_cfg(models_dir), req, 0, tmp_path / "one", pipes=pipes, progress=False)
    assert one["items"] == 5 and one["items_by_kind"] == {"generate": 2, "inpaint": 2, "t2i": 1}
    assert one["pipeline_calls_this_run"] == 3                  # one batch per kind
    df = pd.read_parquet(tmp_path / "one" / "generated.parquet")
    assert list(df.columns) == list(G.GENERATED_SCHEMA)
    assert list(df["item_id"]) == ["g1", "g2", "i1", "i2", "t1"]
    assert df["seed"].tolist() == [G.item_seed(0, i) for i in df["item_id"]]
    assert df.loc[2, "source_image_path"] == "src.png" and list(df.loc[2, "mask_box"]) == [0.25, 0.25, 0.75, 0.75]
    assert [list(b) for b in df.loc[0, "boxes"]] == [[0.1, 0.05, 0.5, 0.4], [0.3, 0.5, 0.9, 0.95]]
    assert not (tmp_path / "one" / "work").exists()

    cfg = _cfg(models_dir, shard_size=2, batch_size=1)
    dirs = []
    for shard in range(3):
        G.run_grounded_shard(cfg, req, shard, tmp_path / f"s{shard}", pipes=pipes, progress=False)
        dirs.append(tmp_path / f"s{shard}")
    merged = G.merge_grounded_shards(dirs, tmp_path / "merged")
    assert merged["items"] == 5
    mdf = pd.read_parquet(tmp_path / "merged" / "generated.parquet")
    assert mdf["seed"].tolist() == df["seed"].tolist()
    imgs_one, imgs_merged = _images(tmp_path / "one"), _images(tmp_path / "merged")
    assert imgs_one["g1"].shape == (SIZE, SIZE, 3)
    _assert_close_images(imgs_one, imgs_merged)

    with pytest.raises(InputError, match="expected each of"):
        G.merge_grounded_shards(dirs[:2], tmp_path / "bad")


def test_resume_after_a_kill_regenerates_the_half_done_batch_whole(models_dir, pipes, tmp_path):
    """Kill-and-rerun byte identity and cache hits for every stage: tests/test_shard_contract.py. Here: a batch
    is planned over the whole shard and regenerated whole, and a changed setting invalidates the cache."""
    req = _requests(tmp_path / "req")
    cfg = _cfg(models_dir, batch_size=2)
    G.run_grounded_shard(cfg, req, 0, tmp_path / "full", pipes=pipes, progress=False)

    class Killed(Exception):
        pass

    def kill(k, item_id):
        if k == 2:      # after g1, g2 and i1: the inpaint batch (i1, i2) is half done
            raise Killed

    with pytest.raises(Killed):
        G.run_grounded_shard(cfg, req, 0, tmp_path / "resumed", pipes=pipes, hook=kill, progress=False)
    assert not (tmp_path / "resumed" / "generated.parquet").exists()
    s = G.run_grounded_shard(cfg, req, 0, tmp_path / "resumed", pipes=pipes, progress=False)
    assert s["pipeline_calls_this_run"] == 2          # the half-done inpaint batch again, then t2i
    for name in ("images/g1.png", "images/i1.png", "images/i2.png", "images/t1.png", "generated.parquet"):
        assert (tmp_path / "full" / name).read_bytes() == (tmp_path / "resumed" / name).read_bytes(), name
    full = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert full["config_digest"] == s["config_digest"]

    # with the work folder kept, a changed setting invalidates the cache
    small = _requests(tmp_path / "small", [{"item_id": "t1", "kind": "t2i", "prompt": "a red car"},
                                           {"item_id": "t2", "kind": "t2i", "prompt": "a blue car"}])
    kept = _cfg(models_dir, batch_size=2, keep_work=True)
    assert G.run_grounded_shard(kept, small, 0, tmp_path / "k", pipes=pipes,
                                progress=False)["items_generated_this_run"] == 2
    again = G.run_grounded_shard(_cfg(models_dir, batch_size=2, keep_work=True, guidance=3.0), small, 0,
                                 tmp_path / "k", pipes=pipes, progress=False)
    assert again["items_generated_this_run"] == 2


def test_t2i_role_loads_the_class_its_folder_names_and_draws_at_the_t2i_size(tmp_path, pipes):
    """The t2i role takes whatever text-to-image class the folder's model_index.json names (SDXL in the paper
    config, an SD 1.x folder works too, without a safety checker), and draws t2i_width x t2i_height images,
    independent of GLIGEN's height/width; the default is DALLE-3's hd size."""
    from diffusers import StableDiffusionPipeline

    from counterfactory.models import registry, tiny

    assert (G.GroundedSettings().t2i_height, G.GroundedSettings().t2i_width) == (1024, 1024)
    assert (G.GroundedSettings.from_config({}).t2i_height, G.GroundedSettings.from_config({}).t2i_width) == (1024,
                                                                                                          1024)
    with pytest.raises(ConfigError, match="t2i_width"):
        G.GroundedSettings.from_config({"t2i_width": 100})
    q = G.GroundedRequest("t", "t2i", "a red car")
    s = G.GroundedSettings(steps=STEPS, height=SIZE, width=SIZE, t2i_height=48, t2i_width=24)
    assert G.t2i_batch(pipes["t2i"], s, [q], [5]).shape == (1, 48, 24, 3)
    tiny.build("sd", tmp_path)
    sd = registry.load({"models": {"t2i": {"source": str(tmp_path / "sd")}}}, "t2i")
    assert type(sd) is StableDiffusionPipeline and sd.safety_checker is None
    assert G.t2i_batch(sd, s, [q], [5]).shape == (1, 48, 24, 3)


def test_inpainting_keeps_the_known_region(pipes):
    """GLIGEN inpainting replaces the known region of the latent by the noised source latent before
    every step, so the final latent outside the boxes stays at the source latent; with paste-back the
    pixels outside the (latent-grid) mask are the source's."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    src = np.stack([xx * 7, yy * 7, (xx + yy) * 3], -1).astype(np.uint8)
    q = G.GroundedRequest("i", "inpaint", "a plant", ("a plant",), ((0.25, 0.25, 0.75, 0.75),), source="s")
    s = G.GroundedSettings(steps=STEPS, height=SIZE, width=SIZE)
    img, lat = G.gligen_batch(pipes["gligen_inpaint"], s, [q], [3], sources=[src], return_latents=True)
    keep = lat["keep"][0, 0].bool()
    assert keep.sum() == 12 and (~keep).sum() == 4       # 4x4 latent grid, the 2x2 centre regenerated
    d = (lat["latents"] - lat["source_latents"]).abs()[0]
    assert d[:, keep].mean() < 0.1 * d[:, ~keep].mean()

    pasted = G.gligen_batch(pipes["gligen_inpaint"], G.GroundedSettings(steps=STEPS, height=SIZE, width=SIZE,
                                                                        inpaint_paste_back=True),
                            [q], [3], sources=[src])[0]
    outside = np.ones((SIZE, SIZE), bool)
    outside[8:24, 8:24] = False
    np.testing.assert_array_equal(pasted[outside], src[outside])
    assert np.abs(pasted[~outside].astype(int) - src[~outside]).mean() > 5
    np.testing.assert_array_equal(pasted[~outside], img[0][~outside])

    # the mask box widens the regenerated region beyond the phrase box
    q2 = G.GroundedRequest("i", "inpaint", "a plant", ("a plant",), ((0.25, 0.25, 0.75, 0.75),), source="s",
                           mask_box=(0.0, 0.0, 0.5, 0.5))
    _, lat2 = G.gligen_batch(pipes["gligen_inpaint"], s, [q2], [3], sources=[src], return_latents=True)
    assert (lat2["keep"] == 0).sum() == 7


@pytest.mark.parametrize("row, problem", [
    ({"item_id": "b1", "kind": "generate", "prompt": "p", "phrases": ["a"], "boxes": [[0.1, 0.1, 1.2, 0.5]]},
     "outside \\[0, 1\\]"),
    ({"item_id": "b1", "kind": "generate", "prompt": "p", "phrases": [], "boxes": [[0.1, 0.1, 0.5, 0.5]]},
     "phrase list is empty"),
    ({"item_id": "b1", "kind": "inpaint", "prompt": "p", "phrases": ["a"], "boxes": [[0.1, 0.1, 0.5, 0.5]],
      "image_path": "nope.png"}, "source image 'nope.png' not found"),
    ({"item_id": "b1", "kind": "generate", "prompt": "p", "phrases": ["a", "b"], "boxes": [[0.1, 0.1, 0.5, 0.5]]},
     "2 phrase\\(s\\) but 1 box"),
    ({"item_id": "b1", "kind": "paint", "prompt": "p"}, "kind 'paint'"),
])
def test_bad_requests_name_file_and_record(models_dir, tmp_path, row, problem):
    good = {"item_id": "a0", "kind": "t2i", "prompt": "fine"}
    req = _requests(tmp_path / "req", [good, row])
    with pytest.raises(InputError, match=problem) as info:
        G.run_grounded_shard(_cfg(models_dir), req, 0, tmp_path / "out", pipes={}, progress=False)
    msg = str(info.value)
    assert str(req) in msg and "record 1 (item_id 'b1')" in msg and "Fix:" in msg


def test_settings_are_checked():
    assert G.GroundedSettings.from_config({}).scheduled_sampling_beta == 1.0
    assert G.GroundedSettings.from_config({"negative_prompt": ""}).negative_prompt is None
    with pytest.raises(ConfigError, match="grounded.scheduled_sampling_beta"):
        G.GroundedSettings.from_config({"scheduled_sampling_beta": 1.5})
    with pytest.raises(ConfigError, match="grounded.height"):
        G.GroundedSettings.from_config({"height": 100})
    with pytest.raises(ConfigError, match="unknown key"):
        G.GroundedSettings.from_config({"stepz": 3})


def test_cli_registers_generate_and_merge():
    from counterfactory.cli import build_parser

    args = build_parser().parse_args(["countercurate", "generate", "--config", "c.yaml", "--requests", "r.parquet",
                                      "--shard", "00002", "--out-dir", "o", "--threads", "1", "--no-progress"])
    assert args.shard == 2 and args.requests == "r.parquet" and args.no_progress and callable(args.func)
    args = build_parser().parse_args(["countercurate", "generate-merge", "--shard-dirs", "a", "b", "--out-dir", "o"])
    assert args.shard_dirs == ["a", "b"] and callable(args.func)
