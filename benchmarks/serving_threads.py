"""Benchmark: one intra-op thread against TensorFlow's default, per encoder size.

    python benchmarks/serving_threads.py                      # about 3 min on 2 CPU cores
    python benchmarks/serving_threads.py --encoders demo,resnet50 --repeats 5

`captioner serve` picks TensorFlow's intra-op pool size itself when
`--tensorflow_intra_op_parallelism` is not given (docs/serving.md): one
thread per op when every model it serves has an encoder of at most
`serving.server.thread_choice.SMALL_ENCODER_GFLOPS` per image, TensorFlow's
default otherwise. This measures where that line belongs. For each encoder
(`weights=None`) it exports a captioner with the demo's decoder (untrained,
so every caption runs to `--max-length`: the slowest decode), records the
encoder's GFLOPs per image (`models.encoder.encoder_flops`), then times the
`serving_default` signature on one JPEG in process, in child processes
that alternate: TensorFlow's default pools against one intra-op thread,
both sized as the server sizes them. Medians over
`--repeats` children of the median of `--calls` calls each.

Prints the CPU and its flags, a table (`speedup` = default ms / one-thread
ms: above 1, one thread is faster), and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.results import host, write_result  # noqa: E402

# name -> encoder fields (models.encoder.EncoderSpec, weights none).
ENCODERS = {
    "demo": dict(kind="small_cnn", image_size=64, width=16, grid_size=8),
    "small_cnn_128": dict(kind="small_cnn", image_size=128, width=32, grid_size=8),
    "mobilenetv2": dict(kind="keras_app", application="MobileNetV2", layer="out_relu",
                        image_size=224),
    "resnet50": dict(kind="keras_app", application="ResNet50", layer="conv5_block3_out",
                     image_size=224),
    "vgg19": dict(kind="keras_app", application="VGG19", layer="block5_conv4", image_size=224),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--encoders", default="demo,small_cnn_128,mobilenetv2,resnet50",
                        help=f"comma-separated, of {', '.join(ENCODERS)}")
    parser.add_argument("--repeats", type=int, default=3, help="child processes per setting")
    parser.add_argument("--calls", type=int, default=30, help="timed calls per child")
    parser.add_argument("--beam-size", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=24)
    parser.add_argument("--worker", nargs=2, metavar=("SAVED_MODEL", "INTRA_OP"),
                        help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _export(name: str, folder: str, args) -> tuple[str, float]:
    """Exports a captioner over encoder `name`; (its folder, the encoder's GFLOPs per image)."""
    from models.encoder import build_encoder, encoder_flops
    from models.show_attend_tell import ShowAttendTell
    from serving.signature.export import Decoding, export_saved_model
    fields = dict(ENCODERS[name])
    encoder = build_encoder(fields.pop("kind"), weights="none", **fields)
    _, h, w, d = encoder.output_shape
    vocabulary = ["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(56)]
    # The demo's decoder sizes (pipeline/configs/demo.py).
    decoder = ShowAttendTell(len(vocabulary), {"embedding_dim": 64, "hidden_dim": 256,
                                               "attention_dim": 128}, seed=0)
    decoder.build((None, h * w, d))
    path = os.path.join(folder, name, "1")
    export_saved_model(path, encoder, decoder, vocabulary,
                       Decoding(beam_size=args.beam_size, max_length=args.max_length),
                       num_warmup_requests=0)
    return path, encoder_flops(encoder) / 1e9


def _worker(path: str, intra_op: int, calls: int) -> None:
    """In a child: the server's thread settings, then the signature's median latency (ms)."""
    import io

    import numpy as np
    from PIL import Image

    from serving.server.model_server import _set_tf_threads
    _set_tf_threads(intra_op, 0)
    import tensorflow as tf
    model = tf.saved_model.load(path)
    signature = model.signatures["serving_default"]
    size = 224
    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    image = tf.constant([buffer.getvalue()])
    for _ in range(5):
        signature(image_bytes=image)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        signature(image_bytes=image)
        times.append(time.perf_counter() - start)
    print(json.dumps({"ms": 1000 * statistics.median(times)}))


def _child(path: str, intra_op: int, calls: int) -> float:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", path,
                          str(intra_op), "--calls", str(calls)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["ms"]


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        _worker(args.worker[0], int(args.worker[1]), args.calls)
        return None
    names = [n.strip() for n in args.encoders.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENCODERS]
    if unknown:
        raise SystemExit(f"unknown encoders {unknown}; choose from {sorted(ENCODERS)}")
    machine = host()
    print(f"CPU: {machine['cpu']} ({machine['cores']} cores), flags: {machine['flags']}",
          flush=True)
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            path, gflops = _export(name, folder, args)
            times = {"default": [], "one": []}
            for _ in range(args.repeats):  # alternating, so drifts in load hit both
                times["default"].append(_child(path, 0, args.calls))
                times["one"].append(_child(path, 1, args.calls))
            default_ms = statistics.median(times["default"])
            one_ms = statistics.median(times["one"])
            rows[name] = {"encoder_gflops": round(gflops, 3),
                          "default_ms": round(default_ms, 2), "one_thread_ms": round(one_ms, 2),
                          "default_runs_ms": [round(t, 2) for t in times["default"]],
                          "one_thread_runs_ms": [round(t, 2) for t in times["one"]],
                          "speedup": round(default_ms / one_ms, 3)}
            print(f"{name:14s} {gflops:8.3f} GFLOPs  default {default_ms:8.2f} ms  "
                  f"one thread {one_ms:8.2f} ms  speedup {default_ms / one_ms:5.2f}", flush=True)
    result = {"encoders": rows, "beam_size": args.beam_size, "max_length": args.max_length,
              "repeats": args.repeats, "calls": args.calls,
              "load_average": list(os.getloadavg())}
    print(json.dumps(result))
    write_result("serving_threads", result, argv=argv)
    return result


if __name__ == "__main__":
    main()
