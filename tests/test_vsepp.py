"""VSE++ (Faghri et al. 2018), the triplet-loss model of the spurious-correlation retrieval paper (§4.1, Tables 1-2):
its hardest-negative loss, its folder (config.json, model.safetensors, vocab.json) through the registry, scoring
through the shared scorers and training through the shared trainer, on tiny dimensions."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from counterfactory import training
from counterfactory.errors import ConfigError, ModelLoadError
from counterfactory.models import registry, vsepp
from counterfactory.training import model as model_mod
from counterfactory.training import vsepp_loss

pytestmark = pytest.mark.usefixtures("one_thread")

ROLE = "vsepp"
# three pairs, image i matches caption i; with one-hot images the score matrix s(image, caption) is SCORES itself
SCORES = torch.tensor([[0.80, 0.10, 1.00],
                       [0.50, 1.00, 0.00],
                       [0.95, 0.70, 0.60]])
IMAGES = torch.eye(3)
TEXTS = SCORES.T.contiguous()


@pytest.fixture(scope="module")
def tiny_vsepp(tmp_path_factory):
    from counterfactory.models.tiny import build_vsepp

    out = tmp_path_factory.mktemp("vsepp") / ROLE
    build_vsepp(out)
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from counterfactory.testing import pair_images

    root = tmp_path_factory.mktemp("imgs")
    return root, pair_images(root, ["red", "green", "blue", "yellow"], step=60)


def cfg_of(path):
    return {"models": {ROLE: {"source": str(path)}}}


def images_of(root, frame):
    return [Image.open(root / p).convert("RGB") for p in frame["image_path"]]


# --------------------------------------------------------------------------- the loss

def test_max_of_hinges_equals_the_hand_computation_and_differs_from_the_sum():
    # caption hinges [0.2 + s(i, c') - s(i, c)]_+ per image row: row 0 {0, 0.4}, row 1 {0, 0}, row 2 {0.55, 0.3}
    # image hinges [0.2 + s(i', c) - s(i, c)]_+ per caption column: col 0 {0, 0.35}, col 1 {0, 0}, col 2 {0.6, 0}
    mh = vsepp_loss.hinge_triplet_loss(IMAGES, TEXTS, margin=0.2)
    assert float(mh) == pytest.approx(0.4 + 0.0 + 0.55 + 0.35 + 0.0 + 0.6)           # 1.9
    sh = vsepp_loss.hinge_triplet_loss(IMAGES, TEXTS, margin=0.2, max_violation=False)
    assert float(sh) == pytest.approx(0.4 + 0.0 + 0.85 + 0.35 + 0.0 + 0.6)           # 2.2
    assert float(mh) != pytest.approx(float(sh))
    # the same by explicit loops over anchors and negatives (VSE++ §3)
    s = SCORES.tolist()
    ref = sum(max(max(0.0, 0.2 + s[i][j] - s[i][i]) for j in range(3) if j != i) for i in range(3)) + \
        sum(max(max(0.0, 0.2 + s[i][j] - s[j][j]) for i in range(3) if i != j) for j in range(3))
    assert float(mh) == pytest.approx(ref)
    # the margin counts: without it only strict violations remain (rows 0.2, 0.35; columns 0.15, 0.4)
    assert float(vsepp_loss.hinge_triplet_loss(IMAGES, TEXTS, margin=0.0)) == pytest.approx(1.1)


def test_hardest_negatives_are_chosen_per_row_and_per_column():
    caption_of_image, image_of_caption = vsepp_loss.hardest_negatives(IMAGES, TEXTS)
    assert caption_of_image.tolist() == [2, 0, 0]     # row maxima off the diagonal: 1.00, 0.50, 0.95
    assert image_of_caption.tolist() == [2, 2, 0]     # column maxima off the diagonal: 0.95, 0.70, 1.00
    # d loss / d s: each anchor's hardest violating negative +1, its positive -1, nothing else
    txt = TEXTS.clone().requires_grad_(True)
    vsepp_loss.hinge_triplet_loss(IMAGES, txt).backward()
    assert txt.grad.T.tolist() == [[-2, 0, 2], [0, 0, 0], [2, 0, -2]]
    # the sum of hinges also pushes image 2 away from caption 1 (its second violation, 0.3)
    txt = TEXTS.clone().requires_grad_(True)
    vsepp_loss.hinge_triplet_loss(IMAGES, txt, max_violation=False).backward()
    assert txt.grad.T.tolist() == [[-2, 0, 2], [0, 0, 0], [2, 1, -3]]


def test_hard_negatives_after_the_pairs_are_candidates_never_anchors():
    # 2 pairs + image 2 and caption 2 as unpaired hard negatives: rows 0-1 over 3 captions, columns 0-1 over 3 images
    loss = vsepp_loss.hinge_triplet_loss(IMAGES, TEXTS, n_pairs=2)
    assert float(loss) == pytest.approx(0.4 + 0.0 + 0.35 + 0.0)
    out = {"image_embeds": IMAGES, "text_embeds": TEXTS, "logit_scale": torch.tensor(1.0),
           "hinge_margin": torch.tensor([0.2, 0.2]), "hinge_max_violation": torch.tensor([1.0, 1.0])}
    assert float(model_mod.contrastive_loss(out, 2)) == pytest.approx(0.75)   # the trainer's dispatch
    assert float(model_mod.contrastive_loss(out)) == pytest.approx(1.9)


# --------------------------------------------------------------------------- the folder and the registry

def test_vocabulary_keeps_words_seen_min_count_times():
    vocab = vsepp.build_vocab(["A dog, a dog.", "the cat", "a Dog"], min_count=2)
    assert list(vocab)[:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert list(vocab)[4:] == ["a", "dog"]           # 3 times each (most frequent first, ties alphabetical)
    tok = vsepp.VSEPPTokenizer(vocab, max_length=5)
    enc = tok(["a dog", "the dog a dog a"], padding="max_length", max_length=5)
    assert enc["input_ids"].tolist() == [[1, 4, 5, 2, 0], [1, 3, 5, 4, 2]]   # truncated inside <start> ... <end>
    assert enc["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_save_load_round_trip_gives_identical_embeddings(tiny_vsepp, dataset, tmp_path):
    root, frame = dataset
    model, processor = registry.load(cfg_of(tiny_vsepp), ROLE)
    assert registry.model_spec(cfg_of(tiny_vsepp), ROLE).library == "vsepp"
    assert type(model).__name__ == "VSEPP" and model.config.backbone == "tiny"
    assert {p.name for p in tiny_vsepp.iterdir()} >= {"config.json", "model.safetensors", "vocab.json"}
    pixels = processor.image_processor(images=images_of(root, frame))["pixel_values"]
    tokens = processor.tokenizer(frame["caption"].tolist())
    with torch.no_grad():
        img, txt = model(pixels, tokens["input_ids"], tokens["attention_mask"])
    torch.testing.assert_close(img.norm(dim=-1), torch.ones(len(frame)))
    torch.testing.assert_close(txt.norm(dim=-1), torch.ones(len(frame)))
    # a checkpoint written the way the trainer writes one reloads bit for bit
    from counterfactory.training.model import ContrastiveAdapter

    ContrastiveAdapter((model, processor), "vsepp").save(tmp_path / "copy")
    again, proc2 = registry.load(cfg_of(tmp_path / "copy"), ROLE)
    assert again.config == model.config and proc2.tokenizer.vocab == processor.tokenizer.vocab
    with torch.no_grad():
        img2, txt2 = again(pixels, tokens["input_ids"], tokens["attention_mask"])
    assert torch.equal(img, img2) and torch.equal(txt, txt2)
    # the shared scorer ranks by the cosine of those embeddings
    from counterfactory.scorers import scorer_from_config

    scorer = scorer_from_config(cfg_of(tmp_path / "copy"), ROLE, head="itc", progress=False)
    assert type(scorer).__name__ == "VseppScorer" and scorer.dual
    got = scorer.score_matrix(images_of(root, frame), frame["caption"].tolist())
    np.testing.assert_allclose(got, (img @ txt.T).numpy(), atol=1e-5)


def test_broken_or_missing_folders_name_the_file_and_the_fix(tiny_vsepp, tmp_path):
    with pytest.raises(ModelLoadError, match="build-vsepp"):
        registry.load(cfg_of(tmp_path / "absent"), ROLE)
    with pytest.raises(ModelLoadError, match="no hub checkpoint"):
        registry.load({"models": {ROLE: {"source": "someone/vsepp"}}}, ROLE)
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_vsepp, broken)
    vocab = json.loads((broken / "vocab.json").read_text())
    vocab.pop(next(iter(list(vocab)[5:])))
    (broken / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ModelLoadError, match="vocab.json"):
        vsepp.load(broken)
    (broken / "vocab.json").unlink()
    with pytest.raises(ModelLoadError, match="vocabulary is missing"):
        vsepp.load(broken)


def test_build_command_writes_a_loadable_folder_and_uses_local_imagenet_weights(tmp_path, monkeypatch, capsys):
    from counterfactory import cli

    captions = tmp_path / "captions.txt"
    captions.write_text("a dog on a bench\na cat on a bench\na dog and a cat\n")
    args = ["models", "build-vsepp", "--captions", str(captions), "--backbone", "tiny", "--min-count", "2",
            "--embed-size", "8", "--word-dim", "4"]
    assert cli.main([*args, "--out", str(tmp_path / "auto")]) == 2     # tiny has no ImageNet weights: says so
    assert "--imagenet-weights none" in capsys.readouterr().err
    assert cli.main([*args, "--imagenet-weights", "none", "--out", str(tmp_path / "m")]) == 0
    model, processor = vsepp.load(tmp_path / "m")
    assert set(processor.tokenizer.vocab) == {"<pad>", "<start>", "<end>", "<unk>", "a", "dog", "cat", "on", "bench"}
    assert model.config.embed_size == 8 and model.config.backbone_init == "random" and model.config.margin == 0.2
    assert registry.verify_role(cfg_of(tmp_path / "m"), ROLE)["problems"] == []
    (tmp_path / "m" / "vocab.json").write_text("{}")     # a damaged folder: the check says how to rebuild it
    report = registry.verify_role(cfg_of(tmp_path / "m"), ROLE)
    assert report["problems"] and "models build-vsepp" in report["fix"]
    # a Karpathy split file gives the vocabulary of its train + restval captions only (§4.1's training split)
    doc = {"images": [{"split": split, "cocoid": i, "filename": f"{i}.jpg", "filepath": "x",
                       "sentences": [{"raw": text, "sentid": 10 * i + k} for k, text in enumerate(texts)]}
                      for i, (split, texts) in enumerate([("train", ["a dog", "a dog"]), ("restval", ["a cat", "a cat"]),
                                                          ("val", ["a zebra", "a zebra"])])]}
    (tmp_path / "k.json").write_text(json.dumps(doc))
    assert cli.main([*args[:3], str(tmp_path / "k.json"), *args[4:], "--imagenet-weights", "none",
                     "--out", str(tmp_path / "k")]) == 0
    assert set(vsepp.load(tmp_path / "k")[1].tokenizer.vocab) == {"<pad>", "<start>", "<end>", "<unk>", "a", "dog", "cat"}
    # ImageNet initialisation: torchvision's file in torch hub's checkpoint folder (here a stand-in for the tiny CNN)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setitem(vsepp.IMAGENET_FILES, "tiny", "tiny-cnn.pth")
    with pytest.raises(ModelLoadError, match="curl -L -o .*tiny-cnn.pth"):
        vsepp.make(["a dog", "a dog"], backbone="tiny", min_count=1)
    cnn, _ = vsepp.make_backbone(vsepp.VSEPPConfig(vocab_size=5, backbone="tiny"))
    weights = {k: torch.full_like(v, 0.5) if v.is_floating_point() else v for k, v in cnn.state_dict().items()}
    path = vsepp.imagenet_weights_path("tiny")
    path.parent.mkdir(parents=True)
    torch.save(weights, path)
    built, _ = vsepp.make(["a dog", "a dog"], backbone="tiny", min_count=1)
    assert built.config.backbone_init == "imagenet:tiny-cnn.pth"
    assert all(torch.equal(v, weights[k]) for k, v in built.cnn.state_dict().items())
    with pytest.raises(ConfigError, match="no word occurs"):
        vsepp.make(["a dog"], backbone="tiny", imagenet=None, min_count=2)


# --------------------------------------------------------------------------- training through the shared trainer

def _adapter(path):
    from counterfactory.training.runs import _adapter as adapter_of

    return adapter_of(cfg_of(path), ROLE)


def _loss(a, root, frame):
    batch = {**a.image_inputs(images_of(root, frame)), **a.tokens(frame["caption"].tolist())}
    a.module.eval()
    with torch.no_grad():
        return float(training.recipe_loss(a.module, batch))


def _train(path, root, frame, out_dir):
    a = _adapter(path)
    settings = training.TrainSettings(lr=1e-3, batch_size=len(frame), eval_batch_size=len(frame), epochs=2,
                                      eval_every=2, max_steps=2, seed=3, data_seed=4, max_length=16,
                                      no_decay=("bias",), weight_decay=0.0)
    return a, training.train(a, frame, frame, settings, image_root=root, out_dir=out_dir)


def test_two_trainer_steps_lower_the_loss_deterministically(tiny_vsepp, dataset, tmp_path):
    root, frame = dataset
    before = _adapter(tiny_vsepp)
    assert before.kind == "vsepp" and before.max_length == before.model.config.max_length
    loss0 = _loss(before, root, frame)
    a, res = _train(tiny_vsepp, root, frame, tmp_path / "ckpt")
    assert len(res.history) == 2 and all(math.isfinite(h["train_loss"]) for h in res.history)
    assert _loss(a, root, frame) < loss0                      # the overfit batch's max-of-hinges went down
    # the CNN is frozen (finetune_cnn false), the projection and the text encoder learned
    assert all(torch.equal(p, q) for p, q in zip(a.model.cnn.parameters(), before.model.cnn.parameters()))
    assert not torch.equal(a.model.image_fc.weight, before.model.image_fc.weight)
    assert not torch.equal(a.model.gru.weight_hh_l0, before.model.gru.weight_hh_l0)
    # same seeds, same run; the saved checkpoint is the trained model
    b, res_b = _train(tiny_vsepp, root, frame, tmp_path / "ckpt_b")
    assert [h["train_loss"] for h in res_b.history] == [h["train_loss"] for h in res.history]
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    reloaded, _ = registry.load(cfg_of(tmp_path / "ckpt"), ROLE)
    assert all(torch.equal(p, q) for p, q in zip(reloaded.parameters(), a.model.parameters()))


# --------------------------------------------------------------------------- the spurious-correlation study's runs

def test_spurious_vsepp_recipe_has_no_zeroshot_run_and_trains_on_the_max_of_hinges(tiny_vsepp, dataset, tmp_path,
                                                                                    monkeypatch):
    # Tables 1-2 have no "VSE++ (zeroshot)" row: the vsepp recipe's runs are finetune and ours only, and its run
    # trains with VSE++'s hardest-negative loss (max of hinges, margin 0.2) from the §4.1 recipe
    from counterfactory.io import write_parquet
    from counterfactory.studies.spurious_retrieval import evaluation as ev
    from counterfactory.studies.spurious_retrieval import runs as rn
    from counterfactory.studies.spurious_retrieval import settings as st

    root, frame = dataset
    none = {"table3_models": [], "ratio_models": [], "appendix_b_models": []}
    section = {"data": {"datasets": ["coco"]}, "mixtures": none,
               "training": {"models": {"clip_train": "clip", ROLE: "vsepp"}, "seeds": {"count": 2},
                            "common": {"max_steps": 1, "dataloader_workers": 0, "cpu_threads": 1},
                            "vsepp": {"batch_size": 4}}}
    s = st.settings(section)
    assert (s["training"]["vsepp"]["lr"], s["training"]["vsepp"]["epochs"]) == (1e-4, 10)
    plan = rn.runs(s)
    assert [m for _, r, m, _ in plan if r == ROLE] == ["finetune", "finetune", "ours", "ours"]
    assert next(m for _, r, m, _ in plan if r == "clip_train") == "zeroshot"
    cfg = {"models": {ROLE: {"source": str(tiny_vsepp)}}, "device": "cpu", "precision": "fp32",
           "spurious_retrieval": section}
    with pytest.raises(ConfigError, match="'vsepp' .*no zero-shot run"):
        rn.run(cfg, "coco", ROLE, "zeroshot", 0, 1, tmp_path, tmp_path, tmp_path / "zs")

    manifests = tmp_path / "manifests"
    write_parquet(manifests / "finetune.parquet", frame.assign(image_path=[str(root / p) for p in frame["image_path"]],
                                                               split="train"))
    seen = []
    loss = vsepp_loss.hinge_triplet_loss
    monkeypatch.setattr(vsepp_loss, "hinge_triplet_loss",
                        lambda i, t, margin, max_violation, n_pairs=None: seen.append((margin, max_violation))
                        or loss(i, t, margin, max_violation, n_pairs))
    monkeypatch.setattr(ev, "evaluate", lambda cfg, role, *a, **k:   # the scoring itself: tests/test_spurious_retrieval.py
                        {"ODmAP@1": 50.0 if str(cfg["models"][role]["source"]).endswith("checkpoint") else 0.0})
    rows = rn.run(cfg, "coco", ROLE, "finetune", 0, 1, manifests, tmp_path / "gallery.parquet", tmp_path / "run")
    assert seen and all(m == (pytest.approx(0.2), True) for m in seen)     # VSE++'s MH loss, margin 0.2
    assert rows.to_dict("records") == [{"experiment": "coco_vsepp", "mixture": "finetune", "seed": 0, "data_seed": 1,
                                        "metric": "ODmAP@1", "value": 50.0}]   # scored the trained checkpoint
    assert (tmp_path / "run" / "checkpoint" / "vocab.json").exists()
