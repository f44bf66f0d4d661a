"""Every result in the report has a short, distinct name (issue 44 item 2): rules pass ``labels`` to each
``report()`` item, and counterfactory.report_labels names each reported path by the paper's numbering."""

from __future__ import annotations

import re
from pathlib import Path

from counterfactory.report_labels import FIGURE_SPACE, LABELS, label, labels, pad_numbers

REPO = Path(__file__).resolve().parents[1]


def report_calls() -> list[str]:
    """The text of every ``report(...)`` call in rules/*.smk (balanced parentheses)."""
    out = []
    for path in sorted((REPO / "rules").glob("*.smk")):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"\breport\(", text):
            depth, i = 0, m.start() + len("report")
            while True:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i += 1
            out.append(f"{path.name}: {text[m.start():i + 1]}")
    return out


def test_every_report_item_has_labels():
    calls = [c for c in report_calls() if not c.endswith("report()")]
    assert len(calls) >= 35
    missing = [c for c in calls if "labels=" not in c]
    assert not missing, missing


def test_every_reported_path_gets_a_name_from_the_table():
    paths = []
    for call in report_calls():
        m = re.search(r'result_label\(f?"([^"]+)"\)', call)
        if m:
            paths.append(m.group(1))
    assert len(paths) >= 34
    filled = {"{table}": "retrieval", "{dataset}": "positions", "{stage}": "before", "{name}": "maxskew_boxplots",
              "{n}": "4"}
    for p in paths:
        for k, v in filled.items():
            p = p.replace(k, v)
        assert label(p) != p, f"{p}: no entry in counterfactory.report_labels.LABELS"


def test_the_eight_coco_cf_training_entries_are_distinct_and_sort_in_table_order():
    rel = ["training/tables/retrieval.html", "training/tables/classification.html",
           "training/tables/retrieval_flickr30k.html", "in_domain/table.html", "training/label_frequency.csv",
           "training/human_taxonomy.csv", "training/runs.csv", "training/curves.png"]
    names = [label(r, "coco_counterfactuals") for r in rel]
    assert len(set(names)) == len(names)
    # the panel sorts with localeCompare, where the figure space (whitespace) sorts before digits, as " " does here
    # (tests/test_report_browser.py checks the browser's own order)
    tables = sorted((n for n in names if n.startswith("Table")), key=lambda n: n.replace(FIGURE_SPACE, " "))
    assert [re.sub(r"\D", "", n.split("·")[0]) for n in tables] == ["3", "4", "5", "6", "12"]
    assert labels("tables.html", "cvld") == {"result": pad_numbers("Tables 1-4 · classification, retrieval, "
                                                                     "captioning")}
    assert label("tables.html", "spurious_retrieval") != label("tables.html", "cvld")
    assert FIGURE_SPACE in label("figures/figure4.png") and FIGURE_SPACE not in label("figures/figure10.png")
    assert label("probing/after/figures/marginal_gender_by_race.png") == pad_numbers(
        "Figure 4 · marginal gender by race, after filtering")
    assert all(re.compile(p) for p, _ in LABELS)


def test_every_caption_says_random_tiny_models_only_when_a_role_is_one():
    """Issue 44 item 3: each result's caption carries the warning on a demo run and not on a run with real roles."""
    import jinja2
    from docutils.core import publish_parts
    from types import SimpleNamespace

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)     # as snakemake.report sets it up
    warning = "Random tiny models: the numbers show that the pipeline runs, not what the papers found."
    captions = [p for p in sorted((REPO / "report").glob("*.rst")) if p.name != "workflow.rst"]
    assert len(captions) >= 20
    for models, expected in (({"clip": {"source": "resources/models/tiny/clip"}, "lm": {"source": "gpt2"}}, True),
                             ({"clip": {"source": "openai/clip-vit-base-patch32"}}, False)):
        config = {"models": models, "tiny_models": {"out_dir": "resources/models/tiny"}}
        for path in captions:
            text = env.from_string(path.read_text(encoding="utf-8")).render(snakemake=SimpleNamespace(config=config))
            html = publish_parts(text, writer_name="html", settings_overrides={"report_level": 2,
                                                                               "halt_level": 2})["body"]
            assert (html.count(warning) == 1) is expected, (path.name, html)


def test_job_parameters_read_as_names_and_the_shell_still_gets_flags():
    """Issue 44 item 3: the report's "Job parameters" showed ``labels=--label mlm=mlm --label lm=lm ...``."""
    import pickle

    from snakemake.iocontainers import Namedlist
    from snakemake.logging import format_dict
    from snakemake.utils import format as snakemake_format

    from counterfactory.report_labels import CliFlags, name_flags

    params = Namedlist(fromdict={"labels": name_flags("--label", {"mlm": "mlm", "clip_eval": "tiny CLIP"}),
                                 "pretrained": CliFlags("", "no pre-trained row")})
    assert format_dict(params) == "labels=mlm, clip_eval: tiny CLIP, pretrained=no pre-trained row"
    assert snakemake_format("x {params.labels.flags} {params.pretrained.flags}y", params=params) == (
        "x --label mlm=mlm --label 'clip_eval=tiny CLIP' y")
    # what Snakemake records for its rerun check (repr) is the flags, as before
    assert repr(params.labels) == repr("--label mlm=mlm --label 'clip_eval=tiny CLIP'")
    assert pickle.loads(pickle.dumps(params.labels)).readable == "mlm, clip_eval: tiny CLIP"
    rules = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "rules").glob("*.smk"))
    assert "{params.labels}" not in rules and "{params.labels.flags}" in rules


DOT = """digraph snakemake_dag {
    graph[bgcolor=white, margin=0];
    node[shape=box, style=rounded, fontname=sans,                 fontsize=10, penwidth=2];
    edge[penwidth=2, color=grey];
\t0[label = "all", color = "0.00 0.6 0.85", style="rounded"];
\t1[label = "cvld_tables", color = "0.29 0.6 0.85", style="rounded"];
\t2[label = "config_write_job", color = "0.03 0.6 0.85", style="rounded"];
\t3[label = "models_build_tiny", color = "0.30 0.6 0.85", style="rounded"];
\t1 -> 0
\t2 -> 1
\t2 -> 0
\t3 -> 1
}
"""


def test_the_rule_graph_leaves_out_the_bookkeeping_rules(tmp_path, capsys):
    """Issue 44 item 6: config_write_job and models_build_tiny have edges into almost every rule."""
    from counterfactory.cli import main
    from counterfactory.report_labels import drop_rules

    text, dropped = drop_rules(DOT)
    assert dropped == ["config_write_job", "models_build_tiny"]
    assert "config_write_job\"" not in text and "2 -> 1" not in text and "3 -> 1" not in text
    assert "\t1 -> 0" in text and 'not drawn: config_write_job, models_build_tiny' in text
    assert text.rstrip().endswith("}")
    (tmp_path / "g.dot").write_text(DOT)
    assert main(["report", "rulegraph", str(tmp_path / "g.dot"), "--out", str(tmp_path / "o.dot")]) == 0
    assert (tmp_path / "o.dot").read_text() == text
    assert main(["report", "rulegraph", str(tmp_path / "g.dot"), "--drop", "all", "--out", str(tmp_path / "a.dot")]) == 0
    assert '"all"' not in (tmp_path / "a.dot").read_text() and "models_build_tiny" in (tmp_path / "a.dot").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert "counterfactory report rulegraph" in makefile and "rulegraph_$$s.dot" in makefile


def test_sidebar_sub_groups_sort_in_each_papers_order():
    """Issue 44: Snakemake's panel sorts sub-groups alphabetically; the numbered titles make that each paper's order,
    and every sub-group the rules name is a known one."""
    from counterfactory import studies
    from counterfactory.report_labels import SECTIONS, section

    texts = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "rules").glob("*.smk"))
    used = set(re.findall(r'subcategory=report_section\("([^"]+)"\)', texts))
    assert len(used) >= 15 and used <= set(SECTIONS)
    assert "subcategory=\"" not in texts   # no sub-group bypasses the numbering
    for study, order in ((s.name, s.report_sections) for s in studies.specs()):
        assert order, study
        titles = [section(name, order) for name in SECTIONS]
        # the browser's localeCompare puts the figure space before digits, as " " sorts before digits here
        got = [t.split(" · ", 1)[1] for t in sorted(titles, key=lambda t: t.replace(FIGURE_SPACE, " "))]
        assert got[:len(order)] == list(order), study
        assert got[len(order):] == [s for s in SECTIONS if s not in order]
    assert section("Training", studies.spec("coco_counterfactuals").report_sections) == f"{FIGURE_SPACE}7 · Training"
    assert section("Tables", studies.spec("cvld").report_sections).endswith("4 · Tables")
    try:
        section("Trainnig")
    except ValueError as err:
        assert "SECTIONS" in str(err)
    else:
        raise AssertionError("an unknown sub-group must fail")
