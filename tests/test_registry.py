"""Model registry: roles load through the libraries' own loaders; failures name role, source and fix."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from counterfactory.errors import CounterFactoryError, ModelLoadError
from counterfactory.models import identity, registry


def test_text_roles_load_from_tiny_folders(tiny_text_models):
    cfg = {"models": {r: {"source": str(tiny_text_models / r)} for r in ("mlm", "lm", "sentence")}}
    model, tok = registry.load(cfg, "mlm")
    assert type(model).__name__ == "RobertaForMaskedLM" and tok.mask_token == "<mask>"
    model, tok = registry.load(cfg, "lm")
    assert type(model).__name__ == "GPT2LMHeadModel"
    st = registry.load(cfg, "sentence")
    assert st.encode(["a dog"]).shape == (1, 384)  # the real all-MiniLM-L6-v2
    info = registry.loaded_models()
    assert info["mlm"]["resolved"].endswith("mlm") and len(info["mlm"]["fingerprint"]) == 64
    assert info["mlm"]["fingerprint"] == registry.fingerprint(tiny_text_models / "mlm")
    assert (tiny_text_models / "mlm" / registry.MANIFEST_NAME).is_file()  # written by build-tiny
    assert registry.verify_folder(tiny_text_models / "mlm") == ("manifest", [])


def test_missing_local_folder_says_how_to_build(tmp_path):
    # a folder of the tiny stand-ins (directly under tiny_models.out_dir): built by models build-tiny
    cfg = {"models": {"mlm": {"source": str(tmp_path / "absent")}}, "tiny_models": {"out_dir": str(tmp_path)}}
    with pytest.raises(ModelLoadError) as err:
        registry.load(cfg, "mlm")
    msg = str(err.value)
    assert "role 'mlm'" in msg and "absent" in msg and "models_build_tiny" in msg


def test_unloadable_folder_names_role_and_path(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    cfg = {"models": {"lm": {"source": str(tmp_path / "broken")}}}
    with pytest.raises(ModelLoadError) as err:
        registry.load(cfg, "lm")
    assert "role 'lm'" in str(err.value) and "broken" in str(err.value) and "Fix:" in str(err.value)


def test_offline_hub_id_explains_cache(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = {"models": {"mlm": {"source": "counterfactory-test/definitely-not-cached"}}}
    with pytest.raises(ModelLoadError) as err:
        registry.load(cfg, "mlm")
    msg = str(err.value)
    assert "definitely-not-cached" in msg and "HF_HUB_OFFLINE" in msg and "models.mlm.source" in msg


def test_unconfigured_role_is_a_config_error():
    from counterfactory.errors import ConfigError

    with pytest.raises(ConfigError, match="models.sd is not configured"):
        registry.load({"models": {}}, "sd")


def test_clip_tokenizer_is_exact():
    from counterfactory.models import tiny

    tok = tiny.clip_tokenizer()
    assert len(tok) == 49408
    # ids of openai/clip-vit-base-patch32 for this text
    assert tok("a photo of a cat").input_ids == [49406, 320, 1125, 539, 320, 2368, 49407]


# ------------------------------------------------------------------ identity by content, integrity


@pytest.fixture(autouse=True)
def _hash_cache(tmp_path, monkeypatch):
    """Every test gets its own file-hash cache (never the user's ~/.cache)."""
    monkeypatch.setenv("COUNTERFACTORY_CACHE_DIR", str(tmp_path / "hash-cache"))


OLD = 1_600_000_000  # a fixed, long-past mtime: such files are cached (fresh ones are not, see RACY_NS)


def _toy_model(folder, scale: float = 1.0, age: bool = True):
    """A small model folder of one architecture: config.json + model.safetensors (weights * scale)."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "toy", "hidden": 64}')
    rng = np.random.default_rng(0)
    save_file({"embed.weight": (rng.standard_normal((64, 32)) * scale).astype("float32"),
               "head.bias": np.zeros(32, dtype="float32")}, str(folder / "model.safetensors"))
    if age:
        for f in folder.iterdir():
            os.utime(f, ns=(OLD * 10**9, OLD * 10**9))
    return folder


def _corrupt(path, offset=None, n=16):
    """Write random bytes into the middle of a file (size unchanged)."""
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(size // 2 if offset is None else offset)
        fh.write(os.urandom(n))


def test_fingerprint_is_by_content(tmp_path):
    a, b = _toy_model(tmp_path / "a"), _toy_model(tmp_path / "b", scale=2.0)
    fa, fb = registry.fingerprint(a), registry.fingerprint(b)
    assert len(fa) == 64 and set(fa) <= set("0123456789abcdef")
    assert fa != fb  # same architecture and file sizes, different weights
    copy = tmp_path / "elsewhere" / "a-copy"
    shutil.copytree(a, copy)
    (copy / ".git").mkdir()
    (copy / ".git" / "HEAD").write_text("ref: refs/heads/main")
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "x.pyc").write_bytes(b"junk")
    (copy / "model.safetensors.lock").write_text("")
    (copy / "download.log").write_text("log")
    assert registry.fingerprint(copy) == fa  # same content elsewhere, junk ignored
    (copy / "extra.json").write_text("{}")
    assert registry.fingerprint(copy) != fa
    _corrupt(a / "model.safetensors")
    assert registry.fingerprint(a) != fa


def test_configured_models_reports_full_identity(tmp_path):
    model = _toy_model(tmp_path / "m")
    cfg = {"models": {"lm": {"source": str(model)}, "mlm": {"source": "counterfactory-test/not-cached"}}}
    info = registry.configured_models(cfg)
    assert info["lm"] == {"source": str(model), "library": "transformers", "revision": None, "local": True,
                          "resolved": str(model.resolve()), "fingerprint": registry.fingerprint(model)}
    assert info["mlm"]["local"] is False and info["mlm"]["fingerprint"] is None and "commit" in info["mlm"]
    assert set(registry.configured_models(cfg, roles=["lm"])) == {"lm"}


def test_unidentifiable_model_raises_naming_role_path_and_fix(tmp_path, monkeypatch):
    cfg = {"models": {"lm": {"source": str(tmp_path / "absent")}}}
    with pytest.raises(registry.ModelIdentityError) as err:
        registry.configured_models(cfg)
    assert "role 'lm'" in str(err.value) and "absent" in str(err.value) and "hf download" in str(err.value)

    model = _toy_model(tmp_path / "m")

    real_hash = identity._hash_file

    def denied(path):
        if Path(path).suffix == ".safetensors":
            raise PermissionError(13, "Permission denied", str(path))
        return real_hash(path)

    monkeypatch.setattr(identity, "_hash_file", denied)
    cfg = {"models": {"lm": {"source": str(model)}}}
    with pytest.raises(CounterFactoryError) as err:
        registry.configured_models(cfg)
    msg = str(err.value)
    assert isinstance(err.value, registry.ModelIdentityError)
    assert "role 'lm'" in msg and "model.safetensors" in msg and "Permission denied" in msg and "Fix:" in msg


def test_hash_cache_is_used_and_invalidated(tmp_path, monkeypatch):
    model = _toy_model(tmp_path / "m")
    calls = []
    real_hash = identity._hash_file
    monkeypatch.setattr(identity, "_hash_file", lambda p: calls.append(Path(p).name) or real_hash(p))
    first = registry.fingerprint(model)
    assert sorted(calls) == ["config.json", "model.safetensors"]
    cache_file = tmp_path / "hash-cache" / "file_hashes.json"
    assert cache_file.is_file()
    calls.clear()
    assert registry.fingerprint(model) == first and calls == []  # nothing re-read

    weights = model / "model.safetensors"
    _corrupt(weights)  # same size, new content ...
    os.utime(weights, ns=(OLD * 10**9, (OLD + 5) * 10**9))  # ... and another (old) mtime
    changed = registry.fingerprint(model)
    assert calls == ["model.safetensors"] and changed != first
    calls.clear()
    with open(weights, "ab") as fh:  # size changes (mtime put back: the size alone invalidates)
        fh.write(b"\0")
    os.utime(weights, ns=(OLD * 10**9, (OLD + 5) * 10**9))
    assert registry.fingerprint(model) not in (first, changed) and calls == ["model.safetensors"]

    calls.clear()
    cache_file.write_text("{not json")  # a corrupt cache is ignored and rewritten
    registry.fingerprint(model)
    assert sorted(calls) == ["config.json", "model.safetensors"]
    assert json.loads(cache_file.read_text())["format"] == 1
    calls.clear()
    registry.fingerprint(model, use_cache=False)  # a check re-reads everything
    assert len(calls) == 2


def test_freshly_written_files_are_not_cached(tmp_path, monkeypatch):
    model = _toy_model(tmp_path / "m", age=False)  # mtime now: a rewrite could keep it, so no cache entry
    calls = []
    real_hash = identity._hash_file
    monkeypatch.setattr(identity, "_hash_file", lambda p: calls.append(p) or real_hash(p))
    registry.fingerprint(model)
    registry.fingerprint(model)
    assert len(calls) == 4


def _check(monkeypatch, cfg, *extra):
    from counterfactory.cli import main
    from counterfactory.commands import models as models_cmd

    monkeypatch.setattr(models_cmd, "load_config", lambda paths: cfg)
    return main(["models", "check", "--config", "unused.yaml", *extra])


def _load_toy(spec, kw):
    from safetensors.numpy import load_file

    return load_file(str(spec.local_path / "model.safetensors"))


def test_models_check_finds_corrupted_weights(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(registry._LOADERS, "toy", _load_toy)
    model = _toy_model(tmp_path / "toy")
    registry.write_manifest(model, builder=registry.TINY_BUILDER, role="toy")
    cfg = {"models": {"toy": {"source": str(model)}}}
    assert _check(monkeypatch, cfg) == 0
    out = capsys.readouterr().out
    assert "toy: ok" in out and "files match the manifest" in out and registry.fingerprint(model) in out

    _corrupt(model / "model.safetensors")
    assert registry.load(cfg, "toy")  # the damage is inside the tensor data: the file still loads ...
    assert _check(monkeypatch, cfg) == 2  # ... but the check fails
    captured = capsys.readouterr()
    assert "CORRUPT" in captured.out and "model.safetensors" in captured.err
    assert "counterfactory models build-tiny" in captured.err and "--role toy --force" in captured.err
    # even when the cache is trusted: the rewrite changed ctime (and usually mtime)
    assert _check(monkeypatch, cfg, "--trust-cache") == 2


def test_models_check_without_manifest_prints_fingerprint(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(registry._LOADERS, "toy", _load_toy)
    model = _toy_model(tmp_path / "toy")
    assert _check(monkeypatch, {"models": {"toy": {"source": str(model)}}}) == 0
    out = capsys.readouterr().out
    assert "no manifest" in out and registry.fingerprint(model) in out


def test_tiny_build_writes_a_manifest(tmp_path, monkeypatch):
    from counterfactory.models import tiny

    monkeypatch.setattr(tiny, "builders", lambda: {"toy": lambda out, seed: _toy_model(out, age=False)})
    folder = tiny.build("toy", tmp_path / "tiny", seed=3)
    manifest = json.loads((folder / registry.MANIFEST_NAME).read_text())
    assert manifest["builder"] == registry.TINY_BUILDER and manifest["role"] == "toy" and manifest["seed"] == 3
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors"]
    assert manifest["fingerprint"] == registry.fingerprint(folder)  # the manifest is not part of the content
    assert registry.verify_folder(folder) == ("manifest", [])
    (folder / "config.json").unlink()
    (folder / "notes.txt").write_text("x")
    method, problems = registry.verify_folder(folder)
    assert [(Path(p["path"]).name, p["problem"].split(" (")[0]) for p in problems] == [
        ("config.json", "missing"), ("notes.txt", "not listed in the manifest")]


def test_snakemake_timestamp_is_not_model_content(tmp_path, monkeypatch, capsys):
    """Snakemake drops `.snakemake_timestamp` into every folder output once the job ends: a freshly built
    tiny model must still match its manifest and keep its fingerprint (`models check` said CORRUPT)."""
    from counterfactory.models import tiny

    monkeypatch.setattr(tiny, "builders", lambda: {"toy": lambda out, seed: _toy_model(out, age=False)})
    monkeypatch.setitem(registry._LOADERS, "toy", _load_toy)
    folder = tiny.build("toy", tmp_path / "tiny", seed=0)
    before = registry.fingerprint(folder, use_cache=False)
    (folder / ".snakemake_timestamp").write_text("")
    assert registry.verify_folder(folder) == ("manifest", [])
    assert registry.fingerprint(folder, use_cache=False) == before
    assert _check(monkeypatch, {"models": {"toy": {"source": str(folder)}}}) == 0
    assert "CORRUPT" not in capsys.readouterr().out


def test_tiny_role_path_typo_is_a_parse_time_error_naming_the_key():
    """A typo in one tiny role's folder used to rerun the one build job, fail with a KeyError and let Snakemake
    delete every declared tiny model; rules/setup.smk now stops at parse time with the key and the fix."""
    import yaml

    from counterfactory import workflow as wf
    from counterfactory.config import ConfigError
    from counterfactory.models import tiny

    assert set(tiny.builders()) == tiny.BUILDER_NAMES  # the static list the parse-time check uses
    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "demo.yaml").read_text())
    assert tiny.tiny_sources(cfg) == sorted(set(wf.tiny_model_inputs(cfg, *cfg["models"])))
    cfg["models"]["sd"] = {"source": "resources/models/tiny/sdd"}
    cfg["models"]["lm"] = "resources/models/tiny/gpt"
    with pytest.raises(ConfigError) as err:
        tiny.tiny_sources(cfg)
    msg = str(err.value)
    assert "models.sd.source: 'resources/models/tiny/sdd'" in msg and "no tiny builder named 'sdd'" in msg
    assert "did you mean 'resources/models/tiny/sd'?" in msg
    assert "models.lm: 'resources/models/tiny/gpt'" in msg  # every mistake at once
    with pytest.raises(ConfigError, match="no tiny builder named 'sdd'.*Fix"):
        tiny.build("sdd", "unused")


def _fake_hub(root, repo_id="org/toy", commit="c" * 40):
    """An HF-cache layout: blobs named by sha256 (LFS) / git blob sha1, snapshot symlinks, refs/main."""
    import hashlib

    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    weights = os.urandom(4096)
    config = b'{"model_type": "toy"}'
    blobs = {"model.safetensors": (hashlib.sha256(weights).hexdigest(), weights),
             "config.json": (hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest(), config)}
    for name, (blob, data) in blobs.items():
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snap / name)
    return repo, snap


def test_hub_id_in_the_hf_cache_records_commit_and_checks_blobs(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo, snap = _fake_hub(tmp_path / "hub")
    cfg = {"models": {"mlm": {"source": "org/toy"}}}
    info = registry.configured_models(cfg)["mlm"]
    assert info["commit"] == "c" * 40 and info["resolved"] == str(snap)
    assert info["fingerprint"] == registry.fingerprint(snap)
    report = registry.verify_role(cfg, "mlm")
    assert report["method"] == "hf-cache" and report["problems"] == []
    _corrupt(Path(os.path.realpath(snap / "model.safetensors")))
    report = registry.verify_role(cfg, "mlm")
    assert [Path(p["path"]).name for p in report["problems"]] == ["model.safetensors"]
    assert "re-download" in report["fix"] and "org/toy" in report["fix"]
    assert registry.configured_models(cfg)["mlm"]["fingerprint"] != info["fingerprint"]


def test_vae_role_loads_an_autoencoder_from_the_tiny_folder(tmp_path, monkeypatch, repo):
    """The optional ``vae`` role: diffusers' ``AutoencoderKL.from_pretrained`` (no remote code), a tiny
    builder whose latent channels match the tiny sd, identity by content; the configs name it."""
    import diffusers

    from counterfactory.config import load_config
    from counterfactory.models import tiny

    assert registry.DEFAULT_LIBRARY["vae"] == "diffusers" and "vae" in tiny.builders()
    folder = tiny.build("vae", tmp_path)
    calls = []
    real = diffusers.AutoencoderKL.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        calls.append(kwargs)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(diffusers.AutoencoderKL, "from_pretrained", classmethod(spy))
    vae = registry.load({"models": {"vae": {"source": str(folder)}}}, "vae")
    assert type(vae).__name__ == "AutoencoderKL" and vae.config.latent_channels == 4
    assert calls and all("trust_remote_code" not in kw for kw in calls)
    assert registry.loaded_models()["vae"]["fingerprint"] == registry.fingerprint(folder)
    paper = load_config([repo / "config" / "config.yaml"])
    demo = load_config([repo / "config" / "demo.yaml"])
    assert paper["models"]["vae"]["source"] == "stabilityai/sd-vae-ft-mse"
    assert demo["models"]["vae"]["source"] == "resources/models/tiny/vae"


def test_a_path_like_source_that_is_nowhere_says_both_readings(tmp_path, monkeypatch):
    """issue 31, #20: 'probe/models/sd' (no ./, not on disk) was taken for a hub id ("hf download probe/...")."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as err:      # two slashes: no hub id has them, so no loader is tried
        registry.load({"models": {"sd": {"source": "probe/models/sd", "library": "diffusers"}}}, "sd")
    msg = str(err.value)
    assert "as a local folder" in msg and str(tmp_path / "probe" / "models" / "sd") in msg
    assert "hub ids are 'owner/name'" in msg and "hf download" not in msg and "./probe/models/sd" in msg
    with pytest.raises(ModelLoadError) as err:      # one slash: a folder or a hub id, neither found
        registry.load({"models": {"clip_filter": {"source": "probe/clip"}}}, "clip_filter")
    msg = str(err.value)
    assert "as a local folder" in msg and "not in the Hugging Face cache" in msg
    assert "./probe/clip" in msg and "hf download probe/clip" in msg


def test_ctrl_c_during_a_load_is_an_interrupt_even_when_the_library_swallows_it(monkeypatch, capsys):
    """issue 31, #23: a Ctrl-C caught inside a library (re-raised as another error) read "could not load ...
    rebuild it"; it must stay an interrupt (the CLI prints "interrupted", exit 130)."""
    import signal

    from counterfactory import cli

    def swallowing_loader(spec, kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):        # the handler runs between bytecodes, right after the kill
                pass
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error while deserializing header: incomplete read") from exc
        raise AssertionError("no KeyboardInterrupt arrived")

    monkeypatch.setitem(registry._LOADERS, "probe_role", swallowing_loader)
    cfg = {"models": {"probe_role": {"source": "probe-org-h6b/not-a-folder"}}}
    before = signal.getsignal(signal.SIGINT)   # SIG_IGN where the suite runs as a background job
    with pytest.raises(KeyboardInterrupt):
        registry.load(cfg, "probe_role")
    assert signal.getsignal(signal.SIGINT) is before      # the caller's handler is restored

    def boom(*args, **kwargs):
        registry.load(cfg, "probe_role")

    monkeypatch.setattr("counterfactory.data.coco.load_coco_captions", boom)
    assert cli.main(["data", "captions", "--captions-json", "c.json", "--out", "/tmp/unused-cf.parquet"]) == 130
    assert capsys.readouterr().err.strip() == "counterfactory data: interrupted"
