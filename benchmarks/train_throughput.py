"""Trainer throughput: examples/second with `default` and `mirrored` (2 logical CPUs).

    .venv/bin/python benchmarks/train_throughput.py                 # about 2 min on 2 CPU cores
    .venv/bin/python benchmarks/train_throughput.py --steps 60 --annotations URI --vocabulary URI

Each strategy trains in its own process (`python -m components.trainer`,
the way workers run it) on the demo config (pipeline/configs/demo.py: batch
64, embedding 64, LSTM 256, attention 128) for `--steps` steps, without
validation; `mirrored` splits the CPU into two logical devices
(`train.cpu_logical_devices=2`). The data are synthetic annotations of the
demo encoder's grid (8 x 8 x 130, float16) with 5 captions of 4-16 words per
image over a 40-word vocabulary, unless `--annotations` names a real
Annotations artifact. Throughput excludes the first (tracing) step; the
input-wait fraction is the share of step time spent in `next(iterator)`
(target < 5%). The strategies alternate `--repeats` times and the best run
of each counts, since other load on a shared machine only slows runs down.

Ends with one JSON line: per-strategy figures and `ratio` (mirrored / default).
Results: docs/PERFORMANCE.md, section "Trainer".
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.results import write_result  # noqa: E402

VOCAB_WORDS = 40


def demo_grid_shape() -> list[int]:
    """The demo encoder's annotation grid `[H, W, D]`."""
    from models.encoder import build_encoder
    from pipeline.config import load_config
    cfg = load_config("demo").encoder
    encoder = build_encoder(cfg.kind, image_size=cfg.image_size, width=cfg.width,
                            grid_size=cfg.grid_size, coord_channels=cfg.coord_channels)
    return [int(v) for v in encoder.output_shape[1:]]


def write_synthetic(folder: str, images: int, grid_shape, captions_per_image: int = 5,
                    seed: int = 0) -> tuple[str, str]:
    """Annotations (train split, 4 shards) and Vocabulary artifacts of random data."""
    import tensorflow as tf

    from components.contract import schema
    from components.contract.artifacts import Artifact, write_artifact_json
    from models import text
    rng = np.random.default_rng(seed)
    h, w, d = grid_shape
    annotations, vocabulary = os.path.join(folder, "annotations"), os.path.join(folder, "vocab")
    os.makedirs(os.path.join(annotations, "train"))
    os.makedirs(vocabulary)
    shards = 4
    writers = [tf.io.TFRecordWriter(schema.shard_path(os.path.join(annotations, "train"),
                                                        "annotations", k, shards))
               for k in range(shards)]
    first_word = len(text.RESERVED)
    for i in range(images):
        caps = [[text.START_ID] + list(rng.integers(first_word, first_word + VOCAB_WORDS,
                                                    rng.integers(4, 17)))
                + [text.END_ID] for _ in range(captions_per_image)]
        example = schema.encode_annotations(
            f"img-{i}", rng.normal(size=(h, w, d)).astype(np.float16),
            [t for c in caps for t in c], [len(c) for c in caps], [])
        writers[i % shards].write(example.SerializeToString())
    for writer in writers:
        writer.close()
    write_artifact_json(Artifact(type="Annotations", uri=annotations, producer="benchmark",
                                 execution_id=0, fingerprint="synthetic", inputs={},
                                 counts={"train": images},
                                 properties={"grid_shape": list(grid_shape),
                                             "num_records": {"train": images}}),
                        config={})
    with open(os.path.join(vocabulary, schema.VOCAB_FILE), "w") as f:
        f.write(schema.vocabulary_text(list(text.RESERVED)
                                        + [f"w{i}" for i in range(VOCAB_WORDS)]))
    write_artifact_json(Artifact(type="Vocabulary", uri=vocabulary, producer="benchmark",
                                 execution_id=0, fingerprint="synthetic", inputs={},
                                 counts={},
                                 properties={"size": len(text.RESERVED) + VOCAB_WORDS}),
                        config={})
    return annotations, vocabulary


def run_trainer(annotations: str, vocabulary: str, folder: str, overrides) -> dict:
    """Trains in a fresh process; returns the Model properties and the process seconds."""
    result = os.path.join(folder, "result.json")
    cmd = [sys.executable, "-m", "components.trainer",
           "--config", os.path.join(ROOT, "pipeline", "configs", "demo.py"),
           "--annotations", annotations, "--vocabulary", vocabulary,
           "--work-dir", os.path.join(folder, "work"), "--result", result]
    for item in overrides:
        cmd += ["--set", item]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    start = time.time()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"trainer failed:\n{proc.stderr[-4000:]}")
    with open(result) as f:
        props = json.load(f)["model"]["properties"]
    props["process_seconds"] = round(time.time() - start, 1)
    return props


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40, help="training steps per strategy")
    p.add_argument("--images", type=int, default=1024, help="synthetic train images")
    p.add_argument("--repeats", type=int, default=2, help="runs per strategy (best counts)")
    p.add_argument("--annotations", default="", help="a real Annotations artifact folder")
    p.add_argument("--vocabulary", default="", help="its Vocabulary artifact folder")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="extra config overrides for both runs, e.g. train.bucket_by_length=true")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory(prefix="train-throughput-") as tmp:
        if args.annotations:
            if not args.vocabulary:
                p.error("--annotations needs --vocabulary")
            annotations, vocabulary = args.annotations, args.vocabulary
            grid = None
        else:
            grid = demo_grid_shape()
            annotations, vocabulary = write_synthetic(tmp, args.images, grid)
        common = [f"train.max_steps={args.steps}", "train.epochs=1000", "train.val_examples=0",
                  f"train.checkpoint_every={args.steps * 10}", *args.overrides]
        strategies = (("default", ["train.strategy=default"]),
                      ("mirrored", ["train.strategy=mirrored", "train.cpu_logical_devices=2"]))
        runs: dict[str, list[dict]] = {name: [] for name, _ in strategies}
        # Interleaved repeats; the best run of each counts (other load only slows runs down).
        for repeat in range(args.repeats):
            for name, extra in strategies:
                folder = os.path.join(tmp, f"{name}-{repeat}")
                os.makedirs(folder)
                props = run_trainer(annotations, vocabulary, folder, common + extra)
                runs[name].append(props)
                print(f"{name:9s} {props['examples_per_second']:8.1f} examples/s  input wait "
                      f"{100 * props['input_wait_fraction']:.1f}%  ({props['replicas']} "
                      f"replica(s), {props['steps']} steps, {props['process_seconds']}s)",
                      file=sys.stderr)
        best = {name: max(rs, key=lambda r: r["examples_per_second"])
                for name, rs in runs.items()}
        summary = {
            "benchmark": "train_throughput", "config": "demo", "steps": args.steps,
            "repeats": args.repeats, "grid_shape": grid or "from --annotations",
            "batch_size": best["default"].get("examples_seen", 0) // max(args.steps, 1),
            "cpu_count": os.cpu_count(),
            **{f"{k}_{m}": v[m] for k, v in best.items()
               for m in ("examples_per_second", "input_wait_fraction")},
            "ratio": round(best["mirrored"]["examples_per_second"]
                           / best["default"]["examples_per_second"], 3),
        }
    print(json.dumps(summary))
    write_result("train_throughput", summary, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
