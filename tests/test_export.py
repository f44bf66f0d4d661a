"""Exports round-trip through `datasets.load_dataset`; the dataset card states the run's numbers."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

datasets = pytest.importorskip("datasets")

from counterfactory import studies  # noqa: E402
from counterfactory.cli import main  # noqa: E402
from counterfactory.errors import InputError  # noqa: E402
from counterfactory.export import cards, formats  # noqa: E402
from counterfactory.studies.spurious_retrieval.export import spurious_tables  # noqa: E402

BIG_SEED = 2**63 + 5          # a generation seed beyond int64
COCO_EXPORT = studies.spec("coco_counterfactuals").export


def png(path, colour, size=(8, 6)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def pixels(image):
    return np.asarray(image.convert("RGB"))


def load(builder, tmp_path, **kw):
    return datasets.load_dataset(builder, cache_dir=str(tmp_path / "hf-cache"), **kw)


@pytest.fixture
def table(tmp_path):
    src = tmp_path / "src"
    rows = pd.DataFrame({
        "item_id": ["a/1", "b 2", "c3"],
        "caption": ["a dog", "a cat", "two cats"],
        "count": [1, 2, 3],
        "boxes": [np.array([[0, 1, 2, 3]]), np.array([[4, 5, 6, 7], [1, 1, 2, 2]]), np.array([[0, 0, 1, 1]])],
        "score": [0.5, float("nan"), 1.25],
        "seed": np.array([1, BIG_SEED, 3], dtype="uint64"),
        "split": ["train", "test", "train"],
        "image": ["i0.png", "i1.png", "i2.png"],
        "negative": [str(png(src / f"n{k}.png", (0, 10 * k, 200))) for k in range(3)],   # absolute paths
    })
    for k in range(3):
        png(src / f"i{k}.png", (50 * k, 0, 0))
    return formats.ExportTable("toy", rows, ("image", "negative"), "item_id", split_column="split", base=src)


def test_imagefolder_round_trip(tmp_path, table):
    m = formats.write_imagefolder([table], tmp_path / "if")
    assert {s: v["rows"] for s, v in m["configs"]["toy"]["splits"].items()} == {"test": 1, "train": 2}
    ds = load("imagefolder", tmp_path, data_dir=str(tmp_path / "if" / "toy"))
    assert sorted(ds) == ["test", "train"] and ds["train"].num_rows == 2 and ds["test"].num_rows == 1
    train = ds["train"].sort("item_id")
    assert train["item_id"] == ["a/1", "c3"] and train["caption"] == ["a dog", "two cats"]
    assert train["boxes"] == [[[0, 1, 2, 3]], [[0, 0, 1, 1]]] and train["count"] == [1, 3]
    test = ds["test"][0]
    assert test["seed"] == str(BIG_SEED) and test["score"] is None     # uint64 as text in JSON, NaN -> null
    assert pixels(test["image"])[0, 0].tolist() == [50, 0, 0]
    assert pixels(test["negative"])[0, 0].tolist() == [0, 10, 200]
    assert (tmp_path / "if" / "toy" / "train" / "image" / "a_1.png").is_file()     # id made file-name safe
    # 'score' is null throughout the test split: JSONL would give that split another type, so parquet metadata
    assert (tmp_path / "if/toy/test/metadata.parquet").is_file() and not (tmp_path / "if/toy/test/metadata.jsonl").exists()
    even = formats.ExportTable("even", table.rows.drop(columns=["split", "score"]), table.images, "item_id",
                               base=table.base)
    formats.write_imagefolder([even], tmp_path / "if2")
    lines = (tmp_path / "if2/even/train/metadata.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["image_file_name"] == "image/a_1.png" and len(lines) == 3
    assert load("imagefolder", tmp_path, data_dir=str(tmp_path / "if2/even"), split="train").num_rows == 3


def test_parquet_round_trip_keeps_bytes_and_types(tmp_path, table):
    m = formats.write_parquet([table], tmp_path / "pq")
    path = tmp_path / "pq" / m["configs"]["toy"]["splits"]["train"]["path"]
    ds = load("parquet", tmp_path, data_files={"train": str(path)}, split="train")
    assert isinstance(ds.features["image"], datasets.Image) and isinstance(ds.features["negative"], datasets.Image)
    assert ds["item_id"] == ["a/1", "c3"] and ds.features["seed"].dtype == "uint64"
    assert pixels(ds[1]["image"])[0, 0].tolist() == [100, 0, 0]
    raw = ds.cast_column("image", datasets.Image(decode=False))[0]["image"]
    assert raw["bytes"] == (table.base / "i0.png").read_bytes()
    test = load("parquet", tmp_path, data_files={"test": str(tmp_path / "pq/toy/test-00000-of-00001.parquet")},
                split="test")
    assert test[0]["seed"] == BIG_SEED and test[0]["boxes"] == [[4, 5, 6, 7], [1, 1, 2, 2]]


def test_missing_image_and_duplicate_ids_are_named(tmp_path, table):
    table.rows.loc[1, "image"] = "gone.png"
    with pytest.raises(InputError, match=r"item_id 'b 2'.*gone\.png not found"):
        formats.write_imagefolder([table], tmp_path / "if")
    assert not (tmp_path / "if").exists()                               # nothing half-written
    table.rows.loc[1, "image"], table.rows.loc[1, "item_id"] = "i1.png", "a/1"
    with pytest.raises(InputError, match="'a/1'.*twice"):
        formats.write_parquet([table], tmp_path / "pq")


def coco_study(tmp_path):
    d = tmp_path / "results" / "coco_counterfactuals"
    img = d / "images" / "shards" / "00000" / "images"
    pairs = pd.DataFrame({"id": ["101_0", "102_3"], "caption_0": ["a red bus", "a dog on grass"],
                          "caption_1": ["a red car", "a cat on grass"],
                          "image_0": [f"shards/00000/images/{i}_img_0.png" for i in ("101_0", "102_3")],
                          "image_1": [f"shards/00000/images/{i}_img_1.png" for i in ("101_0", "102_3")],
                          "seed": np.array([7, BIG_SEED], dtype="uint64")})
    for k, i in enumerate(("101_0", "102_3")):
        png(img / f"{i}_img_0.png", (k, 1, 2))
        png(img / f"{i}_img_1.png", (k, 3, 4))
    pairs.to_parquet(d / "images" / "selected_pairs.parquet")
    (d / "captions" / "summary").mkdir(parents=True)
    lines = [{"coco-counterfactual-index": i, "original_caption": a, "counterfactual_caption": b}
             for i, a, b in zip(pairs["id"], pairs["caption_0"], pairs["caption_1"])]
    (d / "captions" / "coco_counterfactuals_captions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for shard, (acc, rej) in enumerate([(3, 11), (4, 20)]):
        (d / "captions" / "summary" / f"{shard:05d}.json").write_text(json.dumps(
            {"counts": {"accepted": acc, "rejected_by_reason": {"not_whole_word": rej}}, "config_digest": "x",
             "provenance": {"models": {"x": 1}}, "seconds": {"edit": 9.5}}))
    (d / "images" / "summary.json").write_text(json.dumps({"candidates_generated": 376, "pairs_selected": 2}))
    return d


def test_coco_counterfactuals_release_round_trip(tmp_path):
    d = coco_study(tmp_path)
    out = tmp_path / "release"
    formats.write_coco_counterfactuals(d / "images/selected_pairs.parquet",
                                       d / "captions/coco_counterfactuals_captions.jsonl", out)
    ex = load("json", tmp_path, data_files={"test": str(out / "data/examples.jsonl")}, split="test")
    assert ex.column_names == ["id", "image_0", "image_1", "caption_0", "caption_1"]
    assert ex.features["id"].dtype == "string" and ex["image_0"] == ["101_0_img_0", "102_3_img_0"]
    assert ex["caption_1"] == ["a red car", "a cat on grass"]
    for row in ex:
        for col in ("image_0", "image_1"):
            src = d / "images/shards/00000/images" / f"{row[col]}.png"
            assert (out / "data/images" / f"{row[col]}.png").read_bytes() == src.read_bytes()
    cap = load("json", tmp_path, data_files=str(out / "coco_counterfactuals_captions.jsonl"), split="train")
    assert cap.column_names == ["coco-counterfactual-index", "original_caption", "counterfactual_caption"]
    assert cap["coco-counterfactual-index"] == ["101_0", "102_3"]


def test_countercurate_tsv_round_trip(tmp_path):
    d = tmp_path / "datasets"
    flickr = png(tmp_path / "flickr30k-images" / "1.jpg", (9, 9, 9))
    neg = [png(tmp_path / "gen" / f"{k}.png", (k, 0, 0)) for k in range(3)]
    d.mkdir()
    pd.DataFrame({"item_id": ["1_1_2_lr", "1_1_2_ab"], "image_path": [str(flickr)] * 2,
                  "caption": ["a is to the left of b", "a is above b"],
                  "negative_caption": ["a is to the right of b", "a is below b"],
                  "negative_image": [str(neg[0]), str(neg[1])], "subset": ["LR", "AB"], "split": ["test", "train"]}
                 ).to_parquet(d / "positions.parquet")
    pd.DataFrame({"item_id": ["1_1_2"], "image_path": [str(flickr)], "caption": ["there are two dogs"],
                  "negative_caption": ["there are three dogs"], "negative_image": [str(neg[2])]}
                 ).to_parquet(d / "counting.parquet")
    pd.DataFrame({"item_id": pd.Series([], dtype=str), "negative": pd.Series([], dtype=str)}
                 ).to_parquet(d / "attributes.parquet")
    out = tmp_path / "cc"
    m = formats.write_countercurate(d, out)
    assert m["configs"]["attributes"]["splits"]["train"]["rows"] == 0 and not (out / "attributes.tsv").exists()
    lr = load("csv", tmp_path, data_files=str(out / "positions_LR_test.tsv"), delimiter="\t", split="train")
    assert lr.column_names == ["captions", "images", "neg_captions", "neg_images"]
    assert lr[0]["neg_captions"] == "a is to the right of b"
    assert (out / lr[0]["neg_images"]).read_bytes() == neg[0].read_bytes()
    assert (out / lr[0]["images"]).read_bytes() == flickr.read_bytes()
    counting = load("csv", tmp_path, data_files=str(out / "counting.tsv"), delimiter="\t", split="train")
    assert counting["captions"] == ["there are two dogs"] and counting.num_rows == 1
    assert len(list((out / "images/source").iterdir())) == 1          # the shared source image is copied once


def test_social_release_reuses_the_study_writer(tmp_path):
    img = [png(tmp_path / "imgs" / f"{k}.png", (0, 0, 40 * k)) for k in range(2)]
    pd.DataFrame({"set_id": ["s1", "s1"], "member_index": [0, 1],
                  "caption": ["A photo of a Black female plumber", "A photo of a White female plumber"],
                  "a1_type": ["race"] * 2, "a1": ["Black", "White"], "a2_type": ["gender"] * 2,
                  "a2": ["female"] * 2, "image_path": [f"imgs/{k}.png" for k in range(2)]}
                 ).to_parquet(tmp_path / "kept.parquet")
    m = formats.write_social_counterfactuals(tmp_path / "kept.parquet", tmp_path / "rel",
                                             citation=studies.spec("social_counterfactuals").export.citation)
    assert m["configs"]["default"]["splits"]["train"]["rows"] == 2 and m["sets"] == 1
    files = sorted(str(p) for p in (tmp_path / "rel" / "data").glob("train-*.parquet"))
    ds = load("parquet", tmp_path, data_files={"train": files}, split="train")
    assert ds["a1a2"] == ["Black female", "White female"] and ds["subject"] == ["plumber", "plumber"]
    assert pixels(ds[1]["image"])[0, 0].tolist() == [0, 0, 40]
    assert formats.read_manifest(tmp_path / "rel")["format"] == "social_counterfactuals"
    # issue 32 item 10: the release README is a Hub dataset card (YAML metadata naming the shards, citation)
    from huggingface_hub import DatasetCard

    card = DatasetCard.load(tmp_path / "rel" / "README.md")
    assert card.data.configs == [{"config_name": "default", "data_files": [{"split": "train",
                                                                             "path": "data/train-*.parquet"}]}]
    assert card.data.license == "other" and "@inproceedings{howard2024socialcounterfactuals" in card.text


def test_card_lists_the_run_numbers(tmp_path):
    d = coco_study(tmp_path)
    export = d / "export"
    tables = [formats.ExportTable("default", pd.read_parquet(d / "images/selected_pairs.parquet"),
                                  ("image_0", "image_1"), "id", base=d / "images", default_split="test")]
    formats.write_parquet(tables, export / "parquet")
    formats.write_coco_counterfactuals(d / "images/selected_pairs.parquet",
                                       d / "captions/coco_counterfactuals_captions.jsonl", export / "release")
    prov = {"counterfactory": "0.1.0", "git": {"commit": "abc123", "dirty": False},
            "models": {"mlm": {"source": "resources/models/tiny/mlm", "library": "transformers", "revision": None,
                               "fingerprint": "979d60282801e6f000b6"}},
            "config": {"coco_counterfactuals": {"captions": {"similarity_low": 0.8, "mlm_top_k": 10}}}}
    (tmp_path / "provenance.json").write_text(json.dumps(prov))
    path = cards.write_card("coco_counterfactuals", COCO_EXPORT, d, tmp_path / "provenance.json", export)
    text = path.read_text()
    front = cards.card_numbers(text)
    assert front["license"] == "other" and front["size_categories"] == ["n<1K"]
    assert front["configs"] == [{"config_name": "default", "data_files": [
        {"split": "test", "path": "parquet/default/test-*.parquet"}]}]
    # issue 32 item 10: the funnel reads as steps with worded counts, not JSON key paths
    assert "   - accepted: 7" in text                                     # 3 + 4 over the two caption shards
    assert "   - rejected: not whole word: 31" in text and "counts.rejected_by_reason" not in text
    assert "   - candidates generated: 376" in text and "   - pairs selected: 2" in text
    assert "1. **captions**" in text and "2. **images**" in text
    assert "seconds" not in text and "config_digest" not in text        # bookkeeping is not a count
    assert "| release | default | test | 2 |" in text and "| parquet | default | test | 2 |" in text
    assert "| mlm | `resources/models/tiny/mlm` | transformers | - | `979d60282801e6f0` |" in text
    assert "Not recorded in this run's provenance (not used by it): lm, sentence, sd, vae, clip_filter" in text
    assert "CC BY 4.0" in text and "random" in text                      # demo limitation
    # issue 44: the warning right under the title (the only role is a tiny stand-in)
    from counterfactory.report_labels import TINY_WARNING

    assert text.index(f"> **{TINY_WARNING} 1 of 1 model roles") < text.index("## Dataset Summary")
    real = dict(prov, models={"mlm": dict(prov["models"]["mlm"], source="roberta-base")})
    (tmp_path / "provenance.json").write_text(json.dumps(real))
    assert TINY_WARNING not in cards.write_card("coco_counterfactuals", COCO_EXPORT, d, tmp_path / "provenance.json",
                                                export, out=tmp_path / "real.md").read_text()
    # the config is pointed to (provenance.json), not pasted in
    assert "similarity_low" not in text and "`config.coco_counterfactuals`" in text
    # every field documented with its type: the selection scores too
    assert "| `caption_1` | string | counterfactual caption (one noun replaced) |" in text
    assert "| `seed` | uint64 |" in text
    for heading in ("## Dataset Summary", "### Data Fields", "## Dataset Creation", "### How the data was made",
                    "## Licensing Information", "## Bias, Risks, and Limitations", "### Known Limitations",
                    "## Citation"):
        assert heading in text
    assert "@inproceedings{le2023cococounterfactuals" in text
    # the Hub's own parser reads the card's metadata
    from huggingface_hub import DatasetCard

    card = DatasetCard(text)
    assert card.data.pretty_name.startswith("COCO-Counterfactuals") and card.data.size_categories == ["n<1K"]


def test_cli_release_for_a_study_without_published_format(tmp_path, capsys):
    rc = main(["export", "release", "--study", "cvld", "--study-dir", str(tmp_path), "--out-dir", str(tmp_path / "o")])
    assert rc == 2 and "no published release format" in capsys.readouterr().err


def test_card_documents_the_selection_scores():
    """Issue 32 item 10: rank, p and the sim_* scores were exported undocumented."""
    for field in ("rank", "p", "guidance", "seed", "sim_0", "sim_1", "sim_image", "sim_direction", "set_id",
                  "member_index"):
        assert len(cards.FIELD_DOCS[field]) > 10, field
    assert cards.funnel_label("counts.rejected_by_reason.not_whole_word") == "rejected: not whole word"
    for s in studies.specs():   # each study's own BibTeX entry, in its export declaration
        assert s.export.citation.startswith("@") and s.export.citation.rstrip().endswith("}"), s.name


def test_size_categories():
    assert [cards.size_category(n) for n in (0, 999, 1000, 170_832)] == ["n<1K", "n<1K", "1K<n<10K", "100K<n<1M"]


def test_examples_grid_draws_an_export_and_says_so_when_it_is_empty(tmp_path, table, caplog):
    """`report examples` draws the exported rows; an export that kept nothing (own data no selection rule
    accepted) gets a figure saying so and a warning, not a failed job at the end of a finished run."""
    from counterfactory.plots import export_grid

    formats.write_imagefolder([table], tmp_path / "if")
    full = export_grid(tmp_path / "if", tmp_path / "full.png")
    empty = formats.ExportTable("none", table.rows.iloc[:0], table.images, "item_id", base=table.base)
    formats.write_imagefolder([empty], tmp_path / "if0")
    with caplog.at_level("WARNING"):
        blank = export_grid(tmp_path / "if0", tmp_path / "empty.png")
    assert "no exported examples" in caplog.text and "none" in caplog.text
    with Image.open(full) as a, Image.open(blank) as b:
        assert a.size[1] > b.size[1]           # one row of panels per example vs a one-line note


def test_uploaded_folders_hold_no_manifest_or_snakemake_marker(tmp_path, repo):
    """Issue 32 item 9: `.snakemake_timestamp` (Snakemake marks every directory() output with it) and manifest.json
    sat inside the export folders users upload. The writers put the manifest where they are told, the rules declare
    those manifest files (no directory() output under export/), and the card and examples grid read them there."""
    import re

    from counterfactory.plots import export_grid

    d = coco_study(tmp_path)
    export, manifests = d / "export", d / "manifests"
    common = ["--study", "coco_counterfactuals", "--study-dir", str(d)]
    assert main(["export", "imagefolder", *common, "--out-dir", str(export / "imagefolder"), "--parquet-dir",
                 str(export / "parquet"), "--manifest-imagefolder", str(manifests / "export_imagefolder.json"),
                 "--manifest-parquet", str(manifests / "export_parquet.json")]) == 0
    assert main(["export", "release", *common, "--out-dir", str(export / "release"), "--manifest",
                 str(manifests / "export_release.json")]) == 0
    prov = {"counterfactory": "0.1.0", "git": {}, "models": {}, "config": {}}
    (tmp_path / "provenance.json").write_text(json.dumps(prov))
    assert main(["export", "card", *common, "--provenance", str(tmp_path / "provenance.json"), "--export-dir",
                 str(export), *[f"--manifest={layout}={manifests / f'export_{layout}.json'}"
                                for layout in ("release", "imagefolder", "parquet")]]) == 0
    assert not [p for p in export.rglob("*") if p.name in ("manifest.json", ".snakemake_timestamp")]
    assert json.loads((manifests / "export_parquet.json").read_text())["format"] == "parquet"
    assert "| parquet | default | test | 2 |" in (export / "README.md").read_text()
    export_grid(export / "imagefolder", tmp_path / "ex.png", manifest=manifests / "export_imagefolder.json")
    rules = (repo / "rules" / "export.smk").read_text()
    assert not re.search(r"directory\(\s*f\"\{S\}/export/", rules)
    assert "manifests/export_imagefolder.json" in (repo / "rules" / "report.smk").read_text()


def test_parquet_streams_bounded_shards_that_load_back(tmp_path):
    """Issue 32.8: a split larger than the bound is cut into Hub-named shards; all of them load back."""
    src = tmp_path / "src"
    rows = pd.DataFrame({"item_id": [f"i{k}" for k in range(7)], "caption": [f"caption {k}" for k in range(7)],
                         "image": [str(png(src / f"i{k}.png", (30 * k, 5, 9), size=(16, 16))) for k in range(7)]})
    size = (src / "i0.png").stat().st_size
    table = formats.ExportTable("toy", rows, ("image",), "item_id")
    m = formats.write_parquet([table], tmp_path / "pq", max_shard_bytes=2 * size + size // 2)   # 2 images a shard
    split = m["configs"]["toy"]["splits"]["train"]
    assert split["files"] == [f"toy/train-{k:05d}-of-00004.parquet" for k in range(4)]
    assert sorted(p.name for p in (tmp_path / "pq/toy").iterdir()) == [f.split("/")[1] for f in split["files"]]
    ds = load("parquet", tmp_path, data_files={"train": str(tmp_path / "pq" / split["path"])}, split="train")
    assert isinstance(ds.features["image"], datasets.Image) and ds.num_rows == 7 == split["rows"]
    got = {r["item_id"]: (r["caption"], pixels(r["image"])[0, 0].tolist()) for r in ds}
    assert got == {f"i{k}": (f"caption {k}", [30 * k, 5, 9]) for k in range(7)}
    assert formats.shard_bounds([5, 50, 1, 1], 10) == [(0, 1), (1, 2), (2, 4)]    # an oversized row: own shard
    assert formats.shard_bounds([], 10) == [(0, 0)]


def spurious_study(tmp_path, with_prompt=True):
    d = tmp_path / "results" / "spurious_retrieval"
    ds = d / "coco"
    (ds / "selection").mkdir(parents=True)
    req = pd.DataFrame({"item_id": ["1_dog", "2_cat", "3_cup"], "image_id": [1, 2, 3],
                        "split": ["train", "train", "val"], "category": ["dog", "cat", "cup"],
                        "removed_categories": [["dog"], ["cat"], ["cup"]],
                        "present_categories": [["person"], ["sofa"], []],
                        "image_path": [str(png(tmp_path / "coco" / f"{i}.png", (i, 0, 0))) for i in (1, 2, 3)]})
    req.to_parquet(ds / "selection" / "requests.parquet")
    shard = ds / "images" / "lama" / "00000"
    for i in ("1_dog", "2_cat", "3_cup"):
        png(shard / f"{i}.png", (0, 9, 9))
    pd.DataFrame({"item_id": ["1_dog", "2_cat", "3_cup"], "image_path": list(req["image_path"]),
                  "output_path": ["1_dog.png", "2_cat.png", "3_cup.png"], "method": "lama",
                  "key": ["k1", "k2", "k3"]}).to_parquet(shard / "shard.parquet")
    (ds / "captions").mkdir()
    syn = [("1_dog", 1, "train", "np_removal", 1, "a man on a bench", True),
           ("1_dog", 1, "train", "np_removal", 0, "a man sitting", True),
           ("3_cup", 3, "val", "np_removal", 0, "a table", True)]
    if with_prompt:
        syn.append(("2_cat", 2, "train", "prompt", 0, "A photo of a sofa.", True))
    pd.DataFrame(syn, columns=["item_id", "image_id", "split", "method", "caption_index", "caption",
                               "matched"]).to_parquet(ds / "captions" / "synthetic.parquet")
    return d


def test_spurious_retrieval_export_pairs_every_image_with_its_captions(tmp_path):
    """Issue 32.7: the spurious-retrieval rows carry their captions (no image-only rows)."""
    d = spurious_study(tmp_path)
    (table,) = spurious_tables(d)
    rows = table.rows.set_index("item_id")
    assert rows.loc["1_dog", "caption"] == "a man sitting"
    assert list(rows.loc["1_dog", "captions"]) == ["a man sitting", "a man on a bench"]
    assert rows.loc["2_cat", "caption"] == "A photo of a sofa." and rows.loc["2_cat", "prompt_caption"] == "A photo of a sofa."
    assert rows.loc["3_cup", "caption"] == "a table" and "captioner_caption" not in rows.columns
    formats.write_imagefolder([table], tmp_path / "if")
    ds = load("imagefolder", tmp_path, data_dir=str(tmp_path / "if" / "coco_lama"), split="train")
    assert sorted(zip(ds["item_id"], ds["caption"])) == [("1_dog", "a man sitting"), ("2_cat", "A photo of a sofa."),
                                                         ("3_cup", "a table")]
    (table,) = spurious_tables(spurious_study(tmp_path / "noprompt", with_prompt=False))
    assert sorted(table.rows["item_id"]) == ["1_dog", "3_cup"]          # 2_cat lost every caption: not exported
    (d / "coco/captions/synthetic.parquet").unlink()
    with pytest.raises(InputError, match="synthetic captions not found"):
        spurious_tables(d)


def test_card_lists_and_copies_the_filter_cards(tmp_path):
    """Issue 47: an audited filter's card (precision, recall with intervals, removal share) sits beside the dataset
    card; without one the card has no such section and no filter_cards/ folder."""
    d = coco_study(tmp_path)
    export = d / "export"
    tables = [formats.ExportTable("default", pd.read_parquet(d / "images/selected_pairs.parquet"),
                                  ("image_0", "image_1"), "id", base=d / "images", default_split="test")]
    formats.write_parquet(tables, export / "parquet")
    (tmp_path / "provenance.json").write_text(json.dumps({"git": {"commit": "abc"}}))
    card_dir = d / "filters" / "cards" / "clip"
    card_dir.mkdir(parents=True)
    metric = lambda v, lo, hi: {"value": v, "low": lo, "high": hi}  # noqa: E731
    (card_dir / "card.json").write_text(json.dumps({
        "title": "COCO-CF CLIP filter", "threshold": None, "removal_share": 0.5132978723404256, "n_audited": 29,
        "bootstrap": {"level": 0.95}, "metrics": {"precision": metric(0.38888, 0.2096, 0.6002),
                                                  "recall": metric(0.63636, 0.3990, 0.9090)}}))
    (card_dir / "card.md").write_text("# card\n")
    (card_dir / "scores.parquet").write_text("not copied")
    rc = main(["export", "card", "--study", "coco_counterfactuals", "--study-dir", str(d), "--provenance",
               str(tmp_path / "provenance.json"), "--export-dir", str(export), "--filter-card", str(card_dir)])
    text = (export / "README.md").read_text()
    assert rc == 0 and "### Filter cards" in text
    assert ("| `clip` | COCO-CF CLIP filter | rule | 0.389 [0.210, 0.600] | 0.636 [0.399, 0.909] | 0.513 | 29 | "
            "`filter_cards/clip/card.md` |") in text
    assert sorted(p.name for p in (export / "filter_cards" / "clip").iterdir()) == ["card.json", "card.md"]
    assert text.index("### Filter cards") < text.index("### Configuration")
    # without a card: no section, and the earlier copies go
    cards.write_card("coco_counterfactuals", COCO_EXPORT, d, tmp_path / "provenance.json", export)
    assert "Filter cards" not in (export / "README.md").read_text() and not (export / "filter_cards").exists()


@pytest.mark.parametrize("kept", [["102_3"], []])
def test_imagefolder_exports_the_verified_variant(tmp_path, kept):
    """Issue 47: `export imagefolder --verified` adds <config>_verified with the rows the VQA check kept (none kept:
    an empty config), beside the full one; the dataset card names it."""
    d = coco_study(tmp_path)
    pairs = pd.read_parquet(d / "images/selected_pairs.parquet")
    (d / "verify").mkdir()
    pairs[pairs["id"].isin(kept)].to_parquet(d / "verify" / "verified.parquet")
    export = d / "export"
    rc = main(["export", "imagefolder", "--study", "coco_counterfactuals", "--study-dir", str(d), "--out-dir",
               str(export / "imagefolder"), "--parquet-dir", str(export / "parquet"),
               "--verified", str(d / "verify" / "verified.parquet")])
    assert rc == 0
    m = json.loads((export / "parquet" / "manifest.json").read_text())
    assert {c: sum(s["rows"] for s in v["splits"].values()) for c, v in m["configs"].items()} == {
        "default": 2, "default_verified": len(kept)}
    if kept:
        ds = load("parquet", tmp_path, data_files=str(export / "parquet" / "default_verified" / "test-*.parquet"),
                  split="train")
        assert ds["id"] == kept and pixels(ds[0]["image_0"])[0, 0].tolist() == [1, 1, 2]
    (tmp_path / "provenance.json").write_text(json.dumps({"git": {"commit": "abc"}}))
    text = cards.write_card("coco_counterfactuals", COCO_EXPORT, d, tmp_path / "provenance.json", export).read_text()
    assert "Verified variant: `default_verified`" in text
    assert any(c["config_name"] == "default_verified" for c in cards.card_numbers(text)["configs"])


def test_verified_rows_of_each_study():
    """Which export rows each study's verified variant keeps (its keys: pair id, set member, dataset + item,
    edited image file)."""
    T = formats.ExportTable
    social = T("default", pd.DataFrame({"set_id": ["s1", "s1", "s2"], "candidate_index": [0, 0, 1],
                                        "member_index": [0, 1, 0], "image": ["a", "b", "c"]}), ("image",), "set_id")
    v = pd.DataFrame({"set_id": ["s1"], "candidate_index": [0], "member_index": [1]})
    assert list(studies.spec("social_counterfactuals").export.verified(social, v, None)) == [False, True, False]
    cc = T("counting", pd.DataFrame({"item_id": ["1", "2"]}), (), "item_id")
    v = pd.DataFrame({"dataset": ["counting", "positions"], "item_id": ["2", "1"]})
    assert list(studies.spec("countercurate").export.verified(cc, v, None)) == [False, True]
    from pathlib import Path

    cvld = T("coco_ip2p", pd.DataFrame({"image": ["/r/cvld/coco/edits/ip2p/00000/a.png",
                                                  "/r/cvld/coco/edits/ip2p/00000/b.png"]}), ("image",), "image")
    v = pd.DataFrame({"path": ["../coco/edits/ip2p/00000/b.png", "../coco/edits/other/00000/a.png"]})
    assert studies.spec("cvld").export.verified(cvld, v, Path("/r/cvld/verify")) == [False, True]
    sr = T("coco_lama", pd.DataFrame({"image": ["/r/sr/coco/images/lama/00000/a.png"]}), ("image",), "image")
    v = pd.DataFrame({"image": ["../coco/images/lama/00000/a.png"]})
    assert studies.spec("spurious_retrieval").export.verified(sr, v, Path("/r/sr/verify")) == [True]
