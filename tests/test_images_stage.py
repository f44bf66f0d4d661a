"""The sharded, resumable image stage (run_shard / merge_shards / CLI) on the tiny models."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from counterfactory import cli
from counterfactory.config import load_config
from counterfactory.errors import InputError
from counterfactory.generation.sampler import build_engine
from counterfactory.generation.shards import merge_shards, read_pairs, run_shard

REPO = Path(__file__).resolve().parents[1]

PAIRS = [
    # caption_id, source_index, original, counterfactual
    ("101_0", 0, "A man riding a horse on the beach.", "A man riding a cow on the beach."),
    ("101_1", 1, "Two dogs sitting on a couch.", "Two cats sitting on a couch."),
    ("102_0", 3, "A plate of pizza on a table.", "A plate of cake on a table."),
    ("102_2", 4, "A red bus parked in the street.", "A red truck parked in the street."),
    ("103_1", 5, "A woman holding an umbrella.", "A woman holding a kite."),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from counterfactory.models import tiny

    out = tmp_path_factory.mktemp("tiny_vision")
    return {role: str(tiny.build(role, out)) for role in ("sd", "clip_filter", "vae")}


def _cfg(models, **images):
    img = {"shard_size": 3, "candidates_per_pair": 3, "batch_size": 2, "steps": 2, "height": 32, "width": 32}
    img.update(images)
    overrides = {"models": {"sd": {"source": models["sd"]}, "clip_filter": {"source": models["clip_filter"]},
                            "vae": {"source": models["vae"]}},
                 "images": img}
    return load_config([REPO / "config" / "demo.yaml"], overrides)


@pytest.fixture(scope="module")
def cfg(models):
    return _cfg(models)


@pytest.fixture(scope="module")
def engine(cfg):
    return build_engine(cfg)


@pytest.fixture(scope="module")
def scorer(cfg):
    from counterfactory.filters import ClipScorer

    return ClipScorer.from_config(cfg)


def _write_pairs(path: Path, rows=PAIRS, drop: tuple = ()) -> Path:
    df = pd.DataFrame(rows, columns=["caption_id", "source_index", "original", "counterfactual"])
    df["image_id"] = [c.split("_")[0] for c in df["caption_id"]]
    df["original_word"], df["new_word"], df["position"] = "x", "y", 1
    df["similarity"], df["perplexity"] = 0.85, 20.0
    df = df.drop(columns=list(drop))
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return path


def _config_file(cfg, path: Path) -> Path:
    """Write a study view (what load_config returns) as a job configuration file."""
    from counterfactory.config import JOB_KEY

    data = json.loads(json.dumps(dict(cfg)))
    data[JOB_KEY] = {"digest": "test", "sections": sorted(k for k in data if k not in ("study", "run_name"))}
    path.write_text(yaml.safe_dump(data))
    return path


def _run(cfg, pairs, shard, out, engine, scorer, **kw):
    return run_shard(cfg, pairs, shard, out, engine=engine, scorer=scorer, progress=False, **kw)


def test_shard_outputs(tmp_path, cfg, engine, scorer):
    pairs = _write_pairs(tmp_path / "pairs.parquet")
    out = tmp_path / "shard0"
    summary = _run(cfg, pairs, "00000", out, engine, scorer)
    assert summary["captions"] == 2 and summary["source_index_range"] == [0, 3]
    scores = pd.read_parquet(out / "candidate_scores.parquet")
    assert len(scores) == 2 * 3 and set(scores["caption_id"]) == {"101_0", "101_1"}
    assert scores["p"].between(0.1, 0.9).all() and scores["guidance"].between(7.5, 15).all()
    sel = pd.read_parquet(out / "selected_pairs.parquet")
    assert list(sel.columns[:5]) == ["id", "caption_0", "caption_1", "image_0", "image_1"]
    for _, row in sel.iterrows():
        assert row["image_0"] == f"images/{row['id']}_img_0.png" and (out / row["image_1"]).exists()
        best = scores[(scores.caption_id == row["caption_id"]) & scores.passed].sort_values(
            ["sim_direction", "candidate_index"], ascending=[False, True]).iloc[0]
        assert row["candidate_index"] == best["candidate_index"]
    assert summary["pairs_selected"] == len(sel) == scores["selected"].sum()
    assert summary["unet_evals"] == 2 * 3 * 2 * 2 * 2      # captions x candidates x CFG x members x steps
    assert not (out / "work").exists()                     # keep_work: false
    assert json.loads((out / "summary.json").read_text()) == summary


def test_adaptive_mode_stops_early(tmp_path, models, scorer):
    cfg = _cfg(models, candidates_per_pair=6, batch_size=2,
               filter={"image_caption_min": -1.0, "image_image_min": -1.0, "direction_min": -1.0, "top_k": 1},
               adaptive={"enabled": True})
    engine = build_engine(cfg)
    pairs = _write_pairs(tmp_path / "pairs.parquet")
    summary = _run(cfg, pairs, 0, tmp_path / "ad", engine, scorer)
    assert summary["adaptive"] and summary["stopped_early"] == 2
    assert summary["candidates_generated"] == 2 * 2           # one batch of 2 per caption, not 6
    assert summary["unet_evals"] == 2 * 2 * 2 * 2 * 2
    assert summary["pairs_selected"] == 2


def test_bad_pairs_are_logged_rejections(tmp_path, cfg, engine, scorer, caplog):
    rows = [("1_0", 0, "A cat on a bed.", "A dog on a bed."), ("1_1", 1, "  ", "A dog."),
            ("1_2", 2, "A cat.", "a  cat.")]
    pairs = _write_pairs(tmp_path / "pairs.parquet", rows)
    with caplog.at_level(logging.WARNING):
        summary = _run(cfg, pairs, 0, tmp_path / "out", engine, scorer)
    assert summary["captions"] == 3 and summary["captions_rejected"] == 2 and summary["captions_generated"] == 1
    assert [(r["caption_id"], r["reason"]) for r in summary["rejected_captions"]] == [
        ("1_1", "empty_prompt:original"), ("1_2", "identical_pair")]
    assert "1_1" in caplog.text and "identical_pair" in caplog.text


def test_non_finite_scores_reject_candidates(tmp_path, cfg, engine, scorer, caplog):
    class NanScorer:
        def score_pairs(self, t0, t1, a, b):
            s = scorer.score_pairs(t0, t1, a, b)
            s["sim_direction"][:] = np.nan
            return s

    pairs = _write_pairs(tmp_path / "pairs.parquet")
    with caplog.at_level(logging.WARNING):
        summary = _run(cfg, pairs, 0, tmp_path / "nan", engine, NanScorer())
    scores = pd.read_parquet(tmp_path / "nan" / "candidate_scores.parquet")
    assert len(scores) == 6 and not scores["passed"].any()
    assert (scores["reject_reason"] == "non_finite_score").all()
    assert summary["pairs_selected"] == 0 and "non-finite" in caplog.text


def test_bad_input_files(tmp_path, cfg, engine, scorer):
    with pytest.raises(InputError, match="not found"):
        read_pairs(tmp_path / "missing.parquet")
    with pytest.raises(InputError, match="missing column"):
        read_pairs(_write_pairs(tmp_path / "a.parquet", drop=("counterfactual",)))
    dup = PAIRS[:2] + [("101_0", 2, "A b.", "A c.")]
    with pytest.raises(InputError, match="duplicate caption_id"):
        read_pairs(_write_pairs(tmp_path / "b.parquet", dup))
    with pytest.raises(InputError, match="caption_id"):
        read_pairs(_write_pairs(tmp_path / "c.parquet", [("a/b", 0, "A b.", "A c.")]))
    with pytest.raises(InputError, match="shard output missing"):
        merge_shards([tmp_path / "nope"], tmp_path / "merged")


def test_empty_shard_writes_empty_tables(tmp_path, cfg, engine, scorer):
    pairs = _write_pairs(tmp_path / "pairs.parquet")
    summary = _run(cfg, pairs, 7, tmp_path / "empty", engine, scorer)
    assert summary["captions"] == 0
    sel = pd.read_parquet(tmp_path / "empty" / "selected_pairs.parquet")
    assert len(sel) == 0 and list(sel.columns[:5]) == ["id", "caption_0", "caption_1", "image_0", "image_1"]
    assert (tmp_path / "empty" / "images").is_dir()


def test_cli_generate_and_merge(tmp_path, models, capsys):
    cfg = _cfg(models, save_all_candidates=True)
    cfg_path = _config_file(cfg, tmp_path / "cfg.yaml")
    pairs = _write_pairs(tmp_path / "pairs.parquet", PAIRS[:2])
    shard = tmp_path / "images" / "shards" / "00000"
    rc = cli.main(["images", "generate", "--config", str(cfg_path), "--pairs", str(pairs), "--shard", "00000",
                   "--out-dir", str(shard), "--threads", "2", "--no-progress"])
    assert rc == 0
    assert len(list((shard / "images" / "candidates" / "101_0").glob("*.png"))) == 3 * 2
    rc = cli.main(["images", "merge", "--shard-dirs", str(shard), "--out-dir", str(tmp_path / "images")])
    assert rc == 0
    sel = pd.read_parquet(tmp_path / "images" / "selected_pairs.parquet")
    for p in sel["image_0"]:
        assert (tmp_path / "images" / p).exists()
    rc = cli.main(["images", "generate", "--config", str(cfg_path), "--pairs", str(tmp_path / "none.parquet"),
                   "--shard", "0", "--out-dir", str(shard), "--no-progress"])
    assert rc == 2 and "not found" in capsys.readouterr().err


def test_stale_build_folder_of_a_killed_assembly_is_removed(tmp_path, cfg, engine, scorer):
    pairs = _write_pairs(tmp_path / "pairs.parquet")
    out = tmp_path / "shard"
    out.mkdir()
    stale = out / ".images.build-k1ll3d00"
    stale.mkdir()
    (stale / "101_0_img_0.png").write_bytes(b"half")
    _run(cfg, pairs, 0, out, engine, scorer)
    assert not stale.exists() and (out / "images").is_dir()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_model_identification_failure_is_an_error(tmp_path, cfg, engine, scorer, monkeypatch):
    from counterfactory.errors import CounterFactoryError
    from counterfactory.models import registry

    def broken(*a, **k):
        raise CounterFactoryError("models.sd: cannot identify /nowhere. Fix: rebuild it")

    monkeypatch.setattr(registry, "configured_models", broken)
    with pytest.raises(CounterFactoryError, match="cannot identify"):
        _run(cfg, _write_pairs(tmp_path / "pairs.parquet"), 0, tmp_path / "out", engine, scorer)


# --------------------------------------------------------------------------- the optional vae role

def _without_vae(cfg) -> dict:
    plain = json.loads(json.dumps(dict(cfg)))
    del plain["models"]["vae"]
    return plain


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_vae_role_decodes_and_keys_the_cache(tmp_path, models, cfg, engine):
    """The configured ``vae`` is the engine's decoder (not the sd folder's own VAE), and its content
    fingerprint is part of the resume-cache key and the shard config digest; absent, nothing changes."""
    import torch
    from diffusers import AutoencoderKL

    from counterfactory.generation import shards
    from counterfactory.models import registry

    role_vae = AutoencoderKL.from_pretrained(models["vae"])
    pipe_vae = AutoencoderKL.from_pretrained(Path(models["sd"]) / "vae")
    mine = engine.vae.state_dict()
    for name, tensor in role_vae.state_dict().items():
        torch.testing.assert_close(mine[name], tensor)
    assert any(not torch.equal(mine[n], t) for n, t in pipe_vae.state_dict().items())

    assert shards.model_roles(cfg) == ("sd", "clip_filter", "vae")
    ctx = shards._shard_context(cfg)
    assert ctx.models["vae"]["fingerprint"] == registry.fingerprint(models["vae"])
    row = {"caption_id": "1_0", "original": "A cat.", "counterfactual": "A dog."}
    other = shards._shard_context(cfg)
    other.models = {**other.models, "vae": {**other.models["vae"], "fingerprint": "0" * 64}}
    assert shards._caption_fingerprint(ctx, row) != shards._caption_fingerprint(other, row)

    plain = _without_vae(cfg)
    assert shards.model_roles(plain) == ("sd", "clip_filter")
    assert "vae" not in shards._shard_context(plain).models
    assert shards.images_config_digest(plain) != shards.images_config_digest(cfg)
    own = build_engine(plain)
    for name, tensor in pipe_vae.state_dict().items():
        torch.testing.assert_close(own.vae.state_dict()[name], tensor)
    own.close()


# ------------------------------------------------------------------ issue 42 items 7 and 8 (B.1.2 fidelity)
def test_paper_config_runs_the_image_stage_as_fp16_autocast_over_fp32_weights(models):
    """Issue 42 item 7: B.1.2's generator (InstructPix2Pix's) ran generation and the CLIP filter under fp16 autocast
    over fp32 weights; images.autocast (true in the paper config) does that, false casts the weights (pure)."""
    import torch

    from counterfactory.device import engine_dtypes
    from counterfactory.filters import ClipScorer

    paper = load_config([REPO / "config" / "config.yaml"], study="coco_counterfactuals")
    assert paper["images"]["precision"] == "fp16" and paper["images"]["autocast"] is True
    assert engine_dtypes(torch.float16, True) == (torch.float32, torch.float16)
    assert engine_dtypes(torch.float16, False) == (torch.float16, None)
    assert engine_dtypes(torch.float32, True) == (torch.float32, None)
    # on CPU fp16 falls back to fp32, so the mechanism is checked with bf16 (CPU autocast supports it)
    cfg = _cfg(models, precision="bf16")
    cfg = {**dict(cfg), "precision": "bf16", "device": "cpu"}
    auto = build_engine(cfg, autocast=True)
    assert {p.dtype for p in auto.unet.parameters()} == {torch.float32} and auto.autocast_dtype == torch.bfloat16
    pure = build_engine(cfg, autocast=False)
    assert {p.dtype for p in pure.unet.parameters()} == {torch.bfloat16} and pure.autocast_dtype is None
    scorer = ClipScorer.from_config(cfg, autocast=True)
    assert scorer.dtype == torch.float32 and scorer.autocast_dtype == torch.bfloat16
    from counterfactory.generation.selection import make_candidate

    cand = [make_candidate(0, "101_0", 0, auto.settings)]
    a = auto.generate(["a red bus", "a red truck"], cand)
    b = pure.generate(["a red bus", "a red truck"], cand)
    assert a.latents.dtype == np.float32 and np.isfinite(a.latents).all()
    assert not np.array_equal(a.latents, b.latents)       # two different computations, both options work
    emb = scorer.embed_images(a.images[0])
    assert np.isfinite(emb).all()


def test_shard_stage_builds_engine_and_filter_with_the_configured_autocast(tmp_path, models, monkeypatch):
    from counterfactory.filters import ClipScorer
    from counterfactory.generation import shards

    seen = {}
    real_build, real_scorer = shards.build_engine, ClipScorer.from_config.__func__

    def fake_build(cfg, autocast=False):
        seen["engine"] = autocast
        return real_build(cfg, autocast=autocast)

    def fake_scorer(cls, cfg, *a, autocast=False, **k):
        seen["scorer"] = autocast
        return real_scorer(cls, cfg, *a, autocast=autocast, **k)

    monkeypatch.setattr(shards, "build_engine", fake_build)
    monkeypatch.setattr(ClipScorer, "from_config", classmethod(fake_scorer))
    pairs = _write_pairs(tmp_path / "pairs.parquet")
    run_shard(_cfg(models, candidates_per_pair=1), pairs, 0, tmp_path / "a", progress=False)
    assert seen == {"engine": True, "scorer": True}              # the schema default, as the paper config
    run_shard(_cfg(models, candidates_per_pair=1, autocast=False), pairs, 0, tmp_path / "b", progress=False)
    assert seen == {"engine": False, "scorer": False}


def test_clip_filter_scores_the_decoded_images_before_quantisation(tmp_path, cfg, engine, scorer):
    """Issue 42 item 8: InstructPix2Pix's filter (B.1.2) scores the decoded float images; the PNGs are what is saved.
    images.filter.score_images: decoded (paper config) scores those; png (option) the saved 8-bit images."""
    from counterfactory.filters import FilterThresholds
    from counterfactory.generation.selection import SelectionSettings, make_candidate, overgenerate_caption

    paper = load_config([REPO / "config" / "config.yaml"], study="coco_counterfactuals")
    assert paper["images"]["filter"]["score_images"] == "decoded"
    cand = [make_candidate(0, "101_0", i, engine.settings) for i in range(2)]
    res = engine.generate(["A man riding a horse.", "A man riding a cow."], cand, float_images=True)
    assert res.float_images.dtype == np.float32 and res.float_images.shape == res.images.shape
    assert np.array_equal((res.float_images * 255).round().astype(np.uint8), res.images)   # the PNGs' pixels
    assert not np.array_equal(res.float_images * 255, res.images.astype(np.float32))     # quantisation changed them
    th = FilterThresholds.from_config(cfg["images"]["filter"])
    out = {}
    for mode in ("decoded", "png"):
        out[mode] = overgenerate_caption(engine, scorer, th, "101_0", "A man riding a horse.", "A man riding a cow.",
                                         2, int(cfg["seed"]), SelectionSettings(score_images=mode, top_k=1))
    fl = scorer.score_pairs("A man riding a horse.", "A man riding a cow.", res.float_images[:, 0],
                            res.float_images[:, 1])
    q = scorer.score_pairs("A man riding a horse.", "A man riding a cow.", res.images[:, 0], res.images[:, 1])
    got_decoded = [s["sim_0"] for s in out["decoded"].scores]
    got_png = [s["sim_0"] for s in out["png"].scores]
    np.testing.assert_allclose(got_decoded, fl["sim_0"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got_png, q["sim_0"], rtol=0, atol=1e-6)
    assert not np.allclose(fl["sim_0"], q["sim_0"], rtol=0, atol=1e-9)
