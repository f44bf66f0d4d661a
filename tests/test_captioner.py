"""The ``captioner`` role (spurious-correlation study, Table 3 "capt. model"): tiny BLIP captioning model,
registry load by path, batched greedy captions independent of the batch size, bad-input errors."""

from __future__ import annotations

import pytest

from counterfactory.errors import ConfigError, InputError, ModelLoadError
from counterfactory.generation.captioning import caption_images


@pytest.fixture(scope="module")
def tiny_captioner(tmp_path_factory):
    from counterfactory.models import tiny

    return tiny.build("captioner", tmp_path_factory.mktemp("tiny_captioner"))


pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(path):
    return {"models": {"captioner": {"source": str(path)}}, "device": "cpu", "precision": "fp32"}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Three small PNGs: a white box on red, green and blue, at different places and sizes."""
    from PIL import Image, ImageDraw

    folder = tmp_path_factory.mktemp("images")
    paths = []
    for i, colour in enumerate([(255, 0, 0), (0, 200, 0), (0, 0, 255)]):
        im = Image.new("RGB", (48 + 8 * i, 40), colour)
        ImageDraw.Draw(im).rectangle([5 + 5 * i, 5, 25 + 5 * i, 30], fill=(255, 255, 255))
        path = folder / f"img{i}.png"
        im.save(path)
        paths.append(path)
    return paths


def test_tiny_captioner_loads_by_path_through_the_registry(tiny_captioner):
    from counterfactory.models import registry, tiny

    assert "captioner" in tiny.builders() and registry.DEFAULT_LIBRARY["captioner"] == "transformers"
    assert (tiny_captioner / registry.MANIFEST_NAME).exists()
    model, processor = registry.load(_cfg(tiny_captioner), "captioner")
    assert type(model).__name__ == "BlipForConditionalGeneration"
    assert type(processor).__name__ == "BlipProcessor"
    text = model.config.text_config
    tok = processor.tokenizer
    assert (text.bos_token_id, text.sep_token_id, text.pad_token_id) == (
        tok.convert_tokens_to_ids("[DEC]"), tok.sep_token_id, tok.pad_token_id)
    assert text.vocab_size == len(tok)
    loaded = registry.loaded_models()["captioner"]
    assert loaded["local"] and len(loaded["fingerprint"]) == 64
    assert loaded["classes"] == ["BlipForConditionalGeneration", "BlipProcessor"]


def test_captions_are_words_in_input_order_and_deterministic(tiny_captioner, images):
    cfg = _cfg(tiny_captioner)
    captions = caption_images(cfg, images, batch_size=2, max_new_tokens=6, progress=False)
    assert len(captions) == 3 and all(isinstance(c, str) and c == c.strip() for c in captions)
    assert all(c for c in captions)  # the tiny model writes words, not only special tokens
    for c in captions:
        words = c.split()
        assert 1 <= len(words) <= 6  # at most max_new_tokens tokens, each a whole word
        assert all(w.isalnum() and (len(w) > 1 or w == "a") for w in words)
        assert "[" not in c
    assert len(set(captions)) > 1  # captions depend on the image
    # input order: captioning the images in reverse reverses the captions
    assert caption_images(cfg, images[::-1], batch_size=2, max_new_tokens=6, progress=False) == captions[::-1]
    assert caption_images(cfg, [str(p) for p in images], batch_size=2, max_new_tokens=6, progress=False) == captions


def test_captions_do_not_depend_on_batch_size(tiny_captioner, images):
    cfg = _cfg(tiny_captioner)
    one = caption_images(cfg, images, batch_size=1, max_new_tokens=8, progress=False)
    three = caption_images(cfg, images, batch_size=3, max_new_tokens=8, progress=False)
    assert one == three
    # with a prompt (BLIP keeps it as the caption's start) and with beam search
    prompted = caption_images(cfg, images, batch_size=1, max_new_tokens=4, prompt="a photo of", progress=False)
    assert prompted == caption_images(cfg, images, batch_size=3, max_new_tokens=4, prompt="a photo of",
                                      progress=False)
    assert all(c.startswith("a photo of") for c in prompted)
    beams = caption_images(cfg, images, batch_size=1, max_new_tokens=5, num_beams=2, progress=False)
    assert beams == caption_images(cfg, images, batch_size=3, max_new_tokens=5, num_beams=2, progress=False)
    assert all(isinstance(c, str) for c in beams)


def test_missing_or_unreadable_image_names_the_file(tiny_captioner, images, tmp_path):
    cfg = _cfg(tiny_captioner)
    missing = tmp_path / "gone.png"
    with pytest.raises(InputError, match="gone.png.*not found"):
        caption_images(cfg, [images[0], missing], progress=False)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    with pytest.raises(InputError, match="broken.png.*not a readable image"):
        caption_images(cfg, [images[0], broken], batch_size=1, progress=False)
    with pytest.raises(InputError, match="folder"):
        caption_images(cfg, [tmp_path], progress=False)
    assert caption_images(cfg, [], progress=False) == []


def test_bad_options_and_missing_model(tiny_captioner, images, tmp_path):
    with pytest.raises(ConfigError, match="batch_size"):
        caption_images(_cfg(tiny_captioner), images, batch_size=0, progress=False)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        caption_images(_cfg(tiny_captioner), images, max_new_tokens=0, progress=False)
    with pytest.raises(ModelLoadError, match="captioner"):
        caption_images(_cfg(tmp_path / "no-model"), images, progress=False)
    with pytest.raises(ConfigError, match="models.captioner is not configured"):
        caption_images({"device": "cpu", "models": {}}, images, progress=False)
