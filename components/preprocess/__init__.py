"""Preprocess (Apache Beam): Examples + Encoder -> `Annotations`, `Vocabulary`.

| module | job |
|---|---|
| `stage` | the stage entry `run(ctx)`, the Beam pipeline and the vocabulary |
| `transforms` | the Beam graph: parse, tokenize, decode, encode, write; the vocabulary |
"""
from components.preprocess.stage import run

__all__ = ["run"]
