"""SocialCounterfactuals release layout (Intel/SocialCounterfactuals on the Hugging Face Hub)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pyarrow.parquet as pq
import pytest
from PIL import Image

from counterfactory.errors import InputError
from counterfactory.studies.social_counterfactuals import captions as C
from counterfactory.export import social_release as R

SHARD = re.compile(r"^data/train-(\d{5})-of-(\d{5})-[0-9a-f]{16}\.parquet$")


def _kept_images(root, segments=(["race", "gender"], ["physical", "gender"]), drop_every=0):
    """A kept-images table: one prefix, two subjects, small PNGs with distinct colours, relative paths."""
    frame = C.build_caption_sets({"prefixes": ["A photo of a"], "subjects": ["doctor", "umpire"],
                                  "segments": [list(s) for s in segments]})
    if drop_every:
        frame = frame[frame.index % drop_every != 1]
    (root / "images").mkdir(parents=True, exist_ok=True)
    paths = []
    for i, r in enumerate(frame.itertuples(index=False)):
        name = f"images/{r.set_id}_{r.member_index:02d}.png"
        Image.new("RGB", (8, 6), (i % 256, (7 * i) % 256, 40)).save(root / name)
        paths.append(name)
    frame = frame.assign(image_path=paths)
    # the filter step's table: the required columns (and a3_*), rows in scrambled order
    table = frame[["set_id", "member_index", "caption", "a1_type", "a1", "a2_type", "a2", "a3_type", "a3",
                   "image_path"]].sample(frac=1.0, random_state=0)
    out = root / "kept.parquet"
    table.to_parquet(out, index=False)
    return out, frame


def test_export_layout_and_fields(tmp_path):
    kept, frame = _kept_images(tmp_path)
    out = tmp_path / "release"
    summary = R.export_release(kept, out, shard_size=10)
    n = len(frame)                                                     # 2 subjects x (12 + 10)
    assert n == 44 and summary["rows"] == 44 and summary["sets"] == 4
    assert len(summary["shards"]) == 5
    for k, name in enumerate(summary["shards"]):
        m = SHARD.match(name)
        assert m and int(m.group(1)) == k and int(m.group(2)) == 5
    assert sorted(str(p.relative_to(out)) for p in (out / "data").iterdir()) == sorted(summary["shards"])
    table = pq.read_table([out / s for s in summary["shards"]][0])
    assert table.schema.names[:8] == list(R.RELEASE_FIELDS)
    features = json.loads(table.schema.metadata[b"huggingface"])["info"]["features"]
    assert features["image"] == {"_type": "Image"} and features["caption"]["dtype"] == "string"
    rows = pd.concat([pq.read_table(out / s).to_pandas() for s in summary["shards"]], ignore_index=True)
    assert len(rows) == 44
    # ordered by (set, member); every row keeps its caption, attributes and the image file's bytes
    assert list(zip(rows["counterfactual_set"], rows["member_index"])) == sorted(
        zip(frame["set_id"], frame["member_index"]))
    by_key = frame.set_index(["set_id", "member_index"])
    for r in rows.itertuples(index=False):
        src = by_key.loc[(r.counterfactual_set, r.member_index)]
        assert r.caption == src["caption"] and (r.a1_type, r.a1, r.a2_type, r.a2) == (
            src["a1_type"], src["a1"], src["a2_type"], src["a2"])
        assert r.a1a2 == f"{r.a1} {r.a2}" and r.a1a2 in r.caption
        assert r.caption.split(r.a2 + " ")[1] == r.subject                 # B12's recovery of the profession
        assert r.image["bytes"] == (tmp_path / src["image_path"]).read_bytes()
        assert r.image["path"] == src["image_path"].split("/")[-1]
        assert r.a3_type == "" and r.a3 == "" and r.segment == f"{r.a1_type}_{r.a2_type}"
    assert (out / "README.md").exists() and json.loads((out / "release_summary.json").read_text())["rows"] == 44


def test_export_is_deterministic_and_replaces_the_folder(tmp_path):
    kept, _ = _kept_images(tmp_path)
    a = R.export_release(kept, tmp_path / "a", shard_size=16)
    b = R.export_release(kept, tmp_path / "b", shard_size=16)
    assert a["shards"] == b["shards"]
    for name in a["shards"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    (tmp_path / "a" / "data" / "stale.parquet").write_bytes(b"x")
    again = R.export_release(kept, tmp_path / "a", shard_size=100)
    assert len(again["shards"]) == 1
    assert sorted(p.name for p in (tmp_path / "a" / "data").iterdir()) == [again["shards"][0][5:]]


def test_check_with_pyarrow_counts_sets_per_segment(tmp_path):
    kept, frame = _kept_images(tmp_path, drop_every=7)                 # some images filtered out
    R.export_release(kept, tmp_path / "rel", shard_size=9)
    report = R.check_release(tmp_path / "rel", use_datasets=False)
    assert report["rows"] == len(frame) and report["sets"] == frame["set_id"].nunique() == 4
    seg = {s["segment"]: s for s in report["segments"]}
    expect = frame.groupby("segment").size().to_dict()
    assert {k: v["images"] for k, v in seg.items()} == expect
    assert seg["race_gender"]["sets"] == 2 and seg["race_gender"]["images_per_set_max"] <= 12
    assert report["first_image_size"] == [8, 6] and report["reader"].startswith("pyarrow")


def test_three_attribute_sets(tmp_path):
    kept, frame = _kept_images(tmp_path, segments=(["physical", "race", "gender"],))
    R.export_release(kept, tmp_path / "rel", shard_size=50)
    rows = pd.concat([pq.read_table(p).to_pandas() for p in R.release_shards(tmp_path / "rel")])
    assert len(rows) == 120 and set(rows["a3_type"]) == {"gender"}
    assert all(r.a1a2 == f"{r.a1} {r.a2} {r.a3}" for r in rows.itertuples())
    assert set(rows["segment"]) == {"physical_race_gender"} and set(rows["subject"]) == {"doctor", "umpire"}


def test_round_trip_through_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    kept, frame = _kept_images(tmp_path)
    R.export_release(kept, tmp_path / "rel", shard_size=10)
    ds = R.load_release(tmp_path / "rel", cache_dir=tmp_path / "cache")
    assert isinstance(ds.features["image"], datasets.Image)
    assert ds.num_rows == 44 and set(R.RELEASE_FIELDS) <= set(ds.column_names)
    first = ds[0]
    assert first["image"].size == (8, 6) and first["a1a2"] in first["caption"]
    report = R.check_release(tmp_path / "rel", use_datasets=True)
    assert report["rows"] == 44 and report["sets"] == 4 and report["reader"].startswith("datasets")


def _edit(kept, fn):
    table = pd.read_parquet(kept)
    table = fn(table)
    table.to_parquet(kept, index=False)


@pytest.mark.parametrize("edit, text", [
    (lambda t: t.drop(columns=["a2"]), "missing column(s) a2"),
    (lambda t: t.assign(image_path=t["image_path"].where(t.index != t.index[3], "images/nope.png")),
     "image file"),
    (lambda t: t.assign(a1=t["a1"].where(t.index != t.index[0], "Martian")), "does not contain its attribute"),
    (lambda t: pd.concat([t, t.iloc[:1]]), "twice"),
    (lambda t: t.iloc[:0], "no rows"),
    (lambda t: t.assign(caption=t["caption"].where(t.index != t.index[2], None)), "empty caption"),
])
def test_bad_input_names_file_row_and_fix(tmp_path, edit, text):
    kept, _ = _kept_images(tmp_path)
    _edit(kept, edit)
    with pytest.raises(InputError) as info:
        R.export_release(kept, tmp_path / "rel")
    assert text in str(info.value) and str(kept) in str(info.value) and "Fix:" in str(info.value)
    assert not (tmp_path / "rel").exists()


def test_check_rejects_a_broken_release(tmp_path):
    kept, _ = _kept_images(tmp_path)
    R.export_release(kept, tmp_path / "rel", shard_size=10)
    victim = sorted((tmp_path / "rel" / "data").iterdir())[2]
    victim.unlink()
    with pytest.raises(InputError, match="incomplete"):
        R.check_release(tmp_path / "rel", use_datasets=False)
    with pytest.raises(InputError, match="not found"):
        R.check_release(tmp_path / "missing", use_datasets=False)


def test_cli_release_and_check(tmp_path, capsys):
    from counterfactory.cli import main

    kept, _ = _kept_images(tmp_path)
    out = tmp_path / "rel"
    assert main(["social", "release", "--images", str(kept), "--out-dir", str(out), "--shard-size", "20"]) == 0
    printed = capsys.readouterr().out
    assert "44 images in 4 sets" in printed and "(3 shards)" in printed
    assert main(["social", "release-check", "--dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "44 images in 4 sets, 3 shard(s)" in printed
    assert "race_gender: 2 sets, 24 images (12-12 per set)" in printed
    assert main(["social", "release", "--images", str(tmp_path / "none.parquet"), "--out-dir", str(out)]) == 2
    assert "kept-images table not found" in capsys.readouterr().err


def test_each_surviving_candidate_set_is_a_release_set(tmp_path):
    """The filter keeps every passing candidate set, so one caption set may appear with two candidates: each is its
    own counterfactual set of the release (set id + candidate), never a duplicate member."""
    kept, frame = _kept_images(tmp_path, segments=(["race", "gender"],))
    table = pd.read_parquet(kept)
    two = pd.concat([table.assign(candidate_index=0), table.assign(candidate_index=3)], ignore_index=True)
    two.to_parquet(kept, index=False)
    R.export_release(kept, tmp_path / "rel")
    report = R.check_release(tmp_path / "rel", use_datasets=False)
    assert report["rows"] == 2 * len(frame) and report["sets"] == 2 * frame["set_id"].nunique()
    released = pd.read_parquet(R.release_shards(tmp_path / "rel")[0], columns=["counterfactual_set"])
    first = frame["set_id"].iloc[0]
    assert {f"{first}-c000", f"{first}-c003"} <= set(released["counterfactual_set"])
