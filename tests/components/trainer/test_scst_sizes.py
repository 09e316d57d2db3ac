"""train.scst_size_reward: the in-graph size truth against the Evaluator's counts, the reward, the refusal."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from components import trainer
from components.contract.object_words import phrase_role
from components.evaluator.metrics.grounding import COUNT_KEYS, grounding_counts
from components.synthetic import scenes_grammar
from components.trainer import scst, train_data
from models import scst as scst_terms
from models.text import PAD_ID, RESERVED
from tests.components import test_trainer
from tests.components.test_trainer import _config, _ctx
from tests.components.trainer.test_scst_boxes import SCST, boxed, scst_run  # noqa: F401

source = test_trainer.source  # tiny Annotations without objects

SIZED, CORRECT = COUNT_KEYS.index("num_sized_phrases"), COUNT_KEYS.index("num_size_correct")
KINDS, COLORS, SIZES = scenes_grammar.KINDS, tuple(scenes_grammar.COLORS), tuple(
    scenes_grammar.SIZES)


def _objects(rng) -> list[dict]:
    """2 to 5 scenes objects, some sharing a (colour, kind) with different sizes."""
    objects = []
    for _ in range(int(rng.integers(2, 6))):
        y, x = rng.uniform(0, 0.6, size=2)
        objects.append({"bbox": (y, x, y + 0.3, x + 0.3), "color": str(rng.choice(COLORS[:3])),
                        "shape": str(rng.choice(KINDS[:3])), "size": str(rng.choice(SIZES)),
                        "visible_area": float(rng.uniform(0.02, 0.1))})
    return objects


def _perturbed(caption: str, rng) -> str:
    """A caption as a sampling model might say it: sizes, colours and kinds swapped, words dropped."""
    pools = (scenes_grammar.SIZE_WORDS, scenes_grammar.COLOR_WORDS, scenes_grammar.KIND_WORDS)
    words = []
    for w in caption.split():
        r = rng.random()
        pool = next((p for p in pools if any(w in ws for ws in p.values())), None)
        if pool is not None and r < 0.3:
            w = str(rng.choice([v for ws in pool.values() for v in ws]))
        elif r < 0.05:
            continue
        elif r < 0.1:
            words.append(str(rng.choice(["large", "the", "two", "red", "and"])))
        words.append(w)
    return " ".join(words)


def _cases(num_images: int = 120, per_image: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(num_images):
        objects = _objects(rng)
        captions = scenes_grammar.make_captions(objects, "dark", per_image, rng)
        images.append((objects, [c if k % 2 == 0 else _perturbed(c, rng)
                                 for k, c in enumerate(captions)]))
    return images


def _vocabulary(images) -> list[str]:
    words = {w for _, captions in images for c in captions for w in c.split()}
    for table in (scenes_grammar.SIZE_WORDS, scenes_grammar.COLOR_WORDS):
        words.update(w for ws in table.values() for w in ws)
    return list(RESERVED) + sorted(words)


def _batch(images, word_ids, steps: int):
    tokens = np.full((len(images), len(images[0][1]), steps), PAD_ID, np.int32)
    rows = [train_data.object_word_ids(objects, word_ids) for objects, _ in images]
    words = np.full((len(images), max(r.shape[0] for r in rows), max(r.shape[1] for r in rows)),
                    train_data.NO_WORD, np.int32)
    for i, ((_, captions), row) in enumerate(zip(images, rows, strict=True)):
        words[i, :row.shape[0], :row.shape[1]] = row
        for k, caption in enumerate(captions):
            ids = [word_ids[w] for w in caption.split()][:steps]
            tokens[i, k, :len(ids)] = ids
    return tokens, words


def test_phrase_roles_follow_the_scenes_parser():
    assert [phrase_role(w) for w in ("big", "violet", "boxes", "an", "three", "left")] == [
        "size", "color", "kind", "stop", "stop", "other"]
    roles = scst.word_roles(["<pad>", "tiny", "hoop", "one"])
    assert [scst_terms.PHRASE_ROLES[r] for r in roles] == ["other", "size", "kind", "stop"]


def test_size_truth_counts_what_the_evaluator_counts():
    images = _cases()
    vocab = _vocabulary(images)
    word_ids = {w: i for i, w in enumerate(vocab)}
    steps = 1 + max(len(c.split()) for _, captions in images for c in captions)
    tokens, object_words = _batch(images, word_ids, steps)
    correct, sized = scst_terms.size_truth(tf.constant(tokens), scst.word_roles(vocab),
                                           tf.constant(object_words))
    # The reference: the Evaluator's grounding counts, one caption at a time.
    flat = [(c, objects) for objects, captions in images for c in captions]
    counts = grounding_counts([c for c, _ in flat], [np.zeros((steps, 3, 3))] * len(flat),
                              [o for _, o in flat])
    np.testing.assert_array_equal(np.asarray(sized).ravel(), counts[:, SIZED])
    np.testing.assert_array_equal(np.asarray(correct).ravel(), counts[:, CORRECT])
    # The cases reach every branch: true sizes, false sizes, captions with none.
    assert counts[:, CORRECT].sum() > 50
    assert (counts[:, SIZED] - counts[:, CORRECT]).sum() > 20
    assert (counts[:, SIZED] == 0).sum() > 50


def test_size_truth_on_written_phrases():
    vocab = list(RESERVED) + ["a", "big", "small", "red", "blue", "star", "stars", "two",
                              "and", "above", "the"]
    ids = {w: i for i, w in enumerate(vocab)}
    objects = [{"color": "red", "shape": "star", "size": "large"},
               {"color": "red", "shape": "star", "size": "small"},
               {"color": "blue", "shape": "star", "size": "small"}]
    captions = ["a big red star",               # true (one of the red stars is large)
                "a big blue star",               # false
                "two small red stars and a big star",   # true; no colour: not matched
                "a big the red star",            # the run ends at "the": no size
                "big red star above the small blue star"]  # both true
    tokens, words = _batch([(objects, captions)], ids, 9)
    correct, sized = scst_terms.size_truth(tokens, scst.word_roles(vocab), words)
    assert np.asarray(sized).tolist() == [[1, 1, 1, 0, 2]]
    assert np.asarray(correct).tolist() == [[1, 0, 1, 0, 2]]
    score = scst_terms.with_size_reward(lambda t, r: tf.ones(tf.shape(t)[:2]),
                                        scst.word_roles(vocab), words, 0.5)
    np.testing.assert_allclose(np.asarray(score(tf.constant(tokens), None)),
                               [[1.5, 0.5, 1.5, 1.0, 2.0]])


def test_a_scorer_with_a_bonus_rewards_the_samples_and_the_greedy_caption():
    from tests.components.trainer.test_scst import _references
    from tests.models.tiny import annotations, make_model
    refs, scorer = _references()
    model, a = make_model("soft", seed=0), tf.constant(annotations(seed=3, batch=2))

    def rewarded(score):
        return scst_terms.sample_and_reward(model, a, tf.constant(refs), score, num_samples=3,
                                            max_length=5, seed=tf.constant([1, 2]))

    plain = rewarded(scorer)
    shifted = rewarded(lambda t, r: scorer(t, r) + tf.cast(t[..., 0], tf.float32))  # first id
    np.testing.assert_array_equal(plain["tokens"], shifted["tokens"])
    np.testing.assert_allclose(shifted["reward"], plain["reward"]
                               + np.asarray(plain["tokens"])[..., 0], rtol=1e-6)
    from models.decoding import greedy_decode
    greedy = greedy_decode(model, a, 5, context_products=False)["tokens"]
    np.testing.assert_allclose(shifted["baseline"][:, 0] - plain["baseline"][:, 0],
                               np.asarray(greedy)[:, 0], rtol=1e-6)


def test_the_size_reward_alone_teaches_true_sizes():
    from components.trainer.scst_step import ScstStepOptions, make_scst_step
    from tests.components.trainer.test_scst import _references
    from tests.models.tiny import annotations, make_model
    refs, _ = _references()
    # Words 4..19 are sizes, colours and kinds in turn, so that samples say phrases often.
    roles = [0] * 4 + [scst_terms.PHRASE_ROLES.index(("size", "color", "kind")[w % 3])
                       for w in range(4, 20)]
    sizes = [w for w in range(4, 20) if w % 3 == 0]
    others = [w for w in range(4, 20) if w % 3]
    # Every colour and kind names each image's object; half the sizes are true of each.
    words = tf.constant([[others + sizes[::2]], [others + sizes[1::2] + [-1]]], tf.int32)
    a = tf.constant(annotations(seed=3, batch=2))
    batch = {"annotations": a, "tokens": tf.constant(refs[:, 0]),
             "references": tf.constant(refs), "object_words": words}

    def no_cider(tokens, references):  # the size reward is the whole reward
        return tf.zeros(tf.shape(tokens)[:2])

    model = make_model("soft", seed=0, dropout=0.0)
    optimizer = keras.optimizers.Adam(0.02)
    optimizer.build(model.trainable_variables)
    spec = {k: tf.TensorSpec(v.shape, v.dtype) for k, v in batch.items()}
    options = ScstStepOptions(clip_norm=5.0, global_batch_size=2, num_samples=8, max_length=6,
                              baseline="mean", size_reward=1.0, word_roles=tuple(roles))
    step = make_scst_step(tf.distribute.get_strategy(), model, optimizer, no_cider, options,
                          spec)
    outs = [step(batch, tf.constant([0, i], tf.int64)) for i in range(60)]
    for out in outs:  # the reward is the size reward, from the counts the step reports
        assert float(out["reward_sum"]) == pytest.approx(
            2 * float(out["size_correct"]) - float(out["size_words"]))

    def accuracy(part):
        return (sum(float(o["size_correct"]) for o in part)
                / sum(float(o["size_words"]) for o in part))

    assert sum(float(o["size_words"]) for o in outs[:10]) > 20
    assert accuracy(outs[:10]) < 0.7 and accuracy(outs[-10:]) > 0.9, (
        accuracy(outs[:10]), accuracy(outs[-10:]))


def test_scst_with_the_size_reward_trains_and_logs_it(boxed, tmp_path, capfd):  # noqa: F811
    props, err, events = scst_run(boxed, str(tmp_path), capfd, scst_size_reward=0.5)
    assert props["size_reward"] == 0.5
    assert "size reward 0.5" in err
    accuracy = [v for _, v in events["scst/size_word_accuracy"]]
    said = [v for _, v in events["scst/size_words_per_caption"]]
    assert len(accuracy) == 8 and all(0 <= v <= 1 for v in accuracy)
    assert len(said) == 8 and all(0 <= v <= 3 for v in said)  # the tiny model seldom says one


def test_the_size_reward_is_refused_on_data_without_sizes(source, tmp_path):
    ctx = _ctx(source, str(tmp_path), _config(**SCST, scst_size_reward=0.5))
    with pytest.raises(scst.NoObjectsError, match="object sizes .*train.scst_size_reward=0"):
        trainer.run(ctx)
