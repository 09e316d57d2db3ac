"""Self-critical training pieces: sampling from the model, rewards, baselines, the policy gradient."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from models import scst
from models.cider_d import CiderD
from models.decoding import greedy_decode, sample_decode
from models.text import END_ID, PAD_ID
from tests.models.tiny import VOCAB, annotations, make_model

SEED = tf.constant([3, 7], tf.int64)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_sampling_is_seeded_and_pads_after_the_end(attention):
    model = make_model(attention, seed=1)
    a = annotations(batch=3)
    first = sample_decode(model, a, num_samples=4, max_length=7, seed=SEED)
    again = sample_decode(model, a, num_samples=4, max_length=7, seed=SEED)
    other = sample_decode(model, a, num_samples=4, max_length=7, seed=SEED + 1)
    tokens = first["tokens"].numpy()
    assert tokens.shape == (3, 4, 7)
    np.testing.assert_array_equal(tokens, again["tokens"].numpy())
    assert not np.array_equal(tokens, other["tokens"].numpy())
    lengths = first["lengths"].numpy()
    for row, n in zip(tokens.reshape(12, 7), lengths.reshape(12), strict=True):
        assert (row[n:] == PAD_ID).all() and (row[:n] != PAD_ID).all()
        assert END_ID not in row[:n - 1]
        assert row[0] not in (0, 1)        # never <pad> or <start>


def test_the_first_word_follows_the_model_distribution():
    model = make_model("soft", seed=4)
    a = annotations(batch=1)
    out = sample_decode(model, a, num_samples=4000, max_length=1, seed=SEED)
    counts = np.bincount(out["tokens"].numpy()[0, :, 0], minlength=VOCAB) / 4000.0
    log_probs, _, _ = model.decode_step(np.ones(1, "int32"), model.initial_state(a), a,
                                        model.project_annotations(a))
    probs = np.exp(np.asarray(log_probs)[0])
    probs[:2] = 0.0                       # <pad>, <start> are never emitted
    probs /= probs.sum()
    np.testing.assert_allclose(counts, probs, atol=0.025)


def _scorer():
    refs = [[[5, 6, 7]], [[8, 9]], [[10, 11, 12]]]
    return CiderD.from_references(refs, VOCAB), np.array(
        [[[1, 5, 6, 7, 2]], [[1, 8, 9, 2, 0]], [[1, 10, 11, 12, 2]]], np.int32)


def test_baselines_greedy_and_mean_of_the_others():
    model = make_model("soft", seed=2)
    scorer, refs = _scorer()
    a = annotations(batch=3)
    mean = scst.sample_and_reward(model, a, refs, scorer, num_samples=3, max_length=5,
                                  seed=SEED, baseline="mean")
    r = mean["reward"].numpy()
    expected = (r.sum(1, keepdims=True) - r) / 2.0
    np.testing.assert_allclose(mean["baseline"].numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(mean["advantage"].numpy(), r - expected, rtol=1e-6, atol=1e-6)
    greedy = scst.sample_and_reward(model, a, refs, scorer, num_samples=3, max_length=5,
                                    seed=SEED, baseline="greedy")
    g = greedy_decode(model, a, 5)["tokens"].numpy()[:, None]
    np.testing.assert_allclose(greedy["greedy_reward"].numpy(), scorer(g, refs).numpy()[:, 0])
    np.testing.assert_allclose(greedy["baseline"].numpy(),
                               np.repeat(greedy["greedy_reward"].numpy()[:, None], 3, 1))
    with pytest.raises(ValueError, match="num_samples >= 2"):
        scst.sample_and_reward(model, a, refs, scorer, num_samples=1, max_length=5,
                               seed=SEED, baseline="mean")


def test_policy_terms_are_the_advantage_weighted_sample_likelihood():
    model = make_model("soft", seed=3)
    a = annotations(batch=2)
    tokens = np.array([[[5, 6, 2, 0]], [[7, 2, 0, 0]]], np.int32)
    ones = scst.policy_loss_terms(model, a, tokens, np.ones((2, 1), np.float32))
    np.testing.assert_allclose(ones["policy_sum"], ones["nll_sum"], rtol=1e-6)
    assert float(ones["sample_tokens"]) == 5.0
    halves = scst.policy_loss_terms(model, a, tokens, np.array([[0.5], [-2.0]], np.float32))
    per_caption = []
    for row in range(2):
        one = scst.policy_loss_terms(model, a[row:row + 1], tokens[row:row + 1],
                                     np.ones((1, 1), np.float32))
        per_caption.append(float(one["nll_sum"]))
    np.testing.assert_allclose(halves["policy_sum"], 0.5 * per_caption[0] - 2.0 * per_caption[1],
                               rtol=1e-5)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_a_step_on_a_rewarded_sample_makes_it_likelier(attention):
    model = make_model(attention, seed=5)
    a = annotations(batch=1)
    tokens = np.array([[[9, 4, 2, 0]]], np.int32)
    optimizer = keras.optimizers.SGD(0.5)

    def nll():
        return float(scst.policy_loss_terms(model, a, tokens, np.ones((1, 1), "float32"))["nll_sum"])

    before = nll()
    with tf.GradientTape() as tape:
        terms = scst.policy_loss_terms(model, a, tokens, np.ones((1, 1), "float32"))
    grads = tape.gradient(terms["policy_sum"], model.trainable_variables)
    assert any(g is not None and float(tf.norm(tf.convert_to_tensor(g))) > 0 for g in grads)
    optimizer.apply_gradients([(g, v) for g, v in zip(grads, model.trainable_variables, strict=True)
                               if g is not None])
    assert nll() < before


def _numpy_kl(p, q, targets):
    """The reference: per-word KL(p || q) in float64, 0 at `<pad>`."""
    p64, q64 = p.astype(np.float64), q.astype(np.float64)
    terms = np.where(p64 > 0, p64 * (np.log(np.maximum(p64, 1e-8)) - np.log(np.maximum(q64, 1e-8))),
                     0.0)
    return terms.sum(-1) * (targets != PAD_ID)


def test_attention_kl_matches_a_reference_and_is_zero_for_equal_maps():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6), size=(3, 4)).astype(np.float32)
    q = rng.dirichlet(np.ones(6), size=(3, 4)).astype(np.float32)
    p[0, 0] = [1, 0, 0, 0, 0, 0]  # a one-hot map (zeros in the anchor contribute nothing)
    targets = np.array([[5, 6, 2, 0], [7, 2, 0, 0], [4, 4, 4, 2]], np.int32)
    got = scst.attention_kl(p, q, targets).numpy()
    np.testing.assert_allclose(got, _numpy_kl(p, q, targets), rtol=1e-5, atol=1e-6)
    assert got[0, 3] == 0.0 and got[1, 2] == 0.0 and (got[targets != PAD_ID] > 0).all()
    np.testing.assert_allclose(scst.attention_kl(p, p, targets).numpy(), 0.0, atol=1e-6)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_the_anchor_term_is_the_kl_to_the_start_models_attention(attention):
    model, start = make_model(attention, seed=3), make_model(attention, seed=4)
    a = annotations(batch=2)
    tokens = np.array([[[5, 6, 2, 0], [9, 2, 0, 0]], [[7, 2, 0, 0], [4, 4, 2, 0]]], np.int32)
    anchor = scst.teacher_forced_attention(start, a, tokens)
    assert anchor.shape == (4, 4, a.shape[1])
    terms = scst.policy_loss_terms(model, a, tokens, np.ones((2, 2), np.float32), anchor)
    mine = scst.teacher_forced_attention(model, a, tokens).numpy()
    targets = tokens.reshape(4, 4)
    expected = _numpy_kl(anchor.numpy(), mine, targets).sum()
    np.testing.assert_allclose(float(terms["attention_kl_sum"]), expected, rtol=1e-4)
    assert expected > 0
    same = scst.policy_loss_terms(model, a, tokens, np.ones((2, 2), np.float32),
                                  scst.teacher_forced_attention(model, a, tokens))
    assert abs(float(same["attention_kl_sum"])) < 1e-4
    assert float(scst.policy_loss_terms(model, a, tokens, np.ones((2, 2), np.float32))
                 ["attention_kl_sum"]) == 0.0


def _numpy_cells(boxes, h, w):
    """The reference: cell (y, x) is in a box when their rectangles overlap with positive area."""
    out = np.zeros(boxes.shape[:2] + (h * w,), np.float32)
    for n, m in np.ndindex(*boxes.shape[:2]):
        ymin, xmin, ymax, xmax = boxes[n, m]
        for y, x in np.ndindex(h, w):
            dy = min(ymax, (y + 1) / h) - max(ymin, y / h)
            dx = min(xmax, (x + 1) / w) - max(xmin, x / w)
            out[n, m, y * w + x] = float(dy > 0 and dx > 0)
    return out


def test_box_cells_are_the_cells_a_box_overlaps():
    rng = np.random.default_rng(1)
    corners = np.sort(rng.uniform(0, 1, size=(3, 5, 2, 2)), axis=2)   # (N, M, lo/hi, y/x)
    boxes = np.stack([corners[:, :, 0, 0], corners[:, :, 0, 1],
                      corners[:, :, 1, 0], corners[:, :, 1, 1]], -1).astype(np.float32)
    boxes[0, 0] = [0.0, 0.0, 0.0, 0.0]           # padding: no area, no cell
    boxes[0, 1] = [0.40, 0.40, 0.45, 0.45]       # inside one cell of a 2x3 grid
    got = scst.box_cells(boxes, 2, 3).numpy()
    np.testing.assert_array_equal(got, _numpy_cells(boxes, 2, 3))
    assert got[0, 0].sum() == 0 and got[0, 1].tolist() == [0, 1, 0, 0, 0, 0]


def _numpy_box_nll(alpha, targets, object_words, cells):
    """The reference: loops over words, objects and cells."""
    nll = np.zeros(targets.shape)
    counted = np.zeros(targets.shape)
    for n, t in np.ndindex(*targets.shape):
        if targets[n, t] == PAD_ID:
            continue
        region = np.zeros(cells.shape[-1], bool)
        for m in range(object_words.shape[1]):
            if targets[n, t] in object_words[n, m]:
                region |= cells[n, m] > 0
        if region.any():
            counted[n, t] = 1.0
            nll[n, t] = -np.log(max(float(alpha[n, t][region].sum()), 1e-8))
    return nll, counted


def test_the_box_term_matches_a_reference_on_a_small_case():
    rng = np.random.default_rng(2)
    alpha = rng.dirichlet(np.ones(4), size=(2, 4)).astype(np.float32)   # (N=2, T=4, L=4)
    targets = np.array([[5, 6, 7, 0], [6, 8, 2, 0]], np.int32)
    # Image 0: object 0 is named by 5 and 6, object 1 by 6; image 1: object 0 by 8, a box
    # without area (named by 6: not counted), padding.
    object_words = np.array([[[5, 6], [6, -1]], [[8, -1], [6, -1]]], np.int32)
    boxes = np.array([[[0.0, 0.0, 0.4, 0.4], [0.6, 0.0, 1.0, 1.0]],
                      [[0.0, 0.6, 1.0, 1.0], [0.3, 0.3, 0.3, 0.3]]], np.float32)
    cells = scst.box_cells(boxes, 2, 2)
    nll, counted = scst.box_attention_nll(
        alpha, targets, scst.word_regions(targets, object_words, cells))
    want_nll, want_counted = _numpy_box_nll(alpha, targets, object_words, cells.numpy())
    np.testing.assert_allclose(nll.numpy(), want_nll, rtol=1e-5)
    np.testing.assert_array_equal(counted.numpy(), want_counted)
    assert want_counted.tolist() == [[1, 1, 0, 0], [0, 1, 0, 0]]
    # "6" in image 0 names both objects: its region is their union (cells 0, 2, 3).
    assert want_nll[0, 1] == pytest.approx(-np.log(alpha[0, 1][[0, 2, 3]].sum()), rel=1e-6)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_the_box_term_of_the_policy_loss_is_computed_in_the_graph(attention):
    model = make_model(attention, seed=3)
    a = annotations(batch=2)
    tokens = np.array([[[5, 6, 2, 0], [9, 2, 0, 0]], [[7, 2, 0, 0], [4, 4, 2, 0]]], np.int32)
    object_words = np.array([[[5, 9]], [[4, -1]]], np.int32)          # one object per image
    boxes = np.array([[[0.0, 0.0, 0.5, 0.5]], [[0.5, 0.5, 1.0, 1.0]]], np.float32)
    cells = scst.box_cells(boxes, 3, 3)
    ones = np.ones((2, 2), np.float32)
    step = tf.function(lambda: scst.policy_loss_terms(model, a, tokens, ones, None,
                                                      (object_words, cells)))
    with tf.GradientTape() as tape:
        terms = step()
    grads = tape.gradient(terms["box_nll_sum"], model.trainable_variables)
    assert any(g is not None and float(tf.norm(tf.convert_to_tensor(g))) > 0 for g in grads)
    alpha = scst.teacher_forced_attention(model, a, tokens).numpy()
    want, counted = _numpy_box_nll(alpha, tokens.reshape(4, 4), np.repeat(object_words, 2, 0),
                                   np.repeat(cells.numpy(), 2, 0))
    np.testing.assert_allclose(float(terms["box_nll_sum"]), want.sum(), rtol=1e-4)
    assert float(terms["box_words"]) == counted.sum() == 4   # 5 and 9; 4 and 4
    none = scst.policy_loss_terms(model, a, tokens, ones)
    assert float(none["box_nll_sum"]) == float(none["box_words"]) == 0.0


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_the_keep_form_of_the_box_term_counts_only_the_excess_over_the_start(attention):
    model = make_model(attention, seed=3)
    a = annotations(batch=2)
    tokens = np.array([[[5, 6, 2, 0], [9, 2, 0, 0]], [[7, 2, 0, 0], [4, 4, 2, 0]]], np.int32)
    object_words = np.array([[[5, 9]], [[4, -1]]], np.int32)
    boxes = np.array([[[0.0, 0.0, 0.5, 0.5]], [[0.5, 0.5, 1.0, 1.0]]], np.float32)
    cells = scst.box_cells(boxes, 3, 3)
    ones = np.ones((2, 2), np.float32)
    # A start model looking everywhere alike: 4 of the 9 cells in each box, -log(4/9) = 0.81,
    # above the model's at image 1's words and below it at image 0's.
    start_alpha = tf.fill([4, 4, 9], 1.0 / 9.0)
    step = tf.function(lambda: scst.policy_loss_terms(model, a, tokens, ones, None,
                                                      (object_words, cells), start_alpha))
    with tf.GradientTape() as tape:
        terms = step()
    # The reference: per counted word, max(-log mass of the model - (-log mass of the start), 0).
    targets = tokens.reshape(4, 4)
    words, boxed = np.repeat(object_words, 2, 0), np.repeat(cells.numpy(), 2, 0)
    mine, counted = _numpy_box_nll(scst.teacher_forced_attention(model, a, tokens).numpy(),
                                   targets, words, boxed)
    theirs, _ = _numpy_box_nll(start_alpha.numpy(), targets, words, boxed)
    want = np.maximum(mine - theirs, 0.0) * counted
    assert 0 < (want > 0).sum() < counted.sum()   # the case has words above and below the start
    np.testing.assert_allclose(float(terms["box_nll_sum"]), want.sum(), rtol=1e-4, atol=1e-6)
    assert float(terms["box_words"]) == counted.sum() == 4
    grads = tape.gradient(terms["box_nll_sum"], model.trainable_variables)
    assert any(g is not None and float(tf.norm(tf.convert_to_tensor(g))) > 0 for g in grads)
    # Against itself the model has no excess, and the term gives no gradient.
    itself = scst.teacher_forced_attention(model, a, tokens)
    with tf.GradientTape() as tape:
        same = scst.policy_loss_terms(model, a, tokens, ones, None, (object_words, cells), itself)
    assert float(same["box_nll_sum"]) == 0.0 and float(same["box_words"]) == 4
    grads = tape.gradient(same["box_nll_sum"], model.trainable_variables)
    assert all(g is None or float(tf.norm(tf.convert_to_tensor(g))) == 0 for g in grads)


def test_the_box_excess_is_a_hinge_at_the_start_models_value():
    nll = tf.constant([[0.5, 2.0, 0.0]])
    start = tf.constant([[1.0, 1.5, 0.0]])
    np.testing.assert_allclose(scst.box_attention_excess(nll, start).numpy(), [[0.0, 0.5, 0.0]])
    with tf.GradientTape() as tape:
        tape.watch(start)
        out = tf.reduce_sum(scst.box_attention_excess(nll, start))
    assert tape.gradient(out, start) is None   # the start model's value is a constant
