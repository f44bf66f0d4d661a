"""The generative VLM of CounterCurate (LLaVA-1.5 class, the ``vlm`` role): choosing between two captions,
and fine-tuning in conversation format (§3.5, §4, appendix "Training details").

Evaluation (§4.2 "For LLaVA-1.5, we simply query the model to choose between the positive and negative
captions when presented with the ground truth image"; §4.3 and §4.4 use "the same" protocol). The authors'
benchmark scripts put both captions in one multiple-choice question in LLaVA-1.5's Vicuna-v1 conversation,
the positive at a random position::

    <system> USER: <image>
    Which of the following captions best describes the image?
    A. <caption or negative>
    B. <the other one>
    Answer with the option's letter from the given choices directly. ASSISTANT:

and count the item correct when greedy decoding answers the positive's letter. Here the decision is made
deterministically and without decoding: the answer letters' log-likelihoods ``log p("A")`` and ``log p("B")``
after the prompt are compared (greedy decoding restricted to the two options). That is the answer greedy
decoding gives whenever its first token is one of the two letters, and it never produces an unparseable answer
(free text such as "The first one" would otherwise have to be counted wrong). :func:`parse_choice` reads a
free-text answer ("B", "(a)", "Option B.", "A. the caption", or the caption itself) for answers produced
elsewhere. :func:`choose` returns the margin ``log p(letter of caption_a) - log p(letter of caption_b)`` (> 0:
``caption_a`` chosen; a tie is not a choice of ``caption_a``).

Option order (``choice_order``): ``random`` (the paper config, as the authors' ``random.randint(0, 1)`` per item)
draws each item's coin from a hash of ``choice_seed`` and the item's key (its image file name and both
captions), so an item gets the same order for every model (pre-trained and fine-tuned see identical questions),
in any subset or row order of the benchmark and wherever the data lies; ``fixed`` (``caption_a`` is always A) or ``both`` (margins of both orders averaged:
no letter bias, twice the cost; ours).

Benchmarks (``protocol``, :mod:`.benchmarks`): ``choice`` (the paper, §4.2 "query the model to choose between
the positive and negative captions when presented with the ground truth image", and §4.3 / §4.4 / appendix E)
or ``likelihood`` (ours: the summed caption log-likelihood of :meth:`VlmScorer.score_pairs` as an ITM-style score;
length-biased, kept as an option).

For pairwise benchmarks that take ITM-style scorers, :class:`VlmScorer` also has ``score_pairs(images,
texts)``: the log-likelihood of each caption as the assistant's answer to LLaVA-1.5's short-caption
instruction ("Provide a one-sentence caption for the provided image.") given the image (sum over its
tokens, or the mean with ``caption_score: mean``). Scores do not depend on the batch size beyond float noise:
sequences are right-padded with an attention mask (positions stay those of the unpadded sequence).

Fine-tuning in conversation format (§3.5, Figure 3 (b); LoRA optional, merged before saving) is
:mod:`.vlm_finetune`; its names are importable from here too.

Config (study section ``vlm``; defaults in the schema, ``countercurate.vlm``): ``lr`` 2e-6, ``batch_size`` 16, ``epochs`` 1
(appendix, Flickr30k-Attributes; Flickr30k-Positions / -Counting use ``lr`` 2.56e-5, batch 16).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ...config import fill_section
from ...device import from_config
from ...errors import ConfigError, input_error
from ...models import registry
from ...models.llava import IGNORE, VICUNA_SYSTEM, Encoded, Encoder, collate, render_prompt  # noqa: F401
from ...scorers import ImageLike, Scorer, load_image
from . import STUDY, VLM_ROLE

log = logging.getLogger(__name__)

ROLE = VLM_ROLE
SECTION = "vlm"
#: required columns of training / scoring tables; ``negative_image_path`` is optional
COLUMNS = ("image_path", "caption", "negative_caption")
NEGATIVE_IMAGE = "negative_image_path"
LETTERS = ("A", "B")



# --------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VlmSettings:
    """The ``vlm`` section with the schema's defaults filled (config/schema.yaml gives each key's source)."""

    lr: float
    batch_size: int
    epochs: float
    grad_accum_steps: int
    eval_batch_size: int
    weight_decay: float
    warmup_ratio: float
    lr_scheduler: str
    max_grad_norm: float
    max_length: int
    freeze_vision: bool
    lora: dict | None
    gradient_checkpointing: bool
    max_steps: int | None
    eval_every: int | None
    deterministic: bool
    cpu_threads: int | None
    system: str | None
    question: str
    answer_instruction: str
    caption_prompt: str
    caption_score: str
    choice_order: str
    choice_seed: int
    protocol: str

    @classmethod
    def from_config(cls, cfg: dict) -> "VlmSettings":
        """Settings from ``cfg["vlm"]`` (a study view; missing keys take the schema's defaults, each with its source:
        ``countercurate.vlm`` in config/schema.yaml). Unknown keys and bad values are a :class:`ConfigError`."""
        section = cfg.get(SECTION) if isinstance(cfg, dict) else None
        values = fill_section(f"{STUDY}.{SECTION}", section)
        return cls(**values)

    @classmethod
    def defaults(cls) -> "VlmSettings":
        """The schema's defaults (what a config without a ``vlm`` section gets)."""
        return cls.from_config({})

    def as_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------------------------
def choice_question(settings: VlmSettings, option_a: str, option_b: str) -> str:
    """The multiple-choice question of the authors' LLaVA scripts (the image placeholder is added by the
    chat template): question, ``A. ...``, ``B. ...``, then the answer instruction."""
    return f"{settings.question}\nA. {option_a}\nB. {option_b}\n{settings.answer_instruction}"


def item_keys(images: Sequence[ImageLike], captions_a: Sequence[str], captions_b: Sequence[str]) -> list[str]:
    """A stable key per item for the option order: the image's file name (not its folder, so moving the data does
    not change the questions; the item's position when the image is an in-memory picture) and both captions."""
    out = []
    for i, (image, a, b) in enumerate(zip(images, captions_a, captions_b)):
        where = Path(image).name if isinstance(image, (str, os.PathLike)) else f"#{i}"
        out.append(f"{where}\x1f{a}\x1f{b}")
    return out


def option_a_first(keys: Sequence[str], seed: int) -> np.ndarray:
    """Per item, whether ``caption_a`` is option A: a fair coin from ``sha256(seed, key)``, so the order depends on
    the item and the seed only (not on the row's position, the batch or the model)."""
    return np.array([hashlib.sha256(f"{int(seed)}\x1e{k}".encode()).digest()[0] % 2 == 0 for k in keys], dtype=bool)


#: a letter answer: optional "the answer is" / "option", the letter, then a bracket, stop, colon, comma or the end
#: (so the article in "a dog ..." is not read as option A)
_LETTER = re.compile(r"^\W*(?:(?:the\s+)?(?:answer|option|choice)\s*(?:is)?\s*[:\-]?\s*)?\(?([ab])\s*(?:[).:,]|$)",
                     re.IGNORECASE)


def parse_choice(answer: str, option_a: str, option_b: str) -> str | None:
    """The option a free-text answer names: ``"A"`` / ``"B"``, or ``None`` when it names neither (counted wrong).

    Accepts the letter with any case, brackets and punctuation (``"B"``, ``"(a)"``, ``"B."``, ``"Option B"``,
    ``"The answer is A"``, ``"A. <caption>"``; not the article of ``"a dog ..."``) and an answer that repeats
    exactly one option's text (or the longer one when one option contains the other)."""
    text = str(answer or "").strip()
    m = _LETTER.match(text)
    if m:
        return m.group(1).upper()
    norm = re.sub(r"[^a-z0-9 ]+", "", text.lower()).strip()
    a = re.sub(r"[^a-z0-9 ]+", "", str(option_a).lower()).strip()
    b = re.sub(r"[^a-z0-9 ]+", "", str(option_b).lower()).strip()
    hits = [letter for letter, opt in ((LETTERS[0], a), (LETTERS[1], b)) if opt and opt in norm]
    if len(hits) == 1:
        return hits[0]
    if len(hits) == 2 and a != b and (a in b or b in a):  # one option contains the other: the longer one
        return LETTERS[0] if len(a) > len(b) else LETTERS[1]
    return None  # neither option, or both named


# --------------------------------------------------------------------------------------------
# encoding
# --------------------------------------------------------------------------------------------
# The LLaVA prompt and encoding (render_prompt, Encoder, Encoded, collate) are shared with the VQA check:
# :mod:`counterfactory.models.llava`, imported above.


# --------------------------------------------------------------------------------------------
# scoring
# --------------------------------------------------------------------------------------------
class VlmScorer(Scorer):
    """Log-likelihood scorer over a ``LlavaForConditionalGeneration`` (CounterCurate §4).

    ``score_pairs(images, texts)`` (and ``score_index_pairs`` / ``score_matrix``, as the ITM scorers of
    :mod:`counterfactory.scorers`): log-likelihood of each caption as the answer to ``caption_prompt`` given
    the image. :meth:`choose`: the paper's two-caption question, margin of the two answer letters."""

    def __init__(self, model, processor, *, settings: VlmSettings | None = None, **kw):
        self.settings = settings or VlmSettings.defaults()
        kw.setdefault("batch_size", self.settings.eval_batch_size)
        super().__init__(model, **kw)
        self.processor = processor
        self.encoder = Encoder(processor, self.settings.max_length)

    # model calls -----------------------------------------------------------------------------
    @torch.no_grad()
    def _logprobs(self, items: Sequence[Encoded]) -> list[torch.Tensor]:
        """Per item: log-probabilities (float32) of its answer tokens, one forward pass per batch."""
        batch = collate(items, self.encoder.pad_id)
        out = self.model(input_ids=batch["input_ids"].to(self.device),
                         attention_mask=batch["attention_mask"].to(self.device),
                         pixel_values=self._pixels(batch["pixel_values"]))
        logits = out.logits
        result = []
        for i, e in enumerate(items):
            n = len(e.input_ids)
            if n == e.n_prompt:
                result.append(torch.zeros(0))
                continue
            step = torch.log_softmax(logits[i, e.n_prompt - 1:n - 1].float(), dim=-1)
            target = batch["input_ids"][i, e.n_prompt:n].to(step.device)
            result.append(step.gather(-1, target[:, None])[:, 0].cpu())
        return result

    def _run(self, jobs: Sequence[tuple[ImageLike, str, str | None]], desc: str) -> list[torch.Tensor]:
        """Answer-token log-probabilities of (image, prompt, answer) jobs, in batches of ``batch_size``."""
        out: list[torch.Tensor] = []
        starts = range(0, len(jobs), self.batch_size)
        for start in self._bar(starts, total=len(starts), desc=desc):
            chunk = jobs[start:start + self.batch_size]
            items = [self.encoder.encode(load_image(img), prompt, answer, eos=False) for img, prompt, answer in chunk]
            out.extend(self._logprobs(items))
        return out

    # interface -------------------------------------------------------------------------------
    def score_index_pairs(self, images, texts, image_idx, text_idx) -> np.ndarray:
        """Log-likelihood of ``texts[text_idx[k]]`` given ``images[image_idx[k]]`` (sum or mean over tokens)."""
        image_idx, text_idx = np.asarray(image_idx, dtype=np.int64), np.asarray(text_idx, dtype=np.int64)
        if len(image_idx) != len(text_idx):
            raise ValueError(f"score_index_pairs: {len(image_idx)} image indexes but {len(text_idx)} text indexes")
        prompt = render_prompt(self.processor, self.settings.caption_prompt, self.settings.system)
        jobs = [(images[i], prompt, str(texts[j])) for i, j in zip(image_idx, text_idx)]
        lp = self._run(jobs, "caption log-likelihood")
        reduce = (lambda t: float(t.mean())) if self.settings.caption_score == "mean" else (lambda t: float(t.sum()))
        return np.array([reduce(t) for t in lp], dtype=np.float64)

    def score_matrix(self, images, texts) -> np.ndarray:
        ii, tt = np.meshgrid(np.arange(len(images)), np.arange(len(texts)), indexing="ij")
        return self.score_index_pairs(images, texts, ii.ravel(), tt.ravel()).reshape(len(images), len(texts))

    def choice_table(self, images: Sequence[ImageLike], captions_a: Sequence[str], captions_b: Sequence[str],
                     order: str | None = None, seed: int | None = None,
                     keys: Sequence[str] | None = None) -> pd.DataFrame:
        """One row per item: ``a_first`` (caption_a shown as option A; both orders: ``None``), ``logp_a`` /
        ``logp_b`` (log-likelihood of the letter naming caption_a / caption_b, averaged over orders for
        ``both``), ``margin`` = logp_a - logp_b and ``choice`` (``a`` when margin > 0, else ``b``).

        ``keys`` name the items for the ``random`` order (default :func:`item_keys`: image path and both
        captions)."""
        n = len(images)
        if not (len(captions_a) == len(captions_b) == n):
            raise ValueError(f"choose: {n} images, {len(captions_a)} captions_a and {len(captions_b)} captions_b; "
                             "they must be aligned")
        order = order or self.settings.choice_order
        seed = self.settings.choice_seed if seed is None else seed
        if order == "fixed":
            orders = [np.ones(n, dtype=bool)]
        elif order == "random":  # the authors' random.randint(0, 1) per item, from the item's key
            keys = item_keys(images, captions_a, captions_b) if keys is None else list(keys)
            if len(keys) != n:
                raise ValueError(f"choose: {len(keys)} keys for {n} items")
            orders = [option_a_first(keys, seed)]
        elif order == "both":
            orders = [np.ones(n, dtype=bool), np.zeros(n, dtype=bool)]
        else:
            raise ConfigError(f"{SECTION}.choice_order: {order!r}. Fix: use random, fixed or both")
        logp_a, logp_b = np.zeros(n), np.zeros(n)
        for a_first in orders:
            jobs = []
            for i in range(n):
                first, second = (captions_a[i], captions_b[i]) if a_first[i] else (captions_b[i], captions_a[i])
                prompt = render_prompt(self.processor, choice_question(self.settings, str(first), str(second)),
                                       self.settings.system)
                jobs += [(images[i], prompt, LETTERS[0]), (images[i], prompt, LETTERS[1])]
            lp = self._letter_logprobs(jobs)
            la, lb = lp[0::2], lp[1::2]  # log p("A"), log p("B")
            logp_a += np.where(a_first, la, lb) / len(orders)
            logp_b += np.where(a_first, lb, la) / len(orders)
        margin = logp_a - logp_b
        return pd.DataFrame({"a_first": orders[0] if len(orders) == 1 else [None] * n, "logp_a": logp_a,
                             "logp_b": logp_b, "margin": margin, "choice": np.where(margin > 0, "a", "b")})

    def _letter_logprobs(self, jobs: list[tuple[ImageLike, str, str]]) -> np.ndarray:
        """log p(letter | image, prompt) of (image, prompt, letter) jobs; when every letter is one token, one
        forward pass per prompt scores both letters (pairs of jobs share their image and prompt)."""
        single = all(len(self.encoder.answer_ids(p, a)) == 1 for _, p, a in jobs)
        if not single:
            return np.array([float(t.sum()) for t in self._run(jobs, "choice")], dtype=np.float64)
        out = np.zeros(len(jobs))
        pairs = list(range(0, len(jobs), 2))
        starts = range(0, len(pairs), self.batch_size)
        for start in self._bar(starts, total=len(starts), desc="choice"):
            chunk = pairs[start:start + self.batch_size]
            items = [self.encoder.encode(load_image(jobs[k][0]), jobs[k][1], None, eos=False) for k in chunk]
            batch = collate(items, self.encoder.pad_id)
            with torch.no_grad():
                logits = self.model(input_ids=batch["input_ids"].to(self.device),
                                    attention_mask=batch["attention_mask"].to(self.device),
                                    pixel_values=self._pixels(batch["pixel_values"])).logits
            for row, (k, e) in enumerate(zip(chunk, items)):
                step = torch.log_softmax(logits[row, e.n_prompt - 1].float(), dim=-1).cpu()
                for j in (k, k + 1):
                    out[j] = float(step[self.encoder.answer_ids(jobs[j][1], jobs[j][2])[0]])
        return out

    def choose(self, images, captions_a, captions_b, order: str | None = None, seed: int | None = None,
               keys: Sequence[str] | None = None) -> np.ndarray:
        """Margins ``log p(letter of a) - log p(letter of b)``; > 0 means the model chooses ``captions_a``."""
        return self.choice_table(images, captions_a, captions_b, order, seed, keys)["margin"].to_numpy(np.float64)

    def describe(self) -> dict:
        return {**super().describe(), "kind": "generative", "caption_score": self.settings.caption_score,
                "choice_order": self.settings.choice_order, "protocol": self.settings.protocol}


def scorer_from_config(cfg: dict, role: str = ROLE, progress: bool = False, **kw) -> VlmScorer:
    """A :class:`VlmScorer` over ``registry.load(cfg, role)`` with the ``vlm`` section's settings and the
    config's device / precision."""
    device, dtype = from_config(cfg)
    model, processor = registry.load(cfg, role, dtype=dtype)   # read in the scoring precision (7B: half the memory)
    return VlmScorer(model, processor, settings=VlmSettings.from_config(cfg), name=role, device=device,
                     dtype=dtype, progress=progress, **kw)


def choose(cfg: dict, role: str, images: Sequence[ImageLike], captions_a: Sequence[str],
           captions_b: Sequence[str]) -> np.ndarray:
    """CounterCurate's LLaVA protocol (§4.2-§4.4): for each image, the margin ``log p(letter of captions_a[i])
    - log p(letter of captions_b[i])`` of the two-option question; > 0 means ``captions_a[i]`` is chosen (with
    ``captions_a`` the positives, accuracy is ``mean(margin > 0)``)."""
    return scorer_from_config(cfg, role).choose(images, captions_a, captions_b)


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------
def read_pairs(path: str | os.PathLike) -> pd.DataFrame:
    """Rows ``image_path, caption, negative_caption[, negative_image_path]`` (parquet or CSV) with relative image
    paths resolved against the table's folder; every problem is an error naming the file and the row."""
    path = Path(path)
    if not path.exists():
        raise input_error(path, None, "caption-pair table not found", "check the path and that its step has run")
    try:
        frame = pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)
    except Exception as exc:  # pyarrow / pandas raise several types
        raise input_error(path, None, f"not a readable table ({exc})", "regenerate it") from exc
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {missing}",
                          f"the table needs {list(COLUMNS)} (and optionally {NEGATIVE_IMAGE})")
    if frame.empty:
        raise input_error(path, None, "no rows", "check the step that wrote it")
    frame = frame.reset_index(drop=True)
    base = path.resolve().parent
    out = {c: [] for c in (*COLUMNS, NEGATIVE_IMAGE)}
    for i, row in enumerate(frame.itertuples(index=False)):
        rec = row._asdict()
        for col in ("caption", "negative_caption"):
            v = rec[col]
            if not isinstance(v, str) or not v.strip():
                raise input_error(path, f"row {i}", f"{col} is {v!r}, not a non-empty text", "fix or drop the row")
        if rec["caption"].strip() == rec["negative_caption"].strip():
            raise input_error(path, f"row {i}", "caption and negative_caption are the same",
                              "a negative must differ from its positive; fix or drop the row")
        images = [("image_path", rec["image_path"], True), (NEGATIVE_IMAGE, rec.get(NEGATIVE_IMAGE), False)]
        for col, v, required in images:
            empty = not v.strip() if isinstance(v, str) else _missing(v)
            if empty:
                if required:
                    raise input_error(path, f"row {i}", f"{col} is empty", "give every row its image")
                out[col].append(None)
                continue
            if not isinstance(v, str):
                raise input_error(path, f"row {i}", f"{col} is {v!r}, not a path", "fix the row")
            p = v if os.path.isabs(v) else str(base / v)
            if not os.path.isfile(p):
                raise input_error(path, f"row {i}", f"{col} {p} does not exist",
                                  "check the path (relative paths are relative to the table's folder)")
            out[col].append(p)
        out["caption"].append(rec["caption"].strip())
        out["negative_caption"].append(rec["negative_caption"].strip())
    return pd.DataFrame(out)


def _missing(value) -> bool:
    """None, NaN or pd.NA (how parquet / CSV give an empty optional cell)."""
    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):  # arrays and other non-scalars are not "missing"
        return False


def score_table(cfg: dict, role: str, data: str | os.PathLike, progress: bool = False) -> pd.DataFrame:
    """``vlm-score``: per row of ``data`` the caption and negative log-likelihoods (``score_pairs``) and the
    two-option choice (margin > 0: the caption is chosen)."""
    frame = read_pairs(data)
    scorer = scorer_from_config(cfg, role, progress=progress)
    images = frame["image_path"].tolist()
    table = scorer.choice_table(images, frame["caption"].tolist(), frame["negative_caption"].tolist())
    return pd.DataFrame({
        "row": np.arange(len(frame)), "image_path": images, "caption": frame["caption"],
        "negative_caption": frame["negative_caption"],
        "logp_caption": scorer.score_pairs(images, frame["caption"].tolist()),
        "logp_negative": scorer.score_pairs(images, frame["negative_caption"].tolist()),
        "caption_first": table["a_first"], "logp_letter_caption": table["logp_a"],
        "logp_letter_negative": table["logp_b"], "choice_margin": table["margin"],
        "chose_caption": table["margin"] > 0})
