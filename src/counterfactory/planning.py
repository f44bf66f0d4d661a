"""Paper-scale plan: what each enabled study's image stages will cost before a run is submitted.

One row per (study, stage): items, UNet evaluations, images written, disk, GPU-hours and jobs.

Definitions
-----------
* **UNet evaluation**: one latent row through the UNet at one denoising step; a UNet call on a batch of B rows
  counts B (what the stages count, ``P2PEngine.unet_evals``). Classifier-free guidance therefore doubles it
  (conditional + unconditional row), InstructPix2Pix's text + image guidance triples it.
* **Per item** (upper bounds: adaptive stopping and early-stopped null-text optimisation only lower them):

  - COCO-Counterfactuals image stage (§3.2, B.1.2), item = caption pair: ``2 CFG x 2 prompts x
    candidates_per_pair x steps`` (paper: 2 x 2 x 100 x 100 = 40,000).
  - SocialCounterfactuals sets (§3.3), item = caption set of G captions: ``2 x G x candidates_per_set x steps``.
  - CounterCurate grounded generation (§3.2-3.4), item = request: ``steps x (2 if guidance > 1 else 1)``.
  - Spurious-correlation retrieval (§3.1): LaMa inpainting and the captioner use no UNet; their work is images
    (GPU-hours = images / images_per_s).
  - CVLD editing (§3.3, §5.1), item = example: ``ip2p``: ``3 x m x steps``; ``null_text``: ``inversion_steps x
    (1 + (2 + inner_steps) + 4 m)`` (DDIM inversion, null-text optimisation with its bound of ``inner_steps``
    iterations, then Prompt-to-Prompt on source + target rows of the m candidates with CFG).
* **Items** come, in this order, from ``items`` overrides (``"study.stage": n``), from the stage's input table
  when an earlier run wrote it under ``results/<run_name>/<study>/``, from the configuration when it determines
  them (SocialCounterfactuals' caption sets), else from the paper's counts (each cited in ``items_source``),
  capped by what the configured data can give at most when its file is in place (a caption pair per caption; a
  spurious or CVLD image per Karpathy training image), so a small or own dataset is not planned at the paper's
  size; where none exists the row stays blank.
* **Disk**: PNG bytes per image = ``height x width x`` :data:`BYTES_PER_PIXEL` (a documented estimate: photographic
  Stable Diffusion PNGs at 512x512 are about 0.3-0.5 MB, i.e. about 1.45 bytes per pixel; noise compresses worse,
  flat images better). Only images the stage keeps are counted (candidates are not written unless configured).
* **GPU-hours** = UNet evaluations / (UNet evaluations per second of that stage) / 3600, or images / images per
  second for stages without a UNet. Rates come from a throughput JSON (``benchmarks/bench_true_size.py --json``);
  the packaged default (:data:`DEFAULT_THROUGHPUT`) holds the H100 measurements, plus rows with an ``estimate``
  key for stages not measured there (derived from measured rows as the key says; shown with "≈" and counted
  apart in the total). A measured row of a stage always wins over an estimated one.
* **Jobs** per stage: the Snakemake jobs of its shards, from the config's shard settings.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from .errors import ConfigError, input_error

#: packaged throughput file: bench_true_size.py's H100 measurements plus estimated rows (module docstring)
DEFAULT_THROUGHPUT = Path(__file__).resolve().parent / "resources" / "throughput" / "h100.json"
#: estimated PNG bytes per pixel of a photographic RGB image (module docstring)
BYTES_PER_PIXEL = {"png": 1.45}
#: paper counts used when no input table exists (each with its source)
PAPER_ITEMS = {
    ("coco_counterfactuals", "p2p_pairs"): (24508, "COCO-CF §3.3: 24,508 caption pairs from 25,014 captions"),
    ("spurious_retrieval", "coco"): (45467, "Kim et al. §4.1: 45,467 synthetic MS-COCO training images"),
    ("spurious_retrieval", "flickr30k"): (4650, "Kim et al. §4.1: 4,650 synthetic Flickr30k training images"),
}
#: COCO val2017 captions (COCO-CF §3.3), the input of the COCO-CF image jobs' sharding
COCO_VAL2017_CAPTIONS = 25014
#: CelebA training images (official split) and Karpathy COCO training images (train + restval)
CELEBA_TRAIN, KARPATHY_COCO_TRAIN = 162770, 113287
#: Flickr30k (Entities) images and captions per image (Young et al. 2014; Plummer et al. 2016)
FLICKR30K_IMAGES, FLICKR30K_CAPTIONS_PER_IMAGE = 31783, 5

COLUMNS = ["study", "stage", "items", "items_source", "unet_evals_per_item", "unet_evals", "images", "resolution",
           "disk_bytes", "throughput_stage", "rate", "rate_unit", "gpu_hours", "jobs", "throughput_row",
           "rate_estimate"]


@dataclass
class Stage:
    """One image stage of one study, before throughput is applied."""

    study: str
    stage: str
    items: int | None
    items_source: str
    unet_per_item: int | None        # None: the stage has no UNet (work = images)
    images_per_item: float
    height: int
    width: int
    throughput_stage: str
    jobs: int | None
    item_key: str = ""               # the --items key (default study.stage; spurious_retrieval: per dataset)

    def key(self) -> str:
        return self.item_key or f"{self.study}.{self.stage}"


# --------------------------------------------------------------------------- item counts


def _rows(path: Path) -> int | None:
    return len(pd.read_parquet(path)) if path.exists() else None


def _items(key: tuple[str, str], overrides: Mapping[str, int], table: Path | None = None, count=None,
           fallback: tuple[int | None, str] | None = None) -> tuple[int | None, str]:
    """(items, where the number comes from): override, then the input table, then ``fallback``."""
    name = ".".join(key)
    if name in overrides:
        return int(overrides[name]), "--items"
    if table is not None and table.exists():
        return (count(table) if count else _rows(table)), str(table)
    return fallback or PAPER_ITEMS.get(key, (None, "unknown: run the step that writes the input table, or --items"))


def _karpathy_images(path, splits=("train", "restval")) -> int | None:
    """Images of ``splits`` (default: the training images, train + restval, §4.1 of Kim et al.; CVLD app. B) in a
    configured Karpathy file; None when the file is not in place or not readable (the paper count is used then).
    The file is read once per version (:func:`counterfactory.data.karpathy.summary`)."""
    from .data.karpathy import summary

    info = summary(path) if path else None
    return None if info is None else sum(info["counts"].get(name, 0) for name in set(splits))


def _capped(paper: tuple[int, str], most: int | None, what: str) -> tuple[int, str]:
    """The paper's count, or what the configured data can give at most (``what``) when that is fewer."""
    if most is None or most >= paper[0]:
        return paper
    return most, f"upper bound: {most:,} {what} (paper: {paper[1]})"


# --------------------------------------------------------------------------- the studies


def _coco(view, res: Path, items: Mapping[str, int]) -> list[Stage]:
    from . import workflow

    img = view["images"]
    path = workflow.caption_json(view)
    configured = workflow._count(str(path), view["data"].get("limit_images")) if path.exists() else None
    n, src = _items(("coco_counterfactuals", "p2p_pairs"), items,
                    res / "captions" / "counterfactual_captions.parquet",
                    fallback=_capped(PAPER_ITEMS[("coco_counterfactuals", "p2p_pairs")], configured,
                                     f"caption pairs, one per caption of {path}"))
    per = 2 * 2 * int(img["candidates_per_pair"]) * int(img["steps"])
    kept = 2 * int(img["filter"]["top_k"]) + (2 * int(img["candidates_per_pair"]) if img.get("save_all_candidates") else 0)
    captions = COCO_VAL2017_CAPTIONS if configured is None else configured
    jobs = max(1, math.ceil(captions / int(img["shard_size"])))   # image jobs shard the input captions
    return [Stage("coco_counterfactuals", "p2p_pairs", n, src, per, kept, int(img["height"]), int(img["width"]),
                  "p2p_pairs", jobs)]


def _social(view, res: Path, items: Mapping[str, int]) -> list[Stage]:
    from .generation.sampler import GenerationSettings
    from .generation.sets import SetGenerationSettings
    from .studies.social_counterfactuals.captions import build_caption_sets

    img = view.get("images") or {}
    gen, sets = GenerationSettings.from_config(img), SetGenerationSettings.from_config(img)
    table = build_caption_sets(view.get("captions"))
    n_sets, n_captions = table["set_id"].nunique(), len(table)
    if "social_counterfactuals.p2p_sets" in items:
        n_sets = int(items["social_counterfactuals.p2p_sets"])
        n_captions = round(n_captions / max(table["set_id"].nunique(), 1) * n_sets)
        src = "--items (captions per set as configured)"
    else:
        src = f"config: {n_sets:,} sets, {n_captions:,} captions (§3.2)"
    members = n_captions / n_sets if n_sets else 0
    per = 2 * members * sets.candidates_per_set * gen.steps
    return [Stage("social_counterfactuals", "p2p_sets", n_sets, src, round(per) if per == int(per) else per,
                  members * sets.candidates_per_set, gen.height, gen.width, "p2p_sets",
                  math.ceil(n_sets / sets.set_shard_size) if n_sets else None)]


def _attributes_upper_bound(view) -> tuple[int, str]:
    """CounterCurate's t2i images before the LLM has answered: every negative kind accepted for the selected caption
    of every Flickr30k Entities image (an upper bound: the paper got only about 2.5k swaps, §4.4)."""
    from .studies.countercurate.attributes import section_of

    at = section_of(view)
    n_images = min(int(at["limit_images"] or FLICKR30K_IMAGES), FLICKR30K_IMAGES)
    per_image = len(at["kinds"]) * (FLICKR30K_CAPTIONS_PER_IMAGE if at["caption"] == "all" else 1)
    return n_images * per_image, (f"upper bound: {len(at['kinds'])} negative kinds x {at['caption']} caption(s) of "
                                  f"{n_images:,} Flickr30k Entities images, all accepted (§3.4; the paper's swaps "
                                  "were about 2.5k, §4.4); --items countercurate.t2i=N")


def _countercurate(view, res: Path, items: Mapping[str, int]) -> list[Stage]:
    from .generation.grounded import GroundedSettings

    s = GroundedSettings.from_config(view.get("grounded"))
    table = res / "generation" / "requests.parquet"
    kinds = pd.read_parquet(table, columns=["kind"])["kind"].value_counts() if table.exists() else None
    out = []
    for kind, stage in (("generate", "gligen_generate"), ("inpaint", "gligen_inpaint"), ("t2i", "t2i")):
        name = f"countercurate.{stage}"
        if name in items:
            n, src = int(items[name]), "--items"
        elif kinds is not None:
            n, src = int(kinds.get(kind, 0)), str(table)
        elif kind == "t2i":     # Flickr30k-Attributes: one image per accepted negative caption (§3.4)
            n, src = _attributes_upper_bound(view)
        else:
            n, src = None, ("unknown before countercurate_requests (Flickr30k Entities); --items countercurate.%s=N"
                            % stage)
        h, w = (s.t2i_height, s.t2i_width) if kind == "t2i" else (s.height, s.width)
        out.append(Stage("countercurate", stage, n, src, s.steps * (2 if s.guidance > 1.0 else 1), 1, h, w, stage,
                         math.ceil(n / s.shard_size) if n else None))
    return out


#: typical source sizes of inpainted images (the images keep their size): COCO 640x480, Flickr30k 500x375
_SOURCE_SIZE = {"coco": (480, 640), "flickr30k": (375, 500)}


def _spurious(view, res: Path, items: Mapping[str, int]) -> list[Stage]:
    from .studies.spurious_retrieval import settings as sr

    s = sr.settings(view)
    out = []
    for ds in s["data"]["datasets"]:
        karpathy = (s["data"].get(ds) or {}).get("karpathy_json")
        train = s["data"]["splits"]["train"]
        most = _karpathy_images(karpathy, tuple([train] if isinstance(train, str) else train))
        n, src = _items(("spurious_retrieval", ds), items, res / ds / "selection" / "requests.parquet",
                        fallback=_capped(PAPER_ITEMS[("spurious_retrieval", ds)], most,
                                         f"training images in {karpathy}"))
        h, w = _SOURCE_SIZE.get(ds, (512, 512))
        methods = sr.image_methods(s, ds)
        shards = int(s["inpaint"]["shards"])
        if "lama" in methods:
            out.append(Stage("spurious_retrieval", f"lama_{ds}", n, src, None, 1, h, w, "lama_inpaint", shards,
                             f"spurious_retrieval.{ds}"))
        pads = [m for m in methods if m != "lama"]
        if pads:   # paddings run on the CPU: images and disk, no GPU time
            out.append(Stage("spurious_retrieval", f"padding_{ds}", n, src + f"; {len(pads)} paddings (CPU)", None,
                             len(pads), h, w, "", shards * len(pads), f"spurious_retrieval.{ds}"))
        if "captioner" in sr.text_methods(s, ds):
            out.append(Stage("spurious_retrieval", f"captioner_{ds}", n, src, None, 0, h, w, "captioner", 1,
                             f"spurious_retrieval.{ds}"))
    return out


def _cvld(view, res: Path, items: Mapping[str, int]) -> list[Stage]:
    from .generation.editing import EditSettings
    from .studies.cvld import settings as cv

    s = cv.settings(view)
    ed = s["editing"]
    knobs = EditSettings.from_config({**ed["settings"], "m": ed["m"], "k": ed["k"]})
    subset = max(s["data"]["subsets"])
    cl = s["classification"]
    shots = set(cl["shots"]) | ({cl["figure4_shots"]} if cl["lambdas"] else set())
    episodes = len(cl["attributes"]) * 2 * sum(shots) * int(cl["episodes"])
    coco_json = (s["data"].get("coco") or {}).get("karpathy_json")
    coco_train = _karpathy_images(coco_json)
    fallback = {"coco": (round(subset * (KARPATHY_COCO_TRAIN if coco_train is None else coco_train)),
                         f"upper bound: every image of the {subset:.0%} COCO subset accepted (§3.3, app. B)"
                         + ("" if coco_train is None else f"; {coco_train:,} training images in {coco_json}")),
                "celeba": (min(episodes, CELEBA_TRAIN),
                           "upper bound: attributes x 2K shots x episodes, no image shared (app. A)")}
    per = {"ip2p": 3 * knobs.m * knobs.steps,
           "null_text": knobs.inversion_steps * (1 + 2 + knobs.inner_steps + 4 * knobs.m)}
    out = []
    for ds in ("coco", "celeba"):
        for method in ed["methods"]:
            n, src = _items(("cvld", f"{method}_{ds}"), items, res / ds / "edits" / "requests.parquet",
                            fallback=fallback[ds])
            out.append(Stage("cvld", f"{method}_{ds}", n, src, per[method], knobs.k, knobs.size, knobs.size,
                             f"{method}_edit", int(ed["shards"])))
    return out


STUDIES = {"coco_counterfactuals": _coco, "social_counterfactuals": _social, "countercurate": _countercurate,
           "spurious_retrieval": _spurious, "cvld": _cvld}


# --------------------------------------------------------------------------- throughput


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def load_throughput(path: str | Path | None = None) -> dict:
    """``{"path", "device", "placeholder", "rows"}`` from a throughput JSON: a list of rows or ``{"rows": [...]}``
    (each row ``{stage, device, precision, batch_size, images_per_s, unet_evals_per_s, ...}``)."""
    path = Path(path) if path else DEFAULT_THROUGHPUT
    if not path.exists():
        raise input_error(path, None, "throughput file not found",
                          "pass --throughput FILE written by benchmarks/bench_true_size.py --json")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise input_error(path, None, f"not valid JSON ({exc})", "rewrite it with bench_true_size.py --json") from exc
    rows = doc.get("rows") if isinstance(doc, dict) else doc
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "stage" in r for r in rows):
        raise input_error(path, None, "expected a list of rows with a 'stage' key (or {'rows': [...]})",
                          "write it with benchmarks/bench_true_size.py --json")
    devices = sorted({str(r.get("device")) for r in rows if r.get("device")})
    device = doc.get("device") if isinstance(doc, dict) and doc.get("device") else ", ".join(devices) or "unknown"
    placeholder = bool(doc.get("placeholder")) if isinstance(doc, dict) else False
    return {"path": str(path), "device": device, "placeholder": placeholder, "rows": rows}


def pick_rate(rows: list[dict], stage: str, unit: str, precision: str | None = None,
              compiled: bool = False) -> tuple[float | None, dict | None]:
    """The rate (``unit``: ``unet_evals_per_s`` or ``images_per_s``) of ``stage`` (names compared without case and
    punctuation): rows of the fast path the config runs (``compile: true`` rows only when ``compiled``, which
    falls back to the eager rows of a stage without any), measured rows before estimated ones (a row with an
    ``estimate`` key says how it was derived, not measured), rows of the batched mode when any (a row whose
    ``mode`` names a loop is the one-item baseline), of ``precision`` when any, then the fastest."""
    mine = [r for r in rows if _norm(r["stage"]) == _norm(stage) and r.get(unit)]
    eager = [r for r in mine if not r.get("compile")]
    mine = ([r for r in mine if r.get("compile")] or eager) if compiled else (eager or mine)
    mine = [r for r in mine if not r.get("estimate")] or mine
    batched = [r for r in mine if not re.search(r"loop|single|one", str(r.get("mode", "")), re.I)]
    mine = batched or mine
    same = [r for r in mine if precision and str(r.get("precision")) == precision]
    mine = same or mine
    if not mine:
        return None, None
    best = max(mine, key=lambda r: float(r[unit]))
    return float(best[unit]), best


# --------------------------------------------------------------------------- the plan


def plan(cfg: Mapping[str, Any], throughput: dict | str | Path | None = None, items: Mapping[str, int] | None = None,
         results_root: str | Path = ".") -> pd.DataFrame:
    """The plan of every enabled study of the full, validated configuration ``cfg`` (module docstring).

    ``throughput``: a :func:`load_throughput` result or a path (default: the packaged file); ``items``: counts by
    ``"study.stage"``; ``results_root``: the folder holding ``results/`` (input tables of earlier runs)."""
    from .config import study_view

    tp = throughput if isinstance(throughput, dict) else load_throughput(throughput)
    items = dict(items or {})
    known = {st.key() for st in _stages(cfg, Path("/nonexistent"), {}, study_view)}
    unknown = sorted(set(items) - known)
    if unknown:
        raise ConfigError(f"--items {', '.join(unknown)}: no such stage. Fix: use one of {', '.join(sorted(known))}")
    compiled = bool((cfg.get("performance") or {}).get("compile"))
    rows = []
    for st in _stages(cfg, Path(results_root) / "results" / str(cfg.get("run_name", "paper")), items, study_view):
        unit = "unet_evals_per_s" if st.unet_per_item is not None else "images_per_s"
        rate, row = pick_rate(tp["rows"], st.throughput_stage, unit, cfg.get("precision"), compiled) \
            if st.throughput_stage else (None, None)
        n = st.items
        evals = None if n is None or st.unet_per_item is None else round(n * st.unet_per_item)
        images = None if n is None else round(n * st.images_per_item)
        work = evals if st.unet_per_item is not None else (n if st.throughput_stage == "captioner" else images)
        rows.append({
            "study": st.study, "stage": st.stage, "items": n, "items_source": st.items_source,
            "unet_evals_per_item": st.unet_per_item, "unet_evals": evals, "images": images,
            "resolution": f"{st.width}x{st.height}",
            "disk_bytes": None if images is None else disk_bytes(images, st.height, st.width),
            "throughput_stage": st.throughput_stage or "(cpu)", "rate": rate,
            "rate_unit": unit if st.throughput_stage else "",
            "gpu_hours": gpu_hours(work, rate) if st.throughput_stage else 0.0,
            "jobs": st.jobs,
            "throughput_row": "" if row is None else
            f"{row.get('device', '?')} {row.get('precision', '?')} batch {row.get('batch_size', '?')}"
            + (" compiled" if row.get("compile") else ""),
            "rate_estimate": "" if row is None else str(row.get("estimate") or ""),
        })
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("items", "unet_evals", "images", "disk_bytes", "jobs"):
        frame[col] = frame[col].astype("Int64")
    return frame


def _stages(cfg, results: Path, items, study_view) -> list[Stage]:
    out = []
    for study in cfg.get("studies") or []:
        view = study_view(cfg, study)
        out += STUDIES[study](view, results / study, items)
    return out


def disk_bytes(images: int, height: int, width: int, fmt: str = "png") -> int:
    """Estimated bytes of ``images`` images of ``height x width`` in ``fmt`` (:data:`BYTES_PER_PIXEL`)."""
    return round(images * height * width * BYTES_PER_PIXEL[fmt])


def gpu_hours(work: float | None, rate: float | None) -> float | None:
    """``work`` (UNet evaluations or images) at ``rate`` per second, in hours; None when either is unknown."""
    if work is None or not rate:
        return None
    return work / rate / 3600.0


# --------------------------------------------------------------------------- dry-run job counts


#: each study's short name -> the study. A study's own rules are ``<short>_<step>`` (``counterfactory <short> <step>``),
#: a shared stage's rule run for one study is ``<group>_<step>_<short>[_...]``: a rule belongs to the study whose short
#: name is one of its ``_``-separated words (the rest of the per-study rules are COCO-Counterfactuals')
STUDY_SHORT_NAMES = {"social": "social_counterfactuals", "countercurate": "countercurate",
                     "spurious": "spurious_retrieval", "cvld": "cvld"}
#: a study's rules that run a shared group's step without a study suffix (no other rule runs that step)
STUDY_RULES = {"data_flickr30k_captions": "countercurate"}
SHARED_RULES = {"all", "config_write_job", "models_build_tiny", "nltk_prepare", "provenance", "report_overview"}


def rule_study(rule: str) -> str:
    """The study a rule's jobs count for (:data:`STUDY_SHORT_NAMES`, :data:`STUDY_RULES`); ``shared`` for
    :data:`SHARED_RULES`."""
    if rule in SHARED_RULES:
        return "shared"
    if rule in STUDY_RULES:
        return STUDY_RULES[rule]
    words = rule.split("_")
    return next((study for short, study in STUDY_SHORT_NAMES.items() if short in words), "coco_counterfactuals")


def job_counts(output: str) -> dict[str, int]:
    """Jobs per rule from Snakemake's "Job stats" table (``rule count`` lines; ``total`` included)."""
    counts: dict[str, int] = {}
    in_table = False
    for line in output.splitlines():
        if line.strip().startswith("Job stats"):
            in_table = True
            continue
        m = re.match(r"^\s*([A-Za-z_]\w*)\s+(\d+)\s*$", line)
        if in_table and m:
            counts[m.group(1)] = int(m.group(2))
        elif in_table and counts and not line.strip():
            break
    return counts


def jobs_by_study(counts: Mapping[str, int]) -> dict[str, int]:
    """Rule counts summed per study (:func:`rule_study`); shared rules under ``shared``."""
    out: dict[str, int] = {}
    for rule, n in counts.items():
        if rule == "total":
            continue
        study = rule_study(rule)
        out[study] = out.get(study, 0) + n
    return out


# --------------------------------------------------------------------------- Markdown


def _fmt(value, kind: str = "int") -> str:
    if value is None or pd.isna(value):
        return "—"
    if kind == "bytes":
        for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
            if value >= size:
                return f"{value / size:,.1f} {unit}"
        return f"{value / 1e3:,.1f} kB"
    if kind == "hours":
        return f"{value:,.1f}" if value >= 1 or value == 0 else f"{value:,.2f}"
    if kind == "rate":
        return f"{value:,.1f}"
    return f"{int(round(value)):,}"


def to_markdown(frame: pd.DataFrame, throughput: dict, study_jobs: Mapping[str, int] | None = None) -> str:
    """A Markdown table per study, then the totals; names the throughput file and device."""
    note = " (PLACEHOLDER values, not measurements)" if throughput.get("placeholder") else ""
    lines = [f"Throughput: {throughput['path']} — device {throughput['device']}{note}", ""]
    head = "| stage | items | UNet evals / item | UNet evals | images | disk | rate | GPU-hours | jobs |"
    for study, part in frame.groupby("study", sort=False):
        jobs = (study_jobs or {}).get(study)
        lines += [f"### {study}" + (f" — {jobs:,} Snakemake jobs (dry run)" if jobs is not None else ""), "",
                  head, "|" + "---|" * 9]
        for r in part.itertuples(index=False):
            est = "≈ " if r.rate_estimate else ""      # an estimated rate, not a measured one
            rate = "cpu" if r.throughput_stage == "(cpu)" else (
                f"{est}{_fmt(r.rate, 'rate')} {'evals' if r.rate_unit.startswith('unet') else 'img'}/s" if r.rate
                else "—")
            hours = _fmt(r.gpu_hours, 'hours')
            lines.append(f"| {r.stage} | {_fmt(r.items)} | {_fmt(r.unet_evals_per_item)} | {_fmt(r.unet_evals)} | "
                         f"{_fmt(r.images)} | {_fmt(r.disk_bytes, 'bytes')} | {rate} | "
                         f"{est if hours != '—' else ''}{hours} | {_fmt(r.jobs)} |")
        lines += ["", "items: " + "; ".join(f"{r.stage}: {r.items_source}" for r in part.itertuples(index=False))]
        lines += [f"≈ {r.stage}: estimated rate, {r.rate_estimate}"
                  for r in part.itertuples(index=False) if r.rate_estimate and r.rate]
        lines.append("")
    known = frame["gpu_hours"].dropna()
    blank = int(frame["gpu_hours"].isna().sum())
    estimated = frame.loc[frame["rate_estimate"].astype(bool), "gpu_hours"].dropna()
    lines.append(f"**Total**: {_fmt(frame['unet_evals'].sum())} UNet evaluations, {_fmt(frame['images'].sum())} "
                 f"images, {_fmt(frame['disk_bytes'].sum(), 'bytes')}, {_fmt(known.sum(), 'hours')} GPU-hours"
                 + (f" (of which {_fmt(estimated.sum(), 'hours')} at estimated rates)" if len(estimated) else "")
                 + (f" ({blank} stage(s) unknown, not counted)" if blank else "")
                 + (f", {sum(study_jobs.values()):,} Snakemake jobs (dry run)" if study_jobs else ""))
    return "\n".join(lines) + "\n"


def dry_run_jobs(configs, snakefile: str | Path = "Snakefile", directory: str | Path = ".",
                 timeout: int = 1800) -> dict[str, int]:
    """Jobs per rule of ``snakemake -n all`` with ``configs`` (Snakemake's "Job stats" table; ``total`` included)."""
    import os
    import shutil
    import subprocess
    import sys

    exe = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
    cmd = [exe, "-n", "all", "--snakefile", str(Path(snakefile).resolve()), "--directory", str(directory),
           "--cores", "1", "--quiet", "rules", "--configfile", *[str(Path(c).resolve()) for c in configs]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise ConfigError(f"snakemake -n failed (exit {proc.returncode}):\n{tail}\nFix: the dry run needs the data the "
                          "config names (or run without --dry-run)")
    return job_counts(proc.stdout + proc.stderr)
