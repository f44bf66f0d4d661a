"""CVLD text intervention (§3.2-3.3, app. B): gender swap of captions, edit prompts, majority vote, llm path."""

from __future__ import annotations

import json
import logging

import pandas as pd
import pytest

from counterfactory.errors import ConfigError, InputError
from counterfactory.text import gender, llm
from counterfactory.text.gender import edit_prompt, majority_vote, swap_gender, swap_table

# caption -> (intervened, edit prompt); None = unchanged and "no change". Expected values written by hand.
CASES = {
    "A man riding a horse.": ("A woman riding a horse.", "turn the man into a woman"),
    "a boy and a girl playing": ("a girl and a boy playing", "turn the boy into a girl and the girl into a boy"),
    "Two men and three women.": ("Two women and three men.", "turn the men into women and the women into men"),
    "MAN ON A SURFBOARD": ("WOMAN ON A SURFBOARD", "turn the man into a woman"),
    "The man's hat is red.": ("The woman's hat is red.", "turn the man into a woman"),
    "the women’s team": ("the men’s team", "turn the women into men"),
    "the gentlemen's room": ("the ladies' room", "turn the gentlemen into ladies"),
    "Three ladies' hats": ("Three gentlemen's hats", "turn the ladies into gentlemen"),
    "a manager talks to a human": None,
    "A shepherd with sheep near the shore": None,
    "a cat on a sofa": None,
    "a man-made lake": None,            # hyphenated compounds are one word, not in the list
    "a sales-man sells hats": None,     # (so is the rare spelling "sales-man"; "salesman" is listed)
    "A sportswoman runs.": ("A sportsman runs.", "turn the sportswoman into a sportsman"),
    "A young boy eats.": ("A young girl eats.", "turn the boy into a girl"),           # age kept
    "A woman holding her umbrella.": ("A man holding his umbrella.", "turn the woman into a man"),
    "A man looks at her.": ("A woman looks at him.", "turn the man into a woman"),      # PRP: end of caption
    "He gives her a ball.": ("She gives him a ball.", "turn the man into a woman"),     # PRP: before "a"
    "Her dog runs to her.": ("His dog runs to him.", "turn the woman into a man"),
    "A man helps her up.": ("A woman helps him up.", "turn the man into a woman"),          # object_followers
    "a boy next to her on a bench": ("a girl next to him on a bench", "turn the boy into a girl"),  # before IN
    "A woman lying on her back": ("A man lying on his back", "turn the woman into a man"),
    "A girl with her 3 dogs": ("A boy with his 3 dogs", "turn the girl into a boy"),       # a number is owned
    "She cuts her hair herself.": ("He cuts his hair himself.", "turn the woman into a man"),
    "The hat is his.": ("The hat is hers.", "turn the man into a woman"),
    "Hers is the red one.": ("His is the red one.", "turn the woman into a man"),
    "The boy, his father and his sister.": ("The girl, her mother and her brother.",
                                            "turn the boy into a girl, the father into a mother and the sister "
                                            "into a brother"),
    "Mr. Smith and his wife": ("Mrs. Smith and her husband", "turn the wife into a husband"),
    "A policeman and a businesswoman.": ("A policewoman and a businessman.",
                                         "turn the policeman into a policewoman and the businesswoman into a "
                                         "businessman"),
    "The bride and groom cut the cake.": ("The groom and bride cut the cake.",
                                          "turn the bride into a groom and the groom into a bride"),
    "a guy on a skateboard": ("a woman on a skateboard", "turn the guy into a woman"),  # one way
    "A male tennis player": ("A female tennis player", "turn the man into a woman"),  # adjective: fallback
    "The King and Queen wave.": ("The Queen and King wave.", "turn the king into a queen and the queen into a king"),
    "An actress and her nephew": ("An actor and his niece", "turn the actress into an actor and the nephew into a niece"),
    "  A   man\twith  a dog!! ": ("  A   woman\twith  a dog!! ", "turn the man into a woman"),
    "a man with a man": ("a woman with a woman", "turn the man into a woman"),  # distinct nouns once
    "He smiles.": ("She smiles.", "turn the man into a woman"),
}


@pytest.mark.parametrize("caption", list(CASES))
def test_swap_table_of_tricky_captions(caption, nltk_dir):
    expected = CASES[caption]
    swap = swap_gender(caption)
    if expected is None:
        assert (swap.intervened, swap.changed, swap.edits) == (caption, False, [])
        assert edit_prompt(swap.edits) == "no change"
    else:
        assert swap.intervened == expected[0] and swap.changed
        assert edit_prompt(swap.edits) == expected[1]


def test_edits_are_lower_case_source_target_in_caption_order(nltk_dir):
    swap = swap_gender("Her Brother hugs HIM.")
    assert swap.edits == [("her", "his"), ("brother", "sister"), ("him", "her")]
    assert swap.intervened == "His Sister hugs HER."


def test_her_follows_the_tagger_and_the_tagger_is_called_only_when_needed():
    calls = []

    def tagger(tokens):
        calls.append(tokens)
        return [(t, "PRP" if t == "her" else "NN") for t in tokens]

    assert swap_gender("a woman and her cat", tagger=tagger).intervened == "a man and him cat"  # tagger says PRP
    assert calls == [["a", "woman", "and", "her", "cat"]]
    swap_gender("a woman and a cat", tagger=tagger)
    swap_gender("he sees him", tagger=tagger)  # "him" has one counterpart: no tagging needed
    assert len(calls) == 1
    prp_det = lambda tags: (lambda toks: list(zip(toks, tags)))  # noqa: E731 - a fixed tag sequence
    assert swap_gender("see her very big hat", tagger=prp_det(["VB", "PRP$", "RB", "JJ", "NN"])).intervened == \
        "see his very big hat"                      # adverb before an adjective: still a determiner
    assert swap_gender("see her very well", tagger=prp_det(["VB", "PRP$", "RB", "RB"])).intervened == \
        "see him very well"                         # adverb not before an adjective or noun: object
    assert swap_gender("give her the cup", tagger=prp_det(["VB", "PRP$", "DT", "NN"])).intervened == \
        "give him the cup"                          # a determiner follows: object
    assert swap_gender("her cup", tagger=prp_det(["NN", "NN"])).intervened == "his cup"  # any other tag: by follower
    with pytest.raises(ValueError, match="2 tags for 3 tokens"):
        swap_gender("her red hat", tagger=lambda toks: [("her", "PRP$"), ("red", "JJ")])


def test_edit_prompt_shapes():
    assert edit_prompt([]) == "no change"
    assert edit_prompt([("man", "woman")]) == "turn the man into a woman"
    assert edit_prompt([("woman", "man"), ("girl", "boy")]) == "turn the woman into a man and the girl into a boy"
    assert edit_prompt([("men", "women")]) == "turn the men into women"
    assert edit_prompt([("he", "she")]) == "turn the man into a woman"
    assert edit_prompt([("her", "his"), ("she", "he")]) == "turn the woman into a man"
    assert edit_prompt([("Uncle", "Aunt")]) == "turn the uncle into an aunt"
    assert edit_prompt([("unknown", "word")]) == "no change"


def test_word_list_is_consistent_and_bad_lists_are_config_errors(tmp_path):
    words = gender.load_words()
    for word, target in words.swap.items():
        assert words.gender[word] != words.gender[target], (word, target)
    for word in ("man", "woman", "boy", "girl", "men", "ladies", "guy"):
        assert word in words.nouns
    assert {"men", "women", "ladies", "guys"} <= words.plurals and "man" not in words.plurals
    assert words.swap["guy"] == "woman" and words.swap["woman"] == "man"   # one way
    assert gender.load_words() is words   # cached
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - kind: noun\n    pairs:\n      - [man, woman]\n")
    with pytest.raises(ConfigError, match="list of 4 words"):
        gender.load_words(bad)
    twice = tmp_path / "twice.yaml"
    twice.write_text("groups:\n  - kind: pronoun\n    pairs:\n      - [he, she]\n      - [he, her]\n")
    with pytest.raises(ConfigError, match="listed twice"):
        gender.load_words(twice)
    custom = tmp_path / "custom.yaml"
    custom.write_text("groups:\n  - kind: noun\n    pairs:\n      - [lad, lass, lads, lasses]\n")
    assert swap_gender("A lad and a man", words=custom).intervened == "A lass and a man"


# --------------------------------------------------------------------------- majority vote

M, W, B, NC = "turn the man into a woman", "turn the woman into a man", "turn the boy into a girl", "no change"


def _votes():
    rows = [(1, p) for p in (M, M, M, NC, B)]                                   # 3 of 5: accepted
    rows += [(2, p) for p in (M, M, W, W, B)]                                   # 2-2-1: tie, not accepted
    rows += [(3, p) for p in (NC, NC, NC, M, M)]                                # "no change" majority
    rows += [(4, p) for p in ("Turn the man into a woman.", M, " turn  the man into a woman ", NC)]  # 3 of 4
    rows += [(5, p) for p in (M, M, W, None)]                                   # 2 of 4: not more than half
    return pd.DataFrame(rows, columns=["image_id", "edit_prompt"])


def test_majority_vote_accepts_more_than_half():
    out = majority_vote(_votes()).set_index("image_id")
    assert list(out.index) == [1, 2, 3, 4, 5]
    assert out.loc[1].to_dict() == {"edit_prompt": M, "votes": 3, "n_captions": 5, "accepted": True}
    assert out.loc[2].to_dict() == {"edit_prompt": "", "votes": 2, "n_captions": 5, "accepted": False}
    assert out.loc[3].to_dict() == {"edit_prompt": M, "votes": 2, "n_captions": 5, "accepted": False}
    assert out.loc[4].to_dict() == {"edit_prompt": M, "votes": 3, "n_captions": 4, "accepted": True}
    assert out.loc[5].to_dict() == {"edit_prompt": M, "votes": 2, "n_captions": 4, "accepted": False}


def test_majority_vote_min_agree_and_row_order():
    frame = _votes()
    loose = majority_vote(frame, min_agree=2).set_index("image_id")["accepted"]
    assert loose.to_dict() == {1: True, 2: False, 3: True, 4: True, 5: True}   # a tie is never accepted
    base = majority_vote(frame)
    for seed in range(3):
        pd.testing.assert_frame_equal(majority_vote(frame.sample(frac=1, random_state=seed)), base)
    with pytest.raises(ConfigError, match="min_agree"):
        majority_vote(frame, min_agree=0)
    with pytest.raises(InputError, match="image_id"):
        majority_vote(frame.drop(columns="image_id"))


# --------------------------------------------------------------------------- swap_table


def _captions():
    return pd.DataFrame({"caption_id": ["c1", "c2", "c3", "c4"], "image_id": [1, 1, 1, 2],
                         "caption": ["A man rides.", "A man on a horse.", "A horse.", "A girl and her dog."]})


def test_swap_table_columns_and_vote(nltk_dir, caplog):
    frame = _captions()
    with caplog.at_level(logging.WARNING, logger="counterfactory.text.gender"):
        out = swap_table(frame, source="demo.parquet")
    assert "demo.parquet: 1 of 4 caption(s) have no gendered word" in caplog.text
    assert list(out.columns) == list(frame.columns) + ["intervened", "changed", "edits", "edit_prompt"]
    assert list(frame.columns) == ["caption_id", "image_id", "caption"]   # a copy: the input is untouched
    assert out["intervened"].tolist() == ["A woman rides.", "A woman on a horse.", "A horse.", "A boy and his dog."]
    assert out["changed"].tolist() == [True, True, False, True]
    assert [json.loads(e) for e in out["edits"]] == [[["man", "woman"]], [["man", "woman"]], [],
                                                     [["girl", "boy"], ["her", "his"]]]
    votes = majority_vote(out).set_index("image_id")
    assert votes.loc[1, "accepted"] and votes.loc[1, "edit_prompt"] == M and votes.loc[1, "votes"] == 2
    assert votes.loc[2, "accepted"] and votes.loc[2, "edit_prompt"] == "turn the girl into a boy"


@pytest.mark.parametrize("change, message", [
    (lambda f: f.drop(columns="caption"), r"demo.parquet: missing column\(s\) caption"),
    (lambda f: f.assign(caption_id=["c1", "c2", "c1", "c4"]), r"record caption_id 'c1' \(rows 0 and 2\): duplicate"),
    (lambda f: f.assign(caption=["A man.", "  ", "x", "y"]), r"record caption_id 'c2' \(row 1\): empty caption"),
    (lambda f: f.assign(caption=["A man.", None, "x", "y"]), r"record caption_id 'c2' \(row 1\): empty caption"),
    (lambda f: f.assign(caption_id=["c1", None, "c3", "c4"]), r"record row 1: empty caption_id"),
])
def test_swap_table_input_errors_name_file_and_row(change, message):
    with pytest.raises(InputError, match=message):
        swap_table(change(_captions()), source="demo.parquet")


# --------------------------------------------------------------------------- llm path


def test_llm_requests_render_both_tasks(nltk_dir):
    frame = swap_table(_captions()[:2])
    req = gender.llm_requests(frame)
    assert req["task"].tolist() == [gender.INTERVENE_TASK] * 2 + [gender.EDIT_TASK] * 2
    assert req["item_id"].tolist() == ["c1", "c2", "c1", "c2"]
    assert json.loads(req["fields"][2]) == {"caption": "A man rides.", "intervened": "A woman rides."}
    prepared = llm.prepare(req)
    assert '"A man rides."' in prepared[0].user and "$" not in prepared[0].user
    assert '"A woman rides."' in prepared[2].user and "no change" in prepared[2].user
    assert prepared[0].schema["properties"]["intervened"]["maxLength"] == len("A man rides.") + gender.EXTRA_CHARS
    assert prepared[2].schema["required"] == ["edit_prompt"]
    only = gender.llm_requests(_captions(), tasks=(gender.INTERVENE_TASK,))
    assert set(only["task"]) == {gender.INTERVENE_TASK} and len(only) == 4
    with pytest.raises(InputError, match="needs an intervened column"):
        gender.llm_requests(_captions())


def _answers():
    def row(item, task, answer, valid=True, error=None):
        return {"item_id": item, "task": task, "answer": answer, "valid": valid, "error": error}

    iv, ep = gender.INTERVENE_TASK, gender.EDIT_TASK
    return pd.DataFrame([
        row("c1", iv, '{"intervened": "A woman rides."}'), row("c1", ep, '{"edit_prompt": "Turn the man into a woman."}'),
        row("c2", iv, '{"intervened": "A woman on a horse."}'), row("c2", ep, '{"edit_prompt": "turn the man into a woman"}'),
        row("c3", iv, '{"intervened": "A horse."}'), row("c3", ep, '{"edit_prompt": "No change"}'),
        row("c4", iv, '{"intervened": "A boy and', False, "not valid JSON"),
    ])


def test_parse_llm_answers_round_trip():
    out = gender.parse_llm_answers(_answers(), _captions())
    assert out["intervened"].tolist() == ["A woman rides.", "A woman on a horse.", "A horse.", None]
    assert out["changed"].tolist() == [True, True, False, False]
    assert out["edit_prompt"].tolist() == [M, M, NC, ""]
    assert out["llm_valid"].tolist() == [True, True, True, False]
    assert out["llm_error"].tolist()[3] == "cvld_intervene: not valid JSON"
    votes = majority_vote(out).set_index("image_id")
    assert votes.loc[1, "accepted"] and votes.loc[1, "votes"] == 2 and not votes.loc[2, "accepted"]
    bare = gender.parse_llm_answers(_answers())
    assert bare["item_id"].tolist() == ["c1", "c2", "c3", "c4"]
    assert bare["changed"].tolist() == [True, True, False, False]
    blank = _answers().assign(answer=lambda f: f["answer"].where(f.index != 0, '{"intervened": "  "}'))
    assert gender.parse_llm_answers(blank)["llm_error"][0] == "cvld_intervene: empty answer"
    with pytest.raises(InputError, match="two answers"):
        gender.parse_llm_answers(pd.concat([_answers(), _answers()[:1]]))


def test_edit_prompt_answers_keep_the_rule_based_intervention(nltk_dir):
    frame = swap_table(_captions())
    answers = _answers()[lambda f: f["task"] == gender.EDIT_TASK]
    out = gender.parse_llm_answers(answers, frame)
    assert out["intervened"].tolist() == frame["intervened"].tolist()
    assert out["edit_prompt"].tolist() == [M, M, NC, ""] and out["llm_error"][3] == "no llm answer"


@pytest.mark.usefixtures("one_thread")
def test_run_llm_with_the_tiny_llm(tmp_path):
    from counterfactory.models import tiny

    folder = tiny.build("llm", tmp_path / "models")
    cfg = {"models": {"llm": {"source": str(folder)}}, "device": "cpu", "precision": "fp32",
           "llm": {"batch_size": 2, "max_new_tokens": 40}}
    out = gender.run_llm(cfg, _captions(), out=tmp_path / "llm.parquet", answers_out=tmp_path / "answers.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "llm.parquet"), out, check_dtype=False)
    answers = pd.read_parquet(tmp_path / "answers.parquet")
    n_ok = int(out["intervened"].notna().sum())
    assert (answers["task"] == gender.INTERVENE_TASK).sum() == 4 and (answers["task"] == gender.EDIT_TASK).sum() == n_ok
    for rec in out.to_dict("records"):   # random answers: each row is either readable or carries its reason
        assert rec["llm_valid"] or rec["llm_error"]
        assert rec["intervened"] is None or rec["intervened"].strip()
    assert majority_vote(out)["n_captions"].tolist() == [3, 1]


# --------------------------------------------------------------------------- appendix B: one direction per pass
def test_llm_intervention_is_written_per_direction_as_in_appendix_b(monkeypatch):
    from counterfactory.studies.cvld import intervention as iv
    from counterfactory.studies.cvld import settings as cvld_settings

    assert cvld_settings.settings(None)["intervention"]["llm_prompt"] == "per_direction"
    frame = pd.DataFrame({"caption_id": ["1_0", "1_1", "1_2", "2_0", "3_0"], "image_id": [1, 1, 1, 2, 3],
                          "caption": ["A woman and a girl eat.", "A person eats.", "A man and a woman eat.",
                                      "A boy runs.", "A cat sleeps."]})
    req = iv.requests(frame)
    # image 1 names female people more often: every caption of it is turned male; image 2 male -> female
    assert req["direction"].tolist() == ["to_male"] * 3 + ["to_female"] * 2
    to_male = llm.prepare(req.drop(columns=["direction"]))[0]
    assert "make every female person male" in to_male.user and '"A woman and a girl eat."' in to_male.user
    assert "female person male" not in req["prompt"][3] and "make every male person female" in req["prompt"][3]
    assert to_male.schema["properties"]["intervened"]["maxLength"] == len(frame["caption"][0]) + gender.EXTRA_CHARS

    answers = {"1_0": "A man and a boy eat.", "1_1": "A person eats.", "1_2": "A man and a man eat.",
               "2_0": "A girl runs.", "3_0": "A cat sleeps."}
    edits = {"1_0": "turn the woman into a man and the girl into a boy", "1_1": "no change",
             "1_2": "turn the woman into a man", "2_0": "turn the boy into a girl", "3_0": "no change"}
    asked = []

    def fake_run_requests(cfg, requests, cache_path=None):
        asked.append(requests)
        key = "intervened" if (requests["task"] == gender.INTERVENE_TASK).all() else "edit_prompt"
        table = answers if key == "intervened" else edits
        return pd.DataFrame({"item_id": requests["item_id"], "task": requests["task"],
                             "answer": [json.dumps({key: table[i]}) for i in requests["item_id"]],
                             "valid": True, "error": None})

    monkeypatch.setattr(llm, "run_requests", fake_run_requests)
    out = iv.run_llm({}, frame)
    assert "prompt" in asked[0].columns and (asked[1]["task"] == gender.EDIT_TASK).all()
    assert out["intervened"].tolist() == list(answers.values())
    assert out["changed"].tolist() == [True, False, True, True, False]
    assert out["direction"].tolist() == req["direction"].tolist()
    with pytest.raises(ValueError, match="direction"):
        iv.instruction("A man.", "both")


# --------------------------------------------------------------------------- meaning checks and rejected rows
def test_vote_for_an_image_naming_no_gendered_person_is_rejected_with_its_reason(monkeypatch, tmp_path):
    """Issue 31 item 5: the llm agreed (3 of 3) on "turn the woman into a man" for a photo of coins; an invalid
    answer left no reason in any output. Both must be rows of the rejected table, counted in the summary."""
    from counterfactory.studies.cvld import data as cvld_data
    from counterfactory.studies.cvld import intervention as iv
    from counterfactory.studies.cvld import pipeline

    frame = pd.DataFrame({"caption_id": ["7_0", "7_1", "7_2", "8_0", "8_1", "8_2", "8_3"],
                          "image_id": [7, 7, 7, 8, 8, 8, 8], "split": "train",
                          "caption": ["A pile of coins.", "Old coins on a table.", "Some silver coins.",
                                      "A woman rides a horse.", "A woman on a horse.", "A rider and a horse.",
                                      "A woman and her horse."], "image_path": "x.jpg"})
    monkeypatch.setattr(cvld_data, "captions", lambda s, dataset="coco": frame)
    monkeypatch.setattr(cvld_data, "subset_of", lambda ids, fraction, seed=0: pd.Series(True, index=ids.index))

    def fake_run_requests(cfg, requests, cache_path=None):
        rows = []
        for item, task in zip(requests["item_id"], requests["task"]):
            if task == gender.INTERVENE_TASK and item == "8_3":
                rows.append({"answer": '{"intervened": "A man and', "valid": False,
                             "error": "not valid JSON (Unterminated string at character 14; cut off?)"})
                continue
            key = "intervened" if task == gender.INTERVENE_TASK else "edit_prompt"
            text = "A man with some coins." if key == "intervened" else "turn the woman into a man"
            rows.append({"answer": json.dumps({key: text}), "valid": True, "error": None})
        return pd.DataFrame({"item_id": requests["item_id"], "task": requests["task"], **pd.DataFrame(rows)})

    monkeypatch.setattr(llm, "run_requests", fake_run_requests)
    out = {k: tmp_path / f"{k}.parquet" for k in ("captions", "votes", "requests", "rejected")}
    counts = pipeline.intervene({"intervention": {"text_method": "llm"}}, out["captions"], out["votes"],
                                out["requests"], tmp_path / "summary.csv", out_rejected=out["rejected"])
    votes = pd.read_parquet(out["votes"]).set_index("image_id")
    assert votes.loc[7, "votes"] == 3 and not votes.loc[7, "accepted"]
    assert votes.loc[7, "reason"] == iv.NO_GENDERED_PERSON and votes.loc[8, "accepted"]
    assert pd.read_parquet(out["requests"])["image_id"].tolist() == [8]
    rejected = pd.read_parquet(out["rejected"])
    assert list(rejected.columns) == iv.REJECTED_COLUMNS
    assert rejected[["stage", "item_id", "task", "reason"]].values.tolist() == [
        ["caption", "8_3", gender.INTERVENE_TASK, "not_json"], ["image", "7", "vote", iv.NO_GENDERED_PERSON]]
    assert "not valid JSON" in rejected["detail"][0] and "turn the woman into a man" in rejected["detail"][1]
    summary = dict(pd.read_csv(tmp_path / "summary.csv").values.tolist())
    assert summary["rejected answers: not_json"] == 1 and summary["rejected images: no_gendered_person"] == 1
    assert counts["accepted images"] == 1


def test_names_gendered_person_uses_the_word_list():
    from counterfactory.studies.cvld import intervention as iv

    assert iv.names_gendered_person("A Woman with coins") and iv.names_gendered_person("he holds her bag")
    for caption in ("a pile of coins", "a person rides", "a man-made lake", None):
        assert not iv.names_gendered_person(caption)
