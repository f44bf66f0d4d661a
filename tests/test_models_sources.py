"""`counterfactory models check` says how to get each missing role, right for its library and kind (issue 27,
finding 6): a hub id is `hf download <id>`, the open_clip role is the hub repository of its pretrained tag (not the
architecture name), the paper's LaMa role is lama-cleaner's big-lama.pt release file (not the demo's tiny build).
The check runs over every role of config/config.yaml with no network and downloads nothing."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from counterfactory.cli import main
from counterfactory.config import load_config
from counterfactory.models import registry, sources

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "config" / "config.yaml"
DEMO = ROOT / "config" / "demo.yaml"


def _no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("models check must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def _expected(spec) -> tuple[str, list[str]]:
    """(text the role's fix must hold, texts it must not hold)."""
    if spec.library == "lama_cleaner":
        return sources.BIG_LAMA_URL, ["build-tiny", "hf download"]
    if spec.library == "open_clip" and str(spec.pretrained or "").endswith((".pt", ".pth")):
        # a released checkpoint that is not on the hub (NegCLIP, ALIP, LaCLIP, SLIP): its release, to the configured path
        return f"checkpoint (http", ["build-tiny", "hf download"]
    if spec.library == "open_clip":
        return "hf download laion/CLIP-ViT-B-32-laion2B-s34B-b79K", [f"hf download {spec.source}`", "build-tiny"]
    if spec.library == "vsepp":  # VSE++ has no hub checkpoint: the release's checkpoint, converted (issue 43.6)
        return "counterfactory models convert-vsepp --checkpoint", ["build-tiny", "hf download"]
    if spec.library == "torchvision":  # the inception role (§10.3): torchvision's weights file, no hub id
        return "https://download.pytorch.org/models/inception_v3_google-0cc3c7bd.pth", ["build-tiny", "hf download"]
    if spec.role in ("itm_blip", "captioner_pretrained"):  # pre-trained BLIP: the original checkpoint, converted
        return "counterfactory models convert-blip --checkpoint model_base", ["build-tiny", "hf download <hub id>"]
    return f"hf download {sources.hub_id(spec)}", ["build-tiny"]


def test_paper_config_check_suggests_each_roles_real_source(tmp_path, monkeypatch, capsys):
    """Every role of the paper config fails offline (nothing cached) with the right way to get it."""
    cfg = load_config([str(PAPER)])
    roles = sorted(cfg["models"])
    assert {"clip_open_clip", "inpaint", "llm", "sentence"} <= set(roles)
    monkeypatch.chdir(tmp_path)  # relative local sources (the LaMa folder) do not exist here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _no_network(monkeypatch)

    def not_cached(spec, kw):  # what the libraries raise offline for a model that is not in the cache
        raise OSError(f"{spec.source} is not in the local cache and outgoing traffic has been disabled")

    monkeypatch.setattr(registry, "_LOADERS", {kind: not_cached for kind in registry._LOADERS})
    assert main(["models", "check", "--config", str(PAPER)]) == 2
    out = capsys.readouterr().out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines() if re.match(r"^\w+: FAILED ", line)}
    assert sorted(lines) == roles
    wrong = []
    for role in roles:
        fix = lines[role].split("Fix: ", 1)[1]
        must, must_not = _expected(registry.model_spec(cfg, role))
        if must not in fix or any(text in fix for text in must_not):
            wrong.append(f"{role}: {fix}")
    assert not wrong, "\n".join(wrong)
    assert "models.inpaint.source" in lines["inpaint"] and "big-lama.pt" in lines["inpaint"]


def test_demo_roles_are_built_by_build_tiny():
    cfg = load_config([str(DEMO)])
    for role in cfg["models"]:
        fix = sources.how_to_get(registry.model_spec(cfg, role), cfg)
        assert f"models build-tiny --config <config> --role {role}" in fix, (role, fix)


def test_big_lama_url_is_lama_cleaners():
    """The URL and md5 are lama-cleaner's own defaults (read from its source, so importing it sets nothing)."""
    import importlib.util

    text = Path(importlib.util.find_spec("lama_cleaner").submodule_search_locations[0], "model", "lama.py").read_text()
    assert f'"{sources.BIG_LAMA_URL}"' in text and f'"{sources.BIG_LAMA_MD5}"' in text


@pytest.mark.parametrize("entry,expected", [
    ({"source": "ViT-B-32", "library": "open_clip", "pretrained": "laion2b_s34b_b79k"},
     "`hf download laion/CLIP-ViT-B-32-laion2B-s34B-b79K --include 'open_clip_*'`"),
    ({"source": "hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K", "library": "open_clip"},
     "`hf download laion/CLIP-ViT-B-32-laion2B-s34B-b79K`"),
    ({"source": "ViT-B-32", "library": "open_clip", "pretrained": "no-such-tag"}, "laion2b_s34b_b79k"),
    ({"source": "all-MiniLM-L6-v2", "library": "sentence_transformers"},
     "`hf download sentence-transformers/all-MiniLM-L6-v2`"),
    ({"source": "roberta-base", "revision": "e2da8e2"}, "`hf download roberta-base --revision e2da8e2`"),
    ({"source": "/data/big-lama/big-lama.pt", "library": "lama_cleaner"},
     f"curl -L -o /data/big-lama/big-lama.pt {sources.BIG_LAMA_URL}"),
    ({"source": "/data/models/roberta"}, "--local-dir /data/models/roberta"),
])
def test_how_to_get_each_kind(entry, expected):
    spec = registry.model_spec({"models": {"role": entry}}, "role")
    assert expected in sources.how_to_get(spec)
