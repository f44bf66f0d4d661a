"""SocialCounterfactuals set generation (generation/sets.py and `social generate`) on the tiny SD."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from counterfactory.config import load_config
from counterfactory.errors import ConfigError, InputError
from counterfactory.generation import sets as sets_mod
from counterfactory.generation.sampler import build_engine
from counterfactory.generation.selection import candidate_seed
from counterfactory.generation.sets import merge_set_shards, read_sets, run_set_shard

REPO = Path(__file__).resolve().parents[1]
N = 3   # candidate sets per caption set


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from counterfactory.models import tiny

    out = tmp_path_factory.mktemp("tiny_vision")
    return {role: str(tiny.build(role, out)) for role in ("sd", "vae")}


def _cfg(models, **images) -> dict:
    """A social-study-like view: the demo's shared sections with the set-generation ``images`` keys."""
    base = load_config([REPO / "config" / "demo.yaml"],
                       {"models": {"sd": {"source": models["sd"]}, "vae": {"source": models["vae"]}}})
    cfg = json.loads(json.dumps(dict(base)))
    cfg["models"] = {"sd": {"source": models["sd"]}, "vae": {"source": models["vae"]}}
    img = {"set_shard_size": 2, "candidates_per_set": N, "batch_size": 2, "steps": 2, "height": 32, "width": 32,
           "attention_control": "ip2p_self", "p_range": [0.1, 0.9], "guidance_range": [7.5, 15.0],
           "scheduler": "euler_ancestral"}
    img.update(images)
    cfg["images"] = img
    cfg["study"] = "social_counterfactuals"
    return cfg


@pytest.fixture(scope="module")
def cfg(models):
    return _cfg(models)


@pytest.fixture(scope="module")
def engine(cfg):
    e = build_engine(cfg)
    yield e
    e.close()


def _set_rows(set_id, segment, subject, attrs, prefix="A photo of"):
    """One set: the base (first attribute combination) then the counterfactual members."""
    rows = []
    for m, (a1, a2) in enumerate(attrs):
        rows.append({"set_id": set_id, "segment": segment, "prefix": prefix, "subject": subject,
                     "a1_type": segment.split("-")[0], "a1": a1, "a2_type": segment.split("-")[1], "a2": a2,
                     "caption": f"{prefix} {a1} {a2} {subject}".strip(), "member_index": m})
    return rows


RG = [("white", "male"), ("white", "female"), ("black", "male")]
PG = [("skinny", "male"), ("skinny", "female")]
TABLE = (_set_rows("rg_doctor", "race-gender", "doctor", RG)
         + _set_rows("pg_nurse", "physical-gender", "nurse", PG)
         + _set_rows("rg_chef", "race-gender", "chef", RG, prefix="")
         + _set_rows("pg_pilot", "physical-gender", "pilot", PG))
# sorted set ids: pg_nurse, pg_pilot, rg_chef, rg_doctor


def _write(path: Path, rows=TABLE, drop=(), shuffle=False) -> Path:
    df = pd.DataFrame(rows).drop(columns=list(drop))
    if shuffle:
        df = df.sample(frac=1.0, random_state=3)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return path


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _run(cfg, sets, shard, out, engine, **kw):
    return run_set_shard(cfg, sets, shard, out, engine=engine, progress=False, **kw)


def _load_images(folder: Path, table: pd.DataFrame) -> np.ndarray:
    from PIL import Image

    return np.stack([np.asarray(Image.open(folder / p)) for p in table["image_path"]])


# --------------------------------------------------------------------------- outputs

def test_shard_outputs_and_shared_candidate_parameters(tmp_path, cfg, engine):
    sets = _write(tmp_path / "sets.parquet")
    out = tmp_path / "s1"
    before = engine.unet_evals
    summary = _run(cfg, sets, 1, out, engine)          # shard 1 of size 2: rg_chef, rg_doctor
    t = pd.read_parquet(out / "candidates.parquet")
    assert list(t.columns) == list(sets_mod.CANDIDATE_SCHEMA)
    assert list(dict.fromkeys(t["set_id"])) == ["rg_chef", "rg_doctor"]
    assert len(t) == 2 * N * 3 and summary["images"] == len(t) and summary["candidates_generated"] == 2 * N
    assert summary["sets"] == 2 and summary["sets_total"] == 4 and summary["set_range"] == [2, 4]
    assert summary["unet_evals"] == engine.unet_evals - before == 2 * N * 3 * 2 * 2   # sets x cands x G x CFG x steps
    assert summary["sets_by_segment"] == {"race-gender": 2}
    for (sid, c), g in t.groupby(["set_id", "candidate_index"]):
        assert list(g["member_index"]) == [0, 1, 2]
        assert g["seed"].nunique() == g["p"].nunique() == g["guidance"].nunique() == 1
        assert g["seed"].iloc[0] == candidate_seed(0, sid, c)
    assert t["p"].between(0.1, 0.9).all() and t["guidance"].between(7.5, 15).all()
    assert t["seed"].dtype == np.uint64
    row = t[(t.set_id == "rg_chef") & (t.candidate_index == 1) & (t.member_index == 2)].iloc[0]
    assert row["image_path"] == "images/rg_chef/c0001_m02.png" and row["caption"] == "black male chef"
    assert row["prefix"] == "" and row["a1"] == "black" and row["a3_type"] is None
    imgs = _load_images(out, t)
    assert imgs.shape == (len(t), 32, 32, 3)
    # the set was generated together: members 0 and 1 of a candidate differ (different prompts)
    assert not np.array_equal(imgs[0], imgs[1])
    assert not (out / "work").exists()
    assert json.loads((out / "summary.json").read_text()) == summary
    assert len(summary["config_digest"]) == 64 and len(summary["sets_digest"]) == 64


def test_members_match_direct_engine_call(tmp_path, cfg, engine):
    """The shard's images for a set are exactly one engine call per batch of candidate sets."""
    from counterfactory.generation.selection import candidate_batches
    from counterfactory.generation.sampler import GenerationSettings

    sets = _write(tmp_path / "sets.parquet")
    _run(cfg, sets, 0, tmp_path / "s0", engine)
    t = pd.read_parquet(tmp_path / "s0" / "candidates.parquet")
    t = t[t.set_id == "pg_nurse"]
    settings = GenerationSettings.from_config(cfg["images"])
    prompts = ["A photo of skinny male nurse", "A photo of skinny female nurse"]
    direct = np.concatenate([engine.generate(prompts, b).images
                             for b in candidate_batches(0, "pg_nurse", N, settings, batch_size=2)])
    np.testing.assert_array_equal(_load_images(tmp_path / "s0", t), direct.reshape(-1, 32, 32, 3))


# --------------------------------------------------------------------------- determinism

def test_same_images_across_shard_sizes_and_row_order(tmp_path, models, engine):
    sets = _write(tmp_path / "sets.parquet")
    shuffled = _write(tmp_path / "shuffled.parquet", shuffle=True)
    small, big = _cfg(models, set_shard_size=1), _cfg(models, set_shard_size=3)
    dirs1 = [tmp_path / "a" / f"{i:05d}" for i in range(4)]
    for i, d in enumerate(dirs1):
        _run(small, sets, i, d, engine)
    m1 = merge_set_shards(dirs1, tmp_path / "a", copy_images=True)
    dirs3 = [tmp_path / "b" / f"{i:05d}" for i in range(2)]
    for i, d in enumerate(dirs3):
        _run(big, shuffled, i, d, engine)
    m3 = merge_set_shards(dirs3, tmp_path / "b", copy_images=True)
    assert m1["sets"] == m3["sets"] == 4 and m1["images"] == m3["images"] == 2 * N * 3 + 2 * N * 2
    assert m1["sets_digest"] == m3["sets_digest"]           # row order does not change the table's digest
    a = pd.read_parquet(tmp_path / "a" / "candidates.parquet")
    b = pd.read_parquet(tmp_path / "b" / "candidates.parquet")
    pd.testing.assert_frame_equal(a, b)
    assert _tree(tmp_path / "a" / "images") == _tree(tmp_path / "b" / "images")   # byte-identical
    # merged without copying: paths point into the shard folders
    m = merge_set_shards(dirs3, tmp_path / "b")
    c = pd.read_parquet(tmp_path / "b" / "candidates.parquet")
    assert c["image_path"].iloc[0] == "00000/images/pg_nurse/c0000_m00.png" and not m["images_copied"]
    assert (tmp_path / "b" / c["image_path"].iloc[-1]).exists()


def test_image_cap_lowers_the_set_batch_size():
    """The image cap lowers the batch for big sets: 7 images per call -> 2 candidates of 3 members (batch-size
    invariance itself is a shard contract test: tests/test_shard_contract.py)."""
    from counterfactory.generation.sampler import GenerationSettings

    capped = {"images": {"batch_size": 4, "max_images_per_call": 7}}
    st = sets_mod.SetGenerationSettings.from_config(capped["images"])
    assert sets_mod.set_batch_size(GenerationSettings.from_config(capped["images"]), st, 3) == 2
    assert sets_mod.set_batch_size(GenerationSettings.from_config(capped["images"]), st, 30) == 1


def test_changed_captions_invalidate_the_cache(tmp_path, models, engine):
    cfg = _cfg(models, keep_work=True)
    sets = _write(tmp_path / "sets.parquet")
    out = tmp_path / "s"
    _run(cfg, sets, 0, out, engine)
    rows = [dict(r) for r in TABLE]
    for r in rows:
        if r["set_id"] == "pg_pilot" and r["member_index"] == 1:
            r["caption"] = "A photo of obese male pilot"
    seen = []
    _run(cfg, _write(tmp_path / "sets2.parquet", rows), 0, out, engine, hook=lambda k, sid: seen.append(sid))
    assert seen == ["pg_pilot"]


# --------------------------------------------------------------------------- merge

def test_merge_refuses_mismatches(tmp_path, models, engine):
    """Mixed config digests: tests/test_shard_contract.py."""
    sets = _write(tmp_path / "sets.parquet")
    cfg = _cfg(models)
    a, b = tmp_path / "m" / "00000", tmp_path / "m" / "00001"
    sa = _run(cfg, sets, 0, a, engine)
    # a setting set generation does not read (a filter threshold next to it) keeps the digest
    assert sets_mod.set_config_digest(_cfg(models, filter={"x": 1})) == sa["config_digest"]
    # same config, other caption-set table
    rows = [dict(r, caption=r["caption"] + ".") for r in TABLE]
    _run(cfg, _write(tmp_path / "sets2.parquet", rows), 1, b, engine)
    with pytest.raises(InputError, match="different caption-set tables"):
        merge_set_shards([a, b], tmp_path / "m")
    with pytest.raises(InputError, match=r"shard\(s\) \[1\] missing"):
        merge_set_shards([a], tmp_path / "m")
    with pytest.raises(InputError, match="listed twice"):
        merge_set_shards([a, a], tmp_path / "m")
    with pytest.raises(InputError, match="set shard output missing"):
        merge_set_shards([tmp_path / "nope"], tmp_path / "m")


def test_engine_with_other_settings_is_refused(tmp_path, models, engine):
    with pytest.raises(ConfigError, match="differ"):
        _run(_cfg(models, steps=3), _write(tmp_path / "sets.parquet"), 0, tmp_path / "x", engine)


# --------------------------------------------------------------------------- bad input

def _error(path: Path) -> str:
    with pytest.raises(InputError) as err:
        read_sets(path)
    msg = str(err.value)
    assert str(path) in msg and "Fix:" in msg
    return msg


def test_bad_input_names_file_and_record(tmp_path):
    assert "missing column(s) ['member_index']" in _error(_write(tmp_path / "a.parquet", drop=("member_index",)))

    rows = [dict(r) for r in TABLE]
    rows[3] = dict(rows[3], member_index=1)                 # pg_nurse members 0, 1 -> 1, 1
    msg = _error(_write(tmp_path / "dup.parquet", rows))
    assert "record 4" in msg and "duplicate (set_id, member_index) ('pg_nurse', 1)" in msg and "record 3" in msg

    rows = [dict(r, member_index=r["member_index"] + 1) if r["set_id"] == "pg_pilot" else r for r in TABLE]
    msg = _error(_write(tmp_path / "start.parquet", rows))
    assert "set_id 'pg_pilot'" in msg and "starts at 1, not 0" in msg and "record 8" in msg

    rows = [dict(r, member_index=3) if (r["set_id"] == "rg_chef" and r["member_index"] == 2) else r for r in TABLE]
    msg = _error(_write(tmp_path / "gap.parquet", rows))
    assert "set_id 'rg_chef'" in msg and "gap: [2] missing" in msg

    rows = [dict(r) for r in TABLE]
    rows[0] = dict(rows[0], set_id="rg/doctor")
    assert "record 0" in _error(_write(tmp_path / "id.parquet", rows))
    rows = [dict(r) for r in TABLE]
    rows[1] = dict(rows[1], caption="  ")
    assert "record 1" in _error(_write(tmp_path / "cap.parquet", rows))
    rows = [dict(r) for r in TABLE]
    rows[2] = dict(rows[2], subject="chef")
    msg = _error(_write(tmp_path / "subj.parquet", rows))
    assert "record 2" in msg and "subject 'chef' differs" in msg
    assert "one caption" in _error(_write(tmp_path / "one.parquet", TABLE[:1]))
    with pytest.raises(InputError, match="not found"):
        read_sets(tmp_path / "missing.parquet")


def test_optional_third_attribute_is_carried(tmp_path):
    rows = [dict(r, a3_type="physical", a3="young") for r in TABLE]
    df = read_sets(_write(tmp_path / "a3.parquet", rows))
    assert set(df["a3"]) == {"young"}
    assert sets_mod.sets_digest(df) != sets_mod.sets_digest(read_sets(_write(tmp_path / "t.parquet")))


# --------------------------------------------------------------------------- CLI

def test_cli_generate_and_merge(tmp_path, models, monkeypatch, capsys):
    from counterfactory.commands import social

    cfg = _cfg(models)
    monkeypatch.setattr(social, "_load_config", lambda paths: cfg)   # no social section in the schema yet
    ap = argparse.ArgumentParser()
    social.add_generate(ap.add_subparsers())
    sets = _write(tmp_path / "sets.parquet")
    shards = [tmp_path / "gen" / "shards" / f"{i:05d}" for i in range(2)]
    for i, d in enumerate(shards):
        args = ap.parse_args(["generate", "--config", "unused.yaml", "--sets", str(sets), "--shard", f"{i:05d}",
                              "--out-dir", str(d), "--threads", "2", "--no-progress"])
        assert args.func(args) == 0
    args = ap.parse_args(["generate-merge", "--shard-dirs", *map(str, shards), "--out-dir", str(tmp_path / "gen")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "merged 2 set shards: 4 caption sets" in out
    t = pd.read_parquet(tmp_path / "gen" / "candidates.parquet")
    assert len(t) == 2 * N * 3 + 2 * N * 2 and all((tmp_path / "gen" / p).exists() for p in t["image_path"])
    with pytest.raises(SystemExit):
        ap.parse_args(["generate", "--config", "c", "--sets", "s", "--shard", "-1", "--out-dir", "o"])


# --------------------------------------------------------------------------- adaptive mode (ours)

NA = 5   # candidate sets per caption set in the adaptive tests (batches of 2: 2, 2, 1)


@pytest.fixture(scope="module")
def clip_model(tmp_path_factory):
    from counterfactory.models import tiny

    return str(tiny.build("clip_filter", tmp_path_factory.mktemp("tiny_clip")))


def _adaptive_cfg(models, clip_model, enabled=True, target=1, ic_min=0.2, ii_min=0.2, **images):
    cfg = _cfg(models, **{"candidates_per_set": NA, "adaptive": {"enabled": enabled, "target": target}, **images})
    cfg["models"]["clip_filter"] = {"source": clip_model}
    cfg["filter"] = {"clip": {"role": "clip_filter", "image_caption_min": ic_min, "image_image_min": ii_min}}
    return cfg


def test_adaptive_stops_early_and_outputs_are_a_prefix_of_the_full_run(tmp_path, models, clip_model, engine):
    sets = _write(tmp_path / "sets.parquet")
    full_cfg = _adaptive_cfg(models, clip_model, enabled=False)
    full = _run(full_cfg, sets, 0, tmp_path / "full", engine)            # pg_nurse, pg_pilot: 2 members each
    assert full["candidates_generated"] == 2 * NA and full["sets_stopped_early"] == 0
    assert full["adaptive"] == {"enabled": False}
    ft = pd.read_parquet(tmp_path / "full" / "candidates.parquet")
    per_cand = 2 * 2 * 2                                                 # members x CFG x steps
    # every candidate set passes (thresholds -1): 2 pass after batch 1, 4 after batch 2 >= 3 -> stop at 4 of 5
    ad = _run(_adaptive_cfg(models, clip_model, target=3, ic_min=-1.0, ii_min=-1.0), sets, 0, tmp_path / "ad", engine)
    assert ad["candidates_generated"] == 2 * 4 and ad["sets_stopped_early"] == 2
    assert ad["adaptive"] == {"enabled": True, "target": 3, "clip_role": "clip_filter", "image_caption_min": -1.0,
                              "image_image_min": -1.0}
    assert ad["unet_evals"] == 2 * 4 * per_cand and full["unet_evals"] == 2 * NA * per_cand
    assert ad["per_set"]["pg_nurse"] == {"candidates": 4, "unet_evals": 4 * per_cand, "stopped_early": True,
                                         "clip_passed": 4}
    at = pd.read_parquet(tmp_path / "ad" / "candidates.parquet")
    prefix = ft[ft["candidate_index"] < 4].reset_index(drop=True)
    pd.testing.assert_frame_equal(at, prefix)                            # same candidates, seeds, p, guidance
    full_images = _tree(tmp_path / "full" / "images")
    assert _tree(tmp_path / "ad" / "images") == {k: v for k, v in full_images.items() if "c0004_" not in k}
    # nothing passes (image-caption cosine >= 1): every candidate is made, the outputs are the full run's
    none = _run(_adaptive_cfg(models, clip_model, target=1, ic_min=1.0), sets, 0, tmp_path / "none", engine)
    assert none["candidates_generated"] == 2 * NA and none["sets_stopped_early"] == 0
    assert none["per_set"]["pg_pilot"]["clip_passed"] == 0 and not none["per_set"]["pg_pilot"]["stopped_early"]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "none" / "candidates.parquet"), ft)
    assert _tree(tmp_path / "none" / "images") == full_images
    # the target reached exactly at the last batch is not an early stop
    last = _run(_adaptive_cfg(models, clip_model, target=NA, ic_min=-1.0, ii_min=-1.0, set_shard_size=1), sets, 0,
                tmp_path / "last", engine)
    assert last["candidates_generated"] == NA and last["sets_stopped_early"] == 0
    # adaptive and fixed shards are different configurations: merging them is refused
    assert len({full["config_digest"], ad["config_digest"], none["config_digest"]}) == 3


def test_adaptive_digest_and_fingerprint_cover_the_clip_filter_only_when_on(tmp_path, models, clip_model):
    import shutil

    digest, ctx = sets_mod.set_config_digest, sets_mod._context
    other_clip = tmp_path / "clip_copy"
    shutil.copytree(clip_model, other_clip)

    def variants(enabled):
        base = _adaptive_cfg(models, clip_model, enabled=enabled)
        thr = _adaptive_cfg(models, clip_model, enabled=enabled, ic_min=0.3)
        mod = _adaptive_cfg(models, str(other_clip), enabled=enabled)
        return base, thr, mod

    def fp(cfg):
        return sets_mod._set_fingerprint(ctx(cfg), "pg_nurse", ["a", "b"], 2)

    base, thr, mod = variants(False)
    plain = _cfg(models, candidates_per_set=NA)                          # no adaptive key, no CLIP model
    assert digest(base) == digest(thr) == digest(mod) == digest(plain)
    assert digest(_adaptive_cfg(models, clip_model, enabled=False, target=4)) == digest(plain)
    assert fp(base) == fp(thr) == fp(mod) == fp(plain)
    assert sets_mod.model_roles(base) == ("sd", "vae")
    on, thr_on, mod_on = variants(True)
    assert sets_mod.model_roles(on) == ("sd", "vae", "clip_filter")
    assert len({digest(plain), digest(on), digest(thr_on), digest(mod_on),
                digest(_adaptive_cfg(models, clip_model, target=2))}) == 5
    assert len({fp(plain), fp(on), fp(thr_on), fp(mod_on)}) == 4
    # filter keys the CLIP stage does not read (NSFW, detectability) still do not count
    extra = json.loads(json.dumps(on))
    extra["filter"]["nsfw"] = {"threshold": 0.9}
    assert digest(extra) == digest(on) and fp(extra) == fp(on)
    with pytest.raises(ConfigError, match="images.adaptive.target"):
        sets_mod.AdaptiveSettings.from_config({"adaptive": {"enabled": True, "target": 0}})


def test_adaptive_off_reuses_the_non_adaptive_cache(tmp_path, models, clip_model, engine):
    """Off (whatever its target or the CLIP settings): the fingerprint, digest and outputs of a config
    without the adaptive key, so its cached sets are reused as they are."""
    sets = _write(tmp_path / "sets.parquet")
    out = tmp_path / "s"
    ref = _run(_cfg(models, keep_work=True), sets, 0, out, engine)
    before = _tree(out)
    seen = []
    off = _adaptive_cfg(models, clip_model, enabled=False, target=2, ic_min=0.9, candidates_per_set=N,
                        keep_work=True)
    again = _run(off, sets, 0, out, engine, hook=lambda k, sid: seen.append(sid))
    assert seen == [] and again["config_digest"] == ref["config_digest"] and _tree(out) == before


def test_paper_config_generates_sets_in_fp32_on_cuda(repo, monkeypatch):
    """The authors' SocialCounterfactuals generator ran in fp32 (its --precision hmp default falls through to fp32);
    the paper config's set generation resolves fp32 on CUDA although the config-wide precision is auto (bf16 there)."""
    import torch

    from counterfactory import device

    view = load_config([repo / "config" / "config.yaml"], study="social_counterfactuals")
    assert view["precision"] == "auto" and view["images"]["precision"] == "fp32"
    stage = sets_mod.stage_config(view)
    assert stage["precision"] == "fp32" and view["precision"] == "auto"       # the view itself is left alone
    monkeypatch.setattr(device, "resolve_device", lambda _spec: torch.device("cuda"))
    assert device.from_config(stage) == (torch.device("cuda"), torch.float32)
    # the engine is built from the stage's config (captured instead of loading Stable Diffusion)
    from counterfactory.models import registry

    monkeypatch.setattr(registry, "configured_models", lambda cfg, roles=None: {})
    assert sets_mod._context(view).cfg["precision"] == "fp32"
    # null = the config-wide precision
    view["images"]["precision"] = None
    assert sets_mod.stage_config(view)["precision"] == "auto"
    with pytest.raises(ConfigError, match="precision"):
        device.with_stage_precision(view, "fp8")
