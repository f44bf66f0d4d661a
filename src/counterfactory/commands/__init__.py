"""CLI subcommands. Every module in this package defines ``register(subparsers)``;
``counterfactory.cli`` imports them (only the one a command line names, when it can), so adding a stage never
edits a shared file. A module is named like the group it registers: ``commands/<group>.py`` holds
``counterfactory <group> <step>``, which the workflow's rule ``<group>_<step>`` runs (tests/test_names.py)."""

import argparse
import re


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
    add_progress_option(parser)


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--no-progress``: the one spelling of the progress switch (bars are on by default; the workflow's jobs
    pass it so that their logs stay readable)."""
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def add_renamed(parser: argparse.ArgumentParser, flag: str, *old: str, **kwargs) -> argparse.Action:
    """Add option ``flag`` that still accepts its former spellings ``old`` (``--requests-out`` for
    ``--out-requests``); ``--help`` shows only ``flag`` (see ``counterfactory.cli``)."""
    action = parser.add_argument(flag, *old, **kwargs)
    action.deprecated_spellings = tuple(old)
    return action


_ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|attr|data|exc|obj|ref|doc):`~?([^`<]*?)(?:\s*<[^>]*>)?`")


def cli_text(text: str | None) -> str | None:
    """Help or description text for the terminal: Sphinx roles (``:mod:`x```, ``:func:`~a.b```) become their
    target's name (the last part after ``~``) and double backquotes are dropped."""
    if not text:
        return text

    def role(match: re.Match) -> str:
        target = match.group(1).strip()
        return target.rsplit(".", 1)[-1] if match.group(0).count("~") else target

    return _ROLE.sub(role, text).replace("``", "")
