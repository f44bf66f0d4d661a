"""Command-line entry point: ``counterfactory <subcommand> [options]``.

Each module in :mod:`counterfactory.commands` registers one or more subcommands.

Exit status: 0 success; 2 a user-facing error — a :class:`CounterFactoryError` or an :class:`OSError`
(disk full, read-only, permission denied, a folder where a file belongs, a missing input), printed as
one line naming the path and the fix (the traceback follows only with ``-v``; every ``--out``/``--out-*`` path
is checked before the step starts: ``commands.check_output_paths``); 130 interrupted
(Ctrl-C: one line ``interrupted``, no traceback). Atomic writers leave no half-written outputs.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import logging
import os
import pkgutil
import re
import sys

from . import __version__, commands
from .errors import CounterFactoryError, os_error_message


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command`` (the first word of the command line) only the module of that name registers
    its subcommands when it has them (a job then imports only what its step needs), otherwise every module."""
    parser = argparse.ArgumentParser(
        prog="counterfactory",
        description="Generate counterfactual image-text data and evaluate vision-language models with it.",
    )
    parser.add_argument("--version", action="version", version=f"counterfactory {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    sub.required = True
    names = sorted(info.name for info in pkgutil.iter_modules(commands.__path__))
    if command in names:
        importlib.import_module(f"{commands.__name__}.{command}").register(sub)
        if command in sub.choices:
            return _for_terminal(parser)
    for name in names:
        if name != command:
            importlib.import_module(f"{commands.__name__}.{name}").register(sub)
    return _for_terminal(parser)


class _HideFormerSpellings:
    """Help-formatter mix-in: an option's former spellings (``commands.add_renamed``) still parse but are not
    listed in ``--help``."""

    def _format_action_invocation(self, action):
        hidden = getattr(action, "deprecated_spellings", ())
        if hidden:
            action = copy.copy(action)
            action.option_strings = [s for s in action.option_strings if s not in hidden]
        return super()._format_action_invocation(action)


def _for_terminal(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every parser of the tree: descriptions and help without Sphinx markup (``commands.cli_text``), and a help
    formatter that hides former option spellings."""
    seen: set[int] = set()
    stack = [parser]
    while stack:
        p = stack.pop()
        if id(p) in seen:
            continue
        seen.add(id(p))
        p.description = commands.cli_text(p.description)
        if not issubclass(p.formatter_class, _HideFormerSpellings):
            p.formatter_class = type(p.formatter_class.__name__, (_HideFormerSpellings, p.formatter_class), {})
        for action in p._actions:
            action.help = commands.cli_text(action.help)
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    choice.help = commands.cli_text(choice.help)
                stack.extend(action.choices.values())
    return parser


def _command_word(argv: list[str]) -> str | None:
    """The first word that is not an option (the subcommand), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_word(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    prefix = f"counterfactory {args.command}"
    outputs = commands.output_options(parser, args)
    try:
        commands.check_output_paths(outputs)   # before any work starts
        rc = args.func(args)
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr)
        return 130
    except CounterFactoryError as exc:
        _traceback(args)
        print(f"{prefix}: error: {exc}", file=sys.stderr)
        return 2
    except LookupError as exc:   # NLTK's multi-line message for missing data: one line with the command
        from .data.nltk_data import is_nltk_lookup_error, missing_data_error

        if not is_nltk_lookup_error(exc):
            raise
        _traceback(args)
        print(f"{prefix}: error: {missing_data_error(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        _traceback(args)
        print(f"{prefix}: error: {os_error_message(exc, outputs=[path for _, path, _ in outputs])}", file=sys.stderr)
        return 2
    except Exception as exc:
        wrapped = wrapped_os_error(exc)
        if wrapped is None:
            raise
        _traceback(args)
        print(f"{prefix}: error: {os_error_message(wrapped, outputs=[path for _, path, _ in outputs])}",
              file=sys.stderr)
        return 2
    return int(rc or 0)


#: errno of an OS error that a library reports in its own exception's text (safetensors' Rust writer: "No space
#: left on device (os error 28)")
_OS_ERROR_TEXT = re.compile(r"\(os error (\d+)\)")


def wrapped_os_error(exc: Exception) -> OSError | None:
    """The :class:`OSError` inside a library exception that carries one only as text (safetensors'
    ``SafetensorError`` on a full disk), so it gets the same one-line message and fix; else None."""
    import errno

    if type(exc).__name__ != "SafetensorError":
        return None
    m = _OS_ERROR_TEXT.search(str(exc))
    if not m:
        return None
    code = int(m.group(1))
    return OSError(code, os.strerror(code) if code in errno.errorcode else str(exc))


def _traceback(args) -> None:
    if getattr(args, "verbose", False):
        import traceback

        traceback.print_exc(file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
