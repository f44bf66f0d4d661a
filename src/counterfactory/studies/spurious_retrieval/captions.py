"""Captions of the study (§3.2, §3.3, Table 3).

* :func:`gallery`: every caption of train + val + test (§3.2: the ODmAP@k gallery is formed "not only from the test
  dataset but also from the training and validation datasets") with the classes it mentions — COCO through
  noun-phrase chunking and the matching table of appendix Table 4 (:mod:`counterfactory.text.noun_phrases`),
  Flickr30k through the annotated phrase types of Flickr30k Entities.
* :func:`synthetic`: the captions of the synthetic images: ``np_removal`` (§3.3, the default: every original
  caption of the image without the noun phrases of the removed classes; a caption that names none of them is kept
  unchanged when ``captions.keep_unmatched``, since it still describes x', and one that loses every word is
  dropped) and ``prompt`` (a prompt template naming the classes left in the image, one of CLIP's 80 ImageNet
  templates drawn per item with a seed from its id). The captioning-model alternative is :func:`captioner`.
* :func:`write_captions`: both from files (``counterfactory spurious captions``).

MS-COCO class matching (:func:`matcher`, ``captions.word_matching``): appendix A counts a noun phrase for a class
when it contains one of the class's words (``any_word``, the paper config), so "a wine glass" also matches *cup*
(its word "glass") and "a hot dog" also matches *dog*. ``longest_match`` (ours) lets a longer entry shadow the
shorter ones it covers, so those phrases match only *wine glass* and *hot dog*.
"""

from __future__ import annotations

import logging
import random
import zlib

import pandas as pd

from ...data.nltk_data import ensure_nltk_data
from ...errors import ConfigError
from ...io import write_parquet
from ...text import noun_phrases as npx

log = logging.getLogger(__name__)

GALLERY_COLUMNS = ["image_id", "split", "caption_index", "caption", "image_path", "mentions"]
SYNTHETIC_COLUMNS = ["item_id", "image_id", "split", "method", "caption_index", "caption", "matched"]
#: how a prompt names a Flickr30k Entities type (the types are plural category names)
FLICKR_PROMPT_NOUNS = {"people": "person", "animals": "animal", "vehicles": "vehicle", "instruments": "instrument",
                       "clothing": "clothing", "bodyparts": "body part", "scene": "scene", "other": "object"}


def item_seed(item_id: str, salt: int = 0) -> int:
    """A seed from an item id (crc32), so a draw does not depend on the order or the batch of items."""
    return zlib.crc32(f"{salt}:{item_id}".encode())


def templates(name_or_list) -> list[str]:
    """Prompt templates with ``{objects}``: ``openai_imagenet`` = CLIP's 80 ImageNet templates (open_clip's copy)."""
    if name_or_list == "openai_imagenet":
        from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

        return [t("{objects}") for t in OPENAI_IMAGENET_TEMPLATES]
    if isinstance(name_or_list, str) or not name_or_list:
        raise ConfigError(f"spurious_retrieval.captions.prompt_templates: {name_or_list!r}. Fix: openai_imagenet or "
                          "a list of templates with {objects}")
    return list(name_or_list)


def matcher(s: dict):
    """The MS-COCO class matcher of appendix A's table under ``captions.word_matching``."""
    rule = s["captions"]["word_matching"]
    return npx.ClassMatcher(npx.load_matching_table(), longest_match=rule == "longest_match")


def _flickr(dataset: str) -> bool:
    return dataset == "flickr30k"


def gallery(s: dict, dataset: str, captions: pd.DataFrame, classes: list[str], tagger=None) -> pd.DataFrame:
    """:data:`GALLERY_COLUMNS`: ``mentions`` is the sorted list of ``classes`` a caption mentions."""
    if _flickr(dataset):
        phrases = _phrases(s, captions)
        found = [sorted(npx.flickr_mentions(phrases.get((i, k), []), classes))
                 for i, k in zip(captions["image_id"], captions["caption_index"])]
    else:
        matrix = npx.mention_matrix(captions["caption"].tolist(), classes, matcher(s), tagger)
        found = [[classes[j] for j in row.nonzero()[0]] for row in matrix]
    out = captions[["image_id", "split", "caption_index", "caption", "image_path"]].copy()
    out["mentions"] = found
    return out[GALLERY_COLUMNS].reset_index(drop=True)


def _phrases(s: dict, captions: pd.DataFrame) -> dict:
    from .data import flickr_phrases

    return flickr_phrases(s["data"]["flickr30k"]["entities_root"], captions["image_id"].unique())


def synthetic(s: dict, dataset: str, requests: pd.DataFrame, captions: pd.DataFrame, methods, classes: list[str],
              tagger=None) -> pd.DataFrame:
    """:data:`SYNTHETIC_COLUMNS` for every request and every text method in ``methods`` (``np_removal``,
    ``prompt``; ``captioner`` rows come from :func:`captioner`)."""
    cs = s["captions"]
    by_image = {k: g for k, g in captions.groupby("image_id", sort=False)}
    rows = []
    if "np_removal" in methods:
        if _flickr(dataset):
            phrases = _phrases(s, captions[captions["image_id"].isin(set(requests["image_id"]))])
        else:
            table = matcher(s)
        for r in requests.itertuples(index=False):
            for c in by_image[r.image_id].itertuples(index=False):
                removed = list(r.removed_categories)
                if _flickr(dataset):
                    new = npx.flickr_remove_phrases(c.caption, phrases.get((r.image_id, c.caption_index), []),
                                                    removed)
                else:
                    new = npx.remove_phrases(c.caption, removed, table, tagger)
                matched = new is not None
                if not matched:
                    if not cs["keep_unmatched"]:
                        continue
                    new = c.caption
                if not new.strip():
                    continue
                rows.append((r.item_id, r.image_id, r.split, "np_removal", int(c.caption_index), new, matched))
    if "prompt" in methods:
        pool = templates(cs["prompt_templates"])
        for r in requests.itertuples(index=False):
            present = list(r.present_categories)
            if _flickr(dataset):
                present = [FLICKR_PROMPT_NOUNS.get(c, c) for c in present]
            if not present:
                continue
            rng = random.Random(item_seed(r.item_id))
            text = npx.prompt_caption(present, pool, article=bool(cs["prompt_article"]), rng=rng)
            rows.append((r.item_id, r.image_id, r.split, "prompt", 0, text[:1].upper() + text[1:], True))
    out = pd.DataFrame(rows, columns=SYNTHETIC_COLUMNS)
    if "np_removal" in methods and len(out):
        n = out[out["method"] == "np_removal"]
        log.info("np_removal: %d captions for %d items (%d with a removed phrase)", len(n), n["item_id"].nunique(),
                 int(n["matched"].sum()))
    return out


def captioner(cfg, s: dict, requests: pd.DataFrame, images: dict[str, str], progress: bool = True) -> pd.DataFrame:
    """Table 3 "capt. model": the ``captioner`` role's caption of every inpainted image (``images``: item id ->
    file), as :data:`SYNTHETIC_COLUMNS` rows (method ``captioner``); empty captions are dropped."""
    from ...generation.captioning import caption_images

    cc = s["captions"]["captioner"]
    todo = requests[requests["item_id"].isin(images)]
    texts = caption_images(cfg, [images[i] for i in todo["item_id"]], batch_size=int(cc["batch_size"]),
                           max_new_tokens=int(cc["max_new_tokens"]), num_beams=int(cc["num_beams"]),
                           progress=progress)
    rows = [(r.item_id, r.image_id, r.split, "captioner", 0, t.strip(), True)
            for r, t in zip(todo.itertuples(index=False), texts) if t and t.strip()]
    if len(rows) < len(todo):
        log.warning("captioner: %d of %d images got an empty caption (dropped)", len(todo) - len(rows), len(todo))
    return pd.DataFrame(rows, columns=SYNTHETIC_COLUMNS)


def _nltk(cfg) -> None:
    """NLTK's data from the configuration's ``nltk`` section (the COCO noun-phrase chunker tags with it)."""
    from ...settings import config_value

    section = cfg.get("nltk") or {}
    ensure_nltk_data(config_value(section, "nltk.data_dir"), section.get("source"))


def request_classes(requests: pd.DataFrame) -> list[str]:
    """Every class the removal requests remove or leave in an image, sorted."""
    return sorted({c for col in ("removed_categories", "present_categories") for v in requests[col] for c in v})


def write_captions(cfg, dataset: str, requests_path, out_gallery, out_synthetic) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``counterfactory spurious captions``: the ODmAP gallery (:func:`gallery`) of ``dataset``'s captions and the
    ``np_removal`` and ``prompt`` captions (:func:`synthetic`) of the removal requests in ``requests_path``,
    written to ``out_gallery`` and ``out_synthetic``. Returns ``(gallery, synthetic)``."""
    from . import data, settings

    s = settings.settings(cfg)
    requests = data.read_requests(requests_path)
    if dataset == "coco":
        _nltk(cfg)
    table = data.load_captions(s, dataset)
    classes = request_classes(requests)
    rows = gallery(s, dataset, table, classes)
    syn = synthetic(s, dataset, requests, table, ("np_removal", "prompt"), classes)
    write_parquet(out_gallery, rows)
    write_parquet(out_synthetic, syn)
    return rows, syn
