"""``counterfactory config write-job``: write one job's configuration file, as the Snakefile planned it.

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
