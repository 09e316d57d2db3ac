"""Tiny sizes and helpers shared by the models tests (width <= 16, batch 2, 3x3 grid: fast on 2 CPU cores)."""
from __future__ import annotations

import contextlib

import keras
import numpy as np

from models.show_attend_tell import ShowAttendTell

VOCAB, EMBED, HIDDEN, UNITS, DIM, REGIONS, BATCH = 20, 8, 16, 8, 16, 9, 2

# Two captions: <start> w.. <end> <pad>.., as compute_loss_terms takes them.
CAPTIONS = np.array([[1, 5, 6, 7, 2, 0],
                     [1, 8, 9, 2, 0, 0]], dtype="int32")


def annotations(seed=0, batch=BATCH):
    """(batch, 9, 16) float32 random annotation grids."""
    return np.random.default_rng(seed).normal(size=(batch, REGIONS, DIM)).astype("float32")


def hidden(seed=1, batch=BATCH):
    """(batch, 16) float32 random LSTM states."""
    return np.random.default_rng(seed).normal(size=(batch, HIDDEN)).astype("float32")


def make_model(attention="soft", seed=0, **kwargs):
    """A built tiny `ShowAttendTell` with deterministic weights."""
    keras.utils.set_random_seed(seed)
    config = dict(vocab_size=VOCAB, embedding_dim=EMBED, hidden_dim=HIDDEN,
                  attention_dim=UNITS, attention=attention, seed=seed)
    config.update(kwargs)
    model = ShowAttendTell(**config)
    model.build((None, REGIONS, DIM))
    return model


@contextlib.contextmanager
def policy(name):
    """Sets the global dtype policy for the block, restoring float32 after."""
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")
