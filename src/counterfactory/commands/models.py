"""``counterfactory models``: build the offline tiny models (with a sha256 manifest); check that
configured roles are intact (manifest / HF-cache blob hashes) and load; convert original BLIP checkpoints; make a
fresh VSE++ folder; pin hub roles to their cached commits. This module is the command line only, declared as data
(``commands.Step``); the work is done by :mod:`counterfactory.models` (``tiny``, ``registry``, ``convert_blip``,
``convert_vsepp``, ``vsepp``, ``pins``)."""

from __future__ import annotations

import json

from ..config import load_config
from . import CONFIG, OUT, Param, Step, flag, registrar

# ------------------------------------------------------------------------------------------- handlers


def _build_tiny(args) -> int:
    from ..models import tiny
    from ..settings import config_value

    cfg = load_config(args.config)
    section = cfg.get("tiny_models", {})
    out_dir = args.out_dir or config_value(section, "tiny_models.out_dir")
    roles = args.role or section.get("roles") or sorted(tiny.builders())
    for role in roles:
        tiny.build(role, out_dir, seed=config_value(section, "tiny_models.seed"), force=args.force)
    return 0


def _check(args) -> int:
    """Verify each role's files (manifest / HF-cache blob names), then load it; report every failure."""
    from ..models import registry

    cfg = load_config(args.config)
    failures = registry.check_roles(cfg, args.role or sorted(cfg["models"]), use_cache=args.trust_cache)
    print(json.dumps(registry.loaded_models(), indent=2))
    if failures:
        raise registry.ModelIntegrityError(
            f"models check: {len(failures)} problem(s):\n  " + "\n  ".join(failures))
    return 0


def _convert_blip(args) -> int:
    from ..models import convert_blip

    base = args.base or convert_blip.HUB_BASES[args.kind]
    out = convert_blip.convert(args.checkpoint, args.kind, args.out, base, image_size=args.image_size)
    print(f"wrote {out} ({convert_blip.CLASSES[args.kind]} from {args.checkpoint})")
    return 0


def _build_vsepp(args) -> int:
    from ..data.karpathy import training_captions
    from ..models import vsepp

    captions = training_captions(args.captions)
    imagenet = None if args.imagenet_weights == "none" else args.imagenet_weights
    out = vsepp.build(args.out, captions, backbone=args.backbone, imagenet=imagenet, seed=args.seed,
                      min_count=args.min_count, embed_size=args.embed_size, word_dim=args.word_dim,
                      bidirectional=args.bidirectional, finetune_cnn=args.finetune_cnn, margin=args.margin,
                      max_violation=not args.sum_of_hinges)
    model_cfg = vsepp.load(out)[0].config
    print(f"wrote {out} (VSE++ {model_cfg.backbone}, CNN {model_cfg.backbone_init}, {model_cfg.vocab_size} words)")
    return 0


def _convert_vsepp(args) -> int:
    from ..models import convert_vsepp

    out, cfg = convert_vsepp.convert(args.checkpoint, args.vocab, args.out)
    gru = "bidirectional GRU" if cfg.bidirectional else "GRU"
    print(f"wrote {out} (VSE++ {cfg.backbone}, {gru}, {cfg.vocab_size} words, joint space {cfg.embed_size}, "
          f"from {args.checkpoint})")
    return 0


def _pin(args) -> int:
    """Print each hub role's cached commit; write the overlay with --out. Exit 1 when a role has none."""
    from ..io import write_text
    from ..models import pins

    cfg = load_config(args.config)
    rows, skipped = pins.pins(cfg, roles=args.role)
    print(pins.table(rows))
    for line in skipped:
        print(f"not pinned: {line}")
    text = pins.overlay_text(rows, " ".join(args.config))
    if args.out:
        write_text(args.out, text)
        print(f"wrote {args.out} ({sum(r.ok for r in rows)} of {len(rows)} hub roles pinned)")
    else:
        print(text, end="")
    missing = [r for r in rows if not r.ok]
    if missing:
        print(f"{len(missing)} hub role(s) without a cached commit ({', '.join(r.role for r in missing)}): run the "
              "`hf download` shown for each, then `counterfactory models pin` again")
        return 1
    return 0


# ------------------------------------------------------------------------------------------- declarations

#: ``--out`` of the steps that write a model folder (convert-blip, convert-vsepp, build-vsepp): replaced atomically,
#: with a sha256 manifest (:func:`counterfactory.models.identity.save_with_manifest`)
MODEL_OUT = OUT.but(metavar=None, help="folder to write (replaced atomically if it exists)")

BUILD_TINY = Step(
    "build-tiny", help="build small random models of the real classes (offline demo)",
    description="Reads the config's tiny_models section; writes one small random-weight model folder per role (the "
                "real library classes, with a sha256 manifest) under tiny_models.out_dir. Needs no network.",
    params=(CONFIG,
            Param("--role", action="append", help="role to build (repeatable; default: all with a builder)"),
            Param("--out-dir", help="default: tiny_models.out_dir from config"),
            flag("--force", "rebuild even if the folder exists")),
    run=_build_tiny)

CHECK = Step(
    "check", help="verify each configured role's files, then load it with its library's loader",
    description="Reads the config's models section and each role's files (local folder or the Hugging Face cache); "
                "writes nothing, prints one line per role and the loaded models' identities as JSON, and for a "
                "missing role how to get it.",
    params=(CONFIG,
            Param("--role", action="append", help="role to check (repeatable; default: all configured)"),
            flag("--trust-cache", "take file hashes from the hash cache when size/mtime/inode are unchanged (fast; "
                                  "default re-reads every file so silent corruption is found)")),
    run=_check)

CONVERT_BLIP = Step(
    "convert-blip", help="convert an original BLIP checkpoint (model_base*.pth) to a transformers folder",
    description="Reads an original salesforce/BLIP checkpoint (e.g. the pre-trained model_base.pth or "
                "model_base_capfilt_large.pth) and the config and processor of --base; writes a transformers folder "
                "(BlipForImageTextRetrieval for --kind itm, BlipForConditionalGeneration for --kind captioning) "
                "with its processor and a sha256 manifest naming the source checkpoint, atomically. Keys the class "
                "has no place for, or weights the checkpoint lacks, are an error naming them.",
    params=(Param("--checkpoint", required=True, help="original BLIP .pth file ({'model': state_dict})"),
            Param("--kind", required=True, choices=("itm", "captioning"),
                  help="itm: image-text retrieval model (ITC + ITM heads); captioning: image-to-text decoder"),
            MODEL_OUT,
            Param("--base", default=None,
                  help="transformers BLIP folder or hub id giving the config and processor (default: "
                       "Salesforce/blip-itm-base-coco for itm, Salesforce/blip-image-captioning-base for "
                       "captioning; only their config and processor are used, not their weights)"),
            Param("--image-size", type=int, default=None,
                  help="input resolution of the converted model (default: the checkpoint's own, 224 for the "
                       "pre-training checkpoints); another size resizes the position embeddings bicubically, as "
                       "BLIP does when it loads a checkpoint at another size")),
    run=_convert_blip)

CONVERT_VSEPP = Step(
    "convert-vsepp", help="convert a published VSE++ checkpoint (model_best.pth.tar) to a VSE++ folder",
    description="Reads a checkpoint of the original VSE++ release (Faghri et al. 2018; runs.tar of "
                "http://www.cs.toronto.edu/~faghri/vsepp/, a full-image VGG19 or ResNet-152 run) and its "
                "vocabulary (vocab.tar: vocab/<data>_vocab.pkl); writes a VSE++ folder (config.json, "
                "model.safetensors, vocab.json, a sha256 manifest naming both sources) atomically, for a role with "
                "library vsepp. Neither file can run code when read. See docs/models.md#vse.",
    params=(Param("--checkpoint", required=True,
                  help="the release's model_best.pth.tar (or checkpoint.pth.tar)"),
            Param("--vocab", required=True,
                  help="the vocabulary the run was trained with: vocab/coco_vocab.pkl or vocab/f30k_vocab.pkl (or "
                       "a JSON word -> id mapping)"),
            MODEL_OUT),
    run=_convert_vsepp)

BUILD_VSEPP = Step(
    "build-vsepp", help="make a fresh VSE++ model folder (vocabulary from the training captions)",
    description="Reads the training captions and torchvision's ImageNet weights file of the CNN (from torch hub's "
                "checkpoint folder unless --imagenet-weights names it; nothing is downloaded); writes a VSE++ "
                "folder (config.json, model.safetensors, vocab.json, a sha256 manifest) atomically, for a role "
                "with library vsepp to train from. See docs/models.md#vse.",
    params=(Param("--captions", required=True,
                  help="training captions: a Karpathy split file (.json; its train and restval captions), a CSV / "
                       "parquet table with a caption column (a split column keeps its train rows), or a text file "
                       "with one caption per line"),
            MODEL_OUT,
            Param("--backbone", choices=("resnet152", "vgg19", "tiny"), default="resnet152",
                  help="image CNN (default resnet152, VSE++'s best; the spurious-retrieval paper §4.1 names "
                       "vgg19)"),
            Param("--imagenet-weights", default="auto",
                  help="torchvision ImageNet weights file of the CNN: auto (torch hub's checkpoint folder, e.g. "
                       "~/.cache/torch/hub/checkpoints/resnet152-394f9c45.pth), a path, or none (random CNN)"),
            flag("--bidirectional",
                 "a bidirectional GRU (the final states of both directions averaged; §4.1's Bi-GRU)"),
            flag("--finetune-cnn",
                 "train the CNN too (default: frozen, only the projection and the text encoder learn)"),
            Param("--min-count", type=int, default=4, help="keep words seen at least this often (VSE++: 4)"),
            Param("--embed-size", type=int, default=1024, help="joint space size (VSE++: 1024)"),
            Param("--word-dim", type=int, default=300, help="word embedding size (VSE++: 300)"),
            Param("--margin", type=float, default=0.2, help="triplet loss margin (VSE++: 0.2)"),
            flag("--sum-of-hinges",
                 "train with the sum of hinges over all negatives (VSE0) instead of the hardest negative"),
            Param("--seed", type=int, default=0, help="seed of the random initial weights")),
    run=_build_vsepp)

PIN = Step(
    "pin", help="pin each hub role to the commit the local Hugging Face cache holds",
    description="Reads the config's models section and the local Hugging Face cache (refs/main and snapshot "
                "folders; nothing is downloaded) and prints, per hub role, its repository and cached commit, or the "
                "`hf download` command for a role that is not cached. With --out, writes the config overlay "
                "`models: {<role>: {revision: <commit>}}` (atomically) to pass after the config. A role that "
                "already pins a revision keeps it. Exit status 1 when a hub role has no cached commit.",
    params=(CONFIG,
            Param("--role", action="append", help="role to pin (repeatable; default: every hub role)"),
            Param("--out", metavar="YAML", help="overlay file to write (default: print it)")),
    run=_pin)

MODELS = Step(
    "models", help="model roles: build tiny offline stand-ins, check loading",
    description="Model roles: build the offline tiny models (with a sha256 manifest) and check that the configured "
                "roles are intact (manifest / Hugging Face cache blob hashes) and load; a role that is missing says "
                "where to get it; convert original BLIP checkpoints to transformers folders.",
    steps=(BUILD_TINY, CHECK, CONVERT_BLIP, CONVERT_VSEPP, BUILD_VSEPP, PIN))

register = registrar(MODELS)
