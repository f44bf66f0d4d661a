"""Rendering primitives every table and figure writer shares: the Agg ``pyplot``, pipe tables, escaping,
and the one description of a paper table with its one renderer.

A paper table is described once, as a :class:`Table`: :class:`Column` s (header label, alignment, an
optional upper header group) and rows of cells. A cell is a :class:`Cell` (mean, optional std, significance
and best marks, optional delta), plain text (escaped for each format), a :class:`Text` (written as given,
per format) or ``None`` (missing). :func:`render_markdown` / :func:`render_latex` write it; a new format
(e.g. HTML through ``Styler.to_html``) is one more entry in :func:`format_cell` and one more renderer.

Table builders (:mod:`counterfactory.tables`, :mod:`counterfactory.evaluation.tables`, the studies) only
build the description, so evaluation, generation and reporting code render alike without importing one
another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

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


def escape_md(text: str) -> str:
    """A Markdown pipe-table cell: ``|`` escaped."""
    return str(text).replace("|", "\\|")


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
                             disable_numparse=[i for i, a in enumerate(auto) if not a], floatfmt=floatfmt)


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

    def get(self, fmt: str) -> str:
        if fmt == "tex":
            return escape_tex(self.md) if self.tex is None else self.tex
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
MISSING = {"md": MISSING_MD, "tex": MISSING_TEX, "plain": ""}
ESCAPE = {"md": escape_md, "tex": escape_tex, "plain": str}


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
        return ESCAPE[fmt](format(value, table.floatfmt))
    return ESCAPE[fmt](value)


def _label(value: str | Text, fmt: str) -> str:
    return value.get(fmt) if isinstance(value, Text) else ESCAPE[fmt](value)


def _frame(table: Table, fmt: str, header) -> "pd.DataFrame":
    import pandas as pd

    raw = [fmt == "md" and c.align == "auto" for c in table.columns]
    rows = [[v if r and not isinstance(v, (Cell, Text)) else format_value(v, fmt, table) for v, r in zip(row, raw)]
            for row in table.rows]
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


def describe_frame(frame: "pd.DataFrame", floatfmt: str = "g", index: bool = False) -> Table:
    """A plain data frame (and its index, with ``index``) as a :class:`Table` of ``auto`` columns: headers and
    values written as given, numbers with ``floatfmt`` (what ``DataFrame.to_markdown(floatfmt=...)`` writes)."""
    columns = [Column(Text(str(c)), "auto") for c in frame.columns]
    rows = [list(r) for r in frame.to_numpy()]       # as tabulate reads a frame (one dtype for all columns)
    if index:
        name = frame.index.name
        columns.insert(0, Column(Text("" if name is None else str(name)), "auto"))
        rows = [[idx, *r] for idx, r in zip(frame.index, rows)]
    return Table(columns, rows, floatfmt=floatfmt)
