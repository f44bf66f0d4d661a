"""VSE++ (Faghri, Fleet, Kiros & Fidler 2018, "VSE++: Improving Visual-Semantic Embeddings with Hard Negatives"):
a two-tower image-text embedding model, one of the three models of the spurious-correlation retrieval paper
(Kim et al. 2023, §4.1 and Tables 1-2), written here with torch / torchvision modules.

* **image encoder**: a torchvision CNN (``resnet152``, ``vgg19``, or ``tiny`` for the offline demo and tests),
  globally pooled (ResNet: its average pool; VGG: the 4096-d ``fc7`` features), L2-normalised as VSE++'s code does
  (``cnn_l2norm``; off only in folders built before that field existed), a linear projection to the joint
  space (Xavier-uniform initialised, zero bias), L2-normalised. ``finetune_cnn: false`` freezes the CNN (no
  gradients, and it stays in eval mode, so its batch-norm statistics do not drift either);
* **text encoder**: word embeddings (uniform in [-0.1, 0.1]) and a GRU whose last hidden state (of the last
  layer; a bidirectional GRU averages its two directions' final states) is the caption's embedding, L2-normalised.
  Captions are lower-cased, split into words and punctuation, wrapped in ``<start>`` / ``<end>``; words outside the
  vocabulary are ``<unk>`` (``tokenizer: nltk``, the converted checkpoints': nltk's word tokenizer, as VSE++'s
  code). The vocabulary is built from the training captions: every word seen at least
  ``min_count`` times (VSE++ keeps words seen 4 times or more);
* **its loss** (margin 0.2, hardest negative in the batch) is training's: :mod:`counterfactory.training.vsepp_loss`.
  The margin and ``max_violation`` travel in the model's ``config.json`` so the shared trainer uses the right one.

A VSE++ model is a folder (:func:`load` / :meth:`VSEPP.save_pretrained`): ``config.json`` (architecture, image
preprocessing, text length, loss settings, how the CNN was initialised), ``model.safetensors`` (every weight,
the CNN's included) and ``vocab.json`` (word -> id). :func:`build` makes a fresh one from a caption list
(``counterfactory models build-vsepp``), the CNN initialised from torchvision's ImageNet weights file when it is
on disk (``IMAGENET_FILES``; nothing is downloaded). Retrieval scores are the cosine of the two embeddings.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, ModelLoadError
from ..io import atomic_path, write_text
from ..rgb import to_rgb
from .identity import save_with_manifest

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
VOCAB_NAME = "vocab.json"
MODEL_TYPE = "vsepp"
#: the special tokens, first in every vocabulary (ids 0-3)
PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
BACKBONES = ("resnet152", "vgg19", "tiny")
#: caption tokenizers: ``words`` (lower-cased words and punctuation, :func:`words`) or ``nltk`` (nltk's
#: ``NLTKWordTokenizer`` on the lower-cased caption: VSE++'s own ``word_tokenize``, whose sentence splitting needs
#: the punkt data and changes nothing on one-sentence captions)
TOKENIZERS = ("words", "nltk")
#: torchvision's ImageNet weights files (``IMAGENET1K_V1``, the ones VSE++ started from), looked up in torch hub's
#: checkpoint folder (``$TORCH_HOME/hub/checkpoints``) unless a path is given
IMAGENET_FILES = {"resnet152": "resnet152-394f9c45.pth", "vgg19": "vgg19-dcbb9e9d.pth"}
IMAGENET_URL = "https://download.pytorch.org/models/{}"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_WORDS = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


@dataclass(frozen=True)
class VSEPPConfig:
    """Architecture, preprocessing and loss settings of a VSE++ folder (its ``config.json``)."""

    vocab_size: int
    backbone: str = "resnet152"
    embed_size: int = 1024          # VSE++: 1024-d joint space
    word_dim: int = 300             # VSE++: 300-d word embeddings
    num_layers: int = 1
    bidirectional: bool = False
    finetune_cnn: bool = False
    image_size: int = 224           # centre crop
    resize: int = 256               # shorter side before the crop
    image_mean: tuple[float, ...] = IMAGENET_MEAN
    image_std: tuple[float, ...] = IMAGENET_STD
    max_length: int = 100           # tokens per caption, <start> and <end> included
    margin: float = 0.2             # VSE++ §3: triplet margin alpha
    max_violation: bool = True      # VSE++ MH loss (False: the sum of hinges, VSE0)
    min_count: int = 4              # how the vocabulary was built (words seen at least this often)
    tiny_width: int = 8             # channels of the ``tiny`` CNN's first layer
    backbone_init: str = "random"   # "imagenet:<file name>" when built from torchvision's ImageNet weights
    cnn_l2norm: bool = False        # VSE++'s code L2-normalises the CNN features before the projection (converted
                                    # checkpoints and new builds: True; False = folders built before this field)
    tokenizer: str = "words"        # "words": our regex split; "nltk": nltk's word tokenizer, as VSE++'s code

    def __post_init__(self):
        if self.backbone not in BACKBONES:
            raise ConfigError(f"VSE++ backbone {self.backbone!r} is not one of {list(BACKBONES)}. "
                              f"Fix: build the model with --backbone {BACKBONES[0]} or {BACKBONES[1]}")
        if not 0 <= float(self.margin):
            raise ConfigError(f"VSE++ margin must be >= 0, got {self.margin}. Fix: use 0.2 (VSE++ §3)")
        if self.tokenizer not in TOKENIZERS:
            raise ConfigError(f"VSE++ tokenizer {self.tokenizer!r} is not one of {list(TOKENIZERS)}")
        if int(self.max_length) < 3:
            raise ConfigError(f"VSE++ max_length must be >= 3 (<start>, one word, <end>), got {self.max_length}")

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(model_type=MODEL_TYPE, architectures=["VSEPP"])
        out["image_mean"], out["image_std"] = list(self.image_mean), list(self.image_std)
        return out

    @classmethod
    def from_dict(cls, data: dict, path: Path | str = CONFIG_NAME) -> VSEPPConfig:
        if not isinstance(data, dict) or data.get("model_type") != MODEL_TYPE:
            raise ModelLoadError(f"{path}: not a VSE++ config (model_type {MODEL_TYPE!r} expected). Fix: point the "
                                 "role at a folder made by `counterfactory models build-vsepp` or by training one")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names - {"model_type", "architectures"})
        if unknown or "vocab_size" not in data:
            raise ModelLoadError(f"{path}: {'unknown keys ' + str(unknown) if unknown else 'no vocab_size'}. Fix: "
                                 "rebuild the folder with `counterfactory models build-vsepp`")
        values = {k: v for k, v in data.items() if k in names}
        for key in ("image_mean", "image_std"):
            if key in values:
                values[key] = tuple(float(x) for x in values[key])
        return cls(**values)


# --------------------------------------------------------------------------- vocabulary and tokenizer

def words(text: str, tokenizer: str = "words") -> list[str]:
    """Lower-cased words and punctuation marks of ``text`` (``tokenizer``: one of :data:`TOKENIZERS`)."""
    if tokenizer == "nltk":
        from nltk.tokenize import NLTKWordTokenizer

        return NLTKWordTokenizer().tokenize(str(text).lower())
    return _WORDS.findall(str(text).lower())


def build_vocab(captions: Iterable[str], min_count: int = 4) -> dict[str, int]:
    """Word -> id: the special tokens, then every word seen at least ``min_count`` times, most frequent first
    (ties alphabetical), so the same captions always give the same ids."""
    if int(min_count) < 1:
        raise ConfigError(f"VSE++ vocabulary: min_count must be >= 1, got {min_count}")
    counts = Counter(w for caption in captions for w in words(caption))
    kept = sorted((w for w, c in counts.items() if c >= int(min_count) and w not in SPECIALS),
                  key=lambda w: (-counts[w], w))
    return {w: i for i, w in enumerate([*SPECIALS, *kept])}


class VSEPPTokenizer:
    """Captions -> ``input_ids`` / ``attention_mask``, called like a transformers tokenizer."""

    def __init__(self, vocab: dict[str, int], max_length: int = 100, tokenizer: str = "words"):
        missing = [t for t in SPECIALS if vocab.get(t) != SPECIALS.index(t)]
        if missing:
            raise ModelLoadError(f"VSE++ vocabulary: special tokens {missing} are not at ids 0-3. Fix: rebuild the "
                                 "vocabulary with `counterfactory models build-vsepp`")
        self.vocab = dict(vocab)
        self.model_max_length = int(max_length)
        self.pad_token_id = self.vocab[PAD]
        self.word_split = tokenizer

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, max_length: int | None = None) -> list[int]:
        limit = min(int(max_length or self.model_max_length), self.model_max_length)
        unk = self.vocab[UNK]
        ids = [self.vocab.get(w, unk) for w in words(text, self.word_split)][: limit - 2]
        return [self.vocab[START], *ids, self.vocab[END]]

    def __call__(self, texts: Sequence[str] | str, return_tensors: str = "pt", padding: bool | str = True,
                 truncation: bool = True, max_length: int | None = None) -> dict[str, torch.Tensor]:
        texts = [texts] if isinstance(texts, str) else list(texts)
        rows = [self.encode(t, max_length) for t in texts]
        width = max(map(len, rows), default=0)
        if padding == "max_length" and max_length:
            width = max(width, min(int(max_length), self.model_max_length))
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, :len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask}


class VSEPPImageProcessor:
    """PIL images -> ``pixel_values``: resize the shorter side, centre crop, ImageNet normalisation (VSE++'s
    evaluation transform; training uses it too, so batches are deterministic)."""

    def __init__(self, config: VSEPPConfig):
        from torchvision import transforms

        self.transform = transforms.Compose([
            transforms.Resize(config.resize), transforms.CenterCrop(config.image_size), transforms.ToTensor(),
            transforms.Normalize(config.image_mean, config.image_std)])

    def __call__(self, images=None, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        return {"pixel_values": torch.stack([self.transform(to_rgb(im)) for im in images])}


class VSEPPProcessor:
    """The image processor and the tokenizer of a VSE++ folder; saving writes ``vocab.json``."""

    def __init__(self, config: VSEPPConfig, vocab: dict[str, int]):
        self.image_processor = VSEPPImageProcessor(config)
        self.tokenizer = VSEPPTokenizer(vocab, config.max_length, config.tokenizer)

    def save_pretrained(self, out_dir: str | Path) -> None:
        write_text(Path(out_dir) / VOCAB_NAME, json.dumps(self.tokenizer.vocab, ensure_ascii=False, indent=0) + "\n")


# --------------------------------------------------------------------------- the model

def _tiny_cnn(width: int) -> tuple[nn.Module, int]:
    layers = []
    channels = 3
    for out in (width, 2 * width):
        layers += [nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(out),
                   nn.ReLU(inplace=True)]
        channels = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten()), channels


def make_backbone(config: VSEPPConfig) -> tuple[nn.Module, int]:
    """The CNN trunk (random weights) and the size of its pooled features."""
    import torchvision

    if config.backbone == "resnet152":
        cnn = torchvision.models.resnet152(weights=None)
        dim = cnn.fc.in_features
        cnn.fc = nn.Identity()
        return cnn, dim
    if config.backbone == "vgg19":
        cnn = torchvision.models.vgg19(weights=None)
        dim = cnn.classifier[-1].in_features
        cnn.classifier = cnn.classifier[:-1]  # fc7 features (after its ReLU and dropout), as VSE++ uses
        return cnn, dim
    return _tiny_cnn(config.tiny_width)


class VSEPP(nn.Module):
    """VSE++ image and text encoders; ``forward`` returns the L2-normalised ``(image, text)`` embeddings."""

    def __init__(self, config: VSEPPConfig):
        super().__init__()
        self.config = config
        self.cnn, feat_dim = make_backbone(config)
        self.image_fc = nn.Linear(feat_dim, config.embed_size)
        bound = (6.0 / (feat_dim + config.embed_size)) ** 0.5
        nn.init.uniform_(self.image_fc.weight, -bound, bound)
        nn.init.zeros_(self.image_fc.bias)
        self.embed = nn.Embedding(config.vocab_size, config.word_dim)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        self.gru = nn.GRU(config.word_dim, config.embed_size, config.num_layers, batch_first=True,
                          bidirectional=config.bidirectional)
        self.cnn.requires_grad_(bool(config.finetune_cnn))

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.config.finetune_cnn:
            self.cnn.eval()   # frozen: its batch-norm statistics stay the pre-trained ones
        return self

    def encode_image(self, pixel_values: torch.Tensor) -> torch.Tensor:
        feats = self.cnn(pixel_values)
        if self.config.cnn_l2norm:
            feats = F.normalize(feats, dim=-1)
        return F.normalize(self.image_fc(feats), dim=-1)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = (input_ids != SPECIALS.index(PAD)).long()
        lengths = attention_mask.sum(dim=1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(input_ids), lengths, batch_first=True,
                                                   enforce_sorted=False)
        _, hidden = self.gru(packed)
        if self.config.bidirectional:
            last = 0.5 * (hidden[-2] + hidden[-1])   # the last layer's forward and backward final states
        else:
            last = hidden[-1]
        return F.normalize(last, dim=-1)

    def forward(self, pixel_values: torch.Tensor, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_image(pixel_values), self.encode_text(input_ids, attention_mask)

    def save_pretrained(self, out_dir: str | Path, safe_serialization: bool = True) -> None:
        """``config.json`` and ``model.safetensors`` (every weight, the CNN's too) in ``out_dir``."""
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text(out_dir / CONFIG_NAME, json.dumps(self.config.to_dict(), indent=2, sort_keys=True) + "\n")
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        with atomic_path(out_dir / WEIGHTS_NAME) as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})


def _read_json(path: Path, what: str):
    if not path.is_file():
        raise ModelLoadError(f"{path}: the VSE++ {what} is missing. Fix: point the role at a complete VSE++ folder "
                             "(config.json, model.safetensors, vocab.json), e.g. one made by `counterfactory models "
                             "build-vsepp`")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: the VSE++ {what} is not readable JSON ({exc}). Fix: rebuild the folder with "
                             "`counterfactory models build-vsepp`") from exc


def load(folder: str | Path) -> tuple[VSEPP, VSEPPProcessor]:
    """``(model in eval mode, processor)`` of a VSE++ folder; a missing or mismatched file is a
    :class:`ModelLoadError` naming it."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: no such VSE++ folder. Fix: build one with `counterfactory models build-vsepp "
                             f"--captions <training captions> --out {folder}`")
    config = VSEPPConfig.from_dict(_read_json(folder / CONFIG_NAME, "config"), folder / CONFIG_NAME)
    vocab = _read_json(folder / VOCAB_NAME, "vocabulary")
    if not isinstance(vocab, dict) or len(vocab) != config.vocab_size or \
            sorted(vocab.values()) != list(range(config.vocab_size)):
        raise ModelLoadError(f"{folder / VOCAB_NAME}: not a word -> id mapping of the config's {config.vocab_size} "
                             "ids. Fix: keep the vocab.json the model was built with")
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        raise ModelLoadError(f"{weights}: the VSE++ weights are missing. Fix: rebuild or retrain the folder")
    model = VSEPP(config)
    state = load_file(str(weights))
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or shapes:
        raise ModelLoadError(f"{weights}: does not fit the config's VSE++ ({config.backbone}): missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}, shape mismatch {shapes[:3]}. Fix: keep the weights and "
                             "config.json of one build together, or rebuild the folder")
    model.load_state_dict(state, strict=True)
    return model.eval(), VSEPPProcessor(config, vocab)


# --------------------------------------------------------------------------- building a fresh folder

def imagenet_weights_path(backbone: str) -> Path:
    """Where torchvision keeps its ImageNet weights file of ``backbone`` (torch hub's checkpoint folder)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / IMAGENET_FILES[backbone]


def init_from_imagenet(model: VSEPP, path: str | Path) -> None:
    """Load torchvision's ImageNet weights of the backbone into ``model.cnn`` (the classifier's last layer,
    which VSE++ replaces, is dropped)."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # zip / pickle errors vary
        raise ModelLoadError(f"{path}: not a readable torchvision weights file ({type(exc).__name__}: {exc}). Fix: "
                             f"re-download {IMAGENET_URL.format(IMAGENET_FILES[model.config.backbone])}") from exc
    own = model.cnn.state_dict()
    state = {k: v for k, v in state.items() if k in own or not k.startswith(("fc.", "classifier.6."))}
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ModelLoadError(f"{path}: not torchvision's {model.config.backbone} weights (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}). Fix: use {IMAGENET_FILES[model.config.backbone]}")
    model.cnn.load_state_dict(state, strict=True)


def make(captions: Iterable[str], *, backbone: str = "resnet152", imagenet: str | Path | None = "auto",
         seed: int = 0, min_count: int = 4, **config) -> tuple[VSEPP, VSEPPProcessor]:
    """A fresh VSE++ ``(model, processor)``: vocabulary from ``captions``, weights drawn with ``seed``, the CNN from
    torchvision's ImageNet file (``imagenet``: ``"auto"`` = torch hub's checkpoint folder, a path, or None for
    random weights). ``config``: other :class:`VSEPPConfig` fields."""
    weights = None
    if imagenet is not None:
        if backbone not in IMAGENET_FILES:
            raise ConfigError(f"VSE++ backbone {backbone!r} has no ImageNet weights. Fix: pass --imagenet-weights "
                              "none for random weights")
        weights = imagenet_weights_path(backbone) if imagenet == "auto" else Path(imagenet)
        if not weights.is_file():
            name = IMAGENET_FILES[backbone]
            raise ModelLoadError(
                f"{weights}: torchvision's ImageNet {backbone} weights are not on disk. Fix: download them "
                f"(`mkdir -p {weights.parent} && curl -L -o {weights} {IMAGENET_URL.format(name)}`), pass their path "
                "with --imagenet-weights, or --imagenet-weights none for a randomly initialised CNN")
    vocab = build_vocab(captions, min_count)
    if len(vocab) == len(SPECIALS):
        raise ConfigError(f"VSE++ vocabulary: no word occurs {min_count} times or more in the captions. Fix: give the "
                          "training captions (or lower --min-count)")
    torch.manual_seed(int(seed))
    config.setdefault("cnn_l2norm", True)
    cfg = VSEPPConfig(vocab_size=len(vocab), backbone=backbone, min_count=int(min_count),
                      backbone_init=f"imagenet:{weights.name}" if weights else "random", **config)
    model = VSEPP(cfg)
    if weights is not None:
        init_from_imagenet(model, weights)
    return model.eval(), VSEPPProcessor(cfg, vocab)


def build(out: str | Path, captions: Iterable[str], **kw) -> Path:
    """:func:`make` a fresh VSE++ and write it to the folder ``out`` atomically, with a sha256 manifest."""
    model, processor = make(captions, **kw)
    return save_with_manifest(out, model, processor, builder=__name__, role="vsepp", seed=int(kw.get("seed", 0)))
