"""The Show, Attend and Tell decoder and captioner (Xu et al. 2015, sections 3 and 4).

The model's forward pass and decoding step live here; its settings are
`models/decoder_options.py`, its time loop `models/recurrence.py`, its
training objective (loss terms, REINFORCE, the reward baselines)
`models/objective.py`, and the hand-written gradients of its time loop
`models/hoisted_gradients.py`. Training runs through the Trainer's step
(components/trainer/step.py), not `model.fit`.
"""
from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf
from keras import ops

from models import attention_step, hoisted_gradients, objective, recurrence
from models.decoder_options import (  # noqa: F401
    ATTENTIONS,
    FIELDS,
    REINFORCE_BASELINES,
    REINFORCE_CREDITS,
    DecoderOptions,
)
from models.recurrence import SequenceInputs


@keras.saving.register_keras_serializable(package="captioner")
class ShowAttendTell(keras.Model):
    """LSTM decoder with attention over an annotation grid (docs/attention.md).

    At step t (section 3.1.2) the attention reads the `L` regions from
    `h_{t-1}`: soft attention's context `z_t` is the expected annotation
    under a softmax of the regions' scores (gated by `beta_t =
    sigmoid(f_beta(h_{t-1}))`, section 4.2.1), hard attention's a sampled
    region (section 4.1); a glimpse (Mnih et al. 2014) reads a sampled
    location through a multi-resolution retina, a spatial transformer
    (Jaderberg et al. 2015) a window it places differentiably. The LSTM reads
    `[E y_{t-1}; z_t]`, and the deep output layer gives
    `p(y_t) ~ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))` (equation 7), with
    dropout before `L_o`. `h_0, c_0` come from tanh MLPs on the mean
    annotation (section 3.1.2).

    Teacher forcing is one graph: the attention's per-sequence projection,
    the word embeddings and their LSTM input transform, and the deep output
    with the vocabulary projection of all steps are batched matmuls outside
    the time loop; only the recurrence runs in a `tf.while_loop`. Softmaxes,
    logits, losses and locations are float32 under mixed precision, and so
    are the attention MLP's `tanh` and scores and the LSTM cell state.

    Args:
      vocab_size: number of tokens, reserved ones included (`models.text`).
      options: a `DecoderOptions` (or a dict of its fields); None: the defaults.
      seed: optional int; seeds the samplers, the dropout and the coin flips.

    Call args:
      inputs: dict with `"annotations"` (batch, L, D) float, `"tokens"`
        (batch, T) int input tokens starting with `<start>`, optional
        `"mask"` (batch, L) bool (True = keep).
      training: dropout, and the sampling attentions sample their locations.

    Returns:
      dict with `"logits"` (batch, T, V) float32, `"alpha"` (batch, T, L)
      float32 (the attention map of every step) and `"beta"` (batch, T)
      float32 (ones without a gate); the location-wise attentions also
      `"locations"` (batch, T, 3) float32 `(x, y, scale)` in grid coordinates.
    """

    # Compute the recurrent weights' gradients after the time loop (see
    # `models.hoisted_gradients`); False gives plain autodiff (tests compare them).
    _hoist_weight_grads = True

    def __init__(self, vocab_size: int, options: DecoderOptions | dict | None = None,
                 seed: int | None = None, **kwargs):
        # `kwargs` are Keras's (name, dtype, trainable) and go to the base class only.
        if isinstance(options, dict):
            options = DecoderOptions.from_mapping(options)
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.options = options or DecoderOptions()
        self.seed = seed
        self._annotation_dim = None
        self._regions = None

    @property
    def located(self) -> bool:
        """A location-wise attention (glimpse, spatial transformer): returns `locations`."""
        return self.options.located

    @property
    def linear_context(self) -> bool:
        """`z_t = sum_i w_ti a_i` for some weights (`context_products` apply): all but glimpse."""
        return self.options.attention != "glimpse"

    # ------------------------------------------------------------------ build

    def build(self, input_shape):
        """Creates every sublayer; `D` (and `L` for the location-wise attentions) matter.

        Args:
          input_shape: the inputs' shapes (a dict with `"annotations"`) or
            the annotation shape `(batch, L, D)` itself.
        """
        shape = input_shape["annotations"] if isinstance(input_shape, dict) else input_shape
        dim, regions = int(shape[-1]), shape[-2]
        regions = None if regions is None else int(regions)
        o, seed, policy = self.options, self.seed, self.dtype_policy
        e, n, v = o.embedding_dim, o.hidden_dim, self.vocab_size

        def dense(units, name, input_dim, **kw):
            layer = keras.layers.Dense(units, dtype=policy, name=name, **kw)
            layer.build(input_dim)
            return layer

        self.embedding = keras.layers.Embedding(v, e, dtype=policy, name="embedding")
        self.embedding.build((None, None))
        self.init_h = dense(n, "init_h", (None, dim), activation="tanh")
        self.init_c = dense(n, "init_c", (None, dim), activation="tanh")
        self.attention_layer = attention_step.make_layer(o, policy, seed)
        self.attention_layer.build((None, regions, dim), (None, n))
        if o.gated:
            self.gate = dense(1, "gate", (None, n), activation="sigmoid")   # f_beta
        # The LSTM affine map of [E y_{t-1}; z_t; h_{t-1}] (equation 1), split
        # so that the E y part (with the bias) runs for all steps at once.
        self.lstm_input = dense(4 * n, "lstm_input", (None, None, e))
        self.lstm_context = dense(4 * n, "lstm_context", (None, dim), use_bias=False)
        self.lstm_recurrent = dense(4 * n, "lstm_recurrent", (None, n), use_bias=False,
                                    kernel_initializer="orthogonal")
        bias = ops.convert_to_numpy(self.lstm_input.bias)
        bias[n:2 * n] = 1.0   # forget gate (gate order i, f, g, o)
        self.lstm_input.bias.assign(bias)
        self.output_hidden = dense(e, "output_hidden", (None, None, n), use_bias=False)   # L_h
        self.output_context = dense(e, "output_context", (None, None, dim),
                                    use_bias=False)                                     # L_z
        self.output_dropout = keras.layers.Dropout(
            o.dropout, seed=None if seed is None else seed + 1, dtype=policy,
            name="output_dropout")
        self.output_logits = dense(v, "output_logits", (None, None, e))                 # L_o
        if o.samples:
            self._add_reinforce_state()
        if o.located:
            # Training (example, step) pairs and those where the attention's guard acted
            # (mean-aggregated, as the hard attention's counters).
            self.guard_fired, self.guard_checked = (self._counter(name) for name in (
                "guard_fired", "guard_checked"))
        self._annotation_dim, self._regions = dim, regions
        self.built = True

    def _counter(self, name):
        # aggregation="mean": assigning from a tf.distribute replica context
        # all-reduces the replicas' values, so every replica keeps the same value.
        return self.add_weight(shape=(), initializer="zeros", dtype="float32", trainable=False,
                               autocast=False, aggregation="mean", name=name)

    def _add_reinforce_state(self):
        """The moving-average reward baseline; hard attention's coin-flip seed and step count."""
        if self.options.hard:
            seed = self.seed
            self.expected_alpha_seed = keras.random.SeedGenerator(
                None if seed is None else seed + 2, name="expected_alpha_seed")
        self.reward_baseline = self._counter("reward_baseline")     # the moving average b
        self.baseline_updates = self._counter("baseline_updates")
        if self.options.hard:
            # Training minibatches seen (for `expected_alpha_warmup`).
            self.hard_training_steps = self._counter("hard_training_steps")

    def get_build_config(self):
        if self._annotation_dim is None:
            return None
        config = {"annotation_dim": self._annotation_dim}
        if self._regions is not None:
            config["regions"] = self._regions
        return config

    def build_from_config(self, config):
        if config:
            self.build((None, config.get("regions"), config["annotation_dim"]))

    # ------------------------------------------------------- building blocks

    def project_annotations(self, annotations):
        """The attention's per-sequence precomputation (e.g. `W_a a_i + b`), once per sequence."""
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

    def step_records(self) -> dict:
        """What a step of the time loop records, name -> dtype (besides `h` and `z`)."""
        return attention_step.records(self.options, self.compute_dtype)

    def _cell(self, gates, c):
        """LSTM update from the gate pre-activations (gate order i, f, g, o), in float32."""
        i, f, g, o = ops.split(ops.cast(gates, "float32"), 4, axis=-1)
        c = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(g)
        return ops.cast(ops.sigmoid(o) * ops.tanh(c), self.compute_dtype), c

    def _step(self, x_t, state, per_step, seq: SequenceInputs):
        """One recurrence step from `state = (h_{t-1}, c_{t-1})`; `x_t` is the E y_{t-1} gate part.

        `per_step`: this step's slice of the loop's other inputs (`attention_step.attend`).

        Returns:
          `((h_t, c_t), z_t, attended, expected)`: `attended` from `attention_step.attend`;
          `expected` with `seq.counterfactual` (the sampling attentions' `"expected"`
          reward baseline): `(h_e, z_e)` had the step used the expected context
          (glimpse: the glimpse at the mean location) from the same
          `h_{t-1}, c_{t-1}`; else None.
        """
        h, c = state
        attended = attention_step.attend(self, h, seq, per_step)
        z = attention_step.context(self, attended, seq.annotations)    # (batch, D)
        if seq.recurrent is None:
            base = x_t + self.lstm_recurrent(h)
            gates = base + self.lstm_context(z)
        elif len(seq.recurrent) == 2:
            # One matmul of [h_{t-1}, z_t] with the stacked kernel [U; W_z].
            w, w_t = seq.recurrent
            base = None
            gates = x_t + hoisted_gradients.matmul_without_weight_grad(
                tf.concat([h, z], -1), w, w_t)
        else:
            w_z, w_z_t, u, u_t = seq.recurrent
            base = x_t + hoisted_gradients.matmul_without_weight_grad(h, u, u_t)
            gates = base + hoisted_gradients.matmul_without_weight_grad(z, w_z, w_z_t)
        expected = None
        if seq.counterfactual:
            z_e = attended.get("expected_context")
            if z_e is None:
                z_e = self.attention_layer.weighted_context(attended["alpha"], seq.annotations)
            z_e = tf.stop_gradient(z_e)
            w_z = self.lstm_context.kernel if seq.recurrent is None else seq.recurrent[0]
            gates_e = tf.stop_gradient(base) + tf.matmul(z_e, tf.stop_gradient(
                tf.cast(w_z, self.compute_dtype)))
            h_e, _ = self._cell(gates_e, tf.stop_gradient(c))
            expected = (h_e, z_e)
        return self._cell(gates, c), z, attended, expected

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
        if training and self.options.dropout > 0:
            shape = ops.shape(deep)
            deep = keras.random.dropout(deep, self.options.dropout,
                                        noise_shape=(1,) + tuple(shape[1:]),
                                        seed=self.output_dropout.seed_generator)
        logits = ops.cast(self.output_logits(deep), "float32")
        return logits[0], logits[1]

    def _noise(self, tokens, annotations, training):
        """The samplers' noise of every step, drawn before the loop: (T, batch, ...) or None."""
        if not (training and self.options.samples):
            return None
        steps, batch = tf.shape(tokens)[1], tf.shape(annotations)[0]
        last = 2 if self.options.attention == "glimpse" else tf.shape(annotations)[1]
        return self.attention_layer.sample_noise(tf.stack([steps, batch, last]))

    def teacher_forced(self, annotations, tokens, mask=None, training=False,
                       use_expected=None):
        """Teacher-forced pass over input tokens `<start> w1 .. wn`.

        Args:
          annotations: (batch, L, D).
          tokens: (batch, T) int inputs.
          mask: optional (batch, L) bool over regions.
          training: dropout, and the sampling attentions sample.
          use_expected: hard attention: scalar bool, use the expected context.
        Returns:
          dict: `logits` (batch, T, V), `alpha` (batch, T, L), `beta` (batch, T),
          float32; hard attention and glimpse also `sample_log_prob` (batch, T),
          and with `reinforce_baseline="expected"` in training `expected_logits`;
          the location-wise attentions `locations` (batch, T, 3), `guard` and
          `guard_penalty` (batch, T); glimpse `baseline` (batch, T).
        """
        o = self.options
        annotations = ops.cast(annotations, self.compute_dtype)        # (batch, L, D)
        if not o.annotation_gradients:
            annotations = ops.stop_gradient(annotations)
        tokens = ops.cast(tokens, "int32")                              # (batch, T)
        if mask is not None:
            mask = ops.cast(mask, "bool")
        embedded = self.embedding(tokens)                               # (batch, T, m)
        seq = SequenceInputs(
            annotations, self.project_annotations(annotations), mask, training=training,
            use_expected=use_expected,
            counterfactual=o.samples and training and o.reinforce_baseline == "expected")
        rec = recurrence.run(self, self.lstm_input(embedded), self.initial_state(annotations, mask),
                             seq, self._noise(tokens, annotations, training))
        if "h_expected" in rec:
            # Both deep outputs share one dropout mask, so that the reward
            # minus its baseline measures the sampled context alone.
            logits, expected_logits = self._paired_logits(
                embedded, (rec["h"], rec["z"]),
                (tf.stop_gradient(rec["h_expected"]), tf.stop_gradient(rec["z_expected"])),
                training)
        else:
            logits, expected_logits = self._logits(embedded, rec["h"], rec["z"], training), None
        if o.gated:
            beta = ops.cast(ops.squeeze(rec["beta"], -1), "float32")
        else:
            beta = ops.ones_like(rec["alpha"][..., 0])
        out = {"logits": logits, "alpha": rec["alpha"], "beta": beta}
        for key in ("sample_log_prob", "guard", "guard_penalty", "baseline"):
            if key in rec:
                out[key] = rec[key]                                     # (batch, T)
        if "location" in rec:
            out["locations"] = rec["location"]                          # (batch, T, 3)
        if expected_logits is not None:
            out["expected_logits"] = tf.stop_gradient(expected_logits)
        return out

    # ------------------------------------------------------------- public API

    def call(self, inputs, training=None):
        out = self.teacher_forced(inputs["annotations"], inputs["tokens"], inputs.get("mask"),
                                  training=bool(training))
        keys = ("logits", "alpha", "beta") + (("locations",) if self.located else ())
        return {key: out[key] for key in keys}

    def context_products(self, annotations):
        """`(a W_z, a L_z)`: every region through the LSTM and deep-output context weights.

        Both maps are linear, so `z_t W_z = beta_t sum_i w_ti (a_i W_z)`: with
        these, a decoding step reads (batch, L, 4n + m) products instead of
        the (D, 4n + m) weights. That wins when few captions are decoded at
        once (single-image latency), where each step would stream the
        weights from memory for a handful of rows; it costs `L / steps`
        times more FLOPs, so large batches do without (see `models.decoding`).
        Only for a context linear in the annotations (`linear_context`).

        Args:
          annotations: (batch, L, D).
        Returns:
          (batch, L, 4n) and (batch, L, m) in the compute dtype.
        """
        a = ops.cast(annotations, self.compute_dtype)
        return self.lstm_context(a), self.output_context(a)

    def step_outputs(self, prev_tokens, state, annotations, projected, mask=None,
                     context_products=None) -> dict:
        """One decoding step (inference: no dropout, the sampling attentions at their mean).

        Args:
          prev_tokens: (batch,) int previous words (`<start>` first).
          state: `(h, c)` from `initial_state` or the previous step.
          annotations: (batch, L, D).
          projected: from `project_annotations`.
          mask: optional (batch, L) bool.
          context_products: optional `context_products(annotations)`, computed
            once per caption; the same result up to float rounding (ignored
            where the context is not linear in the annotations: glimpse).
        Returns:
          dict: `log_probs` (batch, V) float32 log-softmax, `alpha` (batch, L)
          float32 attention of this step, `state` `(h, c)`; the location-wise
          attentions also `location` (batch, 3) float32.
        """
        if mask is not None:
            mask = ops.cast(mask, "bool")
        h, c = state
        embedded = self.embedding(ops.cast(prev_tokens, "int32"))      # (batch, m)
        attended = attention_step.attend(self, h, SequenceInputs(annotations, projected, mask))
        beta = attended["beta"]
        if context_products is None or attended["weights"] is None:
            z = attention_step.context(self, attended, annotations)    # (batch, D)
            z_gates, z_out = self.lstm_context(z), self.output_context(z)
        else:
            weights = ops.cast(attended["weights"], self.compute_dtype)
            z_gates = ops.einsum("bl,blg->bg", weights, context_products[0])  # (batch, 4n)
            z_out = ops.einsum("bl,blm->bm", weights, context_products[1])    # (batch, m)
            if beta is not None:
                z_gates, z_out = beta * z_gates, beta * z_out
        h, c = self._cell(self.lstm_input(embedded) + z_gates + self.lstm_recurrent(h), c)
        deep = embedded + self.output_hidden(h) + z_out
        log_probs = ops.log_softmax(ops.cast(self.output_logits(deep), "float32"), axis=-1)
        out = {"log_probs": log_probs, "alpha": attended["alpha"], "state": (h, c)}
        if "location" in attended:
            out["location"] = attended["location"]
        return out

    def decode_step(self, prev_tokens, state, annotations, projected, mask=None,
                    context_products=None):
        """`step_outputs` as `(log_probs, alpha, new_state)`."""
        out = self.step_outputs(prev_tokens, state, annotations, projected, mask,
                                context_products)
        return out["log_probs"], out["alpha"], out["state"]

    def update_baseline(self, mean_reward, skip=None):
        """Moves the REINFORCE baseline (`models.objective.update_baseline`).

        Called by `compute_loss_terms(training=True)`; call it yourself only
        with `update_baseline=False` there.
        """
        objective.update_baseline(self, mean_reward, skip)

    def guard_rate(self) -> float | None:
        """The share of training steps (example x word) whose location the guard clamped."""
        if not self.located:
            return None
        checked = float(self.guard_checked.numpy())
        return float(self.guard_fired.numpy()) / checked if checked else 0.0

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
        twin.build((None, self._regions, self._annotation_dim))
        twin.set_weights(self.get_weights())
        return twin

    def get_config(self):
        # The options' fields sit flat in the config, as in every saved model.
        config = super().get_config()
        config.update({"vocab_size": self.vocab_size, "seed": self.seed,
                       **dataclasses.asdict(self.options)})
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        options = {name: config.pop(name) for name in list(config) if name in FIELDS}
        return cls(options=DecoderOptions.from_mapping(options), **config)
