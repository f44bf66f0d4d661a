"""SocialCounterfactuals bias probing (§4, §10): neutral queries, K, metrics against the metrics library, marginals,
the runner with a stand-in dual encoder, tables and figures."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from counterfactory.metrics.retrieval import bias_at_k, max_skew_at_k, min_skew_at_k, ndkl, ranking_from_scores
from counterfactory.studies.social_counterfactuals import probing as pr
from counterfactory.studies.social_counterfactuals import probe_report as rp


def rows_to_frame(rows):
    return pd.DataFrame(rows)


def pick(df, attribute, metric, given="all", label=""):
    sel = df[(df["attribute"] == attribute) & (df["metric"] == metric) & (df["given"] == given)
             & (df["label"] == label)]
    assert len(sel) == 1, (attribute, metric, given, label, sel)
    return sel.iloc[0]


# ------------------------------------------------------------------ neutral queries
@pytest.mark.parametrize("prefix, subject, expected", [
    ("A/An", "doctor", "A doctor"),
    ("A", "umpire", "An umpire"),                       # the prefixes of resources/social/attributes.yaml
    ("A photo of a", "umpire", "A photo of an umpire"),
    ("", "umpire", "An umpire"),
    ("A photo of", "architect", "A photo of an architect"),
    ("A picture of a", "engineer", "A picture of an engineer"),
    ("An image of an", "web developer", "An image of a web developer"),
    ("A photo of", "university professor", "A photo of a university professor"),
    ("A photo of", "hour worker", "A photo of an hour worker"),
    ("A photo of", "CEO", "A photo of a CEO"),
    ("A photo of", "MBA student", "A photo of an MBA student"),
])
def test_neutral_query_article(prefix, subject, expected):
    assert pr.neutral_query(prefix, subject) == expected


class FakeScorer:
    """Dual encoder stand-in: fixed embeddings per text / per image path (rows L2-normalised)."""

    def __init__(self, texts=None, images=None, dim=4, seed=0):
        self.texts, self.images, self.dim = dict(texts or {}), dict(images or {}), dim
        self.rng = np.random.default_rng(seed)
        self.encoded_texts: list[str] = []

    def _get(self, table, key):
        if key not in table:
            v = self.rng.normal(size=self.dim)
            table[key] = v
        v = np.asarray(table[key], dtype=np.float64)
        return v / np.linalg.norm(v)

    def encode_texts(self, texts):
        self.encoded_texts += list(texts)
        return np.stack([self._get(self.texts, t) for t in texts])

    def encode_images(self, paths):
        return np.stack([self._get(self.images, str(p).rsplit("/", 1)[-1]) for p in paths])


def test_average_query_embedding_is_renormalised_mean():
    emb = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.6, 0.8]])
    got = pr.average_query_embedding(emb)
    mean = emb.mean(axis=0)
    np.testing.assert_allclose(got, mean / np.linalg.norm(mean))
    assert math.isclose(np.linalg.norm(got), 1.0)
    with pytest.raises(ValueError):
        pr.average_query_embedding(np.array([[1.0, 0.0], [-1.0, 0.0]]))


def test_subject_query_embeddings_average_over_prefixes():
    prefixes = ["A/An", "A photo of", "An image of"]
    texts = {"A nurse": [1, 0, 0, 0], "A photo of a nurse": [0, 1, 0, 0], "An image of a nurse": [0, 0, 3, 4]}
    sc = FakeScorer(texts=texts)
    q = pr.subject_query_embeddings(sc, ["nurse"], prefixes)["nurse"]
    expected = np.array([1, 1, 0.6, 0.8]) / 3
    np.testing.assert_allclose(q, expected / np.linalg.norm(expected))
    assert sorted(sc.encoded_texts) == sorted(texts)


# ------------------------------------------------------------------ metrics of one ranking
RACES = ["white", "black", "indian", "asian", "middle eastern", "latino"]
GENDERS = ["male", "female"]


def test_k_is_product_of_attribute_set_sizes():
    labels = [(r, g) for _ in range(2) for r in RACES for g in GENDERS]       # 24 images
    scores = np.linspace(1, 0, len(labels))
    df = rows_to_frame(pr.retrieval_metrics(scores, labels, {"race": RACES, "gender": GENDERS}))
    assert pick(df, "intersectional", "maxskew")["k"] == 12
    assert pick(df, "gender", "bias")["k"] == 12
    phys = ["skinny", "obese", "young", "old", "tattooed"]
    labels3 = [(p, r, g) for p in phys for r in RACES for g in GENDERS] * 2     # 120 images
    df3 = rows_to_frame(pr.retrieval_metrics(np.arange(120.0), labels3,
                                             {"physical": phys, "race": RACES, "gender": GENDERS}))
    assert pick(df3, "intersectional", "maxskew")["k"] == 60                    # §10.2: MaxSkew@60
    assert pick(df3, "race+gender", "maxskew")["k"] == 60
    # a pool smaller than K uses k = pool size
    small = rows_to_frame(pr.retrieval_metrics([0.3, 0.2, 0.1], labels[:3], {"race": RACES, "gender": GENDERS}))
    assert pick(small, "intersectional", "maxskew")["k"] == 3


def test_metrics_equal_library_on_hand_made_ranking():
    rng = np.random.default_rng(3)
    values = {"race": ["a", "b", "c"], "gender": GENDERS}
    labels = [(rng.choice(values["race"]), rng.choice(GENDERS)) for _ in range(30)]
    scores = rng.normal(size=30).round(1)                                      # ties on purpose
    df = rows_to_frame(pr.retrieval_metrics(scores, labels, values))
    order = ranking_from_scores(scores)
    joint = ["|".join(labels[i]) for i in order]
    all_joint = [f"{r}|{g}" for r in values["race"] for g in GENDERS]
    assert pick(df, "intersectional", "maxskew")["value"] == pytest.approx(max_skew_at_k(joint, 6, labels=all_joint))
    assert pick(df, "intersectional", "minskew")["value"] == pytest.approx(min_skew_at_k(joint, 6, labels=all_joint))
    assert pick(df, "intersectional", "ndkl")["value"] == pytest.approx(ndkl(joint, labels=all_joint))
    assert pick(df, "intersectional", "ndkl")["k"] == 30
    genders = [labels[i][1] for i in order]
    assert pick(df, "gender", "bias")["value"] == pytest.approx(bias_at_k(genders, 6))
    assert pick(df, "race", "maxskew")["value"] == pytest.approx(max_skew_at_k([labels[i][0] for i in order], 6,
                                                                               labels=values["race"]))
    shares = df[(df["metric"] == "share") & (df["attribute"] == "intersectional")]
    assert shares["value"].sum() == pytest.approx(1.0)
    # NDKL over the top K² (§10.1 wording)
    dk = rows_to_frame(pr.retrieval_metrics(scores, labels, values, ndkl_depth="k_squared"))
    assert pick(dk, "intersectional", "ndkl")["k"] == 30                       # min(36, 30)
    dk2 = rows_to_frame(pr.retrieval_metrics(scores, labels, values, k=4, ndkl_depth="k_squared"))
    assert pick(dk2, "intersectional", "ndkl")["value"] == pytest.approx(ndkl(joint[:16], labels=all_joint))


def test_marginals_known_answer():
    # ranking (scores descending): a|m, a|m, b|f, a|f, b|m, b|f, a|m, b|m
    labels = [("a", "male"), ("a", "male"), ("b", "female"), ("a", "female"),
              ("b", "male"), ("b", "female"), ("a", "male"), ("b", "male")]
    scores = np.arange(8, 0, -1, dtype=float)
    values = {"race": ["a", "b"], "gender": GENDERS}
    df = rows_to_frame(pr.retrieval_metrics(scores, labels, values))           # K = 4
    # given race = a: genders in rank order m, m, f, m -> top 4: p_m = 3/4
    assert pick(df, "gender", "maxskew", "race=a")["value"] == pytest.approx(math.log(1.5))
    assert pick(df, "gender", "minskew", "race=a")["value"] == pytest.approx(math.log(0.5))
    assert pick(df, "gender", "bias", "race=a")["value"] == pytest.approx(0.5)
    # given race = b: f, m, f, m -> balanced
    assert pick(df, "gender", "maxskew", "race=b")["value"] == pytest.approx(0.0)
    assert pick(df, "gender", "bias", "race=b")["value"] == pytest.approx(0.0)
    # given gender = male: races a, a, b, a -> ln(3/4 / 1/2)
    assert pick(df, "race", "maxskew", "gender=male")["value"] == pytest.approx(math.log(1.5))
    # unconditioned marginal on the top 4 of the full ranking: m, m, f, f
    assert pick(df, "gender", "maxskew")["value"] == pytest.approx(0.0)
    assert pick(df, "gender", "share", label="male")["value"] == pytest.approx(0.5)
    # intersectional top 4: a|m x2, b|f, a|f; b|m absent (share replaced by 1/k)
    assert pick(df, "intersectional", "maxskew")["value"] == pytest.approx(math.log(2))
    assert pick(df, "intersectional", "skew", label="b|male")["value"] == pytest.approx(0.0)
    assert pick(df, "intersectional", "share", label="a|male")["value"] == pytest.approx(0.5)
    # K = |A_t| for the marginals: top 2 of race=a are m, m
    da = rows_to_frame(pr.retrieval_metrics(scores, labels, values, marginal_k="attribute"))
    assert pick(da, "gender", "maxskew", "race=a")["value"] == pytest.approx(math.log(2))
    assert pick(da, "gender", "bias", "race=a")["value"] == pytest.approx(1.0)
    assert pick(da, "gender", "maxskew", "race=a")["k"] == 2


def test_ties_keep_pool_order_and_bad_labels_fail():
    labels = [("a", "male"), ("a", "female"), ("b", "female"), ("b", "male")]
    df = rows_to_frame(pr.retrieval_metrics(np.zeros(4), labels, {"race": ["a", "b"], "gender": GENDERS}, k=1))
    assert pick(df, "intersectional", "share", label="a|male")["value"] == 1.0
    with pytest.raises(ValueError, match="not among"):
        pr.retrieval_metrics([1.0], [("c", "male")], {"race": ["a", "b"], "gender": GENDERS})


# ------------------------------------------------------------------ runner, tables, figures
def make_table(tmp_path):
    rows = []
    prefixes = ["A/An", "A photo of"]
    for subj in ("doctor", "umpire"):
        for s, prefix in enumerate(prefixes):
            for m, (r, g) in enumerate([(r, g) for r in ("a", "b") for g in GENDERS]):
                name = f"{subj}_{s}_{m}.png"
                rows.append(dict(set_id=f"{subj}-{s}", candidate_index=0, member_index=m, segment="race-gender",
                                 prefix=prefix, subject=subj, caption=f"{prefix} {r} {g} {subj}", a1_type="race",
                                 a1=r, a2_type="gender", a2=g, image_path=f"img/{name}"))
    path = tmp_path / "kept.parquet"
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def test_probe_runner_with_stand_in_scorer(tmp_path, monkeypatch):
    path = make_table(tmp_path)
    scorers = {}

    def factory(cfg, role):
        scorers[role] = FakeScorer(seed=len(scorers))
        return scorers[role]

    df = pr.probe({}, ["m1", "m2"], path, scorer_factory=factory)
    assert list(df.columns) == pr.PROBE_COLUMNS
    assert set(df["model"]) == {"m1", "m2"} and set(df["subject"]) == {"doctor", "umpire"}
    assert pick(df[(df["model"] == "m1") & (df["subject"] == "doctor")], "intersectional", "pool_size")["value"] == 8
    # recompute one subject by hand: cosine to the prefix-averaged neutral query
    sc = scorers["m1"]
    table = pr.read_images_table(path)
    assert table["image_path"].iloc[0].startswith(str(tmp_path))
    pool = table[table["subject"] == "doctor"]
    q = pr.average_query_embedding(np.stack([sc._get(sc.texts, t) for t in ("A doctor", "A photo of a doctor")]))
    scores = np.stack([sc._get(sc.images, p.rsplit("/", 1)[-1]) for p in pool["image_path"]]) @ q
    joint = ["|".join(x) for x in np.array(pool[["a1", "a2"]])[ranking_from_scores(scores)]]
    got = pick(df[(df["model"] == "m1") & (df["subject"] == "doctor")], "intersectional", "maxskew")
    assert got["value"] == pytest.approx(max_skew_at_k(joint, 4, labels=["a|male", "a|female", "b|male", "b|female"]))

    # tables (Tables 12-15 layouts) and their renderings
    tables = rp.paper_tables(df)
    dist = tables["NDKL distribution across occupations, segment (Race, Gender)"]
    assert list(dist.columns) == ["Mean", "Std", "Min", "25%", "50%", "75%", "Max"]
    assert list(dist.index) == ["m1", "m2"]
    bias = tables["Bias@K across occupations (segments with gender; positive = male)"]
    assert list(bias.columns) == ["m1", "m2"] and list(bias.index) == ["(Race, Gender)"]
    assert "| m1" in rp.tables_markdown(tables) and "\\begin{tabular}" in rp.tables_latex(tables)
    assert len(rp.tables_long(tables)) > 0

    # CSV round trip and figures
    from counterfactory.io import write_csv

    write_csv(tmp_path / "probe.csv", df)
    back = pr.read_probe(tmp_path / "probe.csv")
    assert len(back) == len(df) and (back["label"] == "").sum() == (df["label"] == "").sum()
    closed = []
    real = rp._pyplot()

    class _Recording:                          # pyplot, but remembers the figures it closes
        def __getattr__(self, name):
            return getattr(real, name)

        def close(self, fig):
            closed.append([ax.get_title() for ax in fig.axes])
            real.close(fig)

    monkeypatch.setattr(rp, "_pyplot", _Recording)
    assert rp.figure_maxskew_boxplots(back, tmp_path / "f3.png").stat().st_size > 0
    assert rp.figure_marginal_bars(back, tmp_path / "f4.png").stat().st_size > 0
    assert closed[0] == ["(a) (Race, Gender)"]                  # segments named as the tables name them
    assert closed[1] == ["(Race, Gender): marginal gender by race"]
    # issue 44: an all-zero panel says why instead of showing empty axes
    zero = back.assign(value=back["value"].where(back["attribute"] != "gender", 0.0))
    texts = []
    monkeypatch.setattr(rp, "_pyplot", type("_Texts", (), {"__getattr__": lambda self, n: getattr(real, n),
                                                           "close": lambda self, fig: texts.append(
                                                               [t.get_text() for ax in fig.axes for t in ax.texts])
                                                           or real.close(fig)}))
    rp.figure_marginal_bars(zero, tmp_path / "f4_zero.png")
    assert texts == [[rp.ZERO_NOTE]]
    rp.figure_marginal_bars(back.assign(value=0.5), tmp_path / "f4_bars.png")
    assert texts[1] == []
    assert rp.figure_retrieval_proportions(back, tmp_path / "f5.png", "doctor").stat().st_size > 0


def test_probing_loads_its_models_in_probing_precision(tmp_path, repo):
    """Issue 42 item 2: probing (and the debias probes, which run probe()) has its own precision key; the paper
    config probes in fp32 whatever the config-wide precision (auto = bf16 on CUDA); null keeps the config's."""
    from counterfactory.config import load_config

    view = load_config([repo / "config" / "config.yaml"], study="social_counterfactuals")
    assert view["probing"]["precision"] == "fp32" and view["precision"] == "auto"
    path = make_table(tmp_path)
    seen = []

    def factory(cfg, role):
        seen.append(cfg["precision"])
        return FakeScorer(seed=0)

    pr.probe({"precision": "auto"}, ["m1"], path, scorer_factory=factory)
    pr.probe({"precision": "auto", "probing": {"precision": None}}, ["m1"], path, scorer_factory=factory)
    assert seen == ["fp32", "auto"]


def test_figure3_panels_and_models_in_the_papers_order(tmp_path, monkeypatch):
    """Issue 42 item 6 (Figure 3): panels (a) Race-Gender, (b) Physical Char.-Gender, (c) Physical Char.-Race, then
    any other segment; models in the probe table's (probing.roles) order, as Figure 3 lists them."""
    assert rp.figure_segments(["physical_race", "physical_race_gender", "race_gender", "physical_gender"]) == [
        "race_gender", "physical_gender", "physical_race", "physical_race_gender"]
    rows = []
    for model in ("SLIP", "ALIP", "CLIP"):                        # the roles' order, not alphabetical
        for seg in ("physical_race", "race_gender", "physical_gender"):
            for subj, v in (("doctor", 0.1), ("nurse", 0.3)):
                rows.append({"model": model, "segment": seg, "subject": subj, "attribute": pr.INTERSECTIONAL,
                             "given": pr.ALL, "label": "", "metric": "maxskew", "k": 4, "value": v})
    frame = pd.DataFrame(rows, columns=pr.PROBE_COLUMNS)
    seen = []
    real = rp._pyplot()

    class _Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def close(self, fig):
            seen.append([(ax.get_title(), [t.get_text() for t in ax.get_xticklabels()]) for ax in fig.axes])
            real.close(fig)

    monkeypatch.setattr(rp, "_pyplot", _Recording)
    rp.figure_maxskew_boxplots(frame, tmp_path / "f3.png")
    assert [t for t, _ in seen[0]] == ["(a) (Race, Gender)", "(b) (Physical Char., Gender)",
                                       "(c) (Physical Char., Race)"]
    assert all(models == ["SLIP", "ALIP", "CLIP"] for _, models in seen[0])


def test_images_table_errors(tmp_path):
    from counterfactory.errors import InputError

    bad = tmp_path / "bad.csv"
    pd.DataFrame({"segment": ["x"], "subject": ["doctor"]}).to_csv(bad, index=False)
    with pytest.raises(InputError, match="missing column"):
        pr.read_images_table(bad)
    with pytest.raises(pr.ConfigError, match="marginal_k"):
        pr.settings({"probing": {"marginal_k": "nope"}})


def test_cli_probe_tables(tmp_path):
    from counterfactory.cli import main

    df = pd.DataFrame([dict(model=m, segment="race-gender", subject=s, attribute=a, given="all", label="",
                            metric=met, k=12, value=v)
                       for m in ("clip", "flava") for s, v in (("doctor", 0.4), ("nurse", 0.9))
                       for a, met in (("intersectional", "maxskew"), ("intersectional", "ndkl"), ("gender", "bias"))])
    df.to_csv(tmp_path / "p.csv", index=False)
    rc = main(["social", "probe-tables", "--probe", str(tmp_path / "p.csv"), "--out-md", str(tmp_path / "t.md"),
               "--out-tex", str(tmp_path / "t.tex"), "--out-csv", str(tmp_path / "t.csv")])
    assert rc == 0
    md = (tmp_path / "t.md").read_text()
    assert "Mean MaxSkew@K" in md and "0.65" in md


def test_probe_tables_name_models_and_segments_as_the_paper(tmp_path, monkeypatch):
    """Tables 2 and 12-17 (issue 32 item 2): rows and columns carry the roles' display names (``--label ROLE=NAME``,
    what rule social_probe_tables passes from ``models.<role>.display_name``) and Table 2's segment names
    ``(Race, Gender)``, never the config keys ``clip_eval`` / ``race_gender``."""
    from counterfactory.cli import main

    df = pd.DataFrame([dict(model=m, segment=seg, subject=s, attribute=a, given="all", label="", metric=met, k=12,
                            value=v)
                       for m in ("clip_eval", "itm_flava") for seg in ("race_gender", "physical_race")
                       for s, v in (("doctor", 0.4), ("nurse", 0.9))
                       for a, met in (("intersectional", "maxskew"), ("intersectional", "ndkl"), ("gender", "bias"))])
    df.to_csv(tmp_path / "p.csv", index=False)
    out = {ext: tmp_path / f"t.{ext}" for ext in ("md", "html", "csv")}
    assert main(["social", "probe-tables", "--probe", str(tmp_path / "p.csv"), "--label", "clip_eval=CLIP",
                 "--label", "itm_flava=FLAVA", "--out-md", str(out["md"]), "--out-html", str(out["html"]),
                 "--out-csv", str(out["csv"])]) == 0
    for text in (out["md"].read_text(), out["html"].read_text()):
        assert "CLIP" in text and "FLAVA" in text and "(Race, Gender)" in text and "(Physical Char., Race)" in text
        assert not any(key in text for key in ("clip_eval", "itm_flava", "race_gender", "physical_race"))
    tables = rp.paper_tables(df, labels={"clip_eval": "CLIP", "itm_flava": "FLAVA"})
    mean = tables["Mean MaxSkew@K across occupations"]
    assert list(mean.columns) == ["CLIP", "FLAVA"] and mean.columns.name == "Model"
    assert list(mean.index) == ["(Physical Char., Race)", "(Race, Gender)"] and mean.index.name == "Segment"
    long = pd.read_csv(out["csv"])
    assert "clip_eval" not in set(long["column"]) and "(Race, Gender)" in set(long["row"])
    # the figures name the models the same way (probe-plots --label)
    seen = []
    monkeypatch.setattr(rp, "figure_maxskew_boxplots", lambda frame, path: seen.append(set(frame["model"])))
    monkeypatch.setattr(rp, "figure_marginal_bars", lambda *a, **k: None)
    monkeypatch.setattr(rp, "figure_retrieval_proportions", lambda *a, **k: None)
    assert main(["social", "probe-plots", "--probe", str(tmp_path / "p.csv"), "--out-dir", str(tmp_path / "f"),
                 "--label", "clip_eval=CLIP", "--label", "itm_flava=FLAVA"]) == 0
    assert seen == [{"CLIP", "FLAVA"}]


def test_segment_values_ignore_a_blank_third_attribute():
    """Two-attribute sets carry a3_type / a3 as "" (or null) in the filter's tables: no third attribute."""
    import pandas as pd

    from counterfactory.studies.social_counterfactuals import probing as P

    rows = [{"segment": "race_gender", "member_index": i, "a1_type": "race", "a1": r, "a2_type": "gender", "a2": g,
             "a3_type": blank, "a3": blank}
            for i, (r, g, blank) in enumerate([("White", "male", ""), ("White", "female", None),
                                               ("Black", "male", ""), ("Black", "female", "")])]
    values = P.segment_values(pd.DataFrame(rows))
    assert values == {"race_gender": {"race": ["White", "Black"], "gender": ["male", "female"]}}


def test_probe_frame_ignores_a_blank_third_attribute():
    import numpy as np
    import pandas as pd

    from counterfactory.studies.social_counterfactuals import probing as P

    class Scorer:
        def encode_images(self, paths):
            return np.eye(len(paths), 4)[: len(paths)]

        def encode_texts(self, texts):
            return np.ones((len(texts), 4)) / 2.0

    rows = [{"set_id": "s", "candidate_index": 0, "member_index": i, "segment": "race_gender", "prefix": "A photo of a",
             "subject": "doctor", "caption": "c", "a1_type": "race", "a1": r, "a2_type": "gender", "a2": g,
             "a3_type": "", "a3": "", "image_path": f"{i}.png"}
            for i, (r, g) in enumerate([("White", "male"), ("White", "female"), ("Black", "male"), ("Black", "female")])]
    out = P.probe_frame(pd.DataFrame(rows), Scorer(), "m", P.settings({}))
    full = out[(out["metric"] == "maxskew") & (out["given"] == "all")]
    assert set(full["k"]) == {4} and "" not in set(full["attribute"])   # K = |race| x |gender|, no third type


def test_paper_config_ndkl_depth_is_k_squared_hand_computed(repo):
    """§10.1: NDKL sums over ranked lists of size 1..K², K = |A1|·|A2|. Paper config on a synthetic ranking of 6 items
    with K = 2 x 1 = 2: the sum stops at 4 (the whole ranking, `full`, gives another value)."""
    from counterfactory.config import load_config

    opts = load_config([repo / "config" / "config.yaml"], study="social_counterfactuals")["probing"]
    assert opts["ndkl_depth"] == "k_squared"
    values = {"race": ["a", "b"], "gender": ["m"]}
    labels = [("a", "m"), ("a", "m"), ("b", "m"), ("a", "m"), ("b", "m"), ("b", "m")]
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]                                  # ranked as listed
    # top-i shares of "a" 1, 1, 2/3, 3/4 against uniform Q = (1/2, 1/2); natural log; discount 1/log2(i + 1)
    kl = [math.log(2), math.log(2), 2 / 3 * math.log(4 / 3) + 1 / 3 * math.log(2 / 3),
          3 / 4 * math.log(3 / 2) + 1 / 4 * math.log(1 / 2)]
    disc = [1 / math.log2(i + 1) for i in range(1, 5)]
    expected = sum(k * d for k, d in zip(kl, disc)) / sum(disc)
    paper = rows_to_frame(pr.retrieval_metrics(scores, labels, values, ndkl_depth=opts["ndkl_depth"]))
    assert pick(paper, "intersectional", "ndkl")["k"] == 4
    assert pick(paper, "intersectional", "ndkl")["value"] == pytest.approx(expected, rel=1e-12)
    full = rows_to_frame(pr.retrieval_metrics(scores, labels, values, ndkl_depth="full"))
    assert pick(full, "intersectional", "ndkl")["k"] == 6
    assert pick(full, "intersectional", "ndkl")["value"] != pytest.approx(expected)
    # the library default follows the paper too
    default = rows_to_frame(pr.retrieval_metrics(scores, labels, values))
    assert pick(default, "intersectional", "ndkl")["value"] == pytest.approx(expected, rel=1e-12)


def test_paper_config_probes_flava_with_unprojected_pooler_output(repo, tmp_path):
    """The authors' evaluation embeds FLAVA images and texts with the unimodal encoders' unprojected pooler_output;
    the paper config does the same (the projected contrastive embeddings stay an option). Tiny FLAVA stand-in."""
    import copy

    import torch
    from PIL import Image

    from counterfactory.config import load_config
    from counterfactory.models import loaders_eval, tiny_eval
    from counterfactory.models.registry import ModelSpec
    from counterfactory.scorers import FlavaItcScorer, wrap_model

    tiny_eval.BUILDERS["itm_flava"](tmp_path / "flava", 0)
    view = load_config([repo / "config" / "config.yaml"], study="social_counterfactuals")
    assert pr.settings(view)["flava_embedding"] == "pooler"
    cfg = copy.deepcopy(dict(view))
    cfg["models"] = {**cfg["models"], "itm_flava": {"source": str(tmp_path / "flava")}}
    cfg["device"], cfg["precision"] = "cpu", "fp32"
    paper = pr._default_scorer_factory(cfg, "itm_flava")                   # what `social probe` builds
    assert isinstance(paper, FlavaItcScorer) and paper.embedding == "pooler"
    loaded = loaders_eval.load_itm_transformers(ModelSpec(role="itm_flava", source=str(tmp_path / "flava"),
                                                          library="transformers"), {"head": "itc"})
    projected = wrap_model(loaded, name="f", head="itc", flava_embedding="projected", progress=False)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)) for _ in range(3)]
    texts = ["A photo of a doctor", "A photo of an umpire"]
    model, processor = loaded
    flava = getattr(model, "flava", model)
    with torch.inference_mode():
        pix = processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
        img_ref = torch.nn.functional.normalize(flava.image_model(pixel_values=pix).pooler_output.float(), dim=-1)
        tok = processor.tokenizer(texts, padding=True, return_tensors="pt")
        txt_ref = torch.nn.functional.normalize(flava.text_model(
            input_ids=tok["input_ids"], attention_mask=tok["attention_mask"]).pooler_output.float(), dim=-1)
    np.testing.assert_allclose(paper.encode_images(images), img_ref.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(paper.encode_texts(texts), txt_ref.numpy(), rtol=1e-4, atol=1e-5)
    other_i, other_t = projected.encode_images(images), projected.encode_texts(texts)
    assert other_i.shape != img_ref.shape or not np.allclose(other_i, img_ref.numpy(), atol=1e-3)
    assert other_t.shape != txt_ref.shape or not np.allclose(other_t, txt_ref.numpy(), atol=1e-3)
    with pytest.raises(Exception, match="embedding"):
        wrap_model(loaded, name="f", head="itc", flava_embedding="cls", progress=False)


def test_three_attribute_comparison_table_section_10_2():
    """§10.2: MaxSkew@60 of physical x race x gender next to each pair's MaxSkew@60 on the same images."""
    physical = ["skinny", "obese", "young", "old", "tattooed"]
    values = {"physical": physical, "race": RACES, "gender": GENDERS}
    rows = []
    rng = np.random.default_rng(5)
    for subject in ("doctor", "nurse"):
        labels = [(p, r, g) for p in physical for r in RACES for g in GENDERS] * 2      # 120 images, 2 candidate sets
        scores = rng.normal(size=len(labels))
        for r in pr.retrieval_metrics(scores, labels, values, marginals=False):
            rows.append({"model": "clip_eval", "segment": "physical_race_gender", "subject": subject, **r})
        two = [(r_, g) for r_ in RACES for g in GENDERS]
        for r in pr.retrieval_metrics(rng.normal(size=12), two, {"race": RACES, "gender": GENDERS}, marginals=False):
            rows.append({"model": "clip_eval", "segment": "race_gender", "subject": subject, **r})
    df = pd.DataFrame(rows)
    table = rp.three_attribute_table(df)
    assert list(table.index) == [("physical_race_gender", "clip_eval")]               # two-attribute segments: no row
    assert list(table.columns) == ["intersection (K=60)", "physical+gender (K=60)", "physical+race (K=60)",
                                   "race+gender (K=60)"]
    sel = df[(df["segment"] == "physical_race_gender") & (df["metric"] == "maxskew")]
    for column, attribute in (("intersection (K=60)", "intersectional"), ("race+gender (K=60)", "race+gender")):
        expected = sel.loc[sel["attribute"] == attribute, "value"].mean()
        assert table.loc[("physical_race_gender", "clip_eval"), column] == pytest.approx(expected)
    assert any("§10.2" in title for title in rp.paper_tables(df))
    assert rp.three_attribute_table(df[df["segment"] == "race_gender"]).empty


def test_paper_config_figure_subjects_are_those_of_figures_5_8_and_9_to_13():
    """§10: Doctor (Figures 5, 8) and the five further occupations of Figures 9-13, all generated occupations."""
    from pathlib import Path

    from counterfactory.config import load_full_config
    from counterfactory.studies.social_counterfactuals import captions

    cfg = load_full_config([Path(__file__).resolve().parents[1] / "config" / "config.yaml"])["social_counterfactuals"]
    subjects = cfg["probing"]["figure_subjects"]
    assert subjects == ["doctor", "software developer", "construction worker", "entrepreneur", "technical writer",
                        "salesperson"]
    assert set(subjects) <= set(captions.resolve_section(cfg["captions"])["subjects"])
