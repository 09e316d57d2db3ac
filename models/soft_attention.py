"""Deterministic soft attention (Xu et al. 2015, section 4.2)."""
from __future__ import annotations

import keras

from models.attention_scorer import AttentionScorer


@keras.saving.register_keras_serializable(package="captioner")
class SoftAttention(AttentionScorer):
    """Soft attention: `z_t = sum_i alpha_ti a_i` (section 4.2, equation 13).

    The scores come from the MLP `e_ti = w^T tanh(W_a a_i + W_h h_{t-1} + b)`
    and the softmax over the `L` regions runs in float32. Pass `projected`
    (from `project()`) to reuse `W_a a_i + b` across the steps of a sequence.
    The gating scalar `beta_t` (section 4.2.1) belongs to the decoder.

    Args:
      units: width of the attention MLP.

    Call args:
      annotations: (batch, L, D) annotation vectors `a_i`.
      hidden: (batch, n) previous LSTM state `h_{t-1}`.
      projected: optional (batch, L, units) from `project(annotations)`.
      mask: optional (batch, L) bool, True = keep; masked regions get 0 weight.
      training: unused (soft attention is deterministic).

    Returns:
      `(context, alpha)`: (batch, D) in the compute dtype and (batch, L) float32.
    """

    def call(self, annotations, hidden, projected=None, mask=None, training=None):
        if projected is None:
            projected = self.project(annotations)
        alpha, _ = self.attention_weights(projected, hidden, mask)
        return self.weighted_context(alpha, annotations), alpha
