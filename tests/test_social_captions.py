"""SocialCounterfactuals caption sets (§3.2, §8.4, §10.2, Tables 1, 11, 18, 19)."""

from __future__ import annotations

import itertools
import random
import re

import pandas as pd
import pytest
import yaml

from counterfactory.errors import ConfigError
from counterfactory.studies.social_counterfactuals import captions as C

RACES = ["White", "Black", "Indian", "Asian", "Middle Eastern", "Latino"]
GENDERS = ["male", "female"]
PHYSICAL = ["skinny", "obese", "young", "old", "tattooed"]
#: attribute values read with a vowel sound (checked by hand)
AN_VALUES = {"Indian", "Asian", "obese", "old"}
#: Table 18 occupations read with a vowel sound (checked by hand); every other entry takes "a"
AN_OCCUPATIONS = {
    "academic", "accountant", "administrative assistant", "analyst", "architect", "army", "artist", "assistant",
    "astronaut", "athlete", "attorney", "audiologist", "auditor", "author", "economist", "editor", "electrician",
    "engineer", "entrepreneur", "opera singer", "optician", "optician custodian", "umpire",
}


@pytest.fixture(scope="module")
def defaults():
    return C.default_lists()


@pytest.fixture(scope="module")
def paper_frame():
    return C.build_caption_sets({"subjects": "table18"})


def test_default_lists_are_the_papers(defaults):
    assert defaults["prefixes"] == ["A", "A photo of a", "A picture of a", "An image of a"]
    assert defaults["attributes"] == {"race": RACES, "gender": GENDERS, "physical": PHYSICAL}
    assert defaults["segments"] == [["race", "gender"], ["physical", "gender"], ["physical", "race"]]
    assert defaults["segments_three_attribute"] == [["physical", "race", "gender"]]
    subjects = defaults["subjects"]
    assert len(subjects) == 156 == len(set(subjects))           # every entry printed in Table 18
    assert subjects[0] == "academic" and subjects[-1] == "zoologist"
    for name in ("doctor", "web developer", "electrician", "barber", "nurse", "ceo", "pr person"):
        assert name in subjects
    for key in ("prefixes", "race", "gender", "physical", "subjects", "segments"):
        assert key in defaults["sources"]
    assert "Table 18" in defaults["sources"]["subjects"]


def test_paper_scale_counts_with_260_occupations(defaults):
    subjects = defaults["subjects"] + [f"occupation {i:03d}" for i in range(260 - len(defaults["subjects"]))]
    frame = C.build_caption_sets({"subjects": subjects})
    assert len(frame) == 54_080 and frame["set_id"].nunique() == 3_120          # §3.2
    counts = C.counts_by_segment(frame).set_index("segment")
    assert counts.loc["race_gender"].tolist() == [1040, 12_480, 12]             # 4 prefixes x 260
    assert counts.loc["physical_gender"].tolist() == [1040, 10_400, 10]
    assert counts.loc["physical_race"].tolist() == [1040, 31_200, 30]
    assert frame["caption"].is_unique


def test_released_prefilter_list_is_shipped_and_is_the_default(defaults):
    """§3.2, §8.4: the paper generates from the pre-filter list (its "260 occupations"); the authors' release holds
    261 entries, 244 distinct as written and 181 ignoring case. The default list is the release as published (every
    entry, release order); Table 18 (the survivors) stays available by name."""
    released = defaults["subjects_released"]
    assert len(released) == 261 and len(set(released)) == 244 and len({s.casefold() for s in released}) == 181
    assert released[:3] == ["barber", "coach", "businessperson"] and released[-1] == "receptionist"
    assert C.named_subjects("released") == released
    merged = C.named_subjects("released", dedup="case")
    assert len(merged) == 181 == len({s.casefold() for s in merged})
    assert merged[:3] == ["barber", "coach", "businessperson"] and "Audiologist" in merged and "audiologist" not in merged
    exact = C.named_subjects("released", dedup="exact")
    assert len(exact) == 244 and "Accountant" in exact and "accountant" in exact
    table18 = {s.casefold() for s in defaults["subjects"]}
    assert table18 - {s.casefold() for s in merged} == {"real estate developer"}   # released as "real-estate developer"
    assert C.named_subjects("table18") == defaults["subjects"]
    assert C.resolve_section({})["subjects"] == released == C.resolve_section({"subjects": "released"})["subjects"]
    assert C.resolve_section({"subjects_dedup": "case"})["subjects"] == merged
    assert C.resolve_section({"subjects": "table18"})["subjects"] == defaults["subjects"]
    with pytest.raises(ConfigError, match="subjects"):
        C.resolve_section({"subjects": "table 18"})
    with pytest.raises(ConfigError, match="subjects_dedup"):
        C.resolve_section({"subjects_dedup": "casefold"})


def test_released_list_as_published_counts():
    """Issue 42 item 1: the release as published, 261 entries -> 261 x 4 = 1,044 race-gender sets (the authors' own
    race_gender_occupation.jsonl), 54,288 captions in 3,132 sets over Table 1's segments (the paper's 260: 54,080 /
    3,120); de-duplication is an option: exact (244) and case (181)."""
    frame = C.build_caption_sets({})
    counts = C.counts_by_segment(frame).set_index("segment")
    assert counts.loc["race_gender"].tolist() == [1_044, 12_528, 12]
    assert counts.loc["physical_gender"].tolist() == [1_044, 10_440, 10]
    assert counts.loc["physical_race"].tolist() == [1_044, 31_320, 30]
    assert len(frame) == 54_288 and frame["set_id"].nunique() == 3_132
    assert "A photo of a White male barber" in set(frame["caption"])
    # "doctor" is released twice: two sets per prefix and segment, the second's id marked, the same captions
    doctor = frame[(frame["subject"] == "doctor") & (frame["segment"] == "race_gender") & (frame["prefix_index"] == 0)]
    ids = doctor["set_id"].unique().tolist()                                 # release order
    assert len(ids) == 2 and "-doctor-2-" in ids[1] and "-doctor-2-" not in ids[0]
    first, second = (doctor[doctor["set_id"] == i]["caption"].tolist() for i in ids)
    assert first == second
    assert C.make_set_id(["race", "gender"], 0, "doctor") in ids              # the first entry keeps its old id
    for dedup, subjects in (("exact", 244), ("case", 181)):
        other = C.build_caption_sets({"subjects_dedup": dedup})
        assert other["set_id"].nunique() == 3 * 4 * subjects and other["caption"].is_unique
        assert len(other) == 4 * subjects * (12 + 10 + 30)
    assert len(C.build_caption_sets({"subjects_dedup": "case"})) == 37_648


def test_user_list_repeats_follow_subjects_dedup():
    section = {"subjects": ["doctor", "nurse", "Doctor", "doctor"], "segments": [["race", "gender"]],
               "prefixes": ["A photo of a"]}
    assert C.build_caption_sets(section)["set_id"].nunique() == 4
    assert C.build_caption_sets({**section, "subjects_dedup": "exact"})["set_id"].nunique() == 3
    assert C.build_caption_sets({**section, "subjects_dedup": "case"})["subject"].unique().tolist() == ["doctor", "nurse"]


def test_paper_config_subjects_are_the_released_list(repo):
    from counterfactory.config import load_config

    view = load_config([repo / "config" / "config.yaml"], study="social_counterfactuals")
    assert view["captions"]["subjects"] == "released"                       # §3.2, §8.4
    assert view["captions"]["subjects_dedup"] == "none"                     # issue 42 item 1: as published
    assert len(C.resolve_section(view["captions"])["subjects"]) == 261
    demo = load_config([repo / "config" / "config.yaml", repo / "config" / "demo.yaml"],
                       study="social_counterfactuals")
    assert C.resolve_section(demo["captions"])["subjects"] == ["academic", "accountant"]   # demo unchanged


def test_default_list_counts(paper_frame):
    counts = C.counts_by_segment(paper_frame)
    assert counts["segment"].tolist() == ["race_gender", "physical_gender", "physical_race"]
    assert counts["sets"].tolist() == [624, 624, 624]                           # 4 x 156
    assert counts["captions"].tolist() == [624 * 12, 624 * 10, 624 * 30]
    assert len(paper_frame) == 32_448 and paper_frame["set_id"].nunique() == 1_872


def test_columns(paper_frame):
    for col in ("set_id", "segment", "prefix", "subject", "a1_type", "a1", "a2_type", "a2", "a3_type", "a3",
                "caption", "member_index"):
        assert col in paper_frame.columns
    assert (paper_frame["a3_type"] == "").all() and (paper_frame["a3"] == "").all()


def test_every_set_has_each_combination_once(paper_frame):
    values = {"race": RACES, "gender": GENDERS, "physical": PHYSICAL}
    for sid, g in paper_frame.groupby("set_id", sort=False):
        assert g["prefix"].nunique() == 1 and g["subject"].nunique() == 1 and g["segment"].nunique() == 1
        t1, t2 = g["a1_type"].iloc[0], g["a2_type"].iloc[0]
        assert (g["a1_type"] == t1).all() and (g["a2_type"] == t2).all()
        expected = list(itertools.product(values[t1], values[t2]))
        assert list(zip(g["a1"], g["a2"])) == expected                          # order fixed, each once
        assert g["member_index"].tolist() == list(range(len(expected)))
        assert g["a1"].iloc[0] == values[t1][0] and g["a2"].iloc[0] == values[t2][0]   # base = first combination


def test_caption_text_follows_the_template(paper_frame):
    sample = paper_frame.sample(500, random_state=0)
    for r in sample.itertuples(index=False):
        words = r.caption.split(" ")
        head = " ".join(words[:len(r.prefix.split(" ")) - 1])                  # prefix without its article
        assert r.caption.startswith(head)
        assert r.caption.endswith(f" {r.a1} {r.a2} {r.subject}")


def test_table_19_examples(paper_frame):
    captions = set(paper_frame["caption"])
    extra = C.build_caption_sets({"subjects": ["nurse", "electrician", "web developer", "barber", "doctor"]})
    captions |= set(extra["caption"])
    for text in ("An Indian female nurse", "A photo of a White male electrician",
                 "A picture of a young Latino web developer", "An image of a tattooed male barber",
                 "A photo of an Asian female doctor"):
        assert text in captions


@pytest.mark.parametrize("value", RACES + GENDERS + PHYSICAL)
def test_article_for_every_attribute_value(value, paper_frame):
    expected = "an" if value in AN_VALUES else "a"
    assert C.indefinite_article(value) == expected
    rows = paper_frame[paper_frame["a1"] == value]
    for r in rows.head(200).itertuples(index=False):       # the article stands right before a1
        before = r.caption[: -len(f" {r.a1} {r.a2} {r.subject}")].split(" ")[-1]
        assert before.lower() == expected, r.caption


def test_article_for_every_occupation(defaults):
    for occupation in defaults["subjects"]:
        expected = "an" if occupation in AN_OCCUPATIONS else "a"
        assert C.indefinite_article(occupation) == expected, occupation
        assert C.compose_caption("A photo of a", [], occupation) == f"A photo of {expected} {occupation}"
        assert C.compose_caption("A", [], occupation) == f"{expected.capitalize()} {occupation}"


@pytest.mark.parametrize("word, article", [
    ("honest", "an"), ("hour", "an"), ("heir", "an"), ("honorable", "an"), ("historian", "a"), ("hairdresser", "a"),
    ("European", "a"), ("eulogist", "a"), ("unicycle", "a"), ("university", "a"), ("uniformed", "a"),
    ("user", "a"), ("usual", "a"), ("urologist", "a"), ("umbrella", "an"), ("uninformed", "an"), ("urban", "an"),
    ("one-eyed", "a"), ("once-famous", "a"), ("onerous", "an"), ("MBA", "an"), ("FBI", "an"), ("CEO", "a"),
    ("NASA", "a"), ("HTML", "an"), ("8-year-old", "an"), ("11-year-old", "an"), ("18", "an"), ("1", "a"),
    ("800", "an"), ("X", "an"), ("B", "a"), ("apple", "an"), ("young", "a"), ("Asian", "an"),
])
def test_article_rules(word, article):
    assert C.indefinite_article(word) == article


def test_article_overrides_and_capital_kept():
    assert C.fix_articles("a ukulele player") == "a ukulele player"
    assert C.fix_articles("A apple and an pear") == "An apple and a pear"
    assert C.fix_articles("An image of a obese chef") == "An image of an obese chef"
    frame = C.build_caption_sets({"prefixes": ["A photo of a"], "subjects": ["chef"], "segments": [["race", "gender"]],
                                  "attributes": {"race": ["Ugandan", "Welsh"], "gender": ["male", "female"]},
                                  "article_an": ["Welsh"]})
    assert frame["caption"].tolist()[:1] == ["A photo of an Ugandan male chef"]
    assert "A photo of an Welsh female chef" in frame["caption"].tolist()
    frame = C.build_caption_sets({"prefixes": ["A photo of a"], "subjects": ["chef"], "segments": [["race", "gender"]],
                                  "attributes": {"race": ["Ugandan"], "gender": ["male"]}, "article_a": ["ugandan"]})
    assert frame["caption"].tolist() == ["A photo of a Ugandan male chef"]


def test_set_ids_are_stable(defaults):
    subjects = list(defaults["subjects"][:20])
    base = C.build_caption_sets({"subjects": subjects})
    shuffled = list(subjects)
    random.Random(3).shuffle(shuffled)
    other = C.build_caption_sets({"subjects": shuffled[:7] + ["new occupation"] + shuffled[7:12]})
    key = ["segment", "prefix_index", "subject", "member_index"]
    merged = base.merge(other, on=key, suffixes=("", "_other"))
    assert len(merged) == 12 * 4 * 52
    assert (merged["set_id"] == merged["set_id_other"]).all()
    assert (merged["caption"] == merged["caption_other"]).all()
    assert base.groupby(["segment", "prefix_index", "subject"])["set_id"].nunique().eq(1).all()
    assert base.drop_duplicates("set_id").shape[0] == 3 * 4 * 20
    assert re.fullmatch(r"race_gender-p1-web-developer-[0-9a-f]{10}", C.make_set_id(["race", "gender"], 1,
                                                                                    "web developer"))
    # the id does not depend on the attribute values
    changed = C.build_caption_sets({"subjects": subjects, "attributes": {"race": ["White", "Black"],
                                                                        "gender": GENDERS, "physical": PHYSICAL}})
    assert set(changed["set_id"]) == set(base["set_id"])


def test_three_attribute_segment(defaults):
    frame = C.build_caption_sets({"segments": defaults["segments_three_attribute"], "subjects": "table18", "max_subjects": 3})
    assert len(frame) == 4 * 3 * 60 and frame["set_id"].nunique() == 12
    assert (frame["n_members"] == 60).all()                                     # MaxSkew@60 (§10.2)
    first = frame[frame["set_id"] == frame["set_id"].iloc[0]]
    assert first[["a1_type", "a2_type", "a3_type"]].drop_duplicates().values.tolist() == [["physical", "race",
                                                                                          "gender"]]
    assert len(set(zip(first["a1"], first["a2"], first["a3"]))) == 60
    assert first["caption"].iloc[0] == "A skinny White male academic"
    assert "An old Asian female academic" in set(first["caption"])
    mixed = C.build_caption_sets({"segments": [["race", "gender"], ["physical", "race", "gender"]], "subjects": "table18", "max_subjects": 1})
    assert set(mixed.loc[mixed["segment"] == "race_gender", "a3"]) == {""}


@pytest.mark.parametrize("section, key", [
    ({"attributes": {"race": [], "gender": GENDERS, "physical": PHYSICAL}}, "attributes.race"),
    ({"attributes": {"race": RACES, "gender": ["male", "Male"], "physical": PHYSICAL}}, "attributes.gender"),
    ({"attributes": {"race": RACES, "gender": GENDERS, "physical": ["old", "White"]}}, "attributes.physical"),
    ({"attributes": {"race": RACES, "gender": [None], "physical": PHYSICAL}}, "attributes.gender[0]"),
    ({"segments": [["race", "religion"]]}, "segments[0]"),
    ({"segments": [["race"]]}, "segments[0]"),
    ({"segments": [["race", "race"]]}, "segments[0]"),
    ({"segments": [["race", "gender"], ["gender", "race"]]}, "segments[1]"),
    ({"segments": []}, "segments"),
    ({"subjects": ["doctor", "nurse", "doctor"], "subjects_dedup": "none ignoring case"}, "subjects_dedup"),
    ({"subjects": []}, "subjects"),
    ({"prefixes": ["A photo of a", "A photo of a"]}, "prefixes"),
    ({"max_subjects": 0}, "max_subjects"),
    ({"article_a": ["x"], "article_an": ["X"]}, "article_a"),
    ({"occupations": ["doctor"]}, "occupations"),
])
def test_errors_name_the_key(section, key):
    with pytest.raises(ConfigError) as info:
        C.build_caption_sets(section, source="my.yaml")
    message = str(info.value)
    assert message.startswith(f"my.yaml: social_counterfactuals.captions.{key}:"), message
    assert "Fix:" in message


def test_cli_with_a_plain_list_file(tmp_path, capsys):
    from counterfactory.cli import main

    lists = tmp_path / "lists.yaml"
    lists.write_text(yaml.safe_dump({"subjects": ["doctor", "umpire"], "prefixes": ["A photo of a", "A"]}))
    out = tmp_path / "captions.parquet"
    assert main(["social", "captions", "--config", str(lists), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "race_gender: 4 sets x 12 = 48 captions" in printed
    assert "total: 12 sets, 208 captions" in printed
    frame = pd.read_parquet(out)
    assert len(frame) == 208 and "A photo of an Asian female umpire" in set(frame["caption"])
    # the same keys under 'captions:', merged with a second file (later wins)
    wrapped = tmp_path / "wrapped.yaml"
    wrapped.write_text(yaml.safe_dump({"captions": {"subjects": ["nurse"]}}))
    assert main(["social", "captions", "--config", str(lists), "--config", str(wrapped), "--out", str(out)]) == 0
    assert set(pd.read_parquet(out)["subject"]) == {"nurse"}


def test_cli_reports_a_bad_list_file(tmp_path, capsys):
    from counterfactory.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"attributes": {"race": [], "gender": GENDERS}}))
    assert main(["social", "captions", "--config", str(bad), "--out", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err
    assert "social_counterfactuals.captions.attributes.race: is empty" in err and "Fix:" in err
    assert not (tmp_path / "x.parquet").exists()
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({"subject": ["doctor"]}))
    assert main(["social", "captions", "--config", str(typo), "--out", str(tmp_path / "x.parquet")]) == 2
    assert "unknown top-level key(s) subject" in capsys.readouterr().err


def test_full_config_section(tmp_path, monkeypatch):
    """A full configuration's social_counterfactuals.captions section, with a plain list file on top."""
    import copy
    import pathlib

    from counterfactory import config as config_mod

    base = pathlib.Path(__file__).resolve().parents[1] / "config" / "demo.yaml"
    schema = config_mod.load_schema()
    if "social_counterfactuals" not in schema["properties"]:      # until the shared schema has the study
        patched = copy.deepcopy(schema)
        patched["properties"]["studies"]["items"]["enum"].append("social_counterfactuals")
        patched["properties"]["social_counterfactuals"] = {
            "type": "object", "properties": {"captions": {"type": "object"}}}
        monkeypatch.setattr(config_mod, "load_schema", lambda: copy.deepcopy(patched))
    doc = yaml.safe_load(base.read_text())
    doc["studies"] = ["social_counterfactuals"]
    doc["social_counterfactuals"] = {"captions": {"subjects": ["doctor", "nurse"], "max_subjects": 1}}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    section, source = C.load_section([cfg])
    assert section["subjects"] == ["doctor", "nurse"] and str(cfg) in source
    assert set(C.build_caption_sets(section)["subject"]) == {"doctor"}
    lists = tmp_path / "lists.yaml"
    lists.write_text(yaml.safe_dump({"subjects": ["umpire"]}))
    section, _ = C.load_section([cfg, lists])
    assert section["subjects"] == ["umpire"] and section["max_subjects"] == 1


def test_paper_config_has_the_three_attribute_segment_with_thresholds():
    """§10.2: the paper config generates, filters and probes physical x race x gender next to Table 1's pairs; the
    detectability stage has thresholds for each of its types (Table 10 prints none: ours, documented)."""
    from pathlib import Path

    from counterfactory.config import load_full_config
    from counterfactory.studies.social_counterfactuals import filtering

    cfg = load_full_config([Path(__file__).resolve().parents[1] / "config" / "config.yaml"])["social_counterfactuals"]
    section = C.resolve_section(cfg["captions"])
    assert section["segments"] == [("race", "gender"), ("physical", "gender"), ("physical", "race"),
                                   ("physical", "race", "gender")]
    thresholds = filtering.check_thresholds(cfg["filter"]["detectability"]["thresholds"])
    assert thresholds["physical_race_gender"] == {"gender": 60, "race": 2 * 13, "physical": 2 * 8}
    assert set(thresholds) == {C.segment_name(t) for t in section["segments"]}
