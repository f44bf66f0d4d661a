"""``counterfactory provenance``: record git commit, resolved config, package versions and model roles."""

from __future__ import annotations

from ..config import load_config


def _write(args) -> int:
    from .. import provenance

    cfg = load_config(args.config)
    provenance.write(args.out, cfg)
    return 0


def register(sub) -> None:
    p = sub.add_parser("provenance", help="write a provenance JSON for a run", description=__doc__)
    p.add_argument("--config", action="append", required=True, help="config YAML (repeat to merge)")
    p.add_argument("--out", required=True, help="output JSON")
    p.set_defaults(func=_write)
