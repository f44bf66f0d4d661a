"""Flickr30k-Attributes (CounterCurate §3.4, app. A) and the above/below rewrite task (app. B)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from counterfactory.config import fill_section
from counterfactory.errors import ConfigError, InputError
from counterfactory.studies.countercurate import attributes as at
from counterfactory.text import llm

# the paper's example caption (§3.4), in Flickr30k Entities markup
MARKUP = ("[/EN#1/people A man] wearing [/EN#2/clothing a black shirt] and [/EN#3/clothing blue jeans] "
          "stands on [/EN#4/scene the beach] .")
CAPTION = "A man wearing a black shirt and blue jeans stands on the beach."


def _item():
    caption, phrases = at.parse_markup(MARKUP)
    return at.CaptionItem("img1", 0, caption, phrases, {"1": [[10, 5, 60, 120]], "2": [[20, 30, 55, 70]]},
                          width=200, height=150)


def test_markup_is_parsed_and_round_trips():
    caption, phrases = at.parse_markup(MARKUP)
    assert caption == CAPTION
    assert [(p.entity_id, p.types, p.text, p.start, p.end) for p in phrases] == [
        ("1", ("people",), "A man", 0, 2), ("2", ("clothing",), "a black shirt", 3, 6),
        ("3", ("clothing",), "blue jeans", 7, 9), ("4", ("scene",), "the beach", 11, 13)]
    assert at.parse_markup(at.markup_of(caption, phrases)) == (caption, phrases)
    # the reader's table form (caption + phrases with first_word_index) gives the same phrases
    recs = [{"phrase": p.text, "entity_id": p.entity_id, "types": list(p.types), "first_word_index": fwi}
            for p, fwi in zip(phrases, (0, 3, 7, 11))]
    assert at.locate_phrases(CAPTION, recs) == phrases
    with pytest.raises(ValueError, match="not in the caption"):
        at.locate_phrases(CAPTION, [{"text": "a red hat", "entity_id": "9"}])


def _edit(to_from, neg, eid):
    return {"entity_id": eid, "changed_from": to_from[0], "changed_to": to_from[1], "negative": neg}


def test_noun_answers():
    it = _item()
    ok = at.check_edit("noun", it, _edit(("a black shirt", "a black jacket"),
                                         "A man wearing a black jacket and blue jeans stands on the beach.", "2"))
    assert ok[:2] == ("accepted", None)
    bad = {
        "adjective change": (_edit(("a black shirt", "a red shirt"),
                                   "A man wearing a red shirt and blue jeans stands on the beach.", "2"), "unchanged"),
        "plural only": (_edit(("a black shirt", "black shirts"),
                              "A man wearing black shirts and blue jeans stands on the beach.", "2"), "plural"),
        "two phrases": (_edit(("a black shirt", "a black jacket"),
                              "A man wearing a black jacket and red jeans stands on the beach.", "2"), "outside"),
        "same caption": (_edit(("A man", "A man"), CAPTION.lower(), "1"), "caption itself"),
        "wrong from": (_edit(("a hat", "a black jacket"),
                             "A man wearing a black jacket and blue jeans stands on the beach.", "2"), "changed_from"),
        "wrong to": (_edit(("a black shirt", "a coat"),
                           "A man wearing a black jacket and blue jeans stands on the beach.", "2"), "changed_to"),
        "article": (_edit(("A man", "The man"), "The man wearing a black shirt and blue jeans stands on the beach.",
                          "1"), "article"),
        "unknown id": (_edit(("A man", "A woman"), "A woman wearing a black shirt and blue jeans stands on the beach.",
                             "0"), "not a marked phrase"),
        "empty": (_edit(("A man", "A woman"), "  ", "1"), "empty"),
    }
    for name, (answer, reason) in bad.items():
        status, why, _ = at.check_edit("noun", it, answer)
        assert status == "rejected" and reason in why, (name, why)


def test_adjective_answers():
    it = _item()
    ok = at.check_edit("adjective", it, _edit(("blue jeans", "red jeans"),
                                              "A man wearing a black shirt and red jeans stands on the beach.", "3"))
    assert ok[0] == "accepted" and ok[2]["entity_ids"] == ["3"]
    status, why, _ = at.check_edit("adjective", it, _edit(
        ("a black shirt", "a black jacket"), "A man wearing a black jacket and blue jeans stands on the beach.", "2"))
    assert status == "rejected" and "noun changed" in why


def test_swap_answers():
    it = _item()
    swap = {"entity_a": "2", "entity_b": "3",
            "negative": "A man wearing a blue shirt and black jeans stands on the beach."}
    assert at.check_swap(it, swap)[:2] == ("accepted", None)
    order = {"entity_a": "2", "entity_b": "3",
             "negative": "A man wearing blue jeans and a black shirt stands on the beach."}
    assert at.check_swap(it, order)[0] == "accepted"
    assert at.check_swap(it, {"entity_a": None, "entity_b": None, "negative": None})[0] == "none"
    cases = {
        "incomplete": ({"entity_a": "2", "entity_b": None, "negative": swap["negative"]}, "incomplete"),
        "same entity": ({**swap, "entity_b": "2"}, "two different"),
        "new word": ({**swap, "negative": "A man wearing a red shirt and black jeans stands on the beach."},
                     "added: red"),
        "one phrase": ({**swap, "negative": "A man wearing a shirt black and blue jeans stands on the beach."},
                       "only phrase #2"),
        "outside": ({**swap, "entity_b": "4", "negative": "A man wearing a blue shirt and black jeans stands on "
                     "the beach."}, "outside"),
    }
    for name, (answer, reason) in cases.items():
        status, why, _ = at.check_swap(it, answer)
        assert status == "rejected" and reason in why, (name, why)


def test_rewrite_task_app_b():
    fields = {"statement": "a street is above a young child", "subject": "a street", "relation": "above",
              "object": "a young child", "max_chars": 200}
    good = {"rewrite": "the street stretches out above a young child, elevated by a bridge"}
    assert at.check_rewrite(fields, good) == ("accepted", None)
    assert "does not mention the object" in at.check_rewrite(fields, {"rewrite": "a street runs above a bridge"})[1]
    assert "more than one sentence" in at.check_rewrite(fields, {"rewrite": "A street is above. A child plays."})[1]
    assert "does not say" in at.check_rewrite(fields, {"rewrite": "a street next to a young child"})[1]
    assert at.check_rewrite(fields, {"rewrite": "a street next to a young child"},
                            {"require_relation_word": False})[0] == "accepted"
    req = at.rewrite_requests(pd.DataFrame({"item_id": ["p1"], "subject": ["a dog"], "relation": ["below"],
                                            "object": ["a man"]}))
    prepared = llm.prepare(req)[0]
    assert "a dog is below a man" in prepared.user and "$" not in prepared.user
    rewrite_max = fill_section("countercurate.positions_rewrite")["max_chars"]     # the schema's default (app. B)
    assert prepared.schema["properties"]["rewrite"]["maxLength"] == rewrite_max == 200
    with pytest.raises(InputError, match="not above or below"):
        at.rewrite_requests(pd.DataFrame({"item_id": ["p"], "subject": ["a"], "relation": ["left"], "object": ["b"]}))


#: the per-kind, text-only path (ours, option): one request per caption and kind, boxes as coordinates
PER_KIND = {"attributes": {"one_answer": False, "images": "none", "role": "llm"}}


def test_requests_have_per_caption_schemas_and_prompts():
    section = at.section_of(PER_KIND)
    single = at.CaptionItem("img2", 0, "A dog runs.", at.parse_markup("[/EN#7/animals A dog] runs .")[1], {})
    req, skipped = at.requests_for([_item(), single], section)
    assert list(req["item_id"]) == ["img1_0_noun", "img1_0_adjective", "img1_0_swap", "img2_0_noun",
                                    "img2_0_adjective"]
    assert skipped == [("img2_0_swap", "swap", "fewer than two marked entities")]
    prepared = llm.prepare(req)
    assert prepared[0].schema["properties"]["entity_id"]["enum"] == ["1", "2", "3", "4"]
    assert prepared[2].schema["properties"]["entity_a"]["anyOf"][1] == {"type": "null"}
    for p in prepared:
        assert "$" not in p.user and "[/EN#" in p.user and "(10, 5, 60, 120)" in p.user or p.item_id.startswith("img2")
    odd = at.CaptionItem("a/b c", 0, "A dog runs.", at.parse_markup("[/EN#7/animals A dog] runs .")[1], {})
    assert at.item_id_of(odd, "noun") == "a-b-c_0_noun"      # ids name the t2i images: file-name characters only
    with pytest.raises(ConfigError, match="kinds"):
        at.section_of({"attributes": {"kinds": ["colour"]}})


def test_caption_selection_and_table_input():
    frame = pd.DataFrame({"image_id": ["b", "a", "a"], "sentence_index": [0, 1, 0],
                          "markup": [MARKUP, "[/EN#5/people Two very tall women] walk .", MARKUP]})
    items = at.read_captions(frame)
    assert [(i.image_id, i.sentence_index) for i in at.select_captions(items, at.section_of({}))] == \
        [("a", 0), ("b", 0)]
    longest = at.select_captions(items, at.section_of({"attributes": {"caption": "longest"}}))
    assert [(i.image_id, i.sentence_index) for i in longest] == [("a", 0), ("b", 0)]
    assert len(at.select_captions(items, at.section_of({"attributes": {"caption": "all", "limit_images": 1}}))) == 2
    with pytest.raises(InputError, match="more than once"):
        at.read_captions(pd.concat([frame, frame.iloc[:1]]))


def test_collect_and_t2i_requests_from_hand_made_answers():
    it = _item()
    req, _ = at.requests_for([it], at.section_of(PER_KIND))
    answers = pd.DataFrame({
        "item_id": list(req["item_id"]), "prompt_sha256": ["x"] * 3, "valid": [True, True, False],
        "error": [None, None, "not valid JSON"],
        "answer": [json.dumps(_edit(("a black shirt", "a black jacket"),
                                    "A man wearing a black jacket and blue jeans stands on the beach.", "2")),
                   json.dumps(_edit(("a black shirt", "a black jacket"),
                                    "A man wearing a black jacket and blue jeans stands on the beach.", "2")),
                   '{"entity_a": "2"']})
    neg = at.collect([it], req, answers)
    assert list(neg["status"]) == ["accepted", "rejected", "rejected"]
    assert "noun changed" in neg["reason"].iloc[1] and "invalid llm answer" in neg["reason"].iloc[2]
    t2i = at.t2i_requests(neg)
    assert t2i.to_dict("records") == [{"item_id": "img1_0_noun", "kind": "t2i",
                                       "prompt": "A man wearing a black jacket and blue jeans stands on the beach.",
                                       "image_id": "img1", "source_kind": "noun", "caption": CAPTION}]


def test_stage_runs_end_to_end_with_the_tiny_llm(tmp_path):
    import torch

    from counterfactory.models import tiny

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        folder = tiny.build("llm", tmp_path / "models")
        cfg = {"models": {"llm": {"source": str(folder)}}, "device": "cpu",
               "llm": {"batch_size": 3, "max_new_tokens": 400},
               "attributes": {"extra_negative_chars": 10, **PER_KIND["attributes"]}}
        captions = pd.DataFrame({"image_id": ["img1"], "sentence_index": [0], "markup": [MARKUP]})
        neg = at.run(cfg, captions, tmp_path / "neg.parquet", tmp_path / "t2i.parquet",
                     answers_out=tmp_path / "answers.parquet", cache_path=tmp_path / "cache.jsonl")
    finally:
        torch.set_num_threads(threads)
    assert list(neg.columns) == at.NEGATIVE_COLUMNS and len(neg) == 3
    assert set(neg["status"]) <= {"accepted", "rejected", "none"}
    assert neg.loc[neg["status"] == "rejected", "reason"].notna().all()
    answers = pd.read_parquet(tmp_path / "answers.parquet")
    assert answers["valid"].all(), answers["error"].tolist()  # constrained decoding: parseable, on-schema JSON
    t2i = pd.read_parquet(tmp_path / "t2i.parquet")
    assert list(t2i.columns) == at.T2I_COLUMNS and len(t2i) == (neg["status"] == "accepted").sum()


def test_cli_is_registered():
    import argparse

    from counterfactory.commands import countercurate as cmd

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cmd.add_attributes(sub)
    args = parser.parse_args(["attributes", "--config", "c.yaml", "--captions", "c.parquet", "--out", "o.parquet",
                              "--out-requests", "t.parquet"])
    assert args.func is cmd._cmd_attributes and args.out_requests == "t.parquet"
    for name in ("positions-rewrite", "llm"):  # llm: the old name, kept as an alias
        args = parser.parse_args([name, "--config", "c.yaml", "--requests", "r.parquet", "--out", "o.parquet"])
        assert args.func is cmd._cmd_llm


def test_off_topic_rewrite_is_a_rejected_row_and_never_the_gligen_prompt(tmp_path, monkeypatch, capsys):
    """Issue 31 item 5: check_rewrite was never called, so "a cat sleeps on the sofa" became the GLIGEN prompt."""
    from counterfactory.cli import main
    from counterfactory.studies.countercurate import positions as P

    pairs = pd.DataFrame({"item_id": ["i1", "i2", "i3"], "subject": "a young child", "relation": "above",
                          "object": ["a street", "a road", "a bridge"]})
    at.rewrite_requests(pairs).to_parquet(tmp_path / "requests.parquet")
    said = {"i1": '{"rewrite": "a young child hovers high above a busy street"}',
            "i2": '{"rewrite": "a cat sleeps on the sofa"}', "i3": '{"rewrite": "a young chi'}

    class FakeRunner:
        def __init__(self, cfg, settings, role="llm"):
            assert role == "llm"   # app. B stays with the text llm (the paper's rewrite prompt has no image)

        def generate(self, batch):
            return [said[p.item_id] for p in batch]

    monkeypatch.setattr(llm, "Runner", FakeRunner)
    monkeypatch.setattr(llm, "model_identity", lambda cfg, role="llm": "fake-llm")
    answers, rejected = tmp_path / "rewrites.parquet", tmp_path / "rejected.parquet"
    job = {"study": "countercurate", "run_name": "t", "models": {"llm": {"source": "./no-model"}}, "llm": {},
           "positions_rewrite": {}, "counterfactory_job": {"digest": "t", "sections": ["llm", "models",
                                                                                     "positions_rewrite"]}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    assert main(["countercurate", "positions-rewrite", "--config", str(tmp_path / "job.yaml"), "--requests",
                 str(tmp_path / "requests.parquet"), "--out", str(answers), "--rejected", str(rejected),
                 "--cache", str(tmp_path / "cache.jsonl")]) == 0
    assert "rejected: 1 failed_check, 1 not_json" in capsys.readouterr().out
    got = pd.read_parquet(answers)
    assert got["valid"].tolist() == [True, False, False]
    assert "does not mention the subject 'a young child'" in got["error"][1]
    rows = pd.read_parquet(rejected)
    assert list(rows.columns) == llm.REJECTED_COLUMNS
    assert rows[["item_id", "reason"]].values.tolist() == [["i2", "failed_check"], ["i3", "not_json"]]
    assert rows["answer"][0] == said["i2"] and "does not mention the subject" in rows["detail"][0]
    prompts = P.apply_rewrites(pd.DataFrame({"item_id": ["i1", "i2", "i3"], "prompt": "vanilla"}), got)
    assert prompts["prompt"].tolist() == ["a young child hovers high above a busy street", "vanilla", "vanilla"]
    assert prompts["prompt_source"].tolist() == ["llm", "template", "template"]


def test_answer_menu_offers_only_checked_answers_and_steers_the_tiny_llm(tmp_path):
    """Issue 32.11: with ``answer_menu`` (the demo's setting) the tiny random model's constrained answers are
    accepted negatives, so the demo runs the t2i path and the Attributes export -- also on the paper path the demo
    now takes (issue 29.2: the tiny vlm sees the photograph and its boxed copy and answers once per caption)."""
    import torch
    import yaml
    from PIL import Image

    from counterfactory.models import tiny

    it = _item()
    for kind in at.KINDS:
        menu = at.answer_menu(it, kind, 3)
        assert len(menu) == 3
        for answer in menu:
            status = (at.check_swap(it, answer) if kind == "swap" else at.check_edit(kind, it, answer))[0]
            assert status == "accepted", (kind, answer)
    assert at.answer_menu(it, "noun", 1)[0] == {"entity_id": "1", "changed_from": "man", "changed_to": "shirt",
                                                "negative": "A shirt wearing a black shirt and blue jeans stands on "
                                                            "the beach."}
    req, _ = at.requests_for([it], at.section_of({"attributes": {**PER_KIND["attributes"], "answer_menu": 2}}))
    schema = llm.prepare(req)[2].schema
    assert len(schema["anyOf"]) == 2 and schema["anyOf"][0]["properties"]["entity_a"] == {"enum": ["1"]}
    assert "anyOf" not in llm.prepare(at.requests_for([it], at.section_of(PER_KIND))[0])[0].schema   # free text
    one = llm.prepare(at.requests_for([it], at.section_of({"attributes": {"answer_menu": 2}}))[0])[0].schema
    assert [len(one["properties"][k]["anyOf"]) for k in at.KINDS] == [2, 2, 2]   # one menu per kind
    assert "anyOf" not in one["properties"]["noun"] or len(one["properties"]["noun"]["anyOf"]) == 2
    demo = yaml.safe_load((Path(__file__).parents[1] / "config" / "demo.yaml").read_text())["countercurate"]
    assert demo["attributes"]["answer_menu"] > 0
    section = at.section_of({"attributes": demo["attributes"]})
    assert (section["role"], section["images"], section["one_answer"]) == ("vlm", "both", True)   # the paper path
    Image.new("RGB", (200, 150), "white").save(tmp_path / "img1.jpg")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = {"models": {"vlm": {"source": str(tiny.build("vlm", tmp_path / "models"))}}, "device": "cpu",
               "llm": demo["llm"], "attributes": demo["attributes"]}
        short = "[/EN#1/people A man] holds [/EN#2/other a red kite] ."   # short answers: a faster test
        captions = pd.DataFrame({"image_id": ["img1"], "sentence_index": [0], "markup": [short],
                                 "image_path": [str(tmp_path / "img1.jpg")],
                                 "boxes": [json.dumps({"1": [[10, 5, 60, 120]], "2": [[20, 30, 55, 70]]})]})
        neg = at.run(cfg, captions, requests_out=tmp_path / "t2i.parquet", answers_out=tmp_path / "answers.parquet")
    finally:
        torch.set_num_threads(threads)
    assert len(pd.read_parquet(tmp_path / "answers.parquet")) == 1     # one answer for the three kinds
    assert list(neg["status"]) == ["accepted"] * 3, neg[["kind", "reason"]].to_string()
    assert len(pd.read_parquet(tmp_path / "t2i.parquet")) == 3
