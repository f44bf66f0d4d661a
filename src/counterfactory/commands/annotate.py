"""``counterfactory annotate {tasks,push,pull,read,agreement}``: the human verification round trip with Label Studio (issue
47.3). The command line only; the work is :mod:`counterfactory.filters.annotate`."""

from __future__ import annotations

import json
import logging

from . import OUT, OUT_DIR, SEED, Param, Step, lazy_module, positive_int, registrar

log = logging.getLogger(__name__)

# imported when a subcommand runs (the filters package imports torch); building the parser must not import it
annotate = lazy_module("counterfactory.filters.annotate")
cards = lazy_module("counterfactory.filters.cards")


def _tasks(args) -> int:
    items = annotate.items_of(args.items)
    scores = cards.read_scores(args.scores, args.score_column)
    paths = annotate.write_tasks(args.out_dir, items, scores, threshold=args.threshold,
                                 n_uncertain=args.uncertain, n_random=args.random, seed=args.seed,
                                 image_mode=args.image_url, document_root=args.document_root,
                                 question=args.question)
    n = len(json.loads(paths[0].read_text(encoding="utf-8")))
    print(f"{args.out_dir}: {n} Label Studio tasks (import tasks.json; labelling interface: label_config.xml)")
    return 0


def _client(args):
    import os

    return annotate.LabelStudio(args.url, args.token or os.environ.get("LABEL_STUDIO_API_KEY", ""))


def _push(args) -> int:
    project = annotate.push(_client(args), args.tasks, args.title, args.storage)
    print(project)   # the project id, for scripts
    return 0


def _pull(args) -> int:
    annotate.pull(_client(args), args.project, args.out, args.format)
    print(f"{args.out}: project {args.project}'s {args.format} export")
    return 0


def _read(args) -> int:
    audit = annotate.read_export(args.export, from_name=args.from_name)
    annotate.write_audit(audit, args.out)
    print(f"{args.out}: {len(audit)} answers on {audit['item_id'].nunique()} items by "
          f"{audit['annotator'].nunique()} annotator(s)")
    return 0


def _agreement(args) -> int:
    audit = annotate.read_answers(args.audit)
    filters = {}
    for spec in args.filter:
        name, path, column, threshold, keep = annotate.parse_filter(spec)
        filters[name] = annotate.filter_kept(path, column, threshold, keep)
    result = annotate.write_agreement(args.out_dir, audit, filters)
    print(annotate.render_agreement(result))
    return 0


# ------------------------------------------------------------------------------------------- declarations

#: the Label Studio server of `push` and `pull`
SERVER = (Param("--url", default="http://localhost:8080", help="Label Studio's address (default http://localhost:8080)"),
          Param("--token", default=None,
                help="your account's access token (default: the LABEL_STUDIO_API_KEY environment variable)"))

TASKS = Step(
    "tasks", help="Label Studio tasks of the least certain and of randomly drawn candidates",
    description="Pick the --uncertain items whose filter score is closest to --threshold and --random more "
                "drawn from the rest (numpy default_rng(--seed) over the sorted ids), and write tasks.json "
                "(Label Studio's import format), label_config.xml (the labelling interface: the question, the "
                "image(s) and caption(s), a required Yes/No) and selection.csv (which item, why, its score).",
    params=(
        Param("--items", required=True, action="append", metavar="FILE.parquet|csv",
              help="item table(s): item_id, image_path, caption [, partner_image_path, partner_caption] "
                   "(the verify stage's pairs.parquet); repeatable"),
        Param("--scores", required=True, metavar="FILE.parquet|csv",
              help="the filter's score table (item_id and --score-column), e.g. verify/vqa.parquet"),
        Param("--score-column", default="score", metavar="NAME", help="column of the score (default score)"),
        Param("--threshold", required=True, type=float, metavar="X",
              help="the filter's threshold: the items closest to it are the least certain"),
        Param("--uncertain", type=int, default=100, metavar="N", help="how many of the least certain items (default 100)"),
        Param("--random", type=int, default=50, metavar="N",
              help="how many more drawn at random as a control sample (default 50)"),
        SEED.but(help="seed of the random draw (default 0)"),
        Param("--image-url", default="local-files", metavar="local-files|embed|URL",
              help="how tasks refer to images: local-files (Label Studio's local file serving, paths relative to "
                   "--document-root; the default), embed (inline data URIs) or an http(s):// prefix"),
        Param("--document-root", default=".", metavar="DIR",
              help="the folder Label Studio serves images from (LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT; "
                   "default: the current folder)"),
        Param("--question", default=None,
              help="the question annotators answer (default: one for an image, another for a pair)"),
        OUT_DIR.but(help="folder to write tasks.json, label_config.xml and selection.csv into"),
    ),
    run=_tasks)

READ = Step(
    "read", help="Label Studio's JSON export as the audit sample (item_id,verdict,annotator)",
    description="Read a Label Studio JSON or JSON_MIN export of the tasks `annotate tasks` wrote and write the "
                "audit sample `counterfactory filters card --audit` reads: one row per answer, verdict 1 for Yes "
                "and 0 for No, the annotator. Skipped (cancelled) annotations are left out.",
    params=(
        Param("--export", required=True, metavar="FILE.json", help="Label Studio's export (JSON or JSON_MIN)"),
        Param("--from-name", default="verdict", metavar="NAME",
              help="the Choices tag holding the verdict (default verdict, as label_config.xml names it)"),
        OUT.but(metavar="FILE.csv", help="the audit sample to write"),
    ),
    run=_read)

PUSH = Step(
    "push", help="create a Label Studio project from `annotate tasks`' folder and import its tasks",
    description="Create a project on a running Label Studio with label_config.xml as its labelling interface, "
                "connect --storage (the image folder, below LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT) for "
                "local-files image URLs, and import tasks.json; prints the project id.",
    params=(
        *SERVER,
        Param("--tasks", required=True, metavar="DIR", help="the folder `annotate tasks` wrote"),
        Param("--title", required=True, help="the project's title"),
        Param("--storage", default=None, metavar="DIR",
              help="the image folder to connect as local-files storage (omit for embedded or http images)"),
    ),
    run=_push)

PULL = Step(
    "pull", help="export a Label Studio project's answers as JSON",
    description="Export a project's tasks with their answers (Label Studio's JSON or JSON_MIN export) for "
                "`annotate read` and `annotate agreement`.",
    params=(
        *SERVER,
        Param("--project", required=True, type=positive_int, help="the project id `annotate push` printed"),
        Param("--format", default="JSON", choices=("JSON", "JSON_MIN"), help="export format (default JSON)"),
        OUT.but(metavar="FILE.json", help="the export to write"),
    ),
    run=_pull)

AGREEMENT = Step(
    "agreement", help="agreement between annotators and between people and each filter",
    description="Cohen's kappa of every two annotators, Fleiss' kappa over the items all of the most common "
                "number of annotators answered, and, per --filter, the agreement (raw and Cohen's kappa) of the "
                "majority verdict with the filter's decision. Writes agreement.md and agreement.json.",
    params=(
        Param("--audit", required=True, metavar="FILE.csv|json",
              help="the audit sample (item_id,verdict,annotator CSV) or a Label Studio JSON export"),
        Param("--filter", action="append", default=[], metavar="NAME=PATH[:COLUMN[>=X|<=X]]",
              help="a filter's table: its kept column (default `kept`), a true/false COLUMN, or a score COLUMN "
                   "kept at >= X (or <= X); repeatable"),
        OUT_DIR.but(help="folder to write agreement.md and .json into"),
    ),
    run=_agreement)

ANNOTATE = Step(
    "annotate", help="human verification with Label Studio: tasks out, verdicts back, agreement",
    description="Human verification with Label Studio (docs/verify.md): write the candidates a filter is least "
                "sure about and a random control sample as Label Studio tasks, read Label Studio's JSON export "
                "back as the audit sample of `counterfactory filters card`, and report the agreement between "
                "annotators (Cohen's, Fleiss' kappa) and between people and each filter.",
    steps=(TASKS, READ, PUSH, PULL, AGREEMENT))

register = registrar(ANNOTATE)
