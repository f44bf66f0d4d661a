"""Evaluation stage: retrieval sets, relative change, ITM differences, zero-shot classification, and the
CLI end to end on tiny models and tiny inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from counterfactory import cli, evaluation
from counterfactory.evaluation import classify
from counterfactory.errors import ConfigError, InputError
from counterfactory.metrics import recall_at_k
from test_tables import parse_pipe_table

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "resources" / "demo" / "classification"
IMAGE_IDS = (101, 102, 103, 104, 105)
PAIR_IMAGES = (101, 102, 103, 104)


# --------------------------------------------------------------------------------------------
# tiny inputs: a COCO root, its caption table and the image stage's selected pairs
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_inputs")
    rng = np.random.default_rng(0)
    coco = root / "coco" / "val2017"
    coco.mkdir(parents=True)
    caps = []
    for iid in IMAGE_IDS:
        Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(coco / f"{iid:012d}.jpg")
        for c in range(2):
            caps.append({"caption_id": f"{iid}_{c}", "image_id": iid, "caption": f"caption {c} of image {iid} with a dog"})
    pd.DataFrame(caps).to_parquet(root / "captions.parquet")
    images_dir = root / "images"
    (images_dir / "shards" / "00000" / "images").mkdir(parents=True)
    rows = []
    for iid in PAIR_IMAGES:
        cid = f"{iid}_0"
        for g in (0, 1):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(
                images_dir / "shards" / "00000" / "images" / f"{cid}_img_{g}.png")
        rows.append({"id": cid, "caption_0": f"caption 0 of image {iid} with a dog",
                     "caption_1": f"caption 0 of image {iid} with a cat",
                     "image_0": f"shards/00000/images/{cid}_img_0.png", "image_1": f"shards/00000/images/{cid}_img_1.png",
                     "caption_id": cid, "source_index": len(rows), "image_id": str(iid)})
    pd.DataFrame(rows).to_parquet(images_dir / "selected_pairs.parquet")
    return {"root": root, "coco_root": root / "coco", "captions": root / "captions.parquet",
            "pairs": images_dir / "selected_pairs.parquet"}


# --------------------------------------------------------------------------------------------
# fake scorers (exact, known scores)
# --------------------------------------------------------------------------------------------
class FakeDual:
    dual = True
    name = "fake_dual"

    def __init__(self, matrix):
        self.matrix = np.asarray(matrix, dtype=np.float32)

    def score_matrix(self, images, texts):
        assert self.matrix.shape == (len(images), len(texts))
        return self.matrix


class FakeCross:
    dual = False
    name = "fake_cross"

    def __init__(self, matrix=None, fn=None):
        self.matrix = None if matrix is None else np.asarray(matrix, dtype=np.float32)
        self.fn = fn
        self.calls = 0

    def score_index_pairs(self, images, texts, ii, tt):
        self.calls += len(ii)
        if self.fn is not None:
            return np.array([self.fn(images[i], texts[j]) for i, j in zip(ii, tt)], dtype=np.float32)
        return self.matrix[np.asarray(ii), np.asarray(tt)]

    def score_matrix(self, images, texts):
        ii, tt = np.meshgrid(np.arange(len(images)), np.arange(len(texts)), indexing="ij")
        return self.score_index_pairs(images, texts, ii.ravel(), tt.ravel()).reshape(len(images), len(texts))


def test_retrieval_sets(inputs):
    pairs = evaluation.read_pairs(inputs["pairs"])
    assert Path(pairs["image_0"][0]).is_absolute() or Path(pairs["image_0"][0]).exists()
    cf = evaluation.cf_retrieval_set(pairs)
    assert len(cf.images) == len(cf.texts) == 8
    assert cf.texts[4] == pairs["caption_1"][0] and cf.text_image.tolist() == list(range(8))
    captions = evaluation.read_captions(inputs["captions"])
    coco = evaluation.coco_retrieval_set(pairs, captions, inputs["coco_root"] / "val2017", "matched")
    assert coco.name == "MS-COCO" and len(coco.images) == 4 and coco.texts == list(pairs["caption_0"])
    assert coco.images[0].endswith("000000000101.jpg")
    full = evaluation.coco_retrieval_set(pairs, captions, inputs["coco_root"] / "val2017", "all")
    assert len(full.texts) == 8 and full.text_image.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ConfigError):
        evaluation.coco_retrieval_set(pairs, captions, inputs["coco_root"] / "val2017", "five")
    with pytest.raises(InputError, match="MS-COCO image not found"):
        evaluation.coco_retrieval_set(pairs, captions, inputs["root"] / "nowhere", "matched")


def test_retrieval_recall_dual_and_shortlist():
    rng = np.random.default_rng(1)
    s = rng.normal(size=(6, 6)).astype(np.float32)
    rset = evaluation.RetrievalSet("x", [f"i{k}" for k in range(6)], [f"t{k}" for k in range(6)], np.arange(6))
    ref = recall_at_k(s, np.arange(6), (1, 5))
    assert evaluation.retrieval_recall(FakeDual(s), rset, (1, 5)) == ref
    # cross-encoder, exhaustive and with a shortlist that covers everything: identical
    assert evaluation.retrieval_recall(FakeCross(s), rset, (1, 5)) == ref
    cross = FakeCross(s)
    assert evaluation.retrieval_recall(cross, rset, (1, 5), FakeDual(rng.normal(size=(6, 6))), 6) == ref
    # a shortlist of 1 scores at most 2 pairs per query; positives outside it are misses
    cand = np.full((6, 6), -1.0)
    np.fill_diagonal(cand, 1.0)
    cand[0, 0], cand[0, 1] = -1.0, 1.0  # image 0's shortlist misses its own text
    cross = FakeCross(np.eye(6))
    with pytest.raises(ConfigError, match="shortlist.k"):
        evaluation.retrieval_recall(cross, rset, (1, 5), FakeDual(cand), 1)
    out = evaluation.retrieval_recall(cross, rset, (1,), FakeDual(cand), 1)
    assert out["image_to_text@1"] == pytest.approx(100 * 5 / 6)
    assert cross.calls <= 12


def test_relative_change_and_table():
    assert evaluation.relative_change(21.72, 44.33) == pytest.approx(100 * (21.72 - 44.33) / 44.33)
    assert np.isnan(evaluation.relative_change(5.0, 0.0))
    rows = []
    for role, base, cf in (("bt", (40.0, 80.0), (20.0, 60.0)), ("clip", (30.0, 50.0), (33.0, 40.0))):
        for ds, vals in (("MS-COCO", base), ("COCO-CFs", cf)):
            for metric, v in zip(("TR@1", "IR@1"), vals):
                rows.append({"role": role, "model": f"model-{role}", "dataset": ds, "metric": metric, "value": v,
                             "n_pairs": 4, "n_images": 8, "n_texts": 8})
    table = evaluation.itr_table(pd.DataFrame(rows))
    assert list(table.columns[:3]) == ["model", "role", "dataset"]
    assert {"TR@1", "IR@1", "TR@1 rel%", "IR@1 rel%", "n_images"} <= set(table.columns)
    assert table["dataset"].tolist() == ["MS-COCO", "COCO-CFs", "MS-COCO", "COCO-CFs"]
    bt_cf = table[(table.role == "bt") & (table.dataset == "COCO-CFs")].iloc[0]
    assert bt_cf["TR@1 rel%"] == pytest.approx(-50.0) and bt_cf["IR@1 rel%"] == pytest.approx(-25.0)
    clip_cf = table[(table.role == "clip") & (table.dataset == "COCO-CFs")].iloc[0]
    assert clip_cf["TR@1 rel%"] == pytest.approx(10.0) and clip_cf["IR@1 rel%"] == pytest.approx(-20.0)
    assert table[table.dataset == "MS-COCO"]["TR@1 rel%"].isna().all()
    header, align, md_rows = parse_pipe_table(evaluation.render_itr_markdown(table))
    assert header == ["Model", "Evaluated dataset", "TR R@1", "IR R@1"]
    assert align == ["left", "left", "right", "right"]
    assert md_rows == [["model-bt", "MS-COCO", "40.00", "80.00"],
                    ["", "COCO-CFs", "20.00 (**-50%**)", "60.00 (-25%)"],   # largest drop of the row is bold
                    ["model-clip", "MS-COCO", "30.00", "50.00"],
                    ["", "COCO-CFs", "33.00 (+10%)", "40.00 (**-20%**)"]]
    with pytest.raises(InputError, match="MS-COCO"):
        evaluation.itr_table(pd.DataFrame(rows).query("dataset != 'MS-COCO'"))


def test_itm_inputs_random_pairs(inputs):
    pairs = evaluation.read_pairs(inputs["pairs"])
    captions = evaluation.read_captions(inputs["captions"])
    coco_dir = inputs["coco_root"] / "val2017"
    a = evaluation.itm_inputs(pairs, captions, coco_dir, seed=3)
    b = evaluation.itm_inputs(pairs, captions, coco_dir, seed=3)
    pd.testing.assert_frame_equal(a, b)
    assert (a["I_r"] != a["I_o"]).all()
    assert a["C_o"].tolist() == pairs["caption_0"].tolist() and a["I_c_s"].tolist() == pairs["image_1"].tolist()
    m = evaluation.itm_inputs(pairs, captions, coco_dir, seed=3, pool="matched")
    assert set(m["I_r"]) <= set(m["I_o"])


def test_itm_scores_follow_the_definitions(inputs):
    pairs = evaluation.read_pairs(inputs["pairs"])
    captions = evaluation.read_captions(inputs["captions"])
    inp = evaluation.itm_inputs(pairs, captions, inputs["coco_root"] / "val2017", seed=0)

    def g(image, text):
        return float(sum(map(ord, str(image))) % 89) + 0.01 * (sum(map(ord, text)) % 97)

    out = evaluation.itm_scores(FakeCross(fn=g), inp)
    r = inp.iloc[1]
    o = out.iloc[1]
    assert o["IR_r"] == pytest.approx(g(r.I_r, r.C_r) - g(r.I_o, r.C_r), abs=1e-4)
    assert o["TR_r"] == pytest.approx(g(r.I_r, r.C_r) - g(r.I_r, r.C_o), abs=1e-4)
    assert o["IR_c"] == pytest.approx(g(r.I_c_s, r.C_c) - g(r.I_o_s, r.C_c), abs=1e-4)
    assert o["TR_c"] == pytest.approx(g(r.I_c_s, r.C_c) - g(r.I_c_s, r.C_o), abs=1e-4)
    summary = evaluation.itm_summary(out.assign(role="r", model="m"))
    assert summary["metric"].tolist() == list(evaluation.ITM_METRICS)
    for _, row in summary.iterrows():
        v = out[row["metric"]].to_numpy(dtype=float)
        assert row["n"] == len(v)
        assert row["mean"] == pytest.approx(sum(v) / len(v))
        assert row["std"] == pytest.approx(np.std(v, ddof=1))
        assert (row["median"], row["q25"], row["q75"]) == pytest.approx(tuple(np.percentile(v, [50, 25, 75])))
        assert row["pct_below_zero"] == pytest.approx(100 * sum(x < 0 for x in v) / len(v))


def _topk_by_counting(logits, labels, k):
    """Independent top-k: the label's rank = #classes scoring higher + #lower-index classes tying it."""
    hits = 0
    for row, y in zip(logits, labels):
        rank = sum(1 for c, v in enumerate(row) if v > row[y] or (v == row[y] and c < y))
        hits += rank < k
    return 100.0 * hits / len(labels)


def test_topk_accuracy_and_class_embeddings():
    logits = np.array([[0.1, 0.9, 0.0], [0.5, 0.5, 0.1], [0.2, 0.1, 0.3]])
    acc = evaluation.topk_accuracy(logits, np.array([1, 1, 0]), [1, 2, 5])
    # row 2: tie between classes 0 and 1 goes to class 0, so label 1 is second
    assert acc == {1: pytest.approx(100 / 3), 2: pytest.approx(100.0), 5: 100.0}
    rng = np.random.default_rng(4)
    for n_classes in (2, 3, 10):
        logits = rng.integers(0, 4, size=(60, n_classes)).astype(float)   # many ties
        labels = rng.integers(0, n_classes, size=60)
        ks = [1, 2, 5, n_classes]
        got = evaluation.topk_accuracy(logits, labels, ks)
        assert got == {k: pytest.approx(_topk_by_counting(logits, labels, k)) for k in ks}
    with pytest.raises(ValueError, match="labels"):
        evaluation.topk_accuracy(np.zeros((2, 3)), np.array([0, 3]), [1])

    class Texts:
        def encode_texts(self, texts):
            return np.array([[1.0, 0.0] if "photo" in t else [0.0, 1.0] for t in texts])

    w = evaluation.class_text_embeddings(Texts(), ["cat", "dog"], ["a photo of a {c}.", "a {c}."])
    np.testing.assert_allclose(w, np.full((2, 2), 1 / np.sqrt(2)))
    with pytest.raises(ConfigError, match="placeholder"):
        evaluation.check_templates(["a photo"])


def test_class_embeddings_average_normalised_prompts():
    """Independent computation: per class, L2-normalise each template's text embedding, average, renormalise."""
    rng = np.random.default_rng(0)
    table: dict[str, np.ndarray] = {}

    class Fake:  # unnormalised, text-dependent vectors
        def encode_texts(self, texts):
            return np.stack([table.setdefault(t, rng.normal(size=5) * rng.uniform(0.5, 3)) for t in texts])

    classes, templates = ["cat", "dog", "sea horse"], ["a photo of a {c}.", "art of the {c}", "{c}!"]
    got = evaluation.class_text_embeddings(Fake(), classes, templates)
    for i, c in enumerate(classes):
        vecs = [table[t.replace("{c}", c)] for t in templates]
        mean = np.mean([v / np.linalg.norm(v) for v in vecs], axis=0)
        np.testing.assert_allclose(got[i], mean / np.linalg.norm(mean), rtol=1e-10)


def test_prompts_are_verbatim_no_period_added():
    assert classify.class_prompts(["dog", "hot dog"], ["a photo of a {c}", "{c}, a type of food."]) == [
        "a photo of a dog", "dog, a type of food.", "a photo of a hot dog", "hot dog, a type of food."]
    seen = []

    class Recorder:
        def encode_texts(self, texts):
            seen.extend(texts)
            return np.ones((len(texts), 2))

    evaluation.class_text_embeddings(Recorder(), ["dog"], ["a photo of a {c}"])
    assert seen == ["a photo of a dog"]


def test_per_dataset_templates_of_the_paper_config():
    """config.yaml: §5.2's single prompt "a photo of a {c}" (no period), Food101's food prompt, CLIP's readable
    class names for CIFAR and Food101, the reference evaluation's (torchvision's) for Caltech-101 and ImageNet;
    CLIP's prompt ensembles stay available as builtin lists."""
    from counterfactory.config import validate_config
    from counterfactory.data.classification import builtin_templates

    cfg = validate_config(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    ev = cfg["coco_counterfactuals"]["evaluation"]["classification"]
    food = classify.dataset_templates(ev, "Food101")
    assert food == ["a photo of {c}, a type of food"]
    assert classify.class_prompts(["apple pie"], food) == ["a photo of apple pie, a type of food"]
    n = {d: len(classify.dataset_templates(ev, d)) for d in ev["datasets"]}
    assert n == {"CIFAR10": 1, "CIFAR100": 1, "Food101": 1, "Caltech101": 1, "Caltech256": 1, "ImageNet": 1}
    assert classify.dataset_templates(ev, "ImageNet") == ["a photo of a {c}"]
    assert len(classify.check_templates("builtin:imagenet")) == 80  # CLIP's ensemble, as an option
    assert classify.check_templates("builtin:imagenet")[:2] == ["a bad photo of a {c}.", "a photo of many {c}."]
    assert {d: s.get("class_names") for d, s in ev["datasets"].items()} == {
        "CIFAR10": "builtin:cifar10", "CIFAR100": "builtin:cifar100", "Food101": "builtin:food101",
        "Caltech101": "torchvision", "Caltech256": "torchvision", "ImageNet": "torchvision"}   # the reference's names
    assert ev["datasets"]["Caltech101"]["background_class"] is False
    assert ev["datasets"]["Caltech256"]["background_class"] is True
    assert classify.dataset_templates({"templates": ["a {c}"], "datasets": {"X": {}}}, "X") == ["a {c}"]
    assert all(len(set(t)) == len(t) for t in builtin_templates().values())
    with pytest.raises(ConfigError, match=r"builtin:nope is not a built-in template list"):
        evaluation.check_templates("builtin:nope")
    with pytest.raises(ConfigError, match=r"datasets\.X\.templates.*placeholder"):
        classify.dataset_templates({"templates": ["a {c}"], "datasets": {"X": {"templates": ["nothing"]}}}, "X")


def test_classification_table_layout():
    results = [{"role": "a", "model": "A", "dataset": d, "top1": v, "top5": 100.0}
               for d, v in (("CIFAR10", 50.0), ("Food101", 70.0))]
    results.append({"role": "b", "model": "B", "dataset": "CIFAR10", "top1": 10.0, "top5": 90.0})
    t = evaluation.classification_table(results, "top1", ["Food101", "CIFAR10"])
    assert list(t.columns) == ["model", "role", "Food101", "CIFAR10", "Mean"]
    assert t.loc[0, "Mean"] == pytest.approx(60.0) and t.loc[1, "Mean"] == pytest.approx(10.0)
    header, _, rows = parse_pipe_table(evaluation.render_classification_markdown({"top1": t}))
    assert header == ["Model", "Food101", "CIFAR10", "Mean"]
    assert rows == [["A", "70.00", "50.00", "60.00"], ["B", "–", "10.00", "10.00"]]


# --------------------------------------------------------------------------------------------
# end to end through the CLI with tiny models
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def config_file(inputs, tmp_path_factory):
    from counterfactory.models import tiny_eval, tiny_vision

    models = tmp_path_factory.mktemp("eval_models")
    tiny_vision.build_clip(models / "clip_eval")
    tiny_eval.build_bridgetower(models / "itm")
    cfg = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    cfg["studies"] = ["coco_counterfactuals"]   # this test's models are the COCO-CF evaluation roles only
    study = cfg["coco_counterfactuals"]
    study["in_domain"]["enabled"] = False       # its fine-tuned models are not among this test's roles
    study["data"]["coco_root"] = str(inputs["coco_root"])
    cfg["models"] = {**{r: {"source": "unused"} for r in ("mlm", "lm", "sentence", "sd", "clip_filter")},
                     "clip_eval": {"source": str(models / "clip_eval")}, "itm": {"source": str(models / "itm")}}
    study["evaluation"] = {
        "batch_size": 8,
        "itr": {"models": ["clip_eval", "itm"], "ks": [1, 5], "head": "itm", "shortlist": {"role": "clip_eval", "k": 5}},
        "itm": {"models": ["clip_eval", "itm"], "seed": 0, "bins": 10},
        "classification": {"models": ["clip_eval"], "templates": ["a photo of a {c}.", "a {c}."],
                           "datasets": {"CIFAR10": {"format": "cifar10", "root": str(FIX / "cifar-10-batches-py"),
                                                        "trust_unofficial_pickle": True},
                                        "Food101": {"format": "food101", "root": str(FIX / "food-101"),
                                                    "templates": ["a photo of {c}, a type of food."]},
                                        "Caltech101": {"format": "caltech101", "root": str(FIX / "caltech101"),
                                                       "templates": "builtin:caltech101",
                                                       "class_names": "builtin:caltech101"},
                                        "ImageNet": {"format": "imagenet", "root": str(FIX / "imagenet" / "val"),
                                                     "class_index": str(FIX / "imagenet" / "LOC_synset_mapping.txt")}}},
    }
    path = inputs["root"] / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_cli_end_to_end(config_file, inputs, tmp_path):
    out = tmp_path / "evaluation"
    common = ["--config", str(config_file), "--pairs", str(inputs["pairs"]), "--captions", str(inputs["captions"]),
              "--no-progress"]
    for role in ("clip_eval", "itm"):
        assert cli.main(["evaluate", "itr", "--role", role, "--out", str(out / "itr" / f"{role}.csv"), *common]) == 0
        assert cli.main(["evaluate", "itm", "--role", role, "--out", str(out / "itm" / f"{role}.parquet"), *common]) == 0
    long = pd.read_csv(out / "itr" / "itm.csv")
    assert set(long["dataset"]) == {"MS-COCO", "COCO-CFs"} and set(long["metric"]) == {"TR@1", "TR@5", "IR@1", "IR@5"}
    assert long["scorer"].iloc[0] == "BridgeTowerItmScorer"
    cf = long[long.dataset == "COCO-CFs"].iloc[0]
    assert (cf["n_pairs"], cf["n_images"], cf["n_texts"]) == (4, 8, 8)

    assert cli.main(["evaluate", "itr-table", "--inputs", str(out / "itr" / "clip_eval.csv"),
                     str(out / "itr" / "itm.csv"), "--out-csv", str(out / "itr_table.csv"),
                     "--out-md", str(out / "itr_table.md")]) == 0
    table = pd.read_csv(out / "itr_table.csv")
    assert table["dataset"].tolist() == ["MS-COCO", "COCO-CFs"] * 2
    for col in ("TR@1", "TR@5", "IR@1", "IR@5", "TR@1 rel%", "IR@5 rel%"):
        assert col in table.columns
    base = table.iloc[0]
    cfs = table.iloc[1]
    for m in ("TR@1", "TR@5", "IR@1", "IR@5"):
        if base[m] > 0:
            assert cfs[f"{m} rel%"] == pytest.approx(100 * (cfs[m] - base[m]) / base[m])
    header, _, _ = parse_pipe_table((out / "itr_table.md").read_text())
    assert header == ["Model", "Evaluated dataset", "TR R@1", "TR R@5", "IR R@1", "IR R@5"]

    assert cli.main(["evaluate", "itm-summary", "--inputs", str(out / "itm" / "clip_eval.parquet"),
                     str(out / "itm" / "itm.parquet"), "--out-csv", str(out / "itm.csv"), "--out-md",
                     str(out / "itm.md"), "--out-png", str(out / "itm.png")]) == 0
    per_pair = pd.read_parquet(out / "itm" / "itm.parquet")
    assert len(per_pair) == 4 and set(evaluation.ITM_METRICS) <= set(per_pair.columns)
    np.testing.assert_allclose(per_pair["TR_c"], per_pair["counterfactual_pair"]
                               - per_pair["original_caption_counterfactual_image"], atol=1e-6)
    summary = pd.read_csv(out / "itm.csv")
    assert len(summary) == 8 and {"mean", "std", "median", "pct_below_zero"} <= set(summary.columns)
    assert (out / "itm.png").read_bytes()[:4] == b"\x89PNG"

    results = []
    for ds in ("CIFAR10", "ImageNet"):
        path = out / "classification" / "clip_eval" / f"{ds}.json"
        assert cli.main(["evaluate", "classify", "--config", str(config_file), "--role", "clip_eval",
                         "--dataset", ds, "--out", str(path), "--no-progress"]) == 0
        results.append(path)
    r = json.loads(results[0].read_text())
    assert (r["n_images"], r["n_classes"]) == (30, 10) and 0 <= r["top1"] <= r["top5"] <= 100
    assert r["templates"] == ["a photo of a {c}.", "a {c}."]   # the global list
    for ds, templates, n_classes in (("Food101", ["a photo of {c}, a type of food."], 3), ("Caltech101", 34, 4)):
        path = out / "classification" / "clip_eval" / f"{ds}.json"
        assert cli.main(["evaluate", "classify", "--config", str(config_file), "--role", "clip_eval",
                         "--dataset", ds, "--out", str(path), "--no-progress"]) == 0
        r = json.loads(path.read_text())
        assert r["n_classes"] == n_classes
        assert (len(r["templates"]) if isinstance(templates, int) else r["templates"]) == templates
    assert cli.main(["evaluate", "classify-table", "--inputs", *map(str, results), "--dataset-order",
                     "ImageNet,CIFAR10", "--out-csv", str(out / "cls.csv"), "--out-md", str(out / "cls.md"),
                     "--out-png", str(out / "cls.png")]) == 0
    cls = pd.read_csv(out / "cls.csv")
    assert list(cls.columns) == ["metric", "model", "role", "ImageNet", "CIFAR10", "Mean"]
    assert cls["metric"].tolist() == ["top1", "top5"]
    assert cls.loc[0, "Mean"] == pytest.approx((cls.loc[0, "ImageNet"] + cls.loc[0, "CIFAR10"]) / 2)


def test_cli_errors(config_file, inputs, tmp_path, capsys):
    rc = cli.main(["evaluate", "classify", "--config", str(config_file), "--role", "clip_eval", "--dataset", "MNIST",
                   "--out", str(tmp_path / "x.json")])
    assert rc == 2 and "MNIST" in capsys.readouterr().err
    bad = tmp_path / "pairs.parquet"
    pd.DataFrame({"id": ["1_0"], "caption_0": ["a"]}).to_parquet(bad)
    rc = cli.main(["evaluate", "itm", "--config", str(config_file), "--role", "itm", "--pairs", str(bad),
                   "--captions", str(inputs["captions"]), "--out", str(tmp_path / "x.parquet")])
    assert rc == 2 and "missing column(s)" in capsys.readouterr().err


def test_itm_random_pool_is_the_paper_subset_on_the_demo_fixtures(repo):
    """Footnote 11: the MS-COCO side of the ITM comparison is the subset of val2017 captions that have a
    COCO-Counterfactuals pair (17,410 in the paper), not every val2017 caption. The paper config draws
    (C_r, I_r) from the pairs' own original captions; on the demo COCO fixtures every draw is one of them."""
    from counterfactory.config import load_config
    from counterfactory.data.coco import load_coco_captions

    demo = repo / "resources" / "demo"
    captions = load_coco_captions(demo / "coco2017" / "annotations" / "captions_val2017.json")
    captions = captions.assign(caption_id=captions["caption_id"].astype(str), image_id=captions["image_id"].astype(str))
    first = captions.drop_duplicates("image_id").head(4)       # one caption of each of four images: the "subset"
    synth = sorted((demo / "coco2017" / "val2017").glob("*.jpg"))[:2]        # any existing files stand in for the generated pair
    pairs = pd.DataFrame({"id": first["caption_id"].to_numpy(), "caption_id": first["caption_id"].to_numpy(),
                          "image_id": first["image_id"].to_numpy(), "caption_0": first["caption"].to_numpy(),
                          "caption_1": [f"{c} (edited)" for c in first["caption"]],
                          "image_0": str(synth[0]), "image_1": str(synth[1])})
    assert captions["image_id"].nunique() > 4 and len(captions) > 4 * 5   # the full pool is much larger

    paper = load_config([repo / "config" / "config.yaml"])
    pool = evaluation.settings(paper)["itm"]["random_pool"]
    assert pool == "subset"
    draws = pd.concat([evaluation.itm_inputs(pairs, captions, demo / "coco2017" / "val2017", seed=s, pool=pool) for s in range(20)])
    assert set(draws["C_r"]) <= set(pairs["caption_0"])
    assert set(draws["random_caption_id"]) <= set(pairs["caption_id"])
    assert (draws["I_r"] != draws["I_o"]).all()
    assert set(draws["I_r"]) <= set(draws["I_o"])
    # every val2017 caption (the old paper-config pool) reaches captions outside the subset
    full = pd.concat([evaluation.itm_inputs(pairs, captions, demo / "coco2017" / "val2017", seed=s, pool="all") for s in range(20)])
    assert not set(full["C_r"]) <= set(pairs["caption_0"])
    # the demo keeps drawing from every caption of its tiny val2017
    assert evaluation.settings(load_config([repo / "config" / "demo.yaml"]))["itm"]["random_pool"] == "all"
