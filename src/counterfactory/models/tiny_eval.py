"""Tiny stand-ins for the evaluation roles (image-text matching models and an open_clip CLIP) and the captioner.

Same classes as the paper-scale models of COCO-Counterfactuals appendix A.6 (and BLIP), randomly
initialised with a fixed seed and saved with the libraries' own ``save_pretrained`` (safetensors),
so that :mod:`counterfactory.models.loaders_eval` reads them back by path exactly like a hub model:

=====================  ==============================================  ===============================
role                   model class (paper-scale checkpoint)             processor / tokenizer
=====================  ==============================================  ===============================
``itm_bridgetower``    ``BridgeTowerForImageAndTextRetrieval`` and      ``BridgeTowerProcessor``,
                       ``...ForContrastiveLearning`` (one checkpoint    byte-level BPE (RoBERTa style)
                       with ITM + ITC heads, as
                       BridgeTower/bridgetower-large-itm-mlm-itc)
``itm_flava``          ``FlavaForPreTraining`` (facebook/flava-full)    ``FlavaProcessor``, WordPiece
``itm_vilt``           ``ViltForImageAndTextRetrieval``                 ``ViltProcessor``, WordPiece
                       (dandelin/vilt-b32-finetuned-coco)
``itm_blip``           ``BlipForImageTextRetrieval``                    ``BlipProcessor``, WordPiece
                       (Salesforce/blip-itm-base-coco)
``itm``                same as ``itm_bridgetower``
``clip_open_clip``     open_clip ``CLIP`` saved as a ``local-dir:``      open_clip's bundled CLIP BPE
                       folder (``open_clip_config.json`` + weights)
``captioner``          ``BlipForConditionalGeneration``                 ``BlipProcessor``, WordPiece
                       (Salesforce/blip-image-captioning-base)          with BLIP's ``[DEC]`` bos token
=====================  ==============================================  ===============================

Tokenizers are built offline. The WordPiece vocabularies (BERT style, lower case) are written from a
small word list: the special tokens, single characters and ``##`` continuation characters (so every
word can be tokenised), then the words of :func:`counterfactory.models.tiny_common.caption_corpus`, the
MS-COCO category names and the demo classification class names. The byte-level BPE of BridgeTower is
trained with ``tokenizers`` on the same caption corpus (as the tiny ``mlm`` role does).

Every image processor resizes to :data:`TINY_IMAGE_SIZE` (32 px), the models' own image size. The
transformers are 32 wide with 2 layers, except BridgeTower (64 wide: its vision tower has width // 64
heads, and its contrastive forward adds vision and cross-modal states, so all widths must match).
Scores made with these models carry no meaning; they show that the evaluation pipeline runs.
"""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path

from .tiny_common import COCO_CATEGORIES, SCENE_NOUNS, _seed_all, _train_byte_bpe, _vocab_and_merges, caption_corpus

#: image side the tiny evaluation models are built for (same as the tiny vision roles)
TINY_IMAGE_SIZE = 32
#: width of every tiny transformer here
TINY_WIDTH = 32
#: text length the tiny models accept (tokens, including special tokens)
TINY_TEXT_LENGTH = 40

_WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Class names of the demo classification fixtures (scripts/make_demo_classification.py), so they
# tokenise to whole words with the tiny WordPiece vocabularies.
_EXTRA_WORDS = (
    "photo airplane automobile bird cat deer dog frog horse ship truck apple aquarium fish baby bear "
    "beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can castle caterpillar "
    "cattle chair pie pizza sushi ramen waffles steak tacos accordion anchor ant barrel bass ak47 "
    "backpack baseball bat glove tench goldfish shark goose faces easy leopards motorbikes american "
    "flag"
).split()


def wordpiece_vocab(extra_words: list[str] | tuple[str, ...] = ()) -> dict[str, int]:
    """A lower-case BERT-style WordPiece vocabulary (token -> id) built from a small word list."""
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    words: list[str] = []
    for line in caption_corpus(n=2000, seed=0):
        words.extend(w.strip(string.punctuation).lower() for w in line.split())
    for name in list(COCO_CATEGORIES) + list(SCENE_NOUNS) + _EXTRA_WORDS + list(extra_words):
        words.extend(name.lower().replace("_", " ").split())
    tokens = _WORDPIECE_SPECIALS + chars + ["##" + c for c in string.ascii_lowercase + string.digits]
    seen = set(tokens)
    for w in sorted(set(words)):
        if w and w not in seen:
            tokens.append(w)
            seen.add(w)
    return {t: i for i, t in enumerate(tokens)}


def wordpiece_tokenizer(max_length: int = TINY_TEXT_LENGTH):
    """A ``BertTokenizer`` (tokenizers backend) over :func:`wordpiece_vocab`."""
    from transformers import BertTokenizer

    return BertTokenizer(vocab=wordpiece_vocab(), do_lower_case=True, model_max_length=max_length)


def roberta_tokenizer(max_length: int = TINY_TEXT_LENGTH, seed: int = 0):
    """A byte-level BPE ``RobertaTokenizer`` trained offline on the caption corpus."""
    from transformers import RobertaTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        _train_byte_bpe(caption_corpus(seed=seed + 2), 1000, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                        Path(tmp))
        return RobertaTokenizer(**_vocab_and_merges(Path(tmp)), model_max_length=max_length)


def _bert_text_kwargs(vocab_size: int) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=TINY_WIDTH, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=2 * TINY_WIDTH, max_position_embeddings=TINY_TEXT_LENGTH)


def _vision_kwargs() -> dict:
    return dict(hidden_size=TINY_WIDTH, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=2 * TINY_WIDTH, image_size=TINY_IMAGE_SIZE, patch_size=8)


def build_vilt(out: Path, seed: int = 0) -> None:
    """Tiny ``ViltForImageAndTextRetrieval`` + ``ViltProcessor``."""
    from transformers import ViltConfig, ViltForImageAndTextRetrieval, ViltImageProcessor, ViltProcessor

    tok = wordpiece_tokenizer()
    _seed_all(seed)
    config = ViltConfig(
        vocab_size=len(tok), hidden_size=TINY_WIDTH, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=2 * TINY_WIDTH, max_position_embeddings=TINY_TEXT_LENGTH,
        image_size=TINY_IMAGE_SIZE, patch_size=8, max_image_length=-1,
    )
    model = ViltForImageAndTextRetrieval(config)
    image_processor = ViltImageProcessor(size={"shortest_edge": TINY_IMAGE_SIZE}, size_divisor=8)
    processor = ViltProcessor(image_processor=image_processor, tokenizer=tok)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


def build_blip(out: Path, seed: int = 0) -> None:
    """Tiny ``BlipForImageTextRetrieval`` + ``BlipProcessor``."""
    from transformers import BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor, BlipProcessor

    tok = wordpiece_tokenizer()
    _seed_all(seed)
    text = _bert_text_kwargs(len(tok))
    text.update(encoder_hidden_size=TINY_WIDTH, pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                sep_token_id=tok.sep_token_id)
    config = BlipConfig(text_config=text, vision_config=_vision_kwargs(), projection_dim=TINY_WIDTH,
                        image_text_hidden_size=TINY_WIDTH)
    model = BlipForImageTextRetrieval(config)
    image_processor = BlipImageProcessor(size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE})
    processor = BlipProcessor(image_processor=image_processor, tokenizer=tok)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


#: output-bias given to the tokens the tiny captioner should never write (special tokens other than
#: ``[SEP]``, ``##`` continuations, punctuation, single characters but ``a``): its greedy captions are
#: whole lower-case words
_CAPTION_SUPPRESS_BIAS = -1.0e4


def steer_caption_head(model, tok, extra_prefixes: tuple[str, ...] = ()) -> list[int]:
    """Give the caption head of a ``BlipForConditionalGeneration`` (randomly initialised) the output bias
    :data:`_CAPTION_SUPPRESS_BIAS` on the tokens its greedy captions should never write: special tokens other than
    ``[SEP]``, ``##`` pieces, tokens starting with one of ``extra_prefixes`` (e.g. ``"[unused"``: a vocabulary
    padded to its true size with filler entries), tokens without a letter or digit, and single characters but
    ``a``; the bias is copied to the decoder's own bias when it is a separate tensor. In place; returns the
    suppressed token ids."""
    import torch

    prefixes = ("##", *extra_prefixes)
    suppress = [i for t, i in tok.get_vocab().items()
                if (t in tok.all_special_tokens and t != tok.sep_token) or t.startswith(prefixes)
                or not any(c.isalnum() for c in t) or (len(t) == 1 and t != "a")]
    head = model.text_decoder.cls.predictions
    with torch.no_grad():
        head.bias[suppress] = _CAPTION_SUPPRESS_BIAS
        if head.decoder.bias is not None and head.decoder.bias.data_ptr() != head.bias.data_ptr():
            head.decoder.bias.copy_(head.bias)
    return suppress


def build_blip_captioner(out: Path, seed: int = 0) -> None:
    """Tiny ``BlipForConditionalGeneration`` + ``BlipProcessor`` for the ``captioner`` role.

    As Salesforce/blip-image-captioning-base: a BERT WordPiece tokenizer with ``[DEC]`` added as its bos
    token (the decoder's start token), ``[SEP]`` ends a caption (BLIP's ``generate`` stops on
    ``sep_token_id``) and ``[PAD]`` pads finished rows. Captions depend on the image: the vision tower is
    initialised with std 0.02 (BLIP's default, 1e-10, would make every image look alike to the decoder) and
    the text decoder with std 0.1. The language-model head's bias suppresses special tokens other than
    ``[SEP]``, ``##`` pieces, punctuation and single characters (but ``a``), so greedy decoding writes whole
    words (ending with ``[SEP]`` or at ``max_new_tokens``; :func:`steer_caption_head`). The captions carry no
    meaning."""
    from transformers import BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    tok = wordpiece_tokenizer()
    tok.add_special_tokens({"bos_token": "[DEC]"})
    _seed_all(seed)
    text = _bert_text_kwargs(len(tok))
    text.update(encoder_hidden_size=TINY_WIDTH, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                sep_token_id=tok.sep_token_id, eos_token_id=tok.sep_token_id, initializer_range=0.1)
    config = BlipConfig(text_config=text, vision_config=dict(_vision_kwargs(), initializer_range=0.02),
                        projection_dim=TINY_WIDTH, image_text_hidden_size=TINY_WIDTH)
    model = BlipForConditionalGeneration(config).eval()
    steer_caption_head(model, tok)
    image_processor = BlipImageProcessor(size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE})
    processor = BlipProcessor(image_processor=image_processor, tokenizer=tok)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


def build_flava(out: Path, seed: int = 0) -> None:
    """Tiny ``FlavaForPreTraining`` (ITM head, contrastive projections, tiny image codebook) + ``FlavaProcessor``."""
    from transformers import FlavaConfig, FlavaForPreTraining, FlavaImageProcessor, FlavaProcessor

    tok = wordpiece_tokenizer()
    _seed_all(seed)
    layer = dict(hidden_size=TINY_WIDTH, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=2 * TINY_WIDTH)
    config = FlavaConfig(
        image_config=dict(layer, image_size=TINY_IMAGE_SIZE, patch_size=8),
        text_config=dict(layer, vocab_size=len(tok), max_position_embeddings=TINY_TEXT_LENGTH,
                         pad_token_id=tok.pad_token_id),
        multimodal_config=dict(layer),
        image_codebook_config=dict(num_groups=1, num_blocks_per_group=1, hidden_size=8, vocab_size=64),
        hidden_size=TINY_WIDTH, projection_dim=TINY_WIDTH,
    )
    model = FlavaForPreTraining(config)
    image_processor = FlavaImageProcessor(
        size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE},
        crop_size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE},
        input_size_patches=TINY_IMAGE_SIZE // 8, total_mask_patches=4, mask_group_max_patches=2,
        mask_group_min_patches=1,
        codebook_size={"height": TINY_IMAGE_SIZE // 2, "width": TINY_IMAGE_SIZE // 2},
        codebook_crop_size={"height": TINY_IMAGE_SIZE // 2, "width": TINY_IMAGE_SIZE // 2},
    )
    processor = FlavaProcessor(image_processor=image_processor, tokenizer=tok)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


def build_bridgetower(out: Path, seed: int = 0) -> None:
    """Tiny ``BridgeTowerForImageAndTextRetrieval`` + ``BridgeTowerProcessor`` (RoBERTa-style BPE)."""
    from transformers import (BridgeTowerConfig, BridgeTowerForContrastiveLearning,
                              BridgeTowerForImageAndTextRetrieval, BridgeTowerImageProcessor, BridgeTowerProcessor)

    tok = roberta_tokenizer(seed=seed)
    _seed_all(seed)
    config = BridgeTowerConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=TINY_TEXT_LENGTH + 2,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id),
        vision_config=dict(hidden_size=64, num_hidden_layers=2, patch_size=8, image_size=TINY_IMAGE_SIZE),  # heads = width // 64
        # one width (64) for text, vision and cross-modal layers: the link towers add them, and the
        # vision tower needs width // 64 >= 1 heads
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        contrastive_hidden_size=TINY_WIDTH, logit_scale_init_value=2.6592,
    )
    model = BridgeTowerForImageAndTextRetrieval(config)
    # Like bridgetower-large-itm-mlm-itc, one checkpoint holds the ITM head and the contrastive (ITC)
    # heads: it loads as BridgeTowerForImageAndTextRetrieval and as BridgeTowerForContrastiveLearning.
    _seed_all(seed + 1)
    itc = BridgeTowerForContrastiveLearning(config)
    for name in ("itc_text_head", "itc_image_head", "itc_cross_modal_head"):
        model.add_module(name, getattr(itc, name))
    model.register_parameter("logit_scale", itc.logit_scale)
    image_processor = BridgeTowerImageProcessor(size={"shortest_edge": TINY_IMAGE_SIZE}, size_divisor=8,
                                                crop_size={"shortest_edge": TINY_IMAGE_SIZE})
    processor = BridgeTowerProcessor(image_processor=image_processor, tokenizer=tok)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


def build_open_clip(out: Path, seed: int = 0) -> None:
    """Tiny open_clip ``CLIP`` saved as a ``local-dir:`` folder (config JSON + safetensors weights).

    The tokenizer is open_clip's default ``SimpleTokenizer`` (the CLIP BPE bundled with open_clip), so
    the folder needs no tokenizer files; the text tower keeps CLIP's 49,408-token vocabulary.
    """
    import open_clip
    from safetensors.torch import save_file

    model_cfg = {
        "embed_dim": TINY_WIDTH,
        "vision_cfg": {"image_size": TINY_IMAGE_SIZE, "layers": 2, "width": TINY_WIDTH, "patch_size": 8,
                       "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": TINY_WIDTH, "heads": 2, "layers": 2},
    }
    preprocess_cfg = {"size": TINY_IMAGE_SIZE, "mean": [0.48145466, 0.4578275, 0.40821073],
                      "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic",
                      "resize_mode": "shortest"}
    _seed_all(seed)
    model = open_clip.CLIP(**model_cfg)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "open_clip_model.safetensors"))
    (out / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": model_cfg, "preprocess_cfg": preprocess_cfg}, indent=2), encoding="utf-8")


BUILDERS = {
    "itm": build_bridgetower,
    "itm_bridgetower": build_bridgetower,
    "itm_flava": build_flava,
    "itm_vilt": build_vilt,
    "itm_blip": build_blip,
    "clip_open_clip": build_open_clip,
    "captioner": build_blip_captioner,
}
