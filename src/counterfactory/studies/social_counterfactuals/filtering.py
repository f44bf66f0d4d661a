"""The three-stage filter of SocialCounterfactuals (Howard et al., CVPR 2024; §3.4, §8.3, Tables 10-11).

Inputs
------
* the candidate-image table of the generation step (one row per image): ``set_id, candidate_index,
  member_index, caption, image_path`` (+ ``segment`` and the attribute columns ``a1_type, a1, a2_type, a2
  [, a3_type, a3 ...]``, or a caption-set table that supplies them); ``image_path`` is relative to the
  table's folder or absolute. A *candidate set* is ``(set_id, candidate_index)``: every member's image of
  one over-generation (§3.3: 100 candidates per caption set).
* Every stage writes the surviving image rows (same columns; ``image_path`` made relative to the output's
  folder) and a per-set table (``set_id, candidate_index, n_images, <scores>, passed, reason``) covering
  every candidate set that entered the stage.

Stages, in the paper's order (Table 11: CLIP similarity, then NSFW, then attribute detectability)
----------------------------------------------------------------------------------------------------
(a) **CLIP image-text similarity** (§3.4): a candidate set passes when the cosine of every member's
    image and caption embeddings is **at least** 0.2 ("a minimum cosine similarity of 0.2") and the cosine
    of every pair of images in the set is **greater than** 0.2 (strict: "greater than 0.2"). Cosines of
    L2-normalised embeddings of the ``clip_filter`` role (the paper says "CLIP [41]" without a size).
(b) **NSFW** (§3.4, §8.3): the ``nsfw`` role (paper: Falconsai/nsfw_image_detection, a ViT) classifies
    every image; a set with any flagged image is dropped. An image is flagged when the ``nsfw`` class has
    the highest probability (the model card's pipeline: argmax; a tie is *not* flagged) or, with
    ``filter.nsfw.threshold`` set, when P(nsfw) >= threshold.
(c) **CLIP attribute detectability** (§3.4, §8.3, Table 10): for each attribute type X of the set's
    segment, the prompts "a/an x person" for every value x of X are scored against each image; the image's
    targeted value is *discernible* when its prompt is the most similar one, **strictly** (a tie with
    another value's prompt is not discernible: CLIP cannot tell the two apart). The set is filtered out
    with respect to X when fewer than ``threshold[segment][X]`` of its images are discernible (§8.3: "if
    the number of its images that have their targeted attribute X discernible ... is less than the
    respective threshold"), and filtered out when it is filtered out for *any* of its types. Thresholds
    are image **counts** and depend on the segment (Table 10: (Race, Gender) gender 12, race 9;
    (Physical, Gender) gender 10, physical 5; (Physical, Race) race 13, physical 8).

**How many candidates survive per caption set.** The paper keeps *every* candidate set that passes the
three stages; there is no "best candidate" selection: Table 11 counts 21,359 sets after the CLIP filter
and 13,824 in the final dataset from 3,120 caption sets (e.g. 7,936 race-gender sets from 1,040 caption
sets, Table 1), so several candidates of one caption set remain. We do the same.

**Calibration** (§3.4, §8.3, two phases): phase 1, people label a random sample of 100 candidate sets
per segment, per attribute type: does the set keep (1) or get filtered out (0) for lack of detectability
of that type. Phase 2 learns, per (segment, type), the count threshold that agrees best with those labels
(:func:`calibrate`). Label file (CSV, one row per labelled set and type)::

    set_id,candidate_index,attribute_type,label
    race_gender-p0-doctor-0123456789,17,gender,1
    race_gender-p0-doctor-0123456789,17,race,0

``label`` 1 = the type's targeted attributes are discernible enough, keep the set; 0 = filter it out.
Other columns (e.g. the annotator's count of images showing their attribute, §3.4) are ignored. The
positive class of the agreement metrics is "keep".

Config (the study's ``filter`` section; every key optional, defaults, with their paper sections, in the schema)::

    filter:
      batch_size: 32                 # images per forward pass
      chunk_images: 8192             # images embedded at a time (bounded memory at paper scale)
      clip: {role: clip_filter, image_caption_min: 0.2, image_image_min: 0.2}
      nsfw: {role: nsfw, label: nsfw, threshold: null}
      detectability:
        role: clip_filter
        template: "{article} {value} person"
        thresholds: {race_gender: {gender: 12, race: 9}, ...}
        objective: accuracy          # calibration: accuracy | f1

CLI: ``counterfactory social filter-clip | filter-nsfw | filter-detect | calibrate | filter-table``.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ...config import fill_section
from ...errors import ConfigError, InputError, input_error
from ...filters.sets import ClipThresholds, _as_bool, _factorize, _group_sum, clip_stage, nsfw_stage
from . import STUDY

log = logging.getLogger(__name__)

#: dotted name of the config section this module reads
SECTION = f"{STUDY}.filter"
#: a candidate set (§3.3: one over-generation of a caption set)
SET_KEYS = ("set_id", "candidate_index")
CANDIDATE_COLUMNS = ("set_id", "candidate_index", "member_index", "caption", "image_path")
LABEL_COLUMNS = ("set_id", "candidate_index", "attribute_type", "label")
_SLOT = re.compile(r"^a(\d+)_type$")


# ------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class FilterSettings:
    """The study's ``filter`` section, checked (see the module docstring for the keys; defaults in the schema)."""

    batch_size: int
    chunk_images: int
    clip_role: str
    clip: ClipThresholds
    nsfw_role: str
    nsfw_label: str
    nsfw_threshold: float | None
    detect_role: str
    template: str
    thresholds: dict
    objective: str


def _cfg_fail(key: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{SECTION}.{key}: {problem}. Fix: {fix}")


def check_thresholds(thresholds: Any, key: str = "detectability.thresholds") -> dict[str, dict[str, int]]:
    """``{segment: {attribute type: count}}`` with non-negative integer counts (Table 10)."""
    if not isinstance(thresholds, Mapping):
        raise _cfg_fail(key, f"must map segment -> {{attribute type: count}}, got {thresholds!r}",
                        "write e.g. thresholds: {race_gender: {gender: 12, race: 9}} (Table 10)")
    out: dict[str, dict[str, int]] = {}
    for segment, per_type in thresholds.items():
        if not isinstance(per_type, Mapping) or not per_type:
            raise _cfg_fail(f"{key}.{segment}", f"must map attribute type -> count, got {per_type!r}",
                            "write e.g. {gender: 12, race: 9} (Table 10)")
        out[str(segment)] = {}
        for typ, count in per_type.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise _cfg_fail(f"{key}.{segment}.{typ}", f"must be a count of images (integer >= 0), got {count!r}",
                                "thresholds are numbers of discernible images per set (Table 10), e.g. 9")
            out[str(segment)][str(typ)] = count
    return out


def settings(cfg: Mapping) -> FilterSettings:
    """:class:`FilterSettings` from a study view (``cfg["filter"]`` validated, absent keys from the schema's
    defaults; the template's placeholders are checked here)."""
    sec = fill_section(SECTION, cfg.get("filter"))
    clip, nsfw, det = sec["clip"], sec["nsfw"], sec["detectability"]
    template = det["template"]
    try:
        template.format(article="a", value="x")
    except (KeyError, IndexError, ValueError) as exc:
        raise _cfg_fail("detectability.template", f"only {{article}} and {{value}} may be used ({exc})",
                        'use "{article} {value} person"') from None
    return FilterSettings(
        batch_size=sec["batch_size"], chunk_images=sec["chunk_images"],
        clip_role=clip["role"],
        clip=ClipThresholds(float(clip["image_caption_min"]), float(clip["image_image_min"])),
        nsfw_role=nsfw["role"], nsfw_label=nsfw["label"],
        nsfw_threshold=None if nsfw["threshold"] is None else float(nsfw["threshold"]),
        detect_role=det["role"], template=template, thresholds=check_thresholds(det["thresholds"]),
        objective=det["objective"],
    )


class NsfwClassifier:
    """The ``nsfw`` role's image classifier: ``probabilities(images) -> (n, k)`` in the order of ``labels``."""

    def __init__(self, model, processor, *, device: Any = "cpu", dtype: Any = None, batch_size: int = 32,
                 progress: bool = False):
        import torch

        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self.model = model.to(self.device, dtype=self.dtype).eval()
        self.processor = processor
        self.batch_size = int(batch_size)
        self.progress = progress
        id2label = {int(k): str(v) for k, v in (model.config.id2label or {}).items()}
        self.labels = [id2label.get(i, str(i)) for i in range(int(model.config.num_labels))]

    @classmethod
    def from_config(cls, cfg: Mapping, role: str = "nsfw", batch_size: int = 32, progress: bool = False):
        from ... import device as device_mod
        from ...models import registry

        dev, dtype = device_mod.from_config(cfg)
        model, processor = registry.load(cfg, role)
        return cls(model, processor, device=dev, dtype=dtype, batch_size=batch_size, progress=progress)

    def probabilities(self, images: Sequence[Any]) -> np.ndarray:
        """(n, k) float64 softmax probabilities; images are paths or PIL images."""
        import torch
        from tqdm.auto import tqdm

        from ...scorers import load_image

        out = []
        starts = range(0, len(images), self.batch_size)
        for s in tqdm(starts, desc="nsfw", unit="batch", leave=False, disable=not self.progress):
            batch = [load_image(im) for im in images[s:s + self.batch_size]]
            pixels = self.processor(images=batch, return_tensors="pt")["pixel_values"]
            with torch.inference_mode():
                logits = self.model(pixel_values=pixels.to(self.device, dtype=self.dtype)).logits
            out.append(torch.softmax(logits.float(), dim=-1).cpu().numpy().astype(np.float64))
        return np.concatenate(out) if out else np.zeros((0, len(self.labels)))


# ------------------------------------------------------------------------- stage (c) detectability


def attribute_prompts(values_by_type: Mapping[str, Sequence[str]], template: str = "{article} {value} person"
                      ) -> tuple[list[str], list[tuple[str, str]]]:
    """The §8.3 text pairings: for every type and value, ``template`` with the value and its article
    ("a female person", "an Asian person"; the article by
    :func:`counterfactory.studies.social_counterfactuals.captions.indefinite_article`). Returns
    ``(prompts, prompt_values)`` with ``prompt_values[j] = (type, value)``."""
    from .captions import indefinite_article

    prompts, pv = [], []
    for typ, values in values_by_type.items():
        for value in values:
            prompts.append(template.format(article=indefinite_article(str(value)), value=value))
            pv.append((str(typ), str(value)))
    return prompts, pv


def detectability_batch(similarity: Any, prompt_values: Sequence[tuple[str, str]], set_index: Any,
                        targets: Mapping[str, Sequence[str]], thresholds: Mapping[str, int]) -> pd.DataFrame:
    """Stage (c) for many candidate sets of one segment (§8.3, Table 10), vectorised.

    ``similarity`` (n_images, n_prompts): image-prompt scores (cosine or CLIP logits: only the order
    matters); ``prompt_values[j] = (type, value)`` of prompt ``j``; ``set_index`` (n_images,): each image's
    set; ``targets[type]`` (n_images,): each image's targeted value of that type. Image ``i``'s value of
    type X is discernible when its prompt scores strictly higher than every other prompt of type X (ties
    are not discernible). A set keeps for X when its count of discernible images is ``>= thresholds[X]``
    and passes when it keeps for every type in ``targets``. Returns one row per set: ``set_index,
    n_images, count_<type>..., passed, reason``.
    """
    sim = np.asarray(similarity, dtype=np.float64)
    codes, uniq = _factorize(set_index)
    if sim.ndim != 2 or sim.shape != (len(codes), len(prompt_values)):
        raise ValueError(f"similarity must be (n_images={len(codes)}, n_prompts={len(prompt_values)}), "
                         f"got shape {sim.shape}")
    n = len(uniq)
    rows = np.arange(len(codes))
    out = {"set_index": uniq, "n_images": np.bincount(codes, minlength=n)}
    passed = np.ones(n, dtype=bool)
    reasons: list[list[str]] = [[] for _ in range(n)]
    for typ, values in targets.items():
        if typ not in thresholds:
            raise ConfigError(f"{SECTION}.detectability.thresholds: no threshold for attribute type {typ!r}. "
                              f"Fix: add `{typ}: <count>` for this segment (Table 10)")
        cols = [j for j, (t, _) in enumerate(prompt_values) if t == typ]
        names = [prompt_values[j][1] for j in cols]
        if not cols:
            raise ValueError(f"no prompt of attribute type {typ!r} among prompt_values")
        if len(set(names)) != len(names):
            raise ValueError(f"attribute type {typ!r} has duplicate prompt values {names}")
        pos = {v: k for k, v in enumerate(names)}
        vals = np.asarray(values, dtype=object)
        if len(vals) != len(codes):
            raise ValueError(f"targets[{typ!r}] has {len(vals)} values for {len(codes)} images")
        unknown = sorted({str(v) for v in vals if v not in pos})
        if unknown:
            raise ValueError(f"targets[{typ!r}]: value(s) {unknown} have no prompt (prompts: {names})")
        idx = np.fromiter((pos[v] for v in vals), dtype=np.intp, count=len(vals))
        sub = sim[:, cols]
        own = sub[rows, idx]
        rival = sub.copy()
        rival[rows, idx] = -np.inf
        discernible = own > rival.max(axis=1)               # NaN scores are never discernible
        count = _group_sum(codes, discernible, n).astype(int)
        out[f"count_{typ}"] = count
        ok = count >= int(thresholds[typ])
        passed &= ok
        for k in np.flatnonzero(~ok):
            reasons[k].append(f"{typ}:{count[k]}<{int(thresholds[typ])}")
    out["passed"] = passed
    out["reason"] = [";".join(r) for r in reasons]
    return pd.DataFrame(out)


def detectability(similarity: Any, prompt_values: Sequence[tuple[str, str]], targets: Sequence[Mapping[str, str]],
                  thresholds: Mapping[str, int]) -> tuple[dict[str, int], bool]:
    """Stage (c) for one candidate set: ``(counts, keep)``.

    ``similarity`` (n_images, n_prompts); ``targets[i]`` = ``{type: value}`` of image ``i`` (every image the
    same types); ``thresholds`` = ``{type: count}`` of the set's segment (Table 10). ``counts[type]`` is the
    number of images whose targeted value's prompt is strictly the most similar among that type's prompts;
    ``keep`` is True when every count reaches its threshold. See :func:`detectability_batch`."""
    targets = list(targets)
    types = list(dict.fromkeys(t for tg in targets for t in tg))
    for i, tg in enumerate(targets):
        if set(tg) != set(types):
            raise ValueError(f"targets[{i}] has types {sorted(tg)}, expected {sorted(types)}")
    frame = detectability_batch(similarity, prompt_values, np.zeros(len(targets), dtype=int),
                                {t: [tg[t] for tg in targets] for t in types}, thresholds)
    row = frame.iloc[0]
    return {t: int(row[f"count_{t}"]) for t in types}, bool(row["passed"])


# ------------------------------------------------------------------------------------ calibration


def agreement(keep: Any, label: Any) -> dict[str, float]:
    """Agreement of automatic keep decisions with human labels (positive class = keep):
    ``n, accuracy, precision, recall, f1, tp, fp, fn, tn`` (NaN where a denominator is 0)."""
    k, y = np.asarray(keep, dtype=bool), np.asarray(label, dtype=bool)
    tp, fp = int(np.sum(k & y)), int(np.sum(k & ~y))
    fn, tn = int(np.sum(~k & y)), int(np.sum(~k & ~y))
    n = len(k)
    prec = tp / (tp + fp) if tp + fp else float("nan")
    rec = tp / (tp + fn) if tp + fn else float("nan")
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan")
    return {"n": n, "accuracy": (tp + tn) / n if n else float("nan"), "precision": prec, "recall": rec, "f1": f1,
            "tp": tp, "fp": fp, "fn": fn, "tn": tn}


def learn_threshold(counts: Any, labels: Any, objective: str = "accuracy") -> int:
    """Phase 2 of §8.3 for one (segment, type): the count threshold ``t`` (keep when ``count >= t``) that
    agrees best with the human ``labels`` (1 = keep). Every ``t`` in ``0 .. max(count) + 1`` is tried;
    ``objective`` is ``accuracy`` or ``f1`` (NaN counts as -1); ties go to the **largest** ``t`` (the
    stricter filter: with separable labels this is the smallest count a human kept)."""
    c = np.asarray(counts, dtype=np.int64)
    y = np.asarray(labels, dtype=bool)
    if len(c) == 0:
        raise ValueError("learn_threshold: no labelled sets")
    best_t, best = 0, -np.inf
    for t in range(0, int(c.max()) + 2):
        score = agreement(c >= t, y)[objective]
        score = -1.0 if np.isnan(score) else score
        if score >= best:
            best_t, best = t, score
    return best_t


def calibrate(labelled: pd.DataFrame, objective: str = "accuracy",
              configured: Mapping[str, Mapping[str, int]] | None = None) -> tuple[dict, pd.DataFrame]:
    """Learn one threshold per (segment, type) and report agreement (§3.4, §8.3).

    ``labelled``: one row per labelled (set, type) with ``set_id, candidate_index, segment,
    attribute_type, count`` (CLIP-discernible images, from stage (c)) and ``label`` (1 keep, 0 filter out)
    — :func:`read_labels` builds it. Returns ``(thresholds, report)``: ``{segment: {type: t}}`` and a table
    with one row per (segment, type), one per segment (``attribute_type`` ``"*"``: the set is kept when
    every labelled type keeps, against "every label is 1") and an overall row (``segment`` ``"*"``), each
    with :func:`agreement` under the learned thresholds and, when ``configured`` thresholds are given,
    ``configured_threshold`` / ``configured_accuracy`` / ``configured_f1``.
    """
    thresholds: dict[str, dict[str, int]] = {}
    rows = []
    frame = labelled.copy()
    frame["keep_learned"] = False
    frame["keep_configured"] = np.nan          # 1.0 / 0.0 where a configured threshold exists
    for (segment, typ), g in frame.groupby(["segment", "attribute_type"], sort=False):
        t = learn_threshold(g["count"], g["label"], objective)
        thresholds.setdefault(str(segment), {})[str(typ)] = t
        frame.loc[g.index, "keep_learned"] = g["count"].to_numpy() >= t
        row = {"segment": segment, "attribute_type": typ, "threshold": t,
               **agreement(g["count"].to_numpy() >= t, g["label"].to_numpy())}
        conf = (configured or {}).get(str(segment), {}).get(str(typ))
        if conf is not None:
            kc = g["count"].to_numpy() >= conf
            frame.loc[g.index, "keep_configured"] = kc.astype(float)
            a = agreement(kc, g["label"].to_numpy())
            row.update(configured_threshold=conf, configured_accuracy=a["accuracy"], configured_f1=a["f1"])
        rows.append(row)
    per_set = frame.groupby(["segment", "set_id", "candidate_index"], sort=False).agg(
        keep_learned=("keep_learned", "all"), label=("label", "all"),
        keep_configured=("keep_configured", lambda s: float(s.min()) if s.notna().all() else np.nan))
    per_set = per_set.reset_index()
    for segment, g in [*per_set.groupby("segment", sort=False), ("*", per_set)]:
        row = {"segment": segment, "attribute_type": "*", "threshold": np.nan,
               **agreement(g["keep_learned"].to_numpy(), g["label"].to_numpy())}
        if g["keep_configured"].notna().all() and configured:
            a = agreement(g["keep_configured"].to_numpy() == 1.0, g["label"].to_numpy())
            row.update(configured_accuracy=a["accuracy"], configured_f1=a["f1"])
        rows.append(row)
    return thresholds, pd.DataFrame(rows)


def read_labels(path: str | os.PathLike, detect_sets: pd.DataFrame) -> pd.DataFrame:
    """The hand labels of phase 1 (§8.3) joined with stage (c)'s counts.

    ``path``: CSV with ``set_id, candidate_index, attribute_type, label`` (label 1 = keep, 0 = filter out;
    one row per labelled set and type). ``detect_sets``: stage (c)'s per-set table (``set_id,
    candidate_index, segment, count_<type>``). Returns ``set_id, candidate_index, segment,
    attribute_type, label, count``. Raises :class:`InputError` naming the file, the row (its line number;
    the header is row 1) and the fix for: missing columns, a label other than 0/1, a non-integer candidate
    index, a set not in the stage (c) table, a type that is not one of that set's segment, a duplicate
    (set, type).
    """
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "label file not found",
                          "write it with `counterfactory social calibrate --write-template FILE` and fill in labels")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as exc:  # pandas raises several types for malformed CSV
        raise input_error(path, None, f"not a readable CSV file ({exc})", "save the labels as CSV") from exc
    missing = [c for c in LABEL_COLUMNS if c not in raw.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {missing}",
                          f"the label file needs the header {','.join(LABEL_COLUMNS)}")
    sets = detect_sets.assign(set_id=detect_sets["set_id"].astype(str),
                              candidate_index=detect_sets["candidate_index"].astype(int))
    sets = sets.set_index(["set_id", "candidate_index"])
    types_of = {}
    for col in (c for c in sets.columns if c.startswith("count_")):
        for key in sets.index[sets[col].notna()]:
            types_of.setdefault(key, set()).add(col[len("count_"):])
    out, seen = [], {}
    for i, r in enumerate(raw.itertuples(index=False), start=2):
        rec = f"row {i}"
        label = str(r.label).strip()
        if label not in ("0", "1"):
            raise input_error(path, rec, f"label {r.label!r} is not 0 or 1",
                              "write 1 when the set keeps (the attribute is discernible enough) or 0 to filter it out")
        try:
            cand = int(str(r.candidate_index).strip())
        except ValueError:
            raise input_error(path, rec, f"candidate_index {r.candidate_index!r} is not an integer",
                              "copy the candidate_index of the set from the stage (c) table") from None
        key = (str(r.set_id).strip(), cand)
        if key not in sets.index:
            raise input_error(path, rec, f"unknown set {key[0]!r} candidate {cand}: not in the stage (c) table",
                              "label only candidate sets that entered the detectability stage (fix the set_id/"
                              "candidate_index, or pass the matching --sets table)")
        typ = str(r.attribute_type).strip()
        if typ not in types_of.get(key, set()):
            raise input_error(path, rec, f"attribute_type {typ!r} is not a type of this set's segment "
                              f"{sets.loc[key, 'segment']!r}",
                              f"use one of {sorted(types_of.get(key, set()))}")
        if (key, typ) in seen:
            raise input_error(path, rec, f"duplicate label for set {key[0]!r} candidate {cand} type {typ!r} "
                              f"(first at row {seen[(key, typ)]})", "keep one row per set and attribute type")
        seen[(key, typ)] = i
        out.append({"set_id": key[0], "candidate_index": cand, "segment": sets.loc[key, "segment"],
                    "attribute_type": typ, "label": int(label), "count": int(sets.loc[key, f"count_{typ}"])})
    if not out:
        raise input_error(path, None, "no labelled rows", "label at least one set per segment and type")
    return pd.DataFrame(out)


def label_template(detect_sets: pd.DataFrame, sample_size: int = 100, seed: int = 0) -> pd.DataFrame:
    """Phase 1 of §8.3: a random sample of ``sample_size`` candidate sets per segment (all when fewer),
    one row per sampled set and attribute type, with an empty ``label`` column to fill in; the image
    paths are not included (look them up by ``set_id``/``candidate_index``)."""
    rows = []
    rng = np.random.default_rng(seed)
    for segment, g in detect_sets.groupby("segment", sort=False):
        pick = g.iloc[np.sort(rng.choice(len(g), size=min(sample_size, len(g)), replace=False))]
        types = [c[len("count_"):] for c in g.columns if c.startswith("count_") and g[c].notna().all()]
        for r in pick.itertuples(index=False):
            for typ in types:
                rows.append({"set_id": r.set_id, "candidate_index": int(r.candidate_index), "segment": segment,
                             "attribute_type": typ, "label": ""})
    return pd.DataFrame(rows, columns=["set_id", "candidate_index", "segment", "attribute_type", "label"])


# ------------------------------------------------------------------------------------ Table 11


def _segment_map(frames: Sequence[pd.DataFrame | None]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in frames:
        if f is not None and "segment" in f.columns:
            out.update(dict(zip(f["set_id"].astype(str), f["segment"].astype(str))))
    return out


def stage_counts(candidates: pd.DataFrame, clip_sets: pd.DataFrame, nsfw_sets: pd.DataFrame,
                 detect_sets: pd.DataFrame, captions: pd.DataFrame | None = None) -> pd.DataFrame:
    """Table 11: candidate sets remaining after each stage, per segment, plus a total row.

    ``candidates``: every generated image (one row each); ``*_sets``: the per-set tables of the three stages
    (a ``passed`` column); the segment of a set comes from any table with ``segment`` (``captions`` or the
    candidates). ``% Filtered Out`` is relative to the sets entering that stage, in percent (1 decimal).
    """
    seg = _segment_map([captions, candidates, detect_sets])
    cand = candidates.assign(set_id=candidates["set_id"].astype(str))
    cand["segment"] = cand["set_id"].map(seg)
    if cand["segment"].isna().any():
        missing = cand.loc[cand["segment"].isna(), "set_id"].iloc[0]
        raise InputError(f"set {missing!r} has no segment. Fix: pass the caption-set table (--captions)")
    order = list(dict.fromkeys(cand["segment"]))

    def passed_by_segment(frame: pd.DataFrame, weight: str | None = None) -> pd.Series:
        f = frame[_as_bool(frame["passed"])]
        s = f["set_id"].astype(str).map(seg)
        return (f[weight].groupby(s).sum() if weight else s.value_counts()).reindex(order, fill_value=0)

    sets = cand.groupby("segment")[list(SET_KEYS)].apply(lambda g: len(g.drop_duplicates())).reindex(order)
    images = cand.groupby("segment").size().reindex(order)
    per_set = cand.groupby(["segment", *SET_KEYS]).size().groupby(level="segment").agg(
        lambda s: "/".join(str(v) for v in sorted(s.unique()))).reindex(order)
    a, b, c = passed_by_segment(clip_sets), passed_by_segment(nsfw_sets), passed_by_segment(detect_sets)
    final_images = passed_by_segment(detect_sets, "n_images")

    def pct(after, before):
        return np.round(100.0 * (1 - np.asarray(after, float) / np.asarray(before, float)), 1)

    with np.errstate(invalid="ignore", divide="ignore"):
        table = pd.DataFrame({
            "Attribute Types": order, "No. Sets": sets.to_numpy(), "Images Per Set": per_set.to_numpy(),
            "No. Images": images.to_numpy(), "Sets After CLIP Sim. Filter": a.to_numpy(),
            "% Filtered Out (CLIP Sim.)": pct(a, sets), "Sets After NSFW Filter": b.to_numpy(),
            "% Filtered Out (NSFW)": pct(b, a), "Sets After CLIP Attrib. Filter": c.to_numpy(),
            "% Filtered Out (CLIP Attrib.)": pct(c, b), "Final No. Images": final_images.to_numpy().astype(int),
        })
        total = {"Attribute Types": "Total", "Images Per Set": ""}
        for col in ("No. Sets", "No. Images", "Sets After CLIP Sim. Filter", "Sets After NSFW Filter",
                    "Sets After CLIP Attrib. Filter", "Final No. Images"):
            total[col] = int(table[col].sum())
        total["% Filtered Out (CLIP Sim.)"] = pct(total["Sets After CLIP Sim. Filter"], total["No. Sets"])
        total["% Filtered Out (NSFW)"] = pct(total["Sets After NSFW Filter"], total["Sets After CLIP Sim. Filter"])
        total["% Filtered Out (CLIP Attrib.)"] = pct(total["Sets After CLIP Attrib. Filter"],
                                                     total["Sets After NSFW Filter"])
    return pd.concat([table, pd.DataFrame([total])], ignore_index=True)


def stage_counts_markdown(table: pd.DataFrame) -> str:
    """Markdown rendering of :func:`stage_counts` (:func:`counterfactory.render.describe_frame`), percentages
    with a % sign."""
    from ...render import describe_frame, markdown_body

    shown = table.copy()
    for col in (c for c in shown.columns if c.startswith("% Filtered")):
        shown[col] = [("" if pd.isna(v) else f"{float(v):.1f}%") for v in shown[col]]
    return markdown_body(describe_frame(shown)) + "\n"


# ------------------------------------------------------------------------------------ table I/O


def read_table(path: str | os.PathLike, what: str, columns: Sequence[str] = ()) -> pd.DataFrame:
    """A parquet or CSV table with the required ``columns`` (clear :class:`InputError` otherwise)."""
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, f"{what} not found", "check the path and that the step producing it has run")
    try:
        if path.suffix.lower() == ".csv":
            frame = pd.read_csv(path, dtype={"set_id": str})
        else:
            frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow / pandas raise several types
        raise input_error(path, None, f"not a readable {path.suffix.lstrip('.')} file ({exc})",
                          f"regenerate the {what}") from exc
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {missing}", f"the {what} needs columns {list(columns)}")
    return frame


def read_images(path: str | os.PathLike) -> pd.DataFrame:
    """A candidate-image table with ``image_path`` resolved (relative paths are relative to its folder),
    ``set_id`` as text, indexes as integers, rows sorted by set and member."""
    path = Path(path)
    frame = read_table(path, "candidate-image table", CANDIDATE_COLUMNS)
    frame = frame.assign(set_id=frame["set_id"].astype(str))
    for col in ("candidate_index", "member_index"):
        try:
            frame[col] = frame[col].astype(np.int64)
        except (TypeError, ValueError):
            raise input_error(path, None, f"column {col} holds non-integers", "regenerate the table") from None
    dup = frame.duplicated([*SET_KEYS, "member_index"])
    if dup.any():
        r = frame[dup].iloc[0]
        raise input_error(path, f"set {r.set_id} candidate {r.candidate_index} member {r.member_index}",
                          "duplicate image row", "keep one row per (set_id, candidate_index, member_index)")
    base = path.resolve().parent
    frame["image_path"] = [p if os.path.isabs(p) else str(base / p) for p in frame["image_path"].astype(str)]
    return frame.sort_values([*SET_KEYS, "member_index"], kind="stable").reset_index(drop=True)


def _write_table(path: str | os.PathLike, frame: pd.DataFrame) -> Path:
    from ...io import write_csv, write_parquet

    return write_csv(path, frame) if str(path).lower().endswith(".csv") else write_parquet(path, frame)


def write_images(path: str | os.PathLike, frame: pd.DataFrame) -> Path:
    """Write surviving image rows with ``image_path`` relative to the output's folder."""
    base = Path(path).resolve().parent
    rel = [os.path.relpath(p, base) for p in frame["image_path"]]
    return _write_table(path, frame.assign(image_path=rel))


def _with_keys(stage: pd.DataFrame, keys: pd.DataFrame) -> pd.DataFrame:
    """Replace ``set_index`` (a code) by the set's ``set_id, candidate_index`` (and segment when known)."""
    k = keys.iloc[stage["set_index"].to_numpy()].reset_index(drop=True)
    return pd.concat([k, stage.drop(columns="set_index").reset_index(drop=True)], axis=1)


def _prepare(images: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by candidate set and member (each set contiguous), a fresh 0..n-1 index, text set ids."""
    frame = images.assign(set_id=images["set_id"].astype(str))
    return frame.sort_values([*SET_KEYS, "member_index"], kind="stable").reset_index(drop=True)


def _codes(frame: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    codes = frame.groupby(list(SET_KEYS), sort=False).ngroup().to_numpy()
    cols = [*SET_KEYS, *(["segment"] if "segment" in frame.columns else [])]
    keys = frame.loc[~pd.Series(codes).duplicated().to_numpy(), cols].reset_index(drop=True)
    return codes, keys


def _chunks(codes: np.ndarray, max_images: int) -> list[tuple[int, int]]:
    """Row ranges of ``codes`` (sorted, contiguous sets) of at most ``max_images`` rows, cut at set
    boundaries (a single larger set is one chunk)."""
    if len(codes) == 0:
        return []
    bounds = np.flatnonzero(np.diff(codes)) + 1
    starts = np.concatenate([[0], bounds, [len(codes)]])
    out, lo = [], 0
    for a, b in zip(starts[:-1], starts[1:]):
        if b - lo > max_images and a > lo:
            out.append((lo, int(a)))
            lo = int(a)
    out.append((lo, len(codes)))
    return out


def _dual_scorer(cfg: Mapping, role: str, batch_size: int, progress: bool):
    from ...scorers import scorer_from_config

    scorer = scorer_from_config(cfg, role, head="itc", progress=progress, batch_size=batch_size)
    if not getattr(scorer, "dual", False):
        raise ConfigError(f"{SECTION}: role {role!r} is not a dual encoder (CLIP-like). Fix: point "
                          f"models.{role} at a CLIP checkpoint (the paper's filters use CLIP, §3.4)")
    return scorer


def _split(frame: pd.DataFrame, sets: pd.DataFrame) -> pd.DataFrame:
    keep = sets.loc[sets["passed"], list(SET_KEYS)]
    return frame.merge(keep, on=list(SET_KEYS), how="inner", sort=False)


# ------------------------------------------------------------------------------------ stage runners


def run_clip(cfg: Mapping, images: pd.DataFrame, scorer: Any = None,
             progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stage (a) on a candidate-image table (:func:`read_images`): ``(per-set table, surviving images)``.

    ``scorer``: a dual encoder (``encode_images``, ``encode_texts``, L2-normalised); default the
    ``filter.clip.role`` model through :func:`counterfactory.scorers.scorer_from_config` (head ``itc``).
    Captions are embedded once each; images in chunks of ``filter.chunk_images`` whole sets."""
    st = settings(cfg)
    images = _prepare(images)
    scorer = scorer or _dual_scorer(cfg, st.clip_role, st.batch_size, progress)
    codes, keys = _codes(images)
    uniq, inverse = np.unique(images["caption"].astype(str).to_numpy(), return_inverse=True)
    text_emb = np.asarray(scorer.encode_texts(list(uniq))) if len(uniq) else None   # one row per distinct caption
    parts = []
    paths = images["image_path"].tolist()
    for lo, hi in _chunks(codes, st.chunk_images):
        emb = np.asarray(scorer.encode_images(paths[lo:hi]))
        parts.append(clip_stage(emb, text_emb[inverse[lo:hi]], codes[lo:hi], st.clip))
        log.info("clip filter: %d/%d images scored", hi, len(codes))
    sets = _with_keys(pd.concat(parts, ignore_index=True), keys) if parts else _empty_sets(keys)
    return sets, _split(images, sets)


def run_nsfw(cfg: Mapping, images: pd.DataFrame, classifier: Any = None,
             progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stage (b): ``(per-set table, surviving images)``; ``classifier`` has ``labels`` and
    ``probabilities(paths)`` (default: :class:`NsfwClassifier` of the ``filter.nsfw.role`` model)."""
    st = settings(cfg)
    classifier = classifier or NsfwClassifier.from_config(cfg, st.nsfw_role, st.batch_size, progress)
    labels = list(classifier.labels)
    if [x.lower() for x in labels].count(st.nsfw_label.lower()) != 1:
        raise ConfigError(f"{SECTION}.nsfw.label: {st.nsfw_label!r} is not one of the classifier's labels "
                          f"{labels}. Fix: set it to the classifier's NSFW class name")
    images = _prepare(images)
    codes, keys = _codes(images)
    parts, paths = [], images["image_path"].tolist()
    for lo, hi in _chunks(codes, st.chunk_images):
        probs = classifier.probabilities(paths[lo:hi])
        parts.append(nsfw_stage(probs, labels, codes[lo:hi], label=st.nsfw_label, threshold=st.nsfw_threshold))
    sets = _with_keys(pd.concat(parts, ignore_index=True), keys) if parts else _empty_sets(keys)
    return sets, _split(images, sets)


def _empty_sets(keys: pd.DataFrame) -> pd.DataFrame:
    return keys.assign(n_images=pd.Series(dtype=int), passed=pd.Series(dtype=bool), reason=pd.Series(dtype=object))


def _slot_columns(frame: pd.DataFrame) -> list[tuple[str, str]]:
    slots = sorted((int(m.group(1)), c) for c in frame.columns if (m := _SLOT.match(c)))
    return [(c, f"a{k}") for k, c in slots if f"a{k}" in frame.columns]


def _blank(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) or str(v).strip() == ""


def attach_captions(images: pd.DataFrame, captions: pd.DataFrame | None) -> pd.DataFrame:
    """``images`` with ``segment`` and every ``aK_type``/``aK`` column taken from the caption-set table
    (joined on ``set_id, member_index``) when given; without it the image table must carry them."""
    if captions is None:
        if "segment" not in images.columns or not _slot_columns(images):
            raise InputError("the candidate-image table has no segment / attribute columns. Fix: pass the "
                             "caption-set table (--captions)")
        return images
    cap = captions.assign(set_id=captions["set_id"].astype(str), member_index=captions["member_index"].astype(int))
    cols = ["segment", *[c for pair in _slot_columns(cap) for c in pair]]
    merged = images.drop(columns=[c for c in cols if c in images.columns]).merge(
        cap[["set_id", "member_index", *cols]], on=["set_id", "member_index"], how="left", sort=False)
    if merged["segment"].isna().any():
        r = merged[merged["segment"].isna()].iloc[0]
        raise InputError(f"image of set {r.set_id!r} member {r.member_index} has no row in the caption-set "
                         f"table. Fix: pass the caption-set table the images were generated from")
    return merged


def attribute_values(frame: pd.DataFrame) -> dict[str, list[str]]:
    """Every value of every attribute type in a table with ``aK_type``/``aK`` columns (first-seen order):
    the §8.3 "names of all the attributes of the targeted attribute type"."""
    out: dict[str, list[str]] = {}
    for tcol, vcol in _slot_columns(frame):
        for t, v in zip(frame[tcol], frame[vcol]):
            if not _blank(t):
                vals = out.setdefault(str(t), [])
                if str(v) not in vals:
                    vals.append(str(v))
    return out


def run_detect(cfg: Mapping, images: pd.DataFrame, captions: pd.DataFrame | None = None, scorer: Any = None,
               progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stage (c): ``(per-set table, surviving images)``. The per-set table has ``set_id, candidate_index,
    segment, n_images, count_<type>`` (NA for types not in the set's segment), ``passed, reason``.

    Prompts are built for every value of every type in the caption-set table (or the image table);
    the scorer is the ``filter.detectability.role`` dual encoder; thresholds come from
    ``filter.detectability.thresholds[segment]`` (a missing segment or type is a :class:`ConfigError`)."""
    st = settings(cfg)
    frame = _prepare(attach_captions(images, captions))
    values = attribute_values(captions if captions is not None else frame)
    prompts, pv = attribute_prompts(values, st.template)
    for segment in dict.fromkeys(frame["segment"].astype(str)):
        if segment not in st.thresholds:
            raise ConfigError(f"{SECTION}.detectability.thresholds: no thresholds for segment {segment!r}. Fix: add "
                              f"`{segment}: {{<type>: <count>, ...}}` (Table 10; `counterfactory social calibrate` "
                              f"learns them from labels)")
        rows = frame[frame["segment"].astype(str) == segment]
        types = {str(t) for tcol, _ in _slot_columns(frame) for t in rows[tcol] if not _blank(t)}
        unknown = sorted(set(st.thresholds[segment]) - types)
        if unknown:
            raise ConfigError(f"{SECTION}.detectability.thresholds.{segment}: threshold for attribute type "
                              f"{unknown[0]!r}, which segment {segment!r} does not have (its types: "
                              f"{', '.join(sorted(types))}). Fix: remove it or correct the type name")
    scorer = scorer or _dual_scorer(cfg, st.detect_role, st.batch_size, progress)
    text_emb = np.asarray(scorer.encode_texts(prompts), dtype=np.float64) if len(frame) else None
    codes, keys = _codes(frame)
    slots = _slot_columns(frame)
    parts, paths = [], frame["image_path"].tolist()
    for lo, hi in _chunks(codes, st.chunk_images):
        sim = np.asarray(scorer.encode_images(paths[lo:hi]), dtype=np.float64) @ text_emb.T
        chunk = frame.iloc[lo:hi]
        for segment, g in chunk.groupby("segment", sort=False):
            pos = g.index.to_numpy() - lo
            targets: dict[str, list] = {}
            for tcol, vcol in slots:
                for typ in dict.fromkeys(t for t in g[tcol] if not _blank(t)):
                    targets.setdefault(str(typ), [None] * len(g))
            for typ in targets:
                picked = np.full(len(g), None, dtype=object)
                for tcol, vcol in slots:
                    hit = (g[tcol].astype(str) == typ).to_numpy()
                    picked[hit] = g[vcol].astype(str).to_numpy()[hit]
                if any(v is None for v in picked):
                    raise InputError(f"segment {segment!r}: some images lack a value of type {typ!r}. Fix: "
                                     "every member of a set must carry every attribute type of its segment")
                targets[typ] = list(picked)
            parts.append(detectability_batch(sim[pos], pv, codes[lo:hi][pos], targets,
                                             st.thresholds[str(segment)]))
    if not parts:
        return _empty_sets(keys), frame.iloc[:0]
    stage = pd.concat(parts, ignore_index=True)
    counts = [c for c in stage.columns if c.startswith("count_")]
    stage[counts] = stage[counts].astype("Int64")
    stage = stage.sort_values("set_index", kind="stable").reset_index(drop=True)
    sets = _with_keys(stage, keys)
    return sets, _split(frame, sets)[list(images.columns)]


# ------------------------------------------------------------------------------------ file-level steps


def filter_clip_files(cfg: Mapping, images_path, out_images, out_sets, scorer=None, progress=False) -> dict:
    """Stage (a) from and to files; returns a summary (sets in / passed)."""
    sets, kept = run_clip(cfg, read_images(images_path), scorer=scorer, progress=progress)
    _write_table(out_sets, sets)
    write_images(out_images, kept)
    return {"stage": "clip", "sets": len(sets), "passed": int(sets["passed"].sum()), "images": len(kept)}


def filter_nsfw_files(cfg: Mapping, images_path, out_images, out_sets, classifier=None, progress=False) -> dict:
    """Stage (b) from and to files."""
    sets, kept = run_nsfw(cfg, read_images(images_path), classifier=classifier, progress=progress)
    _write_table(out_sets, sets)
    write_images(out_images, kept)
    return {"stage": "nsfw", "sets": len(sets), "passed": int(sets["passed"].sum()), "images": len(kept)}


def filter_detect_files(cfg: Mapping, images_path, out_images, out_sets, captions_path=None, scorer=None,
                        progress=False) -> dict:
    """Stage (c) from and to files."""
    captions = read_table(captions_path, "caption-set table", ("set_id", "segment", "member_index")) \
        if captions_path else None
    sets, kept = run_detect(cfg, read_images(images_path), captions, scorer=scorer, progress=progress)
    _write_table(out_sets, sets)
    write_images(out_images, kept)
    return {"stage": "detectability", "sets": len(sets), "passed": int(sets["passed"].sum()), "images": len(kept)}


#: per stage: (surviving images, per-set table) as the filter rules name them in a shard folder and after the merge
STAGE_FILES = {"clip": ("clip.parquet", "clip_sets.parquet"), "nsfw": ("nsfw.parquet", "nsfw_sets.parquet"),
               "detectability": ("kept.parquet", "detect_sets.parquet")}


def merge_filter_shards(shard_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> pd.DataFrame:
    """Concatenate the three stages' outputs of every generation shard (the filters run per shard: a paper-scale
    run filters 5.4 M images) into ``out_dir`` under the same names; image paths stay valid (relative to the
    merged tables). Returns the per-stage counts. A set appearing in two shards is an error."""
    out_dir = Path(out_dir)
    rows = []
    for stage, (images_name, sets_name) in STAGE_FILES.items():
        images = [read_images(Path(d) / images_name) for d in shard_dirs]
        sets = [read_table(Path(d) / sets_name, f"{stage} set table", SET_KEYS) for d in shard_dirs]
        frame = pd.concat(images, ignore_index=True) if images else pd.DataFrame(columns=CANDIDATE_COLUMNS)
        table = pd.concat(sets, ignore_index=True) if sets else pd.DataFrame(columns=list(SET_KEYS))
        dup = table.duplicated(list(SET_KEYS))
        if dup.any():
            first = table[dup].iloc[0]
            raise input_error(Path(shard_dirs[0]).parent, f"set {first['set_id']} candidate {first['candidate_index']}",
                              "the candidate set is in two shards", "rerun the filter jobs of one generation run")
        write_images(out_dir / images_name, frame.sort_values([*SET_KEYS, "member_index"], kind="stable"))
        _write_table(out_dir / sets_name, table.sort_values(list(SET_KEYS), kind="stable"))
        rows.append({"stage": stage, "sets": len(table), "passed": int(table["passed"].astype(bool).sum()),
                     "images": len(frame)})
    return pd.DataFrame(rows)


def calibrate_files(cfg: Mapping, sets_path, labels_path, out_json, out_report=None) -> dict:
    """Phase 2 of §8.3 from files: learned thresholds (JSON, ready for ``filter.detectability.thresholds``)
    and the agreement report (CSV)."""
    from ...io import write_json

    st = settings(cfg)
    detect_sets = read_table(sets_path, "detectability set table", (*SET_KEYS, "segment"))
    labelled = read_labels(labels_path, detect_sets)
    thresholds, report = calibrate(labelled, st.objective, st.thresholds or None)
    overall = report[(report["segment"] == "*")].iloc[0]
    summary = {"thresholds": thresholds, "objective": st.objective, "labelled_rows": len(labelled),
               "overall": {k: (None if pd.isna(overall[k]) else float(overall[k]))
                           for k in ("n", "accuracy", "precision", "recall", "f1")},
               "per_type": report.to_dict(orient="records")}
    write_json(out_json, summary)
    if out_report:
        _write_table(out_report, report)
    return summary


def filter_table_files(candidates_path, clip_sets, nsfw_sets, detect_sets, out_csv, out_markdown=None,
                       captions_path=None) -> pd.DataFrame:
    """Table 11 from the stage outputs (CSV and, optionally, Markdown)."""
    from ...io import write_text

    captions = read_table(captions_path, "caption-set table", ("set_id", "segment")) if captions_path else None
    table = stage_counts(read_table(candidates_path, "candidate-image table", SET_KEYS),
                         read_table(clip_sets, "CLIP set table", (*SET_KEYS, "passed")),
                         read_table(nsfw_sets, "NSFW set table", (*SET_KEYS, "passed")),
                         read_table(detect_sets, "detectability set table", (*SET_KEYS, "passed", "n_images")),
                         captions)
    _write_table(out_csv, table)
    if out_markdown:
        write_text(out_markdown, stage_counts_markdown(table))
    return table
