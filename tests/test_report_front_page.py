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
    results = {}
    for study, _, suffix, _ in headlines():
        results.setdefault(Cat(studies.title(study)), {}).setdefault(Cat("Tables"), []).append(
            Result(Path(f"results/demo/{study}/{suffix}")))
    results[Cat(studies.title("cvld"))][Cat("Tables")].append(Result(Path("results/demo/cvld/other.csv")))
    text = render(results, ["coco_counterfactuals", "cvld"])
    head = text[text.index("Headline results"):text.index("Run overview")]
    assert "Table 3: zero-shot image-text retrieval" in head and "results/demo/cvld/tables.html')>`__" in head
    assert head.count("javascript:app.showResultInfo") == 4          # two studies ran: their table and figure
    assert "other.csv" not in head and "countercurate" not in head
    html = docutils.publish_parts(text, writer="html", settings_overrides={"report_level": 2,
                                                                                  "halt_level": 2})["html_body"]
    assert html.index("Headline results") < html.index("results/demo/cvld/other.csv")
