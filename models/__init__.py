"""The Show, Attend and Tell model: encoders, attention layers, decoder, losses and decoding graphs.

Pure Keras 3 (TensorFlow backend); knows nothing about pipelines or serving.

The public names below load lazily, so that `models.text` (tokenization, used
by the Beam preprocessing) does not import TensorFlow. Importing
`models.show_attend_tell` (or touching `models.ShowAttendTell`) registers the
layers with Keras, which `keras.saving.load_model` needs for `.keras` files.
"""
import importlib

_EXPORTS = {
    "SoftAttention": "models.soft_attention",
    "HardAttention": "models.hard_attention",
    "ShowAttendTell": "models.show_attend_tell",
    "greedy_decode": "models.decoding",
    "beam_search": "models.decoding",
    "attention_to_grid": "models.decoding",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
