"""Command-line entry point: ``counterfactory <subcommand> [options]``.

Each module in :mod:`counterfactory.commands` registers one or more subcommands.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from . import __version__, commands
from .errors import CounterFactoryError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="counterfactory",
        description="Generate counterfactual image-text data and evaluate vision-language models with it.",
    )
    parser.add_argument("--version", action="version", version=f"counterfactory {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        rc = args.func(args)
    except CounterFactoryError as exc:
        print(f"counterfactory {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
