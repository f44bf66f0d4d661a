"""``counterfactory preflight`` (counterfactory.preflight): every model role, dataset, the NLTK data, the disk and the
GPU memory a run needs, checked before it starts without loading weights; and the Snakefile's start-up check, which
lists every missing dataset and model at once (issue 27, finding 5; issue 33, part 2)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from counterfactory import preflight
from counterfactory.config import deep_merge, load_full_config, validate_config


def _config(repo: Path, tmp_path: Path, overlay: dict | None = None, base: str = "demo.yaml") -> dict:
    cfg = yaml.safe_load((repo / "config" / base).read_text())
    return validate_config(deep_merge(cfg, overlay or {}), source="test")


def _by_key(checks, check: str) -> dict:
    return {c.key: c for c in checks if c.check == check}


def _fake_pipeline(folder: Path, name: str, unet_in: int) -> Path:
    """A diffusers pipeline folder's configuration files and one (empty) weight file: what the preflight reads."""
    (folder / "unet").mkdir(parents=True)
    unet = {"_class_name": "UNet2DConditionModel", "in_channels": unet_in}
    index = {"_class_name": name, "unet": ["diffusers", unet["_class_name"]]}
    (folder / "model_index.json").write_text(json.dumps(index))
    (folder / "unet" / "config.json").write_text(json.dumps(unet))
    (folder / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    return folder


def test_a_missing_role_folder_fails_naming_key_and_fix(repo, tmp_path):
    missing = tmp_path / "models" / "sd"
    cfg = _config(repo, tmp_path, {"models": {"sd": {"source": str(missing)}}})
    (check,) = preflight.check_role(cfg, "sd")
    assert (check.check, check.key, check.status) == ("model", "models.sd.source", preflight.FAIL)
    assert str(missing) in check.detail and str(missing) in check.fix
    # a tiny stand-in of the demo that is not built yet is the workflow's to build, not a failure
    tiny_dir = {"tiny_models": {"out_dir": str(tmp_path / "tiny")},
                "models": {"sd": {"source": str(tmp_path / "tiny/sd")}}}
    (tiny,) = preflight.check_role(_config(repo, tmp_path, tiny_dir), "sd")
    assert tiny.status == preflight.BUILD and tiny.passed


def test_a_role_of_the_wrong_class_fails(repo, tmp_path, tiny_clip):
    """A CLIP folder given as the text-to-image role, a 4-channel GLIGEN given as the inpainting one."""
    gligen = _fake_pipeline(tmp_path / "gligen", "StableDiffusionGLIGENPipeline", 4)
    cfg = _config(repo, tmp_path, {"models": {"t2i": {"source": str(tiny_clip)},
                                              "gligen_inpaint": {"source": str(gligen)},
                                              "gligen": {"source": str(gligen)}}})
    found, wrong = preflight.check_role(cfg, "t2i")
    assert found.status == preflight.OK       # the folder is complete ...
    assert (wrong.check, wrong.key, wrong.status) == ("model-class", "models.t2i.source", preflight.FAIL)
    assert "clip model (CLIPModel), not a diffusers pipeline" in wrong.detail and "models.t2i.source" in wrong.fix
    _, inpaint = preflight.check_role(cfg, "gligen_inpaint")
    assert inpaint.status == preflight.FAIL and "UNet takes 4 input channels" in inpaint.detail
    _, generate = preflight.check_role(cfg, "gligen")
    assert generate.status == preflight.OK    # the same folder is right for text-box generation


def test_a_missing_dataset_fails_with_its_full_key(repo, tmp_path, monkeypatch):
    monkeypatch.chdir(repo)   # the demo's data paths are relative to the repository
    empty = tmp_path / "coco"
    empty.mkdir()
    cfg = _config(repo, tmp_path, {"coco_counterfactuals": {"data": {"coco_root": str(empty)}},
                                   "cvld": {"data": {"celeba": {"root": str(tmp_path / "celeba")}}}})
    checks = _by_key(preflight.dataset_checks(cfg), "dataset")
    coco, celeba = checks["coco_counterfactuals.data.coco_root"], checks["cvld.data.celeba.root"]
    assert coco.status == celeba.status == preflight.FAIL
    assert "annotations/captions_val2017.json, val2017/ (official layout)" in coco.detail
    assert "https://cocodataset.org" in coco.fix and "celeba" in celeba.fix.lower()
    assert checks["countercurate.data.entities_root"].status == preflight.OK   # the demo's own data is in place


def test_too_little_disk_fails(repo, tmp_path, monkeypatch):
    cfg = _config(repo, tmp_path, {"studies": ["social_counterfactuals"]})
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: SimpleNamespace(total=10**6, used=0, free=1000))
    check = preflight.disk_check(cfg, results_root=tmp_path)
    assert (check.key, check.status) == ("run_name", preflight.FAIL) and "1.0 kB free" in check.detail
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: SimpleNamespace(total=10**13, used=0, free=10**12))
    assert preflight.disk_check(cfg, results_root=tmp_path).status == preflight.OK


def test_a_complete_tiny_setup_passes(repo, tmp_path, tiny_clip, monkeypatch):
    """Tiny models of the real classes (SocialCounterfactuals' roles), the demo's data: every check passes."""
    from counterfactory.models import tiny

    monkeypatch.chdir(repo)
    built = tmp_path / "built"
    for role in ("sd", "nsfw", "inception"):
        tiny.build(role, built)
    clip = str(tiny_clip)
    cfg = _config(repo, tmp_path, {
        "studies": ["social_counterfactuals"], "tiny_models": {"out_dir": str(tmp_path / "tiny")},
        "models": {"sd": {"source": str(built / "sd")}, "nsfw": {"source": str(built / "nsfw")},
                   "inception": {"source": str(built / "inception")},
                   "clip_filter": {"source": clip}, "clip_eval": {"source": clip}, "clip_train": {"source": clip},
                   "vae": {"source": str(tmp_path / "tiny/vae")},
                   "itm_flava": {"source": str(tmp_path / "tiny/itm_flava")},
                   "clip_open_clip": {"source": str(tmp_path / "tiny/clip_open_clip"), "library": "open_clip"}}})
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: SimpleNamespace(total=10**13, used=0, free=10**12))
    checks = preflight.preflight(cfg, online=False, results_root=tmp_path)
    assert preflight.passed(checks), preflight.to_table(checks, only_problems=True)
    classes = _by_key(checks, "model-class")
    assert {k for k, c in classes.items() if c.status == preflight.OK} >= {
        "models.sd.source", "models.nsfw.source", "models.clip_filter.source"}
    assert {c.check for c in checks} >= {"model", "model-class", "nltk", "disk", "gpu-memory"}


def test_the_command_prints_one_table_writes_json_and_exits_nonzero_on_a_problem(repo, tmp_path, capsys):
    from counterfactory import cli

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"studies": ["spurious_retrieval"],
                                       "models": {"inpaint": {"source": str(tmp_path / "no-lama"),
                                                              "library": "lama_cleaner"}}}))
    out = tmp_path / "preflight.json"
    code = cli.main(["preflight", "--config", str(repo / "config" / "demo.yaml"), "--config", str(overlay),
                     "--only", "model", "--offline", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 1
    assert "models.inpaint.source" in printed and "big-lama.pt" in printed and "failed" in printed
    doc = json.loads(out.read_text())
    assert doc["passed"] is False
    (row,) = [r for r in doc["checks"] if r["key"] == "models.inpaint.source"]
    assert row["status"] == "FAIL" and "curl -L" in row["fix"]


def test_the_snakefile_start_up_lists_every_missing_dataset_at_once(repo, tmp_path, monkeypatch):
    """What `snakemake -n all` (paper config, no data) stops with: every missing dataset, each once, with its full
    config key and where to get it (it used to stop at the first, naming one key without its study)."""
    monkeypatch.chdir(tmp_path)   # no data/ here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_full_config([repo / "config" / "config.yaml"])
    checks, message = preflight.startup(cfg)
    assert message is not None
    keys = ["coco_counterfactuals.data.coco_root",
            "coco_counterfactuals.evaluation.classification.datasets.CIFAR10.root",
            "coco_counterfactuals.training.eval.retrieval[flickr30k].karpathy_json", "countercurate.data.entities_root",
            "spurious_retrieval.data.coco.karpathy_json", "cvld.data.celeba.root"]
    import re

    for key in keys:   # each named once, in its study's block, under its catalogue dataset with the source
        assert len(re.findall(re.escape(key) + r"(?![\w.\[])", message)) == 1, key
    assert "cs.toronto.edu/~kriz" in message and "cocodataset.org" in message
    assert "\ncoco_counterfactuals\n" in message and "\ncvld\n" in message
    # models: the hub ids are not cached and the hub is off: each role listed too, with its download command
    assert "models.t2i.source" in message and "hf download stabilityai/stable-diffusion-xl-base-1.0" in message
    assert not preflight.passed(checks)


def test_switched_off_evaluation_datasets_are_not_required(repo, tmp_path, monkeypatch):
    """Own data without CIFAR or Flickr30k (docs/own-data.md): no classification model, no classification or
    retrieval evaluation of the fine-tuned runs -- then those datasets are not checked (nor planned)."""
    monkeypatch.chdir(tmp_path)
    off = {"coco_counterfactuals": {"evaluation": {"classification": {"models": []}},
                                    "training": {"eval": {"classification": [], "retrieval": None}}}}
    cfg = _config(repo, tmp_path, off, base="config.yaml")
    keys = set(_by_key(preflight.dataset_checks(cfg), "dataset"))
    assert "coco_counterfactuals.data.coco_root" in keys
    assert not [k for k in keys if ".evaluation.classification." in k or ".training.eval." in k]
    on = set(_by_key(preflight.dataset_checks(_config(repo, tmp_path, base="config.yaml")), "dataset"))
    assert "coco_counterfactuals.evaluation.classification.datasets.ImageNet.root" in on


def test_the_start_up_gate_plans_a_dry_run_with_a_model_problem_and_stops_a_real_run(repo, tmp_path, monkeypatch):
    """The Snakefile's `all` input: a model problem is warned about once in a dry run (which still plans) and stops a
    real run; a dataset problem stops both (the shards follow from the data)."""
    monkeypatch.chdir(repo)
    cfg = _config(repo, tmp_path, {"models": {"sd": {"source": str(tmp_path / "no-sd")}}})
    warned = []
    gate = preflight.StartupGate()
    assert gate.check(cfg, dry_run=True, warn=warned.append) == [] and gate.check(cfg, True, warned.append) == []
    assert len(warned) == 1 and "models.sd.source" in warned[0] and "a real run stops here" in warned[0]
    with pytest.raises(preflight.PreflightError, match=r"models\.sd\.source"):
        preflight.StartupGate().check(cfg, dry_run=False)
    no_data = _config(repo, tmp_path, {"cvld": {"data": {"celeba": {"root": str(tmp_path / "celeba")}}}})
    with pytest.raises(preflight.PreflightError, match=r"cvld\.data\.celeba\.root"):
        preflight.StartupGate().check(no_data, dry_run=True)
    assert preflight.StartupGate().check(_config(repo, tmp_path), dry_run=False) == []   # the demo: nothing missing


def test_an_open_clip_role_with_a_released_weights_file(tmp_path):
    """NegCLIP / ALIP / LaCLIP / SLIP: an architecture plus a released file; the check looks for the file only."""
    from counterfactory import preflight
    from counterfactory.models import registry

    cfg = {"models": {"negclip": {"source": "ViT-B-32", "library": "open_clip",
                                  "pretrained": str(tmp_path / "negclip.pth")}}}
    spec = registry.model_spec(cfg, "negclip")
    missing = preflight._check_open_clip(spec, cfg, online=False)
    assert missing.status == preflight.FAIL and missing.key == "models.negclip.pretrained"
    assert "github.com/vinid/neg_clip" in missing.fix
    (tmp_path / "negclip.pth").write_bytes(b"weights")
    assert preflight._check_open_clip(spec, cfg, online=False).status == preflight.OK
