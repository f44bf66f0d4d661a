"""``counterfactory config write-job``: write one job's configuration file, as the Snakefile planned it;
``counterfactory config check``: check configuration files (YAML syntax with file and line, then the schema).

The Snakefile plans every job's ``--config`` file (the config sections its rule declares, named by their
digest) without writing anything; its local rule ``config_write_job`` calls this command to write the file when a
job first needs it. Run by hand, it writes any YAML text to a file atomically (a killed write leaves
nothing behind). The steps are declared as data (``commands.Step``).
"""

from __future__ import annotations

from . import OUT, Param, Step, registrar


def _write_job(args) -> int:
    import yaml

    from ..errors import ConfigError
    from ..io import write_text

    try:
        data = yaml.safe_load(args.text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{args.out}: the job configuration is not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{args.out}: a job configuration must be a mapping of config sections")
    write_text(args.out, args.text)
    return 0


def _check(args) -> list[str]:
    """Check the files of ``config check``: each exists and is valid YAML (file, line and column of a syntax
    error), then the schema, layered in order over ./config/config.yaml when it exists. Returns the files checked."""
    from pathlib import Path

    from ..config import check_yaml_syntax, load_full_config
    from ..errors import missing_input

    for path in args.files:
        if not Path(path).is_file():
            raise missing_input(path, "configuration file", "check the path")
    base = Path("config/config.yaml")        # what the Snakefile loads first, under every --configfile
    files = ([str(base)] if base.is_file() and not any(Path(f).resolve() == base.resolve() for f in args.files)
             else []) + list(args.files)
    check_yaml_syntax(files)                 # file, line and column of a syntax error
    load_full_config(files)                  # then the schema, layered in order (later files win)
    return files


def _cmd_check(args) -> int:
    files = _check(args)   # looked up when the step runs (tests replace it)
    print(f"{', '.join(files)}: valid YAML and a valid configuration")
    return 0


WRITE_JOB = Step(
    "write-job", help="write one job's configuration (YAML text) to a file, atomically",
    description="Reads the YAML text of --text (the Snakefile's config_write_job rule passes it) and writes it "
                "unchanged to --out; refuses text that is not a YAML mapping.",
    params=(Param("--text", required=True, metavar="YAML", help="the configuration, as YAML text"),
            OUT.but(help="the job configuration file to write")),
    run=_write_job)

CHECK = Step(
    "check", help="check configuration files: YAML syntax (file and line), then the schema",
    description="Parses each file as YAML (a syntax error names the file, line and column; Snakemake's "
                "--configfile message names neither), then validates the files layered in order (later files "
                "win) over ./config/config.yaml when it exists, as the workflow layers --configfile files.",
    params=(Param("files", nargs="+", metavar="FILE", help="configuration files, in the order they are layered"),),
    run=_cmd_check)

CONFIG_GROUP = Step(
    "config", help="configuration files of the workflow's jobs",
    description="Configuration files of the workflow's jobs: the Snakefile plans each job's --config file (the "
                "config sections its rule declares, named by their digest) and its local rule config_write_job "
                "writes it with `config write-job`.",
    steps=(WRITE_JOB, CHECK))

register = registrar(CONFIG_GROUP)
