"""CLI subcommands. Every module in this package defines ``register(subparsers)``;
``counterfactory.cli`` imports them (only the one a command line names, when it can), so adding a stage never
edits a shared file. A module is named like the group it registers: ``commands/<group>.py`` holds
``counterfactory <group> <step>``, which the workflow's rule ``<group>_<step>`` runs (tests/test_names.py)."""

import argparse
import dataclasses
import re
from collections.abc import Callable
from typing import Any


class lazy_module:  # noqa: N801 - used like a module
    """The module ``name``, imported on first attribute access: a command module can name the step modules of
    every subcommand while a job imports only the ones its subcommand uses (a table job then does not pay for
    torch, which the model steps import). A plain proxy, not an entry in ``sys.modules`` (tools that walk the
    loaded modules, as torch's import does through ``inspect``, must not trigger these imports)."""

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr: str):
        if self._module is None:
            import importlib

            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name}>"


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


def _number(text: str, kind=float):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None


def open_fraction(text: str) -> float:
    """argparse type: a number strictly between 0 and 1 (a significance or interval level)."""
    value = _number(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return value


def fraction(text: str) -> float:
    """argparse type: a number in (0, 1] (a share or a target precision)."""
    value = _number(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
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


def add_label_option(parser: argparse.ArgumentParser,
                     help: str = "display name of a model role (repeatable; default: the role)") -> None:
    """``--label ROLE=NAME`` (repeatable): how a table or figure step names a model; the workflow passes every
    role's ``models.<role>.display_name``. Read back with :func:`role_labels`."""
    LABEL.but(help=help).add_to(parser)


def role_labels(items) -> dict[str, str]:
    """``--label ROLE=NAME`` items as a mapping (:func:`key_values`: a malformed item is a ConfigError)."""
    return dict(key_values(items, "--label", "ROLE=NAME (e.g. clip_train=CLIP)"))


def add_config_option(parser: argparse.ArgumentParser,
                      help: str = "configuration file (repeatable; later files win)") -> None:
    """``--config YAML`` (required, repeatable; later files win): how a study step gets its configuration;
    ``help`` may say which sections the step reads."""
    CONFIG.but(help=help).add_to(parser)


def add_shard_job_options(parser: argparse.ArgumentParser, input_flag: str, input_metavar: str,
                          input_help: str) -> None:
    """The options every sharded generation job shares, in this order: ``--config`` (repeatable), its input
    table ``input_flag``, ``--shard``, ``--out-dir``, ``--threads`` and ``--no-progress``."""
    for param in shard_job_params(input_flag, input_metavar, input_help):
        param.add_to(parser)


def add_nltk_option(parser: argparse.ArgumentParser) -> None:
    """``--nltk-data DIR``: the NLTK data folder a standalone step tags or tokenizes with (made by ``counterfactory
    nltk prepare``); without it NLTK searches its usual places ($NLTK_DATA, ~/nltk_data, ...)."""
    NLTK_DATA.add_to(parser)


def use_nltk_data(args: argparse.Namespace) -> None:
    """Point NLTK at ``--nltk-data`` when given (a folder lacking the data is an error naming the fix)."""
    if getattr(args, "nltk_data", None):
        from ..data.nltk_data import ensure_nltk_data

        ensure_nltk_data(args.nltk_data)


def use_threads(args: argparse.Namespace) -> None:
    """``--threads N`` (:data:`THREADS`): torch's CPU threads for this job (torch is imported only when given)."""
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--no-progress``: the one spelling of the progress switch (bars are on by default; the workflow's jobs
    pass it so that their logs stay readable)."""
    NO_PROGRESS.add_to(parser)


def add_renamed(parser: argparse.ArgumentParser, flag: str, *old: str, **kwargs) -> argparse.Action:
    """Add option ``flag`` that still accepts its former spellings ``old`` (``--requests-out`` for
    ``--out-requests``); ``--help`` shows only ``flag`` (see ``counterfactory.cli``)."""
    return Param((flag,), former=tuple(old), **kwargs).add_to(parser)


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


# ----------------------------------------------------------------------------------------- output paths

#: option destinations that name folders (besides a metavar containing ``DIR``)
_FOLDER_SUFFIXES = ("_dir", "_root", "_figures")


def _chosen_parsers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[argparse.ArgumentParser]:
    """``parser`` and the subparsers the command line chose (``counterfactory <group> <step>``)."""
    chain = [parser]
    while True:
        sub = next((a for a in chain[-1]._actions if isinstance(a, argparse._SubParsersAction)), None)
        choice = getattr(args, sub.dest, None) if sub is not None and sub.dest else None
        if choice is None or choice not in sub.choices:
            return chain
        chain.append(sub.choices[choice])


def output_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """``(option, path, "file" | "folder")`` for every output option the command line gave: options spelled
    ``--out`` or ``--out-*`` (a ``DIR`` metavar or a ``-dir``/``-root``/``-figures`` name: a folder)."""
    found = []
    for p in _chosen_parsers(parser, args):
        for action in p._actions:
            dest = action.dest or ""
            if not (dest == "out" or dest.startswith("out_")) or not action.option_strings:
                continue
            value = getattr(args, dest, None)
            if value is None or isinstance(value, bool):
                continue
            folder = "DIR" in str(action.metavar or "") or dest.endswith(_FOLDER_SUFFIXES)
            for v in value if isinstance(value, (list, tuple)) else [value]:
                found.append((action.option_strings[0], str(v), "folder" if folder else "file"))
    return found


def check_output_paths(outputs) -> None:
    """Before a step starts its work: every output path can be written. A folder where a file belongs (or a file
    where a folder belongs), a file in the path where a folder must be, and a folder that cannot be written are a
    :class:`~counterfactory.errors.OutputPathError` naming the option, the path and the fix, so a long model run
    never ends in a write that was bound to fail (with other outputs already written)."""
    import os

    from ..errors import OutputPathError, describe_path

    for option, path, kind in outputs:
        if path in ("", "-"):
            continue

        def fail(problem: str, fix: str):
            raise OutputPathError(f"{option} {describe_path(path)}: {problem}. Fix: {fix}")

        if kind == "file" and os.path.isdir(path):
            fail("is a folder, but this option names a file", f"pass a file path for {option}, or remove or rename "
                 "that folder")
        if kind == "folder" and os.path.exists(path) and not os.path.isdir(path):
            fail("is a file, but this option names a folder", f"pass a folder for {option}, or remove or rename "
                 "that file")
        # the nearest existing folder on the way: outputs are written there (atomic writes add a temporary file)
        probe = os.path.abspath(path if kind == "folder" else os.path.dirname(os.path.abspath(path)))
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        if not os.path.isdir(probe):
            fail(f"{probe} is a file, but the path needs a folder there", "check the path")
        if not os.access(probe, os.W_OK | os.X_OK):
            fail(f"cannot write in {probe} (permission denied or read-only)",
                 f"choose a folder you can write to (ls -ld {probe})")


# ----------------------------------------------------------------------------------------- steps declared as data
#
# A step's interface is declared once (issue 41 §3): a :class:`Step` names the subcommand, its help and description,
# its :class:`Param`\ s and the function it runs; :func:`add_step` generates the argparse subcommand from it. A
# command module then holds declarations and the thin handlers that call its stage, no parsing code. The options
# that recur across steps are declared once below (``CONFIG``, ``OUT``, ``OUT_DIR``, ``SHARD``, ...) and reused,
# with :meth:`Param.but` where a step only says more in the help.


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: a Param field left to argparse's own default (``default=None`` and an omitted default differ for some actions)
UNSET: Any = _Unset()


@dataclasses.dataclass(frozen=True)
class Param:
    """One option (or positional argument) of a step: ``flags`` as on the command line (the first is the name,
    ``former`` are old spellings that still parse but are not shown in ``--help``) and argparse's keywords."""

    flags: tuple[str, ...]
    help: str | None = None
    type: Callable | None = None
    default: Any = UNSET
    required: bool = False
    choices: tuple | None = None
    metavar: str | None = None
    nargs: Any = None
    action: str | None = None
    dest: str | None = None
    const: Any = UNSET
    former: tuple[str, ...] = ()

    def __post_init__(self):
        if isinstance(self.flags, str):
            object.__setattr__(self, "flags", (self.flags,))

    def but(self, **changes) -> "Param":
        """This parameter with some fields changed (a step's own help for a shared option)."""
        return dataclasses.replace(self, **changes)

    def kwargs(self) -> dict:
        """argparse ``add_argument`` keywords: only the fields that are set."""
        out = {}
        for field in ("help", "type", "choices", "metavar", "nargs", "action", "dest"):
            value = getattr(self, field)
            if value is not None:
                out[field] = value
        for field in ("default", "const"):
            value = getattr(self, field)
            if value is not UNSET:
                out[field] = value
        if self.required:
            out["required"] = True
        return out

    def add_to(self, parser) -> argparse.Action:
        action = parser.add_argument(*self.flags, *self.former, **self.kwargs())
        if self.former:
            action.deprecated_spellings = tuple(self.former)
        return action


def flag(name: str, help: str, **kwargs) -> Param:
    """A ``store_true`` switch."""
    return Param(name, help=help, action="store_true", **kwargs)


@dataclasses.dataclass(frozen=True)
class OneOf:
    """Parameters of which at most one (with ``required``: exactly one) may be given (a mutually exclusive group)."""

    params: tuple[Param, ...]
    required: bool = False

    def add_to(self, parser) -> None:
        group = parser.add_mutually_exclusive_group(required=self.required)
        for param in self.params:
            param.add_to(group)


@dataclasses.dataclass(frozen=True)
class Step:
    """A subcommand: ``counterfactory [<group> ...] <name>``. A leaf runs ``run(args)``; a group holds ``steps``
    (its subcommands, chosen into ``args.<dest>``, by default ``<name>_command``). ``aliases`` are old names that
    still parse."""

    name: str
    help: str
    description: str | None = None
    params: tuple[Param | OneOf, ...] = ()
    run: Callable | None = None
    steps: tuple["Step", ...] = ()
    aliases: tuple[str, ...] = ()
    dest: str | None = None
    metavar: str = "<step>"
    defaults: dict = dataclasses.field(default_factory=dict)
    #: argparse help formatter of its parser (None: argparse's default; ``RawDescriptionHelpFormatter`` keeps a
    #: description's line breaks)
    formatter_class: type | None = None

    def subcommand_dest(self) -> str:
        return self.dest or f"{self.name.replace('-', '_')}_command"


def add_step(subparsers, step: Step) -> argparse.ArgumentParser:
    """Generate ``step``'s argparse subcommand (and its own steps, recursively) in ``subparsers``."""
    kwargs = {"help": step.help}
    if step.description is not None:
        kwargs["description"] = step.description
    if step.aliases:
        kwargs["aliases"] = list(step.aliases)
    if step.formatter_class is not None:
        kwargs["formatter_class"] = step.formatter_class
    parser = subparsers.add_parser(step.name, **kwargs)
    for param in step.params:
        param.add_to(parser)
    if step.steps:
        sub = parser.add_subparsers(dest=step.subcommand_dest(), metavar=step.metavar)
        sub.required = True
        for child in step.steps:
            add_step(sub, child)
    if step.run is not None:
        parser.set_defaults(func=step.run)
    if step.defaults:
        parser.set_defaults(**step.defaults)
    return parser


def registrar(*steps: Step) -> Callable:
    """The ``register(subparsers)`` of a command module that declares ``steps``."""

    def register(subparsers) -> None:
        for step in steps:
            add_step(subparsers, step)

    return register


# the options that recur across steps, declared once
CONFIG = Param("--config", action="append", required=True, metavar="YAML",
               help="configuration file (repeatable; later files win)")
SHARD = Param("--shard", required=True, type=shard_id, metavar="N", help="shard number, e.g. 00003")
OUT = Param("--out", required=True, metavar="FILE", help="the file to write")
OUT_DIR = Param("--out-dir", required=True, metavar="DIR", help="the folder to write into")
SHARD_DIRS = Param("--shard-dirs", nargs="+", required=True, metavar="DIR", help="shard output folders")
THREADS = Param("--threads", type=positive_int, default=None, help="CPU threads for torch (default: torch's)")
NO_PROGRESS = flag("--no-progress", "hide progress bars")
NLTK_DATA = Param("--nltk-data", metavar="DIR", default=None,
                  help="NLTK data folder from `counterfactory nltk prepare` (default: NLTK's own search path)")
LABEL = Param("--label", action="append", default=[], metavar="ROLE=NAME",
              help="display name of a model role (repeatable; default: the role)")
SEED = Param("--seed", type=int, default=0, help="seed (default 0)")
INPUTS = Param("--input", action="append", default=[], required=True, metavar="NAME=PATH",
               help="an input file (repeatable)")
OUT_MD = Param("--out-md", metavar="FILE.md", help="the table as Markdown")
OUT_TEX = Param("--out-tex", metavar="FILE.tex", help="the table as LaTeX")
OUT_CSV = Param("--out-csv", metavar="FILE.csv", help="the table as CSV")
OUT_HTML = Param("--out-html", metavar="FILE.html", help="the table as an HTML page (what the report shows)")
DECIMALS = Param("--decimals", type=int, default=2, help="decimals shown (default: 2)")


def shard_job_params(input_flag: str, input_metavar: str, input_help: str) -> tuple[Param, ...]:
    """The parameters every sharded generation job shares, in this order: ``--config``, its input table
    ``input_flag``, ``--shard``, ``--out-dir`` (the shard's folder), ``--threads`` and ``--no-progress``."""
    return (CONFIG, Param(input_flag, required=True, metavar=input_metavar, help=input_help), SHARD,
            OUT_DIR.but(help="the shard's output folder"), THREADS, NO_PROGRESS)
