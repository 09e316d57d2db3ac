"""Tiny sizes and helpers shared by the models tests.

Sizes are kept tiny (width <= 16, batch 2, a 3x3 grid, vocabulary <= 30) so
that the default suite stays within minutes on 2 CPU cores.
"""
from __future__ import annotations

import keras
import numpy as np

from models.show_attend_tell import ShowAttendTell
from tests.models.layer_contract import policy  # noqa: F401  (re-exported for the models tests)

VOCAB, EMBED, HIDDEN, UNITS, DIM, REGIONS, BATCH = 20, 8, 16, 8, 16, 9, 2

# The trainable weights of an attention layer (AttentionScorer and its subclasses).
SCORER_WEIGHTS = {"annotation_projection/kernel": (DIM, UNITS),   # W_a
                  "annotation_projection/bias": (UNITS,),        # b
                  "hidden_projection/kernel": (HIDDEN, UNITS),   # W_h
                  "score_kernel": (UNITS,)}                      # w

# Two captions: <start> w.. <end> <pad>.., as compute_loss_terms takes them.
CAPTIONS = np.array([[1, 5, 6, 7, 2, 0],
                     [1, 8, 9, 2, 0, 0]], dtype="int32")


def annotations(seed=0, batch=BATCH):
    """(batch, 9, 16) float32 random annotation grids."""
    return np.random.default_rng(seed).normal(size=(batch, REGIONS, DIM)).astype("float32")


def hidden(seed=1, batch=BATCH):
    """(batch, 16) float32 random LSTM states."""
    return np.random.default_rng(seed).normal(size=(batch, HIDDEN)).astype("float32")


def make_model(attention="soft", seed=0, vocab_size=VOCAB, **kwargs):
    """A built tiny `ShowAttendTell` with deterministic weights."""
    keras.utils.set_random_seed(seed)
    options = dict(embedding_dim=EMBED, hidden_dim=HIDDEN, attention_dim=UNITS,
                   attention=attention)
    options.update(kwargs)
    model = ShowAttendTell(vocab_size, options, seed=seed)
    model.build((None, REGIONS, DIM))
    return model
