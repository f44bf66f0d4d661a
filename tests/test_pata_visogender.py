"""PATA and VisoGender readers on fixtures in the official layouts (reference notes B9, B10), clear errors on
malformed lines, and the §5.3 skewness evaluation with a stand-in dual encoder."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from counterfactory.data.pata import read_pata_captions, read_pata_files
from counterfactory.data.visogender import load_visogender, read_visogender
from counterfactory.errors import InputError
from counterfactory.studies.social_counterfactuals import external as ex

FIX = Path(__file__).parents[1] / "resources" / "demo"  # the demo's PATA / VisoGender files (official layouts)
PATA_LST = FIX / "pata" / "pata_fairness.files.lst"
PATA_JSON = FIX / "pata" / "pata_fairness.captions.json"
PATA_IMG = FIX / "pata" / "images"
OO = FIX / "visogender" / "OO_Visogender_10052025.tsv"
OP = FIX / "visogender" / "OP_Visogender_11012024.tsv"
VG_IMG = FIX / "visogender" / "images"


# ------------------------------------------------------------------ PATA
def test_pata_files_scene_with_underscore_and_images():
    df = read_pata_files(PATA_LST, PATA_IMG)
    assert list(df["scene"]) == ["forest", "fashion_show", "fashion_show"]
    assert list(df["race"]) == ["indian", "black", "caucasian"]
    assert list(df["gender"]) == ["male", "female", "male"]
    assert list(df["age"]) == ["young", "young", "old"]
    assert list(df["index"]) == [0, 1, 2] and list(df["line"]) == [1, 2, 3]
    assert [Path(p).name for p in df["image_path"]] == ["0.png", "1.png", "2.png"]
    assert df["url"].iloc[1] == "https://example.org/show/model%20one.jpg?w=600"
    # no folder: no images; a pattern that matches nothing: None
    assert read_pata_files(PATA_LST)["image_path"].isna().all()
    assert read_pata_files(PATA_LST, PATA_IMG, "{stem}.png")["image_path"].isna().all()
    assert Path(read_pata_files(PATA_LST, PATA_IMG, "{index}.png")["image_path"].iloc[2]).name == "2.png"


@pytest.mark.parametrize("line, problem", [
    ("forest_indian_male_young https://example.org/x.jpg", "no '|'"),
    ("forest_martian_male_young|https://example.org/x.jpg", "race 'martian'"),
    ("male_young|https://example.org/x.jpg", "is not <scene>_<race>_<gender>_<age>"),
    ("forest_indian_male_young|", "empty URL"),
])
def test_pata_malformed_line_names_file_and_line(tmp_path, line, problem):
    bad = tmp_path / "pata_fairness.files.lst"
    bad.write_text(PATA_LST.read_text().splitlines()[0] + "\n\n" + line + "\n")
    with pytest.raises(InputError) as info:
        read_pata_files(bad)
    msg = str(info.value)
    assert str(bad) in msg and "line 3" in msg and problem in msg and "Fix:" in msg


def test_pata_captions():
    caps = read_pata_captions(PATA_JSON)
    assert set(caps["attribute"]) == {"race", "gender", "age"}
    forest = caps[caps["scene"] == "forest"]
    assert len(forest) == 4 and set(forest["polarity"]) == {"pos", "neg"}
    neg = caps[(caps["scene"] == "fashion_show") & (caps["polarity"] == "neg")]
    assert "photo of a show-off" in set(neg["caption"])


def test_pata_captions_errors(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text('[{"long": "x", "pos": {}, "neg": {}}]')
    with pytest.raises(InputError, match=r"entry \[0\]: missing key 'short'"):
        read_pata_captions(bad)
    bad.write_text('[{"short": "x", "pos": {"races": "photo"}, "neg": {}}]')
    with pytest.raises(InputError, match="not a list of captions"):
        read_pata_captions(bad)
    bad.write_text('[{"short": "x",')
    with pytest.raises(InputError, match="line 1"):
        read_pata_captions(bad)


# ------------------------------------------------------------------ VisoGender
def test_visogender_oo_and_op():
    oo = read_visogender(OO, VG_IMG)
    assert list(oo["context"].unique()) == ["OO"] and list(oo["idx"]) == ["OO_1", "OO_2", "OO_3"]
    assert list(oo["occupation_gender"]) == ["masculine", "feminine", "feminine"]
    assert list(oo["other"]) == ["clipboard", "clipboard", "desk"]
    assert pd.isna(oo["url"].iloc[2]) and oo["participant_gender"].isna().all()
    assert [Path(p).name if pd.notna(p) else None for p in oo["image_path"]] == ["OO_1.png", "OO_2.png", None]
    op = read_visogender(OP, VG_IMG, context="OP")
    assert list(op["participant_gender"]) == ["feminine", "masculine"] and list(op["other"]) == ["student"] * 2
    both = load_visogender(OO, OP, VG_IMG)
    assert len(both) == 5


def test_visogender_errors(tmp_path):
    lines = OO.read_text().splitlines()
    bad = tmp_path / "oo.tsv"
    bad.write_text("\n".join([lines[0], lines[1], lines[2].replace("\tfeminine\t", "\twoman\t")]) + "\n")
    with pytest.raises(InputError) as info:
        read_visogender(bad)
    assert str(bad) in str(info.value) and "line 3" in str(info.value) and "'woman'" in str(info.value)
    bad.write_text("\n".join([lines[0], lines[1] + "\textra"]) + "\n")
    with pytest.raises(InputError, match="line 2.*11 tab-separated fields"):
        read_visogender(bad)
    bad.write_text("IDX,Sector\nOO_1,x\n")
    with pytest.raises(InputError, match="header"):
        read_visogender(bad)
    with pytest.raises(InputError, match="is a OO file but OP was expected"):
        read_visogender(OO, context="OP")


# ------------------------------------------------------------------ §5.3 evaluation
class PathScorer:
    """Stand-in dual encoder: image i's embedding points at angle i, texts at a fixed angle."""

    def encode_images(self, paths):
        out = []
        for p in paths:
            a = (sum(map(ord, Path(p).name)) % 17) / 17 * math.pi
            out.append([math.cos(a), math.sin(a)])
        return np.array(out)

    def encode_texts(self, texts):
        return np.array([[1.0, 0.0] if len(t) % 2 else [0.0, 1.0] for t in texts])


def test_single_attribute_metrics():
    rows = ex.single_attribute_metrics([0.9, 0.8, 0.1, 0.05], ["masculine", "masculine", "feminine", "feminine"],
                                       attribute="gender")
    by = {(r["metric"], r["label"]): r for r in rows}
    assert by[("maxskew", "")]["k"] == 2 and by[("maxskew", "")]["value"] == pytest.approx(math.log(2))
    assert by[("bias", "")]["value"] == pytest.approx(1.0)
    assert by[("share", "masculine")]["value"] == pytest.approx(1.0)
    assert ex.single_attribute_metrics([0.1, 0.2], ["young", "young"], attribute="age") == []


def test_evaluate_pata_and_visogender_on_fixtures():
    factory = lambda cfg, role: PathScorer()  # noqa: E731
    pata = ex.evaluate_pata({}, ["clip"], scorer_factory=factory, files_list=PATA_LST, captions_json=PATA_JSON,
                            image_dir=PATA_IMG)
    assert list(pata.columns) == ex.COLUMNS
    # forest has one image (one value of every attribute): skipped; fashion_show has 2 values of each attribute
    assert set(pata["group"]) == {"fashion_show"}
    assert set(pata["attribute"]) == {"race", "gender", "age"}
    ms = pata[(pata["metric"] == "maxskew")]
    assert len(ms) == 6 and (ms["k"] == 2).all()
    assert set(ms["query_set"]) == {"pos", "neg"}

    vg = ex.evaluate_visogender({}, ["clip"], scorer_factory=factory, oo_tsv=OO, op_tsv=OP, image_dir=VG_IMG)
    groups = set(vg["group"])
    assert groups == {"OO:doctor", "OP:teacher"}                       # lawyer has no image
    q = vg[vg["group"] == "OO:doctor"]["query"].iloc[0]
    assert q == "The doctor and their clipboard"
    table = ex.external_summary(pd.concat([pata, vg], ignore_index=True))
    assert list(table.columns) == ["pata", "visogender"] and list(table.index) == ["clip"]
    assert 0 <= table.loc["clip", "visogender"] <= math.log(2) + 1e-9
