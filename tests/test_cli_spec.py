"""A step's interface is declared once (issue 41 §3): ``commands.Step``/``Param`` declarations, argparse
subcommands generated from them (``commands.add_step``)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from counterfactory import cli, commands
from counterfactory.commands import CONFIG, OUT, Param, Step, add_step

COMMANDS = Path(commands.__file__).resolve().parent

#: command modules whose subcommands are generated from declarations: no parsing code of their own
CONVERTED = ("annotate", "verify", "filters", "social", "train", "report", "export", "release", "cvld", "models",
             "stats", "score", "analysis", "nltk", "countercurate", "images", "config", "plan", "provenance",
             "captions", "cluster", "data", "evaluate", "preflight", "spurious")
#: modules that declare steps another module's group holds (``images adaptive-curve``): no group of their own
PART_OF = {"adaptive": "images"}
#: command modules not in either list (a new module lands here until it is declared)
HAND_WRITTEN = tuple(sorted({p.stem for p in COMMANDS.glob("*.py")} - {"__init__", *CONVERTED, *PART_OF}))


def _parser(*steps: Step) -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="t")
    sub = root.add_subparsers(dest="command")
    sub.required = True
    for step in steps:
        add_step(sub, step)
    return root


def _run(args):
    return 0


DEMO = Step("demo", help="a demo group", description="a group", steps=(
    Step("go", help="go", description="runs", run=_run, aliases=("went",), params=(
        CONFIG,
        OUT.but(metavar="FILE.csv", help="the table"),
        Param("--n", type=int, default=3, help="a count"),
        Param("--mode", choices=("a", "b"), default="a", help="a mode"),
        Param("--out-md", former=("--markdown",), metavar="FILE.md", help="markdown"),
        commands.OneOf((Param("--x", help="x"), Param("--y", help="y")), required=True),
    )),))


def test_generated_flags_types_defaults_and_choices():
    root = _parser(DEMO)
    args = root.parse_args(["demo", "go", "--config", "a.yaml", "--config", "b.yaml", "--out", "o.csv", "--x", "1"])
    assert args.config == ["a.yaml", "b.yaml"] and args.out == "o.csv" and args.n == 3 and args.mode == "a"
    assert args.func is _run and args.demo_command == "go"
    assert root.parse_args(["demo", "go", "--config", "c", "--out", "o", "--n", "7", "--y", "2"]).n == 7
    go = root._subparsers._group_actions[0].choices["demo"]._subparsers._group_actions[0].choices["go"]
    actions = {a.dest: a for a in go._actions}
    assert actions["n"].type is int and actions["mode"].choices == ("a", "b")
    assert actions["out"].required and actions["out"].metavar == "FILE.csv" and actions["out"].help == "the table"
    assert actions["config"].required and actions["config"].metavar == "YAML"
    # a former spelling parses but is not shown
    assert root.parse_args(["demo", "went", "--config", "c", "--out", "o", "--markdown", "m", "--x", "1"]).out_md == "m"
    assert actions["out_md"].deprecated_spellings == ("--markdown",)
    # the shared declaration is not changed by a step's `but`
    assert OUT.help == "the file to write" and OUT.metavar == "FILE"


@pytest.mark.parametrize("argv, message", [
    (["demo", "go", "--out", "o", "--x", "1"], "the following arguments are required: --config"),
    (["demo", "go", "--config", "c", "--out", "o"], "one of the arguments --x --y is required"),
    (["demo", "go", "--config", "c", "--out", "o", "--x", "1", "--y", "2"], "not allowed with argument"),
    (["demo", "go", "--config", "c", "--out", "o", "--x", "1", "--mode", "z"], "invalid choice: 'z'"),
    (["demo", "go", "--config", "c", "--out", "o", "--x", "1", "--n", "many"], "invalid int value"),
])
def test_generated_parser_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        _parser(DEMO).parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_shard_options_of_a_real_step_come_from_the_declaration():
    args = cli.build_parser("verify").parse_args(["verify", "vqa", "--config", "c.yaml", "--pairs", "p.parquet",
                                                   "--shard", "00003", "--out", "o.parquet"])
    assert args.shard == 3 and args.no_progress is False and args.func.__name__ == "_vqa"
    with pytest.raises(SystemExit):
        cli.build_parser("verify").parse_args(["verify", "vqa", "--config", "c", "--pairs", "p", "--shard", "-1",
                                               "--out", "o"])


def _calls(module: str) -> list[str]:
    tree = ast.parse((COMMANDS / f"{module}.py").read_text(encoding="utf-8"))
    banned = {"add_argument", "add_parser", "add_subparsers", "add_mutually_exclusive_group", "add_argument_group",
              "set_defaults"}
    return [f"{module}.py:{node.lineno} {node.func.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in banned]


@pytest.mark.parametrize("module", [*CONVERTED, *PART_OF])
def test_converted_modules_hold_no_parsing_code(module):
    assert not _calls(module)


@pytest.mark.parametrize("module", CONVERTED)
def test_converted_modules_register_their_declarations(module):
    """Every subcommand a converted module registers is generated from one of its declared Steps."""
    import importlib

    mod = importlib.import_module(f"counterfactory.commands.{module}")
    declared = [v for v in vars(mod).values() if isinstance(v, Step)]
    top = cli.build_parser(module)._subparsers._group_actions[0]
    group = next(s for s in declared if s.name == module)
    assert module in top.choices

    def check(step: Step, parser: argparse.ArgumentParser):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if step.steps:
            [sub] = subs
            assert {a.dest for a in sub._choices_actions} == {s.name for s in step.steps}
            for child in step.steps:
                check(child, sub.choices[child.name])
        else:
            assert not subs and parser.get_default("func") is step.run
            flags = {f for p in step.params for f in getattr(p, "flags", ())}
            assert flags <= {s for a in parser._actions for s in (a.option_strings or [a.dest])}

    check(group, top.choices[module])


def test_every_command_module_is_declared():
    """No command module is left hand-written: each is in CONVERTED (or PART_OF), so the two tests above hold for
    every module of ``commands/``, a new one included."""
    assert HAND_WRITTEN == ()


@pytest.mark.parametrize("module, group", sorted(PART_OF.items()))
def test_a_module_without_a_group_declares_steps_of_another_group(module, group):
    """``adaptive`` declares ``images adaptive-curve``: its Steps are children of the ``images`` group's Step."""
    import importlib

    mod = importlib.import_module(f"counterfactory.commands.{module}")
    owner = importlib.import_module(f"counterfactory.commands.{group}")
    declared = [v for v in vars(mod).values() if isinstance(v, Step)]
    group_step = next(v for v in vars(owner).values() if isinstance(v, Step) and v.name == group)
    assert declared and all(any(d is child for child in group_step.steps) for d in declared)
    top = cli.build_parser(group)._subparsers._group_actions[0].choices[group]
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    assert all(sub.choices[d.name].get_default("func") is d.run for d in declared)
