"""Counting rules shared by every split and sample: ``fraction × n`` rounded half up, without float noise.

They sit in the data layer because readers (own data's Karpathy view), training mixtures and study splits
(SocialCounterfactuals' withheld occupations) all draw the same counts.
"""

from __future__ import annotations

import math


def exact(x: float) -> float:
    """``fraction * n`` without float noise (0.2 * 17410 = 3482.0000000000005)."""
    return round(x, 9)


def round_half_up(x: float) -> int:
    return int(math.floor(exact(x) + 0.5))
