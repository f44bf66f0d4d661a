"""Score any model on the counterfactual benchmarks of the five studies: one leaderboard with bootstrap intervals,
paired comparisons and shortcut baselines (``counterfactory score``; docs/score.md).

A benchmark is a reader (its items, read in the official layout through the readers the studies use) and a kind:

* ``pair``: an image with a positive and a negative caption (SugarCrepe, PointQA-LookTwice); per item
  ``correct = s(image, positive) > s(image, negative)`` (a tie is wrong); metric ``accuracy``, pooled and, where the
  items have a ``category`` (SugarCrepe's seven), per category (``accuracy:<category>``).
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

* ``quad``: CounterCurate's (C, I, C′, I′) quadruples from the workflow's Flickr30k-Positions / -Counting /
  -Attributes tables: ``accuracy`` (the authors' 2N image-to-text accuracy, half a point per image) and the
  Winoground ``text`` / ``image`` / ``group`` booleans of the quadruple.
* ``set``: a set-level metric (Recall@K, MaxSkew@K, NDKL, ODmAP@k, Bias@K, AP, DEO, ΔAcc) over the benchmark's
  *units* (queries, pools or images; ``coco_cf_retrieval``: each image and each caption of the COCO-CF pairs'
  retrieval space as a query, the cells ``evaluate itr``'s COCO-CFs Recall@K). A set benchmark's ``score`` writes one row per unit with what its ``aggregate``
  needs (per-query values from the studies' own code, or per-image scores and labels); the cell is
  ``aggregate(all units)`` and its interval the percentile bootstrap of ``aggregate`` over units drawn with
  replacement (``resamples`` draws, seeded). Bias metrics are lower-is-better (shown with ↓).

Each benchmark declares the model kinds it can score (:data:`DUAL`, :data:`ITM`, :data:`GENERATIVE`); a model of
another kind gets n/a (a note), not an error. A benchmark whose data is not configured is skipped with a note.

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

from .catalogue import dataset_root
from .config import study_view
from .data.celeba import PROTECTED, load_celeba
from .data.fairface import load_fairface
from .data.releases import read_coco_counterfactuals, read_social_counterfactuals, social_shards
from .device import resolve_device
from .errors import ConfigError, input_error
from .evaluation import cf_retrieval_set, retrieval_recall
from .evaluation.settings import settings as evaluation_settings
from .io import file_sha256, write_csv, write_json, write_parquet, write_text
from .metrics import odmap_at_k, recall_at_k
from .metrics.fairness import calibrated_threshold
from .metrics.pairwise import stack_pair_scores, winoground_item_scores
from .models import registry
from .models.identity import fingerprint
from .models.registry import model_spec
from .render import escape_md, html_page, model_display_names
from .settings import config_value
from .studies.countercurate import benchmarks as cc
from .studies.countercurate.benchmarks import load_benchmark, read_positions
from .studies.social_counterfactuals import external, probing
from .studies.spurious_retrieval.evaluation import CHUNK_ELEMENTS, class_matrix, read_gallery, relevance
from .text.captions import CausalLMPerplexity

log = logging.getLogger(__name__)

PAIR, GROUP, QUAD, SET = "pair", "group", "quad", "set"
#: a pair benchmark's item column whose values get a cell each (``accuracy:<category>``: SugarCrepe's seven)
CATEGORY = "category"
METRICS = {PAIR: ("accuracy",), GROUP: ("text", "image", "group"), QUAD: ("accuracy", "text", "image", "group")}
TEXT_ONLY, BOW = "text-only (lm)", "bag of words (ceiling)"
#: model kinds: an embedding per image and per text (CLIP, OpenCLIP, VSE++, the ITC heads of BLIP / FLAVA /
#: BridgeTower), an image-text matching head (BLIP, FLAVA, BridgeTower, ViLT), a generative VLM (LLaVA)
DUAL, ITM, GENERATIVE = "dual encoder", "cross-encoder", "generative VLM"
ALL_KINDS = frozenset({DUAL, ITM, GENERATIVE})


class NotConfigured(ConfigError):
    """A benchmark whose data the configuration does not name: skipped with this note, not an error."""


@dataclass(frozen=True)
class Metric:
    """A leaderboard metric: its name, whether lower is better (bias metrics), and whether it is a share (shown
    in percent) or a raw value (MaxSkew, NDKL)."""

    name: str
    lower_is_better: bool = False
    percent: bool = True


@dataclass(frozen=True)
class SetData:
    """A set benchmark's data: ``files`` (fingerprinted: their bytes), ``settings`` (fingerprinted: what the
    metric depends on, e.g. K), ``payload`` (what its ``score`` reads) and ``n`` (its size, for the log)."""

    files: tuple
    settings: Mapping
    payload: object
    n: int


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: its kind (:data:`PAIR` / :data:`GROUP` / :data:`QUAD` / :data:`SET`), where it comes from, and
    its reader ``read(cfg, source)`` (pair items: ``image_path, caption, negative_caption``; group and quad items:
    ``image_0_path, image_1_path, caption_0, caption_1``; all with ``item_id``; a set benchmark: a :class:`SetData`).
    ``models``: the model kinds it can score. ``study``: the study whose configuration section its reader reads.
    A set benchmark adds ``score(cfg, role, data, progress) -> units`` (one row per ``unit``, column ``unit_id``),
    ``aggregate(units) -> {metric: value}`` and its ``metrics``."""

    name: str
    kind: str
    title: str
    source: str
    read: Callable[[Mapping, str | None], object]
    models: frozenset = ALL_KINDS
    study: str = "countercurate"
    metrics: tuple = ()
    unit: str = "item"
    score: Callable | None = None
    aggregate: Callable | None = None

    def metric_list(self) -> tuple:
        return self.metrics or tuple(Metric(m) for m in METRICS[self.kind])

    def metric(self, name: str) -> Metric:
        """The declared metric of ``name`` (a per-segment name ``base:segment`` takes its base's declaration)."""
        base = re.split(r"[:@]", name, maxsplit=1)[0]
        for m in self.metric_list():
            if m.name in (name, base):
                return m
        return Metric(name)


def _cc_items(benchmark: str):
    def read(cfg: Mapping, source: str | None) -> pd.DataFrame:
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
        raise NotConfigured("coco_cf needs its pairs: pass --data coco_cf=<selected_pairs.parquet of the image "
                            "stage, or the Intel/COCO-Counterfactuals release folder>")
    path = Path(source)
    if path.is_dir():
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


def _view(cfg: Mapping, study: str) -> Mapping:
    """``study``'s view of ``cfg`` (a full configuration), or ``cfg`` itself when it is already a view."""
    return study_view(cfg, study) if study in cfg else cfg


def _quad_items(dataset: str):
    """CounterCurate's Flickr30k-Positions / -Counting / -Attributes (the ``countercurate datasets`` step's
    ``datasets/<dataset>.parquet``, its test split) as quad items: image 0 = I, image 1 = the negative image I′,
    caption 0 = C, caption 1 = C′."""

    def read(cfg: Mapping, source: str | None) -> pd.DataFrame:
        if not source:
            raise NotConfigured(f"cc_{dataset} reads the countercurate study's datasets/{dataset}.parquet; pass "
                                f"--data cc_{dataset}=results/<run>/countercurate/datasets/{dataset}.parquet")
        path = Path(source)
        if dataset == "positions":
            frame = read_positions(path)
        else:
            if not path.is_file():
                raise input_error(path, None, f"Flickr30k-{dataset.capitalize()} table not found",
                                  "run the countercurate study's datasets step (or pass its table)")
            frame = pd.read_parquet(path).rename(columns={"negative_image": "negative_image_path"})
            if "negative_caption" not in frame.columns and "negative" in frame.columns:   # the attributes table
                frame = frame.rename(columns={"negative": "negative_caption"})
            missing = {"image_path", "negative_image_path", "caption", "negative_caption"} - set(frame.columns)
            if missing:
                raise input_error(path, None, f"no column(s) {', '.join(sorted(missing))}",
                                  "pass the countercurate datasets step's table")
            if "status" in frame.columns:   # an attribute edit the LLM's answer did not give is no item
                frame = frame[frame["status"].astype(str) == "accepted"]
            frame = frame[frame["negative_caption"].notna() & frame["negative_image_path"].notna()]
            if "split" in frame.columns:
                frame = frame[frame["split"].astype(str) == "test"]
            for col in ("image_path", "negative_image_path"):
                frame[col] = [str(p if Path(p).is_absolute() else (path.parent / p).resolve()) for p in frame[col]]
        frame = frame.reset_index(drop=True)
        ids = frame["item_id"].astype(str) if "item_id" in frame.columns else [f"{dataset}_{i}"
                                                                              for i in range(len(frame))]
        return pd.DataFrame({"item_id": list(ids), "caption_0": frame["caption"].astype(str).to_numpy(),
                             "caption_1": frame["negative_caption"].astype(str).to_numpy(),
                             "image_0_path": frame["image_path"].astype(str).to_numpy(),
                             "image_1_path": frame["negative_image_path"].astype(str).to_numpy()})

    return read


# ---------------------------------------------------------------------------------------------------- set benchmarks
def _mean_of_units(columns: Sequence[str], by: str | None = None):
    """``aggregate`` of per-unit values: the mean of each column over the units (NaN units skipped), and with
    ``by`` also per value of that column (``<metric>:<value>``, e.g. per SocialCF segment)."""

    def aggregate(units: pd.DataFrame) -> dict[str, float]:
        out = {}
        for c in columns:
            x = units[c].astype(float)
            out[c] = float(x.mean()) if x.notna().any() else float("nan")
            if by is not None:
                for value, part in units.groupby(by, sort=True):
                    y = part[c].astype(float)
                    out[f"{c}:{value}"] = float(y.mean()) if y.notna().any() else float("nan")
        return out

    return aggregate


def _dual_scorer(cfg: Mapping, role: str, progress: bool = False, **kw):
    """The role's contrastive (ITC) scorer: dual encoders rank a pool by one query embedding."""
    from .scorers import scorer_from_config

    return scorer_from_config(dict(cfg), role, head="itc", progress=progress, **kw)


SOCIAL = "social_counterfactuals"


def default_source(cfg: Mapping, name: str) -> str | None:
    """The data of benchmark ``name`` a full configuration names outside its study sections: SocialCF's
    published release (``social_counterfactuals.release.root``, else the catalogue's
    ``releases/social_counterfactuals`` when it holds ``data/``); None for the others."""
    if name != "socialcf":
        return None
    root = ((cfg.get(SOCIAL) or {}).get("release") or {}).get("root")
    if root:
        return str(root)
    if "data_root" not in cfg:
        return None

    folder = Path(dataset_root(dict(cfg), "releases")) / "social_counterfactuals"
    return str(folder) if (folder / "data").is_dir() else None


#: benchmark -> (study, the study's output it reads, relative to results/<run>/): the workflow's own data
STUDY_OUTPUTS = {**{b: ("coco_counterfactuals", "coco_counterfactuals/images/selected_pairs.parquet")
                    for b in ("coco_cf", "coco_cf_retrieval")},
                 **{f"cc_{d}": ("countercurate", f"countercurate/datasets/{d}.parquet")
                    for d in ("positions", "counting", "attributes")},
                 **{f"odmap_{d}": ("spurious_retrieval", f"spurious_retrieval/{d}") for d in ("coco", "flickr30k")}}
#: the sections of each study's view a benchmark's job reads (the workflow's job configuration)
STUDY_KEYS = {"countercurate": ("benchmarks",), "coco_counterfactuals": ("evaluation.itr.ks",),
              SOCIAL: ("probing", "release", "captions"),
              "cvld": ("data", "retrieval", "classification"), "spurious_retrieval": ("evaluation",)}


def data_inputs(cfg: Mapping, name: str) -> list[str]:
    """The files and folders a config-data benchmark reads (the workflow's job inputs), without reading them;
    :class:`NotConfigured` when the configuration names none or they are absent. Benchmarks of
    :data:`STUDY_OUTPUTS` read a study's output instead (the workflow supplies it)."""
    bench = BENCHMARKS[name]
    if name in STUDY_OUTPUTS:
        return []
    if name in ("sugarcrepe", "winoground", "looktwice"):
        return []   # the countercurate.benchmarks paths, checked by their reader
    view = _view(cfg, bench.study)
    if name == "socialcf":
        source = default_source(cfg, name)
        if not source:
            raise NotConfigured("socialcf: no SocialCounterfactuals release (social_counterfactuals.release.root, or "
                                "the catalogue's releases/social_counterfactuals/data)")
        paths = [str(Path(source) / "data") if Path(source).is_dir() else source]
    elif name in ("pata", "visogender"):
        if not external.configured(view, name):
            raise NotConfigured(f"{name} is not configured (social_counterfactuals.probing.{name})")
        o = external.external_settings(view, name)
        keys = ("files_list", "captions_json", "image_dir") if name == "pata" else ("oo_tsv", "op_tsv", "image_dir")
        paths = [str(o[k]) for k in keys if o.get(k)]
    else:   # cvld_fairface, cvld_celeba
        root = ((view.get("data") or {}).get(name.split("_", 1)[1]) or {}).get("root")
        if not root:
            raise NotConfigured(f"{name}: cvld.data.{name.split('_', 1)[1]}.root is not set")
        paths = [str(root)]
    absent = [p for p in paths if not Path(p).exists()]
    if absent:
        raise NotConfigured(f"{name}: {absent[0]} not found (docs/data.md)")
    return paths


def _socialcf_read(cfg: Mapping, source: str | None) -> SetData:
    """SocialCounterfactuals: the published release folder (``data/train-*.parquet``; default the study's
    ``release.root``) or a kept-images table of the study's filter step."""
    view = _view(cfg, SOCIAL)
    source = source or ((view.get("release") or {}).get("root"))
    if not source:
        raise NotConfigured("socialcf reads the Intel/SocialCounterfactuals release (social_counterfactuals.release."
                            "root, or --data socialcf=<release folder or kept-images table>)")
    path = Path(source)

    opts = probing.settings(view)
    settings = {k: opts.get(k) for k in ("k", "marginal_k", "ndkl_depth", "prefixes", "flava_embedding")}
    if path.is_dir():
        shards = social_shards(path)
        return SetData(tuple(str(p) for p in shards), settings, ("release", str(path)), len(shards))
    frame = probing.read_images_table(path)
    return SetData((str(path), *dict.fromkeys(frame["image_path"].astype(str))), settings, ("table", str(path)),
                   len(frame))


def _socialcf_score(cfg: Mapping, role: str, data: SetData, progress: bool = False) -> pd.DataFrame:
    """Per (segment, subject) pool: the study's probe (§4.1: MaxSkew@K and NDKL of the intersectional labels)."""
    import tempfile

    view = _view(cfg, SOCIAL)
    opts = probing.settings(view)
    how, where = data.payload
    with tempfile.TemporaryDirectory(prefix="score-socialcf-") as tmp:
        if how == "release":
            frame = read_social_counterfactuals(where, tmp)
            frame.to_parquet(Path(tmp) / "kept.parquet")
            frame = probing.read_images_table(Path(tmp) / "kept.parquet")
        else:
            frame = probing.read_images_table(where)
        scorer = probing._default_scorer_factory(probing.probe_config(view), role)
        rows = probing.probe_frame(frame, scorer, role, opts)
    sel = rows[(rows["attribute"] == probing.INTERSECTIONAL) & (rows["given"] == probing.ALL)
               & rows["metric"].isin(["maxskew", "ndkl"])]
    units = sel.pivot_table(index=["segment", "subject"], columns="metric", values="value", aggfunc="first")
    units = units.reset_index()
    units.insert(0, "unit_id", units["segment"].astype(str) + "/" + units["subject"].astype(str))
    return units[["unit_id", "segment", "subject", "maxskew", "ndkl"]]


def _external_read(dataset: str):
    def read(cfg: Mapping, source: str | None) -> SetData:
        view = _view(cfg, SOCIAL)
        if not external.configured(view, dataset):
            keys = "files_list, captions_json, image_dir" if dataset == "pata" else "image_dir, oo_tsv / op_tsv"
            raise NotConfigured(f"{dataset} is not configured (social_counterfactuals.probing.{dataset}: {keys}; "
                                f"the catalogue's data.{dataset})")
        o = external.external_settings(view, dataset)
        files = [o[k] for k in (("files_list", "captions_json") if dataset == "pata" else ("oo_tsv", "op_tsv"))
                 if o.get(k)]
        absent = [p for p in [*files, o["image_dir"]] if not Path(p).exists()]
        if absent:
            raise NotConfigured(f"{dataset}: {absent[0]} not found (social_counterfactuals.probing.{dataset}; the "
                                f"catalogue's data.{dataset}, docs/data.md)")
        images = external.image_paths(view, dataset)
        if not images:
            raise NotConfigured(f"{dataset}: none of its images is in {o['image_dir']}")
        settings = {k: v for k, v in o.items() if k in ("polarities", "k", "templates", "image_name")}
        return SetData(tuple(files + images), settings, o, len(images))

    return read


def _external_score(dataset: str):
    """Per query (PATA: scene x caption x attribute; VisoGender: context x occupation): MaxSkew@K and NDKL of
    the study's §5.3 evaluation (:mod:`counterfactory.studies.social_counterfactuals.external`)."""

    def score(cfg: Mapping, role: str, data: SetData, progress: bool = False) -> pd.DataFrame:
        view = _view(cfg, SOCIAL)
        run = external.evaluate_pata if dataset == "pata" else external.evaluate_visogender
        rows = run(view, [role])
        sel = rows[(rows["label"].fillna("") == "") & rows["metric"].isin(["maxskew", "ndkl"])]
        units = sel.pivot_table(index=["group", "query_set", "query", "attribute"], columns="metric",
                                values="value", aggfunc="first").reset_index()
        units.insert(0, "unit_id", units[["group", "query_set", "query", "attribute"]].astype(str).agg("/".join,
                                                                                                     axis=1))
        return units[["unit_id", "group", "query", "attribute", "maxskew", "ndkl"]]

    return score


CVLD = "cvld"


def _fairface_read(cfg: Mapping, source: str | None) -> SetData:
    """FairFace (``cvld.data.fairface``): CVLD appendix A's ten Berg et al. queries against every image."""
    view = _view(cfg, CVLD)
    ff = dict((view.get("data") or {}).get("fairface") or {})
    root = source or ff.get("root")
    if not root or not Path(root).is_dir():
        raise NotConfigured("cvld_fairface reads FairFace (cvld.data.fairface.root; the catalogue's data.fairface)"
                            + (f": {root} not found" if root else ""))
    frame = load_fairface(root, ff.get("split") or "val")
    ks = [int(k) for k in ((view.get("retrieval") or {}).get("fairface_ks") or (1000, 128))]
    return SetData(tuple(frame["image_path"].astype(str)), {"ks": ks, "split": ff.get("split")}, frame, len(frame))


def _fairface_score(cfg: Mapping, role: str, data: SetData, progress: bool = False) -> pd.DataFrame:
    """Per query: |Bias@K| and MaxSkew@K of CVLD's FairFace evaluation (:func:`counterfactory.evaluation.cvld.
    fairface_bias_table`), images ranked by the model's contrastive score."""
    from .evaluation.cvld import FAIRFACE_QUERIES, fairface_bias_table

    frame = data.payload
    scorer = _dual_scorer(cfg, role, progress)
    sim = np.asarray(scorer.score_matrix(list(frame["image_path"]), list(FAIRFACE_QUERIES)), dtype=np.float64).T
    table = fairface_bias_table(sim, list(frame["gender"]), list(FAIRFACE_QUERIES), ks=data.settings["ks"])
    table = table[table["query"] != "mean"]
    units = pd.DataFrame({"unit_id": list(FAIRFACE_QUERIES)})
    for k in data.settings["ks"]:
        part = table[table["k"] == k].set_index("query")
        units[f"bias@{k}"] = part.loc[units["unit_id"], "abs_bias"].to_numpy()
        units[f"maxskew@{k}"] = part.loc[units["unit_id"], "max_skew"].to_numpy()
    return units


def _celeba_read(cfg: Mapping, source: str | None) -> SetData:
    """CelebA (``cvld.data.celeba``): zero-shot classification of ``cvld.classification.attributes``; thresholds
    calibrated on the valid split, metrics on the test split (Ramaswamy et al.'s protocol, CVLD Table 1)."""
    view = _view(cfg, CVLD)
    root = source or ((view.get("data") or {}).get("celeba") or {}).get("root")
    if not root or not Path(root).is_dir():
        raise NotConfigured("cvld_celeba reads CelebA (cvld.data.celeba.root; the catalogue's data.celeba)"
                            + (f": {root} not found" if root else ""))
    attributes = list((view.get("classification") or {}).get("attributes") or [])
    test, val = load_celeba(root, "test"), load_celeba(root, "valid")
    files = (str(Path(root) / "list_attr_celeba.txt"), str(Path(root) / "list_eval_partition.txt"),
             *test["image_path"].astype(str), *val["image_path"].astype(str))
    return SetData(files, {"attributes": attributes}, (test, val, attributes), len(test))


def _celeba_score(cfg: Mapping, role: str, data: SetData, progress: bool = False) -> pd.DataFrame:
    """Per test image: each attribute's score ``s(positive prompt) − s(negative prompt)`` (CVLD's prompts,
    :data:`counterfactory.evaluation.cvld.DEFAULT_PROMPTS`), its label, the validation-calibrated threshold
    (:func:`counterfactory.metrics.fairness.calibrated_threshold`) and the protected attribute (``Male``)."""
    from .evaluation.cvld import DEFAULT_PROMPTS

    test, val, attributes = data.payload
    scorer = _dual_scorer(cfg, role, progress)
    texts = [t for a in attributes for t in DEFAULT_PROMPTS[a]]

    def margins(frame):
        s = np.asarray(scorer.score_matrix(list(frame["image_path"]), texts), dtype=np.float64)
        return s[:, 0::2] - s[:, 1::2]

    s_test, s_val = margins(test), margins(val)
    units = pd.DataFrame({"unit_id": test["image_id"].astype(str).to_numpy(),
                          "gender": test[PROTECTED].astype(int).to_numpy()})
    for j, a in enumerate(attributes):
        units[f"score:{a}"] = s_test[:, j]
        units[f"label:{a}"] = test[a].astype(int).to_numpy()
        units[f"threshold:{a}"] = calibrated_threshold(val[a].astype(int).to_numpy(), s_val[:, j])
    return units


def _celeba_aggregate(units: pd.DataFrame) -> dict[str, float]:
    """AP, DEO and ΔAcc of CVLD Table 1 (:func:`counterfactory.evaluation.cvld.classification_metrics`), the mean
    over the attributes, as fractions."""
    from .evaluation.cvld import classification_metrics

    attributes = [c.split(":", 1)[1] for c in units.columns if c.startswith("score:")]
    rows = []
    quiet = logging.getLogger("counterfactory.evaluation.cvld")
    level = quiet.level
    quiet.setLevel(logging.ERROR)   # a resample without a positive in a gender: NaN for that attribute
    try:
        for a in attributes:
            scores = pd.DataFrame({a: units[f"score:{a}"].to_numpy()})
            labels = pd.DataFrame({a: units[f"label:{a}"].to_numpy()})
            table = classification_metrics(scores, labels, units["gender"].to_numpy(), attributes=[a],
                                           threshold=float(units[f"threshold:{a}"].iloc[0]))
            rows.append(table.iloc[0])
    finally:
        quiet.setLevel(level)
    table = pd.DataFrame(rows)
    return {m: float(np.nanmean(table[c])) / 100 if table[c].notna().any() else float("nan")
            for m, c in (("AP", "AP"), ("DEO", "DEO"), ("ΔAcc", "ΔAcc"))}


SPURIOUS = "spurious_retrieval"


def _odmap_read(dataset: str):
    def read(cfg: Mapping, source: str | None) -> SetData:
        view = _view(cfg, SPURIOUS)
        if not source:
            raise NotConfigured(f"odmap_{dataset} reads the spurious_retrieval study's decorrelated {dataset} set; "
                                f"pass --data odmap_{dataset}=results/<run>/spurious_retrieval/{dataset}")
        folder = Path(source)
        gallery, queries = folder / "captions" / "gallery.parquet", folder / "manifests" / "queries.parquet"
        for path in (gallery, queries):
            if not path.is_file():
                raise input_error(path, None, "not found", "run the spurious_retrieval study's captions and "
                                  "manifests steps for this dataset (or pass its folder)")
        ev = view.get("evaluation") or {}
        q = pd.read_parquet(queries)
        settings = {"ks": [int(k) for k in ev.get("ks") or (1, 5, 10)],
                    "normaliser": ev.get("odmap_normaliser") or "hits_in_top_k"}
        return SetData((str(gallery), str(queries), *q["image_path"].astype(str)), settings, (gallery, queries),
                       len(q))

    return read


def _odmap_score(cfg: Mapping, role: str, data: SetData, progress: bool = False) -> pd.DataFrame:
    """Per synthetic query image: AP@k of caption retrieval (:func:`counterfactory.metrics.odmap_at_k`, the
    study's relevance rule :func:`counterfactory.studies.spurious_retrieval.evaluation.relevance`); queries with
    no correct caption in the gallery are dropped (as the study skips them)."""
    gallery_path, queries_path = data.payload
    gallery, queries = read_gallery(gallery_path), pd.read_parquet(queries_path)
    ks, normaliser = data.settings["ks"], data.settings["normaliser"]
    classes = sorted({c for col in ("removed_categories", "present_categories") for v in queries[col] for c in v}
                     | {c for v in gallery["mentions"] for c in v})
    scorer = _dual_scorer(cfg, role, progress)
    gal = np.asarray(scorer.encode_texts(gallery["caption"].astype(str).tolist()), dtype=np.float64)
    qry = np.asarray(scorer.encode_images([str(p) for p in queries["image_path"]]), dtype=np.float64)
    removed = class_matrix(queries["removed_categories"], classes)
    present = class_matrix(queries["present_categories"], classes)
    mentions = class_matrix(gallery["mentions"], classes)
    per = {k: np.full(len(qry), np.nan) for k in ks}
    step = max(1, CHUNK_ELEMENTS // max(len(gal), 1))
    for lo in range(0, len(qry), step):
        hi = min(len(qry), lo + step)
        rel = relevance(removed[lo:hi], present[lo:hi], mentions)
        if not rel.any():
            continue
        sim = qry[lo:hi] @ gal.T
        for k in ks:
            per[k][lo:hi] = odmap_at_k(sim, rel, min(k, len(gal)), percent=False, return_per_query=True,
                                       normaliser=normaliser)[1]
    ids = queries["item_id"].astype(str) if "item_id" in queries.columns else pd.Series(range(len(qry))).astype(str)
    units = pd.DataFrame({"unit_id": ids.to_numpy(), **{f"odmap@{k}": per[k] for k in ks}})
    return units[~np.isnan(per[ks[0]])].reset_index(drop=True)


COCO = "coco_counterfactuals"
RECALL_DIRECTIONS = ("image_to_text", "text_to_image")


def _cf_retrieval_read(cfg: Mapping, source: str | None) -> SetData:
    """COCO-Counterfactuals' retrieval space (§4.2.1, ``counterfactory evaluate itr``'s COCO-CFs set,
    :func:`counterfactory.evaluation.cf_retrieval_set`): every image of the pairs (2N) against every caption (2N),
    caption ``k`` of a pair belonging to image ``k``; the pairs as :func:`_coco_cf_items` reads them. K: the study's
    ``coco_counterfactuals.evaluation.itr.ks`` (the paper's Recall@1/5/10). Fingerprinted: the image bytes, K and
    the captions in order."""
    if not source:
        raise NotConfigured("coco_cf_retrieval needs the pairs: pass --data coco_cf_retrieval=<selected_pairs.parquet "
                            "of the image stage, or the Intel/COCO-Counterfactuals release folder>")
    items = _coco_cf_items(cfg, source)
    pairs = pd.DataFrame({"id": items["item_id"], "caption_0": items["caption_0"], "caption_1": items["caption_1"],
                          "image_0": items["image_0_path"], "image_1": items["image_1_path"]})
    rset = cf_retrieval_set(pairs)
    ks = [int(k) for k in evaluation_settings(dict(_view(cfg, COCO)))["itr"]["ks"]]
    captions = hashlib.sha256(json.dumps(rset.texts).encode()).hexdigest()[:16]
    keys = [f"{i}_{side}" for side in (0, 1) for i in items["item_id"]]   # rset's order: all image_0, then image_1
    return SetData(tuple(rset.images), {"ks": ks, "captions": captions}, (rset, keys), len(rset.images))


class _CachedMatrix:
    """A scorer whose ``score_matrix`` is computed once (the per-query hits and :func:`retrieval_recall` read the
    same matrix)."""

    def __init__(self, scorer):
        self._scorer, self._matrix = scorer, None

    def __getattr__(self, name):
        return getattr(self._scorer, name)

    def score_matrix(self, images, texts):
        if self._matrix is None:
            self._matrix = np.asarray(self._scorer.score_matrix(images, texts))
        return self._matrix


def _cf_retrieval_score(cfg: Mapping, role: str, data: SetData, progress: bool = False) -> pd.DataFrame:
    """Per query (each of the 2N images, each of the 2N captions): its hit at every K, 0 or 1, by
    :func:`counterfactory.metrics.recall_at_k` on that query's row or column of the model's contrastive score
    matrix (every candidate of the space, as :func:`counterfactory.evaluation.retrieval_recall` ranks them; a tie
    counts for the positive). The units' means are checked against :func:`retrieval_recall` on the same matrix,
    so the cells are ``evaluate itr``'s COCO-CFs Recall@K (in fractions)."""
    rset, keys = data.payload
    ks = data.settings["ks"]
    scorer = _CachedMatrix(_dual_scorer(cfg, role, progress))
    whole = retrieval_recall(scorer, rset, ks)
    sim = scorer.score_matrix(rset.images, rset.texts)
    owner = rset.text_image
    if not np.array_equal(owner, np.arange(len(rset.images))):
        raise ValueError("coco_cf_retrieval: a retrieval space of one caption per image was expected")
    rows = []
    for i, key in enumerate(keys):   # image i's caption is caption i: its row ranked as a one-query text_to_image
        hit = recall_at_k(sim[i:i + 1].T, np.zeros(1, dtype=np.int64) + i, ks)
        rows.append({"unit_id": f"image:{key}", "direction": "image_to_text",
                     **{f"image_to_text@{k}": hit[f"text_to_image@{k}"] / 100 for k in ks},
                     **{f"text_to_image@{k}": np.nan for k in ks}, TIED: _tied(sim[i], i)})
    for j, key in enumerate(keys):
        hit = recall_at_k(sim[:, j:j + 1], owner[j:j + 1], ks)
        rows.append({"unit_id": f"text:{key}", "direction": "text_to_image",
                     **{f"image_to_text@{k}": np.nan for k in ks},
                     **{f"text_to_image@{k}": hit[f"text_to_image@{k}"] / 100 for k in ks},
                     TIED: _tied(sim[:, j], int(owner[j]))})
    units = pd.DataFrame(rows)
    got = _cf_retrieval_aggregate(units)
    for name, value in whole.items():
        if not np.isclose(100 * got[name], value, rtol=0, atol=1e-9):
            raise RuntimeError(f"coco_cf_retrieval: per-query {name} {100 * got[name]} != retrieval_recall's {value}")
    return units


#: per-unit column of a ranked set benchmark: the positive's score equals another candidate's exactly, so the tie
#: rule (recall_at_k: a tie counts for the positive) and not the model decides that query
TIED = "tied"


def _tied(scores: np.ndarray, positive: int) -> bool:
    others = np.delete(np.asarray(scores), positive)
    return bool((others == scores[positive]).any())


def tie_notes(scored: Sequence[tuple[str, str, pd.DataFrame]]) -> list[str]:
    """A note per (model, benchmark) whose per-unit outcomes have queries decided by an exact tie (a model that
    scores every candidate alike, e.g. a collapsed or random encoder, would otherwise read as perfect)."""
    notes = []
    for label, name, outcomes in scored:
        if TIED in outcomes.columns and outcomes[TIED].astype(bool).any():
            n = int(outcomes[TIED].astype(bool).sum())
            notes.append(f"{label} on {name}: {n} of {len(outcomes)} queries have their positive tied exactly with "
                         "another candidate; a tie counts for the positive (recall_at_k's rule), so those hits say "
                         "nothing of the model")
    return notes


def _cf_retrieval_aggregate(units: pd.DataFrame) -> dict[str, float]:
    """Recall@K per direction: the share of that direction's queries that hit (NaN: a draw without one)."""
    return _mean_of_units([c for c in units.columns if c.startswith(RECALL_DIRECTIONS)])(units)


def _odmap_aggregate(units: pd.DataFrame) -> dict[str, float]:
    return _mean_of_units([c for c in units.columns if c.startswith("odmap@")])(units)


def _fairface_aggregate(units: pd.DataFrame) -> dict[str, float]:
    return _mean_of_units([c for c in units.columns if c.startswith(("bias@", "maxskew@"))])(units)


SKEW = (Metric("maxskew", lower_is_better=True, percent=False), Metric("ndkl", lower_is_better=True, percent=False))


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in [
    Benchmark("coco_cf", GROUP, "COCO-Counterfactuals pairs", "Le et al. 2023 (Intel/COCO-Counterfactuals)",
              _coco_cf_items),
    Benchmark("coco_cf_retrieval", SET, "COCO-Counterfactuals pairs' retrieval space", "Le et al. 2023 "
              "(Intel/COCO-Counterfactuals), §4.2.1", _cf_retrieval_read, frozenset({DUAL}), COCO,
              tuple(Metric(d) for d in RECALL_DIRECTIONS), "query (image or caption)", _cf_retrieval_score,
              _cf_retrieval_aggregate),
    Benchmark("sugarcrepe", PAIR, "SugarCrepe", "Hsieh et al. 2023 (RAIVNLab/sugar-crepe)", _cc_items("sugarcrepe")),
    Benchmark("winoground", GROUP, "Winoground", "Thrush et al. 2022 (facebook/winoground)", _cc_items("winoground")),
    Benchmark("looktwice", PAIR, "PointQA-LookTwice", "Mani et al. 2020", _cc_items("looktwice")),
    *[Benchmark(f"cc_{d}", QUAD, f"Flickr30k-{d.capitalize()}", "Zhang et al. 2024 (CounterCurate), the workflow's "
                f"countercurate datasets/{d}.parquet", _quad_items(d)) for d in ("positions", "counting", "attributes")],
    Benchmark("socialcf", SET, "SocialCounterfactuals", "Howard et al. 2024 (Intel/SocialCounterfactuals)",
              _socialcf_read, frozenset({DUAL}), SOCIAL, SKEW, "pool (segment x occupation)", _socialcf_score,
              _mean_of_units(["maxskew", "ndkl"], by="segment")),
    Benchmark("pata", SET, "PATA", "Seth et al. 2023 (DeAR)", _external_read("pata"), frozenset({DUAL}), SOCIAL,
              SKEW, "query (scene x caption x attribute)", _external_score("pata"),
              _mean_of_units(["maxskew", "ndkl"])),
    Benchmark("visogender", SET, "VisoGender", "Hall et al. 2023 (oxai/visogender)", _external_read("visogender"),
              frozenset({DUAL}), SOCIAL, SKEW, "query (context x occupation)", _external_score("visogender"),
              _mean_of_units(["maxskew", "ndkl"])),
    Benchmark("cvld_fairface", SET, "FairFace retrieval bias (CVLD)", "Kärkkäinen & Joo 2021; queries of Berg et "
              "al. 2022", _fairface_read, frozenset({DUAL}), CVLD,
              (Metric("bias", lower_is_better=True, percent=False),
               Metric("maxskew", lower_is_better=True, percent=False)), "query", _fairface_score, _fairface_aggregate),
    Benchmark("cvld_celeba", SET, "CelebA attribute classification (CVLD)", "Liu et al. 2015; Ramaswamy et al. 2021's "
              "protocol", _celeba_read, frozenset({DUAL}), CVLD,
              (Metric("AP"), Metric("DEO", lower_is_better=True), Metric("ΔAcc", lower_is_better=True)), "image",
              _celeba_score, _celeba_aggregate),
    *[Benchmark(f"odmap_{d}", SET, f"ODmAP@k, decorrelated {name}", "Kim et al. 2023, the workflow's "
                f"spurious_retrieval {d} set", _odmap_read(d), frozenset({DUAL}), SPURIOUS, (Metric("odmap"),),
                "query image", _odmap_score, _odmap_aggregate) for d, name in (("coco", "MS-COCO"),
                                                                                ("flickr30k", "Flickr30k"))],
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


#: ``model_type`` (or the open_clip / vsepp library) -> the kinds of scoring the model offers
KINDS_OF_MODEL_TYPE = {"clip": frozenset({DUAL}), "open_clip": frozenset({DUAL}), "vsepp": frozenset({DUAL}),
                       "blip": frozenset({DUAL, ITM}), "flava": frozenset({DUAL, ITM}),
                       "bridgetower": frozenset({DUAL, ITM}), "vilt": frozenset({ITM}),
                       "llava": frozenset({GENERATIVE})}
_ROLE_PREFIX_TYPE = (("vlm", "llava"), ("itm_blip", "blip"), ("itm_flava", "flava"), ("itm_vilt", "vilt"),
                     ("itm_bridgetower", "bridgetower"), ("itm", "bridgetower"), ("vsepp", "vsepp"), ("clip", "clip"))


def model_kinds(cfg: Mapping, role: str) -> frozenset:
    """The kinds of scoring ``role``'s model offers (:data:`DUAL`, :data:`ITM`, :data:`GENERATIVE`), from its
    library, its folder's ``config.json`` ``model_type``, else its role name (a hub CLIP id: a dual encoder)."""
    spec = model_spec(dict(cfg), role)
    if spec.library in KINDS_OF_MODEL_TYPE:
        return KINDS_OF_MODEL_TYPE[spec.library]
    config = spec.local_path / "config.json" if spec.is_local else None
    if config is not None and config.is_file():
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        if model_type in KINDS_OF_MODEL_TYPE:
            return KINDS_OF_MODEL_TYPE[model_type]
    for prefix, model_type in _ROLE_PREFIX_TYPE:
        if role.startswith(prefix):
            return KINDS_OF_MODEL_TYPE[model_type]
    return KINDS_OF_MODEL_TYPE["clip"]


def not_scorable(cfg: Mapping, role: str, name: str) -> str | None:
    """Why ``role`` cannot be scored on benchmark ``name`` (its model kinds are not the benchmark's), else None."""
    bench = BENCHMARKS[name]
    kinds = model_kinds(cfg, role)
    if kinds & bench.models:
        return None
    return (f"n/a: {name} scores {' / '.join(sorted(bench.models))} models; {role} is a "
            f"{' / '.join(sorted(kinds))}")


# ---------------------------------------------------------------------------------------------------- outcomes
def item_outcomes(kind: str, scored: pd.DataFrame) -> pd.DataFrame:
    """Per-item booleans of scored items (``score_items`` / ``choice_items`` columns): ``item_id`` + the metrics of
    ``kind``."""
    out = pd.DataFrame({"item_id": scored["item_id"].astype(str).to_numpy()})
    if kind == PAIR:
        if "margin" in scored.columns:
            out["accuracy"] = scored["margin"].to_numpy() > 0
        else:
            out["accuracy"] = scored["s_pos"].to_numpy() > scored["s_neg"].to_numpy()
        if CATEGORY in scored.columns:   # SugarCrepe: a cell per category too
            out[CATEGORY] = scored[CATEGORY].astype(str).to_numpy()
        return out
    if "m_i0" in scored.columns:   # a generative VLM choosing a caption per image: text score only
        if kind == QUAD:
            out["accuracy"] = ((scored["m_i0"].to_numpy() > 0).astype(float)
                               + (scored["m_i1"].to_numpy() > 0).astype(float)) / 2
        out["text"] = (scored["m_i0"].to_numpy() > 0) & (scored["m_i1"].to_numpy() > 0)
        out["image"] = np.nan
        out["group"] = np.nan
        return out
    if kind == QUAD:   # CounterCurate: s(C, I) > s(C', I) and s(C', I') > s(C, I'), half a point each
        out["accuracy"] = ((scored["s_c0_i0"].to_numpy() > scored["s_c1_i0"].to_numpy()).astype(float)
                           + (scored["s_c1_i1"].to_numpy() > scored["s_c0_i1"].to_numpy()).astype(float)) / 2
    s = stack_pair_scores(scored["s_c0_i0"], scored["s_c0_i1"], scored["s_c1_i0"], scored["s_c1_i1"])
    for name, values in winoground_item_scores(s).items():
        out[name] = values
    return out


def set_bootstrap(units: pd.DataFrame, aggregate: Callable[[pd.DataFrame], Mapping[str, float]], *, resamples: int,
                  seed: int, level: float = 0.95) -> dict[str, tuple[float, float, float]]:
    """``{metric: (value, ci_low, ci_high)}`` of a set-level metric: ``aggregate`` of every unit, and the
    percentile interval of ``aggregate`` recomputed on ``resamples`` draws of the units with replacement (seeded;
    a draw where a metric is undefined, e.g. a segment drawn no unit, is left out of that metric's interval)."""
    point = dict(aggregate(units))
    n = len(units)
    if n == 0:
        return {}
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {m: [] for m in point}
    for _ in range(resamples):
        one = aggregate(units.iloc[rng.integers(0, n, size=n)].reset_index(drop=True))
        for m in point:
            draws[m].append(float(one.get(m, np.nan)))
    out = {}
    for m, v in point.items():
        x = np.asarray(draws[m], dtype=np.float64)
        x = x[~np.isnan(x)]
        if np.isnan(v):
            continue
        lo, hi = np.quantile(x, [(1 - level) / 2, 1 - (1 - level) / 2]) if len(x) else (np.nan, np.nan)
        out[m] = (float(v), float(lo), float(hi))
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


def compare_sets(a: pd.DataFrame, b: pd.DataFrame, aggregate: Callable[[pd.DataFrame], Mapping[str, float]], *,
                 resamples: int, seed: int, level: float = 0.95) -> dict:
    """Paired bootstrap of a set-level metric that is not a mean over units (CelebA's AP, DEO, ΔAcc): each draw
    resamples the units both models hold (by ``unit_id``, the same draw for both) and recomputes ``aggregate`` on
    each model's drawn units; per metric the difference, its interval and the two-sided p-value of :func:`compare`
    (draws where a metric is undefined for either model are left out)."""
    ids = sorted(set(a["unit_id"].astype(str)) & set(b["unit_id"].astype(str)))
    if not ids:
        raise ConfigError("compare: the two outcome files share no unit. Fix: compare two models on the same data")
    a = a.assign(unit_id=a["unit_id"].astype(str)).set_index("unit_id").loc[ids].reset_index()
    b = b.assign(unit_id=b["unit_id"].astype(str)).set_index("unit_id").loc[ids].reset_index()
    point_a, point_b = dict(aggregate(a)), dict(aggregate(b))
    names = [m for m in point_a if m in point_b]
    rng = np.random.default_rng(seed)
    diffs: dict[str, list[float]] = {m: [] for m in names}
    for _ in range(resamples):
        draw = rng.integers(0, len(ids), size=len(ids))
        da, db = aggregate(a.iloc[draw].reset_index(drop=True)), aggregate(b.iloc[draw].reset_index(drop=True))
        for m in names:
            diffs[m].append(float(da.get(m, np.nan)) - float(db.get(m, np.nan)))
    out = {}
    for m in names:
        d = np.asarray(diffs[m])
        d = d[np.isfinite(d)]
        if not len(d):
            continue
        lo, hi = np.quantile(d, [(1 - level) / 2, 1 - (1 - level) / 2])
        p = min(1.0, 2 * min(float(np.mean(d <= 0)), float(np.mean(d >= 0))))
        out[m] = {"difference": float(point_a[m] - point_b[m]), "ci_low": float(lo), "ci_high": float(hi),
                  "p_value": p, "n": len(ids), "test": "paired bootstrap over units (metric recomputed per draw)"}
    return out


# ---------------------------------------------------------------------------------------------------- baselines
_WORD = re.compile(r"[a-z0-9']+")


def bag_of_words_inseparable(a: str, b: str) -> bool:
    """Whether the two captions are the same multiset of words (case and punctuation ignored)."""
    return sorted(_WORD.findall(a.lower())) == sorted(_WORD.findall(b.lower()))


def _pair_captions(kind: str, items: pd.DataFrame) -> tuple[list[str], list[str]]:
    if kind == SET:
        raise ValueError("a set benchmark has no caption pairs")
    if kind == PAIR:
        return items["caption"].astype(str).tolist(), items["negative_caption"].astype(str).tolist()
    return items["caption_0"].astype(str).tolist(), items["caption_1"].astype(str).tolist()


def bow_outcomes(kind: str, items: pd.DataFrame) -> pd.DataFrame:
    """Per item: 1 when a bag-of-words model *could* separate the two captions, for every metric of the kind (a
    model that cannot tell the captions apart cannot get the item right under any of them)."""
    a, b = _pair_captions(kind, items)
    separable = [not bag_of_words_inseparable(x, y) for x, y in zip(a, b)]
    return _with_category(items, pd.DataFrame({"item_id": items["item_id"].astype(str).to_numpy(),
                                               **{m: separable for m in METRICS[kind]}}))


def _with_category(items: pd.DataFrame, outcomes: pd.DataFrame) -> pd.DataFrame:
    if CATEGORY in items.columns:
        outcomes[CATEGORY] = items[CATEGORY].astype(str).to_numpy()
    return outcomes


def text_only_outcomes(items: pd.DataFrame, perplexity: Callable[[list[str]], np.ndarray]) -> pd.DataFrame:
    """Pair items answered without the image: the positive wins when the language model finds it more likely
    (strictly lower perplexity)."""
    pos, neg = _pair_captions(PAIR, items)
    ppl = np.asarray(perplexity(pos + neg), dtype=np.float64)
    n = len(pos)
    return _with_category(items, pd.DataFrame({"item_id": items["item_id"].astype(str).to_numpy(),
                                               "accuracy": ppl[:n] < ppl[n:]}))


def lm_perplexity(cfg: Mapping, role: str = "lm", batch_size: int = 16, device: str | None = None):
    """The ``lm`` role as a perplexity function (BOS prepended: the first word is scored too)."""
    import torch

    dev = resolve_device(device or config_value(cfg, "device"))
    model, tokenizer = registry.load(dict(cfg), role)
    scorer = CausalLMPerplexity(model.eval(), tokenizer, device=dev, prepend_bos=True)

    def perplexity(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            return np.concatenate([scorer.perplexity(texts[i:i + batch_size])
                                   for i in range(0, len(texts), batch_size)]) if texts else np.zeros(0)

    return perplexity


# ---------------------------------------------------------------------------------------------------- caching
def data_fingerprint(kind: str, items) -> str:
    """Content digest of a benchmark's items: the captions, and the bytes of every image (not their names); of a
    set benchmark's :class:`SetData`: the bytes of its files and its settings."""
    h = hashlib.sha256()
    if kind == SET:
        h.update(json.dumps(dict(items.settings), sort_keys=True, default=str).encode())
        for path in items.files:
            try:
                h.update(b"\0" + file_sha256(path).encode())
            except OSError as exc:
                raise input_error(path, None, f"benchmark file unreadable ({exc.strerror or exc})",
                                  "fix the benchmark's data folder (docs/data.md)") from None
        return h.hexdigest()[:16]
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
    spec = model_spec(dict(cfg), role)
    if spec.is_local:
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
    if benchmark.kind == SET:
        return benchmark.score(cfg, role, items, progress)
    cc_name = "sugarcrepe" if benchmark.kind == PAIR else "winoground"   # the item layout score_items reads
    if scorer is None:
        scorer = cc._default_scorer_factory(dict(cfg), role, head=head, progress=progress)
    scored = cc.choice_items(cc_name, items, scorer) if cc.uses_choice(scorer) else cc.score_items(cc_name, items,
                                                                                                     scorer)
    return item_outcomes(benchmark.kind, scored)


SETTINGS_VERSION = 2   # 2: pair outcomes keep the item's category (SugarCrepe's per-category cells)


def read_items(cfg: Mapping, name: str, source: str | None = None):
    """The items of benchmark ``name`` (``source``: its data where the config does not say); a set benchmark's
    :class:`SetData`. A benchmark whose data is not configured raises :class:`NotConfigured`."""
    if name not in BENCHMARKS:
        raise ConfigError(f"score: unknown benchmark {name!r}. Fix: use {', '.join(BENCHMARKS)} or all")
    items = BENCHMARKS[name].read(cfg, source)
    if (items.n == 0) if isinstance(items, SetData) else items.empty:
        raise input_error(source or name, None, "the benchmark has no items", "check its data")
    return items


def empty_outcomes(note: str) -> pd.DataFrame:
    """The outcome file of a model a benchmark cannot score (its kind is not the benchmark's): one row, the
    reason in ``na_note``; the leaderboard reads n/a there."""
    return pd.DataFrame({"na_note": [note]})


def outcome_note(outcomes: pd.DataFrame) -> str | None:
    """The n/a reason of an outcome file written by :func:`empty_outcomes`, else None."""
    return str(outcomes["na_note"].iloc[0]) if "na_note" in outcomes.columns and len(outcomes) else None


def outcomes_of(ref: ModelRef, name: str, items: pd.DataFrame, out: Path, *, head: str = "itm",
                progress: bool = False) -> tuple[str, pd.DataFrame]:
    """``(cache key, per-item outcomes)`` of one model on one benchmark, read from ``out/items/<name>/<key>.parquet``
    when that model, data and settings were scored before, else scored and cached there."""
    bench = BENCHMARKS[name]
    key = cache_key(model_fingerprint(ref.cfg, ref.role), data_fingerprint(bench.kind, items),
                    {"head": "itc" if bench.kind == SET else head, "version": SETTINGS_VERSION})
    path = Path(out) / "items" / name / f"{key}.parquet"
    if path.exists():
        log.info("%s on %s: cached (%s)", ref.label, name, path.name)
        return key, pd.read_parquet(path)
    log.info("%s on %s: scoring %d items", ref.label, name, items.n if isinstance(items, SetData) else len(items))
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
        if bench.kind == SET:   # no caption pairs: no shortcut rows
            continue
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
    out = Path(out_dir)
    sources = dict(sources or {})
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        raise ConfigError(f"score: unknown benchmark(s) {', '.join(unknown)}. Fix: use {', '.join(BENCHMARKS)} or all")
    items, notes = {}, []
    for name in benchmarks:
        try:
            items[name] = read_items(cfg, name, sources.get(name))
        except NotConfigured as exc:
            log.warning("score: %s skipped (%s)", name, exc)
            notes.append(f"{name}: skipped, {exc}")
    scored, keys = [], []
    for name in items:
        for ref in models:
            why = not_scorable(ref.cfg, ref.role, name)
            if why:
                notes.append(f"{ref.label} on {name}: {why}")
                continue
            key, outcomes = outcomes_of(ref, name, items[name], out, head=head, progress=progress)
            keys.append({"model": ref.label, "benchmark": name, "key": key})
            scored.append((ref.label, name, outcomes))
    table = cells(cfg, scored, items, resamples=resamples, seed=seed, level=level, baselines=baselines)
    table = with_na_rows(table, [ref.label for ref in models], list(items))
    notes += tie_notes(scored)
    write_leaderboard(table, out, resamples=resamples, seed=seed, level=level, notes=notes)
    write_csv(out / "cache_keys.csv", pd.DataFrame(keys, columns=["model", "benchmark", "key"]))
    return table


def run_items(cfg: Mapping, paths: Sequence[str | Path], out_dir: str | Path, *,
              sources: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
              notes: Sequence[str] = ()) -> tuple[pd.DataFrame, list]:
    """``counterfactory score leaderboard``: the leaderboard of the workflow's per-item outcome files (``paths``,
    laid out as ``<dir>/items/<benchmark>/<role>.parquet`` by ``score item``), with the config's ``score.resamples``
    / ``seed`` / ``level`` / ``baselines``, written to ``out_dir`` (``leaderboard.{csv,json,md,html}``). A role is
    named by ``labels`` (role -> name), else its ``display_name``; an n/a outcome file becomes a note after
    ``notes``; the shortcut rows read each benchmark's items (``sources``: benchmark -> data instead of the
    config's). Returns the long table and the scored ``(label, benchmark, outcomes)``."""
    sc = cfg["score"]
    labels, sources = dict(labels or {}), dict(sources or {})
    scored, names, notes, models = [], [], list(notes), []
    for path in map(Path, paths):
        name, role = path.parent.name, path.stem
        if name not in BENCHMARKS:
            raise input_error(path, None, f"{name!r} is not a benchmark",
                              "pass files laid out as <dir>/items/<benchmark>/<role>.parquet")
        label = labels.get(role) or model_display_names(cfg.get("models") or {}, [role]).get(role, role)
        outcomes = pd.read_parquet(path)
        models.append(label)
        names.append(name)
        note = outcome_note(outcomes)
        if note:
            notes.append(f"{label} on {name}: {note}")
            continue
        scored.append((label, name, outcomes))
    names = list(dict.fromkeys(names))
    shortcut = [n for n in names if BENCHMARKS[n].kind != SET]
    items = {n: read_items(cfg, n, sources.get(n)) for n in shortcut} if sc["baselines"] else {}
    table = cells(cfg, scored, items, resamples=sc["resamples"], seed=sc["seed"], level=sc["level"],
                  baselines=sc["baselines"])
    table = with_na_rows(table, list(dict.fromkeys(models)), names)
    write_leaderboard(table, Path(out_dir), resamples=sc["resamples"], seed=sc["seed"], level=sc["level"],
                      notes=notes + tie_notes(scored))
    return table, scored


LONG_COLUMNS = ["model", "kind", "benchmark", "metric", "value", "ci_low", "ci_high", "n", "direction", "unit"]


def with_na_rows(table: pd.DataFrame, models: Sequence[str], benchmarks: Sequence[str]) -> pd.DataFrame:
    """``table`` plus an all-NaN row for every model that has no cell on a benchmark others were scored on (so the
    wide table reads n/a there)."""
    rows = []
    for name in benchmarks:
        metrics = table.loc[(table["benchmark"] == name), "metric"].unique().tolist()
        if not metrics:
            metrics = [BENCHMARKS[name].metric_list()[0].name]
        have = set(table.loc[table["benchmark"] == name, "model"])
        for model in models:
            if model not in have:
                rows += [{"model": model, "kind": "model", "benchmark": name, "metric": m, "value": np.nan,
                          "ci_low": np.nan, "ci_high": np.nan, "n": 0, "direction": _direction(name, m),
                          "unit": BENCHMARKS[name].unit} for m in metrics]
    return pd.concat([table, pd.DataFrame(rows, columns=LONG_COLUMNS)], ignore_index=True) if rows else table


def _direction(name: str, metric: str) -> str:
    return "lower" if BENCHMARKS[name].metric(metric).lower_is_better else "higher"


def _cells(model: str, kind: str, bench: Benchmark, outcomes: pd.DataFrame, resamples: int, seed: int,
           level: float) -> list[dict]:
    rows = []
    if outcome_note(outcomes) is not None:
        return rows
    if bench.kind == SET:
        for metric, (v, lo, hi) in set_bootstrap(outcomes, bench.aggregate, resamples=resamples, seed=seed,
                                                 level=level).items():
            rows.append({"model": model, "kind": kind, "benchmark": bench.name, "metric": metric, "value": v,
                         "ci_low": lo, "ci_high": hi, "n": len(outcomes), "direction": _direction(bench.name, metric),
                         "unit": bench.unit})
        return rows
    parts = [("", outcomes)]
    if bench.kind == PAIR and CATEGORY in outcomes.columns:   # the pooled cell, then one per category
        parts += [(f":{c}", outcomes[outcomes[CATEGORY].astype(str) == c])
                  for c in dict.fromkeys(outcomes[CATEGORY].astype(str))]
    for suffix, part in parts:
        for metric in METRICS[bench.kind]:
            if metric not in part.columns or part[metric].isna().all():
                continue
            x = part[metric].astype(float).to_numpy()
            lo, hi = bootstrap_ci(x, resamples=resamples, seed=seed, level=level)
            rows.append({"model": model, "kind": kind, "benchmark": bench.name, "metric": metric + suffix,
                         "value": float(x.mean()), "ci_low": lo, "ci_high": hi, "n": len(x), "direction": "higher",
                         "unit": bench.unit})
    return rows


def compare_cached(out_dir: str | Path, benchmark: str, key_a: str, key_b: str, *, resamples: int = 1000,
                   seed: int = 0) -> dict:
    """:func:`compare` of two cached outcome files of one benchmark, per metric, on the items both hold."""
    folder = Path(out_dir) / "items" / benchmark
    a, b = (pd.read_parquet(folder / f"{k}.parquet") for k in (key_a, key_b))
    both = a.merge(b, on="item_id", suffixes=("_a", "_b")) if "item_id" in a.columns else None
    bench = BENCHMARKS[benchmark]
    if bench.kind == SET:
        if bench.name == "cvld_celeba":   # AP, DEO, ΔAcc are not means over images: recompute them per draw
            return compare_sets(a, b, bench.aggregate, resamples=resamples, seed=seed)
        names = [c for c in a.columns if c not in ("unit_id", "item_id") and pd.api.types.is_float_dtype(a[c])]
        both = a.merge(b, on="unit_id", suffixes=("_a", "_b"))
    else:
        names = list(METRICS[bench.kind])
    out = {}
    for m in names:   # the units where both have the metric (coco_cf_retrieval: one direction per unit)
        if f"{m}_a" not in both:
            continue
        pair = both[[f"{m}_a", f"{m}_b"]].astype(float).dropna()
        if len(pair):
            out[m] = compare(pair[f"{m}_a"], pair[f"{m}_b"], resamples=resamples, seed=seed)
    return out


# ---------------------------------------------------------------------------------------------------- output
def wide(table: pd.DataFrame) -> pd.DataFrame:
    """Model rows x ``benchmark/metric`` columns of ``value [ci_low, ci_high]`` (percent), models first, then the
    shortcut rows; a benchmark a model was not scored on reads n/a."""
    def cell(name, metric, v, lo, hi):
        if pd.isna(v):
            return None
        if BENCHMARKS[name].metric(metric).percent:
            return f"{100 * v:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"
        return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"

    arrow = ["" if BENCHMARKS[b].metric(m).lower_is_better is False else " ↓"
             for b, m in zip(table["benchmark"], table["metric"])]
    cells = table.assign(column=table["benchmark"] + "/" + table["metric"] + arrow,
                         cell=[cell(*r) for r in zip(table["benchmark"], table["metric"], table["value"],
                                                     table["ci_low"], table["ci_high"])])
    order = list(dict.fromkeys(cells["column"]))
    models = list(dict.fromkeys(cells.loc[cells["kind"] == "model", "model"]))
    shortcuts = list(dict.fromkeys(cells.loc[cells["kind"] == "shortcut", "model"]))
    out = cells.dropna(subset=["cell"]).pivot_table(index="model", columns="column", values="cell",
                                                     aggfunc="first")
    return out.reindex(index=models + shortcuts, columns=order).astype(object).fillna("n/a")


def write_leaderboard(table: pd.DataFrame, out_dir: Path, *, resamples: int, seed: int, level: float,
                      notes: Sequence[str] = ()) -> None:
    out_dir = Path(out_dir)
    write_csv(out_dir / "leaderboard.csv", table)
    w = wide(table)
    note = (f"Percent (MaxSkew, NDKL, Bias@K: raw values), with the {round(level * 100)} % percentile bootstrap "
            f"interval over items, or over the benchmark's units for a set-level metric (docs/score.md; "
            f"{resamples} resamples, seed {seed}). ↓: lower is better (bias metrics); otherwise higher is better. "
            f"`{BOW}`: the share of items whose two captions are not the same multiset of "
            f"words; `{TEXT_ONLY}`: the caption the lm role finds more likely, without the image.")
    header = "| model | " + " | ".join(escape_md(c) for c in w.columns) + " |"
    lines = ["# Leaderboard", "", note, "", header, "|" + " --- |" * (len(w.columns) + 1)]
    lines += ["| " + escape_md(str(m)) + " | " + " | ".join(w.loc[m]) + " |" for m in w.index]
    if notes:
        lines += ["", "Notes:", ""] + [f"* {escape_md(n)}" for n in notes]
    write_json(out_dir / "leaderboard.json", {"resamples": resamples, "seed": seed, "level": level,
                                              "cells": table.to_dict(orient="records"), "notes": list(notes)})
    write_text(out_dir / "leaderboard.md", "\n".join(lines) + "\n")
    import html as _html

    head = "".join(f"<th>{_html.escape(c)}</th>" for c in ["model", *w.columns])
    body = "".join("<tr>" + "".join(f"<td>{_html.escape(str(v))}</td>" for v in [m, *w.loc[m]]) + "</tr>"
                   for m in w.index)
    body += "".join(f"<tr><td colspan='{len(w.columns) + 1}'>{_html.escape(n)}</td></tr>" for n in notes)
    write_text(out_dir / "leaderboard.html", html_page("Leaderboard", [f"<p>{_html.escape(note)}</p><table><thead>"
                                                         f"<tr>{head}</tr></thead><tbody>{body}</tbody></table>"]))
