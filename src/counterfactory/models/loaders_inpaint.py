"""Loader of the ``inpaint`` role (spurious-correlation retrieval study §3.1, object removal): LaMa through
lama-cleaner, registered with :func:`counterfactory.models.base.register_loader`.

:func:`load_lama` puts the local ``big-lama.pt`` path into ``LAMA_MODEL_URL`` before importing
``lama_cleaner.model.lama`` (the module reads it at import time; a local path skips the download and the md5
check) and, as the module may have been imported before, also sets the module constant ``LAMA_MODEL_URL``
(``LaMa.init_model`` reads it when called) while ``LaMa(device)`` is built; the environment and the constant
are restored afterwards. lama-cleaner's load-error handler deletes a model file whose md5 is not the official
one and calls ``exit``; it is replaced by one that raises while the model loads, so a damaged or tiny model
file is never deleted. lama-cleaner's loguru messages (two INFO lines per image) are disabled.

A TorchScript file is a program, not only weights (``torch.jit.load`` runs its code), so before loading
:func:`verify_lama` checks it: the official ``big-lama.pt`` (lama-cleaner's md5 :data:`LAMA_OFFICIAL_MD5`) or a
tiny stand-in whose ``counterfactory-manifest.json`` (written by ``counterfactory models build-tiny``) lists it
with its sha256; anything else is refused (docs/models.md#files-that-can-run-code).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .base import ModelSpec, register_loader
from .identity import MANIFEST_NAME, verify_folder

#: file name of the big-lama TorchScript model inside a model folder (as lama-cleaner downloads it)
LAMA_FILE = "big-lama.pt"
_LAMA_LOCK = threading.Lock()


def _quiet_lama_cleaner() -> None:
    """Silence lama-cleaner's per-image loguru messages and its import-time deprecation warnings
    (``imghdr``, pydantic v1-style ``class Config``)."""
    with contextlib.suppress(ImportError):
        from loguru import logger

        logger.disable("lama_cleaner")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        import lama_cleaner.helper  # noqa: F401
        import lama_cleaner.schema  # noqa: F401
        with contextlib.suppress(ImportError):
            import lama_cleaner.parse_args  # noqa: F401  (imports imghdr; pulled in by lama_cleaner.model)


def _raise_load_error(model_path, model_md5, exc):
    """Replacement of ``lama_cleaner.helper.handle_error`` (which deletes the file and exits)."""
    raise ModelLoadError(f"lama-cleaner could not load the TorchScript model {model_path}: {exc}. Fix: point "
                         f"models.inpaint.source at a complete big-lama.pt (torch.jit.save format) or its folder")


def lama_file(source: str | os.PathLike) -> Path:
    """The TorchScript file of an ``inpaint`` source: ``source/big-lama.pt`` for a folder, else ``source``."""
    path = Path(os.path.expanduser(os.fspath(source)))
    file = path / LAMA_FILE if path.is_dir() else path
    if not file.is_file():
        raise ModelLoadError(
            f"role 'inpaint' (lama_cleaner): {file} does not exist. Fix: put big-lama.pt there (download "
            f"https://github.com/Sanster/models/releases/download/add_big_lama/big-lama.pt) or build the tiny "
            f"stand-in (`counterfactory models build-tiny --config <config> --role inpaint`)")
    return file


#: md5 of the official big-lama.pt (lama_cleaner.model.lama.LAMA_MODEL_MD5, the release the paper's tool uses)
LAMA_OFFICIAL_MD5 = "e3aa4aaa15225a33ec84f9f4bc47e500"


def verify_lama(file: str | os.PathLike) -> str:
    """How the TorchScript ``file`` is trusted: ``"official"`` (its md5 is :data:`LAMA_OFFICIAL_MD5`) or
    ``"manifest"`` (its folder's build-tiny manifest lists it and every file matches); else
    :class:`ModelLoadError` (nothing is loaded: TorchScript can run code)."""
    import hashlib

    file = Path(file)
    md5 = hashlib.md5()
    with open(file, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            md5.update(chunk)
    if md5.hexdigest() == LAMA_OFFICIAL_MD5:
        return "official"
    manifest = file.parent / MANIFEST_NAME
    if manifest.is_file():
        method, problems = verify_folder(file.parent)
        if not problems:
            return "manifest"
        raise ModelLoadError(
            f"role 'inpaint' (lama_cleaner): {file} is not what {manifest} lists ({problems[0]['path']}: "
            f"{problems[0]['problem']}); a TorchScript file can run code, so it is not loaded. Fix: rebuild it "
            "(`counterfactory models build-tiny --config <config> --role inpaint`) or use the official big-lama.pt")
    raise ModelLoadError(
        f"role 'inpaint' (lama_cleaner): {file} has md5 {md5.hexdigest()}, not the official big-lama.pt's "
        f"{LAMA_OFFICIAL_MD5}, and no counterfactory manifest vouches for it; a TorchScript file can run code, so "
        "it is not loaded. Fix: download https://github.com/Sanster/models/releases/download/add_big_lama/"
        "big-lama.pt, or build the tiny stand-in (`counterfactory models build-tiny --config <config> --role "
        "inpaint`)")


def load_lama(source: str | os.PathLike, device: Any = "auto"):
    """lama-cleaner's ``LaMa`` model on the local TorchScript file ``source`` (a ``.pt`` file or a folder
    holding ``big-lama.pt``), on ``device`` (a config value for :func:`~counterfactory.device.resolve_device`
    or a ``torch.device``). See the module docstring for how ``LAMA_MODEL_URL`` is set. The returned object
    has ``.model`` (the TorchScript module), ``.device`` and ``counterfactory_file`` (the file loaded)."""
    import torch

    from ..device import resolve_device

    file = lama_file(source).resolve()
    verify_lama(file)
    dev = device if isinstance(device, torch.device) else resolve_device(str(device))
    _quiet_lama_cleaner()
    with _LAMA_LOCK:
        before = os.environ.get("LAMA_MODEL_URL")
        os.environ["LAMA_MODEL_URL"] = str(file)
        try:
            import lama_cleaner.helper as helper
            import lama_cleaner.model.lama as lama_module  # reads LAMA_MODEL_URL at its first import
        finally:
            if before is None:
                os.environ.pop("LAMA_MODEL_URL", None)
            else:
                os.environ["LAMA_MODEL_URL"] = before
        old_url, old_handler = lama_module.LAMA_MODEL_URL, helper.handle_error
        lama_module.LAMA_MODEL_URL = str(file)  # imported earlier: init_model reads the constant when called
        helper.handle_error = _raise_load_error
        try:
            with warnings.catch_warnings():  # torch.jit.load's deprecation notice (lama-cleaner's format)
                warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")
                model = lama_module.LaMa(dev)
        except SystemExit as exc:  # lama-cleaner calls exit() on load problems
            raise ModelLoadError(f"lama-cleaner gave up loading {file} (exit {exc.code}). Fix: check the file") from exc
        finally:
            lama_module.LAMA_MODEL_URL, helper.handle_error = old_url, old_handler
    model.counterfactory_file = file
    return model


@register_loader("inpaint:lama_cleaner")
def _load_inpaint_lama(spec: ModelSpec, kw: dict):
    """lama-cleaner's ``LaMa`` on the big-lama TorchScript file: ``source`` is a local folder holding
    ``big-lama.pt`` (the tiny stand-in's layout) or the ``.pt`` file itself (spurious-correlation study
    §3.1, object removal). See :func:`load_lama`."""
    if not spec.is_local:
        raise ModelLoadError(
            f"role '{spec.role}' (lama_cleaner): source {spec.source!r} is not a local path. Fix: download "
            f"big-lama.pt (https://github.com/Sanster/models/releases/download/add_big_lama/big-lama.pt) and set "
            f"models.{spec.role}.source to the file or its folder, so the model is identified by content")
    return load_lama(spec.local_path, device=kw.get("device", "auto"))
