"""Noun-phrase chunks, class <-> word matching (paper appendix Table 4) and caption synthesis by noun-phrase
removal (counterfactory.text.noun_phrases), with the offline-built NLTK tagger."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from counterfactory.data.flickr30k_entities import parse_sentence, Phrase
from counterfactory.errors import ConfigError, InputError
from counterfactory.text import noun_phrases as npm


@pytest.fixture(scope="module")
def table() -> dict[str, list[str]]:
    return npm.load_matching_table(categories=npm.COCO_CATEGORIES)


def phrases(caption: str) -> list[str]:
    return [s.text for s in npm.noun_phrases(caption)]


# ------------------------------------------------------------------------------------ the table


def test_packaged_table_has_the_80_coco_classes_with_table4_words(table):
    assert list(table) == list(npm.COCO_CATEGORIES) and len(table) == 80
    assert table["frisbee"] == ["frisbee", "disc", "disk", "frisby"]          # class name added first
    assert table["vase"] == ["pot", "vase"]                                    # listed in Table 4 itself: kept
    assert {"man", "woman", "people", "children"} - set(table["person"]) == {"children"}
    assert table["cow"][1:] == ["cattle", "oxen", "ox", "herd", "calves", "bull", "calf"]
    assert table["hot dog"] == ["hot dog", "hot dogs"]                         # not in Table 4: name + plural
    assert table["teddy bear"] == ["teddy bear", "teddy", "toy", "bear", "doll"]
    assert all(ws and ws[0] == c or c in ws for c, ws in table.items())
    text = npm.default_table_path().read_text()
    assert "Appendix A, Table 4" in text and text.count("# not in Table 4") == 33


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "table.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("text, where, problem", [
    ("dog: [puppy]\ncat: [kitten]\ndog: [hound]\n", "class 'dog'", "listed twice (lines 1 and 3)"),
    ("dog: []\n", "class 'dog'", "has no words"),
    ("dog:\n", "class 'dog'", "has no words"),
    ("dog: [puppy, Puppy]\n", "class 'dog'", "word 'Puppy' is listed twice"),
    ("dog: [puppy, 3.5]\n", "class 'dog'", "word 3.5 is not text"),
    ("unicorn: [horn]\n", "class 'unicorn'", "not one of the dataset's categories"),
    ("- dog\n- cat\n", None, "expected a mapping"),
    ("dog: [puppy\n", None, "not valid YAML"),
])
def test_malformed_tables_name_file_class_and_fix(tmp_path, text, where, problem):
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as err:
        npm.load_matching_table(path, categories=["dog", "cat"])
    msg = str(err.value)
    assert str(path) in msg and problem in msg and "Fix:" in msg
    if where:
        assert where in msg


def test_table_missing_a_category_and_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"class 'cat'.*1 category without an entry.*Fix: add an entry"):
        npm.load_matching_table(_write(tmp_path, "dog: [puppy]\n"), categories=["dog", "cat"])
    with pytest.raises(InputError, match="not found"):
        npm.load_matching_table(tmp_path / "nope.yaml")
    # without categories any class names are accepted; the class name is added to its words
    assert npm.load_matching_table(_write(tmp_path, "people: [crowd]\n")) == {"people": ["people", "crowd"]}


# ------------------------------------------------------------------------------------ matching


def test_plurals_rules_and_irregulars():
    assert npm.plurals("dog") == ("dogs",)
    assert npm.plurals("bus") == ("buses", "busses")
    assert npm.plurals("glass") == ("glasses",)
    assert npm.plurals("sandwich") == ("sandwiches",)
    assert npm.plurals("puppy") == ("puppies",) and npm.plurals("cowboy") == ("cowboys",)
    assert npm.plurals("knife") == ("knives",) and npm.plurals("mouse") == ("mice",)
    assert npm.plurals("sheep") == ("sheep",) and npm.plurals("fireman") == ("firemen",)
    assert npm.plurals("human") == ("humans",)
    assert npm.inflections("people") == {"people", "person"} and npm.inflections("oxen") == {"oxen", "ox"}


@pytest.mark.parametrize("phrase, cls", [
    ("two dogs", "dog"), ("the puppies", "dog"), ("three people", "person"), ("some men", "person"),
    ("two women", "person"), ("the children", "person"), ("a child", "person"), ("the mice", "mouse"),
    ("sharp knives", "knife"), ("a flock of sheep", "sheep"), ("the skis", "skis"), ("a ski", "skis"),
    ("two kittens", "cat"), ("the ponies", "horse"), ("geese", "bird"), ("the buses", "bus"),
    ("TWO DOGS", "dog"), ("Pizzas", "pizza"), ("wine glasses", "wine glass"), ("the oxen", "cow"),
])
def test_singular_plural_and_irregular_forms_match(table, phrase, cls):
    assert npm.matches(phrase, table[cls])


def test_multi_word_classes(table):
    matcher = npm.ClassMatcher(table)
    assert matcher.phrase_classes("a traffic light") == {"traffic light"}
    assert matcher.phrase_classes("two hot dogs") == {"hot dog"}          # "hot dog" shadows "dog"
    assert matcher.phrase_classes("a hot-dog") == {"hot dog"}             # hyphen separates words
    assert matcher.phrase_classes("a cell phone") == {"cell phone"}
    assert matcher.phrase_classes("the teddy bears") == {"teddy bear"}    # shadows the bear class
    assert matcher.phrase_classes("a brown bear") == {"bear", "teddy bear"}  # Table 4 lists "bear" for teddy bear
    assert matcher.phrase_classes("a wine glass") == {"wine glass"}       # cup's "glass" is shadowed
    assert matcher.phrase_classes("a glass") == {"wine glass", "cup"}
    # the paper's literal rule: every contained entry counts
    literal = npm.ClassMatcher(table, longest_match=False)
    assert literal.phrase_classes("two hot dogs") == {"hot dog", "dog"}
    # the single-class function looks at that class's words only
    assert npm.matches("a hot dog", table["dog"]) and npm.matches("a hot dog", table["hot dog"])
    assert not npm.matches("a hot", table["hot dog"]) and not npm.matches("a light", table["traffic light"])


def test_word_boundaries(table):
    assert not npm.matches("a category", table["cat"])
    assert not npm.matches("the scattered leaves", table["cat"])
    assert not npm.matches("a doghouse", table["dog"])
    assert not npm.matches("the manager", table["person"])
    assert not npm.matches("a tiebreak", table["tie"])
    assert npm.matches("the cat's bowl", table["cat"]) and npm.matches("a cat-like toy", table["cat"])
    assert npm.matches("a  Cat", "cat")


def test_one_phrase_can_match_two_classes_and_head_only(table):
    matcher = npm.ClassMatcher(table)
    assert matcher.phrase_classes("a baby elephant") == {"person", "elephant"}
    assert matcher.phrase_classes("a dog bed") == {"dog", "bed"}
    head = npm.ClassMatcher(table, head_only=True)
    assert head.phrase_classes("a baby elephant") == {"elephant"}
    assert head.phrase_classes("a dog bed") == {"bed"}
    assert head.phrase_classes("a traffic light") == {"traffic light"}
    assert matcher.matches("a baby elephant", "person") and not head.matches("a baby elephant", "person")


def test_unknown_class_is_a_config_error(table):
    with pytest.raises(ConfigError, match="not in the matching table"):
        npm.ClassMatcher(table, ["dog", "unicorn"])
    with pytest.raises(ConfigError, match="'ball'"):
        npm.remove_phrases("A dog with a ball", ["ball"], table, tagger=lambda s: [])


# ------------------------------------------------------------------------------------ chunks (real tagger)


def test_noun_phrase_chunks(nltk_dir):
    assert phrases("Two dogs fighting over a frisbee") == ["Two dogs", "a frisbee"]
    assert phrases("A man riding a horse next to a traffic light.") == ["A man", "a horse", "a traffic light"]
    assert phrases("Three people eating hot dogs at a picnic.") == ["Three people", "hot dogs", "a picnic"]
    assert phrases("A man holding umbrellas in the rain") == ["A man", "umbrellas", "the rain"]
    assert phrases("A sleeping cat on a wooden table.") == ["A sleeping cat", "a wooden table"]
    assert phrases("A man's hat on a red fire hydrant") == ["A man", "'s hat", "a red fire hydrant"]
    assert phrases("") == [] and npm.noun_phrases(None) == []
    span = npm.noun_phrases('A man says "hi" to a dog.')[-1]
    assert (span.text, span.words, span.tags, span.start, span.end) == ("a dog", ("a", "dog"), ("DT", "NN"), 7, 9)
    assert 'A man says "hi" to a dog.'[span.char_start:span.char_end] == "a dog"


def test_mentions_per_noun_phrase(nltk_dir, table):
    assert npm.mentions("A man on a horse", None, table) == {"person", "horse"}
    assert npm.mentions("A man on a horse", ["horse", "dog"], table) == {"horse"}
    assert npm.mentions("A cat sitting in a category box", None, table) == {"cat"}
    assert npm.mentions("The women and children are watching the sheep.", None, table) == {"person", "sheep"}
    assert npm.mentions("Three people eating hot dogs.", None, table) == {"person", "hot dog"}
    assert npm.mentions("A view of the mountains.", None, table) == set()


# ------------------------------------------------------------------------------------ removal


@pytest.mark.parametrize("caption, classes, expected", [
    ("Two dogs fighting over a frisbee", ["frisbee"], "Two dogs fighting over"),      # the paper's example
    ("Two dogs fighting over a frisbee.", ["frisbee"], "Two dogs fighting over."),
    ("A man riding a horse next to a traffic light.", ["person", "traffic light"], "Riding a horse next to."),
    ("A plate with knives, forks and a donut", ["knife"], "A plate with forks and a donut"),
    ("A dog, a cat and a frisbee on the grass.", ["cat"], "A dog and a frisbee on the grass."),
    ("A dog, a cat and a frisbee on the grass.", ["dog"], "A cat and a frisbee on the grass."),
    ("A man's hat on a red fire hydrant", ["person"], "Hat on a red fire hydrant"),
    ("Three people eating hot dogs at a picnic.", ["dog"], None),                      # hot dog is not dog
    ("Three people eating hot dogs at a picnic.", ["hot dog"], "Three people eating at a picnic."),
    ("A woman on skis in the snow.", ["skis", "person"], "On in the snow."),          # grammar not repaired
    ("A dog.", ["dog"], ""),
    ("A cat sitting in a category box", ["dog"], None),
])
def test_remove_phrases(nltk_dir, table, caption, classes, expected):
    assert npm.remove_phrases(caption, classes, table) == expected


def test_remove_phrases_accepts_a_single_class_and_a_matcher(nltk_dir, table):
    matcher = npm.ClassMatcher(table)
    assert npm.remove_phrases("Two dogs fighting over a frisbee", "frisbee", matcher) == "Two dogs fighting over"
    assert npm.remove_phrases("   ", ["dog"], table) is None


def test_tidy():
    assert npm.tidy("A dog ,  ,  and  . ") == "A dog, and."
    assert npm.tidy(", on the grass ,") == "on the grass"
    assert npm.tidy('A sign ( ) saying " " stop .') == "A sign saying stop."


# ------------------------------------------------------------------------------------ mention matrix


def test_mention_matrix_equals_per_caption_mentions(nltk_dir, table):
    captions = ["Two dogs fighting over a frisbee", "A man on a horse", "Three people eating hot dogs.",
                "A man on a horse", "A cat sitting in a category box", "", None, "A view of the mountains."]
    classes = ["person", "dog", "horse", "frisbee", "hot dog", "cat"]
    calls = []

    def counting_tagger(text):
        calls.append(text)
        return npm.default_tagger(text)

    matrix = npm.mention_matrix(captions, classes, table, tagger=counting_tagger)
    assert matrix.shape == (8, 6) and matrix.dtype == bool
    for row, caption in zip(matrix, captions):
        expected = npm.mentions(caption, classes, table) if caption else set()
        assert {c for c, hit in zip(classes, row) if hit} == expected
    assert len(calls) == 5                       # each distinct usable caption tagged once
    assert npm.mention_matrix(captions[:2], None, table).shape == (2, 80)


def test_odmap_relevance():
    matrix = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=bool)
    # removed class 0, present classes 1 and 2
    assert npm.odmap_relevance(matrix, [0], [1, 2]).tolist() == [False, True, False, False]
    assert npm.odmap_relevance(matrix, [], [0]).tolist() == [True, False, True, False]


# ------------------------------------------------------------------------------------ prompts


def test_prompt_caption_grammar():
    assert npm.prompt_caption(["dog"]) == "a photo of a dog."
    assert npm.prompt_caption(["dog", "frisbee"]) == "a photo of a dog and a frisbee."
    assert npm.prompt_caption(["dog", "cat", "frisbee"]) == "a photo of a dog, a cat and a frisbee."
    assert npm.prompt_caption(["apple", "umbrella", "elephant", "oven"]) == \
        "a photo of an apple, an umbrella, an elephant and an oven."
    assert npm.prompt_caption(["hot dog", "skis", "dog", "dog"]) == "a photo of a hot dog, skis and a dog."
    assert npm.prompt_caption(["person", "dog"], "A photo of {objects}", article=False) == \
        "A photo of person and dog"
    assert npm.indefinite_article("unicycle") == "a" and npm.indefinite_article("hour") == "an"
    assert npm.with_article("teddy_bear") == "a teddy bear"
    templates = ["a photo of {objects}.", "a picture of {objects}."]
    drawn = {npm.prompt_caption(["cat"], templates, rng=random.Random(seed)) for seed in range(20)}
    assert drawn == {"a photo of a cat.", "a picture of a cat."}
    with pytest.raises(ConfigError, match="{objects}"):
        npm.prompt_caption(["cat"], "a photo of a {c}.")
    with pytest.raises(Exception, match="at least one present class"):
        npm.prompt_caption([])


# ------------------------------------------------------------------------------------ Flickr30k


def _flickr(markup: str) -> tuple[str, list[Phrase]]:
    sentence, found = parse_sentence(markup, "Sentences/1.txt", "line 1")
    return sentence, [Phrase(0, t, c, ty, w) for c, ty, t, w in found]


def test_flickr_mentions_and_removal_by_phrase_types():
    sentence, found = _flickr("[/EN#1/people A man] , [/EN#2/animals a dog] and [/EN#3/other a ball] on "
                              "[/EN#4/scene the beach] .")
    assert sentence == "A man , a dog and a ball on the beach ."
    assert npm.flickr_mentions(found, ["people", "animals", "vehicles"]) == {"people", "animals"}
    assert npm.flickr_mentions([p.types for p in found], "scene") == {"scene"}
    assert npm.flickr_remove_phrases(sentence, found, ["animals"]) == "A man and a ball on the beach."
    assert npm.flickr_remove_phrases(sentence, found, ["people"]) == "A dog and a ball on the beach."
    assert npm.flickr_remove_phrases(sentence, found, ["vehicles"]) is None
    with pytest.raises(ConfigError, match="not Flickr30k Entities phrase types"):
        npm.flickr_mentions(found, ["person"])
    with pytest.raises(InputError, match="is not at word"):
        npm.flickr_remove_phrases("A cat on the beach .", found, ["people"])
