"""Baseline: the TensorFlow image-captioning tutorial's model (GRU + Bahdanau attention).

Written from the tutorial's description ("Image captioning with visual
attention", tensorflow.org, 2019-2022 edition) for the benchmarks, in Keras 3:

- `CNN_Encoder`: one `Dense(embedding_dim)` + ReLU over the 64 x 2048
  InceptionV3 features;
- `RNN_Decoder`: embedding, Bahdanau attention (`W1`, `W2`, `V`), a GRU over
  `[context; embedding]`, then `fc1` (units) and `fc2` (vocabulary);
- teacher forcing with a Python loop over the time steps inside
  `tf.function`, calling the decoder once per step, so the feature
  projection `W1(features)` is recomputed at every step;
- `evaluate`: eager, step-by-step greedy decoding of one image.

The tutorial calls its GRU without the previous state (each step starts from
zeros, a known slip); here the state is passed, which costs the same and makes
it an actual recurrent decoder. Sizes default to the tutorial's: embedding
256, units 512, vocabulary 5000, 64 x 2048 features, batch 64.

Under a mixed-precision global policy (for benchmarks in the same precision
as ours) the features and the GRU state enter in the compute dtype and the
logits leave in float32, as the Keras mixed-precision guide prescribes; in
float32 these casts are no-ops.
"""
from __future__ import annotations

import keras
import tensorflow as tf

EMBEDDING_DIM, UNITS, VOCAB_SIZE = 256, 512, 5000
FEATURES_SHAPE = (64, 2048)
BATCH_SIZE = 64
START_ID, END_ID = 1, 2


class BahdanauAttention(keras.layers.Layer):
    """`score = V tanh(W1 features + W2 hidden)`, softmax over the 64 locations."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.W1 = keras.layers.Dense(units)
        self.W2 = keras.layers.Dense(units)
        self.V = keras.layers.Dense(1)

    def call(self, features, hidden):
        hidden_with_time_axis = tf.expand_dims(hidden, 1)               # (batch, 1, units)
        attention_hidden_layer = tf.nn.tanh(self.W1(features) + self.W2(hidden_with_time_axis))
        score = self.V(attention_hidden_layer)                          # (batch, 64, 1)
        attention_weights = tf.nn.softmax(score, axis=1)
        context_vector = tf.reduce_sum(attention_weights * features, axis=1)
        return context_vector, attention_weights


class CNN_Encoder(keras.Model):
    """The tutorial's "encoder": a fully connected layer over the CNN features."""

    def __init__(self, embedding_dim, **kwargs):
        super().__init__(**kwargs)
        self.fc = keras.layers.Dense(embedding_dim)

    def call(self, x):
        return tf.nn.relu(self.fc(x))


class RNN_Decoder(keras.Model):
    """One decoding step per call: attention, GRU, fc1, fc2."""

    def __init__(self, embedding_dim, units, vocab_size, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.embedding = keras.layers.Embedding(vocab_size, embedding_dim)
        self.gru = keras.layers.GRU(units, return_sequences=True, return_state=True,
                                    recurrent_initializer="glorot_uniform")
        self.fc1 = keras.layers.Dense(units)
        self.fc2 = keras.layers.Dense(vocab_size)
        self.attention = BahdanauAttention(units)

    def call(self, x, features, hidden):
        context_vector, attention_weights = self.attention(features, hidden)
        x = self.embedding(x)                                           # (batch, 1, emb)
        x = tf.concat([tf.expand_dims(context_vector, 1), x], axis=-1)
        output, state = self.gru(x, initial_state=hidden)
        x = self.fc1(output)
        x = tf.reshape(x, (-1, x.shape[2]))
        x = tf.cast(self.fc2(x), tf.float32)   # logits in float32 (mixed precision)
        return x, state, attention_weights

    def reset_state(self, batch_size):
        return tf.zeros((batch_size, self.units), self.compute_dtype)


def loss_function(real, pred):
    """Masked sparse cross-entropy, mean over the batch (PAD = 0 masked)."""
    mask = tf.math.logical_not(tf.math.equal(real, 0))
    loss_ = keras.losses.sparse_categorical_crossentropy(real, pred, from_logits=True)
    loss_ *= tf.cast(mask, dtype=loss_.dtype)
    return tf.reduce_mean(loss_)


def build(embedding_dim=EMBEDDING_DIM, units=UNITS, vocab_size=VOCAB_SIZE,
          features_shape=FEATURES_SHAPE):
    """The encoder and decoder, built on the feature shape."""
    encoder = CNN_Encoder(embedding_dim)
    decoder = RNN_Decoder(embedding_dim, units, vocab_size)
    features = encoder(tf.zeros((1,) + tuple(features_shape), encoder.compute_dtype))
    decoder(tf.zeros((1, 1), tf.int32), features, decoder.reset_state(1))
    return encoder, decoder


def make_train_step(encoder, decoder, optimizer):
    """The tutorial's `train_step`: a Python loop over time inside `tf.function`."""

    @tf.function
    def train_step(img_tensor, target):
        loss = 0.0
        hidden = decoder.reset_state(batch_size=target.shape[0])
        dec_input = tf.expand_dims([START_ID] * target.shape[0], 1)
        with tf.GradientTape() as tape:
            features = encoder(tf.cast(img_tensor, encoder.compute_dtype))
            for i in range(1, target.shape[1]):
                predictions, hidden, _ = decoder(dec_input, features, hidden)
                loss += loss_function(target[:, i], predictions)
                dec_input = tf.expand_dims(target[:, i], 1)              # teacher forcing
        total_loss = loss / int(target.shape[1])
        trainable_variables = encoder.trainable_variables + decoder.trainable_variables
        gradients = tape.gradient(loss, trainable_variables)
        optimizer.apply_gradients(zip(gradients, trainable_variables, strict=True))
        return loss, total_loss

    return train_step


def evaluate(encoder, decoder, img_features, max_length):
    """The tutorial's eager greedy decode of one image: (1, 64, 2048) -> word ids."""
    hidden = decoder.reset_state(batch_size=1)
    features = encoder(tf.cast(img_features, encoder.compute_dtype))
    dec_input = tf.expand_dims([START_ID], 0)
    result = []
    for _ in range(max_length):
        predictions, hidden, _ = decoder(dec_input, features, hidden)
        predicted_id = int(tf.argmax(predictions[0]).numpy())
        result.append(predicted_id)
        if predicted_id == END_ID:
            return result
        dec_input = tf.expand_dims([predicted_id], 0)
    return result
