"""benchmarks/scst_size_words.py: size words said and how often true, counted on hand-made captions."""
from tests.benchmarks import load_benchmark

OBJECTS = {"a": [{"color": "red", "shape": "circle", "size": "small"},
                 {"color": "blue", "shape": "square", "size": "large"}],
           "b": [{"color": "red", "shape": "circle", "size": "large"},
                 {"color": "red", "shape": "circle", "size": "medium"}]}


def test_size_words_count_matched_phrases_and_true_sizes():
    size_words = load_benchmark("scst_size_words").size_words
    out = size_words([("a", "a large red circle and a big blue square"),  # wrong, right
                      ("a", "a green star"),                               # matches nothing
                      ("b", "two red circles and a medium red disc")],     # unsized; right (any match)
                     OBJECTS)
    assert out["images"] == 3 and out["phrases_per_image"] == round(5 / 3, 3)
    assert out["matched_phrases"] == 4
    assert out["true_sizes"] == {"large": 0.75, "small": 0.25}  # the first matched object's
    assert out["said"] == {"large": {"phrases": 2, "true": 0.5},
                           "medium": {"phrases": 1, "true": 1.0}}
    assert out["size_accuracy"] == round(2 / 3, 3)
    assert size_words([("b", "a picture")], OBJECTS)["size_accuracy"] is None
