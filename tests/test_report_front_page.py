"""The report's front page (report/workflow.rst, Snakemake's --report text) leads with each study's headline table
and figure (issue 32 item 4)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from counterfactory import studies

REPO = Path(__file__).resolve().parents[1]
FRONT = REPO / "report" / "workflow.rst"


def headlines() -> list[tuple[str, str, str, str]]:
    block = re.search(r"set headlines = (\[.*?\]) %\}", FRONT.read_text(encoding="utf-8"), re.DOTALL)
    assert block, "report/workflow.rst declares no headlines list"
    return ast.literal_eval(block.group(1))


@dataclass(order=True, frozen=True)
class Cat:
    name: str


@dataclass
class Result:
    path: Path
    labels: dict | None = None
    job: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(rule=SimpleNamespace(name="some_rule")))


def render(results: dict, studies_run: list[str]) -> str:
    jinja2 = pytest.importorskip("jinja2")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)     # as snakemake.report sets it up
    links = "\n".join([".. _Run overview: javascript:x()"] + [f".. _{c.name}: javascript:x()" for c in results])
    config = {"studies": studies_run, "run_name": "demo", "device": "cpu", "precision": "fp32", "seed": 0}
    return env.from_string(FRONT.read_text(encoding="utf-8") + "\n" + links + "\n").render(
        snakemake=SimpleNamespace(config=config), categories=results, files=[])


def test_every_study_has_a_headline_table_and_figure_that_a_rule_reports():
    rules = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "rules").glob("*.smk"))
    reported = re.findall(r'report\(\s*(?:directory\()?f"\{S\}/([^"]+)"', rules)
    found = {}
    for study, what, suffix, caption in headlines():
        found.setdefault(study, []).append(what)
        assert "\n" not in caption and len(caption) < 120, caption                  # one line
        pattern = [re.sub(r"(\\\{)+\w+(\\\})+", r"[^/]+", re.escape(r)) for r in reported]
        pattern += [p + r"/[^/]+\.png" for p in pattern if p.endswith("figures")]   # a reported folder's files
        assert any(re.fullmatch(p, suffix) for p in pattern), f"{study}: no rule reports {suffix}"
    assert {s: sorted(w) for s, w in found.items()} == {s: ["figure", "table"] for s in studies.STUDIES}


def test_front_page_renders_the_headlines_first_as_links(tmp_path):
    docutils = pytest.importorskip("docutils.core")
    from counterfactory.report_labels import labels

    results = {}
    for study, _, suffix, _ in headlines():
        results.setdefault(Cat(studies.title(study)), {}).setdefault(Cat("Tables"), []).append(
            Result(Path(f"results/demo/{study}/{suffix}"), labels(suffix, study)))
    results[Cat(studies.title("cvld"))][Cat("Tables")].append(
        Result(Path("results/demo/cvld/other.csv"), {"result": "some CSV"}))
    text = render(results, ["coco_counterfactuals", "cvld"])
    head = text[text.index("Headline results"):text.index("Run overview")]
    assert "Table 3: zero-shot image-text retrieval" in head and "results/demo/cvld/tables.html')" in head
    # issue 44: a headline opens the table or figure itself (not only its details in the navigation panel)
    assert head.count("javascript:void(app.setView({content:") == 4          # two studies ran: table and figure
    assert head.count("content:'html'") == 2 and head.count("content:'img'") == 2
    assert "other.csv" not in head and "countercurate" not in head
    html = docutils.publish_parts(text, writer="html", settings_overrides={"report_level": 2,
                                                                                  "halt_level": 2})["html_body"]
    assert html.index("Headline results") < html.index("results/demo/cvld/other.csv")
    # the list of every result: links named by their labels (no figure-space padding on the front page)
    assert ">some CSV</a>" in html and "showResultInfo(decodeURIComponent('results/demo/cvld/other.csv'))" in html
    assert ">Tables 1-4 · classification, retrieval, captioning</a>" in html


@pytest.mark.parametrize("source, banner", [("resources/models/tiny/clip", True), ("openai/clip-vit-base-patch32",
                                                                                     False)])
def test_front_page_warns_when_a_role_is_a_tiny_stand_in(source, banner):
    docutils = pytest.importorskip("docutils.core")
    jinja2 = pytest.importorskip("jinja2")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    config = {"studies": [], "run_name": "demo", "device": "cpu", "precision": "fp32", "seed": 0,
              "models": {"clip": {"source": source}, "lm": {"source": "gpt2"}},
              "tiny_models": {"out_dir": "resources/models/tiny"}}
    text = env.from_string(FRONT.read_text(encoding="utf-8") + "\n.. _Run overview: javascript:x()\n").render(
        snakemake=SimpleNamespace(config=config), categories={}, files=[])
    html = docutils.publish_parts(text, writer="html", settings_overrides={"report_level": 2,
                                                                                  "halt_level": 2})["html_body"]
    assert ('class="admonition warning"' in html) is banner
    assert ("Random tiny models: the numbers show that the pipeline runs, not what the papers found" in html) is banner
    if banner:
        assert "1 of 2 model roles" in html
