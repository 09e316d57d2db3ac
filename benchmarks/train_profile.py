"""Benchmark: where the Trainer's step spends its time, at the demo's sizes, op by op.

    python benchmarks/train_profile.py                         # float32, the demo's sizes
    python benchmarks/train_profile.py --precision mixed_bfloat16 --attention-score general
    python benchmarks/train_profile.py --sizes tutorial --precision mixed_bfloat16 \
        --attention-score general    # benchmarks/train_step.py's step, op by op
    ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/train_profile.py   # oneDNN held to AVX2

Times one Adam step of `ShowAttendTell` (the demo config's decoder: `D =
130`, `L = 64`, LSTM 256, attention 128, embedding 64, dropout 0.1, a batch of
64 captions of 18 tokens) in a `tf.function`, the Trainer's step without
its input pipeline, and then profiles `--profiled-steps` steps with
`tf.profiler` and sums each op type's time on the host's op lines.

Prints the CPU, the step's median milliseconds and examples/s, the op types
by total time (with their share of the summed op time and the count per
step), and one JSON line at the end.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The demo config's decoder and data (pipeline/configs/demo.py; grid 8 x 8 x (128 + 2)).
DEMO = {"regions": 64, "dim": 130, "hidden": 256, "attention": 128, "embedding": 64,
        "vocab": 43, "length": 18, "batch": 64}


def _sizes(name: str) -> dict:
    if name == "tutorial":
        from benchmarks.train_step import SIZES
        return dict(SIZES)
    return dict(DEMO)


def make_step(args):
    """`(step, inputs)`: a compiled Adam step of the decoder and its fixed inputs.

    `--sizes demo`: the demo config's decoder (below); `tutorial`: the step
    `benchmarks/train_step.py` times against the TensorFlow tutorial.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from components.trainer.fused_adam import FusedAdam
    from models.show_attend_tell import ShowAttendTell
    keras.mixed_precision.set_global_policy(args.precision)
    keras.utils.set_random_seed(0)
    if args.sizes == "tutorial":
        from benchmarks.train_step import SIZES, make_data, our_step
        sizes = {**SIZES, "batch": args.batch}
        return (our_step(sizes, jit=False, attention=args.attention, score=args.attention_score),
                make_data(sizes))
    s = DEMO
    model = ShowAttendTell(s["vocab"], {
        "embedding_dim": s["embedding"], "hidden_dim": s["hidden"],
        "attention_dim": s["attention"], "attention": args.attention,
        "attention_score": args.attention_score, "dropout": 0.1,
        "doubly_stochastic_lambda": 0.01, "entropy_lambda": 0.0})
    model.build((None, s["regions"], s["dim"]))
    rng = np.random.default_rng(0)
    b, t = args.batch, s["length"]
    annotations = tf.constant(rng.normal(size=(b, s["regions"], s["dim"])).astype("float32"))
    tokens = tf.constant(np.concatenate(
        [np.ones((b, 1)), rng.integers(4, s["vocab"], (b, t - 2)), np.full((b, 1), 2)],
        1).astype("int32"))
    optimizer = FusedAdam(4e-3)   # the Trainer's Adam
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(a, tok):
        with tf.GradientTape() as tape:
            terms = model.compute_loss_terms(a, tok, training=True, update_baseline=False)
        grads = tape.gradient(terms["loss"], model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return terms["loss"]
    return step, (annotations, tokens)


def time_steps(step, inputs, repeats: int, steps: int) -> list[float]:
    """Seconds per step of `repeats` runs of `steps` steps each, after 3 warm-up steps."""
    for _ in range(3):
        step(*inputs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            loss = step(*inputs)
        float(loss)
        times.append((time.perf_counter() - start) / steps)
    return times


def op_times(logdir: str) -> tuple[collections.Counter, collections.Counter]:
    """(milliseconds, count) per op type over the host plane's op lines of one trace.

    Ops run on the inter-op pool's `tf_Compute` lines; their time includes the
    intra-op (Eigen) threads they wait for, which are not counted again.
    """
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:  # older TensorFlow layouts
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    [path] = sorted(glob.glob(os.path.join(logdir, "plugins/profile/*/*.xplane.pb")))[-1:]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    total, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = plane.event_metadata
        for line in plane.lines:
            if not (line.name.startswith("tf_Compute") or "Ops" in line.name):
                continue  # the executor's op lines; not the Eigen threads inside ops
            for event in line.events:
                name = names[event.metadata_id].name
                if ":" not in name or "::" in name:
                    continue  # the executor's own spans (`ExecutorState::Process`) hold ops
                kind = name.split(":")[-1]
                total[kind] += event.duration_ps / 1e9
                count[kind] += 1
    return total, count


def profile(step, inputs, steps: int) -> dict:
    """Op types by time over `steps` profiled steps: name -> (ms per step, share, per step)."""
    import tensorflow as tf
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(steps):
            loss = step(*inputs)
        float(loss)
        tf.profiler.experimental.stop()
        total, count = op_times(logdir)
    summed = sum(total.values()) or 1.0
    return {name: {"ms_per_step": round(ms / steps, 3), "share": round(ms / summed, 4),
                   "count_per_step": round(count[name] / steps, 1)}
            for name, ms in total.most_common()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="float32",
                        choices=["float32", "mixed_bfloat16", "mixed_float16"])
    parser.add_argument("--attention", default="soft")
    parser.add_argument("--attention-score", default="additive")
    parser.add_argument("--sizes", choices=("demo", "tutorial"), default="demo",
                        help="the demo config's decoder, or benchmarks/train_step.py's step "
                             "at the TensorFlow tutorial's sizes")
    parser.add_argument("--batch", type=int, default=DEMO["batch"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    parser.add_argument("--profiled-steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=15, help="op types printed")
    args = parser.parse_args(argv)
    import numpy as np

    from benchmarks.results import cpuinfo, write_result
    cpu, flags = cpuinfo()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    print(f"CPU: {cpu} (avx2 {'avx2' in flags}, avx512f {'avx512f' in flags}, avx512_bf16 "
          f"{'avx512_bf16' in flags}){'; ONEDNN_MAX_CPU_ISA=' + isa if isa else ''}", flush=True)
    step, inputs = make_step(args)
    times = time_steps(step, inputs, args.repeats, args.steps)
    median = float(np.median(times))
    print(f"step: median {1000 * median:.1f} ms ({args.batch / median:.0f} examples/s), "
          f"runs {[round(1000 * t, 1) for t in times]}", flush=True)
    ops = profile(step, inputs, args.profiled_steps)
    for name, row in list(ops.items())[:args.top]:
        print(f"  {name[:48]:48s} {row['ms_per_step']:8.2f} ms/step  {100 * row['share']:5.1f}%"
              f"  x{row['count_per_step']}")
    result = {"cpu": cpu, "onednn_max_cpu_isa": isa, "precision": args.precision,
              "attention": args.attention, "attention_score": args.attention_score,
              "size_set": args.sizes, "sizes": {**_sizes(args.sizes), "batch": args.batch},
              "step_ms": round(1000 * median, 2),
              "step_ms_all": [round(1000 * t, 2) for t in times],
              "examples_per_s": round(args.batch / median, 1),
              "op_types": dict(list(ops.items())[:args.top])}
    print(json.dumps(result))
    write_result("train_profile", result, argv=argv,
                 variant="-".join(v for v in (
                     "" if args.sizes == "demo" else args.sizes,
                     "" if args.attention_score == "additive" else args.attention_score,
                     args.precision, isa.lower()) if v))
    return result


if __name__ == "__main__":
    main()
