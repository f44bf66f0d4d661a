"""The names SocialCounterfactuals' debiasing runs and tables share (§5): a run's experiment is
``"<model role>:<segment>"``, its mixture ``pretrained`` or ``debiased``, a segment reads as Table 2 writes it.
Kept apart from :mod:`.debias` and :mod:`.debias_tables` so that the task evaluation, the probe report and the
filter table can use them without importing the training code (no import cycle)."""

from __future__ import annotations

PRETRAINED = "pretrained"
DEBIASED = "debiased"
ATTRIBUTE_LABELS = {"physical": "Physical Char.", "race": "Race", "gender": "Gender"}


def experiment_name(role: str, segment: str) -> str:
    """The runs table's experiment of one (model role, segment): ``"<role>:<segment>"``."""
    return f"{role}:{segment}"


def parse_experiment(name: str) -> tuple[str, str]:
    role, sep, segment = str(name).rpartition(":")
    if not sep or not role or not segment:
        raise ValueError(f"experiment {name!r} is not '<role>:<segment>'")
    return role, segment


def segment_label(segment: str) -> str:
    """``race_gender`` (or ``race-gender``) -> ``(Race, Gender)`` (Table 2's row names)."""
    parts = str(segment).replace("-", "_").split("_")
    return "(" + ", ".join(ATTRIBUTE_LABELS.get(p, p.capitalize()) for p in parts) + ")"
