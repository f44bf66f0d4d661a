"""``counterfactory social``: the SocialCounterfactuals steps (caption sets, filters, bias probing,
debiasing, release). Each step module of :mod:`counterfactory.studies.social_counterfactuals` adds its own
subcommands with ``add_cli(subparsers)``."""

from __future__ import annotations

import importlib


def register(sub) -> None:
    from ..studies import social_counterfactuals as study

    p = sub.add_parser("social", help="SocialCounterfactuals: caption sets, filters, bias probing, debiasing",
                       description=__doc__)
    s = p.add_subparsers(dest="social_command", metavar="<step>")
    s.required = True
    for name in study.CLI_MODULES:
        importlib.import_module(f"{study.__name__}.{name}").add_cli(s)
