"""`FusedAdam` makes Keras Adam's updates, in one kernel per variable.

Exactness against `keras.optimizers.Adam` (dense and embedding gradients,
a schedule, clipping, weight decay, bfloat16 gradients of float32 weights),
its config, and its updates under `MirroredStrategy` on two logical CPUs (a
subprocess: the devices must be split before TensorFlow initialises).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from components.trainer.fused_adam import FusedAdam


def _model(seed: int = 0) -> keras.Model:
    """Embedding (sparse gradients) -> Dense, tiny."""
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((3,), dtype="int32")
    x = keras.layers.Embedding(11, 4, name="embed")(tokens)
    x = keras.layers.Flatten()(x)
    out = keras.layers.Dense(5, name="dense")(x)
    return keras.Model(tokens, out)


def _train(optimizer, steps: int = 5, seed: int = 0, bf16_grads: bool = False):
    """Weights of `_model` after `steps` Adam steps on fixed random data, and the last grads."""
    model = _model(seed)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.integers(0, 11, (6, 3)).astype("int32"))
    y = tf.constant(rng.normal(size=(6, 5)).astype("float32"))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        if bf16_grads:  # what a mixed_bfloat16 model's backward pass hands over
            grads = [tf.cast(tf.convert_to_tensor(g), tf.bfloat16) for g in grads]
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return grads

    for _ in range(steps):
        grads = step()
    return [v.numpy() for v in model.trainable_variables], grads


@pytest.mark.parametrize("kwargs", [
    {"learning_rate": 0.05},
    {"learning_rate": keras.optimizers.schedules.CosineDecay(0.05, 10)},
    {"learning_rate": 0.05, "clipnorm": 0.1, "weight_decay": 0.01, "epsilon": 1e-4,
     "beta_1": 0.8, "beta_2": 0.95},
])
def test_matches_keras_adam(kwargs):
    want, _ = _train(keras.optimizers.Adam(**kwargs))
    got, grads = _train(FusedAdam(**kwargs))
    # the embedding's gradient is sparse, with a repeated row (Keras's own update)
    assert isinstance(grads[0], tf.IndexedSlices)
    assert len(set(grads[0].indices.numpy().tolist())) < len(grads[0].indices)
    initial = _model().get_weights()
    for w, g, w0 in zip(want, got, initial, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)  # float rounding; a step is 0.05
        assert np.abs(g - w0).max() > 0.01  # every variable moved: not two untouched models


def test_bfloat16_gradients_update_float32_weights_as_keras_does():
    want, _ = _train(keras.optimizers.Adam(0.05), bf16_grads=True)
    got, _ = _train(FusedAdam(0.05), bf16_grads=True)
    for w, g in zip(want, got, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)  # float rounding; a step is 0.05


def test_amsgrad_uses_keras_update():
    want, _ = _train(keras.optimizers.Adam(0.05, amsgrad=True))
    got, _ = _train(FusedAdam(0.05, amsgrad=True))
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_config_round_trip_and_same_variables_as_adam():
    optimizer = FusedAdam(0.003, beta_1=0.85, epsilon=1e-6)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(again) is FusedAdam
    assert again.get_config() == optimizer.get_config()
    variables = _model().trainable_variables
    optimizer.build(variables)
    adam = keras.optimizers.Adam(0.003)
    adam.build(variables)
    def names(opt):  # paths without the optimizer's own name
        return [(v.path.split("/", 1)[1], tuple(v.shape)) for v in opt.variables]
    assert names(optimizer) == names(adam)


_MIRRORED = textwrap.dedent("""
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np, tensorflow as tf, keras
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from components.trainer.fused_adam import FusedAdam

    def run(make_optimizer):
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
            optimizer = make_optimizer()
            optimizer.build(model.trainable_variables)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(8, 4)).astype("float32")
        y = rng.normal(size=(8, 3)).astype("float32")
        data = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
        batch = next(iter(data))

        @tf.function
        def step(batch):
            def replica(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(tf.square(model(x) - y)) / 8.0
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            strategy.run(replica, args=batch)

        for _ in range(3):
            step(batch)
        kernel = model.trainable_variables[0].value
        return [v.numpy().tolist() for v in strategy.experimental_local_results(kernel)]

    print(json.dumps({"keras": run(lambda: keras.optimizers.Adam(0.1)),
                      "fused": run(lambda: FusedAdam(0.1))}))
""")


@pytest.mark.slow
def test_mirrored_strategy_updates_every_replica_like_keras_adam():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _MIRRORED], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    keras_replicas, fused_replicas = np.array(result["keras"]), np.array(result["fused"])
    assert keras_replicas.shape[0] == fused_replicas.shape[0] == 2
    np.testing.assert_allclose(fused_replicas[0], fused_replicas[1], rtol=0, atol=0)
    np.testing.assert_allclose(fused_replicas, keras_replicas, rtol=1e-5, atol=1e-6)


def test_resumes_a_checkpoint_written_with_keras_adam(tmp_path):
    # A Trainer run checkpointed with keras.optimizers.Adam (tf.train.Checkpoint of
    # model and optimizer, as components/trainer/loop.py writes) resumes with FusedAdam.
    model = _model()
    adam = keras.optimizers.Adam(0.05)
    x = tf.constant([[1, 2, 3], [4, 4, 5]])
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(x)))
        adam.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                 model.trainable_variables, strict=True))
    path = tf.train.Checkpoint(model=model, optimizer=adam).write(str(tmp_path / "ckpt"))

    resumed_model, fused = _model(seed=1), FusedAdam(0.05)
    fused.build(resumed_model.trainable_variables)
    tf.train.Checkpoint(model=resumed_model, optimizer=fused).read(path).assert_consumed()
    assert int(fused.iterations.numpy()) == 2
    for a, b in zip(adam.variables, fused.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(model.get_weights(), resumed_model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
