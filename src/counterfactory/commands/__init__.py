"""CLI subcommands. Every module in this package defines ``register(subparsers)``;
``counterfactory.cli`` imports them (only the one a command line names, when it can), so adding a stage never
edits a shared file. A module is named like the group it registers: ``commands/<group>.py`` holds
``counterfactory <group> <step>``, which the workflow's rule ``<group>_<step>`` runs (tests/test_names.py)."""

import argparse
import re


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
    parser.add_argument("--label", action="append", default=[], metavar="ROLE=NAME", help=help)


def role_labels(items) -> dict[str, str]:
    """``--label ROLE=NAME`` items as a mapping (:func:`key_values`: a malformed item is a ConfigError)."""
    return dict(key_values(items, "--label", "ROLE=NAME (e.g. clip_train=CLIP)"))


def add_config_option(parser: argparse.ArgumentParser,
                      help: str = "configuration file (repeatable; later files win)") -> None:
    """``--config YAML`` (required, repeatable; later files win): how a study step gets its configuration;
    ``help`` may say which sections the step reads."""
    parser.add_argument("--config", action="append", required=True, metavar="YAML", help=help)


def add_shard_job_options(parser: argparse.ArgumentParser, input_flag: str, input_metavar: str,
                          input_help: str) -> None:
    """The options every sharded generation job shares, in this order: ``--config`` (repeatable), its input
    table ``input_flag``, ``--shard``, ``--out-dir``, ``--threads`` and ``--no-progress``."""
    add_config_option(parser)
    parser.add_argument(input_flag, required=True, metavar=input_metavar, help=input_help)
    parser.add_argument("--shard", required=True, type=shard_id, metavar="N", help="shard number, e.g. 00003")
    parser.add_argument("--out-dir", required=True, metavar="DIR", help="the shard's output folder")
    parser.add_argument("--threads", type=positive_int, default=None, help="CPU threads for torch (default: torch's)")
    add_progress_option(parser)


def add_nltk_option(parser: argparse.ArgumentParser) -> None:
    """``--nltk-data DIR``: the NLTK data folder a standalone step tags or tokenizes with (made by ``counterfactory
    nltk prepare``); without it NLTK searches its usual places ($NLTK_DATA, ~/nltk_data, ...)."""
    parser.add_argument("--nltk-data", metavar="DIR", default=None,
                        help="NLTK data folder from `counterfactory nltk prepare` (default: NLTK's own search path)")


def use_nltk_data(args: argparse.Namespace) -> None:
    """Point NLTK at ``--nltk-data`` when given (a folder lacking the data is an error naming the fix)."""
    if getattr(args, "nltk_data", None):
        from ..data.nltk_data import ensure_nltk_data

        ensure_nltk_data(args.nltk_data)


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--no-progress``: the one spelling of the progress switch (bars are on by default; the workflow's jobs
    pass it so that their logs stay readable)."""
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def add_renamed(parser: argparse.ArgumentParser, flag: str, *old: str, **kwargs) -> argparse.Action:
    """Add option ``flag`` that still accepts its former spellings ``old`` (``--requests-out`` for
    ``--out-requests``); ``--help`` shows only ``flag`` (see ``counterfactory.cli``)."""
    action = parser.add_argument(flag, *old, **kwargs)
    action.deprecated_spellings = tuple(old)
    return action


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
