"""The decoder's teacher-forced time loop: `ShowAttendTell._step` over time in one `tf.while_loop`.

Everything that does not depend on the step (the annotation projection, the
word embeddings' LSTM input transform, the noise of the samplers) is
computed before the loop and read here; only the recurrence runs inside.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from models import hoisted_gradients


class SequenceInputs(NamedTuple):
    """What every step of one teacher-forced pass reads (constant over its steps).

    Attributes:
      annotations: (batch, L, D) in the compute dtype.
      projected: the attention layer's `project(annotations)`.
      mask: optional (batch, L) bool over regions.
      training: dropout, and the sampling attentions sample.
      use_expected: hard attention: scalar bool, use the expected context.
      recurrent: inside the training loop, the recurrent weights for
        `hoisted_gradients.matmul_without_weight_grad`: `(W, W^T)` of the stacked
        kernel `W = [U; W_z]` (one matmul of `[h_{t-1}, z_t]` per step), or
        `(W_z, W_z^T, U, U^T)` where the step also needs `h_{t-1} U` alone
        (`counterfactual`); None uses the Dense layers.
      counterfactual: hard attention in training with the `"expected"` reward
        baseline: each step also returns what the expected context would give.
    """
    annotations: Any
    projected: Any
    mask: Any = None
    training: bool = False
    use_expected: Any = None
    recurrent: Any = None
    counterfactual: bool = False


def _hoists_scores(model) -> bool:
    """Whether the training loop hoists the general score's projection gradient."""
    options = model.options
    return (model._hoist_weight_grads and options.attention in ("soft", "hard")
            and options.attention_score == "general" and not options.annotation_gradients)


def run(model, x_gates, state, seq: SequenceInputs, noise=None) -> dict:
    """Runs `model._step` over time; inputs and outputs are batch-major.

    Args:
      model: the `ShowAttendTell`.
      x_gates: (batch, T, 4n) the `E y_{t-1}` part of the LSTM gates.
      state: `(h_0, c_0)`.
      seq: the `SequenceInputs` (its `recurrent` is filled here).
      noise: optional (T, batch, ...) sampler noise, one slice per step.
    Returns:
      dict of (batch, T, ...) tensors: `h`, `z` and the attention's records
      (`ShowAttendTell.step_records`), and `h_expected`, `z_expected` with
      `seq.counterfactual`.
    """
    x_time = tf.transpose(x_gates, [1, 0, 2])                          # (T, batch, 4n)
    steps = tf.shape(x_time)[0]
    step_inputs, query_inputs = {}, {}
    per_step = {"noise": noise}
    if _hoists_scores(model):
        # The general score's `a W` enters the loop without its gradient, which is
        # added after the loop from the step queries (`models.hoisted_gradients`).
        layer = model.attention_layer
        shape = tf.shape(seq.annotations)
        per_step["score_offset"] = hoisted_gradients.hoisted_projection_grads(
            tf.zeros(tf.stack([steps, shape[0], shape[1]])),
            tf.cast(layer.annotation_projection.kernel, model.compute_dtype),
            seq.annotations, query_inputs)
        seq = seq._replace(projected=tf.stop_gradient(seq.projected))
    fused = model._hoist_weight_grads and not seq.counterfactual
    if model._hoist_weight_grads:
        # W_z and U enter the loop without their gradient, which is added
        # after the loop from the stacked step inputs (`models.hoisted_gradients`).
        w_z = tf.cast(model.lstm_context.kernel, model.compute_dtype)
        u = tf.cast(model.lstm_recurrent.kernel, model.compute_dtype)
        weights = [tf.concat([u, w_z], 0)] if fused else [w_z, u]
        seq = seq._replace(recurrent=tuple(
            value for w in weights for value in (tf.stop_gradient(w),
                                                 tf.stop_gradient(tf.transpose(w)))))
        x_time = hoisted_gradients.hoisted_weight_grads(x_time, weights, step_inputs)
    xs = tf.TensorArray(x_time.dtype, size=steps, element_shape=x_time.shape[1:])
    xs = xs.unstack(x_time)
    per_step = {key: tf.TensorArray(value.dtype, size=steps, element_shape=value.shape[1:]
                                    ).unstack(value)
                for key, value in per_step.items() if value is not None}

    records = model.step_records()
    if "score_offset" in per_step:
        records = {**records, "query": seq.projected.dtype}
    names = {"h": model.compute_dtype, "z": model.compute_dtype, **records}
    if seq.counterfactual:
        names.update(h_expected=model.compute_dtype, z_expected=model.compute_dtype)
    outputs = {name: tf.TensorArray(dtype, size=steps) for name, dtype in names.items()}

    def body(t, h, c, outputs):
        inputs_t = {key: ta.read(t) for key, ta in per_step.items()}
        (h, c), z, attended, expected = model._step(xs.read(t), (h, c), inputs_t, seq)
        values = {"h": h, "z": z, **{name: attended[name] for name in records}}
        if expected is not None:
            values["h_expected"], values["z_expected"] = expected
        outputs = {k: ta.write(t, values[k]) for k, ta in outputs.items()}
        return t + 1, h, c, outputs

    h0, c0 = state
    _, _, _, outputs = tf.while_loop(
        lambda t, *_: t < steps, body, (tf.constant(0), h0, c0, outputs),
        maximum_iterations=steps)
    stacked = {key: ta.stack() for key, ta in outputs.items()}         # (T, batch, ...)
    h_prev = tf.concat([h0[None], stacked["h"][:-1]], 0)               # h_{t-1}
    if fused:
        step_inputs[0] = tf.concat([h_prev, stacked["z"]], -1)         # inputs of [U; W_z]
    else:
        step_inputs[0], step_inputs[1] = stacked["z"], h_prev          # inputs of W_z, U
    if "query" in stacked:
        query_inputs[0] = stacked["query"]                             # the general score's q_t
    result = {}
    for key, value in stacked.items():
        perm = [1, 0] + list(range(2, len(value.shape)))
        result[key] = tf.transpose(value, perm)
    return result
