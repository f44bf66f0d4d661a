"""COCO-Counterfactuals appendix A.1: the withheld in-domain test set (Tables 5 and 7).

"We withhold 30% of the original-counterfactual paired examples in COCO-Counterfactuals for testing and
train [...] on the remainder, with 56% of the total dataset used for training and 14% used as a
development set." The unit is the counterfactual pair: a pair's two samples are always on one side.

* :func:`split_pairs`: pair id -> ``train`` / ``dev`` / ``test``; ``n_test`` = round-half-up(0.3 n), ``n_dev`` =
  round-half-up(0.2 (n - n_test)) (56 / 14 / 30 %), reproducible from ``random_state``;
* :func:`write_in_domain`: the split, the test pairs (images as absolute paths) and two training manifests in
  the mixtures' format (``split`` = train / val, the dev pairs validating): ``coco_cfs`` (both counterfactual
  samples of every train/dev pair) and ``mscoco`` (the real MS-COCO caption and image of the same pairs plus a
  further caption of that image, :func:`real_samples`: A.1's "equivalent amount of real examples"), the two
  fine-tuned rows of Table 5.

* :func:`table5`: Table 5's layout, one block per fine-tuned model (``in_domain.models``: CLIP, BridgeTower,
  FLAVA) with the rows "None (pre-trained <model>)", "MS-COCO" and "COCO-CFs" and the columns text retrieval
  R@1/5/10, image retrieval R@1/5/10 and their mean; mean ± std over seeds, underlined where the one-tailed
  t-test against the MS-COCO row is significant.

Every row comes from ``counterfactory train run --eval-pairs`` on the test pairs with the model's contrastive
(ITC) head: the fine-tuned rows after training (one run per seed), the pre-trained row with ``--no-train``
(one run), so all rows of a model share one protocol. The ITR evaluation also scores the test pairs as a
subset (``evaluate itr --subset 'withheld COCO-CFs test=...'``) with the heads of ``evaluation.itr``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import ConfigError
from ...evaluation import read_pairs
from ...io import write_csv, write_parquet
from ...render import Column, Table, html_page, render_html, render_latex, render_markdown
from ...training import mixtures as mx

SPLITS = ("train", "dev", "test")
MIXTURES = ("mscoco", "coco_cfs")
PRETRAINED = "pretrained"
#: display names of Table 5's row groups (other roles show their role name)
MODEL_NAMES = {"clip_train": "CLIP", "itm_bridgetower": "BridgeTower", "itm_flava": "Flava"}
MIXTURE_NAMES = {"mscoco": "MS-COCO", "coco_cfs": "COCO-CFs"}
PREFIX = "coco_cfs_test"
#: Table 5's columns: (metric in the runs table, header)
TABLE5_COLUMNS = [(f"{PREFIX}/image_to_text@{k}", f"TR R@{k}") for k in (1, 5, 10)] \
    + [(f"{PREFIX}/text_to_image@{k}", f"IR R@{k}") for k in (1, 5, 10)] + [(f"{PREFIX}/mean", "Mean")]


def split_pairs(ids, test_fraction: float = 0.3, dev_fraction: float = 0.2, random_state: int = 42) -> pd.DataFrame:
    """``id, split`` for every pair id (sorted), split by pair into train / dev / test."""
    if not (0 < test_fraction < 1 and 0 <= dev_fraction < 1):
        raise ConfigError(f"in_domain: test_fraction {test_fraction} must be in (0, 1) and dev_fraction "
                          f"{dev_fraction} in [0, 1). Fix: the paper uses 0.3 and 0.2 (56 / 14 / 30 %)")
    ids = np.array(sorted(str(i) for i in ids))
    if len(set(ids)) != len(ids):
        raise ConfigError("in_domain: duplicate pair ids. Fix: split the image stage's selected pairs")
    n_test = mx.round_half_up(test_fraction * len(ids))
    n_dev = mx.round_half_up(dev_fraction * (len(ids) - n_test))
    order = np.random.default_rng(random_state).permutation(len(ids))
    split = np.empty(len(ids), dtype=object)
    split[order[:n_test]] = "test"
    split[order[n_test:n_test + n_dev]] = "dev"
    split[order[n_test + n_dev:]] = "train"
    return pd.DataFrame({"id": ids, "split": split})


def real_samples(real: pd.DataFrame, caption_ids: list, pair_ids: list, side, per_pair: int, pair_captions: set,
                 random_state: int) -> pd.DataFrame:
    """The MS-COCO manifest of A.1: per train / dev pair its original caption and image, plus ``per_pair - 1``
    further captions of the same MS-COCO image, so the real side holds as many samples as the counterfactual
    side (A.1: "an equivalent amount of real examples"; 2 per pair). Further captions are drawn with
    ``random_state`` among the image's captions that are no pair's original caption (a test pair's caption
    never trains); an image with too few gets what it has (logged). ``real``: ``real_table`` indexed by
    caption id."""
    import logging

    rng = np.random.default_rng(random_state)
    by_image = real.reset_index().groupby("image_path", sort=False)["caption_id"].apply(list).to_dict()
    rows, short = [], 0
    for cid, pid, where in zip(caption_ids, pair_ids, side):
        image = real.at[cid, "image_path"]
        others = [c for c in by_image.get(image, []) if c != cid and c not in pair_captions]
        extra = [others[k] for k in sorted(rng.permutation(len(others))[:per_pair - 1])] if per_pair > 1 else []
        short += per_pair - 1 - len(extra)
        for c in [cid, *extra]:
            rows.append({"image_path": image, "caption": real.at[c, "caption"], "is_counterfactual": False,
                         "pair_id": f"real:{pid}", "split": where})
    if short:
        logging.getLogger(__name__).warning("in_domain: %d pairs' MS-COCO images had too few further captions; the "
                                            "real side is %d samples short of %d per pair", short, short, per_pair)
    return pd.DataFrame(rows, columns=mx.MANIFEST_COLUMNS)


def _absolute(paths) -> list[str]:
    return [str(Path(p).resolve()) for p in paths]


def write_in_domain(cfg: dict, pairs_path: str | Path, captions_path: str | Path, out_dir: str | Path) -> pd.DataFrame:
    """Write ``split.parquet``, ``test_pairs.parquet``, ``manifests/<mixture>.parquet`` and ``summary.csv``
    under ``out_dir``; return the summary (per mixture: training / validation sizes, and the test size)."""
    section = cfg["in_domain"]
    pairs = read_pairs(pairs_path)
    pairs = pairs.assign(image_0=_absolute(pairs["image_0"]), image_1=_absolute(pairs["image_1"]))
    split = split_pairs(pairs["id"], section["test_fraction"], section["dev_fraction"], section["random_state"])
    pairs = pairs.merge(split, on="id")
    out_dir = Path(out_dir)
    write_parquet(out_dir / "split.parquet", split)
    write_parquet(out_dir / "test_pairs.parquet", pairs[pairs["split"] == "test"].drop(columns="split"))
    keep = pairs[pairs["split"] != "test"]
    side = np.where(keep["split"] == "train", "train", "val")
    caption_ids = keep["caption_id"] if "caption_id" in keep else keep["id"]
    real = mx.real_table(pd.read_parquet(captions_path), Path(cfg["data"]["coco_root"]) / cfg["data"]["split"])
    real = real.set_index("caption_id")
    missing = [c for c in caption_ids if c not in real.index]
    if missing:
        raise ConfigError(f"{captions_path}: caption {missing[0]} of a selected pair is not in the caption table. "
                          "Fix: build the pairs and the caption table in the same run")
    frames = {
        "mscoco": real_samples(real, list(caption_ids), list(keep["id"]), side, int(section["real_per_pair"]),
                               set(pairs["caption_id"] if "caption_id" in pairs else pairs["id"]),
                               section["random_state"]),
        "coco_cfs": pd.DataFrame({
            "image_path": np.concatenate([keep["image_0"], keep["image_1"]]),
            "caption": np.concatenate([keep["caption_0"], keep["caption_1"]]), "is_counterfactual": True,
            "pair_id": [f"cf:{i}" for i in keep["id"]] * 2, "split": np.concatenate([side, side])}),
    }
    for name in section["mixtures"]:
        if name not in frames:
            raise ConfigError(f"in_domain.mixtures: unknown {name!r}. Fix: use {', '.join(MIXTURES)}")
        write_parquet(out_dir / "manifests" / f"{name}.parquet", frames[name][mx.MANIFEST_COLUMNS])
    summary = mx.summary({name: frames[name] for name in section["mixtures"]})
    write_csv(out_dir / "summary.csv", summary)
    return summary


def table5(summary: pd.DataFrame, models, mixtures=MIXTURES, decimals: int = 2,
           std_decimals: int = 1, labels=None) -> list[tuple[str, str, list]]:
    """Table 5's rows: ``(model name, training dataset label, [Cell | None per column])``; ``labels`` (role ->
    display name, the config's ``models.<role>.display_name``) override the paper's names in :data:`MODEL_NAMES`.

    ``summary`` is the statistics table (``counterfactory stats summarize``) of the in-domain runs, with one
    experiment per model role and the mixtures ``pretrained`` + ``mixtures``. Within a model's block the best
    mean per column is marked; significance is the t-test against the block's MS-COCO runs."""
    from ...tables import build_table

    rows = []
    metrics = [m for m, _ in TABLE5_COLUMNS]
    for role in models:
        if role not in set(summary["experiment"]):
            raise ConfigError(f"in_domain.models: {role!r} has no runs in the summary. Fix: rerun the in-domain "
                              f"runs of that model (in_domain/runs/{role}/...)")
        table = build_table(summary, metrics=metrics, mixture_order=[PRETRAINED, *mixtures], experiment=role,
                            decimals=decimals, std_decimals=std_decimals)
        name = (labels or {}).get(role) or MODEL_NAMES.get(role, role)
        for mixture in table.row_keys:
            label = f"None (pre-trained {name})" if mixture == PRETRAINED else MIXTURE_NAMES.get(mixture, mixture)
            rows.append((name, label, [table.cells.get((mixture, key)) for key in table.col_keys]))
    return rows


TABLE5_TITLE = "Table 5 (appendix A.1): image-text retrieval on the withheld COCO-CFs test set"
TABLE5_NOTE = ("TR = text retrieval (image → text), IR = image retrieval (text → image), Recall@K in %. Mean over "
               "seeds with the sample standard deviation as subscript (the pre-trained row is one evaluation); best "
               "mean of each model in bold; underlined: one-tailed t-test shows a significant improvement over "
               "training on MS-COCO.")


def describe_table5(rows):
    """Table 5 as the shared table description (:class:`counterfactory.render.Table`); the model's name on the
    first row of its block only. Kept as before: cells use 2 / 1 decimals whatever ``table5`` was given, and the
    Markdown names are not escaped."""
    columns = [Column("Pre-trained model", "left"), Column("Training dataset", "left")]
    columns += [Column(h, "center") for _, h in TABLE5_COLUMNS]
    records, last = [], None
    for name, label, cells in rows:
        shown = name if name != last else ""
        records.append([shown, label, *cells])          # names from config: escaped per format
        last = name
    return Table(columns, records, title=TABLE5_TITLE,
                 caption="Image-text retrieval performance on a withheld COCO-CFs test set.", label="tab:in-domain",
                 note=TABLE5_NOTE)


def table5_markdown(rows) -> str:
    return render_markdown(describe_table5(rows))


def table5_html(rows) -> str:
    """Table 5 as a standalone HTML page (what the Snakemake report shows)."""
    return html_page(TABLE5_TITLE, [render_html(describe_table5(rows))])


def table5_latex(rows) -> str:
    return render_latex(describe_table5(rows))


def table5_csv(rows) -> pd.DataFrame:
    """Long form: ``model, training_dataset, column, mean, std, n, best, significant``."""
    return pd.DataFrame([
        {"model": name, "training_dataset": label, "column": header, "mean": c.mean if c else float("nan"),
         "std": c.std if c else float("nan"), "n": c.n if c else 0, "best": bool(c and c.best),
         "significant": bool(c and c.significant)}
        for name, label, cells in rows for (_, header), c in zip(TABLE5_COLUMNS, cells)])
