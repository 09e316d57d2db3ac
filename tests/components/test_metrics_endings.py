"""ending_metrics: captions that end on a function word, and the built-in grammars' references."""
import itertools
import string

import pytest

from components.evaluator.metrics.endings import (
    FUNCTION_WORDS,
    ending_metrics,
    is_dangling,
    last_word,
)
from components.synthetic import scenes, scenes_grammar, shapes_grammar
from components.synthetic import shapes as synthetic


@pytest.mark.parametrize("caption", [
    "a red circle with a", "a man riding a horse with a", "a red circle to the left of",
    "a red circle to the left of the", "a red circle and", "a blue square is", "there are",
    "a red circle above", "a green ring next to", "A red circle with A.", "a red circle with, ",
])
def test_a_caption_ending_on_a_function_word_dangles(caption):
    assert is_dangling(caption)


@pytest.mark.parametrize("caption", [
    "a red circle on the left", "a red circle on the right", "a red circle to the left",
    "a large red circle", "two green rings", "a red circle on a black background",
    "a red circle and a blue one", "a woman with a dog beside her", "a bus driving by",
    "there is a red circle over there", "a red circle.", "<unk>",
])
def test_a_complete_caption_does_not_dangle(caption):
    assert not is_dangling(caption)


def test_words_are_normalized_like_the_evaluators_captions():
    assert last_word("A Red Circle, With THE.") == "the"
    assert last_word(["a", "red", "circle", "with", "The"]) == "the"
    assert last_word("") is None and last_word("  ... ") is None and last_word([]) is None
    assert not {"left", "right", "next", "one", "her", "by"} & FUNCTION_WORDS


def test_counts_and_rate_over_non_empty_captions():
    m = ending_metrics(["a red circle with a", "a red circle on the left", "", "a blue square of",
                        ["a", "green", "cross"]])
    assert m == {"dangling_endings": 2, "dangling_ending_rate": 2 / 4, "empty_captions": 1}
    assert ending_metrics(["", " "]) == {"dangling_endings": 0, "dangling_ending_rate": None,
                                         "empty_captions": 2}
    assert ending_metrics([]) == {"dangling_endings": 0, "dangling_ending_rate": None,
                                  "empty_captions": 0}


def test_no_template_of_either_grammar_ends_on_a_function_word():
    # Every frame, filled with every way an object phrase can end (each noun, singular and
    # plural) and every other filler: the last word of every reference the grammars can write.
    nouns = set(shapes_grammar.SHAPES)
    for words in scenes_grammar.KIND_WORDS.values():
        nouns |= set(words) | {scenes_grammar.PLURALS.get(w, w + "s") for w in words}
    others = {"bg": scenes_grammar.BACKGROUNDS, "n": scenes_grammar.NUMBER_WORDS[1:],
              "rel": [p for ps in scenes_grammar.RELATION_WORDING.values() for p in ps]
              + list(shapes_grammar.RELATION_PHRASE.values())
              + list(shapes_grammar.RELATION_ALT_PHRASE.values())}
    others["inv"] = others["rel_alt"] = others["inv_alt"] = others["rel"]
    templates = [t for g in (shapes_grammar.ONE_OBJECT, shapes_grammar.TWO_OBJECTS,
                             shapes_grammar.THREE_OBJECTS)
                 for t in (g["primary"], *g["canonical"], *g["other"])]
    templates += [t for frames in (scenes_grammar.FRAMES_1, scenes_grammar.FRAMES_1_MANY,
                                   scenes_grammar.FRAMES_2, scenes_grammar.FRAMES_2_MANY,
                                   scenes_grammar.FRAMES_2_REL, scenes_grammar.FRAMES_3,
                                   scenes_grammar.FRAMES_3_REL) for t in frames]
    assert len(templates) > 40
    checked = 0
    for template in templates:
        keys = [name for _, name, _, _ in string.Formatter().parse(template) if name]
        objects = [k for k in keys if k not in others]
        for noun, *rest in itertools.product(sorted(nouns), *(others[k] for k in keys
                                                               if k in others)):
            fill = {k: f"a red {noun}" for k in objects}
            fill.update(zip([k for k in keys if k in others], rest, strict=True))
            caption = template.format(**fill)
            assert not is_dangling(caption), caption
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("source, kwargs", [
    (synthetic, {"min_objects": 1, "max_objects": 3}),
    (scenes, {"min_objects": 1, "max_objects": 8}),
])
def test_no_reference_of_the_built_in_sources_dangles(source, kwargs):
    references = [c for ex in source.generate(200, seed=0, **kwargs) for c in ex.captions]
    assert len(references) == 1000
    m = ending_metrics(references)
    assert m == {"dangling_endings": 0, "dangling_ending_rate": 0.0, "empty_captions": 0}
