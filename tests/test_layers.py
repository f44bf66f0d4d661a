"""The package's one-way layers (pyproject.toml, ``[tool.importlinter]``), checked by import-linter.

Lower layers never import higher ones, at module level or inside functions: models and readers know
nothing of stages, shared stages nothing of studies, studies nothing of the command line.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import counterfactory

PACKAGE = Path(counterfactory.__file__).resolve().parent


@pytest.fixture(scope="module")
def contract(repo):
    with open(repo / "pyproject.toml", "rb") as fh:
        contracts = tomllib.load(fh)["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    return layers


def _members(layer: str) -> list[str]:
    return [m.strip() for m in layer.replace(":", "|").split("|")]


def test_every_module_of_the_package_sits_in_a_layer(contract):
    """A new top-level module or subpackage must be placed in the layers, or it would escape the check."""
    listed = {m for layer in contract["layers"] for m in _members(layer)}
    present = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    present |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert present - listed == set(), "place these in [tool.importlinter] layers (pyproject.toml)"
    assert listed - present == set(), "layers name modules that do not exist"


def test_layers_run_one_way(repo, contract):
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--config", str(repo / "pyproject.toml"), "--no-cache"], cwd=repo,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "3 kept, 0 broken" in out.stdout   # layers, study independence, no sibling cycles


def test_the_layer_check_catches_an_upward_import(tmp_path, contract):
    """The contract is not vacuous: a shared stage importing a study breaks it."""
    import grimp  # import-linter's graph library

    graph = grimp.build_graph("counterfactory", cache_dir=None)
    graph.add_import(importer="counterfactory.generation.sets", imported="counterfactory.studies.social_counterfactuals",
                     line_number=1, line_contents="from ..studies import social_counterfactuals")
    layers = [grimp.Layer(*_members(layer), independent="|" in layer) for layer in contract["layers"]]
    illegal = graph.find_illegal_dependencies_for_layers(layers=layers, containers={"counterfactory"})
    assert {(d.importer, d.imported) for d in illegal} == {("counterfactory.generation", "counterfactory.studies")}


@pytest.fixture(scope="module")
def graph():
    import grimp

    return grimp.build_graph("counterfactory", exclude_type_checking_imports=True)


def _study_packages() -> list[str]:
    from counterfactory import studies

    return [f"counterfactory.studies.{s}" for s in studies.names()]


def test_every_study_is_independent_of_every_other(graph):
    """Issue 41 §2 and §4: no study imports another, directly or through any chain of imports. Checked over the
    study specs (``studies.names()``), so a sixth study is covered without editing pyproject.toml; the
    "studies are independent" contract there runs the same check under ``lint-imports``."""
    found = _study_packages()
    assert len(found) >= 5
    chains = [(a, b) for a in found for b in found if a != b and graph.chain_exists(a, b, as_packages=True)]
    assert chains == [], "a study imports another: move what both need into a shared stage below them"


def _sibling_cycle(graph, package: str) -> list[str] | None:
    """A cycle among the children of ``package`` (an edge a -> b: a module in a imports one in b), or None."""
    children = sorted(graph.find_children(package))
    edges = {a: [b for b in children if b != a and graph.direct_import_exists(importer=a, imported=b,
                                                                               as_packages=True)]
             for a in children}
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in edges[node]:
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [nxt])
                if cycle:
                    return cycle
        state[node] = 2
        return None

    for start in children:
        if start not in state:
            cycle = visit(start, [start])
            if cycle:
                return cycle
    return None


def test_no_package_has_an_import_cycle_between_its_modules(graph):
    """Issue 41 §4: within every package of the tree (the studies' included, found on disk), no two modules import
    each other through a cycle, function-local imports counted. The acyclic-siblings contract in pyproject.toml runs
    the same check under ``lint-imports``."""
    src = PACKAGE.parent
    packages = sorted(".".join(p.parent.relative_to(src).parts) for p in PACKAGE.rglob("__init__.py")
                      if "__pycache__" not in p.parts)
    cycles = {p: c for p in packages if p != "counterfactory" and (c := _sibling_cycle(graph, p))}
    assert cycles == {}


def test_the_contracts_cover_the_shared_packages(repo):
    """The pyproject.toml contracts name every shared package with several modules (a study's packages are checked
    by the tests above whether or not the contracts list them)."""
    with open(repo / "pyproject.toml", "rb") as fh:
        contracts = {c["type"]: c for c in tomllib.load(fh)["tool"]["importlinter"]["contracts"]}
    assert set(contracts["independence"]["modules"]) <= set(_study_packages())
    src = repo / "src"
    packages = {".".join(p.parent.relative_to(src).parts) for p in (src / "counterfactory").rglob("__init__.py")}
    multi = {p for p in packages if p != "counterfactory" and not p.startswith("counterfactory.studies.")
             and len([m for m in (src / Path(*p.split("."))).glob("*.py") if m.name != "__init__.py"]) > 1}
    assert multi <= set(contracts["acyclic_siblings"]["ancestors"]), \
        "list the package in the acyclic_siblings contract (pyproject.toml)"


def test_the_checks_find_a_planted_cross_study_import_and_cycle():
    """The two checks above can fail: on a copy of the graph, one study importing another and two modules of a
    package importing each other are found."""
    import grimp

    planted = grimp.build_graph("counterfactory", exclude_type_checking_imports=True)
    a, b = _study_packages()[:2]
    planted.add_import(importer=f"{a}.spec", imported=f"{b}.spec", line_number=1, line_contents="planted")
    assert planted.chain_exists(a, b, as_packages=True)
    assert _sibling_cycle(planted, "counterfactory.models") is None
    planted.add_import(importer="counterfactory.models.base", imported="counterfactory.models.registry",
                       line_number=1, line_contents="planted")
    cycle = _sibling_cycle(planted, "counterfactory.models")
    assert cycle and cycle[0] == cycle[-1] and {"counterfactory.models.base", "counterfactory.models.registry"} <= \
        set(cycle)


#: function-local internal imports outside ``commands/`` and ``cli.py`` (issue 41 §4): what is left imports a module
#: that would load a heavy library (torch, transformers, diffusers, scipy, pandas, jsonschema) into a lighter module,
#: or a name tests patch; the number may only go down
LOCAL_IMPORTS_AT_MOST = 119


def _local_internal_imports() -> list[str]:
    import ast

    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "commands" or rel.name == "cli.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if not isinstance(node, ast.ImportFrom):
                    continue
                if node.level or (node.module or "").startswith("counterfactory"):
                    out.append(f"{rel}:{node.lineno}")
    return sorted(set(out))


def test_function_local_imports_are_the_heavy_ones_only():
    """Issue 41 §4: a module imports the package's modules at its top; a function-local import is kept only where
    the imported module is heavy (see LOCAL_IMPORTS_AT_MOST). A new function-local import makes this fail: move it
    to the module's import block, or, where the module it imports is heavy, raise the bound and say why."""
    found = _local_internal_imports()
    assert len(found) <= LOCAL_IMPORTS_AT_MOST, f"{len(found)} function-local internal imports: {found[-10:]}"
