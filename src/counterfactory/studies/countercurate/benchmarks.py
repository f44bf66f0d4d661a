"""CounterCurate benchmarks (Zhang et al., Findings of ACL 2024, §4.2–§4.5 and appendices E–G): scores of one model role and the
paper's result tables.

Benchmarks and scores (every comparison strict, a tie is wrong: reference notes A8, A9, C.3–C.4)
-----------------------------------------------------------------------------------------------
* ``positions`` — **Flickr30k-Positions test split** (§4.2, Tables 1 and 4). Each row is a quadruple (C, I, C′, I′);
  the model gets 0.5 for ``s(C, I) > s(C′, I)`` and 0.5 for ``s(C′, I′) > s(C, I′)``: an image-to-text choice for
  each image, as in the authors' ``benchmark/CLIP_test_position.py`` (accuracy = correct / 2N;
  :func:`~counterfactory.metrics.pairwise.countercurate_position_accuracy`). Subsets: ``LR`` (left/right), ``AB``
  (above/below) and ``both`` = every test row (LR ∪ AB; the paper's "both" column). We also report the Winoground
  ``text_score`` / ``image_score`` / ``group_score`` of the quadruples — **our definition** (reference A8: the
  released code has no group score); they are not in the paper's tables.
* ``looktwice`` — **PointQA-LookTwice counting** (§4.3, Tables 2 and 8): correct iff
  ``s(I, "there are n X in the image.") > s(I, "... n+1 ...")``; images with a repeated object name are dropped
  (:mod:`counterfactory.data.looktwice`). Metric ``accuracy``.
* ``sugarcrepe`` — **SugarCrepe** (§4.4, Tables 3 and 6): correct iff ``s(I, positive) > s(I, negative)``; ``accuracy``
  per category (the seven files). For the groups ``add`` / ``replace`` / ``swap`` and ``average``, ``accuracy`` is the
  **item-pooled** fraction correct over the member categories: this is what Table 3 reports (from Table 6 and the
  official counts, e.g. CLIP Add = (77.89·2062 + 87.15·692) / 2754 = 80.22 and Average = 79.54, whereas the
  unweighted means are 82.52 and 76.82). ``macro_accuracy`` is the unweighted mean of the categories
  (:func:`~counterfactory.metrics.pairwise.sugarcrepe_scores`, the convention of third-party SugarCrepe code).
* ``winoground`` — **Winoground** (appendix E, Table 7): ``text_score``, ``image_score``, ``group_score``
  (:func:`~counterfactory.metrics.pairwise.winoground_scores`) over all examples (subset ``all``) and per
  ``collapsed_tag`` (subsets ``tag:<value>``). Table 7 reports the text score only.

Scores ``s(caption, image)`` come from any object with ``score_pairs(images, texts)`` (aligned pairs); when it also
has ``score_index_pairs`` (every :class:`counterfactory.scorers.Scorer`), each distinct image and caption is encoded
once. Dual encoders (CLIP, open_clip) use their cosine, cross-encoders their ITM head (``head``).

The generative VLM (LLaVA-1.5 class, :class:`.vlm.VlmScorer`) is scored as the paper scores it when its
``vlm.protocol`` is ``choice`` (the default): it *chooses* between the positive and the negative caption given the
ground-truth image (§4.2; §4.3, §4.4 and appendix E "the same" protocol; :func:`choice_items`). Positions: one
question per item on the positive image I (accuracy = fraction choosing C; the Winoground-style scores of the
quadruple do not exist for a choice); LookTwice and SugarCrepe: one question per item (``s_pos`` = the choice
margin, ``s_neg`` = 0, so the pairwise accuracy counts the positive chosen); Winoground: one question per image
(I0: C0 vs C1, I1: C1 vs C0), the text score only (Table 7). ``vlm.protocol: likelihood`` (ours) scores it like an
ITM model by the summed caption log-likelihood instead.

Results
-------
:func:`evaluate` returns ``(results, items)``: the long results (:data:`RESULT_COLUMNS`) and the per-item
scores; :mod:`.benchmark_tables` lays them out as the paper's tables.

The result tables are :mod:`.benchmark_tables` (their names are importable from here too).

Configuration (study section ``countercurate``, key ``benchmarks``; CLI options override)::

    benchmarks:
      head: itm                       # scorer head for cross-encoders (itm | itc)
      positions:  {table: null, images_root: null, split: test, subset: null}   # subset: LR|AB of an official TSV
      looktwice:  {dataset: null, images: null, imgs_list: null, image_name: "{id}.jpg",
                   template: "there are {n} {name} in the image."}
      sugarcrepe: {root: null, images: null, categories: null}
      winoground: {examples: null, images: null, ext: .png}
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ...config import fill_section
from ...data.looktwice import read_looktwice
from ...data.sugarcrepe import read_sugarcrepe
from ...data.winoground import read_winoground
from ...device import with_stage_precision
from ...errors import ConfigError, InputError, input_error
from ...metrics.pairwise import (SUGARCREPE_AVERAGES, SUGARCREPE_CATEGORIES, countercurate_counting_accuracy,
                                 countercurate_position_accuracy, pairwise_accuracy, stack_pair_scores,
                                 sugarcrepe_scores, winoground_item_scores, winoground_scores)

log = logging.getLogger(__name__)

BENCHMARKS = ("positions", "looktwice", "sugarcrepe", "winoground")
RESULT_COLUMNS = ["model", "benchmark", "subset", "metric", "value", "n"]
#: columns the positions table must have (written by ``positions.py``; ``split`` is used when present)
POSITION_COLUMNS = ("image_path", "negative_image_path", "caption", "negative_caption", "subset")
#: the official CounterCurate test TSV (``captions, images, neg_captions, neg_images``) -> our column names
OFFICIAL_POSITION_COLUMNS = {"captions": "caption", "images": "image_path", "neg_captions": "negative_caption",
                             "neg_images": "negative_image_path"}
POSITION_SUBSETS = ("LR", "AB")

#: ``benchmarks.<name>`` has its keys and defaults in the schema (config/schema.yaml; docs/config-reference.md)
#: the key of each benchmark that ``--data`` sets, and the key that ``--images`` sets
DATA_KEY = {"positions": "table", "looktwice": "dataset", "sugarcrepe": "root", "winoground": "examples"}
IMAGES_KEY = {"positions": "images_root", "looktwice": "images", "sugarcrepe": "images", "winoground": "images"}

#: SugarCrepe groups of Table 3 -> member categories (pooled); "average" pools all seven
SUGARCREPE_GROUPS: dict[str, tuple[str, ...]] = {"add": SUGARCREPE_AVERAGES["avg_add"],
                                                 "replace": SUGARCREPE_AVERAGES["avg_replace"],
                                                 "swap": SUGARCREPE_AVERAGES["avg_swap"]}
#: Table 6 row order and labels
SUGARCREPE_LABELS = {"add_obj": "Add Object", "add_att": "Add Attribute", "replace_obj": "Replace Object",
                     "replace_att": "Replace Attribute", "replace_rel": "Replace Relations",
                     "swap_obj": "Swap Object", "swap_att": "Swap Attribute", "average": "Average"}
SUGARCREPE_GROUP_LABELS = {"add": "Add", "replace": "Replace", "swap": "Swap", "average": "Average"}



# ----------------------------------------------------------------------------------------------------------------
# settings
# ----------------------------------------------------------------------------------------------------------------
def benchmark_settings(cfg: Mapping | None, benchmark: str, **overrides) -> dict:
    """``benchmarks.<benchmark>`` of the study view (validated, the schema's defaults filled), then the non-None
    ``overrides`` (command-line options)."""
    if benchmark not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark {benchmark!r}. Fix: use one of {', '.join(BENCHMARKS)}")
    out = fill_section("countercurate.benchmarks", (cfg or {}).get("benchmarks"))[benchmark]
    out.update({k: v for k, v in overrides.items() if v is not None})
    return out


def _require(opts: Mapping, benchmark: str, key: str, option: str) -> Any:
    if not opts.get(key):
        raise ConfigError(f"benchmarks.{benchmark}.{key} is not set. Fix: set it in the config or pass {option}")
    return opts[key]


# ----------------------------------------------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------------------------------------------
def _read_any(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise input_error(path.resolve(), None, "positions table not found",
                          "run 'counterfactory countercurate positions' first or pass the table with --data")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    sep = "\t" if suffix in (".tsv", ".tab") else ","
    return pd.read_csv(path, sep=sep, keep_default_na=False, na_values=[""], dtype=str)


def read_positions(path: str | Path, images_root: str | Path | None = None, *, split: str | None = "test",
                   subset: str | None = None) -> pd.DataFrame:
    """The Flickr30k-Positions evaluation rows (§4.2): ``positions.py``'s table (parquet / CSV / TSV with the
    columns :data:`POSITION_COLUMNS`, plus ``split`` and any others, e.g. ``image_id, relation``; its
    ``negative_image`` column is read as ``negative_image_path``), or the official
    CounterCurate test TSV (``captions, images, neg_captions, neg_images``; give its ``subset``, LR or AB).

    Rows of ``split`` are kept when the table has a ``split`` column (``split=None`` keeps all). Relative image paths
    are resolved against ``images_root`` (default: the table's folder) and returned absolute. ``subset`` values are
    upper-cased and must be LR or AB."""
    path = Path(path)
    frame = _read_any(path)
    aliases = {**OFFICIAL_POSITION_COLUMNS, "negative_image": "negative_image_path"}
    frame = frame.rename(columns={k: v for k, v in aliases.items() if k in frame.columns and v not in frame.columns})
    if "subset" not in frame.columns and subset is not None:
        frame["subset"] = subset
    missing = [c for c in POSITION_COLUMNS if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {', '.join(missing)} (found: {', '.join(map(str, frame))})",
                          "use the table of 'countercurate positions' (image_path, negative_image_path, caption, "
                          "negative_caption, subset, split), or an official test TSV with --subset")
    if split is not None and "split" in frame.columns:
        frame = frame[frame["split"].astype(str) == str(split)]
    elif split is not None:
        log.info("%s: no 'split' column; evaluating every row", path)
    frame = frame.reset_index(drop=True)
    if frame.empty:
        raise input_error(path, None, f"no rows of split {split!r}", "check benchmarks.positions.split and the table")
    for col in POSITION_COLUMNS:
        empty = frame[col].isna() | (frame[col].astype(str).str.strip() == "")
        if empty.any() and col == "negative_image_path":
            per = frame.loc[empty, "subset"].astype(str).value_counts().to_dict()
            raise input_error(path, f"row {int(np.flatnonzero(empty.to_numpy())[0])}",
                              f"{int(empty.sum())} of {len(frame)} rows have no negative image (per subset: {per})",
                              "write the negatives first (flipped images for LR, grounded generation for AB) and "
                              "put their paths in negative_image")
        if empty.any():
            raise input_error(path, f"row {int(np.flatnonzero(empty.to_numpy())[0])}", f"empty {col!r}",
                              "fix or drop the row")
    frame["subset"] = frame["subset"].astype(str).str.strip().str.upper()
    bad = ~frame["subset"].isin(POSITION_SUBSETS)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise input_error(path, f"row {i}", f"subset {frame['subset'].iloc[i]!r} is not LR or AB",
                          "subset must be LR (left/right) or AB (above/below)")
    root = Path(images_root) if images_root is not None else path.parent
    for col in ("image_path", "negative_image_path"):
        frame[col] = [str(p if Path(p).is_absolute() else (root / p).resolve()) for p in frame[col].astype(str)]
    return frame


def load_benchmark(cfg: Mapping | None, benchmark: str, *, data: str | Path | None = None,
                   images: str | Path | None = None, check_images: bool = True) -> pd.DataFrame:
    """The items of ``benchmark`` read with the settings of ``benchmarks.<benchmark>`` (``data`` / ``images``
    override the keys :data:`DATA_KEY` / :data:`IMAGES_KEY`)."""
    opts = benchmark_settings(cfg, benchmark, **{DATA_KEY[benchmark]: data, IMAGES_KEY[benchmark]: images})
    option = "--data"
    if benchmark == "positions":
        return read_positions(_require(opts, benchmark, "table", option), opts["images_root"], split=opts["split"],
                              subset=opts["subset"])
    if benchmark == "looktwice":
        return read_looktwice(_require(opts, benchmark, "dataset", option),
                              _require(opts, benchmark, "images", "--images"),
                              imgs_list=opts["imgs_list"], template=opts["template"], image_name=opts["image_name"],
                              check_images=check_images)
    if benchmark == "sugarcrepe":
        return read_sugarcrepe(_require(opts, benchmark, "root", option),
                               _require(opts, benchmark, "images", "--images"), opts["categories"],
                               check_images=check_images)

    return read_winoground(_require(opts, benchmark, "examples", option),
                           _require(opts, benchmark, "images", "--images"), ext=opts["ext"], check_images=check_images)


# ----------------------------------------------------------------------------------------------------------------
# scoring
# ----------------------------------------------------------------------------------------------------------------
def _factorize(values: Sequence) -> tuple[list, np.ndarray]:
    codes, uniques = pd.factorize(pd.Series(list(values), dtype=object), sort=False)
    return list(uniques), codes.astype(np.intp)


def pair_scores(scorer, images: Sequence, texts: Sequence[str]) -> np.ndarray:
    """``s(texts[k], images[k])`` for every k (float64). Distinct images / texts are scored once when the scorer has
    ``score_index_pairs``; otherwise ``score_pairs`` gets the aligned lists. A NaN score is an error."""
    if len(images) != len(texts):
        raise ValueError(f"{len(images)} images but {len(texts)} texts; pairs must be aligned")
    if hasattr(scorer, "score_index_pairs"):
        ui, ii = _factorize(images)
        ut, it = _factorize([str(t) for t in texts])
        out = scorer.score_index_pairs(ui, ut, ii, it)
    else:
        out = scorer.score_pairs(list(images), [str(t) for t in texts])
    out = np.asarray(out, dtype=np.float64).reshape(-1)
    if out.shape[0] != len(images):
        raise ValueError(f"the scorer returned {out.shape[0]} scores for {len(images)} pairs")
    if np.isnan(out).any():
        k = int(np.flatnonzero(np.isnan(out))[0])
        raise InputError(f"scorer {getattr(scorer, 'name', type(scorer).__name__)}: NaN score for image "
                         f"{images[k]} and caption {str(texts[k])!r}. Fix: check the model weights and precision "
                         "(fp16 overflow) and rerun")
    return out


def score_items(benchmark: str, items: pd.DataFrame, scorer) -> pd.DataFrame:
    """``items`` with score columns added: positions ``s_c_i, s_nc_i, s_c_ni, s_nc_ni`` (s(C,I), s(C′,I), s(C,I′),
    s(C′,I′)); looktwice and sugarcrepe ``s_pos, s_neg`` (image vs positive / negative caption); winoground
    ``s_c0_i0, s_c0_i1, s_c1_i0, s_c1_i1``. All pairs of a benchmark are scored in one call."""
    out = items.copy()
    if benchmark == "positions":
        specs = {"s_c_i": ("image_path", "caption"), "s_nc_i": ("image_path", "negative_caption"),
                 "s_c_ni": ("negative_image_path", "caption"), "s_nc_ni": ("negative_image_path", "negative_caption")}
    elif benchmark in ("looktwice", "sugarcrepe"):
        specs = {"s_pos": ("image_path", "caption"), "s_neg": ("image_path", "negative_caption")}
    elif benchmark == "winoground":
        specs = {f"s_c{c}_i{i}": (f"image_{i}_path", f"caption_{c}") for c in (0, 1) for i in (0, 1)}
    else:
        raise ConfigError(f"unknown benchmark {benchmark!r}. Fix: use one of {', '.join(BENCHMARKS)}")
    n = len(out)
    images = [p for img_col, _ in specs.values() for p in out[img_col].tolist()]
    texts = [t for _, txt_col in specs.values() for t in out[txt_col].tolist()]
    scores = pair_scores(scorer, images, texts)
    for k, name in enumerate(specs):
        out[name] = scores[k * n:(k + 1) * n]
    return out


def uses_choice(scorer) -> bool:
    """Whether ``scorer`` is a generative VLM scored by two-option choice (``vlm.protocol: choice``)."""
    return hasattr(scorer, "choice_table") and getattr(getattr(scorer, "settings", None), "protocol", None) == "choice"


def choice_items(benchmark: str, items: pd.DataFrame, scorer) -> pd.DataFrame:
    """``items`` with the two-option choice margins of a generative VLM (``scorer.choice_table``; margin > 0: the
    positive chosen; a tie is wrong). Positions ``m_i`` (on I: C vs C′, §4.2 "the ground truth image");
    LookTwice / SugarCrepe ``margin`` and ``s_pos`` = margin, ``s_neg`` = 0; Winoground ``m_i0`` (I0: C0 vs C1)
    and ``m_i1`` (I1: C1 vs C0). All questions of a benchmark are asked in one call."""
    out = items.copy()
    if benchmark == "winoground":
        images = out["image_0_path"].tolist() + out["image_1_path"].tolist()
        pos = out["caption_0"].astype(str).tolist() + out["caption_1"].astype(str).tolist()
        neg = out["caption_1"].astype(str).tolist() + out["caption_0"].astype(str).tolist()
    elif benchmark in ("positions", "looktwice", "sugarcrepe"):
        images = out["image_path"].tolist()
        pos, neg = out["caption"].astype(str).tolist(), out["negative_caption"].astype(str).tolist()
    else:
        raise ConfigError(f"unknown benchmark {benchmark!r}. Fix: use one of {', '.join(BENCHMARKS)}")
    margin = np.asarray(scorer.choose(images, pos, neg), dtype=np.float64).reshape(-1)
    if margin.shape[0] != len(images) or np.isnan(margin).any():
        raise InputError(f"scorer {getattr(scorer, 'name', type(scorer).__name__)}: {margin.shape[0]} choice margins "
                         f"(NaN: {int(np.isnan(margin).sum())}) for {len(images)} {benchmark} questions. Fix: check "
                         "the model weights and precision (fp16 overflow) and rerun")
    n = len(out)
    if benchmark == "winoground":
        out["m_i0"], out["m_i1"] = margin[:n], margin[n:]
    elif benchmark == "positions":
        out["m_i"] = margin
    else:
        out["margin"], out["s_pos"], out["s_neg"] = margin, margin, 0.0
    return out


def summarize_choice(benchmark: str, scored: pd.DataFrame, model: str) -> pd.DataFrame:
    """Results of :func:`choice_items`: positions ``accuracy`` per LR / AB / both (fraction of items whose positive
    is chosen); Winoground ``text_score`` (both images choose their caption) over all and per ``collapsed_tag``;
    LookTwice / SugarCrepe as :func:`summarize`."""
    if benchmark == "positions":
        rows = []
        for subset in (*POSITION_SUBSETS, "both"):
            part = scored if subset == "both" else scored[scored["subset"] == subset]
            if len(part):
                rows.append(_row(model, "positions", subset, "accuracy", float((part["m_i"] > 0).mean()), len(part)))
        return pd.DataFrame(rows, columns=RESULT_COLUMNS)
    if benchmark == "winoground":
        ok = ((scored["m_i0"] > 0) & (scored["m_i1"] > 0)).to_numpy()
        rows = [_row(model, "winoground", "all", "text_score", float(ok.mean()), len(scored))]
        if "collapsed_tag" in scored.columns:
            tags = scored["collapsed_tag"]
            for tag in dict.fromkeys(tags.dropna().astype(str)):
                mask = (tags.astype(str) == tag).to_numpy() & tags.notna().to_numpy()
                rows.append(_row(model, "winoground", f"tag:{tag}", "text_score", float(ok[mask].mean()),
                                 int(mask.sum())))
        return pd.DataFrame(rows, columns=RESULT_COLUMNS)
    return summarize(benchmark, scored, model)


def _row(model: str, benchmark: str, subset: str, metric: str, value: float, n: int) -> dict:
    return {"model": model, "benchmark": benchmark, "subset": subset, "metric": metric, "value": float(value),
            "n": int(n)}


def summarize_positions(scored: pd.DataFrame, model: str) -> list[dict]:
    """Flickr30k-Positions rows (§4.2): per subset LR, AB, both, the 2N accuracy and (ours) Winoground scores."""
    rows = []
    for subset in (*POSITION_SUBSETS, "both"):
        part = scored if subset == "both" else scored[scored["subset"] == subset]
        if part.empty:
            continue
        s = stack_pair_scores(part["s_c_i"], part["s_c_ni"], part["s_nc_i"], part["s_nc_ni"])
        rows.append(_row(model, "positions", subset, "accuracy", countercurate_position_accuracy(s), len(part)))
        for name, value in winoground_scores(s).items():
            rows.append(_row(model, "positions", subset, f"{name}_score", value, len(part)))
    return rows


def summarize_looktwice(scored: pd.DataFrame, model: str) -> list[dict]:
    """PointQA-LookTwice row (§4.3): accuracy of n over n + 1."""
    return [_row(model, "looktwice", "all", "accuracy",
                 countercurate_counting_accuracy(scored["s_pos"], scored["s_neg"]), len(scored))]


def summarize_sugarcrepe(scored: pd.DataFrame, model: str) -> list[dict]:
    """SugarCrepe rows (§4.4, app. G): per category ``accuracy``; per group and ``average`` the pooled ``accuracy``
    (Table 3) and the unweighted ``macro_accuracy`` (metrics library)."""
    cats = scored["category"].astype(str).tolist()
    lib = sugarcrepe_scores(scored["s_pos"], scored["s_neg"], cats)
    counts = scored["category"].value_counts()
    present = [c for c in SUGARCREPE_CATEGORIES if c in counts] + [c for c in dict.fromkeys(cats)
                                                                   if c not in SUGARCREPE_CATEGORIES]
    rows = [_row(model, "sugarcrepe", c, "accuracy", lib[c], counts[c]) for c in present]
    groups = {g: m for g, m in SUGARCREPE_GROUPS.items() if all(c in counts for c in m)}
    groups["average"] = tuple(present)
    macro = {"add": "avg_add", "replace": "avg_replace", "swap": "avg_swap", "average": "average"}
    for group, members in groups.items():
        part = scored[scored["category"].isin(members)]
        rows.append(_row(model, "sugarcrepe", group, "accuracy", pairwise_accuracy(part["s_pos"], part["s_neg"]),
                         len(part)))
        rows.append(_row(model, "sugarcrepe", group, "macro_accuracy", lib[macro[group]], len(part)))
    return rows


def summarize_winoground(scored: pd.DataFrame, model: str) -> list[dict]:
    """Winoground rows (app. E): text / image / group score over all examples and per ``collapsed_tag``."""
    s = stack_pair_scores(scored["s_c0_i0"], scored["s_c0_i1"], scored["s_c1_i0"], scored["s_c1_i1"])
    rows = [_row(model, "winoground", "all", f"{k}_score", v, len(scored)) for k, v in winoground_scores(s).items()]
    if "collapsed_tag" in scored.columns:
        items = winoground_item_scores(s)
        tags = scored["collapsed_tag"]
        for tag in dict.fromkeys(tags.dropna().astype(str)):
            mask = (tags.astype(str) == tag).to_numpy() & tags.notna().to_numpy()
            for k, v in items.items():
                rows.append(_row(model, "winoground", f"tag:{tag}", f"{k}_score", float(v[mask].mean()),
                                 int(mask.sum())))
    return rows


SUMMARIZERS: dict[str, Callable[[pd.DataFrame, str], list[dict]]] = {
    "positions": summarize_positions, "looktwice": summarize_looktwice, "sugarcrepe": summarize_sugarcrepe,
    "winoground": summarize_winoground}


def summarize(benchmark: str, scored: pd.DataFrame, model: str) -> pd.DataFrame:
    """The long results table (:data:`RESULT_COLUMNS`) of scored items (:func:`score_items`)."""
    if benchmark not in SUMMARIZERS:
        raise ConfigError(f"unknown benchmark {benchmark!r}. Fix: use one of {', '.join(BENCHMARKS)}")
    return pd.DataFrame(SUMMARIZERS[benchmark](scored, model), columns=RESULT_COLUMNS)


def _default_scorer_factory(cfg, role, head="itm", progress=True):
    """The role's scorer: the generative VLM (``vlm``, LLaVA class; :class:`counterfactory.studies.countercurate.vlm.
    VlmScorer`, asked to choose between two captions or, with ``vlm.protocol: likelihood``, scoring a caption by its
    log-likelihood given the image); every other role through :func:`counterfactory.scorers.scorer_from_config`."""
    if role == "vlm":
        from .vlm import scorer_from_config as vlm_scorer

        return vlm_scorer(cfg, role, progress=progress)
    from ...scorers import scorer_from_config

    return scorer_from_config(cfg, role, head=head, progress=progress)


def scoring_cfg(cfg: Mapping | None) -> Mapping | None:
    """``cfg`` with ``benchmarks.precision`` (paper config: fp32) as the precision the benchmarks and Table 5's
    retrieval are scored in (null: the config's own)."""
    if cfg is None:
        return cfg

    return with_stage_precision(cfg, fill_section("countercurate.benchmarks", cfg.get("benchmarks"))["precision"])


def evaluate(cfg: Mapping | None, role: str, benchmark: str, *, data: str | Path | None = None,
             images: str | Path | None = None, model: str | None = None, scorer=None,
             scorer_factory: Callable | None = None, head: str | None = None,
             progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Evaluate model ``role`` on ``benchmark``: ``(results, scored_items)``.

    ``scorer`` (anything with ``score_pairs``) is used when given; otherwise ``scorer_factory(cfg, role, head=...,
    progress=...)`` (default :func:`counterfactory.scorers.scorer_from_config`). ``model`` names the rows of the
    results (default ``role``). ``head`` defaults to ``benchmarks.head`` or ``itm``. The model is loaded in
    ``benchmarks.precision`` (fp32 in the paper config; null = the config's precision)."""
    if benchmark not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark {benchmark!r}. Fix: use one of {', '.join(BENCHMARKS)}")
    items = load_benchmark(cfg, benchmark, data=data, images=images)
    if scorer is None:
        cfg = scoring_cfg(cfg)   # benchmarks.precision: fp32 in the paper config (ties flip in bf16)
        head = head or fill_section("countercurate.benchmarks", (cfg or {}).get("benchmarks"))["head"]
        scorer = (scorer_factory or _default_scorer_factory)(cfg, role, head=head, progress=progress)
    if uses_choice(scorer):  # the paper's LLaVA protocol: choose between the two captions (§4.2-4.4, app. E)
        log.info("%s: asking %d %s items to choose between two captions", role, len(items), benchmark)
        scored = choice_items(benchmark, items, scorer)
        return summarize_choice(benchmark, scored, model or role), scored
    log.info("%s: scoring %d %s items", role, len(items), benchmark)
    scored = score_items(benchmark, items, scorer)
    return summarize(benchmark, scored, model or role), scored
