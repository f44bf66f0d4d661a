"""Model roles: every model the workflow uses is a *role* in config (``models.<role>.source``),
loaded through its library's own loader. See :mod:`counterfactory.models.registry`."""

from .registry import ModelSpec, load, loaded_models, model_spec

__all__ = ["ModelSpec", "load", "loaded_models", "model_spec"]
