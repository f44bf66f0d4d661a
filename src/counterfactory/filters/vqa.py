"""The VQA check: a VQAScore-style verification of counterfactual pairs by the ``vlm`` role, shared by every study
(issue 47 item 1; docs/verify.md "VQA check").

VQAScore (Lin et al., "Evaluating Text-to-Visual Generation with Image-to-Text Generation", ECCV 2024) scores an
image against a text as the probability that a VQA model answers "Yes" to ``Does this figure show "{text}"?
Please answer yes or no.``: the softmax over the whole vocabulary of the first answer token after the prompt
(no decoding, deterministic). Here it is asked of LLaVA-1.5-class models (the ``vlm`` role, in LLaVA-1.5's chat
template) with the question ``verify.question``.

**Input: the pair table** (:data:`PAIR_COLUMNS`, study-agnostic; each study maps its candidates to it in
``studies/<study>/verify.py``): ``item_id``, ``image_path``, ``caption``, ``partner_image_path`` (the counterfactual
partner) and ``partner_caption`` (may be empty: a one-sided edit such as an object removal, where only the caption
must be absent from the partner). Relative image paths are relative to the table's folder.

**Scores per item** (each a probability in [0, 1]):

* ``yes_image`` = P(Yes | image, caption) and ``yes_partner`` = P(Yes | partner, partner caption): the edit's two
  sides each *present* in their own image;
* ``yes_image_partner_caption`` = P(Yes | image, partner caption) and ``yes_partner_caption`` = P(Yes | partner,
  caption): each side *absent* from the other image;
* ``present`` = min of the present terms, ``absent`` = max of the absent terms (one each without a partner caption:
  ``yes_image`` and ``yes_partner_caption``), ``score`` = present - absent in [-1, 1] (the worst case of "the edit
  is in one image and not in the other"); ``kept`` = present >= ``verify.min_present`` and absent <=
  ``verify.max_absent`` and score >= ``verify.min_score``.

The output (:data:`SCORE_COLUMNS`) is a filter card's score table (``item_id`` + ``score``; docs/verify.md).

**Batches, shards, resume.** :func:`score_shard` scores the rows of one shard (contiguous bounds of the table,
:func:`shard_rows`) in batches of ``verify.batch_size`` prompts (right-padded: a probability does not depend on the
batch beyond float noise). Every ``verify.checkpoint_every`` items it writes a chunk to ``<out>.work/``; a rerun
with the same fingerprint (settings, model spec, the shard's rows) skips the items its chunks hold. :func:`merge`
joins the shards in order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from ..config import fill_section
from ..device import from_config, place
from ..errors import ConfigError, input_error
from ..io import write_json, write_parquet
from ..io import read_table as _read_table
from ..models import registry
from ..models.llava import Encoded, Encoder, collate, next_token_logprobs, render_prompt
from ..scorers import load_image
from .cards import score_frame

log = logging.getLogger(__name__)

SECTION = "verify"
PAIR_COLUMNS = ("item_id", "image_path", "caption", "partner_image_path", "partner_caption")
#: the four P(Yes) terms: (column, image column, caption column)
TERMS = (("yes_image", "image_path", "caption"),
         ("yes_partner", "partner_image_path", "partner_caption"),
         ("yes_image_partner_caption", "image_path", "partner_caption"),
         ("yes_partner_caption", "partner_image_path", "caption"))
SCORE_COLUMNS = ("item_id", *(t[0] for t in TERMS), "present", "absent", "score", "kept")
WORK_SUFFIX = ".work"


# --------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VerifySettings:
    """The ``verify`` section with the schema's defaults filled (config/schema.yaml gives each key's source)."""

    enabled: bool
    role: str
    question: str
    answer: str
    system: str | None
    batch_size: int
    max_length: int
    shards: int
    checkpoint_every: int
    min_present: float
    max_absent: float
    min_score: float

    @classmethod
    def from_config(cls, cfg: dict) -> "VerifySettings":
        section = cfg.get(SECTION) if isinstance(cfg, dict) else None
        return cls(**fill_section(SECTION, section))

    def as_dict(self) -> dict:
        return asdict(self)

    def scoring(self) -> dict:
        """What the probabilities depend on (the thresholds only decide ``kept``)."""
        return {k: getattr(self, k) for k in ("role", "question", "answer", "system", "max_length")}


# --------------------------------------------------------------------------------------------
# the formula
# --------------------------------------------------------------------------------------------
def combine(terms: pd.DataFrame, settings: VerifySettings) -> pd.DataFrame:
    """``present``, ``absent``, ``score`` and ``kept`` from the four P(Yes) columns (a NaN
    ``yes_partner`` / ``yes_image_partner_caption``: no partner caption, left out of the min / max)."""
    present = np.fmin(terms["yes_image"].to_numpy(float), terms["yes_partner"].to_numpy(float))
    absent = np.fmax(terms["yes_image_partner_caption"].to_numpy(float), terms["yes_partner_caption"].to_numpy(float))
    out = terms.copy()
    out["present"], out["absent"] = present, absent
    out["score"] = present - absent
    out["kept"] = (present >= settings.min_present) & (absent <= settings.max_absent) & \
        (out["score"].to_numpy() >= settings.min_score)
    return out


def margin(scores: pd.DataFrame, settings: VerifySettings) -> np.ndarray:
    """How far each item is from the check's decision: ``min(present - min_present, max_absent - absent,
    score - min_score)``, so ``margin >= 0`` exactly when ``kept`` (a difference of two floats is 0 only when they
    are equal). A filter card thresholds it at 0: the card measures the check as ``kept`` decides, all three tests
    together, and its threshold curve moves them together."""
    return np.minimum.reduce([scores["present"].to_numpy(float) - settings.min_present,
                              settings.max_absent - scores["absent"].to_numpy(float),
                              scores["score"].to_numpy(float) - settings.min_score])


def card_scores(path: str | os.PathLike, cfg: dict) -> pd.DataFrame:
    """A VQA score table (``verify/vqa.parquet``) as a filter card reads it: ``item_id``, the :func:`margin` as
    ``score`` (threshold 0), ``kept`` and the check's own ``vqa_score`` (present - absent)."""
    vqa = read_table(path, ("item_id", "present", "absent", "score", "kept"), "VQA scores")
    return score_frame(vqa["item_id"].astype(str), margin(vqa, VerifySettings.from_config(cfg)),
                       kept=vqa["kept"].astype(bool).to_numpy(), vqa_score=vqa["score"].astype(float).to_numpy())


#: a VQA card's title suffix and note (its score is the margin, its threshold 0)
CARD_SCORE = "margin to the check's thresholds"
CARD_NOTE = ("Score: min(present - verify.min_present, verify.max_absent - absent, score - verify.min_score), kept when "
             ">= 0: the check's decision (docs/verify.md).")


# --------------------------------------------------------------------------------------------
# the pair table
# --------------------------------------------------------------------------------------------
def pair_frame(rows: list[dict], base: str | os.PathLike) -> pd.DataFrame:
    """A pair table from adapter rows (absolute or working-directory image paths), paths made relative to
    ``base`` (the folder the table is written to), so the table moves with the results."""
    base = os.path.abspath(base)
    frame = pd.DataFrame(rows, columns=list(PAIR_COLUMNS))
    for col in ("image_path", "partner_image_path"):
        frame[col] = [os.path.relpath(os.path.abspath(p), base) for p in frame[col]]
    frame["item_id"] = frame["item_id"].astype(str)
    frame["partner_caption"] = frame["partner_caption"].astype(object).where(frame["partner_caption"].notna(), None)
    return frame


def write_pairs(rows: list[dict], out: str | os.PathLike) -> pd.DataFrame:
    frame = pair_frame(rows, Path(out).parent)
    write_parquet(Path(out), frame)
    return frame


def read_pairs(path: str | os.PathLike) -> pd.DataFrame:
    """The pair table at ``path`` with image paths resolved against its folder; every problem is an error naming
    the file and the record (its row and item id)."""
    path = Path(path)
    frame = _read_table(path, "pair table", f"run the study's `verify pairs` step; the pair table needs "
                        f"{list(PAIR_COLUMNS)}", columns=PAIR_COLUMNS).reset_index(drop=True)
    base = path.resolve().parent
    ids = frame["item_id"].astype(str)
    dup = ids[ids.duplicated()]
    if len(dup):
        raise input_error(path, f"row {dup.index[0]} (item_id {dup.iloc[0]})", "item_id is not unique",
                          "give every pair its own item_id")
    out = {c: [] for c in PAIR_COLUMNS}
    for i, rec in enumerate(frame.to_dict("records")):
        where = f"row {i} (item_id {ids[i]})"
        for col in ("caption", "partner_caption"):
            v = rec[col]
            if col == "partner_caption" and _missing(v):
                out[col].append(None)
                continue
            if not isinstance(v, str) or not v.strip():
                raise input_error(path, where, f"{col} is {v!r}, not a non-empty text", "fix or drop the row")
            out[col].append(v.strip())
        for col in ("image_path", "partner_image_path"):
            v = rec[col]
            if not isinstance(v, str) or not v.strip():
                raise input_error(path, where, f"{col} is {v!r}, not a path", "give every pair both images")
            p = v if os.path.isabs(v) else str(base / v)
            if not os.path.isfile(p):
                raise input_error(path, where, f"{col} {p} does not exist",
                                  "check the path (relative paths are relative to the table's folder)")
            out[col].append(p)
        out["item_id"].append(ids[i])
    return pd.DataFrame(out, columns=list(PAIR_COLUMNS))


def _missing(value) -> bool:
    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def read_table(path: str | os.PathLike, columns: Sequence[str], what: str) -> pd.DataFrame:
    """A study's candidate table (parquet or CSV) with ``columns`` (:func:`..io.read_table`, the one table reader);
    an error names the file and the fix."""
    return _read_table(path, what, "run the study's step that writes it first",
                       columns=columns).reset_index(drop=True)


def resolve(base: str | os.PathLike, value: str) -> str:
    """``value`` as a path: relative ones are relative to ``base`` (a table's folder)."""
    return value if os.path.isabs(value) else os.path.join(os.fspath(base), value)


def rebase(values: Sequence[str], src_dir: str | os.PathLike, dst_dir: str | os.PathLike) -> list[str]:
    """Paths relative to ``src_dir`` made relative to ``dst_dir`` (absolute ones stay as they are): a study's
    table copied into the verify folder keeps pointing at the same images."""
    out = []
    for v in values:
        if not isinstance(v, str) or not v or os.path.isabs(v):
            out.append(v)
        else:
            out.append(os.path.relpath(os.path.abspath(os.path.join(os.fspath(src_dir), v)), os.fspath(dst_dir)))
    return out


def kept_ids(scores: pd.DataFrame) -> set[str]:
    """The item ids a score table keeps."""
    return set(scores.loc[scores["kept"].astype(bool), "item_id"].astype(str))


def shard_rows(n: int, shard: int, shards: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of shard ``shard`` of ``shards`` (contiguous, sizes differ by at most one)."""
    if not 0 <= shard < shards:
        raise ConfigError(f"verify: shard {shard} of {shards}. Fix: pass 0 <= --shard < verify.shards")
    return n * shard // shards, n * (shard + 1) // shards


# --------------------------------------------------------------------------------------------
# P(Yes)
# --------------------------------------------------------------------------------------------
class YesScorer:
    """P(answer | image, question) of a LLaVA-class model: the probability of the answer's tokens after the
    prompt, softmax over the whole vocabulary (VQAScore; for a one-token answer such as "Yes", one forward pass of
    the prompt)."""

    def __init__(self, model, processor, settings: VerifySettings, *, device="cpu", dtype=torch.float32,
                 progress: bool = False):
        self.model, self.processor, self.settings = model, processor, settings
        self.device, self.dtype, self.progress = torch.device(device), dtype, progress
        self.encoder = Encoder(processor, settings.max_length, length_key=f"{SECTION}.max_length")

    def prompt(self, caption: str) -> str:
        try:
            text = self.settings.question.format(caption=caption)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"verify.question: {self.settings.question!r} ({exc}). Fix: use one {{caption}} "
                              "placeholder and no other braces") from exc
        return render_prompt(self.processor, text, self.settings.system)

    @torch.no_grad()
    def probabilities(self, images: Sequence, captions: Sequence[str], *, where: Sequence[tuple] | None = None
                      ) -> np.ndarray:
        """P(answer) for each (image, caption), in batches of ``batch_size``; ``where`` = (file, record) per job
        names it in an error."""
        n = len(images)
        out = np.zeros(n, dtype=np.float64)
        bs = self.settings.batch_size
        for start in range(0, n, bs):
            idx = range(start, min(n, start + bs))
            prompts = [self.prompt(captions[k]) for k in idx]
            answers = [self.encoder.answer_ids(p, self.settings.answer) for p in prompts]
            encoded = [self.encoder.encode(load_image(images[k]), p, None, eos=False,
                                           where=where[k] if where else (None, None)) for k, p in zip(idx, prompts)]
            if all(len(a) == 1 for a in answers):   # one token ("Yes"): P from the prompt's next-token softmax
                lp = next_token_logprobs(self.model, encoded, self.encoder.pad_id, self.device, self.dtype)
                out[list(idx)] = [float(torch.exp(lp[j, a[0]])) for j, a in enumerate(answers)]
                continue
            out[list(idx)] = self._multi_token(encoded, answers)
        return out

    def _multi_token(self, encoded, answers) -> list[float]:
        """P of a several-token answer: the product of its tokens' probabilities (teacher-forced)."""
        items = [Encoded(e.input_ids + a, e.pixel_values, e.n_prompt) for e, a in zip(encoded, answers)]
        for e in items:
            e.labels = [-100] * len(e.input_ids)
        batch = collate(items, self.encoder.pad_id)
        logits = self.model(input_ids=batch["input_ids"].to(self.device),
                            attention_mask=batch["attention_mask"].to(self.device),
                            pixel_values=batch["pixel_values"].to(self.device, dtype=self.dtype)).logits
        probs = []
        for i, (e, a) in enumerate(zip(items, answers)):
            step = torch.log_softmax(logits[i, e.n_prompt - 1:e.n_prompt - 1 + len(a)].float(), dim=-1)
            probs.append(float(torch.exp(step.gather(-1, torch.tensor(a, device=step.device)[:, None]).sum())))
        return probs


def score_terms(scorer: YesScorer, pairs: pd.DataFrame, source: str | os.PathLike = "<pairs>") -> pd.DataFrame:
    """The four P(Yes) columns of ``pairs`` (rows of :func:`read_pairs`); a term without a partner caption is NaN."""
    jobs, slots = [], []
    for i, rec in enumerate(pairs.to_dict("records")):
        for t, (_, image_col, caption_col) in enumerate(TERMS):
            if _missing(rec[caption_col]):
                continue
            jobs.append((rec[image_col], rec[caption_col], (source, f"item_id {rec['item_id']}")))
            slots.append((i, t))
    values = np.full((len(pairs), len(TERMS)), np.nan)
    if jobs:
        probs = scorer.probabilities([j[0] for j in jobs], [j[1] for j in jobs], where=[j[2] for j in jobs])
        for (i, t), p in zip(slots, probs):
            values[i, t] = p
    frame = pd.DataFrame(values, columns=[t[0] for t in TERMS])
    frame.insert(0, "item_id", pairs["item_id"].astype(str).to_numpy())
    return frame


# --------------------------------------------------------------------------------------------
# shards
# --------------------------------------------------------------------------------------------
def fingerprint(settings: VerifySettings, model: dict, rows: pd.DataFrame) -> str:
    """sha256 of what a shard's probabilities depend on: the scoring settings, the model role's spec and the rows."""
    text = json.dumps({"settings": settings.scoring(), "model": model,
                       "rows": rows.astype(object).where(rows.notna(), None).values.tolist()},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _work_dir(out: Path) -> Path:
    return out.with_name(out.name + WORK_SUFFIX)


def _done_chunks(work: Path, digest: str) -> list[pd.DataFrame]:
    """The chunks a previous run of the same shard left (another fingerprint: the work is discarded)."""
    meta = work / "fingerprint.json"
    if not meta.exists():
        return []
    try:
        if json.loads(meta.read_text()).get("fingerprint") != digest:
            log.info("%s: made under other settings, model or rows; starting over", work)
            shutil.rmtree(work)
            return []
        return [pd.read_parquet(p) for p in sorted(work.glob("chunk-*.parquet"))]
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable (%s); starting over", work, exc)
        shutil.rmtree(work, ignore_errors=True)
        return []


def score_shard(pairs_path: str | os.PathLike, out: str | os.PathLike, settings: VerifySettings,
                scorer_factory: Callable[[], YesScorer], model: dict, *, shard: int = 0, shards: int = 1,
                hook: Callable[[int], None] | None = None) -> pd.DataFrame:
    """Score shard ``shard`` of ``shards`` of the pair table into ``out`` (:data:`SCORE_COLUMNS`), resumably.

    ``scorer_factory`` loads the model only when there is something left to score; ``hook(n_done)`` is called after
    every chunk (tests interrupt a run there)."""
    out = Path(out)
    pairs = read_pairs(pairs_path)
    start, stop = shard_rows(len(pairs), shard, shards)
    mine = pairs.iloc[start:stop].reset_index(drop=True)
    raw = pd.read_parquet(pairs_path) if Path(pairs_path).suffix != ".csv" else pd.read_csv(pairs_path)
    digest = fingerprint(settings, model, raw.iloc[start:stop][list(PAIR_COLUMNS)])
    work = _work_dir(out)
    chunks = _done_chunks(work, digest)
    done = {i for c in chunks for i in c["item_id"].astype(str)}
    todo = mine[~mine["item_id"].isin(done)].reset_index(drop=True)
    if len(todo):
        work.mkdir(parents=True, exist_ok=True)
        write_json(work / "fingerprint.json", {"fingerprint": digest, "shard": shard, "shards": shards})
        scorer = scorer_factory()
        step = settings.checkpoint_every
        for k in range(0, len(todo), step):
            chunk = score_terms(scorer, todo.iloc[k:k + step], pairs_path)
            write_parquet(work / f"chunk-{len(chunks):05d}.parquet", chunk)
            chunks.append(chunk)
            if hook:
                hook(sum(len(c) for c in chunks))
    terms = pd.concat(chunks, ignore_index=True) if chunks else score_terms(None, mine.iloc[:0])
    terms = terms.drop_duplicates("item_id").set_index("item_id").loc[mine["item_id"]].reset_index()
    table = combine(terms, settings)[list(SCORE_COLUMNS)]
    write_parquet(out, table)
    shutil.rmtree(work, ignore_errors=True)
    return table


def merge(shard_files: Sequence[str | os.PathLike], settings: VerifySettings | None = None) -> pd.DataFrame:
    """The shards' score tables in order (``kept`` recomputed when ``settings`` are given: a threshold edit
    reruns only the merge)."""
    frames = []
    for p in shard_files:
        try:
            f = pd.read_parquet(p)
        except Exception as exc:
            raise input_error(p, None, f"not a readable shard ({exc})", "rerun its verify vqa job") from exc
        missing = [c for c in SCORE_COLUMNS if c not in f.columns]
        if missing:
            raise input_error(p, None, f"missing column(s) {missing}", "rerun its verify vqa job")
        frames.append(f[list(SCORE_COLUMNS)])
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(SCORE_COLUMNS))
    dup = table["item_id"][table["item_id"].duplicated()]
    if len(dup):
        raise input_error(shard_files[0], f"item_id {dup.iloc[0]}", "an item is in two shards",
                          "rerun every shard under one verify.shards")
    if settings is not None:
        table = combine(table[[c for c in SCORE_COLUMNS if c not in ("present", "absent", "score", "kept")]],
                        settings)[list(SCORE_COLUMNS)]
    return table


def scorer_from_config(cfg: dict, settings: VerifySettings, progress: bool = False) -> YesScorer:
    """A :class:`YesScorer` over ``registry.load(cfg, verify.role)`` on the config's device and precision."""
    device, dtype = from_config(cfg)
    model, processor = registry.load(cfg, settings.role, dtype=dtype)
    return YesScorer(place(model, torch.device(device), dtype), processor, settings, device=device, dtype=dtype,
                     progress=progress)


def model_identity(cfg: dict, role: str) -> dict:
    """The role's configured spec (source, revision, ...), part of a shard's fingerprint."""
    spec = (cfg.get("models") or {}).get(role)
    if spec is None:
        raise ConfigError(f"verify.role: {role!r} is not under models. Fix: configure models.{role} "
                          "(a LLaVA-1.5-class checkpoint) or set verify.role")
    return json.loads(json.dumps(spec, default=str))
