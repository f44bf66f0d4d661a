"""The front page of a run's report: which studies ran, on which data and with which models.

:func:`write_overview` reads the run's ``provenance.json`` (written last, from the files it describes: the
resolved config, each model role's source and content fingerprint, package versions, the git commit and every
output) and writes one self-contained HTML page. ``snakemake --report`` shows it first (category "Run
overview"); the report's front text (``report/workflow.rst``) links every other result to the rule that made it.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from pathlib import Path
from typing import Any, Callable, Iterator

from . import studies
from .config import study_roles as required_roles
from .errors import input_error
from .io import atomic_path
from .render import model_display_name
from .report_labels import tiny_warning

def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list) and any(isinstance(v, (dict, list)) for v in node):
        for i, value in enumerate(node):
            yield from _leaves(value, f"{prefix}[{i}]")
    else:
        yield prefix, node


#: roles that only serve another role: the optional ``vae`` decodes the ``sd`` role's latents (COCO-CF B.1.2)
COMPANION_ROLES = {"vae": "sd"}
#: commands the page tells a reader to run (a test checks that each exists)
COMMANDS = ("counterfactory models check", "counterfactory provenance --verify", "counterfactory report overview")


def study_roles(study: str, section: dict, roles: set[str]) -> list[str]:
    """Model roles a study needs (its schema section's ``x-required-roles``, :func:`counterfactory.config.study_roles`),
    names anywhere in its section (e.g. ``evaluation.itm.models``, ``editing.editor_role``) or serve one of those
    (:data:`COMPANION_ROLES`)."""
    named = set(required_roles(study))
    for _, value in _leaves(section):
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and v in roles:
                named.add(v)
    if study == "cvld" and isinstance(section.get("captioning"), dict):   # Table 4 LIC's BERT (Hirota et al. §4)
        from .studies.cvld.leakage import classifier_roles

        named |= set(classifier_roles(section["captioning"]))
    named |= {c for c, owner in COMPANION_ROLES.items() if owner in named}
    return sorted(named & roles)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _code(text: Any) -> str:
    return f"<code>{html.escape(str(text))}</code>"


def reads_by_study(reads: list[tuple[str, str]] | None, study: str) -> list[tuple[str, str]] | None:
    """``(config key under the study, paths)`` of the files and folders the study's jobs read, one row per key (a
    key naming several files, e.g. a classification dataset's, lists them all); None when not known."""
    if reads is None:
        return None
    rows: dict[str, list[str]] = {}
    for key, path in reads:
        if key.startswith(study + "."):
            paths = rows.setdefault(key[len(study) + 1:], [])
            if str(path) not in paths:
                paths.append(str(path))
    return [(k, ", ".join(v)) for k, v in rows.items()]


def overview(provenance: dict, reads: list[tuple[str, str]] | None = None) -> dict:
    """The page's content as data: run facts, one row per study, one per model role. ``reads``: ``(config key,
    path)`` of every source-data file or folder the run's jobs take as inputs (counterfactory.preflight's
    ``dataset_requirements``, which the DAG's input functions are checked against); without it the page says that
    the data read was not recorded instead of guessing from the config's keys."""
    cfg = provenance.get("config") or {}
    run = cfg.get("run_name", "?")
    models = provenance.get("models") or {}
    outputs = provenance.get("outputs") or []
    rows = []
    users: dict[str, list[str]] = {}
    for study in cfg.get("studies") or []:
        section = cfg.get(study) or {}
        roles = study_roles(study, section, set(models))
        for role in roles:
            users.setdefault(role, []).append(studies.title(study))
        prefix = f"results/{run}/{study}/"
        rows.append({
            "study": study, "title": studies.title(study), "paper": studies.STUDIES.get(study, ("", ""))[1],
            "data": reads_by_study(reads, study), "roles": roles,
            "outputs": sum(1 for o in outputs if str(o.get("path", "")).startswith(prefix)),
        })
    model_rows = [{"role": role, "name": model_display_name(cfg.get("models") or {role: m}, role),
                   "source": m.get("source"), "library": m.get("library"),
                   "fingerprint": m.get("fingerprint"), "revision": m.get("revision"),
                   "studies": users.get(role, [])} for role, m in sorted(models.items())]
    created = provenance.get("created_unix")
    return {
        "run_name": run, "studies": rows, "models": model_rows,
        "created": _dt.datetime.fromtimestamp(created, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if created else "?",
        "git": provenance.get("git") or {}, "packages": provenance.get("packages") or {},
        "device": cfg.get("device"), "precision": cfg.get("precision"), "seed": cfg.get("seed"),
        "nltk": (provenance.get("nltk_data") or {}).get("mode"),
        "warning": tiny_warning(cfg.get("models") or models, cfg),
    }


def render(page: dict) -> str:
    """The overview as one HTML page (no external resources)."""
    git = page["git"]
    commit = git.get("commit") or "not a git checkout"
    facts = [
        ["run", _code(page["run_name"])], ["made", html.escape(page["created"])],
        ["code", _code(commit) + (" (uncommitted changes)" if git.get("dirty") else "")],
        ["device / precision / seed", html.escape(f"{page['device']} / {page['precision']} / {page['seed']}")],
        ["NLTK data", html.escape(str(page["nltk"]))],
    ]
    study_rows = []
    for s in page["studies"]:
        if s["data"] is None:
            data = "not recorded (rebuild the overview with <code>counterfactory report overview</code>)"
        else:
            data = "<br>".join(f"{_code(k)}: {_code(v)}" for k, v in s["data"]) or "none (generated from the study's templates)"
        study_rows.append([f"<b>{html.escape(s['title'])}</b><br><small>{html.escape(s['paper'])}</small>", data,
                           ", ".join(_code(r) for r in s["roles"]) or "—", str(s["outputs"])])
    model_rows = [[_code(m["role"]), html.escape(m["name"]), _code(m["source"]), html.escape(str(m["library"] or "")),
                   _code((m["fingerprint"] or "")[:16]), html.escape(str(m["revision"] or "—")),
                   html.escape(", ".join(m["studies"]) or "no enabled study")] for m in page["models"]]
    packages = [[html.escape(k), _code(v)] for k, v in sorted(page["packages"].items())]
    style = ("body{font-family:sans-serif;margin:1em;}table{border-collapse:collapse;margin:0.5em 0 1.5em;}"
             "td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left;}th{background:#f3f3f3;}"
             ".warning{border-left:6px solid #d97706;background:#fef3c7;padding:0.5em 1em;margin:0.5em 0 1em;}")
    warning = [f"<p class='warning'><b>{html.escape(page['warning'])}</b></p>"] if page.get("warning") else []
    return "\n".join([
        "<!doctype html>", "<html><head><meta charset='utf-8'>",
        f"<title>CounterFactory run {html.escape(page['run_name'])}</title><style>{style}</style></head><body>",
        f"<h1>CounterFactory run {_code(page['run_name'])}</h1>", *warning, _table(["", ""], facts),
        "<h2>Studies that ran</h2>",
        "<p>Source data: the files and folders each study's jobs took as inputs in this run (parts the config "
        "turns off read nothing and are not listed), with the config key that names each.</p>",
        _table(["study (paper)", "source data read (config key: path)", "model roles", "outputs recorded"],
               study_rows),
        "<h2>Models</h2>",
        ("<p>Every role as configured, with the content fingerprint of the files that were loaded "
         "(sha256 over the folder's files). <code>counterfactory models check --config CONFIG</code> checks and "
         "loads each role; <code>counterfactory provenance --verify provenance.json</code> checks the recorded "
         "outputs against the disk.</p>"),
        _table(["role", "name in tables", "source", "library", "fingerprint", "hub revision", "used by"],
               model_rows),
        "<h2>Software</h2>", _table(["package", "version"], packages),
        "</body></html>",
    ])


def write_overview(provenance_json: str | Path, out: str | Path,
                   reads: Callable[[dict], list[tuple[str, str]]] | None = None) -> dict:
    """Read ``provenance.json`` and write the overview page to ``out``; returns the page's content. ``reads``:
    the run's config -> ``(config key, path)`` of the source data its jobs read (see :func:`overview`)."""
    path = Path(provenance_json)
    try:
        provenance = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise input_error(path, None, f"cannot be read as JSON ({exc})",
                          "rebuild it with the `provenance` rule (snakemake results/<run>/provenance.json)") from None
    if not isinstance(provenance, dict) or "config" not in provenance:
        raise input_error(path, None, "has no 'config' entry: it is not a CounterFactory provenance file",
                          "point --provenance at results/<run>/provenance.json")
    page = overview(provenance, reads(provenance["config"]) if reads else None)
    with atomic_path(out) as tmp:
        Path(tmp).write_text(render(page), encoding="utf-8")
    return page
