"""Rendering primitives every table and figure writer shares: the Agg ``pyplot``, pipe tables, escaping,
and the one description of a paper table with its one renderer.

A paper table is described once, as a :class:`Table`: :class:`Column` s (header label, alignment, an
optional upper header group) and rows of cells. A cell is a :class:`Cell` (mean, optional std, significance
and best marks, optional delta), plain text (escaped for each format), a :class:`Text` (written as given,
per format) or ``None`` (missing). :func:`render_markdown` / :func:`render_latex` / :func:`render_html` write it
(HTML: the form Snakemake's report shows; :func:`html_page` makes a standalone page); a new format is one more
entry in :func:`format_cell` and one more renderer.

Table builders (:mod:`counterfactory.tables`, :mod:`counterfactory.evaluation.tables`, the studies) only
build the description, so evaluation, generation and reporting code render alike without importing one
another.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    import pandas as pd

#: an empty cell (no run, no value)
MISSING_MD = "–"
MISSING_TEX = "--"

_TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (figures are only saved to files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def model_display_name(models: "Mapping | None", role: str) -> str:
    """How tables and figures name the model of ``role``: its ``models.<role>.display_name`` when the config gives
    one (the paper's name, e.g. ``BridgeTower``), else the model's own name taken from its source (the hub id's or
    folder's last part, ``openai/clip-vit-base-patch32`` -> ``clip-vit-base-patch32``), else the role itself (a
    role the config does not list)."""
    entry = (models or {}).get(role) if isinstance(models, Mapping) else None
    if isinstance(entry, str):
        entry = {"source": entry}
    if not isinstance(entry, Mapping):
        return str(role)
    if entry.get("display_name"):
        return str(entry["display_name"])
    source = str(entry.get("source") or "").rstrip("/\\")
    return source.replace("\\", "/").split("/")[-1] or str(role)


def model_display_names(models: "Mapping | None", roles) -> dict[str, str]:
    """:func:`model_display_name` of each of ``roles``, in their order."""
    return {r: model_display_name(models, r) for r in roles}


def escape_md(text: str) -> str:
    """A Markdown pipe-table cell or inline text from config or data: ``|`` escaped and ``<``, ``>`` written as
    entities, so markup in a name (``<script>``) is shown as text wherever the Markdown is rendered."""
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def code_span(text: str) -> str:
    """``text`` as one Markdown code span whatever it holds: fenced by one backtick more than its longest run of
    backticks (CommonMark), padded with a space where it starts or ends with one; markup inside is inert."""
    text = str(text).replace("\n", " ")
    runs = [len(r) for r in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def escape_tex(text: str) -> str:
    """A LaTeX cell: TeX's special characters escaped."""
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in str(text))


def markdown_table(frame: "pd.DataFrame", align: Sequence[str], floatfmt: str = "g") -> str:
    """A GitHub pipe table of ``frame`` (``DataFrame.to_markdown``, i.e. tabulate's ``pipe`` format), no
    index. Cells are written as given (no number parsing, so ``67.10`` keeps its zero); escape ``|`` in
    them first. ``align``: ``left``/``right``/``center`` per column, or ``auto``: tabulate parses that
    column's numbers (formatted with ``floatfmt``) and aligns it by type (numbers on the decimal point, text
    left)."""
    auto = [a == "auto" for a in align]
    if not any(auto):
        return frame.to_markdown(index=False, tablefmt="pipe", colalign=tuple(align), disable_numparse=True)
    colalign = tuple("global" if a else x for a, x in zip(auto, align))
    return frame.to_markdown(index=False, tablefmt="pipe", colalign=colalign,
                             disable_numparse=[i for i, a in enumerate(auto) if not a], floatfmt=floatfmt,
                             missingval=MISSING_MD)


# --------------------------------------------------------------------------------------------
# the description of a paper table
# --------------------------------------------------------------------------------------------
ALIGN_TEX = {"left": "l", "right": "r", "center": "c", "auto": "r"}


@dataclass
class Cell:
    """A numeric cell: ``mean`` with an optional ``std`` (NaN: none, e.g. n = 1) as subscript, ``significant``
    (underlined), ``best`` (bold) and an optional ``delta`` (NaN: none) shown as ``mean (+delta)``."""

    mean: float
    std: float = math.nan
    n: int = 0
    significant: bool = False
    best: bool = False
    delta: float = math.nan


@dataclass(frozen=True)
class Text:
    """A cell or header label given per format and written as is (no escaping); without ``tex``, LaTeX writes
    ``md`` escaped."""

    md: str
    tex: str | None = None
    html: str | None = None

    def get(self, fmt: str) -> str:
        if fmt == "tex":
            return escape_tex(self.md) if self.tex is None else self.tex
        if fmt == "html":       # Markdown's inline HTML (<sub>, <u>) is HTML already: pipes unescaped, **bold**
            if self.html is not None:
                return self.html
            return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", self.md.replace("\\|", "|"))
        return self.md


Value = Cell | Text | str | float | int | None


@dataclass
class Column:
    """A column: header ``label`` (text is escaped, a :class:`Text` is not), ``align`` (``left`` / ``right`` /
    ``center``, or ``auto``: Markdown hands the column's raw values to tabulate, which parses numbers, writes
    them with the table's ``floatfmt`` and aligns by type; LaTeX right-aligns) and an optional ``group``:
    LaTeX writes groups as an upper header row (``\\multicolumn``); Markdown, which has one header row,
    writes ``"group label"``."""

    label: str | Text
    align: str = "center"
    group: str | Text = ""


@dataclass
class Table:
    """One paper table. ``title``: Markdown's bold line above the table (and the LaTeX caption unless
    ``caption`` is given); ``note``: Markdown's paragraph below it; ``label``: LaTeX ``\\label``. ``decimals`` /
    ``std_decimals``: of the :class:`Cell` s' mean and std; ``floatfmt``: of raw numbers (``format`` spec;
    ``auto`` columns, see :class:`Column`). ``tex_math``: LaTeX writes cells in math mode
    (``$x_{std}$``). ``compact``: Markdown writes unpadded rows and a ``|---|`` rule (no alignment)."""

    columns: list[Column]
    rows: list[list[Value]] = field(default_factory=list)
    title: str | None = None
    caption: str | None = None
    label: str | None = None
    note: str | None = None
    decimals: int = 2
    std_decimals: int = 1
    floatfmt: str = "g"
    tex_math: bool = True
    compact: bool = False


# --------------------------------------------------------------------------------------------
# the renderer
# --------------------------------------------------------------------------------------------
MISSING = {"md": MISSING_MD, "tex": MISSING_TEX, "plain": "", "html": MISSING_MD}
ESCAPE = {"md": escape_md, "tex": escape_tex, "plain": str, "html": lambda t: html.escape(str(t), quote=False)}


def format_cell(cell: Cell | None, fmt: str, decimals: int = 2, std_decimals: int = 1, *,
                tex_math: bool = True) -> str:
    """``cell`` as ``fmt`` text: ``md`` (``**<u>x</u>**<sub>std</sub>``), ``tex``
    (``$\\underline{\\textbf{x}}_{std}$``) or ``plain`` (``x_{std}``, no marks); ``None`` is the missing mark."""
    if cell is None:
        return MISSING[fmt]
    text = f"{cell.mean:.{decimals}f}"
    std = f"{cell.std:.{std_decimals}f}" if math.isfinite(cell.std) else None
    if fmt == "md":
        if cell.significant:
            text = f"<u>{text}</u>"
        if cell.best:
            text = f"**{text}**"
        if std is not None:
            text += f"<sub>{std}</sub>"
    elif fmt == "tex":
        if cell.best:
            text = f"\\textbf{{{text}}}"
        if cell.significant:
            text = f"\\underline{{{text}}}"
        if std is not None:
            text += f"_{{{std}}}"
    elif fmt == "html":
        if cell.significant:
            text = f"<u>{text}</u>"
        if cell.best:
            text = f"<strong>{text}</strong>"
        if std is not None:
            text += f"<sub>{std}</sub>"
    elif fmt == "plain":
        if std is not None:
            text += f"_{{{std}}}"
    else:
        raise ValueError(f"unknown format {fmt!r}")
    if math.isfinite(cell.delta):
        text += f" ({cell.delta:+.{decimals}f})"
    return f"${text}$" if fmt == "tex" and tex_math else text


def format_value(value: Value, fmt: str, table: Table) -> str:
    """One cell of ``table`` as ``fmt`` text (text escaped, :class:`Text` as given, ``None`` missing)."""
    if isinstance(value, Cell) or value is None:
        return format_cell(value, fmt, table.decimals, table.std_decimals, tex_math=table.tex_math)
    if isinstance(value, Text):
        return value.get(fmt)
    if isinstance(value, float):
        if math.isnan(value):          # a missing number (e.g. the std of one run) prints as the missing mark
            return MISSING[fmt]
        return ESCAPE[fmt](format(value, table.floatfmt))
    return ESCAPE[fmt](value)


def script_label(text: str) -> str | Text:
    """A label with ``^X`` marks (CVLD's ``BLIP^PT``, ``BLIP^Bal``) as superscripts in every format (HTML and
    Markdown ``<sup>``, LaTeX ``$^{\\text{X}}$``); other text unchanged."""
    if not re.search(r"\^[A-Za-z0-9]", str(text)):
        return text
    md = re.sub(r"\^([A-Za-z0-9]+)", r"<sup>\1</sup>", escape_md(text))
    tex = "".join(_TEX_ESCAPES.get(ch, ch) if ch != "^" else ch for ch in str(text))
    tex = re.sub(r"\^([A-Za-z0-9]+)", r"$^{\\text{\1}}$", tex)
    return Text(md, tex, md)


def _is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _label(value: str | Text, fmt: str) -> str:
    return value.get(fmt) if isinstance(value, Text) else ESCAPE[fmt](value)


def _frame(table: Table, fmt: str, header) -> "pd.DataFrame":
    import pandas as pd

    raw = [fmt == "md" and c.align == "auto" for c in table.columns]
    rows = [[(None if _is_nan(v) else v) if r and not isinstance(v, (Cell, Text, str)) else format_value(v, fmt, table)
             for v, r in zip(row, raw)]
            for row in table.rows]     # numbers of auto columns go raw to tabulate (NaN as None: its missing mark)
    frame = pd.DataFrame(rows, columns=range(len(table.columns)), dtype=object)
    frame.columns = header
    return frame


def markdown_body(table: Table) -> str:
    """The pipe table of ``table`` alone (no title, no note, no final newline)."""
    header = [f"{_label(c.group, 'md')} {_label(c.label, 'md')}" if c.group else _label(c.label, "md")
              for c in table.columns]
    if table.compact:
        rows = [[format_value(v, "md", table) for v in row] for row in table.rows]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    return markdown_table(_frame(table, "md", header), [c.align for c in table.columns], table.floatfmt)


def render_markdown(table: Table) -> str:
    """``**title**``, the pipe table and the note, blank-line separated, ending in a newline."""
    lines = [f"**{table.title}**", ""] if table.title is not None else []
    lines += [markdown_body(table), ""]
    if table.note is not None:
        lines.append(table.note)
    return "\n".join(lines) + "\n"


def render_latex(table: Table) -> str:
    """A booktabs table (``Styler.to_latex``, placement ``t``, centred) with the caption escaped; column groups
    become a ``\\multicolumn`` header row."""
    import pandas as pd

    grouped = any(c.group for c in table.columns)
    if grouped:
        header = pd.MultiIndex.from_tuples([(_label(c.group, "tex"), _label(c.label, "tex")) for c in table.columns])
    else:
        header = [_label(c.label, "tex") for c in table.columns]
    caption = table.caption if table.caption is not None else table.title
    extra = {"multicol_align": "c"} if grouped else {}
    latex = _frame(table, "tex", header).style.hide(axis="index").to_latex(
        column_format="".join(ALIGN_TEX[c.align] for c in table.columns), position="t",
        position_float="centering", hrules=True, caption=escape_tex(caption) if caption is not None else None,
        label=table.label, **extra)
    return "% requires \\usepackage{booktabs}\n" + latex


_HTML_ALIGN = {"left": "left", "right": "right", "center": "center", "auto": "right"}
#: the style of a standalone HTML table page (Snakemake's report shows it in a frame)
HTML_STYLE = ("body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}"
              "table{border-collapse:collapse;margin:.5em 0 1em}caption{font-weight:bold;text-align:left;"
              "padding:.3em 0}th,td{padding:.25em .7em}thead tr:last-child th{border-bottom:1px solid #444}"
              "table{border-top:2px solid #444;border-bottom:2px solid #444}tbody tr:nth-child(even){"
              "background:#f6f6f6}p.note{font-size:.9em;color:#555;max-width:60em}")


def render_html(table: Table) -> str:
    """``table`` as an HTML ``<table>`` (the title as its caption; column groups as an upper header row with
    ``colspan``; best in ``<strong>``, significant ``<u>``, std in ``<sub>``) and the note as a paragraph. Text is
    escaped; a :class:`Text` is written as given (its ``html``, else its Markdown, which is HTML-ready)."""
    out = ['<table class="paper-table">']
    if table.title is not None:
        out.append(f"<caption>{ESCAPE['html'](table.title)}</caption>")
    out.append("<thead>")
    if any(c.group for c in table.columns):
        cells, i = [], 0
        while i < len(table.columns):
            group = table.columns[i].group
            j = i
            while j + 1 < len(table.columns) and table.columns[j + 1].group == group:
                j += 1
            span = f' colspan="{j - i + 1}"' if j > i else ""
            cells.append(f'<th{span} style="text-align:center">{_label(group, "html") if group else ""}</th>')
            i = j + 1
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("<tr>" + "".join(f'<th style="text-align:{_HTML_ALIGN[c.align]}">{_label(c.label, "html")}</th>'
                                for c in table.columns) + "</tr>")
    out.append("</thead>")
    out.append("<tbody>")
    for row in table.rows:
        out.append("<tr>" + "".join(f'<td style="text-align:{_HTML_ALIGN[c.align]}">{format_value(v, "html", table)}'
                                    f"</td>" for v, c in zip(row, table.columns)) + "</tr>")
    out.append("</tbody>")
    out.append("</table>")
    if table.note is not None:
        out.append(f'<p class="note">{ESCAPE["html"](table.note)}</p>')
    return "\n".join(out) + "\n"


def html_page(title: str, bodies: Sequence[str]) -> str:
    """A standalone HTML page of rendered tables (:func:`render_html`) under the heading ``title``."""
    head = html.escape(title)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">"
            f"<title>{head}</title><style>{HTML_STYLE}</style></head>\n<body>\n<h1>{head}</h1>\n"
            + "\n".join(bodies) + "</body>\n</html>\n")


def describe_frame(frame: "pd.DataFrame", floatfmt: str = "g", index: bool = False) -> Table:
    """A plain data frame (and its index, with ``index``) as a :class:`Table` of ``auto`` columns: headers and
    values written as given, numbers with ``floatfmt`` (what ``DataFrame.to_markdown(floatfmt=...)`` writes)."""
    columns = [Column(str(c), "auto") for c in frame.columns]
    rows = [list(r) for r in frame.to_numpy()]       # as tabulate reads a frame (one dtype for all columns)
    if index:
        name = frame.index.name
        columns.insert(0, Column("" if name is None else str(name), "auto"))
        rows = [[idx, *r] for idx, r in zip(frame.index, rows)]
    return Table(columns, rows, floatfmt=floatfmt)
