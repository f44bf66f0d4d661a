"""Issue 45 (reliability and security round 3): each case's reproduction, named after the case."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from counterfactory.errors import InputError

EVIL = "<script>alert(1)</script>"


# ------------------------------------------------------------------------------------------ case 1 / 12
def test_case01_markup_from_config_or_data_is_escaped_in_every_table_writer():
    """A display name / dataset name of markup is written as text in every HTML and Markdown table writer."""
    from counterfactory import evaluation, render
    from counterfactory.evaluation.settings import ITM_METRICS

    long = pd.DataFrame([{"role": "clip_eval", "model": EVIL, "dataset": d, "metric": m, "value": v}
                         for d, base in (("MS-COCO", 50.0), (EVIL + "ds", 40.0))
                         for m, v in (("TR@1", base), ("IR@1", base - 5))])
    table = evaluation.itr_table(long)
    outputs = [evaluation.render_itr_html(table, "Table 2"), evaluation.render_itr_markdown(table)]
    results = [{"model": EVIL, "role": "clip_eval", "dataset": d, "top1": 50.0} for d in ("CIFAR10", EVIL)]
    wide = evaluation.classification_table(results)
    outputs += [evaluation.render_classification_html({"top1": wide}, "T4"),
                evaluation.render_classification_markdown({"top1": wide})]
    per_pair = pd.DataFrame([{"role": "r", "model": EVIL, **{m: 0.1 for m in ITM_METRICS}}])
    summary = evaluation.itm_summary(per_pair)
    outputs += [evaluation.render_itm_html(summary), evaluation.render_itm_markdown(summary)]
    frame = pd.DataFrame({EVIL: [EVIL]})
    desc = render.describe_frame(frame)
    outputs += [render.render_html(desc), render.render_markdown(desc)]
    for text in outputs:
        assert "<script" not in text, text
        assert "&lt;script&gt;" in text
    # the bold marks of the retrieval table still work
    assert "<strong>" in outputs[0]


def test_case12_card_code_spans_and_text_survive_backticks_and_markup(tmp_path):
    from counterfactory import studies
    from counterfactory.export import cards

    prov = {"models": {"mlm": {"source": "a`b" + EVIL, "library": EVIL, "fingerprint": "f" * 20}}}
    rows, _ = cards._models(studies.spec("coco_counterfactuals").export, prov)
    text = cards.markdown_table(["role", "id / path", "library", "revision", "fingerprint"], rows)
    assert "<script" not in text.replace("``a`b<script>alert(1)</script>``", "")
    assert "``a`b<script>alert(1)</script>``" in text      # one code span (longer fence), markup inert inside it
    assert "&lt;script&gt;" in text                         # the plain library cell is escaped


def test_case01_table5_and_release_card_escape_names():
    from counterfactory import stats
    from counterfactory.export import social_release
    from counterfactory.studies.coco_counterfactuals import in_domain

    summary = stats.summarize(pd.DataFrame([{"experiment": "clip_train", "mixture": mix, "seed": s, "data_seed": s,
                                             "metric": m, "value": 40.0 + s + i}
                                            for i, mix in enumerate(("pretrained", "mscoco", "coco_cfs"))
                                            for s in ((1,) if mix == "pretrained" else (1, 2))
                                            for m, _ in in_domain.TABLE5_COLUMNS]), "mscoco")
    rows = in_domain.table5(summary, ["clip_train"], labels={"clip_train": EVIL})
    for text in (in_domain.table5_html(rows), in_domain.table5_markdown(rows)):
        assert "<script" not in text and "&lt;script&gt;" in text
    readme = social_release._readme({"rows": 1, "sets": 1, "shards": ["a"],
                                     "segments": [{"segment": EVIL, "sets": 1, "images": 1}]})
    assert "<script" not in readme and "&lt;script&gt;" in readme


# ------------------------------------------------------------------------------------------ case 2
@pytest.mark.parametrize("name", [".", "..", "a/b", "../x", "/abs"])
def test_case02_run_name_is_one_plain_path_component(repo, tmp_path, name):
    from counterfactory.config import ConfigError, load_config

    overlay = tmp_path / "run.yaml"
    overlay.write_text(json.dumps({"run_name": name}))
    with pytest.raises(ConfigError, match="run_name"):
        load_config([repo / "config" / "demo.yaml", overlay])
    overlay.write_text("run_name: demo.v2\n")
    assert load_config([repo / "config" / "demo.yaml", overlay])["run_name"] == "demo.v2"


# ------------------------------------------------------------------------------------------ case 3
class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch BOOM_RAN",))


def test_case03_a_tampered_cifar_pickle_is_refused_and_never_runs(tmp_path, monkeypatch, repo):
    import pickle
    import shutil

    import numpy as np

    from counterfactory.data.classification import load_dataset, read_cifar10

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "cifar-10-batches-py"
    shutil.copytree(repo / "resources/demo/classification/cifar-10-batches-py", root)
    (root / "test_batch").write_bytes(pickle.dumps({"data": np.zeros((1, 3072), np.uint8), "labels": [0],
                                                    "x": _Boom()}))
    with pytest.raises(InputError, match=r"trust_unofficial_pickle") as err:
        load_dataset("CIFAR10", {"format": "cifar10", "root": str(root)})
    assert "test_batch" in str(err.value) and "md5" in str(err.value)
    assert not (tmp_path / "BOOM_RAN").exists()
    # opted in: read with a restricted unpickler, which still refuses the os.system global
    with pytest.raises(InputError, match="os.system|posix.system|not allowed"):
        load_dataset("CIFAR10", {"format": "cifar10", "root": str(root), "trust_unofficial_pickle": True})
    assert not (tmp_path / "BOOM_RAN").exists()
    # a plain re-packed copy reads when opted in
    assert len(read_cifar10(repo / "resources/demo/classification", trust_unofficial_pickle=True)) == 30


def test_case03_a_torchscript_lama_file_is_verified_before_loading(tmp_path):
    """TorchScript can run code: big-lama.pt must be the official file (lama-cleaner's md5) or a tiny build whose
    counterfactory manifest checks out; anything else is refused before torch.jit.load."""
    from counterfactory.errors import ModelLoadError
    from counterfactory.models import loaders_inpaint as I
    from counterfactory.models import tiny

    folder = tiny.build("inpaint", tmp_path / "models")
    assert I.verify_lama(folder / "big-lama.pt") == "manifest"
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "big-lama.pt").write_bytes((folder / "big-lama.pt").read_bytes())
    with pytest.raises(ModelLoadError, match="md5"):
        I.load_lama(stray, device="cpu")
    # a tampered tiny build: the manifest no longer matches
    with open(folder / "big-lama.pt", "ab") as fh:
        fh.write(b"x")
    with pytest.raises(ModelLoadError, match="manifest"):
        I.load_lama(folder, device="cpu")


# ------------------------------------------------------------------------------------------ case 4
def test_case04_karpathy_paths_outside_image_root_are_refused_before_reading(tmp_path):
    """A filepath of ../elsewhere is refused by load_karpathy (with image_root) itself, naming the record and the
    fix, before the folder outside the root is listed."""
    from PIL import Image

    from counterfactory.data.karpathy import load_karpathy

    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "elsewhere" / "a.jpg")
    for fp, fn in (("../elsewhere", "a.jpg"), ("", "../elsewhere/a.jpg"), (str(tmp_path / "elsewhere"), "a.jpg")):
        doc = {"images": [{"filepath": fp, "filename": fn, "split": "test", "cocoid": 1,
                           "sentences": [{"raw": "a dog", "sentid": 1}]}]}
        (tmp_path / "k.json").write_text(json.dumps(doc))
        with pytest.raises(InputError, match=r"leaves image_root.*Fix: write the paths in k.json relative"):
            load_karpathy(tmp_path / "k.json", image_root=tmp_path / "root")


def test_case04_every_reader_joining_a_root_with_a_data_path_refuses_escapes(tmp_path):
    from counterfactory.data import check, fairface, sugarcrepe, winoground

    root = tmp_path / "root"
    root.mkdir()
    # FairFace: the CSV's file column
    (root / "fairface_label_val.csv").write_text("file,age,gender,race,service_test\n../x.jpg,20-29,Male,White,True\n")
    with pytest.raises(InputError, match="leaves"):
        fairface.load_fairface(root, "val")
    # SugarCrepe: the JSON's filename
    (tmp_path / "sc").mkdir()
    (tmp_path / "sc" / "replace_obj.json").write_text(json.dumps(
        {"0": {"filename": "../../etc/passwd", "caption": "a", "negative_caption": "b"}}))
    with pytest.raises(InputError, match="leaves"):
        sugarcrepe.read_category(tmp_path / "sc" / "replace_obj.json", "replace_obj", images_root=root)
    # Winoground: the image stems
    (tmp_path / "w.jsonl").write_text(json.dumps({"id": 0, "caption_0": "a", "caption_1": "b", "image_0": "../x",
                                                  "image_1": "y", "tag": "t", "secondary_tag": "",
                                                  "num_main_preds": 1, "collapsed_tag": "Object"}) + "\n")
    with pytest.raises(InputError, match="leaves"):
        winoground.read_winoground(tmp_path / "w.jsonl", root, check_images=False)
    # the COCO layout check: file names from the annotation JSON
    with pytest.raises(InputError, match="leaves"):
        check.scan_images(root, ["../x.jpg"])


# ------------------------------------------------------------------------------------------ case 5
def test_case05_a_display_name_is_in_no_job_configuration(repo, tmp_path):
    """Renaming a model changes no job configuration (evaluation, training, export jobs keep their digests):
    display names reach only the table steps, as --label flags."""
    import copy

    from counterfactory.config import job_config_file, load_full_config

    cfg = load_full_config([repo / "config" / "config.yaml", repo / "config" / "demo.yaml"])
    renamed = copy.deepcopy(cfg)
    renamed["models"]["clip_eval"]["display_name"] = "tiny CLIP 2"
    renamed["models"]["itm_flava"]["display_name"] = EVIL
    for keys in (["models.clip_eval", "evaluation"], ["models.itm_flava", "training"], ["models"]):
        before = job_config_file(cfg, "coco_counterfactuals", keys)
        after = job_config_file(renamed, "coco_counterfactuals", keys)
        assert before == after and "display_name" not in after[1]


def test_case05_table_steps_name_models_from_label_flags(tmp_path):
    from counterfactory.cli import main

    rows = [{"role": "clip_eval", "model": "clip_eval", "dataset": d, "metric": m, "value": v}
            for d, base in (("MS-COCO", 50.0), ("COCO-CFs", 40.0)) for m, v in (("TR@1", base), ("IR@1", base - 5))]
    pd.DataFrame(rows).to_csv(tmp_path / "itr.csv", index=False)
    assert main(["evaluate", "itr-table", "--inputs", str(tmp_path / "itr.csv"), "--out-csv", str(tmp_path / "t.csv"),
                 "--out-md", str(tmp_path / "t.md"), "--label", "clip_eval=tiny CLIP 2"]) == 0
    assert "tiny CLIP 2" in (tmp_path / "t.md").read_text()
    (tmp_path / "c.json").write_text(json.dumps({"role": "clip_eval", "model": "clip_eval", "dataset": "CIFAR10",
                                                 "top1": 50.0}))
    assert main(["evaluate", "classify-table", "--inputs", str(tmp_path / "c.json"), "--out-csv",
                 str(tmp_path / "c.csv"), "--out-md", str(tmp_path / "c.md"), "--label", "clip_eval=X 2"]) == 0
    assert "X 2" in (tmp_path / "c.md").read_text()


def test_case05_only_table_rules_take_display_names(repo):
    """display_labels (the rule parameter that carries display names) is used by table / figure steps only."""
    import re

    for path in (repo / "rules").glob("*.smk"):
        text = path.read_text()
        for block in re.split(r"\nrule ", text)[1:]:
            name = block.split(":", 1)[0]
            if "display_labels" in block:
                assert re.search(r"table|plot|summary|figure|tables|leaderboard", name), (path.name, name)


# ------------------------------------------------------------------------------------------ case 6
def _tree_bytes(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_case06_tiny_builds_are_byte_reproducible_across_processes(tmp_path):
    """The same builder and seed give the same bytes in another process (string-hash order: TorchScript constants)
    and another folder (a temporary build path recorded as _name_or_path)."""
    import os
    import subprocess
    import sys

    script = ("import sys; from pathlib import Path; from counterfactory.models import tiny\n"
              "for r in ('inpaint', 'editor'): tiny.build(r, Path(sys.argv[1]))\n")
    for i, seed in enumerate(("1", "2")):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / f"b{i}")], check=True, capture_output=True,
                       env={**os.environ, "PYTHONHASHSEED": seed})
    for role in ("inpaint", "editor"):
        a, b = _tree_bytes(tmp_path / "b0" / role), _tree_bytes(tmp_path / "b1" / role)
        assert a.keys() == b.keys() and [k for k in a if a[k] != b[k]] == []
        assert not any(b"/tmp" in v for k, v in a.items() if k.endswith(".json"))


def test_case06_a_missing_model_folder_in_a_job_is_a_model_error_naming_the_key(tmp_path):
    """A job's partial view without tiny_models: a mistyped local source is reported as the model's problem
    (models.mlm.source, the folder), not as an internal missing-section message."""
    from counterfactory.config import ConfigView
    from counterfactory.errors import ModelLoadError
    from counterfactory.models import registry

    view = ConfigView({"models": {"mlm": {"source": str(tmp_path / "tinyy" / "mlm")}}, "study": "coco_counterfactuals"},
                      partial=True)
    with pytest.raises(ModelLoadError) as err:
        registry.load(view, "mlm", device="cpu")
    assert "tiny_models" not in str(err.value).split("Fix")[0] and "tinyy" in str(err.value)


def test_case06_the_tiny_build_job_has_no_roles_parameter(repo):
    """A role leaving the tiny folder must change no parameter of models_build_tiny (Snakemake's params trigger
    would rebuild every stand-in): the roles are read from the output folders in the shell command."""
    text = (repo / "rules" / "setup.smk").read_text()
    block = text[text.index("rule models_build_tiny:"):].split("\n\n\n")[0]
    params = block[block.index("params:"):block.index("shell:")]
    assert "roles" not in params.split("#")[0] and "TINY_MODELS" not in params
    assert "basename" in block


# ------------------------------------------------------------------------------------------ case 7
def _png16(path, value=None):
    import numpy as np
    from PIL import Image

    arr = (np.arange(32 * 32).reshape(32, 32) * 64).astype(np.uint16) if value is None else \
        np.full((32, 32), value, np.uint16)
    Image.fromarray(arr).save(path)
    return arr


def test_case07_16bit_pngs_are_scaled_not_clipped_by_every_loader(tmp_path):
    import numpy as np
    from PIL import Image

    from counterfactory import scorers
    from counterfactory.rgb import open_rgb, to_rgb

    arr = _png16(tmp_path / "g16.png")
    expected = np.rint(arr / 257.0).astype(np.uint8)
    rgb = open_rgb(tmp_path / "g16.png")
    assert rgb.mode == "RGB" and np.array_equal(np.asarray(rgb)[..., 0], expected)
    assert (np.asarray(rgb) == 255).mean() < 0.01
    assert np.array_equal(np.asarray(scorers.load_image(tmp_path / "g16.png")), np.asarray(rgb))
    with Image.open(tmp_path / "g16.png") as im:
        assert np.array_equal(np.asarray(scorers.load_image(im)), np.asarray(rgb))
    # an 8-bit image is unchanged
    Image.fromarray(expected, mode="L").save(tmp_path / "g8.png")
    assert np.array_equal(np.asarray(open_rgb(tmp_path / "g8.png"))[..., 0], expected)
    with pytest.raises(InputError, match="f.tif"):
        to_rgb(Image.fromarray(np.zeros((4, 4), np.float32)), tmp_path / "f.tif")


def test_case07_no_module_converts_to_rgb_by_itself(repo):
    """One shared loader: no `.convert("RGB")` outside counterfactory.rgb."""
    offenders = [str(p.relative_to(repo)) for p in (repo / "src" / "counterfactory").rglob("*.py")
                 if 'convert("RGB")' in p.read_text(encoding="utf-8") and p.name != "rgb.py"]
    assert offenders == []


# ------------------------------------------------------------------------------------------ case 8
def test_case08_an_empty_cvld_test_split_stops_before_training(repo, tmp_path):
    from counterfactory.config import load_config
    from counterfactory.studies.cvld import runs

    cfg = load_config([repo / "config" / "config.yaml", repo / "config" / "demo.yaml"], study="cvld")
    table = pd.DataFrame({"image_id": [1, 1, 2], "caption_id": ["1_0", "1_1", "2_0"], "split": ["train"] * 3,
                          "caption": ["a man", "a man sits", "a woman"], "intervened": ["a woman", "a woman sits",
                                                                                          "a man"],
                          "image_path": ["a.jpg", "a.jpg", "b.jpg"]})
    table.to_parquet(tmp_path / "interventions.parquet")
    with pytest.raises(InputError, match=r"interventions.parquet.*split 'test'.*no test captions"):
        runs.run(cfg, "retrieval", "coco_100", "cvld", 0, [], tmp_path / "run",
                 interventions=tmp_path / "interventions.parquet")
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_case08_cvld_captions_refuse_a_karpathy_file_without_test_images(repo, tmp_path):
    from counterfactory.config import load_config
    from counterfactory.studies.cvld import data, settings

    s = settings.settings(load_config([repo / "config" / "config.yaml", repo / "config" / "demo.yaml"], study="cvld"))
    doc = json.loads(open(s["data"]["coco"]["karpathy_json"]).read())
    for img in doc["images"]:
        img["split"] = "train"
    (tmp_path / "k.json").write_text(json.dumps(doc))
    s["data"]["coco"]["karpathy_json"] = str(tmp_path / "k.json")
    with pytest.raises(InputError, match=r"k.json.*split 'test'.*no images in the test split"):
        data.captions(s, "coco")


# ------------------------------------------------------------------------------------------ case 9
def test_case09_llm_interventions_are_checked_for_meaning_with_a_rejection_row():
    """The llm's intervened caption must be the rule-based gender swap (in the request's direction); noise or an
    unrelated rewrite is an invalid answer (failed the task's check) with a rejection row, and asks no edit prompt."""
    from counterfactory.studies.cvld import intervention as iv
    from counterfactory.text import gender, llm

    check = lambda fields, text: llm.check_meaning(gender.INTERVENE_TASK, fields, {"intervened": text})  # noqa: E731
    assert check({"caption": "A man rides his bike."}, "A woman rides her bike") is None
    assert check({"caption": "A man and a woman eat.", "direction": "to_female"}, "A woman and a woman eat.") is None
    assert check({"caption": "A cat sleeps."}, "A cat sleeps.") is None
    for fields, text in (({"caption": "A man rides his bike."}, ":342342342 :342342"),
                         ({"caption": "A man rides his bike."}, "A woman rides her horse."),
                         ({"caption": "A man and a woman eat.", "direction": "to_female"}, "A woman and a man eat.")):
        error = check(fields, text)
        assert error and error.startswith(llm.CHECK_PREFIX) and "rule-based swap gives" in error
    # per-direction requests carry their direction, so the check knows which words flip
    frame = pd.DataFrame({"caption_id": ["1_0"], "image_id": [1], "caption": ["A boy runs."]})
    assert json.loads(iv.requests(frame)["fields"][0])["direction"] == "to_female"
    # an answer that failed the check becomes a rejection row with its reason
    answers = pd.DataFrame({"item_id": ["1_0"], "task": [gender.INTERVENE_TASK], "answer": ['{"intervened": ":34"}'],
                            "valid": [False], "error": [check({"caption": "A boy runs."}, ":34")]})
    parsed = gender.parse_llm_answers(answers, frame)
    assert parsed["intervened"].tolist() == [None]
    rejected = iv.rejected_rows(parsed, pd.DataFrame(columns=["image_id", "reason"]))
    assert rejected["reason"].tolist() == ["failed_check"] and "rule-based swap" in rejected["detail"][0]


# ------------------------------------------------------------------------------------------ case 10 / 17
@pytest.mark.parametrize("text, key, lines", [
    ("run_name: a\nseed: 1\nseed: 2\n", "seed", (2, 3)),
    ("run_name: a\ncoco_counterfactuals:\n  captions: {mlm_top_k: 5}\ncoco_counterfactuals:\n  images: {}\n",
     "coco_counterfactuals", (2, 4)),
    ("models:\n  mlm:\n    source: a\n    source: b\n", "source", (3, 4)),
])
def test_case10_a_duplicated_key_at_any_depth_names_both_lines(repo, tmp_path, capsys, text, key, lines):
    from counterfactory.cli import main
    from counterfactory.config import ConfigError, load_config

    path = tmp_path / "dup.yaml"
    path.write_text(text)
    pattern = rf"dup.yaml.*{key!r}.*line {lines[0]}, again at line {lines[1]}"
    with pytest.raises(ConfigError, match=pattern):
        load_config([repo / "config" / "demo.yaml", path])
    assert main(["config", "check", str(path)]) != 0
    err = capsys.readouterr().err
    assert f"first at line {lines[0]}, again at line {lines[1]}" in err and "Traceback" not in err


def test_case10_merge_keys_are_not_duplicates(tmp_path):
    from counterfactory.config import load_yaml

    assert load_yaml("base: &b {x: 1}\nmore:\n  <<: *b\n  y: 2\n") == {"base": {"x": 1}, "more": {"x": 1, "y": 2}}


def test_case17_config_check_on_latin1_bytes_names_the_line(tmp_path, capsys):
    from counterfactory.cli import main

    path = tmp_path / "latin1.yaml"
    path.write_bytes("run_name: a\n# caf\u00e9\n".encode("latin-1"))
    assert main(["config", "check", str(path)]) != 0
    err = capsys.readouterr().err
    assert "line 2" in err and "UTF-8" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------ case 14
def test_case14_a_decompression_bomb_png_is_a_named_problem_not_a_traceback(tmp_path):
    import struct
    import zlib

    from counterfactory.data.check import image_problem

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)

    path = tmp_path / "huge.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 1, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    assert "too large to decode safely" in image_problem(path)


# ------------------------------------------------------------------------------------------ case 16
def test_case16_preflight_with_an_invalid_throughput_file_fails_naming_it(repo, tmp_path, capsys, monkeypatch):
    from counterfactory.cli import main

    monkeypatch.chdir(repo)
    bad = tmp_path / "tp.json"
    bad.write_text("{not json")
    code = main(["preflight", "--config", "config/demo.yaml", "--throughput", str(bad), "--only", "disk"])
    err = capsys.readouterr().err
    assert code != 0 and "tp.json" in err and "not valid JSON" in err


# ------------------------------------------------------------------------------------------ case 19
def test_case19_a_bad_fairface_csv_stops_cvld_retrieval_before_training(repo, tmp_path, monkeypatch):
    from counterfactory.config import load_config
    from counterfactory.studies.cvld import runs

    cfg = load_config([repo / "config" / "config.yaml", repo / "config" / "demo.yaml"], study="cvld")
    root = tmp_path / "fairface"
    root.mkdir()
    (root / "fairface_label_val.csv").write_bytes("file,age,gender,race,service_test\nval/\xe9.jpg\n".encode("latin-1"))
    cfg["data"]["fairface"] = {**cfg["data"]["fairface"], "root": str(root), "split": "val"}
    trained = []
    monkeypatch.setattr(runs, "_train_coco", lambda *a, **k: trained.append(1) or (None, None))
    table = pd.DataFrame({"image_id": [1, 2], "caption_id": ["1_0", "2_0"], "split": ["train", "test"],
                          "caption": ["a man", "a woman"], "intervened": ["a woman", "a man"],
                          "image_path": ["a.jpg", "b.jpg"]})
    with pytest.raises(InputError, match="fairface_label_val.csv"):
        runs.run(cfg, "retrieval", "coco_100", "cvld", 0, [], tmp_path / "run", interventions=table)
    assert trained == [] and not (tmp_path / "run" / "checkpoint").exists()


# ------------------------------------------------------------------------------------------ case 20
def test_case20_the_docs_say_how_to_get_the_line_of_a_configfile_error(repo):
    text = (repo / "docs" / "configuration.md").read_text()
    para = text[text.index("not valid JSON or YAML"):][:1500]
    assert "counterfactory config check" in para and "twice" in para and "UTF-8" in para


def test_case20_the_workflow_rereads_every_configfile_with_duplicate_keys_refused(repo, tmp_path):
    """What the Snakefile runs on --configfile files (workflow_layers) refuses a duplicated key naming both lines."""
    from counterfactory.config import ConfigError, workflow_layers

    dup = tmp_path / "dup.yaml"
    dup.write_text("seed: 1\nseed: 2\n")
    with pytest.raises(ConfigError, match="line 1, again at line 2"):
        workflow_layers([str(dup)], {})


# ------------------------------------------------------------------------------------------ case 13
def test_case13_replacing_a_symlinked_folder_leaves_no_old_link(tmp_path):
    from counterfactory.io import atomic_dir

    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / "keep.txt").write_text("x")
    (tmp_path / "export").mkdir()
    link = tmp_path / "export" / "release"
    link.symlink_to(real, target_is_directory=True)
    with atomic_dir(link) as tmp:
        (tmp / "new.txt").write_text("y")
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["release"]
    assert (link / "new.txt").is_file() and not link.is_symlink() and (real / "keep.txt").is_file()


# ------------------------------------------------------------------------------------------ case 15
def test_case15_a_float_caption_column_is_an_error_naming_the_column(tmp_path):
    from counterfactory.text.caption_stage import read_shard

    path = tmp_path / "captions.parquet"
    pd.DataFrame({"caption_id": ["1", "2"], "image_id": [1, 2], "caption": [0.5, float("nan")]}).to_parquet(path)
    with pytest.raises(InputError, match=r"captions.parquet.*column 'caption'.*float64 values, not text"):
        read_shard(path, 0, 10)


# ------------------------------------------------------------------------------------------ case 11 (part)
def test_case11_a_full_disk_inside_safetensors_is_the_one_line_disk_message(tmp_path, capsys, monkeypatch):
    """safetensors reports ENOSPC as a SafetensorError ("... (os error 28)"): the CLI names the output's file system
    and the fix, as for any OSError, instead of a traceback."""
    from safetensors import SafetensorError

    from counterfactory import cli

    def boom(args):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" }) (os error 28)")

    err = cli.wrapped_os_error(SafetensorError("x (os error 28)"))
    assert isinstance(err, OSError) and err.errno == 28
    monkeypatch.setattr(cli, "_traceback", lambda args: None)
    parser_main = cli.main
    import counterfactory.commands.config as cc

    monkeypatch.setattr(cc, "_check", boom)
    code = parser_main(["config", "check", str(tmp_path / "x.yaml")])
    text = capsys.readouterr().err
    assert code == 2 and "no space left on device" in text and "Traceback" not in text
