"""CVLD faithful to the paper (round 3, issue 43): nocaps in the paper config (Table 4), the two-stage ITC + ITM
ranking of the FairFace bias metrics (§4.3, Table 3), DEO as the median over bootstrap resamples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def _paper_view():
    from counterfactory.config import load_config

    return load_config([str(REPO / "config" / "config.yaml")], study="cvld")


def test_paper_config_runs_table4_nocaps_columns():
    from counterfactory.studies.cvld import settings as cs

    s = cs.settings(_paper_view())
    assert s["data"]["nocaps"]["annotations"].endswith("nocaps_val_4500_captions.json")
    assert s["data"]["nocaps"]["image_root"].rstrip("/").endswith("images")


class _Fixed:
    """A scorer with fixed scores: ``score_matrix`` returns ``matrix`` (images x texts), ``score_index_pairs`` its
    entries; records the pairs it scored."""

    def __init__(self, matrix, seen=None):
        self.matrix, self.seen = np.asarray(matrix, dtype=float), seen

    def score_matrix(self, images, texts):
        return self.matrix.copy()

    def score_index_pairs(self, images, texts, i, j):
        if self.seen is not None:
            self.seen.extend(zip(np.asarray(i).tolist(), np.asarray(j).tolist()))
        return self.matrix[np.asarray(i), np.asarray(j)]


def test_itc_itm_rerank_hand_computed():
    """BLIP's two stages: each column's ITC top 2 rows re-scored by ITM + ITC, above the rest (kept in ITC order)."""
    from counterfactory.evaluation import cvld

    itc = np.array([[0.9, 0.1], [0.8, 0.2], [0.1, 0.3], [0.0, 0.25]])
    itm = np.array([[0.0, 0.0], [5.0, 0.0], [9.0, 2.0], [0.0, 0.0]])
    seen = []
    scorer = _Fixed(itm, seen)
    by_col, by_row = cvld.itc_itm_rerank(itc, lambda i, j: scorer.score_index_pairs(None, None, i, j), 2, None)
    assert by_row is None
    assert sorted(seen) == [(0, 0), (1, 0), (2, 1), (3, 1)]          # only the shortlists reach ITM
    order = [list(np.argsort(-by_col[:, c], kind="stable")) for c in range(2)]
    assert order == [[1, 0, 2, 3], [2, 3, 1, 0]]                      # row 2's ITM 9.0 cannot lift it into column 0
    assert by_col[1, 0] == pytest.approx(5.8) and by_col[2, 1] == pytest.approx(2.3)


def test_fairface_bias_ranks_with_itc_then_itm(monkeypatch):
    """§4.3: FairFace retrieval is ITC, then ITM over each query's shortlist; the paper config re-ranks to K = 1000."""
    import pandas as pd

    from counterfactory.evaluation import cvld
    from counterfactory.studies.cvld import settings as cs

    itc = np.array([[0.9], [0.8], [0.7], [0.1]])        # 4 images x 1 query: ITC ranks the men (0, 1) first
    itm = np.array([[0.0], [0.0], [3.0], [3.0]])        # ITM prefers images 2 and 3 (women)
    monkeypatch.setattr(cvld, "_itc", lambda m, p, bs: _Fixed(itc))
    monkeypatch.setattr(cvld, "_itm", lambda m, p, bs, kind: _Fixed(itm))
    frame = pd.DataFrame({"image_path": list("abcd"), "gender": ["Male", "Male", "Female", "Female"]})
    itc_only = cvld.fairface_similarity(None, None, frame, ["q"])
    two_stage = cvld.fairface_similarity(None, None, frame, ["q"], rerank_k=3)
    bias = lambda sim: cvld.fairface_bias_table(sim, frame["gender"], ["q"], ks=[1])["bias"].iloc[0]  # noqa: E731
    assert bias(itc_only) == 1.0 and bias(two_stage) == -1.0
    assert list(np.argsort(-two_stage[0], kind="stable")) == [2, 0, 1, 3]   # image 3 is outside the ITC top 3
    assert cs.settings(_paper_view())["retrieval"]["fairface_rerank_k"] == 1000


def test_cvld_retrieval_run_passes_the_fairface_depth_and_records_it(monkeypatch, tmp_path):
    import pandas as pd

    from counterfactory.data import fairface as ffd
    from counterfactory.evaluation import cvld as ev
    from counterfactory.studies.cvld import runs as rn
    from counterfactory.studies.cvld import settings as cs

    faces = pd.DataFrame({"image_path": list("abcd"), "gender": ["Male", "Female"] * 2})
    depths = []
    monkeypatch.setattr(ffd, "load_fairface", lambda root, split: faces)
    monkeypatch.setattr(rn, "_train_coco", lambda *a, **k: (None, None))
    monkeypatch.setattr(ev, "fairface_similarity", lambda m, p, f, q=ev.FAIRFACE_QUERIES, *, batch_size, rerank_k:
                        depths.append(rerank_k) or np.zeros((len(q), len(f))))
    for depth, recorded in ((1000, 4), (None, None)):
        s = cs.settings({"data": {"fairface": {"root": "ff"}}, "retrieval": {"fairface_rerank_k": depth}})
        out = rn._retrieval({}, s, "coco1", "base", 0, {}, tmp_path, None, False)
        assert out.get("FairFace:rerank_k") == recorded
    assert depths == [1000, 1000, None, None]       # Bias / MaxSkew and Figure 5's occupations, per setting


def test_deo_is_the_bootstrap_median_of_the_cited_protocol(monkeypatch, tmp_path):
    """App. A follows Ramaswamy et al. 2021, who report DEO as the median over 500 bootstrap resamples."""
    import pandas as pd

    from counterfactory.data import celeba
    from counterfactory.evaluation import cvld as ev
    from counterfactory.models import registry
    from counterfactory.studies.cvld import runs as rn
    from counterfactory.studies.cvld import settings as cs

    assert cs.settings(_paper_view())["classification"]["deo_resamples"] == 500
    frame = pd.DataFrame({"image_id": ["1", "2"], "Smiling": [1, 0], "Male": [1, 0]})
    seen = []
    monkeypatch.setattr(celeba, "load_celeba", lambda root, name: frame)
    monkeypatch.setattr(registry, "load", lambda cfg, role: (None, None))
    monkeypatch.setattr(ev, "classify_attributes", lambda m, p, f, a, pr, head, batch_size:
                        pd.DataFrame({"image_id": f["image_id"], a[0]: [0.5, -0.5]}))
    monkeypatch.setattr(ev, "classification_metrics", lambda *a, n_resamples, **k: seen.append(n_resamples) or
                        pd.DataFrame([{"attribute": "mean", "DEO": 1.0, "ΔAcc": 0.0, "AP": 1.0, "mAcc": 1.0}]))
    for resamples in (500, 0):
        s = cs.settings({"data": {"celeba": {"root": "c"}},
                         "classification": {"attributes": ["Smiling"], "deo_resamples": resamples}})
        out = rn._classification({}, s, "k16", "pretrained", 0, {}, tmp_path, None, False)
        assert out["deo_resamples"] == resamples
    assert seen == [500, 0]


def _cls_summary(rows):
    import pandas as pd

    return pd.DataFrame([{"experiment": e, "mixture": m, "metric": k, "mean": v, "std": 0.0} for e, m, k, v in rows])


def test_figure4_against_k_and_figure9_relative_improvement():
    """Figure 4's caption: K-shot classification (x = K, a line per λ); Figure 9: relative DEO improvement (app. D)."""
    from counterfactory.studies.cvld import settings as cs
    from counterfactory.studies.cvld import tables as T

    s = cs.settings({})
    summary = _cls_summary([("classification_k16", "base", "DEO", 20.0), ("classification_k256", "base", "DEO", 16.0),
                            ("classification_k16", "cvld", "DEO", 10.0), ("classification_k256", "cvld", "DEO", 8.0),
                            ("classification_k256", "cvld_lam0.5", "DEO", 12.0),
                            ("classification_k256", "base", "DEO:Bangs", 20.0),
                            ("classification_k256", "cvld", "DEO:Bangs", 15.0),
                            ("classification_k256", "base", "DEO:Smiling", 10.0),
                            ("classification_k256", "cvld", "DEO:Smiling", 9.0)])
    points = T.figure4_points(summary, s)
    base = points[(points["lam"] == 0) & (points["metric"] == "DEO")]
    assert base["k"].tolist() == [16, 256] and base["mean"].tolist() == [20.0, 16.0]
    assert sorted(points["lam"].unique()) == [0.0, 0.5, 1.0]
    rel = T.figure9_values(summary, s)
    assert rel.to_dict() == pytest.approx({"Smiling": 10.0, "Bangs": 25.0})        # 100 (base - cvld) / base
    absolute = T.figure9_values(summary, cs.settings({"classification": {"figure9_change": "absolute"}}))
    assert absolute.to_dict() == pytest.approx({"Bangs": -5.0, "Smiling": -1.0})


def test_study_page_cites_app_b_for_the_vote_and_names_no_figure4_k():
    """Issue 43 item 14: the majority vote is appendix B; the paper names no K for Figure 4's λ sweep."""
    page = (REPO / "docs" / "studies" / "cvld.md").read_text()
    assert "Majority vote per image (app. B" in page and "(§3.2-3.3)" not in page
    assert "§5.2: CVLD classification at K = 256" not in page and "neither names the K" in page


def test_table2_384_rows_are_rows_of_the_one_table2(monkeypatch, tmp_path):
    """Issue 43.12: Table 2's subscripted rows are runs at 384 px (settings <subset>-384) and rows of the one Table 2,
    each subset's after its 224 px rows, with the full-data BLIP₃₈₄ row (BLIP's own COCO retrieval checkpoint,
    role itm_blip_coco) under BLIP^PT; the 384 runs train on the subset's rows at 384 px."""
    import pandas as pd

    from counterfactory.studies.cvld import runs as rn
    from counterfactory.studies.cvld import settings as st
    from counterfactory.studies.cvld import tables as tb

    cfg = _paper_view()
    s = st.settings(cfg)
    assert s["retrieval"]["hires"] == {"image_size": 384, "variants": ["base", "balanced", "cvld"],
                                       "full_data_role": "itm_blip_coco"}
    runs = st.runs(s)
    for sub in ("coco10", "coco1"):
        for v in ("base", "balanced", "cvld"):
            assert {"task": "retrieval", "setting": f"{sub}-384", "variant": v, "seed": 0} in runs
    assert {"task": "retrieval", "setting": "full-384", "variant": "base", "seed": 0} in runs
    assert "itm_blip_coco" in cfg["models"]
    assert (rn.role_of(s, "retrieval", "full-384"), rn.role_of(s, "retrieval", "coco10-384"),
            rn.role_of(s, "retrieval", "coco10")) == ("itm_blip_coco", "itm_blip", "itm_blip")
    assert [rn.image_size_of(s, "retrieval", "cvld", x) for x in ("coco10", "coco10-384", "full-384")] == \
        [224, 384, 384]
    assert st.split_setting("coco0.5-384") == ("coco0.5", 384) and st.split_setting("k256") == ("k256", None)

    # the run: the full-data row loads itm_blip_coco at 384 and trains nothing; a subset row trains at 384
    from counterfactory.models import registry
    from counterfactory.training import cvld as tr

    loaded, trained = [], []
    monkeypatch.setattr(registry, "load", lambda c, role: loaded.append(role) or ("m", "p"))
    monkeypatch.setattr("counterfactory.studies.cvld.resolution.set_resolution",
                        lambda m, p, size: loaded.append(size) or (m, p))
    monkeypatch.setattr(tr, "train_retrieval", lambda *a, **k: trained.append(1))
    caps = pd.DataFrame({"image_id": ["1", "2"], "caption": ["A man.", "A dog."], "split": ["train", "train"],
                         "intervened": ["A woman.", "A dog."], "image_path": ["a.jpg", "b.jpg"]})
    assert rn._train_coco(cfg, s, "retrieval", "full-384", "base", 0, {}, tmp_path, caps, False) == ("m", "p")
    assert loaded == ["itm_blip_coco", 384] and not trained

    rows = [{"experiment": e, "mixture": m, "seed": seed, "data_seed": seed, "metric": "COCO:Rec@1",
             "value": 50.0 + seed} for e, m, seeds in (
                ("retrieval", "pretrained", [0]), ("retrieval_full-384", "base", [0]),
                ("retrieval_coco10", "base", [0, 1]), ("retrieval_coco10", "cvld", [0, 1]),
                ("retrieval_coco10-384", "base", [0, 1]), ("retrieval_coco10-384", "cvld", [0, 1]),
                ("retrieval_coco1", "base", [0, 1]), ("retrieval_coco1-384", "base", [0, 1]))
             for seed in seeds]
    tables = dict(tb.paper_tables(tb.summarize(pd.DataFrame(rows)), s))
    t2 = [t for title, t in tables.items() if title.startswith("Table 2")]
    assert len(t2) == 1 and not any("384" in title for title in tables)
    assert t2[0].row_labels == ["BLIP^PT", "BLIP₃₈₄", "COCO 10% BLIP", "COCO 10% CVLD", "COCO 10% BLIP₃₈₄",
                                "COCO 10% CVLD₃₈₄", "COCO 1% BLIP", "COCO 1% BLIP₃₈₄"]
    off = st.settings({"retrieval": {"hires": {"image_size": None}}})
    assert not any("-" in r["setting"] for r in st.runs(off))
