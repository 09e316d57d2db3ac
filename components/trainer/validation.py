"""Validation during training: loss, BLEU-4, CIDEr-D, attention maps, and the best-model rule.

The chief computes the metrics on a held-in-memory `EvalSet`
(components/trainer/train_data.py); `improved` decides whether an epoch's value is a
new best (which resets early stopping's patience).
"""
from __future__ import annotations

import math

import numpy as np

from components.contract.config import EARLY_STOPPING_METRICS as METRICS
from components.contract.scoring import nonempty
from models.text import decode

# Validation images whose attention maps go to TensorBoard.
ATTENTION_IMAGES = 2
ATTENTION_TILE = 64
# The default smallest validation improvement that counts (`train.min_delta`).
MIN_DELTA = 1e-4


def improved(metric: str, value: float, best: float, min_delta: float = MIN_DELTA) -> bool:
    """Better by more than `min_delta` (relative for the loss, absolute for BLEU and CIDEr).

    Args:
      metric: `val_loss` (lower is better), `bleu4` or `cider`.
      value: this epoch's value.
      best: the best so far (NaN: none yet).
      min_delta: `train.min_delta`.
    Returns:
      Whether `value` is a new best (which also resets early stopping's patience).
    """
    if math.isnan(best):
        return True
    if metric == "val_loss":
        return value < best - min_delta * abs(best)
    return value > best + min_delta


class Validator:
    """Validation metrics on a held-in-memory `EvalSet` (the chief computes them).

    `val_loss`: per-token NLL of every (image, reference caption) pair, no
    dropout, expected attention. `bleu4`: corpus BLEU-4 (coco-caption
    `Bleu`, whitespace tokens) of greedy captions against all references;
    `cider`: their CIDEr-D (coco-caption `Cider`, document frequencies of
    the validation references).
    """

    def __init__(self, model, eval_set, id_to_word, batch_size: int = 128):
        import tensorflow as tf

        from models.decoding import greedy_decode
        self.model = model
        self.eval_set = eval_set
        self.id_to_word = list(id_to_word)
        self.batch_size = max(1, batch_size)
        self.pair_index, self.pair_tokens = eval_set.pairs()
        # Longest reference (words + <end>) plus slack.
        self.max_length = int(max(self.pair_tokens.shape[1] - 1, 1)) + 2

        regions, dim = eval_set.annotations.shape[1:]
        grids = tf.TensorSpec([None, regions, dim], tf.float32)

        @tf.function(input_signature=[grids, tf.TensorSpec([None, None], tf.int32)],
                     autograph=False)
        def loss_sums(annotations, tokens):
            terms = model.compute_loss_terms(annotations, tokens, training=False)
            return tf.reduce_sum(terms["example_nll"]), terms["num_tokens"]

        @tf.function(input_signature=[grids], autograph=False)
        def decode_batch(annotations):
            return greedy_decode(model, annotations, self.max_length)

        self._loss_sums, self._decode = loss_sums, decode_batch

    def metric(self, name: str) -> float:
        """One of `METRICS` by name."""
        if name not in METRICS:
            raise ValueError(f"no validation metric {name!r}; one of {METRICS}")
        return getattr(self, name)()

    def val_loss(self) -> float:
        """Per-token negative log-likelihood over every reference caption."""
        nll, tokens = 0.0, 0.0
        grids = self.eval_set.annotations
        for start in range(0, len(self.pair_index), self.batch_size):
            rows = slice(start, start + self.batch_size)
            s, n = self._loss_sums(grids[self.pair_index[rows]], self.pair_tokens[rows])
            nll += float(s)
            tokens += float(n)
        return nll / max(tokens, 1.0)

    def greedy(self, annotations) -> dict:
        return {k: v.numpy() for k, v in self._decode(annotations).items()}

    def captions(self) -> list[str]:
        """Greedy captions of every validation image."""
        out = []
        grids = self.eval_set.annotations
        for start in range(0, len(grids), self.batch_size):
            result = self.greedy(grids[start:start + self.batch_size])
            out += [decode(row, self.id_to_word) for row in result["tokens"]]
        return out

    def _greedy_and_references(self):
        hyps = self.captions()
        gts = {i: list(refs) for i, refs in enumerate(self.eval_set.references)}
        res = {i: [nonempty(h)] for i, h in enumerate(hyps)}
        return gts, res

    def bleu4(self) -> float:
        """Corpus BLEU-4 of greedy captions (whitespace tokenization, no Java)."""
        from pycocoevalcap.bleu.bleu import Bleu
        score, _ = Bleu(4).compute_score(*self._greedy_and_references(), verbose=0)
        return float(score[3])

    def cider(self) -> float:
        """CIDEr-D of greedy captions (whitespace tokenization, no Java)."""
        from pycocoevalcap.cider.cider import Cider
        score, _ = Cider().compute_score(*self._greedy_and_references())
        return float(score)

    def attention_images(self, grid_shape, count: int = ATTENTION_IMAGES):
        """[(caption, (1, tile, tile * words, 1) float32 image)] for the first images.

        Each word's alpha is reshaped to H x W, scaled to its maximum and
        upsampled (nearest) to a tile; the tiles of a caption form one strip.
        """
        import tensorflow as tf
        h, w, _ = (int(v) for v in grid_shape)
        grids = self.eval_set.annotations[:count]
        if len(grids) == 0:
            return []
        result = self.greedy(grids)
        images = []
        for row in range(len(grids)):
            n = max(int(result["lengths"][row]), 1)
            alpha = result["attention"][row, :n].reshape(n, h, w, 1)
            alpha = alpha / np.maximum(alpha.max(axis=(1, 2, 3), keepdims=True), 1e-9)
            tiles = tf.image.resize(alpha, (ATTENTION_TILE, ATTENTION_TILE), method="nearest")
            strip = tf.concat(tf.unstack(tiles), axis=1)[None]   # (1, tile, tile * n, 1)
            images.append((decode(result["tokens"][row], self.id_to_word), strip))
        return images
