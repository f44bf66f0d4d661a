"""One CVLD run (a task, a setting, a variant and a seed) trained and evaluated; its ``metrics.csv`` is a runs table
(``experiment, mixture, seed, data_seed, metric, value``) for ``counterfactory stats summarize``.

* **classification** (§4.2, §5.2, Table 1): per CelebA attribute, a K-shot episode (``seed`` = episode) of the
  training split, deep prompts trained on Eq. 3 with the counterfactual of each image that has one (``cvld``,
  λ = 1) or without (``base``), then AP, mAcc, DEO and ΔAcc on the test split with the threshold calibrated on the
  validation split (appendix A). ``pretrained`` scores the class prompts with BLIP as it is (BLIP^PT).
* **retrieval** (§4.3, §5.3, Tables 2-3): BLIP fine-tuned on a COCO subset (``coco10`` = 10 %) with the Table 3
  variant's losses; Bias@K and MaxSkew@K on FairFace, Rec@1 and mRec on the COCO and Flickr30K test splits.
* **captioning** (§4.4, §5.4, Table 4): BLIP's captioner fine-tuned on Eq. 9; BLEU-4, CIDEr (SPICE where its Java
  jars are installed), gender error, BiasAmp and LIC on the COCO test split. LIC is Hirota et al.'s LIC_M − LIC_D
  on gender-balanced splits (:mod:`.leakage`; ``LIC_M`` and ``LIC_D`` are kept as rows) unless ``captioning.lic``
  is ``leakage``; the row ``LIC/definition=<name>`` records which, and ``LIC/classifier=<bert|tfidf>`` the
  amplification LIC's classifier (``captioning.lic_classifier``: Hirota et al.'s fine-tuned BERT, the ``lic_bert``
  role, or TF-IDF + logistic regression).

``balanced`` (BLIP^Bal) downsamples the training images so both genders are equally frequent
(:func:`counterfactory.training.cvld.balanced_subset`; images whose captions name no gender stay).

§5.1 keeps the top k = 3 of m = 10 edits per example and adds the edited pairs to the training set
(``editing.per_example: all_kept``): a COCO image's caption rows take its k kept edits (``editing.train_method``) in
turn (:func:`spread`), so every kept edit is trained on and no original caption is repeated; ``one_per_seed`` (ours,
former default) gives every row of an image the one edit drawn by a hash of (seed, item id). A CelebA image has one
row (no captions), so classification trains on the drawn edit of its episode seed in both settings.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ...data import celeba, fairface
from ...errors import ConfigError, input_error
from ...io import write_csv
from ...metrics import captioning, ranking_from_scores
from ...metrics.captioning import caption_bias_amplification, gender_error, gender_from_references, lic
from ...models import registry
from . import data
from .data import nocaps, unit_hash
from .leakage import bert_options, lic_amplification
from .settings import FULL, hires, lambda_of, rerank_depth, settings, split_setting, subset_name

log = logging.getLogger(__name__)

RUN_COLUMNS = ["experiment", "mixture", "seed", "data_seed", "metric", "value"]
ROLES = {"classification": "itm_blip", "retrieval": "itm_blip", "captioning": "captioner_pretrained"}
#: ours: the leakage classifier's split needs a few captions of each gender
MIN_LIC_PER_GENDER = 10
#: metric row recording which LIC a result reports (``captioning.lic``)
LIC_RECORD = "LIC/definition="
#: the row recording the amplification LIC's classifier (``captioning.lic_classifier``: bert or tfidf)
LIC_CLASSIFIER_RECORD = "LIC/classifier="


def counterfactual_files(manifests) -> dict[str, list[str]]:
    """item id -> the paths of its kept edits, best first, from edit manifests: a method's merged ``edits.parquet``
    (paths ``<shard>/<file>``) or its shard manifests (``<shard>/shard.parquet``, paths ``<file>``); a path is read
    relative to its manifest's folder and may not leave it."""
    out: dict[str, list[str]] = {}
    for path in manifests:
        frame = pd.read_parquet(path)
        kept = frame[frame["kept"]].sort_values(["item_id", "rank"], kind="stable")
        base = Path(path).parent
        for item, part in kept.groupby("item_id", sort=False):
            out[str(item)] = [p if Path(p).is_absolute() else str(base / _inside(path, p)) for p in part["path"]]
    return out


def _inside(manifest, p: str) -> Path:
    rel = Path(p)
    if ".." in rel.parts:
        raise ConfigError(f"{manifest}: edit path {p!r} leaves the manifest's folder. Fix: rebuild the manifest "
                          "with `counterfactory cvld edit` / `cvld edit-merge`")
    return rel


def pick(files: dict[str, list[str]], item_id: str, seed: int) -> str:
    """The counterfactual of ``item_id`` a run with ``seed`` trains on ("" when it has none)."""
    options = files.get(item_id) or []
    return options[int(unit_hash(f"{seed}:{item_id}") * len(options))] if options else ""


def spread(files: dict[str, list[str]], item_ids, seed: int) -> list[str]:
    """The counterfactual of each row of an image's rows (``item_ids`` in row order, one row per caption) when every
    kept edit is used (``editing.per_example: all_kept``, §5.1): the image's rows take its k kept edits in turn,
    starting from :func:`pick`'s choice for ``seed``, so all k edits enter the training set and no caption is
    repeated ("" where the image has none)."""
    out, seen = [], {}
    for item in item_ids:
        options = files.get(item) or []
        j = seen.get(item, 0)
        seen[item] = j + 1
        if not options:
            out.append("")
            continue
        start = int(unit_hash(f"{seed}:{item}") * len(options))
        out.append(options[(start + j) % len(options)])
    return out


def _train_settings(s: dict, task: str, variant: str, seed: int, progress: bool):
    from ...training.cvld import CVLDSettings

    section = dict(s[task]["train"])
    section["lam"] = lambda_of(s, task, variant)
    # Table 3's loss variants are retrieval's; BLIP^Bal changes the data, not the loss
    section["variant"] = variant if task == "retrieval" and variant != "balanced" else "base"
    try:
        return CVLDSettings.for_task(task, **section, seed=int(seed), progress=progress)
    except TypeError as exc:          # a key of cvld.<task>.train that the trainer does not know
        known = ", ".join(f for f in CVLDSettings.__dataclass_fields__ if f not in ("task", "seed", "progress"))
        raise ConfigError(f"cvld.{task}.train: {exc}. Fix: use only {known}") from None


def role_of(s: dict, task: str, setting: str) -> str:
    """The model role of a run: the task's, except Table 2's full-data row (``full-<size>``), which evaluates
    ``retrieval.hires.full_data_role`` (BLIP fine-tuned on all of COCO, as released)."""
    name, size = split_setting(setting)
    if task == "retrieval" and name == FULL and size is not None:
        h = hires(s)
        if not h or not h["full_data_role"]:
            raise ConfigError(f"cvld run --setting {setting}: retrieval.hires.full_data_role is not set. Fix: set it "
                              "(the paper config: itm_blip_coco) or drop the run")
        return str(h["full_data_role"])
    return ROLES[task]


def is_full_data(task: str, setting: str) -> bool:
    return task == "retrieval" and split_setting(setting)[0] == FULL


def _with_source(cfg, role: str, source) -> dict:
    out = copy.deepcopy(dict(cfg))
    out["models"] = dict(out["models"])
    out["models"][role] = {**out["models"][role], "source": str(source)}
    return out


def _rows(experiment: str, variant: str, seed: int, metrics: dict) -> pd.DataFrame:
    return pd.DataFrame([{"experiment": experiment, "mixture": variant, "seed": int(seed), "data_seed": int(seed),
                          "metric": k, "value": float(v)} for k, v in metrics.items()
                         if v is not None and np.isfinite(float(v))], columns=RUN_COLUMNS)


def run(cfg, task: str, setting: str, variant: str, seed: int, edits, out_dir, interventions=None,
        progress: bool = False) -> pd.DataFrame:
    """Train (unless ``pretrained``) and evaluate one run; writes ``out_dir/metrics.csv`` (and the task's detail
    tables) and returns the runs-table rows. ``edits``: the training edit manifests; ``interventions``: the
    caption interventions table (retrieval and captioning)."""
    s = settings(cfg)
    role = role_of(s, task, setting)
    if role not in (cfg.get("models") or {}):
        raise ConfigError(f"models.{role}: not configured. Fix: add the role under models (docs/studies/cvld.md)")
    out_dir = Path(out_dir)
    files = counterfactual_files(edits) if variant not in ("pretrained", "base", "balanced") else {}
    source = "the interventions table"
    if interventions is not None and not isinstance(interventions, pd.DataFrame):
        source = str(interventions)
        interventions = pd.read_parquet(interventions)
    if task != "classification" and interventions is None:
        raise ConfigError(f"cvld run --task {task}: no --interventions table. Fix: pass `cvld intervene --out-captions`")
    if task != "classification":
        check_splits(s, task, setting, variant, interventions, source)
    runner = {"classification": _classification, "retrieval": _retrieval, "captioning": _captioning}[task]
    metrics = runner(cfg, s, setting, variant, int(seed), files, out_dir, interventions, progress)
    rows = _rows(f"{task}_{setting}" if setting != "pt" else task, variant, seed, metrics)
    write_csv(out_dir / "metrics.csv", rows)
    return rows


def check_splits(s: dict, task: str, setting: str, variant: str, interventions: pd.DataFrame, source: str) -> None:
    """Before any model is loaded or trained: the COCO test split of ``interventions`` (the file ``source``) holds
    images, and so does the run's training subset (unless ``pretrained``); an empty one is an error naming the
    file and the split (it would otherwise fail only after training, at the evaluation)."""
    splits = interventions["split"].astype(str) if "split" in interventions.columns else pd.Series(dtype=str)
    counts = splits.value_counts().to_dict()
    found = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no rows"
    fix = ("rerun `cvld intervene` on a Karpathy file whose test and train splits both hold images (check "
           "cvld.data.coco.karpathy_json)")
    if not counts.get("test"):
        raise input_error(source, "split 'test'", f"no test captions for cvld run --task {task} to evaluate on "
                          f"(captions per split: {found})", fix)
    if variant == "pretrained" or is_full_data(task, setting):
        return
    fractions = {subset_name(f): f for f in s["data"]["subsets"]}
    train = interventions[splits == "train"]
    subset = split_setting(setting)[0]
    if subset in fractions:
        train = train[data.subset_of(train["image_id"], fractions[subset], s["data"]["subset_seed"])]
    if train.empty:
        raise input_error(source, "split 'train'", f"no training captions in the COCO subset {setting!r} "
                          f"(captions per split: {found})", fix)


# ---------------------------------------------------------------------------------------------- classification
def _classification(cfg, s, setting, variant, seed, files, out_dir, interventions, progress) -> dict:
    from ...evaluation.cvld import classification_metrics, classify_attributes
    from ...training.cvld import sample_episode, train_classification
    from ...training.cvld_losses import class_prompts
    from ...training.prompt_tuning import remove_prompts

    root = s["data"]["celeba"]["root"]
    if not root:
        raise ConfigError("cvld.data.celeba.root: not set. Fix: point it at the CelebA folder (docs/studies/cvld.md)")
    split = {name: celeba.load_celeba(root, name) for name in ("train", "valid", "test")}
    attributes = list(s["classification"]["attributes"])
    prompts = {a: tuple(reversed(class_prompts(a))) for a in attributes}      # (positive, negative)
    batch = int(s["classification"]["eval_batch_size"])
    model, processor = registry.load(cfg, "itm_blip")
    scores = {"valid": [], "test": []}
    history = []
    for a in attributes:
        if variant != "pretrained":
            if setting == FULL:                  # Table 1's full-data row: the whole training split
                episode, what = split["train"].copy(), "every image"
            else:
                k = int(setting.lstrip("k"))
                episode = sample_episode(split["train"], a, k, episode=seed, id_col="image_id")
                what = f"{k}-shot episode {seed}"
            episode = episode.assign(cf_image_path=[pick(files, f"celeba_{Path(str(i)).stem}", seed)
                                                    for i in episode["image_id"]], caption="", cf_caption="")
            episode.attrs["source"] = f"{root} (train split, {a}, {what})"
            result = train_classification(model, processor, episode, a,
                                          _train_settings(s, "classification", variant, seed, progress))
            history += [{"attribute": a, **h} for h in result.history]
        for name in scores:
            scores[name].append(classify_attributes(model, processor, split[name], [a], {a: prompts[a]}, head="itm",
                                                    batch_size=batch).set_index("image_id"))
        if variant != "pretrained":
            remove_prompts(model)
    table = classification_metrics(
        pd.concat(scores["test"], axis=1), split["test"].set_index("image_id")[attributes],
        split["test"][celeba.PROTECTED].to_numpy(), val_scores=pd.concat(scores["valid"], axis=1),
        val_labels=split["valid"].set_index("image_id")[attributes], attributes=attributes,
        n_resamples=s["classification"]["deo_resamples"])   # app. A: Ramaswamy et al.'s bootstrap median (0: point)
    write_csv(out_dir / "attributes.csv", table)
    if history:
        write_csv(out_dir / "history.csv", pd.DataFrame(history))
    mean = table[table["attribute"] == "mean"].iloc[0]
    out = {m: mean[m] for m in ("DEO", "ΔAcc", "AP", "mAcc")}
    out["deo_resamples"] = s["classification"]["deo_resamples"]
    out.update({f"DEO:{r.attribute}": r.DEO for r in table[table["attribute"] != "mean"].itertuples(index=False)})
    return out


# ---------------------------------------------------------------------------------------------- COCO tasks
def coco_training_table(s: dict, interventions: pd.DataFrame, setting: str, variant: str, seed: int,
                        files: dict) -> pd.DataFrame:
    """Training rows of a COCO subset: one per caption, with its image's counterfactual (the chosen edit and
    the caption's own intervention, the caption itself when it names no gender) where the image has one."""
    from ...training.cvld import balanced_subset

    fractions = {subset_name(f): f for f in s["data"]["subsets"]}
    subset = split_setting(setting)[0]
    if subset not in fractions:
        raise ConfigError(f"cvld: unknown COCO subset {setting!r}. Fix: use one of {', '.join(fractions)}")
    train = interventions[interventions["split"] == "train"]
    train = train[data.subset_of(train["image_id"], fractions[subset], s["data"]["subset_seed"])].copy()
    gender = train.groupby("image_id", sort=False)["caption"].agg(lambda c: gender_from_references(list(c)))
    train["gender"] = train["image_id"].map(gender).replace({"neutral": None})
    if variant == "balanced":
        images = train.drop_duplicates("image_id")[["image_id", "gender"]]
        keep = balanced_subset(images, "gender", seed=seed, id_col="image_id")["image_id"]
        train = train[train["image_id"].isin(set(keep))]
    items = [f"coco_{i}" for i in train["image_id"]]
    if s["editing"]["per_example"] == "all_kept":
        cf = spread(files, items, seed)
    else:
        cf = [pick(files, item, seed) for item in items]
    out = pd.DataFrame({"id": train["caption_id"].astype(str).to_numpy(), "image_path": train["image_path"],
                        "caption": train["caption"], "cf_image_path": cf,
                        "cf_caption": np.where(np.array(cf) != "", train["intervened"], ""),
                        "gender": train["gender"]})
    return out.reset_index(drop=True)


def with_caption_prompt(table: pd.DataFrame, prompt: str) -> pd.DataFrame:
    """Captioning training rows with BLIP's prompt before every caption and counterfactual caption (BLIP trains its
    captioner on prompt + caption and generates after the same prompt)."""
    if not prompt:
        return table
    out = table.copy()
    out["caption"] = prompt + out["caption"].astype(str)
    has_cf = out["cf_caption"].astype(str) != ""
    out.loc[has_cf, "cf_caption"] = prompt + out.loc[has_cf, "cf_caption"].astype(str)
    return out


def _test(interventions: pd.DataFrame) -> tuple[list[str], list[list[str]], list]:
    test = interventions[interventions["split"] == "test"]
    groups = test.groupby("image_id", sort=False)
    return [g["image_path"].iloc[0] for _, g in groups], [list(g["caption"]) for _, g in groups], list(groups.groups)


def _train_coco(cfg, s, task, setting, variant, seed, files, out_dir, interventions, progress):
    """(model, processor) of the run: trained on the subset, or BLIP as it is for ``pretrained``."""
    from ...training.cvld import train_captioning, train_retrieval

    from .resolution import set_resolution

    role = role_of(s, task, setting)
    size = image_size_of(s, task, variant, setting)
    model, processor = set_resolution(*registry.load(cfg, role), size)
    if variant == "pretrained" or is_full_data(task, setting):   # evaluated as it is
        return model, processor
    table = coco_training_table(s, interventions, setting, variant, seed, files)
    if task == "captioning":
        table = with_caption_prompt(table, s["captioning"]["prompt"])
    table.attrs["source"] = f"COCO {setting} training captions"
    settings = _train_settings(s, task, variant, seed, progress)
    if task == "captioning":   # the prompt's tokens are context, not targets (BLIP's captioning fine-tuning)
        train_captioning(model, processor, table, settings, out_dir / "checkpoint", prompt=s["captioning"]["prompt"])
    else:
        train_retrieval(model, processor, table, settings, out_dir / "checkpoint")
    return set_resolution(*registry.load(_with_source(cfg, role, out_dir / "checkpoint"), role), size)


def image_size_of(s: dict, task: str, variant: str, setting: str = "") -> int | None:
    """Input size of a run (:mod:`.resolution`): the setting's (``coco10-384``: Table 2's subscripted rows), else
    the task's ``image_size``; Table 4's BLIP^PT keeps its own."""
    size = split_setting(setting)[1]
    if size is not None:
        return size
    if task == "captioning" and variant == "pretrained":
        return None
    return s[task]["image_size"]


def _retrieval(cfg, s, setting, variant, seed, files, out_dir, interventions, progress) -> dict:
    from ...evaluation.cvld import (FAIRFACE_QUERIES, fairface_bias_table, fairface_similarity, maxskew_curve,
                                    retrieval_recall)

    # every evaluation input is read and checked before the model loads or trains (issue 45.19): a bad FairFace CSV
    # or Flickr30K file stops the run before a checkpoint is written
    ff = s["data"]["fairface"]
    faces = fairface.load_fairface(ff["root"], ff["split"]) if ff["root"] else None
    flickr = data.captions(s, "flickr30k") if s["data"]["flickr30k"]["karpathy_json"] else None
    model, processor = _train_coco(cfg, s, "retrieval", setting, variant, seed, files, out_dir, interventions,
                                   progress)
    from .resolution import current_size

    rv = s["retrieval"]
    batch = int(rv["eval_batch_size"])
    out: dict = {"image_size": current_size(model)} if model is not None else {}
    if faces is not None:
        depth = rv["fairface_rerank_k"]      # §4.3: ITC, then ITM re-ranks each query's shortlist (null: ITC only)
        sim = fairface_similarity(model, processor, faces, batch_size=batch, rerank_k=depth)
        if depth is not None:
            out["FairFace:rerank_k"] = min(int(depth), len(faces))   # the depth used (capped at the images)
        table = fairface_bias_table(sim, faces["gender"], FAIRFACE_QUERIES, ks=rv["fairface_ks"])
        write_csv(out_dir / "fairface.csv", table)
        for r in table[table["query"] == "mean"].itertuples(index=False):
            out[f"Bias@{r.k}"] = r.abs_bias
            out[f"MaxSkew@{r.k}"] = r.max_skew
        curve = maxskew_curve(sim, faces["gender"], [k for k in rv["curve_ks"] if k <= len(faces)])
        write_csv(out_dir / "maxskew_curve.csv", curve)
        out.update({f"MaxSkewCurve@{int(r.k)}": r.max_skew for r in curve.itertuples(index=False)})
        if rv["occupations"]:                 # Figure 5 right: "a photo of a doctor / nurse"
            occ = fairface_similarity(model, processor, faces, [f"a photo of a {o}" for o in rv["occupations"]],
                                      batch_size=batch, rerank_k=depth)
            out.update(occupation_shares(occ, faces["gender"], rv["occupations"], rv["curve_ks"]))
    for name, dataset, frame in (("COCO", "coco", interventions), ("Flickr30K", "flickr30k", flickr)):
        if frame is None:
            continue
        images, caps, _ = _test(frame)
        rec = retrieval_recall(model, processor, images, caps, rerank_k=rerank_depth(s, dataset), batch_size=batch)
        out[f"{name}:Rec@1"], out[f"{name}:mRec"] = rec["rec@1"], rec["mrec"]
        out[f"{name}:rerank_k"] = rec["rerank_k"]          # the depth used (capped at the test set's size)
    return out


def occupation_shares(similarity, genders, occupations, ks) -> dict[str, float]:
    """Figure 5 (right): ``MaleShare@K:<occupation>``, the percentage of men among the top K images of each
    occupation query (rows of ``similarity``; ties by image order), for every K up to the number of images."""
    male = np.array([str(g).strip().lower() == "male" for g in genders])
    out = {}
    for occupation, row in zip(occupations, np.asarray(similarity)):
        ranked = male[ranking_from_scores(row)]
        for k in ks:
            if int(k) <= len(ranked):
                out[f"MaleShare@{int(k)}:{occupation}"] = 100.0 * float(ranked[:int(k)].mean())
    return out


def _captioning(cfg, s, setting, variant, seed, files, out_dir, interventions, progress) -> dict:
    from ...evaluation.cvld import generate_captions

    nocaps_set = nocaps(s) if s["data"]["nocaps"]["annotations"] else None   # read before the model (issue 45.19)
    model, processor = _train_coco(cfg, s, "captioning", setting, variant, seed, files, out_dir, interventions,
                                   progress)
    from .resolution import current_size

    cp = s["captioning"]
    images, refs, ids = _test(interventions)
    preds = generate_captions(model, processor, images, batch_size=int(cp["eval_batch_size"]), prompt=cp["prompt"],
                              **cp["generate"])
    write_csv(out_dir / "captions.csv", pd.DataFrame({"image_id": ids, "caption": preds}))
    scores = captioning.coco_caption_scores(dict(zip(ids, refs)), dict(zip(ids, preds)))
    truth = [gender_from_references(r) for r in refs]
    out = {"BLEU-4": scores["BLEU-4"], "CIDEr": scores["CIDEr"], "SPICE": scores.get("SPICE"),
           "image_size": current_size(model)}
    if nocaps_set is not None:                    # Table 4's zero-shot nocaps columns (public validation split)
        n_images, n_refs, n_ids = nocaps_set
        n_preds = generate_captions(model, processor, n_images, batch_size=int(cp["eval_batch_size"]),
                                    prompt=cp["prompt"], **cp["generate"])
        write_csv(out_dir / "nocaps_captions.csv", pd.DataFrame({"image_id": n_ids, "caption": n_preds}))
        n_scores = captioning.coco_caption_scores(dict(zip(n_ids, n_refs)), dict(zip(n_ids, n_preds)))
        out["nocaps:CIDEr"], out["nocaps:SPICE"] = n_scores["CIDEr"], n_scores.get("SPICE")
    out["Error"] = gender_error(preds, truth)
    try:
        out["BiasAmp"] = caption_bias_amplification(refs, preds)
    except ValueError as exc:       # no object word both in gendered references and in gendered model captions
        log.warning("BiasAmp not defined on these captions (%s); left out of the run's metrics", exc)
    gendered = [i for i, g in enumerate(truth) if g != "neutral"]
    per_gender = pd.Series([truth[i] for i in gendered]).value_counts()
    if len(per_gender) < 2 or per_gender.min() < MIN_LIC_PER_GENDER:
        log.warning("LIC not computed: the leakage classifier needs at least %d test images of each gender whose "
                    "references name it (have %s)", MIN_LIC_PER_GENDER, per_gender.to_dict())
    elif cp["lic"] == "amplification":
        classifier = cp["lic_classifier"]
        bert = bert_options(cfg, cp, device=next(model.parameters()).device) if classifier == "bert" else None
        out.update(lic_amplification([preds[i] for i in gendered], [refs[i] for i in gendered],
                                     [truth[i] for i in gendered], seeds=range(int(cp["lic_seeds"])),
                                     classifier=classifier, bert=bert))
        out[LIC_CLASSIFIER_RECORD + classifier] = 1.0
        out[LIC_RECORD + "amplification"] = 1.0
    else:
        model_lic = lic([preds[i] for i in gendered], [truth[i] for i in gendered],
                        seeds=range(int(cp["lic_seeds"])))
        out["LIC"] = out["LIC_M"] = model_lic["lic"]
        out[LIC_RECORD + "leakage"] = 1.0
    return out
