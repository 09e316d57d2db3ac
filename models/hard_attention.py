"""Stochastic hard attention (Xu et al. 2015, section 4.1)."""
from __future__ import annotations

import keras
from keras import ops

from models.attention_scorer import AttentionScorer
from models.decoder_options import INFERENCE_MODES

_TINY = 1e-20


@keras.saving.register_keras_serializable(package="captioner")
class HardAttention(AttentionScorer):
    """Hard attention: sample `s_t ~ Multinoulli(alpha_t)`, `z_t = a_{s_t}` (section 4.1).

    `alpha_t` comes from the same MLP as `SoftAttention`. In training one
    region per step is sampled with the Gumbel-max trick (`argmax(log alpha +
    g)`, `g` Gumbel noise from a `keras.random.SeedGenerator`), which draws
    exactly from the multinoulli; the caller may pass the noise (the decoder
    draws the noise of all steps at once, outside its time loop). At inference
    the context is the expected one, `sum_i alpha_i a_i` (the default, as the
    paper evaluates), or the region of largest weight (`"argmax"`).

    Args:
      units: width of the attention MLP.
      inference: `"expected"` or `"argmax"`.
      seed: optional int seed of the sampler.

    Call args:
      annotations: (batch, L, D).
      hidden: (batch, n) previous LSTM state `h_{t-1}`.
      projected: optional (batch, L, units) from `project(annotations)`.
      mask: optional (batch, L) bool, True = keep; masked regions get 0 weight
        and are never sampled.
      training: sample when true.
      use_expected: training only: a Python bool or scalar bool tensor; when
        true the context is the expected one (the paper's "with probability
        0.5 set s to its expected value"), otherwise the sample.
      noise: optional (batch, L) float32 Gumbel noise from `sample_noise`.

    Returns:
      `(context, alpha, sample, sample_log_prob)`: context (batch, D) in the
      compute dtype; alpha (batch, L) float32; sample (batch, L) float32 one-hot
      of the chosen region (training: the sample; inference: the argmax);
      sample_log_prob (batch,) float32 `log alpha_{t, s_t}` of that region.
    """

    def __init__(self, units: int, inference: str = "expected", seed: int | None = None,
                 **kwargs):
        super().__init__(units, **kwargs)
        if inference not in INFERENCE_MODES:
            raise ValueError(f"inference must be one of {INFERENCE_MODES}, got {inference!r}")
        self.inference = inference
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed, name="sampler_seed")

    def sample_noise(self, shape):
        """Standard Gumbel noise of `shape` (float32), one fresh draw per call."""
        u = keras.random.uniform(shape, minval=_TINY, maxval=1.0, dtype="float32",
                                 seed=self.seed_generator)
        return -ops.log(-ops.log(u))

    def select(self, alpha, log_alpha, training=False, use_expected=False, noise=None):
        """The region weights that make the context, and the chosen region.

        Args:
          alpha, log_alpha: (batch, L) float32 from `attention_weights`.
          training: sample when true; otherwise use `self.inference`.
          use_expected: see the class docstring.
          noise: optional (batch, L) Gumbel noise.
        Returns:
          `(weights, sample, sample_log_prob)`: (batch, L), (batch, L), (batch,).
        """
        regions = ops.shape(alpha)[-1]
        if training:
            if noise is None:
                noise = self.sample_noise(ops.shape(alpha))
            index = ops.argmax(log_alpha + noise, axis=-1)
        else:
            index = ops.argmax(alpha, axis=-1)
        sample = ops.one_hot(index, regions, dtype="float32")
        sample_log_prob = ops.sum(sample * log_alpha, axis=-1)
        if training:
            if use_expected is True:
                weights = alpha
            elif use_expected is False or use_expected is None:
                weights = sample
            else:  # a scalar bool tensor, decided per minibatch in the graph
                weights = ops.where(use_expected, alpha, sample)
        else:
            weights = alpha if self.inference == "expected" else sample
        return weights, sample, sample_log_prob

    def call(self, annotations, hidden, projected=None, mask=None, training=None,
             use_expected=False, noise=None):
        if projected is None:
            projected = self.project(annotations)
        alpha, log_alpha = self.attention_weights(projected, hidden, mask)
        weights, sample, sample_log_prob = self.select(
            alpha, log_alpha, training=bool(training), use_expected=use_expected, noise=noise)
        return self.weighted_context(weights, annotations), alpha, sample, sample_log_prob

    def get_config(self):
        config = super().get_config()
        config.update({"inference": self.inference, "seed": self.seed})
        return config
