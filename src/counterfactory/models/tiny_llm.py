"""Tiny stand-in for the ``llm`` role (CounterCurate §3.2/app. B and §3.4/app. A: GPT-4(V)'s role).

The paper's closed models are replaced by a local instruction-tuned causal LM (e.g. a Qwen2-Instruct
checkpoint). The stand-in has the same classes: a randomly initialised ``Qwen2ForCausalLM`` (2 layers, 64
wide, fixed seed) with a ``Qwen2Tokenizer`` -- a byte-level BPE trained offline with ``tokenizers`` -- and a
ChatML chat template (``<|im_start|>role ... <|im_end|>``), saved with ``save_pretrained`` (safetensors) so
the ``llm`` loader (:mod:`counterfactory.models.loaders_llm`) reads it back by path like a hub model.

The tokenizer is trained on caption-like sentences, JSON answers of the kinds the ``llm`` tasks ask for and
the package's own prompt texts (so prompts stay short in tokens). Being byte-level, every character --
JSON punctuation, quotes, digits, ``null`` -- can be produced; frequent pieces (``{"``, ``": "``, digits)
are single tokens. Its answers are random text forced into the requested JSON schema by constrained
decoding (:mod:`counterfactory.text.llm`); they say nothing about what the paper found.
"""

from __future__ import annotations

import json
import random
import tempfile
from importlib import resources
from pathlib import Path

from .tiny_common import _seed_all, _train_byte_bpe, _vocab_and_merges, caption_corpus

#: ChatML special tokens (as Qwen2-Instruct); ``<|endoftext|>`` is the padding token
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: ChatML template (string contents; list contents -- multimodal messages -- contribute their text parts)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
VOCAB_SIZE = 2000


def _json_corpus(captions: list[str], seed: int) -> list[str]:
    """JSON answers shaped like the ``llm`` tasks' answers (keys, ids, nulls, nested quotes)."""
    rng = random.Random(seed)
    out = []
    for i, cap in enumerate(captions):
        words = cap.rstrip(".").split()
        a, b = " ".join(words[:3]), " ".join(words[-3:])
        ident = str(rng.randint(0, 300000))
        out.append(json.dumps({"entity_id": ident, "changed_from": a, "changed_to": b, "negative": cap}))
        out.append(json.dumps({"entity_a": ident, "entity_b": str(rng.randint(0, 999)), "negative": cap}))
        out.append(json.dumps({"entity_a": None, "entity_b": None, "negative": None}))
        out.append(json.dumps({"rewrite": cap}, indent=i % 3 or None))
        out.append(f"[/EN#{ident}/people {a}] and [/EN#{rng.randint(0, 99)}/other {b}] {rng.random():.3f}")
    return out


def _prompt_corpus() -> list[str]:
    folder = resources.files("counterfactory.resources").joinpath("prompts")
    texts = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".txt"):
            texts.extend(line for line in entry.read_text(encoding="utf-8").splitlines() if line.strip())
    return texts


def tokenizer_corpus(seed: int = 0) -> list[str]:
    """Deterministic training text of the tiny tokenizer: captions, task-shaped JSON and the prompt texts."""
    captions = caption_corpus(n=3000, seed=seed + 3)
    return captions + _json_corpus(captions, seed) + _prompt_corpus() * 5


def build_llm(out: Path, seed: int = 0) -> None:
    """Tiny ``Qwen2ForCausalLM`` + ``Qwen2Tokenizer`` with a ChatML chat template (the class of Qwen2-Instruct)."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        _train_byte_bpe(tokenizer_corpus(seed), VOCAB_SIZE, [PAD, IM_START, IM_END], Path(tmp))
        tok = Qwen2Tokenizer(**_vocab_and_merges(Path(tmp)), unk_token=None, bos_token=None, eos_token=IM_END,
                             pad_token=PAD, model_max_length=4096, padding_side="left")
    tok.chat_template = CHAT_TEMPLATE
    _seed_all(seed)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids(IM_END), pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        do_sample=False, eos_token_id=[config.eos_token_id, tok.pad_token_id], pad_token_id=tok.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


BUILDERS = {"llm": build_llm}
