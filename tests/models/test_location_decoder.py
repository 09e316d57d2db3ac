"""ShowAttendTell with the location-wise attentions: weights, objective, decoding, precision."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from models import losses
from models.decoding import beam_search, greedy_decode, sample_decode
from models.show_attend_tell import ShowAttendTell
from models.text import END_ID
from tests.models.tiny import (
    CAPTIONS,
    DIM,
    EMBED,
    HIDDEN,
    REGIONS,
    UNITS,
    VOCAB,
    annotations,
    make_model,
    policy,
)

LOCATED = ["glimpse", "spatial_transformer"]


def _np(x):
    return np.asarray(tf.convert_to_tensor(x))


def _inputs(seed=0):
    return {"annotations": annotations(seed), "tokens": CAPTIONS[:, :-1]}


@pytest.mark.parametrize("attention", LOCATED)
def test_exact_weights_and_counters(attention):
    model = make_model(attention)
    got = {w.path.split("/", 1)[1] for w in model.trainable_weights}
    common = {"embedding/embeddings", "init_h/kernel", "init_h/bias", "init_c/kernel",
              "init_c/bias", "lstm_input/kernel", "lstm_input/bias", "lstm_context/kernel",
              "lstm_recurrent/kernel", "output_hidden/kernel", "output_context/kernel",
              "output_logits/kernel", "output_logits/bias"}
    network = {f"attention/location_network/{k}" for k in (
        "hidden_layer/kernel", "hidden_layer/bias", "cell_projection/kernel",
        "map_projection/kernel", "output_kernel", "output_bias")}
    if attention == "glimpse":
        own = {f"attention/{k}" for k in (
            "retina_projection/kernel", "retina_layer/kernel", "retina_layer/bias",
            "where_layer/kernel", "where_layer/bias", "glimpse_layer/kernel",
            "glimpse_layer/bias", "baseline_kernel", "baseline_bias")}
        counters = ["baseline_updates", "guard_checked", "guard_fired", "reward_baseline"]
    else:
        own = {"gate/kernel", "gate/bias"}
        counters = ["guard_checked", "guard_fired"]
    assert got == common | network | own
    assert sorted(w.path.split("/", 1)[1] for w in model.non_trainable_weights) == counters
    shapes = {w.path.split("/", 1)[1]: tuple(w.shape) for w in model.trainable_weights}
    assert shapes["attention/location_network/map_projection/kernel"] == (REGIONS * 4, UNITS)
    assert shapes["lstm_context/kernel"] == (DIM, 4 * HIDDEN)   # the context is D wide


@pytest.mark.parametrize("attention", LOCATED)
def test_outputs_save_and_load(tmp_path, attention):
    model = make_model(attention)
    out = model(_inputs())
    assert set(out) == {"logits", "alpha", "beta", "locations"}
    assert out["locations"].shape == (2, 5, 3) and out["locations"].dtype == "float32"
    np.testing.assert_allclose(_np(out["alpha"]).sum(-1), 1.0, rtol=1e-5)
    model.save(tmp_path / "model.keras")
    revived = keras.saving.load_model(tmp_path / "model.keras")
    assert revived.get_config() == model.get_config()
    for key, value in out.items():
        np.testing.assert_array_equal(value, revived(_inputs())[key])


@pytest.mark.parametrize("attention", LOCATED)
def test_teacher_forcing_equals_step_by_step_decoding(attention):
    model = make_model(attention, dropout=0.0)
    a, tokens = annotations(), CAPTIONS[:, :-1]
    out = model({"annotations": a, "tokens": tokens})
    want = _np(tf.nn.log_softmax(out["logits"]))
    projected, state = model.project_annotations(a), model.initial_state(a)
    products = model.context_products(a)
    for t in range(tokens.shape[1]):
        step = model.step_outputs(tokens[:, t], state, a, projected, context_products=products)
        np.testing.assert_allclose(step["log_probs"], want[:, t], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(step["alpha"], out["alpha"][:, t], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(step["location"], out["locations"][:, t], rtol=1e-5,
                                   atol=1e-6)
        state = step["state"]


@pytest.mark.parametrize("attention", LOCATED)
def test_greedy_and_beam_search_return_each_words_location(attention):
    model = make_model(attention, seed=4)
    model.output_logits.bias.assign(np.where(np.arange(VOCAB) == END_ID, 1.5, 0.0))
    a = annotations(4)
    greedy, beam1 = greedy_decode(model, a, 6), beam_search(model, a, 1, 6)
    for key in greedy:
        np.testing.assert_array_equal(greedy[key], beam1[key], err_msg=key)
    plain = greedy_decode(model, a, 6, context_products=False)
    fast = greedy_decode(model, a, 6, context_products=True)
    np.testing.assert_array_equal(plain["tokens"], fast["tokens"])
    beam = beam_search(model, a, 3, 6)
    for out in (greedy, beam):
        locations, lengths = _np(out["locations"]), _np(out["lengths"])
        assert locations.shape == (2, 6, 3) and out["locations"].dtype == tf.float32
        for row, length in zip(locations, lengths, strict=True):
            assert (np.abs(row[:length, :2]) <= 1).all() and (row[:length, 2] > 0).all()
            assert (row[length:] == 0).all()
        np.testing.assert_allclose(_np(out["attention"])[:, 0].sum(-1), 1.0, rtol=1e-5)
    assert "locations" not in greedy_decode(make_model("soft"), a, 3)
    sampled = sample_decode(model, a, 2, 4, tf.constant([1, 2]))
    assert sampled["tokens"].shape == (2, 2, 4)


def test_glimpse_objective_reinforce_against_the_baseline_and_its_loss():
    model = make_model("glimpse", dropout=0.0, reinforce_credit="token", reinforce_lambda=0.7)
    terms = model.compute_loss_terms(annotations(), CAPTIONS)
    targets = CAPTIONS[:, 1:]
    steps = (targets != 0).astype("float32")
    token_nll = _np(losses.masked_nll(terms["logits"], targets))
    reward = -token_nll
    # The first step sets the moving average to the mean reward per word.
    average = reward.sum() / steps.sum()
    np.testing.assert_allclose(float(model.reward_baseline.numpy()), average, rtol=1e-5)
    np.testing.assert_allclose(terms["reward"], average, rtol=1e-5)
    assert float(terms["used_expected_alpha"]) == 0.0
    np.testing.assert_allclose(
        terms["loss"], float(terms["nll"]) + float(terms["reinforce_term"])
        + float(terms["baseline_loss"]) + float(terms["guard_penalty"]), rtol=1e-5)
    assert float(terms["attention_penalty"]) == 0.0           # no doubly stochastic term
    # The moving average has moved: the next step's baseline is b + f(h).
    second = model.compute_loss_terms(annotations(), CAPTIONS)
    log_prob = _np(second["sample_log_prob"])
    reward2 = -_np(losses.masked_nll(second["logits"], targets))
    per_step = float(second["baseline"])
    assert abs(per_step - average) < 0.5                      # f starts near zero
    want_loss = (((reward2 - average) ** 2) * steps).sum() / steps.sum()
    assert abs(float(second["baseline_loss"]) - want_loss) < 0.5 * want_loss + 1e-3
    assert np.isfinite(log_prob).all() and (log_prob[steps > 0] != 0).all()


def test_glimpse_reinforce_gradient_reaches_the_policy_and_baseline_not_the_decoder_output():
    model = make_model("glimpse", dropout=0.0)
    model.compute_loss_terms(annotations(), CAPTIONS)        # sets the moving average
    variables = model.trainable_variables
    with tf.GradientTape(persistent=True) as tape:
        terms = model.compute_loss_terms(annotations(), CAPTIONS)
    def moved(term):
        return {v.path.split("/", 1)[1] for v, g in zip(variables, tape.gradient(terms[term],
                                                                                   variables), strict=True)
                if g is not None and np.abs(_np(g)).max() > 0}
    policy = {p for p in moved("reinforce_term")}
    assert policy and all(p.startswith("attention/location_network/") for p in policy), policy
    assert moved("baseline_loss") == {"attention/baseline_kernel", "attention/baseline_bias"}
    assert not any(p.startswith("attention/location_network/") for p in moved("nll"))


@pytest.mark.parametrize("attention", LOCATED)
def test_guard_counts_training_steps_only(attention):
    model = make_model(attention)
    terms = model.compute_loss_terms(annotations(), CAPTIONS)
    real = float((CAPTIONS[:, 1:] != 0).sum())
    assert float(model.guard_checked.numpy()) == real
    assert float(terms["guard_rate"]) == 0.0 and model.guard_rate() == 0.0
    model.attention_layer.location_network.output_bias.assign(
        np.full_like(model.attention_layer.location_network.output_bias.numpy(), 50.0))
    terms = model.compute_loss_terms(annotations(), CAPTIONS)
    assert float(terms["guard_rate"]) == 1.0 and float(terms["guard_penalty"]) > 0
    assert model.guard_rate() == pytest.approx(0.5)
    model.compute_loss_terms(annotations(), CAPTIONS, training=False)
    assert float(model.guard_checked.numpy()) == 2 * real


@pytest.mark.parametrize("attention", LOCATED)
def test_one_training_step_reaches_the_weights_and_hoisted_gradients_are_exact(attention):
    model = make_model(attention, dropout=0.0)
    variables = model.trainable_variables

    def grads(hoist):
        model._hoist_weight_grads = hoist
        keras.utils.set_random_seed(9)           # the same samples both times
        with tf.GradientTape() as tape:
            loss = model.compute_loss_terms(annotations(), CAPTIONS, training=False)["loss"]
        return [None if g is None else _np(g) for g in tape.gradient(loss, variables)]

    hoisted, plain = grads(True), grads(False)
    for v, x, y in zip(variables, hoisted, plain, strict=True):
        assert (x is None) == (y is None), v.path
        if x is not None:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=v.path)
    # In training every weight gets a gradient, except the spatial transformer's layers
    # before its zero-initialized output kernel.
    with tf.GradientTape() as tape:
        loss = model.compute_loss_terms(annotations(), CAPTIONS)["loss"]
    zero = {v.path.split("/", 1)[1] for v, g in zip(variables, tape.gradient(loss, variables), strict=True)
            if g is None or not np.abs(_np(g)).max() > 0}
    if attention == "glimpse":
        assert not zero
    else:
        assert zero == {f"attention/location_network/{k}" for k in (
            "hidden_layer/kernel", "hidden_layer/bias", "cell_projection/kernel",
            "map_projection/kernel")}


@pytest.mark.parametrize("attention", LOCATED)
def test_mixed_precision_keeps_locations_and_maps_in_float32(attention):
    with policy("mixed_bfloat16"):
        model = make_model(attention)
        out = model(_inputs(), training=True)
        with tf.GradientTape() as tape:
            terms = model.compute_loss_terms(annotations(), CAPTIONS)
        grads = tape.gradient(terms["loss"], model.trainable_variables)
        decoded = beam_search(model, annotations(), 2, 4)
    assert out["alpha"].dtype == out["locations"].dtype == "float32"
    assert np.isfinite(float(terms["loss"])) and all(g is not None for g in grads)
    assert decoded["locations"].dtype == tf.float32
    twin = model.as_float32()
    assert twin.compute_dtype == "float32"
    np.testing.assert_allclose(twin(_inputs())["locations"], model(_inputs())["locations"],
                               atol=0.05)


def test_options_come_as_a_dataclass_and_old_configs_load():
    from models.decoder_options import DecoderOptions
    options = DecoderOptions(embedding_dim=EMBED, hidden_dim=HIDDEN, attention_dim=UNITS,
                             attention="spatial_transformer", transform="affine")
    model = ShowAttendTell(VOCAB, options, seed=1)
    assert model.options is options and model.options.transform == "affine"
    assert ShowAttendTell.from_config(model.get_config()).options == options
    # A saved model's config from before the new options: they take their defaults.
    old = {"vocab_size": VOCAB, "embedding_dim": EMBED, "hidden_dim": HIDDEN,
           "attention_dim": UNITS, "attention": "hard", "seed": 0, "name": "show_attend_tell"}
    revived = ShowAttendTell.from_config(old)
    assert revived.options.attention_score == "additive" and revived.options.attention == "hard"
    with pytest.raises(ValueError, match="attention_score"):
        ShowAttendTell(VOCAB, {"attention": "glimpse", "attention_score": "general"})
    with pytest.raises(ValueError, match="glimpse_std"):
        ShowAttendTell(VOCAB, {"attention": "glimpse", "glimpse_std": 0.0})


@pytest.mark.parametrize("attention", LOCATED)
def test_self_critical_sampling_and_step(attention):
    from models import scst
    from models.cider_d import CiderD
    model = make_model(attention, seed=5)
    a = annotations(batch=2)
    references = np.array([[[1, 9, 4, 2]], [[1, 5, 6, 2]]], np.int32)
    scorer = CiderD.from_references([[list(r[0])] for r in references], VOCAB)
    sampled = scst.sample_and_reward(model, a, references, scorer, num_samples=3,
                                     max_length=5, seed=tf.constant([1, 2], tf.int64))
    assert sampled["tokens"].shape == (2, 3, 5)
    tokens = np.array([[[9, 4, 2, 0]], [[5, 6, 2, 0]]], np.int32)
    advantage = np.ones((2, 1), "float32")
    before = float(scst.policy_loss_terms(model, a, tokens, advantage)["nll_sum"])
    with tf.GradientTape() as tape:
        terms = scst.policy_loss_terms(model, a, tokens, advantage)
    grads = tape.gradient(terms["policy_sum"], model.trainable_variables)
    keras.optimizers.SGD(0.05).apply_gradients(
        [(g, v) for g, v in zip(grads, model.trainable_variables, strict=True) if g is not None])
    assert float(scst.policy_loss_terms(model, a, tokens, advantage)["nll_sum"]) < before


def test_spatial_transformer_objective_has_no_doubly_stochastic_penalty():
    # The penalty is smallest when the words' maps cover every cell: on a
    # window's map it would widen every window. Soft attention keeps it.
    stn = make_model("spatial_transformer", dropout=0.0, doubly_stochastic_lambda=1.0)
    terms = stn.compute_loss_terms(annotations(), CAPTIONS, training=False)
    steps = (CAPTIONS[:, 1:] != 0).astype("float32")
    # The maps do not sum to 1 over the steps in every cell, so the term would not be 0.
    coverage = (_np(terms["alpha"]) * steps[..., None]).sum(axis=1)
    assert np.abs(1.0 - coverage).max() > 0.1
    assert float(terms["attention_penalty"]) == 0.0
    np.testing.assert_allclose(_np(terms["example_penalty"]), 0.0)
    np.testing.assert_allclose(
        terms["loss"], float(terms["nll"]) + float(terms["guard_penalty"]), rtol=1e-5)
    soft = make_model("soft", dropout=0.0, doubly_stochastic_lambda=1.0)
    assert float(soft.compute_loss_terms(annotations(), CAPTIONS,
                                         training=False)["attention_penalty"]) > 0.0
