"""Human verification round trip (issue 47.3) without a server: task selection, the tasks and labelling interface,
reading Label Studio's JSON / JSON_MIN exports, kappa, and the CLI. tests/test_label_studio.py runs the same round
trip against a real Label Studio server."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from counterfactory.cli import main
from counterfactory.errors import InputError
from counterfactory.filters import annotate, cards


def _items(tmp_path, n=6, pair=True):
    rows = []
    for i in range(n):
        img = tmp_path / "img" / f"{i}.png"
        img.parent.mkdir(exist_ok=True)
        Image.new("RGB", (4, 4), (i * 40, 0, 0)).save(img)
        row = {"item_id": f"c{i}:0", "image_path": str(img), "caption": f"a red cube {i}"}
        if pair:
            part = tmp_path / "img" / f"{i}b.png"
            Image.new("RGB", (4, 4), (0, i * 40, 0)).save(part)
            row.update(partner_image_path=str(part), partner_caption=f"a green cube {i}")
        rows.append(row)
    return pd.DataFrame(rows)


def test_select_for_review_takes_the_closest_to_the_threshold_then_a_seeded_control_sample():
    scores = pd.Series([0.9, 0.52, 0.1, 0.47, 0.5, 0.8, 0.3], index=list("abcdefg"))
    sel = annotate.select_for_review(scores, threshold=0.5, n_uncertain=3, n_random=2, seed=0)
    assert sel["item_id"][:3].tolist() == ["e", "b", "d"]          # |margin| 0, .02, .03
    assert sel["reason"].tolist() == ["uncertain"] * 3 + ["random"] * 2
    assert np.allclose(sel["margin"][:3], [0.0, 0.02, -0.03])
    control = sel["item_id"][3:].tolist()
    assert len(set(control)) == 2 and not set(control) & {"e", "b", "d"}
    # the draw depends on the ids, not on the table's row order
    again = annotate.select_for_review(scores.iloc[::-1], threshold=0.5, n_uncertain=3, n_random=2, seed=0)
    assert again["item_id"].tolist() == sel["item_id"].tolist()
    other = [annotate.select_for_review(scores, threshold=0.5, n_uncertain=3, n_random=2, seed=s)["item_id"][3:]
             .tolist() for s in range(20)]
    assert len({tuple(o) for o in other}) > 1
    everything = annotate.select_for_review(scores, threshold=0.5, n_uncertain=3, n_random=99, seed=0)
    assert sorted(everything["item_id"]) == sorted(scores.index)


def test_tasks_carry_the_item_id_the_images_and_the_question_and_the_label_config_is_xml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    items = _items(tmp_path)
    scores = pd.Series([0.1, 0.2, 0.45, 0.55, 0.9, 0.95], index=items["item_id"])
    paths = annotate.write_tasks(tmp_path / "ls", items, scores, threshold=0.5, n_uncertain=2, n_random=1, seed=0,
                                 document_root=tmp_path)
    tasks = json.loads(paths[0].read_text())
    assert [t["data"]["item_id"] for t in tasks[:2]] == ["c2:0", "c3:0"]
    first = tasks[0]["data"]
    assert first["image"] == "/data/local-files/?d=img/2.png"
    assert first["partner_image"] == "/data/local-files/?d=img/2b.png"
    assert first["caption"] == "a red cube 2" and first["partner_caption"] == "a green cube 2"
    assert first["question"] == annotate.QUESTION_PAIR and first["reason"] == "uncertain"
    view = ET.fromstring(paths[1].read_text())
    names = {el.get("name") for el in view}
    assert {"image", "caption", "partner", "partner_caption", "verdict"} <= names
    choices = view.find("Choices")
    assert choices.get("toName") == "image" and [c.get("value") for c in choices] == ["Yes", "No"]
    assert pd.read_csv(paths[2])["item_id"].tolist() == [t["data"]["item_id"] for t in tasks]

    embedded = annotate.make_tasks(items, annotate.select_for_review(scores, threshold=0.5, n_uncertain=1,
                                                                      n_random=0, seed=0), image_mode="embed")
    assert embedded[0]["data"]["image"].startswith("data:image/png;base64,")
    single = annotate.label_config(pair=False)
    assert "partner" not in single and ET.fromstring(single).find("Choices") is not None


def test_an_image_outside_the_document_root_and_an_unknown_item_are_refused(tmp_path):
    items = _items(tmp_path, n=2)
    sel = annotate.select_for_review(pd.Series([0.4, 0.6], index=items["item_id"]), threshold=0.5,
                                     n_uncertain=2, n_random=0, seed=0)
    with pytest.raises(InputError, match="not under the document root"):
        annotate.make_tasks(items, sel, document_root=tmp_path / "elsewhere")
    bad = sel.assign(item_id=["c0:0", "nope"])
    with pytest.raises(InputError, match="'nope' of the score table is not in the item table"):
        annotate.make_tasks(items, bad, document_root=tmp_path)


def _full_export(answers):
    """A full JSON export as Label Studio 1.x writes it: one task per item, its annotations with completed_by."""
    tasks = []
    for n, (item, anns) in enumerate(answers.items()):
        tasks.append({"id": n + 1, "data": {"item_id": item, "caption": "x"}, "annotations": [
            {"id": 10 * n + k, "completed_by": who, "was_cancelled": cancelled,
             "result": [] if answer is None else
             [{"from_name": "verdict", "to_name": "image", "type": "choices", "value": {"choices": [answer]}}]}
            for k, (who, answer, cancelled) in enumerate(anns)]})
    return tasks


def test_read_export_reads_the_full_and_the_min_export(tmp_path):
    doc = _full_export({"a": [(1, "Yes", False), ({"id": 2, "email": "b@x.org"}, "No", False)],
                        "b": [(1, "No", False), (2, None, True)],      # a skipped annotation is left out
                        "c": []})                                      # nobody answered
    (tmp_path / "full.json").write_text(json.dumps(doc))
    audit = annotate.read_export(tmp_path / "full.json")
    assert audit.to_dict("records") == [{"item_id": "a", "verdict": True, "annotator": "1"},
                                        {"item_id": "a", "verdict": False, "annotator": "b@x.org"},
                                        {"item_id": "b", "verdict": False, "annotator": "1"}]
    minimal = [{"id": 1, "item_id": "a", "verdict": "Yes", "annotator": 1, "annotation_id": 3},
               {"id": 2, "item_id": "b", "verdict": "No", "annotator": 1},
               {"id": 3, "item_id": "c"}]
    (tmp_path / "min.json").write_text(json.dumps(minimal))
    assert annotate.read_export(tmp_path / "min.json")[["item_id", "verdict"]].values.tolist() == [
        ["a", True], ["b", False]]
    # the audit sample written back is what filters card reads
    annotate.write_audit(audit, tmp_path / "audit.csv")
    read = cards.read_audit(tmp_path / "audit.csv", ties="drop")
    assert read["item_id"].tolist() == ["b"] and read["good"].tolist() == [False]   # 'a' is a 1-1 tie


@pytest.mark.parametrize("doc, message", [
    ({"not": "a list"}, "a list of tasks"),
    ([{"id": 7, "data": {}, "annotations": []}], "task 7 has no data.item_id"),
    ([{"id": 7, "data": {"item_id": "a"}, "annotations": [{"id": 3, "result": [
        {"from_name": "verdict", "value": {"choices": ["Maybe"]}}]}]}], "task 7, annotation 3: the verdict"),
    ([{"id": 7, "data": {"item_id": "a"}, "annotations": [{"id": 3, "result": []}]}], "has no 'verdict' answer"),
    ([{"id": 7, "data": {"item_id": "a"}, "annotations": []}], "no answered task"),
])
def test_a_bad_export_names_the_file_the_task_and_the_fix(tmp_path, doc, message):
    path = tmp_path / "export.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=message) as err:
        annotate.read_export(path)
    assert str(path) in str(err.value) and "Fix:" in str(err.value)


def test_cohen_kappa_by_hand_and_undefined_when_both_raters_never_change():
    a = [1, 1, 0, 0, 1, 0, 1, 1]
    b = [1, 0, 0, 0, 1, 1, 1, 1]
    # observed 6/8; chance: p_a = 5/8, p_b = 5/8 -> 25/64 + 9/64 = 34/64
    expected = (6 / 8 - 34 / 64) / (1 - 34 / 64)
    assert annotate.cohen_kappa(a, b) == pytest.approx(expected, abs=1e-12)
    assert annotate.cohen_kappa([1, 1], [1, 1]) is None
    assert annotate.cohen_kappa([], []) is None


def test_fleiss_kappa_equals_fleiss_1971_worked_example():
    # the 10 items x 5 categories, 14 raters example (Fleiss 1971; statsmodels' fleiss_kappa gives 0.2099307)
    table = np.array([[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
                      [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]])
    assert annotate.fleiss_kappa(table) == pytest.approx(0.2099307044, abs=1e-9)
    # two categories, 3 raters: P-bar = 11/15, Pe = 0.52 -> 0.4444
    assert annotate.fleiss_kappa(np.array([[3, 0], [2, 1], [0, 3], [1, 2], [3, 0]])) == pytest.approx(4 / 9)
    with pytest.raises(Exception, match="same number"):
        annotate.fleiss_kappa(np.array([[2, 0], [1, 2]]))


def test_agreement_between_annotators_and_with_each_filter():
    rows = []
    truth = {"a": (1, 1, 1), "b": (1, 1, 0), "c": (0, 0, 0), "d": (0, 1, 0), "e": (1, 1, 1)}
    for item, votes in truth.items():
        rows += [(item, bool(v), who) for v, who in zip(votes, ("ann1", "ann2", "ann3"))]
    rows.append(("f", True, "ann1"))                     # one answer: not in Fleiss' kappa
    audit = pd.DataFrame(rows, columns=["item_id", "verdict", "annotator"])
    kept = pd.Series([True, True, False, True, False], index=list("abcde"))
    result = annotate.agreement(audit, {"vqa": kept})
    assert result["items"] == 6 and result["annotators"] == ["ann1", "ann2", "ann3"]
    fl = result["fleiss"]
    assert (fl["m"], fl["n"], fl["left_out"]) == (3, 5, 1)
    assert fl["kappa"] == pytest.approx(4 / 9)           # the same table as the hand example above
    pair = next(p for p in result["pairs"] if (p["a"], p["b"]) == ("ann1", "ann2"))
    assert pair["n"] == 5 and pair["agreement"] == pytest.approx(4 / 5)
    assert pair["kappa"] == pytest.approx(annotate.cohen_kappa([1, 1, 0, 0, 1], [1, 1, 0, 1, 1]))
    # majority verdicts a..e: 1 1 0 0 1, f: 1 (unscored); the filter keeps 1 1 0 1 0 -> 3/5 agree
    vqa = result["filters"]["vqa"]
    assert (vqa["n"], vqa["unscored"], vqa["ties_left_out"]) == (5, 1, 0)
    assert vqa["agreement"] == pytest.approx(3 / 5)
    assert vqa["kappa"] == pytest.approx(annotate.cohen_kappa([1, 1, 0, 0, 1], [1, 1, 0, 1, 0]))
    text = annotate.render_agreement(result)
    assert "Fleiss' kappa" in text and "| vqa | 5 |" in text


@pytest.mark.parametrize("spec, parsed", [
    ("vqa=out/vqa.parquet", ("vqa", "out/vqa.parquet", None, None, "above")),
    ("vote=t.csv:kept", ("vote", "t.csv", "kept", None, "above")),
    ("clip=t.parquet:score>=0.7", ("clip", "t.parquet", "score", 0.7, "above")),
    ("nsfw=t.parquet:p<=0.2", ("nsfw", "t.parquet", "p", 0.2, "below")),
])
def test_filter_specs(spec, parsed):
    assert annotate.parse_filter(spec) == parsed


def test_cli_round_trip_tasks_read_agreement_then_filter_card(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    items = _items(tmp_path, n=6)
    items.to_parquet(tmp_path / "pairs.parquet", index=False)
    scores = pd.DataFrame({"item_id": items["item_id"], "score": [0.1, 0.2, 0.45, 0.55, 0.9, 0.95]})
    scores.assign(kept=scores["score"] >= 0.5).to_parquet(tmp_path / "vqa.parquet", index=False)
    assert main(["annotate", "tasks", "--items", "pairs.parquet", "--scores", "vqa.parquet", "--threshold", "0.5",
                 "--uncertain", "4", "--random", "2", "--out-dir", "ls"]) == 0
    tasks = json.loads((tmp_path / "ls" / "tasks.json").read_text())
    assert len(tasks) == 6
    # two annotators answer every task: ann1 says Yes to the items the filter keeps, ann2 disagrees on one
    export = [{"id": n, "data": t["data"], "annotations": [
        {"id": 2 * n + k, "completed_by": k + 1, "was_cancelled": False, "result": [
            {"from_name": "verdict", "to_name": "image", "type": "choices",
             "value": {"choices": ["Yes" if (t["data"]["score"] >= 0.5) != (k == 1 and n == 0) else "No"]}}]}
        for k in range(2)]} for n, t in enumerate(tasks)]
    (tmp_path / "export.json").write_text(json.dumps(export))
    assert main(["annotate", "read", "--export", "export.json", "--out", "audit.csv"]) == 0
    audit = pd.read_csv(tmp_path / "audit.csv")
    assert len(audit) == 12 and set(audit["annotator"]) == {1, 2}
    assert main(["annotate", "agreement", "--audit", "audit.csv", "--filter", "vqa=vqa.parquet",
                 "--out-dir", "agree"]) == 0
    result = json.loads((tmp_path / "agree" / "agreement.json").read_text())
    assert result["pairs"][0]["agreement"] == pytest.approx(5 / 6)
    assert result["filters"]["vqa"]["n"] == 5 and result["filters"]["vqa"]["agreement"] == 1.0   # one tie out
    assert main(["annotate", "agreement", "--audit", "export.json", "--out-dir", "agree2"]) == 0
    assert json.loads((tmp_path / "agree2" / "agreement.json").read_text())["pairs"] == result["pairs"]
    assert main(["filters", "card", "--scores", "vqa.parquet", "--score-column", "score", "--audit", "audit.csv",
                 "--ties", "drop", "--threshold", "0.5", "--resamples", "50", "--out-dir", "card"]) == 0
    card = json.loads((tmp_path / "card" / "card.json").read_text())
    assert card["n_audited"] == 5
