"""CLI subcommands. Every module in this package defines ``register(subparsers)``;
``counterfactory.cli`` imports them all, so adding a stage never edits a shared file."""

import argparse


def shard_id(text: str) -> int:
    """argparse type of ``--shard``: a non-negative integer (``00003`` as the rules write it)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"shard must be a non-negative integer such as 00003, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("shard must be >= 0")
    return value


def positive_int(text: str) -> int:
    """argparse type of counts such as ``--threads``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value
