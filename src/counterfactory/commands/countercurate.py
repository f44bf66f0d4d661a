"""``counterfactory countercurate``: the CounterCurate steps (Flickr30k-Positions, -Counting, -Attributes,
grounded generation, benchmarks, the generative VLM). Each step module of
:mod:`counterfactory.studies.countercurate` adds its own subcommands with ``add_cli(subparsers)``."""

from __future__ import annotations

import importlib


def register(sub) -> None:
    from ..studies import countercurate as study

    p = sub.add_parser("countercurate", help="CounterCurate: positions, counting, attributes, grounded generation, "
                       "benchmarks", description=__doc__)
    s = p.add_subparsers(dest="countercurate_command", metavar="<step>")
    s.required = True
    for name in study.CLI_MODULES:
        try:
            module = importlib.import_module(f"{study.__name__}.{name}")
        except ModuleNotFoundError as exc:  # a step being built: its module does not exist yet
            if exc.name != f"{study.__name__}.{name}":
                raise
            continue
        module.add_cli(s)
