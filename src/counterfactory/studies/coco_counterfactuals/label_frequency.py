"""Label-frequency analysis of COCO-Counterfactuals appendix A.2 (Table 6), and appendix A.3.2's count of pairs
whose altered subject is a human-related word (:func:`human_taxonomy_table`).

*COCO-CFs label frequency* of an image-recognition dataset (A.2): "the total number of COCO-Counterfactuals
in which one or more of the dataset's labels matched one of the two altered subjects used to produce the
counterfactual pair". So:

* it is counted over the **released dataset**, the selected image pairs (``selected_pairs.parquet``), not
  over every caption pair the caption stage produced; each released pair counts **once**, however many
  labels match and whether one or both altered subjects match;
* the altered subjects are the masked noun of the original caption and the noun that replaced it.

Matching is ours (A.2 does not spell it out): case-insensitive; singular and plural forms match
(``dogs``/``dog``, ``puppies``/``puppy``, ``boxes``/``box``, irregular ``men``/``man``, ``mice``/``mouse``, ...);
a multi-word label (``hot dog``, ``teddy bear``) matches when the caption holds the label as a phrase whose
last word is the altered subject (``a hot dog on a plate`` with ``dog`` -> ``cat`` matches ``hot dog``), so a
single altered noun never matches a longer label by itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ...data.classification import load_dataset
from ...errors import CounterFactoryError, input_error
from ...evaluation import read_pairs
from ...io import write_csv, write_json, write_text
from ...render import Column, Table, html_page, render_html, render_markdown

#: irregular plurals of English nouns frequent in captions and class labels (plural -> singular)
IRREGULAR = {"men": "man", "women": "woman", "children": "child", "people": "person", "mice": "mouse",
             "geese": "goose", "teeth": "tooth", "feet": "foot", "knives": "knife", "leaves": "leaf",
             "wolves": "wolf", "shelves": "shelf", "loaves": "loaf", "calves": "calf", "halves": "half",
             "oxen": "ox", "dice": "die", "sheep": "sheep", "fish": "fish", "deer": "deer", "cacti": "cactus"}


def forms(word: str) -> set[str]:
    """Lower-case singular/plural forms of one word (``box`` -> box, boxs, boxes; ``puppies`` -> puppy, ...)."""
    w = word.lower().strip()
    out = {w}
    if w in IRREGULAR:
        out.add(IRREGULAR[w])
    out.update(p for p, s in IRREGULAR.items() if s == w)
    if w.endswith("ies") and len(w) > 3:
        out.add(w[:-3] + "y")
    if w.endswith("es") and len(w) > 2:
        out.add(w[:-2])
    if w.endswith("s") and len(w) > 1:
        out.add(w[:-1])
    if w.endswith("y") and len(w) > 1:
        out.add(w[:-1] + "ies")
    out.update({w + "s", w + "es"})
    return out


def _phrase_pattern(label: str) -> re.Pattern:
    words = label.lower().split()
    head = "|".join(sorted(map(re.escape, forms(words[-1]))))
    body = r"\s+".join(map(re.escape, words[:-1]))
    return re.compile(rf"\b{body}\s+(?:{head})\b")


class LabelMatcher:
    """Does an altered subject (word, in its caption) match one of a dataset's class labels?"""

    def __init__(self, classes):
        self.single: set[str] = set()
        self.multi: dict[str, list[re.Pattern]] = {}   # head form -> phrase patterns
        for name in classes:
            words = str(name).replace("_", " ").lower().split()
            if not words:
                continue
            if len(words) == 1:
                self.single |= forms(words[0])
            else:
                pattern = _phrase_pattern(" ".join(words))
                for f in forms(words[-1]):
                    self.multi.setdefault(f, []).append(pattern)

    def matches(self, word: str, caption: str = "") -> bool:
        w = str(word).lower()
        if forms(w) & self.single:
            return True
        text = str(caption).lower()
        return any(p.search(text) for p in self.multi.get(w, ()))


def label_frequency(subjects: pd.DataFrame, classes) -> int:
    """Released pairs whose altered subjects match a class label, each pair counted once.

    ``subjects`` has one row per released pair with ``original_word`` and ``new_word`` (and, for
    multi-word labels, the captions ``original`` and ``counterfactual`` they sit in)."""
    matcher = LabelMatcher(classes)
    originals = subjects["original"] if "original" in subjects else [""] * len(subjects)
    counterfactuals = subjects["counterfactual"] if "counterfactual" in subjects else [""] * len(subjects)
    hits = [matcher.matches(a, ca) or matcher.matches(b, cb)
            for a, b, ca, cb in zip(subjects["original_word"], subjects["new_word"], originals, counterfactuals)]
    return int(sum(hits))


#: A.3.2's list of human-related words ("girl", ..., "lady"), verbatim: the paper lists singular and plural
#: forms itself, so matching is exact (lower-cased), without the plural handling of the label frequency
HUMAN_TAXONOMY = ("girl", "boy", "man", "men", "woman", "guy", "kid", "person", "people", "child", "children",
                  "couple", "group", "lady")
HUMAN_TAXONOMY_COLUMNS = ("subject", "original", "counterfactual", "image_text_pairs", "counterfactual_pairs")


def human_taxonomy_table(subjects: pd.DataFrame, words=HUMAN_TAXONOMY) -> pd.DataFrame:
    """Appendix A.3.2: released image-text pairs "related to the human taxonomy", i.e. whose caption's altered
    subject is one of ``words`` (the paper counts 4,117 of the 34,820 image-text pairs).

    Each released counterfactual pair gives two image-text pairs: the original caption (altered subject
    ``original_word``) and the counterfactual one (``new_word``). One row per word: ``original`` and
    ``counterfactual`` (image-text pairs whose altered subject is that word on each side), ``image_text_pairs``
    (their sum) and ``counterfactual_pairs`` (pairs with the word on either side); then a ``total`` row whose
    ``image_text_pairs`` is A.3.2's count and ``counterfactual_pairs`` the pairs with a human subject on either
    side (each pair once). A.3.2's error rate (1,864 errors, 44.3 %) needs the §4.1 human labels, which were
    not released."""
    vocab = [str(w).lower() for w in words]
    original = subjects["original_word"].astype(str).str.strip().str.lower()
    new = subjects["new_word"].astype(str).str.strip().str.lower()
    rows = []
    for word in vocab:
        a, b = original == word, new == word
        rows.append({"subject": word, "original": int(a.sum()), "counterfactual": int(b.sum()),
                     "image_text_pairs": int(a.sum() + b.sum()), "counterfactual_pairs": int((a | b).sum())})
    a, b = original.isin(vocab), new.isin(vocab)
    rows.append({"subject": "total", "original": int(a.sum()), "counterfactual": int(b.sum()),
                 "image_text_pairs": int(a.sum() + b.sum()), "counterfactual_pairs": int((a | b).sum())})
    return pd.DataFrame(rows, columns=list(HUMAN_TAXONOMY_COLUMNS))


def released_subjects(pairs_path: str | Path, captions_path: str | Path) -> pd.DataFrame:
    """One row per released pair (``selected_pairs.parquet``) with its altered subjects and captions, from the
    caption stage's table (joined on the caption id the pair was made from)."""
    pairs = read_pairs(pairs_path)
    captions = pd.read_parquet(captions_path)
    for col in ("caption_id", "original", "counterfactual", "original_word", "new_word"):
        if col not in captions.columns:
            raise input_error(captions_path, None, f"missing column {col!r}",
                              "use the caption stage's counterfactual_captions.parquet")
    key = "caption_id" if "caption_id" in pairs.columns else "id"
    table = pairs[[key]].rename(columns={key: "caption_id"}).astype(str).merge(
        captions.assign(caption_id=captions["caption_id"].astype(str)), on="caption_id", how="left")
    missing = table["original_word"].isna()
    if missing.any():
        raise input_error(pairs_path, f"pair {table.loc[missing, 'caption_id'].iloc[0]}",
                          "released pair without its caption-stage row",
                          "build the pairs and the captions in the same run")
    return table


def label_frequency_table(cfg: dict, pairs_path: str | Path, captions_path: str | Path, runs_path: str | Path,
                          pretrained_path: str | Path, pretrained_role: str) -> pd.DataFrame:
    """Table 6 layout, long form: ``dataset, label_frequency, mixture, delta`` (non-baseline mixtures);
    delta = a mixture's mean top-1 over seeds minus the pre-trained model's top-1 (percentage points as
    the tables store them)."""
    from ...stats import read_runs
    from ...training.runs import PRETRAINED

    subjects = released_subjects(pairs_path, captions_path)
    runs = read_runs(runs_path)
    pre = pd.read_csv(pretrained_path)
    pre = pre[(pre["metric"] == "top1") & (pre["role"] == pretrained_role)]
    if pre.empty:
        raise input_error(pretrained_path, None, f"no top1 row for role {pretrained_role!r}",
                          "list that role under evaluation.classification.models")
    training = cfg["training"]
    rows = []
    for dataset in training["eval"].get("classification") or []:
        spec = cfg["evaluation"]["classification"]["datasets"][dataset]
        freq = label_frequency(subjects, load_dataset(dataset, dict(spec)).classes)
        metric = runs[runs["metric"] == f"{dataset}/top1"]
        base = float(pre.iloc[0][dataset])
        for mixture, group in metric.groupby("mixture", sort=False):
            if mixture in (training["baseline"], PRETRAINED):   # Table 6: the fine-tuned mixtures only
                continue
            rows.append({"dataset": dataset, "label_frequency": freq, "mixture": mixture,
                         "delta": float(group["value"].mean()) - base})
    return pd.DataFrame(rows, columns=["dataset", "label_frequency", "mixture", "delta"])


def table6(long: pd.DataFrame, correlation: dict | None = None, decimals: int = 2):
    """Table 6 in the paper's wide layout (appendix A.2): one row per image-recognition dataset with its COCO-CFs
    Label Frequency and one Δ column per fine-tuned mixture (``COCO-CFs (base) Δ``, ``(medium)``, ``(all)``: mean
    top-1 over seeds minus pre-trained CLIP's, percentage points), rows in decreasing Δ of the first mixture (the
    paper's order: CIFAR100 ... Food101); ``correlation`` (:func:`correlate_or_explain`) is stated below it.
    ``long``: :func:`label_frequency_table`'s frame. A :class:`counterfactory.render.Table`."""
    mixtures = list(dict.fromkeys(long["mixture"].astype(str)))
    wide = long.pivot_table(index=["dataset", "label_frequency"], columns="mixture", values="delta", sort=False)
    wide = wide.reset_index()
    if mixtures:
        wide = wide.sort_values(mixtures[0], ascending=False, kind="stable")
    columns = [Column("IR Dataset", "left"), Column("COCO-CFs Label Frequency", "right")] + [
        Column(f"COCO-CFs ({m}) Δ", "right") for m in mixtures]
    rows = [[str(r["dataset"]), int(r["label_frequency"]), *(float(r[m]) if pd.notna(r[m]) else None for m in mixtures)]
            for _, r in wide.iterrows()]
    note = None
    if correlation:
        if correlation.get("pearson_r") is None:
            note = f"Pearson correlation: {correlation.get('note', 'undefined')}."
        else:
            note = (f"Pearson correlation of label frequency and the {correlation['n']} Δ values: r = "
                    f"{correlation['pearson_r']:.3f}, p = {correlation['pearson_p']:.3f} (the paper: 0.522, p = 0.026).")
    return Table(columns, rows, title="Table 6: Frequency of class label occurrence in COCO-CFs and absolute change "
                 "(Δ) in performance relative to pre-trained CLIP after training on various sizes of COCO-CFs",
                 note=note, decimals=decimals, floatfmt=f".{decimals}f")


def correlate_or_explain(table: pd.DataFrame, x: str, y: str, source: str) -> dict:
    """Pearson/Spearman of ``x`` vs ``y``; when undefined (n < 3, a constant column) a record saying why."""
    from ...stats import correlate

    try:
        return correlate(table, x, y, source=source)
    except CounterFactoryError as exc:
        return {"x": x, "y": y, "n": int(len(table)), "pearson_r": None, "pearson_p": None, "spearman_rho": None,
                "spearman_p": None, "note": f"undefined: {exc}"}


def write_human_taxonomy(pairs_path: str | Path, captions_path: str | Path, out: str | Path) -> pd.DataFrame:
    """Appendix A.3.2's count (:func:`human_taxonomy_table` of the released pairs' altered subjects), written to
    ``out`` (CSV) and returned; its last row is the total."""
    taxonomy = human_taxonomy_table(released_subjects(pairs_path, captions_path))
    write_csv(out, taxonomy)
    return taxonomy


def write_label_frequency(cfg: dict, pairs_path: str | Path, captions_path: str | Path, runs_path: str | Path,
                          pretrained_path: str | Path, pretrained_role: str, out: str | Path,
                          correlation_out: str | Path, *, out_md: str | Path | None = None,
                          out_html: str | Path | None = None) -> tuple[pd.DataFrame, dict]:
    """``counterfactory analysis label-frequency``: Table 6 in long form (:func:`label_frequency_table`) to ``out``
    (CSV), the correlation of label frequency and Δ (:func:`correlate_or_explain`) to ``correlation_out`` (JSON)
    and, when asked, Table 6 in the paper's wide layout (:func:`table6`) as Markdown (``out_md``) and an HTML page
    (``out_html``). Returns the long table and the correlation."""
    table = label_frequency_table(cfg, pairs_path, captions_path, runs_path, pretrained_path, pretrained_role)
    write_csv(out, table)
    result = correlate_or_explain(table, "label_frequency", "delta", source=out)
    write_json(correlation_out, result)
    if out_md or out_html:   # Table 6 as the paper lays it out
        wide = table6(table, result)
        if out_md:
            write_text(out_md, render_markdown(wide))
        if out_html:
            write_text(out_html, html_page("COCO-Counterfactuals: Table 6", [render_html(wide)]))
    return table, result
