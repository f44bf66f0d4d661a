"""``counterfactory models convert-blip`` against the ORIGINAL BLIP code (issue 30, item 1).

Both the spurious-correlation retrieval paper (§4.1, BLIP zero-shot / fine-tune rows) and CVLD (§5, BLIP^PT) start
from pre-trained BLIP, published only in the original salesforce/BLIP checkpoint layout. The fixture
(tests/fixtures/blip_original/, recorded by scripts/record_blip_fixture.py in a throwaway environment with the
original model code of the ``blip-ci`` package) holds a tiny random original BLIP in the pre-training layout and
that code's outputs on a fixed input. Converting it must give the same vision embeddings, text embeddings, ITC
similarities, ITM logits, caption logits, decoder loss and greedy caption through transformers' classes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from counterfactory import cli
from counterfactory.models import convert_blip
from counterfactory.models.identity import verify_folder

FIXTURE = Path(__file__).parent / "fixtures" / "blip_original"
CHECKPOINT = FIXTURE / "model_tiny_pretrain.pth"
BASE = FIXTURE / "hf_base"
ATOL = 1e-5


@pytest.fixture(scope="module")
def expected():
    return torch.load(FIXTURE / "expected.pt", weights_only=True)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The fixture checkpoint converted by the command line, once per kind (and once at 48 pixels)."""
    root = tmp_path_factory.mktemp("converted")
    runs = {"itm": ["--kind", "itm"], "captioning": ["--kind", "captioning"],
            "itm48": ["--kind", "itm", "--image-size", "48"]}
    for name, extra in runs.items():
        rc = cli.main(["models", "convert-blip", "--checkpoint", str(CHECKPOINT), "--base", str(BASE),
                       "--out", str(root / name), *extra])
        assert rc == 0, name
    return root


def _close(actual, want, what):
    assert actual.shape == want.shape, what
    diff = (actual - want).abs().max().item()
    assert diff <= ATOL, f"{what}: max |diff| {diff}"


def test_itm_matches_the_original_embeddings_itc_and_itm(converted, expected):
    model = transformers.BlipForImageTextRetrieval.from_pretrained(converted / "itm").eval()
    ids, mask, image = expected["itm_input_ids"], expected["itm_attention_mask"], expected["image"]
    with torch.no_grad():
        _close(model.vision_model(pixel_values=image).last_hidden_state, expected["image_embeds"], "image embeds")
        _close(model.text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state, expected["text_embeds"],
               "text embeds")
        itc = model(input_ids=ids, attention_mask=mask, pixel_values=image, use_itm_head=False).itm_score
        _close(itc, expected["itc_sim"], "ITC similarities")
        itm = model(input_ids=ids, attention_mask=mask, pixel_values=image, use_itm_head=True).itm_score
        _close(itm, expected["itm_logits"], "ITM logits")
        itm_enc = model(input_ids=expected["itm_enc_input_ids"], attention_mask=mask, pixel_values=image,
                        use_itm_head=True).itm_score
        _close(itm_enc, expected["itm_enc_logits"], "ITM logits with [ENC]")
    # the original ViT's layer-norm epsilon, not the hub ports' 1e-5
    assert model.config.vision_config.layer_norm_eps == convert_blip.VIT_LAYER_NORM_EPS
    # the checkpoint's own resolution (32), not the base folder's (64), for the model and its processor
    processor = transformers.AutoProcessor.from_pretrained(converted / "itm")
    assert model.config.vision_config.image_size == 32
    assert processor.image_processor.size == {"height": 32, "width": 32}


def test_captioning_matches_the_original_logits_loss_and_caption(converted, expected):
    model = transformers.BlipForConditionalGeneration.from_pretrained(converted / "captioning").eval()
    processor = transformers.AutoProcessor.from_pretrained(converted / "captioning")
    image = expected["image"]
    with torch.no_grad():
        out = model(pixel_values=image, input_ids=expected["caption_input_ids"],
                    attention_mask=expected["caption_attention_mask"], labels=expected["caption_labels"])
        _close(out.logits, expected["caption_logits"], "caption logits")
        # BLIP's decoder loss: label smoothing 0.1 over the caption tokens after the prompt
        _close(out.loss, expected["caption_loss"], "decoder loss")
        prompt = expected["prompt_ids"].repeat(image.shape[0], 1)
        tokens = model.generate(pixel_values=image, input_ids=prompt, num_beams=1, max_length=12, min_length=5)
    captions = [processor.tokenizer.decode(t, skip_special_tokens=True)[len(expected["prompt"]):] for t in tokens]
    assert captions == expected["greedy_captions"]


def test_position_embeddings_are_resized_as_blip_does(converted, expected):
    """A 32-pixel checkpoint converted for 48 pixels equals the original loaded by BLIP's load_checkpoint."""
    model = transformers.BlipForImageTextRetrieval.from_pretrained(converted / "itm48").eval()
    assert model.config.vision_config.image_size == 48
    processor = transformers.AutoProcessor.from_pretrained(converted / "itm48")
    assert processor.image_processor.size == {"height": 48, "width": 48}
    ids, mask, image = expected["itm_input_ids"], expected["itm_attention_mask"], expected["image48"]
    with torch.no_grad():
        _close(model(input_ids=ids, attention_mask=mask, pixel_values=image, use_itm_head=False).itm_score,
               expected["itc_sim_48"], "ITC at 48 px")
        _close(model(input_ids=ids, attention_mask=mask, pixel_values=image, use_itm_head=True).itm_score,
               expected["itm_logits_48"], "ITM at 48 px")


def test_folder_carries_a_manifest_naming_the_source(converted):
    manifest = json.loads((converted / "itm" / "counterfactory-manifest.json").read_text())
    assert manifest["builder"] == convert_blip.BUILDER
    assert manifest["source_sha256"] == hashlib.sha256(CHECKPOINT.read_bytes()).hexdigest()
    # what the retrieval class has no place for: the decoder, momentum copies, queues, temperature
    assert {"text_decoder", "visual_encoder_m", "text_encoder_m", "image_queue", "temp"} <= set(manifest["dropped"])
    assert "text_encoder" in json.loads((converted / "captioning" / "counterfactory-manifest.json")
                                        .read_text())["dropped"]
    method, problems = verify_folder(converted / "itm")
    assert method == "manifest" and problems == []


def _state():
    return dict(torch.load(CHECKPOINT, weights_only=True)["model"])


def test_unexpected_key_is_named_and_nothing_is_written(tmp_path, capsys):
    state = _state()
    state["visual_encoder.blocks.0.attn.rel_pos"] = torch.zeros(3)
    state["fusion_head.weight"] = torch.zeros(2, 2)
    bad = tmp_path / "bad.pth"
    torch.save({"model": state}, bad)
    rc = cli.main(["models", "convert-blip", "--checkpoint", str(bad), "--base", str(BASE), "--kind", "itm",
                   "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "fusion_head.weight" in err and "visual_encoder.blocks.0.attn.rel_pos" in err and str(bad) in err
    assert not (tmp_path / "out").exists()


def test_missing_weight_is_named(tmp_path):
    state = _state()
    del state["visual_encoder.blocks.1.norm2.weight"]
    with pytest.raises(convert_blip.BlipConversionError, match=r"vision_model\.encoder\.layers\.1\.layer_norm2\.weight"):
        convert_blip.build_model(state, "itm", str(BASE))


def test_fine_tuned_captioning_checkpoint_cannot_become_itm():
    state = {k: v for k, v in _state().items() if k.startswith(("visual_encoder.", "text_decoder."))}
    with pytest.raises(convert_blip.BlipConversionError, match="text_encoder, vision_proj, text_proj, itm_head"):
        convert_blip.map_state_dict(state, "itm")


def test_base_of_another_size_is_refused(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    for f in BASE.iterdir():
        (base / f.name).write_bytes(f.read_bytes())
    config = json.loads((base / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 3
    (base / "config.json").write_text(json.dumps(config))
    with pytest.raises(convert_blip.BlipConversionError, match=r"text_config\.num_hidden_layers: checkpoint 2, base 3"):
        convert_blip.build_model(_state(), "captioning", str(base))


def test_key_renames_of_the_vision_transformer():
    assert convert_blip.rename("visual_encoder.blocks.11.attn.proj.weight", "itm") == \
        "vision_model.encoder.layers.11.self_attn.projection.weight"
    assert convert_blip.rename("visual_encoder.norm.bias", "captioning") == "vision_model.post_layernorm.bias"
    assert convert_blip.rename("visual_encoder.cls_token", "itm") == "vision_model.embeddings.class_embedding"
    assert convert_blip.rename("text_decoder.cls.predictions.bias", "captioning") == "text_decoder.cls.predictions.bias"
    assert convert_blip.rename("text_decoder.cls.predictions.bias", "itm") is None
    assert convert_blip.rename("visual_encoder_m.pos_embed", "itm") is None
    with pytest.raises(KeyError):
        convert_blip.rename("visual_encoder.blocks.0.attn.rel_pos", "itm")
