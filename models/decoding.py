"""Greedy and beam-search caption decoding as TensorFlow graphs.

Both loops are explicit `tf.while_loop`s with no Python control flow on
tensors, so they trace under `tf.function(autograph=False)`, which is how
`keras.export.ExportArchive` traces serving endpoints. The attention's
per-sequence projection (`W_a a + b`) runs once, before the loop. Outputs
have a static time dimension `max_length` (TF Serving batches along
dimension 0 only). A location-wise attention's model (`model.located`) also
returns each word's window, `locations` (batch, max_length, 3).
"""
from __future__ import annotations

import tensorflow as tf

from models.text import END_ID, PAD_ID, START_ID

# Score of a beam that does not exist yet (stays finite: no inf - inf).
_NEG = -1e9
# `context_products="auto"` uses `model.context_products` when at most this
# many captions (images x beams) are decoded at once: a step on a few rows
# streams the (D, 4n) weights from memory, while the products cost L/steps
# times more FLOPs, which only pays for such small batches.
LATENCY_ROWS = 4


def _choose(model, rows, context_products, build):
    """`build(use_products)`, with a graph `tf.cond` on `rows` for `"auto"`."""
    if not model.linear_context:      # a glimpse's context is not a sum of annotations
        context_products = False
    if context_products == "auto":
        return tf.cond(rows <= LATENCY_ROWS, lambda: build(True), lambda: build(False))
    if context_products not in (True, False):
        raise ValueError(f"context_products must be True, False or 'auto', "
                         f"got {context_products!r}")
    return build(context_products)


def _repeat(structure, k):
    """Every tensor of `structure` (e.g. a projection) repeated `k` times along the batch."""
    return tf.nest.map_structure(lambda x: tf.repeat(x, k, axis=0), structure)


def _histories(model, batch, max_length, regions):
    """The zero `(attention, locations)` histories of a decoding loop (locations: () if none)."""
    attention = tf.zeros([batch, max_length, regions], tf.float32)
    return (attention,) + ((tf.zeros([batch, max_length, 3], tf.float32),)
                           if model.located else ())


def _record(histories, t, out, finished, parent=None):
    """Writes step t's `alpha` (and `location`) into the histories, 0 where `finished`."""
    values = (out["alpha"],) + ((out["location"],) if len(histories) > 1 else ())
    written = []
    for history, value in zip(histories, values, strict=True):
        if parent is not None:
            history, value = tf.gather(history, parent), tf.gather(value, parent)
        value = tf.where(tf.expand_dims(finished, 1), 0.0, value)
        written.append(_write_column(history, t, value))
    return tuple(written)


def _outputs(histories, **values):
    """The decoding result: `values`, `attention` and (if recorded) `locations`."""
    values["attention"] = histories[0]
    if len(histories) > 1:
        values["locations"] = histories[1]
    return values


def _write_column(history, t, values):
    """`history[:, t] = values` for a (batch, T, ...) history whose column t is zero."""
    depth = tf.shape(history)[1]
    column = tf.one_hot(t, depth, dtype=history.dtype)               # (T,)
    column = tf.reshape(column, [1, -1] + [1] * (len(history.shape) - 2))
    return history + column * tf.expand_dims(values, 1)


def _forbid_reserved(log_probs):
    """Sets `<pad>` and `<start>` (never targets in training) to -1e9: they are never emitted."""
    vocab = tf.shape(log_probs)[-1]
    banned = tf.reduce_sum(tf.one_hot([PAD_ID, START_ID], vocab, dtype=log_probs.dtype), 0)
    return tf.where(banned > 0, tf.cast(_NEG, log_probs.dtype), log_probs)


def length_penalty(lengths, alpha):
    """GNMT length normalisation `((5 + len) / 6) ** alpha` (float32)."""
    return tf.pow((5.0 + tf.cast(lengths, tf.float32)) / 6.0, alpha)


def greedy_decode(model, annotations, max_length: int, mask=None, context_products="auto"):
    """Greedy decoding: the most likely word at every step, until `<end>`.

    `<pad>` and `<start>` are never emitted (scores use the model's own
    normalised log-probabilities of the emitted words).

    Args:
      model: a built `ShowAttendTell`.
      annotations: (batch, L, D) float.
      max_length: most words to emit (`<end>` included).
      mask: optional (batch, L) bool over regions (True = keep).
      context_products: use `model.context_products` in the steps (True),
        not (False), or when the batch has at most `LATENCY_ROWS` images
        ("auto"); the results agree up to float rounding.
    Returns:
      dict: `tokens` int32 (batch, max_length) without `<start>`, `<end>`
      included when emitted, then 0; `lengths` int32 (batch,) words incl.
      `<end>`; `scores` float32 (batch,) caption log-probability; `attention`
      float32 (batch, max_length, L), the alpha used to emit each word (0 after
      the end); with a location-wise attention also `locations` float32
      (batch, max_length, 3), each word's `(x, y, scale)` (0 after the end).
    """
    annotations = tf.convert_to_tensor(annotations)
    if mask is not None:
        mask = tf.cast(mask, tf.bool)
    return _choose(model, tf.shape(annotations)[0], context_products,
                   lambda use: _greedy(model, annotations, max_length, mask, use))


def _greedy(model, annotations, max_length, mask, use_products):
    """The greedy loop; see `greedy_decode`."""
    batch, regions = tf.shape(annotations)[0], tf.shape(annotations)[1]
    projected = model.project_annotations(annotations)
    products = model.context_products(annotations) if use_products else None
    state = model.initial_state(annotations, mask)

    def body(t, prev, state, finished, scores, lengths, tokens, histories):
        out = model.step_outputs(prev, state, annotations, projected, mask,
                                 context_products=products)
        log_probs = _forbid_reserved(out["log_probs"])
        # Chosen on the running score (the same argmax), exactly as
        # beam_search does with one beam, so that beam 1 == greedy bit for bit.
        total = tf.expand_dims(scores, 1) + log_probs                  # (batch, V)
        best, word = tf.math.top_k(total, k=1)
        word = tf.where(finished, PAD_ID, tf.cast(word[:, 0], tf.int32))
        scores = tf.where(finished, scores, best[:, 0])
        tokens = _write_column(tokens, t, word)
        histories = _record(histories, t, out, finished)
        lengths = lengths + tf.cast(tf.logical_not(finished), tf.int32)
        finished = tf.logical_or(finished, tf.equal(word, END_ID))
        return t + 1, word, out["state"], finished, scores, lengths, tokens, histories

    def cond(t, prev, state, finished, *_):
        return tf.logical_and(t < max_length, tf.logical_not(tf.reduce_all(finished)))

    loop_vars = (tf.constant(0), tf.fill([batch], START_ID), state,
                 tf.zeros([batch], tf.bool), tf.zeros([batch], tf.float32),
                 tf.zeros([batch], tf.int32), tf.zeros([batch, max_length], tf.int32),
                 _histories(model, batch, max_length, regions))
    _, _, _, _, scores, lengths, tokens, histories = tf.while_loop(
        cond, body, loop_vars, maximum_iterations=max_length)
    return _outputs(histories, tokens=tokens, lengths=lengths, scores=scores)


def sample_decode(model, annotations, num_samples: int, max_length: int, seed, mask=None,
                  temperature: float = 1.0):
    """Samples `num_samples` captions per image from the model's word distribution.

    Inference mode (no dropout; hard attention per `hard_inference`), so the
    captions are drawn from the same policy that `model.teacher_forced(...,
    training=False)` scores: self-critical training (`models.scst`) samples
    here and differentiates there. Each step draws with a stateless op keyed
    by `(seed, step)`, so a given seed gives the same captions on any device.

    Args:
      model: a built `ShowAttendTell`.
      annotations: (batch, L, D) float.
      num_samples: captions per image, K.
      max_length: most words to emit (`<end>` included).
      seed: int32/int64 tensor of shape (2,).
      mask: optional (batch, L) bool over regions.
      temperature: divides the logits before sampling (1 = the model's distribution).
    Returns:
      dict: `tokens` int32 (batch, K, max_length) as `greedy_decode` writes
      them (no `<start>`, `<end>` when emitted, then `<pad>`); `lengths`
      int32 (batch, K), words incl. `<end>`.
    """
    k = int(num_samples)
    annotations = tf.convert_to_tensor(annotations)
    batch = tf.shape(annotations)[0]
    rows = batch * k
    if mask is not None:
        mask = tf.repeat(tf.cast(mask, tf.bool), k, axis=0)
    projected = _repeat(model.project_annotations(annotations), k)
    annotations = tf.repeat(annotations, k, axis=0)                   # (batch*k, L, D)
    state = model.initial_state(annotations, mask)
    seed = tf.cast(seed, tf.int64)

    def body(t, prev, state, finished, lengths, tokens):
        log_probs, _, state = model.decode_step(prev, state, annotations, projected, mask)
        logits = _forbid_reserved(log_probs) / temperature
        step_seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(t, tf.int64))
        word = tf.random.stateless_categorical(logits, 1, seed=step_seed, dtype=tf.int32)[:, 0]
        word = tf.where(finished, PAD_ID, word)
        tokens = _write_column(tokens, t, word)
        lengths = lengths + tf.cast(tf.logical_not(finished), tf.int32)
        finished = tf.logical_or(finished, tf.equal(word, END_ID))
        return t + 1, word, state, finished, lengths, tokens

    def cond(t, prev, state, finished, *_):
        return tf.logical_and(t < max_length, tf.logical_not(tf.reduce_all(finished)))

    loop_vars = (tf.constant(0), tf.fill([rows], START_ID), state, tf.zeros([rows], tf.bool),
                 tf.zeros([rows], tf.int32), tf.zeros([rows, max_length], tf.int32))
    _, _, _, _, lengths, tokens = tf.while_loop(cond, body, loop_vars,
                                                maximum_iterations=max_length)
    return {"tokens": tf.reshape(tokens, [batch, k, max_length]),
            "lengths": tf.reshape(lengths, [batch, k])}


def beam_search(model, annotations, beam_size: int, max_length: int,
                length_normalization: float = 0.0, mask=None, context_products="auto"):
    """Batched beam search until every beam has emitted `<end>` (or `max_length`).

    A finished beam stays in the beam with its score and only extends with
    `<pad>` at no cost. With `length_normalization = a > 0` beams are ranked,
    and the best one chosen, by `score / ((5 + len) / 6) ** a` (Wu et al. 2016).

    Args:
      model: a built `ShowAttendTell`.
      annotations: (batch, L, D) float.
      beam_size: beams per image (1 gives exactly `greedy_decode`).
      max_length: most words to emit (`<end>` included).
      length_normalization: the exponent `a`; 0 = raw log-probabilities.
      mask: optional (batch, L) bool over regions.
      context_products: as in `greedy_decode`, counting images x beams.
    Returns:
      The best beam per image, as `greedy_decode` returns it; `scores` are
      length-normalised when `length_normalization > 0`.
    """
    k = int(beam_size)
    annotations = tf.convert_to_tensor(annotations)
    if mask is not None:
        mask = tf.cast(mask, tf.bool)
    return _choose(model, tf.shape(annotations)[0] * k, context_products,
                   lambda use: _beam(model, annotations, k, max_length, length_normalization,
                                     mask, use))


def _beam(model, annotations, k, max_length, length_normalization, mask, use_products):
    """The beam-search loop; see `beam_search`."""
    batch, regions = tf.shape(annotations)[0], tf.shape(annotations)[1]
    rows = batch * k
    if mask is not None:
        mask = tf.repeat(mask, k, axis=0)                             # (batch*k, L)
    projected = _repeat(model.project_annotations(annotations), k)
    products = None
    if use_products:  # once per image, then shared by its beams
        products = tuple(tf.repeat(p, k, axis=0) for p in model.context_products(annotations))
    annotations = tf.repeat(annotations, k, axis=0)                   # (batch*k, L, D)
    state = model.initial_state(annotations, mask)
    vocab = model.vocab_size
    offsets = tf.expand_dims(tf.range(batch) * k, 1)                  # (batch, 1)
    pad_only = tf.one_hot(PAD_ID, vocab, on_value=0.0, off_value=_NEG)  # (V,)

    def body(t, prev, state, finished, scores, lengths, tokens, histories):
        out = model.step_outputs(prev, state, annotations, projected, mask,
                                 context_products=products)
        log_probs = tf.where(tf.expand_dims(finished, 1), pad_only,
                             _forbid_reserved(out["log_probs"]))
        total = tf.expand_dims(scores, 1) + log_probs                  # (batch*k, V)
        if k > 1 and length_normalization > 0:
            new_lengths = lengths + tf.cast(tf.logical_not(finished), tf.int32)
            rank = total / tf.expand_dims(length_penalty(new_lengths, length_normalization), 1)
        else:  # one beam: every candidate has the same length
            rank = total
        _, index = tf.math.top_k(tf.reshape(rank, [batch, k * vocab]), k=k)  # (batch, k)
        scores = tf.gather(tf.reshape(total, [batch, k * vocab]), index, batch_dims=1)
        parent = tf.reshape(offsets + index // vocab, [rows])          # rows of batch*k
        word = tf.reshape(tf.cast(index % vocab, tf.int32), [rows])
        scores = tf.reshape(scores, [rows])
        was_finished = tf.gather(finished, parent)
        state = tf.nest.map_structure(lambda s: tf.gather(s, parent), out["state"])
        histories = _record(histories, t, out, was_finished, parent)
        tokens = _write_column(tf.gather(tokens, parent), t, word)
        lengths = tf.gather(lengths, parent) + tf.cast(tf.logical_not(was_finished), tf.int32)
        finished = tf.logical_or(was_finished, tf.equal(word, END_ID))
        return t + 1, word, state, finished, scores, lengths, tokens, histories

    def cond(t, prev, state, finished, *_):
        return tf.logical_and(t < max_length, tf.logical_not(tf.reduce_all(finished)))

    first = tf.tile(tf.one_hot(0, k, on_value=0.0, off_value=_NEG), [batch])  # only beam 0 alive
    loop_vars = (tf.constant(0), tf.fill([rows], START_ID), state,
                 tf.zeros([rows], tf.bool), first, tf.zeros([rows], tf.int32),
                 tf.zeros([rows, max_length], tf.int32),
                 _histories(model, rows, max_length, regions))
    _, _, _, _, scores, lengths, tokens, histories = tf.while_loop(
        cond, body, loop_vars, maximum_iterations=max_length)
    if length_normalization > 0:
        scores = scores / length_penalty(lengths, length_normalization)
    best = tf.argmax(tf.reshape(scores, [batch, k]), axis=1, output_type=tf.int32)
    pick = tf.range(batch) * k + best                                 # (batch,)
    return _outputs(tuple(tf.gather(h, pick) for h in histories), tokens=tf.gather(tokens, pick),
                    lengths=tf.gather(lengths, pick), scores=tf.gather(scores, pick))


def attention_to_grid(attention, grid_h: int, grid_w: int):
    """(batch, T, L) attention -> (batch, T, grid_h, grid_w); cell `i = y * W + x`."""
    attention = tf.convert_to_tensor(attention)
    shape = tf.shape(attention)
    return tf.reshape(attention, tf.stack([shape[0], shape[1], grid_h, grid_w]))
