"""CVLD image editing (§3.3, §5.1): InstructPix2Pix, null-text inversion + Prompt-to-Prompt, Swin top-k, shards."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from counterfactory.errors import ConfigError, InputError
from counterfactory.generation import editing as ed
from counterfactory.generation import inversion as inv

pytestmark = pytest.mark.usefixtures("one_thread")

EDIT = "turn the man into a woman"
SRC, TGT = "a photo of a man", "a photo of a woman"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny editor, Swin encoder and SD, built by the builders and loaded back by path through the registry."""
    from diffusers import StableDiffusionPipeline

    from counterfactory.models import tiny_editing, tiny_vision

    root = tmp_path_factory.mktemp("edit_models")
    tiny_editing.build_editor(root / "editor")
    tiny_editing.build_image_encoder(root / "image_encoder")
    tiny_vision.build_sd(root / "raw_sd")
    # SD scales its VAE latents to unit variance (0.18215); the random tiny VAE's latents need ~4.0 for that,
    # without which DDIM on a random UNet is far from invertible
    sd = StableDiffusionPipeline.from_pretrained(root / "raw_sd", safety_checker=None, requires_safety_checker=False)
    sd.vae.register_to_config(scaling_factor=4.0)
    sd.save_pretrained(root / "sd")
    cfg = {"models": {role: {"source": str(root / role)} for role in ("editor", "image_encoder", "sd")}}
    return {"cfg": cfg, "editor": ed._load(cfg, "editor", "cpu"), "sd": ed._load(cfg, "sd", "cpu"),
            "encoder": ed._load(cfg, "image_encoder", "cpu")}


def blocks(seed: int, h: int = 32, w: int = 32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.kron(rng.integers(0, 255, (h // 8, w // 8, 3)), np.ones((8, 8, 1))).astype(np.uint8)


# null-text: the tiny UNet reacts weakly to its text, so the tests give Adam more room than Mokady et al. (lr 1e-2,
# 10 iterations): lr 0.1 and 30 iterations per step
SMALL = ed.EditSettings(m=4, k=2, size=32, steps=3, inversion_steps=10, inner_steps=30, null_lr=0.1)


# --------------------------------------------------------------------------- settings and parameters


def test_settings_defaults_and_errors():
    s = ed.EditSettings()
    assert (s.m, s.k, s.guidance_range, s.image_guidance_range) == (10, 3, (5.0, 10.0), (1.0, 2.0))
    assert (s.inversion().steps, s.inversion().guidance, s.inversion().inner_steps) == (50, 7.5, 10)
    assert ed.EditSettings.from_config({"m": 5, "k": 2, "cross_range": [0.1, 0.3]}).cross_range == (0.1, 0.3)
    with pytest.raises(ConfigError, match="k = 4 is above m = 3"):
        ed.EditSettings(m=3, k=4)
    with pytest.raises(ConfigError, match="unknown keys \\['mm'\\]"):
        ed.EditSettings.from_config({"mm": 1})
    with pytest.raises(ConfigError, match="unknown"):
        ed.check_method("sdedit")


def test_edit_params_deterministic_from_id_and_index():
    s = ed.EditSettings()
    a = [ed.edit_params("img1", j, s, "ip2p") for j in range(10)]
    assert a == [ed.edit_params("img1", j, s, "ip2p") for j in range(10)]
    assert len({p["seed"] for p in a}) == 10 and a[0] != ed.edit_params("img2", 0, s, "ip2p")
    assert all(5 <= p["guidance_scale"] <= 10 and 1 <= p["image_guidance_scale"] <= 2 for p in a)
    b = [ed.edit_params("img1", j, s, "p2p") for j in range(10)]
    assert all(0.2 <= p["cross"] <= 0.8 and 0.2 <= p["self"] <= 0.6 for p in b)


# --------------------------------------------------------------------------- top-k


def test_rank_by_similarity_hand_made():
    original = [1.0, 0.0]
    cands = [[0.0, 1.0],      # cos 0
             [1.0, 1.0],      # cos 1/sqrt(2)
             [2.0, 0.0],      # cos 1
             [-1.0, 0.0],     # cos -1
             [3.0, 3.0]]      # cos 1/sqrt(2): ties with candidate 1, which wins (lower index)
    idx, sims = ed.rank_by_similarity(original, cands, 3)
    assert idx == [2, 1, 4]
    np.testing.assert_allclose(sims, [0, 2 ** -0.5, 1, -1, 2 ** -0.5], atol=1e-12)


def test_select_top_k_prefers_the_original(models):
    model, proc = models["encoder"]
    img = blocks(0)
    cands = [blocks(5), img.copy(), blocks(6)]
    idx, sims = ed.select_top_k(model, proc, img, cands, 1)
    assert idx == [1] and sims[1] == pytest.approx(1.0, abs=1e-6) and max(sims[0], sims[2]) < 1 - 1e-4


# --------------------------------------------------------------------------- InstructPix2Pix


def test_ip2p_batch_invariance_and_matches_diffusers(models):
    pipe = models["editor"]
    s = ed.EditSettings(size=32, steps=4)
    imgs = [blocks(i, 40, 48) for i in range(3)]
    ps = [ed.edit_params(f"i{i}", 0, s, "ip2p") for i in range(3)]
    batch = ed.ip2p_edit(pipe, imgs, [EDIT] * 3, [p["seed"] for p in ps], s, ps)
    single = [ed.ip2p_edit(pipe, [imgs[i]], [EDIT], [ps[i]["seed"]], s, [ps[i]])[0] for i in range(3)]
    for a, b in zip(batch, single):
        assert a.shape == (32, 32, 3)
        # batched CPU kernels may round differently: at most one level on a rare pixel
        diff = np.abs(a.astype(int) - b)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    assert not np.array_equal(batch[0], batch[1])
    # one item equals diffusers' own InstructPix2Pix pipeline call with the same seed and guidance
    ref = pipe(EDIT, image=Image.fromarray(ed.fit_image(imgs[0], 32)), num_inference_steps=4,
               guidance_scale=ps[0]["guidance_scale"], image_guidance_scale=ps[0]["image_guidance_scale"],
               generator=torch.Generator().manual_seed(ps[0]["seed"]), output_type="np").images[0]
    np.testing.assert_array_equal((ref * 255).round().astype(np.uint8), single[0])


# --------------------------------------------------------------------------- inversion


def test_null_text_inversion_reconstructs_better_than_ddim_and_caches(models, tmp_path):
    pipe = models["sd"]
    s = SMALL.inversion()
    img = blocks(3)
    plain = inv.ddim_invert(pipe, img, SRC, s)
    calls = []
    hook = pipe.unet.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        nti = inv.null_text_invert(pipe, img, SRC, s, cache_dir=tmp_path)
        first = len(calls)
        again = inv.null_text_invert(pipe, img, SRC, s, cache_dir=tmp_path)
        assert len(calls) == first and again.cached and not nti.cached     # cache hit: no UNet call at all
        assert first > s.steps and nti.optimisation_steps > 0
    finally:
        hook.remove()
    torch.testing.assert_close(again.null_embeddings, nti.null_embeddings)
    assert len(list(tmp_path.glob("*.pt"))) == 1
    power = float((nti.latent ** 2).mean())
    err_null = float(((inv.reconstruct(pipe, nti, return_latent=True) - nti.latent) ** 2).mean())
    err_ddim = float(((inv.reconstruct(pipe, plain, return_latent=True) - plain.latent) ** 2).mean())
    assert err_null < 1e-3 * power        # close reconstruction of the encoded input
    assert err_null < 0.01 * err_ddim     # far better than plain DDIM inversion at guidance 7.5
    # another prompt is another cache entry
    inv.null_text_invert(pipe, img, TGT, s, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.pt"))) == 2


def test_p2p_edit_same_prompt_is_reconstruction_and_fractions_matter(models):
    pipe = models["sd"]
    s = inv.InversionSettings(steps=4, size=32, inner_steps=0)
    plain = inv.ddim_invert(pipe, blocks(4), SRC, s)
    rec = inv.reconstruct(pipe, plain)
    same = inv.p2p_edit(pipe, plain, SRC, SRC, [{"cross": 0.5, "self": 0.5}])[0]
    assert np.abs(same.astype(int) - rec).max() <= 1
    edits = inv.p2p_edit(pipe, plain, SRC, TGT, [{"cross": 0.0, "self": 0.0}, {"cross": 1.0, "self": 1.0}])
    free = inv.p2p_edit(pipe, plain, SRC, TGT, [{"cross": 0.0, "self": 0.0}])[0]
    assert np.abs(edits[0].astype(int) - free).max() <= 1     # batch of two = alone
    # full attention control pulls the edit towards the source image
    assert np.abs(edits[1].astype(int) - rec).mean() < np.abs(edits[0].astype(int) - rec).mean()


# --------------------------------------------------------------------------- shards


def _items(tmp_path, n=2, method="ip2p"):
    rows = []
    for i in range(n):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(blocks(10 + i, 40, 32)).save(path)
        rows.append({"item_id": f"it{i}", "image_path": str(path), "edit_prompt": EDIT, "source_prompt": SRC,
                     "target_prompt": TGT})
    return pd.DataFrame(rows)


def test_edit_shard_ip2p_writes_and_redoes_a_damaged_item(models, tmp_path):
    items, out = _items(tmp_path), tmp_path / "out"
    kw = dict(settings=SMALL, batch_size=3, editor=models["editor"], encoder=models["encoder"], progress=False)
    res = ed.edit_shard(items, "ip2p", out, **kw)
    assert res == {"items": 2, "written": 2, "skipped": 0, "candidates": 8, "method": "ip2p"}
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["it0_0.png", "it0_1.png", "it1_0.png", "it1_1.png"]
    man = pd.read_parquet(out / "shard.parquet")
    assert list(man.columns) == list(ed.MANIFEST_SCHEMA) and len(man) == 8
    for _, g in man.groupby("item_id"):
        kept = g[g.kept].sort_values("rank")
        assert list(kept["rank"]) == [0, 1] and (g[~g.kept]["path"] == "").all()
        assert kept.similarity.iloc[0] >= kept.similarity.iloc[1] >= g[~g.kept].similarity.max()
    # (batch-size invariance, kill-and-rerun and cache hits: tests/test_shard_contract.py)
    # a truncated PNG (killed write) redoes that item only
    data = (out / "it1_1.png").read_bytes()
    (out / "it1_1.png").write_bytes(data[: len(data) // 2])
    res = ed.edit_shard(items, "ip2p", out, **kw)
    assert (res["written"], res["skipped"], res["candidates"]) == (1, 1, 4)
    (out / "it0_0.png").unlink()
    assert ed.edit_shard(items, "ip2p", out, **kw)["written"] == 1
    # another setting changes the key: everything is redone
    assert ed.edit_shard(items, "ip2p", out, **{**kw, "settings": ed.EditSettings(
        m=4, k=2, size=32, steps=3, guidance_range=(6.0, 6.0))})["written"] == 2


def test_edit_shard_null_text_through_registry(models, tmp_path):
    items, out = _items(tmp_path, n=1), tmp_path / "out"
    s = ed.EditSettings(m=3, k=2, size=32, inversion_steps=3, inner_steps=2, save_all=True)
    res = ed.edit_shard(items, "p2p", out, cfg=models["cfg"], settings=s, batch_size=2, device="cpu",
                        progress=False)
    assert res["method"] == "null_text" and res["written"] == 1
    man = pd.read_parquet(out / "shard.parquet")
    assert len(man) == 3 and man.kept.sum() == 2 and len(list((out / ".inversions").glob("*.pt"))) == 1
    assert sorted(p.name for p in out.glob("*.png")) == sorted(man.path)     # save_all keeps the dropped one
    assert {"cross", "self"} <= set(__import__("json").loads(man.params.iloc[0]))


def test_edit_shard_bad_inputs(models, tmp_path):
    kw = dict(settings=SMALL, editor=models["editor"], encoder=models["encoder"], progress=False)
    items = _items(tmp_path, n=2)
    bad = items.copy()
    bad.loc[1, "image_path"] = str(tmp_path / "missing.png")
    with pytest.raises(InputError, match=r"<items>, record it1: image .*missing\.png not found"):
        ed.edit_shard(bad, "ip2p", tmp_path / "o1", **kw)
    bad = items.copy()
    bad.loc[0, "edit_prompt"] = "  "
    with pytest.raises(InputError, match=r"record 0 \(item it0\): edit_prompt is empty"):
        ed.edit_shard(bad, "ip2p", tmp_path / "o2", **kw)
    with pytest.raises(InputError, match="missing columns \\['source_prompt'\\]"):
        ed.edit_shard(items.drop(columns=["source_prompt"]), "null_text", tmp_path / "o3", **kw)
    with pytest.raises(InputError, match="occurs twice"):
        ed.edit_shard(pd.concat([items, items]), "ip2p", tmp_path / "o4", **kw)
