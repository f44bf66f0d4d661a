"""CVLD evaluation: CelebA / FairFace readers, Table 1–4 metrics and the BLIP scoring functions."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from counterfactory.data.celeba import ATTRIBUTES, GENDER_INDEPENDENT, load_celeba
from counterfactory.data.fairface import load_fairface
from counterfactory.errors import InputError
from counterfactory.evaluation import cvld
from counterfactory.metrics import captioning as cap

REPO = Path(__file__).resolve().parents[1]
CELEBA = REPO / "resources" / "demo" / "celeba"
FAIRFACE = REPO / "resources" / "demo" / "fairface"

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------------------------
# readers
# --------------------------------------------------------------------------------------------
def test_celeba_fixture_reads_and_covers_every_group():
    test = load_celeba(CELEBA, "test")
    assert list(test.columns[:3]) == ["image_id", "image_path", "split"]
    assert list(test.columns[3:]) == list(ATTRIBUTES)
    assert len(test) == 8 and set(test["split"]) == {"test"}
    assert len(load_celeba(CELEBA, "val")) == 8 and len(load_celeba(CELEBA, None)) == 24
    # first test image (line 19 of the attribute file) compared with the raw ±1 tokens
    raw = (CELEBA / "list_attr_celeba.txt").read_text().splitlines()[18].split()
    assert raw[0] == test.loc[0, "image_id"] == "000017.jpg"
    assert [int(v) for v in test.loc[0, list(ATTRIBUTES)]] == [(int(v) + 1) // 2 for v in raw[1:]]
    assert test.loc[0, "Male"] == 1 and Path(test.loc[0, "image_path"]).is_file()
    for split in ("train", "test"):
        frame = load_celeba(CELEBA, split)
        for a in GENDER_INDEPENDENT:
            assert len(frame.groupby([a, "Male"])) == 4, (split, a)


def _celeba_copy(tmp_path: Path) -> Path:
    root = tmp_path / "celeba"
    root.mkdir()
    for name in ("list_attr_celeba.txt", "list_eval_partition.txt"):
        shutil.copy(CELEBA / name, root / name)
    return root


def _edit_line(path: Path, lineno: int, fn) -> None:
    lines = path.read_text().splitlines()
    lines[lineno - 1] = fn(lines[lineno - 1])
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("edit, file, where, words", [
    (lambda r: _edit_line(r / "list_attr_celeba.txt", 1, lambda s: "25"), "list_attr_celeba.txt", "line 1",
     "announces 25 images but 24"),
    (lambda r: _edit_line(r / "list_attr_celeba.txt", 2, lambda s: s.replace("Smiling", "Smile")),
     "list_attr_celeba.txt", "line 2", "missing attribute column(s) ['Smiling']"),
    (lambda r: _edit_line(r / "list_attr_celeba.txt", 5, lambda s: s[:11] + " 0" + s[13:]),
     "list_attr_celeba.txt", "line 5", "not 1 or -1"),
    (lambda r: _edit_line(r / "list_attr_celeba.txt", 7, lambda s: s.rsplit(" ", 1)[0]),
     "list_attr_celeba.txt", "line 7", "39 values for 40 attributes"),
    (lambda r: _edit_line(r / "list_eval_partition.txt", 4, lambda s: s[:-1] + "3"),
     "list_eval_partition.txt", "line 4", "unknown partition '3'"),
])
def test_celeba_errors_name_file_and_line(tmp_path, edit, file, where, words):
    root = _celeba_copy(tmp_path)
    edit(root)
    with pytest.raises(InputError) as err:
        load_celeba(root, "test", check_images=False)
    msg = str(err.value)
    assert file in msg and where in msg and words in msg and "Fix:" in msg


def test_celeba_missing_image_is_named(tmp_path):
    root = _celeba_copy(tmp_path)
    with pytest.raises(InputError, match=r"000017\.jpg.*CelebA image not found"):
        load_celeba(root, "test")


def test_fairface_fixture():
    frame = load_fairface(FAIRFACE, "val")
    assert list(frame.columns) == ["image_id", "image_path", "age", "gender", "race", "service_test"]
    assert len(frame) == 20 and (frame["gender"] == "Male").sum() == 10
    assert frame.loc[0, "image_id"] == "val/1.jpg" and frame.loc[0, "race"] == "White"
    assert frame["race"].nunique() == 7 and frame["service_test"].dtype == bool


@pytest.mark.parametrize("old, new, where, words", [
    ("val/2.jpg,30-39,Female", "val/2.jpg,30-39,Other", "line 3", "gender 'Other' is not one of ['Male', 'Female']"),
    ("Male,White", "Male,Martian", "line 2", "race 'Martian' is not one of"),
    ("val/3.jpg,40-49", "val/3.jpg,41-49", "line 4", "age '41-49' is not one of"),
    ("file,age,gender,race,service_test", "file,age,sex,race,service_test", "line 1", "missing column(s) ['gender']"),
])
def test_fairface_errors_name_file_line_and_allowed_set(tmp_path, old, new, where, words):
    root = tmp_path / "ff"
    root.mkdir()
    text = (FAIRFACE / "fairface_label_val.csv").read_text()
    assert old in text
    (root / "fairface_label_val.csv").write_text(text.replace(old, new, 1))
    with pytest.raises(InputError) as err:
        load_fairface(root, "val", check_images=False)
    msg = str(err.value)
    assert "fairface_label_val.csv" in msg and where in msg and words in msg


# --------------------------------------------------------------------------------------------
# Table 1 metrics (hand-computed)
# --------------------------------------------------------------------------------------------
def test_classification_metrics_hand_example():
    gender = [1, 1, 1, 1, 0, 0, 0, 0]
    labels = pd.DataFrame({"A": [1, 1, 0, 0, 1, 1, 0, 0], "B": [1, 0, 1, 0, 1, 0, 1, 0]})
    scores = pd.DataFrame({"A": [0.9, 0.2, 0.1, 0.6, 0.8, 0.7, 0.3, 0.1], "B": [1.0, 0, 1, 0, 1, 0, 1, 0]})
    table = cvld.classification_metrics(scores, labels, gender, threshold=0.5).set_index("attribute")
    # A: predictions 1 0 0 1 | 1 1 0 0. TPR male 1/2, female 2/2 -> DEO 50.
    # Y×A accuracies: (1,m) 1/2, (0,m) 1/2, (1,f) 1, (0,f) 1 -> mAcc 75; overall 6/8 -> ΔAcc 75 − 50 = 25.
    # AP: positives at ranks 1, 2, 3, 6 -> (1 + 1 + 1 + 4/6) / 4.
    a = table.loc["A"]
    assert a["DEO"] == pytest.approx(50) and a["mAcc"] == pytest.approx(75) and a["ΔAcc"] == pytest.approx(25)
    assert a["AP"] == pytest.approx(100 * (3 + 4 / 6) / 4)
    b = table.loc["B"]
    assert (b["AP"], b["mAcc"], b["DEO"], b["ΔAcc"]) == pytest.approx((100, 100, 0, 0))
    mean = table.loc["mean"]
    assert mean["AP"] == pytest.approx((a["AP"] + 100) / 2) and mean["DEO"] == pytest.approx(25)
    assert mean["mAcc"] == pytest.approx(87.5) and mean["ΔAcc"] == pytest.approx(12.5)
    # threshold calibrated on validation: cp = 2 positives -> the 2nd largest validation score, 0.4
    val_l = pd.DataFrame({"A": [1, 0, 1, 0], "B": [1, 0, 1, 0]})
    val_s = pd.DataFrame({"A": [0.4, 0.3, 0.9, 0.1], "B": [0.2, 0.1, 0.3, 0.0]})
    cal = cvld.classification_metrics(scores, labels, gender, val_scores=val_s, val_labels=val_l)
    cal = cal.set_index("attribute")
    assert cal.loc["A", "threshold"] == pytest.approx(0.4) and cal.loc["B", "threshold"] == pytest.approx(0.2)
    assert cal.loc["A", "DEO"] == pytest.approx(50)           # same predictions as at 0.5
    assert cal.loc["B", "mAcc"] == pytest.approx(100)          # 1 > 0.2 > 0


# --------------------------------------------------------------------------------------------
# Bias@K / MaxSkew@K on a hand-made ranking
# --------------------------------------------------------------------------------------------
def test_fairface_bias_table_hand_ranking():
    genders = ["Male", "Female", "Male", "Male", "Female", "Female"]
    sim = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4],     # m f m m | f f
                    [0.1, 0.9, 0.2, 0.3, 0.8, 0.7]])    # f f f m | m m
    table = cvld.fairface_bias_table(sim, genders, ["q0", "q1"], ks=(4, 10))
    row = table.set_index(["query", "k"])
    assert row.loc[("q0", 4), "bias"] == pytest.approx(0.5)                 # (3 − 1) / 4
    assert row.loc[("q0", 4), "max_skew"] == pytest.approx(math.log(1.5))   # ln((3/4) / (1/2))
    assert row.loc[("q1", 4), "bias"] == pytest.approx(-0.5)
    assert row.loc[("mean", 4), "bias"] == pytest.approx(0.0)               # signed values cancel
    assert row.loc[("mean", 4), "abs_bias"] == pytest.approx(0.5)
    assert row.loc[("mean", 4), "max_skew"] == pytest.approx(math.log(1.5))
    assert row.loc[("mean", 10), "k_used"] == 6                             # capped at the 6 images
    assert row.loc[("mean", 10), "bias"] == 0 and row.loc[("mean", 10), "max_skew"] == pytest.approx(0)
    curve = cvld.maxskew_curve(sim, genders, ks=[1, 2])
    assert curve["max_skew"].tolist() == pytest.approx([math.log(2), math.log(2) / 2])


# --------------------------------------------------------------------------------------------
# BLEU-4 / CIDEr / SPICE
# --------------------------------------------------------------------------------------------
REFS = {1: ["A man is riding a brown horse.", "A person rides a horse on the beach."],
        2: ["Two cats sleep on a red bed.", "Cats sleeping on a bed."],
        3: ["A plate of food with broccoli.", "Some broccoli and rice on a plate."]}
CANDS = {1: "a man riding a horse on a beach", 2: "two cats sleeping on a bed", 3: "a plate with rice"}


def test_bleu_cider_match_pycocoevalcap():
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    got = cap.coco_caption_scores(REFS, CANDS, spice=False, percent=False)
    tok = PTBTokenizer()
    gts = tok.tokenize({k: [{"caption": c} for c in v] for k, v in REFS.items()})
    res = tok.tokenize({k: [{"caption": v}] for k, v in CANDS.items()})
    assert got["BLEU-4"] == pytest.approx(Bleu(4).compute_score(gts, res, verbose=0)[0][3])
    assert got["CIDEr"] == pytest.approx(Cider().compute_score(gts, res)[0])
    assert got["SPICE"] is None and got["SPICE_note"] == "SPICE not computed: not requested"
    assert 0 < got["BLEU-4"] < 1


def test_identical_captions_by_hand():
    refs = {1: ["A man riding a brown horse."], 2: ["Two cats sleeping on a red bed."]}
    cands = {1: "a man riding a brown horse", 2: "two cats sleeping on a red bed"}
    got = cap.coco_caption_scores(refs, cands, spice=False)
    assert got["BLEU-4"] == pytest.approx(100.0, abs=1e-4)     # every n-gram matches, no brevity penalty
    # CIDEr-D: cosine 1 for every n, no length penalty, ×10 -> 10 (×100 in percent); shared n-grams ("a")
    # have idf log(2/2) = 0 and drop out of both vectors
    assert got["CIDEr"] == pytest.approx(1000.0, abs=1e-3)
    with pytest.raises(ValueError, match="image ids differ"):
        cap.coco_caption_scores(refs, {1: "a man"}, spice=False)


def test_spice_is_none_without_java_or_jars(monkeypatch):
    reason = cap.spice_available()
    if reason is not None:   # this environment: the Stanford CoreNLP 3.6.0 jars are not installed
        assert "stanford-corenlp-3.6.0" in reason or "Java" in reason
        got = cap.coco_caption_scores(REFS, CANDS, spice=True)
        assert got["SPICE"] is None and reason in got["SPICE_note"]
    monkeypatch.setattr(cap.shutil, "which", lambda name: None)
    assert cap.spice_available() == "no Java runtime on PATH"
    from counterfactory.errors import ConfigError

    with pytest.raises(ConfigError, match="needs Java"):
        cap.coco_caption_scores(REFS, CANDS, spice=True)


# --------------------------------------------------------------------------------------------
# gender words, error, BiasAmp, LIC
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("caption, gender", [
    ("A woman's dog runs on the beach", "female"),
    ("a man and a woman at a table", "neutral"),
    ("the human stands near a manhole", "neutral"),
    ("a shepherd herds sheep", "neutral"),
    ("Her bike leans on a wall", "female"),
    ("Two POLICEMEN on horses", "male"),
    ("a person holding his umbrella", "male"),
    ("a group of people", "neutral"),
    ("a pregnant person", "female"),
])
def test_gender_of_caption(caption, gender):
    assert cap.gender_of_caption(caption) == gender


def test_gender_error_and_bias_amplification_by_hand():
    refs = [["a man with a dog"], ["A man walking a dog", "a guy and his dog"], ["a woman with a dog"],
            ["a woman in a kitchen", "a lady cooking"]]
    preds = ["a man with a dog", "a man with a dog", "a man with a dog", "a woman in a kitchen"]
    gt = [cap.gender_from_references(r) for r in refs]
    assert gt == ["male", "male", "female", "female"]
    assert cap.gender_from_references(["a man", "a woman"]) == "neutral"
    assert cap.gender_error(preds, gt) == pytest.approx(25.0)                    # 1 wrong of 4 gendered
    assert cap.gender_error(preds[:3] + ["a person cooking"], gt) == pytest.approx(100 / 3)
    assert cap.gender_error(preds[:3] + ["a person cooking"], gt, denominator="all") == pytest.approx(25.0)
    # b*(dog, male) = 2/3, b*(kitchen, female) = 1; model: b~(dog, male) = 3/3, b~(kitchen, female) = 1
    # BA = ((1 − 2/3) + (1 − 1)) / |O| with O = {dog, kitchen}
    ba = cap.caption_bias_amplification(refs, preds, vocabulary=["dog", "kitchen"], percent=False)
    assert ba == pytest.approx((1 / 3) / 2)
    # the default vocabulary (COCO categories) has "dog" and no "kitchen": O = {dog}
    assert cap.caption_bias_amplification(refs, preds, percent=False) == pytest.approx(1 / 3)


def test_mask_and_lic():
    assert cap.mask_gender_words("A man and his dog.") == "a genderword and genderword dog"
    n = 40
    genders = ["male", "female"] * (n // 2)
    # the non-gender words alone give the gender away
    leaking = ["a man riding a skateboard" if g == "male" else "a woman in a kitchen" for g in genders]
    high = cap.lic(leaking, genders, seeds=(0, 1, 2), test_size=0.25)
    assert high["lic"] > 55 and high["n_test"] == 10 and len(high["per_seed"]) == 3
    # only the gender word differs: after masking the classifier sees identical captions -> chance level
    masked_only = ["a man with a dog" if g == "male" else "a woman with a dog" for g in genders]
    low = cap.lic(masked_only, genders, seeds=(0, 1, 2), test_size=0.25)
    assert low["lic"] == pytest.approx(25.0, abs=3)       # half right at confidence ~0.5
    # labels unrelated to the content: near chance as well
    genders200 = ["male", "female"] * 100
    leaking200 = ["a man riding a skateboard" if g == "male" else "a woman in a kitchen" for g in genders200]
    shuffled = list(np.random.default_rng(0).permutation(genders200))
    mid = cap.lic(leaking200, shuffled, seeds=(0, 1, 2), test_size=0.25)
    assert mid["lic"] == pytest.approx(25.0, abs=5) and mid["n_test"] == 50
    assert cap.lic(leaking200, genders200, seeds=(0,), test_size=0.25)["lic"] > 90


# --------------------------------------------------------------------------------------------
# scoring with the tiny BLIP models
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def blip(tmp_path_factory):
    from transformers import BlipForImageTextRetrieval, BlipProcessor

    from counterfactory.models.tiny_eval import build_blip

    out = tmp_path_factory.mktemp("blip") / "blip"
    build_blip(out)
    return BlipForImageTextRetrieval.from_pretrained(out), BlipProcessor.from_pretrained(out)


#: raw scores of the tiny BLIP at two batch sizes agree to this (float rounding of other GEMM shapes: ~1e-7)
SCORE_ATOL = 1e-5


def _offsets(n_img: int, n_txt: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Handmade (ITC, ITM logit) offsets whose gaps are all >= 1: ITC a random order of every pair, the ITM logit
    a random order scaled by the pair count, so that it dominates the fused ``ITM + ITC`` score."""
    rng = np.random.default_rng(seed)
    n = n_img * n_txt
    return (rng.permutation(n).reshape(n_img, n_txt).astype(np.float32),
            n * rng.permutation(n).reshape(n_img, n_txt).astype(np.float32))


class _Offset:
    """A real scorer (its batch size recorded in ``seen``) whose scores get a fixed offset per (image, text)."""

    def __init__(self, scorer, offset: np.ndarray, seen: list):
        self.scorer, self.offset = scorer, offset
        seen.append(scorer.batch_size)

    def score_matrix(self, images, texts):
        real = self.scorer.score_matrix(images, texts)
        assert real.shape == self.offset.shape
        return real + self.offset

    def score_index_pairs(self, images, texts, image_idx, text_idx):
        assert (len(images), len(texts)) == self.offset.shape
        return self.scorer.score_index_pairs(images, texts, image_idx, text_idx) + self.offset[image_idx, text_idx]


@pytest.fixture
def decisive(monkeypatch):
    """Rankings of the tiny BLIP are float-rounding noise: it scores every image of a text within ~1e-3 of the
    others (its image embeddings hardly differ), so batch shapes or CPUs reorder them (text->image R@1 91.7 at batch
    size 2, 66.7 at 32). ``decisive(n_img, n_txt, seed)`` makes retrieval_recall's scorers add :func:`_offsets` to
    the real scores (which still run, at the batch size asked for); returns the offsets and the batch sizes seen."""

    def install(n_img: int, n_txt: int, seed: int):
        itc_off, itm_off = _offsets(n_img, n_txt, seed)
        seen = {"itc": [], "itm": []}
        real_itc, real_itm = cvld._itc, cvld._itm
        monkeypatch.setattr(cvld, "_itc", lambda m, p, bs: _Offset(real_itc(m, p, bs), itc_off, seen["itc"]))
        monkeypatch.setattr(cvld, "_itm", lambda m, p, bs, kind: _Offset(real_itm(m, p, bs, kind), itm_off,
                                                                         seen["itm"]))
        return itc_off, itm_off, seen

    return install


def _assert_decisive(*real: np.ndarray) -> None:
    """The real scores added to the offsets (gaps >= 1) cannot reorder them: their spreads sum to well below 1."""
    spread = sum(float(np.ptp(r)) for r in real)
    assert spread < 0.5, f"the tiny BLIP's scores spread over {spread:.3g}: make the offsets' gaps larger"


def _reference_recall(itc: np.ndarray, itm: np.ndarray | None, owner: np.ndarray, ks, rerank_k: int | None) -> dict:
    """BLIP's retrieval evaluation by brute force: per query the ``rerank_k`` best candidates by ITC, ordered by
    ITM + ITC, above all others (``rerank_k=None``: ITC order); a hit: a positive among the first K <= rerank_k."""
    n_img, n_txt = itc.shape
    fused = itc if itm is None else itc + itm

    def ranked(itc_row, fused_row):
        order = sorted(range(len(itc_row)), key=lambda c: -itc_row[c])
        return order if rerank_k is None else sorted(order[:rerank_k], key=lambda c: -fused_row[c])

    out = {}
    for k in ks:
        t2i = [owner[j] in ranked(itc[:, j], fused[:, j])[:k] for j in range(n_txt)]
        i2t = [bool(set(ranked(itc[i], fused[i])[:k]) & set(np.flatnonzero(owner == i))) for i in range(n_img)]
        out[f"text_to_image@{k}"], out[f"image_to_text@{k}"] = 100 * np.mean(t2i), 100 * np.mean(i2t)
    return out


def test_scoring_runs_and_is_batch_size_invariant(blip, decisive):
    from counterfactory.scorers import BlipItcScorer, BlipItmScorer

    model, proc = blip
    test = load_celeba(CELEBA, "test")
    ff = load_fairface(FAIRFACE, "val")
    a = cvld.classify_attributes(model, proc, test, batch_size=3)
    b = cvld.classify_attributes(model, proc, test, batch_size=32)
    assert list(a.columns) == ["image_id", *GENDER_INDEPENDENT] and len(a) == 8
    np.testing.assert_allclose(a[list(GENDER_INDEPENDENT)], b[list(GENDER_INDEPENDENT)], atol=1e-6)
    itm = cvld.classify_attributes(model, proc, test.head(3), ["Smiling"], head="itm")
    assert itm.shape == (3, 2) and np.all(np.abs(itm["Smiling"]) < 1)
    table = cvld.classification_metrics(a, test, test["Male"])
    assert table["attribute"].iloc[-1] == "mean" and table[["AP", "mAcc", "ΔAcc"]].notna().all().all()
    texts = ["a photo of a man", "a photo of a woman", "a dog", "a photo of a person"]
    s1 = cvld.itm_match_scores(model, proc, list(ff["image_path"][:4]), texts, batch_size=1)
    s4 = cvld.itm_match_scores(model, proc, list(ff["image_path"][:4]), texts, batch_size=4)
    assert np.all((s1 > 0) & (s1 < 1)) and np.allclose(s1, s4, atol=1e-6)
    sim2 = cvld.fairface_similarity(model, proc, ff, batch_size=2)
    sim = cvld.fairface_similarity(model, proc, ff)
    assert sim.shape == (10, 20) and np.allclose(sim, sim2, atol=1e-6)
    ret = cvld.fairface_retrieval(model, proc, ff, ks=(1000, 8))
    assert set(ret.loc[ret["k"] == 1000, "k_used"]) == {20} and len(ret) == 22
    assert ret["max_skew"].between(0, math.log(2) + 1e-9).all()

    # retrieval: the scores it ranks (ITC cosines, ITM logits of every pair) agree across batch sizes up to rounding
    images = list(ff["image_path"][:6])
    captions = [[f"a photo of person {i}", "a face"] for i in range(6)]
    flat = [c for caps in captions for c in caps]
    owner = np.repeat(np.arange(6), 2)
    itc_real = {bs: BlipItcScorer(model, proc, batch_size=bs, progress=False).score_matrix(images, flat)
                for bs in (2, 32)}
    pairs = np.divmod(np.arange(6 * 12), 12)
    itm_real = {bs: BlipItmScorer(model, proc, itm_score="logit", batch_size=bs, progress=False)
                .score_index_pairs(images, flat, *pairs).reshape(6, 12) for bs in (2, 32)}
    np.testing.assert_allclose(itc_real[2], itc_real[32], atol=SCORE_ATOL)
    np.testing.assert_allclose(itm_real[2], itm_real[32], atol=SCORE_ATOL)
    # ... and the Recall@K of decisive scores (the real ones plus offsets spaced >= 1) does not depend on it either
    itc_off, itm_off, seen = decisive(6, 12, seed=6)
    _assert_decisive(itc_real[32], itm_real[32])
    r_small = cvld.retrieval_recall(model, proc, images, captions, rerank_k=10, batch_size=2)
    r_big = cvld.retrieval_recall(model, proc, images, captions, rerank_k=10, batch_size=32)
    assert seen == {"itc": [2, 32], "itm": [2, 32]}                   # the real scorers ran at both batch sizes
    ks = (1, 5, 10)
    expected = _reference_recall(itc_real[32] + itc_off, itm_real[32] + itm_off, owner, ks, rerank_k=10)
    itc_ranked = _reference_recall(itc_real[32] + itc_off, None, owner, ks, rerank_k=None)
    full_rerank = _reference_recall(itc_real[32] + itc_off, itm_real[32] + itm_off, owner, ks, rerank_k=12)
    # the design exercises both rules: the ITM re-ranking changes R@1 and R@5, and the 2 texts outside an image's
    # ITC top 10 stay below the re-ranked ones (re-ranking all 12 would change image->text R@1/5/10)
    assert {k for k in expected if expected[k] != itc_ranked[k]} >= {"text_to_image@1", "image_to_text@1"}
    assert {k for k in expected if expected[k] != full_rerank[k]} == {f"image_to_text@{k}" for k in ks}
    for got in (r_small, r_big):
        assert {k: got[k] for k in expected} == pytest.approx(expected)
    assert r_small == r_big and r_small["rerank_k"] == 6
    assert r_small["rec@1"] == pytest.approx(expected["text_to_image@1"]) == 100 / 3
    assert r_small["mrec"] == pytest.approx(np.mean([expected[f"text_to_image@{k}"] for k in ks]))
    itc_only = cvld.retrieval_recall(model, proc, images, captions, rerank_k=None)
    assert itc_only["rerank_k"] is None and seen["itm"] == [2, 32]   # no ITM pass without re-ranking
    assert {k: itc_only[k] for k in itc_ranked} == pytest.approx(itc_ranked)


def test_generate_captions_batch_invariant(tmp_path):
    from transformers import BlipForConditionalGeneration, BlipProcessor

    from counterfactory.models.tiny_eval import build_blip_captioner

    build_blip_captioner(tmp_path / "cap")
    model = BlipForConditionalGeneration.from_pretrained(tmp_path / "cap")
    proc = BlipProcessor.from_pretrained(tmp_path / "cap")
    images = list(load_fairface(FAIRFACE)["image_path"][:3])
    one = cvld.generate_captions(model, proc, images, max_length=12, num_beams=2, batch_size=1)
    three = cvld.generate_captions(model, proc, images, max_length=12, num_beams=2, batch_size=3)
    assert one == three and len(one) == 3 and all(isinstance(c, str) and c for c in one)
    assert not any(c.startswith("a picture of") for c in one)


def test_retrieval_rerank_fuses_itm_logit_and_itc(blip, decisive):
    """With rerank_k >= every set size, BLIP's procedure scores every pair by ITM logit + ITC cosine. On decisive
    scores (offsets spaced >= 1 on the real ones: the tiny model's own rankings are rounding noise)."""
    from counterfactory.metrics.retrieval import recall_at_k
    from counterfactory.scorers import BlipItcScorer, BlipItmScorer

    model, proc = blip
    images = list(load_fairface(FAIRFACE)["image_path"][:5])
    texts = ["a man", "a woman", "a smiling person", "a face with glasses", "a photo"]
    itm = BlipItmScorer(model, proc, progress=False).score_matrix(images, texts)
    itc = BlipItcScorer(model, proc, progress=False).score_matrix(images, texts)
    itc_off, itm_off, _ = decisive(5, 5, seed=4)
    _assert_decisive(itm, itc)
    expected = recall_at_k(itm + itm_off + itc + itc_off, np.arange(5), (1, 5, 10))
    assert expected != recall_at_k(itc + itc_off, np.arange(5), (1, 5, 10))    # the ITM logit changes the ranking
    got = cvld.retrieval_recall(model, proc, images, texts, text_image=range(5), rerank_k=16)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key
    assert (got["text_to_image@1"], got["image_to_text@1"]) == (20.0, 40.0)
    with pytest.raises(Exception, match="rerank_k"):
        cvld.retrieval_recall(model, proc, images, texts, text_image=range(5), rerank_k=2)


# ---------------------------------------------------------------- Table 4's LIC: Hirota et al.'s amplification
def _no_signal_captions(n_male: int, n_female: int, seed: int = 0):
    """Captions whose words do not depend on gender (the gender word itself is masked by LIC)."""
    rng = np.random.default_rng(seed)
    words = ["dog", "table", "street", "kite", "pizza", "beach", "car", "phone", "tree", "horse"]
    genders = ["male"] * n_male + ["female"] * n_female
    caps = [f"a {'man' if g == 'male' else 'woman'} with a {' and a '.join(rng.choice(words, 2))}" for g in genders]
    return caps, genders


def test_lic_is_the_amplification_on_balanced_splits_so_imbalance_alone_does_not_raise_it():
    from counterfactory.studies.cvld import leakage
    from counterfactory.studies.cvld import settings as cvld_settings

    assert cvld_settings.settings(None)["captioning"]["lic"] == "amplification"
    caps, genders = _no_signal_captions(300, 100)               # male:female 3:1, captions without gender signal
    raw = cap.lic(caps, genders, seeds=range(3))["lic"]          # stratified split: the majority class wins
    labels = np.array([g == "female" for g in genders], dtype=np.int64)
    balanced = leakage.leakage(caps, labels, range(3)).mean()
    assert raw > 50 and balanced < 40
    # model captions identical to the human ones: LIC_M == LIC_D on the same splits -> amplification exactly 0
    refs = [[c] * 5 for c in caps]
    out = leakage.lic_amplification(caps, refs, genders, seeds=range(2))
    assert out["LIC"] == 0.0 and out["LIC_M"] == out["LIC_D"] == pytest.approx(balanced, abs=15)
    # a model that writes its gender into the caption leaks more than the human captions
    leaky = [c + (" football" if g == "male" else " handbag") for c, g in zip(caps, genders)]
    assert leakage.lic_amplification(leaky, refs, genders, seeds=range(2))["LIC"] > 20
    with pytest.raises(ValueError, match="male or female"):
        leakage.lic_amplification(caps[:2], refs[:2], ["male", "neutral"], seeds=[0])
