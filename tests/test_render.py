"""The one table description and renderer (counterfactory.render): cells, Markdown, LaTeX, compact and auto columns."""

from __future__ import annotations

import math

import pandas as pd

from counterfactory import render
from counterfactory.render import Cell, Column, Table, Text


def test_cell_formats():
    c = Cell(67.104, 0.44, 3, significant=True, best=True)
    assert render.format_cell(c, "md") == "**<u>67.10</u>**<sub>0.4</sub>"
    assert render.format_cell(c, "tex") == "$\\underline{\\textbf{67.10}}_{0.4}$"
    assert render.format_cell(c, "plain", 1, 2) == "67.1_{0.44}"
    assert render.format_cell(Cell(40.0), "tex") == "$40.00$"                  # no std (n = 1): no subscript
    assert render.format_cell(Cell(50.0, delta=-1.25), "tex", tex_math=False) == "50.00 (-1.25)"
    assert [render.format_cell(None, f) for f in ("md", "tex", "plain")] == [render.MISSING_MD, render.MISSING_TEX, ""]


def test_markdown_title_note_escaping_and_missing():
    t = Table([Column("Model|x", "left"), Column("R@1", "right")],
              [["a|b", Cell(1.0, 0.5)], [Text("**c**"), None]], title="T", note="N.")
    text = render.render_markdown(t)
    assert text.startswith("**T**\n\n| Model\\|x") and text.endswith("\n\nN.\n")
    assert "| a\\|b " in text and "| **c** " in text and f" {render.MISSING_MD} |" in text
    assert render.render_markdown(Table([Column("x")], [["1"]])) == "|  x  |\n|:---:|\n|  1  |\n\n"


def test_latex_groups_caption_and_label():
    t = Table([Column("Row", "left"), Column("Pre", group="A_1"), Column("Post", group="A_1")],
              [["r&1", Cell(1.0, best=True), Cell(2.0, significant=True)]], title="50% done", label="tab:x")
    tex = render.render_latex(t)
    assert tex.startswith("% requires \\usepackage{booktabs}\n\\begin{table}[t]\n\\centering\n")
    assert "\\caption{50\\% done}" in tex and "\\label{tab:x}" in tex and "\\begin{tabular}{lcc}" in tex
    assert "\\multicolumn{2}{c}{A\\_1}" in tex
    assert "r\\&1 & $\\textbf{1.00}$ & $\\underline{2.00}$ \\\\" in tex
    md = render.render_markdown(t)
    assert "A\\_1" not in md and "A_1 Pre" in md                               # one Markdown header row


def test_compact_and_auto_columns():
    compact = Table([Column("a|b"), Column("c")], [["x", "p|q"]], compact=True)
    assert render.markdown_body(compact) == "| a\\|b | c |\n|---|---|\n| x | p\\|q |"
    frame = pd.DataFrame({"m": [0.1234, math.nan], "n": [3, 4]}, index=pd.Index(["a", "b"], name="seg"))
    # a missing number prints as the missing mark, not "nan" (issue 44: "Std nan" in SpuriousCF's Figure 4 table)
    assert render.markdown_body(render.describe_frame(frame, ".2f", index=True)) == (
        "| seg   |    m |    n |\n|:------|-----:|-----:|\n| a     | 0.12 | 3.00 |\n| b     | –    | 4.00 |")
    assert frame.fillna(0).to_markdown(index=False) == render.markdown_body(
        render.describe_frame(frame.fillna(0)))                                  # otherwise as pandas writes it
    assert render.markdown_body(render.describe_frame(frame)) == (
        "|      m |   n |\n|-------:|----:|\n| 0.1234 |   3 |\n| –      |   4 |")
    assert "nan" not in render.render_html(render.describe_frame(frame, ".2f"))


def test_carets_are_superscripts_and_a_one_run_table_has_no_subscript_note():
    """Issue 44: CVLD's BLIP^PT / BLIP^Bal printed with raw carets; the subscript note stood under tables whose
    cells have no standard deviation."""
    from counterfactory.tables import NOTE, NOTE_ONE_RUN, PaperTable, describe

    label = render.script_label("COCO 100% BLIP^Bal")
    assert label.get("html") == "COCO 100% BLIP<sup>Bal</sup>" and label.get("md") == label.get("html")
    assert label.get("tex") == "COCO 100\\% BLIP$^{\\text{Bal}}$"
    assert render.script_label("Hard label") == "Hard label"

    def table(std):
        t = PaperTable(row_keys=["pretrained"], row_labels=["BLIP^PT"], info_columns=[], info={"pretrained": {}},
                       col_keys=[("e", "m")], col_labels=["m"])
        t.cells[("pretrained", ("e", "m"))] = Cell(mean=1.0, std=std, n=1 if math.isnan(std) else 3)
        return describe(t)

    assert table(math.nan).note == NOTE_ONE_RUN and table(0.5).note == NOTE
    html = render.render_html(table(math.nan))
    assert "BLIP<sup>PT</sup>" in html and "^" not in html and "subscript" not in html


def test_text_falls_back_to_escaped_markdown_in_latex():
    assert Text("a_b").get("tex") == "a\\_b" and Text("a_b", "A").get("tex") == "A" and Text("a_b").get("md") == "a_b"


def test_html_renderer_writes_the_same_table_as_markdown_and_latex():
    """Issue 32 item 3: Snakemake's report shows HTML, not Markdown; the HTML comes from the same description."""
    from html.parser import HTMLParser

    from counterfactory.render import Cell, Column, Table, Text, html_page, render_html

    table = Table([Column("Model <a>", "left"), Column("R@1", "center", "Flickr30k I→T"),
                   Column("R@5", "center", "Flickr30k I→T"), Column(Text("\\|D<sub>train</sub>\\|"), "right")],
                  [["CLIP & co", Cell(61.234, 0.51, best=True, significant=True), None, "13,928"]],
                  title="Table 3", note="Mean over seeds.")
    page = html_page("Table 3", [render_html(table)])

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.spans, self.inside = [], [], False

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.inside = False

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            if tag in ("td", "th"):
                self.rows[-1].append("")
                self.spans.append(dict(attrs).get("colspan"))
                self.inside = True

        def handle_data(self, data):
            if self.inside:
                self.rows[-1][-1] += data

    parser = Cells()
    parser.feed(page)
    assert parser.rows[0] == ["", "Flickr30k I→T", ""]               # group row: one cell spanning R@1, R@5
    assert "2" in parser.spans
    assert parser.rows[1] == ["Model <a>", "R@1", "R@5", "|Dtrain|"]  # escaped text, Text written as HTML
    assert parser.rows[2] == ["CLIP & co", "61.230.5", "–", "13,928"]
    assert "<strong><u>61.23</u></strong><sub>0.5</sub>" in page     # bold best, underlined significant
    assert "<caption>Table 3</caption>" in page and '<p class="note">Mean over seeds.</p>' in page
    assert page.startswith("<!DOCTYPE html>") and "&lt;a&gt;" in page and "CLIP &amp; co" in page
