"""CVLD Table 4 LIC with Hirota et al.'s BERT classifier (counterfactory.training.text_classifier, leakage.py)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FILLER = ["table", "street", "kite", "pizza", "beach", "car", "phone", "tree", "horse", "dog", "bench", "cup"]
CUES = {"male": "football", "female": "handbag"}
#: fine-tuning of the tiny BERT on decisive data: a learning rate far above BERT-base's (1e-5) for a random tiny model
FAST = {"epochs": 20, "lr": 2e-3, "batch_size": 16, "max_length": 16}


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A tiny randomly initialised BertForSequenceClassification (hidden 32, 2 layers) saved by path."""
    from transformers import BertConfig, BertForSequenceClassification

    from counterfactory.models.tiny import wordpiece_tokenizer, write_wordpiece_vocab

    out = tmp_path_factory.mktemp("tiny_bert")
    vocab = write_wordpiece_vocab(FILLER + list(CUES.values()) + ["a", "with", "and", "the", "genderword"],
                                  out / "vocab.txt")
    tok = wordpiece_tokenizer(vocab)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2, pad_token_id=tok.pad_token_id)
    BertForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _captions(n_per_gender: int, seed: int = 0, gender_word: bool = True):
    """Captions whose only gender signal besides the gender word is a decisive cue word."""
    rng = np.random.default_rng(seed)
    caps, genders = [], []
    for g in ("male", "female") * n_per_gender:
        a, b = rng.choice(FILLER, 2, replace=False)
        who = ("man" if g == "male" else "woman") if gender_word else "person"
        caps.append(f"a {who} with a {a} and a {CUES[g]} and the {b}")
        genders.append(g)
    return caps, genders


def test_fine_tuned_classifier_separates_decisive_captions(tiny_bert):
    from counterfactory.metrics.captioning import mask_gender_words
    from counterfactory.training.text_classifier import FineTuneSettings, train_and_predict

    caps, genders = _captions(40)
    texts = [mask_gender_words(c) for c in caps]
    assert all("man" not in t.split() and "woman" not in t.split() for t in texts)
    labels = np.array([g == "female" for g in genders], dtype=np.int64)
    test_caps, test_genders = _captions(10, seed=1)
    y_test = np.array([g == "female" for g in test_genders], dtype=np.int64)
    p = train_and_predict(tiny_bert, texts, labels, [mask_gender_words(c) for c in test_caps], seed=0,
                          settings=FineTuneSettings(**FAST))
    assert p.shape == (20,) and p.dtype == np.float64 and np.all((p >= 0) & (p <= 1))
    assert np.mean((p > 0.5) == y_test) == 1.0
    # decisive, not marginal: every test caption well on its side of 0.5
    assert np.all(np.abs(p - 0.5) > 0.2), p


def test_same_seed_same_probabilities_and_global_rng_untouched(tiny_bert):
    from counterfactory.training.text_classifier import FineTuneSettings, train_and_predict

    caps, genders = _captions(12)
    labels = np.array([g == "female" for g in genders], dtype=np.int64)
    test = _captions(4, seed=2)[0]
    settings = FineTuneSettings(epochs=2, lr=1e-3, batch_size=8, max_length=16)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = train_and_predict(tiny_bert, caps, labels, test, seed=7, settings=settings)
    assert torch.equal(torch.get_rng_state(), state)          # the caller's RNG is left as it was
    torch.manual_seed(999)                                     # another global state: same result per seed
    b = train_and_predict(tiny_bert, caps, labels, test, seed=7, settings=settings)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    c = train_and_predict(tiny_bert, caps, labels, test, seed=8, settings=settings)
    assert np.max(np.abs(a - c)) > 1e-6                        # the seed reaches initialisation / order / dropout


def test_settings_are_checked():
    from counterfactory.training.text_classifier import FineTuneSettings

    with pytest.raises(ValueError, match="epochs"):
        FineTuneSettings(epochs=0)
    with pytest.raises(ValueError, match="lr"):
        FineTuneSettings(lr=0.0)


def test_lic_amplification_with_bert_runs_and_keeps_its_keys(tiny_bert):
    from counterfactory.studies.cvld import leakage

    caps, genders = _captions(30)
    refs = [[c] * 2 for c in _captions(30, seed=3, gender_word=True)[0]]
    bert = {"source": tiny_bert, **FAST, "epochs": 3}
    out = leakage.lic_amplification(caps, refs, genders, seeds=[0], classifier="bert", bert=bert)
    assert set(out) == {"LIC", "LIC_M", "LIC_D", "LIC/std"}
    assert all(np.isfinite(v) for v in out.values()) and 0 <= out["LIC_M"] <= 100 and 0 <= out["LIC_D"] <= 100
    assert out["LIC"] == pytest.approx(out["LIC_M"] - out["LIC_D"])
    with pytest.raises(ValueError, match="classifier"):
        leakage.leakage(caps, np.array([g == "female" for g in genders], dtype=np.int64), [0], classifier="lstm")
    with pytest.raises(ValueError, match="source"):
        leakage.leakage(caps, np.array([g == "female" for g in genders], dtype=np.int64), [0], classifier="bert")


def test_classifier_roles_and_config_wiring(tiny_bert):
    from counterfactory.errors import ConfigError
    from counterfactory.studies.cvld import leakage

    assert leakage.classifier_roles({"lic": "amplification", "lic_classifier": "bert"}) == ("lic_bert",)
    assert leakage.classifier_roles({"lic": "amplification", "lic_classifier": "tfidf"}) == ()
    assert leakage.classifier_roles({"lic": "leakage", "lic_classifier": "bert"}) == ()
    with pytest.raises(ConfigError, match="lic_bert"):
        leakage.bert_options({"models": {}}, {"lic_classifier": "bert", "lic_bert": {}})
    cfg = {"models": {"lic_bert": {"source": str(tiny_bert)}}}
    opts = leakage.bert_options(cfg, {"lic_bert": {"epochs": 2}}, device="cpu")
    model, tok = opts["source"]()                 # through the registry's lic_bert loader
    assert type(model).__name__ == "BertForSequenceClassification" and model.config.num_labels == 2
    assert opts["epochs"] == 2 and opts["device"] == "cpu"


def test_paper_config_uses_bert_and_the_demo_tfidf():
    from pathlib import Path

    from counterfactory.config import load_full_config
    from counterfactory.models import registry, tiny
    from counterfactory.preflight import ROLE_NEEDS, study_roles

    repo = Path(__file__).resolve().parents[1]
    paper = load_full_config([repo / "config" / "config.yaml"])
    assert paper["cvld"]["captioning"]["lic_classifier"] == "bert"
    assert paper["models"]["lic_bert"]["source"] == "bert-base-uncased"
    assert "lic_bert" in study_roles(paper, "cvld")
    demo = load_full_config([repo / "config" / "demo.yaml"])
    assert demo["cvld"]["captioning"]["lic_classifier"] == "tfidf" and "lic_bert" not in study_roles(demo, "cvld")
    assert registry.DEFAULT_LIBRARY["lic_bert"] == "transformers" and "lic_bert" in ROLE_NEEDS
    assert "lic_bert" in tiny.builders() and "lic_bert" in tiny.BUILDER_NAMES


def test_tiny_lic_bert_builds_and_loads(tmp_path):
    from counterfactory.models import registry, tiny

    folder = tiny.build("lic_bert", tmp_path, seed=0)
    model, tok = registry.load({"models": {"lic_bert": {"source": str(folder)}}}, "lic_bert")
    assert type(model).__name__ == "BertForSequenceClassification" and model.config.hidden_size == 32
    ids = tok("a genderword riding a horse")["input_ids"]
    assert tok.unk_token_id not in ids


def test_tiny_bert_vocabulary_holds_the_mask_word():
    """models.tiny writes the gender mask word into the tiny BERT's vocabulary without importing metrics (a lower
    layer): it must stay metrics.captioning.MASK_TOKEN."""
    import inspect

    from counterfactory.metrics.captioning import MASK_TOKEN
    from counterfactory.models import tiny

    assert f'("{MASK_TOKEN}",)' in inspect.getsource(tiny.build_lic_bert)
