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
  group. §8.2 names no validation set and no model selection (1 epoch, the final weights). We keep a small
  validation split *by set* (``val_fraction``, default 5 %, ours) only to log a validation loss; with
  ``checkpoint: final`` (default) the trainer evaluates once, after the last step, so the kept weights are the
  final ones, as in the paper. ``val_fraction: 0`` trains on every set (run_one then validates on the training rows).
* **Fine-tuning (§8.2).** "We fine-tune CLIP with learning rates of 7e-6, 5e-6 and 9e-6 for (Race, Gender),
  (Physical Char., Gender) and (Physical Char., Race) respectively for 1 epoch and a batch size of 32. For the FLAVA
  and ALIP, we follow the same fine-tuning setting as CLIP." :func:`training_section` overrides those keys of the
  ``training`` settings (the study's ``training`` section if the config has one, else the trainer's defaults, then
  ``debias.trainer``) and :func:`debias_run` trains through :func:`counterfactory.training.runs.run_one`.
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
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from ...errors import ConfigError, input_error
from . import probing

log = logging.getLogger(__name__)

PRETRAINED = "pretrained"
DEBIASED = "debiased"
SPLITS = ("train", "test")
SUBJECT_COLUMNS = ["subject", "split"]
#: manifest columns: the trainer's five plus where each row comes from (the leak check reads ``subject``)
MANIFEST_EXTRA = ["segment", "subject", "set_id"]
#: per-run metrics (means / medians over the withheld subjects); ``bias_*`` only for segments with a gender type
RUN_METRICS = ("maxskew_mean", "maxskew_median", "ndkl_mean", "ndkl_median", "bias_mean", "absbias_mean")

#: defaults of the ``debias`` config section
DEFAULTS: dict[str, Any] = {
    "roles": None,                 # §5.1: CLIP, ALIP, FLAVA (model roles); None: give --role
    "segments": None,              # None: the images table's two-attribute segments (Table 1)
    "withheld_fraction": 0.2,      # §5.1: 20 % of the occupation subjects withheld for testing
    "random_state": 0,             # ours: the paper's split is not published
    "val_fraction": 0.05,          # ours: §8.2 names no validation set (sets, not images, are split)
    "checkpoint": "final",         # final: §8.2 (1 epoch, no model selection) | best: lowest validation loss
    "lr": {"race_gender": 7e-6, "physical_gender": 5e-6, "physical_race": 9e-6},   # §8.2 (CLIP; ALIP/FLAVA same)
    "epochs": 1,                   # §8.2
    "batch_size": 32,              # §8.2
    "trainer": {},                 # other training keys (weight_decay, warmup_steps, max_steps, ...), ours
    "seeds": {"first": 0, "count": 3, "data_seed_offset": 1},   # ours: the paper reports single runs
}
CHECKPOINTS = ("final", "best")


# --------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------
def settings(cfg: Mapping | None) -> dict:
    """The ``debias`` section of ``cfg`` over :data:`DEFAULTS`, checked."""
    out = copy.deepcopy(DEFAULTS)
    section = cfg.get("debias") if cfg is not None else None
    if section:
        unknown = sorted(set(section) - set(DEFAULTS))
        if unknown:
            raise ConfigError(f"debias: unknown key(s) {', '.join(unknown)}. Fix: use {', '.join(sorted(DEFAULTS))}")
        out.update({k: copy.deepcopy(v) for k, v in section.items() if v is not None or k in ("roles", "segments")})
    for key in ("withheld_fraction", "val_fraction"):
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise ConfigError(f"debias.{key}: expected a fraction in [0, 1), got {v!r}")
    if not out["withheld_fraction"] > 0:
        raise ConfigError("debias.withheld_fraction: must be above 0 (§5.1 withholds 20 % of the subjects)")
    if out["checkpoint"] not in CHECKPOINTS:
        raise ConfigError(f"debias.checkpoint: expected one of {', '.join(CHECKPOINTS)}, got {out['checkpoint']!r}")
    for key in ("epochs", "batch_size"):
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"debias.{key}: expected a positive integer, got {v!r}")
    lr = out["lr"]
    values = lr.values() if isinstance(lr, Mapping) else [lr]
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in values):
        raise ConfigError(f"debias.lr: expected a positive number or {{segment: number}}, got {lr!r}")
    if not isinstance(out["trainer"], Mapping):
        raise ConfigError(f"debias.trainer: expected a mapping of training keys, got {out['trainer']!r}")
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


def experiment_name(role: str, segment: str) -> str:
    """The runs table's experiment of one (model role, segment): ``"<role>:<segment>"``."""
    return f"{role}:{segment}"


def parse_experiment(name: str) -> tuple[str, str]:
    role, sep, segment = str(name).rpartition(":")
    if not sep or not role or not segment:
        raise ValueError(f"experiment {name!r} is not '<role>:<segment>'")
    return role, segment


# --------------------------------------------------------------------------------------------
# withheld occupations (§5.1)
# --------------------------------------------------------------------------------------------
def n_withheld(n_subjects: int, withheld_fraction: float) -> int:
    """``round_half_up(withheld_fraction × n)`` subjects for testing (20 % of 121 occupations: 24)."""
    from ...training.mixtures import round_half_up

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
    from ...training.mixtures import round_half_up

    n = len(groups)
    k = min(round_half_up(val_fraction * n), max(n - 1, 0)) if val_fraction > 0 else 0
    rng = np.random.default_rng([int(random_state), zlib.crc32(segment.encode("utf-8"))])
    return {groups[i] for i in rng.permutation(n)[:k]}


def segment_manifest(frame: pd.DataFrame, segment: str, train_subjects: Iterable[str], val_fraction: float,
                     random_state: int) -> pd.DataFrame:
    """The training manifest of one segment: the training subjects' images with their captions; ``pair_id`` groups a
    counterfactual set (``set_id#candidate_index``); whole sets go to ``val``."""
    from ...training.mixtures import MANIFEST_COLUMNS

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
                    out_dir: str | Path, val_fraction: float = DEFAULTS["val_fraction"],
                    random_state: int = DEFAULTS["random_state"]) -> pd.DataFrame:
    """Write ``out_dir/<segment>.parquet`` (training manifests), ``out_dir/subjects.csv`` (the split) and
    ``out_dir/summary.csv`` (per segment: subjects, sets and images on each side); return the summary."""
    from ...io import write_csv, write_parquet

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
    base["eval"] = {}  # no default evaluation: the probe is the evaluation
    return base


def planned_steps(manifest: pd.DataFrame, section: Mapping, data_seed: int) -> int:
    """Optimisation steps of the run (what ``checkpoint: final`` evaluates after)."""
    from ...training import step_plan

    train_rows = manifest[manifest["split"] == "train"].reset_index(drop=True)
    return len(step_plan(train_rows, int(section["batch_size"]), int(section["epochs"]), data_seed,
                         section.get("recipe", "plain"), section.get("max_steps")))


def summarize_probe(probe_df: pd.DataFrame, gender_type: str = "gender") -> dict[str, float]:
    """Per-run metrics (:data:`RUN_METRICS`) from a probe table of the withheld subjects: mean / median over subjects
    of the intersectional MaxSkew@K (Table 2) and NDKL (Table 16); the mean Bias@K (Table 17; signed, male positive)
    and mean |Bias@K| where the segment has ``gender_type``."""
    out: dict[str, float] = {}
    for metric in ("maxskew", "ndkl"):
        v = probing.per_subject(probe_df, metric)["value"].to_numpy(dtype=float)
        if v.size == 0:
            raise ValueError(f"the probe table has no intersectional {metric} rows")
        out[f"{metric}_mean"], out[f"{metric}_median"] = float(np.mean(v)), float(np.median(v))
    b = probing.per_subject(probe_df, "bias", attribute=gender_type)["value"].to_numpy(dtype=float)
    if b.size:
        out["bias_mean"], out["absbias_mean"] = float(np.mean(b)), float(np.mean(np.abs(b)))
    return out


def external_metrics(cfg: Mapping, role: str, out_dir: str | Path,
                     scorer_factory: Callable[[Any, str], Any] | None = None) -> dict[str, float]:
    """§5.3, Table 3: mean MaxSkew@K of the model on PATA and VisoGender, for each of the two the config points
    at (``probing.pata`` / ``probing.visogender``); rows also written to ``external.csv``."""
    from ...io import write_csv
    from . import external

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
    from ...io import write_csv, write_json
    from ...training import read_manifest
    from ...training.runs import RUN_COLUMNS, run_one

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
    run_rows = run_one(run_cfg, manifest, mixture, seed, data_seed, out_dir, progress=progress, default_eval=False,
                       role=role, experiment=experiment, train=train)
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


# --------------------------------------------------------------------------------------------
# tables (Tables 2, 16, 17)
# --------------------------------------------------------------------------------------------
#: table -> (displayed metric, metric whose test marks significance, "best" rule, caption)
TABLES: dict[str, tuple[str, str, str, str]] = {
    "table2": ("maxskew_mean", "maxskew_mean", "min",
               "Table 2. Mean of MaxSkew@K for pre-trained and debiased variants, estimated by withholding "
               "counterfactual sets for 20% of the occupations."),
    "table16": ("ndkl_mean", "ndkl_mean", "min",
                "Table 16. Mean of NDKL for pre-trained and debiased variants, estimated by withholding "
                "counterfactual sets for 20% of the occupations."),
    "table17": ("bias_mean", "absbias_mean", "abs",
                "Table 17. Bias@K for pre-trained and debiased variants, estimated by withholding counterfactual "
                "sets for 20% of the occupations (segments with gender; positive = male)."),
}
for _dataset, _name in (("visogender", "VisoGender"), ("pata", "PATA")):
    TABLES[f"table3_{_dataset}"] = (
        f"{_dataset}_maxskew", f"{_dataset}_maxskew", "min",
        f"Table 3 ({_name}). Mean MaxSkew@K on {_name} of the pre-trained and debiased models (§5.3; debiased on "
        "each segment's counterfactual sets).")
ATTRIBUTE_LABELS = {"physical": "Physical Char.", "race": "Race", "gender": "Gender"}
MIXTURE_LABELS = {PRETRAINED: "Pre-trained", DEBIASED: "Debiased"}
NOTE = ("Mean over seeds with the sample standard deviation as subscript; the better of pre-trained / debiased in "
        "bold (lower; for Bias@K closer to 0); underlined: debiased significantly below pre-trained (one-tailed "
        "t-test over seeds; for Bias@K on the mean |Bias@K|).")


def segment_label(segment: str) -> str:
    """``race_gender`` -> ``(Race, Gender)`` (Table 2's row names)."""
    return "(" + ", ".join(ATTRIBUTE_LABELS.get(p, p.capitalize()) for p in str(segment).split("_")) + ")"


@dataclasses.dataclass
class DebiasTable:
    name: str
    caption: str
    segments: list[str]
    roles: list[str]
    role_labels: dict[str, str]
    cells: dict[tuple[str, str, str], Any]   # (segment, role, mixture) -> tables.Cell
    decimals: int = 2
    std_decimals: int = 2


def build_tables(summary: pd.DataFrame, *, roles: Sequence[str] | None = None, segments: Sequence[str] | None = None,
                 role_labels: Mapping[str, str] | None = None, decimals: int = 2,
                 std_decimals: int = 2) -> dict[str, DebiasTable]:
    """Tables 2, 16 and 17 from a stats summary of debiasing runs (rows: segments; columns: model × pre-trained /
    debiased). A table with no row in the summary is left out (Table 17 without a gender segment)."""
    from ...tables import Cell

    need = {"experiment", "metric", "mixture", "mean", "std", "n", "significant"}
    missing = sorted(need - set(summary.columns))
    if missing:
        raise ConfigError(f"summary: missing column(s) {', '.join(missing)}. Fix: pass the CSV of 'stats summarize' "
                          "(or 'debias-table --runs')")
    df = summary.copy()
    parsed = []
    for e in df["experiment"].astype(str):
        try:
            parsed.append(parse_experiment(e))
        except ValueError as exc:
            raise ConfigError(f"summary: {exc}. Fix: summarize the runs of 'counterfactory social debias-run'") \
                from exc
    df["role"], df["segment"] = [p[0] for p in parsed], [p[1] for p in parsed]
    if "alternative" not in df.columns:
        df["alternative"] = "less"
    role_order = list(roles or dict.fromkeys(df["role"]))
    seg_order = list(segments or dict.fromkeys(df["segment"]))
    labels = {r: (role_labels or {}).get(r, r) for r in role_order}
    out: dict[str, DebiasTable] = {}
    for name, (metric, test_metric, best_rule, caption) in TABLES.items():
        sel = df[df["metric"] == metric]
        if sel.empty:
            continue
        tested = df[(df["metric"] == test_metric) & (df["mixture"] == DEBIASED)]
        cells: dict[tuple[str, str, str], Any] = {}
        for row in sel.itertuples(index=False):
            if row.mixture not in MIXTURE_LABELS or row.role not in labels or row.segment not in seg_order:
                continue
            sig = False
            if row.mixture == DEBIASED:
                t = tested[(tested["experiment"] == row.experiment)]
                if len(t):
                    if str(t["alternative"].iloc[0]) != "less":
                        log.warning("%s %s: the test is 'greater'; debiasing is tested with alternative 'less' "
                                    "(not marked)", row.experiment, test_metric)
                    else:
                        sig = bool(t["significant"].iloc[0])
            cells[(row.segment, row.role, row.mixture)] = Cell(float(row.mean), float(row.std), int(row.n), sig)
        for seg in seg_order:
            for role in role_order:
                pair = [cells.get((seg, role, m)) for m in MIXTURE_LABELS]
                if any(c is None for c in pair):
                    continue
                score = [round(abs(c.mean) if best_rule == "abs" else c.mean, decimals) for c in pair]
                for c, s in zip(pair, score):
                    c.best = s == min(score)
        segs = [s for s in seg_order if any(k[0] == s for k in cells)]
        if segs:
            out[name] = DebiasTable(name, caption, segs, role_order, labels, cells, decimals, std_decimals)
    if not out:
        raise ConfigError(f"summary: none of the metrics {', '.join(t[0] for t in TABLES.values())}. Fix: summarize "
                          "the metrics.csv rows of 'counterfactory social debias-run'")
    return out


def _columns(table: DebiasTable) -> list[tuple[str, str]]:
    return [(role, m) for role in table.roles for m in MIXTURE_LABELS]


def render_markdown(table: DebiasTable) -> str:
    from ...tables import _escape_md, cell_markdown, markdown_table

    header = ["Intersectional Bias"] + [f"{_escape_md(table.role_labels[r])} {MIXTURE_LABELS[m]}"
                                        for r, m in _columns(table)]
    rows = [[segment_label(seg)] + [cell_markdown(table.cells.get((seg, r, m)), table.decimals, table.std_decimals)
                                    for r, m in _columns(table)] for seg in table.segments]
    frame = pd.DataFrame(rows, columns=range(len(header)), dtype=object)
    frame.columns = header
    body = markdown_table(frame, ["left"] + ["center"] * (len(header) - 1))
    return f"**{table.caption}**\n\n{body}\n\n{NOTE}\n"


def render_latex(table: DebiasTable) -> str:
    """Booktabs LaTeX with a two-level header (model, then Pre-trained / Debiased) as in the paper."""
    from ...tables import cell_latex, escape_tex

    cols = pd.MultiIndex.from_tuples([("", "Intersectional Bias")] + [
        (escape_tex(table.role_labels[r]), MIXTURE_LABELS[m]) for r, m in _columns(table)])
    data = [[escape_tex(segment_label(seg))] + [cell_latex(table.cells.get((seg, r, m)), table.decimals,
                                                           table.std_decimals) for r, m in _columns(table)]
            for seg in table.segments]
    frame = pd.DataFrame(data, columns=cols, dtype=object)
    latex = frame.style.hide(axis="index").to_latex(
        column_format="l" + "c" * (len(cols) - 1), position="t", position_float="centering", hrules=True,
        multicol_align="c", caption=escape_tex(table.caption), label=f"tab:debias-{table.name}")
    return "% requires \\usepackage{booktabs}\n" + latex


def tables_frame(tables: Mapping[str, DebiasTable]) -> pd.DataFrame:
    """Long CSV form: one row per (table, segment, model, mixture) with mean, std, n, best and significant."""
    from ...tables import cell_plain

    rows = []
    for t in tables.values():
        for seg in t.segments:
            for role, m in _columns(t):
                c = t.cells.get((seg, role, m))
                rows.append({"table": t.name, "segment": seg, "row": segment_label(seg), "model": role,
                             "label": t.role_labels[role], "mixture": m,
                             "mean": c.mean if c else math.nan, "std": c.std if c else math.nan,
                             "n": c.n if c else 0, "best": bool(c and c.best), "significant": bool(c and c.significant),
                             "cell": cell_plain(c, t.decimals, t.std_decimals)})
    return pd.DataFrame(rows, columns=["table", "segment", "row", "model", "label", "mixture", "mean", "std", "n",
                                       "best", "significant", "cell"])


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def add_cli(sub) -> None:
    """``counterfactory social debias-split | debias-run | debias-table``."""
    p = sub.add_parser("debias-split", help="withhold 20%% of the occupations; training manifests per segment (§5.1)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--config", action="append", required=True, metavar="FILE", help="config file (repeatable)")
    p.add_argument("--images", required=True, metavar="FILE.parquet", help="kept-images table")
    p.add_argument("--segment", action="append", metavar="NAME", help="only these segments (default debias.segments)")
    p.add_argument("--out-dir", required=True, metavar="DIR",
                   help="writes <segment>.parquet manifests, subjects.csv and summary.csv")
    p.set_defaults(func=_cmd_split)

    r = sub.add_parser("debias-run", help="fine-tune one model on one segment (§8.2) and probe the withheld subjects")
    r.add_argument("--config", action="append", required=True, metavar="FILE", help="config file (repeatable)")
    r.add_argument("--role", required=True, metavar="ROLE", help="model role to fine-tune / evaluate")
    r.add_argument("--segment", required=True, metavar="NAME", help="segment (race_gender, physical_gender, ...)")
    r.add_argument("--manifest", metavar="FILE.parquet", help="the segment's training manifest (debias-split)")
    r.add_argument("--test-subjects", required=True, metavar="FILE",
                   help="subjects.csv of debias-split (its test rows) or a .txt list, one subject per line")
    r.add_argument("--images", required=True, metavar="FILE.parquet", help="kept-images table")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--data-seed", type=int, required=True)
    r.add_argument("--out-dir", required=True, metavar="DIR")
    r.add_argument("--no-train", action="store_true", help="evaluate the pre-trained model (the 'Pre-trained' rows)")
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(func=_cmd_run)

    t = sub.add_parser("debias-table", help="Tables 2, 16, 17 (mean ± std over seeds, pre-trained vs debiased)")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--summary", metavar="CSV", help="summary of 'stats summarize --baseline pretrained "
                                                      "--alternative less'")
    src.add_argument("--runs", metavar="CSV", help="runs table (collected metrics.csv); summarized here")
    t.add_argument("--alpha", type=float, default=0.05, help="with --runs: significance level")
    t.add_argument("--role", action="append", metavar="ROLE", help="column order (default: as in the summary)")
    t.add_argument("--label", action="append", default=[], metavar="ROLE=NAME", help="display name of a role")
    t.add_argument("--out-md", metavar="FILE.md")
    t.add_argument("--out-tex", metavar="FILE.tex")
    t.add_argument("--out-csv", metavar="FILE.csv")
    t.add_argument("--decimals", type=int, default=2)
    t.set_defaults(func=_cmd_table)


def _cmd_split(args) -> int:
    from ...config import load_config

    cfg = load_config(args.config, study="social_counterfactuals")
    opts = settings(cfg)
    frame = probing.read_images_table(args.images)
    split = split_subjects(frame["subject"].astype(str), opts["withheld_fraction"], opts["random_state"])
    summary = write_manifests(args.images, split, args.segment or opts["segments"], args.out_dir,
                              val_fraction=opts["val_fraction"], random_state=opts["random_state"])
    print(summary.to_string(index=False))
    return 0


def _cmd_run(args) -> int:
    from ...config import load_config

    cfg = load_config(args.config, study="social_counterfactuals")
    rows = debias_run(cfg, args.role, args.segment, args.manifest, args.test_subjects, args.images, args.seed,
                      args.data_seed, args.out_dir, train=not args.no_train, progress=not args.no_progress)
    print(rows.to_string(index=False))
    return 0


def _cmd_table(args) -> int:
    from ...io import write_csv, write_text

    if not (args.out_md or args.out_tex or args.out_csv):
        raise ConfigError("debias-table: nothing to write. Fix: pass --out-md, --out-tex and/or --out-csv")
    if args.runs:
        from ...stats import read_runs

        summary = summarize(read_runs(args.runs), alpha=args.alpha, source=args.runs)
    else:
        from ...tables import read_summary

        summary = read_summary(args.summary)
    labels = {}
    for item in args.label:
        role, sep, name = item.partition("=")
        if not sep or not role or not name:
            raise ConfigError(f"--label {item!r}: expected ROLE=NAME (e.g. clip_train=CLIP)")
        labels[role] = name
    tables = build_tables(summary, roles=args.role, role_labels=labels, decimals=args.decimals,
                          std_decimals=args.decimals)
    if args.out_md:
        write_text(args.out_md, "\n".join(render_markdown(t) for t in tables.values()))
    if args.out_tex:
        write_text(args.out_tex, "\n".join(render_latex(t) for t in tables.values()))
    if args.out_csv:
        write_csv(args.out_csv, tables_frame(tables))
    return 0
