"""Image quality of a set of images: Fréchet Inception Distance to a reference set and Inception Score
(SocialCounterfactuals §10.3), computed by torchmetrics (``FrechetInceptionDistance``, ``InceptionScore``) over the
features of the ``inception`` role (:mod:`counterfactory.models.inception`).

:func:`extract` runs the network once per image set, batched on the device, and returns the pool features (FID)
and the logits (IS); each set's features are a file of their own (``features.npz``), so a reference set such as
ImageNet val is read once per run and every FID against it is a small computation. torchmetrics is given the
features through a pass-through module, so its FID (Heusel et al. 2017: squared distance of the means plus the
trace term of the covariances, in float64) and its IS (Salimans et al. 2016: exp of the mean KL divergence between
p(y|x) and p(y) over ``splits`` random splits, mean and standard deviation) are what is reported.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import InputError
from ..io import atomic_path
from ..models.inception import IMAGE_SIZE
from ..rgb import open_rgb

log = logging.getLogger(__name__)


class _Given(nn.Module):
    """The torchmetrics feature network for features computed beforehand: returns its input."""

    def __init__(self, num_features: int):
        super().__init__()
        self.num_features = num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _load(path: str, size: int) -> torch.Tensor:
    img = open_rgb(path).resize((size, size), resample=3)   # bicubic to the network's input size
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)


def extract(model, paths: Sequence[str], *, batch_size: int = 32, device: torch.device | str = "cpu",
            progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(features N x 2048, logits N x classes)`` (float64) of the images at ``paths``, in order; each image is
    resized to 299 x 299 on its own, so a batch's make-up does not change an image's features."""
    from tqdm import tqdm

    if not paths:
        raise InputError("image quality: no images to score. Fix: check the set's image table or folder")
    model = model.to(device).eval()
    feats, logits = [], []
    starts = range(0, len(paths), batch_size)
    for s in tqdm(starts, desc="inception", unit="batch", leave=False, disable=not progress):
        batch = torch.stack([_load(p, IMAGE_SIZE) for p in paths[s:s + batch_size]]).to(device)
        f, z = model(batch)
        feats.append(f.double().cpu().numpy())
        logits.append(z.double().cpu().numpy())
    return np.concatenate(feats), np.concatenate(logits)


def fid(features: np.ndarray, reference: np.ndarray) -> float:
    """FID between two feature sets (torchmetrics; each needs two or more images)."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    for name, f in (("set", features), ("reference", reference)):
        if len(f) < 2:
            raise InputError(f"FID: the {name} has {len(f)} image(s); the covariance needs 2 or more. Fix: score "
                             "a larger set")
    metric = FrechetInceptionDistance(feature=_Given(features.shape[1]), normalize=False)
    metric.update(torch.from_numpy(np.ascontiguousarray(reference)), real=True)
    metric.update(torch.from_numpy(np.ascontiguousarray(features)), real=False)
    return float(metric.compute())


def inception_score(logits: np.ndarray, *, splits: int = 10, seed: int = 0) -> tuple[float, float]:
    """IS (mean, std over ``splits`` splits; fewer splits when there are fewer images) from the class logits
    (torchmetrics; its random split permutation is drawn from ``seed``)."""
    from torchmetrics.image.inception import InceptionScore

    splits = max(1, min(int(splits), len(logits)))
    with warnings.catch_warnings():   # "saves all features in a buffer" (they are given); std of one split
        warnings.simplefilter("ignore", UserWarning)
        metric = InceptionScore(feature=_Given(logits.shape[1]), splits=splits, normalize=False)
        metric.update(torch.from_numpy(np.ascontiguousarray(logits)))
        generator_state = torch.random.get_rng_state()
        try:
            torch.manual_seed(seed)
            mean, std = metric.compute()
        finally:
            torch.random.set_rng_state(generator_state)
    return float(mean), float(std) if splits > 1 else 0.0


def save_features(path: str | Path, features: np.ndarray, logits: np.ndarray, paths: Sequence[str]) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, features=features, logits=logits, paths=np.asarray(list(paths), dtype=str))


def load_features(path: str | Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return z["features"], z["logits"], [str(p) for p in z["paths"]]
    except (OSError, KeyError, ValueError) as exc:
        raise InputError(f"{path}: not an image-quality features file ({exc}). Fix: rerun "
                         "`counterfactory social image-quality-features` for this set") from exc


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".JPEG", ".JPG", ".PNG")


def folder_images(root: str | Path, limit: int | None = None) -> list[str]:
    """Every image file under ``root`` (recursively, sorted), the first ``limit`` of them when given."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: reference image folder not found. Fix: point the config key at a folder of "
                         "images (e.g. ImageNet val)")
    files = sorted(str(p) for p in root.rglob("*") if p.is_file() and p.suffix in IMAGE_SUFFIXES)
    if not files:
        raise InputError(f"{root}: no images (.jpg / .png / .webp) under it. Fix: point the key at the image folder")
    return files[:limit] if limit else files
