"""``counterfactory analysis``: the label-frequency analysis of COCO-Counterfactuals appendix A.2 (and A.3.2's
human-taxonomy count)."""

from __future__ import annotations


def _label_frequency(args) -> int:
    from ..studies.coco_counterfactuals.label_frequency import (correlate_or_explain, human_taxonomy_table,
                                                                label_frequency_table, released_subjects, table6)
    from ..config import load_config
    from ..io import write_csv, write_json, write_text
    from ..render import html_page, render_html, render_markdown

    cfg = load_config(args.config)
    if args.human_taxonomy:   # A.3.2: needs only the released pairs and their altered subjects
        taxonomy = human_taxonomy_table(released_subjects(args.pairs, args.captions))
        write_csv(args.human_taxonomy, taxonomy)
        total = taxonomy.iloc[-1]
        print(f"A.3.2 human taxonomy: {total['image_text_pairs']} image-text pairs "
              f"({total['counterfactual_pairs']} counterfactual pairs)")
    table = label_frequency_table(cfg, args.pairs, args.captions, args.runs, args.pretrained, args.pretrained_role)
    write_csv(args.out, table)
    result = correlate_or_explain(table, "label_frequency", "delta", source=args.out)
    write_json(args.correlation, result)
    if args.out_md or args.out_html:   # Table 6 as the paper lays it out
        wide = table6(table, result)
        if args.out_md:
            write_text(args.out_md, render_markdown(wide))
        if args.out_html:
            write_text(args.out_html, html_page("COCO-Counterfactuals: Table 6", [render_html(wide)]))
    print(table.to_string(index=False))
    print(f"pearson r = {result['pearson_r']}, p = {result['pearson_p']} (n = {result['n']})")
    return 0


def register(sub) -> None:
    from . import add_config_option

    p = sub.add_parser("analysis", help="analyses across stages (COCO-CF appendix A.2 label frequency)",
                       description="Analyses across stages: the label-frequency analysis of COCO-Counterfactuals "
                                   "appendix A.2.")
    s = p.add_subparsers(dest="analysis_command", metavar="<analysis>")
    s.required = True
    lf = s.add_parser("label-frequency", help="Table 6: label frequency vs accuracy change, and their correlation",
                      description="Reads the selected pairs, their counterfactual captions, the runs table and the "
                                  "pre-trained zero-shot classification results; writes a CSV table of each "
                                  "class's label frequency against its accuracy change (Table 6) and a JSON file "
                                  "with the Pearson / Spearman correlation of the two.")
    add_config_option(lf)
    lf.add_argument("--pairs", required=True, help="selected_pairs.parquet: the released pairs that are counted")
    lf.add_argument("--captions", required=True,
                    help="counterfactual_captions.parquet (the altered subjects and captions of each pair)")
    lf.add_argument("--runs", required=True, help="runs table CSV")
    lf.add_argument("--pretrained", required=True, help="classification.csv of the zero-shot evaluation")
    lf.add_argument("--pretrained-role", default="clip_eval", help="row of the pre-trained model")
    lf.add_argument("--out", required=True, help="table CSV: dataset, label_frequency, mixture, delta")
    lf.add_argument("--correlation", required=True, help="JSON with Pearson / Spearman and n")
    lf.add_argument("--out-md", metavar="FILE.md", help="Table 6 in the paper's wide layout (Markdown)")
    lf.add_argument("--out-html", metavar="FILE.html", help="Table 6 in the paper's wide layout (HTML page)")
    lf.add_argument("--human-taxonomy", metavar="FILE.csv",
                    help="also write appendix A.3.2's count of image-text pairs whose altered subject is one of its "
                         "14 human-related words (per word and in total)")
    lf.set_defaults(func=_label_frequency)
