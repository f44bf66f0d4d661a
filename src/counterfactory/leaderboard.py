"""Score any model on the counterfactual benchmarks of the five studies: one leaderboard with bootstrap intervals,
paired comparisons and shortcut baselines (``counterfactory score``; docs/score.md).

A benchmark is a reader (its items, read in the official layout through the readers the studies use) and a kind:

* ``pair``: an image with a positive and a negative caption (SugarCrepe, PointQA-LookTwice); per item
  ``correct = s(image, positive) > s(image, negative)`` (a tie is wrong); metric ``accuracy``.
* ``group``: two captions and two images, caption *k* belonging to image *k* (Winoground; COCO-Counterfactuals'
  original / counterfactual pairs, from the workflow's ``selected_pairs.parquet`` or the published release);
  per item the ``text``, ``image`` and ``group`` booleans of Thrush et al. (2022).

Scores come from the studies' own scoring code (:func:`counterfactory.studies.countercurate.benchmarks.score_items`
through a role's :mod:`counterfactory.scorers` scorer; a generative VLM is asked to choose between the two captions),
so a leaderboard cell equals the number the study reports for the same model and items. Every cell carries a
percentile bootstrap interval over items (``resamples`` draws of the items with replacement, seeded);
:func:`compare` is a paired bootstrap of the mean difference of two models on the same items (two-sided p-value:
twice the smaller share of resampled differences on either side of zero).

Shortcut baselines, rows of the same table: ``text-only (lm)`` picks the caption the ``lm`` role finds more likely
(lower per-token perplexity, the first word scored after BOS) without looking at the image (``pair`` benchmarks; for a
``group`` benchmark a blind model gives both images the same answer, so its text and group scores are 0 by
construction and are not listed); ``bag of words (ceiling)`` is the share of items whose two captions are *not* the
same multiset of words — a bag-of-words model cannot separate the rest, so this is its ceiling.

Results are cached per (model fingerprint, benchmark data fingerprint, scoring settings): the per-item outcomes of
one model on one benchmark live in ``<out>/items/<benchmark>/<key>.parquet``, so adding a model scores only that model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from .errors import ConfigError, input_error
from .settings import config_value

log = logging.getLogger(__name__)

PAIR, GROUP = "pair", "group"
METRICS = {PAIR: ("accuracy",), GROUP: ("text", "image", "group")}
TEXT_ONLY, BOW = "text-only (lm)", "bag of words (ceiling)"


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: its kind (:data:`PAIR` / :data:`GROUP`), where it comes from, and its reader
    ``read(cfg, source) -> items`` (pair items: ``image_path, caption, negative_caption``; group items:
    ``image_0_path, image_1_path, caption_0, caption_1``; both with ``item_id``)."""

    name: str
    kind: str
    title: str
    source: str
    read: Callable[[Mapping, str | None], pd.DataFrame]


def _cc_items(benchmark: str):
    def read(cfg: Mapping, source: str | None) -> pd.DataFrame:
        from .config import study_view
        from .studies.countercurate.benchmarks import load_benchmark

        view = study_view(cfg, "countercurate") if "countercurate" in cfg else cfg
        items = load_benchmark(view, benchmark, data=source).reset_index(drop=True)
        if "item_id" not in items.columns:
            items["item_id"] = [f"{benchmark}_{i}" for i in range(len(items))]
        return items

    return read


def _coco_cf_items(cfg: Mapping, source: str | None) -> pd.DataFrame:
    """COCO-Counterfactuals pairs as group items: a ``selected_pairs.parquet`` of the image stage, or the published
    release folder (``data/examples.jsonl`` with ``data/images/`` extracted)."""
    if not source:
        raise ConfigError("score: the coco_cf benchmark needs its pairs. Fix: pass --data coco_cf=<selected_pairs."
                          "parquet of the image stage, or the Intel/COCO-Counterfactuals release folder>")
    path = Path(source)
    if path.is_dir():
        from .data.releases import read_coco_counterfactuals

        pairs = read_coco_counterfactuals(path)
    elif path.is_file():
        pairs = pd.read_parquet(path)
    else:
        raise input_error(path, None, "COCO-Counterfactuals pairs not found",
                          "pass the image stage's selected_pairs.parquet or the release folder")
    missing = {"id", "caption_0", "caption_1", "image_0", "image_1"} - set(pairs.columns)
    if missing:
        raise input_error(path, None, f"no column(s) {', '.join(sorted(missing))}",
                          "pass the image stage's selected_pairs.parquet (or the release)")
    base = path if path.is_dir() else path.parent   # the image stage writes paths relative to its folder

    def located(p: str) -> str:
        return p if Path(p).is_absolute() or Path(p).exists() or not (base / p).exists() else str(base / p)

    return pd.DataFrame({"item_id": pairs["id"].astype(str), "caption_0": pairs["caption_0"].astype(str),
                         "caption_1": pairs["caption_1"].astype(str),
                         "image_0_path": [located(str(p)) for p in pairs["image_0"]],
                         "image_1_path": [located(str(p)) for p in pairs["image_1"]]})


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in [
    Benchmark("coco_cf", GROUP, "COCO-Counterfactuals pairs", "Le et al. 2023 (Intel/COCO-Counterfactuals)",
              _coco_cf_items),
    Benchmark("sugarcrepe", PAIR, "SugarCrepe", "Hsieh et al. 2023 (RAIVNLab/sugar-crepe)", _cc_items("sugarcrepe")),
    Benchmark("winoground", GROUP, "Winoground", "Thrush et al. 2022 (facebook/winoground)", _cc_items("winoground")),
    Benchmark("looktwice", PAIR, "PointQA-LookTwice", "Mani et al. 2020", _cc_items("looktwice")),
]}


# ---------------------------------------------------------------------------------------------------- models
#: a model folder's ``config.json`` ``model_type`` -> the role whose loader and scorer it takes
ROLE_OF_MODEL_TYPE = {"clip": "clip_eval", "blip": "itm_blip", "flava": "itm_flava", "bridgetower": "itm_bridgetower",
                      "vilt": "itm_vilt", "llava": "vlm", "vsepp": "vsepp"}


@dataclass(frozen=True)
class ModelRef:
    """One model to score: its leaderboard name, the configuration it is loaded with and its role there."""

    label: str
    cfg: Mapping
    role: str


def model_ref(cfg: Mapping, value: str) -> ModelRef:
    """A configured role (by name), or a local folder / hub id loaded as the role its architecture takes
    (:data:`ROLE_OF_MODEL_TYPE`; an OpenCLIP folder with ``open_clip_config.json``: ``clip_open_clip``)."""
    import copy

    from .render import model_display_names

    models = dict(cfg.get("models") or {})
    if value in models:
        return ModelRef(model_display_names(models, [value])[value], cfg, value)
    path = Path(value)
    if (path / "open_clip_config.json").is_file():
        role, entry = "clip_open_clip", {"source": value, "library": "open_clip"}
    elif (path / "config.json").is_file():
        model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
        if model_type not in ROLE_OF_MODEL_TYPE:
            raise input_error(path / "config.json", None, f"model_type {model_type!r} is not one this tool scores",
                              f"score a model of type {', '.join(sorted(ROLE_OF_MODEL_TYPE))} or an OpenCLIP folder")
        role, entry = ROLE_OF_MODEL_TYPE[model_type], {"source": value}
    elif path.exists() or value.startswith(("/", "./", "../")):
        raise input_error(path, None, "not a model folder (no config.json or open_clip_config.json)",
                          "pass a model folder, a hub id or a configured role")
    else:   # a hub id: the CLIP family is the common case; name the role for the rest
        role, entry = "clip_eval", {"source": value}
    own = copy.deepcopy(dict(cfg))
    own["models"] = {**models, role: entry}
    return ModelRef(value, own, role)


# ---------------------------------------------------------------------------------------------------- outcomes
def item_outcomes(kind: str, scored: pd.DataFrame) -> pd.DataFrame:
    """Per-item booleans of scored items (``score_items`` / ``choice_items`` columns): ``item_id`` + the metrics of
    ``kind``."""
    from .metrics.pairwise import stack_pair_scores, winoground_item_scores

    out = pd.DataFrame({"item_id": scored["item_id"].astype(str).to_numpy()})
    if kind == PAIR:
        if "margin" in scored.columns:
            out["accuracy"] = scored["margin"].to_numpy() > 0
        else:
            out["accuracy"] = scored["s_pos"].to_numpy() > scored["s_neg"].to_numpy()
        return out
    if "m_i0" in scored.columns:   # a generative VLM choosing a caption per image: text score only
        out["text"] = (scored["m_i0"].to_numpy() > 0) & (scored["m_i1"].to_numpy() > 0)
        out["image"] = np.nan
        out["group"] = np.nan
        return out
    s = stack_pair_scores(scored["s_c0_i0"], scored["s_c0_i1"], scored["s_c1_i0"], scored["s_c1_i1"])
    for name, values in winoground_item_scores(s).items():
        out[name] = values
    return out


def bootstrap_ci(values: Sequence[float], *, resamples: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (items drawn with replacement)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(resamples, len(x)))
    means = x[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def compare(a: Sequence[float], b: Sequence[float], *, resamples: int, seed: int, level: float = 0.95) -> dict:
    """Paired bootstrap of ``mean(a - b)`` over the same items: the difference, its interval and a two-sided
    p-value (twice the smaller share of resampled differences at or beyond zero on either side, at most 1)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or len(a) == 0:
        raise ConfigError(f"compare: {len(a)} and {len(b)} items. Fix: compare two models on the same items")
    d = a - b
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    p = min(1.0, 2 * min(float(np.mean(means <= 0)), float(np.mean(means >= 0))))
    return {"difference": float(d.mean()), "ci_low": float(lo), "ci_high": float(hi), "p_value": p, "n": len(d),
            "test": "paired bootstrap"}


# ---------------------------------------------------------------------------------------------------- baselines
_WORD = re.compile(r"[a-z0-9']+")


def bag_of_words_inseparable(a: str, b: str) -> bool:
    """Whether the two captions are the same multiset of words (case and punctuation ignored)."""
    return sorted(_WORD.findall(a.lower())) == sorted(_WORD.findall(b.lower()))


def _pair_captions(kind: str, items: pd.DataFrame) -> tuple[list[str], list[str]]:
    if kind == PAIR:
        return items["caption"].astype(str).tolist(), items["negative_caption"].astype(str).tolist()
    return items["caption_0"].astype(str).tolist(), items["caption_1"].astype(str).tolist()


def bow_outcomes(kind: str, items: pd.DataFrame) -> pd.DataFrame:
    """Per item: 1 when a bag-of-words model *could* separate the two captions, for every metric of the kind (a
    model that cannot tell the captions apart cannot get the item right under any of them)."""
    a, b = _pair_captions(kind, items)
    separable = [not bag_of_words_inseparable(x, y) for x, y in zip(a, b)]
    return pd.DataFrame({"item_id": items["item_id"].astype(str).to_numpy(), **{m: separable for m in METRICS[kind]}})


def text_only_outcomes(items: pd.DataFrame, perplexity: Callable[[list[str]], np.ndarray]) -> pd.DataFrame:
    """Pair items answered without the image: the positive wins when the language model finds it more likely
    (strictly lower perplexity)."""
    pos, neg = _pair_captions(PAIR, items)
    ppl = np.asarray(perplexity(pos + neg), dtype=np.float64)
    n = len(pos)
    return pd.DataFrame({"item_id": items["item_id"].astype(str).to_numpy(), "accuracy": ppl[:n] < ppl[n:]})


def lm_perplexity(cfg: Mapping, role: str = "lm", batch_size: int = 16, device: str | None = None):
    """The ``lm`` role as a perplexity function (BOS prepended: the first word is scored too)."""
    import torch

    from .device import resolve_device
    from .models import registry
    from .text.captions import CausalLMPerplexity

    dev = resolve_device(device or config_value(cfg, "device"))
    model, tokenizer = registry.load(dict(cfg), role)
    scorer = CausalLMPerplexity(model.eval(), tokenizer, device=dev, prepend_bos=True)

    def perplexity(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            return np.concatenate([scorer.perplexity(texts[i:i + batch_size])
                                   for i in range(0, len(texts), batch_size)]) if texts else np.zeros(0)

    return perplexity


# ---------------------------------------------------------------------------------------------------- caching
def data_fingerprint(kind: str, items: pd.DataFrame) -> str:
    """Content digest of a benchmark's items: the captions, and the bytes of every image (not their names)."""
    from .io import file_sha256

    h = hashlib.sha256()
    columns = ["image_path"] if kind == PAIR else ["image_0_path", "image_1_path"]
    texts = list(_pair_captions(kind, items))
    digests: dict[str, str] = {}
    for row in range(len(items)):
        h.update(str(items["item_id"].iloc[row]).encode())
        for col in texts:
            h.update(b"\0" + col[row].encode())
        for col in columns:
            path = str(items[col].iloc[row])
            if path not in digests:
                try:
                    digests[path] = file_sha256(path)
                except OSError as exc:
                    raise input_error(path, None, f"benchmark image unreadable ({exc.strerror or exc})",
                                      "fix the benchmark's image folder (docs/data.md)") from None
            h.update(b"\0" + digests[path].encode())
    return h.hexdigest()[:16]


def model_fingerprint(cfg: Mapping, role: str) -> str:
    """Content fingerprint of a role's model (its files), else its id and revision."""
    from .models.registry import model_spec

    spec = model_spec(dict(cfg), role)
    if spec.is_local:
        from .models.identity import fingerprint

        return fingerprint(spec.local_path)[:16]
    text = json.dumps({"source": spec.source, "revision": getattr(spec, "revision", None),
                       "library": getattr(spec, "library", None)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_key(model_fp: str, data_fp: str, settings: Mapping) -> str:
    s = hashlib.sha256(json.dumps(dict(settings), sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{model_fp}-{data_fp}-{s}"


# ---------------------------------------------------------------------------------------------------- scoring
def score_model(cfg: Mapping, role: str, benchmark: Benchmark, items: pd.DataFrame, *, head: str = "itm",
                progress: bool = False, scorer=None) -> pd.DataFrame:
    """Per-item outcomes of one model role on one benchmark (the studies' scoring code)."""
    from .studies.countercurate import benchmarks as cc

    cc_name = "winoground" if benchmark.kind == GROUP else "sugarcrepe"   # the item layout score_items reads
    if scorer is None:
        scorer = cc._default_scorer_factory(dict(cfg), role, head=head, progress=progress)
    scored = cc.choice_items(cc_name, items, scorer) if cc.uses_choice(scorer) else cc.score_items(cc_name, items,
                                                                                                     scorer)
    return item_outcomes(benchmark.kind, scored)


SETTINGS_VERSION = 1


def read_items(cfg: Mapping, name: str, source: str | None = None) -> pd.DataFrame:
    """The items of benchmark ``name`` (``source``: its data where the config does not say)."""
    if name not in BENCHMARKS:
        raise ConfigError(f"score: unknown benchmark {name!r}. Fix: use {', '.join(BENCHMARKS)} or all")
    items = BENCHMARKS[name].read(cfg, source)
    if items.empty:
        raise input_error(source or name, None, "the benchmark has no items", "check its data")
    return items


def outcomes_of(ref: ModelRef, name: str, items: pd.DataFrame, out: Path, *, head: str = "itm",
                progress: bool = False) -> tuple[str, pd.DataFrame]:
    """``(cache key, per-item outcomes)`` of one model on one benchmark, read from ``out/items/<name>/<key>.parquet``
    when that model, data and settings were scored before, else scored and cached there."""
    from .io import write_parquet

    bench = BENCHMARKS[name]
    key = cache_key(model_fingerprint(ref.cfg, ref.role), data_fingerprint(bench.kind, items),
                    {"head": head, "version": SETTINGS_VERSION})
    path = Path(out) / "items" / name / f"{key}.parquet"
    if path.exists():
        log.info("%s on %s: cached (%s)", ref.label, name, path.name)
        return key, pd.read_parquet(path)
    log.info("%s on %s: scoring %d items", ref.label, name, len(items))
    outcomes = score_model(ref.cfg, ref.role, bench, items, head=head, progress=progress)
    write_parquet(path, outcomes)
    return key, outcomes


def cells(cfg: Mapping, scored: Sequence[tuple[str, str, pd.DataFrame]], items: Mapping[str, pd.DataFrame], *,
          resamples: int = 1000, seed: int = 0, level: float = 0.95, baselines: bool = True) -> pd.DataFrame:
    """The leaderboard's long table: one row per (model, benchmark, metric) of ``scored`` (``(label, benchmark,
    per-item outcomes)``), then the shortcut rows of every benchmark in ``items`` (name -> its items)."""
    rows = []
    for label, name, outcomes in scored:
        rows += _cells(label, "model", BENCHMARKS[name], outcomes, resamples, seed, level)
    perplexity = None
    for name, its in items.items() if baselines else ():
        bench = BENCHMARKS[name]
        rows += _cells(BOW, "shortcut", bench, bow_outcomes(bench.kind, its), resamples, seed, level)
        if bench.kind == PAIR and "lm" in (cfg.get("models") or {}):
            if perplexity is None:
                perplexity = lm_perplexity(cfg)
            rows += _cells(TEXT_ONLY, "shortcut", bench, text_only_outcomes(its, perplexity), resamples, seed, level)
    return pd.DataFrame(rows, columns=LONG_COLUMNS)


def run(cfg: Mapping, models: Sequence[ModelRef], benchmarks: Sequence[str], out_dir: str | Path, *,
        sources: Mapping[str, str] | None = None, resamples: int = 1000, seed: int = 0, level: float = 0.95,
        head: str = "itm", baselines: bool = True, progress: bool = False) -> pd.DataFrame:
    """Score ``models`` on ``benchmarks`` (cached per model, data and settings) and write the leaderboard
    (``leaderboard.{csv,json,md,html}``) to ``out_dir``; returns its long table."""
    from .io import write_csv

    out = Path(out_dir)
    sources = dict(sources or {})
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        raise ConfigError(f"score: unknown benchmark(s) {', '.join(unknown)}. Fix: use {', '.join(BENCHMARKS)} or all")
    items = {name: read_items(cfg, name, sources.get(name)) for name in benchmarks}
    scored, keys = [], []
    for name in benchmarks:
        for ref in models:
            key, outcomes = outcomes_of(ref, name, items[name], out, head=head, progress=progress)
            keys.append({"model": ref.label, "benchmark": name, "key": key})
            scored.append((ref.label, name, outcomes))
    table = cells(cfg, scored, items, resamples=resamples, seed=seed, level=level, baselines=baselines)
    write_leaderboard(table, out, resamples=resamples, seed=seed, level=level)
    write_csv(out / "cache_keys.csv", pd.DataFrame(keys, columns=["model", "benchmark", "key"]))
    return table


LONG_COLUMNS = ["model", "kind", "benchmark", "metric", "value", "ci_low", "ci_high", "n"]


def _cells(model: str, kind: str, bench: Benchmark, outcomes: pd.DataFrame, resamples: int, seed: int,
           level: float) -> list[dict]:
    rows = []
    for metric in METRICS[bench.kind]:
        if metric not in outcomes.columns or outcomes[metric].isna().all():
            continue
        x = outcomes[metric].astype(float).to_numpy()
        lo, hi = bootstrap_ci(x, resamples=resamples, seed=seed, level=level)
        rows.append({"model": model, "kind": kind, "benchmark": bench.name, "metric": metric,
                     "value": float(x.mean()), "ci_low": lo, "ci_high": hi, "n": len(x)})
    return rows


def compare_cached(out_dir: str | Path, benchmark: str, key_a: str, key_b: str, *, resamples: int = 1000,
                   seed: int = 0) -> dict:
    """:func:`compare` of two cached outcome files of one benchmark, per metric, on the items both hold."""
    folder = Path(out_dir) / "items" / benchmark
    a, b = (pd.read_parquet(folder / f"{k}.parquet") for k in (key_a, key_b))
    both = a.merge(b, on="item_id", suffixes=("_a", "_b"))
    return {m: compare(both[f"{m}_a"].astype(float), both[f"{m}_b"].astype(float), resamples=resamples, seed=seed)
            for m in METRICS[BENCHMARKS[benchmark].kind] if f"{m}_a" in both and not both[f"{m}_a"].isna().all()}


# ---------------------------------------------------------------------------------------------------- output
def wide(table: pd.DataFrame) -> pd.DataFrame:
    """Model rows x ``benchmark/metric`` columns of ``value [ci_low, ci_high]`` (percent), models first, then the
    shortcut rows; a benchmark a model was not scored on reads n/a."""
    cells = table.assign(column=table["benchmark"] + "/" + table["metric"],
                         cell=[f"{100 * v:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"
                               for v, lo, hi in zip(table["value"], table["ci_low"], table["ci_high"])])
    order = list(dict.fromkeys(cells["column"]))
    models = list(dict.fromkeys(cells.loc[cells["kind"] == "model", "model"]))
    shortcuts = list(dict.fromkeys(cells.loc[cells["kind"] == "shortcut", "model"]))
    out = cells.pivot_table(index="model", columns="column", values="cell", aggfunc="first")
    return out.reindex(index=models + shortcuts, columns=order).fillna("n/a")


def write_leaderboard(table: pd.DataFrame, out_dir: Path, *, resamples: int, seed: int, level: float) -> None:
    from .io import write_csv, write_json, write_text
    from .render import escape_md, html_page

    out_dir = Path(out_dir)
    write_csv(out_dir / "leaderboard.csv", table)
    write_json(out_dir / "leaderboard.json", {"resamples": resamples, "seed": seed, "level": level,
                                              "cells": table.to_dict(orient="records")})
    w = wide(table)
    note = (f"Percent, with the {round(level * 100)} % percentile bootstrap interval over items ({resamples} "
            f"resamples, seed {seed}). `{BOW}`: the share of items whose two captions are not the same multiset of "
            f"words; `{TEXT_ONLY}`: the caption the lm role finds more likely, without the image.")
    header = "| model | " + " | ".join(escape_md(c) for c in w.columns) + " |"
    lines = ["# Leaderboard", "", note, "", header, "|" + " --- |" * (len(w.columns) + 1)]
    lines += ["| " + escape_md(str(m)) + " | " + " | ".join(w.loc[m]) + " |" for m in w.index]
    write_text(out_dir / "leaderboard.md", "\n".join(lines) + "\n")
    import html as _html

    head = "".join(f"<th>{_html.escape(c)}</th>" for c in ["model", *w.columns])
    body = "".join("<tr>" + "".join(f"<td>{_html.escape(str(v))}</td>" for v in [m, *w.loc[m]]) + "</tr>"
                   for m in w.index)
    write_text(out_dir / "leaderboard.html", html_page("Leaderboard", [f"<p>{_html.escape(note)}</p><table><thead>"
                                                         f"<tr>{head}</tr></thead><tbody>{body}</tbody></table>"]))
