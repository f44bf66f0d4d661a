"""The ``inception`` role: torchvision's Inception-v3 (Szegedy et al. 2016) as the feature network of FID and IS
(SocialCounterfactuals §10.3 scores its images, VisoGender's and PATA's with both).

A source is either torchvision's ImageNet weights file (``inception_v3_google-0cc3c7bd.pth``, the state dict of
``torchvision.models.inception_v3``; download it once from ``https://download.pytorch.org/models/`` and name its
path) or a folder with ``config.json`` (``{"model_type": "inception_v3", "num_classes", "transform_input"}``) and
``model.safetensors`` (what :func:`save` writes; the offline demo's random stand-in). Nothing is downloaded.

:class:`InceptionFeatures` returns, for images in [0, 1], the 2048-d pool features (FID's) and the class logits
(IS'), one forward pass for both. Inputs are resized to 299 x 299 (bilinear) and normalised with ImageNet's mean
and standard deviation, as torchvision's weights expect.

FID and IS values depend on the network's weights: torch-fidelity's and pytorch-fid's TF-ported Inception gives
different absolute numbers from torchvision's. The paper does not say which it used; compare numbers computed with
the same weights only.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..errors import ModelLoadError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MODEL_TYPE = "inception_v3"
IMAGE_SIZE = 299
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def make(num_classes: int = 1000, transform_input: bool = False) -> nn.Module:
    """A torchvision Inception-v3 without its auxiliary head (FID and IS read the main head only)."""
    from torchvision.models import inception_v3

    return inception_v3(weights=None, aux_logits=False, init_weights=False, num_classes=num_classes,
                        transform_input=transform_input)


class InceptionFeatures(nn.Module):
    """``forward(images in [0, 1], N x 3 x H x W) -> (pool features N x 2048, logits N x classes)``."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net.eval()
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    @property
    def num_classes(self) -> int:
        return self.net.fc.out_features

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = images.to(self.mean.dtype)
        if x.shape[-2:] != (IMAGE_SIZE, IMAGE_SIZE):
            x = nn.functional.interpolate(x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
        x = (x - self.mean) / self.std
        net = self.net
        if net.transform_input:
            x = net._transform_input(x)
        for name in ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1",
                     "Conv2d_4a_3x3", "maxpool2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
                     "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "avgpool"):
            x = getattr(net, name)(x)
        pool = torch.flatten(x, 1)
        return pool, net.fc(pool)


def save(net: nn.Module, out: str | Path) -> Path:
    """Write ``net`` as an inception folder (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_NAME).write_text(json.dumps({"model_type": MODEL_TYPE, "num_classes": net.fc.out_features,
                                               "transform_input": bool(net.transform_input)}, indent=2) + "\n",
                                   encoding="utf-8")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(out / WEIGHTS_NAME))
    return out


def load(source: str | Path) -> InceptionFeatures:
    """An inception folder, or torchvision's ``inception_v3`` ImageNet state-dict file (``.pth``)."""
    path = Path(source)
    try:
        if path.is_dir():
            cfg = json.loads((path / CONFIG_NAME).read_text(encoding="utf-8"))
            if cfg.get("model_type") != MODEL_TYPE:
                raise ModelLoadError(f"{path / CONFIG_NAME}: model_type {cfg.get('model_type')!r}, expected "
                                     f"{MODEL_TYPE!r}. Fix: point the inception role at an Inception-v3 folder or "
                                     "torchvision's inception_v3 weights file")
            from safetensors.torch import load_file

            net = make(int(cfg.get("num_classes", 1000)), bool(cfg.get("transform_input", False)))
            state = load_file(str(path / WEIGHTS_NAME))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
            state = {k: v for k, v in state.items() if not k.startswith("AuxLogits.")}
            net = make(int(state["fc.weight"].shape[0]), False)
        net.load_state_dict(state)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"inception role: cannot load {path} ({exc}). Fix: give torchvision's "
                             "inception_v3_google-0cc3c7bd.pth or a folder written by counterfactory") from exc
    return InceptionFeatures(net)


#: the stand-in's logit spread over the calibration images (photos spread about 20 times more: logits of a few
#: units, so that no class's mean probability underflows to 0, which would make IS NaN)
LOGIT_SPREAD = 0.05


def build_tiny(out: Path, seed: int = 0) -> None:
    """The offline stand-in: an Inception-v3 of the same class with random weights (10 classes). Random weights
    alone give every image the same features (the batch-norm statistics do not fit them), so the statistics are
    set from 8 seeded smooth noise images and the classifier centred and scaled to a small logit spread over them (:data:`LOGIT_SPREAD`): features and IS then vary
    from image to image, as they must for FID and IS to mean anything even on the demo."""
    torch.manual_seed(seed + 31)
    net = make(num_classes=10)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = None   # a cumulative average over the calibration batch
            m.reset_running_stats()
    coarse = torch.rand(8, 3, 6, 6, generator=torch.Generator().manual_seed(seed + 32))   # smooth, photo-like
    noise = nn.functional.interpolate(coarse, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bicubic", align_corners=False)
    noise = noise.clamp(0, 1)
    features = InceptionFeatures(net)
    with torch.no_grad():
        net.train()
        net(((noise - features.mean) / features.std))
        net.eval()
        pool, _ = features(noise)
        centred = (pool - pool.mean(0)) @ net.fc.weight.T          # logits less their mean over the batch
        net.fc.weight.mul_(LOGIT_SPREAD / max(float(centred.std()), 1e-6))
        net.fc.bias.copy_(-(pool.mean(0) @ net.fc.weight.T))       # centred per class
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = 0.1
    save(net, out)
