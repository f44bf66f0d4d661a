"""Model revisions (issue 27, finding 11: the paper config pinned no model `revision`).

The paper config pins its hub roles to 40-hex commits, each listed in docs/models.md#pinned-revisions;
``counterfactory models pin`` writes an overlay of the commits the local Hugging Face cache holds; an overlay that
gives a role another source drops the old pin; the preflight names a pinned revision the cache lacks. The Hugging
Face cache here is a fake one in ``tmp_path`` (``models--org--name/refs/main`` + ``snapshots/<commit>/``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from counterfactory import preflight
from counterfactory.config import drop_replaced_revisions, load_config
from counterfactory.models import pins

REPO = Path(__file__).resolve().parents[1]
HEX40 = re.compile(r"[0-9a-f]{40}")
A, B, C = "a" * 40, "b" * 40, "c" * 40


def _cached(cache: Path, repo_id: str, commits: list[str], main: str | None = None) -> Path:
    """A repository in the fake HF cache: one snapshot folder (with a config.json) per commit; ``refs/main``."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for commit in commits:
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "config.json").write_text('{"model_type": "roberta", "architectures": ["RobertaForMaskedLM"]}')
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(main)
    return repo


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))   # read at import by the hub library
    return cache


def _overlay(tmp_path: Path, models: dict) -> Path:
    path = tmp_path / "roles.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def test_models_pin_writes_the_cached_commits_and_lists_what_is_missing(tmp_path, hf_cache, capsys):
    from counterfactory import cli

    _cached(hf_cache, "org/cached", [A, B], main=B)                  # refs/main -> B
    _cached(hf_cache, "org/onesnap", [C])                             # no refs: its only snapshot
    _cached(hf_cache, "org/pinned", [A, B], main=B)                   # cached at the configured pin A too
    _cached(hf_cache, "sentence-transformers/toy-minilm", [A], main=A)   # a bare sentence-transformers name
    roles = _overlay(tmp_path, {"mlm": {"source": "org/cached"}, "lm": {"source": "org/missing"},
                                "sd": {"source": "org/onesnap", "library": "diffusers"},
                                "clip_filter": {"source": "org/pinned", "revision": A},
                                "clip_eval": {"source": "org/other-pin", "revision": C},
                                "sentence": {"source": "toy-minilm"}})
    out = tmp_path / "pins.yaml"
    code = cli.main(["models", "pin", "--config", str(REPO / "config" / "demo.yaml"), "--config", str(roles),
                     "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 1                                               # two hub roles have no cached commit
    assert yaml.safe_load(out.read_text()) == {"models": {
        "mlm": {"revision": B}, "sd": {"revision": C}, "clip_filter": {"revision": A},
        "sentence": {"revision": A}}}                              # the demo's tiny folders are not hub roles
    assert "`hf download org/missing`" in printed
    assert f"`hf download org/other-pin --revision {C}`" in printed
    assert re.search(r"^mlm\s+org/cached\s+" + B, printed, re.MULTILINE)
    assert not list(tmp_path.glob(".pins.yaml*"))                  # written atomically: no temporary left
    # the overlay, passed after the config, pins the roles
    cfg = load_config([REPO / "config" / "demo.yaml", roles, out])
    assert cfg["models"]["mlm"] == {"source": "org/cached", "revision": B}


def test_models_pin_keeps_a_configured_pin_and_reports_one_the_cache_lacks(tmp_path, hf_cache):
    _cached(hf_cache, "org/toy", [A], main=A)
    cfg = {"models": {"mlm": {"source": "org/toy", "revision": B}, "lm": {"source": "org/toy", "revision": "main"},
                      "inpaint": {"source": "resources/models/big-lama", "library": "lama_cleaner"},
                      "clip_open_clip": {"source": "ViT-B-32", "library": "open_clip",
                                         "pretrained": "laion2b_s34b_b79k"}}}
    rows, skipped = pins.pins(cfg)
    by_role = {r.role: r for r in rows}
    assert set(by_role) == {"mlm", "lm"}
    assert by_role["mlm"].revision is None and by_role["mlm"].status == "pinned-missing"
    assert f"cached at {A[:12]}" in by_role["mlm"].fix and f"--revision {B}" in by_role["mlm"].fix
    assert by_role["lm"].revision == A                             # a branch name resolves through the refs
    assert any(s.startswith("clip_open_clip:") and "no revision" in s for s in skipped)
    assert pins.overlay(rows) == {"models": {"lm": {"revision": A}}}


def test_an_overlay_with_another_source_drops_the_inherited_pin(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text((REPO / "config" / "demo.yaml").read_text())
    pinned = _overlay(tmp_path, {"mlm": {"source": "org/toy", "revision": A},
                                 "lm": {"source": "org/lm", "revision": B}})
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"models": {"mlm": {"source": "./my/mlm"}, "lm": {"display_name": "GPT"}}}))
    cfg = load_config([base, pinned, other])
    assert "revision" not in cfg["models"]["mlm"]                 # the pin was for org/toy, not for ./my/mlm
    assert cfg["models"]["lm"]["revision"] == B                   # same source: the pin stays
    merged = {"models": {"mlm": {"source": "org/toy", "revision": A}}}
    layers = [{"models": {"mlm": {"source": "org/x", "revision": C}}}, {"models": {"mlm": {"source": "org/toy"}}},
              {"models": {"mlm": {"revision": A}}}]
    assert drop_replaced_revisions(merged, layers) == [] and merged["models"]["mlm"]["revision"] == A


def test_the_preflight_names_a_pinned_revision_missing_from_the_cache(tmp_path, hf_cache, monkeypatch):
    _cached(hf_cache, "org/toy", [A], main=A)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = {"models": {"mlm": {"source": "org/toy", "revision": B}}}
    (check,) = preflight.check_role(cfg, "mlm", online=False)
    assert (check.key, check.status) == ("models.mlm.revision", preflight.FAIL)
    assert B in check.detail and A[:12] in check.detail and "HF_HUB_OFFLINE" in check.detail
    assert f"hf download org/toy --revision {B}" in check.fix
    monkeypatch.delenv("HF_HUB_OFFLINE")                          # online later: fetched on first use
    (check,) = preflight.check_role(cfg, "mlm", online=False)
    assert (check.key, check.status) == ("models.mlm.revision", preflight.FETCH)
    cfg["models"]["mlm"]["revision"] = A                          # the pinned commit is cached
    assert preflight.check_role(cfg, "mlm", online=False)[0].status == preflight.OK


def test_every_revision_of_the_paper_config_is_a_commit_listed_in_the_docs():
    models = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["models"]
    pinned = {role: entry["revision"] for role, entry in models.items()
              if isinstance(entry, dict) and "revision" in entry}
    assert len(pinned) >= 15, "the paper config pins its hub roles"
    docs = (REPO / "docs" / "models.md").read_text(encoding="utf-8")
    section = docs.split("## Pinned revisions", 1)[1].split("\n## ", 1)[0]
    for role, revision in pinned.items():
        assert isinstance(revision, str) and HEX40.fullmatch(revision), (role, revision)
        assert not models[role]["source"].startswith(("resources/", "./", "/")), role   # hub ids only
        row = next((line for line in section.splitlines() if f"`{revision}`" in line), None)
        assert row is not None and f"`{role}`" in row, f"docs/models.md#pinned-revisions does not list {role}"
