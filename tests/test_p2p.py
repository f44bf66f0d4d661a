"""Prompt-to-Prompt attention control and the batched engine, on the tiny randomly initialised SD."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from counterfactory.generation import engine as compat
from counterfactory.generation import sampler as eng_mod
from counterfactory.generation.sampler import GenerationSettings, P2PEngine
from counterfactory.generation.selection import candidate_batches, candidate_seed, generate_set, make_candidate
from counterfactory.generation.p2p import AttentionController, apply_alignment, token_alignment

ORIGINAL = "a photo of a cat on the bed"
EDITED = "a photo of a dog on the bed"
LONGER = "a photo of a hippopotamus on the bed"


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory):
    from counterfactory.models import tiny

    return tiny.build("sd", tmp_path_factory.mktemp("tiny_vision"))


def _pipe(sd_dir):
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_pretrained(sd_dir, safety_checker=None, requires_safety_checker=False)


def _settings(**kw):
    base = dict(steps=3, height=32, width=32, batch_size=4)
    base.update(kw)
    return GenerationSettings(**base)


@pytest.fixture(scope="module")
def engine(sd_dir):
    e = P2PEngine(_pipe(sd_dir), _settings())
    yield e
    e.close()


@pytest.fixture(scope="module")
def tokenizer():
    from counterfactory.models.tiny import clip_tokenizer

    return clip_tokenizer()


def _cands(caption_id, n, settings, start=0):
    return [make_candidate(0, caption_id, i, settings) for i in range(start, start + n)]


# ----------------------------------------------------------------------------- seeds

def test_candidate_seed_is_sha256_of_ids():
    expected = int.from_bytes(hashlib.sha256(b"7:123_4:42").digest()[:8], "big")
    assert candidate_seed(7, "123_4", 42) == expected
    s = _settings()
    a, b = make_candidate(0, "x", 3, s), make_candidate(0, "x", 3, s)
    assert a == b and 0.1 <= a.p <= 0.9 and 7.5 <= a.guidance <= 15.0
    assert make_candidate(1, "x", 3, s).seed != a.seed
    # batching never changes which candidates exist or their parameters
    flat = [c for batch in candidate_batches(0, "x", 10, s, batch_size=3) for c in batch]
    assert flat == [make_candidate(0, "x", i, s) for i in range(10)]


# ----------------------------------------------------------------------------- token alignment

def test_token_alignment_equal_length_is_identity_plus_swap(tokenizer):
    a = tokenizer(ORIGINAL, padding="max_length", max_length=77).input_ids
    b = tokenizer(EDITED, padding="max_length", max_length=77).input_ids
    m = token_alignment(a, b)
    assert m.shape == (77, 77)
    np.testing.assert_array_equal(m, np.eye(77, dtype=np.float32))  # one-token swap: position kept


def test_token_alignment_unequal_lengths(tokenizer):
    a = tokenizer(ORIGINAL, padding="max_length", max_length=77).input_ids
    b = tokenizer(LONGER, padding="max_length", max_length=77).input_ids
    n_a = tokenizer(ORIGINAL).input_ids
    n_b = tokenizer(LONGER).input_ids
    d = len(n_b) - len(n_a)
    assert d >= 1, "hippopotamus must tokenise to more tokens than cat for this test"
    word = 5                                  # <bos> a photo of a [cat] ...
    assert a[:word] == b[:word] and a[word] != b[word]
    m = token_alignment(a, b)
    np.testing.assert_allclose(m.sum(1), 1.0)                                       # row-stochastic
    np.testing.assert_array_equal(m[:word, :word], np.eye(word))                    # prefix 1:1
    np.testing.assert_allclose(m[word, word:word + 1 + d], 1.0 / (1 + d))           # cat -> all its tokens
    bed_a = n_a.index(tokenizer.convert_tokens_to_ids("bed</w>"))
    assert m[bed_a, bed_a + d] == 1.0 and m[bed_a].sum() == 1.0                      # suffix shifted by d
    eos_a = len(n_a) - 1
    assert m[eos_a, eos_a + d] == 1.0
    # attention concentrated on "bed" follows the word; rows still sum to one
    probs = torch.zeros(2, 3, 4, 77)
    probs[..., bed_a] = 0.7
    probs[..., word] = 0.3
    out = apply_alignment(probs, torch.from_numpy(m))
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 3, 4))
    torch.testing.assert_close(out[..., bed_a + d], torch.full((2, 3, 4), 0.7))
    torch.testing.assert_close(out[..., word:word + 1 + d].sum(-1), torch.full((2, 3, 4), 0.3))
    # base attention @ M then values == base attention over values re-indexed by M (what the processor does)
    v = torch.randn(2, 3, 77, 5)
    torch.testing.assert_close(out @ v, probs @ (torch.from_numpy(m) @ v))
    # the batched form (one map per row) agrees
    maps = torch.from_numpy(m).expand(2, 77, 77)
    torch.testing.assert_close(apply_alignment(probs, maps), out)


# ----------------------------------------------------------------------------- controller

def test_controller_row_plan():
    c = AttentionController("ip2p_self")
    c.configure(n_candidates=2, group_size=2, p=[0.5, 0.0])
    c.set_step(0, 4)            # 0 < 0.5 for candidate 0 only; rows = [u00 u01 u10 u11 c00 c01 c10 c11]
    assert c.self_src.tolist() == [0, 0, 2, 3, 4, 4, 6, 7]
    assert c.cross_src is None
    c.set_step(2, 4)            # ip2p fraction 2/3 < 0.5 is false
    assert c.self_src is None
    h = AttentionController("hertz_cross", self_fraction=0.3)
    h.configure(2, 3, [1.0, 0.2], maps=torch.eye(77).expand(3, 77, 77))
    h.set_step(1, 4)            # frac 0.25: cross for candidate 0 (conditional half only); self for both
    assert h.cross_src.tolist() == list(range(6)) + [6, 6, 6, 9, 10, 11]
    assert h.cross_map_index.tolist() == [-1] * 6 + [-1, 1, 2, -1, -1, -1]
    assert h.self_src.tolist() == [0, 0, 0, 3, 3, 3, 6, 6, 6, 9, 9, 9]
    with pytest.raises(ValueError):
        AttentionController("bogus")


def _explicit_attention(attn, x, ctx):
    """softmax(QK^T * scale) per head, and V, computed by hand for one diffusers Attention layer."""
    q, k, v = attn.to_q(x), attn.to_k(ctx), attn.to_v(ctx)
    split = lambda t: t.view(t.shape[0], -1, attn.heads, t.shape[-1] // attn.heads).transpose(1, 2)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    return torch.softmax(q @ k.transpose(-1, -2) * attn.scale, dim=-1), v


def _finish(attn, out):
    out = out.transpose(1, 2).reshape(out.shape[0], -1, out.shape[1] * out.shape[-1])
    return attn.to_out[1](attn.to_out[0](out))


@torch.no_grad()
def test_processor_copies_attention_maps_exactly():
    """The processor's edited rows equal (copied base probabilities) @ (own values), computed by hand;
    for word swap the base cross-attention is carried through the token alignment first."""
    from diffusers.models.attention_processor import Attention

    from counterfactory.generation.p2p import P2PAttnProcessor

    torch.manual_seed(0)
    self_attn = Attention(query_dim=16, heads=2, dim_head=8)
    cross_attn = Attention(query_dim=16, cross_attention_dim=12, heads=2, dim_head=8)
    x = torch.randn(8, 10, 16)            # B=2 candidates x G=2 members x 2 CFG halves, 10 pixels
    ctx = torch.randn(8, 6, 12)           # 6 text tokens
    m = torch.from_numpy(token_alignment([1, 2, 3, 9, 9, 9], [1, 2, 4, 5, 3, 9]))
    ctrl = AttentionController("hertz_cross", self_fraction=1.0)
    ctrl.configure(2, 2, p=[1.0, 0.0], maps=torch.stack([torch.eye(6), m]))
    ctrl.set_step(0, 10)
    for attn in (self_attn, cross_attn):
        attn.set_processor(P2PAttnProcessor(ctrl))
    # self-attention: every edited row (1, 3, 5, 7) uses its base row's map (0, 2, 4, 6)
    probs, v = _explicit_attention(self_attn, x, x)
    src = torch.tensor([0, 0, 2, 2, 4, 4, 6, 6])
    torch.testing.assert_close(self_attn(x), _finish(self_attn, probs[src] @ v), rtol=1e-5, atol=1e-5)
    # cross-attention: only candidate 0 (p = 1) in the conditional half (row 5 from row 4) is edited
    probs, v = _explicit_attention(cross_attn, x, ctx)
    expected = probs @ v
    expected[5] = apply_alignment(probs[4], m) @ v[5]
    torch.testing.assert_close(cross_attn(x, encoder_hidden_states=ctx), _finish(cross_attn, expected),
                               rtol=1e-5, atol=1e-5)
    assert ctrl.calls["self_edited"] == 1 and ctrl.calls["cross_edited"] == 1


# ----------------------------------------------------------------------------- engine properties

def test_identical_prompts_give_identical_images(engine):
    cands = _cands("same", 3, engine.settings)
    res = engine.generate([ORIGINAL, ORIGINAL], cands)
    assert res.images.shape == (3, 2, 32, 32, 3) and res.images.dtype == np.uint8
    np.testing.assert_array_equal(res.latents[:, 0], res.latents[:, 1])
    np.testing.assert_array_equal(res.images[:, 0], res.images[:, 1])


def test_original_branch_unchanged_by_attention_control(engine):
    cands = _cands("orig", 3, engine.settings)
    controlled = engine.generate([ORIGINAL, EDITED], cands, p_override=[1.0] * 3)
    free = engine.generate([ORIGINAL, EDITED], cands, p_override=[0.0] * 3)
    np.testing.assert_array_equal(controlled.latents[:, 0], free.latents[:, 0])
    np.testing.assert_array_equal(controlled.images[:, 0], free.images[:, 0])
    assert not np.array_equal(controlled.latents[:, 1], free.latents[:, 1])


@pytest.mark.parametrize("mode", ["ip2p_self", "hertz_cross"])
def test_sharp_attention_p1_closer_than_p0(sd_dir, mode):
    pipe = _pipe(sd_dir)
    with torch.no_grad():   # sharpen every attention on purpose so shared maps matter
        for name, module in pipe.unet.named_modules():
            if name.endswith(("attn1", "attn2")):
                module.to_q.weight.mul_(8.0)
                module.to_k.weight.mul_(8.0)
    e = P2PEngine(pipe, _settings(control=mode))
    cands = _cands("sharp", 4, e.settings)
    prompts = [ORIGINAL, LONGER]
    r1 = e.generate(prompts, cands, p_override=[1.0] * 4)
    r0 = e.generate(prompts, cands, p_override=[0.0] * 4)
    dist = lambda r: np.linalg.norm((r.latents[:, 0] - r.latents[:, 1]).reshape(4, -1), axis=1)  # noqa: E731
    assert np.all(dist(r1) < dist(r0)), (dist(r1), dist(r0))
    if mode == "hertz_cross":
        assert e.controller.calls["cross_edited"] > 0
    e.close()


def test_unet_evaluations_are_counted(engine):
    before = engine.unet_evals
    engine.generate([ORIGINAL, EDITED], _cands("count", 2, engine.settings))
    assert engine.unet_evals - before == 2 * 2 * 2 * engine.settings.steps   # CFG x members x cands x steps


def test_batch_size_independence(engine):
    """Each candidate's randomness is its own: the same candidate gives the same result in a batch of
    4, in batches of 2 and alone. Batched CPU kernels may round differently for different batch shapes,
    so latents agree to float tolerance and 8-bit images to at most 2 levels on a handful of pixels."""
    cands = _cands("bs", 4, engine.settings)
    full = engine.generate([ORIGINAL, EDITED], cands)
    halves = [engine.generate([ORIGINAL, EDITED], cands[i:i + 2]) for i in (0, 2)]
    singles = [engine.generate([ORIGINAL, EDITED], [c]) for c in cands]
    lat_h = np.concatenate([h.latents for h in halves])
    lat_s = np.concatenate([s.latents for s in singles])
    img_s = np.concatenate([s.images for s in singles])
    np.testing.assert_allclose(lat_h, full.latents, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(lat_s, full.latents, rtol=1e-4, atol=1e-3)
    diff = np.abs(img_s.astype(int) - full.images.astype(int))
    assert diff.max() <= 2 and (diff > 0).mean() < 0.01
    # same batch shape -> bit-identical (what resumption relies on)
    again = engine.generate([ORIGINAL, EDITED], cands)
    np.testing.assert_array_equal(again.images, full.images)


def test_hertz_mode_with_unequal_token_lengths(sd_dir):
    e = P2PEngine(_pipe(sd_dir), _settings(control="hertz_cross", hertz_self_fraction=0.5))
    res = e.generate([ORIGINAL, LONGER], _cands("hz", 2, e.settings), p_override=[1.0, 1.0])
    assert res.images.shape == (2, 2, 32, 32, 3)
    assert e.controller.calls["cross_edited"] > 0
    e.close()


def test_counterfactual_sets_share_the_base(engine):
    """SocialCounterfactuals-style set: base + 3 edits in one batch; a member equal to the base
    prompt reproduces the base image exactly, and the base matches the pair engine's base."""
    sets = list(generate_set(engine, ORIGINAL, [EDITED, ORIGINAL, LONGER], "set1", n=2))
    imgs = np.concatenate([b.images for b in sets])
    assert imgs.shape == (2, 4, 32, 32, 3)
    np.testing.assert_array_equal(imgs[:, 2], imgs[:, 0])
    assert not np.array_equal(imgs[:, 1], imgs[:, 0])
    pair = engine.generate([ORIGINAL, EDITED], _cands("set1", 2, engine.settings))
    np.testing.assert_allclose(np.concatenate([b.latents for b in sets])[:, 0], pair.latents[:, 0],
                               rtol=1e-4, atol=1e-3)


def test_bad_arguments(engine):
    with pytest.raises(ValueError):
        engine.generate([ORIGINAL], _cands("x", 1, engine.settings))
    with pytest.raises(ValueError):
        engine.generate([ORIGINAL, EDITED], [])
    from counterfactory.errors import ConfigError

    with pytest.raises(ConfigError):
        GenerationSettings(control="nope")
    with pytest.raises(ConfigError):
        GenerationSettings(p_range=(0.9, 0.1))
    with pytest.raises(ConfigError, match="multiples"):
        P2PEngine(_pipe_cached(engine), _settings(height=30))


def _pipe_cached(engine):
    class _P:  # reuse the loaded components; only the size check matters here
        unet, vae, text_encoder, tokenizer = engine.unet, engine.vae, engine.text_encoder, engine.tokenizer
        scheduler = engine.scheduler_cls.from_config(engine.scheduler_config)
    return _P()


def test_schedulers_from_config(sd_dir):
    for name in eng_mod.SCHEDULERS:
        e = P2PEngine(_pipe(sd_dir), _settings(scheduler=name, steps=2))
        res = e.generate([ORIGINAL, EDITED], _cands("sched", 1, e.settings))
        assert res.images.shape == (1, 2, 32, 32, 3)
        e.close()


def test_engine_module_is_a_thin_reexport_of_the_split_modules():
    from counterfactory.generation import sampler, selection, shards

    assert compat.P2PEngine is sampler.P2PEngine and compat.GenerationSettings is sampler.GenerationSettings
    assert compat.SelectionSettings is selection.SelectionSettings
    assert compat.make_candidate is selection.make_candidate
    assert compat.overgenerate_caption is selection.overgenerate_caption
    assert compat.run_shard is shards.run_shard and compat.merge_shards is shards.merge_shards
    import inspect

    assert not [n for n, o in vars(compat).items() if inspect.isfunction(o) and o.__module__ == compat.__name__]


# ----------------------------------------------------------------------------- the ip2p copy window

def _expected_copy_steps(p: float, total: int) -> int:
    """Steps 0..n-1 copy self-attention, n written independently of the code: InstructPix2Pix's
    generator copies at step index i iff p > i / (T - 1) (exact rational arithmetic here)."""
    from fractions import Fraction

    if total == 1:
        return int(p > 0)
    return sum(1 for i in range(total) if Fraction(i, total - 1) < Fraction(p))


@pytest.mark.parametrize("p, total, last", [
    (0.1, 100, 9), (0.5, 100, 49), (0.9, 100, 89), (0.333, 100, 32),   # 0.333 * 99 = 32.967
    (0.5, 5, 1),                 # 2/4 = 0.5 is not < 0.5: strict comparison; so p = 1 skips the last step
    (0.5, 3, 0), (0.5, 11, 4), (1.0, 10, 8), (0.0, 10, -1), (0.75, 2, 0), (0.3, 1, 0),
])
def test_ip2p_copy_window_boundary(p, total, last):
    """The last step index at which the edited branch copies the base self-attention."""
    from counterfactory.generation.p2p import ip2p_active

    assert _expected_copy_steps(p, total) - 1 == last
    c = AttentionController("ip2p_self")
    c.configure(n_candidates=1, group_size=2, p=[p])
    on = []
    for i in range(total):
        c.set_step(i, total)
        on.append(c.self_src is not None)
        assert ip2p_active(i, total, p) == on[-1]
    assert on == [i <= last for i in range(total)]
    with pytest.raises(ValueError):
        c.set_step(total, total)


def test_engine_uses_the_ip2p_window(engine, monkeypatch):
    """In the sampler loop (3 steps), p = 0.5 copies at step 0 only (1/2 is not < 0.5; the old i/T rule
    would also have copied at step 1); p = 0.51 copies at steps 0 and 1."""
    active = []
    real = engine.controller.set_step

    def spy(step, total):
        real(step, total)
        active.append((step, engine.controller.self_src is not None))

    monkeypatch.setattr(engine.controller, "set_step", spy)
    cands = _cands("window", 1, engine.settings)
    engine.generate([ORIGINAL, EDITED], cands, p_override=[0.5])
    assert active == [(0, True), (1, False), (2, False)]
    active.clear()
    engine.generate([ORIGINAL, EDITED], cands, p_override=[0.51])
    assert active == [(0, True), (1, True), (2, False)]


# ----------------------------------------------------------------------------- the vae role

@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory):
    from counterfactory.models import tiny

    return tiny.build("vae", tmp_path_factory.mktemp("tiny_vae"))


@torch.no_grad()
def test_configured_vae_decodes_instead_of_the_pipelines(sd_dir, vae_dir):
    """With a ``vae`` the images are that VAE's decoding of the latents; the pipeline's VAE is unused."""
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(vae_dir)
    own = P2PEngine(_pipe(sd_dir), _settings())
    pipe = _pipe(sd_dir)

    def unused(*a, **k):
        raise AssertionError("the pipeline's own VAE was used")

    pipe.vae.decode = unused
    swapped = P2PEngine(pipe, _settings(), vae=vae)
    assert swapped.vae is vae
    cands = _cands("vae", 2, own.settings)
    a = own.generate([ORIGINAL, EDITED], cands)
    b = swapped.generate([ORIGINAL, EDITED], cands)
    np.testing.assert_array_equal(a.latents, b.latents)          # same sampling, different decoder
    assert not np.array_equal(a.images, b.images)
    lat = torch.from_numpy(b.latents.reshape(-1, *b.latents.shape[2:]))
    x = vae.decode(lat / vae.config.scaling_factor).sample
    expected = ((x / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    np.testing.assert_array_equal(b.images.reshape(expected.shape), expected)
    own.close()
    swapped.close()


def test_vae_with_wrong_latent_channels_is_a_config_error(sd_dir):
    from diffusers import AutoencoderKL

    from counterfactory.errors import ConfigError

    bad = AutoencoderKL(latent_channels=3, block_out_channels=(8,), norm_num_groups=8)
    with pytest.raises(ConfigError, match="latent channels"):
        P2PEngine(_pipe(sd_dir), _settings(), vae=bad)


# ----------------------------------------------------------------------------- compiled UNet (issue 33, part 3)

def test_p2p_control_compiles_as_one_graph_per_copy_state(sd_dir):
    """The ip2p_self control traces whole (``fullgraph=True``: no graph break), so the compiled UNet can run as
    CUDA graphs: one graph for the steps that copy self-attention and one for those that do not, none more for
    later steps or a second batch, and the same images as the eager UNet."""
    import torch._dynamo

    eager = P2PEngine(_pipe(sd_dir), _settings(steps=4))
    compiled = P2PEngine(_pipe(sd_dir), _settings(steps=4))
    graphs = []

    def backend(gm, example_inputs):          # counts the graphs Dynamo hands over, runs them as traced
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        compiled.unet.forward = torch.compile(compiled.unet.forward, backend=backend, fullgraph=True)
        cands = _cands("graphs", 2, compiled.settings)
        p = [0.4, 0.9]                        # copies at steps 0-1 (both), step 2 (one), none at step 3
        got = compiled.generate([ORIGINAL, EDITED], cands, p_override=p)
        assert len(graphs) == 2
        again = compiled.generate([ORIGINAL, EDITED], _cands("graphs-2", 2, compiled.settings), p_override=p)
        assert len(graphs) == 2 and again.images.shape == got.images.shape
    finally:
        torch._dynamo.reset()
        compiled.close()
    want = eager.generate([ORIGINAL, EDITED], cands, p_override=p)
    eager.close()
    np.testing.assert_allclose(got.latents, want.latents, rtol=1e-5, atol=1e-5)
    assert not np.allclose(got.latents[:, 0], got.latents[:, 1])   # the edit did something


def test_controller_puts_the_step_rows_on_its_device():
    c = AttentionController("ip2p_self", device="cpu")
    c.configure(2, 2, [1.0, 0.0])
    c.set_step(0, 3)
    assert c.self_src.device == torch.device("cpu") and c.self_src.tolist() == [0, 0, 2, 3, 4, 4, 6, 7]


def test_euler_ancestral_uses_the_reference_sigmas():
    """Issue 42 item 10: the reference (InstructPix2Pix's generator, B.1.2) samples with k-diffusion's Euler-ancestral
    over the CompVis sigma table, log-linear between table entries; diffusers' scheduler interpolates sigma linearly
    (8.5e-5 relative apart at 100 steps). The engine uses the reference's. Values: k-diffusion 0.1.1.post1,
    CompVisDenoiser.get_sigmas(100) on SD v1.5's schedule (scaled_linear betas 0.00085 to 0.012, 1000 steps)."""
    from diffusers import EulerAncestralDiscreteScheduler

    from counterfactory.generation.sampler import compvis_sigmas

    sch = EulerAncestralDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                          num_train_timesteps=1000, steps_offset=1)
    ours = compvis_sigmas(sch.alphas_cumprod, 100)
    k_diffusion = [14.6146469116, 13.7524929047, 12.9524354935, 1.588632226, 0.138615936, 0.098694928,
                   0.0291675366, 0.0]
    np.testing.assert_allclose(ours[[0, 1, 2, 50, 97, 98, 99, 100]], k_diffusion, rtol=1e-6, atol=1e-9)
    sch.set_timesteps(100)
    diffusers_own = sch.sigmas.double().numpy()
    assert len(diffusers_own) == len(ours) == 101
    rel = np.abs(diffusers_own[:-1] - ours[:-1]) / ours[:-1]
    assert 1e-5 < rel.max() < 2e-4              # close, not the same: the reference's are used
    at_table = compvis_sigmas(sch.alphas_cumprod, 1000)[::-1][1:]   # integer times: the table itself
    np.testing.assert_allclose(at_table, np.sqrt((1 - sch.alphas_cumprod.double().numpy()) /
                                                 sch.alphas_cumprod.double().numpy()), rtol=1e-9)


def test_engine_scheduler_carries_the_reference_sigmas(tmp_path):
    from counterfactory.generation.sampler import GenerationSettings, P2PEngine, compvis_sigmas
    from counterfactory.models import registry, tiny

    path = tiny.build("sd", tmp_path)
    pipe = registry.load({"device": "cpu", "precision": "fp32", "models": {"sd": {"source": str(path)}}}, "sd")
    settings = GenerationSettings(steps=7, height=32, width=32, scheduler="euler_ancestral", control="ip2p_self",
                                  p_range=(0.1, 0.9), guidance_range=(7.5, 15.0), hertz_self_fraction=0.0,
                                  negative_prompt="", batch_size=1)
    engine = P2PEngine(pipe, settings)
    scheduler = engine.make_scheduler()
    np.testing.assert_allclose(scheduler.sigmas.double().numpy(), compvis_sigmas(scheduler.alphas_cumprod, 7),
                               rtol=1e-6)
    assert float(scheduler.init_noise_sigma) == pytest.approx(float(scheduler.sigmas[0]))
