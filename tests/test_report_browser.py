"""The report in a real browser (issue 44): headless Chromium opens a Snakemake report made with the project's
front page (report/workflow.rst), stylesheet and labels, clicks a headline link and finds the table open in the
content pane and named in the navigation panel. Skips, naming the reason, only when no Chromium is installed
(.ci/run installs Debian's). The screenshots land in the test's tmp_path (recorded as properties)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from browser import SKIP_REASON, Chromium, check_headline_opens, find_chromium
from counterfactory.report_labels import label

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

TABLE_HTML = ("<!doctype html><html><head><meta charset='utf-8'></head><body><table id='t1'>"
              "<caption>Table 1: CelebA classification</caption><tr><th>model</th><th>DEO</th></tr>"
              "<tr><td>BLIP<sup>PT</sup></td><td>1.0<sub>0.1</sub></td></tr></table></body></html>")
PNG_1PX = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


def chromium_or_skip() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip(SKIP_REASON)
    return path


def fixture_report(work: Path, models: dict) -> Path:
    """A two-result CVLD report (its Tables 1-4 page and Figure 4) with the project's front page and stylesheet."""
    from counterfactory import report_labels, studies

    config = {"studies": ["cvld"], "run_name": "demo", "device": "cpu", "precision": "fp32", "seed": 0,
              "models": models, "tiny_models": {"out_dir": "resources/models/tiny"}}
    snakefile = work / "Snakefile"
    snakefile.write_text(textwrap.dedent(f"""\
        import base64
        config.update({config!r})
        report: {str(REPO / "report" / "workflow.rst")!r}

        rule all:
            input: "results/demo/cvld/tables.html", "results/demo/cvld/figures/figure4.png", "results/demo/report/overview.html"

        rule overview:
            output:
                report("results/demo/report/overview.html", category="Run overview",
                       labels={{"result": "which data and models this run used"}})
            run:
                open(output[0], "w").write("<html><body><h1>overview</h1></body></html>")

        rule tables:
            output:
                report("results/demo/cvld/tables.html", category={studies.title("cvld")!r}, subcategory="Tables",
                       labels={report_labels.labels("tables.html", "cvld")!r},
                       caption={str(REPO / "report" / "cvld_tables.rst")!r})
            run:
                open(output[0], "w").write({TABLE_HTML!r})

        rule figure:
            output:
                report("results/demo/cvld/figures/figure4.png", category={studies.title("cvld")!r},
                       subcategory="Figures", labels={report_labels.labels("figures/figure4.png", "cvld")!r},
                       caption={str(REPO / "report" / "cvld_tables.rst")!r})
            run:
                open(output[0], "wb").write(base64.b64decode({PNG_1PX!r}))
        """))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    base = [SNAKEMAKE, "--snakefile", str(snakefile), "--directory", str(work), "--cores", "1", "--quiet", "all"]
    for extra in ([], ["--report", "report.html", "--report-stylesheet", str(REPO / "report" / "style.css")]):
        proc = subprocess.run(base + extra, capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work / "report.html"


TINY = {"clip": {"source": "resources/models/tiny/clip"}, "blip": {"source": "resources/models/tiny/blip"}}


def test_a_headline_link_opens_the_table_in_chromium(tmp_path, record_property):
    chromium = chromium_or_skip()
    report = fixture_report(tmp_path, TINY)
    with Chromium(chromium, tmp_path / "profile") as browser:
        got = check_headline_opens(browser, report, "Tables 1-4: fairness and accuracy", "CelebA classification",
                                   "classification, retrieval, captioning", tmp_path / "shots")
    record_property("front_page_screenshot", got["front_png"])
    record_property("opened_screenshot", got["opened_png"])
    # the link is on screen and clickable, the table fills the content pane beside the navigation panel
    assert got["link"]["w"] > 50 and got["link"]["href"].startswith("javascript:")
    assert got["frame"]["w"] > 700 and got["frame"]["h"] > 500 and got["frame"]["src"].startswith("data:text/html")
    assert got["table"]["w"] > 0 and got["table"]["h"] > 0 and "BLIP" in got["table"]["text"]
    assert "Tables" in got["nav"] and "classification, retrieval, captioning" in got["nav"]
    assert "Random tiny models: the numbers show that the pipeline runs" in got["front_text"]
    assert Path(got["front_png"]).stat().st_size > 5_000


def test_the_figure_link_shows_the_image_and_no_banner_with_real_roles(tmp_path):
    chromium = chromium_or_skip()
    report = fixture_report(tmp_path, {"clip": {"source": "openai/clip-vit-base-patch32"}})
    with Chromium(chromium, tmp_path / "profile") as browser:
        browser.open(report.resolve().as_uri())
        browser.wait_for("document.querySelector('#app .prose a') !== null")
        assert browser.js("document.querySelector('#app .prose .admonition') === null")
        # the front page's full list: every result is a link named by its label
        names = browser.js("[...document.querySelectorAll('#app .prose li a')].map(a => a.textContent)")
        # the navigation panel sorts labels with localeCompare: the padded "Table 3" comes before "Table 12"
        order = browser.js("[" + ", ".join(json.dumps(label(r)) for r in ("training/tables/retrieval_x.html",
                           "in_domain/table.html", "training/tables/retrieval.html")) + "]"
                           ".sort((a, b) => a.localeCompare(b)).map(s => s.replace(/\\D/g, '').slice(0, 2))")
        assert order == ["3", "5", "12"], order
        browser.click_link("Figure 4: DEO and AP")
        img = browser.wait_for("(() => { const i = document.querySelector('#app img[src^=\"data:image/png\"]');"
                               " return i ? i.getAttribute('src').length : 0; })()")
        assert img > 50
    assert any("DEO and AP vs λ" in n for n in names) and any("classification, retrieval" in n for n in names)


def test_the_built_demo_report_if_there_is_one(tmp_path):
    """The real demo report (``make demo`` writes results/demo/report.html; COUNTERFACTORY_DEMO_REPORT names
    another): COCO-Counterfactuals' Table 3 opens from the front page."""
    report = Path(os.environ.get("COUNTERFACTORY_DEMO_REPORT") or REPO / "results" / "demo" / "report.html")
    if not report.is_file():
        pytest.skip(f"no demo report at {report} (run `make demo`)")
    chromium = chromium_or_skip()
    with Chromium(chromium, tmp_path / "profile") as browser:
        got = check_headline_opens(browser, report, "Table 3: zero-shot image-text retrieval", "R@1",
                                   "retrieval after fine-tuning", tmp_path / "shots")
    assert got["frame"]["w"] > 700 and got["table"]["h"] > 0
