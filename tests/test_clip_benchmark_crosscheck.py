"""Issue 46 item 4: the CLIP_benchmark export (``counterfactory export clip-benchmark``, rule export_clip_benchmark) is
read by CLIP_benchmark itself, and its zero-shot retrieval Recall@K on the exported COCO-CF pairs equals
CounterFactory's on the same model and items.

CLIP_benchmark is pinned in requirements.lock (``clip-benchmark``, ``webdataset``, ``braceexpand``: it resolves
beside the other pins without changing any), so ``make test`` has it in .venv. An older .venv without it gets the
three pinned wheels installed from the package index into a throwaway ``--target`` folder (``--no-deps``: the rest
of its requirements are .venv's pins); the test skips only when that index cannot be reached. CLIP_benchmark runs in a
subprocess through its own command line (``clip_benchmark eval --dataset wds/default --task zeroshot_retrieval``),
loading the demo's tiny OpenCLIP model from its folder (``--model local-dir:<folder>``, open_clip's own schema).

CounterFactory's side is ``counterfactory score``'s ``coco_cf_retrieval`` cells (Recall@K on the pairs' retrieval
space, K from ``coco_counterfactuals.evaluation.itr.ks``, here 1, 2, 5, 10), which are built from the COCO-CFs
retrieval set of the study's zero-shot retrieval (``counterfactory evaluate itr``:
:func:`counterfactory.evaluation.cf_retrieval_set` + :func:`~counterfactory.evaluation.retrieval_recall` with the
role's scorer); the test checks both against CLIP_benchmark, and score's against evaluate itr's. All score the same
space: every image of the pairs (2N) against every caption (2N), caption
``k`` of a pair belonging to image ``k``; CLIP_benchmark takes it from the export's samples (one per image, its
caption in ``<key>.txt``). The images are random-noise PNGs and the test first checks that no score in the matrix
within 1e-5 of a query's positive sits where it could
change a hit at any K, so no tie (broken arbitrarily by ``torch.topk``) decides a recall.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from counterfactory.cli import main
from counterfactory.errors import InputError
from counterfactory.export import webdataset as wds_export

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("clip-benchmark", "webdataset", "braceexpand")
KS = (1, 2, 5, 10)
#: pip's messages when the package index cannot be reached (the only reason to skip)
OFFLINE = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
                     r"Network is unreachable|Max retries exceeded|ProxyError|ConnectTimeout|ReadTimeout|"
                     r"Connection refused|No route to host")

pytestmark = pytest.mark.usefixtures("one_thread")


def _pins() -> list[str]:
    lock = (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines()
    pins = [line.strip() for line in lock if line.split("==")[0].strip().lower() in PACKAGES]
    assert len(pins) == len(PACKAGES), f"requirements.lock pins {pins}, expected {PACKAGES}"
    return pins


@pytest.fixture(scope="module")
def clip_benchmark_env(tmp_path_factory) -> dict:
    """Environment for a subprocess that imports clip_benchmark: .venv's own when it has the pinned packages, else
    .venv plus a throwaway ``pip install --target`` of them (skips only when the package index is unreachable)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    if all(importlib.util.find_spec(m) for m in ("clip_benchmark", "webdataset", "braceexpand")):
        return env
    target = tmp_path_factory.mktemp("clip-benchmark-site")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "--target", str(target), *_pins()],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        out = proc.stdout + proc.stderr
        if OFFLINE.search(out):
            pytest.skip(f"clip-benchmark is not in this environment and the package index is unreachable: "
                        f"{OFFLINE.search(out).group(0)}")
        pytest.fail(f"pip install {' '.join(_pins())} failed:\n{out[-3000:]}")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture(scope="module")
def tiny_open_clip(tmp_path_factory) -> Path:
    """The demo's tiny OpenCLIP model (role clip_open_clip, resources/models/tiny/clip_open_clip), built afresh."""
    from counterfactory.models import tiny

    out = tmp_path_factory.mktemp("open_clip")
    tiny.build("clip_open_clip", out)
    return out / "clip_open_clip"


#: the pairs: one noun changed, as COCO-Counterfactuals' captions
WORDS = [("dog", "cat"), ("red car", "blue car"), ("man", "woman"), ("apple", "banana"), ("boat", "plane"),
         ("tree", "house"), ("horse", "cow"), ("pizza", "cake")]


def coco_cf_study(root: Path, seed: int = 3) -> Path:
    """A COCO-Counterfactuals results folder as the image stage writes it: ``images/selected_pairs.parquet`` with
    image paths relative to it, under ``shards/00000/images/<id>_img_<k>.png`` (noise images, distinct per side;
    seed 3: no near-tie within 1e-4 decides a hit of the tiny model)."""
    d = root / "coco_counterfactuals"
    img = d / "images" / "shards" / "00000" / "images"
    img.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    rows = []
    for i, (a, b) in enumerate(WORDS):
        pid = f"{101 + i}_{i % 3}"
        for side in (0, 1):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(img / f"{pid}_img_{side}.png")
        rows.append({"id": pid, "caption_0": f"A photo of a {a} on the grass.",
                     "caption_1": f"A photo of a {b} on the grass.",
                     "image_0": f"shards/00000/images/{pid}_img_0.png", "image_1": f"shards/00000/images/{pid}_img_1.png",
                     "seed": np.uint64(2**63 + i)})
    pd.DataFrame(rows).to_parquet(d / "images" / "selected_pairs.parquet")
    return d


def _export(study: Path, out: Path, *extra: str) -> dict:
    manifest = out.parent / f"{out.name}.json"
    assert main(["export", "clip-benchmark", "--study", "coco_counterfactuals", "--study-dir", str(study),
                 "--out-dir", str(out), "--manifest", str(manifest), *extra]) == 0
    return json.loads(manifest.read_text())


def _counterfactory_recall(model: Path, study: Path) -> tuple[dict, np.ndarray, np.ndarray]:
    """CounterFactory's Recall@K on COCO-CFs (``evaluate itr``'s COCO-CFs rows), the cosine matrix and text owners."""
    from counterfactory.evaluation import cf_retrieval_set, retrieval_recall
    from counterfactory.evaluation.readers import read_pairs
    from counterfactory.scorers import scorer_from_config

    cfg = {"models": {"clip_open_clip": {"source": str(model), "library": "open_clip"}}, "device": "cpu",
           "precision": "fp32"}
    scorer = scorer_from_config(cfg, "clip_open_clip", progress=False)
    rset = cf_retrieval_set(read_pairs(study / "images" / "selected_pairs.parquet"))
    cosine = scorer.score_matrix(rset.images, rset.texts) / scorer.logit_scale
    return retrieval_recall(scorer, rset, KS), cosine, rset.text_image


def _score_recall(model: Path, study: Path, out: Path) -> pd.DataFrame:
    """``counterfactory score run``'s ``coco_cf_retrieval`` cells (value and interval in fractions), by its command
    line, on the demo config with K = :data:`KS` (the study's ``evaluation.itr.ks``)."""
    over = out.parent / f"{out.name}-ks.yaml"
    over.write_text(f"coco_counterfactuals: {{evaluation: {{itr: {{ks: {list(KS)}}}}}}}\ndevice: cpu\n"
                    "precision: fp32\n")
    assert main(["score", "run", "--config", str(REPO / "config" / "demo.yaml"), "--config", str(over),
                 "--model", str(model), "--benchmarks", "coco_cf_retrieval", "--data",
                 f"coco_cf_retrieval={study / 'images' / 'selected_pairs.parquet'}", "--out-dir", str(out),
                 "--resamples", "200", "--no-baselines", "--no-progress"]) == 0
    board = pd.read_csv(out / "leaderboard.csv")
    return board[(board["benchmark"] == "coco_cf_retrieval") & (board["kind"] == "model")].set_index("metric")


def _undecided(cosine: np.ndarray, owner: np.ndarray, tol: float = 1e-5) -> list[tuple[str, int, int]]:
    """The (direction, query, K) whose hit would change if any score moved by ``tol``: a candidate within ``tol`` of
    the query's positive changes its rank by one, and that matters only where the rank is K - 1 or K."""
    undecided = []
    queries = [("text_to_image", j, cosine[:, j], int(i)) for j, i in enumerate(owner)]
    queries += [("image_to_text", i, cosine[i], int(np.flatnonzero(owner == i)[0])) for i in range(cosine.shape[0])]
    for direction, q, scores, positive in queries:
        others = np.delete(scores, positive)
        low, high = int((others > scores[positive] + tol).sum()), int((others > scores[positive] - tol).sum())
        undecided += [(direction, q, k) for k in KS if (low < k) != (high < k)]
    return undecided


def _clip_benchmark(env: dict, model: Path, dataset_root: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "clip_benchmark.cli", "eval", "--dataset", "wds/default",
           "--dataset_root", str(dataset_root), "--task", "zeroshot_retrieval", "--model", f"local-dir:{model}",
           "--pretrained", "none", "--recall_k", *map(str, KS), "--no_amp", "--num_workers", "0",
           "--batch_size", "5", "--output", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out.parent, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())["metrics"]


def test_clip_benchmark_reads_the_export_and_agrees_on_recall(tmp_path, tiny_open_clip, clip_benchmark_env,
                                                              monkeypatch):
    monkeypatch.chdir(REPO)   # the demo config's relative paths
    study = coco_cf_study(tmp_path / "results")
    out = tmp_path / "export" / "clip_benchmark"
    # three shards (~3 KB of PNG each image): CLIP_benchmark reads them through nshards.txt's {0..N-1}.tar pattern
    manifest = _export(study, out, "--max-shard-bytes", "20000")
    split = manifest["configs"]["default"]["splits"]["test"]
    assert split["rows"] == split["captions"] == 2 * len(WORDS) and len(split["files"]) > 1
    assert (out / "default" / "dataset_type.txt").read_text() == "retrieval\n"
    assert int((out / "default" / "test" / "nshards.txt").read_text()) == len(split["files"])

    ours, cosine, owner = _counterfactory_recall(tiny_open_clip, study)
    assert _undecided(cosine, owner) == [], "a near-tie would decide a recall: change the images' seed"
    scored = _score_recall(tiny_open_clip, study, tmp_path / "scores")
    assert set(scored.index) == {f"{d}@{k}" for d in ("image_to_text", "text_to_image") for k in KS}
    assert (scored["n"] == 4 * len(WORDS)).all()   # the units: every image and every caption as a query
    theirs = _clip_benchmark(clip_benchmark_env, tiny_open_clip, out / "default", tmp_path / "clip_benchmark.json")
    for k in KS:   # CLIP_benchmark: fractions, "text retrieval" = image -> text; evaluate itr: percent
        for mine, clip_bench in ((f"image_to_text@{k}", f"text_retrieval_recall@{k}"),
                                 (f"text_to_image@{k}", f"image_retrieval_recall@{k}")):
            cell = scored.loc[mine]
            assert cell["value"] == pytest.approx(theirs[clip_bench], abs=1e-6), mine   # score: fractions
            assert 100 * theirs[clip_bench] == pytest.approx(ours[mine], abs=1e-4), mine
            assert cell["ci_low"] <= cell["value"] <= cell["ci_high"], mine
    # not a trivial agreement: recall grows with K and is neither 0 nor 100 at K = 1
    assert 0 < ours["image_to_text@1"] < 100 or 0 < ours["text_to_image@1"] < 100
    assert ours["text_to_image@10"] > ours["text_to_image@1"]


def test_export_is_deterministic_and_keeps_the_items(tmp_path):
    study = coco_cf_study(tmp_path / "results")
    first, second = tmp_path / "a" / "clip_benchmark", tmp_path / "b" / "clip_benchmark"
    m1, m2 = _export(study, first), _export(study, second)
    assert m1["configs"] == m2["configs"]
    tars = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert tars == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    for rel in tars:
        assert (first / rel).read_bytes() == (second / rel).read_bytes(), rel
    samples = wds_export.read_clip_benchmark(first, "default")
    keys = [k for k, _, _ in samples]
    assert keys == sorted(keys) and len(keys) == 2 * len(WORDS)
    pairs = pd.read_parquet(study / "images" / "selected_pairs.parquet").set_index("id")
    for key, ext, captions in samples:
        pid, side = key.rsplit("_", 1)
        assert ext == "png" and captions == [pairs.loc[pid, f"caption_{side}"]]
    import tarfile

    with tarfile.open(first / "default" / "test" / "0.tar") as tar:
        members = tar.getmembers()
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    meta = json.loads(tarfile.open(first / "default" / "test" / "0.tar").extractfile(f"{keys[0]}.json").read())
    assert meta == {"id": keys[0].rsplit("_", 1)[0], "image": f"image_{keys[0][-1]}"}


def test_writer_flattens_captions_converts_images_and_refuses_bad_keys(tmp_path):
    Image.new("RGB", (4, 4), (1, 2, 3)).save(tmp_path / "a.bmp")
    Image.new("RGB", (4, 4), (9, 9, 9)).save(tmp_path / "b.jpg")
    items = [wds_export.RetrievalItem("b", tmp_path / "b.jpg", ("two\nlines", "  ")),
             wds_export.RetrievalItem("a", tmp_path / "a.bmp", ("one",))]
    wds_export.write_clip_benchmark({"x": items}, tmp_path / "out")
    assert wds_export.read_clip_benchmark(tmp_path / "out", "x") == [("a", "png", ["one"]),
                                                                      ("b", "jpg", ["two lines"])]
    assert wds_export.sample_key("1.5 x", 0) == "1_5_x_0"
    with pytest.raises(InputError, match="occurs twice"):
        wds_export.write_clip_benchmark({"x": items + items[:1]}, tmp_path / "dup")
    with pytest.raises(InputError, match="has a dot"):
        wds_export.write_clip_benchmark({"x": [wds_export.RetrievalItem("a.b", tmp_path / "b.jpg", ("c",))]},
                                        tmp_path / "dot")
    with pytest.raises(InputError, match="no caption"):
        wds_export.write_clip_benchmark({"x": [wds_export.RetrievalItem("a", tmp_path / "b.jpg", ("\n",))]},
                                        tmp_path / "empty")
    assert not (tmp_path / "dup").exists()


def test_other_studies_declare_retrieval_sets(tmp_path, capsys):
    """CounterCurate: each source image once with all its captions, each negative with its negative caption;
    spurious retrieval: each inpainted image with its captions."""
    from counterfactory import studies
    from counterfactory.export.studies import retrieval_sets

    assert [s.name for s in studies.specs() if s.export and s.export.retrieval] == studies.names()   # every study
    d = tmp_path / "countercurate" / "datasets"
    d.mkdir(parents=True)
    for name in ("src.jpg", "n0.png", "n1.png"):
        Image.new("RGB", (4, 4), (len(name), 0, 0)).save(tmp_path / name)
    pd.DataFrame({"item_id": ["i0", "i1"], "image_path": [str(tmp_path / "src.jpg")] * 2,
                  "caption": ["a left of b", "a above b"], "negative_caption": ["a right of b", "a below b"],
                  "negative_image": [str(tmp_path / "n0.png"), str(tmp_path / "n1.png")]}).to_parquet(
        d / "positions.parquet")
    for name in ("counting", "attributes"):
        pd.DataFrame({"item_id": pd.Series([], dtype=str)}).to_parquet(d / f"{name}.parquet")
    sets = retrieval_sets("countercurate", studies.spec("countercurate").export, d.parent)
    got = {it.key: it.captions for it in sets["positions"]}
    assert got == {f"source_{tmp_path.name}_src": ("a left of b", "a above b"), "i0_negative": ("a right of b",),
                   "i1_negative": ("a below b",)}
    assert set(sets) == {"positions"}                                   # empty datasets give no config
    assert main(["export", "clip-benchmark", "--study", "cvld", "--study-dir", str(tmp_path), "--out-dir",
                 str(tmp_path / "o")]) == 2
    assert "no edits" in capsys.readouterr().err                        # a clear error, nothing written
    assert not (tmp_path / "o").exists()


def test_dataset_card_lists_the_clip_benchmark_layout(tmp_path):
    study = coco_cf_study(tmp_path / "results")
    export = study / "export"
    _export(study, export / "clip_benchmark")
    (tmp_path / "provenance.json").write_text(json.dumps({"counterfactory": "0.1.0", "git": {}, "models": {},
                                                          "config": {}}))
    assert main(["export", "card", "--study", "coco_counterfactuals", "--study-dir", str(study), "--provenance",
                 str(tmp_path / "provenance.json"), "--export-dir", str(export),
                 f"--manifest=clip_benchmark={export / 'clip_benchmark.json'}"]) == 0
    card = (export / "README.md").read_text()
    assert f"| clip_benchmark | default | test | {2 * len(WORDS)} |" in card and "wds/<config>" in card


def test_spurious_retrieval_set_pairs_each_inpainted_image_with_its_captions(tmp_path):
    from test_export import spurious_study

    from counterfactory import studies
    from counterfactory.export.studies import retrieval_sets

    sets = retrieval_sets("spurious_retrieval", studies.spec("spurious_retrieval").export, spurious_study(tmp_path))
    got = {it.key: it.captions for it in sets["coco_lama"]}
    assert got["1_dog"] == ("a man sitting", "a man on a bench") and got["3_cup"] == ("a table",)
    assert got["2_cat"] == ("A photo of a sofa.",)          # no noun-phrase caption left: its one caption
    m = wds_export.write_clip_benchmark(sets, tmp_path / "out")
    assert m["configs"]["coco_lama"]["splits"]["test"]["rows"] == 3


@pytest.mark.parametrize("kept", [["102_1", "104_0"], []])
def test_clip_benchmark_exports_the_verified_variant(tmp_path, kept):
    """Issue 47: `export clip-benchmark --verified` adds <config>_verified with the pairs the VQA check kept, in the
    same layout; a check that keeps nothing gives no such config (CLIP_benchmark cannot read zero shards)."""
    study = coco_cf_study(tmp_path / "results")
    pairs = pd.read_parquet(study / "images" / "selected_pairs.parquet")
    (study / "verify").mkdir()
    pairs[pairs["id"].isin(kept)].to_parquet(study / "verify" / "verified.parquet")
    m = _export(study, tmp_path / "out", "--verified", str(study / "verify" / "verified.parquet"))
    assert set(m["configs"]) == ({"default", "default_verified"} if kept else {"default"})
    if kept:
        keys = [k for k, _, _ in wds_export.read_clip_benchmark(tmp_path / "out", "default_verified")]
        assert keys == sorted(f"{pid}_{side}" for pid in kept for side in (0, 1))
        full = dict((k, c) for k, _, c in wds_export.read_clip_benchmark(tmp_path / "out", "default"))
        assert all(full[k] == c for k, _, c in wds_export.read_clip_benchmark(tmp_path / "out", "default_verified"))


def _table(rows: dict, images: tuple[str, ...], index: str):
    from counterfactory.export.formats import ExportTable

    return ExportTable("default", pd.DataFrame(rows), images, index)


def test_social_retrieval_set_is_each_member_once_with_its_own_caption(tmp_path):
    """SocialCF: every member of a set with its caption, one candidate per set (a set's second kept candidate
    repeats its captions word for word, a tie CLIP_benchmark would break arbitrarily)."""
    from counterfactory.studies.social_counterfactuals.export import social_retrieval

    for name in "abcde":
        Image.new("RGB", (4, 4), (ord(name), 0, 0)).save(tmp_path / f"{name}.png")
    table = _table({"item_id": ["s1-c001-m00", "s1-c001-m01", "s1-c000-m00", "s1-c000-m01", "s2-c003-m00"],
                    "set_id": ["s1", "s1", "s1", "s1", "s2"], "candidate_index": [1, 1, 0, 0, 3],
                    "member_index": [0, 1, 0, 1, 0], "segment": ["race_gender"] * 5,
                    "caption": ["a photo of a black man", "a photo of a white man"] * 2 + ["a photo of an old nurse"],
                    "image": [str(tmp_path / f"{n}.png") for n in "abcde"]}, ("image",), "item_id")
    items = social_retrieval(table)
    assert {it.key: it.captions for it in items} == {
        "s1-c000-m00": ("a photo of a black man",), "s1-c000-m01": ("a photo of a white man",),
        "s2-c003-m00": ("a photo of an old nurse",)}
    assert {it.key: it.image.name for it in items} == {"s1-c000-m00": "c.png", "s1-c000-m01": "d.png",
                                                       "s2-c003-m00": "e.png"}
    m = wds_export.write_clip_benchmark({"default": items}, tmp_path / "out")
    split = m["configs"]["default"]["splits"]["test"]
    assert (split["rows"], split["captions"]) == (3, 3)


def test_cvld_retrieval_set_is_each_original_and_its_best_kept_edit(tmp_path):
    """CVLD: each original image once with its caption, and per item the best kept edit (lowest rank) with the
    gender-swapped caption; the other kept edits of the item share that caption and stay out."""
    from counterfactory.studies.cvld.export import cvld_retrieval

    for name in ("o1", "o2", "e10", "e11", "e20"):
        Image.new("RGB", (4, 4), (len(name), 0, 0)).save(tmp_path / f"{name}.png")
    table = _table({"edit_id": ["c1_0", "c1_1", "c2_0"], "item_id": ["c1", "c1", "c2"], "candidate": [0, 1, 0],
                    "rank": [1, 0, 0], "image": [str(tmp_path / f"{n}.png") for n in ("e10", "e11", "e20")],
                    "source_prompt": ["A woman rides.", "A woman rides.", "A man reads."],
                    "target_prompt": ["A man rides.", "A man rides.", "A woman reads."],
                    "original_image": [str(tmp_path / "o1.png"), str(tmp_path / "o1.png"), str(tmp_path / "o2.png")]},
                   ("image", "original_image"), "edit_id")
    items = {it.key: (it.image.name, it.captions) for it in cvld_retrieval(table)}
    assert items == {"c1_1": ("e11.png", ("A man rides.",)), "c2_0": ("e20.png", ("A woman reads.",)),
                     f"original_{tmp_path.name}_o1": ("o1.png", ("A woman rides.",)),
                     f"original_{tmp_path.name}_o2": ("o2.png", ("A man reads.",))}
