"""The distributed cross-entropy step: loss re-weighting, gradient all-reduce, clipping, update.

On each replica: the model's loss terms (`compute_loss_terms`); the token
terms are re-weighted by `local tokens / global tokens` and the batch-mean
attention penalty by `local batch / global batch`, so the replicas' losses
sum to the loss of the global batch. With a fixed `token_normalizer` (the
Trainer's choice under `train.bucket_by_length`) the token terms are divided
by that constant instead of the batch's token count, so that a token weighs
the same in a batch of short captions as in one of long captions; the
reported `loss` stays the per-token mean. Gradients are summed over replicas,
clipped by their global norm, then applied. (Keras' own `global_clipnorm`
would clip each replica's partial gradient before its all-reduce, which is
not the norm of the global gradient; with `clip_norm <= 0` the gradients go
straight to Keras' all-reduce.) The hard-attention REINFORCE baseline moves
with the mean reward of all replicas.
"""
from __future__ import annotations

from typing import Callable

SUM_KEYS = ("loss", "nll_sum", "num_tokens", "penalty_sum", "entropy_sum", "examples")
MEAN_KEYS = ("grad_norm", "baseline", "reward", "reinforce_term", "used_expected_alpha",
             "loss_scale", "guard_rate")
# Terms of `compute_loss_terms` that only some attentions have (hard and
# glimpse: REINFORCE; glimpse and spatial transformer: the location guard), else zeros.
_HARD_KEYS = ("baseline", "reward", "reinforce_term", "used_expected_alpha", "guard_rate")


def make_train_step(strategy, model, optimizer, clip_norm: float, global_batch_size: int,
                    element_spec, jit_compile: bool = False,
                    token_normalizer: float | None = None) -> Callable:
    """The distributed training step: `step(per_replica_batch) -> dict of float scalars`.

    Args:
      strategy: the `tf.distribute.Strategy` the model was built under.
      model: a built `ShowAttendTell`.
      optimizer: a Keras optimizer (maybe a `LossScaleOptimizer`) built on
        `model.trainable_variables`.
      clip_norm: global-norm clipping (<= 0: off).
      global_batch_size: examples per step over all replicas.
      element_spec: the distributed dataset's `element_spec` (one trace).
      jit_compile: XLA-compile the forward and backward pass of each replica.
      token_normalizer: divide the global batch's summed token losses by this
        constant (the expected tokens per global batch) instead of by the
        batch's own token count; None: by the count.
    Returns:
      A `tf.function`; its result holds `SUM_KEYS` summed and `MEAN_KEYS`
      averaged over replicas.
    """
    import tensorflow as tf
    replica_step = _make_replica_step(strategy, model, optimizer, clip_norm,
                                      _make_gradients(model, optimizer, global_batch_size,
                                                      jit_compile, token_normalizer))

    @tf.function(input_signature=[element_spec], autograph=False)
    def step(batch):
        sums, means = strategy.run(replica_step, args=(batch,))
        sums = strategy.reduce(tf.distribute.ReduceOp.SUM, sums, axis=None)
        means = strategy.reduce(tf.distribute.ReduceOp.MEAN, means, axis=None)
        out = {k: sums[i] for i, k in enumerate(SUM_KEYS)}
        out.update({k: means[i] for i, k in enumerate(MEAN_KEYS)})
        return out

    return step


def is_loss_scaled(optimizer) -> bool:
    import keras
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def _make_gradients(model, optimizer, global_batch_size: int, jit_compile: bool,
                    token_normalizer: float | None = None) -> Callable:
    """`gradients(annotations, tokens, global_tokens) -> (grads, terms)` of one replica."""
    import tensorflow as tf
    variables = model.trainable_variables
    loss_scaled = is_loss_scaled(optimizer)

    def gradients(annotations, tokens, global_tokens):
        with tf.GradientTape() as tape:
            terms = model.compute_loss_terms(annotations, tokens, training=True,
                                             update_baseline=False)
            local_tokens = tf.maximum(terms["num_tokens"], 1.0)
            local_batch = tf.cast(tf.shape(tokens)[0], tf.float32)
            token_part = terms["loss"] - terms["attention_penalty"]
            penalty = terms["attention_penalty"] * (local_batch / global_batch_size)
            loss = token_part * (local_tokens / tf.maximum(global_tokens, 1.0)) + penalty
            objective = loss if token_normalizer is None else (
                token_part * (local_tokens / float(token_normalizer)) + penalty)
            scaled = optimizer.scale_loss(objective) if loss_scaled else objective
        grads = tape.gradient(scaled, variables)
        grads = [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v)
                 for g, v in zip(grads, variables, strict=True)]
        out = {"loss": loss, "nll_sum": tf.reduce_sum(terms["example_nll"]),
               "num_tokens": terms["num_tokens"],
               "penalty_sum": tf.reduce_sum(terms["example_penalty"]),
               "entropy_sum": terms["attention_entropy"] * local_tokens,
               "examples": local_batch}
        for key in _HARD_KEYS:
            out[key] = terms[key] if key in terms else tf.zeros((), tf.float32)
        return grads, out

    if jit_compile:
        return tf.function(gradients, jit_compile=True, autograph=False)
    return gradients


def _make_replica_step(strategy, model, optimizer, clip_norm: float,
                       gradients: Callable) -> Callable:
    """`replica_step(batch) -> (sums, means)`: gradients, baseline, clipping, update."""
    import tensorflow as tf

    from models.text import PAD_ID
    replicas = strategy.num_replicas_in_sync
    SUM = tf.distribute.ReduceOp.SUM

    apply = make_apply(strategy, model, optimizer, clip_norm)

    def replica_step(batch):
        ctx = tf.distribute.get_replica_context()
        tokens = tf.cast(batch["tokens"], tf.int32)
        local_tokens = tf.reduce_sum(tf.cast(tf.not_equal(tokens[:, 1:], PAD_ID), tf.float32))
        global_tokens = ctx.all_reduce(SUM, local_tokens) if replicas > 1 else local_tokens
        grads, out = gradients(batch["annotations"], tokens, global_tokens)
        if model.options.samples:
            # Mean-aggregated variables: every replica ends with the mean update.
            model.update_baseline(out["reward"], skip=out["used_expected_alpha"] > 0.5)
        out["grad_norm"], out["loss_scale"] = apply(grads)
        return (tf.stack([tf.cast(out[k], tf.float32) for k in SUM_KEYS]),
                tf.stack([tf.cast(out[k], tf.float32) for k in MEAN_KEYS]))

    return replica_step


def make_apply(strategy, model, optimizer, clip_norm: float) -> Callable:
    """`apply(grads) -> (global norm, loss scale)`: all-reduce, clip and update, in a replica.

    `grads` are this replica's gradients of its share of the global loss
    (the replicas' shares sum to the global loss).
    """
    import tensorflow as tf
    variables = model.trainable_variables
    replicas = strategy.num_replicas_in_sync
    loss_scaled = is_loss_scaled(optimizer)
    summed_here = replicas > 1 and clip_norm > 0

    def apply(grads):
        ctx = tf.distribute.get_replica_context()
        scale = tf.cast(optimizer.dynamic_scale, tf.float32) if loss_scaled else None
        if summed_here:
            grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        grads, norm = _clip(grads, clip_norm, scale)
        if summed_here:
            # Keras' apply_gradients sums over the replicas once more (a second,
            # cheap all-reduce of identical values): pre-divide. Exact for 2^k replicas.
            grads = [g / replicas for g in grads]
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return (tf.cast(norm, tf.float32),
                scale if scale is not None else tf.ones((), tf.float32))

    return apply


def _clip(grads, clip_norm: float, scale):
    """`(grads, global norm)`: clipped by the norm of the unscaled gradients.

    `scale` is the loss scale (None without one); the returned gradients are
    scaled again, since the `LossScaleOptimizer` unscales (and checks) them.
    """
    import tensorflow as tf
    if scale is not None:
        grads = [g / tf.cast(scale, g.dtype) for g in grads]
    if clip_norm > 0:
        grads, norm = tf.clip_by_global_norm(grads, clip_norm)
    else:
        norm = tf.linalg.global_norm(grads)
    if scale is not None:
        grads = [g * tf.cast(scale, g.dtype) for g in grads]
    return grads, norm
