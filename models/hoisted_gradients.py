"""Hand-written gradients of the decoder's time loop (speed only: the values are exact).

Inside a `tf.while_loop`, autodiff accumulates each recurrent weight's
gradient step by step with small matmuls. `matmul_without_weight_grad` keeps
the weights out of the loop's gradient, and `hoisted_weight_grads` adds their
gradients once after it, as one large matmul over all steps.
`ShowAttendTell._hoist_weight_grads = False` turns both off (plain autodiff);
the tests compare the two.
"""
from __future__ import annotations

import tensorflow as tf


def matmul_without_weight_grad(x, w, w_t):
    """`x @ w` whose gradient reaches `x` only, as `dy @ w_t` with `w_t = w^T` precomputed.

    Inside the time loop: the weight's gradient is added once for all steps
    by `hoisted_weight_grads`, and the untransposed `w_t` makes the
    per-step input gradient a plain (faster) matmul.

    Args:
      x: (batch, in) step input.
      w: (in, out) weight; w_t: its transpose, (out, in).
    Returns:
      (batch, out) `x @ w`.
    """
    @tf.custom_gradient
    def matmul(x):
        def grad(dy):
            return tf.matmul(dy, w_t)
        return tf.matmul(x, w), grad
    return matmul(x)


def hoisted_weight_grads(x_time, weights, inputs):
    """Identity on the gate inputs `x_time` (T, batch, 4n) that also carries the
    gradients of the recurrent weights.

    The gates are `G_t = x_t + sum_k in_k,t W_k`, so the gradient reaching
    `x_t` is `dG_t` and `dW_k = sum_t in_k,t^T dG_t`: one (T*batch)-row matmul
    per weight after the loop instead of a 64-row matmul and an accumulation
    per step inside it. `inputs` is a dict filled with the (T, batch, in_k)
    step inputs after the loop is built; the gradient runs later, when they
    exist.

    Args:
      x_time: (T, batch, 4n).
      weights: list of (in_k, 4n) weight tensors used with
        `matmul_without_weight_grad` in the loop.
      inputs: dict index k -> (T, batch, in_k) tensor, filled after the loop.
    Returns:
      `x_time`, unchanged, carrying the weights' gradients.
    """
    @tf.custom_gradient
    def inject(x, *ws):
        def grad(dx):
            flat = tf.reshape(dx, [-1, tf.shape(dx)[-1]])                  # (T*batch, 4n)
            grads = []
            for k, w in enumerate(ws):
                rows = tf.reshape(inputs[k], [-1, tf.shape(w)[0]])       # (T*batch, in_k)
                grads.append(tf.matmul(rows, flat, transpose_a=True))
            return (dx, *grads)
        return tf.identity(x), grad
    return inject(x_time, *weights)


def matvec_without_matrix_grad(matrix, vector):
    """`einsum("blk,bk->bl")` whose gradient reaches `vector` only (`d vector = ds . matrix`).

    The general score's step: `matrix` is the projection `a W` computed once per
    sequence, whose weight gradient `hoisted_projection_grads` adds after the loop.
    """
    @tf.custom_gradient
    def matvec(vector):
        def grad(ds):
            return tf.einsum("bl,blk->bk", ds, matrix)
        return tf.einsum("blk,bk->bl", matrix, vector), grad
    return matvec(vector)


def hoisted_projection_grads(offsets, kernel, annotations, inputs):
    """Identity on zero score offsets (T, batch, L) that carries the gradient of `W` in `a W`.

    The general score of step t is `s_t = (a W) q_t + offset_t`, with `a W`
    entering the loop without its gradient (`matvec_without_matrix_grad`). The
    gradient reaching the offsets is `ds_t`, and `dW = sum_t a^T (ds_t q_t^T) =
    sum_t (ds_t a)^T q_t`: one (T, batch, L) x (batch, L, D) product and one
    (T batch, D)^T x (T batch, n) matmul after the loop, instead of a
    (batch, L, n) accumulation per step and a (batch L, D)^T x (batch L, n)
    matmul.

    Args:
      offsets: (T, batch, L) zeros, added to the scores.
      kernel: (D, n) `W` (in the dtype `a W` was computed in).
      annotations: (batch, L, D), the `a` of `a W`.
      inputs: dict with key 0 -> (T, batch, n) the step queries `q_t`, filled
        after the loop is built.
    Returns:
      `offsets`, unchanged, carrying `W`'s gradient.
    """
    @tf.custom_gradient
    def inject(x, w):
        def grad(dx):
            rows = tf.einsum("tbl,bld->tbd", tf.cast(dx, annotations.dtype), annotations)
            queries = tf.cast(inputs[0], rows.dtype)
            dw = tf.einsum("tbd,tbn->dn", rows, queries)
            return dx, tf.cast(dw, w.dtype)
        return tf.identity(x), grad
    return inject(offsets, kernel)
