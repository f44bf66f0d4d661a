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

Modules: this one holds the settings, the stage runners and the calibration's file steps; the kernels are
shared (:mod:`counterfactory.filters.sets`: CLIP, NSFW; :mod:`counterfactory.filters.detectability`:
detectability, calibration), the NSFW model wrapper is :class:`counterfactory.scorers.NsfwClassifier`, the
table files (and the hand labels) are read and written by :mod:`.filter_io` and Table 11 is
:mod:`.filter_table`. Every public name of those is importable from here too.
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

from ... import scorers
from ...config import fill_section
from ...device import with_stage_precision
from ...errors import ConfigError, InputError, input_error
from ...filters import detectability as _det
from ...filters.detectability import agreement as agreement
from ...filters.detectability import calibrate as calibrate
from ...filters.detectability import label_template as label_template
from ...filters.detectability import learn_threshold as learn_threshold
from ...filters.sets import ClipThresholds, clip_stage, nsfw_stage
from ...io import write_json
from ...scorers import NsfwClassifier as NsfwClassifier
from . import STUDY
from .captions import indefinite_article
from .filter_io import CANDIDATE_COLUMNS as CANDIDATE_COLUMNS
from .filter_io import SET_KEYS as SET_KEYS
from .filter_io import LABEL_COLUMNS as LABEL_COLUMNS
from .filter_io import _write_table, read_images, read_labels, read_table, write_images
from .filter_table import filter_table_files as filter_table_files
from .filter_table import surviving_subjects as surviving_subjects
from .filter_table import stage_counts as stage_counts
from .filter_table import stage_counts_markdown as stage_counts_markdown

log = logging.getLogger(__name__)

#: dotted name of the config section this module reads
SECTION = f"{STUDY}.filter"
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
    #: each stage's precision (``filter.<stage>.precision``; None = the config-wide precision)
    clip_precision: str | None
    nsfw_precision: str | None
    detect_precision: str | None


def stage_config(cfg: Mapping, precision: str | None) -> Mapping:
    """``cfg`` as one filter stage loads its model: the stage's precision replaces the config-wide one."""
    return with_stage_precision(cfg, precision)


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
        clip_precision=clip["precision"], nsfw_precision=nsfw["precision"], detect_precision=det["precision"],
    )


# ------------------------------------------------------------------------- stage (c) detectability
# (the kernels are :mod:`counterfactory.filters.detectability`; these bind the study's article and section)


def attribute_prompts(values_by_type: Mapping[str, Sequence[str]], template: str = "{article} {value} person"
                      ) -> tuple[list[str], list[tuple[str, str]]]:
    """:func:`counterfactory.filters.detectability.attribute_prompts` with the study's article
    (:func:`.captions.indefinite_article`: "a female person", "an Asian person")."""
    return _det.attribute_prompts(values_by_type, template, article=indefinite_article)


def detectability_batch(similarity: Any, prompt_values: Sequence[tuple[str, str]], set_index: Any,
                        targets: Mapping[str, Sequence[str]], thresholds: Mapping[str, int]) -> pd.DataFrame:
    """:func:`counterfactory.filters.detectability.detectability_batch`, errors naming this study's section."""
    return _det.detectability_batch(similarity, prompt_values, set_index, targets, thresholds, section=SECTION)


def detectability(similarity: Any, prompt_values: Sequence[tuple[str, str]], targets: Sequence[Mapping[str, str]],
                  thresholds: Mapping[str, int]) -> tuple[dict[str, int], bool]:
    """:func:`counterfactory.filters.detectability.detectability` (one set), errors naming this study's section."""
    return _det.detectability(similarity, prompt_values, targets, thresholds, section=SECTION)


# ------------------------------------------------------------------------------------ stage helpers


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
    scorer = scorers.scorer_from_config(cfg, role, head="itc", progress=progress, batch_size=batch_size)
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
    scorer = scorer or _dual_scorer(stage_config(cfg, st.clip_precision), st.clip_role, st.batch_size, progress)
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
    classifier = classifier or NsfwClassifier.from_config(stage_config(cfg, st.nsfw_precision), st.nsfw_role,
                                                          st.batch_size, progress)
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
    scorer = scorer or _dual_scorer(stage_config(cfg, st.detect_precision), st.detect_role, st.batch_size, progress)
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
