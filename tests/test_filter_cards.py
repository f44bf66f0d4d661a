"""Filter cards (issue 47, item 2): a keep/drop filter measured against a hand-labelled audit sample
(counterfactory.filters.cards, ``counterfactory filters card|calibrate``). Every number below is computed by hand."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from counterfactory import cli
from counterfactory.errors import InputError
from counterfactory.filters import cards

# 10 scored items; threshold 0.45 keeps a-e (5 of 10: removal share 0.5)
SCORES = pd.Series([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05], index=list("abcdefghij"), name="clip")
# 6 audited scored items plus z, which the score table lacks
AUDIT_CSV = "item_id,verdict\na,good\nc,bad\nd,YES\nf,1\nh,keep\ni,no\nz,true\n"
# kept audited: a good, c bad, d good -> tp 2, fp 1; removed audited: f good, h good, i bad -> fn 2, tn 1


@pytest.fixture
def audit(tmp_path):
    path = tmp_path / "audit.csv"
    path.write_text(AUDIT_CSV)
    return cards.read_audit(path)


def test_read_audit_spellings(audit):
    assert list(audit["item_id"]) == list("acdfhiz")
    assert list(audit["good"]) == [True, False, True, True, True, False, True]
    assert set(audit["n_votes"]) == {1}


def test_card_by_hand(audit):
    card = cards.filter_card(SCORES, audit, threshold=0.45, resamples=200, seed=1)
    assert card.counts == {"tp": 2, "fp": 1, "fn": 2, "tn": 1}
    m = {k: e.value for k, e in card.metrics.items()}
    assert m["precision"] == pytest.approx(2 / 3)            # kept audited judged good
    assert m["recall"] == pytest.approx(1 / 2)               # good audited kept
    assert m["removed_precision"] == pytest.approx(1 / 3)    # removed audited judged bad
    assert m["removed_recall"] == pytest.approx(1 / 2)       # bad audited removed
    assert m["good_share"] == pytest.approx(4 / 6)
    assert card.removal_share == 0.5                         # over all 10 scored items, not the 6 audited
    assert (card.n_scored, card.n_kept, card.n_removed) == (10, 5, 5)
    assert (card.n_audited, card.n_audited_kept, card.n_scored_unaudited) == (6, 3, 4)
    assert card.audit_unscored == ("z",) and any("z" in n for n in card.notes)


def test_intervals_contain_the_estimate_and_are_seeded(audit):
    one = cards.filter_card(SCORES, audit, threshold=0.45, resamples=300, seed=7)
    two = cards.filter_card(SCORES, audit, threshold=0.45, resamples=300, seed=7)
    assert one.metrics == two.metrics
    for name, e in one.metrics.items():
        assert e.low <= e.value <= e.high, name
        assert 0.0 <= e.low and e.high <= 1.0
    other = cards.filter_card(SCORES, audit, threshold=0.45, resamples=300, seed=8)
    assert other.metrics["precision"].value == one.metrics["precision"].value


def test_keep_below_and_a_kept_column(audit):
    below = cards.filter_card(SCORES, audit, threshold=0.65, keep="below", resamples=50)
    # below keeps d-j (scores <= 0.65): d, f, h good and i bad kept; a good and c bad removed
    assert below.counts == {"tp": 3, "fp": 1, "fn": 1, "tn": 1} and below.n_kept == 7
    vote = cards.filter_card(SCORES >= 0.45, audit, resamples=50)     # a rule filter: kept flags, no threshold
    assert vote.threshold is None and vote.counts == {"tp": 2, "fp": 1, "fn": 2, "tn": 1}
    with pytest.raises(ValueError):
        cards.filter_card(SCORES >= 0.45, audit, threshold=0.5)


def test_threshold_curve(audit):
    curve = cards.threshold_curve(SCORES, audit)
    assert list(curve["threshold"]) == [0.1, 0.2, 0.4, 0.6, 0.7, 0.9]   # the distinct audited scores
    assert list(curve["precision"]) == pytest.approx([4 / 6, 4 / 5, 3 / 4, 2 / 3, 1 / 2, 1])
    assert list(curve["n_kept"]) == [9, 8, 6, 4, 3, 1]
    assert list(curve["removal_share"]) == pytest.approx([0.1, 0.2, 0.4, 0.6, 0.7, 0.9])
    assert list(curve["recall"]) == pytest.approx([1, 1, 3 / 4, 1 / 2, 1 / 4, 1 / 4])


def test_calibrate_picks_the_most_lenient_threshold(audit):
    threshold, card = cards.calibrate(SCORES, audit, 0.75, resamples=50)
    assert threshold == 0.2 and card.metrics["precision"].value == pytest.approx(0.8) and card.n_kept == 8
    threshold, _ = cards.calibrate(SCORES, audit, 0.85, resamples=50)   # precision is not monotone: 0.4 and 0.6 fail
    assert threshold == 0.9
    threshold, card = cards.calibrate(SCORES, audit, 0.7, keep="below", resamples=50)
    assert threshold == 0.6 and card.metrics["precision"].value == pytest.approx(0.75) and card.n_kept == 7
    with pytest.raises(cards.NoThresholdError, match="best 0.750 at threshold 0.6"):
        cards.calibrate(SCORES, audit, 0.9, keep="below")


def test_majority_of_annotators(tmp_path):
    path = tmp_path / "votes.csv"
    path.write_text("item_id,verdict,annotator\nx,1,ann\nx,1,bob\nx,0,cy\ny,0,ann\ny,bad,bob\ny,good,cy\n"
                    "w,1,ann\nw,0,bob\n")
    with pytest.raises(InputError, match=r"votes\.csv, record lines 8, 9: item 'w' has a tie"):
        cards.read_audit(path)
    audit = cards.read_audit(path, ties="drop")
    assert dict(zip(audit["item_id"], audit["good"])) == {"x": True, "y": False}
    assert list(audit["n_votes"]) == [3, 3] and list(audit["n_good"]) == [2, 1]
    settled = cards.read_audit(path, ties="good")
    assert settled.set_index("item_id")["good"].to_dict() == {"x": True, "y": False, "w": True}


@pytest.mark.parametrize("text,where,what", [
    ("item_id,verdict\na,1\nb,maybe\n", "line 3", "'maybe'"),
    ("item_id,verdit\na,1\n", "line 1", "lacks column"),
    ("item_id,verdict\na,1\n\na,0\n", "line 4", "judged twice (first on line 2)"),
    ("item_id,verdict,annotator\na,1,ann\na,0,ann\n", "line 3", "annotator 'ann' judges item 'a' twice"),
    ("item_id,verdict\na,1,extra\n", "line 2", "3 fields"),
    ("item_id,verdict\n,1\n", "line 2", "empty item_id"),
])
def test_bad_audit_names_file_line_and_fix(tmp_path, text, where, what):
    path = tmp_path / "bad_audit.csv"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        cards.read_audit(path)
    msg = str(exc.value)
    assert str(path) in msg and where in msg and what in msg and "Fix:" in msg


def test_render_card(audit):
    card = cards.filter_card(SCORES, audit, threshold=0.45, resamples=50)
    text = cards.render_card(card, cards.threshold_curve(SCORES, audit), "CLIP filter")
    assert text.startswith("# CLIP filter\n") and "keep score >= 0.45" in text
    assert "| precision | 0.667 |" in text and "| removal share | 0.500 |" in text and "## Threshold curve" in text


def test_cli_card_and_calibrate(tmp_path, capsys):
    scores = tmp_path / "scores.parquet"
    pd.DataFrame({"item_id": SCORES.index, "clip": SCORES.values}).to_parquet(scores, index=False)
    audit = tmp_path / "audit.csv"
    audit.write_text(AUDIT_CSV)
    out = tmp_path / "card"
    base = ["--scores", str(scores), "--score-column", "clip", "--audit", str(audit), "--resamples", "50"]
    assert cli.main(["filters", "card", *base, "--threshold", "0.45", "--out-dir", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == set(cards.CARD_FILES)
    data = json.loads((out / "card.json").read_text())
    assert data["removal_share"] == 0.5 and data["n_audit_unscored"] == 1
    assert math.isclose(data["metrics"]["precision"]["value"], 2 / 3)
    assert (out / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert len(pd.read_csv(out / "curve.csv")) == 6
    capsys.readouterr()
    cal = tmp_path / "cal"
    assert cli.main(["filters", "calibrate", *base, "--target-precision", "0.75", "--out-dir", str(cal)]) == 0
    assert capsys.readouterr().out.strip() == "0.2"
    assert json.loads((cal / "card.json").read_text())["threshold"] == 0.2
    assert cli.main(["filters", "card", *base, "--out-dir", str(tmp_path / "x")]) == 2   # a score needs a threshold
    assert "--threshold" in capsys.readouterr().err
