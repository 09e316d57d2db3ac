"""grounding_metrics on crafted captions and attention maps."""
import numpy as np
import pytest

from components.evaluator.metrics.grounding import grounding_metrics, merge_grounding

# 4x4 grid: cell (r, c) has centre ((r + .5) / 4, (c + .5) / 4).
RED = {"bbox": (0.0, 0.0, 0.25, 0.25), "color": "red", "shape": "circle", "size": "small"}
BLUE = {"bbox": (0.0, 0.75, 0.25, 1.0), "color": "blue", "shape": "square", "size": "large"}
GREEN = {"bbox": (0.75, 0.75, 1.0, 1.0), "color": "green", "shape": "cross", "size": "small"}


def _maps(cells, grid=4):
    """(T, grid, grid) one-hot maps at the given (row, col) cells."""
    maps = np.full((len(cells), grid, grid), 0.01, np.float32)
    for t, (r, c) in enumerate(cells):
        maps[t, r, c] = 1.0
    return maps / maps.sum(axis=(1, 2), keepdims=True)


def test_grounded_phrase_inside_the_widened_box():
    words = "a small red circle to the left of a large blue square".split()
    # red circle: looks at (0,0) on "circle"; blue square: looks at (3,0) everywhere (far)
    cells = [(3, 3)] * 3 + [(0, 0)] + [(2, 2)] * 4 + [(3, 0)] * 4
    m = grounding_metrics([words], [_maps(cells)], [[RED, BLUE]])
    assert m["num_matched_phrases"] == 2
    assert m["num_grounded"] == 1 and m["grounding"] == 0.5
    assert m["num_grounded_noun"] == 1 and m["grounding_noun"] == 0.5
    assert m["attribute_accuracy"] == 1.0 and m["size_accuracy"] == 1.0
    assert m["relation_accuracy"] == 1.0


def test_widening_by_one_cell_counts_neighbours_only():
    words = ["a", "red", "circle"]
    one_away = grounding_metrics([words], [_maps([(1, 1)] * 3)], [[RED]])
    two_away = grounding_metrics([words], [_maps([(2, 2)] * 3)], [[RED]])
    assert one_away["grounding"] == 1.0 and two_away["grounding"] == 0.0
    strict = grounding_metrics([words], [_maps([(1, 1)] * 3)], [[RED]], widen_cells=0)
    assert strict["grounding"] == 0.0


def test_phrase_grounded_on_article_but_not_on_noun():
    words = ["a", "red", "circle"]
    m = grounding_metrics([words], [_maps([(0, 0), (3, 3), (3, 3)])], [[RED]])
    assert m["grounding"] == 1.0 and m["grounding_noun"] == 0.0


def test_unmatched_phrases_are_not_counted_and_break_attributes():
    words = "a red square to the left of a blue square".split()  # red square is wrong
    m = grounding_metrics([words], [_maps([(0, 3)] * len(words))], [[RED, BLUE]])
    assert m["num_phrases"] == 2 and m["num_matched_phrases"] == 1
    assert m["grounding"] == 1.0
    assert m["attribute_accuracy"] == 0.0
    assert m["relation_accuracy"] == 0.0  # its subject matches no object


@pytest.mark.parametrize("caption, correct", [
    ("a red circle to the left of a blue square", True),
    ("a blue square to the right of a red circle", True),
    ("a blue square is right of a red circle and a green cross", True),
    ("a red circle above a blue square", False),       # mostly horizontal
    ("a blue square to the left of a red circle", False),
    ("a red circle and a blue square", False),         # no relation
    ("a red circle to the left of a red circle", False),
])
def test_relation_accuracy(caption, correct):
    words = caption.split()
    m = grounding_metrics([words], [_maps([(0, 0)] * len(words))], [[RED, BLUE]])
    assert m["relation_accuracy"] == float(correct)
    assert m["num_relation_images"] == 1


def test_attribute_set_must_be_exact_and_rates_aggregate():
    captions = ["a red circle", "a red circle and a blue square", "a blue square above a green cross"]
    objects = [[RED], [RED], [BLUE, GREEN]]
    attention = [_maps([(0, 0)] * len(c.split())) for c in captions]
    m = grounding_metrics(captions, attention, objects)
    assert m["num_images"] == 3
    assert m["num_attribute_correct"] == 2 and m["attribute_accuracy"] == pytest.approx(2 / 3)
    assert m["num_relation_images"] == 1 and m["relation_accuracy"] == 1.0
    assert m["size_accuracy"] is None  # no phrase named a size


def test_extra_end_step_is_ignored_and_short_maps_rejected():
    words = ["a", "red", "circle"]
    m = grounding_metrics([words], [_maps([(0, 0)] * 4)], [[RED]])
    assert m["grounding"] == 1.0
    with pytest.raises(ValueError, match="attention maps"):
        grounding_metrics([words], [_maps([(0, 0)] * 2)], [[RED]])
    with pytest.raises(ValueError, match="differ in length"):
        grounding_metrics([words], [], [[RED]])


def test_empty_inputs_give_none_rates():
    m = grounding_metrics([], [], [])
    assert m["grounding"] is None and m["attribute_accuracy"] is None and m["num_images"] == 0


def test_merging_batches_equals_scoring_every_image_at_once():
    captions = ["a small red circle to the left of a large blue square".split(),
                ["a", "red", "circle"], ["a", "green", "cross"], ["a", "blue", "square"],
                ["nothing", "here"]]
    cells = [[(3, 3)] * 3 + [(0, 0)] + [(2, 2)] * 4 + [(3, 0)] * 4, [(1, 1)] * 3,
             [(3, 3)] * 3, [(0, 0)] * 3, [(0, 0)] * 2]
    objects = [[RED, BLUE], [RED], [GREEN, RED], [BLUE], []]
    maps = [_maps(c) for c in cells]
    whole = grounding_metrics(captions, maps, objects)
    for cut in (1, 2, 4):
        parts = [grounding_metrics(captions[i:i + cut], maps[i:i + cut], objects[i:i + cut])
                 for i in range(0, len(captions), cut)]
        assert merge_grounding(parts) == whole


# -- scenes: synonyms, counted plurals, repeated (color, shape) objects ---------

RING_A = {"bbox": (0.0, 0.0, 0.25, 0.25), "color": "red", "shape": "ring", "size": "small"}
RING_B = {"bbox": (0.75, 0.0, 1.0, 0.25), "color": "red", "shape": "ring", "size": "large"}
STAR = {"bbox": (0.75, 0.75, 1.0, 1.0), "color": "purple", "shape": "star", "size": "small"}


def test_counted_phrase_is_grounded_on_any_of_its_objects():
    words = "two red hoops and a little violet star".split()
    # "hoops" looks at the second ring; the star phrase looks at the star
    cells = [(0, 3), (0, 3), (3, 0)] + [(0, 3)] + [(3, 3)] * 4
    m = grounding_metrics([words], [_maps(cells)], [[RING_A, RING_B, STAR]])
    assert m["num_phrases"] == m["num_matched_phrases"] == 2
    assert m["grounding"] == 1.0 and m["grounding_noun"] == 1.0
    assert m["attribute_accuracy"] == 1.0 and m["size_accuracy"] == 1.0


def test_size_of_a_repeated_object_matches_any_of_them():
    for size, correct in (("big", 1.0), ("little", 1.0), ("medium", 0.0)):
        words = f"a {size} red ring".split()
        m = grounding_metrics([words], [_maps([(0, 0)] * 4)], [[RING_A, RING_B]])
        assert m["size_accuracy"] == correct


@pytest.mark.parametrize("caption, correct", [
    ("a red ring to the left of a violet star", True),  # RING_B is
    ("a red ring below a violet star", False),          # neither is
    ("a purple star to the right of a red ring", True),
    ("a red ring below a red ring", True),       # two distinct rings: B below A
    ("a red ring left of a red ring", False),
])
def test_relation_between_repeated_objects_needs_two_distinct_ones(caption, correct):
    words = caption.split()
    m = grounding_metrics([words], [_maps([(0, 0)] * len(words))], [[RING_A, RING_B, STAR]])
    assert m["relation_accuracy"] == float(correct)
