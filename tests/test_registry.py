"""Model registry: roles load through the libraries' own loaders; failures name role, source and fix."""

from __future__ import annotations

import pytest

from counterfactory.errors import ModelLoadError
from counterfactory.models import registry


def test_text_roles_load_from_tiny_folders(tiny_text_models):
    cfg = {"models": {r: {"source": str(tiny_text_models / r)} for r in ("mlm", "lm", "sentence")}}
    model, tok = registry.load(cfg, "mlm")
    assert type(model).__name__ == "RobertaForMaskedLM" and tok.mask_token == "<mask>"
    model, tok = registry.load(cfg, "lm")
    assert type(model).__name__ == "GPT2LMHeadModel"
    st = registry.load(cfg, "sentence")
    assert st.encode(["a dog"]).shape == (1, 384)  # the real all-MiniLM-L6-v2
    info = registry.loaded_models()
    assert info["mlm"]["resolved"].endswith("mlm") and info["mlm"]["fingerprint"]


def test_missing_local_folder_says_how_to_build(tmp_path):
    cfg = {"models": {"mlm": {"source": str(tmp_path / "absent")}}}
    with pytest.raises(ModelLoadError) as err:
        registry.load(cfg, "mlm")
    msg = str(err.value)
    assert "role 'mlm'" in msg and "absent" in msg and "tiny_models" in msg


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
