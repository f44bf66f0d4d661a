"""SocialCounterfactuals three-stage filter (§3.4, §8.3, Tables 10-11): threshold edges, the detectability
rule, calibration, label-file errors, Table 11 and the tiny NSFW classifier through the registry."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from counterfactory.errors import ConfigError, InputError
from counterfactory.filters import sets as S
from counterfactory.studies.social_counterfactuals import filtering as F

# unit vectors whose cosine is exactly 0.2 / 0.6 in float64 (checked below)
E0 = [1.0, 0.0]
E02 = [0.2, float(np.sqrt(1 - 0.2 ** 2))]
E06 = [0.6, 0.8]
TABLE10 = {"race_gender": {"gender": 12, "race": 9}, "physical_gender": {"gender": 10, "physical": 5},
           "physical_race": {"race": 13, "physical": 8}}


# ------------------------------------------------------------------------------------------- stage (a)

def test_paper_defaults_and_exact_cosines():
    assert S.ClipThresholds() == S.ClipThresholds(0.2, 0.2)
    assert F.settings({}).clip == S.ClipThresholds(0.2, 0.2)
    out = S.clip_stage([E0, E0], [E02, E06], ["s", "t"])
    assert out["min_image_caption"].tolist() == [0.2, 0.6]


def test_image_caption_inclusive_at_paper_threshold():
    # two identical images (image-image cosine 1) whose captions sit exactly at / just below / above 0.2
    img = [E0, E0]
    at = S.clip_stage(img, [E02, E0], [0, 0])
    assert at["passed"].item() and at["reason"].item() == ""
    th = S.ClipThresholds(np.nextafter(0.2, 1.0), 0.2)
    above = S.clip_stage(img, [E02, E0], [0, 0], th)
    assert not above["passed"].item() and "image_caption<" in above["reason"].item()
    assert S.clip_stage(img, [E02, E0], [0, 0], S.ClipThresholds(np.nextafter(0.2, 0.0), 0.2))["passed"].item()


def test_image_image_strict_at_threshold():
    # captions equal to their images (cosine 1); the two images' cosine is exactly 0.2, then 0.6
    at = S.clip_stage([E0, E02], [E0, E02], [0, 0])
    assert at["min_image_image"].item() == 0.2
    assert not at["passed"].item() and at["reason"].item() == "image_image<=0.2"
    just_below = S.ClipThresholds(0.2, np.nextafter(0.2, 0.0))
    assert S.clip_stage([E0, E02], [E0, E02], [0, 0], just_below)["passed"].item()
    assert not S.clip_stage([E0, E06], [E0, E06], [0, 0], S.ClipThresholds(0.2, 0.6))["passed"].item()
    assert S.clip_stage([E0, E06], [E0, E06], [0, 0], S.ClipThresholds(0.2, np.nextafter(0.6, 0)))["passed"].item()


def test_clip_stage_vectorised_matches_brute_force():
    rng = np.random.default_rng(0)
    sizes = [2, 3, 5, 3, 1, 2, 5]
    labels = np.repeat([f"s{i}" for i in range(len(sizes))], sizes)
    perm = rng.permutation(len(labels))           # sets need not be contiguous
    labels = labels[perm]
    img = rng.normal(size=(len(labels), 8))
    txt = img + rng.normal(scale=1.5, size=img.shape)
    out = S.clip_stage(img, txt, labels, S.ClipThresholds(0.3, 0.0)).set_index("set_index")
    for lab in np.unique(labels):
        rows = np.flatnonzero(labels == lab)
        a = img[rows] / np.linalg.norm(img[rows], axis=1, keepdims=True)
        t = txt[rows] / np.linalg.norm(txt[rows], axis=1, keepdims=True)
        ic = np.sum(a * t, axis=1)
        gram = a @ a.T
        ii = gram[~np.eye(len(rows), dtype=bool)].min() if len(rows) > 1 else np.nan
        r = out.loc[lab]
        assert r["n_images"] == len(rows)
        assert np.isclose(r["min_image_caption"], ic.min()) and np.isclose(r["mean_image_caption"], ic.mean())
        assert (np.isnan(ii) and np.isnan(r["min_image_image"])) or np.isclose(r["min_image_image"], ii)
        assert r["passed"] == (ic.min() >= 0.3 and (np.isnan(ii) or ii > 0.0))
    # chunked Gram matrices give the same minima
    order, starts, counts = S._blocks(pd.factorize(labels)[0])
    unit = img / np.linalg.norm(img, axis=1, keepdims=True)
    full = S._min_pairwise(unit, order, starts, counts)
    tiny = S._min_pairwise(unit, order, starts, counts, budget=1)
    np.testing.assert_array_equal(np.isnan(full), np.isnan(tiny))
    np.testing.assert_allclose(full[~np.isnan(full)], tiny[~np.isnan(tiny)])


def test_clip_stage_rejects_bad_embeddings():
    with pytest.raises(ValueError, match="NaN"):
        S.clip_stage([[np.nan, 0.0]], [E0], [0])
    with pytest.raises(ValueError, match="all-zero"):
        S.clip_stage([[0.0, 0.0]], [E0], [0])


# ------------------------------------------------------------------------------------------- stage (b)

def test_nsfw_flags_argmax_and_threshold_edges():
    labels = ["normal", "nsfw"]
    probs = np.array([[0.7, 0.3], [0.3, 0.7], [0.5, 0.5]])
    assert S.nsfw_flags(probs, labels).tolist() == [False, True, False]          # tie: not flagged
    assert S.nsfw_flags(probs, labels, threshold=0.3).tolist() == [True, True, True]    # inclusive
    assert S.nsfw_flags(probs, labels, threshold=np.nextafter(0.3, 1)).tolist() == [False, True, True]
    assert S.nsfw_flags(probs, ["NORMAL", "NSFW"]).tolist() == [False, True, False]
    with pytest.raises(ValueError, match="exactly once"):
        S.nsfw_flags(probs, ["a", "b"])
    sets = S.nsfw_stage(probs, labels, ["x", "x", "y"])
    assert sets["passed"].tolist() == [False, True]
    assert sets["n_flagged"].tolist() == [1, 0] and sets["max_nsfw_probability"].tolist() == [0.7, 0.5]


# ------------------------------------------------------------------------------------------- stage (c)

PV = [("gender", "female"), ("gender", "male"), ("race", "Asian"), ("race", "Black"), ("race", "Indian")]


def test_attribute_prompts_articles():
    prompts, pv = F.attribute_prompts({"gender": ["female", "male"], "race": ["Asian", "Indian", "White"],
                                       "physical": ["obese", "young", "old"]})
    assert prompts == ["a female person", "a male person", "an Asian person", "an Indian person",
                       "a White person", "an obese person", "a young person", "an old person"]
    assert pv[2] == ("race", "Asian")


def test_detectability_rule_counts_and_ties():
    sim = np.array([
        # female male  Asian Black Indian
        [0.30, 0.20, 0.25, 0.10, 0.10],   # female Asian: both discernible
        [0.30, 0.20, 0.10, 0.25, 0.25],   # male Black: gender wrong, race tie with Indian -> not discernible
        [0.20, 0.30, 0.10, 0.10, 0.30],   # male Indian: both discernible
    ])
    targets = [{"gender": "female", "race": "Asian"}, {"gender": "male", "race": "Black"},
               {"gender": "male", "race": "Indian"}]
    counts, keep = F.detectability(sim, PV, targets, {"gender": 2, "race": 2})
    assert counts == {"gender": 2, "race": 2} and keep                       # exactly at the thresholds
    counts, keep = F.detectability(sim, PV, targets, {"gender": 3, "race": 2})
    assert not keep                                                           # one above for gender
    assert F.detectability(sim, PV, targets, {"gender": 2, "race": 3})[1] is False
    assert F.detectability(sim, PV, targets, {"gender": 0, "race": 0})[1] is True
    # the tied image becomes discernible when its own prompt is ahead by the smallest step
    sim[1, 3] = np.nextafter(0.25, 1)
    assert F.detectability(sim, PV, targets, {"gender": 2, "race": 3}) == ({"gender": 2, "race": 3}, True)
    # extra thresholds (types the set does not have) are ignored; a missing one is a config error
    assert F.detectability(sim, PV, targets, {"gender": 2, "race": 3, "physical": 99})[1]
    with pytest.raises(ConfigError, match="race"):
        F.detectability(sim, PV, targets, {"gender": 2})
    with pytest.raises(ValueError, match="no prompt"):
        F.detectability(sim, PV, [{"gender": "female", "race": "Martian"}] * 3, {"gender": 0, "race": 0})


def test_detectability_batch_matches_single_sets():
    rng = np.random.default_rng(1)
    n = 40
    sim = rng.normal(size=(n, len(PV)))
    sets = rng.integers(0, 6, size=n)
    g = rng.choice(["female", "male"], size=n)
    r = rng.choice(["Asian", "Black", "Indian"], size=n)
    th = {"gender": 3, "race": 2}
    batch = F.detectability_batch(sim, PV, sets, {"gender": g, "race": r}, th).set_index("set_index")
    for s in np.unique(sets):
        rows = np.flatnonzero(sets == s)
        counts, keep = F.detectability(sim[rows], PV, [{"gender": g[i], "race": r[i]} for i in rows], th)
        assert counts == {"gender": batch.loc[s, "count_gender"], "race": batch.loc[s, "count_race"]}
        assert keep == batch.loc[s, "passed"]


# ------------------------------------------------------------------------------------------- calibration

def _detect_sets(rng, n_per_segment=60):
    rows = []
    for seg, (types, n_images) in {"race_gender": (("gender", "race"), 12),
                                   "physical_race": (("race", "physical"), 30)}.items():
        for k in range(n_per_segment):
            row = {"set_id": f"{seg}-p0-s{k}", "candidate_index": k % 3, "segment": seg, "n_images": n_images,
                   "passed": True, "reason": ""}
            for t in ("gender", "race", "physical"):
                row[f"count_{t}"] = int(rng.integers(0, n_images + 1)) if t in types else pd.NA
            rows.append(row)
    frame = pd.DataFrame(rows)
    for t in ("gender", "race", "physical"):
        frame[f"count_{t}"] = frame[f"count_{t}"].astype("Int64")
    return frame


def _labels_for(sets, truth):
    rows = []
    for r in sets.itertuples(index=False):
        for t, thr in truth[r.segment].items():
            rows.append({"set_id": r.set_id, "candidate_index": r.candidate_index, "attribute_type": t,
                         "label": int(getattr(r, f"count_{t}") >= thr)})
    return pd.DataFrame(rows)


def test_calibration_recovers_thresholds(tmp_path):
    rng = np.random.default_rng(2)
    sets = _detect_sets(rng)
    truth = {"race_gender": {"gender": 12, "race": 9}, "physical_race": {"race": 13, "physical": 8}}
    # make each threshold identifiable: counts t-1 and t occur for every (segment, type)
    i = 0
    for seg, per in truth.items():
        for t, thr in per.items():
            idx = sets.index[sets["segment"] == seg]
            sets.loc[idx[i], f"count_{t}"] = thr - 1
            sets.loc[idx[i + 1], f"count_{t}"] = thr
            i += 2
    sets_path, labels_path = tmp_path / "detect.parquet", tmp_path / "labels.csv"
    sets.to_parquet(sets_path, index=False)
    _labels_for(sets, truth).to_csv(labels_path, index=False)
    cfg = {"filter": {"detectability": {"thresholds": {"race_gender": {"gender": 11, "race": 9},
                                                       "physical_race": {"race": 13, "physical": 8}}}}}
    summary = F.calibrate_files(cfg, sets_path, labels_path, tmp_path / "th.json", tmp_path / "report.csv")
    assert summary["thresholds"] == truth
    assert summary["overall"]["accuracy"] == 1.0 and summary["overall"]["f1"] == 1.0
    report = pd.read_csv(tmp_path / "report.csv")
    rg = report[(report["segment"] == "race_gender") & (report["attribute_type"] == "gender")].iloc[0]
    assert rg["threshold"] == 12 and rg["configured_threshold"] == 11 and rg["configured_accuracy"] <= 1.0
    assert set(report["attribute_type"]) >= {"gender", "race", "physical", "*"}


def test_learn_threshold_ties_take_the_strictest():
    # labels separable anywhere in (3, 7]: the largest agreeing threshold wins
    assert F.learn_threshold([1, 2, 3, 7, 8], [0, 0, 0, 1, 1]) == 7
    assert F.learn_threshold([5, 6], [1, 1]) == 5
    assert F.learn_threshold([5, 6], [0, 0]) == 7
    # a noisy label: the best-agreeing count is still found
    assert F.learn_threshold([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 1, 0, 1, 1, 1]) == 6
    assert F.agreement([1, 1, 0, 0], [1, 0, 1, 0]) == {"n": 4, "accuracy": 0.5, "precision": 0.5, "recall": 0.5,
                                                       "f1": 0.5, "tp": 1, "fp": 1, "fn": 1, "tn": 1}


@pytest.mark.parametrize("row, match", [
    ({"set_id": "nope", "candidate_index": "0", "attribute_type": "gender", "label": "1"}, "unknown set"),
    ({"set_id": "race_gender-p0-s0", "candidate_index": "0", "attribute_type": "physical", "label": "1"},
     "not a type of this set's segment"),
    ({"set_id": "race_gender-p0-s0", "candidate_index": "0", "attribute_type": "gender", "label": "yes"},
     "not 0 or 1"),
    ({"set_id": "race_gender-p0-s0", "candidate_index": "0", "attribute_type": "gender", "label": "2"},
     "not 0 or 1"),
    ({"set_id": "race_gender-p0-s0", "candidate_index": "x", "attribute_type": "gender", "label": "1"},
     "not an integer"),
    ({"set_id": "race_gender-p0-s0", "candidate_index": "0", "attribute_type": "race", "label": "1"}, "duplicate"),
])
def test_bad_label_files_name_file_row_and_fix(tmp_path, row, match):
    sets = _detect_sets(np.random.default_rng(3), n_per_segment=3)
    good = {"set_id": "race_gender-p0-s0", "candidate_index": "0", "attribute_type": "race", "label": "0"}
    path = tmp_path / "labels.csv"
    pd.DataFrame([good, row]).to_csv(path, index=False)
    with pytest.raises(InputError) as err:
        F.read_labels(path, sets)
    msg = str(err.value)
    assert match in msg and str(path) in msg and "row 3" in msg and "Fix:" in msg and "\n" not in msg


def test_label_file_missing_column_and_template(tmp_path):
    sets = _detect_sets(np.random.default_rng(4), n_per_segment=5)
    path = tmp_path / "labels.csv"
    pd.DataFrame({"set_id": ["x"], "label": ["1"]}).to_csv(path, index=False)
    with pytest.raises(InputError, match="missing column"):
        F.read_labels(path, sets)
    tpl = F.label_template(sets, sample_size=3, seed=0)
    assert len(tpl) == 2 * 3 * 2 and set(tpl["label"]) == {""}
    assert set(tpl.loc[tpl["segment"] == "physical_race", "attribute_type"]) == {"race", "physical"}


# ------------------------------------------------------------------------------------------- settings

def test_settings_validation():
    st = F.settings({"filter": {"detectability": {"thresholds": TABLE10}, "nsfw": {"threshold": 0.5}}})
    assert st.thresholds == TABLE10 and st.nsfw_threshold == 0.5 and st.template == "{article} {value} person"
    for bad in ({"detectability": {"thresholds": {"race_gender": {"gender": 0.5}}}},
                {"detectability": {"thresholds": {"race_gender": {"gender": -1}}}},
                {"detectability": {"template": "a person"}},
                {"detectability": {"template": "{value} {oops}"}},
                {"nsfw": {"threshold": 2}}, {"clip": {"image_caption_min": "x"}}, {"batch_size": 0}):
        with pytest.raises(ConfigError, match="social_counterfactuals.filter"):
            F.settings({"filter": bad})


# ------------------------------------------------------------------------------------------- end to end

class FakeScorer:
    """Dual encoder stand-in: image embeddings from the file name (``good``/``bad``, an attribute value),
    text embeddings from the words (deterministic)."""

    dual = True
    WORDS = ["female", "male", "Asian", "Black", "doctor", "nurse"]

    def _vec(self, words):
        v = np.full(len(self.WORDS) + 1, 0.05)
        for w in words:
            if w in self.WORDS:
                v[self.WORDS.index(w)] += 1.0
        return v / np.linalg.norm(v)

    def encode_texts(self, texts):
        return np.stack([self._vec(t.split()) for t in texts]).astype(np.float32)

    def encode_images(self, paths):
        out = []
        for p in paths:
            stem = str(p).rsplit("/", 1)[-1].removesuffix(".png")
            words = stem.split("_")
            if "bad" in words:           # unrelated to every caption and every other image
                v = np.zeros(len(self.WORDS) + 1)
                v[-1] = 1.0
                out.append(v)
            else:
                out.append(self._vec(words))
        return np.stack(out).astype(np.float32)


class FakeClassifier:
    labels = ["normal", "nsfw"]

    def probabilities(self, paths):
        return np.array([[0.1, 0.9] if "nsfw" in str(p) else [0.9, 0.1] for p in paths])


def _toy_tables(tmp_path):
    caps, imgs = [], []
    members = [("female", "Asian"), ("male", "Asian"), ("female", "Black"), ("male", "Black")]
    for s in range(2):
        sid = f"race_gender-p0-s{s}"
        for m, (g, r) in enumerate(members):
            caption = f"A photo of a {r} {g} doctor"
            caps.append({"set_id": sid, "segment": "race_gender", "prefix": "A photo of a", "subject": "doctor",
                         "a1_type": "race", "a1": r, "a2_type": "gender", "a2": g, "a3_type": "", "a3": "",
                         "caption": caption, "member_index": m})
            for c in range(3):
                # candidate 0 good; 1 has an unrelated image (CLIP fails); 2 is good but flagged NSFW in set 1
                tag = "bad" if (c == 1 and m == 0) else ("nsfw" if (c == 2 and s == 1 and m == 3) else "ok")
                # in set 0 the race of candidate 2's members is not shown: only gender is discernible
                words = [g, "doctor"] if (s == 0 and c == 2) else [r, g, "doctor"]
                name = f"{sid}/c{c}_m{m}_{tag}_{'_'.join(words)}.png"
                imgs.append({"set_id": sid, "candidate_index": c, "member_index": m, "caption": caption,
                             "image_path": f"images/{name}"})
    (tmp_path / "cand").mkdir()
    pd.DataFrame(caps).to_parquet(tmp_path / "captions.parquet", index=False)
    pd.DataFrame(imgs).to_parquet(tmp_path / "cand" / "candidates.parquet", index=False)
    return tmp_path / "captions.parquet", tmp_path / "cand" / "candidates.parquet"


def test_three_stages_end_to_end_and_table11(tmp_path):
    captions, candidates = _toy_tables(tmp_path)
    cfg = {"filter": {"clip": {"image_caption_min": 0.2, "image_image_min": 0.2},
                      "detectability": {"thresholds": {"race_gender": {"gender": 4, "race": 3}}}, "chunk_images": 5}}
    out = tmp_path / "out"
    s1 = F.filter_clip_files(cfg, candidates, out / "clip" / "kept.parquet", out / "clip" / "sets.parquet",
                             scorer=FakeScorer())
    assert s1 == {"stage": "clip", "sets": 6, "passed": 4, "images": 16}
    kept = pd.read_parquet(out / "clip" / "kept.parquet")
    assert not kept["image_path"].iloc[0].startswith("/")                   # relative to the new folder
    assert (out / "clip" / kept["image_path"].iloc[0]).resolve() == (
        tmp_path / "cand" / "images" / kept["image_path"].iloc[0].split("images/", 1)[1]).resolve()
    s2 = F.filter_nsfw_files(cfg, out / "clip" / "kept.parquet", out / "nsfw" / "kept.parquet",
                             out / "nsfw" / "sets.parquet", classifier=FakeClassifier())
    assert s2["sets"] == 4 and s2["passed"] == 3
    s3 = F.filter_detect_files(cfg, out / "nsfw" / "kept.parquet", out / "det" / "kept.parquet",
                               out / "det" / "sets.csv", captions_path=captions, scorer=FakeScorer())
    assert s3["sets"] == 3 and s3["passed"] == 2
    det = pd.read_csv(out / "det" / "sets.csv", dtype={"set_id": str})
    failed = det[~det["passed"]].iloc[0]
    assert (failed["set_id"], failed["candidate_index"]) == ("race_gender-p0-s0", 2)
    assert failed["count_gender"] == 4 and failed["count_race"] == 0 and failed["reason"] == "race:0<3"
    table = F.filter_table_files(candidates, out / "clip" / "sets.parquet", out / "nsfw" / "sets.parquet",
                                 out / "det" / "sets.csv", tmp_path / "t11.csv", tmp_path / "t11.md", captions)
    row = table.iloc[0]
    assert (row["No. Sets"], row["Images Per Set"], row["No. Images"]) == (6, "4", 24)
    assert (row["Sets After CLIP Sim. Filter"], row["Sets After NSFW Filter"],
            row["Sets After CLIP Attrib. Filter"], row["Final No. Images"]) == (4, 3, 2, 8)
    assert row["% Filtered Out (CLIP Sim.)"] == 33.3 and row["% Filtered Out (NSFW)"] == 25.0
    assert table.iloc[-1]["Attribute Types"] == "Total"
    assert row["Attribute Types"] == "(Race, Gender)"       # Table 11's row name, not the segment key race_gender
    md = (tmp_path / "t11.md").read_text()
    assert "| Attribute Types" in md and "33.3%" in md and "| (Race, Gender)" in md and "race_gender" not in md
    # Table 18 (issue 42 item 6): the occupations left after all three stages
    F.filter_table_files(candidates, out / "clip" / "sets.parquet", out / "nsfw" / "sets.parquet",
                         out / "det" / "sets.csv", tmp_path / "t11b.csv", None, captions,
                         out_table18_csv=tmp_path / "t18.csv", out_table18_md=tmp_path / "t18.md")
    t18 = pd.read_csv(tmp_path / "t18.csv")
    assert t18.to_dict("records") == [{"subject": "doctor", "sets_kept": 2, "segments": "race_gender"}]
    assert "Table 18" in (tmp_path / "t18.md").read_text() and "| doctor" in (tmp_path / "t18.md").read_text()
    empty = F.surviving_subjects(det.assign(passed=False), pd.read_parquet(captions))
    assert empty.empty


def test_table11_total_covers_its_three_segments_and_section_10_2_has_its_own_table(tmp_path):
    """Issue 42 item 5: Table 11 (§3.4) covers the three two-attribute segments; §10.2's physical x race x gender
    segment is filtered the same way but stays out of the total, in a table of its own."""
    cand, sets = [], []
    for seg, members, n_sets in (("race_gender", 4, 3), ("physical_race_gender", 8, 2)):
        types = seg.split("_")
        for s in range(n_sets):
            sid = f"{seg}-p0-s{s}"
            for m in range(members):
                cand.append({"set_id": sid, "candidate_index": 0, "member_index": m, "segment": seg,
                             **{f"a{i + 1}_type": (types[i] if i < len(types) else "") for i in range(3)},
                             "image_path": f"{sid}/{m}.png"})
            sets.append({"set_id": sid, "candidate_index": 0, "passed": s == 0, "n_images": members})
    cand, sets = pd.DataFrame(cand), pd.DataFrame(sets)
    table = F.stage_counts(cand, sets, sets, sets)
    assert table["Attribute Types"].tolist() == ["(Race, Gender)", "Total", "(Physical Char., Race, Gender)"]
    total = table.iloc[1]
    assert (total["No. Sets"], total["No. Images"], total["Final No. Images"]) == (3, 12, 4)   # race_gender only
    md = F.stage_counts_markdown(table)
    first, second = md.split("§10.2", 1)
    assert "| Total" in first and "(Physical Char., Race, Gender)" not in first
    assert "(Physical Char., Race, Gender)" in second and "ours" in second and "| Total" not in second


def test_every_filter_stage_loads_its_model_in_its_own_precision(tmp_path, monkeypatch, repo):
    """Issue 42 item 2: the CLIP, NSFW and detectability stages each have a precision key; the paper config scores in
    fp32 whatever the config-wide precision (auto = bf16 on CUDA); null falls back to the config-wide one."""
    from counterfactory.config import load_config

    view = load_config([repo / "config" / "config.yaml"], study="social_counterfactuals")
    assert [view["filter"][k]["precision"] for k in ("clip", "nsfw", "detectability")] == ["fp32"] * 3
    assert view["precision"] == "auto"
    seen = []
    monkeypatch.setattr(F, "_dual_scorer", lambda cfg, role, batch, progress: seen.append(cfg["precision"]) or FakeScorer())
    monkeypatch.setattr(F.NsfwClassifier, "from_config",
                        classmethod(lambda cls, cfg, *a, **k: seen.append(cfg["precision"]) or FakeClassifier()))
    captions, candidates = _toy_tables(tmp_path)
    cfg = {"precision": "auto", "filter": {"clip": {"image_caption_min": 0.2, "image_image_min": 0.2},
                                           "detectability": {"thresholds": {"race_gender": {"gender": 4, "race": 3}}}}}
    frame = F.read_images(candidates)
    F.run_clip(cfg, frame)
    F.run_nsfw(cfg, frame)
    F.run_detect(cfg, frame, pd.read_parquet(captions))
    assert seen == ["fp32"] * 3
    seen.clear()
    cfg["filter"]["clip"]["precision"] = None
    cfg["filter"]["nsfw"] = {"precision": "bf16"}
    F.run_clip(cfg, frame)
    F.run_nsfw(cfg, frame)
    assert seen == ["auto", "bf16"]


def test_detect_missing_segment_threshold_is_config_error(tmp_path):
    captions, candidates = _toy_tables(tmp_path)
    cfg = {"filter": {"detectability": {"thresholds": {"physical_race": {"race": 1, "physical": 1}}}}}
    with pytest.raises(ConfigError, match="race_gender"):
        F.run_detect(cfg, F.read_images(candidates), pd.read_parquet(captions), scorer=FakeScorer())


def test_detect_threshold_for_an_unknown_type_is_config_error(tmp_path):
    captions, candidates = _toy_tables(tmp_path)
    cfg = {"filter": {"detectability": {"thresholds": {"race_gender": {"race": 1, "gender": 1, "religion": 2}}}}}
    with pytest.raises(ConfigError, match=r"thresholds\.race_gender: threshold for attribute type 'religion'"):
        F.run_detect(cfg, F.read_images(candidates), pd.read_parquet(captions), scorer=FakeScorer())


def test_cli_registers_subcommands():
    from counterfactory.commands import social

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd")
    social.add_filtering(sub)
    args = parser.parse_args(["filter-detect", "--config", "c.yaml", "--images", "i.parquet", "--out", "o.parquet",
                              "--sets", "s.parquet", "--captions", "c.parquet"])
    assert args.func is social._cmd_filter_detect
    for cmd in ("filter-clip", "filter-nsfw", "calibrate", "filter-table"):
        assert cmd in sub.choices


# ------------------------------------------------------------------------------------------- tiny NSFW model

def test_tiny_nsfw_builds_loads_and_flags_deterministically(tmp_path):
    from PIL import Image

    from counterfactory.models import registry, tiny

    folder = tiny.build("nsfw", tmp_path / "models")
    assert (folder / registry.MANIFEST_NAME).exists()
    cfg = {"models": {"nsfw": {"source": str(folder)}}, "device": "cpu", "precision": "fp32"}
    assert registry.model_spec(cfg, "nsfw").library == "transformers"
    model, processor = registry.load(cfg, "nsfw")
    assert type(model).__name__ == "ViTForImageClassification" and model.config.id2label == {0: "normal", 1: "nsfw"}
    assert registry.loaded_models()["nsfw"]["fingerprint"]
    rng = np.random.default_rng(0)
    paths = []
    for i in range(6):
        p = tmp_path / f"im{i}.png"
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    a = F.NsfwClassifier.from_config(cfg, batch_size=4).probabilities(paths)
    b = F.NsfwClassifier.from_config(cfg, batch_size=2).probabilities(paths)
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert a.shape == (6, 2) and np.allclose(a.sum(axis=1), 1)
    assert not S.nsfw_flags(a, ["normal", "nsfw"]).any()          # the tiny model leans to "normal"
    cut = float(np.median(a[:, 1]))
    # decisive: run_nsfw scores at its own batch size, so no probability may lie within rounding of the cut
    assert np.abs(a[:, 1] - cut).min() > 1e-4
    frame = pd.DataFrame({"set_id": ["s0", "s0", "s1", "s1", "s2", "s2"], "candidate_index": 0,
                          "member_index": [0, 1] * 3, "caption": "x", "image_path": paths})
    sets, kept = F.run_nsfw({**cfg, "filter": {"nsfw": {"threshold": cut}}}, frame)
    flagged = a[:, 1] >= cut
    assert sets["passed"].tolist() == [not flagged[0:2].any(), not flagged[2:4].any(), not flagged[4:6].any()]
    assert len(kept) == 2 * int(sets["passed"].sum())
    # the default batch size: the same probabilities up to float rounding (a digest of values rounded to 5 decimals
    # is no such check: one of these lies 4e-9 from a rounding boundary, so rounding noise may flip its 5th decimal)
    np.testing.assert_allclose(F.NsfwClassifier.from_config(cfg).probabilities(paths), a, atol=1e-6)


def test_stages_a_and_c_run_with_the_tiny_clip_scorer(tmp_path):
    from PIL import Image

    from counterfactory.models import tiny

    folder = tiny.build("clip_filter", tmp_path / "models")
    captions, candidates = _toy_tables(tmp_path)
    frame = pd.read_parquet(candidates)
    rng = np.random.default_rng(5)
    for p in frame["image_path"]:
        target = tmp_path / "cand" / p
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(target)
    cfg = {"models": {"clip_filter": {"source": str(folder)}}, "device": "cpu", "precision": "fp32",
           "filter": {"clip": {"image_caption_min": -1.0, "image_image_min": -1.0}, "batch_size": 5,
                      "detectability": {"thresholds": {"race_gender": {"gender": 0, "race": 0}}}}}
    sets, kept = F.run_clip(cfg, F.read_images(candidates))
    assert len(sets) == 6 and sets["passed"].all() and len(kept) == 24
    assert sets["min_image_caption"].between(-1, 1).all() and sets["min_image_image"].between(-1, 1).all()
    det, kept = F.run_detect(cfg, kept, pd.read_parquet(captions))
    assert len(det) == 6 and det["passed"].all() and det["count_gender"].between(0, 4).all()


def test_cli_runs_the_stages_and_the_table(tmp_path, monkeypatch, capsys):
    from counterfactory import cli
    from counterfactory.commands import social

    captions, candidates = _toy_tables(tmp_path)
    cfg = {"filter": {"detectability": {"thresholds": {"race_gender": {"gender": 4, "race": 3}}}}}
    monkeypatch.setattr(social, "_load_config", lambda paths: cfg)   # the study's schema section is added elsewhere
    monkeypatch.setattr(F, "_dual_scorer", lambda *a, **k: FakeScorer())
    monkeypatch.setattr(F.NsfwClassifier, "from_config", classmethod(lambda cls, *a, **k: FakeClassifier()))
    o = tmp_path / "o"
    steps = [
        ["filter-clip", "--images", str(candidates), "--out", f"{o}/a.parquet", "--sets", f"{o}/as.parquet"],
        ["filter-nsfw", "--images", f"{o}/a.parquet", "--out", f"{o}/b.parquet", "--sets", f"{o}/bs.parquet"],
        ["filter-detect", "--images", f"{o}/b.parquet", "--out", f"{o}/c.parquet", "--sets", f"{o}/cs.parquet",
         "--captions", str(captions)],
        ["calibrate", "--sets", f"{o}/cs.parquet", "--write-template", f"{o}/labels.csv", "--sample-size", "2"],
        ["filter-table", "--candidates", str(candidates), "--clip", f"{o}/as.parquet", "--nsfw", f"{o}/bs.parquet",
         "--detect", f"{o}/cs.parquet", "--out-csv", f"{o}/t.csv", "--out-md", f"{o}/t.md"],
    ]
    for step in steps:
        assert cli.main(["social", step[0], "--config", "unused.yaml", *step[1:]]) == 0, step
    out = capsys.readouterr().out
    assert "clip: 4/6 candidate sets passed" in out and "detectability: 2/3" in out
    labels = pd.read_csv(f"{o}/labels.csv", dtype=str, keep_default_na=False)
    assert len(labels) == 2 * 2 and set(labels["attribute_type"]) == {"race", "gender"}
    labels["label"] = "1"
    labels.to_csv(f"{o}/labels.csv", index=False)
    assert cli.main(["social", "calibrate", "--config", "u.yaml", "--sets", f"{o}/cs.parquet", "--labels",
                     f"{o}/labels.csv", "--out", f"{o}/th.json", "--report", f"{o}/report.csv"]) == 0
    assert (o / "th.json").exists() and "Total" in (o / "t.md").read_text()


def test_filtering_per_shard_then_merging_equals_filtering_everything(tmp_path):
    """The rules filter each generation shard on its own and merge: same sets and images as one pass."""
    captions, candidates = _toy_tables(tmp_path)
    cfg = {"filter": {"clip": {"image_caption_min": 0.2, "image_image_min": 0.2},
                      "detectability": {"thresholds": {"race_gender": {"gender": 4, "race": 3}}}}}
    frame = pd.read_parquet(candidates)

    def run(images, folder):
        F.filter_clip_files(cfg, images, folder / "clip.parquet", folder / "clip_sets.parquet", scorer=FakeScorer())
        F.filter_nsfw_files(cfg, folder / "clip.parquet", folder / "nsfw.parquet", folder / "nsfw_sets.parquet",
                            classifier=FakeClassifier())
        F.filter_detect_files(cfg, folder / "nsfw.parquet", folder / "kept.parquet", folder / "detect_sets.parquet",
                              captions_path=captions, scorer=FakeScorer())

    run(candidates, tmp_path / "whole")
    shards = []
    for k, part in enumerate(np.array_split(sorted(frame["candidate_index"].unique()), 2)):
        path = tmp_path / "cand" / f"shard{k}.parquet"       # same folder: image paths stay valid
        frame[frame["candidate_index"].isin(part)].to_parquet(path, index=False)
        run(path, tmp_path / f"s{k}")
        shards.append(tmp_path / f"s{k}")
    counts = F.merge_filter_shards(shards, tmp_path / "merged")
    assert counts.set_index("stage").loc["clip", "sets"] == 6
    for name in ("clip", "nsfw", "kept"):
        a, b = (F.read_images(tmp_path / where / f"{name}.parquet").reset_index(drop=True) for where in ("whole", "merged"))
        a["image_path"], b["image_path"] = (f["image_path"].map(lambda p: str(Path(p).resolve())) for f in (a, b))
        pd.testing.assert_frame_equal(a[["set_id", "candidate_index", "member_index", "image_path"]],
                                      b[["set_id", "candidate_index", "member_index", "image_path"]])
    with pytest.raises(InputError, match="in two shards"):
        F.merge_filter_shards([shards[0], shards[0]], tmp_path / "twice")
