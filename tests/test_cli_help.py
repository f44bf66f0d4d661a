"""The command line explains itself (issue 27, finding 10): the whole parser tree, walked in-process.

Every leaf command has a description (what it reads and what it writes), every option has help, no text leaks
Sphinx roles or files a user does not have, the progress switch has one spelling (``--no-progress``) and output
options follow one scheme (``--out`` for a single output, ``--out-<what>`` for several); former spellings of
renamed options still parse but are not shown in ``--help``."""

from __future__ import annotations

import argparse
import re

import pytest

from counterfactory.cli import build_parser

LEAKS = (":mod:", ":func:", ":class:", ":meth:", "``", "add_cli", "../shared", "reference-code-facts",
         "metrics-and-formats")


def _tree():
    """``(command words, parser)`` of every parser (the root, groups and leaves), each parser once."""
    out, seen = [], set()

    def walk(parser, words):
        if id(parser) in seen:
            return
        seen.add(id(parser))
        out.append((words, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, words + [name])

    walk(build_parser(), [])
    return out


TREE = _tree()
LEAVES = [(w, p) for w, p in TREE if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)]


def _options(parser):
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))]


def _visible_strings(action):
    hidden = set(getattr(action, "deprecated_spellings", ()))
    return [s for s in action.option_strings if s not in hidden]


def test_tree_is_walked():
    assert len(LEAVES) > 90
    assert {"models", "data", "train", "countercurate", "social", "spurious", "cvld"} <= {w[0] for w, _ in TREE if w}


def test_every_command_has_a_description():
    missing = [" ".join(w) for w, p in TREE if not (p.description or "").strip()]
    assert not missing, f"{len(missing)} command(s) without a description: {missing}"


def test_every_option_has_help():
    missing = [f"{' '.join(w)} {'/'.join(a.option_strings) or a.dest}"
               for w, p in LEAVES for a in _options(p) if not (a.help or "").strip()]
    assert not missing, f"{len(missing)} option(s) without help: {missing}"


def test_no_internal_references():
    found = []
    for words, parser in TREE:
        texts = [parser.description or "", parser.format_help()]
        texts += [a.help or "" for a in parser._actions if a.help is not argparse.SUPPRESS]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                texts += [c.help or "" for c in action._choices_actions]
        for leak in LEAKS:
            if any(leak in t for t in texts):
                found.append(f"{' '.join(words) or 'counterfactory'}: {leak}")
    assert not found, found


def test_one_progress_flag():
    bad = [f"{' '.join(w)} {s}" for w, p in LEAVES for a in _options(p) for s in a.option_strings
           if "progress" in s and s != "--no-progress"]
    assert not bad, bad


_OUT_SCHEME = re.compile(r"--out(-[a-z0-9]+)*")


def test_output_options_follow_one_scheme():
    """Output options are ``--out`` or ``--out-<what>``: no ``--<what>-out`` and no output ``--summary``."""
    bad = []
    for words, parser in LEAVES:
        for action in _options(parser):
            for s in _visible_strings(action):
                parts = s.lstrip("-").split("-")
                if "out" in parts and not _OUT_SCHEME.fullmatch(s):
                    bad.append(f"{' '.join(words)} {s}")
    assert not bad, bad


# (command words, former spelling, new spelling): the old spelling still parses to the new option
RENAMED = [
    (["captions", "edit"], "--summary", "--out-summary"),
    (["countercurate", "positions"], "--requests-out", "--out-requests"),
    (["countercurate", "counting"], "--requests-out", "--out-requests"),
    (["countercurate", "attributes"], "--requests-out", "--out-requests"),
    (["countercurate", "attributes"], "--llm-requests-out", "--out-llm-requests"),
    (["countercurate", "attributes"], "--answers-out", "--out-answers"),
    (["cvld", "intervene"], "--summary-out", "--out-summary"),
    (["spurious", "select"], "--requests-out", "--out-requests"),
    (["spurious", "select"], "--summary-out", "--out-summary"),
    (["train", "mixtures"], "--summary", "--out-summary"),
]


def _leaf(words):
    return {tuple(w): p for w, p in TREE}[tuple(words)]


@pytest.mark.parametrize("words,old,new", RENAMED, ids=[f"{' '.join(w)} {o}" for w, o, _ in RENAMED])
def test_former_spellings_parse_but_are_hidden(words, old, new):
    parser = _leaf(words)
    action = next(a for a in parser._actions if new in a.option_strings)
    assert old in action.option_strings
    assert parser._option_string_actions[old] is action
    text = parser.format_help()
    assert new in text
    assert not re.search(rf"(?<![\w-]){re.escape(old)}(?![\w-])", text), f"{old} is listed in --help"
