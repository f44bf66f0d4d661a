"""Skewness on real image-text data: PATA and VisoGender (SocialCounterfactuals §5.3, Table 3).

The paper reports one number per model and dataset, "the mean MaxSkew@K", without the protocol. Ours, following the
datasets' own retrieval set-ups and the metrics of §4.1 (reference notes A1, A2):

* **PATA** (Seth et al. 2023): for each scene and each protected attribute (race, gender, age), every caption of
  the scene's ``pos`` and ``neg`` lists for that attribute is a query; the pool is the scene's images that were
  downloaded; labels are the images' values of that attribute. An attribute is skipped for a scene whose pool holds
  fewer than two of its values (age has both values in 8 scenes only).
* **VisoGender** (Hall et al. 2023): for each occupation of each context (OO, OP), the gender-neutral query of the
  VisoGender retrieval benchmark, "The ⟨occupation⟩ and their ⟨object | participant⟩"; the pool is that occupation's
  images of that context; labels are the occupation's perceived gender (masculine / feminine).
* **Metrics** per query: MaxSkew@K, MinSkew@K, per-value Skew@K and share, NDKL (full ranking), Bias@K for gender
  (masculine/male positive), with a uniform desired distribution over the values present in the pool and, by
  default, ``K`` = the number of those values (the §4.1 rule ``K = Π|A_i|`` for a single attribute); ``k`` in the
  config overrides it. A pool smaller than K uses ``k = pool size``.
* **Table 3** (:func:`external_summary`): the mean over every (group, query, attribute) of MaxSkew@K, per model and
  dataset.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ...config import fill_section
from ...data.pata import load_pata
from ...data.visogender import load_visogender
from ...device import release_memory
from ...errors import ConfigError, input_error
from ...io import write_csv, write_text
from ...metrics.retrieval import bias_at_k, ranking_from_scores
from . import STUDY
from .probing import FEMALE_VALUES, MALE_VALUES
from .probing import _attribute_rows, _default_scorer_factory, _gender_word, probe_config

log = logging.getLogger(__name__)

COLUMNS = ["model", "dataset", "group", "query_set", "query", "attribute", "label", "metric", "k", "value"]

#: ``probing.pata`` and ``probing.visogender`` have their keys and defaults in the schema (config/schema.yaml)
DATASETS = ("pata", "visogender")


def external_settings(cfg: Mapping | None, dataset: str, **overrides) -> dict:
    """``probing.<dataset>`` (validated, the schema's defaults filled), then the non-None ``overrides`` (CLI
    options)."""
    if dataset not in DATASETS:
        raise ConfigError(f"unknown external dataset {dataset!r}. Fix: use {', '.join(DATASETS)}")
    section = ((cfg or {}).get("probing") or {}).get(dataset) if cfg is not None else None
    out = fill_section(f"{STUDY}.probing.{dataset}", section)
    out.update({k: v for k, v in overrides.items() if v is not None})
    return out


def configured(cfg: Mapping | None, dataset: str) -> bool:
    """Whether ``probing.<dataset>`` names the files of ``dataset`` (PATA: file list, captions and images;
    VisoGender: images and a TSV)."""
    o = external_settings(cfg, dataset)
    if dataset == "pata":
        return all(o.get(k) for k in ("files_list", "captions_json", "image_dir"))
    return bool(o.get("image_dir") and (o.get("oo_tsv") or o.get("op_tsv")))


def single_attribute_metrics(scores: Sequence[float], labels: Sequence, *, k: int | None = None,
                             attribute: str = "gender", gender: bool | None = None,
                             male_values: Sequence[str] = MALE_VALUES,
                             female_values: Sequence[str] = FEMALE_VALUES) -> list[dict]:
    """Metric rows of one query over one pool labelled with one attribute (pure). The label set is the values
    present in the pool (sorted); fewer than two gives no rows. Keys ``attribute, label, metric, k, value``."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = [str(v) for v in labels]
    if scores.ndim != 1 or scores.shape[0] != len(labels):
        raise ValueError(f"scores has shape {scores.shape} but there are {len(labels)} labels")
    values = sorted(set(labels))
    if len(values) < 2:
        return []
    n = len(labels)
    kk = min(int(k) if k is not None else len(values), n)
    ranked = [labels[i] for i in ranking_from_scores(scores)]
    rows = [dict(attribute=attribute, given="all", label="", metric="pool_size", k=0, value=float(n))]
    rows += _attribute_rows(ranked, values, kk, n, attribute, "all", shares=True)
    if gender if gender is not None else attribute == "gender":
        male, female = {v.lower() for v in male_values}, {v.lower() for v in female_values}
        rows.append(dict(attribute=attribute, given="all", label="", metric="bias", k=kk,
                         value=bias_at_k([_gender_word(v, male, female) for v in ranked], kk)))
    for r in rows:
        r.pop("given")
    return rows


def _encode(scorer, paths: list[str], texts: list[str]) -> tuple[dict, dict]:
    img = np.asarray(scorer.encode_images(paths), dtype=np.float64)
    txt = np.asarray(scorer.encode_texts(texts), dtype=np.float64)
    return ({p: img[i] for i, p in enumerate(paths)}, {t: txt[i] for i, t in enumerate(texts)})


def pata_rows(images: pd.DataFrame, captions: pd.DataFrame, image_emb: Mapping[str, np.ndarray],
              text_emb: Mapping[str, np.ndarray], *, polarities: Sequence[str] = ("pos", "neg"),
              k: int | None = None) -> list[dict]:
    """PATA rows for one model from precomputed embeddings (see the module docstring)."""
    have = images[images["image_path"].notna()]
    rows = []
    for scene, pool in have.groupby("scene", sort=True):
        caps = captions[(captions["scene"] == scene) & captions["polarity"].isin(polarities)]
        if caps.empty:
            continue
        emb = np.stack([image_emb[p] for p in pool["image_path"]])
        for attribute, acaps in caps.groupby("attribute", sort=True):
            for cap in dict.fromkeys(acaps["caption"]):
                pol = ",".join(sorted(acaps[acaps["caption"] == cap]["polarity"].unique()))
                for r in single_attribute_metrics(emb @ text_emb[cap], pool[attribute].tolist(), k=k,
                                                  attribute=attribute):
                    rows.append({"dataset": "pata", "group": scene, "query_set": pol, "query": cap, **r})
    return rows


def visogender_queries(frame: pd.DataFrame, templates: Mapping[str, str]) -> list[tuple[str, str, str, str]]:
    """``(query_set, context, occupation, query)`` for every template and occupation. A template key names its
    context before an optional ``_`` suffix (``OO``, ``OP``, ``OP_par_first``); fields ``{occupation}``, ``{other}``."""
    out = []
    for key, template in templates.items():
        context = key.split("_", 1)[0].upper()
        sub = frame[frame["context"] == context]
        for occ, grp in sub.groupby("occupation", sort=True):
            try:
                query = template.format(occupation=occ, other=grp["other"].iloc[0])
            except (KeyError, IndexError) as exc:
                raise ConfigError(f"probing.visogender.templates.{key}: {template!r} uses an unknown field ({exc}). "
                                  "Fix: use {occupation} and {other}") from exc
            out.append((key, context, occ, query))
    return out


def visogender_rows(frame: pd.DataFrame, image_emb: Mapping[str, np.ndarray], text_emb: Mapping[str, np.ndarray],
                    templates: Mapping[str, str], *, k: int | None = None) -> list[dict]:
    """VisoGender rows for one model from precomputed embeddings (see the module docstring)."""
    rows = []
    have = frame[frame["image_path"].notna()]
    for key, context, occ, query in visogender_queries(frame, templates):
        pool = have[(have["context"] == context) & (have["occupation"] == occ)]
        if pool.empty:
            continue
        emb = np.stack([image_emb[p] for p in pool["image_path"]])
        for r in single_attribute_metrics(emb @ text_emb[query], pool["occupation_gender"].tolist(), k=k,
                                          attribute="gender"):
            rows.append({"dataset": "visogender", "group": f"{context}:{occ}", "query_set": key, "query": query, **r})
    return rows


def _run(cfg, roles, paths: list[str], texts: list[str], make_rows, scorer_factory) -> pd.DataFrame:
    roles = list(roles or ((cfg or {}).get("probing") or {}).get("roles") or [])
    if not roles:
        raise ConfigError("no model role given. Fix: pass --role ROLE (repeatable) or set probing.roles")
    if not paths:
        raise ConfigError("none of the dataset's images was found. Fix: check image_dir and image_name "
                          "(how a record maps to its downloaded file)")
    factory = scorer_factory or _default_scorer_factory
    rows = []
    cfg = probe_config(cfg) if cfg is not None else cfg   # probing.precision
    for role in roles:
        scorer = factory(cfg, role)
        image_emb, text_emb = _encode(scorer, paths, texts)
        rows += [{"model": role, **r} for r in make_rows(image_emb, text_emb)]
        del scorer
        release_memory()
    return pd.DataFrame(rows, columns=COLUMNS)


def _pata(o: Mapping) -> tuple[pd.DataFrame, pd.DataFrame]:
    for key in ("files_list", "captions_json", "image_dir"):
        if not o.get(key):
            raise ConfigError(f"probing.pata.{key} is not set. Fix: set it in the config or pass it on the "
                              "command line")
    return load_pata(o["files_list"], o["captions_json"], o["image_dir"], o["image_name"])


def _visogender(o: Mapping) -> pd.DataFrame:
    if not (o.get("oo_tsv") or o.get("op_tsv")) or not o.get("image_dir"):
        raise ConfigError("probing.visogender needs image_dir and oo_tsv and/or op_tsv. Fix: set them in the config "
                          "or pass them on the command line")
    return load_visogender(o.get("oo_tsv"), o.get("op_tsv"), o["image_dir"], o["image_name"])


def image_paths(cfg: Mapping | None, dataset: str) -> list[str]:
    """The downloaded images of ``pata`` or ``visogender`` (``probing.<dataset>``), each once, in file order."""
    o = external_settings(cfg, dataset)
    frame = _pata(o)[0] if dataset == "pata" else _visogender(o)
    return list(dict.fromkeys(frame["image_path"].dropna()))


def evaluate_pata(cfg, roles: Sequence[str], *, scorer_factory: Callable | None = None, **overrides) -> pd.DataFrame:
    """PATA skewness per model (long table, :data:`COLUMNS`); paths from ``probing.pata`` or ``overrides``."""
    o = external_settings(cfg, "pata", **overrides)
    images, captions = _pata(o)
    caps = captions[captions["polarity"].isin(o["polarities"]) & captions["scene"].isin(images["scene"])]
    paths = list(dict.fromkeys(images["image_path"].dropna()))
    return _run(cfg, roles, paths, list(dict.fromkeys(caps["caption"])),
                lambda ie, te: pata_rows(images, captions, ie, te, polarities=o["polarities"], k=o["k"]),
                scorer_factory)


def evaluate_visogender(cfg, roles: Sequence[str], *, scorer_factory: Callable | None = None,
                        **overrides) -> pd.DataFrame:
    """VisoGender skewness per model (long table, :data:`COLUMNS`); paths from ``probing.visogender`` or
    ``overrides``."""
    o = external_settings(cfg, "visogender", **overrides)
    frame = _visogender(o)
    queries = [q for *_, q in visogender_queries(frame, o["templates"])]
    paths = list(dict.fromkeys(frame["image_path"].dropna()))
    return _run(cfg, roles, paths, list(dict.fromkeys(queries)),
                lambda ie, te: visogender_rows(frame, ie, te, o["templates"], k=o["k"]), scorer_factory)


def external_summary(results: pd.DataFrame, metric: str = "maxskew") -> pd.DataFrame:
    """Table 3: mean ``metric`` over every (group, query, attribute), rows = models, columns = datasets."""
    sel = results[(results["metric"] == metric) & (results["label"].fillna("") == "")]
    if sel.empty:
        return pd.DataFrame()
    return sel.pivot_table(index="model", columns="dataset", values="value", aggfunc="mean")


def external_table_files(results, out_md=None, out_csv=None) -> pd.DataFrame:
    """``social probe-external-table``: Table 3 (mean MaxSkew@K per model) of the probe CSVs ``results`` of
    probe-pata / probe-visogender, written as Markdown and/or CSV; returns the table."""
    from pathlib import Path

    parts = []
    for p in results:
        if not Path(p).is_file():
            raise input_error(p, None, "results table not found", "run probe-pata / probe-visogender first")
        parts.append(pd.read_csv(p, keep_default_na=False, na_values=[""], dtype={"label": str}))
    table = external_summary(pd.concat(parts, ignore_index=True))
    if out_md:
        write_text(out_md, "### Mean MaxSkew@K on real image-text data (Table 3)\n\n"
                   + table.round(3).to_markdown(floatfmt=".3f") + "\n")
    if out_csv:
        write_csv(out_csv, table.reset_index())
    return table
