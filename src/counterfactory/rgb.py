"""The one way every step turns an image into 8-bit RGB (:func:`to_rgb`, :func:`open_rgb`).

PIL's ``convert("RGB")`` clips the 16- and 32-bit integer modes (``I;16``, ``I;16B``, ``I``: 16-bit grayscale PNGs,
scientific TIFFs) to 255, so such an image turns almost white (COCO-style 16-bit PNGs: 99.8 % of the pixels at
255). Here integer images are scaled from their bit depth to 0..255 (16-bit: ``v / 257``, rounded; a mode ``I``
image whose values fit in 8 bits is kept as it is), then made RGB. A float image (``F``), whose range is unknown,
is refused naming the file. Every other mode (``L``, ``P``, ``RGBA``, ``CMYK``, ``1``, ...) is PIL's conversion.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import input_error

#: modes PIL reads high-bit-depth integer images in
HIGH_BIT_MODES = {"I;16", "I;16B", "I;16L", "I;16N", "I"}


def to_rgb(image, source: str | os.PathLike | None = None):
    """``image`` (a PIL image) as a new, loaded 8-bit RGB image (module docstring; also for an RGB image, as
    ``convert("RGB")`` gives, so it outlives the file it was opened from); ``source``: the file it came from, named
    in the error for a float image."""
    import numpy as np
    from PIL import Image

    if image.mode in HIGH_BIT_MODES:
        arr = np.asarray(image).astype(np.int64)
        top = int(arr.max()) if arr.size else 0
        if image.mode != "I" or top > 255:
            if top > 65535 or int(arr.min(initial=0)) < 0:      # 32-bit data: scale by its own range
                lo = int(arr.min())
                arr = (arr - lo) * 255.0 / max(1, top - lo)
            else:
                arr = arr / 257.0
        gray = Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), mode="L")
        return gray.convert("RGB")
    if image.mode in ("F", "I;32", "I;32B"):
        raise input_error(Path(source) if source is not None else "image", None,
                          f"a {image.mode} (floating-point / 32-bit) image has no fixed range to make 8-bit RGB",
                          "convert it to an 8- or 16-bit PNG or a JPEG first")
    return image.convert("RGB")


def open_rgb(path: str | os.PathLike):
    """The image file ``path`` as a loaded 8-bit RGB PIL image (:func:`to_rgb`)."""
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        return to_rgb(im, path)


__all__ = ["HIGH_BIT_MODES", "open_rgb", "to_rgb"]
