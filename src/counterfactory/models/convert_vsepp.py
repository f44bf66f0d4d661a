"""Convert a published VSE++ checkpoint (the original release of Faghri et al. 2018, github.com/fartashf/vsepp) into
a VSE++ folder of :mod:`.vsepp`.

The spurious-correlation retrieval paper (§4.1, Tables 1-2) fine-tunes VSE++ from its published model; training
VSE++ from scratch on a frozen CNN (``counterfactory models build-vsepp``) cannot reach its rows. The release's
files:

* a checkpoint ``model_best.pth.tar`` (e.g. ``runs/coco_vse++/``, ``runs/f30k_vse++/``): a dict with ``model`` =
  ``[image encoder state dict, text encoder state dict]``, ``opt`` (the training options, an ``argparse.Namespace``:
  ``cnn_type``, ``embed_size``, ``word_dim``, ``num_layers``, ``margin``, ``max_violation``, ``finetune``,
  ``measure``, ``use_abs``, ``no_imgnorm``, ``crop_size``, ...), ``epoch``, ``best_rsum``, ``Eiters``;
* a vocabulary ``vocab/<data>_vocab.pkl``: a pickled ``vocab.Vocabulary`` (``word2idx``, ``idx2word``, ``idx``) with
  ``<pad>``, ``<start>``, ``<end>``, ``<unk>`` at ids 0-3. A JSON file with a ``word2idx`` mapping (or a plain
  word -> id mapping) is read too.

Key layout. Image encoder: VGG's ``cnn.features.module.N.*`` (its feature trunk was wrapped in ``DataParallel``)
-> ``cnn.features.N.*``; ``cnn.classifier.{0,3}.*`` (fc6, fc7; the ImageNet fc8 was removed) stay; ResNet's
``cnn.module.*`` -> ``cnn.*``; the projection ``fc.*`` -> ``image_fc.*``. Text encoder: ``embed.weight`` stays,
``rnn.*`` (``nn.GRU``) -> ``gru.*``. Sizes come from the tensors (joint space, word dimension, vocabulary size, GRU
layers; bidirectional when ``*_reverse`` weights exist); the loss settings (margin, hardest negative) and whether
the CNN was fine-tuned come from ``opt``. VSE++'s code L2-normalises the CNN features before the projection and
tokenises with nltk's word tokenizer on the lower-cased caption: the folder says so (``cnn_l2norm: true``,
``tokenizer: nltk``). Its evaluation transform (resize 256, centre crop 224, ImageNet statistics) is the folder's.

Refused with an error naming the fix: order-embedding checkpoints (``measure: order`` / ``use_abs``), ones trained
without image normalisation (``no_imgnorm``), a vocabulary whose size differs from the embedding's rows, and any
key the layout above does not place. The checkpoint is read with ``torch.load(weights_only=True)`` (tensors, plain
containers and ``argparse.Namespace`` only) and the vocabulary with an unpickler that builds nothing but the
``Vocabulary`` record: neither can run code. The output folder is written atomically with a sha256 manifest naming
the source checkpoint and vocabulary.
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import warnings
from pathlib import Path

import torch

from ..errors import CounterFactoryError
from ..io import file_sha256
from . import vsepp
from .identity import save_with_manifest

BUILDER = "counterfactory models convert-vsepp"
#: where the release is published (the VSE++ README: "Download pre-trained models" and the vocabulary)
RELEASE_URL = "http://www.cs.toronto.edu/~faghri/vsepp/"
_IMAGE_KEYS = [  # (pattern of the original image encoder's key, our key), first match wins
    (r"cnn\.features\.module\.(.+)", r"cnn.features.\1"),
    (r"cnn\.classifier\.(.+)", r"cnn.classifier.\1"),
    (r"cnn\.module\.(.+)", r"cnn.\1"),
    (r"fc\.(weight|bias)", r"image_fc.\1"),
]
_TEXT_KEYS = [(r"embed\.weight", "embed.weight"), (r"rnn\.(.+)", r"gru.\1")]


class ConversionError(CounterFactoryError):
    """The checkpoint or vocabulary does not fit VSE++'s published layout."""


# --------------------------------------------------------------------------- reading the release's files

class _Vocabulary:
    """Stand-in for the release's ``vocab.Vocabulary`` (only its attributes are read)."""


class _VocabUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name == "Vocabulary":
            return _Vocabulary
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a VSE++ vocabulary holds only a Vocabulary "
                                     "record")


def read_vocab(path: str | Path) -> dict[str, int]:
    """Word -> id of a VSE++ vocabulary file (the release's pickled ``Vocabulary``, or JSON)."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path}: no such vocabulary file. Fix: download the release's vocab.tar "
                              f"({RELEASE_URL}vocab.tar) and pass e.g. vocab/coco_vocab.pkl")
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            with path.open("rb") as fh:
                data = _VocabUnpickler(fh, encoding="latin1").load()
    except (OSError, ValueError, pickle.UnpicklingError, EOFError, AttributeError) as exc:
        raise ConversionError(f"{path}: not a VSE++ vocabulary ({type(exc).__name__}: {exc}). Fix: pass the "
                              "vocabulary the checkpoint was trained with (vocab/<data>_vocab.pkl)") from exc
    mapping = getattr(data, "word2idx", None)
    if mapping is None and isinstance(data, dict):
        mapping = data.get("word2idx", data)
    if not isinstance(mapping, dict) or not mapping:
        raise ConversionError(f"{path}: holds no word -> id mapping (word2idx). Fix: pass the release's "
                              "vocab/<data>_vocab.pkl")
    vocab = {}
    for word, idx in mapping.items():
        if not isinstance(word, str) or isinstance(idx, bool) or not isinstance(idx, int):
            raise ConversionError(f"{path}: entry {word!r} -> {idx!r} is not a word -> integer id")
        vocab[word] = int(idx)
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ConversionError(f"{path}: ids are not 0 .. {len(vocab) - 1}, each once. Fix: pass an unmodified "
                              "release vocabulary")
    return vocab


def read_checkpoint(path: str | Path) -> tuple[dict, dict, dict]:
    """``(image state dict, text state dict, options)`` of a VSE++ ``.pth.tar``; the options gain the checkpoint's
    ``epoch`` (a top-level key of the file) under ``_epoch``."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path}: no such checkpoint. Fix: download the release's runs.tar ({RELEASE_URL}"
                              "runs.tar) and pass e.g. runs/coco_vse++/model_best.pth.tar")
    try:
        # latin1: the release was pickled by Python 2. torch passes the encoding on to its weights-only unpickler
        # although it warns that it does not
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "pickle_load_args only works", UserWarning)
            ckpt = torch.load(path, map_location="cpu", weights_only=True, encoding="latin1")
    except Exception as exc:  # zip / pickle / unsafe-global errors vary
        raise ConversionError(f"{path}: not a readable VSE++ checkpoint ({type(exc).__name__}: {exc}). Fix: pass "
                              "the release's model_best.pth.tar (tensors and training options only)") from exc
    model = ckpt.get("model") if isinstance(ckpt, dict) else None
    if not (isinstance(model, (list, tuple)) and len(model) == 2 and all(isinstance(m, dict) for m in model)):
        raise ConversionError(f"{path}: 'model' is not [image encoder state dict, text encoder state dict] (VSE++'s "
                              "VSE.state_dict()). Fix: pass a checkpoint saved by VSE++'s train.py")
    opt = ckpt.get("opt")
    opt = dict(vars(opt)) if isinstance(opt, argparse.Namespace) else dict(opt or {})
    epoch = ckpt.get("epoch")
    opt["_epoch"] = int(epoch) if isinstance(epoch, int) and not isinstance(epoch, bool) else None
    return dict(model[0]), dict(model[1]), opt


# --------------------------------------------------------------------------- mapping

def _rename(state: dict, rules: list, path: Path, part: str) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for pattern, repl in rules:
            if re.fullmatch(pattern, key):
                out[re.sub(pattern, repl, key)] = value
                break
        else:
            raise ConversionError(f"{path}: {part} key {key!r} has no place in VSE++'s layout. Fix: pass a "
                                  "checkpoint of VSE++'s full-image model (VGG19 or ResNet-152, GRU text encoder)")
    return out


def _backbone(image: dict, opt: dict, path: Path) -> str:
    cnn = str(opt.get("cnn_type") or ("vgg19" if any(k.startswith("cnn.features.") for k in image) else
                                      "resnet152" if any(k.startswith("cnn.module.") for k in image) else ""))
    if cnn not in ("vgg19", "resnet152"):
        precomp = " (a *_precomp checkpoint holds no CNN: convert a full-image one)" if not any(
            k.startswith("cnn.") for k in image) else ""
        raise ConversionError(f"{path}: CNN {cnn or 'unknown'!r}{precomp}. Fix: convert a VGG19 or ResNet-152 "
                              "checkpoint")
    return cnn


def config_of(image: dict, text: dict, opt: dict, vocab_size: int, path: Path) -> dict:
    """:class:`.vsepp.VSEPPConfig` fields of the checkpoint (sizes from the tensors, loss settings from ``opt``)."""
    if str(opt.get("measure", "cosine")) != "cosine" or opt.get("use_abs"):
        raise ConversionError(f"{path}: an order-embedding checkpoint (measure {opt.get('measure')!r}, use_abs "
                              f"{opt.get('use_abs')}); VSE++ scores by cosine. Fix: convert a cosine VSE++ checkpoint")
    if opt.get("no_imgnorm"):
        raise ConversionError(f"{path}: trained without image-embedding normalisation (no_imgnorm). Fix: convert a "
                              "checkpoint with normalised image embeddings (VSE++'s default)")
    if "fc.weight" not in image or "embed.weight" not in text:
        raise ConversionError(f"{path}: no image projection (fc.weight) or word embedding (embed.weight)")
    rows, word_dim = text["embed.weight"].shape
    if rows != vocab_size:
        raise ConversionError(f"{path}: the word embedding has {rows} rows, the vocabulary {vocab_size} words. Fix: "
                              "pass the vocabulary of the checkpoint's dataset (coco_vocab.pkl for coco_*, "
                              "f30k_vocab.pkl for f30k_*)")
    layers = {int(m.group(1)) for k in text if (m := re.fullmatch(r"rnn\.weight_ih_l(\d+)(_reverse)?", k))}
    return {"vocab_size": int(rows), "backbone": _backbone(image, opt, path),
            "embed_size": int(image["fc.weight"].shape[0]), "word_dim": int(word_dim),
            "num_layers": max(layers) + 1 if layers else 1,
            "bidirectional": any(k.endswith("_reverse") for k in text),
            "finetune_cnn": bool(opt.get("finetune", False)), "image_size": int(opt.get("crop_size", 224) or 224),
            "margin": float(opt.get("margin", 0.2)), "max_violation": bool(opt.get("max_violation", True)),
            "min_count": 4, "backbone_init": f"vsepp:{path.name}", "cnn_l2norm": True, "tokenizer": "nltk"}


def convert(checkpoint: str | Path, vocab: str | Path, out: str | Path):
    """Write the VSE++ folder ``out`` from the release's ``checkpoint`` and ``vocab``; returns ``(out, config)``."""
    checkpoint, vocab_path = Path(checkpoint), Path(vocab)
    words = read_vocab(vocab_path)
    image, text, opt = read_checkpoint(checkpoint)
    fields = config_of(image, text, opt, len(words), checkpoint)
    missing = [t for t in vsepp.SPECIALS if words.get(t) != vsepp.SPECIALS.index(t)]
    if missing:
        raise ConversionError(f"{vocab_path}: special tokens {missing} are not at ids 0-3 as in VSE++'s vocabulary")
    cfg = vsepp.VSEPPConfig(**fields)
    state = {**_rename(image, _IMAGE_KEYS, checkpoint, "image encoder"),
             **_rename(text, _TEXT_KEYS, checkpoint, "text encoder")}
    model = fill(state, cfg, checkpoint)
    processor = vsepp.VSEPPProcessor(cfg, words)
    save_with_manifest(out, model.eval(), processor, builder=BUILDER, role="vsepp",
                       source={"checkpoint": checkpoint.name, "checkpoint_sha256": file_sha256(checkpoint),
                               "vocab": vocab_path.name, "vocab_sha256": file_sha256(vocab_path),
                               "epoch": opt.get("_epoch")})
    return Path(out), cfg


def fill(state: dict[str, torch.Tensor], cfg, path: Path):
    """A :class:`.vsepp.VSEPP` holding exactly ``state`` (renamed keys): built on the meta device and given the
    tensors, so no random weights are made. Batch-norm ``num_batches_tracked`` counters, which checkpoints saved
    before PyTorch 0.4.1 (the release's) lack, start at 0; any other missing, extra or mis-shaped key is an error."""
    with torch.device("meta"):
        model = vsepp.VSEPP(cfg)
    own = model.state_dict()
    state = dict(state)
    for key in own:
        if key.endswith("num_batches_tracked") and key not in state:
            state[key] = torch.zeros((), dtype=torch.long)
    lacking, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(set(own) & set(state))
              if own[k].shape != state[k].shape]
    if lacking or extra or shapes:
        raise ConversionError(f"{path}: does not fill VSE++ ({cfg.backbone}): missing {lacking[:3]}, "
                              f"unexpected {extra[:3]}, shapes {shapes[:3]}. Fix: pass an unmodified release "
                              "checkpoint")
    model.load_state_dict({k: v if k.endswith("num_batches_tracked") else v.float() for k, v in state.items()},
                          strict=True, assign=True)
    model.cnn.requires_grad_(bool(cfg.finetune_cnn))
    return model
