"""Attribute detectability of counterfactual *sets* and its calibration (SocialCounterfactuals §3.4, §8.3,
Table 10): the kernels.

* **Detectability** (:func:`attribute_prompts`, :func:`detectability_batch`, :func:`detectability`): for
  each attribute type X, the prompts "a/an x person" for every value x of X are scored against each image;
  the image's targeted value is *discernible* when its prompt is strictly the most similar one. A set keeps
  for X when at least ``thresholds[X]`` of its images are discernible, and passes when it keeps for every
  type.
* **Calibration** (:func:`agreement`, :func:`learn_threshold`, :func:`calibrate`, :func:`label_template`):
  phase 1 samples candidate sets for people to label; phase 2 learns, per (segment, type), the count
  threshold that agrees best with those labels.

Pure array code (numpy, pandas) next to :mod:`.sets` (the CLIP and NSFW kernels); the study's filter step
(:mod:`counterfactory.studies.social_counterfactuals.filtering`, which reads the config, the files and the
models) passes what is study-specific: the article function, the config-section name of its messages.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .sets import _factorize, _group_sum

# ------------------------------------------------------------------------------------------ detectability


def attribute_prompts(values_by_type: Mapping[str, Sequence[str]], template: str = "{article} {value} person", *,
                      article: Callable[[str], str]) -> tuple[list[str], list[tuple[str, str]]]:
    """The §8.3 text pairings: for every type and value, ``template`` with the value and its article
    ("a female person", "an Asian person"; ``article(value)`` gives the article, e.g. the study's
    :func:`counterfactory.studies.social_counterfactuals.captions.indefinite_article`). Returns
    ``(prompts, prompt_values)`` with ``prompt_values[j] = (type, value)``."""
    prompts, pv = [], []
    for typ, values in values_by_type.items():
        for value in values:
            prompts.append(template.format(article=article(str(value)), value=value))
            pv.append((str(typ), str(value)))
    return prompts, pv


def detectability_batch(similarity: Any, prompt_values: Sequence[tuple[str, str]], set_index: Any,
                        targets: Mapping[str, Sequence[str]], thresholds: Mapping[str, int], *,
                        section: str = "filter") -> pd.DataFrame:
    """Stage (c) for many candidate sets of one segment (§8.3, Table 10), vectorised.

    ``similarity`` (n_images, n_prompts): image-prompt scores (cosine or CLIP logits: only the order
    matters); ``prompt_values[j] = (type, value)`` of prompt ``j``; ``set_index`` (n_images,): each image's
    set; ``targets[type]`` (n_images,): each image's targeted value of that type. Image ``i``'s value of
    type X is discernible when its prompt scores strictly higher than every other prompt of type X (ties
    are not discernible). A set keeps for X when its count of discernible images is ``>= thresholds[X]``
    and passes when it keeps for every type in ``targets``. Returns one row per set: ``set_index,
    n_images, count_<type>..., passed, reason``. ``section``: the dotted config section named in the
    :class:`ConfigError` for a type without a threshold (``<section>.detectability.thresholds``).
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
            raise ConfigError(f"{section}.detectability.thresholds: no threshold for attribute type {typ!r}. "
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
                  thresholds: Mapping[str, int], *, section: str = "filter") -> tuple[dict[str, int], bool]:
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
                                {t: [tg[t] for tg in targets] for t in types}, thresholds, section=section)
    row = frame.iloc[0]
    return {t: int(row[f"count_{t}"]) for t in types}, bool(row["passed"])



# ------------------------------------------------------------------------------------------- calibration


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

