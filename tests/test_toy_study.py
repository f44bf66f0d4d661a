"""Issue 41 §2, "a study is one unit": a sixth study is its package with a ``spec.py`` (plus its rules file, schema
section and docs page, docs/architecture.md "Adding a study"). A toy study on a temporary path is picked up by the
study list, the titles, the plan and the preflight's dataset checks without any other file being edited; taken away,
the five are left."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from counterfactory import planning, preflight, studies
from counterfactory.config import load_full_config
from counterfactory.config import studies as schema_studies

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "config" / "demo.yaml"
FIVE = ["coco_counterfactuals", "social_counterfactuals", "countercurate", "spurious_retrieval", "cvld"]

TOY_SPEC = '''
"""A toy study: one image stage, one dataset folder."""

from counterfactory.workflow import Need, Stage, StudySpec, plan_items


def plan(view, res, items):
    n, src = plan_items(("toy", "edits"), items, res / "edits" / "requests.parquet",
                        fallback=(int(view["images"]["items"]), "config: toy.images.items"))
    return [Stage("toy", "edits", n, src, 2 * int(view["images"]["steps"]), 1, 64, 64, "p2p_pairs", 1)]


def needs(study, v):
    return [Need(f"{study}.data.root", v["data"]["root"], "toy", ("images/",))]


SPEC = StudySpec(name="toy", order=60, short="toy", title="Toy study", paper="A Toy Paper (Nobody et al.)",
                 roles=("vae",), plan=plan, needs=needs)
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """``counterfactory.studies.toy`` on a temporary path added to the package's ``__path__``."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text('"""The toy study."""\n', encoding="utf-8")
    (package / "spec.py").write_text(textwrap.dedent(TOY_SPEC), encoding="utf-8")
    monkeypatch.setattr(studies, "__path__", [*studies.__path__, str(tmp_path)])
    yield package
    for name in [m for m in sys.modules if m.split(".")[:3] == ["counterfactory", "studies", "toy"]]:
        del sys.modules[name]


def _toy_config(tmp_path) -> dict:
    cfg = load_full_config([DEMO])
    cfg["studies"] = ["coco_counterfactuals", "toy"]
    cfg["toy"] = {"data": {"root": str(tmp_path / "toy-data")}, "images": {"items": 12, "steps": 5}}
    return cfg


def test_the_five_studies_are_the_specs_in_order():
    assert studies.names() == FIVE == schema_studies()
    assert list(studies.STUDIES) == FIVE
    assert [s.short for s in studies.specs()] == [None, "social", "countercurate", "spurious", "cvld"]
    assert planning.STUDY_SHORT_NAMES == {"social": "social_counterfactuals", "countercurate": "countercurate",
                                          "spurious": "spurious_retrieval", "cvld": "cvld"}
    assert planning.STUDY_RULES == {"data_flickr30k_captions": "countercurate"}
    assert preflight._IMPLICIT_ROLES == {"coco_counterfactuals": ("clip_train", "clip_eval", "vae"),
                                         "social_counterfactuals": ("vae",)}
    assert set(preflight.STUDY_DATA) == set(planning.STUDIES) == set(FIVE)
    for s in studies.specs():
        assert (REPO / s.rules_file).is_file() and (REPO / s.docs_page).is_file(), s.name
        assert s.export is not None and studies.title(s.name) == s.title
    with pytest.raises(KeyError, match="known: coco_counterfactuals"):
        studies.spec("toy")


def test_a_toy_study_is_picked_up_from_its_package_alone(toy, tmp_path):
    assert studies.names() == [*FIVE, "toy"]
    spec = studies.spec("toy")
    assert studies.title("toy") == "Toy study"
    assert studies.STUDIES["toy"] == ("Toy study", "A Toy Paper (Nobody et al.)")
    assert spec.rules_file == "rules/study_toy.smk" and spec.docs_page == "docs/studies/toy.md"
    assert spec.export is None   # no export formats (its spec sets no export)
    # its rules count for it in `counterfactory plan --dry-run`
    assert planning.rule_study("toy_edit") == "toy" and planning.rule_study("train_collect_toy") == "toy"
    assert planning.rule_study("captions_merge") == "coco_counterfactuals"

    cfg = _toy_config(tmp_path)
    frame = planning.plan(cfg, results_root=tmp_path).set_index(["study", "stage"])
    row = frame.loc[("toy", "edits")]
    assert row["items"] == 12 and row["unet_evals"] == 12 * 10 and row["items_source"] == "config: toy.images.items"
    override = planning.plan(cfg, items={"toy.edits": 3}, results_root=tmp_path).set_index("stage")
    assert override.loc["edits", "items"] == 3

    needs = [n for n in preflight.dataset_requirements(cfg) if n.key.startswith("toy.")]
    assert needs == [preflight.Need("toy.data.root", str(tmp_path / "toy-data"), "toy", ("images/",))]
    (check,) = [c for c in preflight.dataset_checks(cfg) if c.key == "toy.data.root"]
    assert check.status == preflight.FAIL and "docs/studies/toy.md" in check.fix
    (tmp_path / "toy-data" / "images").mkdir(parents=True)
    (check,) = [c for c in preflight.dataset_checks(cfg) if c.key == "toy.data.root"]
    assert check.status == preflight.OK
    assert "toy" in preflight.render(preflight.dataset_checks(cfg), cfg)
    cfg["models"]["vae"] = cfg["models"].get("vae") or "resources/models/tiny/vae"
    assert "vae" in preflight.study_roles(cfg, "toy")   # its implicit role


def test_taking_the_toy_study_away_leaves_the_five(toy, monkeypatch):
    assert "toy" in studies.names()
    monkeypatch.setattr(studies, "__path__", [p for p in studies.__path__ if p != str(toy.parent)])
    assert studies.names() == FIVE and "toy" not in studies.STUDIES and studies.title("toy") == "toy"
    assert planning.rule_study("toy_edit") == "coco_counterfactuals"
