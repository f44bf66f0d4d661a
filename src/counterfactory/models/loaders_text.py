"""Loader of the text-classifier role, registered with :func:`counterfactory.models.registry.register_loader`.

* ``lic_bert`` (transformers): ``(AutoModelForSequenceClassification with 2 labels, AutoTokenizer)`` -- the model
  CVLD's Table 4 LIC fine-tunes as Hirota et al.'s (CVPR 2022, §4) BERT leakage classifier
  (:mod:`counterfactory.training.text_classifier`; paper: ``bert-base-uncased``, whose new classification head is
  initialised from torch's RNG), never ``trust_remote_code``.
"""

from __future__ import annotations

from .registry import ModelSpec, _hf_kwargs, _src, register_loader


@register_loader("lic_bert:transformers")
def load_lic_bert(spec: ModelSpec, kw: dict):
    """``(model, tokenizer)`` of the ``lic_bert`` role, a fresh 2-label sequence classifier."""
    from ..training.text_classifier import load_classifier

    return load_classifier(_src(spec), revision=_hf_kwargs(spec).get("revision"))
