"""Greedy and beam search graphs: correctness, beam 1 == greedy, tracing without autograph, export."""
import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.decoding import attention_to_grid, beam_search, greedy_decode
from models.text import END_ID
from tests.models.tiny import REGIONS, annotations, make_model


def _reference_greedy(model, a, max_length):
    """Step-by-step greedy decode in NumPy over `decode_step`."""
    projected, state = model.project_annotations(a), model.initial_state(a)
    prev = np.ones(len(a), "int32")
    rows, alphas, scores, done = [], [], np.zeros(len(a)), np.zeros(len(a), bool)
    for _ in range(max_length):
        log_probs, alpha, state = model.decode_step(prev, state, a, projected)
        log_probs = np.asarray(log_probs).copy()
        log_probs[:, :2] = -np.inf          # <pad> and <start> are never emitted
        word = np.where(done, 0, log_probs.argmax(-1))
        scores += np.where(done, 0, log_probs.max(-1))
        rows.append(word)
        alphas.append(np.where(done[:, None], 0, alpha))
        done |= word == END_ID
        prev = word.astype("int32")
    return np.stack(rows, 1), np.stack(alphas, 1), scores


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_greedy_matches_a_step_by_step_reference(attention):
    model = make_model(attention, seed=2)
    model.output_logits.bias.assign(np.where(np.arange(20) == END_ID, 1.5, 0.0))  # ends early
    a = annotations()
    out = greedy_decode(model, a, max_length=6)
    tokens, alphas, scores = _reference_greedy(model, a, 6)
    np.testing.assert_array_equal(out["tokens"], tokens)
    np.testing.assert_allclose(out["attention"], alphas, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["scores"], scores, rtol=1e-5)
    lengths = np.asarray(out["lengths"])
    for row, length in zip(np.asarray(out["tokens"]), lengths, strict=True):
        assert (row[:length] != 0).all() and (row[length:] == 0).all()
        assert length == 6 or row[length - 1] == END_ID
    assert out["tokens"].dtype == out["lengths"].dtype == tf.int32
    assert out["attention"].shape == (2, 6, REGIONS)


def test_decoding_stops_at_end():
    model = make_model()
    model.output_logits.bias.assign(np.where(np.arange(20) == END_ID, 100.0, 0.0))
    for out in (greedy_decode(model, annotations(), 5), beam_search(model, annotations(), 3, 5)):
        np.testing.assert_array_equal(out["tokens"], [[END_ID, 0, 0, 0, 0]] * 2)
        np.testing.assert_array_equal(out["lengths"], [1, 1])
        assert (np.asarray(out["attention"])[:, 1:] == 0).all()
        np.testing.assert_allclose(np.asarray(out["attention"])[:, 0].sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("attention,seed", [("soft", 0), ("soft", 1), ("hard", 2)])
def test_beam_of_one_equals_greedy_exactly(attention, seed):
    model = make_model(attention, seed=seed)
    a = annotations(seed)
    mask = np.ones((2, REGIONS), bool)
    mask[1, ::2] = False
    greedy = greedy_decode(model, a, 7, mask=mask)
    beam = beam_search(model, a, 1, 7, mask=mask)
    for key in greedy:
        np.testing.assert_array_equal(greedy[key], beam[key], err_msg=key)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_context_products_give_the_same_captions(attention):
    model = make_model(attention, seed=3)
    a = annotations(3)
    for decode in (lambda **kw: greedy_decode(model, a, 6, **kw),
                   lambda **kw: beam_search(model, a, 2, 6, **kw)):
        plain, products, auto = (decode(context_products=False),
                                 decode(context_products=True), decode())
        for key in plain:
            np.testing.assert_allclose(plain[key], products[key], rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(products[key], auto[key])   # 2 images: products
    with pytest.raises(ValueError, match="context_products"):
        greedy_decode(model, a, 6, context_products="sometimes")


def test_wide_beam_finds_the_exhaustive_optimum():
    model = make_model(seed=4, vocab_size=6)   # words: <end>, 3, 4, 5
    a = annotations(4, batch=1)
    projected = model.project_annotations(a)
    best, best_seq = -np.inf, None
    for length in (1, 2, 3):
        for words in itertools.product([2, 3, 4, 5], repeat=length):
            if END_ID in words[:-1] or (length < 3 and words[-1] != END_ID):
                continue
            state, prev, score = model.initial_state(a), np.ones(1, "int32"), 0.0
            for w in words:
                log_probs, _, state = model.decode_step(prev, state, a, projected)
                score += float(log_probs[0, w])
                prev = np.array([w], "int32")
            if score > best:
                best, best_seq = score, words
    out = beam_search(model, a, beam_size=16, max_length=3)   # 16 >= 4 ** 2 live prefixes
    np.testing.assert_allclose(out["scores"][0], best, rtol=1e-5)
    np.testing.assert_array_equal(out["tokens"][0, :len(best_seq)], best_seq)


def test_length_normalized_scores():
    model = make_model(seed=5)
    raw = beam_search(model, annotations(), 3, 6)
    normalized = beam_search(model, annotations(), 3, 6, length_normalization=0.7)
    lengths = np.asarray(normalized["lengths"])
    penalty = ((5 + lengths) / 6) ** 0.7
    # each reported score is its caption's log-probability over the penalty
    for out, lp in ((raw, 1.0), (normalized, penalty)):
        rescored = []
        for row, tokens in enumerate(np.asarray(out["tokens"])):
            a = annotations()[row:row + 1]
            projected, state, prev, total = (model.project_annotations(a),
                                             model.initial_state(a), np.ones(1, "int32"), 0.0)
            for w in tokens[:int(out["lengths"][row])]:
                log_probs, _, state = model.decode_step(prev, state, a, projected)
                total += float(log_probs[0, w])
                prev = np.array([w], "int32")
            rescored.append(total)
        np.testing.assert_allclose(np.asarray(out["scores"]), np.array(rescored) / lp, rtol=1e-5)


def test_traced_without_autograph_and_exported(tmp_path):
    model = make_model("hard", seed=6)
    a = annotations()
    spec = [tf.TensorSpec((None, REGIONS, a.shape[-1]), tf.float32)]
    greedy = tf.function(lambda x: greedy_decode(model, x, 6), input_signature=spec,
                         autograph=False)
    beam = tf.function(lambda x: beam_search(model, x, 3, 6, 0.5), input_signature=spec,
                       autograph=False)
    eager = {"greedy": greedy_decode(model, a, 6), "beam": beam_search(model, a, 3, 6, 0.5)}
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("greedy", greedy)
    archive.add_endpoint("beam", beam)
    archive.write_out(str(tmp_path / "saved"), verbose=False)
    reloaded = tf.saved_model.load(str(tmp_path / "saved"))
    for name, fn in (("greedy", greedy), ("beam", beam)):
        for out in (fn(a), getattr(reloaded, name)(tf.constant(a))):
            np.testing.assert_array_equal(out["tokens"], eager[name]["tokens"])
            np.testing.assert_allclose(out["scores"], eager[name]["scores"], rtol=1e-5)
            np.testing.assert_allclose(out["attention"], eager[name]["attention"], atol=1e-6)


def test_attention_to_grid_is_row_major():
    attention = np.arange(2 * 3 * 6, dtype="float32").reshape(2, 3, 6)
    grid = np.asarray(attention_to_grid(attention, 2, 3))
    assert grid.shape == (2, 3, 2, 3)
    for y, x in itertools.product(range(2), range(3)):
        np.testing.assert_array_equal(grid[:, :, y, x], attention[:, :, y * 3 + x])
