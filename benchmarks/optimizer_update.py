"""Benchmark: one Adam update of the decoder's weights, Keras's Adam against `FusedAdam`.

    python benchmarks/optimizer_update.py                       # about 30 s on 2 CPU cores
    python benchmarks/optimizer_update.py --precision float32   # float32 weights and gradients

The Trainer's Adam (`components/trainer/fused_adam.py`) makes Keras Adam's
update with TensorFlow's fused `ResourceApplyAdam` kernel, one pass per
variable instead of about ten element-wise ops. This times
`optimizer.apply_gradients` in a `tf.function` on the trainable variables
of `ShowAttendTell` at the TensorFlow tutorial's sizes (those of
`benchmarks/train_step.py`: 12.1 M parameters with `general` scores),
with fixed dense gradients, the two optimizers alternating; medians over
`--repeats` of the mean over `--steps` updates.

Prints the CPU and its flags, the two medians, and one JSON line at the end
(`ratio` = Keras's time over the fused one's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.results import host, write_result  # noqa: E402
from benchmarks.train_step import SIZES  # noqa: E402


def _updates(args):
    """`{name: (optimizer, update function)}` for Keras's Adam and `FusedAdam`."""
    import keras
    import tensorflow as tf

    from components.trainer.fused_adam import FusedAdam
    from models.decoder_options import DecoderOptions
    from models.show_attend_tell import ShowAttendTell
    keras.mixed_precision.set_global_policy(args.precision)
    s = SIZES
    options = DecoderOptions(embedding_dim=s["embedding"], hidden_dim=s["hidden"],
                             attention_dim=s["attention"], attention_score=args.attention_score)
    model = ShowAttendTell(s["vocab"], options, seed=0)
    model.build((None, s["regions"], s["dim"]))
    variables = model.trainable_variables
    grads = [tf.random.stateless_normal(v.shape, seed=(i, 0)) * 1e-3
             for i, v in enumerate(variables)]
    updates = {}
    for name, cls in (("keras", keras.optimizers.Adam), ("fused", FusedAdam)):
        optimizer = cls(1e-3)
        optimizer.build(variables)
        update = tf.function(lambda o=optimizer: o.apply_gradients(zip(grads, variables, strict=True)))
        for _ in range(3):
            update()
        updates[name] = (optimizer, update)
    params = sum(int(v.shape.num_elements()) for v in variables)
    return updates, params, len(variables)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="mixed_bfloat16",
                        help="the dtype policy (float32 weights either way)")
    parser.add_argument("--attention-score", default="general")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5, help="timed updates per repeat")
    args = parser.parse_args(argv)
    machine = host()
    print(f"CPU: {machine['cpu']} ({', '.join(f'{k} {v}' for k, v in machine['flags'].items())})",
          flush=True)
    updates, params, count = _updates(args)
    times = {name: [] for name in updates}
    for _ in range(args.repeats):
        for name, (optimizer, update) in updates.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                update()
            int(optimizer.iterations.numpy())
            times[name].append((time.perf_counter() - start) / args.steps)
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, value in medians.items():
        print(f"{name:6s} Adam update: {1e3 * value:.2f} ms", flush=True)
    result = {"cpu": machine["cpu"], "precision": args.precision,
              "attention_score": args.attention_score, "parameters": params,
              "variables": count, "keras_ms": round(1e3 * medians["keras"], 3),
              "fused_ms": round(1e3 * medians["fused"], 3),
              "ratio": round(medians["keras"] / medians["fused"], 3)}
    print(json.dumps(result), flush=True)
    write_result("optimizer_update", result, argv=argv, variant=args.precision)
    return result


if __name__ == "__main__":
    main()
