"""LLaVA-1.5 chat prompts and encoding, shared by every user of the ``vlm`` role (CounterCurate's scorer and
fine-tuning, :mod:`counterfactory.studies.countercurate.vlm`; the VQA check, :mod:`counterfactory.filters.vqa`).

:func:`render_prompt` writes one user turn (image + text) in the processor's chat template (llava-hf ships
LLaVA-1.5's ``USER: <image>\\n... ASSISTANT:``; a processor without one gets the Vicuna-v1 format written out);
:class:`Encoder` tokenises prompt + answer with the answer's tokens known exactly; :func:`collate` right-pads a
batch with an attention mask (positions stay those of the unpadded sequence, so a score does not depend on the
batch beyond float noise); :func:`next_token_logprobs` is the log-softmax over the vocabulary of the token after
each prompt, one forward pass per batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..errors import ConfigError, input_error

#: LLaVA-1.5's Vicuna-v1 system prompt (``conv_templates["vicuna_v1"]``)
VICUNA_SYSTEM = ("A chat between a curious human and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the human's questions.")
IGNORE = -100  # label of tokens without loss (prompt, padding)


def render_prompt(processor, text: str, system: str | None) -> str:
    """One user turn (image + ``text``) in the model's chat template, ending with the assistant cue.

    Uses the processor's chat template (llava-hf ships LLaVA-1.5's ``USER: <image>\\n... ASSISTANT:``); a
    processor without one gets the Vicuna-v1 format written out."""
    messages = []
    if system:
        messages.append({"role": "system", "content": [{"type": "text", "text": system}]})
    messages.append({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]})
    if getattr(processor, "chat_template", None):
        return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = getattr(processor, "image_token", "<image>")
    return f"{system + ' ' if system else ''}USER: {image}\n{text} ASSISTANT:"


@dataclass
class Encoded:
    """One tokenised sequence: prompt (image placeholders expanded) followed by ``answer_ids``."""

    input_ids: list[int]
    pixel_values: torch.Tensor
    n_prompt: int
    labels: list[int] = field(default_factory=list)


class Encoder:
    """Prompt + answer -> token ids of a LLaVA processor, with the answer's tokens known exactly.

    ``length_key`` is the config key of ``max_length`` named in the error of a too-long sequence."""

    def __init__(self, processor, max_length: int, length_key: str = "vlm.max_length"):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.max_length = int(max_length)
        self.length_key = length_key
        self._answers: dict[tuple[str, str], list[int]] = {}
        if self.tokenizer.pad_token_id is None and self.tokenizer.eos_token_id is None:
            raise ConfigError("vlm: the tokenizer has neither a pad nor an EOS token. Fix: use a LLaVA processor")

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    def answer_ids(self, prompt: str, answer: str) -> list[int]:
        """Token ids of ``" " + answer`` as they follow ``prompt`` (LLaVA's ``ASSISTANT: <answer>``): the tail of
        tokenising prompt + answer when the prompt's tokens are its prefix, else the answer tokenised alone."""
        key = (prompt, answer)
        if key not in self._answers:
            p = self.tokenizer(prompt).input_ids
            f = self.tokenizer(f"{prompt} {answer}").input_ids
            if len(f) > len(p) and f[:len(p)] == p:
                ids = f[len(p):]
            else:
                ids = self.tokenizer(f" {answer}", add_special_tokens=False).input_ids
            if not ids:
                raise ConfigError(f"vlm: the answer {answer!r} tokenises to nothing. Fix: use a non-empty answer")
            self._answers[key] = list(ids)
        return self._answers[key]

    def prompt(self, image, prompt: str) -> tuple[list[int], torch.Tensor]:
        enc = self.processor(text=[prompt], images=[image], return_tensors="pt")
        return enc["input_ids"][0].tolist(), enc["pixel_values"][0]

    def encode(self, image, prompt: str, answer: str | None, *, eos: bool, where: tuple = (None, None)) -> Encoded:
        """``prompt`` (+ ``answer`` (+ EOS)); labels hold -100 on every prompt token. ``where`` = (file, row)
        names the input in the error raised for sequences longer than ``max_length``."""
        ids, pixels = self.prompt(image, prompt)
        n_prompt = len(ids)
        answer_ids = self.answer_ids(prompt, answer) if answer is not None else []
        if eos and self.tokenizer.eos_token_id is not None:
            answer_ids = answer_ids + [int(self.tokenizer.eos_token_id)]
        full = ids + answer_ids
        if len(full) > self.max_length:
            raise input_error(where[0] or "<vlm input>", where[1],
                              f"the conversation is {len(full)} tokens, longer than {self.length_key} "
                              f"({self.max_length})", f"shorten the captions or raise {self.length_key} "
                              "(sequences are never truncated: the answer would be cut off)")
        return Encoded(full, pixels, n_prompt, [IGNORE] * n_prompt + answer_ids)


def collate(items: Sequence[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: ``input_ids``, ``attention_mask``, ``pixel_values``, ``labels`` (-100 on padding)."""
    width = max(len(e.input_ids) for e in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    labels = torch.full((len(items), width), IGNORE, dtype=torch.long)
    for i, e in enumerate(items):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids, dtype=torch.long)
        mask[i, :n] = 1
        labels[i, :n] = torch.tensor(e.labels, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": torch.stack([e.pixel_values for e in items]),
            "labels": labels}


@torch.no_grad()
def next_token_logprobs(model, items: Sequence[Encoded], pad_id: int, device, dtype) -> torch.Tensor:
    """``(len(items), vocab)`` float32 log-probabilities of the token after each item's prompt (``answer`` None
    when encoding), on the CPU; one forward pass of the right-padded batch."""
    batch = collate(items, pad_id)
    logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                   pixel_values=batch["pixel_values"].to(device, dtype=dtype)).logits
    last = torch.tensor([e.n_prompt - 1 for e in items], device=logits.device)
    rows = logits[torch.arange(len(items), device=logits.device), last].float()
    return torch.log_softmax(rows, dim=-1).cpu()
