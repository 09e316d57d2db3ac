"""How many threads one TensorFlow op gets in `captioner serve` when no flag says.

`--tensorflow_intra_op_parallelism` unset (TF Serving's flag; 0 keeps
TensorFlow's choice, as there) lets the server choose before TensorFlow
starts its thread pools, which cannot change afterwards:

- **one thread per op** when every model it is about to serve records an
  encoder of at most `SMALL_ENCODER_GFLOPS` per image. A small captioner's
  served time is mostly the beam search's small ops, where handing an op's
  work to pool threads costs more than it gains.
- **TensorFlow's default** (one thread per CPU) when any model's encoder is
  larger, or records no cost (an export not written by the Exporter, or no
  version on disk yet): larger encoders' convolutions use the threads.

Measured with `benchmarks/serving_threads.py` on 2 cores (one thread per op
against TensorFlow's default, whole export, beam 3): the demo's small CNN
(0.07 GFLOPs) 1.35x faster, MobileNetV2 (0.61) 1.31x faster, a 128-pixel
small CNN (1.2) 0.90x, ResNet50 (7.8) 0.91x (docs/PERFORMANCE.md, Serving).

The cost is the `encoder_gflops` the Exporter writes into each SavedModel's
export record (`assets.extra/captioner_export.json`), read from the newest
version folder of each model. Reading it starts no TensorFlow runtime.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from serving.signature.export import EXPORT_RECORD

# Encoders up to this many GFLOPs per image are served with one thread per op.
SMALL_ENCODER_GFLOPS = 1.0

_VERSION_DIR = re.compile(r"^\d+$")


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op pool size the server sets (0: TensorFlow's choice) and why."""
    intra_op: int
    reason: str


def choose_intra_op(flag: Optional[int], base_paths: Sequence[str]) -> ThreadChoice:
    """The intra-op threads for `--tensorflow_intra_op_parallelism=flag` (None: unset).

    Args:
      flag: the flag's value; None when not given.
      base_paths: the base path of every model the server starts with.
    """
    if flag is not None:
        return ThreadChoice(flag, "set by --tensorflow_intra_op_parallelism")
    if not base_paths:
        return ThreadChoice(0, "no models to read an encoder cost from")
    costs = []
    for base in base_paths:
        gflops = newest_encoder_gflops(base)
        if gflops is None:
            return ThreadChoice(0, f"{base}: no version records its encoder's cost "
                                   f"({EXPORT_RECORD} encoder_gflops)")
        costs.append(gflops)
    largest = max(costs)
    if largest <= SMALL_ENCODER_GFLOPS:
        return ThreadChoice(1, f"every encoder is small (at most {largest:.3g} GFLOPs per "
                               f"image; one thread per op up to {SMALL_ENCODER_GFLOPS:g})")
    return ThreadChoice(0, f"an encoder of {largest:.3g} GFLOPs per image (over "
                           f"{SMALL_ENCODER_GFLOPS:g}) uses TensorFlow's pools")


def newest_encoder_gflops(base_path: str) -> Optional[float]:
    """`encoder_gflops` from the export record of the newest version under `base_path`."""
    import tensorflow as tf  # gfile reads local and remote paths; it starts no runtime
    try:
        entries = tf.io.gfile.listdir(base_path)
    except tf.errors.OpError:
        return None
    versions = sorted((int(e.rstrip("/")) for e in entries if _VERSION_DIR.match(e.rstrip("/"))),
                      reverse=True)
    for version in versions:
        folder = os.path.join(base_path, str(version))
        if not tf.io.gfile.exists(os.path.join(folder, "saved_model.pb")):
            continue
        try:
            with tf.io.gfile.GFile(os.path.join(folder, EXPORT_RECORD), "r") as f:
                record = json.loads(f.read())
        except (tf.errors.OpError, ValueError):
            return None
        value = record.get("encoder_gflops") if isinstance(record, dict) else None
        return float(value) if isinstance(value, (int, float)) and value >= 0 else None
    return None
