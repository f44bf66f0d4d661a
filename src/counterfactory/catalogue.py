"""The data catalogue: every dataset the five studies read, named once, in the layout its download unpacks to.

A configuration names one ``data_root`` (paper config: ``data``; the offline demo: ``resources/demo``) and, under
``data:``, one entry per dataset whose ``root`` defaults to ``<data_root>/<folder>`` (:data:`DATASETS`). The studies'
path keys (``spurious_retrieval.data.coco.karpathy_json``, ``cvld.data.celeba.root``, ...) default to null and are
filled from the catalogue by :func:`resolve` when the configuration is validated, through the one table
:data:`BINDINGS`; a path a config sets explicitly wins (to point a single study elsewhere). Pointing one dataset
elsewhere for every study is one key: ``data.coco2014.root: /scratch/coco2014``.

docs/data.md shows the whole tree (written from this table by :func:`tree_markdown`; a test keeps them equal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any


@dataclass(frozen=True)
class Dataset:
    """One dataset of the catalogue: its folder under ``data_root``, what the folder holds (member name -> path
    inside it; a trailing ``/`` marks a folder), where it comes from, its size and licence, who reads it."""

    name: str
    folder: str
    members: dict[str, str]
    title: str
    source: str
    size: str
    licence: str
    studies: tuple[str, ...]
    notes: str = ""
    extra_tree: tuple[str, ...] = field(default=())


_COCO_CF, _SOCIAL, _CC, _SR, _CVLD = ("coco_counterfactuals", "social_counterfactuals", "countercurate",
                                      "spurious_retrieval", "cvld")

DATASETS: dict[str, Dataset] = {d.name: d for d in [
    Dataset("coco2014", "coco2014",
            {"images": "", "train2014": "train2014/", "val2014": "val2014/",
             "instances_train": "annotations/instances_train2014.json",
             "instances_val": "annotations/instances_val2014.json", "karpathy_json": "dataset_coco.json"},
            "MS-COCO 2014 with Karpathy's split",
            "train2014.zip, val2014.zip, annotations_trainval2014.zip from https://cocodataset.org; dataset_coco.json "
            "from Karpathy's caption_datasets.zip (cs.stanford.edu/people/karpathy/deepimagesent)",
            "19 GB", "annotations CC BY 4.0; images Flickr terms of use", (_COCO_CF, _CC, _SR, _CVLD),
            "the split file's `filepath` (train2014 / val2014) is read below this folder"),
    Dataset("coco2017", "coco2017",
            {"root": "", "val2017": "val2017/", "captions_val": "annotations/captions_val2017.json",
             "instances_val": "annotations/instances_val2017.json"},
            "MS-COCO 2017 validation", "val2017.zip and annotations_trainval2017.zip from https://cocodataset.org",
            "1 GB", "annotations CC BY 4.0; images Flickr terms of use", (_COCO_CF, _CC),
            "COCO-Counterfactuals' caption ids index val2017; SugarCrepe names val2017 images"),
    Dataset("flickr30k", "flickr30k",
            {"images": "flickr30k-images/", "karpathy_json": "dataset_flickr30k.json"},
            "Flickr30k with Karpathy's split",
            "flickr30k-images from the Flickr30k request form (shannon.cs.illinois.edu/DenotationGraph); "
            "dataset_flickr30k.json from Karpathy's caption_datasets.zip",
            "4.4 GB", "non-commercial research use (Flickr30k terms)", (_COCO_CF, _SOCIAL, _CC, _SR, _CVLD)),
    Dataset("flickr30k_entities", "flickr30k_entities",
            {"root": "", "sentences": "Sentences/", "annotations": "Annotations/"},
            "Flickr30k Entities (boxes and phrases)", "annotations.zip of https://github.com/BryanPlummer/"
            "flickr30k_entities (the images are Flickr30k's)", "0.2 GB", "annotations: see the repository; "
            "images: Flickr30k terms", (_CC, _SR)),
    Dataset("celeba", "celeba",
            {"root": "", "images": "img_align_celeba/", "attributes": "list_attr_celeba.txt",
             "partition": "list_eval_partition.txt"},
            "CelebA (aligned)", "https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html", "1.4 GB",
            "non-commercial research use (CelebA agreement)", (_CVLD,)),
    Dataset("fairface", "fairface",
            {"root": "", "val": "val/", "labels_val": "fairface_label_val.csv"},
            "FairFace (padding 1.25)", "fairface-img-margin125-trainval.zip and fairface_label_val.csv from "
            "https://github.com/joojs/fairface", "0.6 GB (val)", "CC BY 4.0", (_CVLD,)),
    Dataset("sugarcrepe", "sugarcrepe",
            {"root": "", "data": "data/"},
            "SugarCrepe", "the data/ folder of https://github.com/RAIVNLab/sugar-crepe (images: COCO 2017 val)", "3 MB",
            "MIT", (_CC,), "the seven category files in data/",
            tuple(f"data/{c}.json" for c in ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel",
                                              "swap_att", "swap_obj"))),
    Dataset("winoground", "winoground",
            {"examples": "examples.jsonl", "images": "images/"},
            "Winoground", "data/examples.jsonl and data/images.zip of https://huggingface.co/datasets/facebook/"
            "winoground (gated: accept its terms)", "0.4 GB", "Getty Images licence: research only", (_CC,)),
    Dataset("looktwice", "looktwice",
            {"dataset": "looktwiceqa_dataset.json", "images": "images/"},
            "PointQA LookTwice", "looktwiceqa_dataset.json of Mani et al. (arXiv:2011.13681) with its Visual "
            "Genome images", "1 GB", "Visual Genome CC BY 4.0", (_CC,)),
    Dataset("pata", "pata",
            {"files_list": "pata_fairness.files.lst", "captions_json": "pata_fairness.captions.json",
             "image_dir": "images/"},
            "PATA", "the PATA release (DeAR, CVPR 2023): the file list, captions and the images of its URL list",
            "0.5 GB", "see the release", (_SOCIAL,)),
    Dataset("visogender", "visogender",
            {"oo_tsv": "OO_Visogender_10052025.tsv", "op_tsv": "OP_Visogender_11012024.tsv", "image_dir": "images/"},
            "VisoGender", "the OO / OP TSVs of https://github.com/oxai/visogender and the images of their URLs",
            "0.1 GB", "see the release", (_SOCIAL,)),
    Dataset("nocaps", "nocaps",
            {"annotations": "nocaps_val_4500_captions.json", "images": "images/"},
            "nocaps validation", "nocaps_val_4500_captions.json and the Open Images validation images of "
            "https://nocaps.org", "1 GB", "annotations CC BY 2.0; images CC BY 2.0 (Open Images)", (_CVLD,)),
    Dataset("classification", "classification",
            {"root": ""},
            "zero-shot classification sets", "CIFAR-10 / CIFAR-100 (python versions, cs.toronto.edu/~kriz), Food-101 "
            "(ETH Zürich), Caltech-101 / -256 (data.caltech.edu), ImageNet ILSVRC-2012 val (image-net.org)",
            "8 GB", "per dataset (research use)", (_COCO_CF, _SOCIAL),
            "each set in the folder its archive unpacks to (below)",
            ("cifar-10-batches-py/", "cifar-100-python/", "food-101/", "caltech101/101_ObjectCategories/",
             "caltech256/256_ObjectCategories/", "imagenet/val/", "imagenet/LOC_synset_mapping.txt")),
    Dataset("releases", "releases",
            {"root": ""},
            "published releases of the studies' datasets", "the COCO-Counterfactuals and SocialCounterfactuals "
            "releases (Intel Labs, Hugging Face datasets Intel/coco-counterfactuals, Intel/SocialCounterfactuals)",
            "30 GB", "CC BY 4.0 (COCO-CF); see the release (SocialCF)", (_COCO_CF, _SOCIAL),
            "only when a study's release.root points here (off in the paper config)"),
    Dataset("models", "models",
            {"root": "", "negclip": "negclip.pth", "big_lama": "big-lama/",
             "blip_itm": "blip-base-pretrained-itm/", "vsepp": "vsepp-vgg19-coco/", "vsepp_f30k": "vsepp-vgg19-f30k/",
             "blip_captioner": "blip-base-capfilt-large-pretrained-captioning/"},
            "model weights that are files (not hub ids)", "NegCLIP, ALIP, LaCLIP, SLIP releases; LaMa's big-lama.pt; torchvision's Inception-v3 (FID / IS); "
            "BLIP's model_base.pth / model_base_capfilt_large.pth and VSE++ converted (docs/models.md)",
            "3 GB", "per model", (_COCO_CF, _SOCIAL, _SR, _CVLD),
            "docs/models.md gives each file's source and conversion command",
            ("alip/ALIP_YFCC15M_B32.pt", "laclip/laion400m_laclip.pt", "slip/slip_base_100ep.pt",
             "inception/inception_v3_google-0cc3c7bd.pth")),
]}


def data_root(cfg: dict) -> str:
    return str(cfg.get("data_root") or "data")


def dataset_root(cfg: dict, name: str) -> str:
    """The folder of dataset ``name``: ``data.<name>.root`` when set, else ``<data_root>/<folder>``."""
    entry = (cfg.get("data") or {}).get(name) or {}
    if entry.get("root"):
        return str(entry["root"])
    return str(PurePosixPath(data_root(cfg)) / DATASETS[name].folder)


def member(cfg: dict, name: str, part: str) -> str:
    """The path of one member of a dataset (``member(cfg, "coco2014", "karpathy_json")``)."""
    inside = DATASETS[name].members[part].rstrip("/")
    root = PurePosixPath(dataset_root(cfg, name))
    return str(root / inside) if inside else str(root)


def _m(name: str, part: str):
    return lambda cfg: member(cfg, name, part)


def _list(*parts: tuple[str, str]):
    return lambda cfg: [member(cfg, n, p) for n, p in parts]


#: study path key -> the catalogue member that fills it when the config leaves the key out (one table for every
#: study). A key set to a path keeps it; a key set to null stays null (that part is off, e.g. CVLD's zero-shot
#: Flickr30K columns). Retrieval sets name a ``dataset`` instead (:data:`RETRIEVAL_KEYS`); any other path may start
#: with a ``{dataset}`` placeholder (``{classification}/cifar-10-batches-py``, ``{models}/negclip.pth``).
BINDINGS: dict[str, Any] = {
    f"{_COCO_CF}.data.coco_root": _m("coco2017", "root"),
    f"{_SOCIAL}.probing.pata.files_list": _m("pata", "files_list"),
    f"{_SOCIAL}.probing.pata.captions_json": _m("pata", "captions_json"),
    f"{_SOCIAL}.probing.pata.image_dir": _m("pata", "image_dir"),
    f"{_SOCIAL}.probing.visogender.oo_tsv": _m("visogender", "oo_tsv"),
    f"{_SOCIAL}.probing.visogender.op_tsv": _m("visogender", "op_tsv"),
    f"{_SOCIAL}.probing.visogender.image_dir": _m("visogender", "image_dir"),
    f"{_CC}.data.entities_root": _m("flickr30k_entities", "root"),
    f"{_CC}.data.images": _m("flickr30k", "images"),
    f"{_CC}.benchmarks.looktwice.dataset": _m("looktwice", "dataset"),
    f"{_CC}.benchmarks.looktwice.images": _m("looktwice", "images"),
    f"{_CC}.benchmarks.sugarcrepe.root": _m("sugarcrepe", "root"),
    f"{_CC}.benchmarks.sugarcrepe.images": _m("coco2017", "val2017"),
    f"{_CC}.benchmarks.winoground.examples": _m("winoground", "examples"),
    f"{_CC}.benchmarks.winoground.images": _m("winoground", "images"),
    f"{_SR}.data.coco.karpathy_json": _m("coco2014", "karpathy_json"),
    f"{_SR}.data.coco.image_root": _m("coco2014", "images"),
    f"{_SR}.data.coco.instances": _list(("coco2014", "instances_train"), ("coco2014", "instances_val")),
    f"{_SR}.data.flickr30k.karpathy_json": _m("flickr30k", "karpathy_json"),
    f"{_SR}.data.flickr30k.image_root": _m("flickr30k", "images"),
    f"{_SR}.data.flickr30k.entities_root": _m("flickr30k_entities", "root"),
    f"{_CVLD}.data.celeba.root": _m("celeba", "root"),
    f"{_CVLD}.data.coco.karpathy_json": _m("coco2014", "karpathy_json"),
    f"{_CVLD}.data.coco.image_root": _m("coco2014", "images"),
    f"{_CVLD}.data.flickr30k.karpathy_json": _m("flickr30k", "karpathy_json"),
    f"{_CVLD}.data.flickr30k.image_root": _m("flickr30k", "images"),
    f"{_CVLD}.data.fairface.root": _m("fairface", "root"),
}

#: where retrieval sets (``{name, dataset, split, ks}``: ``karpathy_json`` and ``image_root`` from the dataset)
#: live in a study section (dotted, below the study); a list of sets or one
RETRIEVAL_KEYS = {_COCO_CF: ("training.eval.retrieval",), _SOCIAL: ("debias.task_eval.retrieval",),
                  _CC: ("training.retrieval",)}
_PLACEHOLDER = re.compile(r"^\{([a-z0-9_]+)\}(?=/|$)")


def _get(node: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def resolve_retrieval_set(cfg: dict, spec: dict) -> dict:
    """Fill ``karpathy_json`` / ``image_root`` of one retrieval set from its ``dataset`` (in place; returned)."""
    name = spec.get("dataset")
    if name in DATASETS:
        if spec.get("karpathy_json") is None:
            spec["karpathy_json"] = member(cfg, name, "karpathy_json")
        if spec.get("image_root") is None:
            spec["image_root"] = member(cfg, name, "images")
    return spec


def expand(cfg: dict, text: str) -> str:
    """``{dataset}/rest`` -> the dataset's folder / rest (``{data_root}`` too); any other text unchanged."""
    match = _PLACEHOLDER.match(text)
    if not match:
        return text
    name = match.group(1)
    if name == "data_root":
        base = data_root(cfg)
    elif name in DATASETS:
        base = dataset_root(cfg, name)
    else:
        return text
    return base + text[match.end():]


def _expand_all(cfg: dict, node: Any) -> Any:
    if isinstance(node, str):
        return expand(cfg, node)
    if isinstance(node, dict):
        for k, v in node.items():
            node[k] = _expand_all(cfg, v)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            node[i] = _expand_all(cfg, v)
    return node


def resolve(cfg: dict) -> dict:
    """Fill every study path key the config leaves out from the catalogue, fill retrieval sets from their dataset
    and expand ``{dataset}`` placeholders (in place; returns ``cfg``). Runs before the schema fills its defaults;
    idempotent (a filled key is a set key). Only study sections present in ``cfg`` are touched."""
    for dotted, make in BINDINGS.items():
        study, rest = dotted.split(".", 1)
        node = cfg.get(study)
        if not isinstance(node, dict):
            continue
        *parents, leaf = rest.split(".")
        for part in parents:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                node = None
                break
            node = child
        if node is not None and leaf not in node:
            node[leaf] = make(cfg)
    for study, keys in RETRIEVAL_KEYS.items():
        for key in keys:
            value = _get(cfg.get(study), key)
            for spec in (value if isinstance(value, list) else [value] if isinstance(value, dict) else []):
                if isinstance(spec, dict):
                    resolve_retrieval_set(cfg, spec)
    for key, value in cfg.items():
        if key == "models" and isinstance(value, dict):
            for entry in value.values():
                # a model folder from the catalogue is written as a path (./data/models/...), never a hub id
                if isinstance(entry, dict) and isinstance(entry.get("source"), str) and \
                        _PLACEHOLDER.match(entry["source"]):
                    path = expand(cfg, entry["source"])
                    entry["source"] = path if path.startswith(("/", "./", "../", "~")) else f"./{path}"
        if key not in ("data", "data_root"):
            cfg[key] = _expand_all(cfg, value)
    return cfg


def owner(cfg: dict, path: str) -> str | None:
    """The catalogue dataset whose folder holds ``path`` (None when none does): for grouping preflight's output."""
    best, length = None, -1
    p = PurePosixPath(str(path))
    for name in DATASETS:
        root = PurePosixPath(dataset_root(cfg, name))
        if (p == root or root in p.parents) and len(root.parts) > length:
            best, length = name, len(root.parts)
    return best


def tree_markdown() -> str:
    """The whole ``data/`` tree of the paper config with each dataset's source, size, licence and readers."""
    lines = ["```text", "data/                                   (data_root)"]
    for d in DATASETS.values():
        lines.append(f"├── {d.folder}/".ljust(40) + f"  data.{d.name}.root")
        entries = {m for m in d.members.values() if m} | set(d.extra_tree)
        members = sorted(m for m in entries if not (m.endswith("/") and any(o != m and o.startswith(m)
                                                                             for o in entries)))
        for i, m in enumerate(members):
            lines.append(("│   └── " if i == len(members) - 1 else "│   ├── ") + m)
    lines.append("```")
    lines += ["", "| dataset (`data.<name>`) | folder | what | source | size | licence | read by |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for d in DATASETS.values():
        what = d.title + (f" ({d.notes})" if d.notes else "")
        lines.append(f"| `{d.name}` | `{d.folder}/` | {what} | {d.source} | {d.size} | {d.licence} | "
                     f"{', '.join(d.studies)} |")
    return "\n".join(lines) + "\n"


DOC_BEGIN = "<!-- data tree: generated by counterfactory.catalogue.write_doc; do not edit by hand -->"
DOC_END = "<!-- end of the generated data tree -->"


def write_doc(path: str = "docs/data.md") -> str:
    """Replace the generated block of ``path`` with :func:`tree_markdown` (a test checks it is up to date)."""
    from pathlib import Path

    doc = Path(path)
    text = doc.read_text(encoding="utf-8")
    head, _, rest = text.partition(DOC_BEGIN)
    _, _, tail = rest.partition(DOC_END)
    new = f"{head}{DOC_BEGIN}\n{tree_markdown()}{DOC_END}{tail}"
    doc.write_text(new, encoding="utf-8")
    return new

