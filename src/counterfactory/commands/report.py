"""``counterfactory report``: figures and tables for the Snakemake report."""

from __future__ import annotations


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


def register(sub) -> None:
    p = sub.add_parser("report", help="figures and tables for the Snakemake report",
                       description="Figures, tables and the front page of the Snakemake report.")
    s = p.add_subparsers(dest="report_command", metavar="<figure>")
    s.required = True
    g = s.add_parser("pair-grid", help="grid of original vs counterfactual images with captions and CLIP scores",
                     description="Reads the selected pairs table (selected_pairs.parquet) and its images; writes a "
                                 "PNG grid of the first pairs with their captions and CLIP scores.")
    g.add_argument("--pairs", required=True, help="selected_pairs.parquet")
    g.add_argument("--out", required=True, help="output PNG")
    g.add_argument("--n", type=int, default=8, help="number of pairs")
    g.set_defaults(func=_pairs)
    c = s.add_parser("caption-examples", help="CSV of original vs counterfactual captions with scores",
                     description="Reads the counterfactual captions table; writes a CSV of example original / "
                                 "counterfactual caption pairs with their scores.")
    c.add_argument("--captions", required=True, help="counterfactual_captions.parquet")
    c.add_argument("--out", required=True, help="output CSV")
    c.add_argument("--n", type=int, default=20, help="number of examples (default: 20)")
    c.set_defaults(func=_captions)
    e = s.add_parser("examples", help="grid of a study's exported examples (pairs, sets, edits) with their captions",
                     description="Reads a study's exported imagefolder; writes a PNG grid of a few examples of each "
                                 "dataset config with their captions.")
    e.add_argument("--imagefolder", required=True, help="the study's export/imagefolder folder")
    e.add_argument("--manifest", metavar="FILE.json", help="its manifest, when kept outside the folder")
    e.add_argument("--out", required=True, help="output PNG")
    e.add_argument("--n", type=int, default=3, help="examples per dataset config")
    e.set_defaults(func=_examples)
    o = s.add_parser("overview", help="the report's front page: studies that ran, their data and models (HTML)",
                     description="Reads the run's provenance JSON; writes the report's front page (HTML): the "
                                 "studies that ran, their data and their model roles.")
    o.add_argument("--provenance", required=True, help="results/<run>/provenance.json")
    o.add_argument("--out", required=True, help="output HTML")
    o.set_defaults(func=_overview)
    r = s.add_parser("rulegraph", help="a readable rule graph: `snakemake --rulegraph` without the bookkeeping rules",
                     description="Reads `snakemake --rulegraph` output (a file, or - for standard input) and writes it "
                                 "without the rules that feed almost every other rule (config_write_job, "
                                 "models_build_tiny, nltk_prepare), naming them in the graph's label.")
    r.add_argument("dot", help="the rule graph (Graphviz .dot), or - for standard input")
    r.add_argument("--out", required=True, help="output .dot")
    r.add_argument("--drop", action="append", metavar="RULE",
                   help="a rule to leave out (repeatable; default: config_write_job, models_build_tiny, nltk_prepare)")
    r.set_defaults(func=_rulegraph)
