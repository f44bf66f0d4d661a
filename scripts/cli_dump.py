"""Dump the whole command-line interface as JSON: every subcommand, its help and description, and every option
(flags, dest, type, default, required, choices, metavar, nargs, action, const, help, former spellings, mutually
exclusive groups), plus the handler each leaf runs. Used to prove a refactor of ``commands/`` keeps the CLI
identical: dump before, dump after, diff.

    python scripts/cli_dump.py > before.json   # ... change commands/ ...
    python scripts/cli_dump.py > after.json && diff before.json after.json

``--module NAME`` dumps only the subcommands that module registers.
"""

from __future__ import annotations

import argparse
import json
import sys

from counterfactory import cli


def _value(v):
    if callable(v):
        return f"<callable {getattr(v, '__module__', '?')}.{getattr(v, '__qualname__', repr(v))}>"
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _value(x) for k, x in v.items()}
    if v is argparse.SUPPRESS:
        return "SUPPRESS"
    return v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)


def _parser(p: argparse.ArgumentParser) -> dict:
    out = {"description": p.description, "options": [], "groups": [], "defaults": {}, "subcommands": {}}
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            out["subcommand_dest"] = action.dest
            out["subcommand_required"] = action.required
            out["subcommand_metavar"] = action.metavar
            seen = {}
            for name, child in action.choices.items():
                if id(child) in seen:   # an alias
                    out["subcommands"][seen[id(child)]].setdefault("aliases", []).append(name)
                    continue
                seen[id(child)] = name
                out["subcommands"][name] = {"help": helps.get(name), **_parser(child)}
            continue
        out["options"].append({
            "flags": list(action.option_strings), "dest": action.dest, "class": type(action).__name__,
            "type": _value(action.type), "default": _value(action.default), "required": action.required,
            "choices": _value(action.choices), "metavar": _value(action.metavar), "nargs": action.nargs,
            "const": _value(action.const), "help": action.help,
            "former": list(getattr(action, "deprecated_spellings", ())),
        })
    for group in p._mutually_exclusive_groups:
        out["groups"].append({"required": group.required, "dests": [a.dest for a in group._group_actions]})
    out["defaults"] = {k: _value(v) for k, v in sorted(p._defaults.items())}
    return out


def dump(module: str | None = None) -> dict:
    parser = cli.build_parser(module)
    tree = _parser(parser)
    if module is not None:
        from counterfactory import commands
        import importlib

        root = argparse.ArgumentParser()
        sub = root.add_subparsers(dest="command")
        importlib.import_module(f"{commands.__name__}.{module}").register(sub)
        names = set(sub.choices)
        tree["subcommands"] = {k: v for k, v in tree["subcommands"].items() if k in names}
    return tree


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", help="only the subcommands of commands/<module>.py")
    args = ap.parse_args(argv)
    json.dump(dump(args.module), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
