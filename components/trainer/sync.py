"""The chief's values on every worker of a multi-worker job (one all-reduce each).

Only the chief reads checkpoints and computes validation metrics; these
helpers hand its values to the other workers, so that every worker resumes
from the same state and takes the same early-stopping decision.
"""
from __future__ import annotations

from typing import Mapping


def broadcast_from_chief(strategy, variables) -> None:
    """Gives every worker the chief's values of `variables` (after the chief alone restored).

    Values travel as float64 through one all-reduce to which only global
    replica 0 (the chief's first device) contributes: exact for float32/16,
    int64 steps below 2^53 and the uint32 seed-generator states.

    Args:
      strategy: the multi-worker strategy.
      variables: `tf.Variable`s or Keras variables, assigned in place.
    """
    import tensorflow as tf
    tensors = [v if isinstance(v, tf.Variable) else v.value for v in variables]

    def fn():
        ctx = tf.distribute.get_replica_context()
        first = tf.cast(tf.equal(ctx.replica_id_in_sync_group, 0), tf.float64)
        vals = [tf.cast(tf.convert_to_tensor(t), tf.float64) * first for t in tensors]
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, vals)

    reduced = strategy.run(tf.function(fn, autograph=False))
    for var, value in zip(tensors, reduced):
        local = strategy.experimental_local_results(value)[0]
        var.assign(tf.cast(local, var.dtype))


def chief_values(strategy, values: Mapping[str, float]) -> dict:
    """The chief's `values` on every worker (see `broadcast_from_chief`).

    Args:
      strategy: the multi-worker strategy.
      values: name -> float on this worker (ignored unless it is the chief).
    Returns:
      name -> the chief's float.
    """
    import tensorflow as tf
    names = sorted(values)
    vector = tf.constant([values[k] for k in names], tf.float64)

    def fn():
        ctx = tf.distribute.get_replica_context()
        return vector * tf.cast(tf.equal(ctx.replica_id_in_sync_group, 0), tf.float64)

    per_replica = strategy.run(tf.function(fn, autograph=False))
    reduced = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    return {k: float(v) for k, v in zip(names, reduced.numpy())}
