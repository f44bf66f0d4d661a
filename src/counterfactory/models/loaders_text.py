"""Loader of the text-classifier role, registered with :func:`counterfactory.models.base.register_loader`.

* ``lic_bert`` (transformers): ``(AutoModelForSequenceClassification with 2 labels, AutoTokenizer)`` -- the model
  CVLD's Table 4 LIC fine-tunes as Hirota et al.'s (CVPR 2022, §4) BERT leakage classifier
  (:mod:`counterfactory.training.text_classifier`; paper: ``bert-base-uncased``, whose new classification head is
  initialised from torch's RNG), never ``trust_remote_code``.
"""

from __future__ import annotations

from .base import ModelSpec, _hf_kwargs, _src, register_loader


def load_classifier(path_or_id, *, revision: str | None = None):
    """``(AutoModelForSequenceClassification with 2 labels, AutoTokenizer)`` of ``path_or_id``; a checkpoint without
    a classification head (``bert-base-uncased``) gets a new one, initialised from torch's global RNG (seed it, or
    use :func:`counterfactory.training.text_classifier.train_and_predict`, which does)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    kw = {"revision": revision} if revision else {}
    tokenizer = AutoTokenizer.from_pretrained(str(path_or_id), **kw)
    model = AutoModelForSequenceClassification.from_pretrained(str(path_or_id), num_labels=2, **kw)
    return model, tokenizer


@register_loader("lic_bert:transformers")
def load_lic_bert(spec: ModelSpec, kw: dict):
    """``(model, tokenizer)`` of the ``lic_bert`` role, a fresh 2-label sequence classifier."""
    return load_classifier(_src(spec), revision=_hf_kwargs(spec).get("revision"))
