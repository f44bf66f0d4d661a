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
import re
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from . import studies
from .config import load_full_config, study_view
from .errors import ConfigError, input_error

# the shared parts of a study's plan rows live below the studies (counterfactory.workflow), each study's own in its
# ``studies/<study>/spec.py``; re-exported here by their old names
from .studies.coco_counterfactuals.spec import COCO_VAL2017_CAPTIONS  # noqa: F401
from .studies.countercurate.spec import FLICKR30K_CAPTIONS_PER_IMAGE, FLICKR30K_IMAGES  # noqa: F401
from .studies.cvld.spec import CELEBA_TRAIN, KARPATHY_COCO_TRAIN  # noqa: F401
from .workflow import PAPER_ITEMS, Stage  # noqa: F401
from .workflow import capped as _capped  # noqa: F401
from .workflow import karpathy_images as _karpathy_images  # noqa: F401
from .workflow import plan_items as _items  # noqa: F401
from .workflow import table_rows as _rows  # noqa: F401

#: packaged throughput file: bench_true_size.py's H100 measurements plus estimated rows (module docstring)
DEFAULT_THROUGHPUT = Path(__file__).resolve().parent / "resources" / "throughput" / "h100.json"
#: estimated PNG bytes per pixel of a photographic RGB image (module docstring)
BYTES_PER_PIXEL = {"png": 1.45}
COLUMNS = ["study", "stage", "items", "items_source", "unet_evals_per_item", "unet_evals", "images", "resolution",
           "disk_bytes", "throughput_stage", "rate", "rate_unit", "gpu_hours", "jobs", "throughput_row",
           "rate_estimate"]


def __getattr__(name: str):
    if name == "STUDIES":          # study -> its plan function (derived from the study specs)
        return {s.name: s.plan for s in studies.specs()}
    if name == "STUDY_SHORT_NAMES":
        return _short_names()
    if name == "STUDY_RULES":
        return _study_rules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        spec = studies.spec(study)
        out += spec.plan(study_view(cfg, study), spec.results(results), items)
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


#: each study's short name -> the study (:data:`counterfactory.workflow.StudySpec.short`, derived from the specs;
#: ``planning.STUDY_SHORT_NAMES``). A study's own rules are ``<short>_<step>`` (``counterfactory <short> <step>``), a
#: shared stage's rule run for one study is ``<group>_<step>_<short>[_...]``: a rule belongs to the study whose short
#: name is one of its ``_``-separated words (the rest of the per-study rules are those of the study without a short
#: name, COCO-Counterfactuals')
def _short_names() -> dict[str, str]:
    return {s.short: s.name for s in studies.specs() if s.short}


#: a study's rules that run a shared group's step without a study suffix (no other rule runs that step;
#: ``StudySpec.own_rules``; ``planning.STUDY_RULES``)
def _study_rules() -> dict[str, str]:
    return {rule: s.name for s in studies.specs() for rule in s.own_rules}


def _default_study() -> str:
    return next((s.name for s in studies.specs() if not s.short), "shared")


SHARED_RULES = {"all", "config_write_job", "models_build_tiny", "nltk_prepare", "provenance", "report_overview"}


def rule_study(rule: str) -> str:
    """The study a rule's jobs count for (:data:`STUDY_SHORT_NAMES`, :data:`STUDY_RULES`); ``shared`` for
    :data:`SHARED_RULES`."""
    if rule in SHARED_RULES:
        return "shared"
    own = _study_rules()
    if rule in own:
        return own[rule]
    words = rule.split("_")
    return next((study for short, study in _short_names().items() if short in words), _default_study())


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


def plan_report(configs, throughput: str | Path | None = None, items: Mapping[str, int] | None = None,
                results_root: str | Path = ".", dry_run: bool = False,
                snakefile: str | Path = "Snakefile") -> tuple[pd.DataFrame, str]:
    """``counterfactory plan``: the plan of the configuration files ``configs`` (layered, later files win) at the
    ``throughput`` file's rates (default: the packaged one), and its Markdown with a heading naming the files; with
    ``dry_run`` the Snakemake jobs per study too (:func:`dry_run_jobs`)."""
    cfg = load_full_config(configs)
    rates = load_throughput(throughput)
    frame = plan(cfg, rates, items=items, results_root=results_root)
    study_jobs = jobs_by_study(dry_run_jobs(configs, snakefile)) if dry_run else None
    text = f"Plan for {', '.join(configs)} (run_name {cfg.get('run_name')})\n\n" + \
        to_markdown(frame, rates, study_jobs)
    return frame, text

