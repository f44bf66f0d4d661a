"""The ``llm`` role: instructions to a local chat model, answered as JSON that follows a schema.

CounterCurate asks closed models for text: GPT-4 rewrites vanilla above/below negatives into natural
sentences for GLIGEN (§3.2, app. B) and GPT-4V writes the noun / adjective / swap negatives of
Flickr30k-Attributes from the caption, its entity markup and the box-annotated image (§3.4, app. A). Here a
local instruction-tuned model (``models.llm``) plays that role; later studies (CVLD) reuse it.

How a request is answered
-------------------------
* A request is a row ``item_id, task, fields`` (``fields``: a JSON object, or a dict). The task (see
  :func:`register_task`) names a prompt template -- a package resource under
  ``counterfactory/resources/prompts/`` filled in with :class:`string.Template` (``$name``) -- and builds the
  JSON schema of the answer from the fields. A row may instead carry its own ``prompt`` and ``schema``
  columns (ad-hoc tasks).
* Generation is greedy (temperature 0: ``do_sample=False``), batched with left padding, and **constrained
  to the schema** with lm-format-enforcer (a :class:`~lmformatenforcer.JsonSchemaParser` and one
  :class:`~lmformatenforcer.TokenEnforcer` per row, as the library's transformers integration does, so
  rows of one batch may have different schemas). Even a tiny random model thus writes parseable JSON as
  long as it stays within ``llm.max_new_tokens``; bounded schemas (``maxLength``, ``enum``) keep it there.
* Every answer is parsed and checked with :mod:`jsonschema`; an answer that is cut off, unparseable or
  off-schema becomes a row with ``valid=False`` and the reason in ``error`` -- never an exception.
* Answers are cached in a JSONL file keyed by (model fingerprint, ``prompt_sha256``, ``schema_sha256``,
  decoding settings): a rerun reuses them without loading the model. ``prompt_sha256`` is the sha256 of
  the canonical JSON of the system and user messages, plus what the model sees of the images: for a row with
  one ``image_path``, the file's sha256 and its ``boxes``; for a row with an ``images`` list, every image's
  file sha256 with the boxes drawn on it, in order, and ``image_max_side`` (a file is hashed, never decoded,
  so a rerun whose answers are all cached stays cheap).

Which role answers
------------------
``models.llm`` by default; every entry point takes ``role=`` so that another configured chat model answers
instead -- CounterCurate's attribute step gives GPT-4V's part to the ``vlm`` role (LLaVA-1.5 class,
``countercurate.attributes.role``). The decoding settings (``llm:`` section) and the cache are the same.

Text-only or multimodal
-----------------------
If the answering role is a vision-language checkpoint (its config has a ``vision_config``; loaded as
``(model, processor)`` by :mod:`counterfactory.models.loaders_llm` or :mod:`~counterfactory.models.loaders_vlm`),
rows with images are sent with them, each as one image entry of the chat template, in order:

* ``image_path`` (+ ``boxes``): one image, with the boxes (``[{"label", "box": [x1, y1, x2, y2], "color"}]``)
  drawn onto it first, as the paper overlaid boxes for GPT-4V (app. A);
* ``images``: a JSON list of ``{"path", "boxes"?}``, one entry per image sent -- e.g. the plain photograph and
  then a copy with the boxes drawn, the two pictures GPT-4V received in app. A. It takes precedence over
  ``image_path``.

With a text-only model the images are not used: tasks then describe the regions in words (box coordinates in
the prompt). The multimodal path is tested offline with the tiny LLaVA stand-in of the ``vlm`` role.

Config (``llm:`` section of the study): ``batch_size``, ``max_new_tokens``, ``cache`` (JSONL path or
null), ``image_max_side`` (annotated images are downscaled to this longest side).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from ..config import fill_definition
from ..device import from_config
from ..errors import ConfigError, InputError, ModelLoadError, input_error, missing_input
from ..io import write_parquet
from ..models import registry
from ..models.identity import _hash_file
from ..models.loaders_llm import is_vision_language
from ..models.registry import _hf_kwargs, _src, model_spec
from ..rgb import to_rgb
from .captions import prompt_text_problem

log = logging.getLogger(__name__)

#: columns of :func:`run_requests`' result
RESULT_COLUMNS = ["item_id", "task", "prompt_sha256", "schema_sha256", "answer", "valid", "error", "cached",
                  "model"]
PROMPT_PACKAGE = "counterfactory.resources"
PROMPT_FOLDER = "prompts"
SYSTEM_PROMPT = "system.txt"
CACHE_FORMAT = 1
#: colours of drawn boxes, in order of the boxes of a request (when a box names none)
#: longest run of whitespace allowed between JSON tokens (lm-format-enforcer's default is 12)
MAX_WHITESPACE = 2
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
BOX_COLORS = ("red", "blue", "lime", "orange", "magenta", "cyan", "yellow", "purple", "white", "brown")


# --------------------------------------------------------------------------- prompts and tasks


def prompt_text(name: str) -> str:
    """The text of the package prompt resource ``resources/prompts/<name>``."""
    res = resources.files(PROMPT_PACKAGE).joinpath(PROMPT_FOLDER).joinpath(name)
    try:
        return res.read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as exc:
        raise ConfigError(f"prompt resource {PROMPT_FOLDER}/{name} is missing from the counterfactory package "
                          f"({exc}). Fix: reinstall the package (pip install -e .)") from exc


def fill(template: str, fields: dict, where: str = "<prompt>") -> str:
    """``template`` with ``$name`` placeholders filled from ``fields``; a missing field is an :class:`InputError`."""
    try:
        return string.Template(template).substitute({k: "" if v is None else str(v) for k, v in fields.items()})
    except KeyError as exc:
        raise input_error(where, None, f"the prompt needs the field {exc.args[0]!r}, which the request lacks",
                          f"add {exc.args[0]!r} to the request's fields") from exc
    except ValueError as exc:
        raise input_error(where, None, f"malformed prompt template ({exc})", "escape a literal $ as $$") from exc


@dataclass(frozen=True)
class Task:
    """An ``llm`` task: its prompt template resource and the JSON schema of its answer.

    ``render(fields)`` returns the user message (default: the template filled with the fields);
    ``schema(fields)`` the answer's JSON schema (it may depend on the fields, e.g. an ``enum`` of ids)."""

    name: str
    template: str
    schema: Callable[[dict], dict]
    render: Callable[[dict], str] | None = None
    #: the meaning check of a schema-valid answer: ``check(fields, parsed answer)`` returns the reason it is
    #: unusable (off-topic, not what was asked) or None; run by :func:`run_requests` (:func:`check_meaning`)
    check: Callable[[dict, Any], str | None] | None = None

    def user_prompt(self, fields: dict) -> str:
        if self.render is not None:
            return self.render(fields)
        return fill(prompt_text(self.template), fields, where=f"task {self.name} ({self.template})")


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Make ``task`` known to :func:`run_requests` (study modules register theirs on import)."""
    TASKS[task.name] = task
    return task


# --------------------------------------------------------------------------- hashing and requests


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def schema_sha256(schema: dict) -> str:
    return sha256_text(canonical(schema))


def _as_dict(value, what: str, item) -> dict:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            out = json.loads(value) if value.strip() else {}
        except ValueError as exc:
            raise input_error("requests", item, f"{what} is not valid JSON ({exc})", f"write {what} as a JSON object")
        if isinstance(out, dict):
            return out
    raise input_error("requests", item, f"{what} must be a JSON object, got {type(value).__name__}",
                      f"write {what} as a JSON object")


def _cell(row: dict, key: str):
    value = row.get(key)
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    return value


@dataclass
class Prepared:
    """One request ready to run: messages, schema, image and their hashes."""

    item_id: str
    task: str
    system: str
    user: str
    schema: dict
    image_path: str | None
    boxes: list
    prompt_sha256: str = ""
    schema_sha256: str = ""
    fields: dict | None = None
    #: the ``images`` column: ``[{"path", "boxes"}]``, one entry per image sent (None: ``image_path`` + ``boxes``)
    images: list | None = None

    def image_specs(self) -> list[dict]:
        """``[{"path", "boxes"}]`` of the images of this request, in the order they are sent."""
        if self.images is not None:
            return self.images
        return [{"path": self.image_path, "boxes": self.boxes}] if self.image_path else []


def _images_cell(value, item: str) -> list | None:
    """The ``images`` cell of a request as ``[{"path", "boxes"}]`` (None when the row has none)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise input_error("requests", item, f"images is not valid JSON ({exc})",
                              'write images as a JSON list of {"path": ..., "boxes": [...]}') from exc
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list):
        raise input_error("requests", item, f"images must be a list, got {type(value).__name__}",
                          'write images as a JSON list of {"path": ..., "boxes": [...]}')
    out = []
    for i, entry in enumerate(value):
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or not entry["path"]:
            raise input_error("requests", item, f"images[{i}] has no path",
                              'give every image entry a "path" (and optionally "boxes")')
        out.append({"path": entry["path"], "boxes": list(entry.get("boxes") or [])})
    return out or None


def prepare(requests: pd.DataFrame) -> list[Prepared]:
    """Render every request's prompt and schema (unknown task, missing field -> :class:`InputError`)."""
    missing = {"item_id", "task"} - set(requests.columns)
    if missing:
        raise input_error("requests", None, f"missing column(s) {', '.join(sorted(missing))}",
                          "give every request an item_id and a task")
    system = prompt_text(SYSTEM_PROMPT).strip()
    out = []
    for row in requests.to_dict("records"):
        item = str(row["item_id"])
        task_name = str(row["task"])
        fields = _as_dict(row.get("fields"), "fields", item)
        prompt, schema = _cell(row, "prompt"), _cell(row, "schema")
        if prompt is None or schema is None:
            task = TASKS.get(task_name)
            if task is None:
                known = ", ".join(sorted(TASKS))
                raise input_error("requests", item, f"unknown llm task {task_name!r} (known: {known})",
                                  "use a registered task or give the row its own prompt and schema columns")
            prompt = task.user_prompt(fields) if prompt is None else prompt
            schema = task.schema(fields) if schema is None else schema
        schema = _as_dict(schema, "schema", item)
        boxes = _cell(row, "boxes")
        if isinstance(boxes, str):
            boxes = json.loads(boxes) if boxes.strip() else []
        out.append(Prepared(item, task_name, system, str(prompt), schema, _cell(row, "image_path"),
                            list(boxes) if boxes is not None else [], fields=fields,
                            images=_images_cell(row.get("images"), item)))
    return out


# --------------------------------------------------------------------------- cache


class AnswerCache:
    """Answers keyed by (model, prompt_sha256, schema_sha256, settings), kept in a JSONL file.

    Lines are appended (one JSON object each) and flushed as answers arrive, so an interrupted run keeps
    what it generated; unreadable lines (a torn last line) are skipped with a warning."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None
        self.entries: dict[tuple, dict] = {}
        if self.path is not None and self.path.exists():
            self._load()

    @staticmethod
    def key(model: str, prompt_sha: str, schema_sha: str, settings_sha: str) -> tuple:
        return model, prompt_sha, schema_sha, settings_sha

    def _load(self) -> None:
        bad = 0
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                    if rec.get("format") != CACHE_FORMAT:
                        raise ValueError("format")
                    k = self.key(rec["model"], rec["prompt_sha256"], rec["schema_sha256"], rec["settings_sha256"])
                    self.entries[k] = rec
                except (ValueError, KeyError, TypeError, AttributeError):
                    bad += 1
        if bad:
            log.warning("llm cache %s: skipped %d unreadable line(s)", self.path, bad)

    def get(self, key: tuple) -> dict | None:
        return self.entries.get(key)

    def put(self, key: tuple, answer: str, **extra) -> None:
        rec = {"format": CACHE_FORMAT, "model": key[0], "prompt_sha256": key[1], "schema_sha256": key[2],
               "settings_sha256": key[3], "answer": answer, **extra}
        self.entries[key] = rec
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, sort_keys=True, ensure_ascii=False) + "\n")
            fh.flush()


# --------------------------------------------------------------------------- validation


def check_answer(text: str | None, schema: dict) -> tuple[Any, str | None]:
    """``(parsed answer, None)`` when ``text`` is JSON that satisfies ``schema``, else ``(parsed or None, reason)``.
    A string of the answer holding a tab, line break or other control character is invalid too (reason names the
    field and the character, :func:`counterfactory.text.captions.prompt_text_problem`): answers become captions and
    generation prompts, and JSON escapes such as ``\\t`` pass the schema and the constrained decoding."""
    import jsonschema

    if text is None or not str(text).strip():
        return None, "empty answer"
    try:
        value = json.loads(text)
    except ValueError as exc:
        return None, f"not valid JSON ({exc.msg} at character {exc.pos}; cut off by max_new_tokens?)"
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        where = ".".join(str(p) for p in errors[0].absolute_path) or "<answer>"
        return value, f"does not match the schema: {where}: {errors[0].message}"
    for where, piece in _strings(value):    # answers become captions and prompts: no tabs or control characters
        problem = prompt_text_problem(piece)
        if problem and piece.strip():
            return value, f"{where}: {problem}"
    return value, None


#: columns of :func:`rejected_rows`: every rejected or unusable answer with its reason code and the full message
REJECTED_COLUMNS = ["item_id", "task", "answer", "reason", "detail"]
#: reason codes of a rejected answer (the ``reason`` column of :func:`rejected_rows`), by the start of ``error``
CHECK_PREFIX = "failed the task's check"
REASONS = {"empty answer": "empty_answer", "not valid JSON": "not_json", "does not match the schema": "off_schema",
           CHECK_PREFIX: "failed_check"}


def check_meaning(task: str, fields: dict | None, value: Any) -> str | None:
    """The reason a schema-valid answer is unusable by the task's own check (:attr:`Task.check`), as an ``error``
    (``"failed the task's check: <reason>"``), or None (accepted, or the task has no check)."""
    t = TASKS.get(task)
    if t is None or t.check is None:
        return None
    reason = t.check(fields or {}, value)
    return f"{CHECK_PREFIX}: {reason}" if reason else None


def reason_code(error: str | None) -> str:
    """The reason code of an answer's ``error`` (:data:`REASONS`; a control character in a string: ``control_character``)."""
    text = str(error or "")
    for prefix, code in REASONS.items():
        if text.startswith(prefix):
            return code
    return "control_character" if "(U+" in text else "invalid_answer"


def rejected_rows(answers: pd.DataFrame) -> pd.DataFrame:
    """The invalid answers of a :func:`run_requests` table as :data:`REJECTED_COLUMNS` rows (reason code and message),
    so that no unusable answer is dropped without a trace."""
    if not len(answers):
        return pd.DataFrame(columns=REJECTED_COLUMNS)
    bad = answers[~answers["valid"].astype(bool)]
    return pd.DataFrame({"item_id": bad["item_id"].astype(str).to_numpy(), "task": bad["task"].to_numpy(),
                         "answer": bad["answer"].to_numpy(), "reason": [reason_code(e) for e in bad["error"]],
                         "detail": bad["error"].to_numpy()}, columns=REJECTED_COLUMNS)


def reason_counts(rejected: pd.DataFrame, column: str = "reason") -> dict[str, int]:
    """``{reason: rows}`` of a rejected table, most common first (ties by name), for summaries."""
    if not len(rejected):
        return {}
    counts = rejected[column].astype(str).value_counts()
    return {k: int(counts[k]) for k in sorted(counts.index, key=lambda k: (-counts[k], k))}


def _strings(value, where: str = "<answer>"):
    """``(path, string)`` of every string in a parsed JSON answer (depth first, in key order)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, str(k) if where == "<answer>" else f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, str(i) if where == "<answer>" else f"{where}.{i}")


# --------------------------------------------------------------------------- the model


def settings_of(section: dict) -> dict:
    """The ``llm:`` section with the schema's defaults filled (``definitions.llm_decoding`` in config/schema.yaml,
    shared by every study's ``llm`` section); bad values are a :class:`ConfigError` naming the key."""
    return fill_definition("llm_decoding", section or {}, where="llm")


def decoding_sha256(settings: dict) -> str:
    """What, besides model, prompt and schema, decides an answer: greedy decoding, the token budget."""
    return sha256_text(canonical({"decoding": "greedy", "constrained": "lm-format-enforcer/json-schema",
                                  "max_new_tokens": settings["max_new_tokens"]}))


def model_identity(cfg: dict, role: str = "llm") -> str | None:
    """Content identity of the configured ``role`` (fingerprint, else ``commit:<hub commit>``), without loading."""
    info = registry.configured_models(cfg, [role])[role]
    if info.get("fingerprint"):
        return info["fingerprint"]
    if info.get("commit"):
        return f"commit:{info['commit']}"
    return None


def _loaded_identity(role: str = "llm") -> str:
    info = registry.loaded_models().get(role) or {}
    if info.get("fingerprint"):
        return info["fingerprint"]
    if info.get("commit"):
        return f"commit:{info['commit']}"
    raise registry.ModelIdentityError(
        f"role {role!r}: the loaded model has neither a content fingerprint nor a hub commit, so its answers "
        f"cannot be cached safely. Fix: download the model (hf download <id>) or point models.{role}.source at a "
        "folder")


def is_multimodal(cfg: dict, role: str = "llm") -> bool:
    """Whether the configured ``role`` is a vision-language checkpoint (reads only its config.json)."""
    from transformers import AutoConfig

    spec = model_spec(cfg, role)
    try:
        return is_vision_language(AutoConfig.from_pretrained(_src(spec), **_hf_kwargs(spec)))
    except Exception:  # unreadable config: the loader will report it properly when the model is needed
        return False


def render_image(path: str, boxes: list, max_side: int):
    """The image of one request entry as the model receives it: RGB, ``boxes`` drawn (:func:`annotate_boxes`),
    downscaled to ``max_side`` (longest side)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            image = to_rgb(im, path)
    except OSError as exc:
        raise input_error(path, None, f"image of an llm request cannot be read ({exc})", "check the image path") \
            from exc
    if boxes:
        image = annotate_boxes(image, boxes)
    if max(image.size) > max_side:
        scale = max_side / max(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
    return image


def _file_sha256(path: str) -> str:
    try:
        return _hash_file(Path(path))
    except OSError as exc:
        raise input_error(path, None, f"image of an llm request cannot be read ({exc.strerror or exc})",
                          "check image_path") from exc


class Runner:
    """A loaded chat model (``role``, default ``llm``) with the lm-format-enforcer data of its tokenizer (built
    once)."""

    def __init__(self, cfg: dict, settings: dict, role: str = "llm"):
        import torch

        self.settings = settings
        self.role = role
        self.device, dtype = from_config(cfg)
        dtype = dtype if self.device.type != "cpu" else None
        model, second = registry.load(cfg, role, dtype=dtype)
        if dtype is not None and getattr(model, "dtype", dtype) != dtype:
            model = model.to(dtype=dtype)   # a loader that takes no dtype (the vlm role's)
        self.model = model.to(self.device)
        self.processor = second if hasattr(second, "image_processor") else None
        self.tokenizer = second.tokenizer if self.processor is not None else second
        self.tokenizer.padding_side = "left"
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos = set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos] if gen_eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        if not eos:
            raise ModelLoadError(f"role {role!r}: the tokenizer defines no end-of-sequence token. Fix: use a chat "
                                 "checkpoint whose tokenizer or generation_config sets eos_token_id")
        self.eos_ids = sorted(eos)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.tokenizer_data = _enforcer_tokenizer_data(self.tokenizer, self.eos_ids)
        self.torch = torch
        self.generated = 0  # rows generated by this runner (tests: cache hits generate nothing)
        self.over_context = 0  # longest prompt + max_new_tokens beyond the model's positions (0: none)
        self._warned_context = False

    def _check_context(self, enc: dict) -> None:
        """Warn once per runner when a prompt plus ``max_new_tokens`` exceeds the model's positions (its text
        config's ``max_position_embeddings``): rotary models then answer from positions they never saw, models with
        learned positions fail inside ``generate``. Recorded in :attr:`over_context` (tests, summaries)."""
        limit = context_length(self.model)
        mask = enc.get("attention_mask")
        if limit is None or mask is None:
            return
        longest = int(mask.sum(dim=1).max())
        need = longest + int(self.settings["max_new_tokens"])
        if need <= limit:
            return
        self.over_context = max(self.over_context, need)
        if not self._warned_context:
            self._warned_context = True
            log.warning("%s: a prompt of %d tokens plus max_new_tokens %d exceeds the model's context of %d positions "
                        "(max_position_embeddings); its answers are unreliable. Fix: a checkpoint with a longer "
                        "context, fewer or smaller pictures, or shorter prompts (CounterCurate attributes: "
                        "attributes.one_answer: false, or images: annotated)", self.role, longest,
                        self.settings["max_new_tokens"], limit)

    def _images(self, p: Prepared) -> list:
        return [render_image(spec["path"], spec["boxes"], self.settings["image_max_side"]) for spec in p.image_specs()]

    def generate(self, batch: list[Prepared]) -> list[str]:
        """Greedy, schema-constrained answers of one batch (left padding)."""
        from lmformatenforcer import JsonSchemaParser, TokenEnforcer
        from transformers import GenerationConfig

        torch = self.torch
        use_images = self.processor is not None and any(p.image_specs() for p in batch)
        texts, images = [], []
        for p in batch:
            if use_images:
                shown = self._images(p)   # one image entry per picture, in order (e.g. plain, then boxes drawn)
                content = [{"type": "image"} for _ in shown] + [{"type": "text", "text": p.user}]
                messages = [{"role": "system", "content": [{"type": "text", "text": p.system}]},
                            {"role": "user", "content": content}]
                texts.append(self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
                images.extend(shown)
            else:
                messages = [{"role": "system", "content": p.system}, {"role": "user", "content": p.user}]
                texts.append(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        if use_images:
            enc = self.processor(text=texts, images=images or None, padding=True, return_tensors="pt")
        else:
            enc = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        enc = {k: v.to(self.device) if hasattr(v, "to") else v for k, v in enc.items()}
        prompt_len = enc["input_ids"].shape[1]
        self._check_context(enc)
        enforcers = []
        for p in batch:
            parser = JsonSchemaParser(enforcer_schema(p.schema))
            enforcer = TokenEnforcer(self.tokenizer_data, parser)
            parser.config.force_json_field_order = True  # answer fields in the order the schema lists them
            parser.config.max_consecutive_whitespaces = MAX_WHITESPACE
            enforcers.append(enforcer)
        eos = set(self.eos_ids)

        def allowed(batch_id: int, sent) -> list[int]:
            tokens = sent.tolist()
            if eos.intersection(tokens[prompt_len:]):
                return [self.pad_id]  # finished row: generate pads until the batch is done
            got = enforcers[batch_id].get_allowed_tokens(tokens).allowed_tokens
            return list(got) if len(got) else list(self.eos_ids)

        config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=self.settings["max_new_tokens"],
                                  eos_token_id=self.eos_ids, pad_token_id=self.pad_id)
        with torch.inference_mode():
            out = self.model.generate(**enc, generation_config=config, prefix_allowed_tokens_fn=allowed)
        self.generated += len(batch)
        return [self.tokenizer.decode(row[prompt_len:], skip_special_tokens=True).strip() for row in out.cpu()]


def context_length(model) -> int | None:
    """The positions a (vision-)language model was built for: its text config's ``max_position_embeddings``
    (LLaVA: the language model's), None when the config does not say."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def enforcer_schema(schema: Any) -> Any:
    """The schema handed to lm-format-enforcer: ``minLength`` dropped, ``maxLength`` lowered by
    :data:`MAX_WHITESPACE`. lm-format-enforcer 0.11 does not count whitespace at the very start of a string
    (it takes it for whitespace between tokens), so its length bounds can be off by that much: a leading
    space plus a closing quote then passes ``minLength`` unseen and leaves the parser stuck. The answer is
    still validated against the original schema, so a too-short string is a rejected answer, not a crash."""
    if isinstance(schema, list):
        return [enforcer_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: enforcer_schema(v) for k, v in schema.items() if k != "minLength"}
    if isinstance(out.get("maxLength"), int):
        out["maxLength"] = max(1, out["maxLength"] - MAX_WHITESPACE)
    return out


def _enforcer_tokenizer_data(tokenizer, eos_ids: list[int]):
    """lm-format-enforcer's per-tokenizer data (regular tokens and how each decodes).

    Built as ``lmformatenforcer.integrations.transformers.build_token_enforcer_tokenizer_data`` does; that
    module cannot be imported with transformers >= 5 (it imports ``transformers.tokenization_utils``).
    Tokens holding control characters are left out: lm-format-enforcer would accept them inside JSON
    strings, where JSON forbids them, so answers use plain spaces as their only whitespace. So are tokens
    that add nothing after other text or only a partial UTF-8 character (byte pieces of a multi-byte character):
    the enforcer sees no new text after them, and a model could repeat them until ``max_new_tokens`` runs out.
    A SentencePiece word-start piece ``▁`` decodes to nothing alone but to a space after text, so it is kept
    (Llama-style vocabularies -- LLaVA's -- need it before a word that has no ``▁word`` piece).
    Characters outside the tokenizer's whole-character tokens therefore cannot be written."""
    from lmformatenforcer import TokenEnforcerTokenizerData

    token_0 = tokenizer.encode("0", add_special_tokens=False)[-1]
    special = set(tokenizer.all_special_ids)
    regular = []
    for idx in range(len(tokenizer)):
        if idx in special:
            continue
        after_0 = tokenizer.decode([token_0, idx])[1:]
        alone = tokenizer.decode([idx])
        if _CONTROL.search(after_0) or "\ufffd" in after_0 or not after_0:
            continue  # control characters, partial UTF-8 and empty pieces: never offered (see the docstring)
        regular.append((idx, after_0, len(after_0) > len(alone)))

    def decode(tokens: list[int]) -> str:
        return tokenizer.decode(tokens).rstrip("\ufffd")

    return TokenEnforcerTokenizerData(regular, decode, list(eos_ids), False, len(tokenizer))


def annotate_boxes(image, boxes: Iterable[dict]):
    """A copy of ``image`` with each box (``{"box": [x1, y1, x2, y2], "label", "color"}``) drawn and labelled
    (the box-annotated image given to GPT-4V in CounterCurate app. A)."""
    from PIL import ImageDraw

    image = image.copy()
    draw = ImageDraw.Draw(image)
    width = max(2, round(max(image.size) / 200))
    for i, b in enumerate(boxes):
        color = b.get("color") or BOX_COLORS[i % len(BOX_COLORS)]
        x1, y1, x2, y2 = (float(v) for v in b["box"])
        draw.rectangle([x1, y1, x2, y2], outline=color, width=width)
        if b.get("label"):
            draw.text((x1 + width + 1, y1 + width + 1), str(b["label"]), fill=color)
    return image


# --------------------------------------------------------------------------- entry point


def run_requests(cfg: dict, requests: pd.DataFrame, out_path: str | os.PathLike | None = None,
                 cache_path: str | os.PathLike | None = None, runner: Runner | None = None,
                 role: str = "llm") -> pd.DataFrame:
    """Answer every request with the ``llm`` role (or ``role``: another configured chat model) and return (and
    write to ``out_path``, parquet) a table
    ``item_id, task, prompt_sha256, schema_sha256, answer, valid, error, cached, model`` in request order.

    ``cfg`` is a study view with ``models.llm`` and an optional ``llm:`` section; ``cache_path`` (default
    ``llm.cache``) is the JSONL answer cache. The model is loaded only when some answer is not cached.
    Invalid answers are rows with ``valid=False`` and the reason in ``error``: an answer that is empty, not JSON or
    off-schema, and a schema-valid one that fails its task's meaning check (:func:`check_meaning`)."""
    settings = settings_of(cfg.get("llm") or {})
    cache = AnswerCache(cache_path if cache_path is not None else settings["cache"])
    prepared = prepare(requests)
    multimodal = any(p.image_specs() for p in prepared) and is_multimodal(cfg, role)
    for p in prepared:
        p.schema_sha256 = schema_sha256(p.schema)
        msg = {"system": p.system, "user": p.user}
        if multimodal and p.images is not None:   # every image, in order: its file, what is drawn, its size
            msg["images"] = [{"sha256": _file_sha256(s["path"]), "boxes": s["boxes"]} for s in p.images]
            msg["image_max_side"] = settings["image_max_side"]
        elif multimodal and p.image_path:   # one image: the key of earlier versions (their caches stay valid)
            msg["image_sha256"] = _file_sha256(p.image_path)
            msg["boxes"] = p.boxes
        p.prompt_sha256 = sha256_text(canonical(msg))
    decoding = decoding_sha256(settings)
    model = model_identity(cfg, role)
    if model is None:  # a hub id that is not in the local cache: identify it by loading it
        runner = runner or Runner(cfg, settings, role)
        model = _loaded_identity(role)

    keys = [AnswerCache.key(model, p.prompt_sha256, p.schema_sha256, decoding) for p in prepared]
    todo: dict[tuple, Prepared] = {}
    for key, p in zip(keys, prepared):
        if cache.get(key) is None and key not in todo:
            todo[key] = p
    fresh: set[tuple] = set()
    if todo:
        runner = runner or Runner(cfg, settings, role)
        order = sorted(todo, key=lambda k: (len(todo[k].system) + len(todo[k].user), k[1], k[2]))
        size = settings["batch_size"]
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            answers = runner.generate([todo[k] for k in chunk])
            for key, answer in zip(chunk, answers):
                cache.put(key, answer, task=todo[key].task)
                fresh.add(key)
            log.info("%s: %d/%d answers generated", role, min(start + size, len(order)), len(order))

    rows = []
    for key, p in zip(keys, prepared):
        answer = cache.get(key)["answer"]
        value, error = check_answer(answer, p.schema)
        if error is None:
            error = check_meaning(p.task, p.fields, value)
        rows.append({"item_id": p.item_id, "task": p.task, "prompt_sha256": p.prompt_sha256,
                     "schema_sha256": p.schema_sha256, "answer": answer, "valid": error is None, "error": error,
                     "cached": key not in fresh, "model": model})
    frame = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    if out_path is not None:
        write_parquet(out_path, frame)
    return frame


def read_requests(path: str | os.PathLike) -> pd.DataFrame:
    """An llm request table (parquet or JSONL) with at least ``item_id`` and ``task``."""
    path = Path(path)
    if not path.exists():
        raise missing_input(path, "llm request table", "write it first (e.g. counterfactory countercurate "
                            "attributes --out-llm-requests)")
    if path.suffix in (".jsonl", ".json"):
        frame = pd.read_json(path, lines=path.suffix == ".jsonl", dtype=False)
    else:
        frame = pd.read_parquet(path)
    missing = {"item_id", "task"} - set(frame.columns)
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(sorted(missing))}. Fix: give every request an "
                         "item_id and a task")
    return frame
