"""Bias probing with SocialCounterfactuals (Howard et al., CVPR 2024, §4 and §10): MaxSkew@K, NDKL and Bias@K of
attribute-neutral occupation queries, per model, dataset segment and subject.

Protocol (§4.1)
---------------
* **Pool.** For a subject (occupation) and a segment (attribute-type pair, e.g. race-gender), the retrieval pool is
  every image of that subject in that segment that passed the filters, over all prefixes and counterfactual sets.
* **Query.** One neutral prompt per prefix, "⟨prefix⟩ a/an ⟨subject⟩" ("A doctor", "A photo of a doctor", "An image
  of an umpire"); their L2-normalised text embeddings are averaged and the mean re-normalised ("averaging their text
  representations across different prefixes to obtain a single text embedding for each subject"). Re-normalising
  changes no ranking, only the cosine values. The prefixes are the config's ``probing.prefixes`` or, by default,
  every prefix in the images table, so a subject's query is the same in every segment.
* **Ranking.** Images are ranked by cosine to the query, ties broken by the pool order (rows sorted by
  ``set_id, candidate_index, member_index``) through :func:`counterfactory.metrics.ranking_from_scores`.
* **Labels and K.** Each image's intersectional label is its tuple of attribute values (a1, a2[, a3]);
  ``K = |A1| × |A2|`` (× |A3| for a three-attribute segment, §10.2: MaxSkew@60), where ``A_i`` are the values of
  that attribute type in the *whole segment* (not just this subject's pool). The desired distribution is uniform
  over the ``K`` combinations (reference notes A1: "eq_opp", ln, a zero share replaced by 1/k).
* **Metrics.** MaxSkew@K / MinSkew@K and per-label Skew@K; NDKL over ranked lists of size 1..``K²`` (§10.1;
  ``ndkl_depth: k_squared``, the default; capped at the pool size) or, with ``ndkl_depth: full``, over the whole
  ranking (Geyik et al.'s definition); Bias@K
  (signed, male positive; Wang et al. 2021) where the segment has a gender type (§10.1, Table 15); the share of
  each label in the top K (Figures 5, 8–13). All metrics come from :mod:`counterfactory.metrics.retrieval`.
* **Marginals (§4.2, Figure 4).** "Filtering on the value of the other attribute": for attribute type ``t`` and each
  value ``v`` of another type ``u``, the pool is restricted to images with ``u = v`` and ranked as before; rows carry
  ``attribute = t`` and ``given = "u=v"``. ``K`` is the segment's ``K`` ("calculated as previously described";
  ``probing.marginal_k: attribute`` uses ``|A_t|`` instead). Unconditioned marginals (``given = "all"``) are computed
  on the top K of the full ranking (the left/centre panels of Figure 5). When a pool is smaller than ``K`` the
  metric uses ``k = pool size`` and the row records that k.

Output: a long table, one row per (model, segment, subject, attribute, given, label, metric) with columns
:data:`PROBE_COLUMNS`; ``label`` is empty for metrics of a whole ranking and names the attribute value (intersectional
values joined by ``|``) for ``skew`` and ``share``. The tables and figures drawn from it are :mod:`.probe_report`
(also importable from here).
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ...config import fill_section
from ...device import release_memory, with_stage_precision
from ...errors import ConfigError, input_error
from ...metrics.retrieval import bias_at_k, max_skew_at_k, min_skew_at_k, ndkl, ranking_from_scores, skew_at_k
from . import STUDY
from .captions import compose_caption

log = logging.getLogger(__name__)

INTERSECTIONAL = "intersectional"
ALL = "all"
SEP = "|"
PROBE_COLUMNS = ["model", "segment", "subject", "attribute", "given", "label", "metric", "k", "value"]
IMAGE_COLUMNS = ["set_id", "candidate_index", "member_index", "segment", "prefix", "subject", "caption",
                 "a1_type", "a1", "a2_type", "a2", "image_path"]

#: the ``probing`` config section has its defaults, each with its paper section, in the schema
#: (``social_counterfactuals.probing`` in config/schema.yaml; docs/config-reference.md). The gender words below are
#: only the keyword defaults of the metric functions for direct library use (a test checks they equal the schema's)
MALE_VALUES = ("male", "man", "men", "masculine")
FEMALE_VALUES = ("female", "woman", "women", "feminine")





# --------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------
def settings(cfg: Mapping | None) -> dict:
    """The ``probing`` section of ``cfg`` validated with the schema's defaults filled (a missing section gives the
    defaults; an unknown key or a bad value is a :class:`ConfigError` naming it), plus the caption step's a/an
    exceptions."""
    section = (cfg or {}).get("probing") if cfg is not None else None
    out = fill_section(f"{STUDY}.probing", section)
    captions = dict.get(cfg, "captions") if isinstance(cfg, dict) and "captions" in cfg else None
    for key in ("article_a", "article_an"):       # the a/an exceptions of the caption step (§3.2)
        out[key] = list((captions or {}).get(key) or [])
    return out


# --------------------------------------------------------------------------------------------
# neutral queries (§4.1)
# --------------------------------------------------------------------------------------------
def neutral_query(prefix: str, subject: str, extra_a: Sequence[str] = (), extra_an: Sequence[str] = ()) -> str:
    """The attribute-neutral prompt for one prefix: ⟨prefix⟩ a/an ⟨subject⟩ (§4.1: "A construction worker").

    Built like the captions (:func:`.captions.compose_caption`, same a/an rules and the config's ``article_a`` /
    ``article_an`` exceptions) with no attribute values: "A photo of a" + "umpire" gives "A photo of an umpire".
    A prefix that is empty or "A/An" reads "A"; a prefix not ending in an article gets "a" appended."""
    subject = " ".join(str(subject).split())
    if not subject:
        raise ValueError("neutral_query: empty subject")
    p = " ".join(str(prefix or "").split())
    if p.lower() in ("", "a/an"):
        p = "A"
    elif not re.search(r"(^|\s)(a|an)$", p, flags=re.IGNORECASE):
        p = f"{p} a"
    return compose_caption(p, [], subject, extra_a, extra_an)


def average_query_embedding(text_embeddings: np.ndarray) -> np.ndarray:
    """Mean of the (already L2-normalised) prefix embeddings, re-normalised to unit length (§4.1)."""
    emb = np.asarray(text_embeddings, dtype=np.float64)
    if emb.ndim != 2 or emb.shape[0] == 0:
        raise ValueError(f"text_embeddings: expected a non-empty (n_prefixes, dim) array, got shape {emb.shape}")
    mean = emb.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    if not norm > 0:
        raise ValueError("text_embeddings: the prefix embeddings average to the zero vector")
    return mean / norm


def subject_query_embeddings(scorer, subjects: Sequence[str], prefixes: Sequence[str], extra_a: Sequence[str] = (),
                             extra_an: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """``{subject: unit query embedding}``: every neutral prompt encoded once, averaged per subject (§4.1)."""
    if not prefixes:
        raise ValueError("prefixes: is empty; give at least one caption prefix")
    texts = {s: [neutral_query(p, s, extra_a, extra_an) for p in prefixes] for s in subjects}
    unique = list(dict.fromkeys(t for ts in texts.values() for t in ts))
    emb = np.asarray(scorer.encode_texts(unique))
    row = {t: i for i, t in enumerate(unique)}
    return {s: average_query_embedding(emb[[row[t] for t in ts]]) for s, ts in texts.items()}


# --------------------------------------------------------------------------------------------
# metrics of one ranking (pure)
# --------------------------------------------------------------------------------------------
def join_label(values: Sequence) -> str:
    return SEP.join(str(v) for v in values)


def _gender_word(value, male: set, female: set):
    low = str(value).strip().lower()
    return "male" if low in male else "female" if low in female else None


def _attribute_rows(ranked: list, label_list: list, k: int, depth: int, attribute: str, given: str,
                    shares: bool) -> list[dict]:
    """maxskew / minskew / per-label skew (and share) at k, NDKL over the first ``depth`` items."""
    rows = [dict(attribute=attribute, given=given, label="", metric="maxskew", k=k,
                 value=max_skew_at_k(ranked, k, labels=label_list)),
            dict(attribute=attribute, given=given, label="", metric="minskew", k=k,
                 value=min_skew_at_k(ranked, k, labels=label_list)),
            dict(attribute=attribute, given=given, label="", metric="ndkl", k=depth,
                 value=ndkl(ranked[:depth], labels=label_list))]
    skews = skew_at_k(ranked, k, labels=label_list)
    top = ranked[:k]
    for lab in label_list:
        rows.append(dict(attribute=attribute, given=given, label=str(lab), metric="skew", k=k, value=skews[lab]))
        if shares:
            rows.append(dict(attribute=attribute, given=given, label=str(lab), metric="share", k=k,
                             value=top.count(lab) / k))
    return rows


def retrieval_metrics(scores: Sequence[float], labels: Sequence[Sequence], values: Mapping[str, Sequence], *,
                      k: int | None = None, marginal_k: str | int = "segment", ndkl_depth: str = "k_squared",
                      gender_type: str | None = "gender", male_values: Sequence[str] = MALE_VALUES,
                      female_values: Sequence[str] = FEMALE_VALUES, marginals: bool = True) -> list[dict]:
    """Metric rows of one subject's pool (pure: no model, no I/O).

    Parameters
    ----------
    scores:
        ``(n,)`` similarity of each pool image to the neutral query (higher = more similar).
    labels:
        ``n`` tuples, one value per attribute type, in the order of ``values``'s keys.
    values:
        ``{attribute type: the segment's values}`` (e.g. ``{"race": [6 races], "gender": ["male", "female"]}``).
    k:
        ``None`` gives ``K = Π |values[t]|`` (§4.1).
    marginal_k, ndkl_depth, gender_type, male_values, female_values:
        see the schema's ``probing`` keys and the module docstring.
    marginals:
        also compute the single-attribute rows (unconditioned and per value of each other type).

    Returns rows (dicts) with keys ``attribute, given, label, metric, k, value`` (see the module docstring); one
    ``pool_size`` row gives n.
    """
    types = list(values)
    if not types:
        raise ValueError("values: no attribute type given")
    scores = np.asarray(scores, dtype=np.float64)
    labels = [tuple(lab) for lab in labels]
    if scores.ndim != 1 or scores.shape[0] != len(labels):
        raise ValueError(f"scores has shape {scores.shape} but there are {len(labels)} labels")
    if not labels:
        raise ValueError("the pool is empty")
    for lab in labels:
        if len(lab) != len(types):
            raise ValueError(f"label {lab!r} has {len(lab)} values but there are {len(types)} attribute types {types}")
    for j, t in enumerate(types):
        bad = sorted({lab[j] for lab in labels} - set(values[t]), key=str)
        if bad:
            raise ValueError(f"attribute {t!r}: value(s) {bad!r} are not among the segment's values "
                             f"{list(values[t])!r}")
    big_k = int(k) if k is not None else math.prod(len(values[t]) for t in types)
    if big_k < 1:
        raise ValueError(f"k must be >= 1, got {big_k}")
    n = len(labels)
    male, female = {v.lower() for v in male_values}, {v.lower() for v in female_values}

    def depth_for(kk: int, m: int) -> int:
        return m if ndkl_depth == "full" else min(kk * kk, m)

    order = ranking_from_scores(scores)
    ranked = [labels[i] for i in order]
    k_eff = min(big_k, n)
    rows: list[dict] = [dict(attribute=INTERSECTIONAL, given=ALL, label="", metric="pool_size", k=0, value=float(n))]
    joint = [join_label(lab) for lab in ranked]
    joint_labels = [join_label(c) for c in itertools.product(*(values[t] for t in types))]
    rows += _attribute_rows(joint, joint_labels, k_eff, depth_for(big_k, n), INTERSECTIONAL, ALL, shares=True)
    if len(types) > 2:  # §10.2: two-attribute intersections measured on three-attribute images at the same K
        for a, b in itertools.combinations(range(len(types)), 2):
            pair = [join_label((lab[a], lab[b])) for lab in ranked]
            pair_labels = [join_label(c) for c in itertools.product(values[types[a]], values[types[b]])]
            rows += _attribute_rows(pair, pair_labels, k_eff, depth_for(big_k, n), f"{types[a]}+{types[b]}", ALL,
                                    shares=True)
    if not marginals:
        return rows
    for j, t in enumerate(types):
        single = [lab[j] for lab in ranked]
        rows += _attribute_rows(single, list(values[t]), k_eff, depth_for(big_k, n), t, ALL, shares=True)
        if t == gender_type:
            rows.append(dict(attribute=t, given=ALL, label="", metric="bias", k=k_eff,
                             value=bias_at_k([_gender_word(v, male, female) for v in single], k_eff)))
        mk = big_k if marginal_k == "segment" else len(values[t]) if marginal_k == "attribute" else int(marginal_k)
        for u_idx, u in enumerate(types):
            if u_idx == j:
                continue
            for v in values[u]:
                sub = [lab[j] for lab in ranked if lab[u_idx] == v]   # the filtered pool, in the same order
                if not sub:
                    continue
                kk = min(mk, len(sub))
                given = f"{u}={v}"
                rows += _attribute_rows(sub, list(values[t]), kk, depth_for(mk, len(sub)), t, given, shares=False)
                if t == gender_type:
                    rows.append(dict(attribute=t, given=given, label="", metric="bias", k=kk,
                                     value=bias_at_k([_gender_word(x, male, female) for x in sub], kk)))
    return rows


# --------------------------------------------------------------------------------------------
# images table
# --------------------------------------------------------------------------------------------
def attribute_columns(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """``[("a1_type", "a1"), ("a2_type", "a2"), ("a3_type", "a3"), ...]``: the attribute columns of ``frame``."""
    cols = [("a1_type", "a1"), ("a2_type", "a2")]
    i = 3
    while f"a{i}_type" in frame.columns and f"a{i}" in frame.columns:
        cols.append((f"a{i}_type", f"a{i}"))
        i += 1
    return cols


def has_attribute(types: pd.Series) -> bool:
    """Whether an ``a<i>_type`` column names an attribute (two-attribute sets carry ``a3_type`` as "" or null)."""
    return not types.fillna("").astype(str).str.strip().eq("").all()


def read_images_table(path: str | Path) -> pd.DataFrame:
    """The kept-images table (parquet or CSV), validated; ``image_path`` made absolute (relative paths are relative
    to the table's folder); rows sorted by ``segment, subject, set_id, candidate_index, member_index``."""
    path = Path(path)
    if not path.is_file():
        raise input_error(path, None, "images table not found",
                          "pass the kept-images table written by 'counterfactory social filter' (--images)")
    try:
        frame = pd.read_csv(path) if path.suffix.lower() in (".csv", ".tsv") else pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a bad input file
        raise input_error(path, None, f"cannot be read as a table ({exc})", "pass a parquet or CSV table") from exc
    missing = [c for c in IMAGE_COLUMNS if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {', '.join(missing)}",
                          f"the table needs {', '.join(IMAGE_COLUMNS)} (+ a3_type, a3 for three attributes)")
    if frame.empty:
        raise input_error(path, None, "has no rows", "run the filtering step first; no image was kept")
    for tcol, vcol in attribute_columns(frame)[:2]:     # a3... may be empty in two-attribute segments
        nulls = frame[vcol].isna() | frame[tcol].isna()
        if nulls.any():
            i = int(np.flatnonzero(nulls.to_numpy())[0])
            raise input_error(path, f"row {i}", f"empty {tcol}/{vcol}", "every kept image needs its attribute values")
    for seg, grp in frame.groupby("segment", sort=False):
        for tcol, _ in attribute_columns(frame):
            kinds = grp[tcol].dropna().unique()
            if len(kinds) > 1:
                raise input_error(path, f"segment {seg!r}", f"column {tcol} holds several types {list(kinds)!r}",
                                  "a segment is one attribute-type pair; give each pair its own segment name")
    base = path.resolve().parent
    frame = frame.copy()
    frame["image_path"] = [str(p if Path(p).is_absolute() else base / p) for p in frame["image_path"].astype(str)]
    frame = frame.sort_values(["segment", "subject", "set_id", "candidate_index", "member_index"], kind="stable")
    return frame.reset_index(drop=True)


def segment_values(frame: pd.DataFrame) -> dict[str, dict[str, list]]:
    """``{segment: {attribute type: values}}``, values in order of first appearance (the caption order)."""
    out: dict[str, dict[str, list]] = {}
    for seg, grp in frame.groupby("segment", sort=True):
        types: dict[str, list] = {}
        for tcol, vcol in attribute_columns(frame):
            if not has_attribute(grp[tcol]):
                continue
            types[str(grp[tcol].iloc[0])] = list(dict.fromkeys(grp.sort_values("member_index", kind="stable")[vcol]))
        out[str(seg)] = types
    return out


def table_prefixes(frame: pd.DataFrame) -> list[str]:
    return [str(p) if isinstance(p, str) else "" for p in dict.fromkeys(frame["prefix"].fillna("").tolist())]


# --------------------------------------------------------------------------------------------
# runner
# --------------------------------------------------------------------------------------------
def _default_scorer_factory(cfg, role):
    """The role's dual-encoder scorer; FLAVA embeds with ``probing.flava_embedding`` (the authors' evaluation: the
    unprojected ``pooler_output``)."""
    from ...scorers import scorer_from_config

    return scorer_from_config(cfg, role, head="itc", flava_embedding=settings(cfg)["flava_embedding"])


def probe_frame(frame: pd.DataFrame, scorer, model: str, opts: Mapping, *, segments: Sequence[str] | None = None,
                subjects: Sequence[str] | None = None) -> pd.DataFrame:
    """Probe one model (``scorer`` with ``encode_images`` / ``encode_texts``) on a validated images table."""
    seg_vals = segment_values(frame)
    if segments:
        unknown = sorted(set(segments) - set(seg_vals))
        if unknown:
            raise ConfigError(f"segments {unknown} are not in the images table (it has {sorted(seg_vals)})")
    sel = frame[frame["segment"].isin(segments or list(seg_vals))]
    if subjects:
        sel = sel[sel["subject"].isin(subjects)]
    if sel.empty:
        raise ConfigError("no image of the selected segments/subjects in the images table")
    prefixes = list(opts.get("prefixes") or table_prefixes(frame))
    paths = list(dict.fromkeys(sel["image_path"]))
    img = np.asarray(scorer.encode_images(paths), dtype=np.float64)
    pos = {p: i for i, p in enumerate(paths)}
    queries = subject_query_embeddings(scorer, sorted(sel["subject"].unique()), prefixes,
                                       opts.get("article_a") or (), opts.get("article_an") or ())
    rows = []
    for (seg, subj), grp in sel.groupby(["segment", "subject"], sort=True):
        values = seg_vals[seg]
        cols = [vcol for tcol, vcol in attribute_columns(frame) if has_attribute(grp[tcol])]
        scores = img[[pos[p] for p in grp["image_path"]]] @ queries[subj]
        labels = list(grp[cols].itertuples(index=False, name=None))
        for r in retrieval_metrics(scores, labels, values, k=opts.get("k"), marginal_k=opts["marginal_k"],
                                   ndkl_depth=opts["ndkl_depth"], gender_type=opts["gender_type"],
                                   male_values=opts["male_values"], female_values=opts["female_values"]):
            rows.append({"model": model, "segment": seg, "subject": subj, **r})
    return pd.DataFrame(rows, columns=PROBE_COLUMNS)


def probe_config(cfg):
    """``cfg`` as probing loads its models: ``probing.precision`` replaces the config-wide precision (None: kept)."""
    return with_stage_precision(cfg, settings(cfg)["precision"])


def probe(cfg, roles: Sequence[str], images_table_path: str | Path, *, segments: Sequence[str] | None = None,
          subjects: Sequence[str] | None = None,
          scorer_factory: Callable[[Any, str], Any] | None = None) -> pd.DataFrame:
    """Probe every model role on the kept-images table (§4, §10.1): the long table of :data:`PROBE_COLUMNS`.

    ``scorer_factory(cfg, role)`` builds a dual-encoder scorer (default: ``scorer_from_config(cfg, role,
    head="itc")``), given ``cfg`` in ``probing.precision`` (:func:`probe_config`); one model is loaded at a time and
    released before the next."""
    opts = settings(cfg)
    cfg = probe_config(cfg)
    roles = list(roles or opts.get("roles") or [])
    if not roles:
        raise ConfigError("no model role to probe. Fix: pass --role ROLE (repeatable) or set probing.roles")
    frame = read_images_table(images_table_path)
    factory = scorer_factory or _default_scorer_factory
    parts = []
    for role in roles:
        scorer = factory(cfg, role)
        if not hasattr(scorer, "encode_images"):
            raise ConfigError(f"model role {role!r} is not a dual encoder; probing ranks images by cosine to one query "
                              "embedding. Fix: probe CLIP-like models (or FLAVA/BLIP with their contrastive head)")
        log.info("probing %s on %d images", role, len(frame))
        parts.append(probe_frame(frame, scorer, role, opts, segments=segments, subjects=subjects))
        del scorer
        release_memory()
    return pd.concat(parts, ignore_index=True)


def read_probe(paths: str | Path | Sequence[str | Path]) -> pd.DataFrame:
    """Concatenate probe CSVs (written by ``counterfactory social probe``), checking their columns."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    parts = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise input_error(p, None, "probe table not found", "run 'counterfactory social probe' first")
        df = pd.read_csv(p, keep_default_na=False, na_values=[""], dtype={"label": str, "given": str})
        missing = [c for c in PROBE_COLUMNS if c not in df.columns]
        if missing:
            raise input_error(p, None, f"missing column(s) {', '.join(missing)}",
                              "pass a table written by 'counterfactory social probe'")
        df["label"] = df["label"].fillna("")
        parts.append(df)
    if not parts:
        raise ConfigError("no probe table given. Fix: pass --probe FILE.csv")
    return pd.concat(parts, ignore_index=True)
