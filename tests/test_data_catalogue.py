"""The data catalogue (one data_root, one entry per dataset), the Karpathy readers' official layout, preflight =
what the DAG reads, and the paper config dry-run on an empty-file tree of the official names (issue 40)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from counterfactory.config import load_full_config, validate_config
from counterfactory import catalogue
from counterfactory.data.karpathy import image_paths, layout_problem, load_karpathy
from counterfactory.errors import CounterFactoryError

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def _paper(*overlays: dict) -> dict:
    import copy

    from counterfactory.config import deep_merge, read_yaml

    cfg = read_yaml(REPO / "config" / "config.yaml")
    for overlay in overlays:
        cfg = deep_merge(cfg, copy.deepcopy(overlay))
    return validate_config(cfg)


def _study_paths(cfg: dict) -> dict[str, str]:
    """Every path the bindings and retrieval sets fill, by dotted key."""
    out = {}
    for dotted in catalogue.BINDINGS:
        node = cfg
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            out[dotted] = node
    for study, keys in catalogue.RETRIEVAL_KEYS.items():
        for key in keys:
            node = cfg[study]
            for part in key.split("."):
                node = node[part]
            for spec in node if isinstance(node, list) else [node]:
                out[f"{study}.{key}[{spec['name']}]"] = [spec["karpathy_json"], spec["image_root"]]
    return out


# ------------------------------------------------------------------------------------------------ the catalogue


def test_the_paper_config_reads_every_dataset_from_the_one_data_root():
    cfg = _paper()
    paths = _study_paths(cfg)
    flat = [p for v in paths.values() for p in (v if isinstance(v, list) else [v])]
    assert len(flat) > 30 and all(str(p).startswith("data/") for p in flat), paths
    # one dataset, one place: COCO 2014 is read at data/coco2014 by every study that reads it
    assert paths["spurious_retrieval.data.coco.karpathy_json"] == paths["cvld.data.coco.karpathy_json"] \
        == "data/coco2014/dataset_coco.json"
    assert paths["spurious_retrieval.data.coco.image_root"] == paths["cvld.data.coco.image_root"] == "data/coco2014"
    assert paths["countercurate.training.retrieval[coco]"] == ["data/coco2014/dataset_coco.json", "data/coco2014"]
    assert paths["coco_counterfactuals.training.eval.retrieval[mscoco]"] == paths[
        "countercurate.training.retrieval[coco]"]
    assert paths["coco_counterfactuals.data.coco_root"] == "data/coco2017"
    assert paths["countercurate.benchmarks.sugarcrepe.images"] == "data/coco2017/val2017"
    assert paths["cvld.data.flickr30k.karpathy_json"] == paths["spurious_retrieval.data.flickr30k.karpathy_json"] \
        == "data/flickr30k/dataset_flickr30k.json"
    # model weights that are files live in one folder
    for role in ("inpaint", "itm_blip", "vsepp", "captioner_pretrained"):
        assert cfg["models"][role]["source"].startswith("./data/models/"), role
    for role in ("negclip", "alip", "laclip", "slip"):
        assert cfg["models"][role]["pretrained"].startswith("data/models/"), role
    # the paper config itself names no dataset path (only the catalogue does)
    text = (REPO / "config" / "config.yaml").read_text()
    assert "data/coco" not in text and "data/flickr30k" not in text and "resources/models/" not in text


def test_one_key_moves_a_dataset_for_every_study_and_a_study_key_still_wins():
    cfg = _paper({"data": {"coco2014": {"root": "/scratch/coco"}}})
    paths = _study_paths(cfg)
    moved = {k: v for k, v in paths.items() if "/scratch/coco" in json.dumps(v)}
    assert set(moved) == {"spurious_retrieval.data.coco.karpathy_json", "spurious_retrieval.data.coco.image_root",
                          "spurious_retrieval.data.coco.instances", "cvld.data.coco.karpathy_json",
                          "cvld.data.coco.image_root", "countercurate.training.retrieval[coco]",
                          "coco_counterfactuals.training.eval.retrieval[mscoco]"}
    assert paths["cvld.data.coco.image_root"] == "/scratch/coco"
    assert paths["spurious_retrieval.data.coco.instances"] == ["/scratch/coco/annotations/instances_train2014.json",
                                                               "/scratch/coco/annotations/instances_val2014.json"]
    # a study's own key wins; an explicit null stays null (that part off)
    cfg = _paper({"data_root": "/d", "cvld": {"data": {"coco": {"image_root": "/mine"}, "flickr30k": {
        "karpathy_json": None}}}})
    assert cfg["cvld"]["data"]["coco"] == {"karpathy_json": "/d/coco2014/dataset_coco.json", "image_root": "/mine"}
    assert cfg["cvld"]["data"]["flickr30k"]["karpathy_json"] is None
    assert cfg["spurious_retrieval"]["data"]["coco"]["image_root"] == "/d/coco2014"


def test_resolution_is_idempotent_and_placeholders_expand_once():
    cfg = _paper({"data_root": "/d"})
    once = json.dumps(cfg, sort_keys=True, default=str)
    assert json.dumps(validate_config(cfg), sort_keys=True, default=str) == once
    spec = cfg["coco_counterfactuals"]["evaluation"]["classification"]["datasets"]["ImageNet"]
    assert spec["root"] == "/d/classification/imagenet/val"
    assert spec["class_index"] == "/d/classification/imagenet/LOC_synset_mapping.txt"
    assert catalogue.expand(cfg, "a photo of a {c}") == "a photo of a {c}"   # not a dataset: left alone
    assert catalogue.expand(cfg, "{data_root}/x") == "/d/x"

    from counterfactory.models import registry

    spec = registry.model_spec(_paper(), "inpaint")
    assert spec.is_local and spec.local_path == Path("data/models/big-lama")


def test_the_demo_reads_the_catalogue_under_its_own_data_root():
    cfg = load_full_config([REPO / "config" / "config.yaml", REPO / "config" / "demo.yaml"])
    assert cfg["data_root"] == "resources/demo"
    assert cfg["cvld"]["data"]["celeba"]["root"] == "resources/demo/celeba"
    assert cfg["social_counterfactuals"]["probing"]["pata"]["files_list"] == \
        "resources/demo/pata/pata_fairness.files.lst"
    assert cfg["countercurate"]["benchmarks"]["winoground"]["examples"] == "resources/demo/winoground/examples.jsonl"
    for key, value in _study_paths(cfg).items():
        for path in value if isinstance(value, list) else [value]:
            assert str(path).startswith("resources/demo"), (key, path)


def _strings(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


#: what the demo config may name below its data_root besides the root itself: its documented cuts (other splits of
#: the same 12 coco2014 photos); the own-data overlay names its own CSV
DEMO_CUTS = {"resources/demo/cuts/dataset_coco_test.json", "resources/demo/cuts/dataset_coco_cvld.json"}


def test_the_demo_walks_the_paper_layout():
    """Issue 40 item 6: config/demo.yaml names no dataset path but data_root and its cuts, so every demo run reads
    the datasets where the paper config reads them (COCO 2017 / 2014, Flickr30k's images, SugarCrepe's val2017
    photos, the spurious study's Karpathy file and instances), and the Karpathy layouts resolve on disk."""
    raw = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    named = {s for s in _strings(raw) if "resources/demo" in s}
    # the hand-labelled audit samples of the filter cards (filters.audit) are demo fixtures, not datasets
    audits = {s for s in named if s.startswith("resources/demo/audit/")}
    assert audits and all((REPO / a).is_file() for a in audits)
    named -= audits
    assert named <= {"resources/demo"} | DEMO_CUTS, named - DEMO_CUTS
    assert all((REPO / c).is_file() for c in DEMO_CUTS)
    cfg = load_full_config([REPO / "config" / "config.yaml", REPO / "config" / "demo.yaml"])
    assert cfg["coco_counterfactuals"]["data"]["coco_root"] == "resources/demo/coco2017"
    cc = cfg["countercurate"]
    assert cc["data"]["images"] == "resources/demo/flickr30k/flickr30k-images"
    assert cc["benchmarks"]["sugarcrepe"]["images"] == "resources/demo/coco2017/val2017"
    sr = cfg["spurious_retrieval"]["data"]["coco"]
    assert sr["karpathy_json"] == "resources/demo/coco2014/dataset_coco.json"
    assert sr["image_root"] == "resources/demo/coco2014"
    assert sr["instances"] == ["resources/demo/coco2014/annotations/instances_train2014.json",
                               "resources/demo/coco2014/annotations/instances_val2014.json"]
    sets = cfg["coco_counterfactuals"]["training"]["eval"]["retrieval"]
    cv = cfg["cvld"]["data"]["coco"]
    for spec in [sr, cv, *sets]:
        assert spec["image_root"] == "resources/demo/coco2014"
        assert layout_problem(REPO / spec["karpathy_json"], REPO / spec["image_root"]) is None, spec
        # the official names: filepath val2014, COCO_val2014_<id>.jpg
        assert all(p.startswith("resources/demo/coco2014/val2014/COCO_val2014_") for p in
                   image_paths(load_karpathy(REPO / spec["karpathy_json"]), "resources/demo/coco2014"))


def test_docs_data_page_shows_the_generated_tree():
    text = (REPO / "docs" / "data.md").read_text(encoding="utf-8")
    assert catalogue.DOC_BEGIN + "\n" + catalogue.tree_markdown() + catalogue.DOC_END in text, \
        "docs/data.md is stale: run python -c 'from counterfactory.catalogue import write_doc; write_doc()'"
    for name in catalogue.DATASETS:
        assert f"data.{name}.root" in text


# ------------------------------------------------------------------------------- Karpathy: image_root/filepath/filename


def _karpathy(tmp_path: Path, filepath: str | None = "val2014") -> tuple[Path, Path]:
    root = tmp_path / "coco2014"
    images = []
    for k, split in enumerate(["train", "test", "test"]):
        name = f"COCO_val2014_{k:012d}.jpg"
        folder = root / (filepath or "")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")
        rec = {"filename": name, "imgid": k, "cocoid": 10 + k, "split": split, "sentids": [k],
               "sentences": [{"raw": f"caption {k}", "sentid": k, "tokens": [], "imgid": k}]}
        if filepath is not None:
            rec["filepath"] = filepath
        images.append(rec)
    path = root / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return path, root


def test_image_paths_follow_filepath_and_refuse_to_leave_the_root(tmp_path):
    path, root = _karpathy(tmp_path)
    table = load_karpathy(path, split="test", image_root=root)
    assert image_paths(table, root) == [str(root / "val2014" / f"COCO_val2014_{k:012d}.jpg") for k in (1, 2)]
    flickr, froot = _karpathy(tmp_path / "f", filepath=None)           # Flickr30k: no filepath
    assert image_paths(load_karpathy(flickr), froot)[0] == str(froot / "COCO_val2014_000000000000.jpg")
    bad = table.assign(filepath="../../elsewhere")
    with pytest.raises(CounterFactoryError, match="leaves image_root"):
        image_paths(bad, root, path)


def test_evaluate_retrieval_reads_the_karpathy_filepath(tmp_path, monkeypatch):
    """CounterCurate Table 5 / COCO-CF Table 12: the images are image_root/val2014/<file>, not image_root/<file>."""
    from counterfactory import scorers
    from counterfactory.evaluation import runs

    path, root = _karpathy(tmp_path)
    seen = []

    class Scorer:
        def encode_images(self, images):
            seen.extend(images)
            assert all(Path(p).is_file() for p in images)
            return np.eye(len(images))

        def encode_texts(self, texts):
            return np.eye(len(texts))

    monkeypatch.setattr(scorers, "scorer_from_config", lambda cfg, role, head, progress: Scorer())
    spec = {"name": "coco", "karpathy_json": str(path), "image_root": str(root), "split": "test", "ks": [1]}
    out = runs.evaluate_retrieval({}, "clip_train", spec)
    assert out["coco/text_to_image@1"] == 100.0 and all("/val2014/" in p for p in seen) and len(seen) == 2
    with pytest.raises(CounterFactoryError, match="not found"):   # the old layout mistake is caught by the reader
        runs.evaluate_retrieval({}, "clip_train", {**spec, "image_root": str(root / "val2014")})


def test_study_readers_of_karpathy_files_use_filepath(tmp_path):
    from counterfactory.studies.cvld import data as cvld_data
    from counterfactory.studies.cvld import settings as cvld_settings
    from counterfactory.studies.spurious_retrieval import data as sr_data
    from counterfactory.studies.spurious_retrieval import settings as sr_settings

    path, root = _karpathy(tmp_path)
    s = cvld_settings.settings({"data": {"coco": {"karpathy_json": str(path), "image_root": str(root)}}})
    frame = cvld_data.captions(s)
    assert set(frame["image_path"]) == {str(root / "val2014" / f"COCO_val2014_{k:012d}.jpg") for k in range(3)}
    s = sr_settings.settings({"data": {"datasets": ["coco"], "coco": {"karpathy_json": str(path),
                                                                     "image_root": str(root),
                                                                     "instances": ["i.json"]}}})
    frame = sr_data.load_captions(s, "coco")
    assert all(p.startswith(str(root / "val2014")) for p in frame["image_path"])


def test_layout_problem_names_the_expected_layout(tmp_path):
    path, root = _karpathy(tmp_path)
    assert layout_problem(path, root, ["test"]) is None
    problem = layout_problem(path, root / "val2014", ["test"])
    assert "2 of 2 sampled images" in problem and "val2014" in problem and "<filename>" in problem


# --------------------------------------------------------------------- preflight = what the DAG reads, on the paper layout


def _run(workdir: Path, *args: str, env_extra: dict | None = None, timeout: int = 600):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **(env_extra or {}))
    cmd = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def paper_tree(tmp_path_factory):
    from counterfactory.testing import official_tree

    work = tmp_path_factory.mktemp("paper layout")   # a space: paths must be quoted
    official_tree(work / "data")
    return work


def test_unchanged_paper_config_dry_runs_every_study_on_the_official_layout(paper_tree):
    """Every study of the unchanged config/config.yaml plans on an empty-file tree of the official names, and the
    files its rules declare are exactly the ones preflight checks, study by study."""
    from counterfactory import preflight

    reads = paper_tree / "reads.tsv"
    reads.unlink(missing_ok=True)
    proc = _run(paper_tree, "-n", "all", "--quiet", "rules", "--cores", "2", "--configfile",
                str(REPO / "config" / "config.yaml"), env_extra={"COUNTERFACTORY_DATA_READS": str(reads)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr
    cwd = os.getcwd()
    os.chdir(paper_tree)
    try:
        cfg = load_full_config([REPO / "config" / "config.yaml"])
        needs = [n for n in preflight.dataset_requirements(cfg) if n.path]
        checks = preflight.dataset_checks(cfg)
    finally:
        os.chdir(cwd)
    assert all(c.passed for c in checks), preflight.render([c for c in checks if not c.passed], cfg)
    read = [line.split("\t") for line in reads.read_text().splitlines()]
    read_paths = {os.path.normpath(p) for _, p in read}

    def covered(path: str) -> bool:
        p = os.path.normpath(path)
        return any(r == p or r.startswith(p + os.sep) or p.startswith(r + os.sep) for r in read_paths)

    for study in cfg["studies"]:
        unread = [(n.key, n.path) for n in needs if n.key.startswith(study + ".") and not covered(n.path)]
        assert not unread, f"{study}: preflight checks data no rule reads: {unread}"
    assert {k.split(".", 1)[0] for k, _ in read} >= set(cfg["studies"]) - {"coco_counterfactuals"}


def test_a_wrong_image_root_stops_the_dry_run_before_any_training(paper_tree, tmp_path):
    """Table 5's failure mode (images looked up as image_root/<file>, the split file says val2014/<file>) cannot
    reach a job: the DAG refuses the set, naming the key and the expected layout."""
    overlay = tmp_path / "wrong.yaml"
    overlay.write_text(yaml.safe_dump({"studies": ["countercurate"], "countercurate": {"training": {"retrieval": {
        "name": "coco", "dataset": "coco2014", "image_root": "data/coco2014/val2014", "split": "test",
        "ks": [1, 5]}}}}))
    proc = _run(paper_tree, "-n", "all", "--cores", "2", "--configfile", str(REPO / "config" / "config.yaml"),
                str(overlay))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "countercurate.training.retrieval" in out and "sampled images of split(s) test not found" in out
    assert "data/coco2014/val2014/{val2014}/<filename>" in out


def test_paper_config_without_data_ends_in_the_preflight_table(tmp_path):
    proc = _run(tmp_path, "-n", "all", "--configfile", str(REPO / "config" / "config.yaml"), timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert "Traceback" not in out and "InputFunctionException" not in out
    assert "problem(s) before the run can start" in out
    for name in ("coco2014", "coco2017", "flickr30k", "celeba", "fairface", "pata", "winoground"):
        assert f"data.{name}: data/{name}/ does not exist" in out, name
    # grouped by study, each dataset's source once; lines short
    assert "\ncvld\n" in out and "\nspurious_retrieval\n" in out
    table = out[out.index("problem(s) before the run"):]
    assert max(len(line) for line in table.splitlines()[1:-1]) <= 120


def test_preflight_cli_groups_dedupes_and_writes_a_script(tmp_path):
    script = tmp_path / "get-data.sh"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([str(Path(sys.executable).with_name("counterfactory")), "preflight", "--config",
                           str(REPO / "config" / "config.yaml"), "--only", "dataset", "--script", str(script)],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("preflight: ") and "failed" in lines[0]   # the summary first
    # COCO 2014 is described once in full and referred to afterwards
    assert proc.stdout.count("data.coco2014: data/coco2014/ does not exist (MS-COCO 2014") == 1
    assert "debias.task_eval.retrieval" in proc.stdout   # SocialCF's Tables 4 / 5 data are seen (issue 40)
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "mkdir -p data/coco2014" in text and "cocodataset.org" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_vsepp_fix_converts_each_datasets_published_checkpoint():
    from counterfactory.models import registry, sources

    cfg = _paper()
    fix = sources.how_to_get(registry.model_spec(cfg, "vsepp"), cfg)
    assert "models convert-vsepp" in fix and "vocab/coco_vocab.pkl" in fix and "runs.tar" in fix
    assert "build-vsepp --captions data/coco2014/dataset_coco.json --backbone vgg19" in fix   # the from-scratch option
    assert "vocab/f30k_vocab.pkl" in sources.how_to_get(registry.model_spec(cfg, "vsepp_f30k"), cfg)
