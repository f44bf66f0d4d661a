"""``counterfactory models``: build the offline tiny models (with a sha256 manifest); check that
configured roles are intact (manifest / HF-cache blob hashes) and load."""

from __future__ import annotations

import json

from ..config import load_config
from . import add_config_option


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
    """Verify each role's files (manifest / HF-cache blob names), then load it; report every failure."""
    from ..errors import CounterFactoryError
    from ..models import registry

    cfg = load_config(args.config)
    roles = args.role or sorted(cfg["models"])
    failures: list[str] = []
    for role in roles:
        source = registry.model_spec(cfg, role).source
        try:
            report = registry.verify_role(cfg, role, use_cache=args.trust_cache)
        except CounterFactoryError as exc:
            print(f"{role}: FAILED {exc}")
            failures.append(str(exc))
            continue
        if report["problems"]:
            for problem in report["problems"]:
                line = f"role '{role}': {problem['path']}: {problem['problem']}. Fix: {report['fix']}"
                print(f"{role}: CORRUPT {problem['path']}: {problem['problem']}")
                failures.append(line)
            print(f"{role}: fix: {report['fix']}")
            continue
        try:
            registry.load(cfg, role)
        except CounterFactoryError as exc:
            print(f"{role}: FAILED {exc}")
            failures.append(str(exc))
            continue
        info = registry.loaded_models()[role]
        checked = {"manifest": "files match the manifest", "hf-cache": "blobs match their hashes",
                   None: "no manifest"}[report["method"]]
        commit = f", commit {info['commit']}" if info.get("commit") else ""
        print(f"{role}: ok ({source}; {checked}; fingerprint {info['fingerprint']}{commit})")
    print(json.dumps(registry.loaded_models(), indent=2))
    if failures:
        raise registry.ModelIntegrityError(
            f"models check: {len(failures)} problem(s):\n  " + "\n  ".join(failures))
    return 0


def register(sub) -> None:
    p = sub.add_parser("models", help="model roles: build tiny offline stand-ins, check loading",
                       description="Model roles: build the offline tiny models (with a sha256 manifest) and check "
                                   "that the configured roles are intact (manifest / Hugging Face cache blob hashes) "
                                   "and load; a role that is missing says where to get it.")
    s = p.add_subparsers(dest="models_command", metavar="<step>")
    s.required = True
    b = s.add_parser("build-tiny", help="build small random models of the real classes (offline demo)",
                     description="Reads the config's tiny_models section; writes one small random-weight model "
                                 "folder per role (the real library classes, with a sha256 manifest) under "
                                 "tiny_models.out_dir. Needs no network.")
    add_config_option(b)
    b.add_argument("--role", action="append", help="role to build (repeatable; default: all with a builder)")
    b.add_argument("--out-dir", help="default: tiny_models.out_dir from config")
    b.add_argument("--force", action="store_true", help="rebuild even if the folder exists")
    b.set_defaults(func=_build_tiny)
    c = s.add_parser("check", help="verify each configured role's files, then load it with its library's loader",
                     description="Reads the config's models section and each role's files (local folder or the "
                                 "Hugging Face cache); writes nothing, prints one line per role and the loaded "
                                 "models' identities as JSON, and for a missing role how to get it.")
    add_config_option(c)
    c.add_argument("--role", action="append", help="role to check (repeatable; default: all configured)")
    c.add_argument("--trust-cache", action="store_true",
                   help="take file hashes from the hash cache when size/mtime/inode are unchanged (fast; "
                        "default re-reads every file so silent corruption is found)")
    c.set_defaults(func=_check)
