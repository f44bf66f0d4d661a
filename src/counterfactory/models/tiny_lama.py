"""Tiny stand-in for the ``inpaint`` role (spurious-correlation retrieval study, §3.1: object removal).

The paper's inpainting model is reached through lama-cleaner's ``LaMa`` class, which loads the big-lama
TorchScript file (``big-lama.pt``) with ``torch.jit.load`` and calls it as ``model(image, mask)``:
``image`` ``[B, 3, H, W]`` float32 RGB in [0, 1], ``mask`` ``[B, 1, H, W]`` (lama-cleaner passes an int64
tensor of 0/1; the batched path in :mod:`counterfactory.generation.inpaint` passes the same), H and W
multiples of 8; it returns ``[B, 3, H, W]`` RGB in [0, 1].

:class:`TinyLaMa` has exactly that interface: a three-level convolutional encoder-decoder (about 10k
parameters) over the masked image and the mask, with a sigmoid output. Its weights are drawn from a
``torch.Generator`` seeded with ``seed`` (the global RNG is untouched), so the same seed gives the same
file content. :func:`build_inpaint` scripts it with ``torch.jit.script`` and saves ``big-lama.pt`` into the
role folder (``<models>/inpaint/big-lama.pt``); the role's ``source`` is that folder. Its outputs carry no
meaning (random weights): it exercises the machinery, not inpainting quality.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

#: file name lama-cleaner downloads and that the ``inpaint`` loader looks for inside a model folder
LAMA_FILE = "big-lama.pt"
#: channels of the hidden layers
WIDTH = 16


class _Conv(nn.Module):
    """A 2-D convolution (``weight``, ``bias``, ``stride``, ``padding``) without ``nn.Conv2d``'s TorchScript
    constants, whose order follows Python's per-process string hashing: the scripted file is byte-reproducible."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cout, cin, kernel, kernel))
        self.bias = nn.Parameter(torch.zeros(cout))
        self.stride = stride
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)


class TinyLaMa(nn.Module):
    """``forward(image [B,3,H,W] in [0,1], mask [B,1,H,W] 0/1 of any dtype) -> [B,3,H,W] in [0,1]``
    (H, W multiples of 4; lama-cleaner pads to multiples of 8)."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.enc1 = _Conv(4, width, 3, padding=1)
        self.enc2 = _Conv(width, width, 3, stride=2, padding=1)
        self.enc3 = _Conv(width, width, 3, stride=2, padding=1)
        self.dec2 = _Conv(2 * width, width, 3, padding=1)
        self.dec1 = _Conv(2 * width, width, 3, padding=1)
        self.out = _Conv(width, 3, 1)

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        mask = (mask > 0).to(image.dtype)
        x = torch.cat([image * (1.0 - mask), mask], dim=1)
        h1 = F.relu(self.enc1(x))
        h2 = F.relu(self.enc2(h1))
        h3 = F.relu(self.enc3(h2))
        u2 = F.interpolate(h3, size=[h2.shape[2], h2.shape[3]], mode="nearest")
        d2 = F.relu(self.dec2(torch.cat([u2, h2], dim=1)))
        u1 = F.interpolate(d2, size=[h1.shape[2], h1.shape[3]], mode="nearest")
        d1 = F.relu(self.dec1(torch.cat([u1, h1], dim=1)))
        return torch.sigmoid(self.out(d1))


def tiny_lama(seed: int = 0) -> TinyLaMa:
    """A :class:`TinyLaMa` with weights drawn from ``torch.Generator().manual_seed(seed)`` (He-scaled
    normal weights, small normal biases), in eval mode."""
    model = TinyLaMa()
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("weight"):
                fan_in = p.shape[1] * p.shape[2] * p.shape[3]
                p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model.eval()


def build_inpaint(out: Path, seed: int = 0) -> None:
    """Script :func:`tiny_lama` with ``torch.jit.script`` and save it as ``out/big-lama.pt``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # torch 2.9+ calls TorchScript deprecated; lama-cleaner needs this format
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")
        scripted = torch.jit.script(tiny_lama(seed))
        torch.jit.save(scripted, str(out / LAMA_FILE))
    _fix_serialization_id(out / LAMA_FILE)


def _fix_serialization_id(path: Path) -> None:
    """Rewrite the TorchScript archive with its random ``serialization_id`` record replaced by one derived from the
    other records (and fixed timestamps), so the same seed gives the same bytes in every run."""
    import hashlib
    import zipfile

    with zipfile.ZipFile(path) as zf:
        records = [(info.filename, zf.read(info)) for info in zf.infolist()]
    digest = hashlib.sha256(b"".join(d for n, d in records if not n.endswith("/serialization_id"))).hexdigest()
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in records:
            if name.endswith("/serialization_id"):
                data = str(int(digest[:32], 16)).encode()
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    os.replace(tmp, path)


BUILDERS = {"inpaint": build_inpaint}
