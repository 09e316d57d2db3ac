"""Benchmark: training throughput of the soft-attention decoder against the TF tutorial's.

    python benchmarks/train_step.py                       # about 3 min on 2 CPU cores
    python benchmarks/train_step.py --steps 2 --repeats 2 # quicker
    python benchmarks/train_step.py --jit on              # XLA for our step
    python benchmarks/train_step.py --precision float32   # both steps in float32
    python benchmarks/train_step.py --baseline-precision float32  # the tutorial as published
    python benchmarks/train_step.py --attention-score general     # Luong's bilinear score
    python benchmarks/train_step.py --attention glimpse           # or spatial_transformer, hard

`--precision auto` (the default, as `train.mixed_precision`) picks
`mixed_bfloat16` where the CPU or GPU multiplies bfloat16 natively and float32
elsewhere (components/contract/precision.py); both models then train in that policy.
`--baseline-precision float32` trains the tutorial in float32 instead, as it
is published and as its users run it (its code sets no policy): `ratio` is
then our speed-up over that.

Both models train at the tutorial's sizes: embedding 256, hidden/units 512,
64 x 2048 annotations, vocabulary 5000, batch 64, captions of 20 tokens
(`<start>`, 18 words, `<end>`: 19 predicted tokens per caption), Adam.

* ours: `ShowAttendTell` (soft attention, gate, attention MLP 512 wide, as
  the tutorial's attention), one `tf.function` step on
  `compute_loss_terms` (masked NLL + doubly stochastic penalty);
  `--attention` and `--attention-score` pick another attention type or
  region score (`model.attention`, `model.attention_score`;
  docs/attention.md), at the same sizes;
* baseline: `benchmarks/baselines/tf_tutorial_captioner.py`, the tutorial's
  `train_step` (a Python loop over time steps inside `tf.function` that
  recomputes the feature projection at every step).

Runs alternate (ours, baseline, matmul peak, ours, ...) so that a change of
machine load hits all three; figures are medians over `--repeats` of the
mean step time over `--steps` steps. The achieved FLOP rate counts matmul
FLOPs only (forward and backward, `model_flops`) and is compared with the
rate of a large square matmul timed in the same run, in the same precision.

Prints one JSON line at the end; `ratio` is ours / baseline tokens per second
(wall clock); `ratio_cpu_time` the same per CPU-second of the process, the
steadier figure when other jobs share the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from benchmarks.results import write_result  # noqa: E402

SIZES = dict(batch=64, length=20, regions=64, dim=2048, embedding=256, hidden=512,
             attention=512, vocab=5000)


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_has_bf16() -> bool:
    """True when the CPU has native bfloat16 matmul instructions (AVX512-BF16 or AMX)."""
    from components.contract.precision import BF16_CPU_FLAGS, cpu_flags
    return bool(set(BF16_CPU_FLAGS) & cpu_flags())


def model_flops(sizes: dict, kind: str = "soft", score: str = "additive") -> int:
    """Matmul FLOPs of one training step of our decoder (forward + backward).

    A matmul of (m, k) x (k, n) costs 2mkn forward and twice that backward
    (input and weight gradients), except where its input is data (the
    annotations), which needs no gradient. `length` tokens give `length - 1`
    steps. `kind` and `score`: the attention type and region score; the
    location-wise types use a 3x3 retina of 2 patches and a 4-channel map.
    `sizes`: as `SIZES`.
    """
    b, t, l, d, e, n, a, v = (sizes["batch"], sizes["length"] - 1, sizes["regions"],
                              sizes["dim"], sizes["embedding"], sizes["hidden"],
                              sizes["attention"], sizes["vocab"])
    lstm = 2 * b * d * 4 * n + 2 * b * n * 4 * n                     # LSTM: z W_z, h U
    context = 2 * 2 * b * l * d              # sum_i alpha_i a_i: forward + d alpha
    if kind == "glimpse":
        samples, map_width = 18, 4 * l
        attend = (2 * b * n * a + 2 * b * a * 2                     # location network
                  + 2 * b * samples * l * a                         # retina samples of a W_v
                  + 2 * b * samples * a * a + 2 * b * 2 * a        # retina and where layers
                  + 2 * b * 2 * a * d + 2 * b * n)                  # glimpse layer, baseline
        context = 0
        projection = 2 * (2 * b * l * d * a + 2 * b * l * d * 4 + 2 * b * map_width * a)
    elif kind == "spatial_transformer":
        attend = 2 * b * n * a + 2 * b * a * 3 + 2 * b * n          # location network, f_beta
        projection = 2 * (2 * b * l * d * 4 + 2 * b * 4 * l * a)
    elif score == "general":
        attend = 2 * b * l * n + 2 * b * n                          # (a_i^T W) . h, f_beta
        # a W forward; W's gradient hoisted out of the loop (models.hoisted_gradients)
        projection = 2 * b * l * d * n + 2 * t * b * l * d + 2 * t * b * d * n
    elif score == "dot":
        attend, projection = 2 * b * n * d * (d != n) + 2 * b * l * d + 2 * b * n, 0
    else:  # additive, concat
        attend = (2 * b * n * a      # W_h h_{t-1}
                  + 2 * b * l * a    # w . tanh(.)
                  + 2 * b * n)       # f_beta(h)
        projection = 2 * (2 * b * l * d * a)     # W_a a (once), forward and weight gradient
    per_step = 3 * (attend + lstm) + context
    outside = 3 * (2 * b * t * e * 4 * n      # E y W_e (all steps)
                   + 2 * b * t * n * e        # L_h h
                   + 2 * b * t * d * e        # L_z z
                   + 2 * b * t * e * v)       # L_o
    outside += projection + 2 * (2 * 2 * b * d * n)   # the attention's projection, h_0, c_0 MLPs
    return t * per_step + outside


def baseline_flops(batch, length, regions, dim, embedding, hidden, vocab, **_):
    """Matmul FLOPs of one training step of the tutorial's model (forward + backward)."""
    b, t, l, d, e, u, v = batch, length - 1, regions, dim, embedding, hidden, vocab
    per_step = (2 * b * l * e * u        # W1(features), recomputed every step
                + 2 * b * u * u          # W2(hidden)
                + 2 * b * l * u          # V(score)
                + 2 * b * (2 * e) * 3 * u + 2 * b * u * 3 * u   # GRU
                + 2 * b * u * u          # fc1
                + 2 * b * u * v)         # fc2
    per_step = 3 * per_step + 2 * 2 * b * l * e   # + attention-weighted sum (fwd + grads)
    return t * per_step + 2 * (2 * b * l * d * e)  # the encoder's Dense on the features


def make_data(sizes, seed=0):
    """Random annotations and full-length captions (no padding)."""
    import tensorflow as tf
    rng = np.random.default_rng(seed)
    b, t = sizes["batch"], sizes["length"]
    annotations = rng.normal(size=(b, sizes["regions"], sizes["dim"])).astype("float32")
    captions = rng.integers(4, sizes["vocab"], size=(b, t)).astype("int32")
    captions[:, 0], captions[:, -1] = 1, 2
    return tf.constant(annotations), tf.constant(captions)


def our_step(sizes, jit: bool, attention: str = "soft", score: str = "additive"):
    """A built `ShowAttendTell` (soft attention by default) and its `tf.function` training step."""
    import tensorflow as tf

    from components.trainer.fused_adam import FusedAdam
    from models.decoder_options import DecoderOptions
    from models.show_attend_tell import ShowAttendTell
    options = DecoderOptions(embedding_dim=sizes["embedding"], hidden_dim=sizes["hidden"],
                             attention_dim=sizes["attention"], attention=attention,
                             attention_score=score)
    model = ShowAttendTell(sizes["vocab"], options, seed=0)
    model.build((None, sizes["regions"], sizes["dim"]))
    optimizer = FusedAdam(1e-3)   # the Trainer's Adam (components/trainer/model_setup.py)
    optimizer.build(model.trainable_variables)

    @tf.function(jit_compile=jit)
    def step(annotations, captions):
        with tf.GradientTape() as tape:
            loss = model.compute_loss_terms(annotations, captions, training=True)["loss"]
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return step


def baseline_step():
    """The tutorial's encoder, decoder and `train_step`."""
    import keras

    from benchmarks.baselines import tf_tutorial_captioner as tutorial
    encoder, decoder = tutorial.build()
    step = tutorial.make_train_step(encoder, decoder, keras.optimizers.Adam(1e-3))
    return lambda annotations, captions: step(annotations, captions)[0]


def matmul_peak(precision: str, n: int = 2048, reps: int = 4):
    """A function returning the GFLOP/s of `reps` chained (n, n) matmuls in `precision`."""
    import tensorflow as tf
    dtype = tf.bfloat16 if precision == "mixed_bfloat16" else (
        tf.float16 if precision == "mixed_float16" else tf.float32)
    a = tf.cast(tf.random.normal((n, n), stddev=n ** -0.5), dtype)
    b = tf.cast(tf.random.normal((n, n)), dtype)

    @tf.function
    def chain():
        x = b
        for _ in range(reps):
            x = tf.matmul(a, x)
        return tf.reduce_sum(tf.cast(x[0, :1], tf.float32))

    chain()

    def measure():
        start = time.perf_counter()
        chain().numpy()
        return 2 * n ** 3 * reps / (time.perf_counter() - start) / 1e9

    return measure


def time_steps(step, annotations, captions, steps: int) -> tuple[float, float]:
    """Mean wall seconds and mean process CPU seconds per step over `steps` steps."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        loss = step(annotations, captions)
    float(loss)
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after tracing")
    parser.add_argument("--jit", choices=("off", "on"), default="off",
                        help="XLA-compile our step (off: measured faster on this CPU)")
    parser.add_argument("--precision", default="auto",
                        choices=("auto", "float32", "mixed_bfloat16", "mixed_float16"),
                        help="the dtype policy of both steps (auto: native bfloat16 if any)")
    parser.add_argument("--baseline-precision", default="same", choices=("same", "float32"),
                        help="the baseline's dtype policy (same: the one --precision picks)")
    parser.add_argument("--batch", type=int, default=SIZES["batch"])
    parser.add_argument("--attention", default="soft",
                        choices=("soft", "hard", "glimpse", "spatial_transformer"),
                        help="our attention type (model.attention)")
    parser.add_argument("--attention-score", default="additive",
                        choices=("additive", "general", "dot", "concat"),
                        help="our region score, soft and hard (model.attention_score)")
    return parser


def _measure(args, steps: dict, data: tuple, peaks: dict) -> dict:
    """Alternating timed repeats: {"first_call_s", "wall", "cpu", "peak"} per step / policy."""
    out = {"first_call_s": {}, "wall": {name: [] for name in steps},
           "cpu": {name: [] for name in steps}, "peak": {policy: [] for policy in peaks}}
    for name, step in steps.items():
        start = time.perf_counter()
        float(step(*data))
        out["first_call_s"][name] = round(time.perf_counter() - start, 1)
        for _ in range(args.warmup):
            float(step(*data))
    for r in range(args.repeats):
        for name, step in steps.items():
            wall, cpu = time_steps(step, *data, args.steps)
            out["wall"][name].append(wall)
            out["cpu"][name].append(cpu)
        for policy, peak in peaks.items():
            out["peak"][policy].append(statistics.median(peak() for _ in range(3)))
        matmul = ", ".join(f"{policy} matmul {gflops[-1]:.1f} GFLOP/s"
                           for policy, gflops in out["peak"].items())
        print(f"repeat {r + 1}/{args.repeats}: ours {out['wall']['ours'][-1]:.3f} s/step, "
              f"baseline {out['wall']['baseline'][-1]:.3f} s/step, {matmul}",
              file=sys.stderr, flush=True)
    return out


def _step_figures(flops: float, walls: list, cpus: list, tokens: int, peak: float) -> dict:
    step_s, cpu_s = statistics.median(walls), statistics.median(cpus)
    gflops = flops / step_s / 1e9
    return {"step_s": round(step_s, 4), "tokens_per_s": round(tokens / step_s, 1),
            "step_s_all": [round(x, 4) for x in walls],
            "cpu_s_per_step": round(cpu_s, 4), "tokens_per_cpu_s": round(tokens / cpu_s, 1),
            "gflop_per_step": round(flops / 1e9, 2), "achieved_gflops": round(gflops, 1),
            "fraction_of_peak": round(gflops / peak, 3)}


def main(argv=None):
    args = _parser().parse_args(argv)
    import keras
    import tensorflow as tf

    from components.contract.precision import resolve
    chosen = resolve(args.precision)
    print(f"precision {chosen.policy} ({chosen.requested}: {chosen.reason})",
          file=sys.stderr, flush=True)
    sizes = dict(SIZES, batch=args.batch)
    tokens = sizes["batch"] * (sizes["length"] - 1)
    baseline_policy = chosen.policy if args.baseline_precision == "same" else "float32"
    keras.mixed_precision.set_global_policy(chosen.policy)
    ours = our_step(sizes, jit=args.jit == "on", attention=args.attention,
                    score=args.attention_score)
    keras.mixed_precision.set_global_policy(baseline_policy)
    baseline = baseline_step()
    keras.mixed_precision.set_global_policy("float32")
    peaks = {policy: matmul_peak(policy)
             for policy in dict.fromkeys([chosen.policy, baseline_policy])}
    runs = _measure(args, {"ours": ours, "baseline": baseline}, make_data(sizes), peaks)
    peak_gflops = {policy: statistics.median(g) for policy, g in runs["peak"].items()}
    result = {"benchmark": "train_step", "machine": cpu_model(), "cpus": os.cpu_count(),
              "tensorflow": tf.__version__, "precision": chosen.policy,
              "precision_requested": chosen.requested, "precision_reason": chosen.reason,
              "baseline_precision": baseline_policy,
              "bf16_native": cpu_has_bf16(), "jit_compile": args.jit == "on",
              "attention": args.attention, "attention_score": args.attention_score,
              "sizes": sizes, "tokens_per_step": tokens, "steps": args.steps,
              "repeats": args.repeats, "first_call_s": runs["first_call_s"],
              "peak_matmul_gflops": round(peak_gflops[chosen.policy], 1)}
    if baseline_policy != chosen.policy:
        result["baseline_peak_matmul_gflops"] = round(peak_gflops[baseline_policy], 1)
    for name, flops, policy in (
            ("ours", model_flops(sizes, args.attention, args.attention_score), chosen.policy),
            ("baseline", baseline_flops(**sizes), baseline_policy)):
        result[name] = _step_figures(flops, runs["wall"][name], runs["cpu"][name], tokens,
                                     peak_gflops[policy])
    result["ratio"] = round(result["ours"]["tokens_per_s"] / result["baseline"]["tokens_per_s"], 3)
    # Under a shared CPU, the ratio of CPU seconds is the steadier figure.
    result["ratio_cpu_time"] = round(result["ours"]["tokens_per_cpu_s"]
                                     / result["baseline"]["tokens_per_cpu_s"], 3)
    print(json.dumps(result))
    write_result("train_step", result, argv=argv,
                 variant=f"{args.attention}-{args.attention_score}-{chosen.policy}")
    return result


if __name__ == "__main__":
    main()
