"""Human verification with Label Studio (issue 47.3): the candidates a filter is least sure about, and a seeded random
control sample, exported as Label Studio tasks; Label Studio's JSON export read back as the audit sample of
:mod:`.cards`; and agreement between annotators (Cohen's and Fleiss' kappa) and between people and each filter.

Label Studio (https://labelstud.io, `pip install label-studio`) is not a dependency of the package: the tasks are
plain JSON in its import format and the export is read from its documented JSON formats ("JSON", the full export with
one ``annotations`` list per task, and "JSON_MIN", one flat record per annotation). ``tests/test_label_studio.py``
runs the round trip against a real server.

The task of an item shows its image and caption and, for a pair (the verify stage's pair table), the partner image and
caption, with a yes/no question; the verdict ``Yes`` is "good" in the audit sample.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import quote

import numpy as np
import pandas as pd

from ..errors import CounterFactoryError, InputError
from ..io import read_table, write_csv, write_json, write_text
from .cards import VERDICTS, read_audit, read_scores

#: the audit verdict of each answer (the label config's choices)
ANSWERS = {"Yes": True, "No": False}
#: the control tag of the label config that holds the verdict
FROM_NAME = "verdict"
#: the question of a single image and of a pair
QUESTION_SINGLE = "Does the image show the caption?"
QUESTION_PAIR = ("Is this a good counterfactual pair: does each image show its own caption, and do the two differ "
                 "only in what the captions change?")
#: columns of the item table (the verify stage's pair table; the partner columns are optional)
ITEM_COLUMNS = ("item_id", "image_path", "caption")
PARTNER_COLUMNS = ("partner_image_path", "partner_caption")
#: how a task refers to its images
IMAGE_URL_MODES = ("local-files", "embed")
TASK_FILES = ("tasks.json", "label_config.xml", "selection.csv")

ITEMS_FIX = ("pass the verify stage's pair table (results/<run>/<study>/verify/pairs.parquet) or any table with "
             "item_id, image_path, caption [, partner_image_path, partner_caption]")


class AnnotationError(InputError):
    """A Label Studio export or an item table that cannot be read as the audit sample."""


# --------------------------------------------------------------------------- tasks


def label_config(pair: bool) -> str:
    """Label Studio's labelling interface: the question, the image(s) with their caption(s), a required Yes/No."""
    partner = ('  <Image name="partner" value="$partner_image"/>\n'
               '  <Text name="partner_caption" value="$partner_caption"/>\n') if pair else ""
    choices = "".join(f'    <Choice value="{a}"/>\n' for a in ANSWERS)
    return ("<View>\n"
            '  <Header value="$question"/>\n'
            '  <Image name="image" value="$image"/>\n'
            '  <Text name="caption" value="$caption"/>\n'
            f"{partner}"
            f'  <Choices name="{FROM_NAME}" toName="image" choice="single" required="true">\n'
            f"{choices}"
            "  </Choices>\n"
            "</View>\n")


def read_items(path: str | os.PathLike) -> pd.DataFrame:
    """The item table (parquet or CSV), checked: its ids unique, its required columns present."""
    path = Path(path)
    items = read_table(path, "item table", ITEMS_FIX, columns=ITEM_COLUMNS, csv_dtype=str).copy()
    items["item_id"] = items["item_id"].astype(str)
    dup = items["item_id"][items["item_id"].duplicated()]
    if len(dup):
        raise AnnotationError(f"{path}: item id {dup.iloc[0]!r} occurs more than once. Fix: give every item one row")
    return items


def select_for_review(scores: pd.Series, *, threshold: float, n_uncertain: int, n_random: int,
                      seed: int) -> pd.DataFrame:
    """The ``n_uncertain`` items whose score is closest to the threshold (ties: the smaller id), then ``n_random``
    of the rest drawn with numpy's ``default_rng(seed)`` from the ids in sorted order (so the draw depends on the
    ids, not on the table's row order). Columns ``item_id``, ``score``, ``margin`` (score - threshold) and
    ``reason`` (``uncertain`` or ``random``)."""
    if n_uncertain < 0 or n_random < 0:
        raise CounterFactoryError("the numbers of uncertain and random items must be >= 0")
    s = pd.Series(scores.to_numpy(dtype=float), index=scores.index.astype(str)).sort_index(kind="mergesort")
    if s.isna().any():
        raise CounterFactoryError(f"item {s.index[s.isna()][0]!r} has no score. Fix: score every item, or drop it")
    frame = pd.DataFrame({"item_id": s.index, "score": s.to_numpy(), "margin": s.to_numpy() - threshold})
    frame["distance"] = frame["margin"].abs()
    order = frame.sort_values(["distance", "item_id"], kind="mergesort")
    uncertain = order.head(n_uncertain).assign(reason="uncertain")
    rest = frame[~frame["item_id"].isin(uncertain["item_id"])]
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(rest), size=min(n_random, len(rest)), replace=False)) if len(rest) else []
    control = rest.iloc[pick].assign(reason="random")
    return pd.concat([uncertain, control], ignore_index=True).drop(columns="distance")


def image_url(path: str | os.PathLike, mode: str, document_root: str | os.PathLike | None = None) -> str:
    """How a task refers to an image: ``local-files`` (Label Studio's local file serving,
    ``/data/local-files/?d=<path relative to the document root>``; start Label Studio with
    ``LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED=true`` and ``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT`` set to the
    root), ``embed`` (the image inline as a data URI: self-contained, for small audits), or a URL prefix
    (``http(s)://...``, the path relative to the document root appended)."""
    path = Path(path)
    if mode == "embed":
        if not path.exists():
            raise AnnotationError(f"{path}: no such image to embed. Fix: run the step that writes it, or pass the "
                                  "item table the images belong to")
        mime = mimetypes.guess_type(path.name)[0] or "image/png"
        return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"
    root = Path(document_root or ".").resolve()
    full = path if path.is_absolute() else Path.cwd() / path
    try:
        rel = full.resolve().relative_to(root)
    except ValueError:
        raise AnnotationError(f"{path}: the image is not under the document root {root}. Fix: pass "
                              "--document-root a folder that holds every image (Label Studio serves files only "
                              "below LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT)") from None
    if mode == "local-files":
        return f"/data/local-files/?d={quote(rel.as_posix())}"
    if mode.startswith(("http://", "https://")):
        return mode.rstrip("/") + "/" + quote(rel.as_posix())
    raise CounterFactoryError(f"image URL mode {mode!r} is not known. Fix: use local-files, embed or an http(s):// "
                              "URL prefix")


def make_tasks(items: pd.DataFrame, selection: pd.DataFrame, *, image_mode: str = "local-files",
               document_root: str | os.PathLike | None = None, question: str | None = None) -> list[dict]:
    """One Label Studio task per selected item, in the selection's order: ``data`` holds the question, the image
    URL(s), the caption(s), the item id, the reason it was chosen and its score (which annotators do not see: the
    label config shows only the question, images and captions)."""
    pair = all(c in items.columns for c in PARTNER_COLUMNS)
    by_id = items.set_index("item_id")
    missing = [i for i in selection["item_id"] if i not in by_id.index]
    if missing:
        raise AnnotationError(f"item {missing[0]!r} of the score table is not in the item table "
                              f"({len(missing)} missing). Fix: pass the item table and the score table of one run")
    text = question or (QUESTION_PAIR if pair else QUESTION_SINGLE)
    tasks = []
    for row in selection.itertuples(index=False):
        item = by_id.loc[row.item_id]
        data: dict[str, Any] = {"item_id": row.item_id, "question": text,
                                "image": image_url(item["image_path"], image_mode, document_root),
                                "caption": str(item["caption"]), "reason": row.reason, "score": float(row.score)}
        if pair:
            data["partner_image"] = image_url(item["partner_image_path"], image_mode, document_root)
            data["partner_caption"] = "" if pd.isna(item["partner_caption"]) else str(item["partner_caption"])
        tasks.append({"data": data})
    return tasks


def write_tasks(out_dir: str | os.PathLike, items: pd.DataFrame, scores: pd.Series, *, threshold: float,
                n_uncertain: int, n_random: int, seed: int, image_mode: str = "local-files",
                document_root: str | os.PathLike | None = None, question: str | None = None) -> list[Path]:
    """Select, build and write ``tasks.json`` (Label Studio's import format), ``label_config.xml`` (the labelling
    interface to paste into the project's settings, or to send as the project's ``label_config``) and
    ``selection.csv`` (which items, why, and their scores)."""
    selection = select_for_review(scores, threshold=threshold, n_uncertain=n_uncertain, n_random=n_random, seed=seed)
    tasks = make_tasks(items, selection, image_mode=image_mode, document_root=document_root, question=question)
    out = Path(out_dir)
    pair = all(c in items.columns for c in PARTNER_COLUMNS)
    write_json(out / "tasks.json", tasks)
    write_text(out / "label_config.xml", label_config(pair))
    write_csv(out / "selection.csv", selection)
    return [out / name for name in TASK_FILES]


# --------------------------------------------------------------------------- reading the export


def _annotator(value: Any) -> str:
    """``completed_by`` is a user id in the full export of current Label Studio, a user record in older ones."""
    if isinstance(value, Mapping):
        for key in ("email", "username", "id"):
            if value.get(key) not in (None, ""):
                return str(value[key])
    return str(value)


def _verdict(choices: Any, where: str) -> bool:
    if isinstance(choices, str):
        choices = [choices]
    if not isinstance(choices, list) or len(choices) != 1 or choices[0] not in ANSWERS:
        raise AnnotationError(f"{where}: the verdict {choices!r} is not one of {', '.join(ANSWERS)}. Fix: use the "
                              "label config `counterfactory annotate tasks` writes (one required Yes/No choice)")
    return ANSWERS[choices[0]]


def read_export(path: str | os.PathLike, *, from_name: str = FROM_NAME) -> pd.DataFrame:
    """The audit sample (``item_id``, ``verdict``, ``annotator``; the format of :func:`.cards.read_audit`) from a
    Label Studio JSON export: the full "JSON" export (tasks with their ``annotations``) or "JSON_MIN" (one record per
    annotation). Cancelled (skipped) annotations and tasks without one are left out; an annotation without a
    ``from_name`` verdict, or with another answer, is an error naming the task."""
    path = Path(path)
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AnnotationError(f"{path}: no such Label Studio export. Fix: export the project as JSON (Export -> "
                              "JSON, or GET /api/projects/<id>/export?exportType=JSON)") from None
    except json.JSONDecodeError as exc:
        raise AnnotationError(f"{path}: not JSON ({exc}). Fix: export the project as JSON or JSON_MIN") from None
    if not isinstance(doc, list):
        raise AnnotationError(f"{path}: a Label Studio export is a list of tasks. Fix: export the project as JSON")
    rows = []
    for n, task in enumerate(doc):
        if not isinstance(task, Mapping):
            raise AnnotationError(f"{path}: record {n} is not an object. Fix: export the project as JSON")
        task_id = task.get("id", n)
        if "annotations" in task:          # the full export
            data = task.get("data") or {}
            if "item_id" not in data:
                raise AnnotationError(f"{path}: task {task_id} has no data.item_id. Fix: import the tasks "
                                      "`counterfactory annotate tasks` wrote (they carry the item id)")
            for ann in task["annotations"]:
                if ann.get("was_cancelled"):
                    continue
                where = f"{path}: task {task_id}, annotation {ann.get('id')}"
                results = [r for r in ann.get("result") or [] if r.get("from_name") == from_name]
                if not results:
                    raise AnnotationError(f"{where} has no {from_name!r} answer. Fix: answer every task's Yes/No "
                                          "question, or skip the task (a skipped task is left out)")
                rows.append((str(data["item_id"]), _verdict((results[0].get("value") or {}).get("choices"), where),
                             _annotator(ann.get("completed_by"))))
        else:                              # JSON_MIN: the task's data and one annotation's answers, flat
            if "item_id" not in task:
                raise AnnotationError(f"{path}: record {n} has no item_id. Fix: import the tasks "
                                      "`counterfactory annotate tasks` wrote (they carry the item id)")
            if from_name not in task:
                continue                   # a task nobody answered
            rows.append((str(task["item_id"]), _verdict(task[from_name], f"{path}: record {n} (task {task_id})"),
                         _annotator(task.get("annotator", task.get("completed_by", "")))))
    if not rows:
        raise AnnotationError(f"{path}: the export holds no answered task. Fix: annotate some tasks first, then "
                              "export again")
    return pd.DataFrame(rows, columns=["item_id", "verdict", "annotator"])


def write_audit(audit: pd.DataFrame, path: str | os.PathLike) -> Path:
    """The audit sample as the CSV :func:`.cards.read_audit` reads (verdict ``1``/``0``)."""
    out = audit.assign(verdict=audit["verdict"].astype(int))[["item_id", "verdict", "annotator"]]
    write_csv(path, out)
    return Path(path)


# --------------------------------------------------------------------------- agreement


def read_answers(path: str | os.PathLike) -> pd.DataFrame:
    """Every answer (``item_id``, ``verdict``, ``annotator``) of a Label Studio JSON export (``.json``) or of an audit
    CSV (checked by :func:`.cards.read_audit`, which names a bad line; without an annotator column every row is one
    annotator's)."""
    if str(path).lower().endswith(".json"):
        return read_export(path)
    read_audit(path, ties="drop")            # the checks, with the line of a bad row
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=True, encoding="utf-8-sig")
    frame.columns = [c.strip().lower() for c in frame.columns]
    frame = frame[frame["item_id"].str.strip() != ""]
    annotator = frame["annotator"].str.strip() if "annotator" in frame.columns else "annotator"
    return pd.DataFrame({"item_id": frame["item_id"].str.strip().to_numpy(),
                         "verdict": frame["verdict"].str.strip().str.lower().map(VERDICTS).astype(bool).to_numpy(),
                         "annotator": annotator if isinstance(annotator, str) else annotator.to_numpy()})



def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    """Cohen's kappa of two raters on the same items (scikit-learn's ``cohen_kappa_score``); ``None`` when it is
    undefined (no items, or both raters gave one answer throughout, so chance agreement is 1)."""
    from sklearn.metrics import cohen_kappa_score

    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if len(a) == 0:
        return None
    pa, pb = a.mean(), b.mean()
    if pa * pb + (1 - pa) * (1 - pb) == 1.0:
        return None
    return float(cohen_kappa_score(a, b))


def fleiss_kappa(counts: np.ndarray) -> float | None:
    """Fleiss' kappa (Fleiss 1971) of an items x categories table of rating counts, every item rated by the same
    number of raters n >= 2: (P̄ - P̄e) / (1 - P̄e) with P_i = (sum_j n_ij^2 - n) / (n (n - 1)) and P̄e = sum_j p_j^2.
    ``None`` when undefined (no items, or P̄e = 1)."""
    counts = np.asarray(counts, dtype=float)
    if counts.ndim != 2 or counts.shape[0] == 0:
        return None
    n = counts.sum(axis=1)
    if not np.all(n == n[0]) or n[0] < 2:
        raise CounterFactoryError("Fleiss' kappa needs the same number (>= 2) of ratings of every item")
    n = n[0]
    p_j = counts.sum(axis=0) / counts.sum()
    p_i = ((counts ** 2).sum(axis=1) - n) / (n * (n - 1))
    p_e = float((p_j ** 2).sum())
    if p_e == 1.0:
        return None
    return float((p_i.mean() - p_e) / (1 - p_e))


def parse_filter(spec: str) -> tuple[str, str, str | None, float | None, str]:
    """``NAME=PATH`` (the table's ``kept`` column), ``NAME=PATH:COLUMN`` (a true/false column), or
    ``NAME=PATH:COLUMN>=X`` / ``NAME=PATH:COLUMN<=X`` (a score and the filter's threshold)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise CounterFactoryError(f"--filter {spec!r}: expected NAME=PATH[:COLUMN[>=X|<=X]]")
    path, colon, expr = rest.rpartition(":")
    if not colon or not path or "/" in expr:     # no column, or the colon is part of the path
        path, expr = rest, ""
    for op, keep in ((">=", "above"), ("<=", "below")):
        if op in expr:
            column, _, value = expr.partition(op)
            try:
                return name, path, column, float(value), keep
            except ValueError:
                raise CounterFactoryError(f"--filter {spec!r}: {value!r} is not a number") from None
    return name, path, expr or None, None, "above"


def filter_kept(path: str | os.PathLike, column: str | None, threshold: float | None, keep: str) -> pd.Series:
    """Whether the filter keeps each item (indexed by item id as text)."""
    column = column or "kept"
    values = read_scores(path, column)
    if threshold is None:
        return values.astype(bool)
    return values >= threshold if keep == "above" else values <= threshold


def agreement(audit: pd.DataFrame, filters: Mapping[str, pd.Series] | None = None) -> dict:
    """Agreement of the annotators with each other and of people with each filter.

    - ``pairs``: Cohen's kappa of every two annotators on the items both answered (with that count and the raw
      agreement);
    - ``fleiss``: Fleiss' kappa over the items answered by the most common number m >= 2 of annotators (the items
      with another count are left out, and counted);
    - ``filters``: per filter, over the audited items it scored whose majority verdict is not a tie, Cohen's kappa and
      the raw agreement of the majority verdict ("good") with the filter's decision ("kept")."""
    audit = audit.assign(item_id=audit["item_id"].astype(str), verdict=audit["verdict"].astype(bool),
                         annotator=audit["annotator"].astype(str))
    wide = audit.drop_duplicates(["item_id", "annotator"], keep="last").pivot(
        index="item_id", columns="annotator", values="verdict")
    annotators = sorted(wide.columns)
    pairs = []
    for i, a in enumerate(annotators):
        for b in annotators[i + 1:]:
            both = wide[[a, b]].dropna()
            pairs.append({"a": a, "b": b, "n": len(both),
                          "agreement": float((both[a] == both[b]).mean()) if len(both) else None,
                          "kappa": cohen_kappa(both[a].astype(bool), both[b].astype(bool))})
    per_item = wide.notna().sum(axis=1)
    multi = per_item[per_item >= 2]
    fleiss = {"m": None, "n": 0, "left_out": int(len(per_item)), "kappa": None}
    if len(multi):
        m = int(multi.value_counts().sort_index(ascending=False).idxmax())
        rows = wide.loc[per_item[per_item == m].index]
        yes = rows.sum(axis=1, min_count=1).to_numpy(dtype=float)
        table = np.stack([yes, m - yes], axis=1)
        fleiss = {"m": m, "n": int(len(rows)), "left_out": int(len(per_item) - len(rows)),
                  "kappa": fleiss_kappa(table)}
    votes = audit.groupby("item_id")["verdict"].agg(["sum", "count"])
    majority = (votes["sum"] * 2 > votes["count"])[votes["sum"] * 2 != votes["count"]]
    out_filters = {}
    for name, kept in (filters or {}).items():
        kept = kept.copy()
        kept.index = kept.index.astype(str)
        common = majority.index.intersection(kept.index)
        h, f = majority.loc[common].astype(bool), kept.loc[common].astype(bool)
        out_filters[name] = {"n": int(len(common)), "agreement": float((h == f).mean()) if len(common) else None,
                             "kappa": cohen_kappa(h, f), "ties_left_out": int(len(votes) - len(majority)),
                             "unscored": int(len(majority.index.difference(kept.index)))}
    return {"items": int(len(per_item)), "annotators": annotators, "answers": int(len(audit)), "pairs": pairs,
            "fleiss": fleiss, "filters": out_filters}


def _f(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def render_agreement(result: Mapping) -> str:
    """The agreement report as Markdown."""
    lines = ["# Agreement", "",
             f"{result['answers']} answers on {result['items']} items by {len(result['annotators'])} annotator(s).", "",
             "## Between annotators (Cohen's kappa)", ""]
    if result["pairs"]:
        lines += ["| annotator | annotator | items | agreement | kappa |", "| --- | --- | ---: | ---: | ---: |"]
        lines += [f"| {p['a']} | {p['b']} | {p['n']} | {_f(p['agreement'])} | {_f(p['kappa'])} |"
                  for p in result["pairs"]]
    else:
        lines.append("One annotator: no agreement between annotators.")
    fl = result["fleiss"]
    lines += ["", "## Fleiss' kappa", "",
              (f"{_f(fl['kappa'])} over the {fl['n']} items answered by {fl['m']} annotators "
               f"({fl['left_out']} items with another number of answers left out)." if fl["m"] else
               "No item has two answers.")]
    if result["filters"]:
        lines += ["", "## People (majority verdict) and each filter", "",
                  "| filter | items | agreement | kappa | ties left out | not scored |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {name} | {r['n']} | {_f(r['agreement'])} | {_f(r['kappa'])} | {r['ties_left_out']} | "
                  f"{r['unscored']} |" for name, r in result["filters"].items()]
    lines += ["", "Kappa is n/a where it is undefined (both raters gave one answer throughout).", ""]
    return "\n".join(lines)


def write_agreement(out_dir: str | os.PathLike, audit: pd.DataFrame,
                    filters: Mapping[str, pd.Series] | None = None) -> dict:
    """Write ``agreement.json`` and ``agreement.md`` and return the result."""
    result = agreement(audit, filters)
    out = Path(out_dir)
    write_json(out / "agreement.json", result)
    write_text(out / "agreement.md", render_agreement(result))
    return result


def items_of(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Item tables concatenated (e.g. several studies' pair tables), ids unique across them."""
    frames = [read_items(p) for p in paths]
    items = pd.concat(frames, ignore_index=True)
    dup = items["item_id"][items["item_id"].duplicated()]
    if len(dup):
        raise AnnotationError(f"item id {dup.iloc[0]!r} occurs in more than one item table. Fix: annotate one "
                              "study's items per project")
    return items


# --------------------------------------------------------------------------- Label Studio's API


class LabelStudio:
    """A small client of Label Studio's REST API (``urllib`` only): create a project with the labelling interface,
    connect a local-files storage, import tasks, export the answers.

    ``token`` is the account's access token: a legacy API token (sent as ``Authorization: Token ...``) or a personal
    access token (a JWT refresh token, exchanged at ``/api/token/refresh`` for an access token sent as ``Bearer``)."""

    def __init__(self, url: str, token: str, timeout: float = 60.0):
        if not token:
            raise CounterFactoryError("no Label Studio token. Fix: pass --token or set LABEL_STUDIO_API_KEY to the "
                                      "access token of your account (Account & Settings)")
        self.url, self.timeout = url.rstrip("/"), timeout
        self._auth = f"Token {token}"
        if token.count(".") == 2:         # a personal access token (JWT refresh token)
            access = self._call("POST", "/api/token/refresh", {"refresh": token}, auth=False)["access"]
            self._auth = f"Bearer {access}"

    def _call(self, method: str, path: str, body: Any = None, params: Mapping | None = None, *,
              auth: bool = True) -> Any:
        import urllib.error
        import urllib.parse
        import urllib.request

        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = self._auth
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text = response.read().decode("utf-8")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            raise CounterFactoryError(f"Label Studio at {self.url}: {method} {path} answered {exc.code}: {detail}. "
                                      "Fix: check the URL, the token and the project id") from None
        except urllib.error.URLError as exc:
            raise CounterFactoryError(f"Label Studio at {self.url} cannot be reached ({exc.reason}). Fix: start it "
                                      "(`label-studio start`) or pass its --url") from None
        return json.loads(text) if text else None

    def create_project(self, title: str, label_config: str) -> int:
        return int(self._call("POST", "/api/projects", {"title": title, "label_config": label_config})["id"])

    def add_local_storage(self, project: int, path: str | os.PathLike, title: str = "images") -> int:
        """Connect a local-files storage (a folder below LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT, not the root itself):
        Label Studio serves ``/data/local-files/?d=...`` only below such a storage's folder."""
        body = {"project": project, "path": str(Path(path).resolve()), "use_blob_urls": False, "title": title}
        return int(self._call("POST", "/api/storages/localfiles", body)["id"])

    def import_tasks(self, project: int, tasks: Sequence[Mapping]) -> list[int]:
        answer = self._call("POST", f"/api/projects/{project}/import", list(tasks), {"return_task_ids": "true"})
        return [int(i) for i in answer.get("task_ids", [])]

    def tasks(self, project: int) -> list[dict]:
        answer = self._call("GET", "/api/tasks", params={"project": project, "page_size": 100000})
        return answer["tasks"] if isinstance(answer, Mapping) else answer

    def annotate(self, task: int, choice: str, *, completed_by: int | None = None, cancelled: bool = False) -> int:
        """Post one Yes/No answer (what an annotator does in the interface)."""
        body: dict[str, Any] = {"result": [] if cancelled else [
            {"from_name": FROM_NAME, "to_name": "image", "type": "choices", "value": {"choices": [choice]}}],
            "was_cancelled": cancelled}
        if completed_by is not None:
            body["completed_by"] = completed_by
        return int(self._call("POST", f"/api/tasks/{task}/annotations", body)["id"])

    def export(self, project: int, kind: str = "JSON") -> list:
        return self._call("GET", f"/api/projects/{project}/export", params={"exportType": kind})


def push(client: LabelStudio, tasks_dir: str | os.PathLike, title: str,
         storage: str | os.PathLike | None = None) -> int:
    """Create a project from ``annotate tasks``' folder (its label config and tasks), connect ``storage`` (the image
    folder, for local-files URLs) and import the tasks; returns the project id."""
    tasks_dir = Path(tasks_dir)
    try:
        config = (tasks_dir / "label_config.xml").read_text(encoding="utf-8")
        tasks = json.loads((tasks_dir / "tasks.json").read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise AnnotationError(f"{exc.filename}: missing. Fix: run `counterfactory annotate tasks --out-dir "
                              f"{tasks_dir}` first") from None
    project = client.create_project(title, config)
    if storage is not None:
        client.add_local_storage(project, storage)
    client.import_tasks(project, tasks)
    return project


def pull(client: LabelStudio, project: int, out: str | os.PathLike, kind: str = "JSON") -> Path:
    """Export the project's answers (Label Studio's ``JSON`` or ``JSON_MIN``) to ``out``."""
    return write_json(out, client.export(project, kind))
