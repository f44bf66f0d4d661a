"""``counterfactory cluster``: set up and check the Slurm / Gaudi profiles (docs/cluster.md).

  counterfactory cluster install-profiles      # link profiles/slurm, profiles/gaudi into ~/.config/snakemake
  counterfactory cluster check-profile --profile slurm
  counterfactory cluster show-site --profile slurm
"""

from __future__ import annotations

import argparse
import sys


def _install(args) -> int:
    from ..cluster import check_profile, install_profiles

    links = install_profiles(dest=args.dest, names=args.names, force=args.force)
    for link in links:
        print(f"{link} -> {link.resolve()}")
    if args.no_check:
        return 0
    failed = 0
    for link in links:
        report = check_profile(str(link))
        print(report.format())
        failed += not report.ok
    if failed:
        print("Fix the problems above (docs/cluster.md), then rerun `make profiles`.", file=sys.stderr)
    return 1 if failed else 0


def _check(args) -> int:
    from ..cluster import check_profile

    live = True if args.live else (False if args.no_live else None)
    report = check_profile(args.profile, snakefile=args.snakefile, live=live)
    print(report.format())
    return 0 if report.ok else 1


def _show(args) -> int:
    from ..cluster import site_settings

    site = site_settings(args.profile, check=False)
    print(site.describe())
    print(f"default-resources from the site: {site.default_resources() or '{}'}")
    print(f"accelerator rules get: {next(iter(site.accelerator_resources().values()), {})}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("cluster", help="set up and check the Slurm / Gaudi profiles", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    csub = p.add_subparsers(dest="cluster_command", metavar="<cluster command>")
    csub.required = True

    i = csub.add_parser("install-profiles", help="link the repository's profiles into Snakemake's profile folder",
                        description="Reads the repository's profiles/<name> folders; writes a symbolic link to "
                                    "each into Snakemake's profile folder, then checks each linked profile.")
    i.add_argument("--dest", default=None, help="folder (default: $XDG_CONFIG_HOME/snakemake, ~/.config/snakemake)")
    i.add_argument("--names", nargs="+", default=["slurm", "gaudi"], help="profiles to link (default: slurm gaudi)")
    i.add_argument("--force", action="store_true", help="replace an existing profile of the same name")
    i.add_argument("--no-check", action="store_true", help="skip check-profile after linking")
    i.set_defaults(func=_install)

    c = csub.add_parser("check-profile", help="check a profile: keys, resources, rules, and the cluster (sinfo)",
                        description="Reads a Snakemake profile (its config.yaml and site settings), the "
                                    "workflow's rules and, when it can, the cluster (sinfo, scontrol); writes "
                                    "nothing, prints a report and exits 1 on a problem.")
    c.add_argument("--profile", required=True, help="profile name (looked up like Snakemake does) or folder")
    c.add_argument("--snakefile", default=None, help="workflow whose rules the profile names (default: this repo's)")
    live = c.add_mutually_exclusive_group()
    live.add_argument("--live", action="store_true", help="always query the cluster (sinfo, scontrol)")
    live.add_argument("--no-live", action="store_true", help="never query the cluster")
    c.set_defaults(func=_check)

    s = csub.add_parser("show-site", help="print the effective site settings and where each comes from",
                        description="Reads a profile's site settings (profile files and environment "
                                    "variables); writes nothing, prints each setting and where it comes from.")
    s.add_argument("--profile", default="slurm", choices=["slurm", "gaudi"],
                   help="which profile's site settings (default: slurm)")
    s.set_defaults(func=_show)
