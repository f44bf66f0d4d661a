"""The report's front page: studies, their source data and model roles, read from provenance.json."""

from __future__ import annotations

import json
import os

import pytest

from counterfactory.errors import CounterFactoryError
from counterfactory.overview import study_roles, write_overview


def _provenance(tmp_path):
    cfg = {
        "run_name": "r1", "device": "cpu", "precision": "fp32", "seed": 3,
        "studies": ["coco_counterfactuals", "cvld"],
        "coco_counterfactuals": {"data": {"coco_root": "data/coco", "split": "val2017", "limit_images": None},
                                 "evaluation": {"itm": {"models": ["itm_flava", "not_a_role"]}}},
        "cvld": {"data": {"celeba": {"root": "data/celeba"}, "flickr30k": {"karpathy_json": None}},
                 "editing": {"editor_role": "editor"}},
    }
    models = {r: {"source": f"hub/{r}", "library": "transformers", "fingerprint": f"{r:0<64}"[:64], "revision": None}
              for r in ("mlm", "lm", "sentence", "sd", "clip_filter", "itm_flava", "editor", "vlm")}
    prov = {"config": cfg, "models": models, "git": {"commit": "abc123", "dirty": False},
            "packages": {"torch": "2.x"}, "created_unix": 0, "nltk_data": {"mode": "offline"},
            "outputs": [{"path": "results/r1/cvld/tables.md"}, {"path": "results/r1/cvld/runs.csv"},
                        {"path": "results/r1/coco_counterfactuals/x.md"}, {"path": "results/r1b/cvld/other.md"}]}
    path = tmp_path / "provenance.json"
    path.write_text(json.dumps(prov))
    return path


def test_study_roles_are_required_roles_plus_roles_the_section_names():
    roles = {"mlm", "lm", "sentence", "sd", "clip_filter", "itm_flava", "editor", "vlm"}
    section = {"evaluation": {"itm": {"models": ["itm_flava", "not_a_role"]}}}
    assert study_roles("coco_counterfactuals", section, roles) == ["clip_filter", "itm_flava", "lm", "mlm", "sd",
                                                                   "sentence"]
    # CVLD's required roles (x-required-roles: editor and sd among those configured here) plus the ones its section names
    assert study_roles("cvld", {"editing": {"editor_role": "editor"}}, roles) == ["editor", "sd"]


def test_overview_page_lists_studies_data_models_and_counts(tmp_path):
    out = tmp_path / "report" / "overview.html"
    reads = [("cvld.data.celeba.root", "data/celeba"), ("cvld.data.fairface.root", "data/ff/a.csv"),
             ("cvld.data.fairface.root", "data/ff/val"), ("coco_counterfactuals.data.coco_root", "data/coco")]
    page = write_overview(_provenance(tmp_path), out, reads=lambda cfg: reads)
    assert [s["study"] for s in page["studies"]] == ["coco_counterfactuals", "cvld"]
    cvld = page["studies"][1]
    assert cvld["outputs"] == 2                 # results/r1b/... belongs to another run
    # issue 44 item 4: only what the jobs read, one row per key (nothing from the config's other path keys)
    assert cvld["data"] == [("data.celeba.root", "data/celeba"), ("data.fairface.root", "data/ff/a.csv, data/ff/val")]
    vlm = next(m for m in page["models"] if m["role"] == "vlm")
    assert vlm["studies"] == []                 # configured but used by no enabled study
    text = out.read_text()
    for needle in ("CounterFactory run <code>r1</code>", "COCO-Counterfactuals", "data.coco_root", "abc123",
                   "<code>editor</code>", "Debias Your VLM"):
        assert needle in text


def test_not_a_provenance_file_names_the_file_and_writes_nothing(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"models": {}}))
    out = tmp_path / "o.html"
    with pytest.raises(CounterFactoryError, match="p.json.*no 'config' entry"):
        write_overview(bad, out)
    assert not out.exists()


@pytest.mark.parametrize("config", ["demo.yaml", "config.yaml"])
def test_every_study_lists_its_roles_and_every_role_its_studies(repo, config):
    """Issue 32 item 5: CVLD lists its roles; editor, gligen, llm, t2i, inpaint, itm_blip (and the sd role's vae)
    name the studies that use them; names in tables come from models.<role>.display_name or the source."""
    from counterfactory.config import load_full_config
    from counterfactory.overview import overview

    cfg = load_full_config([repo / "config" / config])
    models = {r: {"source": v["source"], "library": None, "fingerprint": None, "revision": None}
              for r, v in cfg["models"].items()}
    page = overview({"config": cfg, "models": models})
    by_study = {s["study"]: s["roles"] for s in page["studies"]}
    assert {"editor", "itm_blip", "captioner_pretrained", "image_encoder"} <= set(by_study["cvld"])
    # each study names its own captioner: CVLD pre-trained BLIP (BLIP^PT), the spurious study a COCO-trained one
    assert "captioner" not in by_study["cvld"] and "captioner" in by_study["spurious_retrieval"]
    used = {m["role"]: m["studies"] for m in page["models"]}
    for role, study in (("editor", "CVLD"), ("gligen", "CounterCurate"), ("llm", "CounterCurate"),
                        ("t2i", "CounterCurate"), ("itm_blip", "CVLD"), ("vae", "COCO-Counterfactuals")):
        assert study in used[role], role
    assert any("retrieval" in s for s in used["inpaint"])
    assert all(used.values()), [r for r, s in used.items() if not s]     # every configured role has a user
    names = {m["role"]: m["name"] for m in page["models"]}
    if config == "config.yaml":
        assert names["itm_bridgetower"] == "BridgeTower" and names["mlm"] == "roberta-base"


def test_every_command_the_overview_cites_exists(tmp_path):
    """Issue 32 item 5: the page once cited `counterfactory models verify`, which does not exist."""
    import re
    import shlex

    from counterfactory.cli import build_parser
    from counterfactory.overview import COMMANDS

    page = (tmp_path / "o.html")
    write_overview(_provenance(tmp_path), page)
    cited = re.findall(r"<code>(counterfactory [^<]+)</code>", page.read_text())
    assert cited and {" ".join(c.split()[:3]) for c in cited} <= {" ".join(c.split()[:3]) for c in COMMANDS}
    for command in cited:
        words = shlex.split(command)[1:]
        parser = build_parser()
        for word in words:
            if word.startswith("-"):
                assert word in parser._option_string_actions, (command, word)
                break
            sub = next((a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"), None)
            if sub is None:
                break                               # an argument of the command (CONFIG, a file)
            assert word in sub.choices, (command, word)
            parser = sub.choices[word]


def test_without_the_reads_the_page_says_so_and_guesses_nothing(tmp_path):
    out = tmp_path / "o.html"
    page = write_overview(_provenance(tmp_path), out)
    assert all(s["data"] is None for s in page["studies"])
    assert "not recorded" in out.read_text() and "data/coco" not in out.read_text()


@pytest.mark.parametrize("source, warned", [("resources/models/tiny/mlm", True), ("roberta-base", False)])
def test_the_overview_warns_when_a_role_is_a_tiny_stand_in(tmp_path, source, warned):
    from counterfactory.report_labels import TINY_WARNING

    path = _provenance(tmp_path)
    prov = json.loads(path.read_text())
    prov["config"]["models"] = {"mlm": {"source": source}, "lm": {"source": "gpt2"}}
    path.write_text(json.dumps(prov))
    out = tmp_path / "o.html"
    write_overview(path, out)
    assert (TINY_WARNING in out.read_text()) is warned


def test_demo_overview_lists_what_the_demo_reads_and_no_option_value(repo, tmp_path):
    """The demo config through the command's own reader: SpuriousCF's Flickr30k part is off in the demo (nothing of
    it is read) and CounterCurate's ``attributes.images: both`` is an option, not a path."""
    from counterfactory.commands.report import _overview
    from counterfactory.config import load_full_config
    from types import SimpleNamespace

    cfg = load_full_config([repo / "config" / "demo.yaml"])
    path = tmp_path / "provenance.json"
    path.write_text(json.dumps({"config": cfg, "models": {}}, default=str))
    out = tmp_path / "overview.html"
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        assert _overview(SimpleNamespace(provenance=str(path), out=str(out))) == 0
    finally:
        os.chdir(cwd)
    text = out.read_text()
    assert "attributes.images" not in text and ": <code>both</code>" not in text
    assert "data.flickr30k" not in text and "resources/demo/celeba" in text
    assert "not recorded" not in text
