"""Label-frequency analysis (COCO-CF appendix A.2): counting on constructed examples with known counts,
and the statistic on Table 6's printed numbers; A.3.2's human-taxonomy count."""

from __future__ import annotations

import pandas as pd
import pytest

from counterfactory.studies.coco_counterfactuals.label_frequency import (
    HUMAN_TAXONOMY, correlate_or_explain, forms, human_taxonomy_table, label_frequency, label_frequency_table,
    released_subjects)


def _pairs(rows):
    return pd.DataFrame(rows, columns=["original_word", "new_word", "original", "counterfactual"])


def test_each_released_pair_counts_once():
    subjects = _pairs([
        ("dog", "cat", "a dog on a sofa", "a cat on a sofa"),          # both subjects match: counts once
        ("table", "chair", "a table in a room", "a chair in a room"),   # no match
        ("bus", "boxes", "a bus on a road", "boxes on a road"),         # plural of a label
    ])
    assert label_frequency(subjects, ["cat", "dog", "box"]) == 2
    assert label_frequency(subjects, ["airplane"]) == 0


@pytest.mark.parametrize("word, label", [("dogs", "dog"), ("puppies", "puppy"), ("boxes", "box"), ("men", "man"),
                                         ("mouse", "mice"), ("Cats", "cat"), ("bus", "buses"), ("women", "Woman")])
def test_plural_and_case_forms_match(word, label):
    assert label_frequency(_pairs([(word, "zzz", "", "")]), [label]) == 1


def test_unrelated_words_do_not_match():
    assert label_frequency(_pairs([("bus", "car", "a bus", "a car")]), ["bush", "cart", "ca"]) == 0


def test_multi_word_labels_match_as_phrases_around_the_altered_subject():
    subjects = _pairs([
        ("dog", "cat", "a hot dog on a plate", "a hot cat on a plate"),       # original holds "hot dog"
        ("bird", "bear", "a bird on a bed", "a teddy bear on a bed"),          # counterfactual holds "teddy bear"
        ("dog", "horse", "a dog in the park", "a horse in the park"),          # "dog" alone is not "hot dog"
        ("bears", "cars", "two teddy bears", "two teddy cars"),               # plural head of the phrase
    ])
    labels = ["hot dog", "teddy bear"]
    assert label_frequency(subjects, labels) == 3
    assert label_frequency(subjects.iloc[[2]], labels) == 0


def test_counted_over_released_pairs_not_every_caption_pair(tmp_path):
    captions = pd.DataFrame({
        "caption_id": ["1_0", "1_1", "2_0", "3_0"],
        "original": ["a dog", "a cat", "a dog", "a bus"], "counterfactual": ["a cow", "a cow", "a cow", "a car"],
        "original_word": ["dog", "cat", "dog", "bus"], "new_word": ["cow", "cow", "cow", "car"],
    })
    pairs = pd.DataFrame({"id": ["1_0", "3_0"], "caption_0": ["a dog", "a bus"], "caption_1": ["a cow", "a car"],
                          "image_0": ["a.png", "b.png"], "image_1": ["c.png", "d.png"],
                          "caption_id": ["1_0", "3_0"]})
    captions.to_parquet(tmp_path / "c.parquet")
    pairs.to_parquet(tmp_path / "p.parquet")
    released = released_subjects(tmp_path / "p.parquet", tmp_path / "c.parquet")
    assert list(released["caption_id"]) == ["1_0", "3_0"]
    assert label_frequency(released, ["dog", "cat"]) == 1          # 1_1 and 2_0 were never released
    assert label_frequency(captions, ["dog", "cat"]) == 3           # the old (wrong) population


def test_forms_are_symmetric_for_regular_plurals():
    for w in ("dog", "box", "puppy", "bus", "man"):
        plural = {"dog": "dogs", "box": "boxes", "puppy": "puppies", "bus": "buses", "man": "men"}[w]
        assert plural in forms(w) and w in forms(plural)


def test_correlation_undefined_is_explained_not_raised():
    table = pd.DataFrame({"label_frequency": [1, 1, 1], "delta": [0.1, 0.2, 0.3]})
    out = correlate_or_explain(table, "label_frequency", "delta", source="t")
    assert out["pearson_r"] is None and "undefined" in out["note"]


def test_correlation_matches_paper_table6():
    # the statistic on COCO-CF Table 6's printed numbers (the counting is tested above, not here)
    freq = {"CIFAR100": 3446, "Caltech101": 354, "Caltech256": 744, "CIFAR10": 398, "ImageNet": 887, "Food101": 28}
    deltas = {"CIFAR100": (2.50, 2.63, 1.80), "Caltech101": (2.31, 2.55, 2.45), "Caltech256": (1.78, 1.52, 1.16),
              "CIFAR10": (0.65, 0.36, -0.29), "ImageNet": (0.41, -0.03, -0.37), "Food101": (-1.04, -2.05, -2.11)}
    table = pd.DataFrame([{"label_frequency": freq[d], "delta": v} for d in freq for v in deltas[d]])
    out = correlate_or_explain(table, "label_frequency", "delta", source="table6")
    assert out["n"] == 18 and round(out["pearson_r"], 3) == 0.522


def test_table6_from_pipeline_outputs(repo, tmp_path):
    """The label_frequency rule's function on constructed stage outputs: the demo CIFAR-10 fixture's labels,
    three released pairs (two matching), runs over two seeds, the pre-trained model's accuracy."""
    captions = pd.DataFrame({
        "caption_id": ["1_0", "2_0", "3_0", "4_0"],
        "original": ["a dog on grass", "a truck on a road", "a man in a room", "a frog on a leaf"],
        "counterfactual": ["a sheep on grass", "a bus on a road", "a woman in a room", "a toad on a leaf"],
        "original_word": ["dog", "truck", "man", "frog"], "new_word": ["sheep", "bus", "woman", "toad"],
    })
    pairs = pd.DataFrame({"id": ["1_0", "2_0", "3_0"], "caption_id": ["1_0", "2_0", "3_0"],
                          "caption_0": captions["original"][:3], "caption_1": captions["counterfactual"][:3],
                          "image_0": ["a.png"] * 3, "image_1": ["b.png"] * 3})   # 4_0 (frog) not released
    captions.to_parquet(tmp_path / "c.parquet")
    pairs.to_parquet(tmp_path / "p.parquet")
    runs = pd.DataFrame([{"experiment": "coco_cf", "mixture": m, "seed": s, "data_seed": s + 1,
                          "metric": "CIFAR10/top1", "value": v}
                         for m, vals in {"mscoco": (50.0, 52.0), "all": (60.0, 64.0)}.items()
                         for s, v in zip((107, 108), vals)])
    runs.to_csv(tmp_path / "runs.csv", index=False)
    pd.DataFrame([{"metric": "top1", "model": "clip", "role": "clip_eval", "CIFAR10": 55.0}]).to_csv(
        tmp_path / "pre.csv", index=False)
    cfg = {"training": {"baseline": "mscoco", "eval": {"classification": ["CIFAR10"]}},
           "evaluation": {"classification": {"datasets": {"CIFAR10": {
               "format": "cifar10", "root": str(repo / "resources/demo/classification/cifar-10-batches-py"),
               "trust_unofficial_pickle": True}}}}}
    table = label_frequency_table(cfg, tmp_path / "p.parquet", tmp_path / "c.parquet", tmp_path / "runs.csv",
                                  tmp_path / "pre.csv", "clip_eval")
    assert table.to_dict("records") == [{"dataset": "CIFAR10", "label_frequency": 2, "mixture": "all",
                                         "delta": pytest.approx(62.0 - 55.0)}]


def test_table6_leaves_out_the_pretrained_row(repo, tmp_path):
    """The runs table also holds the pre-trained row's run (Tables 3, 4, 12); Table 6 has fine-tuned rows only."""
    captions = pd.DataFrame({"caption_id": ["1_0"], "original": ["a dog on grass"],
                             "counterfactual": ["a cat on grass"], "original_word": ["dog"], "new_word": ["cat"]})
    pairs = pd.DataFrame({"id": ["1_0"], "caption_id": ["1_0"], "caption_0": ["a dog on grass"],
                          "caption_1": ["a cat on grass"], "image_0": ["a.png"], "image_1": ["b.png"]})
    captions.to_parquet(tmp_path / "c.parquet")
    pairs.to_parquet(tmp_path / "p.parquet")
    runs = pd.DataFrame([{"experiment": "coco_cf", "mixture": m, "seed": 107, "data_seed": 108,
                          "metric": "CIFAR10/top1", "value": v}
                         for m, v in {"pretrained": 55.0, "mscoco": 50.0, "all": 60.0}.items()])
    runs.to_csv(tmp_path / "runs.csv", index=False)
    pd.DataFrame([{"metric": "top1", "model": "clip", "role": "clip_eval", "CIFAR10": 55.0}]).to_csv(
        tmp_path / "pre.csv", index=False)
    cfg = {"training": {"baseline": "mscoco", "eval": {"classification": ["CIFAR10"]}},
           "evaluation": {"classification": {"datasets": {"CIFAR10": {
               "format": "cifar10", "root": str(repo / "resources/demo/classification/cifar-10-batches-py"),
               "trust_unofficial_pickle": True}}}}}
    table = label_frequency_table(cfg, tmp_path / "p.parquet", tmp_path / "c.parquet", tmp_path / "runs.csv",
                                  tmp_path / "pre.csv", "clip_eval")
    assert table["mixture"].tolist() == ["all"]


# --------------------------------------------------------------------------------------------
# A.3.2: image-text pairs whose altered subject is one of the 14 human-related words (paper: 4,117)
# --------------------------------------------------------------------------------------------
def test_human_taxonomy_count_on_a_hand_made_pairs_table():
    assert HUMAN_TAXONOMY == ("girl", "boy", "man", "men", "woman", "guy", "kid", "person", "people", "child",
                              "children", "couple", "group", "lady")   # A.3.2's list, verbatim
    subjects = _pairs([
        ("woman", "girl", "a woman with a kite", "a girl with a kite"),   # both sides human: 2 image-text pairs
        ("Man", "dog", "Man on a bench", "dog on a bench"),               # original side only (case-insensitive)
        ("table", "people", "a table outside", "people outside"),         # counterfactual side only
        ("women", "girls", "two women", "two girls"),                     # plurals not on the list: not counted
        ("building", "house", "a building", "a house"),                   # no human subject
        ("man", "men", "a man", "men"),                                   # both sides
    ])
    table = human_taxonomy_table(subjects)
    assert list(table.columns) == ["subject", "original", "counterfactual", "image_text_pairs", "counterfactual_pairs"]
    assert table["subject"].tolist() == [*HUMAN_TAXONOMY, "total"]
    total = table.iloc[-1].to_dict()
    assert total == {"subject": "total", "original": 3, "counterfactual": 3, "image_text_pairs": 6,
                     "counterfactual_pairs": 4}
    by = table.set_index("subject")
    assert by.loc["man", ["original", "counterfactual", "image_text_pairs", "counterfactual_pairs"]].tolist() == [
        2, 0, 2, 2]
    assert by.loc["men", "counterfactual"] == 1 and by.loc["girl", "counterfactual"] == 1
    assert by.loc["people", "image_text_pairs"] == 1 and by.loc["lady", "image_text_pairs"] == 0
    assert by.drop("total")["image_text_pairs"].sum() == total["image_text_pairs"]


def test_label_frequency_command_writes_the_human_taxonomy(repo, tmp_path):
    from counterfactory.cli import main

    captions = pd.DataFrame({"caption_id": ["1_0", "2_0"], "original": ["a man on a bench", "a dog on grass"],
                             "counterfactual": ["a woman on a bench", "a cat on grass"],
                             "original_word": ["man", "dog"], "new_word": ["woman", "cat"]})
    pairs = pd.DataFrame({"id": ["1_0", "2_0"], "caption_id": ["1_0", "2_0"], "caption_0": captions["original"],
                          "caption_1": captions["counterfactual"], "image_0": ["a.png"] * 2, "image_1": ["b.png"] * 2})
    captions.to_parquet(tmp_path / "c.parquet")
    pairs.to_parquet(tmp_path / "p.parquet")
    pd.DataFrame([{"experiment": "coco_cf", "mixture": m, "seed": s, "data_seed": s + 1, "metric": f"{d}/top1",
                   "value": 50.0 + s % 2} for m in ("mscoco", "base") for s in (107, 108)
                  for d in ("CIFAR10", "Caltech101")]).to_csv(tmp_path / "runs.csv", index=False)
    pd.DataFrame([{"metric": "top1", "model": "clip", "role": "clip_eval", "CIFAR10": 50.0,
                   "Caltech101": 50.0}]).to_csv(tmp_path / "pre.csv", index=False)
    out = tmp_path / "human_taxonomy.csv"
    assert main(["analysis", "label-frequency", "--config", str(repo / "config" / "demo.yaml"),
                 "--pairs", str(tmp_path / "p.parquet"), "--captions", str(tmp_path / "c.parquet"),
                 "--runs", str(tmp_path / "runs.csv"), "--pretrained", str(tmp_path / "pre.csv"),
                 "--out", str(tmp_path / "lf.csv"), "--correlation", str(tmp_path / "lf.json"),
                 "--human-taxonomy", str(out)]) == 0
    total = pd.read_csv(out).set_index("subject").loc["total"]
    assert total["image_text_pairs"] == 2 and total["counterfactual_pairs"] == 1


def test_table6_in_the_papers_wide_layout():
    """Issue 42 item 12: appendix A.2's Table 6 is wide: IR Dataset, COCO-CFs Label Frequency and one Δ column per
    fine-tuned mixture (base, medium, all), rows by decreasing Δ of the first (CIFAR100 ... Food101)."""
    from counterfactory.render import render_html, render_markdown
    from counterfactory.studies.coco_counterfactuals.label_frequency import table6

    paper = {"CIFAR100": (3446, 2.50, 2.63, 1.80), "Food101": (28, -1.04, -2.05, -2.11),
             "Caltech101": (354, 2.31, 2.55, 2.45)}
    long = pd.DataFrame([{"dataset": d, "label_frequency": f, "mixture": m, "delta": v}
                         for d, (f, *deltas) in paper.items() for m, v in zip(("base", "medium", "all"), deltas)])
    corr = correlate_or_explain(long, "label_frequency", "delta", source="t")
    t = table6(long, corr)
    assert [c.label for c in t.columns] == ["IR Dataset", "COCO-CFs Label Frequency", "COCO-CFs (base) Δ",
                                            "COCO-CFs (medium) Δ", "COCO-CFs (all) Δ"]
    assert [r[0] for r in t.rows] == ["CIFAR100", "Caltech101", "Food101"]
    assert t.rows[0][1:] == [3446, 2.50, 2.63, 1.80]
    md = render_markdown(t)
    assert "| CIFAR100" in md and "3446" in md and "-2.11" in md and "r = " in md
    assert "Food101" in render_html(t)
