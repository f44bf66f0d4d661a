"""Defaults are written once, in the schema (issue 41 §1): an AST scan of ``src/counterfactory`` for

* literal fallbacks of a config key: ``section.get("key", <literal>)`` (also ``setdefault`` / ``pop``) where ``key``
  is a key of the schema and the literal is not ``None`` or an empty container (``cfg.get("images") or {}`` and
  ``cfg.get("images", {})`` only stand for an absent section);
* literal field defaults of settings dataclasses (a ``from_config`` / ``from_section`` constructor, or
  :func:`counterfactory.settings.schema_defaults`) on a field the schema holds: the decorator gives those fields the
  schema's value, and refuses a default written in the class body;
* module-level ``DEFAULT_<KEY>`` constants restating a schema key.

The few hits that are not configuration (a summary row's ``.get("captions", 0)``) or that are still to move are
listed below with the reason; the scanner itself is checked on planted sources.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from counterfactory.config import load_schema

ROOT = Path(__file__).resolve().parents[1] / "src" / "counterfactory"


def schema_keys(schema: dict | None = None) -> set[str]:
    """Every property name of the schema, at any depth (definitions included)."""
    names: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                names.update(k for k in props if isinstance(k, str))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema or load_schema())
    return names


def _literal(node: ast.AST):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _is_default_literal(node: ast.AST) -> bool:
    ok, value = _literal(node)
    return ok and value is not None and not (isinstance(value, (dict, list, tuple, set, str)) and len(value) == 0
                                             and not isinstance(value, str))


def _decorator_names(cls: ast.ClassDef) -> set[str]:
    out = set()
    for d in cls.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        out.add(target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", ""))
    return out


def scan(source: str, keys: set[str], where: str = "<source>") -> list[str]:
    """The defaults written outside the schema in ``source`` (``where:line: what``)."""
    tree = ast.parse(source)
    hits = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "setdefault", "pop") and len(node.args) == 2
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and node.args[0].value in keys and _is_default_literal(node.args[1])):
            hits.append(f"{where}:{node.lineno}: fallback {ast.unparse(node)}")
        elif isinstance(node, ast.ClassDef):
            decorators = _decorator_names(node)
            methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            settings = "dataclass" in decorators and ("schema_defaults" in decorators
                                                      or methods & {"from_config", "from_section"})
            if not settings:
                continue
            for stmt in node.body:
                if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None
                        and stmt.target.id in keys and _literal(stmt.value)[0]
                        and "ClassVar" not in ast.unparse(stmt.annotation)):
                    hits.append(f"{where}:{stmt.lineno}: field default {node.name}.{stmt.target.id} = "
                                f"{ast.unparse(stmt.value)}")
    for stmt in tree.body:
        targets = (stmt.targets if isinstance(stmt, ast.Assign)
                   else [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
        for t in targets:
            if isinstance(t, ast.Name) and t.id.startswith("DEFAULT_") and stmt.value is not None \
                    and t.id[len("DEFAULT_"):].lower() in keys and _literal(stmt.value)[0]:
                hits.append(f"{where}:{stmt.lineno}: constant {t.id} = {ast.unparse(stmt.value)}")
    return hits


#: hits that are not configuration defaults (the mapping is no config section, or the key only shares a name), and
#: why; ``path:key`` for fallbacks, ``path:Class.field`` for fields, ``path:NAME`` for constants
NOT_CONFIG = {
    "data/own.py:width": "an image record of an annotation file, not configuration",
    "data/own.py:height": "an image record of an annotation file, not configuration",
    "export/studies.py:source": "a model-card row",
    "generation/shards.py:captions": "a shard summary's caption count",
    "models/loaders_inpaint.py:device": "a loader keyword argument (registry passes the resolved device)",
    "models/registry.py:device": "a loader keyword argument (registry passes the resolved device)",
    "models/vsepp.py:seed": "a loader keyword argument",
    "overview.py:run_name": "a results folder's summary ('?' when unknown), not a config",
    "overview.py:path": "a summary row",
    "planning.py:device": "a throughput-table row",
    "planning.py:precision": "a throughput-table row",
    "planning.py:batch_size": "a throughput-table row",
    "plots.py:caption": "a manifest row",
    "workflow.py:format": "a dataset spec of the catalogue, '' = unknown format (the studies' preflight needs)",
    "workflow.py:name": "a dataset spec of the catalogue",
    "provenance.py:path": "a provenance entry",
    "training/cvld.py:source": "a table's attrs (where it was read from), not configuration",
    "training/mixtures.py:cf_unit": "a mixture spec built by mixture_specs (the schema's value is filled there)",
    "models/registry.py:DEFAULT_LIBRARY": "each role's loader library (the schema's models.<role>.library has no "
                                          "default of its own: this table is the one place)",
    "text/noun_phrases.py:DEFAULT_TABLE": "the packaged class-word table of noun_phrases (shares only a key name)",
    "export/social_release.py:DEFAULT_SHARD_SIZE": "rows per parquet shard of the SocialCF release layout (a CLI "
                                                   "option of `social release`, no config key)",
    "training/trainer.py:TrainSettings.lr_step_epochs": "None = no step schedule (the recipes that use one set it; "
                                                        "spurious_retrieval.training.<recipe>.lr_step_epochs)",
}

#: configuration fallbacks that remain, each with the reason it is not (yet) the schema's default; none disagrees with
#: what a workflow run uses (the key is always present in a validated configuration, or the schema has no default)
STILL_TO_MOVE = {
    "commands/data.py:check_images": "only coco_counterfactuals.data has the key; the other studies' data sections "
                                     "have no check_images (True = check)",
    "config.py:data_root": "a type check before validation (a missing key passes as ''), not a default",
    "data/classification.py:background_class": "the schema has no default for the per-dataset key; adding one would "
                                               "change every job configuration holding a classification dataset",
    "data/classification.py:trust_unofficial_pickle": "as background_class (false = refused, documented in the schema)",
    "data/nltk_data.py:prefer_real": "the schema has no nltk.prefer_real default (source: null decides by it)",
    "planning.py:run_name": "run_name is required by the schema; 'paper' only names a plan made without a config",
    "preflight.py:run_name": "as planning.py:run_name",
    "training/trainer.py:TrainSettings.seed": "the schema gives coco_counterfactuals.training.seeds no default "
                                              "(config/config.yaml states B.3.2's 107, 108); every run passes its own",
}


def _label(hit: str) -> str:
    where, _, what = hit.partition(": ")
    path = where.rsplit(":", 1)[0]
    kind, _, rest = what.partition(" ")
    if kind == "fallback":
        name = ast.parse(rest).body[0].value.args[0].value
    elif kind == "field":
        name = rest.split(" ", 2)[1]
    else:
        name = rest.split(" ", 1)[0]
    return f"{path}:{name}"


def package_hits() -> list[str]:
    keys = schema_keys()
    hits = []
    for path in sorted(ROOT.rglob("*.py")):
        hits += scan(path.read_text(encoding="utf-8"), keys, path.relative_to(ROOT).as_posix())
    return hits


def test_the_scanner_catches_planted_defaults():
    """The scan is not vacuous: each kind of default written outside the schema is caught, and what is not a
    default (None, an absent section's ``{}``, a key the schema does not have, a non-settings dataclass) is not."""
    keys = {"steps", "mean_of", "batch_size", "images"}
    planted = '''
from dataclasses import dataclass
DEFAULT_BATCH_SIZE = 16
DEFAULT_IMAGE_NAME = "{id}.jpg"

def run(cfg, images):
    a = cfg.get("images", {})
    b = images.get("steps", 100)
    c = images.get("steps")
    d = images.get("not_a_key", 3)
    e = images.setdefault("batch_size", 4)
    return a, b, c, d, e

@dataclass(frozen=True)
class FillSettings:
    mean_of: str = "unmasked"
    other: int = 2

    @classmethod
    def from_config(cls, section):
        return cls(**section)

@dataclass
class Row:
    steps: int = 3
'''
    hits = scan(planted, keys, "planted.py")
    assert sorted(_label(h) for h in hits) == ["planted.py:DEFAULT_BATCH_SIZE", "planted.py:FillSettings.mean_of",
                                               "planted.py:batch_size", "planted.py:steps"], hits
    assert scan("x = cfg.get('steps') or 1\n", keys) == []


def test_schema_defaults_refuses_a_default_written_in_code():
    from counterfactory.settings import schema_defaults

    with pytest.raises(TypeError, match=r"spurious_retrieval\.inpaint\.mean_of"):
        @dataclasses.dataclass(frozen=True)
        @schema_defaults("spurious_retrieval.inpaint")
        class Planted:
            mean_of: str = "unmasked"


def test_no_default_is_written_outside_the_schema():
    hits = package_hits()
    labels = {_label(h): h for h in hits}
    new = sorted(h for label, h in labels.items() if label not in NOT_CONFIG and label not in STILL_TO_MOVE)
    assert not new, ("defaults written outside config/schema.yaml (use counterfactory.settings.schema_defaults, "
                     "config_value or fill_section):\n" + "\n".join(new))
    stale = sorted((set(NOT_CONFIG) | set(STILL_TO_MOVE)) - set(labels))
    assert not stale, f"allow-list entries that no longer match anything (remove them): {stale}"


def test_settings_objects_default_to_the_schema():
    """Each settings dataclass built with schema_defaults equals its schema section filled from nothing."""
    import importlib

    from counterfactory.config import fill_section, fill_definition

    modules = ["device", "filters.pairs", "filters.sets", "generation.adaptive", "generation.editing",
               "generation.grounded", "generation.inpaint", "generation.inversion", "generation.sampler",
               "generation.sets", "text.captions", "training.trainer"]
    seen = 0
    for name in modules:
        module = importlib.import_module(f"counterfactory.{name}")
        for obj in vars(module).values():
            if not (isinstance(obj, type) and dataclasses.is_dataclass(obj) and "__schema_section__" in vars(obj)):
                continue
            section = obj.__schema_section__
            filled = (fill_definition(section.rsplit("/", 1)[-1]) if section.startswith("#/")
                      else fill_section(section))
            made = obj()
            for field, key in obj.__schema_keys__.items():
                value = filled[key]
                value = tuple(value) if isinstance(value, list) else value
                assert getattr(made, field) == value, (obj.__name__, field, section, key)
            seen += 1
    assert seen >= 10


def test_library_calls_and_runs_share_precision_and_mean_of():
    """The two divergences of issue 41: inpainting's mean is of the removed region (the schema's ``masked``) and a
    fine-tuning run without a precision uses the schema's ``auto``, for library calls as for the workflow."""
    from counterfactory.config import fill_section, load_schema
    from counterfactory.generation.inpaint import InpaintSettings
    from counterfactory.settings import config_value

    assert InpaintSettings().mean_of == fill_section("spurious_retrieval.inpaint")["mean_of"] == "masked"
    assert config_value({}, "precision") == load_schema()["properties"]["precision"]["default"] == "auto"
    assert config_value({"precision": "fp32"}, "precision") == "fp32"


def test_config_value_fills_from_the_schema_but_keeps_a_partial_job_view_strict():
    from counterfactory.config import ConfigView
    from counterfactory.errors import ConfigError
    from counterfactory.settings import config_value, schema_default

    images = {"keep_work": True}
    assert config_value(images, "coco_counterfactuals.images.keep_work") is True
    assert config_value({}, "coco_counterfactuals.images.candidates_per_pair") == 100
    assert schema_default("spurious_retrieval.captions.captioner") == {"batch_size": 32, "max_new_tokens": 30,
                                                                       "num_beams": 1}
    with pytest.raises(KeyError):
        schema_default("coco_counterfactuals.no_such_key")
    job = ConfigView({"study": "coco_counterfactuals", "images": {}}, partial=True)
    with pytest.raises(ConfigError, match="was not given the config section 'precision'"):
        config_value(job, "precision")


def test_one_seed_expansion():
    from counterfactory.settings import seed_list, seed_pairs
    from counterfactory.studies import social_counterfactuals
    from counterfactory.studies.spurious_retrieval import settings as spurious
    from counterfactory.training.runs import seed_pairs as coco_pairs

    seeds = {"first": 107, "count": 3, "data_seed_offset": 1}
    assert seed_list(seeds) == [107, 108, 109]
    assert seed_pairs(seeds) == [(107, 108), (108, 109), (109, 110)] == coco_pairs({"seeds": seeds})
    assert spurious.seed_pairs({"training": {"seeds": seeds}}) == seed_pairs(seeds)
    assert social_counterfactuals.debias_seeds({"debias": {"seeds": seeds}}) == dict(seed_pairs(seeds))
