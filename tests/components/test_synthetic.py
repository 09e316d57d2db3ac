"""The synthetic shapes generator, its caption grammar and its TFDS builder."""
import io
import itertools

import numpy as np
import pytest
from PIL import Image

from components.synthetic import shapes as synthetic
from components.synthetic import shapes_grammar as g
from tests.components.sources.raw_examples import check_object, decoded_png_example


@pytest.fixture(scope="module")
def examples():
    return list(synthetic.generate(150, image_size=64, seed=7))


def _decode(ex):
    return np.array(Image.open(io.BytesIO(ex.image_bytes)))


# -- generator ---------------------------------------------------------------

def test_same_seed_gives_identical_bytes_and_start_continues_the_stream():
    a = list(synthetic.generate(6, seed=3))
    b = list(synthetic.generate(6, seed=3))
    assert [x.image_bytes for x in a] == [x.image_bytes for x in b]
    assert [x.captions for x in a] == [x.captions for x in b]
    tail = list(synthetic.generate(2, seed=3, start=4))
    assert [x.image_id for x in tail] == ["shapes-000004", "shapes-000005"]
    assert [x.image_bytes for x in tail] == [x.image_bytes for x in a[4:]]
    other = list(synthetic.generate(6, seed=4))
    assert [x.image_bytes for x in other] != [x.image_bytes for x in a]


def test_examples_are_raw_examples_with_png_images(examples):
    ex = examples[0]
    decoded_png_example(ex, "shapes-000000", 64)
    assert len(ex.captions) == 5 and all(isinstance(c, str) for c in ex.captions)
    assert {len(e.objects) for e in examples} == {1, 2, 3}


def test_image_size_and_object_count_are_configurable():
    exs = list(synthetic.generate(10, image_size=32, min_objects=2, max_objects=2,
                                  captions_per_image=3, seed=1))
    assert all(_decode(e).shape == (32, 32, 3) for e in exs)
    assert all(len(e.objects) == 2 and len(e.captions) == 3 for e in exs)


def test_objects_are_inside_apart_distinct_and_sized(examples):
    for ex in examples:
        for o in ex.objects:
            check_object(o, g.SIZES)
            assert o["color"] in g.COLORS and o["shape"] in g.SHAPES
        assert len({(o["color"], o["shape"]) for o in ex.objects}) == len(ex.objects)
        for a, b in itertools.combinations(ex.objects, 2):
            (ay0, ax0, ay1, ax1), (by0, bx0, by1, bx1) = a["bbox"], b["bbox"]
            gap_y = max(by0 - ay1, ay0 - by1)
            gap_x = max(bx0 - ax1, ax0 - bx1)
            assert max(gap_x, gap_y) >= synthetic.GAP - 1e-5


def test_each_object_is_drawn_in_its_color(examples):
    palette = {name: np.array(rgb, float) for name, rgb in g.COLORS.items()}
    for ex in examples[:60]:
        image = _decode(ex).astype(float)
        s = image.shape[0]
        for o in ex.objects:
            cy, cx = g.box_center(o["bbox"])
            pixel = image[int(cy * s), int(cx * s)]  # the centre is inside every shape
            nearest = min(palette, key=lambda c: np.abs(palette[c] - pixel).sum())
            assert nearest == o["color"], (ex.image_id, o)
        # corners of the image are background
        assert image[[0, 0, -1, -1], [0, -1, 0, -1]].max() < 40


def test_shapes_differ_in_their_masks():
    y = (np.arange(40) + 0.5)[:, None] / 40
    x = (np.arange(40) + 0.5)[None, :] / 40
    box = (0.0, 0.0, 1.0, 1.0)
    areas = {s: synthetic.shape_mask(s, y, x, box).mean() for s in g.SHAPES}
    assert areas["square"] == pytest.approx(1.0)
    assert areas["circle"] == pytest.approx(np.pi / 4, abs=0.02)
    assert areas["triangle"] == pytest.approx(0.5, abs=0.03)
    assert areas["cross"] == pytest.approx(1 - (1 - synthetic.CROSS_THICKNESS) ** 2, abs=0.03)


def test_every_reference_caption_is_true_of_its_image(examples):
    for ex in examples:
        gt = {(o["color"], o["shape"]): o for o in ex.objects}
        for caption in ex.captions:
            parsed = g.parse_caption(caption)
            assert {(p.color, p.shape) for p in parsed.objects} == set(gt), caption
            for p in parsed.objects:
                assert gt[(p.color, p.shape)]["size"] == p.size
            if len(ex.objects) >= 2:
                rel = parsed.relation
                assert rel is not None, caption
                a, b = parsed.objects[rel.subject], parsed.objects[rel.object]
                assert g.relation_holds(rel.kind, gt[(a.color, a.shape)]["bbox"],
                                        gt[(b.color, b.shape)]["bbox"]), caption
            else:
                assert parsed.relation is None


def test_primary_caption_is_canonical_and_three_of_five_lead_with_o1(examples):
    kinds = set()
    for ex in examples:
        objs = ex.objects
        o1 = g.object_phrase(objs[0])
        assert ex.captions[0].startswith(o1)
        if len(objs) == 1:
            assert ex.captions[0] == o1
            assert sum(c.startswith(o1) for c in ex.captions) == 3
            continue
        first = [g.parse_caption(c).objects[0] for c in ex.captions]
        assert sum((p.color, p.shape) == (objs[0]["color"], objs[0]["shape"])
                   for p in first) == 3
        o2 = g.object_phrase(objs[1])
        kind = "left" if " to the left of " in ex.captions[0] else "above"
        kinds.add(kind)
        assert ex.captions[0].startswith(f"{o1} {g.RELATION_PHRASE[kind]} {o2}")
        # unambiguous: the dominant axis wins by the margin
        (ay, ax), (by, bx) = g.box_center(objs[0]["bbox"]), g.box_center(objs[1]["bbox"])
        assert abs(abs(bx - ax) - abs(by - ay)) >= synthetic.RELATION_MARGIN - 1e-5
        assert g.relation_holds(kind, objs[0]["bbox"], objs[1]["bbox"])
        if len(objs) == 3:
            assert ex.captions[0].endswith(f" and {g.object_phrase(objs[2])}")
            third_x = g.box_center(objs[2]["bbox"])[1]
            assert third_x - max(ax, bx) >= synthetic.ORDER_MARGIN - 1e-5
    assert kinds == {"left", "above"}


# -- grammar -----------------------------------------------------------------

def test_parse_finds_phrases_with_word_spans():
    p = g.parse_caption("a large red circle to the left of a small blue square and a green cross")
    assert p.objects == (g.ObjectPhrase(0, 4, "large", "red", "circle"),
                         g.ObjectPhrase(8, 12, "small", "blue", "square"),
                         g.ObjectPhrase(13, 16, None, "green", "cross"))
    assert p.relation == g.Relation(4, 8, "left", 0, 1)
    assert p.objects[0].noun_index == 3


@pytest.mark.parametrize("caption, kind, subject, obj", [
    ("there is a small blue square is to the right of a large red circle", "right", 0, 1),
    ("A small blue square, right of a large red circle.", "right", 0, 1),
    ("uh a red circle blah blah above  the yellow triangle xyz", "above", 0, 1),
    ("a red circle under a large yellow triangle", "below", 0, 1),
    ("a purple cross beneath an orange square", "below", 0, 1),
    ("a green cross and a red circle over a blue square", "above", 1, 2),
    ("a red circle on the left of a large blue triangle", "left", 0, 1),
])
def test_parse_is_robust_to_variants_and_junk(caption, kind, subject, obj):
    p = g.parse_caption(caption)
    assert p.relation is not None
    assert (p.relation.kind, p.relation.subject, p.relation.object) == (kind, subject, obj)


def test_parse_without_relation_or_objects():
    assert g.parse_caption("a large red circle on a black background").relation is None
    empty = g.parse_caption("")
    assert empty.objects == () and empty.relation is None
    dangling = g.parse_caption("to the left of a red circle")
    assert dangling.relation is None and len(dangling.objects) == 1


def test_parse_keeps_word_indices_of_a_token_list():
    words = ["<start>", "a", "Red", "circle", ",", "above", "a", "blue", "cross", "<end>"]
    p = g.parse_caption(words)
    assert p.objects[0] == g.ObjectPhrase(1, 4, None, "red", "circle")
    assert p.objects[1] == g.ObjectPhrase(6, 9, None, "blue", "cross")
    assert (p.relation.start, p.relation.end, p.relation.kind) == (5, 6, "above")


def test_adjacent_phrases_do_not_share_words():
    p = g.parse_caption("a red circle red square")
    assert p.objects == (g.ObjectPhrase(0, 3, None, "red", "circle"),
                         g.ObjectPhrase(3, 5, None, "red", "square"))


def test_relation_holds():
    left = (0.4, 0.1, 0.6, 0.3)    # centre (0.5, 0.2)
    right = (0.45, 0.6, 0.65, 0.8)  # centre (0.55, 0.7)
    top = (0.0, 0.15, 0.2, 0.35)    # centre (0.1, 0.25)
    assert g.relation_holds("left", left, right) and g.relation_holds("right", right, left)
    assert not g.relation_holds("right", left, right) and not g.relation_holds("above", left, right)
    assert g.relation_holds("above", top, left) and g.relation_holds("below", left, top)
    assert not g.relation_holds("left", top, left)
    with pytest.raises(ValueError):
        g.relation_holds("near", left, right)


def test_make_captions_counts_and_fractions():
    rng = np.random.default_rng(0)
    objs = [{"bbox": (0.4, 0.6, 0.6, 0.8), "size": "small", "color": "red", "shape": "circle"},
            {"bbox": (0.4, 0.1, 0.6, 0.3), "size": "large", "color": "blue", "shape": "square"}]
    ordered, caps = g.make_captions(objs, 5, rng)
    assert [o["color"] for o in ordered] == ["blue", "red"]
    assert caps[0] == "a large blue square to the left of a small red circle"
    assert sum(c.startswith("a large blue square") for c in caps) == 3
    assert len(set(caps)) == 5
    _, one = g.make_captions(objs, 1, rng)
    assert one == [caps[0]]
    _, many = g.make_captions(objs, 12, rng)
    assert len(many) == 12


# -- TFDS builder ---------------------------------------------------------------

def test_tfds_builder_loads_with_the_generator_contents(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    import tests.components.sources.tfds_shapes  # noqa: F401 - registers the builder

    builder = tfds.builder("synthetic_shapes/tiny", data_dir=str(tmp_path))
    builder.download_and_prepare()
    splits = builder.info.splits
    assert (splits["train"].num_examples, splits["val"].num_examples,
            splits["test"].num_examples) == (16, 2, 2)
    ds = tfds.load("synthetic_shapes/tiny", split="test", data_dir=str(tmp_path))
    got = {ex["image/id"].numpy().decode(): ex for ex in ds}
    assert sorted(got) == ["shapes-000018", "shapes-000019"]
    ref = list(synthetic.generate(2, image_size=32, seed=0, start=18))
    for r in ref:
        ex = got[r.image_id]
        assert [c.decode() for c in ex["captions"].numpy()] == list(r.captions)
        np.testing.assert_array_equal(ex["image"].numpy(), _decode(r))
        np.testing.assert_allclose(ex["objects"]["bbox"].numpy(),
                                   [o["bbox"] for o in r.objects], atol=1e-6)
        assert [c.decode() for c in ex["objects"]["color"].numpy()] == \
            [o["color"] for o in r.objects]
        assert [c.decode() for c in ex["objects"]["size"].numpy()] == \
            [o["size"] for o in r.objects]
