"""The region scores shared by soft and hard attention (Xu et al. 2015, section 3.1.2).

Four scores `e_ti` of region `a_i` against the previous LSTM state `h = h_{t-1}`:

* `additive` (the paper's MLP, Bahdanau et al.): `w^T tanh(W_a a_i + W_h h + b)`;
* `concat` (Luong et al. 2015): `w^T tanh(W [h; a_i])`, the same MLP without `b`;
* `general` (Luong): the bilinear `a_i^T W h / sqrt(n)`, `W` a (D, n) matrix;
* `dot` (Luong): `a_i . q / sqrt(D)`, `q = h` where `n = D`, else `q = W_q h`
  (Luong's dot product needs equal sizes, so `h` is mapped to `D` first).

Whatever does not depend on the step is computed once per sequence by
`project()`: `W_a a_i + b` (additive, concat), `a_i^T W` (general; a step is
then one matrix-vector product over (L, n)), the annotations themselves
(dot). The `1 / sqrt(.)` scale (Vaswani et al. 2017) keeps a fresh model's
softmax from saturating; the learned `W` can undo it.
"""
from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from models import hoisted_gradients
from models.decoder_options import SCORES


def score(energy, w):
    """`sum_k energy_k w_k` over the last axis, as a matrix-vector product with its own gradient.

    The forward pass reads `energy` once (a multiply-and-sum writes and
    reads a product as large as `energy`). Autodiff of the matmul would
    make `ds * w` a rank-1 matmul, slow in oneDNN, and autodiff of the
    multiply-and-sum tiles `ds`; here `ds * w` is one broadcast multiply and
    `dw` one matrix-vector product.

    Args:
      energy: (..., units) float32.
      w: (units,) float32.
    Returns:
      (...) float32 scores.
    """
    @tf.custom_gradient
    def forward(energy, w):
        flat_e = tf.reshape(energy, [-1, tf.shape(energy)[-1]])                 # (N, units)

        def grad(ds):
            flat_ds = tf.reshape(ds, [1, -1])                                  # (1, N)
            return ds[..., None] * w, tf.reshape(tf.matmul(flat_ds, flat_e), [-1])
        scores = tf.reshape(tf.matmul(flat_e, w[:, None]), tf.shape(energy)[:-1])
        return tf.ensure_shape(scores, energy.shape[:-1]), grad
    return forward(energy, tf.convert_to_tensor(w))



# Added to the scores of masked regions: exp() of it underflows to exactly 0
# in float32, and it stays finite so that no inf - inf can appear.
_MASKED_SCORE = -1e9


@keras.saving.register_keras_serializable(package="captioner")
class AttentionScorer(keras.layers.Layer):
    """Scores every region from `a_i` and `h_{t-1}`, by default `w^T tanh(W_a a_i + W_h h + b)`.

    The base of `SoftAttention` and `HardAttention`; it owns the weights and
    the float32 masked softmax, the subclasses turn `alpha` into a context.
    `W_a a_i + b` does not depend on the step, so `project()` computes it
    once per sequence and `attention_weights()` takes the result.

    Under a mixed-precision policy the matmuls run in the compute dtype, but
    the MLP's sum, `tanh` and score run in float32, like the softmax: on a
    CPU, bfloat16 elementwise math is emulated (its `tanh` and `tanh`
    gradient took twice float32's time in the decoder's profile), and a
    `units`-term sum keeps more of its precision in float32.

    Called on its own it returns the attention weights, which is what
    attention analyses need without a context vector.

    Args:
      units: width of the attention MLP (additive and concat; unused by
        general and dot, whose widths are `n` and `D`).
      score: `"additive"`, `"general"`, `"dot"` or `"concat"` (module docstring).

    Call args:
      annotations: (batch, L, D) annotation vectors `a_i`.
      hidden: (batch, n) previous LSTM state `h_{t-1}`.
      projected: optional, from `project(annotations)`.
      mask: optional (batch, L) bool, True = keep.
      training: unused (scoring is deterministic).

    Returns:
      `(alpha, log_alpha)`, both (batch, L) float32.
    """

    def __init__(self, units: int, score: str = "additive", **kwargs):
        super().__init__(**kwargs)
        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {score!r}")
        self.units = int(units)
        self.score = score

    def build(self, annotations_shape, hidden_shape):
        dim, hidden_dim = int(annotations_shape[-1]), int(hidden_shape[-1])
        mlp = self.score in ("additive", "concat")
        if self.score != "dot":
            # additive/concat: W_a (+ b), to `units`; general: W, to `n`.
            self.annotation_projection = keras.layers.Dense(
                self.units if mlp else hidden_dim, use_bias=self.score == "additive",
                dtype=self.dtype_policy, name="annotation_projection")
            self.annotation_projection.build(annotations_shape)
        if mlp or (self.score == "dot" and dim != hidden_dim):
            self.hidden_projection = keras.layers.Dense(       # W_h; dot: W_q
                self.units if mlp else dim, use_bias=False, dtype=self.dtype_policy,
                name="hidden_projection")
            self.hidden_projection.build(hidden_shape)
        if mlp:
            # w: applied by `score` (a matrix-vector product with its own gradient);
            # autocast=False: read in float32 even inside a mixed-precision call.
            self.score_kernel = self.add_weight(
                shape=(self.units,), initializer="glorot_uniform", autocast=False,
                name="score_kernel")
        self._annotation_dim = dim
        self._hidden_dim = hidden_dim
        self.built = True

    def get_build_config(self):
        if not self.built:
            return None
        return {"annotations_shape": [None, None, self._annotation_dim],
                "hidden_shape": [None, self._hidden_dim]}

    def build_from_config(self, config):
        if config:
            self.build(tuple(config["annotations_shape"]), tuple(config["hidden_shape"]))

    def project(self, annotations):
        """The step-independent part of the scores, computed once per sequence.

        Args:
          annotations: (batch, L, D).
        Returns:
          float32 `W_a a_i + b` (batch, L, units) for additive and concat;
          `a_i^T W` (batch, L, n) for general, in the compute dtype: every
          step reads it twice (the score and its gradient), and under mixed
          precision bfloat16 halves those reads, as mixed precision's
          dot-product attention does (the softmax stays float32); the
          annotations (batch, L, D) in float32 for dot.
        """
        annotations = ops.cast(annotations, self.compute_dtype)
        if self.score == "dot":
            return ops.cast(annotations, "float32")
        projection = self.annotation_projection(annotations)
        return projection if self.score == "general" else ops.cast(projection, "float32")

    def query(self, hidden, dtype="float32"):
        """general and dot: the (batch, n or D) vector the projection is multiplied by.

        In `dtype`, the dtype of `project()`'s output (general: the compute
        dtype; dot: float32).
        """
        if self.score == "dot" and hasattr(self, "hidden_projection"):
            hidden = self.hidden_projection(ops.cast(hidden, self.compute_dtype))   # (batch, D)
        query = ops.cast(hidden, dtype)
        return query * ops.cast(float(query.shape[-1]) ** -0.5, dtype)

    def _scores(self, projected, hidden, offset=None):
        """(batch, L) float32 scores `e_t` from `project()`'s output and `h_{t-1}`."""
        if self.score in ("additive", "concat"):
            projected = ops.cast(projected, "float32")
            hidden = ops.cast(self.hidden_projection(ops.cast(hidden, self.compute_dtype)),
                              "float32")
            energy = ops.tanh(projected + ops.expand_dims(hidden, 1))
            return score(energy, ops.cast(self.score_kernel, "float32"))
        query = self.query(hidden, projected.dtype)
        if offset is not None:   # general in the training loop, `W`'s gradient hoisted
            return ops.cast(hoisted_gradients.matvec_without_matrix_grad(projected, query),
                            "float32") + offset
        return ops.cast(ops.einsum("bld,bd->bl", projected, query), "float32")

    def attention_weights(self, projected, hidden, mask=None, offset=None):
        """`alpha_t = softmax(e_t)` over the regions, in float32.

        Args:
          projected: from `project()`.
          hidden: (batch, n) the previous LSTM state `h_{t-1}`.
          mask: optional (batch, L) bool, True = keep; masked regions get
            exactly 0 weight.
          offset: general only, in the decoder's training loop: (batch, L)
            zeros carrying the projection's gradient
            (`hoisted_gradients.hoisted_projection_grads`); `projected` then
            gets no gradient here.
        Returns:
          `(alpha, log_alpha)`, both (batch, L) float32.
        """
        scores = self._scores(projected, hidden, offset)                      # (batch, L)
        if mask is not None:
            mask = ops.cast(mask, "bool")
            scores = ops.where(mask, scores, _MASKED_SCORE)
        log_alpha = ops.log_softmax(scores, axis=-1)
        alpha = ops.exp(log_alpha)
        if mask is not None:
            alpha = ops.where(mask, alpha, 0.0)
        return alpha, log_alpha

    def call(self, annotations, hidden, projected=None, mask=None, training=None):
        if projected is None:
            projected = self.project(annotations)
        return self.attention_weights(projected, hidden, mask)

    def weighted_context(self, weights, annotations):
        """`sum_i weights_i a_i`: (batch, L) x (batch, L, D) -> (batch, D)."""
        annotations = ops.cast(annotations, self.compute_dtype)
        return ops.einsum("bl,bld->bd", ops.cast(weights, self.compute_dtype), annotations)

    def get_config(self):
        config = super().get_config()
        config.update({"units": self.units, "score": self.score})
        return config
