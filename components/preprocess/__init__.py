"""Preprocess (Apache Beam): Examples + Encoder -> `Annotations`, `Vocabulary`.

| module | job |
|---|---|
| `stage` | the stage entry `run(ctx)`, the Beam pipeline and the vocabulary |
| `beam_utils` | the Beam transforms: the encoder's `ModelHandler`, runner options, sharded writes |
"""
from components.preprocess.stage import run

__all__ = ["run"]
