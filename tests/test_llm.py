"""The ``llm`` role (CounterCurate §3.4 / app. A-B): tiny stand-in, schema-constrained decoding, cache, rejections."""

from __future__ import annotations

import json
from importlib import resources

import pandas as pd
import pytest

from counterfactory.errors import InputError
from counterfactory.text import llm


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    from counterfactory.models import tiny

    return tiny.build("llm", tmp_path_factory.mktemp("tiny_llm"))


pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(path, **section):
    return {"models": {"llm": {"source": str(path)}}, "device": "cpu", "precision": "fp32",
            "llm": {"batch_size": 2, "max_new_tokens": 160, **section}}


SCHEMAS = [
    {"type": "object", "additionalProperties": False, "required": ["entity_id", "negative"],
     "properties": {"entity_id": {"type": "string", "enum": ["18", "19", "203"]},
                    "negative": {"type": "string", "minLength": 1, "maxLength": 40}}},
    {"type": "object", "additionalProperties": False, "required": ["entity_a", "negative"],
     "properties": {"entity_a": {"anyOf": [{"type": "string", "enum": ["1", "2"]}, {"type": "null"}]},
                    "negative": {"anyOf": [{"type": "string", "minLength": 1, "maxLength": 30}, {"type": "null"}]}}},
    {"type": "object", "additionalProperties": False, "required": ["rewrite"],
     "properties": {"rewrite": {"type": "string", "minLength": 1, "maxLength": 50}}},
]


def _requests(n=5):
    prompts = [f"Caption {i}: a man in a red shirt rides a bike near {i} dogs on the beach." * (1 + i % 3)
               for i in range(n)]
    return pd.DataFrame({"item_id": [f"item{i}" for i in range(n)], "task": "adhoc", "prompt": prompts,
                         "schema": [json.dumps(SCHEMAS[i % len(SCHEMAS)]) for i in range(n)]})


def test_tiny_llm_loads_by_path_with_chat_template(tiny_llm):
    from counterfactory.models import registry

    model, tok = registry.load(_cfg(tiny_llm), "llm")
    assert type(model).__name__ == "Qwen2ForCausalLM" and tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    for piece in ('{"', '":', "0", "9", "null", "}"):  # JSON punctuation and digits are tokens
        assert tok.convert_ids_to_tokens(tok.encode(piece, add_special_tokens=False))
    assert registry.loaded_models()["llm"]["fingerprint"] == registry.fingerprint(tiny_llm)


def test_constrained_decoding_is_schema_valid_and_batch_size_independent(tiny_llm):
    req = _requests(5)
    one = llm.run_requests(_cfg(tiny_llm, batch_size=1), req)
    three = llm.run_requests(_cfg(tiny_llm, batch_size=3), req)
    assert list(one.columns) == llm.RESULT_COLUMNS and list(one["item_id"]) == list(req["item_id"])
    assert one["valid"].all(), one[["answer", "error"]].to_string()
    for answer, schema in zip(one["answer"], req["schema"]):
        import jsonschema

        jsonschema.validate(json.loads(answer), json.loads(schema))
    assert list(one["answer"]) == list(three["answer"])
    assert list(one["prompt_sha256"]) == list(three["prompt_sha256"])
    assert not one["cached"].any()


def test_rerun_uses_the_cache_without_loading_the_model(tiny_llm, tmp_path, monkeypatch):
    cache = tmp_path / "cache.jsonl"
    req = _requests(3)
    first = llm.run_requests(_cfg(tiny_llm), req, tmp_path / "a.parquet", cache_path=cache)
    assert len(cache.read_text().splitlines()) == 3

    def no_model(*a, **k):
        raise AssertionError("the model must not be loaded when every answer is cached")

    monkeypatch.setattr(llm, "Runner", no_model)
    again = llm.run_requests(_cfg(tiny_llm, cache=str(cache)), req, tmp_path / "b.parquet")
    assert again["cached"].all() and list(again["answer"]) == list(first["answer"])
    assert pd.read_parquet(tmp_path / "b.parquet")["cached"].all()
    # a changed schema is a different key: generation is needed again
    changed = req.copy()
    changed.loc[0, "schema"] = json.dumps({**SCHEMAS[0], "required": ["negative", "entity_id"]})
    with pytest.raises(AssertionError, match="must not be loaded"):
        llm.run_requests(_cfg(tiny_llm, cache=str(cache)), changed)


def test_invalid_answers_are_rejection_rows(tiny_llm, tmp_path):
    schema = SCHEMAS[0]
    assert llm.check_answer('{"entity_id": "18", "negative": "a dog"}', schema) == \
        ({"entity_id": "18", "negative": "a dog"}, None)
    cases = {
        '{"entity_id": "18", "negat': "not valid JSON",
        '{"entity_id": "7", "negative": "a dog"}': "entity_id",
        '{"entity_id": "18", "negative": ""}': "negative",
        '{"entity_id": "18", "negative": "a", "x": 1}': "Additional properties",
        "": "empty answer",
    }
    for text, reason in cases.items():
        _, error = llm.check_answer(text, schema)
        assert error and reason in error, (text, error)
    # a cached invalid answer (as a model could write when cut off) is a row with valid=False, not a crash
    req = _requests(1).assign(schema=json.dumps(schema))
    cache = tmp_path / "cache.jsonl"
    out = llm.run_requests(_cfg(tiny_llm), req, cache_path=cache)
    rec = json.loads(cache.read_text().splitlines()[0])
    cache.write_text(json.dumps({**rec, "answer": '{"entity_id": "18", "negative": "cut'}) + "\nnot json\n")
    bad = llm.run_requests(_cfg(tiny_llm), req, cache_path=cache)
    assert bool(out["valid"].iloc[0]) and not bool(bad["valid"].iloc[0])
    assert "not valid JSON" in bad["error"].iloc[0] and bool(bad["cached"].iloc[0])


def test_enforcer_schema_drops_min_length_and_tightens_max_length():
    s = llm.enforcer_schema(SCHEMAS[1])
    neg = s["properties"]["negative"]["anyOf"][0]
    assert "minLength" not in neg and neg["maxLength"] == 30 - llm.MAX_WHITESPACE
    assert SCHEMAS[1]["properties"]["negative"]["anyOf"][0]["minLength"] == 1  # the original is untouched


def test_prompts_are_package_resources():
    import counterfactory.studies.countercurate.attributes  # noqa: F401  (registers its tasks)

    folder = resources.files("counterfactory.resources").joinpath("prompts")
    names = {p.name for p in folder.iterdir()}
    assert llm.SYSTEM_PROMPT in names
    for task in llm.TASKS.values():
        assert task.template in names
    assert "JSON" in llm.prompt_text(llm.SYSTEM_PROMPT)
    with pytest.raises(InputError, match="needs the field 'subject'"):
        llm.TASKS["positions_rewrite"].user_prompt({"statement": "a cat is above a dog"})


def test_unknown_task_and_missing_columns_are_input_errors():
    with pytest.raises(InputError, match="unknown llm task"):
        llm.prepare(pd.DataFrame({"item_id": ["a"], "task": ["nope"], "fields": ["{}"]}))
    with pytest.raises(InputError, match="missing column"):
        llm.prepare(pd.DataFrame({"item_id": ["a"]}))


def test_annotate_boxes_draws_on_a_copy():
    from PIL import Image

    image = Image.new("RGB", (40, 30), "black")
    drawn = llm.annotate_boxes(image, [{"box": [2, 2, 20, 20], "label": "#1", "color": "red"}])
    assert image.getpixel((2, 10)) == (0, 0, 0) and drawn.getpixel((2, 10)) == (255, 0, 0)


def test_vision_language_llm_gets_the_annotated_image(tmp_path):
    """A VLM checkpoint as ``llm`` (here the tiny LLaVA of the vlm role) sees the image; answers stay on-schema."""
    pytest.importorskip("counterfactory.models.tiny_vlm")
    from PIL import Image

    from counterfactory.models import tiny

    folder = tiny.build("vlm", tmp_path / "models")
    Image.new("RGB", (64, 48), "white").save(tmp_path / "img.png")
    cfg = _cfg(folder, max_new_tokens=80)
    assert llm.is_multimodal(cfg)
    req = _requests(3).assign(schema=json.dumps(SCHEMAS[0]), prompt=["a dog", "a man on a bike", "two cats"],
                              image_path=[str(tmp_path / "img.png"), str(tmp_path / "img.png"), None],
                              boxes=[json.dumps([{"box": [1, 1, 30, 30], "label": "#1"}]), "[]", "[]"])
    out = llm.run_requests(cfg, req)
    assert out["valid"].all(), out["error"].tolist()
    # the image is part of what the model sees, so it is part of the prompt hash
    text_only = llm.run_requests(cfg, req.assign(image_path=None))
    assert (out["prompt_sha256"] != text_only["prompt_sha256"]).tolist() == [True, True, False]


def test_task_meaning_check_and_rejected_rows_with_reason_codes(monkeypatch):
    """Issue 31 item 5: schema-valid but unusable answers are invalid rows, and every invalid answer is a rejected
    row with a reason code that summaries count."""
    schema = {"type": "object", "required": ["rewrite"], "properties": {"rewrite": {"type": "string"}}}
    task = llm.Task("test_checked", "system.txt", lambda f: schema, render=lambda f: f"answer {f['i']}",
                    check=lambda fields, value: None if fields["word"] in value["rewrite"] else "off topic")
    monkeypatch.setitem(llm.TASKS, task.name, task)
    said = {"a": '{"rewrite": "a dog runs"}', "b": '{"rewrite": "a cat sleeps"}', "c": '{"rewrite": "a',
            "d": '{"rewrite": "a\\tdog"}', "e": ""}

    class FakeRunner:
        generated = 0

        def generate(self, batch):
            return [said[p.item_id] for p in batch]

    monkeypatch.setattr(llm, "model_identity", lambda cfg, role="llm": "fake-llm")
    req = pd.DataFrame({"item_id": list(said), "task": task.name,
                        "fields": [json.dumps({"word": "dog", "i": i}) for i in range(len(said))]})
    out = llm.run_requests({}, req, cache_path="", runner=FakeRunner())
    assert out["valid"].tolist() == [True, False, False, False, False]
    assert out["error"][1] == "failed the task's check: off topic"
    rejected = llm.rejected_rows(out)
    assert list(rejected.columns) == llm.REJECTED_COLUMNS
    assert rejected["reason"].tolist() == ["failed_check", "not_json", "control_character", "empty_answer"]
    assert rejected["detail"].tolist() == out["error"][1:].tolist() and rejected["answer"][0] == said["b"]
    assert llm.reason_counts(pd.concat([rejected, rejected[:1]])) == {
        "failed_check": 2, "control_character": 1, "empty_answer": 1, "not_json": 1}
    assert llm.rejected_rows(out[:1]).empty and llm.reason_counts(llm.rejected_rows(out[:0])) == {}
