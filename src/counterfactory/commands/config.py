"""``counterfactory config write-job``: write one job's configuration file, as the Snakefile planned it;
``counterfactory config check``: check configuration files (YAML syntax with file and line, then the schema).

The Snakefile plans every job's ``--config`` file (the config sections its rule declares, named by their
digest) without writing anything; its local rule ``config_write_job`` calls this command to write the file when a
job first needs it. Run by hand, it writes any YAML text to a file atomically (a killed write leaves
nothing behind).
"""

from __future__ import annotations


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


def _check(args) -> int:
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
    print(f"{', '.join(files)}: valid YAML and a valid configuration")
    return 0


def register(sub) -> None:
    p = sub.add_parser("config", help="configuration files of the workflow's jobs",
                       description="Configuration files of the workflow's jobs: the Snakefile plans each job's "
                                   "--config file (the config sections its rule declares, named by their digest) "
                                   "and its local rule config_write_job writes it with `config write-job`.")
    s = p.add_subparsers(dest="config_command", metavar="<step>")
    s.required = True
    w = s.add_parser("write-job", help="write one job's configuration (YAML text) to a file, atomically",
                     description="Reads the YAML text of --text (the Snakefile's config_write_job rule passes it) and "
                                 "writes it unchanged to --out; refuses text that is not a YAML mapping.")
    w.add_argument("--text", required=True, metavar="YAML", help="the configuration, as YAML text")
    w.add_argument("--out", required=True, metavar="FILE", help="the job configuration file to write")
    w.set_defaults(func=_write_job)
    c = s.add_parser("check", help="check configuration files: YAML syntax (file and line), then the schema",
                     description="Parses each file as YAML (a syntax error names the file, line and column; "
                                 "Snakemake's --configfile message names neither), then validates the files "
                                 "layered in order (later files win) over ./config/config.yaml when it exists, as "
                                 "the workflow layers --configfile files.")
    c.add_argument("files", nargs="+", metavar="FILE", help="configuration files, in the order they are layered")
    c.set_defaults(func=_check)
