"""The Show, Attend and Tell decoder and captioner (Xu et al. 2015, sections 3 and 4).

The model's forward pass and decoding step live here; its training objective
(loss terms, REINFORCE, the reward baseline) is `models/objective.py`, and the
hand-written gradients of its time loop are `models/hoisted_gradients.py`.
Training runs through the Trainer's step (components/trainer/step.py), not
`model.fit`.
"""
from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from models import hoisted_gradients, objective
from models.hard_attention import INFERENCE_MODES, HardAttention
from models.soft_attention import SoftAttention

ATTENTIONS = ("soft", "hard")
REINFORCE_CREDITS, REINFORCE_BASELINES = objective.REINFORCE_CREDITS, objective.REINFORCE_BASELINES



@keras.saving.register_keras_serializable(package="captioner")
class ShowAttendTell(keras.Model):
    """LSTM decoder with soft or hard attention over an annotation grid.

    At step t (section 3.1.2) the attention MLP scores the `L` regions from
    `h_{t-1}`, the context `z_t` is the expected annotation (soft, gated by
    `beta_t = sigmoid(f_beta(h_{t-1}))`, section 4.2.1) or a sampled one
    (hard, section 4.1), the LSTM reads `[E y_{t-1}; z_t]`, and the deep
    output layer gives `p(y_t) ~ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))`
    (equation 7), with dropout before `L_o`. `h_0, c_0` come from tanh MLPs
    on the mean annotation (section 3.1.2).

    Teacher forcing is one graph: the attention projection `W_a a + b`, the
    word embeddings and their LSTM input transform, and the deep output with
    the vocabulary projection of all steps are batched matmuls outside the
    time loop; only the recurrence runs in a `tf.while_loop`. Softmaxes,
    logits and losses are float32 under mixed precision, and so are the
    attention MLP's `tanh` and scores and the LSTM cell state.

    The constructor takes the fields of `components.contract.config.ModelConfig` as
    keyword arguments, except that the config's
    `expected_alpha_warmup_epochs` arrives here as `expected_alpha_warmup`
    minibatches (the trainer multiplies by its steps per epoch).

    Args:
      vocab_size: number of tokens, reserved ones included (`models.text`).
      embedding_dim: `m`, word embedding and deep-output width.
      hidden_dim: `n`, LSTM width.
      attention_dim: width of the attention MLP.
      attention: `"soft"` or `"hard"`.
      dropout: rate on the deep-output vector.
      use_gate: soft attention only: multiply the context by `beta_t`.
      doubly_stochastic_lambda: soft attention only (section 4.2.1): weight of
        `sum_i (1 - sum_t alpha_ti)^2`. Hard attention's objective (equation
        12) has no such term, and it would fight what REINFORCE learns: it is
        smallest when the words' attention covers every region, while a
        sampling policy that pays off looks at the named objects only.
      entropy_lambda: hard only: `lambda_e`, weight of the entropy bonus.
      reinforce_lambda: hard only: `lambda_r`, weight of the REINFORCE term.
      expected_alpha_prob: hard only: probability per minibatch of training
        with the expected context instead of a sample.
      expected_alpha_warmup: hard only: the first this many training
        minibatches all use the expected context (sampling starts after).
        Sampling from the near-uniform alpha of a fresh model feeds the LSTM
        random background regions, it learns to ignore the context, and the
        attention never sharpens; a warmup lets alpha focus first.
      baseline_decay: hard only: decay of the moving-average reward baseline.
      reinforce_credit: hard only: the reward each sampled location is
        credited with. `"sequence"` (the paper's equation 12): the caption's
        `log p(y | s, a)` for every step's sample. `"token"`: step t's sample
        gets `log p(y_t | ...)` of the word it helped emit, against a
        baseline of the mean per-word log-likelihood; a lower-variance
        (biased: it ignores the sample's effect on later words) estimate.
      reinforce_baseline: hard only: what each reward is compared with.
        `"moving_average"` (the paper): `b <- decay * b + (1 - decay) * mean
        reward`, one scalar. `"expected"` (needs `reinforce_credit="token"`):
        step t's own counterfactual, `log p(y_t)` had that step used the
        expected context `sum_i alpha_ti a_i` from the same `h_{t-1}` (the
        context the model is evaluated with), with the same dropout mask. The
        advantage is then how much better the sampled region predicts the
        word than the blend, so word difficulty no longer adds variance; it
        costs a second LSTM cell update per step and a second deep output.
        (The moving average's value is the non-trainable weight `reward_baseline`.)
      hard_inference: hard only: `"expected"` or `"argmax"` context at inference.
      seed: optional int; seeds the sampler, the dropout and the coin flips.
      annotation_gradients: back-propagate into the annotations (to fine-tune
        an encoder end to end). Off by default: the annotations are fixed CNN
        features, as in the paper, and their gradient inside the time loop
        (a (batch, L, D) accumulation per step) would be wasted work.

    Call args:
      inputs: dict with `"annotations"` (batch, L, D) float, `"tokens"`
        (batch, T) int input tokens starting with `<start>`, optional
        `"mask"` (batch, L) bool (True = keep).
      training: dropout, and hard attention samples its locations.

    Returns:
      dict with `"logits"` (batch, T, V) float32, `"alpha"` (batch, T, L)
      float32 and `"beta"` (batch, T) float32 (ones without a gate).
    """

    # Compute the recurrent weights' gradients after the time loop (see
    # `models.hoisted_gradients`); False gives plain autodiff (tests compare them).
    _hoist_weight_grads = True

    def __init__(self, vocab_size: int, embedding_dim: int = 128, hidden_dim: int = 256,
                 attention_dim: int = 128, attention: str = "soft", dropout: float = 0.3,
                 use_gate: bool = True, doubly_stochastic_lambda: float = 1.0,
                 entropy_lambda: float = 0.01, reinforce_lambda: float = 1.0,
                 expected_alpha_prob: float = 0.5, expected_alpha_warmup: int = 0,
                 baseline_decay: float = 0.9, reinforce_credit: str = "sequence",
                 reinforce_baseline: str = "moving_average",
                 hard_inference: str = "expected", seed: int | None = None,
                 annotation_gradients: bool = False, **kwargs):
        super().__init__(**kwargs)
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        if hard_inference not in INFERENCE_MODES:
            raise ValueError(f"hard_inference must be one of {INFERENCE_MODES}, "
                             f"got {hard_inference!r}")
        self.vocab_size = int(vocab_size)
        self.embedding_dim = int(embedding_dim)
        self.hidden_dim = int(hidden_dim)
        self.attention_dim = int(attention_dim)
        self.attention = attention
        self.dropout = float(dropout)
        self.use_gate = bool(use_gate)
        self.doubly_stochastic_lambda = float(doubly_stochastic_lambda)
        self.entropy_lambda = float(entropy_lambda)
        self.reinforce_lambda = float(reinforce_lambda)
        self.expected_alpha_prob = float(expected_alpha_prob)
        self.baseline_decay = float(baseline_decay)
        self.expected_alpha_warmup = int(expected_alpha_warmup)
        if reinforce_credit not in REINFORCE_CREDITS:
            raise ValueError(f"reinforce_credit must be one of {REINFORCE_CREDITS}, "
                             f"got {reinforce_credit!r}")
        self.reinforce_credit = reinforce_credit
        if reinforce_baseline not in REINFORCE_BASELINES:
            raise ValueError(f"reinforce_baseline must be one of {REINFORCE_BASELINES}, "
                             f"got {reinforce_baseline!r}")
        if reinforce_baseline == "expected" and reinforce_credit != "token":
            raise ValueError('reinforce_baseline="expected" is a per-word baseline: it needs '
                             'reinforce_credit="token"')
        self.reinforce_baseline = reinforce_baseline
        self.hard_inference = hard_inference
        self.seed = seed
        self.annotation_gradients = bool(annotation_gradients)
        self._hard = attention == "hard"
        self._gated = self.use_gate and not self._hard
        self._annotation_dim = None

    # ------------------------------------------------------------------ build

    def build(self, input_shape):
        """Creates every sublayer; only the annotation size `D` matters.

        Args:
          input_shape: the inputs' shapes (a dict with `"annotations"`) or
            the annotation shape `(batch, L, D)` itself.
        """
        shape = input_shape["annotations"] if isinstance(input_shape, dict) else input_shape
        dim = int(shape[-1])
        e, n, v = self.embedding_dim, self.hidden_dim, self.vocab_size
        policy = self.dtype_policy
        seed = self.seed

        def dense(units, name, **kw):
            return keras.layers.Dense(units, dtype=policy, name=name, **kw)

        self.embedding = keras.layers.Embedding(v, e, dtype=policy, name="embedding")
        self.embedding.build((None, None))
        self.init_h = dense(n, "init_h", activation="tanh")
        self.init_h.build((None, dim))
        self.init_c = dense(n, "init_c", activation="tanh")
        self.init_c.build((None, dim))
        if self._hard:
            self.attention_layer = HardAttention(
                self.attention_dim, inference=self.hard_inference, seed=seed,
                dtype=policy, name="attention")
        else:
            self.attention_layer = SoftAttention(self.attention_dim, dtype=policy, name="attention")
        self.attention_layer.build((None, None, dim), (None, n))
        if self._gated:
            self.gate = dense(1, "gate", activation="sigmoid")   # f_beta
            self.gate.build((None, n))
        # The LSTM affine map of [E y_{t-1}; z_t; h_{t-1}] (equation 1), split
        # so that the E y part (with the bias) runs for all steps at once.
        self.lstm_input = dense(4 * n, "lstm_input")
        self.lstm_input.build((None, None, e))
        self.lstm_context = dense(4 * n, "lstm_context", use_bias=False)
        self.lstm_context.build((None, dim))
        self.lstm_recurrent = dense(4 * n, "lstm_recurrent", use_bias=False,
                                    kernel_initializer="orthogonal")
        self.lstm_recurrent.build((None, n))
        bias = ops.convert_to_numpy(self.lstm_input.bias)
        bias[n:2 * n] = 1.0   # forget gate (gate order i, f, g, o)
        self.lstm_input.bias.assign(bias)
        self.output_hidden = dense(e, "output_hidden", use_bias=False)    # L_h
        self.output_hidden.build((None, None, n))
        self.output_context = dense(e, "output_context", use_bias=False)  # L_z
        self.output_context.build((None, None, dim))
        self.output_dropout = keras.layers.Dropout(
            self.dropout, seed=None if seed is None else seed + 1, dtype=policy,
            name="output_dropout")
        self.output_logits = dense(v, "output_logits")                     # L_o
        self.output_logits.build((None, None, e))
        if self._hard:
            self.expected_alpha_seed = keras.random.SeedGenerator(
                None if seed is None else seed + 2, name="expected_alpha_seed")
            # aggregation="mean": assigning from a tf.distribute replica context
            # all-reduces the replicas' values, so every replica keeps the same b.
            # `b`, the moving-average reward baseline (`models.objective`).
            self.reward_baseline = self.add_weight(
                shape=(), initializer="zeros", dtype="float32", trainable=False,
                autocast=False, aggregation="mean", name="reward_baseline")
            self.baseline_updates = self.add_weight(
                shape=(), initializer="zeros", dtype="float32", trainable=False,
                autocast=False, aggregation="mean", name="baseline_updates")
            # Training minibatches seen (for `expected_alpha_warmup`); mean-aggregated
            # like the baseline, so every replica counts the same.
            self.hard_training_steps = self.add_weight(
                shape=(), initializer="zeros", dtype="float32", trainable=False,
                autocast=False, aggregation="mean", name="hard_training_steps")
        self._annotation_dim = dim
        self.built = True

    def get_build_config(self):
        if self._annotation_dim is None:
            return None
        return {"annotation_dim": self._annotation_dim}

    def build_from_config(self, config):
        if config:
            self.build((None, None, config["annotation_dim"]))

    # ------------------------------------------------------- building blocks

    def project_annotations(self, annotations):
        """`W_a a_i + b`: (batch, L, D) -> (batch, L, attention_dim), once per sequence."""
        return self.attention_layer.project(ops.cast(annotations, self.compute_dtype))

    def initial_state(self, annotations, mask=None):
        """`(h_0, c_0)` from tanh MLPs on the mean annotation (section 3.1.2).

        Args:
          annotations: (batch, L, D).
          mask: optional (batch, L) bool; the mean runs over kept regions.
        Returns:
          `(h, c)`: (batch, n) in the compute dtype and (batch, n) float32.
        """
        a = ops.cast(annotations, "float32")
        if mask is None:
            mean = ops.mean(a, axis=1)
        else:
            keep = ops.expand_dims(ops.cast(mask, "float32"), -1)  # (batch, L, 1)
            mean = ops.sum(a * keep, axis=1) / ops.maximum(ops.sum(keep, axis=1), 1.0)
        mean = ops.cast(mean, self.compute_dtype)
        return self.init_h(mean), ops.cast(self.init_c(mean), "float32")

    def _attend(self, h, projected, mask, training=False, use_expected=None, noise=None):
        """Attention of one step: `(weights, alpha, beta, sample_log_prob)`.

        `weights` (batch, L) make the context (alpha, or the sampled/argmax
        one-hot for hard attention); `beta` (batch, 1) is the gate or None.
        """
        alpha, log_alpha = self.attention_layer.attention_weights(projected, h, mask)
        if self._hard:
            weights, _, sample_log_prob = self.attention_layer.select(
                alpha, log_alpha, training=training, use_expected=use_expected, noise=noise)
        else:
            weights, sample_log_prob = alpha, None
        beta = self.gate(h) if self._gated else None                  # (batch, 1)
        return weights, alpha, beta, sample_log_prob

    def _cell(self, gates, c):
        """LSTM update from the gate pre-activations (gate order i, f, g, o), in float32."""
        i, f, g, o = ops.split(ops.cast(gates, "float32"), 4, axis=-1)
        c = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(g)
        return ops.cast(ops.sigmoid(o) * ops.tanh(c), self.compute_dtype), c

    def _step(self, x_t, h, c, annotations, projected, *, mask, training, use_expected, noise,
              recurrent=None, counterfactual=False):
        """One recurrence step from `h_{t-1}, c_{t-1}`; `x_t` is the E y_{t-1} gate part.

        `recurrent`: inside the training loop, `(W_z, W_z^T, U, U^T)` for
        `hoisted_gradients.matmul_without_weight_grad`; None uses the Dense layers.
        `counterfactual`: hard attention in training: also return what this
        step would have given with the expected context, `(h_e, z_e)` from
        the same `h_{t-1}, c_{t-1}` (the `"expected"` reward baseline); else None.
        """
        weights, alpha, beta, sample_log_prob = self._attend(
            h, projected, mask, training, use_expected, noise)
        z = self.attention_layer.weighted_context(weights, annotations)   # (batch, D)
        if beta is not None:
            z = beta * z
        if recurrent is None:
            base = x_t + self.lstm_recurrent(h)
            gates = base + self.lstm_context(z)
        else:
            w_z, w_z_t, u, u_t = recurrent
            base = x_t + hoisted_gradients.matmul_without_weight_grad(h, u, u_t)
            gates = base + hoisted_gradients.matmul_without_weight_grad(z, w_z, w_z_t)
        expected = None
        if counterfactual:
            z_e = tf.stop_gradient(self.attention_layer.weighted_context(alpha, annotations))
            w_z = self.lstm_context.kernel if recurrent is None else recurrent[0]
            gates_e = tf.stop_gradient(base) + tf.matmul(z_e, tf.stop_gradient(
                tf.cast(w_z, self.compute_dtype)))
            h_e, _ = self._cell(gates_e, tf.stop_gradient(c))
            expected = (h_e, z_e)
        h, c = self._cell(gates, c)
        return h, c, z, alpha, beta, sample_log_prob, expected

    def _deep(self, embedded, h, z):
        """The deep-output vector `E y_{t-1} + L_h h_t + L_z z_t` (before dropout and `L_o`)."""
        return embedded + self.output_hidden(h) + self.output_context(z)

    def _logits(self, embedded, h, z, training=False):
        """Deep output `L_o(E y_{t-1} + L_h h_t + L_z z_t)` (equation 7), float32."""
        deep = self.output_dropout(self._deep(embedded, h, z), training=training)
        return ops.cast(self.output_logits(deep), "float32")

    def _paired_logits(self, embedded, first, second, training):
        """`_logits` of two `(h, z)` sequences with one dropout mask for both."""
        deep = ops.stack([self._deep(embedded, h, z) for h, z in (first, second)])  # (2, b, T, m)
        if training and self.dropout > 0:
            shape = ops.shape(deep)
            deep = keras.random.dropout(deep, self.dropout, noise_shape=(1,) + tuple(shape[1:]),
                                        seed=self.output_dropout.seed_generator)
        logits = ops.cast(self.output_logits(deep), "float32")
        return logits[0], logits[1]

    def _recurrence(self, x_gates, state, annotations, projected, *, mask, training,
                    use_expected, noise):
        """Runs `_step` over time in one `tf.while_loop`; inputs/outputs are batch-major."""
        x_time = tf.transpose(x_gates, [1, 0, 2])                      # (T, batch, 4n)
        steps = tf.shape(x_time)[0]
        step_inputs = {}
        recurrent = None
        if self._hoist_weight_grads:
            # W_z and U enter the loop without their gradient, which is added
            # after the loop from the stacked step inputs (`models.hoisted_gradients`).
            w_z = tf.cast(self.lstm_context.kernel, self.compute_dtype)
            u = tf.cast(self.lstm_recurrent.kernel, self.compute_dtype)
            recurrent = (tf.stop_gradient(w_z), tf.stop_gradient(tf.transpose(w_z)),
                         tf.stop_gradient(u), tf.stop_gradient(tf.transpose(u)))
            x_time = hoisted_gradients.hoisted_weight_grads(x_time, [w_z, u], step_inputs)
        xs = tf.TensorArray(x_time.dtype, size=steps, element_shape=x_time.shape[1:])
        xs = xs.unstack(x_time)
        noises = None
        if noise is not None:                                           # (T, batch, L)
            noises = tf.TensorArray(noise.dtype, size=steps, element_shape=noise.shape[1:])
            noises = noises.unstack(noise)

        def array(dtype):
            return tf.TensorArray(dtype, size=steps)

        outputs = {"h": array(self.compute_dtype), "z": array(self.compute_dtype),
                   "alpha": array("float32")}
        if self._gated:
            outputs["beta"] = array(self.compute_dtype)
        if self._hard:
            outputs["sample_log_prob"] = array("float32")
        counterfactual = self._hard and training and self.reinforce_baseline == "expected"
        if counterfactual:
            outputs["h_expected"] = array(self.compute_dtype)
            outputs["z_expected"] = array(self.compute_dtype)

        def body(t, h, c, outputs):
            noise_t = None if noises is None else noises.read(t)
            h, c, z, alpha, beta, sample_log_prob, expected = self._step(
                xs.read(t), h, c, annotations, projected, mask=mask, training=training,
                use_expected=use_expected, noise=noise_t, recurrent=recurrent,
                counterfactual=counterfactual)
            values = {"h": h, "z": z, "alpha": alpha, "beta": beta,
                      "sample_log_prob": sample_log_prob}
            if expected is not None:
                values["h_expected"], values["z_expected"] = expected
            outputs = {k: ta.write(t, values[k]) for k, ta in outputs.items()}
            return t + 1, h, c, outputs

        h0, c0 = state
        _, _, _, outputs = tf.while_loop(
            lambda t, *_: t < steps, body, (tf.constant(0), h0, c0, outputs),
            maximum_iterations=steps)
        stacked = {key: ta.stack() for key, ta in outputs.items()}      # (T, batch, ...)
        step_inputs[0] = stacked["z"]                                   # inputs of W_z
        step_inputs[1] = tf.concat([h0[None], stacked["h"][:-1]], 0)    # inputs of U: h_{t-1}
        result = {}
        for key, value in stacked.items():
            perm = [1, 0] + list(range(2, len(value.shape)))
            result[key] = tf.transpose(value, perm)
        return result

    def teacher_forced(self, annotations, tokens, mask=None, training=False,
                       use_expected=None):
        """Teacher-forced pass over input tokens `<start> w1 .. wn`.

        Args:
          annotations: (batch, L, D).
          tokens: (batch, T) int inputs.
          mask: optional (batch, L) bool over regions.
          training: dropout, and hard attention samples its locations.
          use_expected: hard attention: scalar bool, use the expected context.
        Returns:
          dict: `logits` (batch, T, V), `alpha` (batch, T, L), `beta` (batch, T),
          float32; hard attention also `sample_log_prob` (batch, T), and with
          `reinforce_baseline="expected"` in training `expected_logits`.
        """
        annotations = ops.cast(annotations, self.compute_dtype)        # (batch, L, D)
        if not self.annotation_gradients:
            annotations = ops.stop_gradient(annotations)
        tokens = ops.cast(tokens, "int32")                              # (batch, T)
        if mask is not None:
            mask = ops.cast(mask, "bool")
        projected = self.project_annotations(annotations)               # (batch, L, A)
        state = self.initial_state(annotations, mask)
        embedded = self.embedding(tokens)                               # (batch, T, m)
        x_gates = self.lstm_input(embedded)                             # (batch, T, 4n)
        noise = None
        if self._hard and training:
            shape = tf.shape(annotations)
            noise = self.attention_layer.sample_noise(
                tf.stack([tf.shape(tokens)[1], shape[0], shape[1]]))    # (T, batch, L)
        rec = self._recurrence(x_gates, state, annotations, projected, mask=mask,
                               training=training, use_expected=use_expected, noise=noise)
        if "h_expected" in rec:
            # Both deep outputs share one dropout mask, so that the reward
            # minus its baseline measures the sampled context alone.
            logits, expected_logits = self._paired_logits(
                embedded, (rec["h"], rec["z"]),
                (tf.stop_gradient(rec["h_expected"]), tf.stop_gradient(rec["z_expected"])),
                training)
        else:
            logits, expected_logits = self._logits(embedded, rec["h"], rec["z"], training), None
        if self._gated:
            beta = ops.cast(ops.squeeze(rec["beta"], -1), "float32")
        else:
            beta = ops.ones_like(rec["alpha"][..., 0])
        out = {"logits": logits, "alpha": rec["alpha"], "beta": beta}
        if self._hard:
            out["sample_log_prob"] = rec["sample_log_prob"]             # (batch, T)
        if expected_logits is not None:
            out["expected_logits"] = tf.stop_gradient(expected_logits)
        return out

    # ------------------------------------------------------------- public API

    def call(self, inputs, training=None):
        out = self.teacher_forced(inputs["annotations"], inputs["tokens"], inputs.get("mask"),
                            training=bool(training))
        return {"logits": out["logits"], "alpha": out["alpha"], "beta": out["beta"]}

    def context_products(self, annotations):
        """`(a W_z, a L_z)`: every region through the LSTM and deep-output context weights.

        Both maps are linear, so `z_t W_z = beta_t sum_i w_ti (a_i W_z)`: with
        these, a decoding step reads (batch, L, 4n + m) products instead of
        the (D, 4n + m) weights. That wins when few captions are decoded at
        once (single-image latency), where each step would stream the
        weights from memory for a handful of rows; it costs `L / steps`
        times more FLOPs, so large batches do without (see `models.decoding`).

        Args:
          annotations: (batch, L, D).
        Returns:
          (batch, L, 4n) and (batch, L, m) in the compute dtype.
        """
        a = ops.cast(annotations, self.compute_dtype)
        return self.lstm_context(a), self.output_context(a)

    def decode_step(self, prev_tokens, state, annotations, projected, mask=None,
                    context_products=None):
        """One decoding step (inference: no dropout, hard attention per `hard_inference`).

        Args:
          prev_tokens: (batch,) int previous words (`<start>` first).
          state: `(h, c)` from `initial_state` or the previous step.
          annotations: (batch, L, D).
          projected: (batch, L, attention_dim) from `project_annotations`.
          mask: optional (batch, L) bool.
          context_products: optional `context_products(annotations)`, computed
            once per caption; the same result up to float rounding.
        Returns:
          `(log_probs, alpha, new_state)`: (batch, V) float32 log-softmax,
          (batch, L) float32 attention of this step, and `(h, c)`.
        """
        if mask is not None:
            mask = ops.cast(mask, "bool")
        h, c = state
        embedded = self.embedding(ops.cast(prev_tokens, "int32"))      # (batch, m)
        weights, alpha, beta, _ = self._attend(h, projected, mask)
        if context_products is None:
            z = self.attention_layer.weighted_context(weights, annotations)  # (batch, D)
            if beta is not None:
                z = beta * z
            z_gates, z_out = self.lstm_context(z), self.output_context(z)
        else:
            weights = ops.cast(weights, self.compute_dtype)
            z_gates = ops.einsum("bl,blg->bg", weights, context_products[0])  # (batch, 4n)
            z_out = ops.einsum("bl,blm->bm", weights, context_products[1])    # (batch, m)
            if beta is not None:
                z_gates, z_out = beta * z_gates, beta * z_out
        h, c = self._cell(self.lstm_input(embedded) + z_gates + self.lstm_recurrent(h), c)
        deep = embedded + self.output_hidden(h) + z_out
        log_probs = ops.log_softmax(ops.cast(self.output_logits(deep), "float32"), axis=-1)
        return log_probs, alpha, (h, c)

    def update_baseline(self, mean_reward, skip=None):
        """Moves the REINFORCE baseline (`models.objective.update_baseline`).

        Called by `compute_loss_terms(training=True)`; call it yourself only
        with `update_baseline=False` there.
        """
        objective.update_baseline(self, mean_reward, skip)

    def compute_loss_terms(self, annotations, tokens, mask=None, training=True,
                           global_batch_size=None, update_baseline=True):
        """Every loss term of one minibatch (`models.objective.compute_loss_terms`).

        Args:
          annotations: (batch, L, D).
          tokens: (batch, T + 1) whole captions; PAD masked.
          mask: optional (batch, L) bool over regions.
          training: dropout, sampling, coin flip and baseline update.
          global_batch_size: scale `loss` by `local / global` batch (None: off).
          update_baseline: hard attention: update the moving-average baseline.
        Returns:
          dict of float32 tensors; `loss` is the scalar to minimize.
        """
        return objective.compute_loss_terms(
            self, annotations, tokens, mask=mask, training=training,
            global_batch_size=global_batch_size, update_baseline_now=update_baseline)

    def as_float32(self) -> "ShowAttendTell":
        """The same model computing in float32: itself, or a float32 twin with its weights.

        Training may run in `mixed_bfloat16` or `mixed_float16` (the
        variables are float32 either way); a saved model should decode at
        full speed on any host, and a host without native bfloat16 emulates
        it several times slower than float32.
        """
        if self.dtype_policy.name == "float32" or self._annotation_dim is None:
            return self
        config = self.get_config()
        config["dtype"] = "float32"
        twin = type(self).from_config(config)
        twin.build((None, None, self._annotation_dim))
        twin.set_weights(self.get_weights())
        return twin

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocab_size": self.vocab_size, "embedding_dim": self.embedding_dim,
            "hidden_dim": self.hidden_dim, "attention_dim": self.attention_dim,
            "attention": self.attention, "dropout": self.dropout, "use_gate": self.use_gate,
            "doubly_stochastic_lambda": self.doubly_stochastic_lambda,
            "entropy_lambda": self.entropy_lambda, "reinforce_lambda": self.reinforce_lambda,
            "expected_alpha_prob": self.expected_alpha_prob,
            "expected_alpha_warmup": self.expected_alpha_warmup,
            "reinforce_credit": self.reinforce_credit,
            "reinforce_baseline": self.reinforce_baseline,
            "baseline_decay": self.baseline_decay, "hard_inference": self.hard_inference,
            "seed": self.seed, "annotation_gradients": self.annotation_gradients,
        })
        return config
