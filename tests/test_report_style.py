"""The report's stylesheet (report/style.css, issue 32 item 4): every documented ``snakemake --report`` command passes
it, and each selector it uses names elements, classes and ids that exist in the installed Snakemake report template,
so an upgrade that renames them fails here instead of silently bringing back a front page that opens half-way down
beside the rule graph, under the navigation panel."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STYLE = REPO / "report" / "style.css"
OPTION = "--report-stylesheet report/style.css"
#: classes docutils gives the front page's own elements (report/workflow.rst's warning box), not the template's
DOCUTILS_CLASSES = {"admonition", "warning", "admonition-title"}


def template_dir() -> Path:
    spec = importlib.util.find_spec("snakemake")       # the package's files, without importing the workflow engine
    assert spec and spec.submodule_search_locations, "snakemake is not installed"
    folder = Path(list(spec.submodule_search_locations)[0]) / "report" / "html_reporter" / "template"
    assert (folder / "index.html.jinja2").is_file(), f"no report template under {folder}"
    return folder


def template_elements() -> tuple[list[tuple[str, set[str]]], set[str]]:
    """``(tag, classes)`` of every element the template's React components and page create, and every id."""
    folder = template_dir()
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(folder.rglob("*.js")))
    page = (folder / "index.html.jinja2").read_text(encoding="utf-8")
    elements = [(tag, set(re.sub(r"\$\{[^}]*\}", " ", classes).split()))
                for tag, classes in re.findall(r'e\(\s*"(\w+)",\s*\{[^{}]*?\bclass(?:Name)?:\s*[`"]([^`"]*)[`"]', text)]
    elements += [(tag, set(classes.split())) for tag, classes in re.findall(r'<(\w+)[^>]*\bclass="([^"]*)"', page)]
    ids = set(re.findall(r'\bid:\s*"([\w-]+)"', text)) | set(re.findall(r'\bid="([\w-]+)"', page))
    return elements, ids


def selectors(css: str) -> list[str]:
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.DOTALL)
    return [s.strip() for block in re.findall(r"([^{}]+)\{[^{}]*\}", css) for s in block.split(",") if s.strip()]


def compounds(selector: str) -> list[tuple[str, list[str], list[str]]]:
    """``(tag, classes, ids)`` of each compound of a selector (``#app div.grow.h-screen`` -> two)."""
    out = []
    for part in re.split(r"\s*[>+~]\s*|\s+", selector):
        if not part:
            continue
        assert re.fullmatch(r"[\w-]*(?:[.#][\w-]+)*", part), f"report/style.css: unsupported selector part {part!r}"
        tag = re.match(r"[\w-]*", part).group(0)
        out.append((tag, re.findall(r"\.([\w-]+)", part), re.findall(r"#([\w-]+)", part)))
    return out


def test_every_selector_names_what_the_installed_report_template_creates():
    elements, ids = template_elements()
    assert elements and "rulegraph" in ids and "app" in ids      # the parser reads the template at all
    found = selectors(STYLE.read_text(encoding="utf-8"))
    assert len(found) >= 4
    for selector in found:
        for tag, classes, names in compounds(selector):
            for name in names:
                assert name in ids, f"report/style.css: #{name} ({selector}) is not an id of the report template"
            if classes and set(classes) <= DOCUTILS_CLASSES:   # our own front text, written by docutils
                continue
            if classes:
                assert any((not tag or tag == t) and set(classes) <= have for t, have in elements), (
                    f"report/style.css: no {tag or 'element'} of the installed Snakemake report template has the "
                    f"classes {classes} ({selector}); the template changed, update the stylesheet")


def test_stylesheet_overrides_the_centred_content_pane_and_the_side_by_side_front_page():
    """The two template layouts that hid the headline results: the content pane centres its content (a tall front
    page opened mid-way), and the front page puts the description beside the rule graph."""
    elements, _ = template_elements()
    css = re.sub(r"\s+", " ", STYLE.read_text(encoding="utf-8"))
    pane = {"grow", "h-screen", "overflow-auto"}
    assert any(pane <= c and {"items-center", "justify-center"} <= c for _, c in elements)
    assert re.search(r"div\.grow\.h-screen\.overflow-auto \{[^}]*align-items: flex-start", css)
    assert re.search(r"div\.grow\.h-screen\.overflow-auto \{[^}]*justify-content: flex-start", css)
    assert re.search(r"div\.grow\.flex\.gap-3\.items-start \{[^}]*flex-direction: column", css)
    assert re.search(r"nav\.h-screen\.overflow-auto \{[^}]*max-width:", css)


def _report_commands() -> list[tuple[str, str]]:
    """``(where, command)`` of every Snakemake command in the Makefile, README and docs that writes a report."""
    commands = []
    target = None
    recipes: dict[str, list[str]] = {}
    for line in (REPO / "Makefile").read_text().splitlines():
        if line and not line[0].isspace() and ":" in line and not line.startswith((".", "#")):
            target = line.split(":")[0]
            recipes[target] = []
        elif line.startswith("\t") and target:
            recipes[target].append(line.strip().rstrip("\\"))
    for name, lines in recipes.items():
        for command in re.split(r"\$\(BIN\)/", " ".join(lines)):
            commands.append((f"Makefile target {name}", command))
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        where = str(page.relative_to(REPO))
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL):      # one command per (continued) line
            commands += [(where, " ".join(line.split())) for line in block.replace("\\\n", " ").splitlines()]
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        commands += [(where, " ".join(span.split())) for span in re.findall(r"`([^`]+)`", prose)]   # inline, wrapped
    return [(where, c) for where, c in commands if "snakemake" in c and re.search(r"--report(?:\s|=|$)", c)]


def test_every_documented_report_command_passes_the_stylesheet():
    assert STYLE.is_file()
    found = _report_commands()
    assert any(w.startswith("Makefile target demo") for w, _ in found)
    assert any(w.startswith("Makefile target report") for w, _ in found)
    assert any(w.startswith("docs/") for w, _ in found)
    for where, command in found:
        assert OPTION in command, f"{where}: `{command}` writes a report without `{OPTION}`"
