"""Benchmark: single-image caption latency, in-graph decoding against the tutorial's eager loop.

    python benchmarks/decode.py                   # about 1 min on 2 CPU cores
    python benchmarks/decode.py --runs 5          # quicker
    python benchmarks/decode.py --precision mixed_bfloat16   # also its float32 twin
    python benchmarks/decode.py --attention glimpse          # another attention type
    python benchmarks/decode.py --attention-score general    # another region score

At the tutorial's sizes (embedding 256, hidden/units 512, 64 x 2048
annotations, vocabulary 5000), one image, up to `--max-length` 20 words:

* ours: `models.decoding.greedy_decode` and `beam_search(beam_size=3)` on a
  soft-attention `ShowAttendTell` (`--attention`, `--attention-score`: another
  type or score, docs/attention.md), each one `tf.function` (one graph call
  per caption: the whole loop runs in TensorFlow);
* baseline: `benchmarks/baselines/tf_tutorial_captioner.py`'s `evaluate`,
  the tutorial's eager step-by-step greedy loop.

Both models are untrained (random weights), so neither emits `<end>` early
and every run decodes `--max-length` words; the JSON reports the lengths to
show that. Runs alternate (ours greedy, ours beam, baseline, ...); figures are
medians over `--runs`.

`--precision mixed_bfloat16` (or `mixed_float16`) builds ours in that
policy and also times its float32 twin (`ShowAttendTell.as_float32()`, the
same weights), as the Trainer saves it: `twin_speedup` is the mixed model's
greedy latency over the twin's.

Prints one JSON line at the end; `ratio` is baseline latency / our greedy
latency.
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

import numpy as np  # noqa: E402

from benchmarks.results import write_result  # noqa: E402
from benchmarks.train_step import SIZES, cpu_model  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    """The command line's options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs of each (median)")
    parser.add_argument("--max-length", type=int, default=20)
    parser.add_argument("--beam-size", type=int, default=3)
    parser.add_argument("--precision", default="float32",
                        choices=("float32", "mixed_bfloat16", "mixed_float16"),
                        help="Keras policy of our model (not float32: its float32 twin too)")
    parser.add_argument("--attention", default="soft",
                        choices=("soft", "hard", "glimpse", "spatial_transformer"),
                        help="our attention type (model.attention)")
    parser.add_argument("--attention-score", default="additive",
                        choices=("additive", "general", "dot", "concat"),
                        help="our region score, soft and hard (model.attention_score)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)

    import keras
    import tensorflow as tf

    from benchmarks.baselines import tf_tutorial_captioner as tutorial
    from models.decoding import beam_search, greedy_decode
    from models.show_attend_tell import ShowAttendTell

    s = SIZES
    rng = np.random.default_rng(0)
    image = tf.constant(rng.normal(size=(1, s["regions"], s["dim"])).astype("float32"))
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(args.precision)
    try:
        model = ShowAttendTell(s["vocab"], {
            "embedding_dim": s["embedding"], "hidden_dim": s["hidden"],
            "attention_dim": s["attention"], "attention": args.attention,
            "attention_score": args.attention_score}, seed=0)
        model.build((None, s["regions"], s["dim"]))
    finally:
        keras.mixed_precision.set_global_policy(previous)
    spec = [tf.TensorSpec((None, s["regions"], s["dim"]), tf.float32)]

    def decoders(m):
        greedy = tf.function(lambda x: greedy_decode(m, x, args.max_length),
                             input_signature=spec, autograph=False)
        beam = tf.function(lambda x: beam_search(m, x, args.beam_size, args.max_length),
                           input_signature=spec, autograph=False)
        return (lambda: int(greedy(image)["lengths"][0]),
                lambda: int(beam(image)["lengths"][0]))

    encoder, decoder = tutorial.build()
    runners = dict(zip(("ours_greedy", "ours_beam"), decoders(model), strict=True))
    runners["baseline_greedy"] = lambda: len(tutorial.evaluate(encoder, decoder, image,
                                                               args.max_length))
    if args.precision != "float32":
        runners.update(zip(("twin_greedy", "twin_beam"), decoders(model.as_float32()), strict=True))
    first_call_s, lengths = {}, {}
    for name, run in runners.items():
        start = time.perf_counter()
        lengths[name] = run()
        first_call_s[name] = round(time.perf_counter() - start, 2)
        run()
    times = {name: [] for name in runners}
    for _ in range(args.runs):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    result = {"benchmark": "decode", "machine": cpu_model(), "cpus": os.cpu_count(),
              "tensorflow": tf.__version__, "sizes": {k: s[k] for k in (
                  "regions", "dim", "embedding", "hidden", "attention", "vocab")},
              "precision": args.precision, "attention": args.attention,
              "attention_score": args.attention_score,
              "batch": 1, "max_length": args.max_length, "beam_size": args.beam_size,
              "runs": args.runs, "first_call_s": first_call_s, "lengths": lengths}
    for name, values in times.items():
        result[f"{name}_ms"] = round(1000 * statistics.median(values), 2)
        result[f"{name}_ms_quartiles"] = [round(1000 * q, 2)
                                          for q in statistics.quantiles(values, n=4)]
    result["ratio"] = round(result["baseline_greedy_ms"] / result["ours_greedy_ms"], 2)
    result["ratio_beam"] = round(result["baseline_greedy_ms"] / result["ours_beam_ms"], 2)
    if "twin_greedy_ms" in result:
        result["twin_speedup"] = round(result["ours_greedy_ms"] / result["twin_greedy_ms"], 2)
    print(json.dumps(result))
    variant = "-".join(v for v in (
        "" if args.precision == "float32" else args.precision,
        "" if args.attention == "soft" else args.attention,
        "" if args.attention_score == "additive" else args.attention_score) if v)
    write_result("decode", result, argv=argv, variant=variant)
    return result


if __name__ == "__main__":
    main()
