"""Debiasing with SocialCounterfactuals (Howard et al., CVPR 2024, §5, §8.2; Tables 2, 16, 17).

Protocol
--------
* **Withheld occupations (§5.1).** "For each of the three segments of our dataset, we withhold counterfactual sets
  associated with 20% of the occupation subjects for testing and use the remainder as a training dataset."
  :func:`split_subjects` draws ``round_half_up(0.2 × n)`` of the distinct subjects of the kept-images table for
  testing, reproducibly (``random_state``; the result does not depend on the input order). One split serves every
  segment, so a withheld occupation is unseen in every segment and the segments' test sets are comparable; no
  subject is ever on both sides ("no overlap between the occupations used for training and testing", §5.2).
* **Training data (§5.1).** Per segment, every kept image of the training subjects with its own caption
  (:func:`write_manifests`); ``pair_id`` is ``set_id#candidate_index``, so a counterfactual set's images form one
  group. §8.2 names no validation set and no model selection (1 epoch, the final weights): ``val_fraction: 0``
  (the schema default and the paper config) trains on every set (run_one then logs its loss on the training rows).
  Ours, option: ``val_fraction > 0`` holds whole sets out to log a validation loss (they are not trained on); with
  ``checkpoint: final`` (default) the trainer evaluates once, after the last step, so the kept weights are the
  final ones, as in the paper.
* **Fine-tuning (§8.2).** "We fine-tune CLIP with learning rates of 7e-6, 5e-6 and 9e-6 for (Race, Gender),
  (Physical Char., Gender) and (Physical Char., Race) respectively for 1 epoch and a batch size of 32. For the FLAVA
  and ALIP, we follow the same fine-tuning setting as CLIP." :func:`training_section` overrides those keys of the
  ``training`` settings (the study's ``training`` section if the config has one, else the trainer's defaults, then
  ``debias.trainer``) and :func:`debias_run` trains through :func:`counterfactory.evaluation.runs.run_one`.
* **Evaluation (§5.1, §10.1).** The checkpoint (or, with ``train=False``, the pre-trained model: the "Pre-trained"
  columns) is probed with :func:`.probing.probe` on the withheld subjects' images of the same segment; the per-subject
  MaxSkew@K, NDKL and Bias@K are averaged over those subjects: Table 2 (mean MaxSkew@K), Table 16 (mean NDKL), Table
  17 (Bias@K, segments with a gender attribute only).
* **Runs table.** ``metrics.csv`` has the runs-table columns ``experiment, mixture, seed, data_seed, metric, value``
  with ``experiment = "<role>:<segment>"``, ``mixture`` = ``pretrained`` / ``debiased`` and the metrics of
  :data:`RUN_METRICS`; :func:`summarize` tests debiased < pre-trained (one-tailed, over seeds). The pre-trained model
  is deterministic (no training, fixed withheld subjects), so the workflow evaluates it once and
  :func:`pretrained_for_every_seed` lets that value stand for each seed: Welch's test then is the one-sample test of
  the debiased runs against the pre-trained value.
* **Tables.** Tables 2, 3, 16 and 17 from the summary are :mod:`.debias_tables` (also importable from here).
* **Task performance (§5.3, Tables 4, 5).** Runs of the roles in ``debias.task_eval.roles`` are also evaluated with
  the shared retrieval and zero-shot classification (:mod:`.task_eval`); their metrics join ``metrics.csv``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from ...config import fill_section
from ...data.splits import round_half_up
from ...errors import ConfigError, input_error
from ...evaluation import runs as ev_runs
from ...io import write_csv, write_json, write_parquet, write_text
from ...render import html_page, model_display_names, render_html, render_latex, render_markdown
from ...training.mixtures import MANIFEST_COLUMNS
from ...training.runs import RUN_COLUMNS
from . import STUDY, debias_segments, debias_tables, external, probe_report, probing, task_eval
from .experiments import DEBIASED, PRETRAINED, experiment_name, parse_experiment  # noqa: F401

log = logging.getLogger(__name__)

SPLITS = ("train", "test")
SUBJECT_COLUMNS = ["subject", "split"]
#: manifest columns: the trainer's five plus where each row comes from (the leak check reads ``subject``)
MANIFEST_EXTRA = ["segment", "subject", "set_id"]
#: per-run metrics (means / medians over the withheld subjects); ``bias_*`` only for segments with a gender type
RUN_METRICS = ("maxskew_mean", "maxskew_median", "ndkl_mean", "ndkl_median", "bias_mean", "absbias_mean")

#: the ``debias`` config section has its defaults (§5.1, §8.2; "ours" where the paper is silent) in the schema
#: (``social_counterfactuals.debias`` in config/schema.yaml; docs/config-reference.md)
CHECKPOINTS = ("final", "best")



# --------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------
def settings(cfg: Mapping | None) -> dict:
    """The ``debias`` section of ``cfg`` validated with the schema's defaults filled (an unknown key or a bad value is
    a :class:`ConfigError` naming it)."""
    out = fill_section(f"{STUDY}.debias", cfg.get("debias") if cfg is not None else None)
    if isinstance(out["lr"], Mapping) and not out["lr"]:
        raise ConfigError(f"{STUDY}.debias.lr: expected a positive number or {{segment: number}}, got {{}}. "
                          "Fix: give §8.2's learning rates")
    return out


def segment_lr(opts: Mapping, segment: str) -> float:
    """The §8.2 learning rate of ``segment`` (the same for every model: "we follow the same fine-tuning setting")."""
    lr = opts["lr"]
    if not isinstance(lr, Mapping):
        return float(lr)
    if segment not in lr:
        raise ConfigError(f"debias.lr: no learning rate for segment {segment!r} (have {', '.join(sorted(lr))}). "
                          f"Fix: add '{segment}: <lr>' under debias.lr")
    return float(lr[segment])


# --------------------------------------------------------------------------------------------
# withheld occupations (§5.1)
# --------------------------------------------------------------------------------------------
def n_withheld(n_subjects: int, withheld_fraction: float) -> int:
    """``round_half_up(withheld_fraction × n)`` subjects for testing (20 % of 121 occupations: 24)."""
    return min(round_half_up(withheld_fraction * n_subjects), n_subjects)


def split_subjects(subjects: Iterable[str], withheld_fraction: float = 0.2, random_state: int = 0) -> pd.DataFrame:
    """Occupations to ``train`` / ``test`` (§5.1): ``n_withheld`` of the distinct subjects, drawn with
    ``numpy.random.default_rng(random_state)`` from the sorted list (so the input order does not matter).
    Columns ``subject, split``; sorted by subject."""
    if not 0 < withheld_fraction < 1:
        raise ValueError(f"withheld_fraction must be in (0, 1), got {withheld_fraction!r}")
    unique = sorted({str(s) for s in subjects})
    if not unique:
        raise ValueError("no subject to split")
    rng = np.random.default_rng(random_state)
    test = set(rng.permutation(len(unique))[:n_withheld(len(unique), withheld_fraction)].tolist())
    return pd.DataFrame({"subject": unique, "split": ["test" if i in test else "train" for i in range(len(unique))]},
                        columns=SUBJECT_COLUMNS)


def read_subjects(path: str | Path) -> pd.DataFrame:
    """The subject split written by ``debias-split`` (CSV ``subject, split``), checked."""
    path = Path(path)
    if not path.is_file():
        raise input_error(path, None, "subject split not found", "run 'counterfactory social debias-split' first")
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in SUBJECT_COLUMNS if c not in frame.columns]
    if missing:
        raise input_error(path, None, f"missing column(s) {', '.join(missing)}", "write a CSV with subject,split")
    bad = ~frame["split"].isin(SPLITS)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise input_error(path, f"row {i + 1}", f"split {frame['split'].iloc[i]!r} is not train or test",
                          "write train or test")
    both = frame.groupby("subject")["split"].nunique()
    if (both > 1).any():
        raise input_error(path, f"subject {both[both > 1].index[0]!r}", "is on both sides of the split",
                          "rerun 'counterfactory social debias-split'")
    return frame


def withheld_subjects(test_subjects: str | Path | Sequence[str]) -> list[str]:
    """The withheld subjects: a list, or the ``test`` rows of a split CSV (one subject per line for ``.txt``)."""
    if isinstance(test_subjects, (str, Path)):
        path = Path(test_subjects)
        if path.suffix.lower() == ".txt":
            if not path.is_file():
                raise input_error(path, None, "subject list not found", "write one withheld subject per line")
            out = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        else:
            frame = read_subjects(path)
            out = frame.loc[frame["split"] == "test", "subject"].tolist()
        where: Any = path
    else:
        out, where = [str(s) for s in test_subjects], "test subjects"
    if not out:
        raise input_error(where, None, "no withheld (test) subject", "withhold at least one subject (§5.1)")
    return out


# --------------------------------------------------------------------------------------------
# manifests (§5.1)
# --------------------------------------------------------------------------------------------
def default_segments(frame: pd.DataFrame) -> list[str]:
    """The table's segments with exactly two attribute types (Table 1; §5 debiases those three)."""
    vals = probing.segment_values(frame)
    return [seg for seg, types in vals.items() if len(types) == 2]


def _val_sets(groups: Sequence[str], val_fraction: float, random_state: int, segment: str) -> set[str]:
    """``round_half_up(val_fraction × n_sets)`` sets for validation (at least one training set kept)."""
    n = len(groups)
    k = min(round_half_up(val_fraction * n), max(n - 1, 0)) if val_fraction > 0 else 0
    rng = np.random.default_rng([int(random_state), zlib.crc32(segment.encode("utf-8"))])
    return {groups[i] for i in rng.permutation(n)[:k]}


def segment_manifest(frame: pd.DataFrame, segment: str, train_subjects: Iterable[str], val_fraction: float,
                     random_state: int) -> pd.DataFrame:
    """The training manifest of one segment: the training subjects' images with their captions; ``pair_id`` groups a
    counterfactual set (``set_id#candidate_index``); whole sets go to ``val``."""
    sel = frame[(frame["segment"] == segment) & frame["subject"].isin(set(train_subjects))]
    pair_id = sel["set_id"].astype(str) + "#" + sel["candidate_index"].astype(str)
    groups = sorted(pair_id.unique())
    val = _val_sets(groups, val_fraction, random_state, segment)
    out = pd.DataFrame({"image_path": sel["image_path"].astype(str), "caption": sel["caption"].astype(str),
                        "is_counterfactual": True, "pair_id": pair_id,
                        "split": ["val" if p in val else "train" for p in pair_id],
                        "segment": sel["segment"].astype(str), "subject": sel["subject"].astype(str),
                        "set_id": sel["set_id"].astype(str)})
    return out[list(MANIFEST_COLUMNS) + MANIFEST_EXTRA].reset_index(drop=True)


def write_manifests(images_table_path: str | Path, split: pd.DataFrame, segments: Sequence[str] | None,
                    out_dir: str | Path, val_fraction: float | None = None,
                    random_state: int | None = None) -> pd.DataFrame:
    """Write ``out_dir/<segment>.parquet`` (training manifests), ``out_dir/subjects.csv`` (the split) and
    ``out_dir/summary.csv`` (per segment: subjects, sets and images on each side); return the summary.
    ``val_fraction`` / ``random_state``: ``None`` = the schema's ``debias`` defaults."""
    if val_fraction is None or random_state is None:
        defaults = settings(None)
        val_fraction = defaults["val_fraction"] if val_fraction is None else val_fraction
        random_state = defaults["random_state"] if random_state is None else random_state

    frame = probing.read_images_table(images_table_path)
    split = split[SUBJECT_COLUMNS].astype(str)
    train = set(split.loc[split["split"] == "train", "subject"])
    test = set(split.loc[split["split"] == "test", "subject"])
    if train & test:
        raise ConfigError(f"subject split: {sorted(train & test)[0]!r} is on both sides. Fix: split by subject")
    if not train or not test:
        raise ConfigError(f"subject split: {len(train)} training and {len(test)} test subjects; §5.1 needs both. "
                          "Fix: use more subjects or another debias.withheld_fraction")
    unknown = sorted(set(frame["subject"].astype(str)) - train - test)
    if unknown:
        raise input_error(images_table_path, f"subject {unknown[0]!r}", "is in neither side of the split",
                          "split the subjects of this images table (debias-split)")
    segments = list(segments or default_segments(frame))
    if not segments:
        raise input_error(images_table_path, None, "no two-attribute segment to debias",
                          "pass the kept images of the caption sets (Table 1's segments) or set debias.segments")
    have = set(frame["segment"].astype(str))
    missing = [s for s in segments if s not in have]
    if missing:
        raise input_error(images_table_path, None, f"no image of segment(s) {', '.join(missing)}",
                          f"choose among {', '.join(sorted(have))} (debias.segments)")
    out_dir = Path(out_dir)
    rows = []
    for seg in segments:
        manifest = segment_manifest(frame, seg, train, val_fraction, random_state)
        if not (manifest["split"] == "train").any():
            raise input_error(images_table_path, f"segment {seg!r}", "no image of a training subject",
                              "check the subject split and the filtering step")
        write_parquet(out_dir / f"{seg}.parquet", manifest)
        seg_rows = frame[frame["segment"] == seg]
        held = seg_rows[seg_rows["subject"].isin(test)]
        for part, sub in (("train", manifest[manifest["split"] == "train"]),
                          ("val", manifest[manifest["split"] == "val"]), ("test", held)):
            rows.append({"segment": seg, "part": part, "subjects": sub["subject"].nunique(),
                         "sets": sub["set_id"].nunique(), "images": len(sub)})
    write_csv(out_dir / "subjects.csv", split.sort_values("subject").reset_index(drop=True))
    summary = pd.DataFrame(rows, columns=["segment", "part", "subjects", "sets", "images"])
    write_csv(out_dir / "summary.csv", summary)
    return summary


# --------------------------------------------------------------------------------------------
# one run (§5.1, §8.2)
# --------------------------------------------------------------------------------------------
def training_section(cfg: Mapping, segment: str, opts: Mapping | None = None) -> dict:
    """The ``training`` settings of a debiasing run: the trainer's defaults, the config's ``training`` section (if
    any), ``debias.trainer``, then §8.2's lr (per segment), epochs and batch size."""
    from ...training import TrainSettings

    opts = opts or settings(cfg)
    base = {f.name: f.default for f in dataclasses.fields(TrainSettings) if f.name in TrainSettings.SECTION_KEYS}
    if "training" in cfg:
        base.update(cfg["training"])
    base.update(opts["trainer"])
    base.update(lr=segment_lr(opts, segment), epochs=int(opts["epochs"]), batch_size=int(opts["batch_size"]))
    if "eval_batch_size" not in opts["trainer"]:
        base["eval_batch_size"] = int(opts["batch_size"])
    base["no_decay"] = list(base.get("no_decay") or ())
    base["precision"] = opts["precision"]   # debias.precision (training.precision's place: run_one's stage_config)
    base["eval"] = {}  # no default evaluation: the probe is the evaluation
    return base


def planned_steps(manifest: pd.DataFrame, section: Mapping, data_seed: int) -> int:
    """Optimisation steps of the run (what ``checkpoint: final`` evaluates after)."""
    from ...training import TrainSettings, step_plan

    train_rows = manifest[manifest["split"] == "train"].reset_index(drop=True)
    return len(step_plan(train_rows, int(section["batch_size"]), int(section["epochs"]), data_seed,
                         section.get("recipe", TrainSettings.recipe), section.get("max_steps")))


def summarize_probe(probe_df: pd.DataFrame, gender_type: str = "gender") -> dict[str, float]:
    """Per-run metrics (:data:`RUN_METRICS`) from a probe table of the withheld subjects: mean / median over subjects
    of the intersectional MaxSkew@K (Table 2) and NDKL (Table 16); the mean Bias@K (Table 17; signed, male positive)
    and mean |Bias@K| where the segment has ``gender_type``."""
    out: dict[str, float] = {}
    for metric in ("maxskew", "ndkl"):
        v = probe_report.per_subject(probe_df, metric)["value"].to_numpy(dtype=float)
        if v.size == 0:
            raise ValueError(f"the probe table has no intersectional {metric} rows")
        out[f"{metric}_mean"], out[f"{metric}_median"] = float(np.mean(v)), float(np.median(v))
    b = probe_report.per_subject(probe_df, "bias", attribute=gender_type)["value"].to_numpy(dtype=float)
    if b.size:
        out["bias_mean"], out["absbias_mean"] = float(np.mean(b)), float(np.mean(np.abs(b)))
    return out


def external_metrics(cfg: Mapping, role: str, out_dir: str | Path,
                     scorer_factory: Callable[[Any, str], Any] | None = None) -> dict[str, float]:
    """§5.3, Table 3: mean MaxSkew@K of the model on PATA and VisoGender, for each of the two the config points
    at (``probing.pata`` / ``probing.visogender``); rows also written to ``external.csv``."""
    frames = []
    if external.configured(cfg, "pata"):
        frames.append(external.evaluate_pata(cfg, [role], scorer_factory=scorer_factory))
    if external.configured(cfg, "visogender"):
        frames.append(external.evaluate_visogender(cfg, [role], scorer_factory=scorer_factory))
    if not frames:
        return {}
    results = pd.concat(frames, ignore_index=True)
    write_csv(Path(out_dir) / "external.csv", results)
    summary = external.external_summary(results)
    return {f"{dataset}_maxskew": float(summary.loc[role, dataset]) for dataset in summary.columns}


def _check_no_leak(manifest: pd.DataFrame, manifest_path, test: Sequence[str]) -> None:
    if "subject" not in manifest.columns:
        log.warning("%s: no subject column; cannot check that the withheld subjects are unseen", manifest_path)
        return
    leak = sorted(set(manifest["subject"].astype(str)) & set(test))
    if leak:
        raise input_error(manifest_path, f"subject {leak[0]!r}",
                          "a withheld (test) subject is in the training manifest", "build the manifest and the test list from one split (debias-split)")


def debias_run(cfg: Mapping, role: str, segment: str, manifest: str | Path | None,
               test_subjects: str | Path | Sequence[str], images_table: str | Path, seed: int, data_seed: int,
               out_dir: str | Path, train: bool = True, progress: bool = False,
               scorer_factory: Callable[[Any, str], Any] | None = None) -> pd.DataFrame:
    """Fine-tune ``role`` on ``segment``'s manifest with the §8.2 settings (``train=True``) and probe the result on the
    withheld subjects' images of that segment; ``train=False`` probes the pre-trained model the same way.

    Writes under ``out_dir``: ``checkpoint/`` (trained runs), ``history.csv``, ``run.json`` (from ``run_one``),
    ``probe.csv`` (per-subject probe rows), ``debias.json`` (settings, subjects, validation loss) and ``metrics.csv``
    (runs-table rows, :data:`RUN_METRICS`); returns the ``metrics.csv`` rows."""
    from ...training import read_manifest

    opts = settings(cfg)
    test = withheld_subjects(test_subjects)
    out_dir = Path(out_dir)
    run_cfg = copy.deepcopy(cfg)
    section = training_section(cfg, segment, opts)
    if train:
        if manifest is None:
            raise ConfigError("debias-run: a trained run needs --manifest (or pass --no-train)")
        frame = read_manifest(manifest)
        _check_no_leak(frame, manifest, test)
        if "segment" in frame.columns and not frame["segment"].astype(str).eq(segment).all():
            raise input_error(manifest, None, f"holds rows of other segments than {segment!r}",
                              f"pass the manifest of segment {segment!r}")
        if opts["checkpoint"] == "final":  # §8.2: no model selection; the only evaluation follows the last step
            section["eval_every"] = max(1, planned_steps(frame, section, data_seed))
    run_cfg["training"] = section
    mixture = DEBIASED if train else PRETRAINED
    experiment = experiment_name(role, segment)
    run_rows = ev_runs.run_one(run_cfg, manifest, mixture, seed, data_seed, out_dir, progress=progress,
                               default_eval=False, role=role, experiment=experiment, train=train)
    eval_cfg = copy.deepcopy(cfg)
    if train:  # the probe loads the fine-tuned weights through the role (as run_one's evaluations do)
        models = eval_cfg["models"]
        entry = models[role] if isinstance(models[role], Mapping) else {"source": models[role]}
        models[role] = {**entry, "source": str(out_dir / "checkpoint")}
    probe_df = probing.probe(eval_cfg, [role], images_table, segments=[segment], subjects=test,
                             scorer_factory=scorer_factory)
    write_csv(out_dir / "probe.csv", probe_df)
    metrics = summarize_probe(probe_df, probing.settings(cfg)["gender_type"])
    metrics.update(external_metrics(eval_cfg, role, out_dir, scorer_factory))
    if task_eval.evaluates(opts, role):  # §5.3, Tables 4 and 5: the shared retrieval / zero-shot evaluation
        metrics.update(task_eval.evaluate(eval_cfg, role, task_eval.task_settings(opts), progress=progress))
    rows = pd.DataFrame([{"experiment": experiment, "mixture": mixture, "seed": int(seed), "data_seed": int(data_seed),
                          "metric": k, "value": v} for k, v in metrics.items()], columns=RUN_COLUMNS)
    val = run_rows.loc[run_rows["metric"] == "val_loss", "value"]
    write_json(out_dir / "debias.json", {
        "role": role, "segment": segment, "trained": bool(train), "training": section if train else None,
        "test_subjects": sorted(test), "probed_subjects": sorted(probe_df["subject"].unique().tolist()),
        "val_loss": float(val.iloc[0]) if len(val) else None})
    write_csv(out_dir / "metrics.csv", rows)  # replaces run_one's rows (val_loss has no pre-trained counterpart)
    return rows


def pretrained_for_every_seed(runs: pd.DataFrame) -> pd.DataFrame:
    """Let an experiment's single pre-trained evaluation stand for each seed of its debiased runs.

    The pre-trained model is not trained and the withheld subjects are fixed, so every seed would evaluate it
    identically; the workflow evaluates it once. Repeating that value per seed gives the baseline zero variance, and
    Welch's test then is the one-sample t-test of the debiased runs against the pre-trained value (df = n - 1), as if
    it had been evaluated for every seed. Experiments with several pre-trained rows are left as they are."""
    pre = runs[runs["mixture"] == PRETRAINED]
    rest = runs[runs["mixture"] != PRETRAINED]
    baselines = []
    for experiment, group in pre.groupby("experiment", sort=False):
        seeds = sorted(rest.loc[rest["experiment"] == experiment, "seed"].unique())
        if group["seed"].nunique() == 1 and len(seeds) > 1:
            group = group.drop(columns="seed").merge(pd.DataFrame({"seed": seeds}), how="cross")[runs.columns]
        baselines.append(group)
    return pd.concat([*baselines, rest], ignore_index=True)


def summarize(runs: pd.DataFrame, alpha: float = 0.05, test: str = "welch", source: str | Path = "runs table"):
    """Mean ± std over seeds per (experiment, metric, mixture) and the one-tailed test debiased < pre-trained
    (:func:`counterfactory.stats.summarize` with ``alternative="less"``: lower skew is better); a single pre-trained
    evaluation stands for every seed (:func:`pretrained_for_every_seed`)."""
    from ...stats import summarize as stats_summarize

    return stats_summarize(pretrained_for_every_seed(runs), PRETRAINED, test=test, alpha=alpha, alternative="less",
                           source=source)


# ------------------------------------------------------------------------------------------- the tables' files


def write_debias_tables(*, summary_path=None, runs_path=None, alpha: float = 0.05, roles=None,
                        labels: Mapping[str, str] | None = None, out_md=None, out_tex=None, out_csv=None,
                        out_html=None, decimals: int = 2, paper_segment: str | None = None,
                        withheld_fraction: float = 0.2) -> dict:
    """``social debias-table``: Tables 2, 16 and 17 (and, with ``paper_segment``, Table 3 as the paper lays it out)
    of a stats summary (``summary_path``) or of a runs table summarized here (``runs_path``), written in the formats
    asked for (at least one, else a ConfigError)."""
    if not (out_md or out_tex or out_csv or out_html):
        raise ConfigError("debias-table: nothing to write. Fix: pass --out-md, --out-tex, --out-csv and/or --out-html")
    if runs_path:
        from ...stats import read_runs

        summary = summarize(read_runs(runs_path), alpha=alpha, source=runs_path)
    else:
        from ...tables import read_summary

        summary = read_summary(summary_path)
    labels = dict(labels or {})
    tables = debias_tables.build_tables(summary, roles=roles, role_labels=labels, decimals=decimals,
                                        std_decimals=decimals, withheld_fraction=withheld_fraction)
    paper3 = None
    if paper_segment:   # §5.3: Table 3 with "Debiased CLIP" = the paper segment's model
        paper3 = debias_tables.table3_paper(summary, paper_segment, roles=roles, role_labels=labels)
    if out_md:
        parts = [debias_tables.render_markdown(t) for t in tables.values()]
        write_text(out_md, "\n".join(parts + ([render_markdown(paper3)] if paper3 is not None else [])))
    if out_html:
        write_text(out_html, debias_tables.render_html(tables, extra=[paper3] if paper3 is not None else []))
    if out_tex:
        write_text(out_tex, "\n".join(debias_tables.render_latex(t) for t in tables.values()))
    if out_csv:
        write_csv(out_csv, debias_tables.tables_frame(tables))
    return tables


def write_task_tables(cfg: Mapping, runs_path, *, labels: Mapping[str, str] | None = None, out_md=None,
                      out_tex=None, out_csv=None, out_html=None, out_seeds_csv=None, decimals: int = 2) -> dict:
    """``social debias-task-table``: Tables 4 and 5 (retrieval R@K and zero-shot accuracy of the pre-trained and
    debiased models, ``debias.task_eval``) of the runs table ``runs_path``, written in the formats asked for."""
    from ...stats import read_runs

    if not (out_md or out_tex or out_csv or out_html or out_seeds_csv):
        raise ConfigError("debias-task-table: nothing to write. Fix: pass --out-md, --out-tex, --out-csv, "
                          "--out-seeds-csv and/or --out-html")
    opts = settings(cfg)
    task = task_eval.task_settings(opts)
    roles = list(task.get("roles") or [])
    if not roles:
        raise ConfigError("debias-task-table: debias.task_eval.roles is empty. Fix: list the debiased roles to "
                          "evaluate (Tables 4, 5: the CLIP role)")
    retrieval = task.get("retrieval") or {}
    runs = read_runs(runs_path)
    layout = dict(ks=retrieval.get("ks") or (1, 5, 10), segments=debias_segments(cfg),
                  labels={**model_display_names(cfg.get("models"), roles), **dict(labels or {})},
                  paper_segment=opts["paper_segment"])
    datasets = task_eval.classification_datasets(task)
    tables = task_eval.build_tables(runs, roles, retrieval.get("name"), datasets, decimals=decimals, **layout)
    if out_seeds_csv:
        write_csv(out_seeds_csv, task_eval.seed_frame(runs, roles, retrieval.get("name"), datasets, **layout))
    if out_md:
        write_text(out_md, "\n".join(render_markdown(t) for t in tables.values()))
    if out_html:
        write_text(out_html, html_page("SocialCounterfactuals: task performance after debiasing",
                                       [render_html(t) for t in tables.values()]))
    if out_tex:
        write_text(out_tex, "\n".join(render_latex(t) for t in tables.values()))
    if out_csv:
        write_csv(out_csv, task_eval.tables_frame(tables))
    return tables
