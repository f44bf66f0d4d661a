"""ALIP, LaCLIP and SLIP roles (SocialCounterfactuals §4.2, Figure 3; ALIP also §5.1): each released checkpoint
layout, written from a tiny randomly initialised model, loads through the registry into open_clip and embeds
exactly as the model it was written from."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import OrderedDict

import pytest
import torch
from torch import nn

open_clip = pytest.importorskip("open_clip")
timm = pytest.importorskip("timm")

from counterfactory.errors import ConfigError, ModelLoadError  # noqa: E402
from counterfactory.models import loaders_clip_family as family  # noqa: E402
from counterfactory.models import registry  # noqa: E402

TINY_VIT = "CFTest-Tiny-ViT"     # open_clip's native ViT (ALIP's and LaCLIP's layout), tiny
TINY_SLIP = "CFTest-Tiny-SLIP"   # SLIP's shape: a timm ViT trunk (timm's 64-wide test_vit) + CLIP text, QuickGELU
TEXT_CFG = {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}


@pytest.fixture(scope="module")
def archs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("open_clip_configs")
    (folder / f"{TINY_VIT}.json").write_text(json.dumps({
        "embed_dim": 16, "text_cfg": TEXT_CFG,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 16, "head_width": 16}}))
    (folder / f"{TINY_SLIP}.json").write_text(json.dumps({
        "embed_dim": 16, "quick_gelu": True, "text_cfg": TEXT_CFG,
        "vision_cfg": {"timm_model_name": "test_vit", "timm_model_pretrained": False, "timm_pool": "token",
                       "timm_proj": "linear", "timm_proj_bias": False, "image_size": 160}}))
    open_clip.add_model_config(str(folder))
    return folder


def _randomise(module: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


def _cfg(role, source, pretrained=None):
    return {"models": {role: {"source": str(source), "library": "open_clip", "pretrained": pretrained}}}


def _assert_same_embeddings(loaded, encode_image, encode_text, image_size):
    model, preprocess, tokenizer = loaded
    images = torch.randn(2, 3, image_size, image_size, generator=torch.Generator().manual_seed(1))
    tokens = tokenizer(["a photo of a doctor", "an image of a tattooed nurse"])
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(images), encode_image(images), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.encode_text(tokens), encode_text(tokens), rtol=1e-5, atol=1e-5)


def _tiny_open_clip(seed=0):
    model = open_clip.create_model(TINY_VIT, pretrained=None).eval()
    _randomise(model, seed)
    return model


def test_alip_released_layout_loads_with_identical_embeddings(archs, tmp_path):
    """ALIP's train.py saves the DDP model's bare state dict: open_clip keys behind ``module.``."""
    ref = _tiny_open_clip()
    path = tmp_path / "ALIP_YFCC15M_B32.pt"
    torch.save({f"module.{k}": v for k, v in ref.state_dict().items()}, path)
    loaded = registry.load(_cfg("alip", TINY_VIT, str(path)), "alip")
    _assert_same_embeddings(loaded, ref.encode_image, ref.encode_text, 32)


@pytest.mark.parametrize("extra", [{}, {"args": argparse.Namespace(model="ViT-B-32", lr=5e-4)}])
def test_laclip_released_layout_loads_with_identical_embeddings(archs, tmp_path, extra):
    """LaCLIP's LAION-400M files are open_clip training checkpoints: ``{"epoch", "name", "state_dict", ...}`` (with an
    ``args`` Namespace, which open_clip's weights-only load refuses, the tensors are read here instead)."""
    ref = _tiny_open_clip(seed=3)
    path = tmp_path / "laion400m_laclip.pt"
    torch.save({"epoch": 32, "name": "laclip", "state_dict": ref.state_dict(), "optimizer": {"state": {}}, **extra},
               path)
    loaded = registry.load(_cfg("laclip", TINY_VIT, str(path)), "laclip")
    _assert_same_embeddings(loaded, ref.encode_image, ref.encode_text, 32)


class _SlipLayout(nn.Module):
    """A model in SLIP's own layout (its models.py: ``visual`` = timm ViT without classifier, ``x @ image_projection``,
    a CLIP text transformer with QuickGELU, and the SimCLR ``image_mlp``), written independently of open_clip."""

    def __init__(self):
        super().__init__()
        self.visual = timm.create_model("test_vit", num_classes=0)
        width, embed = TEXT_CFG["width"], 16
        self.image_projection = nn.Parameter(torch.empty(self.visual.num_features, embed))
        self.text_projection = nn.Parameter(torch.empty(width, embed))
        self.logit_scale = nn.Parameter(torch.ones([]))
        self.token_embedding = nn.Embedding(TEXT_CFG["vocab_size"], width)
        self.positional_embedding = nn.Parameter(torch.empty(77, width))
        self.ln_final = nn.LayerNorm(width)
        self.transformer = nn.Module()
        self.transformer.resblocks = nn.ModuleList([self._block(width) for _ in range(TEXT_CFG["layers"])])
        self.image_mlp = nn.Sequential(OrderedDict(layer1=nn.Linear(self.visual.num_features, 8)))

    @staticmethod
    def _block(width):
        block = nn.Module()
        block.attn = nn.MultiheadAttention(width, TEXT_CFG["heads"])
        block.ln_1, block.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        block.mlp = nn.Sequential(OrderedDict(c_fc=nn.Linear(width, 4 * width), c_proj=nn.Linear(4 * width, width)))
        return block

    def encode_image(self, images):
        return self.visual(images) @ self.image_projection

    def encode_text(self, tokens):
        mask = torch.full((77, 77), float("-inf")).triu(1)
        x = (self.token_embedding(tokens) + self.positional_embedding).permute(1, 0, 2)
        for b in self.transformer.resblocks:
            h = b.ln_1(x)
            x = x + b.attn(h, h, h, need_weights=False, attn_mask=mask)[0]
            h = b.mlp.c_fc(b.ln_2(x))
            x = x + b.mlp.c_proj(h * torch.sigmoid(1.702 * h))   # QuickGELU
        x = self.ln_final(x.permute(1, 0, 2))
        return x[torch.arange(x.shape[0]), tokens.argmax(dim=-1)] @ self.text_projection


def _slip_file(tmp_path, seed=5):
    ref = _SlipLayout().eval()
    _randomise(ref, seed)
    path = tmp_path / "slip_base_100ep.pt"
    torch.save({"epoch": 100, "args": argparse.Namespace(model="SLIP_VITB16", ssl_scale=1.0),
                "state_dict": {f"module.{k}": v for k, v in ref.state_dict().items()}}, path)
    return ref, path


def test_slip_released_layout_maps_into_open_clip_with_identical_embeddings(archs, tmp_path):
    ref, path = _slip_file(tmp_path)
    loaded = registry.load(_cfg("slip", TINY_SLIP, str(path)), "slip")
    _assert_same_embeddings(loaded, ref.encode_image, ref.encode_text, 160)
    assert type(loaded[0].visual).__name__ == "TimmModel"
    normalize = loaded[1].transforms[-1]   # SLIP's evaluation transform: ImageNet statistics
    assert tuple(normalize.mean) == family.IMAGENET_MEAN and tuple(normalize.std) == family.IMAGENET_STD


def test_slip_paper_arch_has_the_released_vit_b16_keys():
    """The shipped SLIP-ViT-B-16 architecture holds exactly SLIP_VITB16's keys after the mapping (shapes too)."""
    family.register_archs()
    with torch.device("meta"):
        model = open_clip.create_model(family.SLIP_ARCH, pretrained=None, device="meta")
        vit = timm.create_model("vit_base_patch16_224", num_classes=0)
    released = {f"visual.{k}": v for k, v in vit.state_dict().items()}
    released["image_projection"] = torch.empty(768, 512, device="meta")
    released.update({k: v for k, v in model.state_dict().items() if not k.startswith("visual.")})
    released["image_mlp.layer1.weight"] = torch.empty(4096, 768, device="meta")
    mapped = family.slip_to_open_clip(released)
    own = model.state_dict()
    assert set(mapped) == set(own)
    assert all(tuple(mapped[k].shape) == tuple(own[k].shape) for k in own)


def test_finetuned_checkpoint_folder_loads_into_the_family_arch(archs, tmp_path, monkeypatch):
    """The debiasing run saves open_clip_model.safetensors (no config) and re-points the role at the folder."""
    from safetensors.torch import save_file

    monkeypatch.setitem(family.FAMILIES, "alip", dataclasses.replace(family.FAMILIES["alip"], arch=TINY_VIT))
    ref = _tiny_open_clip(seed=7)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "open_clip_model.safetensors"))
    loaded = registry.load(_cfg("alip", tmp_path, str(tmp_path / "unused.pt")), "alip")
    _assert_same_embeddings(loaded, ref.encode_image, ref.encode_text, 32)


def test_missing_file_and_wrong_layout_are_clear_errors(archs, tmp_path):
    with pytest.raises(ModelLoadError, match=r"ALIP.*does not exist.*github.com/deepglint/ALIP"):
        registry.load(_cfg("alip", TINY_VIT, str(tmp_path / "nope.pt")), "alip")
    with pytest.raises(ModelLoadError, match=r"models.slip.pretrained is not set"):
        registry.load(_cfg("slip", TINY_SLIP), "slip")
    alip = tmp_path / "alip.pt"
    torch.save(_tiny_open_clip().state_dict(), alip)   # an open_clip-layout file given as SLIP
    with pytest.raises(ModelLoadError, match=r"alip.pt: does not fit .*CFTest-Tiny-SLIP.*SLIP checkpoint"):
        registry.load(_cfg("slip", TINY_SLIP, str(alip)), "slip")


def test_paper_config_probes_six_models_and_debiases_alip():
    from counterfactory.config import load_full_config

    cfg = load_full_config(["config/config.yaml"])
    social = cfg["social_counterfactuals"]
    assert {"alip", "laclip", "slip"} <= set(social["probing"]["roles"])
    assert len(social["probing"]["roles"]) == 6
    assert social["debias"]["roles"] == ["clip_train", "alip", "itm_flava"]
    for role, arch in (("alip", "ViT-B-32"), ("laclip", "ViT-B-32"), ("slip", family.SLIP_ARCH)):
        spec = registry.model_spec(cfg, role)
        assert (spec.library, spec.source, spec.is_local) == ("open_clip", arch, False)
        assert spec.pretrained.endswith(".pt")
    with pytest.raises(ConfigError):
        registry.model_spec({"models": {}}, "alip")
