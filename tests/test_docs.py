"""The documentation stays true (issue 27). README.md and docs/**/*.md: relative links and their anchors resolve;
every ``counterfactory ...`` command names a subcommand and options the real parser knows (the README's quick
read-only ones are run, in-process, as typed); every ``snakemake ...`` command can run as typed (cores or a profile
unless it only plans; targets before ``--configfile`` / ``--config``); the README's shell blocks call only what
``make demo`` / ``make test`` install; dotted ``counterfactory.x.y`` names import; every rule is in the architecture
map; nothing points at files users do not have; the README stays short. Outside the docs, ``README 'Section'`` and
``docs/<page>.md`` pointers in messages, help and config comments resolve. Fast and offline: the parser is built
once, in-process."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 160
#: Snakemake options that plan or describe without running jobs, so they need no --cores (checked by hand:
#: `snakemake -n all --configfile config/demo.yaml` and `--rulegraph` run without cores; a target does not)
NO_CORES_NEEDED = {"-n", "--dry-run", "--dryrun", "--lint", "--rulegraph", "--dag", "--filegraph", "--report",
                   "--help", "-h", "--version", "--list-rules", "-l", "--summary", "--detailed-summary"}
CORES_OPTIONS = {"--cores", "-c", "--jobs", "-j", "--profile", "--workflow-profile"}
#: programs the README's code blocks may call: what `make demo` / `make test` install, plus the shell's own
#: (a pipe into Graphviz's `dot`, which the prerequisites do not install, is what this catches)
README_PROGRAMS = {"make", "snakemake", "counterfactory", "source", "python", "python3", "pytest", "git", "cd",
                   "export", "cp", "mkdir", "ls", "cat", "sudo"}
#: files users of the repository do not have
FORBIDDEN = re.compile(r"\.\./shared|reference-code-facts|metrics-and-formats")


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------------------------ markdown
FENCE = re.compile(r"^(```|~~~)\s*([\w+-]*)")
#: fenced blocks holding commands: write shell commands in ```bash blocks (others, e.g. yaml, are not read)
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}


def split_markdown(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, lines of shell code blocks); fenced blocks start with ``` or ~~~ (``` bash: shell)."""
    prose, code, fence = [], [], None
    for line in text.splitlines():
        m = FENCE.match(line.strip())
        if m:
            fence = (m.group(2) or "") if fence is None else None
            continue
        if fence is None:
            prose.append(line)
        elif fence in SHELL_BLOCKS:
            code.append(line)
    return prose, code


INLINE = re.compile(r"(`+)(.+?)\1")


def paragraphs(lines: list[str]) -> list[str]:
    """Prose joined into paragraphs (a code span may wrap); a table row or list item starts its own."""
    out, buf = [], []
    for line in lines:
        if not line.strip() or line.lstrip().startswith(("|", "- ", "* ", "#", ">")):
            if buf:
                out.append(" ".join(buf))
            buf = [line.strip()] if line.strip() else []
            continue
        buf.append(line.strip())
    if buf:
        out.append(" ".join(buf))
    return out


def inline_code(lines: list[str]) -> list[str]:
    return [m.group(2).strip() for para in paragraphs(lines) for m in INLINE.finditer(para)]


def code_commands(code_lines: list[str]) -> list[str]:
    """Shell commands of code blocks: continuation lines joined, comments dropped, split at && ; |."""
    joined, buf = [], ""
    for line in code_lines:
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        joined.append(buf + line)
        buf = ""
    if buf:
        joined.append(buf)
    out = []
    for line in joined:
        out.extend(part for part in split_shell(line) if part)
    return out


def split_shell(line: str) -> list[str]:
    """One shell line cut at ``&&``, ``||``, ``|`` and ``;`` outside quotes, with its ``#`` comment dropped."""
    parts, buf, quote, i = [], "", None, 0
    while i < len(line):
        ch = line[i]
        if quote:
            quote = None if ch == quote else quote
            buf += ch
        elif ch in "'\"":
            quote = ch
            buf += ch
        elif ch == "#" and (not buf or buf[-1].isspace()):
            break
        elif ch in "|;&":
            if line[i:i + 2] in ("&&", "||"):
                i += 1
            elif ch == "&":
                buf += ch
                i += 1
                continue
            parts.append(buf.strip())
            buf = ""
        else:
            buf += ch
        i += 1
    parts.append(buf.strip())
    return parts


def commands_of(text: str) -> list[str]:
    prose, code = split_markdown(text)
    return code_commands(code) + inline_code(prose)


def _tokens(command: str) -> list[str]:
    command = re.sub(r"<[^<>]*>", lambda m: m.group(0).replace(" ", "_"), command)   # <demo config>: one token
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def program_calls(commands: list[str], program: str) -> list[list[str]]:
    """The argument lists of every call of ``program`` (also as ``.venv/bin/program``) in ``commands``."""
    calls = []
    for command in commands:
        tokens = _tokens(command)
        for i, token in enumerate(tokens):
            if (token == program or token.endswith("/" + program)) and tokens[i + 1:]:
                args = tokens[i + 1:]
                redirect = next((j for j, a in enumerate(args) if re.fullmatch(r"\d?>>?|<", a)), len(args))
                calls.append(args[:redirect])
                break
    return calls


# ------------------------------------------------------------------------------------------------ links
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def github_slug(heading: str) -> str:
    text = re.sub(r"`|\*\*|__|\[|\]\([^)]*\)", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_markdown(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for line in prose:
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text(encoding="utf-8")):
        out.add(m.group(1))
    return out


def dead_links(path: Path) -> list[str]:
    prose, _ = split_markdown(path.read_text(encoding="utf-8"))
    text = "\n".join(INLINE.sub("", line) for line in prose)
    problems = []
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):      # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{_rel(path)}: link to {target}: {file_part} does not exist")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{_rel(path)}: link to {target}: no heading #{anchor} in {_rel(dest)}")
    return problems


# ------------------------------------------------------------------------------------------------ the CLI
def _subparsers(parser: argparse.ArgumentParser):
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def is_placeholder(token: str) -> bool:
    return token.startswith(("<", "{", "$", "…")) or token in ("...", "…") or token.startswith("...")


def check_cli(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """None when the subcommand path of ``counterfactory ARGS`` exists, else what is wrong. ``a / b``
    alternatives (``counterfactory social probe / probe-tables``) are checked at the same level."""
    i = 0
    while i < len(args) and args[i].startswith("-"):           # top-level options: -v, --help, --version
        if args[i] in ("-h", "--help", "--version"):
            return None
        i += 1
    current, path = parser, ["counterfactory"]
    while True:
        sub = _subparsers(current)
        if sub is None:                                           # a leaf: its options must exist
            for a in args[i:]:
                option = a.split("=", 1)[0]
                if option.startswith("--") and option not in current._option_string_actions:
                    return f"{' '.join(path)}: no option {option}"
            return None
        if i >= len(args):
            return None
        token = args[i]
        if token.startswith("-") or is_placeholder(token):
            return None                                       # options, or a <group> / ... placeholder
        if token not in sub.choices:
            return f"{' '.join(path)}: no subcommand {token!r} (known: {', '.join(sorted(sub.choices))})"
        j = i + 1
        while j + 1 < len(args) and args[j] == "/":               # alternatives at this level
            alt = args[j + 1]
            if not is_placeholder(alt) and alt not in sub.choices:
                return f"{' '.join(path)}: no subcommand {alt!r} (known: {', '.join(sorted(sub.choices))})"
            j += 2
        current, path, i = sub.choices[token], path + [token], j


def cli_problems(parser: argparse.ArgumentParser, path: Path) -> list[str]:
    problems = []
    for args in program_calls(commands_of(path.read_text(encoding="utf-8")), "counterfactory"):
        problem = check_cli(parser, args)
        if problem:
            problems.append(f"{_rel(path)}: `counterfactory {' '.join(args)}`: {problem}")
    return problems


# ------------------------------------------------------------------------------------------------ snakemake
def check_snakemake(args: list[str]) -> str | None:
    """None when ``snakemake ARGS`` can run as typed."""
    if not any(a in NO_CORES_NEEDED for a in args) and not any(
            a in CORES_OPTIONS or a.startswith(tuple(o + "=" for o in CORES_OPTIONS if o.startswith("--")))
            or re.fullmatch(r"-[cj]\d+", a) for a in args):
        return "runs jobs but names neither --cores N nor --profile (Snakemake: 'cores have to be specified')"
    if "--config" in args:
        for a in args[args.index("--config") + 1:]:
            if a.startswith("-"):
                break
            if "=" not in a:
                return f"{a!r} after --config is not KEY=VALUE: put targets before --config"
    if "--configfile" in args:
        for a in args[args.index("--configfile") + 1:]:
            if a.startswith("-"):
                break
            if not a.endswith((".yaml", ".yml", ".json")) and not is_placeholder(a) and a != "...":
                return f"target {a!r} after --configfile is read as a config file: put targets first"
    return None


def snakemake_problems(path: Path) -> list[str]:
    """README: every call in code blocks and inline code. docs/: code blocks, and inline calls with more than a
    target (prose such as "the studies `snakemake all` builds" names the target, it is not a command to type)."""
    text = path.read_text(encoding="utf-8")
    prose, code = split_markdown(text)
    calls = program_calls(code_commands(code), "snakemake")
    calls += [a for a in program_calls(inline_code(prose), "snakemake") if path == README or len(a) > 1]
    problems = []
    for args in calls:
        problem = check_snakemake(args)
        if problem:
            problems.append(f"{_rel(path)}: `snakemake {' '.join(args)}`: {problem}")
    return problems


# ------------------------------------------------------------------------------------------------ modules
DOTTED = re.compile(r"^counterfactory(?:\.[A-Za-z_]\w*)+$")


def resolve_dotted(name: str) -> bool:
    """Whether ``counterfactory.a.b.c`` is a module or an attribute of one."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name and not ".".join(parts[:cut]).startswith(exc.name):
                raise                                          # a third-party import failed: a real error
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def module_problems(path: Path) -> list[str]:
    prose, _ = split_markdown(path.read_text(encoding="utf-8"))
    spans = {piece.strip() for span in inline_code(prose) for piece in span.split(",")}
    return [f"{_rel(path)}: `{name}` is neither a module nor an attribute of one"
            for name in sorted(spans) if DOTTED.match(name) and not resolve_dotted(name)]


# ------------------------------------------------------------------------------------------------ tests
@pytest.fixture(scope="module")
def parser():
    from counterfactory.cli import build_parser

    return build_parser()


def test_links_and_anchors_resolve():
    problems = [p for path in doc_files() for p in dead_links(path)]
    assert not problems, "\n".join(problems)


def test_counterfactory_commands_exist(parser):
    problems = [p for path in doc_files() for p in cli_problems(parser, path)]
    assert not problems, "\n".join(problems)


def test_module_paths_exist():
    problems = [p for path in doc_files() for p in module_problems(path)]
    assert not problems, "\n".join(problems)


#: read-only, quick subcommands the README's commands are run with (in-process), exactly as typed
RUN_AS_TYPED = {("data", "own-check")}


def test_readme_quick_counterfactory_commands_run(capsys):
    from counterfactory.cli import main

    calls = program_calls(commands_of(README.read_text(encoding="utf-8")), "counterfactory")
    ran = 0
    for args in calls:
        if tuple(args[:2]) in RUN_AS_TYPED or args == ["--help"]:
            try:
                rc = main(args)
            except SystemExit as exc:                            # --help exits 0
                rc = exc.code
            assert rc in (0, None), f"README: `counterfactory {' '.join(args)}` exited {rc}: {capsys.readouterr()}"
            ran += 1
    assert ran, "the README shows no quick counterfactory command to run"


def test_every_rule_is_in_the_architecture_map():
    """docs/architecture.md maps each step to its rule, subcommand and module: no rule may be missing."""
    sources = [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]
    rules = {m.group(1) for f in sources
             for m in re.finditer(r"^(?:rule|checkpoint)\s+(\w+)\s*:", f.read_text(encoding="utf-8"), re.M)}
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = sorted(r for r in rules if f"`{r}`" not in page)
    assert rules and not missing, f"rules missing from docs/architecture.md: {', '.join(missing)}"


#: user-facing text outside the docs (messages, help, comments users read) that may point into the docs
POINTER_SOURCES = ("src", "rules", "profiles", "config", "Snakefile", "Makefile")
README_SECTION = re.compile(r"README,?\s*[\"'“]([^\"'”]{2,60})[\"'”]")
DOCS_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")


def pointer_problems() -> list[str]:
    """``README 'Section'`` must name a README heading, and ``docs/<page>.md`` an existing page."""
    headings = {re.sub(r"^#+\s*", "", line).strip() for line in README.read_text(encoding="utf-8").splitlines()
                if line.startswith("#")}
    problems = []
    for top in POINTER_SOURCES:
        base = ROOT / top
        files = [base] if base.is_file() else [f for f in base.rglob("*") if f.is_file()
                                               and f.suffix in (".py", ".smk", ".yaml", ".yml", ".rst", "")
                                               and "__pycache__" not in f.parts and not f.is_symlink()]
        for f in files:
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for n, line in enumerate(text.splitlines(), 1):
                for m in README_SECTION.finditer(line):
                    if m.group(1) not in headings:
                        problems.append(f"{_rel(f)}:{n}: README has no section {m.group(1)!r} (point at its docs/ page)")
                for m in DOCS_PATH.finditer(line):
                    if not (ROOT / m.group(0)).exists():
                        problems.append(f"{_rel(f)}:{n}: {m.group(0)} does not exist")
    return problems


def test_pointers_into_the_docs_resolve():
    problems = pointer_problems()
    assert not problems, "\n".join(problems)


def test_snakemake_commands_run_as_typed():
    problems = [p for path in doc_files() for p in snakemake_problems(path)]
    assert not problems, "\n".join(problems)


def readme_program_problems(path: Path) -> list[str]:
    _, code = split_markdown(path.read_text(encoding="utf-8"))
    problems = []
    for command in code_commands(code):
        tokens = [t for t in _tokens(command) if not re.fullmatch(r"[A-Z_]+=\S*", t)]   # VAR=value prefixes
        if tokens and tokens[0] not in (">", "<") and Path(tokens[0]).name not in README_PROGRAMS:
            problems.append(f"{_rel(path)}: `{command}`: {tokens[0]} is not installed by make demo / make test")
    return problems


def test_readme_commands_use_installed_programs():
    problems = readme_program_problems(README)
    assert not problems, "\n".join(problems)


def test_readme_is_short_and_names_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make demo" in text and "make test" in text


def test_no_pointers_to_files_users_do_not_have():
    problems = [f"{_rel(p)}:{n}: {line.strip()}" for p in doc_files()
                for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if FORBIDDEN.search(line)]
    assert not problems, "\n".join(problems)


# the checker itself: it catches what the old README got wrong
def test_checker_flags_known_mistakes(parser, tmp_path):
    assert check_snakemake(["results/x.parquet", "--configfile", "config/demo.yaml"])      # no cores
    assert check_snakemake(["--cores", "2", "--configfile", "config/demo.yaml", "all"])     # target last
    assert check_snakemake(["-n", "all", "--configfile", "config/demo.yaml"]) is None
    assert check_snakemake(["--configfile", "config/demo.yaml", "--rulegraph"]) is None
    assert check_snakemake(["all", "--profile", "profiles/local"]) is None
    assert check_snakemake(["-n", "--config", "studies=[cvld]", "all"])                     # target after --config
    assert check_cli(parser, ["data", "check-coco", "--config", "x.yaml"]) is None
    assert check_cli(parser, ["social", "probe", "/", "probe-tables"]) is None
    assert check_cli(parser, ["<group>", "<step>"]) is None
    assert check_cli(parser, ["data", "no-such-step"])
    assert check_cli(parser, ["social", "probe", "/", "no-such-step"])
    assert check_cli(parser, ["no-such-group"])
    assert check_cli(parser, ["plan", "--config", "c.yaml", "--no-such-option"])
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [bad](#nothing) [gone](missing.md)\n", encoding="utf-8")
    assert len(dead_links(page)) == 2


def test_make_targets_check_their_config_files_before_snakemake_parses_them():
    """Snakemake parses ``--configfile`` files before any workflow code runs and reports a YAML error without file
    or line (issue 31, item 19): every Makefile recipe that hands config files to Snakemake first runs
    ``counterfactory config check`` on each of them, which names file, line and column."""
    recipes: dict[str, list[str]] = {}
    target = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line and not line[0].isspace() and ":" in line and not line.startswith((".", "#", "export")) \
                and "=" not in line.split(":")[0]:
            target = line.split(":")[0]
            recipes[target] = []
        elif line.startswith("\t") and target:
            recipes[target].append(line.strip())
    checked_any = False
    for name, lines in recipes.items():
        joined = " ".join(line.rstrip("\\") for line in lines)
        for m in re.finditer(r"snakemake\b[^;&|]*?--configfile\s+((?:[\w./-]+\.yaml\s*)+)", joined):
            files = m.group(1).split()
            checks = [c for c in re.findall(r"counterfactory config check\s+((?:[\w./-]+\.yaml\s*)+)", joined)]
            checked = {f for c in checks for f in c.split()}
            missing = [f for f in files if f not in checked and f != "config/config.yaml"]
            assert not missing, f"Makefile target {name!r} runs Snakemake on {missing} without `counterfactory " \
                                f"config check` first"
            checked_any = True
    assert checked_any
