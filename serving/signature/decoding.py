"""How the exported graph decodes: `Decoding`, kept free of NumPy and TensorFlow.

The pipeline's config takes `eval`'s decoding defaults from here, so this
module must stay cheap to import (every `captioner` command loads the config).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decoding:
    """How the exported graph decodes (see `CaptionerModule`).

    Attributes:
      beam_size: 1 = greedy decoding.
      max_length: maximum caption length in words (with `<end>`).
      length_normalization: beam search length penalty alpha (0 = off).
    """
    beam_size: int = 3
    max_length: int = 30
    length_normalization: float = 0.0
