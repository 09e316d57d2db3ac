"""The contract every custom Keras layer of the project meets (after keras-hub's `run_layer_test`).

`run_layer_test` checks, for one layer class and constructor arguments:

  * serialization: every constructor argument is returned by `get_config()`
    under its own name; `from_config` and `serialize_keras_object` /
    `deserialize_keras_object` (through JSON) give the same config and the
    same attributes; the class is registered, so `.keras` files can name it;
  * a `.keras` save and load of a model around the layer gives identical
    outputs and an equal config;
  * build: `build()` from the input shapes creates exactly the expected
    weights (path below the layer, shape) and non-trainable variables, and
    `count_params()` adds them up;
  * a symbolic call on `keras.KerasTensor`s with an unknown batch, and an
    eager call, give the expected shapes and dtypes; a `tf.function` call
    gives the eager outputs (the trainer and the export trace the layer);
  * one training step in a `tf.function`: every trainable weight gets a
    finite, nonzero gradient and an SGD step changes it (except the weights
    named in `zero_gradient_weights`, whose first gradient must be exactly
    zero: those behind a zero-initialized layer); a layer without weights
    must pass gradients back to its float inputs;
  * mixed precision (`mixed_float16`, `mixed_bfloat16`), through the `dtype`
    argument and through the global policy: variables stay float32, float
    outputs come in the compute dtype except those named float32 (softmax
    outputs are computed in float32 for stability), sublayers share the
    policy, and the outputs are finite.

The behaviour of each layer (what its outputs mean) stays in its own tests.
A new layer's test file starts with, e.g.:

    def test_layer_contract():
        run_layer_test(SoftAttention, {"units": 8}, (annotations, hidden),
                       ((None, 16), (None, 9)), expected_weights=SCORER_WEIGHTS,
                       float32_outputs=(1,))
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import tempfile
from typing import Any, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

PRECISION_POLICIES = ("mixed_float16", "mixed_bfloat16")


def run_layer_test(cls: type, init_kwargs: Mapping[str, Any], input_data,
                   expected_output_shape, *, expected_weights: Mapping[str, tuple],
                   expected_num_non_trainable_variables: int = 0,
                   call_kwargs: Mapping[str, Any] | None = None,
                   training_kwargs: Mapping[str, Any] | None = None,
                   float32_outputs: Sequence[int] = (),
                   zero_gradient_weights: Sequence[str] = ()) -> None:
    """Runs the whole layer contract for `cls` (see the module docstring).

    Args:
      cls: the layer class.
      init_kwargs: constructor arguments (without `dtype`, which the mixed
        precision check sets).
      input_data: one array, or a tuple of arrays passed as positional
        arguments; dimension 0 is the batch.
      expected_output_shape: one shape, or a tuple of shapes, one per output,
        with `None` for the batch dimension.
      expected_weights: trainable weights as `{path below the layer: shape}`,
        e.g. `{"annotation_projection/kernel": (16, 8)}`; `{}` for none.
      expected_num_non_trainable_variables: non-trainable variables (a
        `SeedGenerator` state counts).
      call_kwargs: keyword arguments of the eager, graph and precision calls
        (tensors allowed).
      training_kwargs: keyword arguments of the training step's call; by
        default `call_kwargs` plus `training=True` where `call` takes it.
      float32_outputs: indices (into the flattened outputs) that stay float32
        under mixed precision.
      zero_gradient_weights: paths below the layer (as in `expected_weights`)
        whose gradient in the first step is exactly zero by construction
        (e.g. the layers before a zero-initialized output kernel).
    """
    init_kwargs = dict(init_kwargs)
    inputs = _as_tuple(input_data)
    expected_shapes = _expected_shapes(expected_output_shape)
    call_kwargs = dict(call_kwargs or {})
    if training_kwargs is None:
        training_kwargs = dict(call_kwargs)
        if "training" in inspect.signature(cls.call).parameters:
            training_kwargs["training"] = True

    run_serialization_test(cls(**init_kwargs), init_kwargs)
    _check_save_and_load(cls, init_kwargs, inputs)
    _check_build(cls, init_kwargs, inputs, expected_weights,
                 expected_num_non_trainable_variables)

    symbolic = cls(**init_kwargs)
    outputs = _flat(symbolic(*[_symbolic(x) for x in inputs]))
    _check_outputs(outputs, expected_shapes, batch=None, compute_dtype="float32",
                   float32_outputs=float32_outputs, what="symbolic call")
    _check_weights(symbolic, expected_weights, expected_num_non_trainable_variables)

    eager_layer = cls(**init_kwargs)
    eager = _flat(eager_layer(*inputs, **call_kwargs))
    _check_outputs(eager, expected_shapes, batch=len(inputs[0]), compute_dtype="float32",
                   float32_outputs=float32_outputs, what="eager call")
    graph = _flat(tf.function(lambda *x: eager_layer(*x, **call_kwargs))(*inputs))
    for e, g in zip(eager, graph, strict=True):
        np.testing.assert_allclose(np.asarray(e), np.asarray(g), rtol=1e-5, atol=1e-6,
                                   err_msg="tf.function call differs from the eager call")

    _check_training_step(cls(**init_kwargs), inputs, training_kwargs, zero_gradient_weights)
    for name in PRECISION_POLICIES:
        _check_precision(cls, init_kwargs, inputs, call_kwargs, expected_shapes,
                         float32_outputs, name)


def run_serialization_test(layer: keras.layers.Layer,
                           init_kwargs: Mapping[str, Any] | None = None) -> None:
    """Config round trips of one (unbuilt) layer: `from_config` and Keras serialization.

    Args:
      layer: the layer.
      init_kwargs: the arguments it was made with; each must come back from
        `get_config()` with the same value.
    """
    cls = type(layer)
    config = layer.get_config()
    as_json = json.dumps(config, sort_keys=True)
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        assert name in config, f"{cls.__name__}.get_config() lacks constructor argument {name!r}"
    for name, value in (init_kwargs or {}).items():
        assert config[name] == value, f"get_config()[{name!r}] is {config[name]!r}, not {value!r}"
    registered = keras.saving.get_registered_name(cls)
    assert registered.startswith("captioner>"), f"{cls.__name__} is not registered ({registered})"

    revived = cls.from_config(config)
    assert json.dumps(revived.get_config(), sort_keys=True) == as_json
    assert set(dir(revived)) == set(dir(layer))

    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    revived = keras.saving.deserialize_keras_object(serialized)
    assert type(revived) is cls
    assert json.dumps(revived.get_config(), sort_keys=True) == as_json
    assert set(dir(revived)) == set(dir(layer))


@contextlib.contextmanager
def policy(name: str):
    """Sets the global dtype policy for the block, restoring float32 after.

    Args:
      name: a Keras dtype policy name, e.g. `mixed_float16`.
    """
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _as_tuple(data) -> tuple:
    return tuple(data) if isinstance(data, (tuple, list)) else (data,)


def _flat(outputs) -> list:
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def _expected_shapes(shape) -> list:
    """One shape or a sequence of shapes -> a list of tuples."""
    if isinstance(shape, (tuple, list)) and shape and isinstance(shape[0], (tuple, list)):
        return [tuple(s) for s in shape]
    return [tuple(shape)]


def _symbolic(x) -> keras.KerasTensor:
    """A KerasTensor like `x` with an unknown batch."""
    x = np.asarray(x)
    return keras.KerasTensor((None, *x.shape[1:]), dtype=str(x.dtype))


def _is_float(dtype) -> bool:
    return "float" in keras.backend.standardize_dtype(dtype)


def _check_outputs(outputs, expected_shapes, *, batch, compute_dtype, float32_outputs, what):
    """Output count, shapes (batch filled in) and float dtypes."""
    assert len(outputs) == len(expected_shapes), f"{what}: {len(outputs)} outputs"
    for i, (out, shape) in enumerate(zip(outputs, expected_shapes, strict=True)):
        want = tuple(batch if (d is None and j == 0) else d for j, d in enumerate(shape))
        got = tuple(out.shape)
        assert got == want, f"{what}: output {i} has shape {got}, not {want}"
        dtype = keras.backend.standardize_dtype(out.dtype)
        if _is_float(dtype):
            expected = "float32" if i in float32_outputs else compute_dtype
            assert dtype == expected, f"{what}: output {i} is {dtype}, not {expected}"


def _weight_paths(layer) -> dict:
    """`{path below the layer: shape}` of the trainable weights."""
    return {w.path.split("/", 1)[1]: tuple(w.shape) for w in layer.trainable_weights}


def _check_weights(layer, expected_weights, expected_num_non_trainable_variables):
    assert layer.built
    assert _weight_paths(layer) == dict(expected_weights)
    assert layer.count_params() == sum(int(np.prod(s)) for s in expected_weights.values())
    assert not layer.non_trainable_weights, [w.path for w in layer.non_trainable_weights]
    assert len(layer.non_trainable_variables) == expected_num_non_trainable_variables, \
        [v.path for v in layer.non_trainable_variables]


def _check_build(cls, init_kwargs, inputs, expected_weights, expected_num_non_trainable):
    """`build()` from the input shapes alone creates every weight."""
    layer = cls(**init_kwargs)
    layer.build(*[(None, *np.shape(x)[1:]) for x in inputs])
    _check_weights(layer, expected_weights, expected_num_non_trainable)


def _check_save_and_load(cls, init_kwargs, inputs):
    """A `.keras` file of a model around the layer reloads to identical outputs."""
    symbolic = [keras.Input(np.shape(x)[1:], dtype=str(np.asarray(x).dtype)) for x in inputs]
    layer = cls(**init_kwargs, name="layer_under_test")
    model = keras.Model(symbolic, layer(*symbolic))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "layer.keras")
        model.save(path)
        revived = keras.saving.load_model(path)
    revived_layer = revived.get_layer("layer_under_test")
    assert type(revived_layer) is cls
    assert revived_layer.get_config() == layer.get_config()
    for want, got in zip(_flat(model(list(inputs))), _flat(revived(list(inputs))), strict=True):
        np.testing.assert_array_equal(np.asarray(want), np.asarray(got))


def _check_training_step(layer, inputs, training_kwargs, zero_gradient_weights=()):
    """One compiled gradient step reaches every weight (or, without weights, the inputs)."""
    tensors = [tf.constant(x) for x in inputs]
    float_inputs = [t for t in tensors if t.dtype.is_floating]

    @tf.function
    def gradients(*xs):
        with tf.GradientTape() as tape:
            tape.watch([x for x in xs if x.dtype.is_floating])
            outputs = _flat(layer(*xs, **training_kwargs))
            loss = tf.add_n([tf.reduce_mean(tf.square(tf.cast(o, tf.float32)))
                             for o in outputs if o.dtype.is_floating])
        targets = layer.trainable_weights or [x for x in xs if x.dtype.is_floating]
        return tape.gradient(loss, targets)

    layer(*tensors, **training_kwargs)  # builds the weights outside the tf.function
    grads = gradients(*tensors)
    if not layer.trainable_weights:
        assert float_inputs, "a layer without weights and without float inputs"
    names = [w.path for w in layer.trainable_weights] or [f"input {i}" for i in range(len(grads))]
    zero = {w.path for w in layer.trainable_weights
            if w.path.split("/", 1)[1] in set(zero_gradient_weights)}
    assert len(zero) == len(set(zero_gradient_weights)), "unknown zero_gradient_weights"
    for name, g in zip(names, grads, strict=True):
        assert g is not None, f"{name} gets no gradient"
        g = np.asarray(tf.convert_to_tensor(g))
        assert np.isfinite(g).all(), f"{name}: non-finite gradient"
        if name in zero:
            assert not np.any(g != 0), f"{name}: nonzero gradient (listed as zero)"
        else:
            assert np.any(g != 0), f"{name}: zero gradient"
    if layer.trainable_weights:
        before = [np.array(w.numpy()) for w in layer.trainable_weights]
        keras.optimizers.SGD(0.1).apply_gradients(zip(grads, layer.trainable_weights, strict=True))
        for b, w in zip(before, layer.trainable_weights, strict=True):
            assert np.array_equal(b, w.numpy()) == (w.path in zero), \
                f"{w.path} {'changed' if w.path in zero else 'did not change'}"


def _check_precision(cls, init_kwargs, inputs, call_kwargs, expected_shapes, float32_outputs,
                     name):
    """Dtypes under a mixed policy, given as `dtype=` and as the global policy."""
    mixed = keras.dtype_policies.get(name)
    made = {"dtype argument": lambda: cls(**init_kwargs, dtype=mixed),
            "global policy": lambda: cls(**init_kwargs)}
    for how, make in made.items():
        what = f"{name} ({how})"
        with policy(name if how == "global policy" else "float32"):
            layer = make()
            symbolic = _flat(layer(*[_symbolic(x) for x in inputs]))
            eager = _flat(layer(*inputs, **call_kwargs))
        for outputs, batch in ((symbolic, None), (eager, len(inputs[0]))):
            _check_outputs(outputs, expected_shapes, batch=batch,
                           compute_dtype=mixed.compute_dtype,
                           float32_outputs=float32_outputs, what=what)
        for out in eager:
            if _is_float(out.dtype):
                assert np.isfinite(np.asarray(tf.cast(out, tf.float32))).all(), what
        for w in layer.weights:
            assert keras.backend.standardize_dtype(w.dtype) == "float32", f"{what}: {w.path}"
        for sub in layer._flatten_layers():
            assert sub.compute_dtype == mixed.compute_dtype, f"{what}: {sub.name}"
            assert sub.variable_dtype == "float32", f"{what}: {sub.name}"
