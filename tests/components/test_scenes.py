"""The synthetic scenes generator, its caption grammar and parser, and its ExampleGen run."""
import io
import itertools
import json
import os
import re
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from components.example_gen.sources import get_source, has_boxes
from components.synthetic import scenes, shapes_grammar
from components.synthetic import scenes_grammar as g
from components.synthetic import shapes as synthetic
from tests.components.sources.raw_examples import check_object, decoded_png_example

N = 120


@pytest.fixture(scope="module")
def examples():
    return list(scenes.generate(N, seed=5))


@pytest.fixture(scope="module")
def scenes_drawn():
    return [scenes.scene_at(i, seed=5) for i in range(40)]


def _decode(ex):
    return np.array(Image.open(io.BytesIO(ex.image_bytes)))


def _groups(objects):
    return Counter((o["color"], o["shape"]) for o in objects)


# -- generator ---------------------------------------------------------------

def test_same_seed_gives_identical_bytes_and_start_continues_the_stream():
    a = list(scenes.generate(5, seed=3))
    b = list(scenes.generate(5, seed=3))
    assert [x.image_bytes for x in a] == [x.image_bytes for x in b]
    assert [x.captions for x in a] == [x.captions for x in b]
    assert [x.objects for x in a] == [x.objects for x in b]
    tail = list(scenes.generate(2, seed=3, start=3))
    assert [x.image_id for x in tail] == ["scenes-000003", "scenes-000004"]
    assert [x.image_bytes for x in tail] == [x.image_bytes for x in a[3:]]
    assert [x.captions for x in tail] == [x.captions for x in a[3:]]
    other = list(scenes.generate(5, seed=4))
    assert all(x.image_bytes != y.image_bytes for x, y in zip(a, other, strict=True))
    # scene_at draws the same pixels as the example
    assert np.array_equal(scenes.scene_at(2, seed=3).image, _decode(a[2]))


def test_examples_are_png_raw_examples_with_3_to_8_objects(examples):
    ex = examples[0]
    decoded_png_example(ex, "scenes-000000", 64)
    assert all(len(e.captions) == 5 for e in examples)
    counts = Counter(len(e.objects) for e in examples)
    assert set(counts) == set(range(3, 9))
    assert set(ex.objects[0]) == {"bbox", "color", "shape", "size", "visible"}


def test_size_and_object_range_are_configurable():
    exs = list(scenes.generate(8, image_size=32, min_objects=1, max_objects=2,
                               captions_per_image=3, seed=1))
    assert all(_decode(e).shape == (32, 32, 3) for e in exs)
    assert all(1 <= len(e.objects) <= 2 and len(e.captions) == 3 for e in exs)
    big = list(scenes.generate(4, image_size=128, min_objects=8, max_objects=8, seed=1))
    assert all(len(e.objects) == 8 and _decode(e).shape == (128, 128, 3) for e in big)


def test_objects_have_known_attributes_boxes_inside_and_sizes_in_range(examples):
    for ex in examples:
        for o in ex.objects:
            height, width = check_object(o, g.SIZES)
            assert height == pytest.approx(width, abs=1e-5)
            assert o["color"] in g.COLORS and o["shape"] in g.KINDS
            assert scenes.MIN_VISIBLE <= o["visible"] <= 1.0
    # occlusion and repeated objects both occur, but not everywhere
    hidden = np.mean([any(o["visible"] < 0.95 for o in e.objects) for e in examples])
    grouped = np.mean([max(_groups(e.objects).values()) >= 2 for e in examples])
    assert 0.2 < hidden < 0.95 and 0.3 < grouped < 0.7


def test_objects_are_listed_most_visible_first(examples, scenes_drawn):
    for i, scene in enumerate(scenes_drawn[:10]):
        ex = scenes.make_example(i, seed=5)
        areas = {o["bbox"]: o["visible_area"] for o in scene.objects}
        ordered = [areas[o["bbox"]] for o in ex.objects]
        assert ordered == sorted(ordered, reverse=True)


def test_boxes_match_what_is_drawn(scenes_drawn):
    palette = {name: np.array(rgb, float) for name, rgb in g.COLORS.items()}
    for scene in scenes_drawn:
        s = scene.image.shape[0]
        image = scene.image.astype(float)
        rows, cols = np.mgrid[0:s, 0:s]
        assert {int(v) for v in np.unique(scene.owner)} <= set(range(-1, len(scene.objects)))
        for j, o in enumerate(scene.objects):
            mine = scene.owner == j
            assert mine.sum() == o["visible_area"] >= scenes.MIN_PIXELS
            ymin, xmin, ymax, xmax = o["bbox"]
            # every pixel the object shows has its centre inside the box (1 px slack)
            assert ((rows[mine] + 0.5) / s >= ymin - 1 / s).all()
            assert ((rows[mine] + 0.5) / s <= ymax + 1 / s).all()
            assert ((cols[mine] + 0.5) / s >= xmin - 1 / s).all()
            assert ((cols[mine] + 0.5) / s <= xmax + 1 / s).all()
            # and is drawn in the object's color (median over its visible pixels)
            pixel = np.median(image[mine], axis=0)
            nearest = min(palette, key=lambda c: np.abs(palette[c] - pixel).sum())
            assert nearest == o["color"], (j, o, pixel)
            # a fully visible object spans its box (2.5 px: a star's thin tips
            # cover under half a pixel)
            if o["visible"] == 1.0:
                r, c, slack = rows[mine], cols[mine], 2.5 / s
                assert r.min() / s <= ymin + slack and (r.max() + 1) / s >= ymax - slack
                assert c.min() / s <= xmin + slack and (c.max() + 1) / s >= xmax - slack


def test_background_is_dark_textured_and_never_an_object_color(scenes_drawn):
    seen = set()
    for scene in scenes_drawn:
        seen.add(scene.background)
        bg = scene.image[scene.owner == -1].astype(float)
        assert bg.max() <= 200 and np.median(bg) < 110
        saturation = bg.max(axis=1) - bg.min(axis=1)
        assert np.percentile(saturation, 95) < 60
    assert seen == set(g.BACKGROUNDS)


def test_kinds_differ_in_their_masks():
    y = (np.arange(64) + 0.5)[:, None] / 64
    x = (np.arange(64) + 0.5)[None, :] / 64
    box = (0.0, 0.0, 1.0, 1.0)
    masks = {k: scenes.shape_mask(k, y, x, box) for k in g.KINDS}
    areas = {k: m.mean() for k, m in masks.items()}
    assert areas["square"] == pytest.approx(1.0)
    assert areas["circle"] == pytest.approx(np.pi / 4, abs=0.02)
    assert areas["diamond"] == pytest.approx(0.5, abs=0.02)
    assert areas["ring"] == pytest.approx(np.pi / 4 * (1 - scenes.RING_INNER ** 2), abs=0.02)
    assert 0.25 < areas["star"] < 0.45 and 0.5 < areas["heart"] < 0.8
    for a, b in itertools.combinations(g.KINDS, 2):
        assert np.abs(masks[a] - masks[b]).mean() > 0.05, (a, b)
    for k, m in masks.items():  # each kind touches the top and bottom thirds of its box
        assert m[:8].any() and m[-8:].any(), k


# -- captions ----------------------------------------------------------------

def test_every_caption_names_existing_objects_with_true_counts_and_sizes(examples):
    for ex in examples:
        groups = _groups(ex.objects)
        sizes = {}
        for o in ex.objects:
            sizes.setdefault((o["color"], o["shape"]), set()).add(o["size"])
        for caption in ex.captions:
            assert caption == caption.strip() and "  " not in caption
            assert re.fullmatch(r"[a-z ]+", caption), caption
            parsed = g.parse_caption(caption)
            assert 1 <= len(parsed.objects) <= 3, caption
            keys = [(p.color, p.shape) for p in parsed.objects]
            assert len(set(keys)) == len(keys), caption
            for p, key in zip(parsed.objects, keys, strict=True):
                assert key in groups, (caption, ex.objects)
                assert p.count == groups[key], caption
                assert p.plural == (groups[key] > 1)
                if p.size is not None:
                    assert sizes[key] == {p.size}, caption
            m = re.search(r"\b(" + "|".join(g.NUMBER_WORDS) + r") shapes", caption)
            if m:
                assert m.group(1) == g.number_word(len(ex.objects)), caption
            if "other shapes" in caption:
                assert sum(p.count for p in parsed.objects) < len(ex.objects), caption


def test_relations_are_true_clear_and_link_single_objects(examples):
    kinds, far = Counter(), 0
    for ex in examples:
        groups = _groups(ex.objects)
        by_key = {(o["color"], o["shape"]): o for o in ex.objects}
        for caption in ex.captions:
            parsed = g.parse_caption(caption)
            assert len(parsed.relations) <= 1
            rel = parsed.relation
            if rel is None:
                continue
            a, b = parsed.objects[rel.subject], parsed.objects[rel.object]
            assert groups[(a.color, a.shape)] == groups[(b.color, b.shape)] == 1, caption
            box_a, box_b = by_key[(a.color, a.shape)]["bbox"], by_key[(b.color, b.shape)]["bbox"]
            assert shapes_grammar.relation_holds(rel.kind, box_a, box_b), caption
            assert g.clear_relation(box_a, box_b) == rel.kind, caption
            kinds[rel.kind] += 1
            # another object's centre lies between the two along the relation's axis
            axis = 1 if rel.kind in ("left", "right") else 0
            lo, hi = sorted((shapes_grammar.box_center(box_a)[axis],
                             shapes_grammar.box_center(box_b)[axis]))
            far += any(lo < shapes_grammar.box_center(o["bbox"])[axis] < hi
                       for o in ex.objects if o["bbox"] not in (box_a, box_b))
    assert set(kinds) == set(shapes_grammar.RELATION_KINDS)
    assert sum(kinds.values()) > 0.1 * N * 5
    assert far > 0.2 * sum(kinds.values())  # relations among non-neighbours


def test_background_words_are_true(examples):
    for i, ex in enumerate(examples[:40]):
        background = scenes.scene_at(i, seed=5).background
        for caption in ex.captions:
            m = re.search(r"on a (\w+) background", caption)
            if m:
                assert m.group(1) == background, caption


def test_references_vary_in_words_subsets_and_frames(examples):
    words = Counter(w for ex in examples for c in ex.captions for w in c.split())
    for synonym in ("disc", "box", "violet", "turquoise", "big", "little", "hoop", "rhombus"):
        assert words[synonym] > 0, synonym
    for number in ("two", "three"):
        assert words[number] > 0
    assert 80 <= len(words) <= 200
    distinct = [len(set(ex.captions)) for ex in examples]
    assert np.mean(distinct) > 4.0
    # references name different subsets of the same image
    subsets = [len({frozenset((p.color, p.shape) for p in g.parse_caption(c).objects)
                    for c in ex.captions}) for ex in examples]
    assert np.mean(subsets) > 2.0
    lengths = [len(c.split()) for ex in examples for c in ex.captions]
    assert 2 <= min(lengths) and max(lengths) <= 24 and 6 < np.mean(lengths) < 14


def test_salient_objects_are_named_more_often(examples):
    most, least = 0, 0
    for ex in examples:
        named = Counter((p.color, p.shape) for c in ex.captions
                        for p in g.parse_caption(c).objects)
        first, last = ex.objects[0], ex.objects[-1]  # most and least visible area
        if (first["color"], first["shape"]) != (last["color"], last["shape"]):
            most += named[(first["color"], first["shape"])]
            least += named[(last["color"], last["shape"])]
    assert most > 2 * least


def test_mention_phrases_use_counts_articles_and_shared_sizes():
    rng = np.random.default_rng(0)
    two = [{"color": "red", "shape": "ring", "size": "small", "visible_area": 40}] * 2
    phrases = {g._mention_phrase(two, rng) for _ in range(50)}
    assert phrases <= {"two red rings", "two red hoops", "two small red rings",
                       "two little red rings", "two tiny red rings", "two small red hoops",
                       "two little red hoops", "two tiny red hoops"}
    mixed = [dict(two[0]), dict(two[0], size="large")]
    assert all(not g.parse_caption(g._mention_phrase(mixed, rng)).objects[0].size
               for _ in range(20))
    orange = [{"color": "orange", "shape": "box", "size": "small", "visible_area": 1}]
    orange[0]["shape"] = "square"
    assert {g._mention_phrase(orange, np.random.default_rng(k)).split()[0]
            for k in range(40)} <= {"a", "an", "one"}
    assert any(g._mention_phrase(orange, np.random.default_rng(k)).startswith("an orange")
               for k in range(40))


def test_make_captions_rejects_bad_arguments():
    with pytest.raises(ValueError):
        g.make_captions([], "dark", 3, np.random.default_rng(0))
    obj = {"bbox": (0, 0, 0.2, 0.2), "color": "red", "shape": "star", "size": "small",
           "visible_area": 20}
    with pytest.raises(ValueError):
        g.make_captions([obj], "dark", 0, np.random.default_rng(0))


# -- parser ------------------------------------------------------------------

def test_parse_counts_plurals_and_synonyms():
    p = g.parse_caption("there are two little violet hoops to the left of a big turquoise disc")
    assert p.objects == (g.ScenePhrase(2, 6, "small", "purple", "ring", 2, True),
                         g.ScenePhrase(10, 14, "large", "cyan", "circle", 1, False))
    assert p.relation.kind == "left" and (p.relation.subject, p.relation.object) == (0, 1)
    q = g.parse_caption("some red boxes and one rhombus")
    assert q.objects[0] == g.ScenePhrase(1, 3, None, "red", "square", None, True)
    assert q.objects[1] == g.ScenePhrase(4, 6, None, None, "diamond", 1, False)
    assert g.parse_caption("seven shapes including three crosses").objects == (
        g.ScenePhrase(3, 5, None, None, "cross", 3, True),)


def test_parse_reads_shapes_captions_exactly_like_the_shapes_parser():
    captions = [c for ex in synthetic.generate(150, seed=7) for c in ex.captions]
    vocab = sorted({w for c in captions for w in c.split()} | {"one", "<end>", "<unk>"})
    rng = np.random.default_rng(0)
    # and any word sequence a shapes model could emit
    captions += [" ".join(rng.choice(vocab, size=int(rng.integers(1, 16))))
                 for _ in range(3000)]
    for caption in captions:
        for form in (caption, caption.split()):
            old, new = shapes_grammar.parse_caption(form), g.parse_caption(form)
            assert new.words == old.words
            assert [tuple(o)[:5] for o in new.objects] == [tuple(o) for o in old.objects], caption
            assert new.relations == old.relations and new.relation == old.relation, caption


def test_every_written_word_form_parses_back():
    for kind, forms in g.KIND_WORDS.items():
        for form in forms:
            plural = g.PLURALS.get(form, form + "s")
            assert g.parse_caption(f"a {form}").objects[0].shape == kind
            assert g.parse_caption(f"four {plural}").objects[0][4:] == (kind, 4, True)
    for color, forms in g.COLOR_WORDS.items():
        assert all(g.parse_caption(f"a {w} star").objects[0].color == color for w in forms)
    for size, forms in g.SIZE_WORDS.items():
        assert all(g.parse_caption(f"a {w} star").objects[0].size == size for w in forms)
    for kind, forms in g.RELATION_WORDING.items():
        for form in forms:
            assert g.parse_caption(f"a star {form} a heart").relation.kind == kind


# -- registry and ExampleGen ---------------------------------------------------

def test_source_is_registered_with_boxes():
    from pipeline.config import DataConfig
    records, total = get_source("scenes")(DataConfig(source="scenes", num_images=3,
                                                     image_size=32, min_objects=2,
                                                     max_objects=4, seed=2))
    records = list(records)
    assert total == 3 and [r.image_id for r in records] == [f"scenes-00000{i}" for i in range(3)]
    assert all(2 <= len(r.objects) <= 4 for r in records)
    assert has_boxes("scenes") and has_boxes("synthetic") and not has_boxes("coco")


def test_example_gen_writes_scenes_with_boxes(tmp_path):
    import tensorflow as tf

    from components.contract import io_utils, schema
    from pipeline import config as config_lib
    from pipeline.runner import Runner
    config = config_lib.load_config("scenes", ["data.num_images=12", "data.image_size=32"])
    summary = Runner(config, str(tmp_path), log=lambda _: None).run(["ExampleGen"])
    st = summary["stages"]["ExampleGen"]
    assert st["status"] == "ran" and st["counts"]["accepted"] == 12
    uri = st["outputs"]["examples"]
    with open(os.path.join(uri, "artifact.json")) as f:
        assert json.load(f)["properties"]["has_boxes"] is True
    expected = {r.image_id: r for r in scenes.generate(12, image_size=32, seed=0)}
    seen = 0
    for split in schema.SPLITS:
        for record in io_utils.read_records(schema.split_files(uri, split)):
            f = tf.train.Example.FromString(record).features.feature
            raw = expected[f[schema.IMAGE_ID].bytes_list.value[0].decode()]
            assert f[schema.IMAGE_ENCODED].bytes_list.value[0] == raw.image_bytes
            assert [c.decode() for c in f[schema.CAPTIONS].bytes_list.value] == list(raw.captions)
            objects = schema.parse_objects(f)
            assert [(o["color"], o["shape"], o["size"]) for o in objects] == [
                (o["color"], o["shape"], o["size"]) for o in raw.objects]
            np.testing.assert_allclose([o["bbox"] for o in objects],
                                       [o["bbox"] for o in raw.objects], atol=1e-6)
            seen += 1
    assert seen == 12
