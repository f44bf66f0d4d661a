"""``counterfactory analysis``: the label-frequency analysis of COCO-Counterfactuals appendix A.2 (and A.3.2's
human-taxonomy count). This module is the command line only, declared as data (``commands.Step``); the work is
done by :mod:`counterfactory.studies.coco_counterfactuals.label_frequency`."""

from __future__ import annotations

from . import CONFIG, OUT_HTML, OUT_MD, Param, Step, lazy_module, registrar

label_frequency = lazy_module("counterfactory.studies.coco_counterfactuals.label_frequency")


def _label_frequency(args) -> int:
    from ..config import load_config

    cfg = load_config(args.config)
    if args.human_taxonomy:   # A.3.2: needs only the released pairs and their altered subjects
        total = label_frequency.write_human_taxonomy(args.pairs, args.captions, args.human_taxonomy).iloc[-1]
        print(f"A.3.2 human taxonomy: {total['image_text_pairs']} image-text pairs "
              f"({total['counterfactual_pairs']} counterfactual pairs)")
    table, result = label_frequency.write_label_frequency(cfg, args.pairs, args.captions, args.runs, args.pretrained,
                                                          args.pretrained_role, args.out, args.correlation,
                                                          out_md=args.out_md, out_html=args.out_html)
    print(table.to_string(index=False))
    print(f"pearson r = {result['pearson_r']}, p = {result['pearson_p']} (n = {result['n']})")
    return 0


LABEL_FREQUENCY = Step(
    "label-frequency", help="Table 6: label frequency vs accuracy change, and their correlation",
    description="Reads the selected pairs, their counterfactual captions, the runs table and the pre-trained "
                "zero-shot classification results; writes a CSV table of each class's label frequency against its "
                "accuracy change (Table 6) and a JSON file with the Pearson / Spearman correlation of the two.",
    params=(CONFIG,
            Param("--pairs", required=True, help="selected_pairs.parquet: the released pairs that are counted"),
            Param("--captions", required=True,
                  help="counterfactual_captions.parquet (the altered subjects and captions of each pair)"),
            Param("--runs", required=True, help="runs table CSV"),
            Param("--pretrained", required=True, help="classification.csv of the zero-shot evaluation"),
            Param("--pretrained-role", default="clip_eval", help="row of the pre-trained model"),
            Param("--out", required=True, help="table CSV: dataset, label_frequency, mixture, delta"),
            Param("--correlation", required=True, help="JSON with Pearson / Spearman and n"),
            OUT_MD.but(help="Table 6 in the paper's wide layout (Markdown)"),
            OUT_HTML.but(help="Table 6 in the paper's wide layout (HTML page)"),
            Param("--human-taxonomy", metavar="FILE.csv",
                  help="also write appendix A.3.2's count of image-text pairs whose altered subject is one of its "
                       "14 human-related words (per word and in total)")),
    run=_label_frequency)

ANALYSIS = Step(
    "analysis", help="analyses across stages (COCO-CF appendix A.2 label frequency)",
    description="Analyses across stages: the label-frequency analysis of COCO-Counterfactuals appendix A.2.",
    steps=(LABEL_FREQUENCY,),
    metavar="<analysis>")

register = registrar(ANALYSIS)
