"""The CVLD steps before training: interventions on COCO captions with the per-image vote (§3.3, appendix B), the
CelebA editing requests (§3.3 "Image-only intervention"), and one shard of image edits (§3.3, §5.1)."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from ...config import fill_section
from ...data import celeba
from ...data.nltk_data import ensure_nltk_data
from ...errors import input_error
from ...io import write_csv, write_parquet
from ...settings import config_value
from ...text import gender
from ...text.gender import swap_table
from . import data
from .intervention import rejected_rows, run_llm, vet_votes
from .settings import settings

log = logging.getLogger(__name__)


def _nltk(cfg) -> None:
    section = fill_section("nltk", cfg.get("nltk"))          # the schema's data_dir when the config sets none
    ensure_nltk_data(section["data_dir"], section.get("source"))


def intervene(cfg, out_captions, out_votes, out_requests, summary_out, llm_cache=None, out_rejected=None) -> dict:
    """Intervene every training caption of the largest COCO subset (``intervention.text_method``: ``rule`` or
    ``llm``), vote per image, and write the captions (train + test; test captions are not intervened), the votes,
    one editing request per accepted image, the rejected answers and votes with their reasons (``out_rejected``,
    default ``rejected.parquet`` beside the votes; :func:`.intervention.rejected_rows`) and the funnel; returns the
    funnel's counts, rejections counted by reason.

    A vote is accepted only for an image one of whose captions names a gendered person
    (:func:`.intervention.vet_votes`): an ``llm`` can agree with itself on "turn the woman into a man" for a photo
    of coins."""
    s = settings(cfg)
    caps = data.captions(s, "coco")
    train = caps[caps["split"] == "train"]
    train = train[data.subset_of(train["image_id"], max(s["data"]["subsets"]), s["data"]["subset_seed"])]
    source = f"{s['data']['coco']['karpathy_json']} (train captions)"
    if s["intervention"]["text_method"] == "llm" and s["intervention"]["llm_prompt"] == "per_direction":
        swapped = run_llm(cfg, train, source=source, cache_path=llm_cache)
    elif s["intervention"]["text_method"] == "llm":
        swapped = gender.run_llm(cfg, train, source=source, cache_path=llm_cache)
    else:
        _nltk(cfg)
        swapped = gender.swap_table(train, source=source)

    votes = vet_votes(gender.majority_vote(swapped, min_agree=s["intervention"]["min_agree"]), train)
    rejected = rejected_rows(swapped, votes)
    requests = data.coco_requests(s, swapped, votes)
    test = caps[caps["split"] == "test"].assign(intervened=lambda f: f["caption"], changed=False, edit_prompt="")
    keep = ["caption_id", "image_id", "split", "caption", "image_path", "intervened", "changed", "edit_prompt"]
    write_parquet(out_captions, pd.concat([swapped[keep], test[keep]], ignore_index=True))
    write_parquet(out_votes, votes)
    write_parquet(out_requests, requests)
    write_parquet(out_rejected or Path(out_votes).with_name("rejected.parquet"), rejected)
    counts = {"train captions": len(swapped), "changed": int(swapped["changed"].sum()),
              "train images": int(votes["image_id"].nunique()), "accepted images": int(votes["accepted"].sum())}
    counts["acceptance rate"] = round(counts["accepted images"] / max(counts["train images"], 1), 4)
    for (stage, reason), n in rejected.groupby(["stage", "reason"]).size().items():
        counts[f"rejected {'answers' if stage == 'caption' else 'images'}: {reason}"] = int(n)
    write_csv(summary_out, pd.DataFrame(list(counts.items()), columns=["count", "value"]))
    return counts


def episode_images(s: dict, train: pd.DataFrame) -> pd.DataFrame:
    """The CelebA training images some K-shot episode of some attribute uses (the only ones worth editing)."""
    from ...training.cvld import sample_episode

    cl = s["classification"]
    shots = set(cl["shots"]) | ({cl["figure4_shots"]} if cl["lambdas"] else set())
    ids = set()
    for a in cl["attributes"]:
        for k in sorted(shots):
            for e in range(int(cl["episodes"])):
                ids |= set(sample_episode(train, a, int(k), episode=e, id_col="image_id")["image_id"])
    return train[train["image_id"].isin(ids)]


def celeba_requests(cfg, out) -> int:
    s = settings(cfg)
    train = celeba.load_celeba(s["data"]["celeba"]["root"], "train")
    requests = data.celeba_requests(s, episode_images(s, train))
    write_parquet(out, requests)
    return len(requests)


def edit(cfg, requests_path, method: str, shard: int, out_dir, cache_dir=None, progress: bool = True) -> dict:
    """One shard of :func:`counterfactory.generation.editing.edit_shard` with the study's settings."""
    from ...generation.editing import EditSettings, edit_shard

    s = settings(cfg)
    ed = s["editing"]
    requests = pd.read_parquet(requests_path)
    part = requests[requests["shard"] == int(shard)]
    knobs = EditSettings.from_config({**ed["settings"], "m": ed["m"], "k": ed["k"]})
    cache = cache_dir or Path(out_dir).parent.parent / "inversions"
    return edit_shard(part, method, out_dir, cfg=cfg, settings=knobs, batch_size=int(ed["batch_size"]),
                      device=config_value(cfg, "device"), cache_dir=cache, progress=progress, source=str(requests_path))


def edit_merge(shard_manifests, out) -> int:
    """The edit shard manifests of one dataset and method in one ``edits.parquet`` (what the training runs read)."""
    from ...generation.editing import merge_manifests

    return merge_manifests(shard_manifests, out)


def read_captions(path) -> pd.DataFrame:
    """A caption table, CSV (every column as text, empty cells kept as "") or parquet (by the ``.parquet`` suffix);
    a missing or unreadable file is an :class:`~counterfactory.errors.InputError` naming it."""
    text = str(path)
    try:
        if text.endswith(".parquet"):
            return pd.read_parquet(path)
        return pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
    except FileNotFoundError:
        raise input_error(path, None, "no such file", "check the path") from None
    except (UnicodeDecodeError, ValueError, OSError) as exc:
        raise input_error(path, None, f"not a readable CSV/parquet table ({exc})",
                          "give a UTF-8 CSV with a header, or a parquet file") from None


def swap_gender(captions, out, caption_column: str = "caption", id_column: str = "caption_id") -> pd.DataFrame:
    """§3.2: the rule-based gender flip (:func:`counterfactory.text.gender.swap_table`) of every caption of the
    table ``captions`` (:func:`read_captions`), written to ``out`` (parquet) and returned."""
    frame = swap_table(read_captions(captions), caption_column, id_column, source=str(captions))
    write_parquet(out, frame)
    return frame
