"""Readers of the published releases (Intel/COCO-Counterfactuals, Intel/SocialCounterfactuals) on the fixtures in resources/demo/releases:
expected rows, the same evaluation / probing / debiasing functions as on generated data (tiny CLIP), round trip
through our own SocialCounterfactuals export, and one clear error per malformed release."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from counterfactory import cli, evaluation
from counterfactory.data import releases as rel
from counterfactory.errors import InputError

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "resources" / "demo" / "releases"
COCO = FIX / "coco_counterfactuals"
SOCIAL = FIX / "social_counterfactuals"
WORDS = {"101_0": ("flag", "banner"), "102_1": ("field", "forest"), "103_0": ("cat", "dog")}


@pytest.fixture(scope="module")
def coco_pairs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("coco") / "images" / "selected_pairs.parquet"
    summary = rel.write_coco_release_pairs(COCO, out)
    assert summary["pairs"] == 3 and summary["with_changed_word"] == 3
    return out


@pytest.fixture(scope="module")
def social_kept(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("social") / "filter" / "kept.parquet"
    summary = rel.write_social_release_images(SOCIAL, out)
    assert (summary["images"], summary["sets"], summary["subjects"]) == (12, 3, 3)
    return out


def _cfg(study: str, clip: Path, **overrides):
    """The demo config with ``clip_eval`` at ``clip`` (conftest's session-built tiny CLIP)."""
    from counterfactory.config import load_config

    models = {"models": {"clip_eval": {"source": str(clip)}}}
    return load_config([REPO / "config" / "demo.yaml"], overrides={**models, **overrides}, study=study)


# --------------------------------------------------------------------------------------------
# COCO-Counterfactuals
# --------------------------------------------------------------------------------------------
def test_coco_release_rows(coco_pairs):
    from counterfactory.generation.shards import SELECTED_SCHEMA

    df = pd.read_parquet(coco_pairs)
    assert list(df.columns) == list(SELECTED_SCHEMA)
    assert df["id"].tolist() == ["101_0", "102_1", "103_0"] == df["caption_id"].tolist()
    assert df["image_id"].tolist() == ["101", "102", "103"] and df["source_index"].tolist() == [0, 1, 2]
    assert df.loc[2, "caption_0"] == "A tabby cat sits and looks to the side."
    assert df.loc[2, "caption_1"] == "A tabby dog sits and looks to the side."
    assert [tuple(x) for x in df[["original_word", "new_word"]].to_numpy()] == list(WORDS.values())
    assert df["image_0"].tolist() == [f"release/{i}_img_0.jpg" for i in WORDS]   # relative, as images_merge writes
    assert df[["p", "guidance", "sim_0", "sim_1", "sim_image", "sim_direction"]].isna().all().all()
    assert df["candidate_index"].isna().all() and df["seed"].isna().all() and (df["rank"] == 0).all()
    with zipfile.ZipFile(COCO / "data" / "images.zip") as zf:   # both path conventions: images/<stem>, <stem>
        assert (coco_pairs.parent / "release" / "102_1_img_1.jpg").read_bytes() == zf.read("images/102_1_img_1.jpg")
        assert (coco_pairs.parent / "release" / "103_0_img_0.jpg").read_bytes() == zf.read("103_0_img_0.jpg")
    pairs = evaluation.read_pairs(coco_pairs)                      # the evaluations' reader accepts it
    assert all(Path(p).is_file() for p in pairs["image_0"].tolist() + pairs["image_1"].tolist())


def test_coco_release_read_in_place(tmp_path):
    root = tmp_path / "release"
    (root / "data" / "images").mkdir(parents=True)
    shutil.copy(COCO / "data" / "examples.jsonl", root / "data")
    with zipfile.ZipFile(COCO / "data" / "images.zip") as zf:      # unzipped into data/images/ (keeps images/...)
        zf.extractall(root / "data" / "images")
    df = rel.read_coco_counterfactuals(root)
    assert df.loc[0, "image_0"] == (root / "data" / "images" / "images" / "101_0_img_0.jpg").resolve().as_posix()
    assert df.loc[2, "image_1"] == (root / "data" / "images" / "103_0_img_1.jpg").resolve().as_posix()
    with pytest.raises(InputError, match="no folder to extract"):
        rel.read_coco_counterfactuals(COCO)


def test_changed_word():
    assert rel.changed_word("A dog on a mat.", "A cat on a mat.") == ("dog", "cat", 1)
    assert rel.changed_word("A dog on a mat.", "A Dog on a mat!") == (None, None, -1)      # nothing changed
    assert rel.changed_word("A dog on a mat.", "A big cat on a mat.") == (None, None, -1)  # two words for one


def test_coco_release_evaluations(coco_pairs, tmp_path, tiny_clip):
    """The release's pairs through run_itr / run_itm with the tiny CLIP, as generated pairs go."""
    from counterfactory.data.coco import load_coco_captions
    from counterfactory.evaluation.itm import run_itm
    from counterfactory.evaluation.itr import run_itr

    captions = tmp_path / "captions.parquet"
    load_coco_captions(REPO / "resources" / "demo" / "coco2017" / "annotations" / "captions_val2017.json").to_parquet(captions)
    cfg = _cfg("coco_counterfactuals", tiny_clip, data={"coco_root": str(REPO / "resources" / "demo" / "coco2017")})
    itr = run_itr(cfg, "clip_eval", coco_pairs, captions, progress=False)
    cf = itr[itr["dataset"] == "COCO-CFs"]
    assert (cf["n_pairs"].iloc[0], cf["n_images"].iloc[0], cf["n_texts"].iloc[0]) == (3, 6, 6)
    coco = itr[itr["dataset"] == "MS-COCO"]
    assert coco["n_images"].iloc[0] == 3                        # the matched MS-COCO images 101, 102, 103
    assert itr["value"].between(0, 100).all()
    r10 = cf.set_index("metric")["value"]
    assert r10["TR@10"] == r10["IR@10"] == 100.0                # 6 candidates: everything is within the top 10
    itm = run_itm(cfg, "clip_eval", coco_pairs, captions, progress=False)
    assert itm["id"].tolist() == list(WORDS) and itm["image_id"].tolist() == ["101", "102", "103"]
    np.testing.assert_allclose(itm["TR_c"], itm["counterfactual_pair"] - itm["original_caption_counterfactual_image"],
                               atol=1e-6)
    out = tmp_path / "grid.png"                                 # NaN scores: the pair grid still draws
    assert cli.main(["report", "pair-grid", "--pairs", str(coco_pairs), "--out", str(out), "--n", "3"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_caption_release(tmp_path):
    from counterfactory.generation.shards import read_pairs
    from counterfactory.text.caption_stage import ACCEPTED_COLUMNS

    df = rel.read_coco_counterfactual_captions(COCO / "coco_counterfactuals_captions.jsonl")
    assert list(df.columns) == ACCEPTED_COLUMNS
    assert df["caption_id"].tolist() == list(WORDS) and df["image_id"].tolist() == ["101", "102", "103"]
    assert df["position"].tolist() == [11, 10, 2] and df["new_word"].tolist() == ["banner", "forest", "dog"]
    path = tmp_path / "counterfactual_captions.parquet"
    assert cli.main(["release", "coco-captions", "--jsonl", str(COCO / "coco_counterfactuals_captions.jsonl"),
                     "--out", str(path)]) == 0
    assert read_pairs(path)["counterfactual"].tolist() == df["counterfactual"].tolist()   # the image stage reads it


def _broken_coco(tmp_path, lines=None, drop=None) -> Path:
    root = tmp_path / "broken"
    shutil.copytree(COCO, root)
    if lines is not None:
        (root / "data" / "examples.jsonl").write_text("".join(x + "\n" for x in lines))
    if drop:
        with zipfile.ZipFile(COCO / "data" / "images.zip") as src, \
                zipfile.ZipFile(root / "data" / "images.zip", "w") as dst:
            for info in src.infolist():
                if info.filename != drop:
                    dst.writestr(info, src.read(info))
    return root


def test_coco_release_errors(tmp_path):
    good = (COCO / "data" / "examples.jsonl").read_text().splitlines()
    missing = json.loads(good[1])
    del missing["caption_1"]
    cases = [
        (dict(lines=[good[0], json.dumps(missing)]), r"examples.jsonl, record line 2: missing field\(s\) caption_1"),
        (dict(lines=[good[0], '{"id": "102_1", "caption_0": ']), r"record line 2: not valid JSON"),
        (dict(lines=[good[0], good[0]]), r"record line 2: id '101_0' repeats line 1"),
        (dict(drop="images/102_1_img_1.jpg"),
         r"images.zip, record image_1 of id 102_1 \(examples.jsonl line 2\): no image 102_1_img_1.jpg"),
    ]
    for i, (kwargs, pattern) in enumerate(cases):
        root = _broken_coco(tmp_path / str(i), **kwargs)
        with pytest.raises(InputError, match=pattern) as err:
            rel.read_coco_counterfactuals(root, tmp_path / str(i) / "out")
        assert "Fix:" in str(err.value)
    (root / "data" / "images.zip").unlink()
    with pytest.raises(InputError, match="data/images.zip or data/images/"):
        rel.read_coco_counterfactuals(root, tmp_path / "out")


# --------------------------------------------------------------------------------------------
# SocialCounterfactuals
# --------------------------------------------------------------------------------------------
def test_social_release_rows(social_kept):
    import datasets

    from counterfactory.studies.social_counterfactuals import probing

    df = pd.read_parquet(social_kept)
    assert list(df.columns) == list(rel.KEPT_COLUMNS)
    assert df["set_id"].tolist() == ["1041"] * 4 + ["2217"] * 4 + ["3090"] * 4
    assert df["member_index"].tolist() == [0, 1, 2, 3] * 3 and (df["candidate_index"] == 0).all()
    assert df["subject"].tolist() == ["doctor"] * 4 + ["plumber"] * 4 + ["nurse"] * 4
    assert set(df["segment"]) == {"race_gender"}
    # "A picture of an Indian ..." keeps the set's one prefix (the article agrees with the next word)
    assert df["prefix"].tolist() == ["A picture of a"] * 8 + ["A photo of a"] * 4
    assert df.loc[2, "caption"] == "A picture of an Indian male doctor"
    assert (df.loc[2, "a1"], df.loc[2, "a2"], df.loc[2, "a3"], df.loc[2, "a3_type"]) == ("Indian", "male", "", "")
    assert df["image_path"].iloc[0] == "release_images/00000/000000.jpg"
    shard = next((SOCIAL / "data").glob("*.parquet"))
    raw = pq.read_table(shard, columns=["image"]).column("image").to_pylist()
    assert (social_kept.parent / df["image_path"].iloc[5]).read_bytes() == raw[5]["bytes"]
    ds = datasets.load_dataset("parquet", data_files=str(shard), split="train", cache_dir=str(social_kept.parent / "c"))
    assert ds.num_rows == len(df) and ds[5]["caption"] == df.loc[5, "caption"]   # what load_dataset reads
    table = probing.read_images_table(social_kept)                              # the probe's reader accepts it
    assert probing.segment_values(table) == {"race_gender": {"race": ["White", "Indian"],
                                                             "gender": ["male", "female"]}}


def test_social_release_probe_and_debias_split(social_kept, tmp_path, tiny_clip):
    from counterfactory.studies.social_counterfactuals import debias, probing

    cfg = _cfg("social_counterfactuals", tiny_clip)
    out = probing.probe(cfg, ["clip_eval"], social_kept)
    assert sorted(out["subject"].unique()) == ["doctor", "nurse", "plumber"]
    k = out[(out["metric"] == "maxskew") & (out["attribute"] == probing.INTERSECTIONAL)]
    assert len(k) == 3 and (k["k"] == 4).all() and k["value"].notna().all()    # K = |races| x |genders|
    frame = probing.read_images_table(social_kept)
    split = debias.split_subjects(frame["subject"], 0.2, 0)
    summary = debias.write_manifests(social_kept, split, None, tmp_path / "manifests", val_fraction=0.0)
    assert set(summary["segment"]) == {"race_gender"}
    test = summary[summary["part"] == "test"]
    assert test["subjects"].sum() == 1 and test["images"].sum() == 4          # 20 % of 3 subjects rounds to 1


def test_social_release_round_trip_through_our_export(social_kept, tmp_path):
    """Our own export (extra fields a3_type, a3, segment, subject, member_index) reads back to the same rows."""
    from counterfactory.export.social_release import export_release

    export_release(social_kept, tmp_path / "export", shard_size=5)
    back = rel.read_social_counterfactuals(tmp_path / "export", tmp_path / "images")
    first = pd.read_parquet(social_kept)
    back = back.sort_values(["set_id", "member_index"]).reset_index(drop=True)
    for col in ("caption", "member_index", "subject", "segment", "prefix", "a1", "a2"):
        assert back[col].tolist() == first[col].tolist(), col
    assert back["set_id"].str.endswith("-c000").all()          # our export names the candidate set


def _social_copy(tmp_path, table_edit=None, name="train-00000-of-00001-0123456789abcdef.parquet") -> Path:
    root = tmp_path / "social"
    (root / "data").mkdir(parents=True)
    table = pq.read_table(next((SOCIAL / "data").glob("*.parquet")))
    pq.write_table(table_edit(table) if table_edit else table, root / "data" / name)
    return root


def test_social_release_errors(tmp_path):
    cases = [
        (dict(table_edit=lambda t: t.drop_columns(["a1"])), r"missing field\(s\) a1 "),
        (dict(name="train-00000-of-00002-0123456789abcdef.parquet"), r"1 shard\(s\) missing \(numbers \[1\]\)"),
        (dict(table_edit=lambda t: t.set_column(1, "caption", [["A picture of a doctor"] * t.num_rows])),
         r"record row 0: caption 'A picture of a doctor' does not contain its attribute values 'White male'"),
        (dict(table_edit=lambda t: t.set_column(0, "image", [[{"bytes": b"not an image", "path": None}]
                                                             * t.num_rows])), r"record row 0: the image is not readable"),
    ]
    for i, (kwargs, pattern) in enumerate(cases):
        root = _social_copy(tmp_path / str(i), **kwargs)
        with pytest.raises(InputError, match=pattern) as err:
            rel.read_social_counterfactuals(root, tmp_path / str(i) / "images")
        assert "Fix:" in str(err.value)
    root = _social_copy(tmp_path / "p", name="train-00000-of-00002-0123456789abcdef.parquet")
    assert len(rel.read_social_counterfactuals(root, tmp_path / "p" / "images", partial=True)) == 12


def test_cli(tmp_path, capsys):
    out = tmp_path / "kept.parquet"
    assert cli.main(["release", "social", "--root", str(SOCIAL), "--out", str(out)]) == 0
    assert "12 images in 3 sets" in capsys.readouterr().out and (tmp_path / "release_images" / "00000").is_dir()
    assert cli.main(["release", "coco", "--root", str(tmp_path), "--out", str(tmp_path / "p.parquet")]) == 2
    err = capsys.readouterr().err
    assert "examples.jsonl: COCO-Counterfactuals examples not found" in err and "Fix:" in err
    assert not (tmp_path / "p.parquet").exists() and not (tmp_path / "release").exists()   # nothing half-written


def test_release_inputs(tmp_path):
    """What the release rules declare as inputs (a missing path comes back for the rule to name its config key)."""
    assert rel.release_inputs("coco", COCO) == [COCO / "data" / "examples.jsonl", COCO / "data" / "images.zip"]
    assert rel.release_inputs("coco", tmp_path) == [tmp_path / "data" / "examples.jsonl", tmp_path / "data" / "images"]
    assert rel.release_inputs("social", SOCIAL) == list((SOCIAL / "data").glob("train-*.parquet"))
    assert rel.release_inputs("social", tmp_path) == [tmp_path / "data"]
