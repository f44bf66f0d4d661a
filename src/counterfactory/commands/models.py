"""``counterfactory models``: build the offline tiny models; check that configured roles load."""

from __future__ import annotations

import json

from ..config import load_config


def _build_tiny(args) -> int:
    from ..models import tiny

    cfg = load_config(args.config)
    section = cfg.get("tiny_models", {})
    out_dir = args.out_dir or section.get("out_dir", "resources/models/tiny")
    roles = args.role or section.get("roles") or sorted(tiny.builders())
    for role in roles:
        tiny.build(role, out_dir, seed=section.get("seed", 0), force=args.force)
    return 0


def _check(args) -> int:
    from ..models import registry

    cfg = load_config(args.config)
    roles = args.role or sorted(cfg["models"])
    for role in roles:
        registry.load(cfg, role)
        print(f"{role}: ok ({registry.model_spec(cfg, role).source})")
    print(json.dumps(registry.loaded_models(), indent=2))
    return 0


def register(sub) -> None:
    p = sub.add_parser("models", help="model roles: build tiny offline stand-ins, check loading",
                       description=__doc__)
    s = p.add_subparsers(dest="models_command", metavar="<step>")
    s.required = True
    b = s.add_parser("build-tiny", help="build small random models of the real classes (offline demo)")
    b.add_argument("--config", action="append", required=True, help="config YAML (repeat to merge)")
    b.add_argument("--role", action="append", help="role to build (repeatable; default: all with a builder)")
    b.add_argument("--out-dir", help="default: tiny_models.out_dir from config")
    b.add_argument("--force", action="store_true", help="rebuild even if the folder exists")
    b.set_defaults(func=_build_tiny)
    c = s.add_parser("check", help="load each configured role with its library's loader")
    c.add_argument("--config", action="append", required=True, help="config YAML (repeat to merge)")
    c.add_argument("--role", action="append", help="role to check (repeatable; default: all configured)")
    c.set_defaults(func=_check)
