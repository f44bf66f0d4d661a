"""``counterfactory cluster``: check the Slurm / Gaudi profiles and show their site settings (docs/cluster.md).

Snakemake reads the profiles from the checkout itself (``snakemake --profile slurm all`` from the repository
root, or ``snakemake all --workflow-profile profiles/slurm``); these commands check what Snakemake accepts
silently and show where each site value comes from:

  counterfactory cluster check-profile --profile slurm
  counterfactory cluster show-site --profile slurm
"""

from __future__ import annotations

import argparse

from . import OneOf, Param, Step, flag, registrar


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


CHECK_PROFILE = Step(
    "check-profile", help="check a profile: keys, resources, rules, and the cluster (sinfo)",
    description="Reads a Snakemake profile (its config.yaml and site settings), the workflow's rules and, when it "
                "can, the cluster (sinfo, scontrol); writes nothing, prints a report and exits 1 on a problem.",
    params=(Param("--profile", required=True,
                  help="profile folder, or a name: profiles/NAME of this workflow, else Snakemake's user profiles"),
            Param("--snakefile", default=None, help="workflow whose rules the profile names (default: this repo's)"),
            OneOf((flag("--live", "always query the cluster (sinfo, scontrol)"),
                   flag("--no-live", "never query the cluster")))),
    run=_check)

SHOW_SITE = Step(
    "show-site", help="print the effective site settings and where each comes from",
    description="Reads a profile's site settings (profile files and environment variables); writes nothing, prints "
                "each setting and where it comes from.",
    params=(Param("--profile", default="slurm", choices=("slurm", "gaudi"),
                  help="which profile's site settings (default: slurm)"),),
    run=_show)

#: its description, this module's docstring with its command lines, is shown as written
CLUSTER = Step("cluster", help="check the Slurm / Gaudi profiles and their site settings", description=__doc__,
               metavar="<cluster command>", steps=(CHECK_PROFILE, SHOW_SITE),
               formatter_class=argparse.RawDescriptionHelpFormatter)

register = registrar(CLUSTER)
