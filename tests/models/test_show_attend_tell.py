"""ShowAttendTell: the layer contract, teacher forcing vs decode_step, losses, overfitting."""
import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from models import losses
from models.decoder_options import DecoderOptions
from models.decoding import greedy_decode
from models.show_attend_tell import ShowAttendTell
from pipeline.config import ModelConfig
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


def _inputs(seed=0):
    return {"annotations": annotations(seed), "tokens": CAPTIONS[:, :-1]}


def test_takes_the_model_config_fields_and_round_trips_its_config():
    fields = dataclasses.asdict(ModelConfig(attention="hard", hard_inference="argmax",
                                            expected_alpha_warmup_epochs=2))
    # The config counts the warmup in epochs, the model in minibatches (the
    # trainer multiplies by its steps per epoch; here 3).
    warmup_steps = int(fields.pop("expected_alpha_warmup_epochs") * 3)
    model = ShowAttendTell(VOCAB, DecoderOptions(expected_alpha_warmup=warmup_steps, **fields),
                           seed=5)
    config = model.get_config()
    for key, value in fields.items():
        assert config[key] == value
    assert config["expected_alpha_warmup"] == 6
    assert config["vocab_size"] == VOCAB and config["seed"] == 5
    assert ShowAttendTell.from_config(config).get_config() == config
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    assert isinstance(revived, ShowAttendTell) and revived.get_config() == config
    with pytest.raises(ValueError, match="attention"):
        ShowAttendTell(VOCAB, {"attention": "sparse"})
    with pytest.raises(ValueError, match="Unrecognized keyword"):  # options are not keywords
        ShowAttendTell(VOCAB, attention="hard")


@pytest.mark.parametrize("attention,use_gate", [("soft", True), ("soft", False), ("hard", True)])
def test_exact_weight_counts(attention, use_gate):
    model = make_model(attention, use_gate=use_gate)
    v, e, n, a, d = VOCAB, EMBED, HIDDEN, UNITS, DIM
    want = {
        "embedding/embeddings": (v, e),
        "init_h/kernel": (d, n), "init_h/bias": (n,),
        "init_c/kernel": (d, n), "init_c/bias": (n,),
        "attention/annotation_projection/kernel": (d, a),
        "attention/annotation_projection/bias": (a,),
        "attention/hidden_projection/kernel": (n, a), "attention/score_kernel": (a,),
        "lstm_input/kernel": (e, 4 * n), "lstm_input/bias": (4 * n,),
        "lstm_context/kernel": (d, 4 * n), "lstm_recurrent/kernel": (n, 4 * n),
        "output_hidden/kernel": (n, e), "output_context/kernel": (d, e),
        "output_logits/kernel": (e, v), "output_logits/bias": (v,),
    }
    if attention == "soft" and use_gate:
        want.update({"gate/kernel": (n, 1), "gate/bias": (1,)})
    got = {w.path.split("/", 1)[1]: tuple(w.shape) for w in model.trainable_weights}
    assert got == want
    assert model.count_params() == sum(np.prod(s) for s in want.values()) + (
        3 if attention == "hard" else 0)
    non_trainable = sorted(w.path.split("/", 1)[1] for w in model.non_trainable_weights)
    assert non_trainable == (["baseline_updates", "hard_training_steps", "reward_baseline"]
                             if attention == "hard" else [])


def test_forget_gate_bias_starts_at_one():
    bias = make_model().lstm_input.bias.numpy()
    np.testing.assert_array_equal(bias[HIDDEN:2 * HIDDEN], 1.0)
    np.testing.assert_array_equal(np.delete(bias, np.s_[HIDDEN:2 * HIDDEN]), 0.0)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_symbolic_and_eager_calls(attention):
    model = ShowAttendTell(VOCAB, DecoderOptions(embedding_dim=EMBED, hidden_dim=HIDDEN,
                                                 attention_dim=UNITS, attention=attention))
    out = model({"annotations": keras.Input((REGIONS, DIM)),
                 "tokens": keras.Input((None,), dtype="int32")})
    assert tuple(out["logits"].shape) == (None, None, VOCAB)
    assert tuple(out["alpha"].shape) == (None, None, REGIONS)
    out = model(_inputs())
    assert out["logits"].shape == (2, 5, VOCAB) and out["logits"].dtype == "float32"
    assert out["alpha"].shape == (2, 5, REGIONS) and out["beta"].shape == (2, 5)
    np.testing.assert_allclose(np.asarray(out["alpha"]).sum(-1), 1.0, rtol=1e-5)


def test_the_gate_scales_the_weights_as_it_would_scale_the_context():
    """`context` folds beta_t into the (batch, L) weights: the value and the gradients
    of `beta_t sum_i alpha_i a_i`."""
    from models import attention_step
    from tests.models.tiny import annotations as grids
    model = make_model()
    rng = np.random.default_rng(5)
    a = tf.constant(grids())
    alpha = tf.nn.softmax(tf.constant(rng.normal(size=(2, REGIONS)), tf.float32))
    beta = tf.constant(rng.uniform(0.1, 0.9, size=(2, 1)), tf.float32)
    probe = tf.constant(rng.normal(size=(2, DIM)), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([alpha, beta])
        z = attention_step.context(model, {"weights": alpha, "beta": beta}, a)
        want = beta * tf.einsum("bl,bld->bd", alpha, a)
        loss, want_loss = tf.reduce_sum(z * probe), tf.reduce_sum(want * probe)
    np.testing.assert_allclose(z, want, rtol=1e-5, atol=1e-6)
    for variable in (alpha, beta):
        np.testing.assert_allclose(tape.gradient(loss, variable),
                                   tape.gradient(want_loss, variable), rtol=1e-5, atol=1e-6)


def test_masked_regions_get_zero_attention_at_every_step():
    model = make_model()
    mask = np.ones((2, REGIONS), bool)
    mask[0, :4] = False
    alpha = np.asarray(model({**_inputs(), "mask": mask})["alpha"])
    assert (alpha[0, :, :4] == 0).all()
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_save_and_load_give_identical_outputs(tmp_path, attention):
    model = make_model(attention)
    if attention == "hard":
        model.reward_baseline.assign(-7.5)
        model.baseline_updates.assign(3.0)
    model.save(tmp_path / "model.keras")
    revived = keras.saving.load_model(tmp_path / "model.keras")
    assert revived.get_config() == model.get_config()
    for key, value in model(_inputs()).items():
        np.testing.assert_array_equal(value, revived(_inputs())[key])
    if attention == "hard":
        assert float(revived.reward_baseline.numpy()) == -7.5


@pytest.mark.parametrize("attention,inference", [("soft", "expected"), ("hard", "expected"),
                                                 ("hard", "argmax")])
def test_teacher_forcing_equals_step_by_step_decoding(attention, inference):
    model = make_model(attention, hard_inference=inference)
    a, mask = annotations(), np.ones((2, REGIONS), bool)
    mask[1, 5:] = False
    tokens = CAPTIONS[:, :-1]
    out = model({"annotations": a, "tokens": tokens, "mask": mask})
    want = np.asarray(tf.nn.log_softmax(out["logits"]))
    projected = model.project_annotations(a)
    products = model.context_products(a)
    state = fast = model.initial_state(a, mask)
    for t in range(tokens.shape[1]):
        log_probs, alpha, state = model.decode_step(tokens[:, t], state, a, projected, mask)
        np.testing.assert_allclose(log_probs, want[:, t], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(alpha, out["alpha"][:, t], rtol=1e-5, atol=1e-6)
        log_probs, alpha, fast = model.decode_step(tokens[:, t], fast, a, projected, mask,
                                                   context_products=products)
        np.testing.assert_allclose(log_probs, want[:, t], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(alpha, out["alpha"][:, t], rtol=1e-5, atol=1e-6)


def test_soft_loss_terms():
    model = make_model(doubly_stochastic_lambda=0.5)
    terms = model.compute_loss_terms(annotations(), CAPTIONS, training=False)
    targets = CAPTIONS[:, 1:]
    real = targets != 0
    log_p = np.asarray(tf.nn.log_softmax(terms["logits"]))
    nll = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(terms["nll"], nll[real].mean(), rtol=1e-5)
    np.testing.assert_allclose(terms["example_nll"], (nll * real).sum(1), rtol=1e-5)
    assert float(terms["num_tokens"]) == real.sum() == 7
    alpha = np.asarray(terms["alpha"])
    penalty = 0.5 * ((1 - (alpha * real[..., None]).sum(1)) ** 2).sum(-1)
    np.testing.assert_allclose(terms["attention_penalty"], penalty.mean(), rtol=1e-5)
    np.testing.assert_allclose(terms["loss"], nll[real].mean() + penalty.mean(), rtol=1e-5)
    scaled = model.compute_loss_terms(annotations(), CAPTIONS, training=False,
                                      global_batch_size=8)
    np.testing.assert_allclose(scaled["loss"], float(terms["loss"]) * 2 / 8, rtol=1e-5)


def test_hard_loss_terms_and_baseline_updates():
    model = make_model("hard", baseline_decay=0.9, expected_alpha_prob=0.0, entropy_lambda=0.1,
                       reinforce_lambda=1.0)
    first = model.compute_loss_terms(annotations(), CAPTIONS)
    assert float(first["used_expected_alpha"]) == 0.0
    reward = float(first["reward"])
    np.testing.assert_allclose(reward, -np.asarray(first["example_nll"]).mean(), rtol=1e-5)
    # The first update sets b to the mean reward; then b <- 0.9 b + 0.1 r.
    np.testing.assert_allclose(model.reward_baseline.numpy(), reward, rtol=1e-6)
    second = model.compute_loss_terms(annotations(), CAPTIONS)
    np.testing.assert_allclose(second["baseline"], reward, rtol=1e-6)
    np.testing.assert_allclose(model.reward_baseline.numpy(),
                               0.9 * reward + 0.1 * float(second["reward"]), rtol=1e-5)
    np.testing.assert_allclose(
        second["loss"], float(second["nll"]) + float(second["attention_penalty"])
        + float(second["reinforce_term"]) - 0.1 * float(second["attention_entropy"]), rtol=1e-5)
    # With the expected alpha: no REINFORCE term and no baseline update.
    model.options = dataclasses.replace(model.options, expected_alpha_prob=1.0)
    before = float(model.reward_baseline.numpy())
    expected = model.compute_loss_terms(annotations(), CAPTIONS)
    assert float(expected["used_expected_alpha"]) == 1.0
    assert float(expected["reinforce_term"]) == 0.0
    assert float(model.reward_baseline.numpy()) == before
    evaluation = model.compute_loss_terms(annotations(), CAPTIONS, training=False)
    assert float(model.baseline_updates.numpy()) == 2.0
    assert float(evaluation["reinforce_term"]) == 0.0


def test_hard_token_credit_rewards_each_step_with_its_word():
    model = make_model("hard", expected_alpha_prob=0.0, entropy_lambda=0.0,
                       reinforce_credit="token")
    terms = model.compute_loss_terms(annotations(), CAPTIONS)
    steps = (np.asarray(CAPTIONS)[:, 1:] != 0).astype(np.float32)
    token_nll = np.asarray(ops.convert_to_numpy(
        losses.masked_nll(terms["logits"], np.asarray(CAPTIONS)[:, 1:])))
    # The reward is the mean per-word log-likelihood; the first baseline equals it.
    np.testing.assert_allclose(terms["reward"], -token_nll.sum() / steps.sum(), rtol=1e-5)
    np.testing.assert_allclose(terms["reward"], -float(terms["nll"]), rtol=1e-5)
    baseline = float(terms["baseline"])
    log_prob = np.asarray(terms["sample_log_prob"])
    want = -(((-token_nll - baseline) * log_prob) * steps).sum() / steps.sum()
    np.testing.assert_allclose(terms["reinforce_term"], want, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="reinforce_credit"):
        make_model("hard", reinforce_credit="episode")


def test_hard_expected_alpha_warmup_then_samples():
    model = make_model("hard", expected_alpha_prob=0.0, expected_alpha_warmup=2)
    used = [float(model.compute_loss_terms(annotations(), CAPTIONS)["used_expected_alpha"])
            for _ in range(4)]
    assert used == [1.0, 1.0, 0.0, 0.0]
    assert float(model.hard_training_steps.numpy()) == 4.0
    model.compute_loss_terms(annotations(), CAPTIONS, training=False)   # not counted
    assert float(model.hard_training_steps.numpy()) == 4.0
    # Warmup minibatches do not move the baseline (they do not sample).
    assert float(model.baseline_updates.numpy()) == 2.0
    assert ShowAttendTell.from_config(model.get_config()).options.expected_alpha_warmup == 2


@pytest.mark.parametrize("attention,expected_alpha_prob", [("soft", 0.5), ("hard", 0.0),
                                                           ("hard", 1.0)])
def test_one_training_step_reaches_every_weight(attention, expected_alpha_prob):
    model = make_model(attention, expected_alpha_prob=expected_alpha_prob)
    variables = model.trainable_variables
    before = [v.numpy().copy() for v in variables]
    with tf.GradientTape() as tape:
        loss = model.compute_loss_terms(annotations(), CAPTIONS)["loss"]
    grads = tape.gradient(loss, variables)
    missing = [v.path for v, g in zip(variables, grads, strict=True) if g is None]
    assert not missing
    keras.optimizers.Adam(1e-2).apply_gradients(zip(grads, variables, strict=True))
    assert all(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables, strict=True))


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_hoisted_recurrent_weight_gradients_equal_plain_autodiff(attention):
    model = make_model(attention, dropout=0.0)
    mask = np.ones((2, REGIONS), bool)
    mask[0, 3:] = False

    def grads():
        with tf.GradientTape() as tape:
            loss = model.compute_loss_terms(annotations(), CAPTIONS, mask=mask,
                                            training=False)["loss"]
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]

    hoisted, traced = grads(), tf.function(grads)()
    model._hoist_weight_grads = False
    plain = grads()
    for variable, x, y, z in zip(model.trainable_variables, hoisted, traced, plain, strict=True):
        np.testing.assert_allclose(x, z, rtol=1e-5, atol=1e-6, err_msg=variable.path)
        np.testing.assert_allclose(y, z, rtol=1e-5, atol=1e-6, err_msg=variable.path)


def test_hoisted_gradients_are_exact_where_the_step_also_needs_h_u_alone():
    # Hard attention in training with the "expected" baseline also scores the
    # expected context from `x_t + h U`, so its loop keeps W_z and U apart
    # (the others stack them into one [U; W_z] matmul): both forms are exact.
    model = make_model("hard", dropout=0.0, reinforce_baseline="expected",
                       reinforce_credit="token")
    model.compute_loss_terms(annotations(), CAPTIONS, training=True)   # creates the state
    state = [(v, v.numpy()) for v in model.non_trainable_variables]

    def grads(hoist):
        model._hoist_weight_grads = hoist
        for variable, value in state:          # the same seeds, coin flips and baselines
            variable.assign(value)
        with tf.GradientTape() as tape:
            loss = model.compute_loss_terms(annotations(), CAPTIONS, training=True)["loss"]
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]

    hoisted, plain = grads(True), grads(False)
    for variable, x, y in zip(model.trainable_variables, hoisted, plain, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=variable.path)


@pytest.mark.parametrize("enabled", [False, True])
def test_annotation_gradients_switch(enabled):
    model = make_model(annotation_gradients=enabled)
    a = tf.constant(annotations())
    with tf.GradientTape() as tape:
        tape.watch(a)
        loss = model.compute_loss_terms(a, CAPTIONS)["loss"]
    grad = tape.gradient(loss, a)
    assert (grad is None) == (not enabled)
    if enabled:
        assert np.abs(grad).max() > 0


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_jit_compiled_training_step(attention):
    model = make_model(attention, dropout=0.0, expected_alpha_prob=1.0)
    a = tf.constant(annotations())

    def step(a, tokens):
        with tf.GradientTape() as tape:
            loss = model.compute_loss_terms(a, tokens)["loss"]
        return loss, tape.gradient(loss, model.trainable_variables)

    jit_loss, jit_grads = tf.function(step, jit_compile=True)(a, CAPTIONS)
    loss, grads = tf.function(step)(a, CAPTIONS)
    np.testing.assert_allclose(jit_loss, loss, rtol=1e-5)
    for x, y in zip(jit_grads, grads, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(x), tf.convert_to_tensor(y),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,compute", [("mixed_float16", "float16"),
                                          ("mixed_bfloat16", "bfloat16")])
@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_mixed_precision_dtypes(name, compute, attention):
    with policy(name):
        model = make_model(attention)
        out = model(_inputs(), training=True)
        state = model.initial_state(annotations())
        with tf.GradientTape() as tape:
            terms = model.compute_loss_terms(annotations(), CAPTIONS)
        grads = tape.gradient(terms["loss"], model.trainable_variables)
        decoded = greedy_decode(model, annotations(), 3)
    assert model.compute_dtype == compute
    assert all(w.dtype == "float32" for w in model.weights)
    assert out["logits"].dtype == out["alpha"].dtype == out["beta"].dtype == "float32"
    assert state[0].dtype == compute and state[1].dtype == "float32"
    assert all(terms[k].dtype == "float32" for k in ("loss", "nll", "attention_penalty"))
    assert np.isfinite(float(terms["loss"]))
    assert all(g is not None for g in grads)
    assert decoded["scores"].dtype == decoded["attention"].dtype == "float32"
    np.testing.assert_allclose(np.asarray(decoded["attention"])[:, 0].sum(-1), 1.0, rtol=1e-3)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_as_float32_is_a_float32_twin_with_the_same_weights(attention):
    with policy("mixed_bfloat16"):
        model = make_model(attention)
        model.compute_loss_terms(annotations(), CAPTIONS)   # moves the hard baseline
        mixed = model({"annotations": annotations(), "tokens": CAPTIONS[:, :-1]})
    twin = model.as_float32()
    assert twin is not model and twin.compute_dtype == "float32"
    assert {layer.compute_dtype for layer in twin._flatten_layers()} == {"float32"}
    assert [w.path for w in twin.weights] == [w.path for w in model.weights]
    for a, b in zip(twin.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    full = twin({"annotations": annotations(), "tokens": CAPTIONS[:, :-1]})
    np.testing.assert_allclose(full["logits"], mixed["logits"], atol=0.05)
    assert twin.as_float32() is twin


def _expected_baseline_model(**kwargs):
    config = dict(expected_alpha_prob=0.0, entropy_lambda=0.0, reinforce_credit="token",
                  reinforce_baseline="expected", dropout=0.0)
    config.update(kwargs)
    return make_model("hard", **config)


def test_hard_expected_baseline_is_each_words_counterfactual():
    model = _expected_baseline_model()
    terms = model.compute_loss_terms(annotations(), CAPTIONS)
    targets = np.asarray(CAPTIONS)[:, 1:]
    steps = (targets != 0).astype(np.float32)
    token_nll = np.asarray(losses.masked_nll(terms["logits"], targets))
    baseline = np.asarray(terms["token_baseline"])
    assert baseline.shape == targets.shape
    # Step 0 starts from the same h_0 as an expected-context pass, so its
    # baseline is that pass's log-likelihood; later steps follow the samples.
    expected_pass = model(_inputs(), training=False)["logits"]
    expected_nll = np.asarray(losses.masked_nll(expected_pass, targets))
    np.testing.assert_allclose(baseline[:, 0], -expected_nll[:, 0], rtol=1e-5)
    assert np.abs(baseline * steps + token_nll).max() > 1e-4   # the samples made a difference
    np.testing.assert_allclose(terms["baseline"], baseline.sum() / steps.sum(), rtol=1e-5)
    log_prob = np.asarray(terms["sample_log_prob"])
    want = -(((-token_nll - baseline) * log_prob) * steps).sum() / steps.sum()
    np.testing.assert_allclose(terms["reinforce_term"], want, rtol=1e-4, atol=1e-6)
    # The moving average is not used, and not moved.
    assert float(model.baseline_updates.numpy()) == 0.0
    assert ShowAttendTell.from_config(model.get_config()).options.reinforce_baseline == "expected"
    with pytest.raises(ValueError, match="token"):
        make_model("hard", reinforce_baseline="expected", reinforce_credit="sequence")
    with pytest.raises(ValueError, match="reinforce_baseline"):
        make_model("hard", reinforce_baseline="learned")


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_hard_expected_baseline_equals_the_reward_when_the_context_is_expected(dropout):
    # Same context, same dropout mask: zero advantage, whatever the dropout.
    model = _expected_baseline_model(expected_alpha_prob=1.0, dropout=dropout)
    terms = model.compute_loss_terms(annotations(), CAPTIONS)
    token_nll = np.asarray(losses.masked_nll(terms["logits"], np.asarray(CAPTIONS)[:, 1:]))
    np.testing.assert_allclose(terms["token_baseline"], -token_nll, rtol=1e-5, atol=1e-6)
    assert float(terms["reinforce_term"]) == 0.0


def test_hard_expected_baseline_has_no_gradient_and_keeps_the_hoisted_gradients():
    def grads(hoist, term):
        model = _expected_baseline_model()
        model._hoist_weight_grads = hoist
        with tf.GradientTape() as tape:
            value = model.compute_loss_terms(annotations(), CAPTIONS)[term]
        return model, tape.gradient(value, model.trainable_variables)

    model, reinforce = grads(True, "reinforce_term")
    # The REINFORCE term moves what computes alpha (attention MLP, LSTM,
    # embedding), never the deep output: its advantage (reward minus the
    # counterfactual baseline) is a constant.
    moved = {v.path.split("/")[-2] for v, g in zip(model.trainable_variables, reinforce, strict=True)
             if g is not None and np.abs(tf.convert_to_tensor(g)).max() > 0}
    assert {"attention", "lstm_recurrent"} <= moved, moved
    assert not moved & {"output_hidden", "output_context", "output_logits"}, moved
    _, hoisted = grads(True, "loss")
    _, plain = grads(False, "loss")
    for variable, x, y in zip(model.trainable_variables, hoisted, plain, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(x), tf.convert_to_tensor(y),
                                   rtol=1e-5, atol=1e-6, err_msg=variable.path)


def test_the_doubly_stochastic_penalty_is_soft_attention_only():
    # Section 4.2.1: a term of the soft objective; hard attention's (equation 12) has none.
    soft = make_model("soft", doubly_stochastic_lambda=1.0)
    hard = make_model("hard", doubly_stochastic_lambda=1.0, expected_alpha_prob=1.0,
                      entropy_lambda=0.0)
    assert float(soft.compute_loss_terms(annotations(), CAPTIONS)["attention_penalty"]) > 0.1
    terms = hard.compute_loss_terms(annotations(), CAPTIONS)
    assert float(terms["attention_penalty"]) == 0.0
    np.testing.assert_allclose(terms["loss"], terms["nll"], rtol=1e-6)
