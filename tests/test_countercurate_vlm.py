"""The ``vlm`` role (LLaVA-1.5 class) of CounterCurate: loader, tiny stand-in, two-caption choice (§4),
conversation fine-tuning with the prompt masked (§3.5), on the tiny randomly initialised model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from counterfactory.errors import ConfigError, InputError
from counterfactory.models import registry, tiny
from counterfactory.studies.countercurate import vlm, vlm_finetune

CAPTIONS = ["a dog sitting on the bench", "two cats near the table", "a red car parked by the road",
            "the man is above the horse", "a woman holding a cup"]
NEGATIVES = ["a bench sitting on the dog", "three cats near the table", "a blue car parked by the road",
             "the horse is above the man", "a woman holding a bowl"]


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    return tiny.build("vlm", tmp_path_factory.mktemp("tiny_vlm"))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """A pair table (parquet) with relative image paths; rows 0 and 2 have a negative image."""
    root = tmp_path_factory.mktemp("vlm_pairs")
    rng = np.random.default_rng(0)
    names = []
    for i in range(len(CAPTIONS)):
        name = f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (36 + 4 * i, 44, 3), dtype=np.uint8)).save(root / name)
        names.append(name)
    frame = pd.DataFrame({"image_path": names, "caption": CAPTIONS, "negative_caption": NEGATIVES,
                          "negative_image_path": [names[1], None, names[3], None, None]})
    frame.to_parquet(root / "pairs.parquet")
    return root / "pairs.parquet"


def _cfg(source, **section) -> dict:
    base = {"batch_size": 2, "eval_batch_size": 2, "max_steps": 2, "lr": 1e-3, "warmup_ratio": 0.0}
    return {"models": {"vlm": {"source": str(source)}}, "device": "cpu", "precision": "fp32",
            "vlm": {**base, **section}}


def test_tiny_vlm_loads_by_path_with_the_llava_classes(tiny_vlm):
    from transformers import CLIPImageProcessor, LlavaForConditionalGeneration, LlavaProcessor

    assert "vlm" in tiny.builders() and registry.DEFAULT_LIBRARY["vlm"] == "transformers"
    assert (tiny_vlm / registry.MANIFEST_NAME).exists()
    model, processor = registry.load(_cfg(tiny_vlm), "vlm")
    assert isinstance(model, LlavaForConditionalGeneration) and not model.training
    assert isinstance(processor, LlavaProcessor) and isinstance(processor.image_processor, CLIPImageProcessor)
    assert processor.image_processor.crop_size == {"height": 32, "width": 32}
    prompt = vlm.render_prompt(processor, "Which one?", vlm.VICUNA_SYSTEM)
    assert prompt == f"{vlm.VICUNA_SYSTEM} USER: <image>\nWhich one? ASSISTANT:"
    enc = processor(text=[prompt], images=[Image.new("RGB", (50, 40))], return_tensors="pt")
    assert int((enc["input_ids"] == model.config.image_token_id).sum()) == 16  # 4x4 patches, CLS dropped
    assert enc["input_ids"][0, 0] == processor.tokenizer.bos_token_id
    assert model(**enc).logits.shape[-1] == len(processor.tokenizer)


def test_missing_tiny_folder_is_a_load_error(tmp_path):
    from counterfactory.errors import ModelLoadError

    cfg = {**_cfg(tmp_path / "nope"), "tiny_models": {"out_dir": str(tmp_path)}}  # a tiny stand-in's folder
    with pytest.raises(ModelLoadError, match="build-tiny"):
        registry.load(cfg, "vlm")


def test_scores_are_deterministic_and_batch_size_independent(tiny_vlm, pairs):
    frame = vlm.read_pairs(pairs)
    images, caps, negs = frame["image_path"].tolist(), frame["caption"].tolist(), frame["negative_caption"].tolist()
    one = vlm.scorer_from_config(_cfg(tiny_vlm, eval_batch_size=1))
    three = vlm.scorer_from_config(_cfg(tiny_vlm, eval_batch_size=3))
    s1 = one.score_pairs(images, caps)
    assert s1.shape == (5,) and np.all(s1 < 0)
    np.testing.assert_allclose(three.score_pairs(images, caps), s1, rtol=1e-5, atol=1e-4)
    assert np.array_equal(one.score_pairs(images, caps), s1)  # repeatable
    np.testing.assert_allclose(one.score_matrix(images[:2], caps[:3])[1, 2], one.score_pairs([images[1]], [caps[2]])[0],
                               rtol=1e-5, atol=1e-4)
    m1, m3 = one.choose(images, caps, negs), three.choose(images, caps, negs)
    np.testing.assert_allclose(m3, m1, rtol=1e-5, atol=1e-5)
    table = one.choice_table(images, caps, negs)
    assert table["a_first"].tolist() == vlm.option_a_first(vlm.item_keys(images, caps, negs), 0).tolist()
    assert set(table["choice"]) <= {"a", "b"} and np.array_equal(table["choice"] == "a", m1 > 0)
    # both orders: swapping the captions flips the margin exactly
    both = one.choose(images, caps, negs, order="both")
    np.testing.assert_allclose(one.choose(images, negs, caps, order="both"), -both, atol=1e-9)
    # the module-level function of the benchmark runner
    np.testing.assert_allclose(vlm.choose(_cfg(tiny_vlm), "vlm", images, caps, negs), m1, rtol=1e-5, atol=1e-5)
    mean = vlm.scorer_from_config(_cfg(tiny_vlm, caption_score="mean")).score_pairs(images[:1], caps[:1])
    n_tokens = len(one.encoder.answer_ids(vlm.render_prompt(one.processor, one.settings.caption_prompt,
                                                            one.settings.system), caps[0]))
    np.testing.assert_allclose(mean[0] * n_tokens, s1[0], rtol=1e-5)


def test_letter_logprobs_fast_path_matches_full_sequences(tiny_vlm, pairs):
    frame = vlm.read_pairs(pairs)
    sc = vlm.scorer_from_config(_cfg(tiny_vlm))
    prompt = vlm.render_prompt(sc.processor, vlm.choice_question(sc.settings, CAPTIONS[0], NEGATIVES[0]),
                               sc.settings.system)
    jobs = [(frame["image_path"][0], prompt, "A"), (frame["image_path"][0], prompt, "B")]
    assert all(len(sc.encoder.answer_ids(p, a)) == 1 for _, p, a in jobs)
    full = [float(t.sum()) for t in sc._run(jobs, "check")]
    np.testing.assert_allclose(sc._letter_logprobs(jobs), full, rtol=1e-5, atol=1e-5)


def test_conversations_follow_the_authors_format(pairs):
    frame = vlm.read_pairs(pairs)
    settings = vlm.VlmSettings.defaults()
    convs = vlm_finetune.conversations(frame, settings, seed=3, source=pairs)
    assert len(convs) == 5 + 2  # rows 0 and 2 also train on their negative image
    coins = np.random.default_rng(3).integers(0, 2, 5)
    for i in range(5):
        own = [c for c in convs if c.row == i]
        first = CAPTIONS[i] if coins[i] == 0 else NEGATIVES[i]
        second = NEGATIVES[i] if coins[i] == 0 else CAPTIONS[i]
        assert own[0].question == (f"Which of the following captions best describes the image?\nA. {first}\nB. "
                                   f"{second}\nAnswer with the option's letter from the given choices directly.")
        assert own[0].answer == ("A" if coins[i] == 0 else "B") and own[0].image_path == frame["image_path"][i]
        if i in (0, 2):
            assert own[1].question == own[0].question and {own[0].answer, own[1].answer} == {"A", "B"}
            assert own[1].image_path == frame["negative_image_path"][i]


def test_loss_masks_the_prompt_tokens(tiny_vlm, pairs):
    model, processor = registry.load(_cfg(tiny_vlm), "vlm")
    frame = vlm.read_pairs(pairs)
    conv = vlm_finetune.conversations(frame, vlm.VlmSettings.defaults(), seed=0, source=pairs)[0]
    batch = vlm_finetune.ConversationCollator(processor, vlm.VlmSettings.defaults())([conv])
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    tok = processor.tokenizer
    prompt = vlm.render_prompt(processor, conv.question, vlm.VICUNA_SYSTEM)
    n_prompt = len(processor(text=[prompt], images=[Image.open(conv.image_path).convert("RGB")]).input_ids[0])
    assert len(ids) == n_prompt + 2  # prompt, the answer letter, </s>
    assert (labels[:n_prompt] == vlm.IGNORE).all()  # system, question, image placeholders: no loss
    assert labels[n_prompt:].tolist() == ids[n_prompt:].tolist()
    assert tok.decode(ids[n_prompt:n_prompt + 1]).strip() == conv.answer and ids[-1] == tok.eos_token_id
    assert (ids[:n_prompt] == model.config.image_token_id).sum() == 16
    # by hand: mean next-token cross-entropy of the two answer tokens equals the model's loss
    with torch.no_grad():
        out = model(**batch)
        logp = torch.log_softmax(out.logits[0].float(), dim=-1)
        hand = -(logp[n_prompt - 1, ids[n_prompt]] + logp[n_prompt, ids[n_prompt + 1]]) / 2
    torch.testing.assert_close(out.loss, hand, rtol=1e-5, atol=1e-5)
    # a padded batch keeps the same per-example labels, padding ignored
    two = vlm_finetune.ConversationCollator(processor, vlm.VlmSettings.defaults())([conv, vlm_finetune.conversations(frame, vlm.VlmSettings.defaults(),
                                                                                          0, pairs)[3]])
    assert (two["labels"] != vlm.IGNORE).sum() == 4


def test_two_step_finetune_changes_weights_and_reloads(tiny_vlm, pairs, tmp_path):
    base, _ = registry.load(_cfg(tiny_vlm), "vlm")
    result = vlm_finetune.train_run(_cfg(tiny_vlm), pairs, tmp_path / "run", seed=5)
    assert result.steps == 2 and result.examples == 7 and len(result.history) == 2
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["lora_merged"] is False and run["settings"]["lr"] == 1e-3
    assert list(pd.read_csv(tmp_path / "run" / "history.csv")["step"]) == [1, 2]
    tuned, processor = registry.load(_cfg(tmp_path / "run" / "model"), "vlm")
    b, t = base.state_dict(), tuned.state_dict()
    assert set(b) == set(t)
    lm = [k for k in b if "language_model" in k]
    vision = [k for k in b if "vision_tower" in k]
    assert any(not torch.equal(b[k], t[k]) for k in lm)
    assert any(not torch.equal(b[k], t[k]) for k in b if "multi_modal_projector" in k)
    assert all(torch.equal(b[k], t[k]) for k in vision)  # frozen, as in LLaVA-1.5 fine-tuning
    frame = vlm.read_pairs(pairs)
    scores = vlm.scorer_from_config(_cfg(tmp_path / "run" / "model")).score_pairs(frame["image_path"][:2].tolist(),
                                                                                CAPTIONS[:2])
    assert np.all(np.isfinite(scores))
    # same seed, same data: the same weights (deterministic)
    vlm_finetune.train_run(_cfg(tiny_vlm), pairs, tmp_path / "again", seed=5)
    again, _ = registry.load(_cfg(tmp_path / "again" / "model"), "vlm")
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in t.items())


def test_lora_finetune_is_merged_and_keeps_the_best_checkpoint(tiny_vlm, pairs, tmp_path):
    cfg = _cfg(tiny_vlm, lora={"r": 4, "alpha": 8, "dropout": 0.0}, eval_every=1)
    result = vlm_finetune.train_run(cfg, pairs, tmp_path / "run", seed=1, val_data=pairs)
    assert result.best_step in (1, 2) and result.best_val_loss is not None
    assert all(not np.isnan(h["val_loss"]) for h in result.history)
    from safetensors import safe_open

    with safe_open(tmp_path / "run" / "model" / "model.safetensors", "pt") as fh:
        keys = list(fh.keys())
    assert not [k for k in keys if "lora" in k or "base_layer" in k or "modules_to_save" in k]
    base, _ = registry.load(_cfg(tiny_vlm), "vlm")
    tuned, _ = registry.load(_cfg(tmp_path / "run" / "model"), "vlm")
    b, t = base.state_dict(), tuned.state_dict()
    assert any(not torch.equal(b[k], t[k]) for k in b if "language_model" in k and "q_proj" in k)
    assert all(torch.equal(b[k], t[k]) for k in b if "embed_tokens" in k)  # LoRA leaves the embeddings alone


def _bad_table(pairs, tmp_path, change: dict):
    frame = pd.read_parquet(pairs)
    frame["image_path"] = [str(pairs.parent / p) for p in frame["image_path"]]
    frame["negative_image_path"] = [str(pairs.parent / p) if isinstance(p, str) else None
                                   for p in frame["negative_image_path"]]
    for (col, row), value in change.items():
        frame.loc[row, col] = value
    path = tmp_path / "bad.parquet"
    frame.to_parquet(path)
    return path


def test_bad_input_names_file_and_row(tiny_vlm, pairs, tmp_path):
    path = _bad_table(pairs, tmp_path, {("caption", 1): ""})
    with pytest.raises(InputError, match=r"bad\.parquet, record row 1: caption"):
        vlm.read_pairs(path)
    path = _bad_table(pairs, tmp_path, {("image_path", 3): "gone.png"})
    with pytest.raises(InputError, match=r"bad\.parquet, record row 3: image_path .*gone\.png does not exist"):
        vlm.read_pairs(path)
    path = _bad_table(pairs, tmp_path, {("negative_caption", 2): CAPTIONS[2]})
    with pytest.raises(InputError, match="row 2: caption and negative_caption are the same"):
        vlm.read_pairs(path)
    pd.DataFrame({"image_path": ["a.png"], "caption": ["x"]}).to_parquet(tmp_path / "cols.parquet")
    with pytest.raises(InputError, match=r"cols\.parquet: missing column\(s\) \['negative_caption'\]"):
        vlm.read_pairs(tmp_path / "cols.parquet")
    # a corrupt image is named with its row when training reads it
    bad_image = tmp_path / "corrupt.png"
    bad_image.write_bytes(b"not a png")
    path = _bad_table(pairs, tmp_path, {("image_path", 0): str(bad_image)})
    with pytest.raises(InputError, match=r"bad\.parquet, record row 0: cannot read image .*corrupt\.png"):
        vlm_finetune.train_run(_cfg(tiny_vlm), path, tmp_path / "run", seed=0)
    # conversations longer than max_length are refused, not truncated
    with pytest.raises(InputError, match=r"pairs\.parquet, record row 0: the conversation is \d+ tokens"):
        vlm_finetune.train_run(_cfg(tiny_vlm, max_length=20), pairs, tmp_path / "run", seed=0)
    assert not (tmp_path / "run").exists()


def test_settings_defaults_and_errors():
    s = vlm.VlmSettings.from_config({})
    assert (s.lr, s.batch_size, s.epochs, s.lora, s.freeze_vision) == (2e-6, 16, 1, None, True)
    assert vlm.VlmSettings.from_config({"vlm": {"lora": {"r": 8}}}).lora == {"r": 8, "alpha": 256, "dropout": 0.05}
    with pytest.raises(ConfigError, match=r"countercurate\.vlm: unknown key\(s\) learning_rate"):
        vlm.VlmSettings.from_config({"vlm": {"learning_rate": 1e-5}})
    with pytest.raises(ConfigError, match=r"countercurate\.vlm\.choice_order: 'sometimes' is not one of"):
        vlm.VlmSettings.from_config({"vlm": {"choice_order": "sometimes"}})
    with pytest.raises(ConfigError, match="lora"):
        vlm.VlmSettings.from_config({"vlm": {"lora": {"rank": 8}}})


def test_cli_train_and_score(tiny_vlm, pairs, tmp_path):
    import yaml

    from counterfactory.config import study_roles

    unused = {role: {"source": "not-loaded"} for role in study_roles("countercurate")}   # the study's required roles
    cfg = {"run_name": "t", "device": "cpu", "models": {**unused, "vlm": {"source": str(tiny_vlm)}},
           "studies": ["countercurate"],
           "countercurate": {"vlm": {"max_steps": 1, "batch_size": 2, "warmup_ratio": 0.0}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    from counterfactory.commands.countercurate import add_vlm

    parser = argparse.ArgumentParser()
    add_vlm(parser.add_subparsers())
    args = parser.parse_args(["vlm-train", "--config", str(tmp_path / "c.yaml"), "--data", str(pairs),
                              "--out-dir", str(tmp_path / "run"), "--seed", "0", "--no-progress"])
    assert args.func(args) == 0 and (tmp_path / "run" / "model" / "config.json").exists()
    args = parser.parse_args(["vlm-score", "--config", str(tmp_path / "c.yaml"), "--role", "vlm", "--data",
                              str(pairs), "--out", str(tmp_path / "s.csv"), "--batch-size", "3", "--no-progress"])
    assert args.func(args) == 0
    table = pd.read_csv(tmp_path / "s.csv")
    assert len(table) == 5 and {"logp_caption", "logp_negative", "choice_margin", "chose_caption"} <= set(table)
    assert (table["chose_caption"] == (table["choice_margin"] > 0)).all()


def test_evaluate_asks_the_tiny_vlm_to_choose(tiny_vlm):
    """§4.4: SugarCrepe with the vlm role is the two-option choice (paper config), the likelihood an option."""
    from counterfactory.studies.countercurate import benchmarks as bm

    demo = Path(__file__).resolve().parents[1] / "resources" / "demo"
    cfg = {**_cfg(tiny_vlm), "benchmarks": {"sugarcrepe": {"root": str(demo / "sugarcrepe" / "data"),
                                                           "images": str(demo / "coco2017" / "val2017")}}}
    res, items = bm.evaluate(cfg, "vlm", "sugarcrepe", progress=False)
    sc = vlm.scorer_from_config(cfg)
    margins = sc.choose(items["image_path"].tolist(), items["caption"].tolist(), items["negative_caption"].tolist())
    np.testing.assert_allclose(items["margin"], margins, rtol=1e-5, atol=1e-5)
    avg = res[(res["subset"] == "average") & (res["metric"] == "accuracy")]["value"].iloc[0]
    assert avg == pytest.approx(float((margins > 0).mean()))
    like_cfg = {**cfg, "vlm": {**cfg["vlm"], "protocol": "likelihood"}}
    _, like_items = bm.evaluate(like_cfg, "vlm", "sugarcrepe", progress=False)
    assert "margin" not in like_items and like_items["s_pos"].lt(0).all()  # caption log-likelihoods
