"""Tiny stand-in for the ``vlm`` role (CounterCurate §3.5, §4: LLaVA-1.5).

Same classes as ``llava-hf/llava-1.5-7b-hf``: a ``LlavaForConditionalGeneration`` (``CLIPVisionModel`` tower,
two-layer GELU projector, ``LlamaForCausalLM``-style decoder) and a ``LlavaProcessor`` (``CLIPImageProcessor``,
Llama tokenizer with the ``<image>`` token, a Vicuna-v1 chat template), randomly initialised with a fixed seed
and saved with ``save_pretrained`` (safetensors), so the ``vlm`` loader
(:mod:`counterfactory.models.loaders_vlm`) reads it back by path like the hub model.

Sizes: 32 px images in 8 px patches (16 patch tokens + CLS; LLaVA's ``vision_feature_select_strategy:
default`` drops the CLS, so every ``<image>`` expands to :data:`IMAGE_TOKENS` = 16 tokens, as 576 in the
real model), vision and text transformers 32 wide with 2 layers, 512 positions. The tokenizer is a Llama-style
BPE (Metaspace ``▁`` pieces, byte fallback through ``<0x00>``..``<0xFF>``, BOS added) trained offline with
``tokenizers`` on :func:`counterfactory.models.tiny_common.caption_corpus` plus the phrases of the CounterCurate
prompts (so ``A``/``B`` answers are single tokens, like Llama's ``▁A``/``▁B``). Outputs carry no meaning.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from .tiny_common import _seed_all, caption_corpus

#: image side of the tiny VLM's vision tower (and of its image processor)
TINY_IMAGE_SIZE = 32
PATCH_SIZE = 8
#: ``<image>`` placeholder tokens per image (patches; the CLS token is dropped as in LLaVA-1.5)
IMAGE_TOKENS = (TINY_IMAGE_SIZE // PATCH_SIZE) ** 2
MAX_POSITIONS = 512
IMAGE_TOKEN = "<image>"

#: Vicuna-v1 conversation format of LLaVA-1.5 (``conv_templates["vicuna_v1"]``), written like the chat template
#: shipped with llava-hf/llava-1.5-*-hf: ``"<system> USER: <image>\n<question> ASSISTANT:"``; a system message is
#: rendered without a role prefix; assistant turns end with the EOS token (``</s>``) as in LLaVA's training data.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for c in message['content'] if c['type'] == 'image' %}{{ '<image>\n' }}{% endfor %}"
    "{% for c in message['content'] if c['type'] == 'text' %}{{ c['text'] + ' ' }}{% endfor %}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# phrases of the prompts the study renders (vlm.py), so the tiny vocabulary holds them as whole pieces
_PROMPT_PHRASES = [
    "A chat between a curious human and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the human's questions.",
    "USER: Which of the following captions best describes the image?",
    "A. B. Answer with the option's letter from the given choices directly. ASSISTANT: A ASSISTANT: B",
    "Provide a one-sentence caption for the provided image.",
    "There are 2 dogs. There are 3 cats. is above is below is to the left of is to the right of",
]


def llama_style_tokenizer(seed: int = 0, vocab_size: int = 1500):
    """A ``LlamaTokenizer`` (BPE over ``▁``-pieces with byte fallback) trained offline, with ``<pad>`` and the
    ``<image>`` token (``tokenizer.image_token``) added as special tokens, BOS prepended."""
    from tokenizers import SentencePieceBPETokenizer
    from transformers import LlamaTokenizer

    corpus = caption_corpus(seed=seed + 3) + _PROMPT_PHRASES * 8
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    bpe = SentencePieceBPETokenizer(add_prefix_space=True)
    bpe.train_from_iterator(corpus, vocab_size=vocab_size, min_frequency=2,
                            special_tokens=["<unk>", "<s>", "</s>", *byte_tokens],
                            initial_alphabet=list(string.ascii_letters + string.digits + string.punctuation))
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return LlamaTokenizer(vocab=model["vocab"], merges=merges, add_bos_token=True, add_eos_token=False,
                          model_max_length=MAX_POSITIONS, pad_token="<pad>",
                          extra_special_tokens={"image_token": IMAGE_TOKEN})


def build_vlm(out: Path, seed: int = 0) -> None:
    """Tiny ``LlavaForConditionalGeneration`` + ``LlavaProcessor`` (the classes of llava-hf/llava-1.5-7b-hf)."""
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    tok = llama_style_tokenizer(seed)
    image_token_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    image_processor = CLIPImageProcessor(size={"shortest_edge": TINY_IMAGE_SIZE},
                                         crop_size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=PATCH_SIZE,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=CHAT_TEMPLATE, image_token=IMAGE_TOKEN)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=TINY_IMAGE_SIZE, patch_size=PATCH_SIZE, projection_dim=32)
    text = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
                       pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token_id,
                         image_seq_length=IMAGE_TOKENS, vision_feature_select_strategy="default",
                         vision_feature_layer=-2, pad_token_id=tok.pad_token_id)
    _seed_all(seed)
    model = LlavaForConditionalGeneration(config)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


BUILDERS = {"vlm": build_vlm}
