"""CIDEr-D (Vedantam et al. 2015) of token-id captions as one TensorFlow graph.

The reward of self-critical sequence training (`models.scst`): every sampled
caption of a minibatch is scored against its image's references inside the
training step, with no Python loop per caption. The definition is
coco-caption's (`pycocoevalcap.cider`, which is CIDEr-D): n = 1..4 grams,
tf-idf vectors with `idf = log(N) - log(max(1, df))`, the candidate's counts
clipped by the reference's, a Gaussian penalty `exp(-delta^2 / (2 sigma^2))`
on the length difference (sigma = 6, length = the number of bigrams), the
mean over n and over the references, times 10. Document frequencies `df`
count the images (of `N`) whose references contain the n-gram; for training
they come from the training references, as in Rennie et al. 2017.

An n-gram of token ids is one int64 key, its words `w + 1` as the digits of
a number in base `vocab_size + 1`; the key's magnitude tells its order, so
no two n-grams (of any orders) share a key. Counting is done with equality
matrices over the (at most T) n-gram positions of a caption, so a caption
costs O(T^2) comparisons per reference and nothing is hashed on the fly.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from models.text import END_ID, PAD_ID, START_ID

ORDERS = 4
SIGMA = 6.0
# (vocab_size + 1) ** 4 must stay below 2 ** 63.
MAX_VOCAB = 55_000


def _check_vocab(vocab_size: int) -> int:
    if not 0 < vocab_size <= MAX_VOCAB:
        raise ValueError(f"CIDEr-D keys need 0 < vocab_size <= {MAX_VOCAB}, got {vocab_size}")
    return int(vocab_size) + 1


def words_mask(tokens):
    """(..., T) bool: the caption's words, i.e. before the first `<end>`, not pad/start.

    Args:
      tokens: (..., T) int token ids (with or without a leading `<start>`).
    Returns:
      (..., T) bool.
    """
    tokens = tf.convert_to_tensor(tokens)
    ended = tf.cumsum(tf.cast(tf.equal(tokens, END_ID), tf.int32), axis=-1) > 0
    return tf.logical_and(tf.logical_not(ended),
                          tf.logical_and(tf.not_equal(tokens, PAD_ID),
                                         tf.not_equal(tokens, START_ID)))


def _compact(tokens):
    """Moves each row's words to the front (a leading `<start>` is dropped): `(words, mask)`."""
    tokens = tf.cast(tokens, tf.int64)
    mask = words_mask(tokens)
    # Stable sort on "not a word": words keep their order and come first.
    order = tf.argsort(tf.cast(tf.logical_not(mask), tf.int32), axis=-1, stable=True)
    return (tf.gather(tokens, order, batch_dims=len(tokens.shape) - 1),
            tf.gather(mask, order, batch_dims=len(tokens.shape) - 1))


def ngram_keys(tokens, order: int, vocab_size: int):
    """`(keys, valid)`: the int64 key of the n-gram starting at each position.

    Args:
      tokens: (..., T) int token ids (see `words_mask`).
      order: n.
      vocab_size: tokens in the vocabulary.
    Returns:
      keys (..., T) int64 and valid (..., T) bool (n words from there on).
    """
    return _keys(*_compact(tokens), order, _check_vocab(vocab_size))


def _keys(words, mask, order: int, base: int):
    """`ngram_keys` of captions already `_compact`ed."""
    steps = tf.shape(words)[-1]
    keys = tf.zeros_like(words)
    valid = tf.ones_like(mask)
    rank = len(words.shape)
    for j in range(order):
        pad = [[0, 0]] * (rank - 1) + [[0, j]]
        shifted = tf.pad(words[..., j:], pad)[..., :steps]
        shifted_mask = tf.pad(mask[..., j:], pad)[..., :steps]
        keys = keys + (shifted + 1) * (base ** j)
        valid = tf.logical_and(valid, shifted_mask)
    return tf.where(valid, keys, tf.zeros_like(keys)), valid


def ngram_keys_numpy(words: Sequence[int], order: int, vocab_size: int) -> np.ndarray:
    """The keys of one caption's n-grams (`words` without `<start>`/`<end>`), as `ngram_keys`."""
    base = _check_vocab(vocab_size)
    w = np.asarray(words, np.int64) + 1
    if len(w) < order:
        return np.zeros((0,), np.int64)
    keys = np.zeros(len(w) - order + 1, np.int64)
    for j in range(order):
        keys += w[j:len(w) - order + 1 + j] * base ** j
    return keys


class CiderD:
    """CIDEr-D rewards with fixed document frequencies (see the module docstring).

    Args:
      keys: int64 n-gram keys (`ngram_keys`) seen in the reference corpus.
      document_frequency: for each key, the images whose references contain it.
      num_documents: images in the corpus (`N`).
      vocab_size: tokens in the vocabulary.
      sigma: the length penalty's standard deviation.
    """

    def __init__(self, keys, document_frequency, num_documents: int, vocab_size: int,
                 sigma: float = SIGMA):
        self._base = _check_vocab(vocab_size)   # the n-gram keys' base
        if num_documents < 1:
            raise ValueError("CIDEr-D needs at least one reference image")
        self.vocab_size = int(vocab_size)
        self.num_documents = int(num_documents)
        self.sigma = float(sigma)
        self.log_documents = float(np.log(float(num_documents)))
        keys = np.asarray(keys, np.int64)
        idf = self.log_documents - np.log(np.maximum(1.0, np.asarray(document_frequency,
                                                                    np.float64)))
        self.num_keys = int(len(keys))
        if len(keys):
            self._table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant(keys, tf.int64), tf.constant(idf.astype(np.float32))),
                default_value=np.float32(self.log_documents))
        else:
            self._table = None

    @classmethod
    def from_references(cls, references: Sequence[Sequence[Sequence[int]]], vocab_size: int,
                        sigma: float = SIGMA) -> "CiderD":
        """Document frequencies of a corpus: per image, its references' word ids.

        Args:
          references: per image, a list of captions, each a sequence of word
            ids (no `<start>`, `<end>` or padding).
          vocab_size: tokens in the vocabulary.
          sigma: the length penalty's standard deviation.
        Returns:
          A `CiderD`.
        """
        per_image = []
        for refs in references:
            keys = [ngram_keys_numpy(r, n, vocab_size) for r in refs for n in range(1, ORDERS + 1)]
            keys = np.concatenate(keys) if keys else np.zeros((0,), np.int64)
            per_image.append(np.unique(keys))
        flat = np.concatenate(per_image) if per_image else np.zeros((0,), np.int64)
        keys, counts = np.unique(flat, return_counts=True)
        return cls(keys, counts, len(references), vocab_size, sigma=sigma)

    def idf(self, keys):
        """`log(N) - log(max(1, df))` of int64 keys (unseen n-grams get `log N`)."""
        if self._table is None:
            return tf.fill(tf.shape(keys), tf.constant(self.log_documents, tf.float32))
        return self._table.lookup(keys)

    def __call__(self, candidates, references):
        """CIDEr-D of each candidate against its image's references.

        Args:
          candidates: (batch, K, T) int token ids, K captions per image; words
            end at the first `<end>` (a leading `<start>` and `<pad>` ignored).
          references: (batch, R, T') int token ids, as the records hold them
            (`<start> w.. <end>`, then `<pad>`); all-pad rows are absent
            references and are not averaged over.
        Returns:
          (batch, K) float32 scores (0 for an image without references).
        """
        candidates = tf.convert_to_tensor(candidates)
        references = tf.convert_to_tensor(references)
        ref_present = tf.cast(tf.reduce_any(words_mask(references), -1), tf.float32)  # (b, R)
        num_refs = tf.reduce_sum(ref_present, -1)                            # (batch,)
        total = 0.0
        cand_bigrams = ref_bigrams = None
        cand, refs = _compact(candidates), _compact(references)   # once for every order
        for order in range(1, ORDERS + 1):
            val, cand_count, ref_count = self._similarity(cand, refs, order)
            total = total + val                                            # (batch, K, R)
            if order == 2:
                cand_bigrams, ref_bigrams = cand_count, ref_count
        delta = cand_bigrams[:, :, None] - ref_bigrams[:, None, :]         # (batch, K, R)
        total = total * tf.exp(-tf.square(delta) / (2.0 * self.sigma ** 2))
        summed = tf.reduce_sum(total * ref_present[:, None, :], -1)         # (batch, K)
        return 10.0 * summed / (ORDERS * tf.maximum(num_refs, 1.0))[:, None]

    def _similarity(self, cand, refs, order: int):
        """One order's clipped cosine `(batch, K, R)` and the n-gram counts of both sides.

        `cand` and `refs` are `_compact`ed `(words, mask)` of the candidates
        (b, K, T) and the references (b, R, T').
        """
        ck, cv = _keys(*cand, order, self._base)                           # (b, K, P)
        rk, rv = _keys(*refs, order, self._base)                           # (b, R, Q)
        cvf, rvf = tf.cast(cv, tf.float32), tf.cast(rv, tf.float32)
        c_idf, r_idf = self.idf(ck), self.idf(rk)
        # Term frequency of each position's n-gram in its own caption.
        c_tf = tf.einsum("bkpq,bkq->bkp", tf.cast(tf.equal(ck[..., :, None], ck[..., None, :]),
                                                  tf.float32), cvf)
        r_tf = tf.einsum("brpq,brq->brp", tf.cast(tf.equal(rk[..., :, None], rk[..., None, :]),
                                                  tf.float32), rvf)
        # Count of each candidate position's n-gram in each reference.
        match = tf.cast(tf.equal(ck[:, :, None, :, None], rk[:, None, :, None, :]), tf.float32)
        in_ref = tf.einsum("bkrpq,brq->bkrp", match, rvf)                  # (b, K, R, P)
        # A distinct n-gram occurs tf times among the positions: sums over
        # positions divide by tf (or weigh squares by tf, not tf^2).
        c_norm = tf.sqrt(tf.reduce_sum(cvf * c_tf * tf.square(c_idf), -1))  # (b, K)
        r_norm = tf.sqrt(tf.reduce_sum(rvf * r_tf * tf.square(r_idf), -1))  # (b, R)
        c_vec = (c_tf * c_idf)[:, :, None, :]                              # (b, K, 1, P)
        r_vec = in_ref * c_idf[:, :, None, :]                              # (b, K, R, P)
        numerator = tf.reduce_sum(
            tf.minimum(c_vec, r_vec) * r_vec * (cvf / tf.maximum(c_tf, 1.0))[:, :, None, :], -1)
        denominator = c_norm[:, :, None] * r_norm[:, None, :]
        val = tf.math.divide_no_nan(numerator, denominator)
        return val, tf.reduce_sum(cvf, -1), tf.reduce_sum(rvf, -1)
