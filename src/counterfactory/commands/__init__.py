"""CLI subcommands. Every module in this package defines ``register(subparsers)``;
``counterfactory.cli`` imports them (only the one a command line names, when it can), so adding a stage never
edits a shared file. A module is named like the group it registers: ``commands/<group>.py`` holds
``counterfactory <group> <step>``, which the workflow's rule ``<group>_<step>`` runs (tests/test_names.py)."""

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


def key_values(items, option: str, form: str) -> list[tuple[str, str]]:
    """``KEY=VALUE`` command-line items (a repeatable option) as ``(key, value)`` pairs, in order; an item without
    a key, an ``=`` or a value is a :class:`~counterfactory.errors.ConfigError` naming the option and the ``form``
    expected (e.g. ``BENCHMARK=PATH``)."""
    from ..errors import ConfigError

    out = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"{option} {item!r}: expected {form}")
        out.append((key, value))
    return out


def add_config_option(parser: argparse.ArgumentParser,
                      help: str = "configuration file (repeatable; later files win)") -> None:
    """``--config YAML`` (required, repeatable; later files win): how a study step gets its configuration;
    ``help`` may say which sections the step reads."""
    parser.add_argument("--config", action="append", required=True, metavar="YAML", help=help)


def add_shard_job_options(parser: argparse.ArgumentParser, input_flag: str, input_metavar: str,
                          input_help: str) -> None:
    """The options every sharded generation job shares, in this order: ``--config`` (repeatable), its input
    table ``input_flag``, ``--shard``, ``--out-dir``, ``--threads`` and ``--no-progress``."""
    add_config_option(parser)
    parser.add_argument(input_flag, required=True, metavar=input_metavar, help=input_help)
    parser.add_argument("--shard", required=True, type=shard_id, metavar="N", help="shard number, e.g. 00003")
    parser.add_argument("--out-dir", required=True, metavar="DIR", help="the shard's output folder")
    parser.add_argument("--threads", type=positive_int, default=None, help="CPU threads for torch (default: torch's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
