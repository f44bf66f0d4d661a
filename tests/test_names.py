"""One name per step (issue 26): rule ``<group>_<step>`` runs ``counterfactory <group> <step>`` (dashes as
underscores), and the group is the module ``src/counterfactory/commands/<group>.py``. A study's own group is its short
name (``social``, ``countercurate``, ``spurious``, ``cvld``); a second rule that runs a shared stage's subcommand for
one study or experiment adds a suffix from :data:`QUALIFIERS`. Reads the rule files as text (no DAG is built)."""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

from counterfactory import cli, planning

REPO = Path(__file__).resolve().parents[1]

#: suffixes of a rule that runs the same subcommand as the unsuffixed rule, for one study or experiment (without the
#: suffix the two names would collide): in_domain = COCO-CF's A.1 in-domain runs; countercurate_vlm = CounterCurate's
#: VLM runs next to its CLIP runs
QUALIFIERS = {"in_domain", "pretrained", "social", "countercurate", "countercurate_vlm", "spurious", "cvld"}

#: rules whose name cannot be their command's, and why
NO_COMMAND = {"all": "the default target: it runs no command"}
#: rules whose step is picked when the DAG is planned (rules/common.smk): MS-COCO or your own `data.source`
PLANNED_STEP = {"data_check": ("data", {"check-coco", "own-check"}),
                "data_captions": ("data", {"captions", "own-captions"})}

#: old spellings, kept as argparse aliases so that existing scripts keep working; rules use the new names
ALIASES = {("odmap",): ("spurious",),
           ("countercurate", "llm"): ("countercurate", "positions-rewrite"),
           ("countercurate", "generate-shards"): ("countercurate", "request-shards")}

def _name_table():
    spec = importlib.util.spec_from_file_location("name_table", REPO / "scripts" / "name_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NAME_TABLE = _name_table()
#: rule name -> file, base rule, docstring, shell and its commands (the same reader the generated table uses)
workflow_rules = NAME_TABLE.workflow_rules


def test_the_name_table_is_generated_and_complete():
    """Issue 41 item 4: docs/architecture.md's step -> rule -> subcommand -> module table is the generated one, and
    every rule and every subcommand is in it (LIC and LLaVA fine-tuning included)."""
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = NAME_TABLE.table_markdown()
    assert NAME_TABLE.BEGIN + "\n" + table + NAME_TABLE.END in page, \
        "docs/architecture.md's name table is stale: run python scripts/name_table.py"
    rows = table.splitlines()[2:]
    for name in workflow_rules():
        assert any(f"`{name}`" in row.split(" | ")[1] for row in rows), name
    commands = {f"counterfactory {g}" + (f" {s}" if s else "") for g, s, _ in NAME_TABLE.subcommands()}
    assert {row.split(" | ")[2].strip("`") for row in rows} >= commands
    # the module column is read from the handlers: a study step names its study's module
    row = next(r for r in rows if "`cvld_run`" in r)
    assert "`counterfactory.studies.cvld.runs.run`" in row


def test_the_name_table_reader_sees_calls_through_every_import_style():
    """The module column follows calls through a module imported in the handler, a lazy step module and a helper
    of the command module (a reader that missed one would leave rows empty)."""
    from counterfactory.commands import social, spurious

    assert "counterfactory.studies.social_counterfactuals.filtering.filter_clip_files" in \
        NAME_TABLE.targets(social._cmd_filter_clip)                       # lazy_module proxy
    assert any(t.startswith("counterfactory.studies.spurious_retrieval.") for t in NAME_TABLE.targets(spurious._run))


def rule_name(group: str, step: str | None) -> str:
    return "_".join(word.replace("-", "_") for word in (group, step) if word)


@functools.cache
def primary_names(group: str, step: str | None = None) -> set[str]:
    """The names (not the aliases) of the top-level commands, or of ``group``'s steps, as a job's command line
    builds the parser (only the module named like the group registers)."""
    top = cli.build_parser(group)._subparsers._group_actions[0]
    if step is None:
        return {a.dest for a in top._choices_actions}
    sub = top.choices[group]._subparsers
    return {a.dest for a in sub._group_actions[0]._choices_actions} if sub else set()


def test_every_rule_is_named_after_its_command():
    rules = workflow_rules()
    assert len(rules) > 80 and "captions_edit" in rules and "release_coco" in rules  # indented rules are read too
    problems = []
    for name, info in sorted(rules.items()):
        if name in NO_COMMAND or name in PLANNED_STEP:
            continue
        if len(info["commands"]) != 1:
            problems.append(f"{name} ({info['file']}): runs {len(info['commands'])} counterfactory commands, not one")
            continue
        group, step = info["commands"][0]
        want = rule_name(group, step)
        qualifier = name[len(want) + 1:] if name.startswith(want + "_") else None
        if name == want or (qualifier in QUALIFIERS and want in rules):
            continue
        problems.append(f"{name} ({info['file']}): runs `counterfactory {group} {step or ''}`, so name it {want} (a "
                        f"second rule of that command, for one study: {want}_<study>, see QUALIFIERS)")
    assert not problems, "\n".join(problems)


def test_exceptions_are_what_they_say():
    rules = workflow_rules()
    for name in NO_COMMAND:
        assert rules[name]["shell"] is None, name
    common = (REPO / "rules" / "common.smk").read_text(encoding="utf-8")
    for name, (group, steps) in PLANNED_STEP.items():
        [(g, step)] = rules[name]["commands"]
        assert g == group and step.startswith("{params."), (name, g, step)
        assert name.startswith(group + "_"), name
        for s in steps:
            assert s in primary_names(group, s), (name, s)
            assert re.search(rf'f?"{re.escape(s)}[ "]', common), f"rules/common.smk never picks `{group} {s}`"


def test_every_command_a_rule_runs_is_its_groups_module_and_no_alias():
    """``counterfactory <group> <step>``: commands/<group>.py registers the group (a job imports only that module), and
    the rules spell group and step by their names, not by the aliases kept for old scripts."""
    used = {c for info in workflow_rules().values() for c in info["commands"] if not (c[1] or "").startswith("{")}
    assert ("spurious", "run") in used and ("countercurate", "positions-rewrite") in used
    for group, step in sorted(used, key=lambda c: (c[0], c[1] or "")):
        assert (REPO / "src" / "counterfactory" / "commands" / f"{group}.py").exists(), group
        assert group in primary_names(group), f"counterfactory {group}: not a command name (an alias?)"
        if step:
            assert step in primary_names(group, step), f"counterfactory {group} {step}: not a step name (an alias?)"
    for old in ALIASES:
        assert old not in {(g,) for g, _ in used} | used, f"a rule runs the old spelling {' '.join(old)}"


def test_old_spellings_still_parse():
    for old, new in ALIASES.items():
        top = cli.build_parser(old[0])._subparsers._group_actions[0]
        if len(old) == 1:
            assert top.choices[old[0]] is top.choices[new[0]]
        else:
            steps = top.choices[old[0]]._subparsers._group_actions[0].choices
            assert steps[old[1]] is steps[new[1]], old
    args = cli.build_parser("odmap").parse_args(["odmap", "select", "--instances", "i.json", "--out", "o.parquet"])
    assert args.command == "odmap" and args.spurious_command == "select"


def test_a_study_files_rules_count_for_that_study():
    """`counterfactory plan --dry-run` sums jobs per study from the rule names (planning.rule_study)."""
    rules = workflow_rules()
    for path in sorted((REPO / "rules").glob("study_*.smk")):
        study = path.stem.removeprefix("study_")
        if study.endswith("_inputs"):
            continue
        names = [name for name, info in rules.items() if info["file"] == path.name]
        assert names, path
        wrong = {name: planning.rule_study(name) for name in names if planning.rule_study(name) != study}
        assert not wrong, f"{path.name}: {wrong}"


def _command_options(shell: str, group: str, step: str | None) -> list[str]:
    """The ``--flag`` words of the ``counterfactory <group> <step> ...`` command in a rule's shell (its string
    literals joined), up to the next shell operator."""
    text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', shell)) or shell
    start = re.search(rf"counterfactory\s+{re.escape(group)}" + (rf"\s+{re.escape(step)}" if step else ""), text)
    if start is None:
        return []
    rest = re.split(r"\s(?:&&|\|\||;|\||>|2>|<)\s?", text[start.end():])[0]
    return re.findall(r"(?<![\w{-])(--[a-z][\w-]*)", rest)


def test_every_flag_a_rule_passes_exists_on_its_subcommand():
    """The options a rule's shell line passes are options of the subcommand it runs (under their current
    spelling, not a former one kept for old scripts): a renamed or dropped flag fails here, not in a job."""
    problems = []
    for name, info in sorted(workflow_rules().items()):
        if not info["shell"] or len(info["commands"]) != 1:
            continue
        group, step = info["commands"][0]
        steps = PLANNED_STEP[name][1] if name in PLANNED_STEP else [step]
        for one in steps:
            top = cli.build_parser(group)._subparsers._group_actions[0].choices[group]
            parser = top._subparsers._group_actions[0].choices[one] if one else top
            known = {s for a in parser._actions for s in a.option_strings}
            former = {s for a in parser._actions for s in getattr(a, "deprecated_spellings", ())}
            for option in _command_options(info["shell"], group, step):
                if option not in known:
                    problems.append(f"{name}: counterfactory {group} {one or ''} has no option {option}")
                elif option in former:
                    problems.append(f"{name}: {option} is a former spelling on counterfactory {group} {one or ''}")
    assert not problems, "\n".join(problems)


def test_the_rule_flag_reader_reads_a_shell_line():
    shell = '\n "counterfactory verify vqa --config {input.config:q} --shard {wildcards.shard}"\n " --out {output:q}' \
            ' --no-progress > {log:q} 2>&1"\n'
    assert _command_options(shell, "verify", "vqa") == ["--config", "--shard", "--out", "--no-progress"]
