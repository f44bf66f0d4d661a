"""The VSE++ converter (``counterfactory models convert-vsepp``): a checkpoint in the original release's layout
(Faghri et al. 2018, github.com/fartashf/vsepp: ``{'model': [image state, text state], 'opt': Namespace, ...}``,
VGG's feature trunk wrapped in ``DataParallel``, a pickled ``Vocabulary``) becomes a VSE++ folder whose embeddings
equal the original forward, written out by hand here (l2norm(CNN) -> fc -> l2norm; GRU output at the last word ->
l2norm; nltk word tokens of the lower-cased caption between <start> and <end>). The CNN is a scaled-down VGG of the
same module layout; the true VGG19 / ResNet-152 layouts are checked on the meta device (no weights allocated)."""

from __future__ import annotations

import argparse
import json
import os
import pickle

import pytest
import torch
import torchvision
from PIL import Image
from torch import nn
from torch.nn import functional as F

from counterfactory.cli import main
from counterfactory.models import convert_vsepp, vsepp

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["<pad>", "<start>", "<end>", "<unk>", "a", "dog", "on", "the", "grass", ",", "cat", "sofa", "."]
EMBED, WORD_DIM, FEAT = 6, 5, 12


class Vocabulary:
    """The release's ``vocab.Vocabulary`` record (pickled under that class name)."""

    def __init__(self, words):
        self.word2idx = {w: i for i, w in enumerate(words)}
        self.idx2word = dict(enumerate(words))
        self.idx = len(words)


class MiniVGG(nn.Module):
    """torchvision VGG's module layout (features / avgpool / classifier with fc8 removed), tiny sizes."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                                      nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.avgpool = nn.AdaptiveAvgPool2d(2)
        self.classifier = nn.Sequential(nn.Linear(32, 16), nn.ReLU(True), nn.Dropout(), nn.Linear(16, FEAT),
                                        nn.ReLU(True), nn.Dropout())

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


@pytest.fixture()
def mini_vgg(monkeypatch):
    real = vsepp.make_backbone
    monkeypatch.setattr(vsepp, "make_backbone",
                        lambda cfg: (MiniVGG(), FEAT) if cfg.backbone == "vgg19" else real(cfg))


def original(bidirectional=False, seed=0):
    """The original encoders: EncoderImageFull (cnn with DataParallel features, fc) and EncoderText (embed, rnn)."""
    torch.manual_seed(seed)
    img = nn.Module()
    img.cnn = MiniVGG()
    img.cnn.features = nn.DataParallel(img.cnn.features)
    img.fc = nn.Linear(FEAT, EMBED)
    txt = nn.Module()
    txt.embed = nn.Embedding(len(WORDS), WORD_DIM)
    txt.rnn = nn.GRU(WORD_DIM, EMBED, 1, batch_first=True, bidirectional=bidirectional)
    return img.eval(), txt.eval()


def opts(**kw):
    base = dict(cnn_type="vgg19", measure="cosine", use_abs=False, no_imgnorm=False, finetune=True, margin=0.2,
                max_violation=True, crop_size=224, embed_size=EMBED, word_dim=WORD_DIM, num_layers=1,
                data_name="coco")
    return argparse.Namespace(**{**base, **kw})


def write_release(tmp_path, img, txt, opt=None, legacy=False, name="model_best.pth.tar"):
    ckpt = tmp_path / name
    torch.save({"model": [img.state_dict(), txt.state_dict()], "opt": opt or opts(), "epoch": 7,
                "best_rsum": 420.5, "Eiters": 12345}, ckpt, _use_new_zipfile_serialization=not legacy)
    vocab = tmp_path / "coco_vocab.pkl"
    with vocab.open("wb") as fh:
        pickle.dump(Vocabulary(WORDS), fh, protocol=2)
    return ckpt, vocab


def images(n=3, size=240):
    gen = torch.Generator().manual_seed(1)
    return [Image.fromarray((torch.rand(size, size + 20, 3, generator=gen) * 255).byte().numpy()) for _ in range(n)]


def release_transform(ims):
    """VSE++'s evaluation transform: resize 256, centre crop 224, ImageNet statistics."""
    from torchvision import transforms

    t = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
                            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    return torch.stack([t(im) for im in ims])


def original_image(img, pixels):
    return F.normalize(img.fc(F.normalize(img.cnn(pixels), dim=-1)), dim=-1)


def original_text(txt, caption):
    import nltk

    w2i = {w: i for i, w in enumerate(WORDS)}
    tokens = nltk.tokenize.NLTKWordTokenizer().tokenize(caption.lower())
    ids = torch.tensor([[1, *[w2i.get(t, 3) for t in tokens], 2]])
    out, _ = txt.rnn(txt.embed(ids))
    return F.normalize(out[:, -1], dim=-1)[0]


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-serialization"])
def test_converted_folder_embeds_as_the_original_forward(tmp_path, mini_vgg, legacy):
    img, txt = original()
    ckpt, vocab = write_release(tmp_path, img, txt, legacy=legacy)
    out, cfg = convert_vsepp.convert(ckpt, vocab, tmp_path / "vsepp")
    assert (cfg.backbone, cfg.embed_size, cfg.word_dim, cfg.vocab_size, cfg.bidirectional) == \
        ("vgg19", EMBED, WORD_DIM, len(WORDS), False)
    assert cfg.cnn_l2norm and cfg.tokenizer == "nltk" and cfg.finetune_cnn and cfg.max_violation
    model, processor = vsepp.load(out)
    ims = images()
    pixels = processor.image_processor(ims)["pixel_values"]
    assert torch.equal(pixels, release_transform(ims))
    captions = ["A dog on the grass, a cat.", "the CAT on a sofa", "a zebra on the grass"]   # zebra: <unk>
    batch = processor.tokenizer(captions)
    with torch.no_grad():
        ours_i = model.encode_image(pixels)
        ours_t = model.encode_text(batch["input_ids"], batch["attention_mask"])
        want_i = original_image(img, pixels)
        want_t = torch.stack([original_text(txt, c) for c in captions])
    torch.testing.assert_close(ours_i, want_i, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_t, want_t, rtol=1e-5, atol=1e-6)
    assert batch["input_ids"][2].tolist()[:3] == [1, 4, 3]   # <start> a <unk>
    manifest = json.loads((out / "counterfactory-manifest.json").read_text())
    text = json.dumps(manifest)
    assert "model_best.pth.tar" in text and "coco_vocab.pkl" in text and convert_vsepp.BUILDER in text


def test_bidirectional_checkpoint_converts_to_a_bidirectional_gru(tmp_path, mini_vgg):
    img, txt = original(bidirectional=True)
    ckpt, vocab = write_release(tmp_path, img, txt)
    out, cfg = convert_vsepp.convert(ckpt, vocab, tmp_path / "vsepp")
    assert cfg.bidirectional
    model, processor = vsepp.load(out)
    batch = processor.tokenizer(["a dog on the grass"])
    ids = batch["input_ids"]
    with torch.no_grad():
        _, hidden = txt.rnn(txt.embed(ids))
        want = F.normalize(0.5 * (hidden[-2] + hidden[-1]), dim=-1)
        torch.testing.assert_close(model.encode_text(ids, batch["attention_mask"]), want, rtol=1e-5, atol=1e-6)


def test_cli_converts_and_the_folder_loads(tmp_path, mini_vgg, capsys):
    img, txt = original()
    ckpt, vocab = write_release(tmp_path, img, txt)
    assert main(["models", "convert-vsepp", "--checkpoint", str(ckpt), "--vocab", str(vocab),
                 "--out", str(tmp_path / "out")]) == 0
    assert "VSE++ vgg19" in capsys.readouterr().out
    assert vsepp.load(tmp_path / "out")[0].config.tokenizer == "nltk"


@pytest.mark.parametrize("backbone", ["vgg19", "resnet152"])
def test_true_size_release_layouts_fill_the_model(backbone):
    """The release's true VGG19 / ResNet-152 key layout (pre-0.4.1 checkpoints: no num_batches_tracked) fills our
    model exactly; built on the meta device, so nothing of the 550 MB is allocated."""
    with torch.device("meta"):
        cnn = getattr(torchvision.models, backbone)(weights=None)
        if backbone == "vgg19":
            cnn.classifier = nn.Sequential(*list(cnn.classifier.children())[:-1])
            image = {f"cnn.{k.replace('features.', 'features.module.', 1)}": v for k, v in cnn.state_dict().items()}
            feat = 4096
        else:
            cnn.fc = nn.Sequential()
            image = {f"cnn.module.{k}": v for k, v in cnn.state_dict().items() if "num_batches_tracked" not in k}
            feat = 2048
        fc = nn.Linear(feat, 1024)
        embed, rnn = nn.Embedding(11755, 300), nn.GRU(300, 1024, 1, batch_first=True)
    image.update({f"fc.{k}": v for k, v in fc.state_dict().items()})
    text = {"embed.weight": embed.weight, **{f"rnn.{k}": v for k, v in rnn.state_dict().items()}}
    fields = convert_vsepp.config_of(image, text, vars(opts(cnn_type=backbone, finetune=False)), 11755,
                                     convert_vsepp.Path("model_best.pth.tar"))
    assert (fields["backbone"], fields["embed_size"], fields["word_dim"], fields["num_layers"]) == \
        (backbone, 1024, 300, 1)
    state = {**convert_vsepp._rename(image, convert_vsepp._IMAGE_KEYS, convert_vsepp.Path("x"), "image encoder"),
             **convert_vsepp._rename(text, convert_vsepp._TEXT_KEYS, convert_vsepp.Path("x"), "text encoder")}
    model = convert_vsepp.fill(state, vsepp.VSEPPConfig(**fields), convert_vsepp.Path("x"))
    assert not any(p.requires_grad for p in model.cnn.parameters())   # finetune False: the CNN stays frozen


def test_refusals_name_the_problem(tmp_path, mini_vgg):
    img, txt = original()
    ckpt, vocab = write_release(tmp_path, img, txt, opt=opts(measure="order", use_abs=True), name="order.pth.tar")
    with pytest.raises(convert_vsepp.ConversionError, match="order-embedding"):
        convert_vsepp.convert(ckpt, vocab, tmp_path / "o1")
    precomp = nn.Module()
    precomp.fc = nn.Linear(4096, EMBED)
    ckpt, _ = write_release(tmp_path, precomp, txt, opt=opts(cnn_type="vgg19", data_name="coco_precomp"),
                            name="precomp.pth.tar")
    with pytest.raises(convert_vsepp.ConversionError, match="precomp"):
        convert_vsepp.convert(ckpt, vocab, tmp_path / "o2")
    small = tmp_path / "small.json"
    small.write_text(json.dumps({w: i for i, w in enumerate(WORDS[:-1])}))
    ckpt, _ = write_release(tmp_path, img, txt, name="ok.pth.tar")
    with pytest.raises(convert_vsepp.ConversionError, match="rows, the vocabulary"):
        convert_vsepp.convert(ckpt, small, tmp_path / "o3")
    img.extra = nn.Linear(2, 2)
    ckpt, _ = write_release(tmp_path, img, txt, name="extra.pth.tar")
    with pytest.raises(convert_vsepp.ConversionError, match="extra.weight"):
        convert_vsepp.convert(ckpt, vocab, tmp_path / "o4")
    for out in ("o1", "o2", "o3", "o4"):
        assert not (tmp_path / out).exists()


class _Evil:
    def __reduce__(self):
        return os.system, ("echo pwned",)


def test_reading_the_vocabulary_or_checkpoint_runs_no_code(tmp_path):
    bad = tmp_path / "evil_vocab.pkl"
    bad.write_bytes(pickle.dumps(_Evil(), protocol=2))
    with pytest.raises(convert_vsepp.ConversionError, match="refusing to load"):
        convert_vsepp.read_vocab(bad)
    evil_ckpt = tmp_path / "evil.pth.tar"
    torch.save({"model": [{}, {}], "opt": _Evil()}, evil_ckpt)
    with pytest.raises(convert_vsepp.ConversionError, match="not a readable VSE"):
        convert_vsepp.read_checkpoint(evil_ckpt)
    with pytest.raises(convert_vsepp.ConversionError, match="vocab.tar"):
        convert_vsepp.read_vocab(tmp_path / "missing.pkl")
