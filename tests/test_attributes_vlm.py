"""Issue 29 item 2: GPT-4V's part in Flickr30k-Attributes (CounterCurate §3.4, app. A) is played by a vision-language
role that sees the photograph and a copy with the boxes drawn, and answers the three negatives at once."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from counterfactory.errors import ConfigError
from counterfactory.studies.countercurate import attributes as at
from counterfactory.text import llm

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).parents[1]
MARKUP = ("[/EN#1/people A man] wearing [/EN#2/clothing a black shirt] and [/EN#3/clothing blue jeans] "
          "stands on [/EN#4/scene the beach] .")
BOXES = {"1": [[10, 5, 60, 120]], "2": [[20, 30, 55, 70]]}


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    pytest.importorskip("counterfactory.models.tiny_vlm")
    from counterfactory.models import tiny

    return tiny.build("vlm", tmp_path_factory.mktemp("tiny_vlm"))


@pytest.fixture()
def photo(tmp_path):
    from PIL import Image

    path = tmp_path / "img1.jpg"
    Image.new("RGB", (200, 150), "white").save(path)
    return path


def _item(path=None):
    caption, phrases = at.parse_markup(MARKUP)
    return at.CaptionItem("img1", 0, caption, phrases, BOXES, str(path) if path else None, width=200, height=150)


def _cfg(folder, **attributes):
    return {"models": {"vlm": {"source": str(folder)}}, "device": "cpu", "precision": "fp32",
            "llm": {"batch_size": 2, "max_new_tokens": 24}, "attributes": attributes}


class FakeRunner:
    """Answers without a model; records the requests it was given."""

    generated = 0

    def __init__(self, answer='{"x": "y"}'):
        self.answer, self.seen = answer, []

    def generate(self, batch):
        self.seen += batch
        return [self.answer for _ in batch]


def test_paper_config_gives_gpt4v_part_to_the_vlm_with_both_pictures_and_one_answer(photo):
    """The paper config selects the vlm role, the photograph + its boxed copy, and one request per caption (before:
    the text llm, boxes as coordinates, three requests)."""
    from counterfactory.config import load_config

    cfg = load_config([str(ROOT / "config" / "config.yaml")], study="countercurate")
    section = at.section_of(cfg)
    assert (section["role"], section["images"], section["one_answer"]) == ("vlm", "both", True)
    assert "llava" in cfg["models"]["vlm"]["source"]
    req, skipped = at.requests_for([_item(photo)], section, with_images=section["images"])
    assert list(req["item_id"]) == ["img1_0_all"] and list(req["task"]) == [at.ONE_TASK] and skipped == []
    images = json.loads(req["images"][0])
    assert [i["path"] for i in images] == [str(photo)] * 2
    assert images[0]["boxes"] == [] and [b["label"] for b in images[1]["boxes"]] == ["#1", "#2"]   # plain, then drawn
    prepared = llm.prepare(req)[0]
    assert [s["boxes"] == [] for s in prepared.image_specs()] == [True, False]
    assert "Two pictures are attached" in prepared.user and "(10, 5, 60, 120), outlined in red" in prepared.user
    for kind in at.KINDS:   # all three kinds are asked in the one prompt, and are fields of the one schema
        assert f'Field "{kind}"' in prepared.user
    assert prepared.schema["required"] == list(at.KINDS) and "$" not in prepared.user


def test_the_vlm_receives_both_pictures_plain_first(tiny_vlm, photo):
    """Two image entries per request reach the processor, the second with the boxes drawn on it."""
    runner = llm.Runner(_cfg(tiny_vlm), llm.settings_of({"max_new_tokens": 24}), role="vlm")
    calls = []

    class Spy:
        def __init__(self, inner):
            self.inner, self.tokenizer, self.image_processor = inner, inner.tokenizer, inner.image_processor

        def apply_chat_template(self, *a, **k):
            return self.inner.apply_chat_template(*a, **k)

        def __call__(self, text, images=None, **k):
            enc = self.inner(text=text, images=images, **k)
            calls.append((list(text), list(images or []), tuple(enc["pixel_values"].shape)))
            return enc

    runner.processor = Spy(runner.processor)
    boxes = [{"label": "#1", "box": [10, 5, 60, 120], "color": "red"}]
    schema = {"type": "object", "additionalProperties": False, "required": ["a"],
              "properties": {"a": {"type": "string", "enum": ["yes", "no"]}}}
    req = pd.DataFrame({"item_id": ["r1", "r2"], "task": "adhoc", "prompt": ["first", "second"],
                        "schema": json.dumps(schema),
                        "images": json.dumps([{"path": str(photo)}, {"path": str(photo), "boxes": boxes}])})
    out = llm.run_requests(_cfg(tiny_vlm), req, runner=runner, role="vlm")
    assert out["valid"].all(), out["error"].tolist()
    (texts, images, shape), = calls
    assert len(texts) == 2 and len(images) == 4 and shape[0] == 4       # 2 images per row
    assert all(t.count("<image>") == 2 for t in texts)
    plain, drawn = images[0], images[1]
    assert plain.getpixel((10, 60)) == (255, 255, 255) and drawn.getpixel((10, 60)) == (255, 0, 0)


def test_cache_key_covers_every_picture_and_old_rows_keep_theirs(tiny_vlm, photo, tmp_path):
    from PIL import Image

    def key(rows):
        n = len(next(iter(rows.values())))
        req = pd.DataFrame({"item_id": [f"r{i}" for i in range(n)], "task": "adhoc", "prompt": "p",
                            "schema": json.dumps({"type": "object"}), **rows})
        return list(llm.run_requests(_cfg(tiny_vlm), req, runner=FakeRunner(), role="vlm")["prompt_sha256"])

    red = [{"label": "#1", "box": [10, 5, 60, 120], "color": "red"}]
    blue = [{"label": "#1", "box": [10, 5, 60, 120], "color": "blue"}]
    two = [json.dumps([{"path": str(photo)}, {"path": str(photo), "boxes": b}]) for b in (red, red, blue)]
    a, same, other = key({"images": two})
    assert a == same and a != other          # a changed annotated copy is a different prompt
    other_photo = tmp_path / "img2.jpg"
    Image.new("RGB", (200, 150), "gray").save(other_photo)
    swapped, = key({"images": [json.dumps([{"path": str(other_photo)}, {"path": str(photo), "boxes": red}])]})
    assert swapped != a                       # so is a changed first picture
    # a single image_path row keeps the key of earlier versions (existing answer caches stay valid)
    old, = key({"image_path": [str(photo)], "boxes": [json.dumps(red)]})
    system = llm.prompt_text(llm.SYSTEM_PROMPT).strip()
    assert old == llm.sha256_text(llm.canonical({"system": system, "user": "p",
                                                 "image_sha256": llm._file_sha256(str(photo)), "boxes": red}))


def test_one_answer_is_split_into_per_kind_rows_checked_as_before():
    it = _item()
    req, _ = at.requests_for([it], at.section_of({"attributes": {"images": "none"}}))
    schema = llm.prepare(req)[0].schema
    noun = {"entity_id": "2", "changed_from": "shirt", "changed_to": "jacket",
            "negative": "A man wearing a black jacket and blue jeans stands on the beach."}
    adjective = {**noun, "changed_from": "black shirt", "changed_to": "black jacket"}   # the noun changed: rejected
    whole = {"noun": noun, "adjective": adjective, "swap": None}
    assert llm.check_answer(json.dumps(whole), schema)[1] is None                # swap may be null ("None", §4.4)
    assert "noun" in llm.check_answer(json.dumps({**whole, "noun": None}), schema)[1]   # noun may not
    answers = pd.DataFrame({"item_id": ["img1_0_all"], "prompt_sha256": ["h"], "valid": [True], "error": [None],
                            "answer": [json.dumps(whole)]})
    neg = at.collect([it], req, answers)
    assert list(neg["item_id"]) == ["img1_0_noun", "img1_0_adjective", "img1_0_swap"]
    assert list(neg["status"]) == ["accepted", "rejected", "none"]
    assert "noun changed" in neg["reason"][1] and json.loads(neg["answer"][0]) == noun
    assert list(neg.columns) == at.NEGATIVE_COLUMNS
    assert list(at.t2i_requests(neg)["item_id"]) == ["img1_0_noun"]               # downstream unchanged
    bad = answers.assign(valid=False, error="not valid JSON (cut off)", answer='{"noun": {')
    rejected = at.collect([it], req, bad)
    assert list(rejected["status"]) == ["rejected"] * 3 and rejected["reason"].str.contains("cut off").all()
    # a caption with one marked entity: no swap is asked, and the skipped row says why
    single = at.CaptionItem("img2", 0, "A dog runs.", at.parse_markup("[/EN#7/animals A dog] runs .")[1], {})
    req, skipped = at.requests_for([single], at.section_of({"attributes": {"images": "none"}}))
    fields = json.loads(req["fields"][0])
    assert fields["kinds"] == ["noun", "adjective"] and 'Field "swap"' not in llm.prepare(req)[0].user
    assert skipped == [("img2_0_swap", "swap", "fewer than two marked entities")]


def test_text_only_role_cannot_be_asked_for_pictures(tmp_path, tiny_vlm):
    """The stage and the preflight both refuse a text-only role when pictures are asked (config.json, no weights)."""
    from counterfactory import preflight

    text = tmp_path / "text_llm"
    text.mkdir()
    (text / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    cfg = {"models": {"llm": {"source": str(text)}, "vlm": {"source": str(tiny_vlm)}}, "device": "cpu"}
    with pytest.raises(ConfigError, match="not a vision-language checkpoint"):
        at.attribute_role({**cfg, "attributes": {"role": "llm"}})
    assert at.attribute_role({**cfg, "attributes": {"role": "llm", "images": "none"}}) == "llm"
    assert at.attribute_role({**cfg, "attributes": {}}) == "vlm"

    def check(**attributes):
        full = {**cfg, "studies": ["countercurate"], "countercurate": {"attributes": attributes}}
        return [(c.key, c.status) for c in preflight.attributes_role_check(full)]

    assert check(role="llm") == [("countercurate.attributes.role", preflight.FAIL)]
    assert check(role="vlm") == [("countercurate.attributes.role", preflight.OK)]
    assert check(role="llm", images="none") == []


def test_boxes_come_from_the_entities_annotations():
    """The workflow's captions table has no boxes: they are read from Annotations/ for the drawn copy."""
    root = ROOT / "resources" / "demo" / "flickr30k_entities"
    caption, phrases = at.parse_markup("[/EN#1/people An astronaut] stands .")
    item = at.CaptionItem("1000000001", 0, caption, phrases, {})
    at.add_boxes([item], root)
    assert item.boxes["1"] == [[20.0, 30.0, 120.0, 223.0]] and (item.width, item.height) == (224, 224)


def test_word_start_piece_of_a_llama_vocabulary_is_offered(tiny_vlm):
    """LLaVA's Llama-style vocabulary writes " jeans" as "▁" + "j" ... when it has no "▁j" piece; "▁" alone
    decodes to nothing, and leaving it out left the constrained decoding stuck before such a word (the one-answer
    menu of the paper's example caption was cut off there)."""
    from transformers import AutoProcessor

    tok = AutoProcessor.from_pretrained(tiny_vlm).tokenizer
    space = tok.convert_tokens_to_ids("▁")
    assert tok.decode([space]) == ""
    data = llm._enforcer_tokenizer_data(tok, [tok.eos_token_id])
    assert space in {idx for idx, _, _ in data.regular_tokens}


def test_a_prompt_beyond_the_models_context_is_warned_once(tiny_vlm, photo, caplog):
    """The true-size run's LLaVA-shaped vlm (TinyLLaVA's 2,048 positions) got 3,134-token prompts (two pictures +
    the app. A prompt) with no word from us: answers from positions the model never saw. Now the runner says so,
    once, with the fix; within the context it stays silent."""
    import logging

    runner = llm.Runner(_cfg(tiny_vlm), llm.settings_of({"max_new_tokens": 4}), role="vlm")
    text_config = runner.model.config.get_text_config()
    assert llm.context_length(runner.model) == text_config.max_position_embeddings
    schema = {"type": "object", "additionalProperties": False, "required": ["a"],
              "properties": {"a": {"type": "string", "enum": ["yes", "no"]}}}
    req = pd.DataFrame({"item_id": ["r1", "r2"], "task": "adhoc", "prompt": ["first", "second"],
                        "schema": json.dumps(schema), "images": json.dumps([{"path": str(photo)}])})
    with caplog.at_level(logging.WARNING, logger="counterfactory.text.llm"):
        llm.run_requests(_cfg(tiny_vlm), req, runner=runner, role="vlm")
    assert runner.over_context == 0 and "exceeds the model's context" not in caplog.text
    text_config.max_position_embeddings = 8           # shorter than any prompt with a picture
    with caplog.at_level(logging.WARNING, logger="counterfactory.text.llm"):
        llm.run_requests(_cfg(tiny_vlm), req.assign(item_id=["r3", "r4"], prompt=["third", "fourth"]),
                         runner=runner, role="vlm")
        llm.run_requests(_cfg(tiny_vlm), req.assign(item_id=["r5", "r6"], prompt=["fifth", "sixth"]),
                         runner=runner, role="vlm")
    assert runner.over_context > 8
    assert caplog.text.count("exceeds the model's context of 8 positions") == 1 and "one_answer: false" in caplog.text
