"""``counterfactory report {pair-grid,caption-examples,examples,overview,rulegraph}``: figures and tables for the
Snakemake report. This module is the command line only, declared as data (``commands.Step``); the work is done by
:mod:`counterfactory.plots`, :mod:`counterfactory.overview` and :mod:`counterfactory.report_labels`."""

from __future__ import annotations

from . import OUT, Param, Step, registrar


def _pairs(args) -> int:
    from ..plots import pair_grid

    pair_grid(args.pairs, args.out, n=args.n)
    return 0


def _captions(args) -> int:
    from ..plots import caption_examples

    caption_examples(args.captions, args.out, n=args.n)
    return 0


def _examples(args) -> int:
    from pathlib import Path

    from .. import studies
    from ..plots import export_grid

    # the study's title, not a results path (results/<run>/<study>/export/imagefolder)
    study = next((p for p in reversed(Path(args.imagefolder).resolve().parts) if p in studies.STUDIES), None)
    title = f"{studies.title(study)}: exported examples" if study else None
    export_grid(args.imagefolder, args.out, n=args.n, title=title, manifest=args.manifest)
    return 0


def _overview(args) -> int:
    from ..overview import write_overview
    from ..preflight import dataset_requirements

    def reads(cfg: dict) -> list[tuple[str, str]] | None:
        """What the run's jobs read: the DAG declares exactly preflight's dataset paths as inputs (the input
        functions check each against them; tests/test_data_catalogue.py compares the two)."""
        try:
            return [(n.key, n.path) for n in dataset_requirements(cfg) if n.path]
        except (KeyError, TypeError, AttributeError):   # a provenance file of an older config layout
            return None

    page = write_overview(args.provenance, args.out, reads=reads)
    print(f"overview of run {page['run_name']}: {len(page['studies'])} studies, {len(page['models'])} model roles "
          f"-> {args.out}")
    return 0


def _rulegraph(args) -> int:
    import sys
    from pathlib import Path

    from ..io import write_text
    from ..report_labels import BOOKKEEPING_RULES, drop_rules

    text = sys.stdin.read() if args.dot == "-" else Path(args.dot).read_text(encoding="utf-8")
    if "digraph" not in text:
        print(f"error: {args.dot} is not Graphviz output of `snakemake --rulegraph`", file=sys.stderr)
        return 2
    out, dropped = drop_rules(text, tuple(args.drop or BOOKKEEPING_RULES))
    write_text(args.out, out)
    print(f"rule graph without {', '.join(dropped) or 'nothing'} -> {args.out}")
    return 0


# ------------------------------------------------------------------------------------------- declarations

def _out(help: str) -> Param:
    """``--out``: the figure or table to write (no metavar: ``help`` names the format)."""
    return OUT.but(metavar=None, help=help)


PAIR_GRID = Step(
    "pair-grid", help="grid of original vs counterfactual images with captions and CLIP scores",
    description="Reads the selected pairs table (selected_pairs.parquet) and its images; writes a PNG grid of the "
                "first pairs with their captions and CLIP scores.",
    params=(Param("--pairs", required=True, help="selected_pairs.parquet"), _out("output PNG"),
            Param("--n", type=int, default=8, help="number of pairs")),
    run=_pairs)

CAPTION_EXAMPLES = Step(
    "caption-examples", help="CSV of original vs counterfactual captions with scores",
    description="Reads the counterfactual captions table; writes a CSV of example original / counterfactual caption "
                "pairs with their scores.",
    params=(Param("--captions", required=True, help="counterfactual_captions.parquet"), _out("output CSV"),
            Param("--n", type=int, default=20, help="number of examples (default: 20)")),
    run=_captions)

EXAMPLES = Step(
    "examples", help="grid of a study's exported examples (pairs, sets, edits) with their captions",
    description="Reads a study's exported imagefolder; writes a PNG grid of a few examples of each dataset config "
                "with their captions.",
    params=(Param("--imagefolder", required=True, help="the study's export/imagefolder folder"),
            Param("--manifest", metavar="FILE.json", help="its manifest, when kept outside the folder"),
            _out("output PNG"),
            Param("--n", type=int, default=3, help="examples per dataset config")),
    run=_examples)

OVERVIEW = Step(
    "overview", help="the report's front page: studies that ran, their data and models (HTML)",
    description="Reads the run's provenance JSON; writes the report's front page (HTML): the studies that ran, "
                "their data and their model roles.",
    params=(Param("--provenance", required=True, help="results/<run>/provenance.json"), _out("output HTML")),
    run=_overview)

RULEGRAPH = Step(
    "rulegraph", help="a readable rule graph: `snakemake --rulegraph` without the bookkeeping rules",
    description="Reads `snakemake --rulegraph` output (a file, or - for standard input) and writes it without the "
                "rules that feed almost every other rule (config_write_job, models_build_tiny, nltk_prepare), "
                "naming them in the graph's label.",
    params=(Param("dot", help="the rule graph (Graphviz .dot), or - for standard input"), _out("output .dot"),
            Param("--drop", action="append", metavar="RULE",
                  help="a rule to leave out (repeatable; default: config_write_job, models_build_tiny, "
                       "nltk_prepare)")),
    run=_rulegraph)

REPORT = Step(
    "report", help="figures and tables for the Snakemake report",
    description="Figures, tables and the front page of the Snakemake report.",
    metavar="<figure>",
    steps=(PAIR_GRID, CAPTION_EXAMPLES, EXAMPLES, OVERVIEW, RULEGRAPH))

register = registrar(REPORT)
