"""Evaluation stage: COCO-Counterfactuals as a test set (§4.2, appendix A.6) and zero-shot image
classification (§5.2, Table 4).

Three analyses, each split into a per-model step (one job per model role, so they parallelise) and a
step that merges the per-model results into paper-style tables and plots:

1. **Zero-shot image-text retrieval** (§4.2.1, Tables 2 and 13). For each model, Recall@K (TR = image→
   text, IR = text→image, in percent, :func:`counterfactory.metrics.recall_at_k`) on

   * ``MS-COCO``: the matched real subset: the original MS-COCO image of every selected pair with the
     pair's original caption (``itr.coco_captions: matched``; ``all`` uses every caption of those
     images). This is the baseline of the relative change;
   * ``COCO-CFs``: every image of the selected pairs (``image_0``, ``image_1``) with its own caption
     (``caption_0``, ``caption_1``): 2N images, 2N texts, the counterfactual partner being the
     hardest distractor;
   * optional subsets of COCO-CFs (``itr.subsets``: label -> CSV/parquet with an ``id`` column, e.g.
     the human-evaluated pairs of §4.1).

   The table shows each value with its relative change versus MS-COCO, ``100 · (R − R_MS-COCO) /
   R_MS-COCO`` (rounded to whole percent, the largest drop of each row in bold, as in Table 2).

   Scores: dual encoders (CLIP, open_clip, and the contrastive heads of FLAVA, BridgeTower and BLIP:
   ``itr.head: itc``, the default) score all pairs from embeddings. Cross-encoders without a
   contrastive head (ViLT), or with ``itr.head: itm``, score pairs with their ITM head: every pair
   (exhaustive, up to ``scorers.<role>.max_exhaustive_pairs``), or, with ``itr.shortlist: {role, k}``,
   the BLIP protocol: a dual-encoder role ranks all candidates, the top k per query are re-scored by
   the ITM head and everything else ranks below them (text→image and image→text use separate
   shortlists). Which heads the paper used for ITR is not stated; ViLT (ITM head only) appears in its
   ITM analysis but not in its ITR tables, which suggests contrastive heads for ITR.

2. **ITM score differences** (§4.2.2, Figure 3): ``IR_r, IR_c, TR_r, TR_c`` from
   :func:`counterfactory.metrics.itm_differences` with ``G`` = the model's ITM score
   (:mod:`counterfactory.scorers`: ITM match logit; CLIP's ``logit_scale · cos``). Per pair,
   ``(C_o, I_o)`` is the original caption (``caption_0``) and its real MS-COCO image, ``I_o^s`` / ``I_c^s``
   the synthetic images ``image_0`` / ``image_1``, ``C_c`` = ``caption_1``, and ``(C_r, I_r)`` a random
   MS-COCO caption and its image with ``I_r != I_o`` (seeded, ``itm.seed``; drawn from every caption
   of the caption table, or only from the matched images with ``itm.random_pool: matched``).
   Outputs: per-pair scores, a summary table (mean, std, median, share below zero) and one histogram
   panel per model.

3. **Zero-shot classification** (§5.2, Table 4): class text embeddings from prompt templates
   (``"a photo of a {c}."`` by default; several templates are averaged, CLIP's prompt ensembling),
   prediction = argmax over classes of the image-class cosine; top-1 and top-5 accuracy in percent.
   Ties are broken towards the lower class index (stable sort). Datasets are read by
   :mod:`counterfactory.data.classification`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from .errors import ConfigError, InputError, input_error

log = logging.getLogger(__name__)

BASELINE = "MS-COCO"
COCO_CFS = "COCO-CFs"
ITM_METRICS = ("IR_r", "IR_c", "TR_r", "TR_c")
#: the six per-pair ITM scores, named as the keyword arguments of metrics.itm_differences
ITM_SCORES = ("random_pair", "random_caption_original_image", "original_caption_random_image",
              "counterfactual_pair", "counterfactual_caption_original_image",
              "original_caption_counterfactual_image")

DEFAULTS: dict[str, Any] = {
    "batch_size": 32,
    "scorers": {},
    "itr": {"models": [], "ks": [1, 5, 10], "head": "itc", "coco_captions": "matched",
            "shortlist": {"role": None, "k": 128}, "subsets": {}},
    "itm": {"models": [], "head": "itm", "random_pool": "all", "seed": 0, "bins": 40},
    "classification": {"models": [], "templates": ["a photo of a {c}."], "topk": [1, 5], "max_per_class": None,
                       "datasets": {}},
}


def settings(cfg: dict) -> dict:
    """``cfg['evaluation']`` merged over :data:`DEFAULTS` (the schema fills the same defaults)."""
    from .config import deep_merge

    return deep_merge(DEFAULTS, cfg.get("evaluation") or {})


def model_label(cfg: dict, role: str) -> str:
    """Display name of a role: the last component of its source (``clip-vit-base-patch32``)."""
    from .models.registry import model_spec

    source = model_spec(cfg, role).source.rstrip("/")
    return source.removeprefix("local-dir:").split("/")[-1] or role


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------
PAIR_COLUMNS = ("id", "caption_0", "caption_1", "image_0", "image_1")


def _read_table(path: str | os.PathLike, what: str, fix: str) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, f"{what} not found", fix)
    try:
        if path.suffix.lower() == ".csv":
            return pd.read_csv(path, dtype=str, keep_default_na=False)
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow / pandas raise several types
        raise input_error(path, None, f"not a readable {path.suffix.lstrip('.')} file ({exc})", fix) from exc


def read_pairs(path: str | os.PathLike) -> pd.DataFrame:
    """The image stage's ``selected_pairs.parquet`` with ``image_0``/``image_1`` resolved to paths
    (relative paths are relative to the parquet's folder, as the image stage writes them)."""
    path = Path(path)
    fix = "run the image stage (`snakemake ... images_merge`) or pass its selected_pairs.parquet"
    df = _read_table(path, "selected pairs table", fix)
    missing = [c for c in PAIR_COLUMNS if c not in df.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {missing}", f"the table needs {list(PAIR_COLUMNS)}")
    if df.empty:
        raise input_error(path, None, "no selected pairs", "the image stage kept no pair; check its filter settings")
    df = df.reset_index(drop=True).copy()
    df["id"] = df["id"].astype(str)
    dup = df["id"].duplicated()
    if dup.any():
        raise input_error(path, int(dup.idxmax()), f"duplicate id {df['id'][dup].iloc[0]!r}", "ids must be unique")
    for col in ("image_0", "image_1"):
        df[col] = [str(p if Path(p).is_absolute() else path.parent / p) for p in df[col].astype(str)]
    for col in ("caption_0", "caption_1"):
        empty = df[col].isna() | (df[col].astype(str).str.strip() == "")
        if empty.any():
            raise input_error(path, f"id {df['id'][empty].iloc[0]}", f"empty {col}", "fix the image stage output")
    return df


def read_captions(path: str | os.PathLike) -> pd.DataFrame:
    """The caption table (``caption_id, image_id, caption`` [, ``file_name``])."""
    path = Path(path)
    df = _read_table(path, "caption table", "run the data stage (`snakemake ... caption_table`)")
    missing = [c for c in ("caption_id", "image_id", "caption") if c not in df.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {missing}",
                          "the caption table must have caption_id, image_id and caption")
    df = df.copy()
    df["caption_id"] = df["caption_id"].astype(str)
    df["image_id"] = df["image_id"].astype(str)
    return df


def coco_image_dir(cfg: dict) -> Path:
    return Path(cfg["data"]["coco_root"]) / cfg["data"]["split"]


def _image_files(captions: pd.DataFrame, coco_dir: Path) -> dict[str, str]:
    """image_id -> path: the table's ``file_name`` if present, else COCO 2017's ``{id:012d}.jpg``."""
    if "file_name" in captions.columns:
        first = captions.drop_duplicates("image_id").set_index("image_id")["file_name"]
        return {i: str(coco_dir / f) for i, f in first.items()}
    out = {}
    for i in captions["image_id"].unique():
        try:
            out[i] = str(coco_dir / f"{int(i):012d}.jpg")
        except ValueError:
            out[i] = str(coco_dir / f"{i}.jpg")
    return out


def pair_image_ids(pairs: pd.DataFrame, captions: pd.DataFrame, pairs_path: str | os.PathLike = "<pairs>") -> list[str]:
    """The MS-COCO image id of each pair: its ``image_id`` column, else the caption table's row for its
    ``caption_id`` (or its ``id``), else the ``{image_id}_{caption_index}`` prefix of the id."""
    by_caption = dict(zip(captions["caption_id"], captions["image_id"]))
    known = set(captions["image_id"])
    out = []
    for k, row in pairs.iterrows():
        cand = None
        if "image_id" in pairs.columns and isinstance(row.get("image_id"), str) and row["image_id"] not in ("", "None"):
            cand = row["image_id"]
        if cand is None:
            cand = by_caption.get(str(row.get("caption_id", row["id"]))) or by_caption.get(row["id"])
        if cand is None:
            cand = row["id"].split("_")[0]
        if cand not in known:
            raise input_error(pairs_path, f"id {row['id']}", f"its MS-COCO image {cand!r} is not in the caption table",
                              "evaluate with the caption table the pairs were made from (same data.split / limit_images)")
        out.append(cand)
    return out


def _check_files(paths: Iterable[str], what: str) -> None:
    for p in paths:
        if not Path(p).exists():
            raise input_error(p, None, f"{what} not found",
                              "check data.coco_root / data.split, or rerun the stage that writes it")


# --------------------------------------------------------------------------------------------
# 1. zero-shot image-text retrieval
# --------------------------------------------------------------------------------------------
@dataclass
class RetrievalSet:
    name: str
    images: list[str]
    texts: list[str]
    text_image: np.ndarray  # text j describes image text_image[j]

    def __post_init__(self):
        self.text_image = np.asarray(self.text_image, dtype=np.int64)


def cf_retrieval_set(pairs: pd.DataFrame, name: str = COCO_CFS) -> RetrievalSet:
    """2N images (``image_0``, ``image_1`` of every pair), each with its own caption."""
    n = len(pairs)
    images = list(pairs["image_0"]) + list(pairs["image_1"])
    texts = list(pairs["caption_0"].astype(str)) + list(pairs["caption_1"].astype(str))
    return RetrievalSet(name, images, texts, np.arange(2 * n))


def coco_retrieval_set(pairs: pd.DataFrame, captions: pd.DataFrame, coco_dir: Path, mode: str = "matched",
                       pairs_path="<pairs>") -> RetrievalSet:
    """The matched MS-COCO subset: the original images of the pairs, with the pairs' original
    captions (``matched``, one per distinct caption) or every caption of those images (``all``)."""
    if mode not in ("matched", "all"):
        raise ConfigError(f"evaluation.itr.coco_captions: {mode!r} is not matched or all")
    image_ids = pair_image_ids(pairs, captions, pairs_path)
    files = _image_files(captions, coco_dir)
    uniq = list(dict.fromkeys(image_ids))
    index = {i: k for k, i in enumerate(uniq)}
    if mode == "matched":
        key = pairs["caption_id"].astype(str) if "caption_id" in pairs.columns else pairs["id"]
        frame = pd.DataFrame({"key": key, "text": pairs["caption_0"].astype(str), "image": image_ids})
        frame = frame.drop_duplicates("key")
        texts, owners = list(frame["text"]), [index[i] for i in frame["image"]]
    else:
        sub = captions[captions["image_id"].isin(index)]
        texts, owners = list(sub["caption"].astype(str)), [index[i] for i in sub["image_id"]]
    images = [files[i] for i in uniq]
    _check_files(images, "MS-COCO image")
    return RetrievalSet(BASELINE, images, texts, np.asarray(owners))


def _topk_indices(scores: np.ndarray, k: int, axis: int) -> np.ndarray:
    """Indices of the k largest entries along ``axis`` (k capped at the axis length)."""
    k = min(k, scores.shape[axis])
    part = np.argpartition(-scores, k - 1, axis=axis)
    return np.take(part, np.arange(k), axis=axis)


def retrieval_recall(scorer, rset: RetrievalSet, ks: Sequence[int], shortlist=None,
                     shortlist_k: int | None = None) -> dict[str, float]:
    """Recall@K (``image_to_text@K`` = TR@K, ``text_to_image@K`` = IR@K) of ``scorer`` on ``rset``."""
    from .metrics import recall_at_k

    if scorer.dual or shortlist is None:
        return recall_at_k(scorer.score_matrix(rset.images, rset.texts), rset.text_image, ks)
    if not shortlist.dual:
        raise ConfigError(f"evaluation.itr.shortlist.role: {shortlist.name} is not a dual encoder. "
                          f"Fix: name a CLIP-like role (or a model with head itc)")
    k = int(shortlist_k or max(ks))
    if k < max(ks):
        raise ConfigError(f"evaluation.itr.shortlist.k = {k} is smaller than the largest K ({max(ks)}). "
                          f"Fix: set shortlist.k >= {max(ks)}")
    cand = shortlist.score_matrix(rset.images, rset.texts)
    i2t = _topk_indices(cand, k, axis=1)          # (n_img, k) text candidates per image
    t2i = _topk_indices(cand, k, axis=0)          # (k, n_txt) image candidates per text
    n_img, n_txt = cand.shape
    rows_a = np.repeat(np.arange(n_img), i2t.shape[1])
    cols_a = i2t.ravel()
    rows_b = t2i.ravel()
    cols_b = np.tile(np.arange(n_txt), t2i.shape[0])
    flat = np.unique(np.concatenate([rows_a * n_txt + cols_a, rows_b * n_txt + cols_b]))
    pi, pj = flat // n_txt, flat % n_txt
    log.info("%s on %s: ITM re-ranking of %d shortlisted pairs (k=%d, from %s)", scorer.name, rset.name,
             flat.size, k, shortlist.name)
    s = scorer.score_index_pairs(rset.images, rset.texts, pi, pj)
    lookup = dict(zip(flat.tolist(), s.tolist()))
    m_i2t = np.full((n_img, n_txt), -np.inf, dtype=np.float32)
    m_i2t[rows_a, cols_a] = [lookup[x] for x in (rows_a * n_txt + cols_a).tolist()]
    m_t2i = np.full((n_img, n_txt), -np.inf, dtype=np.float32)
    m_t2i[rows_b, cols_b] = [lookup[x] for x in (rows_b * n_txt + cols_b).tolist()]
    tr = recall_at_k(m_i2t, rset.text_image, ks)
    ir = recall_at_k(m_t2i, rset.text_image, ks)
    return {**{k_: v for k_, v in tr.items() if k_.startswith("image_to_text")},
            **{k_: v for k_, v in ir.items() if k_.startswith("text_to_image")}}


def _subset_ids(path: str | os.PathLike) -> set[str]:
    df = _read_table(path, "subset id list", "write a CSV or parquet file with an 'id' column")
    if "id" not in df.columns:
        raise input_error(path, None, "no 'id' column", "write the pair ids to keep in a column named id")
    return set(df["id"].astype(str))


def run_itr(cfg: dict, role: str, pairs_path, captions_path, *, progress: bool = True) -> pd.DataFrame:
    """Recall@K of one model role on MS-COCO (matched), COCO-CFs and the configured subsets.

    Returns a long table: ``role, model, source, dataset, n_pairs, n_images, n_texts, metric, value``
    with metrics ``TR@K`` / ``IR@K`` in percent.
    """
    from .models.registry import model_spec
    from .scorers import scorer_from_config

    ev = settings(cfg)["itr"]
    ks = [int(k) for k in ev["ks"]]
    pairs = read_pairs(pairs_path)
    captions = read_captions(captions_path)
    sets = [(coco_retrieval_set(pairs, captions, coco_image_dir(cfg), ev["coco_captions"], pairs_path), len(pairs)),
            (cf_retrieval_set(pairs), len(pairs))]
    for label, path in (ev.get("subsets") or {}).items():
        keep = _subset_ids(path)
        sub = pairs[pairs["id"].isin(keep)].reset_index(drop=True)
        if sub.empty:
            raise input_error(path, None, "none of its ids is among the selected pairs",
                              "list ids from selected_pairs.parquet")
        sets.append((cf_retrieval_set(sub, name=str(label)), len(sub)))
    for rset, _ in sets[1:]:
        _check_files(rset.images, "COCO-CFs image")
    scorer = scorer_from_config(cfg, role, head=ev["head"], progress=progress)
    shortlist, shortlist_k = None, None
    if ev.get("shortlist") and not scorer.dual:
        sl = ev["shortlist"]
        if sl.get("role"):
            shortlist = scorer_from_config(cfg, sl["role"], head="itc", progress=progress)
            shortlist_k = sl.get("k")
    rows = []
    for rset, n_pairs in sets:
        rec = retrieval_recall(scorer, rset, ks, shortlist, shortlist_k)
        for direction, short in (("image_to_text", "TR"), ("text_to_image", "IR")):
            for k in ks:
                rows.append({"role": role, "model": model_label(cfg, role), "source": model_spec(cfg, role).source,
                             "scorer": type(scorer).__name__, "dataset": rset.name, "n_pairs": n_pairs,
                             "n_images": len(rset.images), "n_texts": len(rset.texts),
                             "metric": f"{short}@{k}", "value": rec[f"{direction}@{k}"]})
        log.info("%s on %s (%d images, %d texts): %s", role, rset.name, len(rset.images), len(rset.texts),
                 ", ".join(f"{r['metric']}={r['value']:.2f}" for r in rows[-2 * len(ks):]))
    return pd.DataFrame(rows)


def relative_change(value: float, baseline: float) -> float:
    """``100 · (value − baseline) / baseline`` in percent; NaN when the baseline is 0."""
    if baseline == 0 or not np.isfinite(baseline):
        return float("nan")
    return 100.0 * (value - baseline) / baseline


def _metric_order(metrics: Iterable[str]) -> list[str]:
    def key(m: str):
        head, k = m.split("@")
        return (0 if head == "TR" else 1, int(k))

    return sorted(set(metrics), key=key)


def itr_table(long: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Wide Table-2 layout: one row per (model, dataset), columns ``TR@K``/``IR@K`` and
    ``<metric> rel%`` (relative change vs. the model's ``baseline`` row; NaN on the baseline row)."""
    need = {"role", "model", "dataset", "metric", "value"}
    if not need <= set(long.columns):
        raise InputError(f"ITR results lack columns {sorted(need - set(long.columns))}. "
                         f"Fix: pass the CSVs written by `counterfactory evaluate itr`")
    metrics = _metric_order(long["metric"])
    out = []
    for role, group in long.groupby("role", sort=False):
        wide = group.pivot_table(index="dataset", columns="metric", values="value", aggfunc="first")
        extra = group.drop_duplicates("dataset").set_index("dataset")
        if baseline not in wide.index:
            raise InputError(f"ITR results of role {role} have no {baseline!r} rows. Fix: rerun `evaluate itr`")
        datasets = [baseline] + [d for d in dict.fromkeys(group["dataset"]) if d != baseline]
        for ds in datasets:
            row = {"model": extra.loc[ds, "model"], "role": role, "dataset": ds}
            for col in ("n_pairs", "n_images", "n_texts"):
                if col in extra.columns:
                    row[col] = int(extra.loc[ds, col])
            for m in metrics:
                row[m] = float(wide.loc[ds, m])
            for m in metrics:
                row[f"{m} rel%"] = float("nan") if ds == baseline else relative_change(wide.loc[ds, m], wide.loc[baseline, m])
            out.append(row)
    return pd.DataFrame(out)


def _fmt_change(pct: float) -> str:
    if not np.isfinite(pct):
        return "n/a"
    r = int(round(pct))
    return f"{'+' if r > 0 else ''}{r}%"


def render_itr_markdown(table: pd.DataFrame, title: str | None = None, decimals: int = 2) -> str:
    """Markdown in the layout of Table 2: ``R (±x%)`` with the largest drop of each row in bold."""
    metrics = [c for c in table.columns if "@" in c and not c.endswith("rel%")]
    tr = [m for m in metrics if m.startswith("TR")]
    ir = [m for m in metrics if m.startswith("IR")]
    header = ["Model", "Evaluated dataset"] + [f"TR R@{m.split('@')[1]}" for m in tr] + \
             [f"IR R@{m.split('@')[1]}" for m in ir]
    lines = []
    if title:
        lines += [f"**{title}**", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * len(metrics)) + "|"]
    prev = None
    for _, row in table.iterrows():
        changes = {m: row[f"{m} rel%"] for m in metrics}
        finite = {m: v for m, v in changes.items() if np.isfinite(v)}
        worst = min(finite.values()) if finite else None
        cells = []
        for m in tr + ir:
            text = f"{row[m]:.{decimals}f}"
            if np.isfinite(changes[m]):
                change = _fmt_change(changes[m])
                if worst is not None and worst < 0 and round(changes[m]) == round(worst):
                    change = f"**{change}**"
                text += f" ({change})"
            cells.append(text)
        model = row["model"] if row["model"] != prev else ""
        prev = row["model"]
        lines.append("| " + " | ".join([model, str(row["dataset"])] + cells) + " |")
    lines += ["", "TR = text retrieval (image→text), IR = image retrieval (text→image), Recall@K in percent. "
              f"In parentheses: change relative to the same model on {BASELINE} (the matched real subset); "
              "the largest drop of each row is bold."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# 2. ITM score differences
# --------------------------------------------------------------------------------------------
def itm_inputs(pairs: pd.DataFrame, captions: pd.DataFrame, coco_dir: Path, seed: int = 0,
               pool: str = "all", pairs_path="<pairs>") -> pd.DataFrame:
    """Per pair: ``C_o, I_o, I_o_s, C_c, I_c_s`` and a random MS-COCO pair ``C_r, I_r`` with ``I_r != I_o``.

    The random caption is drawn uniformly (``numpy.random.default_rng(seed)``) from the caption table
    (``pool: all``) or from the captions of the pairs' own images (``pool: matched``), redrawing while it
    belongs to ``I_o``'s image.
    """
    if pool not in ("all", "matched"):
        raise ConfigError(f"evaluation.itm.random_pool: {pool!r} is not all or matched")
    image_ids = pair_image_ids(pairs, captions, pairs_path)
    files = _image_files(captions, coco_dir)
    cand = captions if pool == "all" else captions[captions["image_id"].isin(set(image_ids))]
    cand = cand.reset_index(drop=True)
    if cand["image_id"].nunique() < 2:
        raise input_error(pairs_path, None, "random alternatives need captions of at least 2 MS-COCO images",
                          "evaluate on more than one image (or use evaluation.itm.random_pool: all)")
    rng = np.random.default_rng(seed)
    cand_img = cand["image_id"].to_numpy()
    draws = rng.integers(0, len(cand), size=len(pairs))
    own = np.asarray(image_ids, dtype=object)
    for _ in range(1000):
        clash = cand_img[draws] == own
        if not clash.any():
            break
        draws[clash] = rng.integers(0, len(cand), size=int(clash.sum()))
    else:  # pragma: no cover - needs an extremely unbalanced pool
        raise input_error(pairs_path, None, "could not draw random pairs from other images", "use a larger caption pool")
    rnd = cand.iloc[draws].reset_index(drop=True)
    out = pd.DataFrame({
        "id": pairs["id"].to_numpy(),
        "C_o": pairs["caption_0"].astype(str).to_numpy(), "I_o": [files[i] for i in image_ids],
        "I_o_s": pairs["image_0"].to_numpy(),
        "C_c": pairs["caption_1"].astype(str).to_numpy(), "I_c_s": pairs["image_1"].to_numpy(),
        "C_r": rnd["caption"].astype(str).to_numpy(), "I_r": [files[i] for i in rnd["image_id"]],
        "image_id": image_ids, "random_caption_id": rnd["caption_id"].to_numpy(),
    })
    _check_files(set(out["I_o"]) | set(out["I_r"]), "MS-COCO image")
    _check_files(set(out["I_o_s"]) | set(out["I_c_s"]), "COCO-CFs image")
    return out


#: (caption column, image column) of the six ITM scores, in ITM_SCORES order
_ITM_PAIRS = (("C_r", "I_r"), ("C_r", "I_o"), ("C_o", "I_r"), ("C_c", "I_c_s"), ("C_c", "I_o_s"), ("C_o", "I_c_s"))


def itm_scores(scorer, inputs: pd.DataFrame) -> pd.DataFrame:
    """The six ITM scores and the four differences of every pair, with one scorer call."""
    from .metrics import itm_differences

    images = list(dict.fromkeys(p for _, col in _ITM_PAIRS for p in inputs[col]))
    texts = list(dict.fromkeys(t for col, _ in _ITM_PAIRS for t in inputs[col]))
    img_ix = {p: i for i, p in enumerate(images)}
    txt_ix = {t: i for i, t in enumerate(texts)}
    ii = np.concatenate([[img_ix[p] for p in inputs[icol]] for _, icol in _ITM_PAIRS])
    tt = np.concatenate([[txt_ix[t] for t in inputs[ccol]] for ccol, _ in _ITM_PAIRS])
    s = scorer.score_index_pairs(images, texts, ii, tt).reshape(len(_ITM_PAIRS), len(inputs))
    scores = dict(zip(ITM_SCORES, s))
    diffs = itm_differences(**scores)
    out = inputs[["id", "image_id", "random_caption_id"]].copy()
    for name in ITM_SCORES:
        out[name] = scores[name].astype(np.float64)
    for name in ITM_METRICS:
        out[name] = diffs[name]
    return out


def run_itm(cfg: dict, role: str, pairs_path, captions_path, *, progress: bool = True) -> pd.DataFrame:
    """Per-pair ITM scores and differences of one model role (long: one row per pair)."""
    from .models.registry import model_spec
    from .scorers import scorer_from_config

    ev = settings(cfg)["itm"]
    pairs = read_pairs(pairs_path)
    captions = read_captions(captions_path)
    inputs = itm_inputs(pairs, captions, coco_image_dir(cfg), seed=int(ev["seed"]), pool=ev["random_pool"],
                        pairs_path=pairs_path)
    scorer = scorer_from_config(cfg, role, head=ev["head"], progress=progress)
    out = itm_scores(scorer, inputs)
    out.insert(0, "role", role)
    out.insert(1, "model", model_label(cfg, role))
    out.insert(2, "source", model_spec(cfg, role).source)
    out.insert(3, "scorer", type(scorer).__name__)
    log.info("%s: ITM differences of %d pairs: %s", role, len(out),
             ", ".join(f"{m} mean {out[m].mean():.4g}" for m in ITM_METRICS))
    return out


def itm_summary(per_pair: pd.DataFrame) -> pd.DataFrame:
    """Per model and metric: n, mean, std (ddof=1), median, quartiles, share of pairs below zero (%)."""
    rows = []
    for (role, model), g in per_pair.groupby(["role", "model"], sort=False):
        for m in ITM_METRICS:
            v = g[m].to_numpy(dtype=float)
            rows.append({"role": role, "model": model, "metric": m, "n": int(v.size), "mean": float(v.mean()),
                         "std": float(v.std(ddof=1)) if v.size > 1 else float("nan"),
                         "median": float(np.median(v)), "q25": float(np.quantile(v, 0.25)),
                         "q75": float(np.quantile(v, 0.75)), "pct_below_zero": float(100.0 * (v < 0).mean())})
    return pd.DataFrame(rows)


def render_itm_markdown(summary: pd.DataFrame, title: str | None = None) -> str:
    lines = [f"**{title}**", ""] if title else []
    lines += ["| Model | Metric | n | Mean | Std | Median | % < 0 |", "|---|---|---:|---:|---:|---:|---:|"]
    prev = None
    for _, r in summary.iterrows():
        model = r["model"] if r["model"] != prev else ""
        prev = r["model"]
        std = "n/a" if not np.isfinite(r["std"]) else f"{r['std']:.4g}"
        lines.append(f"| {model} | {r['metric']} | {r['n']} | {r['mean']:.4g} | {std} | {r['median']:.4g} | "
                     f"{r['pct_below_zero']:.1f} |")
    lines += ["", "IR_r = G(C_r, I_r) − G(C_r, I_o), TR_r = G(C_r, I_r) − G(C_o, I_r), IR_c = G(C_c, I_c^s) − "
              "G(C_c, I_o^s), TR_c = G(C_c, I_c^s) − G(C_o, I_c^s) (§4.2.2); > 0 means the matching pair scored "
              "higher. % < 0: share of pairs scored incorrectly."]
    return "\n".join(lines) + "\n"


_ITM_COLORS = {"IR_r": "#1f77b4", "TR_r": "#2ca02c", "IR_c": "#d62728", "TR_c": "#ff7f0e"}


def plot_itm(per_pair: pd.DataFrame, bins: int = 40):
    """Figure 3 style: one panel per model, the distributions of IR_r, TR_r, IR_c, TR_c."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(per_pair.groupby(["role", "model"], sort=False))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False)
    for ax, ((role, model), g) in zip(axes[0], groups):
        values = g[list(ITM_METRICS)].to_numpy(dtype=float)
        lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
        if not hi > lo:
            lo, hi = lo - 0.5, hi + 0.5
        edges = np.linspace(lo, hi, bins + 1)
        for m in ("IR_r", "TR_r", "IR_c", "TR_c"):
            ax.hist(g[m].to_numpy(dtype=float), bins=edges, histtype="step", linewidth=1.5, density=True,
                    color=_ITM_COLORS[m], label=m.replace("_", "$_") + "$")
        ax.axvline(0.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"{model} (n={len(g)})", fontsize=10)
        ax.set_xlabel("ITM score difference")
        ax.set_ylabel("density")
        ax.legend(fontsize=8, frameon=False)
    fig.suptitle("ITM score differences on COCO-Counterfactuals", fontsize=11)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# 3. zero-shot classification
# --------------------------------------------------------------------------------------------
def check_templates(templates: Sequence[str]) -> list[str]:
    templates = [str(t) for t in templates]
    if not templates:
        raise ConfigError("evaluation.classification.templates is empty. Fix: e.g. ['a photo of a {c}.']")
    for t in templates:
        if "{c}" not in t:
            raise ConfigError(f"evaluation.classification.templates: {t!r} has no {{c}} placeholder. "
                              f"Fix: write the class name position as {{c}}, e.g. 'a photo of a {{c}}.'")
    return templates


def class_text_embeddings(scorer, classes: Sequence[str], templates: Sequence[str]) -> np.ndarray:
    """(C, d) L2-normalised class embeddings; several templates are averaged, then renormalised."""
    templates = check_templates(templates)
    texts = [t.replace("{c}", c) for c in classes for t in templates]
    emb = scorer.encode_texts(texts).reshape(len(classes), len(templates), -1).mean(axis=1)
    return emb / np.linalg.norm(emb, axis=1, keepdims=True)


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, ks: Sequence[int]) -> dict[int, float]:
    """Top-k accuracy in percent; ranking by descending logit, ties towards the lower class index;
    k larger than the number of classes counts every image as correct."""
    logits = np.asarray(logits)
    labels = np.asarray(labels)
    if logits.ndim != 2 or logits.shape[0] != labels.shape[0]:
        raise ValueError(f"logits {logits.shape} and labels {labels.shape} do not match")
    order = np.argsort(-logits, axis=1, kind="stable")
    rank = np.argmax(order == labels[:, None], axis=1)
    return {int(k): float(100.0 * np.mean(rank < k)) for k in ks}


def run_classification(cfg: dict, role: str, dataset: str, *, progress: bool = True) -> dict:
    """Zero-shot top-k accuracy of one (dual-encoder) role on one configured dataset."""
    from .data.classification import load_dataset
    from .models.registry import model_spec
    from .scorers import scorer_from_config

    ev = settings(cfg)["classification"]
    datasets = ev.get("datasets") or {}
    if dataset not in datasets:
        raise ConfigError(f"evaluation.classification.datasets has no {dataset!r} (configured: {sorted(datasets)}). "
                          f"Fix: add it with format and root")
    spec = dict(datasets[dataset])
    if ev.get("max_per_class") and not spec.get("max_per_class"):
        spec["max_per_class"] = ev["max_per_class"]
    ds = load_dataset(dataset, spec)
    scorer = scorer_from_config(cfg, role, head="itc", progress=progress)
    if not scorer.dual:
        raise ConfigError(f"evaluation.classification.models: {role} ({type(scorer.model).__name__}) has no "
                          f"contrastive head for zero-shot classification. Fix: list CLIP-like roles only")
    weights = class_text_embeddings(scorer, ds.classes, ev["templates"])
    logits = scorer.encode_images(ds.images) @ weights.T
    acc = topk_accuracy(logits, ds.labels, [int(k) for k in ev["topk"]])
    result = {"role": role, "model": model_label(cfg, role), "source": model_spec(cfg, role).source,
              "dataset": dataset, "format": ds.format, "n_images": len(ds), "n_classes": len(ds.classes),
              "templates": list(ev["templates"]), **{f"top{k}": v for k, v in acc.items()}}
    log.info("%s on %s (%d images, %d classes): %s", role, dataset, len(ds), len(ds.classes),
             ", ".join(f"top-{k} {v:.2f}%" for k, v in acc.items()))
    return result


def classification_table(results: Sequence[dict], metric: str = "top1",
                         dataset_order: Sequence[str] | None = None) -> pd.DataFrame:
    """Table 4 layout: one row per model, one column per dataset, plus ``Mean`` over the datasets."""
    if not results:
        raise InputError("no classification results. Fix: pass the JSON files of `counterfactory evaluate classify`")
    frame = pd.DataFrame(list(results))
    if metric not in frame.columns:
        raise InputError(f"classification results have no {metric!r}. Fix: include its k in evaluation.classification.topk")
    order = list(dataset_order) if dataset_order else list(dict.fromkeys(frame["dataset"]))
    order = [d for d in order if d in set(frame["dataset"])]
    wide = frame.pivot_table(index=["model", "role"], columns="dataset", values=metric, aggfunc="first", sort=False)
    wide = wide.reindex(columns=order)
    wide["Mean"] = wide.mean(axis=1, skipna=True)
    return wide.reset_index()


def render_classification_markdown(tables: dict[str, pd.DataFrame], title: str | None = None,
                                   decimals: int = 2) -> str:
    lines = [f"**{title}**", ""] if title else []
    for metric, table in tables.items():
        cols = [c for c in table.columns if c not in ("model", "role")]
        lines += [f"{metric.replace('top', 'Top-')} accuracy (%)", "",
                  "| Model | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for _, r in table.iterrows():
            cells = ["–" if pd.isna(r[c]) else f"{r[c]:.{decimals}f}" for c in cols]
            lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("Zero-shot: each class is scored by the cosine between the image and its prompt embedding "
                 "(templates averaged); Mean = unweighted mean over the datasets shown.")
    return "\n".join(lines) + "\n"


def plot_classification(table: pd.DataFrame, metric: str = "top1"):
    """Grouped bars: datasets on the x axis, one bar per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [c for c in table.columns if c not in ("model", "role")]
    n_models = len(table)
    width = 0.8 / max(1, n_models)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(cols) + 1), 3.4))
    x = np.arange(len(cols))
    for i, (_, r) in enumerate(table.iterrows()):
        ax.bar(x + (i - (n_models - 1) / 2) * width, [r[c] for c in cols], width, label=r["model"])
    ax.set_xticks(x, cols, rotation=20)
    ax.set_ylabel(f"{metric.replace('top', 'top-')} accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title("Zero-shot classification")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# reading per-model outputs back
# --------------------------------------------------------------------------------------------
def read_csvs(paths: Sequence[str | os.PathLike], what: str) -> pd.DataFrame:
    frames = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise input_error(p, None, f"{what} not found", "run the per-model evaluation step first")
        frames.append(pd.read_csv(p) if p.suffix == ".csv" else pd.read_parquet(p))
    if not frames:
        raise InputError(f"no {what} given. Fix: pass at least one file")
    return pd.concat(frames, ignore_index=True)


def read_jsons(paths: Sequence[str | os.PathLike]) -> list[dict]:
    out = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise input_error(p, None, "classification result not found", "run `counterfactory evaluate classify`")
        try:
            out.append(json.loads(p.read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            raise input_error(p, None, f"not valid JSON ({exc})", "rerun the classification step") from exc
    return out
