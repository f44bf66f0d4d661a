"""Manifests, batch plans and collation: the part of the data pipeline the recipes own.

The batch order is decided here, from ``data_seed`` alone, before the Trainer sees any data: the
Trainer receives the whole run as one fixed list of batches (:func:`step_plan`). That is what keeps
the grouping recipe's pairs in one batch, gives CVLD its counterfactual partners, and makes the order
independent of data-loader workers, threads and devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..errors import input_error
from .model import IMAGE_IDS, N_PAIRS
from ..rgb import to_rgb

MANIFEST_COLUMNS = ("image_path", "caption", "is_counterfactual", "pair_id")
#: optional manifest columns: a row's own hard negatives, a caption or an image with no partner of its own
#: (CounterCurate Table 4's single-negative ablations); the collator appends them to the row's batch as extra
#: columns (captions) or rows (images) of the similarity matrix, negatives for that batch's pairs only
HARD_NEGATIVE_COLUMNS = {"hard_negative_caption": "caption", "hard_negative_image": "image"}


def read_manifest(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "manifest not found", "build it with the mixture stage first")
    frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    missing = [c for c in MANIFEST_COLUMNS if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing columns {missing}", f"a manifest needs {list(MANIFEST_COLUMNS)}")
    empty = frame["caption"].astype(str).str.strip() == ""
    if empty.any():
        raise input_error(path, f"row {int(np.flatnonzero(empty)[0])}", "empty caption", "drop or fix that row")
    for col in HARD_NEGATIVE_COLUMNS:
        if col in frame.columns:
            values = frame[col]
            blank = values.notna() & (values.astype(str).str.strip() == "")
            if blank.any():
                raise input_error(path, f"row {int(np.flatnonzero(blank)[0])}", f"empty {col}",
                                  "leave it null when the row has no hard negative")
    return frame.reset_index(drop=True)


def hard_negatives(frame: pd.DataFrame, rows: Sequence[int], column: str) -> list[int]:
    """Positions among ``rows`` whose ``column`` (a :data:`HARD_NEGATIVE_COLUMNS` key) holds a hard negative."""
    if column not in frame.columns:
        return []
    values = frame[column]
    return [r for r in rows if pd.notna(values.iloc[r])]


# --------------------------------------------------------------------------- batching

def make_batches(frame: pd.DataFrame, batch_size: int, data_seed: int, grouping: bool) -> list[list[int]]:
    """Row positions per batch for one epoch. With ``grouping`` every ``pair_id`` group stays in one batch
    (a batch is closed early rather than split a group); otherwise rows are shuffled freely."""
    rng = np.random.default_rng(data_seed)
    if not grouping:
        order = rng.permutation(len(frame))
        return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    groups = list(frame.reset_index(drop=True).groupby("pair_id", sort=True).indices.values())
    batches, current = [], []
    for g in rng.permutation(len(groups)):
        members = sorted(int(i) for i in groups[g])
        if current and len(current) + len(members) > batch_size:
            batches.append(current)
            current = []
        current.extend(members)
    if current:
        batches.append(current)
    return batches


def anchors_and_partners(frame: pd.DataFrame) -> tuple[list[int], dict[int, int]]:
    """CVLD's ``B`` and ``B~``: one anchor row per ``pair_id`` group (its real, non-counterfactual row if
    it has one, otherwise its first row in manifest order) and, for each anchor, its partner (the next
    row of the same group), if any. Rows are positions in ``frame``."""
    frame = frame.reset_index(drop=True)
    is_cf = frame["is_counterfactual"].astype(bool).to_numpy()
    anchors, partners = [], {}
    for _, rows in frame.groupby("pair_id", sort=False).indices.items():
        rows = sorted(int(r) for r in rows)
        real = [r for r in rows if not is_cf[r]]
        anchor = real[0] if real else rows[0]
        anchors.append(anchor)
        others = [r for r in rows if r != anchor]
        if others:
            partners[anchor] = others[0]
    return sorted(anchors), partners


def counterfactual_partners(frame: pd.DataFrame, rows: Sequence[int]) -> list[int | None]:
    """For each row position in ``rows``, the position of its CVLD partner (see :func:`anchors_and_partners`)."""
    _, partners = anchors_and_partners(frame)
    return [partners.get(int(r)) for r in rows]


@dataclass(frozen=True)
class PlannedBatch:
    epoch: int
    rows: tuple[int, ...]


def step_plan(frame: pd.DataFrame, batch_size: int, epochs: int, data_seed: int, recipe: str,
              max_steps: int | None = None) -> list[PlannedBatch]:
    """Every optimisation step of a run, in order: epoch ``e`` is shuffled with ``data_seed + e``.

    ``plain``: all rows; ``grouping``: all rows, pair groups kept in one batch; ``cvld``: the anchors
    only (their partners are added by the collator as ``B~``)."""
    frame = frame.reset_index(drop=True)
    if recipe == "cvld":
        index = np.array(anchors_and_partners(frame)[0], dtype=int)
        base = frame.iloc[index].reset_index(drop=True)
    else:
        index = np.arange(len(frame))
        base = frame
    plan: list[PlannedBatch] = []
    for epoch in range(epochs):
        for rows in make_batches(base, batch_size, data_seed + epoch, grouping=recipe == "grouping"):
            plan.append(PlannedBatch(epoch, tuple(int(index[r]) for r in rows)))
            if max_steps and len(plan) >= max_steps:
                return plan
    return plan


def eval_batches(n_rows: int, batch_size: int) -> list[list[int]]:
    """Validation batches in manifest order; a trailing single row joins the previous batch (the
    contrastive loss of a one-row batch is 0 by construction)."""
    batches = [list(range(i, min(i + batch_size, n_rows))) for i in range(0, n_rows, batch_size)]
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches[-2].extend(batches.pop())
    return batches


# --------------------------------------------------------------------------- collation

class RowDataset(torch.utils.data.Dataset):
    """Item ``i`` is row position ``i``; the collator turns a batch of positions into tensors."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return int(i)


def load_images(frame: pd.DataFrame, rows: Sequence[int], root: Path, column: str = "image_path"):
    from PIL import Image

    out = []
    for r in rows:
        path = root / str(frame.iloc[r][column])
        try:
            with Image.open(path) as im:
                out.append(to_rgb(im, path))
        except (OSError, ValueError) as exc:
            raise input_error(path, f"manifest row {r}", f"cannot read image ({exc})", "fix or drop that row") from exc
    return out


def image_id_map(frame: pd.DataFrame, column: str = "image_path") -> dict[str, int]:
    """An integer id per image of ``frame`` (BLIP's ``idx``: the rows showing one image share it): the
    position of the row's ``column`` value among the frame's distinct values, sorted, so the ids depend on
    the set of images alone (not on the row order). Counterfactual (e.g. inpainted) images are other files,
    hence other images."""
    return {path: i for i, path in enumerate(sorted(set(frame[column].astype(str))))}


class Collator:
    """Row positions -> model inputs (pixels, tokens padded to ``max_length``); with ``partners`` (CVLD)
    also ``partner_*`` inputs for the partners of the batch's anchors, when there are at least two.

    With ``hard_negatives`` the rows' :data:`HARD_NEGATIVE_COLUMNS` follow the rows' own captions / images
    (pairs first, in row order) and :data:`N_PAIRS` says how many leading images and captions are pairs.

    With ``image_ids`` (image path -> integer id, :func:`image_id_map`; BLIP's official objective) the batch
    also holds :data:`IMAGE_IDS`, the id of each pair's image (and ``partner_image_ids`` for the partners)."""

    def __init__(self, frame: pd.DataFrame, encoder, image_root: str | Path, partners: dict[int, int] | None = None,
                 hard_negatives: bool = True, image_ids: Mapping[str, int] | None = None):
        self.frame = frame.reset_index(drop=True)
        self.encoder = encoder
        self.root = Path(image_root)
        self.partners = partners
        self.hard_negatives = hard_negatives
        self.image_ids = image_ids

    def encode(self, rows: Sequence[int], prefix: str = "") -> dict[str, torch.Tensor]:
        rows = list(rows)
        images = load_images(self.frame, rows, self.root)
        captions = self.frame["caption"].iloc[rows].astype(str).tolist()
        extra_images = extra_captions = []
        if self.hard_negatives and not prefix:
            extra_images = hard_negatives(self.frame, rows, "hard_negative_image")
            extra_captions = hard_negatives(self.frame, rows, "hard_negative_caption")
            images += load_images(self.frame, extra_images, self.root, column="hard_negative_image")
            if extra_captions:
                captions += self.frame["hard_negative_caption"].iloc[extra_captions].astype(str).tolist()
        out = {**self.encoder.image_inputs(images), **self.encoder.tokens(captions)}
        if extra_images or extra_captions:
            out[N_PAIRS] = torch.tensor(len(rows))
        if self.image_ids is not None:
            paths = self.frame["image_path"].iloc[rows].astype(str)
            out[IMAGE_IDS] = torch.tensor([int(self.image_ids[p]) for p in paths], dtype=torch.long)
        return {f"{prefix}{k}": v for k, v in out.items()}

    def __call__(self, rows: Sequence[int]) -> dict[str, torch.Tensor]:
        rows = [int(r) for r in rows]
        batch = self.encode(rows)
        if self.partners is not None:
            partner_rows = [self.partners[r] for r in rows if r in self.partners]
            if len(partner_rows) > 1:
                batch.update(self.encode(partner_rows, prefix="partner_"))
        return batch
