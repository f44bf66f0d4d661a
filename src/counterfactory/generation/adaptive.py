"""What adaptive over-generation would have cost and selected: a curve replayed from a fixed-mode run.

The papers over-generate a fixed number of candidates per item (COCO-Counterfactuals §3.2 / B.1.2: 100
image pairs per caption pair, the best passing one by CLIP_dir is kept; SocialCounterfactuals §3.3 / §3.4:
100 candidate sets per caption set, every set passing the filter is kept). The adaptive modes are ours
(``images.adaptive``, off in the paper configs): they generate the same candidates in the same batches
(:func:`.selection.candidate_batches`; for sets :func:`.sets.set_batch_size`) and stop after the first
batch that meets a stopping rule. So an adaptive run makes a *prefix* of the fixed run's batches, with the
same seeds and therefore the same images and scores, and its cost and selection can be replayed exactly
from a fixed-mode run's per-candidate scores, for any rule, without generating anything.

Rules (one curve point each): ``fixed`` (all candidates, the paper), ``passed>=t`` (stop once ``t``
candidates passed the filter; what the stages' adaptive modes do, for ``t`` in
``adaptive_curve.targets``, default 1, 2, 4) and, optionally, ``best>=q<quantile>`` (stop once the
best passed score reaches the given quantile of all passed candidates' scores in this run; ours, *not*
implemented by the stages, and in-sample: the threshold is taken from the run it is evaluated on).

Costs are the engine's own accounting (:class:`.sampler.P2PEngine` counts one UNet evaluation per latent
row per step, CFG included): the cost of one candidate is read from the fixed run's summary
(``unet_evals`` / ``candidates_generated`` for pairs, ``unet_evals`` / ``images`` x members for sets),
never re-derived. CLIP scoring is not counted (both modes score every generated candidate once).

Selection: pairs as the stage selects (:func:`counterfactory.filters.select_top` by ``sim_direction``,
``images.filter.top_k``); sets keep every passing candidate set (§3.4, no ranking), scored by their
``min_image_caption`` (the CLIP stage's thresholded quantity; any score column can be chosen). The
candidates must come from a fixed-mode run; the replay checks the recorded seeds against
:func:`.selection.candidate_batches`, so scores from another seed or config are refused.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from ..errors import ConfigError, input_error, missing_input
from ..filters import select_top
from ..io import read_table, write_csv
from ..render import pyplot
from ..settings import config_value, schema_defaults
from .sampler import GenerationSettings
from .selection import candidate_batches
from .sets import SetGenerationSettings, set_batch_size

PAIRS, SETS = "pairs", "sets"
#: the score each kind selects by (pairs: CLIP_dir, B.1.2) or reports (sets: the CLIP stage's min cosine)
DEFAULT_SCORE = {PAIRS: "sim_direction", SETS: "min_image_caption"}
_ID = {PAIRS: "caption_id", SETS: "set_id"}
CURVE_COLUMNS = ("rule", "in_stage", "items", "items_with_selection", "stopped_early", "candidates", "unet_evals",
                 "accepted", "unet_evals_per_accepted", "selected_median", "selected_q25", "selected_q75",
                 "selection_changed")


# --------------------------------------------------------------------------- settings and rules

@dataclass(frozen=True)
@schema_defaults("coco_counterfactuals.adaptive_curve")
class CurveSettings:
    """The study's ``adaptive_curve`` section (ours; a section of its own, outside ``images``, so editing it
    reruns only the curve): the ``passed>=t`` targets, optional ``best>=q`` quantiles, and the batch size of the
    replayed layout (None = the run's own)."""

    targets: tuple[int, ...]
    best_quantiles: tuple[float, ...]
    batch_size: int | None

    def __post_init__(self):
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in self.targets):
            raise ConfigError(f"adaptive_curve.targets must be integers >= 1, got {list(self.targets)}. "
                              "Fix: e.g. [1, 2, 4]")
        if any(not 0.0 <= q <= 1.0 for q in self.best_quantiles):
            raise ConfigError(f"adaptive_curve.best_quantiles must lie in [0, 1], got "
                              f"{list(self.best_quantiles)}. Fix: e.g. [0.5, 0.75]")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"adaptive_curve.batch_size must be >= 1 or null, got {self.batch_size}")

    @classmethod
    def from_config(cls, cfg: dict) -> "CurveSettings":
        sec = cfg.get("adaptive_curve") or {}
        bs = sec.get("batch_size")
        return cls(targets=tuple(sec.get("targets", cls.targets)),
                   best_quantiles=tuple(float(q) for q in sec.get("best_quantiles", cls.best_quantiles)),
                   batch_size=None if bs is None else int(bs))


@dataclass(frozen=True)
class Rule:
    """A stopping rule, checked after each batch: stop once ``target`` candidates passed, or once the best
    passed score is ``>= best``; neither = the fixed paper mode. ``in_stage``: the stage's adaptive mode
    implements it (``passed>=t``), else it is a what-if."""

    name: str
    target: int | None = None
    best: float | None = None
    in_stage: bool = True

    def stops(self, n_passed: int, best_score: float) -> bool:
        if self.target is not None:
            return n_passed >= self.target
        if self.best is not None:
            return n_passed > 0 and best_score >= self.best
        return False


def make_rules(settings: CurveSettings, passed_scores: Sequence[float]) -> list[Rule]:
    """``fixed``, ``passed>=t`` per target, ``best>=q<quantile>`` per quantile (threshold: the quantile,
    numpy's linear interpolation, of ``passed_scores``; skipped when nothing passed)."""
    rules = [Rule("fixed", in_stage=True)]
    rules += [Rule(f"passed>={t}", target=t) for t in settings.targets]
    scores = np.asarray([s for s in passed_scores if np.isfinite(s)], dtype=np.float64)
    if len(scores):
        for q in settings.best_quantiles:
            thr = float(np.quantile(scores, q))
            rules.append(Rule(f"best>=q{q:g} ({thr:.4g})", best=thr, in_stage=False))
    return rules


# --------------------------------------------------------------------------- replay

@dataclass
class ItemCandidates:
    """One item's fixed-mode candidates: batches of candidate indices in generation order, each
    candidate's score and filter verdict, and the UNet evaluations one candidate costs."""

    item_id: str
    batches: list[list[int]]
    score: dict[int, float]
    passed: dict[int, bool]
    cost: int


@dataclass(frozen=True)
class ItemReplay:
    item_id: str
    candidates: int
    unet_evals: int
    selected: tuple[int, ...]        # candidate indices, in rank order (pairs) or index order (sets)
    stopped_early: bool


Selector = Callable[[list[int], list[float], list[bool]], list[int]]


def top_k_selector(top_k: int) -> Selector:
    """The COCO-CF stage's selection: :func:`~counterfactory.filters.select_top` by the score."""
    def select(idx: list[int], score: list[float], passed: list[bool]) -> list[int]:
        return [idx[i] for i in select_top(idx, score, passed, top_k)]

    return select


def keep_passed(idx: list[int], score: list[float], passed: list[bool]) -> list[int]:
    """The SocialCounterfactuals selection (§3.4): every passing candidate set."""
    return [i for i, ok in zip(idx, passed) if ok]


def replay_item(item: ItemCandidates, rule: Rule, select: Selector) -> ItemReplay:
    """Generate ``item``'s batches in order until ``rule`` stops (never after the last batch), then select
    among the candidates made, as the stage's adaptive loop does."""
    made: list[int] = []
    n_passed, best = 0, -math.inf
    stopped = False
    for k, batch in enumerate(item.batches):
        made += batch
        for c in batch:
            if item.passed[c]:
                n_passed += 1
                best = max(best, item.score[c])
        if k < len(item.batches) - 1 and rule.stops(n_passed, best):
            stopped = True
            break
    chosen = select(made, [item.score[c] for c in made], [item.passed[c] for c in made])
    return ItemReplay(item.item_id, len(made), len(made) * item.cost, tuple(chosen), stopped)


def curve(items: Sequence[ItemCandidates], rules: Sequence[Rule], select: Selector) -> pd.DataFrame:
    """One row per rule (:data:`CURVE_COLUMNS`): items, items with a selection, items stopped early,
    candidates and UNet evaluations spent, accepted (selected) candidates, UNet evaluations per accepted
    candidate, median / quartiles of the selected candidates' scores, and the fraction of items whose
    selection differs from the fixed mode's."""
    fixed = {it.item_id: replay_item(it, Rule("fixed"), select).selected for it in items}
    by_id = {it.item_id: it for it in items}
    rows = []
    for rule in rules:
        reps = [replay_item(it, rule, select) for it in items]
        sel = np.asarray([by_id[r.item_id].score[c] for r in reps for c in r.selected], dtype=np.float64)
        evals = sum(r.unet_evals for r in reps)
        q25, med, q75 = (np.quantile(sel, [0.25, 0.5, 0.75]).tolist() if len(sel) else (math.nan,) * 3)
        rows.append({
            "rule": rule.name, "in_stage": rule.in_stage, "items": len(reps),
            "items_with_selection": sum(bool(r.selected) for r in reps),
            "stopped_early": sum(r.stopped_early for r in reps),
            "candidates": sum(r.candidates for r in reps), "unet_evals": evals, "accepted": len(sel),
            "unet_evals_per_accepted": evals / len(sel) if len(sel) else math.nan,
            "selected_median": med, "selected_q25": q25, "selected_q75": q75,
            "selection_changed": (sum(r.selected != fixed[r.item_id] for r in reps) / len(reps)) if reps else math.nan,
        })
    return pd.DataFrame(rows, columns=list(CURVE_COLUMNS))


# --------------------------------------------------------------------------- reading a fixed-mode run

def _read_table(path: Path, what: str, fix: str) -> pd.DataFrame:
    return read_table(path, what, fix, formats=("parquet",))


def read_summary(path: str | os.PathLike) -> dict:
    """A fixed-mode run's ``summary.json`` (merged or one shard)."""
    path = Path(path)
    if not path.exists():
        raise missing_input(path, "run summary (summary.json)", "pass the summary.json written next to the "
                            "candidates by the merge step (--summary)")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise input_error(path, None, f"not valid JSON ({exc})", "rerun the merge step") from exc


def _per_unit_cost(summary: dict, path, unit: str) -> int:
    """UNet evaluations per ``unit`` (candidate or image) from the summary, which must be a whole number."""
    evals, count = summary.get("unet_evals"), summary.get(unit)
    stopped = summary.get("stopped_early", summary.get("sets_stopped_early", 0))
    if stopped:
        raise input_error(path, None, f"{stopped} item(s) stopped early: these are adaptive-mode outputs",
                          "replay a fixed-mode run (images.adaptive.enabled: false)")
    if evals == 0 and count == 0:   # a run with no input items (e.g. no caption passed the caption stage)
        return 0
    if not isinstance(evals, int) or not isinstance(count, int) or count <= 0 or evals % count:
        raise input_error(path, None, f"unet_evals {evals!r} is not a whole multiple of {unit} {count!r}",
                          "pass the summary of the run whose candidates are replayed")
    return evals // count


def _check_layout(path, item_id: str, rows: pd.DataFrame, n: int, batches, what: str) -> None:
    idx = sorted(int(i) for i in rows["candidate_index"])
    if idx != list(range(n)):
        raise input_error(path, f"{_ID[what]} {item_id!r}", f"candidate indices {idx[:8]}... are not 0..{n - 1}",
                          f"replay a fixed-mode run made with this config's {n} candidates per item")
    if "seed" in rows:
        recorded = dict(zip(rows["candidate_index"].astype(int), rows["seed"].astype("uint64")))
        for c in (c for b in batches for c in b):
            if int(recorded[c.index]) != c.seed:
                raise input_error(path, f"{_ID[what]} {item_id!r}, candidate {c.index}",
                                  f"recorded seed {int(recorded[c.index])} is not this config's {c.seed}",
                                  "pass the config (seed) the run was made with")


def layout_batch_size(images: dict, settings: CurveSettings, summary: dict, path) -> int:
    """The batch size to replay: the curve's override, else the one the run's summary records (``batch_size``,
    when the stage writes it), else ``images.batch_size``; ``auto`` (device-dependent) needs one of the first two."""
    if settings.batch_size is not None:
        return settings.batch_size
    if isinstance(summary.get("batch_size"), int):
        return summary["batch_size"]
    bs = images.get("batch_size", GenerationSettings.batch_size)
    if bs == "auto":
        raise input_error(path, None, "images.batch_size is auto and the summary does not record the size the run "
                          "resolved", "pass --batch-size N (the run's log says 'batch size auto -> N')")
    return int(bs)


def pair_items(scores: pd.DataFrame, cfg: dict, cost: int, batch_size: int, path="scores",
               score_column: str = DEFAULT_SCORE[PAIRS]) -> list[ItemCandidates]:
    """COCO-CF ``candidate_scores.parquet`` rows -> items, one per caption, batched as the stage batches
    (:func:`.selection.candidate_batches`, ``batch_size`` candidates per call); ``cost`` per candidate."""
    images = cfg.get("images") or {}
    gen = GenerationSettings.from_config({**images, "batch_size": batch_size})
    n = int(config_value(images, "coco_counterfactuals.images.candidates_per_pair"))
    return _items(scores, PAIRS, score_column, path, lambda cid, _rows: (
        list(candidate_batches(int(config_value(cfg, "seed")), cid, n, gen)), n, cost))


def set_items(clip_sets: pd.DataFrame, cfg: dict, cost_per_image: int, batch_size: int, path="clip_sets",
              score_column: str = DEFAULT_SCORE[SETS]) -> list[ItemCandidates]:
    """SocialCounterfactuals ``filter/clip_sets.parquet`` rows (CLIP stage verdict per candidate set) ->
    items, one per caption set, batched as :func:`.sets.run_set_shard` batches (``set_batch_size`` for the
    set's member count ``n_images``, from ``batch_size``); a candidate set costs ``cost_per_image`` x members."""
    images = cfg.get("images") or {}
    gen = GenerationSettings.from_config({**images, "batch_size": batch_size})
    sets = SetGenerationSettings.from_config(images)
    n = sets.candidates_per_set

    def layout(sid: str, rows: pd.DataFrame):
        members = set(int(m) for m in rows["n_images"])
        if len(members) != 1:
            raise input_error(path, f"set_id {sid!r}", f"candidate sets with different n_images {sorted(members)}",
                              "every candidate set of a caption set has one image per caption")
        g = members.pop()
        b = set_batch_size(gen, sets, g)
        seed = int(config_value(cfg, "seed"))
        return list(candidate_batches(seed, sid, n, gen, batch_size=b)), n, cost_per_image * g

    return _items(clip_sets, SETS, score_column, path, layout)


def _items(table: pd.DataFrame, what: str, score_column: str, path, layout) -> list[ItemCandidates]:
    need = [_ID[what], "candidate_index", "passed", score_column] + (["n_images"] if what == SETS else [])
    missing = [c for c in need if c not in table.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {missing}",
                          "pass candidate_scores.parquet (pairs) or filter/clip_sets.parquet (sets)")
    out = []
    for item_id, rows in table.groupby(_ID[what], sort=True):
        if rows["candidate_index"].duplicated().any():
            raise input_error(path, f"{_ID[what]} {item_id!r}", "a candidate index appears twice",
                              "pass one run's merged table")
        batches, n, cost = layout(str(item_id), rows)
        _check_layout(path, str(item_id), rows, n, batches, what)
        idx = rows["candidate_index"].astype(int)
        out.append(ItemCandidates(str(item_id), [[c.index for c in b] for b in batches],
                                  dict(zip(idx, rows[score_column].astype(float))),
                                  dict(zip(idx, rows["passed"].astype(bool))), cost))
    return out


def detect_kind(table: pd.DataFrame) -> str:
    """``pairs`` for COCO-CF candidate scores, ``sets`` for the social CLIP stage's per-set table."""
    if "caption_id" in table.columns:
        return PAIRS
    if "set_id" in table.columns:
        return SETS
    raise ValueError("neither caption_id nor set_id")


def curve_from_files(scores_path, cfg: dict, summary_path=None, *, kind: str | None = None,
                     score_column: str | None = None, settings: CurveSettings | None = None) -> pd.DataFrame:
    """The curve of a fixed-mode run's files: ``scores_path`` = COCO-CF ``candidate_scores.parquet``
    (summary default: its sibling ``summary.json``) or SocialCounterfactuals ``filter/clip_sets.parquet``
    (summary: ``generation/summary.json``, required). ``cfg``: the study's view (``images``, ``seed``)."""
    scores_path = Path(scores_path)
    table = _read_table(scores_path, "candidate scores", "run the image stage (fixed mode) first")
    if kind is None:
        try:
            kind = detect_kind(table)
        except ValueError:
            raise input_error(scores_path, None, "has neither a caption_id nor a set_id column",
                              "pass candidate_scores.parquet (pairs) or filter/clip_sets.parquet (sets)") from None
    settings = settings or CurveSettings.from_config(cfg)
    score_column = score_column or DEFAULT_SCORE[kind]
    if summary_path is None:
        if kind == SETS:
            raise input_error(scores_path, None, "a set table needs the generation summary",
                              "pass --summary <study>/generation/summary.json")
        summary_path = scores_path.with_name("summary.json")
    summary = read_summary(summary_path)
    batch = layout_batch_size(cfg.get("images") or {}, settings, summary, summary_path)
    if kind == PAIRS:
        items = pair_items(table, cfg, _per_unit_cost(summary, summary_path, "candidates_generated"), batch,
                           scores_path, score_column)
        filt = (cfg.get("images") or {}).get("filter") or {}
        top_k = int(config_value(filt, "coco_counterfactuals.images.filter.top_k"))
        select = top_k_selector(top_k)
    else:
        items = set_items(table, cfg, _per_unit_cost(summary, summary_path, "images"), batch, scores_path,
                          score_column)
        select = keep_passed
    passed = [s for it in items for c, s in it.score.items() if it.passed[c]]
    return curve(items, make_rules(settings, passed), select)


def scores_kind(scores_path) -> str:
    """:data:`PAIRS` or :data:`SETS`: which fixed-mode table ``scores_path`` is, from its parquet schema (a set
    table has ``set_id`` and no ``caption_id``); a missing or unreadable file is an error naming the fix."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(scores_path).names
    except FileNotFoundError:
        raise missing_input(scores_path, "candidate scores", "run the image stage (fixed mode) first") from None
    except Exception as exc:  # pyarrow raises several types
        raise input_error(scores_path, None, f"not a readable parquet file ({exc})",
                          "pass candidate_scores.parquet (pairs) or filter/clip_sets.parquet (sets)") from exc
    return SETS if "set_id" in names and "caption_id" not in names else PAIRS


def write_curve(cfg: dict, scores_path, out_csv, summary_path=None, *, kind: str, study: str, out_png=None,
                score_column: str | None = None, targets: Sequence[int] | None = None,
                best_quantiles: Sequence[float] | None = None, batch_size: int | None = None) -> pd.DataFrame:
    """``counterfactory images adaptive-curve``: :func:`curve_from_files` with the config's ``adaptive_curve``
    settings (``targets``, ``best_quantiles``, ``batch_size`` override them), written to ``out_csv`` and, with
    ``out_png``, plotted (:func:`plot_curve`; the title names ``cfg["study"]``, else ``study``). Returns the table."""
    base = CurveSettings.from_config(cfg)
    settings = CurveSettings(
        targets=tuple(targets) if targets else base.targets,
        best_quantiles=tuple(best_quantiles) if best_quantiles else base.best_quantiles,
        batch_size=batch_size if batch_size is not None else base.batch_size)
    score = score_column or DEFAULT_SCORE[kind]
    table = curve_from_files(scores_path, cfg, summary_path, kind=kind, score_column=score, settings=settings)
    write_csv(out_csv, table)
    if out_png:
        label = "median selected CLIP_dir" if score == "sim_direction" else f"median selected {score}"
        plot_curve(table, out_png, score_label=label,
                   title=f"{cfg.get('study', study)}: adaptive over-generation ({kind})")
    return table


# --------------------------------------------------------------------------- plot

def plot_curve(table: pd.DataFrame, out, score_label: str = "median selected CLIP_dir", title: str = "") -> Path:
    """x = UNet evaluations per accepted candidate, y = median selected score (bars: quartiles); one point per
    rule, named in the legend beside the axes (what-if rules, not implemented by the stage, drawn hollow)."""
    from ..io import save_figure  # local: tests patch io.save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.6, 3.8), layout="constrained")
    t = table.dropna(subset=["unet_evals_per_accepted", "selected_median"]).sort_values("unet_evals_per_accepted")
    ax.plot(t["unet_evals_per_accepted"], t["selected_median"], color="0.6", alpha=0.5, lw=1)
    markers = "osD^vP*Xh<>p"
    # one marker and colour per rule, named in the legend: rules of equal cost and score sit on one spot, where
    # labels beside the points overprinted each other
    for k, (_, r) in enumerate(t.iterrows()):
        y = r["selected_median"]
        color = f"C{k % 10}"
        ax.errorbar(r["unet_evals_per_accepted"], y, yerr=[[y - r["selected_q25"]], [r["selected_q75"] - y]],
                    fmt=markers[k % len(markers)], color=color, mfc=color if r["in_stage"] else "white", capsize=3,
                    elinewidth=0.8, alpha=0.9, label=f"{r['rule']}, {r['selection_changed']:.0%} changed"
                    + ("" if r["in_stage"] else " (what-if)"))
    ax.set_xlabel("UNet evaluations per accepted candidate")
    ax.set_ylabel(score_label)
    ax.set_title(title or "Adaptive over-generation: cost vs selected score", fontsize=9)
    ax.grid(alpha=0.3)
    if len(t):
        ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, title="rule",
                  title_fontsize=7)
    out = save_figure(out, fig)
    plt.close(fig)
    return out
